//! Whole-file clones for checkpoints, rewinds and forks of a disk image (ADR 0100): a
//! reflink (`FICLONE`, no data moved) where the file system shares extents (xfs, btrfs),
//! else a sparse copy.

use crate::{Result, SysError};
use std::fs::File;
use std::os::fd::AsFd;
use std::path::Path;

/// How a clone was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloneMethod {
    /// Extents shared, nothing copied.
    Reflink,
    /// The file system cannot share extents: data copied, holes kept.
    Copy,
}

impl CloneMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            CloneMethod::Reflink => "reflink",
            CloneMethod::Copy => "copy",
        }
    }
}

/// Clones `src` into a new file `dst` (which must not exist), fsynced. On failure `dst` is
/// removed.
pub fn clone_file(src: &Path, dst: &Path) -> Result<CloneMethod> {
    let r = clone_inner(src, dst);
    if r.is_err() {
        let _ = std::fs::remove_file(dst);
    }
    r
}

fn clone_inner(src: &Path, dst: &Path) -> Result<CloneMethod> {
    let from = File::open(src).map_err(|e| SysError::os(format!("open {}", src.display()), e))?;
    let to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(|e| SysError::os(format!("create {}", dst.display()), e))?;
    match crate::raw::clone::ficlone(to.as_fd(), from.as_fd()) {
        Ok(()) => {
            to.sync_all()
                .map_err(|e| SysError::os(format!("sync {}", dst.display()), e))?;
            Ok(CloneMethod::Reflink)
        }
        // Not a file system that shares extents (ext4: EOPNOTSUPP; other devices: EXDEV;
        // some kernels answer EINVAL): copy instead.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EXDEV | libc::EINVAL | libc::ENOTTY)
            ) =>
        {
            drop(to);
            std::fs::remove_file(dst)
                .map_err(|e| SysError::os(format!("remove {}", dst.display()), e))?;
            crate::sparse::copy_sparse(src, dst)?;
            Ok(CloneMethod::Copy)
        }
        Err(e) => Err(SysError::os(format!("FICLONE {}", dst.display()), e)),
    }
}

/// Writes back the file system holding `path` (a directory or file opened read-only).
pub fn syncfs(path: &Path) -> Result<()> {
    let f = File::open(path).map_err(|e| SysError::os(format!("open {}", path.display()), e))?;
    crate::raw::clone::syncfs(f.as_fd()).map_err(|e| SysError::os("syncfs", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_has_the_same_bytes_and_is_independent() {
        let d = std::env::temp_dir().join(format!("tb-clone-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::write(&a, b"checkpoint").unwrap();
        let m = clone_file(&a, &b).unwrap();
        assert!(matches!(m, CloneMethod::Reflink | CloneMethod::Copy));
        assert_eq!(std::fs::read(&b).unwrap(), b"checkpoint");
        std::fs::write(&a, b"later").unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), b"checkpoint");
        assert!(clone_file(&a, &b).is_err(), "the target must not exist");
        assert_eq!(std::fs::read(&b).unwrap(), b"checkpoint", "kept on refusal");
        syncfs(&d).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }
}
