//! The store's side of secrets (issue 13, ADR 0068): sealed values by tenant and name, and
//! the placeholders each sandbox holds. Sealing is the manager's (`manager/secrets.rs`).

use crate::error::Result;
use crate::store::Store;

/// A secret's row; `sealed` is nonce || ciphertext.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRow {
    pub tenant: String,
    pub name: String,
    pub host: String,
    pub header: String,
    pub format: String,
    pub sealed: Vec<u8>,
    pub updated_at: i64,
}

type Row = (String, String, String, String, String, Vec<u8>, i64);

fn from_row(r: Row) -> SecretRow {
    SecretRow {
        tenant: r.0,
        name: r.1,
        host: r.2,
        header: r.3,
        format: r.4,
        sealed: r.5,
        updated_at: r.6,
    }
}

const COLS: &str = "tenant, name, host, header, format, sealed, updated_at";

impl Store {
    pub async fn put_secret(&self, s: &SecretRow) -> Result<()> {
        sqlx::query(
            "INSERT INTO secrets (tenant, name, host, header, format, sealed, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, name) DO UPDATE SET \
             host = excluded.host, header = excluded.header, format = excluded.format, \
             sealed = excluded.sealed, updated_at = excluded.updated_at",
        )
        .bind(&s.tenant)
        .bind(&s.name)
        .bind(&s.host)
        .bind(&s.header)
        .bind(&s.format)
        .bind(&s.sealed)
        .bind(s.updated_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn get_secret(&self, tenant: &str, name: &str) -> Result<Option<SecretRow>> {
        let r: Option<Row> = sqlx::query_as(&format!(
            "SELECT {COLS} FROM secrets WHERE tenant = ? AND name = ?"
        ))
        .bind(tenant)
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        Ok(r.map(from_row))
    }

    pub async fn list_secrets(&self, tenant: &str) -> Result<Vec<SecretRow>> {
        let r: Vec<Row> = sqlx::query_as(&format!(
            "SELECT {COLS} FROM secrets WHERE tenant = ? ORDER BY name"
        ))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        Ok(r.into_iter().map(from_row).collect())
    }

    /// Whether a row was removed.
    pub async fn delete_secret(&self, tenant: &str, name: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM secrets WHERE tenant = ? AND name = ?")
            .bind(tenant)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    pub async fn put_sandbox_secret(&self, id: &str, name: &str, placeholder: &str) -> Result<()> {
        sqlx::query(
            "INSERT OR REPLACE INTO sandbox_secrets (sandbox_id, name, placeholder) VALUES (?, ?, ?)",
        )
        .bind(id)
        .bind(name)
        .bind(placeholder)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// (name, placeholder) of sandbox `id`, by name.
    pub async fn sandbox_secrets(&self, id: &str) -> Result<Vec<(String, String)>> {
        Ok(sqlx::query_as(
            "SELECT name, placeholder FROM sandbox_secrets WHERE sandbox_id = ? ORDER BY name",
        )
        .bind(id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The sandboxes of `tenant` holding a placeholder for `name`.
    pub async fn sandboxes_with_secret(&self, tenant: &str, name: &str) -> Result<Vec<String>> {
        let r: Vec<(String,)> = sqlx::query_as(
            "SELECT s.id FROM sandbox_secrets b JOIN sandboxes s ON s.id = b.sandbox_id \
             WHERE s.tenant = ? AND b.name = ?",
        )
        .bind(tenant)
        .bind(name)
        .fetch_all(&self.pool)
        .await?;
        Ok(r.into_iter().map(|(id,)| id).collect())
    }
}
