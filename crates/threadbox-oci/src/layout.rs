//! OCI image layouts (`oci-layout`, `index.json`, `blobs/sha256/…`): written by
//! [`LayoutWriter`] (tests build their images with it; an export later) and read by the
//! import ([`crate::archive`]).

use crate::digest::Digest;
use crate::error::{OciError, Result};
use crate::manifest::{Descriptor, Platform, OCI_INDEX, OCI_MANIFEST};
use std::fs;
use std::path::{Path, PathBuf};

pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// The annotation naming a manifest of a layout (its "tag").
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

fn io(what: &str) -> impl FnOnce(std::io::Error) -> OciError + '_ {
    move |e| OciError::io(what.to_string(), e)
}

/// Writes an OCI layout.
pub struct LayoutWriter {
    dir: PathBuf,
    tags: Vec<serde_json::Value>,
}

/// A layer to put in an image: its blob (compressed or not) and its uncompressed tar's
/// digest.
pub struct LayerBlob {
    pub media_type: &'static str,
    pub blob: Vec<u8>,
    pub diff_id: Digest,
}

impl LayerBlob {
    pub fn plain(tar: Vec<u8>) -> LayerBlob {
        LayerBlob {
            media_type: LAYER_TAR,
            diff_id: Digest::of(&tar),
            blob: tar,
        }
    }
    pub fn gzip(tar: &[u8]) -> LayerBlob {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        let _ = gz.write_all(tar);
        LayerBlob {
            media_type: LAYER_GZIP,
            diff_id: Digest::of(tar),
            blob: gz.finish().unwrap_or_default(),
        }
    }
    pub fn zstd(tar: &[u8]) -> LayerBlob {
        LayerBlob {
            media_type: LAYER_ZSTD,
            diff_id: Digest::of(tar),
            blob: ruzstd::encoding::compress_to_vec(
                tar,
                ruzstd::encoding::CompressionLevel::Fastest,
            ),
        }
    }
}

impl LayoutWriter {
    pub fn create(dir: &Path) -> Result<LayoutWriter> {
        fs::create_dir_all(dir.join("blobs/sha256")).map_err(io("create layout"))?;
        fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)
            .map_err(io("write oci-layout"))?;
        Ok(LayoutWriter {
            dir: dir.to_path_buf(),
            tags: Vec::new(),
        })
    }

    pub fn blob(&self, media_type: &str, bytes: &[u8]) -> Result<Descriptor> {
        let d = Digest::of(bytes);
        fs::write(self.dir.join("blobs/sha256").join(d.hex()), bytes).map_err(io("write blob"))?;
        Ok(Descriptor {
            media_type: media_type.into(),
            digest: d,
            size: bytes.len() as u64,
            platform: None,
        })
    }

    /// Adds an image manifest of `layers` with `run` as its config's `config`; returns its
    /// descriptor (with `platform` set).
    pub fn image(
        &self,
        platform: &Platform,
        layers: &[LayerBlob],
        run: serde_json::Value,
    ) -> Result<Descriptor> {
        let mut descs = Vec::new();
        for l in layers {
            descs.push(self.blob(l.media_type, &l.blob)?);
        }
        let cfg = serde_json::json!({
            "architecture": platform.architecture,
            "os": platform.os,
            "config": run,
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.as_str()).collect::<Vec<_>>()},
        });
        let cfg = self.blob(
            CONFIG,
            &serde_json::to_vec(&cfg).map_err(|e| OciError::Invalid(e.to_string()))?,
        )?;
        let m = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": cfg,
            "layers": descs,
        });
        let mut d = self.blob(
            OCI_MANIFEST,
            &serde_json::to_vec(&m).map_err(|e| OciError::Invalid(e.to_string()))?,
        )?;
        d.platform = Some(platform.clone());
        Ok(d)
    }

    /// Adds an image index of `manifests`.
    pub fn index(&self, manifests: &[Descriptor]) -> Result<Descriptor> {
        let m =
            serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests});
        self.blob(
            OCI_INDEX,
            &serde_json::to_vec(&m).map_err(|e| OciError::Invalid(e.to_string()))?,
        )
    }

    /// Names `d` as `tag` in the layout's `index.json`.
    pub fn tag(&mut self, tag: &str, d: &Descriptor) -> Result<()> {
        let mut v = serde_json::to_value(d).map_err(|e| OciError::Invalid(e.to_string()))?;
        v["annotations"] = serde_json::json!({ REF_NAME: tag });
        self.tags.push(v);
        let idx =
            serde_json::json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": self.tags});
        fs::write(
            self.dir.join("index.json"),
            serde_json::to_vec(&idx).unwrap_or_default(),
        )
        .map_err(io("write index.json"))
    }
}

/// Builds an uncompressed tar of the directory `dir` (symlinks kept as symlinks; files
/// owned as they are): how tests make a layer from a root filesystem.
pub fn tar_dir(dir: &Path) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Complete);
    b.append_dir_all(".", dir)
        .map_err(|e| OciError::io(format!("tar {}", dir.display()), e))?;
    b.into_inner().map_err(io("tar"))
}
