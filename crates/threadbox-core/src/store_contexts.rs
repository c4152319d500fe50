//! The store's side of interpreter contexts (issue 15, ADR 0084): the contexts a sandbox
//! had, so that one its agent no longer has is reported `lost`, with why.

use crate::error::Result;
use crate::store::{now_ms, Store};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredContext {
    pub sandbox_id: String,
    pub name: String,
    pub context_id: String,
    pub language: String,
    /// Milliseconds since the epoch.
    pub created_at: i64,
    /// `stopped`, `daemon-restart`, `agent-restart`; `None` while the agent has it.
    pub lost_reason: Option<String>,
    pub lost_at: Option<i64>,
}

type Row = (
    String,
    String,
    String,
    String,
    i64,
    Option<String>,
    Option<i64>,
);

fn from_row(
    (sandbox_id, name, context_id, language, created_at, lost_reason, lost_at): Row,
) -> StoredContext {
    StoredContext {
        sandbox_id,
        name,
        context_id,
        language,
        created_at,
        lost_reason,
        lost_at,
    }
}

impl Store {
    /// Records a context the agent made (again): it is not lost.
    pub async fn put_context(&self, c: &StoredContext) -> Result<()> {
        sqlx::query(
            "INSERT INTO contexts (sandbox_id, name, context_id, language, created_at, \
             lost_reason, lost_at) VALUES (?, ?, ?, ?, ?, NULL, NULL) \
             ON CONFLICT (sandbox_id, name) DO UPDATE SET context_id = excluded.context_id, \
             language = excluded.language, created_at = excluded.created_at, \
             lost_reason = NULL, lost_at = NULL",
        )
        .bind(&c.sandbox_id)
        .bind(&c.name)
        .bind(&c.context_id)
        .bind(&c.language)
        .bind(c.created_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub async fn list_stored_contexts(&self, sandbox_id: &str) -> Result<Vec<StoredContext>> {
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT sandbox_id, name, context_id, language, created_at, lost_reason, lost_at \
             FROM contexts WHERE sandbox_id = ? ORDER BY created_at, name",
        )
        .bind(sandbox_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(from_row).collect())
    }

    /// Marks the contexts of a sandbox not yet lost as lost, with `reason` (a stop ends
    /// every worker). An earlier reason is kept: it was the first to know.
    pub async fn mark_contexts_lost(&self, sandbox_id: &str, reason: &str) -> Result<()> {
        self.mark_lost(sandbox_id, None, reason).await
    }

    /// Marks one context lost when it is not already.
    pub async fn mark_context_lost(
        &self,
        sandbox_id: &str,
        name: &str,
        reason: &str,
    ) -> Result<()> {
        self.mark_lost(sandbox_id, Some(name), reason).await
    }

    async fn mark_lost(&self, sandbox_id: &str, name: Option<&str>, reason: &str) -> Result<()> {
        sqlx::query(
            "UPDATE contexts SET lost_reason = ?, lost_at = ? \
             WHERE sandbox_id = ? AND lost_reason IS NULL AND (? IS NULL OR name = ?)",
        )
        .bind(reason)
        .bind(now_ms())
        .bind(sandbox_id)
        .bind(name)
        .bind(name)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Forgets a context (deleted on purpose: not lost).
    pub async fn delete_stored_context(&self, sandbox_id: &str, name: &str) -> Result<()> {
        sqlx::query("DELETE FROM contexts WHERE sandbox_id = ? AND name = ?")
            .bind(sandbox_id)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
