//! The store's side of checkpoints (issue 14, ADR 0100).

use crate::error::Result;
use crate::store::Store;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointRow {
    pub id: String,
    pub sandbox: String,
    pub tenant: String,
    pub label: Option<String>,
    pub parent: Option<String>,
    pub size_bytes: u64,
    pub method: String,
    pub created_at: i64,
    pub seq: i64,
    /// Bytes of its memory image (ADR 0195), `None` for a disk-only checkpoint.
    pub memory_bytes: Option<u64>,
}

type Tuple = (
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    i64,
    String,
    i64,
    i64,
    Option<i64>,
);

fn row(t: Tuple) -> CheckpointRow {
    CheckpointRow {
        id: t.0,
        sandbox: t.1,
        tenant: t.2,
        label: t.3,
        parent: t.4,
        size_bytes: t.5.max(0) as u64,
        method: t.6,
        created_at: t.7,
        seq: t.8,
        memory_bytes: t.9.map(|b| b.max(0) as u64),
    }
}

const COLUMNS: &str =
    "id, sandbox, tenant, label, parent, size_bytes, method, created_at, seq, memory_bytes";

impl Store {
    /// Inserts a checkpoint with the next sequence number of its sandbox and makes it the
    /// sandbox's head, in one transaction; `conflict` when the label is taken.
    pub async fn insert_checkpoint(&self, c: &CheckpointRow) -> Result<CheckpointRow> {
        // IMMEDIATE: the read of the next `seq` and the insert are one write transaction.
        // A deferred one fails with SQLITE_BUSY_SNAPSHOT (517, "database is locked", no
        // busy wait) when another writer commits between them (seen under the LangGraph
        // time-travel tests: a checkpoint while other sandboxes were being deleted).
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let (seq,): (i64,) =
            sqlx::query_as("SELECT COALESCE(MAX(seq), 0) + 1 FROM checkpoints WHERE sandbox = ?")
                .bind(&c.sandbox)
                .fetch_one(&mut *tx)
                .await?;
        let r = sqlx::query(
            "INSERT INTO checkpoints (id, sandbox, tenant, label, parent, size_bytes, method, \
             created_at, seq, memory_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&c.id)
        .bind(&c.sandbox)
        .bind(&c.tenant)
        .bind(&c.label)
        .bind(&c.parent)
        .bind(c.size_bytes as i64)
        .bind(&c.method)
        .bind(c.created_at)
        .bind(seq)
        .bind(c.memory_bytes.map(|b| b as i64))
        .execute(&mut *tx)
        .await;
        if let Err(sqlx::Error::Database(e)) = &r {
            if e.is_unique_violation() {
                return Err(crate::CoreError::Conflict(format!(
                    "sandbox {} already has a checkpoint labelled {:?}",
                    c.sandbox,
                    c.label.as_deref().unwrap_or("")
                )));
            }
        }
        r?;
        Self::set_head_in(&mut tx, &c.sandbox, &c.id).await?;
        tx.commit().await?;
        Ok(CheckpointRow { seq, ..c.clone() })
    }

    async fn set_head_in(
        tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
        sandbox: &str,
        ckpt: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO checkpoint_heads (sandbox, checkpoint) VALUES (?, ?) \
             ON CONFLICT (sandbox) DO UPDATE SET checkpoint = excluded.checkpoint",
        )
        .bind(sandbox)
        .bind(ckpt)
        .execute(&mut **tx)
        .await?;
        Ok(())
    }

    /// Makes `ckpt` the head of `sandbox` (after a rewind to it).
    pub async fn set_checkpoint_head(&self, sandbox: &str, ckpt: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        Self::set_head_in(&mut tx, sandbox, ckpt).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The head of `sandbox`, if it still exists.
    pub async fn checkpoint_head(&self, sandbox: &str) -> Result<Option<String>> {
        let r: Option<(String,)> = sqlx::query_as(
            "SELECT h.checkpoint FROM checkpoint_heads h JOIN checkpoints c \
             ON c.id = h.checkpoint WHERE h.sandbox = ?",
        )
        .bind(sandbox)
        .fetch_optional(&self.pool)
        .await?;
        Ok(r.map(|t| t.0))
    }

    /// The checkpoints of `sandbox`, oldest first.
    pub async fn checkpoints_of(&self, sandbox: &str) -> Result<Vec<CheckpointRow>> {
        let rows: Vec<Tuple> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM checkpoints WHERE sandbox = ? ORDER BY seq"
        ))
        .bind(sandbox)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(row).collect())
    }

    /// Every checkpoint (reconciliation, disk usage).
    pub async fn all_checkpoints(&self) -> Result<Vec<CheckpointRow>> {
        let rows: Vec<Tuple> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM checkpoints ORDER BY sandbox, seq"
        ))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(row).collect())
    }

    /// Bytes the checkpoints of `tenant` hold.
    pub async fn checkpoint_bytes(&self, tenant: &str) -> Result<u64> {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COALESCE(SUM(size_bytes), 0) FROM checkpoints WHERE tenant = ?")
                .bind(tenant)
                .fetch_one(&self.pool)
                .await?;
        Ok(n.max(0) as u64)
    }

    /// Makes checkpoint `id` disk-only: its memory image is gone (reconciliation), so its
    /// bytes leave `size_bytes` too.
    pub async fn forget_checkpoint_memory(&self, id: &str) -> Result<()> {
        sqlx::query(
            "UPDATE checkpoints SET size_bytes = MAX(size_bytes - COALESCE(memory_bytes, 0), 0), \
             memory_bytes = NULL WHERE id = ?",
        )
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn delete_checkpoint(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM checkpoints WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Forgets every checkpoint of a deleted sandbox (their clones went with its directory).
    pub async fn delete_checkpoints_of(&self, sandbox: &str) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("DELETE FROM checkpoints WHERE sandbox = ?")
            .bind(sandbox)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM checkpoint_heads WHERE sandbox = ?")
            .bind(sandbox)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}
