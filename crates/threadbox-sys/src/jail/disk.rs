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

/// The mount options a sandbox's boot gives its disk's ext4 (ADR 0216): no cache flushes
/// while the journal of a cloned disk is replayed, which otherwise waits on a flush of the
/// host disk through two loop devices (three forks side by side: 12 ms of mount instead of
/// 4). [`restore_barrier`] turns them back on once the sandbox is up.
pub const BOOT_DISK_OPTIONS: &str = "nobarrier";

/// What [`restore_barrier`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Barrier {
    /// The disk's ext4 was mounted `nobarrier`; it has write barriers again.
    Restored,
    /// It has them already (booted before ADR 0216, or restored before).
    AlreadyOn,
    /// No loop device backed by the image carries a mounted ext4: nothing to do.
    NotMounted,
}

/// The loop device backed by the file with device `dev` and inode `ino`: its name
/// (`loop7`) and an open descriptor, which keeps the device bound while it is held.
fn loop_backed_by(dev: u64, ino: u64) -> Result<Option<(String, fs::File)>> {
    let entries = fs::read_dir("/sys/block").map_err(|e| SysError::os("read /sys/block", e))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(f) = fs::File::open(Path::new("/dev").join(&name)) else {
            continue;
        };
        if matches!(raw::loopdev::backing(f.as_fd()), Ok(b) if b == (dev, ino)) {
            return Ok(Some((name, f)));
        }
    }
    Ok(None)
}

/// Whether the mounted ext4 on loop device `name` has write barriers off (its options in
/// `/proc/fs/ext4/<name>/options`, one per line); `None`: no ext4 is mounted on it.
fn ext4_nobarrier(name: &str) -> Option<bool> {
    let opts = fs::read_to_string(format!("/proc/fs/ext4/{name}/options")).ok()?;
    Some(opts.lines().any(|l| l.trim() == "nobarrier"))
}

/// The backing files (device, inode) of the loop devices whose mounted ext4 has no write
/// barriers: what [`restore_barrier`] has left to do on this host.
pub fn nobarrier_disks() -> Result<Vec<(u64, u64)>> {
    let entries = match fs::read_dir("/proc/fs/ext4") {
        Ok(e) => e,
        // No ext4 mounted anywhere (or none built in): nothing is left without barriers.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(SysError::os("read /proc/fs/ext4", e)),
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") || ext4_nobarrier(&name) != Some(true) {
            continue;
        }
        let Ok(f) = fs::File::open(Path::new("/dev").join(&name)) else {
            continue;
        };
        if let Ok(b) = raw::loopdev::backing(f.as_fd()) {
            out.push(b);
        }
    }
    Ok(out)
}

/// Turns write barriers back on for the ext4 of disk `image`, mounted by a running
/// sandbox with [`BOOT_DISK_OPTIONS`]. That mount lives only in the sandbox's mount
/// namespace, detached from any path since its pivot, so the file system is reached by
/// mounting the same loop device again (ext4 gives the superblock already mounted), in a
/// mount namespace of a thread made for this call and gone with it, on `scratch` (an
/// empty directory only root can reach), and remounting that with `barrier`. The caller
/// keeps the sandbox from stopping or booting meanwhile: a disk whose sandbox had ended
/// would be mounted here on its own (harmless alone, never beside a new boot).
pub fn restore_barrier(image: &Path, scratch: &Path) -> Result<Barrier> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let md =
        fs::metadata(image).map_err(|e| SysError::os(format!("stat {}", image.display()), e))?;
    let Some((name, dev_file)) = loop_backed_by(md.dev(), md.ino())? else {
        return Ok(Barrier::NotMounted);
    };
    match ext4_nobarrier(&name) {
        None => return Ok(Barrier::NotMounted),
        Some(false) => return Ok(Barrier::AlreadyOn),
        Some(true) => {}
    }
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| SysError::Other(format!("NUL in path {}", p.display())))
    };
    let (cdev, ctarget) = (c(&Path::new("/dev").join(&name))?, c(scratch)?);
    let want = (md.dev(), md.ino());
    // A thread of its own: `unshare(CLONE_NEWNS)` changes only the calling thread, whose
    // namespace (and the mount made in it) goes when the thread ends, even if this
    // process is killed in between.
    let r = std::thread::scope(|s| {
        s.spawn(|| -> Result<()> {
            raw::process::unshare(libc::CLONE_NEWNS)
                .map_err(|e| SysError::os("unshare a mount namespace", e))?;
            // Nothing mounted here may propagate to the host's namespace.
            raw::mount::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
                .map_err(|e| SysError::os("make / private", e))?;
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            raw::mount::mount(Some(&cdev), &ctarget, Some(c"ext4"), flags, None)
                .map_err(|e| SysError::os(format!("mount /dev/{name}"), e))?;
            // Still the image's device: the open descriptor kept it bound.
            let same = raw::loopdev::backing(dev_file.as_fd()).ok() == Some(want);
            let r = if same {
                raw::mount::mount(
                    None,
                    &ctarget,
                    None,
                    libc::MS_REMOUNT | flags,
                    Some(c"barrier"),
                )
                .map_err(|e| SysError::os(format!("remount /dev/{name} with barrier"), e))
            } else {
                Err(SysError::Other(format!(
                    "/dev/{name} changed its backing file"
                )))
            };
            let un = raw::mount::umount2(&ctarget, libc::MNT_DETACH)
                .map_err(|e| SysError::os(format!("umount {}", scratch.display()), e));
            r.and(un)
        })
        .join()
        .unwrap_or_else(|_| Err(SysError::Other("the barrier thread panicked".into())))
    });
    r?;
    match ext4_nobarrier(&name) {
        Some(false) => Ok(Barrier::Restored),
        _ => Err(SysError::Other(format!(
            "the ext4 on /dev/{name} still has no write barriers after the remount"
        ))),
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
