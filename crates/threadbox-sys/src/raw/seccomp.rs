//! seccomp(2).

use super::cvt;
use std::io;

/// `seccomp(SECCOMP_SET_MODE_FILTER, flags, {prog})`. The caller has checked the length
/// (1..=u16::MAX) and set no_new_privs or holds CAP_SYS_ADMIN. Returns the call's value:
/// 0, or with TSYNC the id of a thread that could not take the filter.
pub(crate) fn set_mode_filter(
    prog: &[seccompiler::sock_filter],
    flags: u32,
) -> io::Result<libc::c_long> {
    let len = u16::try_from(prog.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let fprog = libc::sock_fprog {
        len,
        // seccompiler's sock_filter is #[repr(C)] with the same fields as the kernel's.
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `prog`, which lives for the whole call; the kernel copies
    // the program and does not write to it.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            &fprog as *const libc::sock_fprog,
        )
    })
}
