//! Imports from files: an OCI layout (a directory, or a tar of one: what `skopeo copy
//! oci-archive:` and Docker ≥ 25's `docker save` write) and the older `docker save` format
//! (`manifest.json` with `Config`, `RepoTags`, `Layers`). A tar is first unpacked into the
//! store's `tmp/` with the same safe unpacker as layers; every blob is then verified into
//! the store and every layer unpacked by diff_id, as for a pull.

use crate::digest::{Digest, HashReader};
use crate::error::{OciError, Result};
use crate::layout::REF_NAME;
use crate::manifest::{self, ImageConfig, Parsed, Platform, MAX_DOCUMENT};
use crate::store::{ImageRecord, Store};
use crate::unpack::{self, Ownership};
use std::fs::{self, File};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// Imports the archive or layout at `path`; the record and the archive's own name for
/// the image (its tag), if it has one.
pub async fn import(
    store: &Arc<Store>,
    path: &Path,
    want: &Platform,
) -> Result<(ImageRecord, Option<String>)> {
    let (s, p, w) = (store.clone(), path.to_path_buf(), want.clone());
    tokio::task::spawn_blocking(move || import_blocking(&s, &p, &w))
        .await
        .map_err(|e| OciError::Registry(format!("import task: {e}")))?
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> OciError {
    move |e| OciError::io(what, e)
}

pub fn import_blocking(
    store: &Store,
    path: &Path,
    want: &Platform,
) -> Result<(ImageRecord, Option<String>)> {
    let meta = fs::metadata(path)
        .map_err(|_| OciError::Invalid(format!("{} does not exist", path.display())))?;
    if meta.is_dir() {
        return from_dir(store, path, want, &format!("import:{}", path.display()));
    }
    let tmp = store.tmp_path("import");
    fs::create_dir(&tmp).map_err(io(format!("create {}", tmp.display())))?;
    let r = (|| {
        let f = File::open(path).map_err(io(format!("open {}", path.display())))?;
        unpack::unpack("archive", unpack::decompressed(f)?, &tmp, Ownership::Root)?;
        from_dir(store, &tmp, want, &format!("import:{}", path.display()))
    })();
    let _ = fs::remove_dir_all(&tmp);
    r
}

/// A path named inside an archive: relative, without `..`.
fn inside(dir: &Path, rel: &str) -> Result<PathBuf> {
    let p = Path::new(rel);
    if p.components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(OciError::Invalid(format!(
            "archive names {rel:?}, outside itself"
        )));
    }
    Ok(dir.join(p))
}

fn read_small(p: &Path) -> Result<Vec<u8>> {
    let m = fs::symlink_metadata(p)
        .map_err(|_| OciError::Invalid(format!("archive lacks {}", p.display())))?;
    if !m.is_file() || m.len() > MAX_DOCUMENT {
        return Err(OciError::Invalid(format!(
            "{} is not a small regular file",
            p.display()
        )));
    }
    fs::read(p).map_err(io(format!("read {}", p.display())))
}

/// Copies the file `src` into the store as blob `want` (verified while copying).
fn store_file(store: &Store, src: &Path, want: &Digest) -> Result<u64> {
    if store.has_blob(want) {
        return fs::metadata(store.blob_path(want))
            .map(|m| m.len())
            .map_err(io("stat blob".into()));
    }
    let m = fs::symlink_metadata(src)
        .map_err(|_| OciError::Invalid(format!("archive lacks {}", src.display())))?;
    if !m.is_file() {
        return Err(OciError::Invalid(format!(
            "{} is not a regular file",
            src.display()
        )));
    }
    let mut w = store.blob_writer(want, Some(m.len()))?;
    let mut f = File::open(src).map_err(io(format!("open {}", src.display())))?;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n =
            std::io::Read::read(&mut f, &mut buf).map_err(io(format!("read {}", src.display())))?;
        if n == 0 {
            break;
        }
        w.write(&buf[..n])?;
    }
    w.commit()?;
    Ok(m.len())
}

fn finish(
    store: &Store,
    source: &str,
    want: &Platform,
    manifest_bytes: &[u8],
    cfg_bytes: &[u8],
    layer_files: Vec<(PathBuf, Digest)>,
) -> Result<ImageRecord> {
    let cfg = ImageConfig::parse(cfg_bytes)?;
    crate::pull::check_config(&cfg, want, layer_files.len())?;
    let mut total = 0;
    for ((file, blob), diff) in layer_files.iter().zip(&cfg.rootfs.diff_ids) {
        if store.has_layer(diff) {
            continue;
        }
        total += store_file(store, file, blob)?;
        let r = store.unpack_layer(blob, diff, Ownership::Image);
        let _ = fs::remove_file(store.blob_path(blob));
        r?;
    }
    let md = Digest::of(manifest_bytes);
    let cd = Digest::of(cfg_bytes);
    store.put_blob(&md, manifest_bytes)?;
    store.put_blob(&cd, cfg_bytes)?;
    let rec = ImageRecord {
        source: source.to_string(),
        manifest_digest: md,
        config_digest: cd,
        platform: want.to_string(),
        layers: cfg.rootfs.diff_ids.clone(),
        compressed_bytes: total,
        run: cfg.config.clone().unwrap_or_default(),
    };
    store.put_image(&rec)?;
    Ok(rec)
}

fn from_dir(
    store: &Store,
    dir: &Path,
    want: &Platform,
    source: &str,
) -> Result<(ImageRecord, Option<String>)> {
    if dir.join("index.json").is_file() {
        return from_layout(store, dir, want, source);
    }
    if dir.join("manifest.json").is_file() {
        return from_docker(store, dir, want, source);
    }
    Err(OciError::Invalid(format!(
        "{source}: neither an OCI layout (index.json) nor a docker save archive (manifest.json)"
    )))
}

fn from_layout(
    store: &Store,
    dir: &Path,
    want: &Platform,
    source: &str,
) -> Result<(ImageRecord, Option<String>)> {
    let blob = |d: &Digest| -> Result<Vec<u8>> {
        let b = read_small(&dir.join("blobs/sha256").join(d.hex()))?;
        if Digest::of(&b) != *d {
            return Err(OciError::Integrity(format!(
                "{source}: blob {d} does not match its digest"
            )));
        }
        Ok(b)
    };
    #[derive(serde::Deserialize)]
    struct Entry {
        digest: Digest,
        #[serde(default)]
        annotations: std::collections::BTreeMap<String, String>,
    }
    #[derive(serde::Deserialize)]
    struct Index {
        manifests: Vec<Entry>,
    }
    let idx: Index = serde_json::from_slice(&read_small(&dir.join("index.json"))?)
        .map_err(|e| OciError::Invalid(format!("{source}: index.json: {e}")))?;
    let first = idx
        .manifests
        .first()
        .ok_or_else(|| OciError::Invalid(format!("{source}: index.json lists no image")))?;
    let tag = first.annotations.get(REF_NAME).cloned();
    let mut bytes = blob(&first.digest)?;
    let mut parsed = manifest::parse_document(&bytes, None)?;
    if let Parsed::Index(entries) = &parsed {
        let d = manifest::choose(entries, want)?.digest.clone();
        bytes = blob(&d)?;
        parsed = manifest::parse_document(&bytes, None)?;
    }
    let Parsed::Manifest { config, layers } = parsed else {
        return Err(OciError::Invalid(format!(
            "{source}: an index inside an index"
        )));
    };
    let cfg = blob(&config.digest)?;
    let files = layers
        .iter()
        .map(|l| {
            (
                dir.join("blobs/sha256").join(l.digest.hex()),
                l.digest.clone(),
            )
        })
        .collect();
    Ok((finish(store, source, want, &bytes, &cfg, files)?, tag))
}

fn from_docker(
    store: &Store,
    dir: &Path,
    want: &Platform,
    source: &str,
) -> Result<(ImageRecord, Option<String>)> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Item {
        config: String,
        #[serde(default)]
        repo_tags: Option<Vec<String>>,
        layers: Vec<String>,
    }
    let items: Vec<Item> = serde_json::from_slice(&read_small(&dir.join("manifest.json"))?)
        .map_err(|e| OciError::Invalid(format!("{source}: manifest.json: {e}")))?;
    let it = items
        .first()
        .ok_or_else(|| OciError::Invalid(format!("{source}: manifest.json lists no image")))?;
    let cfg = read_small(&inside(dir, &it.config)?)?;
    let mut files = Vec::new();
    let mut descs = Vec::new();
    for l in &it.layers {
        let p = inside(dir, l)?;
        let f =
            File::open(&p).map_err(|_| OciError::Invalid(format!("{source}: lacks layer {l}")))?;
        let (d, n) = HashReader::new(f)
            .finish()
            .map_err(io(format!("read {l}")))?;
        descs.push(serde_json::json!({"mediaType": manifest::DOCKER_MANIFEST.replace("manifest.v2+json", "image.rootfs.diff.tar"), "digest": d, "size": n}));
        files.push((p, d));
    }
    // The legacy format has no manifest: one is made (Docker v2 form) so the image has a
    // digest of its own, stable for the same archive.
    let m = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": manifest::DOCKER_MANIFEST,
        "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": Digest::of(&cfg), "size": cfg.len()},
        "layers": descs,
    });
    let mbytes = serde_json::to_vec(&m).map_err(|e| OciError::Invalid(e.to_string()))?;
    let tag = it.repo_tags.as_ref().and_then(|t| t.first().cloned());
    Ok((finish(store, source, want, &mbytes, &cfg, files)?, tag))
}
