//! File clones and file-system syncs: `ioctl(FICLONE)` and `syncfs` (checkpoints, ADR 0100).

use super::cvt_int;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

/// `ioctl(dst, FICLONE, src)`: `dst` shares `src`'s extents (copy on write).
pub(crate) fn ficlone(dst: BorrowedFd<'_>, src: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: both descriptors are open for the call (borrowed); FICLONE takes the source
    // descriptor as its integer argument and reads no memory of ours.
    cvt_int(unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE, src.as_raw_fd()) }).map(drop)
}

/// `syncfs(fd)`: writes back the file system holding `fd`.
pub(crate) fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a descriptor borrowed for the call; no memory is passed.
    cvt_int(unsafe { libc::syncfs(fd.as_raw_fd()) }).map(drop)
}
