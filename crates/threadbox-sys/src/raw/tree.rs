//! Calls that create and label tree entries relative to a directory descriptor: what an
//! image layer unpacker needs beyond `mkdirat` and `openat2` (`fs::tree` is its safe user).

use super::cvt_int;
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `symlinkat(target, dir, name)`.
pub(crate) fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: two NUL-terminated strings and a valid descriptor, alive for the call.
    cvt_int(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// `linkat(old_dir, old, new_dir, new, flags)`.
pub(crate) fn linkat(
    old_dir: BorrowedFd<'_>,
    old: &CStr,
    new_dir: BorrowedFd<'_>,
    new: &CStr,
    flags: i32,
) -> io::Result<()> {
    // SAFETY: valid descriptors and NUL-terminated names, alive for the call.
    cvt_int(unsafe {
        libc::linkat(
            old_dir.as_raw_fd(),
            old.as_ptr(),
            new_dir.as_raw_fd(),
            new.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `mknodat(dir, name, mode, dev)`.
pub(crate) fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, dev: u64) -> io::Result<()> {
    // SAFETY: a valid descriptor and a NUL-terminated name; mode and dev are plain values.
    cvt_int(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode as libc::mode_t, dev) })
        .map(drop)
}

/// `fchownat(dir, name, uid, gid, flags)`.
pub(crate) fn fchownat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    uid: u32,
    gid: u32,
    flags: i32,
) -> io::Result<()> {
    // SAFETY: a valid descriptor and a NUL-terminated name.
    cvt_int(unsafe { libc::fchownat(dir.as_raw_fd(), name.as_ptr(), uid, gid, flags) }).map(drop)
}

/// `fsetxattr(fd, name, value, 0)`.
pub(crate) fn fsetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: a valid descriptor, a NUL-terminated name and a buffer of `value.len()`
    // bytes, all alive for the call; the kernel only reads them.
    cvt_int(unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
    .map(drop)
}

/// `fgetxattr(fd, name, buf)`: the value's length.
pub(crate) fn fgetxattr(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: a valid descriptor, a NUL-terminated name and a writable buffer of
    // `buf.len()` bytes, alive for the call; the kernel writes at most that many.
    let n = unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// `syncfs(fd)`: flushes the whole filesystem holding `fd` (one call after writing a tree,
/// instead of an fsync per file).
pub(crate) fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a valid descriptor.
    cvt_int(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}

/// `ioctl(fd, FS_IOC_GETFLAGS)`: the inode's attribute flags (`lsattr`).
pub(crate) fn get_inode_flags(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    let mut flags: libc::c_int = 0;
    // SAFETY: a valid descriptor and a pointer to a live int the kernel writes (the
    // ioctl's argument is an int despite the `long` in its request number).
    cvt_int(unsafe { libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) })?;
    Ok(flags)
}

/// `ioctl(fd, FS_IOC_SETFLAGS)`: sets the inode's attribute flags (`chattr`).
pub(crate) fn set_inode_flags(fd: BorrowedFd<'_>, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: a valid descriptor and a pointer to a live int the kernel only reads.
    cvt_int(unsafe { libc::ioctl(fd.as_raw_fd(), libc::FS_IOC_SETFLAGS, &flags) }).map(drop)
}
