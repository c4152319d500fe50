//! Template disks of the jail (issue 14 scope 5, ADR 0110): `<root>/sandboxes/.templates/
//! <tpl>.img`, a clone of a sandbox's checkpoint image that records the host uid base of its
//! owners, so a sandbox made from it later (in any slot, after any restart) is shifted like
//! a fork. They live in the reflink store (ADR 0101, mounted on `sandboxes/`), so both the
//! template's clone and every sandbox's clone of it are reflinks there (ADR 0162); disks
//! of roots from before stay readable in `<root>/templates/`.

use crate::checkpoint::{check_ckpt, sync_dir, sys, UID_BASE_FILE};
use crate::{mkdir, Jail};
use std::path::PathBuf;
use threadbox_core::driver::DiskClone;
use threadbox_core::error::{CoreError, Result};
use threadbox_sys::clonefile::{clone_file, syncfs};

impl Jail {
    /// Where template disks are made: inside the sandboxes' store, a name no sandbox id
    /// can have.
    fn templates_dir(&self) -> PathBuf {
        self.config.root.join("sandboxes").join(".templates")
    }

    /// Where roots from before ADR 0162 kept them (outside the store): read and removed
    /// there, never made there.
    fn legacy_templates_dir(&self) -> PathBuf {
        self.config.root.join("templates")
    }

    fn template_image(&self, tpl: &str) -> Result<PathBuf> {
        check_ckpt(tpl)?;
        Ok(self.templates_dir().join(format!("{tpl}.img")))
    }

    /// The disk of `tpl` where it is: the store's, else the legacy directory's.
    fn existing_template_image(&self, tpl: &str) -> Result<PathBuf> {
        let p = self.template_image(tpl)?;
        if p.is_file() {
            return Ok(p);
        }
        let old = self.legacy_templates_dir().join(format!("{tpl}.img"));
        Ok(if old.is_file() { old } else { p })
    }

    pub fn save_template_disk(
        &self,
        from: &str,
        from_index: u32,
        ckpt: &str,
        tpl: &str,
    ) -> Result<DiskClone> {
        // A forked source keeps its parent's owners, recorded beside its disk (ADR 0102).
        let from_base = match crate::checkpoint::disk_owner_base(&self.paths(from).dir) {
            Some(b) => b,
            None => self.uid_range.slot_base(from_index)?,
        };
        self.save_template_disk_stored_at(from, ckpt, tpl, from_base)
    }

    /// [`Jail::save_template_disk`] of a disk whose owners are stored relative to host uid
    /// `from_base` (0 on the gvisor tier, unless the image records its own).
    pub(crate) fn save_template_disk_stored_at(
        &self,
        from: &str,
        ckpt: &str,
        tpl: &str,
        from_base: u32,
    ) -> Result<DiskClone> {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let src = self.checkpoint_image(from, ckpt)?;
        if !src.is_file() {
            return Err(CoreError::NotFound(format!("checkpoint {ckpt} of {from}")));
        }
        let dir = self.templates_dir();
        mkdir(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let dst = self.template_image(tpl)?;
        let tmp = dst.with_extension("img.tmp");
        let mnt = dst.with_extension("mnt");
        let _ = std::fs::remove_file(&tmp);
        let method = clone_file(&src, &tmp).map_err(sys)?;
        // The base its owners are relative to goes into the image itself: the source
        // sandbox may be gone (and its slot reused) when the template is used.
        let recorded = mkdir(&mnt).and_then(|()| {
            threadbox_sys::jail::with_image_mounted(&tmp, &mnt, |root| {
                let file = root.join(UID_BASE_FILE);
                if std::fs::read_to_string(&file)
                    .ok()
                    .and_then(|s| s.trim().parse::<u32>().ok())
                    .is_none()
                {
                    std::fs::write(&file, from_base.to_string())
                        .map_err(|e| threadbox_sys::SysError::os("write uid-base", e))?;
                }
                syncfs(root)
            })
            .map_err(sys)
        });
        let placed = recorded.and_then(|()| std::fs::rename(&tmp, &dst).map_err(CoreError::from));
        let _ = std::fs::remove_dir(&mnt);
        if let Err(e) = placed {
            let _ = threadbox_sys::jail::unmount_leftover(&mnt);
            let _ = std::fs::remove_dir(&mnt);
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        sync_dir(&dir);
        let bytes = std::fs::metadata(&dst)?.blocks().saturating_mul(512);
        Ok(DiskClone {
            bytes,
            method: method.as_str(),
        })
    }

    pub fn template_disk(&self, id: &str, index: u32, tpl: &str) -> Result<()> {
        self.template_disk_to(id, self.uid_range.slot_base(index)?, tpl)
    }

    /// A sandbox's disk from template `tpl`, its owners moved to host uid base `own` (the
    /// slot's on the jail, 0 on the gvisor tier).
    pub(crate) fn template_disk_to(&self, id: &str, own: u32, tpl: &str) -> Result<()> {
        let src = self.existing_template_image(tpl)?;
        if !src.is_file() {
            return Err(CoreError::NotFound(format!("the disk of template {tpl}")));
        }
        // Every template image records its base (save_template_disk); the default is
        // never used, and a shift from the target's own base is a no-op.
        self.disk_from_clone(&src, id, own, own)
    }

    pub fn remove_template_disk(&self, tpl: &str) -> Result<()> {
        let old = self.legacy_templates_dir().join(format!("{tpl}.img"));
        for p in [self.template_image(tpl)?, old] {
            match std::fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Templates whose images exist; half-made ones (`.tmp`, a mount point) are removed.
    pub fn template_disks(&self) -> Vec<String> {
        let mut out = Vec::new();
        for dir in [self.templates_dir(), self.legacy_templates_dir()] {
            let Ok(rd) = std::fs::read_dir(dir) else {
                continue;
            };
            Self::template_entries(rd, &mut out);
        }
        out.sort();
        out.dedup();
        out
    }

    fn template_entries(rd: std::fs::ReadDir, out: &mut Vec<String>) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            } else if name.ends_with(".mnt") {
                let _ = threadbox_sys::jail::unmount_leftover(&e.path());
                let _ = std::fs::remove_dir(e.path());
            } else if let Some(t) = name.strip_suffix(".img") {
                out.push(t.to_string());
            }
        }
    }
}
