//! Templates on the fake tier (ADR 0110): copies of a checkpoint's directory under
//! `root/.templates/<tpl>`, enough for the router and manager tests of every door.

use super::checkpoint::copy_tree;
use super::{internal, FakeDriver};
use crate::driver::DiskClone;
use crate::error::{CoreError, Result};
use std::path::PathBuf;

impl FakeDriver {
    fn templates_dir(&self) -> PathBuf {
        self.root.join(".templates")
    }

    fn template_path(&self, tpl: &str) -> Result<PathBuf> {
        if tpl.is_empty() || !tpl.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(CoreError::InvalidArgument(format!(
                "bad template id {tpl:?}"
            )));
        }
        Ok(self.templates_dir().join(tpl))
    }

    pub(super) fn save_template_disk(
        &self,
        from: &str,
        ckpt: &str,
        tpl: &str,
    ) -> Result<DiskClone> {
        let src = self.dir(from).join("checkpoints").join(ckpt);
        let dst = self.template_path(tpl)?;
        std::fs::create_dir_all(self.templates_dir())
            .map_err(|e| internal("make .templates/", e))?;
        let tmp = dst.with_extension("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        copy_tree(&src, &tmp)
            .and_then(|()| std::fs::rename(&tmp, &dst))
            .map_err(|e| {
                let _ = std::fs::remove_dir_all(&tmp);
                internal("copy the checkpoint", e)
            })?;
        Ok(DiskClone {
            bytes: super::tree_usage(&dst),
            method: "copy",
        })
    }

    pub(super) fn template_disk(&self, id: &str, tpl: &str) -> Result<()> {
        let src = self.template_path(tpl)?;
        if !src.is_dir() {
            return Err(CoreError::NotFound(format!("the disk of template {tpl}")));
        }
        std::fs::create_dir_all(self.dir(id)).map_err(|e| internal("make the directory", e))?;
        let tmp = self.dir(id).join("disk.tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        copy_tree(&src, &tmp).map_err(|e| internal("copy the template", e))?;
        let _ = std::fs::remove_dir_all(self.disk(id));
        std::fs::rename(&tmp, self.disk(id)).map_err(|e| internal("place the disk", e))
    }

    pub(super) fn remove_template_disk(&self, tpl: &str) -> Result<()> {
        match std::fs::remove_dir_all(self.template_path(tpl)?) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(internal("remove the template", e)),
        }
    }

    pub(super) fn template_disks(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.templates_dir()) else {
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
