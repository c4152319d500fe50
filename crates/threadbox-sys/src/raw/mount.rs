//! Mounts: mount(2), the new mount API (fsopen/fsconfig/fsmount), pivot_root, umount2.

use super::{cvt, cvt_int, owned};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

fn ptr_or_null(c: Option<&CStr>) -> *const libc::c_char {
    c.map_or(std::ptr::null(), |c| c.as_ptr())
}

/// `mount(src, target, fstype, flags, data)`.
pub(crate) fn mount(
    src: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    // SAFETY: every pointer is null or points to a NUL-terminated string that lives until
    // the call returns; the kernel copies them.
    cvt_int(unsafe {
        libc::mount(
            ptr_or_null(src),
            target.as_ptr(),
            ptr_or_null(fstype),
            flags,
            ptr_or_null(data).cast(),
        )
    })
    .map(drop)
}

/// `umount2(target, flags)`.
pub(crate) fn umount2(target: &CStr, flags: i32) -> io::Result<()> {
    // SAFETY: a NUL-terminated path that lives for the call.
    cvt_int(unsafe { libc::umount2(target.as_ptr(), flags) }).map(drop)
}

/// `pivot_root(new_root, put_old)`.
pub(crate) fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: NUL-terminated paths that live for the call.
    cvt(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(drop)
}

/// `fsopen(fstype, flags)`: a filesystem context.
pub(crate) fn fsopen(fstype: &CStr, flags: u32) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name and integer flags.
    owned(cvt(unsafe {
        libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), flags)
    })?)
}

/// `fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0)`: creates the superblock.
pub(crate) fn fsconfig_create(fs: BorrowedFd<'_>) -> io::Result<()> {
    const FSCONFIG_CMD_CREATE: u32 = 6;
    // SAFETY: FSCONFIG_CMD_CREATE takes no key or value (both null).
    cvt(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    })
    .map(drop)
}

/// `fsmount(fs, flags, attr_flags)`: a detached mount of the context.
pub(crate) fn fsmount(fs: BorrowedFd<'_>, flags: u32, attr: u32) -> io::Result<OwnedFd> {
    // SAFETY: integer arguments on a configured filesystem context.
    owned(cvt(unsafe {
        libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), flags, attr)
    })?)
}
