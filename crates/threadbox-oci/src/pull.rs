//! A pull: reference → (index →) manifest → config → layers, each blob verified into the
//! store and each layer unpacked once by its diff_id; then the image's record.

use crate::digest::Digest;
use crate::error::{OciError, Result};
use crate::manifest::{self, Descriptor, ImageConfig, Parsed, Platform};
use crate::reference::Reference;
use crate::registry::{Credentials, Registry};
use crate::store::{ImageRecord, Store};
use crate::unpack::Ownership;
use bytes::{Buf, Bytes};
use std::io::{self, Read};
use std::sync::Arc;

#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// Default: the host's.
    pub platform: Option<Platform>,
    pub credentials: Option<Credentials>,
    /// Speak plain HTTP to this registry even if it is not on loopback.
    pub insecure: bool,
    pub ownership: Ownership,
}

/// What a pull or an import reports while it works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The manifest is known: this many layers of this many (compressed) bytes.
    Resolved {
        digest: Digest,
        layers: usize,
        bytes: u64,
    },
    /// `n` more bytes of layer `layer` arrived.
    Bytes { layer: usize, n: u64 },
    /// Layer `layer` is in the store (`cached`: it already was, nothing was fetched).
    Layer {
        layer: usize,
        diff_id: Digest,
        cached: bool,
    },
}

pub type ProgressFn<'a> = &'a mut (dyn FnMut(Progress) + Send);

/// Pulls `reference` into `store`.
pub async fn pull(
    store: &Arc<Store>,
    reference: &Reference,
    opts: &PullOptions,
    progress: ProgressFn<'_>,
) -> Result<ImageRecord> {
    let reg = Registry::new(reference, opts.credentials.clone(), opts.insecure)?;
    let want = opts.platform.clone().unwrap_or_else(Platform::host);
    let (mut bytes, mut ct, mut digest) = reg.manifest(&reference.manifest_ref()).await?;
    let mut parsed = manifest::parse_document(&bytes, ct.as_deref())?;
    if let Parsed::Index(entries) = &parsed {
        let d = manifest::choose(entries, &want)?.digest.clone();
        (bytes, ct, digest) = reg.manifest(d.as_str()).await?;
        if digest != d {
            return Err(OciError::Integrity(format!(
                "manifest {d} arrived as {digest}"
            )));
        }
        parsed = manifest::parse_document(&bytes, ct.as_deref())?;
    }
    let Parsed::Manifest { config, layers } = parsed else {
        return Err(OciError::Registry(
            "an index points to another index".into(),
        ));
    };
    let cfg_bytes = reg.blob_bytes(&config.digest, config.size).await?;
    let cfg = ImageConfig::parse(&cfg_bytes)?;
    check_config(&cfg, &want, layers.len())?;
    let total: u64 = layers.iter().map(|l| l.size).sum();
    progress(Progress::Resolved {
        digest: digest.clone(),
        layers: layers.len(),
        bytes: total,
    });
    for (i, (l, diff)) in layers.iter().zip(&cfg.rootfs.diff_ids).enumerate() {
        if store.has_layer(diff) {
            progress(Progress::Layer {
                layer: i,
                diff_id: diff.clone(),
                cached: true,
            });
            continue;
        }
        if store.has_blob(&l.digest) {
            unpack_blob(store, &l.digest, diff, opts.ownership).await?;
        } else {
            fetch_and_unpack(store, &reg, l, diff, opts.ownership, &mut |n| {
                progress(Progress::Bytes { layer: i, n })
            })
            .await?;
        }
        progress(Progress::Layer {
            layer: i,
            diff_id: diff.clone(),
            cached: false,
        });
    }
    store.put_blob(&digest, &bytes)?;
    store.put_blob(&config.digest, &cfg_bytes)?;
    let rec = ImageRecord {
        source: reference.to_string(),
        manifest_digest: digest,
        config_digest: config.digest,
        platform: want.to_string(),
        layers: cfg.rootfs.diff_ids.clone(),
        compressed_bytes: total,
        run: cfg.config.clone().unwrap_or_default(),
    };
    store.put_image(&rec)?;
    Ok(rec)
}

pub(crate) fn check_config(cfg: &ImageConfig, want: &Platform, n: usize) -> Result<()> {
    if cfg.rootfs.diff_ids.len() != n {
        return Err(OciError::Registry(format!(
            "the manifest lists {n} layers but the config {} diff_ids",
            cfg.rootfs.diff_ids.len()
        )));
    }
    if !cfg.os.is_empty() && cfg.os != want.os
        || !cfg.architecture.is_empty() && cfg.architecture != want.architecture
    {
        return Err(OciError::NotFound(format!(
            "the image is for {}/{}, not {want}",
            cfg.os, cfg.architecture
        )));
    }
    Ok(())
}

/// Chunks of a blob between the connection and the unpacker: enough to keep both busy,
/// few enough that a slow disk holds the registry back (TCP's window) rather than memory.
const CHUNKS_IN_FLIGHT: usize = 64;

/// Fetches the layer blob `l` and unpacks it as it arrives, on the blocking pool (ADR
/// 0171): the bytes go from the connection to the decompressor without a copy of the
/// blob on disk, and the download and the unpack overlap. The store checks the blob's
/// size and digest at its end and the tree's against `diff` before it publishes it.
async fn fetch_and_unpack(
    store: &Arc<Store>,
    reg: &Registry,
    l: &Descriptor,
    diff: &Digest,
    own: Ownership,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<()> {
    let mut body = reg.blob_stream(&l.digest).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(CHUNKS_IN_FLIGHT);
    let (s, b, d, size) = (store.clone(), l.digest.clone(), diff.clone(), l.size);
    let unpacker = tokio::task::spawn_blocking(move || {
        s.unpack_layer_from(&b, size, &d, ChannelReader::new(rx), own)
    });
    let fetched = async {
        while let Some(chunk) = body.next().await? {
            let n = chunk.len() as u64;
            if tx.send(Ok(chunk)).await.is_err() {
                break; // the unpacker stopped early: its own result says why
            }
            progress(n);
        }
        Ok::<_, OciError>(())
    }
    .await;
    if let Err(e) = &fetched {
        let _ = tx.send(Err(io::Error::other(e.to_string()))).await;
    }
    drop(tx);
    let unpacked = unpacker
        .await
        .map_err(|e| OciError::Registry(format!("unpack task: {e}")))?;
    // A broken connection explains whatever the unpacker then saw.
    fetched?;
    unpacked.map(drop)
}

/// The blocking side of the channel from the connection, as a reader. An error chunk
/// (the connection broke) is an error of the read; a closed channel is the end.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
    cur: Bytes,
}

impl ChannelReader {
    fn new(rx: tokio::sync::mpsc::Receiver<io::Result<Bytes>>) -> ChannelReader {
        ChannelReader {
            rx,
            cur: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        self.cur.advance(n);
        Ok(n)
    }
}

/// Unpacks a stored blob as a layer on the blocking pool, then drops the compressed blob
/// (the unpacked tree is what sandboxes use; keeping both would double the disk).
pub(crate) async fn unpack_blob(
    store: &Arc<Store>,
    blob: &Digest,
    diff: &Digest,
    own: Ownership,
) -> Result<()> {
    let (s, b, d) = (store.clone(), blob.clone(), diff.clone());
    let r = tokio::task::spawn_blocking(move || s.unpack_layer(&b, &d, own))
        .await
        .map_err(|e| OciError::Registry(format!("unpack task: {e}")))?;
    let _ = std::fs::remove_file(store.blob_path(blob));
    r.map(drop)
}
