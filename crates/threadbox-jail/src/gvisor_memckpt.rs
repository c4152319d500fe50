//! Checkpoints with memory on the gvisor tier (issue 16 scope 4, ADR 0195): the memory
//! image of checkpoint `ckpt` lives in `sandboxes/<id>/memory/<ckpt>/`, beside the disk's
//! clone in `checkpoints/<ckpt>.img`, both of one instant (`Gvisor::save_with_memory`:
//! checkpoint, halt, clone, restore — the fork-with-memory sequence, with the image kept).
//! A rewind to it restores the disk (the manager) and then boots the sandbox from the
//! image instead of afresh; the image stays for the next rewind. The image is written
//! whole or not at all (temp, fsync, rename: `gvisor_ckpt.rs`) before the checkpoint's
//! row exists, and removed with the clone after the row is gone.

use super::Gvisor;
use std::path::PathBuf;
use threadbox_core::driver::{MemorySaved, SandboxSpec};
use threadbox_core::error::{CoreError, Result};

/// Under a sandbox's directory: the memory images of its checkpoints.
const MEMORY_DIR: &str = "memory";

impl Gvisor {
    fn memory_root(&self, id: &str) -> PathBuf {
        self.j().paths(id).dir.join(MEMORY_DIR)
    }

    fn memory_ckpt_dir(&self, id: &str, ckpt: &str) -> Result<PathBuf> {
        crate::checkpoint::check_ckpt(ckpt)?;
        Ok(self.memory_root(id).join(ckpt))
    }

    pub(super) fn checkpoint_with_memory(
        &self,
        spec: &SandboxSpec,
        ckpt: &str,
    ) -> Result<MemorySaved> {
        let dir = self.memory_ckpt_dir(&spec.id, ckpt)?;
        let (pid, disk, image) = self.save_with_memory(spec, ckpt, &dir)?;
        Ok(MemorySaved {
            pid,
            disk,
            image_bytes: image.bytes,
        })
    }

    /// `spec` (stopped, on the disk restored from `ckpt`) from `ckpt`'s image, listening.
    pub(super) fn boot_memory_checkpoint(&self, spec: &SandboxSpec, ckpt: &str) -> Result<i32> {
        let dir = self.memory_ckpt_dir(&spec.id, ckpt)?;
        if !Self::is_memory_image(&dir) {
            return Err(CoreError::NotFound(format!(
                "the memory image of checkpoint {ckpt} of sandbox {} is missing",
                spec.id
            )));
        }
        // A hibernate image is of processes the rewind's stop ended.
        self.remove_memory_image(&spec.id);
        let pid = self.restore_memory(spec, &dir)?;
        if let Err(e) = self.rebind(&spec.id) {
            let _ = self.halt(&spec.id);
            return Err(e);
        }
        Ok(pid)
    }

    pub(super) fn remove_memory_checkpoint(&self, id: &str, ckpt: &str) -> Result<()> {
        Self::remove_image_at(&self.memory_ckpt_dir(id, ckpt)?);
        Ok(())
    }

    /// The checkpoints with a whole memory image (at a start: a checkpoint or restore a
    /// killed daemon started runs to its end first; half-written images are removed).
    pub(super) fn memory_checkpoints(&self, id: &str) -> Vec<String> {
        let root = self.memory_root(id);
        let Ok(rd) = std::fs::read_dir(&root) else {
            return Vec::new();
        };
        let mut whole = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') {
                continue;
            }
            let dir = root.join(&name);
            if crate::gvisor_ckpt::lock_of(&dir).exists() {
                crate::gvisor_ckpt::wait_unlocked(&dir);
            }
            if Self::is_memory_image(&dir) {
                whole.push(name);
            }
        }
        // What is left beginning with '.': temp images and locks of finished work.
        if let Ok(rd) = std::fs::read_dir(&root) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(ck) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) {
                    tracing::info!(sandbox = %id, checkpoint = %ck, "removed a half-written memory image");
                    let _ = std::fs::remove_dir_all(e.path());
                } else if name.starts_with('.') && name.ends_with(".gone") {
                    // An image renamed away for removal by a daemon that died meanwhile.
                    let _ = std::fs::remove_dir_all(e.path());
                } else if let Some(ck) =
                    name.strip_prefix('.').and_then(|n| n.strip_suffix(".lock"))
                {
                    // The lock of an image that is gone (moved to hibernate, or removed).
                    if !root.join(ck).exists() {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        }
        whole
    }

    /// At a start: memory images whose checkpoint has no clone (a checkpoint cut short
    /// between its image and its clone) go.
    pub(super) fn remove_memory_orphans(&self, id: &str, disks: &[String]) {
        for ck in self.memory_checkpoints(id) {
            if !disks.contains(&ck) {
                tracing::info!(sandbox = %id, checkpoint = %ck, "removed a memory image left by an interrupted checkpoint");
                let _ = self.remove_memory_checkpoint(id, &ck);
            }
        }
    }
}
