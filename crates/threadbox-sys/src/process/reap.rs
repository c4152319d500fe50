//! Reaping children and signalling them.

use crate::raw;
use std::io;

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    Exited(i32),
    Signaled(i32),
}

/// Reaps one terminated child of any pid without blocking: `Ok(None)` when none is
/// waiting (or there are no children).
pub fn reap_any() -> io::Result<Option<(i32, WaitStatus)>> {
    reap(-1)
}

/// Like [`reap_any`], but only for the child `pid` (other children stay unreaped).
pub fn reap_pid(pid: i32) -> io::Result<Option<(i32, WaitStatus)>> {
    reap(pid)
}

fn reap(which: i32) -> io::Result<Option<(i32, WaitStatus)>> {
    loop {
        let (pid, status) = match raw::process::waitpid(which, libc::WNOHANG) {
            Ok((0, _)) => return Ok(None),
            Ok(r) => r,
            Err(e) => match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ECHILD) => return Ok(None),
                _ => return Err(e),
            },
        };
        let ws = if libc::WIFSIGNALED(status) {
            WaitStatus::Signaled(libc::WTERMSIG(status))
        } else if libc::WIFEXITED(status) {
            WaitStatus::Exited(libc::WEXITSTATUS(status))
        } else {
            continue; // stopped/continued: not requested, not expected
        };
        return Ok(Some((pid, ws)));
    }
}

/// Sends `sig` to one process. `pid` must be positive (0 and -1 would reach many).
pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    raw::process::kill(pid, sig)
}

/// Sends `sig` to every process of process group `pgid` (which must be > 1).
pub fn kill_group(pgid: i32, sig: i32) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    raw::process::kill(-pgid, sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_refuses_broadcast_pids() {
        assert!(kill(0, 0).is_err());
        assert!(kill(-1, 0).is_err());
        assert!(kill_group(1, 0).is_err());
    }
}
