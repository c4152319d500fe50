//! The sandbox's disk image on a loop device.

use crate::raw;
use crate::raw::loopdev::LoopConfig;
use crate::{Result, SysError};
use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// Offset of `lo_flags` in `struct loop_info64`.
const LO_FLAGS_OFFSET: usize = 52;

/// Attaches `image` to a free loop device with autoclear: the device is released as soon
/// as its last user (our mount, in the sandbox's mount namespace) is gone.
pub(crate) fn attach_loop(image: &Path) -> Result<(OwnedFd, PathBuf)> {
    let backing = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|e| SysError::os(format!("open {}", image.display()), e))?;
    let ctl = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(|e| SysError::os("open /dev/loop-control", e))?;
    // Another helper may take the same free device between GET_FREE and CONFIGURE.
    for _ in 0..32 {
        let n = raw::loopdev::get_free(ctl.as_fd())
            .map_err(|e| SysError::os("LOOP_CTL_GET_FREE", e))?;
        let dev = PathBuf::from(format!("/dev/loop{n}"));
        let loopf = match fs::OpenOptions::new().read(true).write(true).open(&dev) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(SysError::os(format!("open {}", dev.display()), e)),
        };
        let mut cfg = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: [0; 232],
            reserved: [0; 8],
        };
        cfg.info[LO_FLAGS_OFFSET..LO_FLAGS_OFFSET + 4]
            .copy_from_slice(&LO_FLAGS_AUTOCLEAR.to_ne_bytes());
        match raw::loopdev::configure(loopf.as_fd(), &cfg) {
            Ok(()) => return Ok((OwnedFd::from(loopf), dev)),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
            Err(e) => return Err(SysError::os(format!("LOOP_CONFIGURE {}", dev.display()), e)),
        }
    }
    Err(SysError::Other("no free loop device".into()))
}

/// Mounts the ext4 `image` on `target` (nosuid, nodev, noexec) in the caller's mount
/// namespace, runs `f` on it and unmounts it again (detached, so the autoclear loop device
/// goes with it). For the daemon's own work on a disk no sandbox uses (a fork's clone
/// before its first boot, ADR 0100); `target` must be in a directory only root can reach.
pub fn with_image_mounted<T>(
    image: &Path,
    target: &Path,
    f: impl FnOnce(&Path) -> Result<T>,
) -> Result<T> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let (dev_fd, dev) = attach_loop(image)?;
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| SysError::Other(format!("NUL in path {}", p.display())))
    };
    let (cdev, ctarget) = (c(&dev)?, c(target)?);
    let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
    raw::mount::mount(Some(&cdev), &ctarget, Some(c"ext4"), flags, None)
        .map_err(|e| SysError::os(format!("mount {}", image.display()), e))?;
    // The mount holds the device now; autoclear releases it at the unmount.
    drop(dev_fd);
    let out = f(target);
    let un = raw::mount::umount2(&ctarget, libc::MNT_DETACH)
        .map_err(|e| SysError::os(format!("umount {}", target.display()), e));
    let out = out?;
    un?;
    Ok(out)
}

/// Unmounts whatever a crashed [`with_image_mounted`] left on `target` (nothing: Ok).
pub fn unmount_leftover(target: &Path) -> Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let ctarget = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| SysError::Other(format!("NUL in path {}", target.display())))?;
    match raw::mount::umount2(&ctarget, libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) => Ok(()),
        Err(e) => Err(SysError::os(format!("umount {}", target.display()), e)),
    }
}

/// Moves every owner (uid and gid) under `root` that lies in `[from, from + span)` to the
/// same offset from `to`, without following symlinks; modes are written back after the
/// `lchown` (which clears setuid/setgid). Idempotent while the two ranges are disjoint, so
/// a walk cut short is finished by running it again. The number of entries changed.
pub fn shift_owners(root: &Path, from: u32, to: u32, span: u32) -> Result<u64> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let map = |id: u32| (id >= from && id - from < span).then(|| to + (id - from));
    let mut changed = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = fs::symlink_metadata(&p)
            .map_err(|e| SysError::os(format!("stat {}", p.display()), e))?;
        let (uid, gid) = (map(md.uid()), map(md.gid()));
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(&p, uid, gid)
                .map_err(|e| SysError::os(format!("lchown {}", p.display()), e))?;
            if !md.file_type().is_symlink() && md.mode() & 0o6000 != 0 {
                fs::set_permissions(&p, fs::Permissions::from_mode(md.mode() & 0o7777))
                    .map_err(|e| SysError::os(format!("chmod {}", p.display()), e))?;
            }
            changed += 1;
        }
        if md.is_dir() {
            let rd =
                fs::read_dir(&p).map_err(|e| SysError::os(format!("read {}", p.display()), e))?;
            for e in rd {
                let e = e.map_err(|e| SysError::os(format!("read {}", p.display()), e))?;
                stack.push(e.path());
            }
        }
    }
    Ok(changed)
}

/// A user namespace whose id maps move `[from, from + span)` to `[to, to + span)` and
/// keep host root (0) as it is: the owner mapping of an idmapped mount of a forked disk
/// (ADR 0100's owners, without a walk). Made by a child born in a new user namespace,
/// whose maps are written from here; its namespace outlives it through the returned fd.
/// The caller is single-threaded and in the host's PID namespace (the launch helper,
/// before it enters the sandbox's).
pub(super) fn idmap_userns(from: u32, to: u32, span: u32) -> Result<OwnedFd> {
    userns_with_map(&format!("0 0 1\n{from} {to} {span}\n"))
}

/// A user namespace whose id maps are `0 base span` only: the owner mapping of an OCI
/// image's layers, which hold the image's own ids (ADR 0175). Host root is *not* kept:
/// a layer's root-owned file is the sandbox's root's, never the host's. Same caller
/// contract as [`idmap_userns`].
pub(super) fn range_userns(base: u32, span: u32) -> Result<OwnedFd> {
    userns_with_map(&format!("0 {base} {span}\n"))
}

/// A user namespace with `map` as both its uid and gid map, held by an fd.
fn userns_with_map(map: &str) -> Result<OwnedFd> {
    use raw::process::{CloneArgs, Forked};
    let (go_r, go_w) = raw::fd::pipe_cloexec().map_err(|e| SysError::os("pipe2", e))?;
    let mut args = CloneArgs {
        flags: libc::CLONE_NEWUSER as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    let pid = match raw::process::clone3(&mut args)
        .map_err(|e| SysError::os("clone3 a user namespace holder", e))?
    {
        Forked::Child => {
            // Raw calls only (clone3's contract): wait for the parent to close the pipe.
            drop(go_w);
            let mut b = [0u8; 1];
            let _ = raw::fd::read(go_r.as_fd(), &mut b);
            raw::process::exit_now(0)
        }
        Forked::Parent(pid) => pid,
    };
    drop(go_r);
    let made = (|| {
        for f in ["uid_map", "gid_map"] {
            fs::write(format!("/proc/{pid}/{f}"), map)
                .map_err(|e| SysError::os(format!("write {f} of the idmap namespace"), e))?;
        }
        fs::File::open(format!("/proc/{pid}/ns/user"))
            .map(OwnedFd::from)
            .map_err(|e| SysError::os("open the idmap namespace", e))
    })();
    drop(go_w);
    let _ = raw::process::waitpid(pid, 0);
    made
}

/// Stacks an idmapped copy of the mount at `target` on `target` itself: owners read and
/// written through it are moved by `userns`'s maps, what is on disk stays.
pub(super) fn idmap_mount(target: &Path, userns: std::os::fd::BorrowedFd<'_>) -> Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| SysError::Other(format!("NUL in path {}", target.display())))?;
    let what = |op: &str| format!("{op} {} (idmapped disk)", target.display());
    let tree = raw::mount::open_tree_clone(&c).map_err(|e| SysError::os(what("open_tree"), e))?;
    raw::mount::mount_setattr_idmap(tree.as_fd(), userns, 0)
        .map_err(|e| SysError::os(what("mount_setattr"), e))?;
    raw::mount::move_mount_to(tree.as_fd(), &c).map_err(|e| SysError::os(what("move_mount"), e))
}

/// Stacks a read-only, nosuid, nodev idmapped copy of the layer directory `target` on
/// itself (a bind of just that directory), for overlayfs to take as a lower (ADR 0175).
/// Only in the sandbox's own mount namespace: the host's view of the layer is unchanged.
pub(super) fn idmap_lower(target: &Path, userns: std::os::fd::BorrowedFd<'_>) -> Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| SysError::Other(format!("NUL in path {}", target.display())))?;
    let what = |op: &str| format!("{op} {} (idmapped layer)", target.display());
    let tree = raw::mount::open_tree_clone(&c).map_err(|e| SysError::os(what("open_tree"), e))?;
    raw::mount::mount_setattr_idmap(tree.as_fd(), userns, raw::mount::MOUNT_ATTR_RO_NOSUID_NODEV)
        .map_err(|e| match e.raw_os_error() {
        // The layer store's filesystem cannot idmap (ext4, xfs, btrfs and tmpfs can).
        Some(libc::EINVAL) | Some(libc::EOPNOTSUPP) => SysError::Refused(format!(
            "{}: {e} (the layer store's filesystem must support idmapped mounts)",
            what("mount_setattr")
        )),
        _ => SysError::os(what("mount_setattr"), e),
    })?;
    raw::mount::move_mount_to(tree.as_fd(), &c).map_err(|e| SysError::os(what("move_mount"), e))
}
