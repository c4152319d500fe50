//! The daemon's reflink store (ADR 0101): an xfs image on a loop device, mounted in the
//! host's mount namespace on the directory that holds the sandboxes' disks, so their
//! checkpoints and forks are `FICLONE`s where the root's own file system cannot share
//! extents.

use super::disk::attach_loop;
use crate::raw;
use crate::{Result, SysError};
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| SysError::Other(format!("NUL in path {}", p.display())))
}

/// Mounts the xfs `image` on `target` (nosuid, nodev) and leaves it mounted. `device` is
/// a loop device already backed by `image` (a store whose mount went while a sandbox's
/// mount namespace kept its superblock alive: mounting the same device again gives the
/// same file system; a second loop device on the same image would not mount, and must
/// not). Without one, a free loop device is attached with autoclear, so the device is
/// released with the last mount of it, in whichever namespace that is.
pub fn mount_store(image: &Path, target: &Path, device: Option<&Path>) -> Result<()> {
    let ctarget = cpath(target)?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    let mount = |dev: &Path| {
        raw::mount::mount(Some(&cpath(dev)?), &ctarget, Some(c"xfs"), flags, None).map_err(|e| {
            SysError::os(
                format!("mount {} on {}", image.display(), target.display()),
                e,
            )
        })
    };
    match device {
        Some(dev) => mount(dev),
        None => {
            let (dev_fd, dev) = attach_loop(image)?;
            let r = mount(&dev);
            // On success the mount holds the device; on failure closing it detaches it.
            drop(dev_fd);
            r
        }
    }
}

/// Unmounts the store from `target` unless it is in use in this namespace (an open file,
/// a directory a process is in, a mount under it): then it is left for the next start to
/// reuse. `Ok(true)` when it was unmounted.
pub fn unmount_store(target: &Path) -> Result<bool> {
    match raw::mount::umount2(&cpath(target)?, libc::UMOUNT_NOFOLLOW) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => Ok(false),
        Err(e) => Err(SysError::os(format!("umount {}", target.display()), e)),
    }
}
