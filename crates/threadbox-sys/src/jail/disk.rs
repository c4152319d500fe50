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
