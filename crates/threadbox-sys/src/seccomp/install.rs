//! Loading a compiled program into the kernel.

use crate::raw;
use seccompiler::sock_filter;
use std::io;

/// Installs `prog` on the calling thread (and sets no_new_privs, which seccomp requires
/// without CAP_SYS_ADMIN). Async-signal-safe: two system calls, no allocation, so it may
/// run between fork and exec.
pub fn apply(prog: &[sock_filter]) -> io::Result<()> {
    if prog.is_empty() || prog.len() > u16::MAX as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    raw::process::prctl(libc::PR_SET_NO_NEW_PRIVS, 1)?;
    raw::seccomp::set_mode_filter(prog, 0)
}
