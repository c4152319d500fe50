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
    raw::seccomp::set_mode_filter(prog, 0).map(drop)
}

/// `SECCOMP_FILTER_FLAG_TSYNC`: every thread of the process gets the filter.
const FILTER_FLAG_TSYNC: u32 = 1;

/// Installs `prog` on every thread of the calling process (TSYNC), for the agent's own
/// filter. Without setting no_new_privs where the process holds CAP_SYS_ADMIN (the agent
/// is root of its user namespace): no_new_privs would be inherited by every child, which
/// decides it for itself (the security suite's `suid` control turns it off). Only where
/// the kernel refuses a filter without it (EACCES) is it set first.
pub fn apply_to_agent(prog: &[sock_filter]) -> io::Result<()> {
    if prog.is_empty() || prog.len() > u16::MAX as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let rc = match raw::seccomp::set_mode_filter(prog, FILTER_FLAG_TSYNC) {
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            raw::process::prctl(libc::PR_SET_NO_NEW_PRIVS, 1)?;
            raw::seccomp::set_mode_filter(prog, FILTER_FLAG_TSYNC)?
        }
        other => other?,
    };
    if rc != 0 {
        return Err(io::Error::other(format!(
            "thread {rc} could not take the seccomp filter"
        )));
    }
    Ok(())
}
