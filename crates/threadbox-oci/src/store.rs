//! The image store on disk (ADR 0107), under one directory:
//!
//! ```text
//! blobs/sha256/<hex>   manifests, configs and layer blobs, each verified before it is here
//! layers/<hex>/        a layer unpacked, named by its diff_id (the uncompressed digest),
//!                      so an image whose blobs are compressed differently shares it
//! images/<hex>.json    a pulled image (by manifest digest): its layers and run config
//! tmp/                 what is being written; emptied on open (a crash's leftovers)
//! ```
//!
//! Every entry appears by `rename` from `tmp/` after it was verified and synced, so a crash
//! at any point leaves either the whole entry or nothing (plus junk in `tmp/`).

use crate::digest::{Digest, Hasher};
use crate::error::{OciError, Result};
use crate::manifest::RunConfig;
use crate::unpack::{self, Ownership, UnpackReport};
use serde::{Deserialize, Serialize};
use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// What the store keeps of an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// Where it came from (`localhost:5000/team/app:1`, or `import:<file>`).
    pub source: String,
    pub manifest_digest: Digest,
    pub config_digest: Digest,
    pub platform: String,
    /// The layers' diff_ids, lowest first.
    pub layers: Vec<Digest>,
    /// Bytes of compressed blobs the layers came from.
    pub compressed_bytes: u64,
    #[serde(default)]
    pub run: RunConfig,
}

#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    seq: AtomicU64,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> OciError {
    let what = what.into();
    move |e| OciError::io(what, e)
}

impl Store {
    /// Opens (creating) the store at `root` and clears `tmp/`.
    pub fn open(root: &Path) -> Result<Store> {
        for d in ["blobs/sha256", "layers", "images", "tmp"] {
            fs::create_dir_all(root.join(d))
                .map_err(io(format!("create {}", root.join(d).display())))?;
        }
        // Layers keep the image's uids (ADR 0175), which are also host users' uids: no one
        // but root may reach them, or host uid 1000 could edit every sandbox's lower
        // `/home/app`. Sandboxes never walk this path (their mounts are made by root).
        fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(io(format!("chmod {}", root.display())))?;
        let s = Store {
            root: root.to_path_buf(),
            seq: AtomicU64::new(0),
        };
        s.clear_tmp();
        s.place_layers_apart();
        Ok(s)
    }

    /// Layers are unpacked in `tmp/`: marked as the top of directory hierarchies, it has
    /// ext4 place each new layer in a block group of its own rather than in the one where
    /// the last removed layer's inodes were freed. A journal-less ext4 skips recently
    /// freed inodes by reading each one's inode on every file it creates, which made an
    /// unpack after an `image rm` quadratic in the number of files (ADR 0170). A hint:
    /// other file systems refuse it, and nothing else depends on it.
    fn place_layers_apart(&self) {
        let tmp = self.root.join("tmp");
        if let Err(e) = File::open(&tmp).and_then(|f| threadbox_sys::fs::tree::mark_top_dir(&f)) {
            tracing::debug!(dir = %tmp.display(), error = %e, "layers not placed apart");
        }
    }

    fn clear_tmp(&self) {
        if let Ok(rd) = fs::read_dir(self.root.join("tmp")) {
            for e in rd.flatten() {
                let p = e.path();
                let _ = if p.is_dir() && !p.is_symlink() {
                    fs::remove_dir_all(&p)
                } else {
                    fs::remove_file(&p)
                };
            }
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A fresh name in `tmp/`. It holds the time as well as a counter: the store is
    /// opened anew per request, and ext4 places a directory made in `tmp/` by a hash of
    /// its name (ADR 0170), so the same name for the same layer would land again in the
    /// block group its last copy just freed.
    pub fn tmp_path(&self, tag: &str) -> PathBuf {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        self.root
            .join("tmp")
            .join(format!("{tag}.{}.{n}.{t:x}", std::process::id()))
    }

    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(d.hex())
    }

    pub fn layer_path(&self, diff_id: &Digest) -> PathBuf {
        self.root.join("layers").join(diff_id.hex())
    }

    /// Bytes the unpacked layer `diff_id` occupies on disk (ADR 0165: what a tenant's
    /// disk usage counts for it): the allocated blocks of every entry under it, symlinks
    /// not followed and a file of several links counted once, as `du` counts. A layer
    /// never changes once here, so the daemon measures it once.
    pub fn layer_disk_bytes(&self, diff_id: &Digest) -> Result<u64> {
        tree_disk_bytes(&self.layer_path(diff_id))
    }

    pub fn has_blob(&self, d: &Digest) -> bool {
        self.blob_path(d).is_file()
    }

    pub fn has_layer(&self, diff_id: &Digest) -> bool {
        self.layer_path(diff_id).is_dir()
    }

    /// A blob writer: bytes go to a temp file and are hashed; [`BlobWriter::commit`]
    /// checks the digest and size, syncs and renames. Dropped uncommitted, it removes the
    /// temp file.
    pub fn blob_writer(&self, want: &Digest, size: Option<u64>) -> Result<BlobWriter> {
        let tmp = self.tmp_path(want.hex());
        let file = File::create(&tmp).map_err(io(format!("create {}", tmp.display())))?;
        Ok(BlobWriter {
            file: Some(file),
            tmp,
            dest: self.blob_path(want),
            want: want.clone(),
            size,
            hasher: Hasher::new(),
        })
    }

    /// Stores `bytes` as the blob `want` (after checking the digest).
    pub fn put_blob(&self, want: &Digest, bytes: &[u8]) -> Result<()> {
        let mut w = self.blob_writer(want, Some(bytes.len() as u64))?;
        w.write(bytes)?;
        w.commit()
    }

    pub fn read_blob(&self, d: &Digest, max: u64) -> Result<Vec<u8>> {
        let p = self.blob_path(d);
        let m = fs::metadata(&p).map_err(io(format!("blob {d}")))?;
        if m.len() > max {
            return Err(OciError::Invalid(format!(
                "blob {d} is larger than {max} bytes"
            )));
        }
        let b = fs::read(&p).map_err(io(format!("read blob {d}")))?;
        if Digest::of(&b) != *d {
            return Err(OciError::Integrity(format!(
                "stored blob {d} does not match its digest"
            )));
        }
        Ok(b)
    }

    /// Unpacks the stored blob `blob` as the layer `diff_id` (once: an existing layer is
    /// kept). The unpacked tree's digest must be `diff_id`, or nothing is kept.
    pub fn unpack_layer(
        &self,
        blob: &Digest,
        diff_id: &Digest,
        own: Ownership,
    ) -> Result<Option<UnpackReport>> {
        if self.has_layer(diff_id) {
            return Ok(None);
        }
        let f = File::open(self.blob_path(blob)).map_err(io(format!("open blob {blob}")))?;
        // Verified when it was stored.
        self.unpack_into_layer(blob, diff_id, own, f, |_| Ok(()))
    }

    /// Unpacks the layer blob `blob` of `size` bytes while it is read from `r` (the body
    /// of a pull as it arrives: no copy of the blob is written), as the layer `diff_id`.
    /// The blob's size and digest are checked at its end, the tree's digest against
    /// `diff_id`; unless all three hold nothing is kept (ADR 0171). Until then the tree
    /// is in `tmp/`, written by the same safe unpacker as any layer, so bytes that turn
    /// out not to be the blob never reached anything but a directory about to be removed.
    pub fn unpack_layer_from(
        &self,
        blob: &Digest,
        size: u64,
        diff_id: &Digest,
        r: impl Read + Send,
        own: Ownership,
    ) -> Result<Option<UnpackReport>> {
        let mut br = BlobReader::new(r, blob, size);
        self.unpack_into_layer(blob, diff_id, own, &mut br, |br| br.finish())
    }

    /// The common part of both: `tmp/` → verified → synced → `layers/<diff_id>`.
    /// `verify` runs after the unpack, whether it succeeded or not: its error (the blob
    /// is not the one named) explains an unpack error better than the unpack's own.
    fn unpack_into_layer<R: Read + Send>(
        &self,
        blob: &Digest,
        diff_id: &Digest,
        own: Ownership,
        mut r: R,
        verify: impl FnOnce(&mut R) -> Result<()>,
    ) -> Result<Option<UnpackReport>> {
        if self.has_layer(diff_id) {
            return Ok(None);
        }
        let tmp = self.tmp_path(&format!("layer-{}", diff_id.hex()));
        fs::create_dir(&tmp).map_err(io(format!("create {}", tmp.display())))?;
        let t0 = Instant::now();
        let unpacked =
            unpack::decompress(&mut r).and_then(|z| unpack::unpack(blob.as_str(), z, &tmp, own));
        let walked = t0.elapsed();
        let r = verify(&mut r).and(unpacked).and_then(|rep| {
            if rep.diff_id.as_ref() != Some(diff_id) {
                return Err(OciError::Integrity(format!(
                    "layer {blob} unpacks to {} but the image config says {diff_id}",
                    rep.diff_id.as_ref().map(|d| d.as_str()).unwrap_or("?")
                )));
            }
            // The layer's root directory itself: what overlay shows as the lowest `/`.
            fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .map_err(io("chmod layer"))?;
            // One sync of the file system for the whole tree, before the rename that
            // publishes it, rather than one per file (ADR 0106).
            let t1 = Instant::now();
            threadbox_sys::fs::tree::Tree::open(&tmp)
                .and_then(|t| t.sync())
                .map_err(io(format!("sync {}", tmp.display())))?;
            tracing::debug!(
                layer = %diff_id,
                entries = rep.entries,
                tar_bytes = rep.tar_bytes,
                unpack_ms = walked.as_millis() as u64,
                sync_ms = t1.elapsed().as_millis() as u64,
                "layer unpacked"
            );
            Ok(rep)
        });
        match r {
            Ok(rep) => match fs::rename(&tmp, self.layer_path(diff_id)) {
                Ok(()) => Ok(Some(rep)),
                // Another pull unpacked it meanwhile: theirs is as good.
                Err(_) if self.has_layer(diff_id) => {
                    let _ = fs::remove_dir_all(&tmp);
                    Ok(None)
                }
                Err(e) => {
                    let _ = fs::remove_dir_all(&tmp);
                    Err(OciError::io("rename layer", e))
                }
            },
            Err(e) => {
                let _ = fs::remove_dir_all(&tmp);
                Err(e)
            }
        }
    }

    /// Writes the record of an image (atomically).
    pub fn put_image(&self, rec: &ImageRecord) -> Result<PathBuf> {
        let dest = self.image_path(&rec.manifest_digest);
        let tmp = self.tmp_path("image");
        let bytes = serde_json::to_vec_pretty(rec).map_err(|e| OciError::Invalid(e.to_string()))?;
        let mut f = File::create(&tmp).map_err(io("create image record"))?;
        f.write_all(&bytes).map_err(io("write image record"))?;
        f.sync_all().map_err(io("sync image record"))?;
        fs::rename(&tmp, &dest).map_err(io("rename image record"))?;
        Ok(dest)
    }

    pub fn image_path(&self, manifest: &Digest) -> PathBuf {
        self.root
            .join("images")
            .join(format!("{}.json", manifest.hex()))
    }

    pub fn get_image(&self, manifest: &Digest) -> Result<ImageRecord> {
        let b = fs::read(self.image_path(manifest)).map_err(io(format!("image {manifest}")))?;
        serde_json::from_slice(&b)
            .map_err(|e| OciError::Integrity(format!("image record {manifest}: {e}")))
    }

    /// The records of every image in the store.
    pub fn images(&self) -> Vec<ImageRecord> {
        let mut out = Vec::new();
        if let Ok(rd) = fs::read_dir(self.root.join("images")) {
            for e in rd.flatten() {
                if let Ok(b) = fs::read(e.path()) {
                    if let Ok(r) = serde_json::from_slice::<ImageRecord>(&b) {
                        out.push(r);
                    }
                }
            }
        }
        out
    }

    /// Removes an image's record and every layer and blob no remaining image uses
    /// (`keep`: images still referenced elsewhere, e.g. by the daemon's catalog, whose
    /// records and layers stay). Returns the bytes freed (approximate: blob sizes).
    pub fn remove_image(&self, manifest: &Digest) -> Result<u64> {
        let _ = fs::remove_file(self.image_path(manifest));
        self.gc()
    }

    /// Deletes layers and blobs that no image record names.
    pub fn gc(&self) -> Result<u64> {
        let imgs = self.images();
        let mut live_layers = std::collections::BTreeSet::new();
        let mut live_blobs = std::collections::BTreeSet::new();
        for r in &imgs {
            live_blobs.insert(r.manifest_digest.hex().to_string());
            live_blobs.insert(r.config_digest.hex().to_string());
            for l in &r.layers {
                live_layers.insert(l.hex().to_string());
            }
        }
        let mut freed = 0u64;
        if let Ok(rd) = fs::read_dir(self.root.join("layers")) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if !live_layers.contains(&n) {
                    // Renamed into tmp/ first: a half-removed layer is never under layers/.
                    let t = self.tmp_path("gc");
                    if fs::rename(e.path(), &t).is_ok() {
                        let _ = fs::remove_dir_all(&t);
                        freed += 1;
                    }
                }
            }
        }
        if let Ok(rd) = fs::read_dir(self.root.join("blobs/sha256")) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if !live_blobs.contains(&n) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
        Ok(freed)
    }
}

/// Allocated bytes of the tree at `dir` (see [`Store::layer_disk_bytes`]).
pub fn tree_disk_bytes(dir: &Path) -> Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let top = fs::symlink_metadata(dir).map_err(io(format!("stat {}", dir.display())))?;
    if !top.is_dir() {
        return Err(OciError::Invalid(format!(
            "{} is not a layer directory",
            dir.display()
        )));
    }
    let mut total = top.blocks().saturating_mul(512);
    // Hard links inside a layer are one file on disk: counted at their first name.
    let mut linked = std::collections::HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = fs::read_dir(&d).map_err(io(format!("read {}", d.display())))?;
        for e in rd {
            let e = e.map_err(io(format!("read {}", d.display())))?;
            // `DirEntry::metadata` does not follow a symlink: its own blocks count.
            let m = e
                .metadata()
                .map_err(io(format!("stat {}", e.path().display())))?;
            if m.is_dir() {
                stack.push(e.path());
            } else if m.nlink() > 1 && !linked.insert((m.dev(), m.ino())) {
                continue;
            }
            total = total.saturating_add(m.blocks().saturating_mul(512));
        }
    }
    Ok(total)
}

/// A blob read as it arrives: hashed on the way, refused past its size;
/// [`BlobReader::finish`] reads what is left and checks the size and the digest.
pub struct BlobReader<R> {
    inner: R,
    want: Digest,
    size: u64,
    hasher: Hasher,
}

impl<R: Read> BlobReader<R> {
    pub fn new(inner: R, want: &Digest, size: u64) -> BlobReader<R> {
        BlobReader {
            inner,
            want: want.clone(),
            size,
            hasher: Hasher::new(),
        }
    }

    /// Reads the rest (the digest covers every byte, whatever the unpacker left unread)
    /// and checks the size and the digest.
    pub fn finish(&mut self) -> Result<()> {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match self.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    return Err(OciError::Integrity(e.to_string()))
                }
                Err(e) => {
                    return Err(OciError::Integrity(format!(
                        "blob {} after {} bytes: {e}",
                        self.want,
                        self.hasher.len()
                    )))
                }
            }
        }
        let got_len = self.hasher.len();
        if got_len != self.size {
            return Err(OciError::Integrity(format!(
                "blob {} is truncated: {got_len} of {} bytes",
                self.want, self.size
            )));
        }
        let got = std::mem::take(&mut self.hasher).finish();
        if got != self.want {
            return Err(OciError::Integrity(format!(
                "blob {} arrived with digest {got}: refused",
                self.want
            )));
        }
        Ok(())
    }
}

impl<R: Read> Read for BlobReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if self.hasher.len() + n as u64 > self.size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("blob {} is longer than its {} bytes", self.want, self.size),
            ));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// A blob being written (see [`Store::blob_writer`]).
pub struct BlobWriter {
    file: Option<File>,
    tmp: PathBuf,
    dest: PathBuf,
    want: Digest,
    size: Option<u64>,
    hasher: Hasher,
}

impl BlobWriter {
    pub fn write(&mut self, b: &[u8]) -> Result<()> {
        if let Some(s) = self.size {
            if self.hasher.len() + b.len() as u64 > s {
                return Err(OciError::Integrity(format!(
                    "blob {} is longer than its {s} bytes",
                    self.want
                )));
            }
        }
        self.hasher.update(b);
        match &mut self.file {
            Some(f) => f
                .write_all(b)
                .map_err(io(format!("write blob {}", self.want))),
            None => Ok(()),
        }
    }

    pub fn written(&self) -> u64 {
        self.hasher.len()
    }

    /// Checks size and digest, syncs, renames into place.
    pub fn commit(mut self) -> Result<()> {
        let got_len = self.hasher.len();
        if let Some(s) = self.size {
            if got_len != s {
                return Err(OciError::Integrity(format!(
                    "blob {} is truncated: {got_len} of {s} bytes",
                    self.want
                )));
            }
        }
        let got = std::mem::take(&mut self.hasher).finish();
        if got != self.want {
            return Err(OciError::Integrity(format!(
                "blob {} arrived with digest {got}: refused",
                self.want
            )));
        }
        let f = self.file.take();
        if let Some(f) = f {
            f.sync_all().map_err(io("sync blob"))?;
        }
        fs::rename(&self.tmp, &self.dest).map_err(io("rename blob"))?;
        Ok(())
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        // Committed: the temp name no longer exists and this is a no-op.
        let _ = fs::remove_file(&self.tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn blocks(p: &Path) -> u64 {
        fs::symlink_metadata(p).unwrap().blocks() * 512
    }

    /// What `du` counts: every entry's allocated blocks, a hard-linked file once, a
    /// symlink as itself (never its target), sparse holes not at all.
    #[test]
    fn tree_disk_bytes_counts_allocated_blocks_once_per_file() {
        let outside = tempfile::tempdir().unwrap();
        let big = outside.path().join("big");
        fs::write(&big, vec![7u8; 1 << 20]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let l = dir.path();
        fs::create_dir(l.join("d")).unwrap();
        fs::write(l.join("d/a"), vec![1u8; 300 << 10]).unwrap();
        fs::hard_link(l.join("d/a"), l.join("a-again")).unwrap();
        std::os::unix::fs::symlink(&big, l.join("to-big")).unwrap();
        let sparse = File::create(l.join("sparse")).unwrap();
        sparse.set_len(64 << 20).unwrap();
        drop(sparse);
        let want = blocks(l)
            + blocks(&l.join("d"))
            + blocks(&l.join("d/a"))
            + blocks(&l.join("to-big"))
            + blocks(&l.join("sparse"));
        let got = tree_disk_bytes(l).unwrap();
        assert_eq!(got, want);
        assert!(got >= 300 << 10, "the file's data counts: {got}");
        assert!(
            got < (1 << 20) + (64 << 20),
            "neither the symlink's target nor the hole counts: {got}"
        );
        // Without the second link the total does not move: the file was counted once.
        fs::remove_file(l.join("a-again")).unwrap();
        assert_eq!(tree_disk_bytes(l).unwrap(), want);
        assert!(tree_disk_bytes(&big).is_err(), "a file is not a layer");
        assert!(tree_disk_bytes(&l.join("missing")).is_err());
    }
}
