//! OCI images in the daemon (issue 14, ADR 0108): the layer store under `<root>/oci`
//! (threadbox-oci), how an `oci` catalog row becomes overlay lowers, and the image
//! config's defaults for commands.

use crate::error::{CoreError, Result};
use crate::images::ImageSpec;
use crate::store::ImageRow;
use std::path::{Path, PathBuf};
use threadbox_oci::store::ImageRecord;
use threadbox_oci::OciError;

pub const OCI_KIND: &str = "oci";

/// The most layers one image may have: overlayfs takes its lowers in one mount option
/// string of at most a page (4096 bytes), and each relative lower path is ~80 bytes.
pub const MAX_LAYERS: usize = 40;

pub fn store_dir(root: &Path) -> PathBuf {
    root.join("oci")
}

impl From<OciError> for CoreError {
    fn from(e: OciError) -> CoreError {
        match e {
            OciError::Invalid(m) => CoreError::InvalidArgument(m),
            OciError::NotFound(m) => CoreError::NotFoundOther(m),
            OciError::Unauthorized(m) => CoreError::PermissionDenied(m),
            OciError::Integrity(m) => CoreError::Unavailable(format!("refused: {m}")),
            e @ OciError::Hostile { .. } => CoreError::InvalidArgument(e.to_string()),
            OciError::Registry(m) => CoreError::Unavailable(m),
            e @ OciError::Io { .. } => CoreError::Internal(e.to_string()),
        }
    }
}

/// The record an `oci` row points at.
pub fn record(row: &ImageRow) -> Result<ImageRecord> {
    let path = row
        .path
        .as_deref()
        .ok_or_else(|| CoreError::Internal(format!("image {} has no record", row.name)))?;
    let bytes = std::fs::read(path)
        .map_err(|e| CoreError::Internal(format!("image {}: record {path}: {e}", row.name)))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| CoreError::Internal(format!("image {}: record {path}: {e}", row.name)))
}

/// The overlay lowers of an `oci` image: its layer directories, topmost first (overlay's
/// order), each of which must exist.
pub fn image_spec(root: &Path, row: &ImageRow) -> Result<ImageSpec> {
    let rec = record(row)?;
    let layers = store_dir(root).join("layers");
    let mut lower = Vec::with_capacity(rec.layers.len());
    for d in rec.layers.iter().rev() {
        let p = layers.join(d.hex());
        if !p.is_dir() {
            return Err(CoreError::Unavailable(format!(
                "image {}: layer {d} is missing from the store (pull it again)",
                row.name
            )));
        }
        lower.push(p);
    }
    if lower.is_empty() {
        return Err(CoreError::InvalidArgument(format!(
            "image {} has no layers",
            row.name
        )));
    }
    Ok(ImageSpec {
        lower,
        binds: vec![],
        image_owners: true,
    })
}

/// Catalog names of OCI images: a reference's characters (`/`, `:`, `@` included).
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/' | b':' | b'@')
        });
    if ok {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "image name {name:?} must be 1-255 characters of a-z, A-Z, 0-9, - _ . / : @"
        )))
    }
}

/// Applies the image config's `Env` (the request's variables win) and `WorkingDir` (when
/// the request names no directory).
pub fn apply_defaults(
    rec: &ImageRecord,
    env: &mut std::collections::BTreeMap<String, String>,
    cwd: &mut Option<String>,
) {
    if let Some(vars) = &rec.run.env {
        for kv in vars {
            if let Some((k, v)) = kv.split_once('=') {
                if !k.is_empty() {
                    env.entry(k.to_string()).or_insert_with(|| v.to_string());
                }
            }
        }
    }
    if cwd.is_none() {
        if let Some(w) = rec
            .run
            .working_dir
            .as_deref()
            .filter(|w| w.starts_with('/'))
        {
            *cwd = Some(w.to_string());
        }
    }
}

/// The daemon's layer store of `root` (one per root and process: opening one clears its
/// `tmp/`, which another pull of the same process may be writing).
pub fn open_store(root: &Path) -> Result<std::sync::Arc<threadbox_oci::store::Store>> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    static STORES: OnceLock<Mutex<HashMap<PathBuf, Arc<threadbox_oci::store::Store>>>> =
        OnceLock::new();
    let mut m = STORES
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| CoreError::Internal("the layer store registry is poisoned".into()))?;
    if let Some(s) = m.get(root) {
        return Ok(s.clone());
    }
    let s = Arc::new(threadbox_oci::store::Store::open(&store_dir(root))?);
    m.insert(root.to_path_buf(), s.clone());
    Ok(s)
}

/// [`threadbox_api::ops::PullImage`] with its progress heard on a channel: what the REST
/// door runs for its NDJSON stream (the operation's name, scope and route are the same).
pub struct PullImageWithProgress {
    pub request: threadbox_api::images::PullImageRequest,
    pub events: tokio::sync::mpsc::Sender<threadbox_api::images::ImageEvent>,
}

impl threadbox_api::ops::Operation for PullImageWithProgress {
    type Output = threadbox_api::Image;
    const NAME: &'static str = threadbox_api::ops::PullImage::NAME;
    const SCOPE: threadbox_api::Scope = threadbox_api::ops::PullImage::SCOPE;
    const METHOD: threadbox_api::ops::HttpMethod = threadbox_api::ops::PullImage::METHOD;
    const PATH: &'static str = threadbox_api::ops::PullImage::PATH;
}

impl crate::ops::Run for PullImageWithProgress {
    async fn run(self, m: &crate::Manager, caller: &crate::Caller) -> Result<threadbox_api::Image> {
        m.pull_image(caller, self.request, Some(self.events)).await
    }
}
