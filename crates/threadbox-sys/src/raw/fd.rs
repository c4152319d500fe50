//! Descriptors: open, pipes, read/write, duplication, close, seals.

use super::{cvt, cvt_int, owned};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Whether open/openat read a third (mode) argument with these flags: O_CREAT, or
/// O_TMPFILE (whose value includes O_DIRECTORY's bit, so it is tested whole).
fn needs_mode(flags: i32) -> bool {
    flags & libc::O_CREAT != 0 || flags & libc::O_TMPFILE == libc::O_TMPFILE
}

/// `open(path, flags)` (`O_CLOEXEC` is the caller's to add). No `O_CREAT`/`O_TMPFILE`:
/// those take a mode ([`openat_mode`]).
pub(crate) fn open(path: &CStr, flags: i32) -> io::Result<OwnedFd> {
    if needs_mode(flags) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `path` is NUL-terminated and lives for the call; without O_CREAT/O_TMPFILE
    // (refused above) the variadic mode argument is not read.
    let rc = unsafe { libc::open(path.as_ptr(), flags) };
    owned(cvt(rc as libc::c_long)?)
}

/// `openat(dir, name, flags)` without a mode (no `O_CREAT`/`O_TMPFILE`).
pub(crate) fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<OwnedFd> {
    if needs_mode(flags) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: a valid descriptor and a NUL-terminated name that live for the call; the
    // variadic mode is not read without O_CREAT/O_TMPFILE (refused above).
    let rc = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags) };
    owned(cvt(rc as libc::c_long)?)
}

/// `openat(dirfd, name, flags, mode)`, `dirfd` being a descriptor or `AT_FDCWD`.
pub(crate) fn openat_mode(dirfd: RawFd, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name that lives for the call; integer arguments otherwise
    // (a bad `dirfd` is an EBADF, not a memory error).
    let rc = unsafe { libc::openat(dirfd, name.as_ptr(), flags, mode as libc::c_uint) };
    owned(cvt(rc as libc::c_long)?)
}

/// `struct open_how` of openat2(2).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(dirfd, name, {flags, mode, resolve})`, `dirfd` being a descriptor or
/// `AT_FDCWD`.
pub(crate) fn openat2(
    dirfd: RawFd,
    name: &CStr,
    flags: u64,
    mode: u64,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let how = OpenHow {
        flags,
        mode,
        resolve,
    };
    // SAFETY: `name` is NUL-terminated and `how` a valid open_how of the size passed, both
    // alive for the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            name.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    owned(cvt(rc)?)
}

/// `pipe2(O_CLOEXEC)`: (read end, write end).
pub(crate) fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` points to two writable ints.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    cvt_int(rc)?;
    Ok((
        owned(fds[0] as libc::c_long)?,
        owned(fds[1] as libc::c_long)?,
    ))
}

/// `write(fd, buf)`: the number of bytes written (one call, no retry).
pub(crate) fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: the buffer is valid for `buf.len()` bytes; the kernel only reads it.
    let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
    Ok(cvt(n as libc::c_long)? as usize)
}

/// `read(fd, buf)`: the number of bytes read (one call, no retry).
pub(crate) fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: the buffer is valid and writable for `buf.len()` bytes.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    Ok(cvt(n as libc::c_long)? as usize)
}

/// `lseek(fd, offset, whence)`.
pub(crate) fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> io::Result<u64> {
    // SAFETY: integer arguments on a valid descriptor.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), offset as libc::off_t, whence) };
    Ok(cvt(r as libc::c_long)? as u64)
}

/// `dup2(fd, target)` (the new descriptor has no `FD_CLOEXEC`). `target` is a number the
/// caller reserves for the program it is about to exec.
pub(crate) fn dup2(fd: RawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: integer arguments; dup2 replaces `target`, which the callers (between fork
    // and exec, or the sandbox init setting up the agent's fixed fds) do not use otherwise.
    cvt_int(unsafe { libc::dup2(fd, target) }).map(drop)
}

/// `fcntl(fd, F_DUPFD_CLOEXEC, min)`: a new descriptor numbered at least `min`.
pub(crate) fn dup_above(fd: RawFd, min: RawFd) -> io::Result<RawFd> {
    // SAFETY: integer arguments; the new number is returned to the caller, who keeps it
    // until exec (the sandbox init's fixed fds).
    cvt_int(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) })
}

/// `fcntl(fd, F_GETFD)`.
pub(crate) fn get_fd_flags(fd: RawFd) -> io::Result<i32> {
    // SAFETY: F_GETFD only queries the descriptor.
    cvt_int(unsafe { libc::fcntl(fd, libc::F_GETFD) })
}

/// `fcntl(fd, F_SETFD, flags)`.
pub(crate) fn set_fd_flags(fd: RawFd, flags: i32) -> io::Result<()> {
    // SAFETY: integer arguments; only the descriptor's flags change.
    cvt_int(unsafe { libc::fcntl(fd, libc::F_SETFD, flags) }).map(drop)
}

/// Takes ownership of the inherited descriptor `fd`. Contract: the caller has checked
/// that it is open and makes at most one `OwnedFd` of each number (`take_inherited_fd`'s
/// bitmap).
pub(crate) fn adopt_inherited(fd: RawFd) -> OwnedFd {
    // SAFETY: the descriptor is open and was handed to this process to own; the caller's
    // bitmap guarantees that no second OwnedFd is made from it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `close(fd)` by number. Contract: the caller never uses `fd` again in this process
/// (the child's copy of a descriptor some `OwnedFd` of the parent owns).
pub(crate) fn close(fd: RawFd) {
    // SAFETY: by the contract above nothing uses the number again; close has no memory
    // effect.
    unsafe { libc::close(fd) };
}

/// `close_range(lo, hi, flags)`. Contract: nothing in this process uses the descriptors of
/// the range again (the child closing what it did not keep, or marking it CLOEXEC).
pub(crate) fn close_range(lo: u32, hi: u32, flags: u32) -> io::Result<()> {
    // SAFETY: integer arguments; by the contract, the descriptors closed are not in use.
    cvt(unsafe { libc::syscall(libc::SYS_close_range, lo, hi, flags) }).map(drop)
}

/// `memfd_create(name, flags)`.
pub(crate) fn memfd_create(name: &CStr, flags: u32) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name that lives for the call.
    let rc = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    owned(cvt(rc as libc::c_long)?)
}

/// `fcntl(fd, F_ADD_SEALS, seals)`.
pub(crate) fn add_seals(fd: BorrowedFd<'_>, seals: i32) -> io::Result<()> {
    // SAFETY: integer arguments on a valid descriptor.
    cvt_int(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) }).map(drop)
}

/// `fcntl(fd, F_GET_SEALS)`.
pub(crate) fn get_seals(fd: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: a query on a valid descriptor.
    cvt_int(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })
}

/// Runs `f` on a borrow of the raw descriptor `fd`, which the caller keeps open for the
/// call (an fd inherited over a fork, named by number in a spec).
pub(crate) fn with_borrowed<T>(fd: std::os::fd::RawFd, f: impl FnOnce(BorrowedFd<'_>) -> T) -> T {
    // SAFETY: the caller guarantees `fd` is open for the whole call; the borrow does not
    // outlive `f`.
    f(unsafe { BorrowedFd::borrow_raw(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_creating_flags_need_a_mode() {
        assert!(needs_mode(libc::O_CREAT | libc::O_WRONLY));
        assert!(needs_mode(libc::O_TMPFILE | libc::O_RDWR));
        assert!(!needs_mode(
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW
        ));
        assert!(!needs_mode(libc::O_PATH | libc::O_CLOEXEC));
        assert!(open(c"/", libc::O_RDONLY | libc::O_DIRECTORY).is_ok());
    }
}
