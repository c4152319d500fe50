//! File metadata and directory entries, always relative to a descriptor.

use super::{cvt, cvt_int};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `fstat(fd)` (an `O_PATH` descriptor included).
pub(crate) fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: a valid descriptor and an out-pointer to a stat buffer the kernel fills.
    cvt_int(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: zero-initialised plain data, filled by the successful call.
    Ok(unsafe { st.assume_init() })
}

/// `fstatat(dir, name, flags)`.
pub(crate) fn fstatat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: a valid descriptor, a NUL-terminated name and an out-pointer to a stat
    // buffer, all alive for the call.
    cvt_int(unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: zero-initialised plain data, filled by the successful call.
    Ok(unsafe { st.assume_init() })
}

/// `fstatfs(fd)`.
pub(crate) fn fstatfs(fd: BorrowedFd<'_>) -> io::Result<libc::statfs> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::zeroed();
    // SAFETY: a valid descriptor and an out-pointer to a statfs buffer.
    cvt_int(unsafe { libc::fstatfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: zero-initialised plain data, filled by the successful call.
    Ok(unsafe { st.assume_init() })
}

/// `mkdirat(dir, name, mode)` (the umask applies).
pub(crate) fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: a valid descriptor and a NUL-terminated name.
    cvt_int(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t) })
        .map(drop)
}

/// `flock(fd, op)`.
pub(crate) fn flock(fd: BorrowedFd<'_>, op: i32) -> io::Result<()> {
    // SAFETY: a valid descriptor; flock touches no memory of ours.
    cvt_int(unsafe { libc::flock(fd.as_raw_fd(), op) }).map(drop)
}

/// `unlinkat(dir, name, flags)`.
pub(crate) fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> io::Result<()> {
    // SAFETY: a valid descriptor and a NUL-terminated name.
    cvt_int(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `renameat(from_dir, from, to_dir, to)`.
pub(crate) fn renameat(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> io::Result<()> {
    // SAFETY: valid descriptors and NUL-terminated names.
    cvt_int(unsafe {
        libc::renameat(
            from_dir.as_raw_fd(),
            from.as_ptr(),
            to_dir.as_raw_fd(),
            to.as_ptr(),
        )
    })
    .map(drop)
}

/// `readlinkat(dir, name, buf)`: the number of bytes of the target placed in `buf`.
pub(crate) fn readlinkat(dir: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: a valid descriptor, a NUL-terminated name and a buffer writable for the
    // length passed.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    Ok(cvt(n as libc::c_long)? as usize)
}

/// `getdents64(fd, buf)`: the number of bytes of `struct linux_dirent64` records placed in
/// `buf` (0 at the end of the directory).
pub(crate) fn getdents64(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: a valid descriptor and a buffer writable for the length passed.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    Ok(cvt(n)? as usize)
}
