//! The store's side of port previews (issue 13, ADR 0072): one row per published port.

use crate::error::Result;
use crate::store::Store;

/// A published port as stored. The hashes are hex SHA-256; both `None` when public.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPreview {
    pub sandbox_id: String,
    pub port: u16,
    pub public: bool,
    pub token_hash: Option<String>,
    pub cookie_hash: Option<String>,
    pub created_at: i64,
}

type Row = (String, i64, i64, Option<String>, Option<String>, i64);

fn from_row((sandbox_id, port, public, token_hash, cookie_hash, created_at): Row) -> StoredPreview {
    StoredPreview {
        sandbox_id,
        // Written from a u16 only.
        port: u16::try_from(port).unwrap_or(0),
        public: public != 0,
        token_hash,
        cookie_hash,
        created_at,
    }
}

const COLUMNS: &str = "sandbox_id, port, public, token_hash, cookie_hash, created_at";

impl Store {
    /// Publishes (or republishes, replacing token and cookie) a port.
    pub async fn put_preview(&self, p: &StoredPreview) -> Result<()> {
        sqlx::query(
            "INSERT INTO previews (sandbox_id, port, public, token_hash, cookie_hash, created_at) \
             VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (sandbox_id, port) DO UPDATE SET public = excluded.public, \
             token_hash = excluded.token_hash, cookie_hash = excluded.cookie_hash, \
             created_at = excluded.created_at",
        )
        .bind(&p.sandbox_id)
        .bind(i64::from(p.port))
        .bind(i64::from(p.public))
        .bind(&p.token_hash)
        .bind(&p.cookie_hash)
        .bind(p.created_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn get_preview(&self, sandbox_id: &str, port: u16) -> Result<Option<StoredPreview>> {
        let row: Option<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM previews WHERE sandbox_id = ? AND port = ?"
        ))
        .bind(sandbox_id)
        .bind(i64::from(port))
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(from_row))
    }

    pub async fn list_previews(&self, sandbox_id: &str) -> Result<Vec<StoredPreview>> {
        let rows: Vec<Row> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM previews WHERE sandbox_id = ? ORDER BY port"
        ))
        .bind(sandbox_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(from_row).collect())
    }

    /// Unpublishes a port; whether there was one.
    pub async fn delete_preview(&self, sandbox_id: &str, port: u16) -> Result<bool> {
        let done = sqlx::query("DELETE FROM previews WHERE sandbox_id = ? AND port = ?")
            .bind(sandbox_id)
            .bind(i64::from(port))
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}
