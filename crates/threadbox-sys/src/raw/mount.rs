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

/// `open_tree(AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC)`: a detached copy of
/// the mount at `path`.
pub(crate) fn open_tree_clone(path: &CStr) -> io::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    // SAFETY: a NUL-terminated path that lives for the call, integer flags.
    owned(cvt(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    })?)
}

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV` (for
/// [`mount_setattr_idmap`]'s `extra`).
pub(crate) const MOUNT_ATTR_RO_NOSUID_NODEV: u64 = 0x1 | 0x2 | 0x4;

/// `mount_setattr(tree, "", AT_EMPTY_PATH, {MOUNT_ATTR_IDMAP | extra, userns})`: the
/// detached mount `tree` shows owners through `userns`'s id maps (and gets the `extra`
/// `MOUNT_ATTR_*` flags in the same call).
pub(crate) fn mount_setattr_idmap(
    tree: BorrowedFd<'_>,
    userns: BorrowedFd<'_>,
    extra: u64,
) -> io::Result<()> {
    const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | extra,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: an empty NUL-terminated path, a pointer to a live `mount_attr` and its size;
    // the kernel only reads it.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// `move_mount(tree, "", AT_FDCWD, target, MOVE_MOUNT_F_EMPTY_PATH)`: attaches the
/// detached mount `tree` on `target`.
pub(crate) fn move_mount_to(tree: BorrowedFd<'_>, target: &CStr) -> io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;
    // SAFETY: an empty and a NUL-terminated path that live for the call, integer flags.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })
    .map(drop)
}
