//! The raw layer: every `unsafe` of threadbox (and so of the whole workspace) is in this
//! module, one safe function per system call, each with one `// SAFETY:` comment that can
//! be checked where it stands. The policy modules above (`process`, `fs`, `jail`,
//! `seccomp`, `landlock`, `cgroup`) are safe code that call these.
//!
//! The functions are `pub(crate)`: a few of them are sound only under a contract that the
//! crate's own callers keep and that is written on the function (the child side of a
//! fork makes raw calls only; a descriptor closed by number is not used again).
//! Nothing here decides policy: no weakening, no fallback, no error wording beyond the
//! kernel's own errno.

pub(crate) mod alloc;
pub(crate) mod clone;
pub(crate) mod fd;
pub(crate) mod fs;
pub(crate) mod landlock;
pub(crate) mod loopdev;
pub(crate) mod mount;
pub(crate) mod net;
pub(crate) mod process;
pub(crate) mod pty;
pub(crate) mod seccomp;
#[cfg(test)]
pub(crate) mod testing;
pub(crate) mod tree;

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// `Err(errno)` for a negative return value of a libc call or raw system call.
pub(crate) fn cvt(rc: libc::c_long) -> io::Result<libc::c_long> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// [`cvt`] for calls that return a C `int`.
pub(crate) fn cvt_int(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// The calling thread's errno (0 when none).
pub(crate) fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Takes ownership of a descriptor a system call has just returned (`rc` ≥ 0 checked by
/// the caller with [`cvt`]).
fn owned(rc: libc::c_long) -> io::Result<OwnedFd> {
    let fd = RawFd::try_from(rc).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // SAFETY: every caller passes a descriptor the kernel has just created for this
    // process (open, pipe2, socket, memfd_create, fsopen, ...), which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
