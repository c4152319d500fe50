//! Checkpoints of a jailed sandbox's disk (issue 14, ADR 0100): reflink clones of its ext4
//! image under `sandboxes/<id>/checkpoints/`, a rewind's atomic swap of `disk.img`, and a
//! fork's clone with its owners moved into the fork's uid range.

use crate::{mkdir, Jail};
use std::path::{Path, PathBuf};
use threadbox_core::driver::DiskClone;
use threadbox_core::error::{CoreError, Result};
use threadbox_sys::clonefile::{clone_file, syncfs};

/// Beside a sandbox's `disk.img`: the host uid base its owners are stored relative to
/// (a fork's or template's clone keeps its source's). Absent: the sandbox's own base
/// (ADR 0102). Older forks had their owners rewritten instead (a `uid-base` file inside
/// the image, equal to their own base): they need no idmap.
pub(crate) const DISK_BASE_FILE: &str = "disk-base";

/// At the root of a template's disk image (outside `upper/`, so invisible inside): the
/// host uid base its owners are relative to (ADR 0110). A sandbox made from a template
/// has its owners shifted into its own range (`disk_from_clone`), so it needs no idmap.
pub(crate) const UID_BASE_FILE: &str = "uid-base";

/// The base recorded beside the disk in `dir`, if any.
pub(crate) fn disk_owner_base(dir: &Path) -> Option<u32> {
    std::fs::read_to_string(dir.join(DISK_BASE_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

fn write_durable(path: &Path, text: &str) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Checkpoint ids are ours (`ck-<hex>`), but a path is built from them: refuse anything else.
pub(crate) fn check_ckpt(ckpt: &str) -> Result<()> {
    if ckpt.is_empty()
        || ckpt.len() > 64
        || !ckpt
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(CoreError::InvalidArgument(format!(
            "bad checkpoint id {ckpt:?}"
        )));
    }
    Ok(())
}

pub(crate) fn sys(e: threadbox_sys::SysError) -> CoreError {
    CoreError::Internal(e.to_string())
}

impl Jail {
    fn checkpoint_dir(&self, id: &str) -> PathBuf {
        self.paths(id).dir.join("checkpoints")
    }

    pub(crate) fn checkpoint_image(&self, id: &str, ckpt: &str) -> Result<PathBuf> {
        check_ckpt(ckpt)?;
        Ok(self.checkpoint_dir(id).join(format!("{ckpt}.img")))
    }

    /// Image of a sandbox that has one (ADR 0011); the older plain upper has no checkpoints.
    fn image_of(&self, id: &str) -> Result<PathBuf> {
        let img = self.paths(id).disk_image;
        if !img.is_file() {
            return Err(CoreError::Conflict(format!(
                "sandbox {id} has no disk image (made before disk quotas): it cannot be \
                 checkpointed"
            )));
        }
        Ok(img)
    }

    /// `syncfs` of the sandbox's root as its agent sees it: overlayfs syncs its upper,
    /// the ext4 of the image, which flushes the loop device into the image file.
    pub fn sync_disk(&self, id: &str, agent_pid: Option<i32>) -> Result<()> {
        let Some(pid) = agent_pid.filter(|p| self.agent_alive(id, *p)) else {
            return Ok(());
        };
        syncfs(Path::new(&format!("/proc/{pid}/root/"))).map_err(sys)
    }

    pub fn checkpoint_disk(
        &self,
        id: &str,
        ckpt: &str,
        agent_pid: Option<i32>,
    ) -> Result<DiskClone> {
        self.sync_disk(id, agent_pid)?;
        self.clone_checkpoint(id, ckpt)
    }

    /// The clone itself, of a disk whose writes the caller has synced (the jail through
    /// its agent's root, the gvisor tier through its gofer's).
    pub(crate) fn clone_checkpoint(&self, id: &str, ckpt: &str) -> Result<DiskClone> {
        use std::os::unix::fs::MetadataExt;
        let img = self.image_of(id)?;
        let dst = self.checkpoint_image(id, ckpt)?;
        mkdir(&self.checkpoint_dir(id))?;
        let tmp = dst.with_extension("img.tmp");
        let _ = std::fs::remove_file(&tmp);
        let method = clone_file(&img, &tmp).map_err(sys)?;
        // Renamed only once whole: a crash leaves a `.tmp` that reconciliation removes.
        if let Err(e) = std::fs::rename(&tmp, &dst) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        sync_dir(&self.checkpoint_dir(id));
        let bytes = std::fs::metadata(&dst)?.blocks().saturating_mul(512);
        Ok(DiskClone {
            bytes,
            method: method.as_str(),
        })
    }

    pub fn restore_disk(&self, id: &str, ckpt: &str) -> Result<()> {
        let src = self.checkpoint_image(id, ckpt)?;
        if !src.is_file() {
            return Err(CoreError::NotFound(format!("checkpoint {ckpt} of {id}")));
        }
        let p = self.paths(id);
        let tmp = p.dir.join("disk.img.tmp");
        let _ = std::fs::remove_file(&tmp);
        clone_file(&src, &tmp).map_err(sys)?;
        // The swap is one rename: a crash leaves the old disk or the new one, whole.
        if let Err(e) = std::fs::rename(&tmp, &p.disk_image) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e.into());
        }
        sync_dir(&p.dir);
        Ok(())
    }

    /// A fork's disk: the checkpoint's clone, nothing rewritten. Its owners stay in the
    /// range they are stored in (the parent's own, or the one its disk came from), which
    /// `disk-base` beside the image records before the image is renamed into place; the
    /// boot mounts it idmapped onto the fork's range (ADR 0100, ADR 0102).
    pub fn fork_disk(
        &self,
        id: &str,
        index: u32,
        from: &str,
        from_index: u32,
        ckpt: &str,
    ) -> Result<()> {
        let _ = index;
        let from_base = match disk_owner_base(&self.paths(from).dir) {
            Some(b) => b,
            None => self.uid_range.slot_base(from_index)?,
        };
        self.fork_disk_stored_at(id, from, ckpt, from_base)
    }

    /// A fork's disk as a clone of `from`'s checkpoint, recorded as stored relative to
    /// host uid `from_base` (0 on the gvisor tier, which maps no ids: ADR 0135).
    pub(crate) fn fork_disk_stored_at(
        &self,
        id: &str,
        from: &str,
        ckpt: &str,
        from_base: u32,
    ) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let src = self.checkpoint_image(from, ckpt)?;
        let p = self.paths(id);
        for d in [&p.dir, &p.disk_mount, &p.rootfs, &p.run] {
            mkdir(d)?;
        }
        std::fs::set_permissions(&p.dir, std::fs::Permissions::from_mode(0o700))?;
        let t0 = std::time::Instant::now();
        let tmp = p.dir.join("disk.img.tmp");
        let _ = std::fs::remove_file(&tmp);
        clone_file(&src, &tmp).map_err(sys)?;
        // The base first: a disk that exists is always read with the right owners.
        let r = write_durable(&p.dir.join(DISK_BASE_FILE), &from_base.to_string())
            .and_then(|()| std::fs::rename(&tmp, &p.disk_image).map_err(CoreError::from));
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        sync_dir(&p.dir);
        tracing::debug!(
            sandbox = id,
            owner_base = from_base,
            total_us = t0.elapsed().as_micros() as u64,
            "fork disk"
        );
        Ok(())
    }

    /// Makes `id`'s disk a clone of the image `src`, its owners moved onto host uid base
    /// `to_base` (a jail slot's, or 0 on the gvisor tier) from the base `src` records
    /// (`default_base` when it records none), and only then renamed into place (a disk
    /// that exists is always whole and owned right).
    pub(crate) fn disk_from_clone(
        &self,
        src: &Path,
        id: &str,
        to_base: u32,
        default_base: u32,
    ) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let p = self.paths(id);
        for d in [&p.dir, &p.disk_mount, &p.rootfs, &p.run] {
            mkdir(d)?;
        }
        std::fs::set_permissions(&p.dir, std::fs::Permissions::from_mode(0o700))?;
        let tmp = p.dir.join("disk.img.tmp");
        let _ = std::fs::remove_file(&tmp);
        clone_file(src, &tmp).map_err(sys)?;
        let from_base = default_base;
        let shifted = threadbox_sys::jail::with_image_mounted(&tmp, &p.disk_mount, |root| {
            let file = root.join(UID_BASE_FILE);
            let recorded = std::fs::read_to_string(&file)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .unwrap_or(from_base);
            if recorded != to_base {
                threadbox_sys::jail::shift_owners(
                    root,
                    recorded,
                    to_base,
                    threadbox_sys::jail::ID_RANGE,
                )?;
            }
            // Written last: a walk cut short is done again (it is idempotent).
            std::fs::write(&file, to_base.to_string())
                .map_err(|e| threadbox_sys::SysError::os("write uid-base", e))?;
            syncfs(root)
        });
        if let Err(e) = shifted
            .map_err(sys)
            .and_then(|()| std::fs::rename(&tmp, &p.disk_image).map_err(CoreError::from))
        {
            let _ = threadbox_sys::jail::unmount_leftover(&p.disk_mount);
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        sync_dir(&p.dir);
        Ok(())
    }

    pub fn remove_checkpoint_disk(&self, id: &str, ckpt: &str) -> Result<()> {
        match std::fs::remove_file(self.checkpoint_image(id, ckpt)?) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The checkpoints whose images exist; half-made clones (`.tmp`) are removed on the way.
    pub fn checkpoint_disks(&self, id: &str) -> Vec<String> {
        let dir = self.checkpoint_dir(id);
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            } else if let Some(ck) = name.strip_suffix(".img") {
                out.push(ck.to_string());
            }
        }
        out
    }
}

/// Makes a rename durable (best effort: the rename itself is what matters for consistency).
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(f) = std::fs::File::open(dir) {
        let _ = f.sync_all();
    }
}
