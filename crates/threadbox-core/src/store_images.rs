//! The store's side of OCI images (issue 14, ADR 0108): replacing and removing catalog
//! rows, and how many sandboxes use an image (its reference count).

use crate::error::Result;
use crate::store::Store;

impl Store {
    /// Sandboxes (of any tenant, the warm pool's included) and templates (ADR 0110: a
    /// template's disk is an upper over its image) whose image is `name`.
    pub async fn image_users(&self, name: &str) -> Result<u32> {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM sandboxes WHERE image = ?) \
             + (SELECT COUNT(*) FROM templates WHERE image = ?)",
        )
        .bind(name)
        .bind(name)
        .fetch_one(&self.pool)
        .await?;
        Ok(n.max(0) as u32)
    }

    /// Deletes the image row `name` only while no sandbox uses it (one statement, so a
    /// create cannot slip in between the check and the delete; its layer rows follow by
    /// trigger, ADR 0165). `false` when it is in use or gone.
    pub async fn delete_unused_image(&self, name: &str) -> Result<bool> {
        let r = sqlx::query(
            "DELETE FROM images WHERE name = ? \
             AND NOT EXISTS (SELECT 1 FROM sandboxes WHERE image = ?) \
             AND NOT EXISTS (SELECT 1 FROM templates WHERE image = ?)",
        )
        .bind(name)
        .bind(name)
        .bind(name)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }
}
