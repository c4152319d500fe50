//! The store's side of image layers in the tenants' disk accounting (issue 14 scope 6,
//! ADR 0165): which layers each OCI catalog image stacks and their unpacked sizes, and
//! the distinct layers a tenant's sandboxes and templates use.

use crate::error::Result;
use crate::store::{ImageRow, Store};
use std::collections::BTreeMap;

/// Bytes of the distinct layers (by digest) the images of `tenant`'s sandboxes and
/// templates use; binds the tenant twice. A checkpoint is of a sandbox's disk, on that
/// sandbox's image: its layers are the sandbox's, already counted.
pub(crate) const TENANT_LAYER_BYTES: &str = "(SELECT COALESCE(SUM(b), 0) FROM \
     (SELECT MAX(bytes) AS b FROM image_layers WHERE image IN \
     (SELECT image FROM sandboxes WHERE tenant = ? UNION SELECT image FROM templates WHERE tenant = ?) \
     GROUP BY digest))";

/// One layer of an image: its diff_id and its unpacked size on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerRow {
    pub digest: String,
    pub bytes: u64,
}

impl Store {
    /// Inserts the catalog row of an OCI image with its layers, in one transaction: no
    /// create can see the image without its layers' sizes.
    pub async fn insert_image_with_layers(
        &self,
        img: &ImageRow,
        layers: &[LayerRow],
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        let res =
            sqlx::query("INSERT INTO images (name, kind, path, created_at) VALUES (?, ?, ?, ?)")
                .bind(&img.name)
                .bind(&img.kind)
                .bind(&img.path)
                .bind(img.created_at)
                .execute(&mut *tx)
                .await;
        match res {
            Ok(_) => {}
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                return Err(crate::error::CoreError::Conflict(format!(
                    "an image named {:?} already exists",
                    img.name
                )))
            }
            Err(e) => return Err(e.into()),
        }
        put_layers(&mut tx, &img.name, layers).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Points the image `name` at another record and its layers, only while no sandbox
    /// or template uses it (checked in the same transaction). `false`: in use, or gone.
    pub async fn repoint_unused_image_with_layers(
        &self,
        name: &str,
        path: &str,
        layers: &[LayerRow],
    ) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let r = sqlx::query(
            "UPDATE images SET path = ? WHERE name = ? \
             AND NOT EXISTS (SELECT 1 FROM sandboxes WHERE image = ?) \
             AND NOT EXISTS (SELECT 1 FROM templates WHERE image = ?)",
        )
        .bind(path)
        .bind(name)
        .bind(name)
        .bind(name)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM image_layers WHERE image = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        put_layers(&mut tx, name, layers).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Replaces the layer rows of image `name` (the start's backfill of images catalogued
    /// before layers were counted). Nothing happens when the image row is gone.
    pub async fn set_image_layers(&self, name: &str, layers: &[LayerRow]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM image_layers WHERE image = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let exists: Option<i64> = sqlx::query_scalar("SELECT 1 FROM images WHERE name = ?")
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?;
        if exists.is_some() {
            put_layers(&mut tx, name, layers).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The layers of image `name`, by digest.
    pub async fn image_layers(&self, name: &str) -> Result<Vec<LayerRow>> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT digest, bytes FROM image_layers WHERE image = ? ORDER BY digest",
        )
        .bind(name)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(digest, bytes)| LayerRow {
                digest,
                bytes: bytes.max(0) as u64,
            })
            .collect())
    }

    /// The measured size of each of `digests` already known (a layer another image
    /// shares was measured when that image was catalogued).
    pub async fn known_layer_bytes(&self, digests: &[String]) -> Result<BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        for d in digests {
            let b: Option<i64> =
                sqlx::query_scalar("SELECT MAX(bytes) FROM image_layers WHERE digest = ?")
                    .bind(d)
                    .fetch_one(&self.pool)
                    .await?;
            if let Some(b) = b {
                out.insert(d.clone(), b.max(0) as u64);
            }
        }
        Ok(out)
    }

    /// Catalog rows of `kind` that have no layer rows.
    pub async fn images_without_layers(&self, kind: &str) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT name FROM images WHERE kind = ? \
             AND NOT EXISTS (SELECT 1 FROM image_layers l WHERE l.image = images.name) \
             ORDER BY name",
        )
        .bind(kind)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Bytes of the distinct layers `tenant`'s sandboxes and templates use.
    pub async fn layer_bytes_of(&self, tenant: &str) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(&format!("SELECT {TENANT_LAYER_BYTES}"))
            .bind(tenant)
            .bind(tenant)
            .fetch_one(&self.pool)
            .await?;
        Ok(n.max(0) as u64)
    }

    /// Bytes a new sandbox (or template) of `tenant` on `image` adds to its layers: the
    /// image's layers none of the tenant's sandboxes and templates uses yet.
    pub async fn new_layer_bytes(&self, tenant: &str, image: &str) -> Result<u64> {
        let n: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(b), 0) FROM (SELECT MAX(bytes) AS b FROM image_layers \
             WHERE image = ? AND digest NOT IN (SELECT digest FROM image_layers WHERE image IN \
             (SELECT image FROM sandboxes WHERE tenant = ? \
              UNION SELECT image FROM templates WHERE tenant = ?)) \
             GROUP BY digest)",
        )
        .bind(image)
        .bind(tenant)
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok(n.max(0) as u64)
    }
}

async fn put_layers(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    image: &str,
    layers: &[LayerRow],
) -> Result<()> {
    for l in layers {
        // An image may name one layer twice (two identical diffs): one row.
        sqlx::query(
            "INSERT INTO image_layers (image, digest, bytes) VALUES (?, ?, ?) \
             ON CONFLICT (image, digest) DO UPDATE SET bytes = excluded.bytes",
        )
        .bind(image)
        .bind(&l.digest)
        .bind(l.bytes.min(i64::MAX as u64) as i64)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "store_layers_tests.rs"]
mod tests;
