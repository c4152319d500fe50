//! Loop devices: the two ioctls that attach a disk image.

use super::cvt_int;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;

/// `struct loop_config` of LOOP_CONFIGURE (linux/loop.h).
#[repr(C)]
pub(crate) struct LoopConfig {
    pub fd: u32,
    pub block_size: u32,
    pub info: [u8; 232],
    pub reserved: [u64; 8],
}

/// `LOOP_CTL_GET_FREE` on `/dev/loop-control`: the number of a free loop device.
pub(crate) fn get_free(ctl: BorrowedFd<'_>) -> io::Result<i32> {
    // SAFETY: an ioctl with an integer request and no argument.
    cvt_int(unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) })
}

/// `LOOP_CONFIGURE` on a loop device.
pub(crate) fn configure(dev: BorrowedFd<'_>, cfg: &LoopConfig) -> io::Result<()> {
    // SAFETY: `cfg` is a valid loop_config that lives for the call; the kernel only reads
    // it.
    cvt_int(unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, cfg as *const LoopConfig) })
        .map(drop)
}

const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;

/// `LOOP_GET_STATUS64` on a loop device: the device and inode numbers of its backing file
/// (`lo_device`, `lo_inode` of `struct loop_info64`, in `stat`'s encoding). ENXIO: the
/// device has no backing file.
pub(crate) fn backing(dev: BorrowedFd<'_>) -> io::Result<(u64, u64)> {
    let mut info = [0u8; 232];
    // SAFETY: `info` is a writable buffer of the size of `struct loop_info64` that lives
    // for the call; the kernel writes at most that many bytes into it.
    cvt_int(unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_GET_STATUS64, info.as_mut_ptr()) })?;
    let (mut d, mut i) = ([0u8; 8], [0u8; 8]);
    d.copy_from_slice(&info[0..8]);
    i.copy_from_slice(&info[8..16]);
    Ok((u64::from_ne_bytes(d), u64::from_ne_bytes(i)))
}
