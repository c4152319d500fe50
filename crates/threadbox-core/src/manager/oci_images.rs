//! OCI images in the catalog (issue 14, ADR 0108): pull, import, remove with reference
//! counts. The layer store is threadbox-oci's, one per daemon root (`crate::oci`).

use super::*;
use crate::oci::{self, OCI_KIND};
use threadbox_api::images::{ImageEvent, ImportImageRequest, PullImageRequest};
use threadbox_oci::manifest::Platform;
use threadbox_oci::pull::{Progress, PullOptions};
use threadbox_oci::reference::Reference;
use threadbox_oci::registry::Credentials;
use threadbox_oci::store::ImageRecord;

/// Bytes between two `progress` events.
const PROGRESS_STEP: u64 = 1 << 20;

impl Manager {
    /// The API view of a catalog row: the record's facts for `oci` rows, and how many
    /// sandboxes use it.
    pub(super) async fn image_view(&self, r: ImageRow) -> Result<Image> {
        let sandboxes = self.store.image_users(&r.name).await?;
        let rec = (r.kind == OCI_KIND).then(|| oci::record(&r).ok()).flatten();
        Ok(Image {
            reference: rec.as_ref().map(|x| x.source.clone()),
            digest: rec.as_ref().map(|x| x.manifest_digest.to_string()),
            layers: rec.as_ref().map(|x| x.layers.len() as u32),
            size_bytes: rec.as_ref().map(|x| x.compressed_bytes),
            sandboxes,
            user: rec.as_ref().and_then(|x| x.run.user.clone()),
            entrypoint: rec.as_ref().and_then(|x| x.run.entrypoint.clone()),
            cmd: rec.as_ref().and_then(|x| x.run.cmd.clone()),
            name: r.name,
            kind: r.kind,
            path: r.path,
            created_at: rfc3339(r.created_at),
        })
    }

    /// Pulls an image into the catalog; `events` (when given) hears its progress.
    pub async fn pull_image(
        &self,
        caller: &Caller,
        req: PullImageRequest,
        events: Option<mpsc::Sender<ImageEvent>>,
    ) -> Result<Image> {
        let target = req.name.clone().unwrap_or_else(|| req.reference.clone());
        let r = async {
            caller.require(ops::PullImage::SCOPE)?;
            let reference = Reference::parse(req.reference.trim())?;
            let name = req
                .name
                .clone()
                .unwrap_or_else(|| req.reference.trim().to_string());
            oci::validate_name(&name)?;
            let platform = req.platform.as_deref().map(Platform::parse).transpose()?;
            let credentials = match (req.username, req.password) {
                (Some(username), Some(password)) => Some(Credentials { username, password }),
                (None, None) => None,
                _ => {
                    return Err(CoreError::InvalidArgument(
                        "username and password go together".into(),
                    ))
                }
            };
            self.check_oci_name_free(&name).await?;
            let store = oci::open_store(self.root())?;
            let opts = PullOptions {
                platform,
                credentials,
                insecure: req.insecure,
                ..Default::default()
            };
            let mut sink = ProgressSink::new(events);
            let rec =
                threadbox_oci::pull::pull(&store, &reference, &opts, &mut |p| sink.on(p)).await?;
            self.catalog_oci(&name, &store, &rec).await
        }
        .await;
        self.audit(caller, ops::PullImage::NAME, &target, &r).await;
        r
    }

    /// Imports a `docker save` archive or an OCI layout from the daemon's host.
    pub async fn import_image(&self, caller: &Caller, req: ImportImageRequest) -> Result<Image> {
        let target = req.name.clone().unwrap_or_else(|| req.path.clone());
        let r = async {
            caller.require(ops::ImportImage::SCOPE)?;
            let path = crate::images::validate_rootfs_path(&req.path)?;
            let platform = req.platform.as_deref().map(Platform::parse).transpose()?;
            if let Some(n) = &req.name {
                oci::validate_name(n)?;
                self.check_oci_name_free(n).await?;
            }
            let store = oci::open_store(self.root())?;
            let want = platform.unwrap_or_else(Platform::host);
            let (rec, tag) = threadbox_oci::archive::import(&store, &path, &want).await?;
            let name = match (req.name, tag) {
                (Some(n), _) => n,
                (None, Some(t)) => t,
                (None, None) => {
                    return Err(CoreError::InvalidArgument(format!(
                        "{} names no image tag: give a name",
                        req.path
                    )))
                }
            };
            oci::validate_name(&name)?;
            self.check_oci_name_free(&name).await?;
            self.catalog_oci(&name, &store, &rec).await
        }
        .await;
        self.audit(caller, ops::ImportImage::NAME, &target, &r)
            .await;
        r
    }

    /// Removes an image from the catalog (never `host`, never one in use) and the layers
    /// no other image uses.
    pub async fn remove_image(&self, caller: &Caller, name: &str) -> Result<()> {
        let r = async {
            caller.require(ops::RemoveImage::SCOPE)?;
            if name == HOST_IMAGE {
                return Err(CoreError::InvalidArgument(
                    "the built-in host image cannot be removed".into(),
                ));
            }
            let row = self.store.get_image(name).await?.ok_or_else(|| {
                CoreError::NotFoundOther(format!("image {name:?} does not exist"))
            })?;
            if !self.store.delete_unused_image(name).await? {
                let n = self.store.image_users(name).await?;
                return Err(CoreError::Conflict(format!(
                    "image {name:?} is used by {n} sandbox(es): delete them first"
                )));
            }
            if row.kind == OCI_KIND {
                self.gc_oci().await?;
            }
            Ok(())
        }
        .await;
        self.audit(caller, ops::RemoveImage::NAME, name, &r).await;
        r
    }

    /// `name` may become an `oci` image: it is not the host image nor another kind's.
    async fn check_oci_name_free(&self, name: &str) -> Result<()> {
        match self.store.get_image(name).await? {
            Some(r) if r.kind != OCI_KIND => Err(CoreError::Conflict(format!(
                "an image named {name:?} already exists (a {} image)",
                r.kind
            ))),
            _ => Ok(()),
        }
    }

    /// Adds (or re-points, while unused) the catalog row of a stored image.
    async fn catalog_oci(
        &self,
        name: &str,
        store: &threadbox_oci::store::Store,
        rec: &ImageRecord,
    ) -> Result<Image> {
        if rec.layers.len() > oci::MAX_LAYERS {
            return Err(CoreError::InvalidArgument(format!(
                "the image has {} layers; at most {} are supported",
                rec.layers.len(),
                oci::MAX_LAYERS
            )));
        }
        let path = store.image_path(&rec.manifest_digest).display().to_string();
        match self.store.get_image(name).await? {
            None => {
                let layers = self.measure_layers(rec).await?;
                self.store
                    .insert_image_with_layers(
                        &ImageRow {
                            name: name.to_string(),
                            kind: OCI_KIND.into(),
                            path: Some(path),
                            created_at: now_ms(),
                        },
                        &layers,
                    )
                    .await?
            }
            Some(r) if r.path.as_deref() == Some(path.as_str()) => {}
            Some(_) => {
                let layers = self.measure_layers(rec).await?;
                if !self
                    .store
                    .repoint_unused_image_with_layers(name, &path, &layers)
                    .await?
                {
                    return Err(CoreError::Conflict(format!(
                        "image {name:?} now names another digest but sandboxes use the old one: \
                         pull it under another name, or delete them first"
                    )));
                }
                self.gc_oci().await?;
            }
        }
        let row = self
            .store
            .get_image(name)
            .await?
            .ok_or_else(|| CoreError::Internal(format!("image {name:?} vanished")))?;
        self.image_view(row).await
    }

    /// The layers of `rec` with their unpacked sizes on disk (ADR 0165): a digest already
    /// measured (another image shares it) is not walked again, layers being immutable.
    async fn measure_layers(
        &self,
        rec: &ImageRecord,
    ) -> Result<Vec<crate::store_layers::LayerRow>> {
        let digests: Vec<String> = rec.layers.iter().map(|d| d.to_string()).collect();
        let known = self.store.known_layer_bytes(&digests).await?;
        let store = oci::open_store(self.root())?;
        let wanted = rec.layers.clone();
        blocking(move || {
            let mut out: Vec<crate::store_layers::LayerRow> = Vec::with_capacity(wanted.len());
            for d in &wanted {
                let digest = d.to_string();
                if out.iter().any(|l| l.digest == digest) {
                    continue;
                }
                let bytes = match known.get(&digest) {
                    Some(b) => *b,
                    None => store.layer_disk_bytes(d)?,
                };
                out.push(crate::store_layers::LayerRow { digest, bytes });
            }
            Ok(out)
        })
        .await
    }

    /// After a crash: a pull cut short may have left blobs, layers or an image record
    /// that no catalog row names; they go before anything can use them (issue 14). Then
    /// the images catalogued before layers counted in the tenants' disk (ADR 0165) get
    /// their layers measured, before any create is admitted.
    pub(super) async fn reconcile_images(&self) -> Result<()> {
        if !oci::store_dir(self.root()).is_dir() {
            return Ok(());
        }
        self.gc_oci().await?;
        for name in self.store.images_without_layers(OCI_KIND).await? {
            let Some(row) = self.store.get_image(&name).await? else {
                continue;
            };
            let measured = match oci::record(&row) {
                Ok(rec) => self.measure_layers(&rec).await,
                Err(e) => Err(e),
            };
            match measured {
                Ok(layers) => {
                    self.store.set_image_layers(&name, &layers).await?;
                    let bytes: u64 = layers.iter().map(|l| l.bytes).sum();
                    tracing::info!(image = %name, layers = layers.len(), bytes, "image layers measured for disk accounting");
                }
                // Its sandboxes cannot boot either (image_spec says why); it counts for
                // nothing until it is pulled again.
                Err(e) => tracing::warn!(image = %name, "image layers not measured: {e}"),
            }
        }
        Ok(())
    }

    /// Drops store records no catalog row points at, then their unused layers.
    async fn gc_oci(&self) -> Result<()> {
        let live: std::collections::BTreeSet<String> = self
            .store
            .list_images()
            .await?
            .into_iter()
            .filter(|r| r.kind == OCI_KIND)
            .filter_map(|r| r.path)
            .collect();
        let store = oci::open_store(self.root())?;
        blocking(move || {
            for rec in store.images() {
                let p = store.image_path(&rec.manifest_digest);
                if !live.contains(&p.display().to_string()) {
                    let _ = std::fs::remove_file(&p);
                }
            }
            store.gc()?;
            Ok(())
        })
        .await
    }
}

/// Turns the store's progress into API events, at most one `progress` per MiB.
struct ProgressSink {
    tx: Option<mpsc::Sender<ImageEvent>>,
    total: u64,
    done: u64,
    sent: u64,
}

impl ProgressSink {
    fn new(tx: Option<mpsc::Sender<ImageEvent>>) -> ProgressSink {
        ProgressSink {
            tx,
            total: 0,
            done: 0,
            sent: 0,
        }
    }

    fn on(&mut self, p: Progress) {
        let Some(tx) = &self.tx else { return };
        // A slow reader loses progress lines, never the pull: try_send drops when full.
        let ev = match p {
            Progress::Resolved {
                digest,
                layers,
                bytes,
            } => {
                self.total = bytes;
                ImageEvent::Resolved {
                    digest: digest.to_string(),
                    layers: layers as u32,
                    bytes,
                }
            }
            Progress::Bytes { n, .. } => {
                self.done += n;
                if self.done - self.sent < PROGRESS_STEP && self.done != self.total {
                    return;
                }
                self.sent = self.done;
                ImageEvent::Progress {
                    bytes: self.done,
                    total: self.total,
                }
            }
            Progress::Layer { layer, cached, .. } => ImageEvent::Layer {
                index: layer as u32,
                cached,
            },
        };
        let _ = tx.try_send(ev);
    }
}
