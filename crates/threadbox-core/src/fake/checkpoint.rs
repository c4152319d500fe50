//! Checkpoints on the fake tier: copies of the sandbox's disk directory (the jail clones
//! its image, ADR 0100); enough for the router and manager tests of every door.

use super::{internal, FakeDriver};
use crate::driver::DiskClone;
use crate::error::{CoreError, Result};
use std::path::{Path, PathBuf};

/// Copies the tree `src` to the new directory `dst` (files, directories, symlinks).
pub(super) fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let (from, to) = (e.path(), dst.join(e.file_name()));
        let ft = e.file_type()?;
        if ft.is_dir() {
            copy_tree(&from, &to)?;
        } else if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
        } else if ft.is_file() {
            std::fs::copy(&from, &to)?;
        }
    }
    Ok(())
}

impl FakeDriver {
    fn checkpoint_path(&self, id: &str, ckpt: &str) -> Result<PathBuf> {
        if ckpt.is_empty() || !ckpt.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(CoreError::InvalidArgument(format!(
                "bad checkpoint id {ckpt:?}"
            )));
        }
        Ok(self.dir(id).join("checkpoints").join(ckpt))
    }

    pub(super) fn checkpoint_disk(&self, id: &str, ckpt: &str) -> Result<DiskClone> {
        let dst = self.checkpoint_path(id, ckpt)?;
        let parent = dst.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(parent).map_err(|e| internal("make checkpoints/", e))?;
        let tmp = dst.with_extension("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        copy_tree(&self.disk(id), &tmp)
            .and_then(|()| std::fs::rename(&tmp, &dst))
            .map_err(|e| {
                let _ = std::fs::remove_dir_all(&tmp);
                internal("copy the disk", e)
            })?;
        Ok(DiskClone {
            bytes: super::tree_usage(&dst),
            method: "copy",
        })
    }

    pub(super) fn restore_disk(&self, id: &str, from: &str, ckpt: &str) -> Result<()> {
        let src = self.checkpoint_path(from, ckpt)?;
        if !src.is_dir() {
            return Err(CoreError::NotFound(format!("checkpoint {ckpt} of {from}")));
        }
        std::fs::create_dir_all(self.dir(id)).map_err(|e| internal("make the directory", e))?;
        let tmp = self.dir(id).join("disk.tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        copy_tree(&src, &tmp).map_err(|e| internal("copy the checkpoint", e))?;
        let _ = std::fs::remove_dir_all(self.disk(id));
        std::fs::rename(&tmp, self.disk(id)).map_err(|e| internal("swap the disk", e))
    }

    pub(super) fn remove_checkpoint_disk(&self, id: &str, ckpt: &str) -> Result<()> {
        match std::fs::remove_dir_all(self.checkpoint_path(id, ckpt)?) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(internal("remove the checkpoint", e)),
        }
    }

    pub(super) fn checkpoint_disks(&self, id: &str) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.dir(id).join("checkpoints")) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_dir_all(e.path());
            } else {
                out.push(name);
            }
        }
        out
    }
}
