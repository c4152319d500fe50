//! The layer store (issue 14): read-only directory layers stored once by digest under
//! `<root>/layers/sha256/<hex>/`, for OCI image layers unpacked by `threadbox-oci` and used
//! as overlay lower layers. A layer appears whole or not at all: it is unpacked into a
//! staging directory and renamed into place; a crash leaves only staging directories,
//! removed when the store opens. Which images use a layer (reference counts, garbage
//! collection) is the image store's; see `docs/layers.md`.
//!
//! Sandbox disks, checkpoints and forks are not layers: they are clones of the sandbox's
//! ext4 image (ADR 0100).

use crate::error::{CoreError, Result};
use std::path::{Path, PathBuf};

/// The store under a daemon root.
#[derive(Debug, Clone)]
pub struct LayerStore {
    dir: PathBuf,
}

/// A directory being filled; removed on drop unless [`LayerStore::commit`]ted.
#[derive(Debug)]
pub struct Staged {
    path: PathBuf,
    committed: bool,
}

impl Staged {
    /// Where to unpack the layer.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// `sha256:<64 lowercase hex>` → the hex; anything else is refused (it becomes a path).
fn hex_of(digest: &str) -> Result<&str> {
    let hex = digest.strip_prefix("sha256:").unwrap_or("");
    if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(CoreError::InvalidArgument(format!(
            "layer digest {digest:?} is not sha256:<64 lowercase hex digits>"
        )));
    }
    Ok(hex)
}

impl LayerStore {
    /// Opens (creating) `<root>/layers`, removing what interrupted stagings left.
    pub fn open(root: &Path) -> Result<LayerStore> {
        use std::os::unix::fs::PermissionsExt;
        let dir = root.join("layers");
        std::fs::create_dir_all(dir.join("sha256"))?;
        // Traversable (sandbox users read lower layers through it), not listable.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))?;
        let staging = dir.join(".staging");
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging)?;
        std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o700))?;
        Ok(LayerStore { dir })
    }

    /// A new empty staging directory (only root can reach it).
    pub fn stage(&self) -> Result<Staged> {
        let path = self
            .dir
            .join(".staging")
            .join(uuid::Uuid::new_v4().simple().to_string());
        std::fs::create_dir(&path)?;
        Ok(Staged {
            path,
            committed: false,
        })
    }

    /// Moves `staged` into place as layer `digest` (the caller verified the content) and
    /// returns its path. A layer of that digest already there wins and `staged` is dropped.
    pub fn commit(&self, mut staged: Staged, digest: &str) -> Result<PathBuf> {
        let dst = self.dir.join("sha256").join(hex_of(digest)?);
        if dst.is_dir() {
            return Ok(dst);
        }
        match std::fs::rename(&staged.path, &dst) {
            Ok(()) => {
                staged.committed = true;
                if let Ok(d) = std::fs::File::open(self.dir.join("sha256")) {
                    let _ = d.sync_all();
                }
                Ok(dst)
            }
            // Another commit of the same digest won the race.
            Err(_) if dst.is_dir() => Ok(dst),
            Err(e) => Err(e.into()),
        }
    }

    /// The layer's directory, if stored.
    pub fn path(&self, digest: &str) -> Result<Option<PathBuf>> {
        let p = self.dir.join("sha256").join(hex_of(digest)?);
        Ok(p.is_dir().then_some(p))
    }

    /// Every stored layer's digest.
    pub fn list(&self) -> Vec<String> {
        std::fs::read_dir(self.dir.join("sha256"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| format!("sha256:{}", e.file_name().to_string_lossy()))
            .collect()
    }

    /// Removes a layer: renamed out of `sha256/` first (it vanishes at once, whole), then
    /// deleted. Absent: Ok. The caller checks that no image uses it.
    pub fn remove(&self, digest: &str) -> Result<()> {
        let p = self.dir.join("sha256").join(hex_of(digest)?);
        let trash = self.stage()?;
        std::fs::remove_dir(trash.path())?;
        match std::fs::rename(&p, trash.path()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e.into()),
        }
        // `trash` is dropped here: the directory goes.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn a_layer_appears_whole_once_and_goes() {
        let root = std::env::temp_dir().join(format!("tb-layers-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let s = LayerStore::open(&root).unwrap();
        assert!(s.path(D).unwrap().is_none());
        let st = s.stage().unwrap();
        std::fs::write(st.path().join("f"), b"x").unwrap();
        let p = s.commit(st, D).unwrap();
        assert_eq!(std::fs::read(p.join("f")).unwrap(), b"x");
        // A second commit of the same digest keeps the first.
        let st = s.stage().unwrap();
        std::fs::write(st.path().join("g"), b"y").unwrap();
        let staged = st.path().to_path_buf();
        assert_eq!(s.commit(st, D).unwrap(), p);
        assert!(!p.join("g").exists() && !staged.exists());
        assert_eq!(s.list(), vec![D.to_string()]);
        // A dropped staging leaves nothing; bad digests are refused.
        let st = s.stage().unwrap();
        let gone = st.path().to_path_buf();
        drop(st);
        assert!(!gone.exists());
        assert!(s.path("sha256:../../etc").is_err());
        assert!(s.commit(s.stage().unwrap(), "md5:00").is_err());
        s.remove(D).unwrap();
        assert!(s.path(D).unwrap().is_none());
        s.remove(D).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
    }
}
