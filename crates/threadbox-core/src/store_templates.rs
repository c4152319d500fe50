//! The store's side of templates (issue 14 scope 5, ADR 0110).

use crate::error::{CoreError, Result};
use crate::store::Store;
use sqlx::Row;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq)]
pub struct TemplateRow {
    pub id: String,
    pub tenant: String,
    pub name: String,
    pub source: String,
    pub image: String,
    pub tier: String,
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u32,
    pub disk_bytes: u64,
    pub labels: BTreeMap<String, String>,
    /// JSON of a `NetworkPolicySpec`, as a sandbox row keeps it.
    pub network_policy: Option<String>,
    pub size_bytes: u64,
    pub method: String,
    pub created_at: i64,
}

const COLUMNS: &str = "id, tenant, name, source, image, tier, memory_bytes, cpus, pids, \
                       disk_bytes, labels, network_policy, size_bytes, method, created_at";

fn from_row(r: &sqlx::sqlite::SqliteRow) -> Result<TemplateRow> {
    let labels: String = r.try_get("labels")?;
    Ok(TemplateRow {
        id: r.try_get("id")?,
        tenant: r.try_get("tenant")?,
        name: r.try_get("name")?,
        source: r.try_get("source")?,
        image: r.try_get("image")?,
        tier: r.try_get("tier")?,
        memory_bytes: r.try_get::<i64, _>("memory_bytes")?.max(0) as u64,
        cpus: r.try_get("cpus")?,
        pids: r.try_get::<i64, _>("pids")?.max(0) as u32,
        disk_bytes: r.try_get::<i64, _>("disk_bytes")?.max(0) as u64,
        labels: serde_json::from_str(&labels)
            .map_err(|e| CoreError::Internal(format!("stored template labels: {e}")))?,
        network_policy: r.try_get("network_policy")?,
        size_bytes: r.try_get::<i64, _>("size_bytes")?.max(0) as u64,
        method: r.try_get("method")?,
        created_at: r.try_get("created_at")?,
    })
}

impl Store {
    /// Inserts a template; `conflict` when the tenant has one of that name.
    pub async fn insert_template(&self, t: &TemplateRow) -> Result<()> {
        let labels =
            serde_json::to_string(&t.labels).map_err(|e| CoreError::Internal(e.to_string()))?;
        let r = sqlx::query(&format!(
            "INSERT INTO templates ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        ))
        .bind(&t.id)
        .bind(&t.tenant)
        .bind(&t.name)
        .bind(&t.source)
        .bind(&t.image)
        .bind(&t.tier)
        .bind(t.memory_bytes as i64)
        .bind(t.cpus)
        .bind(t.pids as i64)
        .bind(t.disk_bytes as i64)
        .bind(labels)
        .bind(&t.network_policy)
        .bind(t.size_bytes as i64)
        .bind(&t.method)
        .bind(t.created_at)
        .execute(&self.pool)
        .await;
        match r {
            Ok(_) => Ok(()),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => Err(CoreError::Conflict(
                format!("a template named {:?} exists already", t.name),
            )),
            Err(e) => Err(e.into()),
        }
    }

    /// The template of `tenant` named `name_or_id` (another tenant's is not found).
    pub async fn get_template(
        &self,
        tenant: &str,
        name_or_id: &str,
    ) -> Result<Option<TemplateRow>> {
        let r = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM templates WHERE tenant = ? AND (name = ? OR id = ?)"
        ))
        .bind(tenant)
        .bind(name_or_id)
        .bind(name_or_id)
        .fetch_optional(&self.pool)
        .await?;
        r.as_ref().map(from_row).transpose()
    }

    /// The templates of `tenant` (all tenants' with `None`), oldest first.
    pub async fn templates_of(&self, tenant: Option<&str>) -> Result<Vec<TemplateRow>> {
        let rows = match tenant {
            Some(t) => {
                sqlx::query(&format!(
                    "SELECT {COLUMNS} FROM templates WHERE tenant = ? ORDER BY created_at, id"
                ))
                .bind(t)
                .fetch_all(&self.pool)
                .await?
            }
            None => {
                sqlx::query(&format!(
                    "SELECT {COLUMNS} FROM templates ORDER BY created_at, id"
                ))
                .fetch_all(&self.pool)
                .await?
            }
        };
        rows.iter().map(from_row).collect()
    }

    pub async fn delete_template(&self, id: &str) -> Result<()> {
        sqlx::query("DELETE FROM templates WHERE id = ?")
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Bytes the templates of `tenant` hold on the host (their size when made): what a
    /// tenant's disk usage and quota count for its templates (helper U's accounting).
    pub async fn template_bytes_of(&self, tenant: &str) -> Result<u64> {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COALESCE(SUM(size_bytes), 0) FROM templates WHERE tenant = ?")
                .bind(tenant)
                .fetch_one(&self.pool)
                .await?;
        Ok(n.max(0) as u64)
    }

    /// Records that `sandbox` was made from `template`.
    pub async fn set_template_use(&self, sandbox: &str, template: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO template_uses (sandbox, template) VALUES (?, ?) \
             ON CONFLICT (sandbox) DO UPDATE SET template = excluded.template",
        )
        .bind(sandbox)
        .bind(template)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The template `sandbox` was made from, if any.
    pub async fn template_of(&self, sandbox: &str) -> Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT template FROM template_uses WHERE sandbox = ?")
                .bind(sandbox)
                .fetch_optional(&self.pool)
                .await?,
        )
    }

    /// Existing sandboxes (the warm pool's included) made from `template`.
    pub async fn template_users(&self, template: &str) -> Result<u32> {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM template_uses u JOIN sandboxes s ON s.id = u.sandbox \
             WHERE u.template = ? AND s.tenant != ?",
        )
        .bind(template)
        .bind(crate::caller::POOL_TENANT)
        .fetch_one(&self.pool)
        .await?;
        Ok(n.max(0) as u32)
    }

    /// Pooled sandboxes of `template` (`None`: of no template), any state.
    pub async fn count_pooled(&self, template: Option<&str>) -> Result<u32> {
        let (n,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM sandboxes s LEFT JOIN template_uses u ON u.sandbox = s.id \
             WHERE s.tenant = ? AND u.template IS ? AND s.state != 'stopped'",
        )
        .bind(crate::caller::POOL_TENANT)
        .bind(template)
        .fetch_one(&self.pool)
        .await?;
        Ok(n.max(0) as u32)
    }

    /// Staged slots (ADR 0180): the pool's rows that are `stopped` (no agent until a
    /// disk is attached).
    pub async fn count_staged(&self) -> Result<u32> {
        let (n,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM sandboxes WHERE tenant = ? AND state = 'stopped'")
                .bind(crate::caller::POOL_TENANT)
                .fetch_one(&self.pool)
                .await?;
        Ok(n.max(0) as u32)
    }

    /// A staged slot of `image`, oldest first.
    pub async fn staged_candidate(&self, image: &str) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(
            "SELECT id FROM sandboxes WHERE tenant = ? AND state = 'stopped' AND image = ? \
             ORDER BY created_at, id LIMIT 1",
        )
        .bind(crate::caller::POOL_TENANT)
        .bind(image)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Makes staged slot `id` the sandbox `row` (its tenant, name, labels, limits, disk
    /// size and timers), `creating` until its boot ends; false when it is no longer a
    /// staged slot (another request took it).
    pub async fn adopt_staged(&self, id: &str, row: &crate::store::SandboxRow) -> Result<bool> {
        let labels =
            serde_json::to_string(&row.labels).map_err(|e| CoreError::Internal(e.to_string()))?;
        let res = sqlx::query(
            "UPDATE sandboxes SET tenant = ?, name = ?, labels = ?, memory_bytes = ?, cpus = ?, \
             pids = ?, disk_bytes = ?, idle_pause_secs = ?, ttl_secs = ?, ttl_action = ?, \
             created_at = ?, last_active_at = ?, idle_stop_secs = ?, idle_hibernate_secs = ?, \
             state = 'creating' \
             WHERE id = ? AND tenant = ? AND state = 'stopped'",
        )
        .bind(&row.tenant)
        .bind(&row.name)
        .bind(labels)
        .bind(row.memory_bytes as i64)
        .bind(row.cpus)
        .bind(row.pids as i64)
        .bind(row.disk_bytes as i64)
        .bind(row.idle_pause_secs.map(|v| v as i64))
        .bind(row.ttl_secs.map(|v| v as i64))
        .bind(crate::store::ttl_str(row.ttl_action))
        .bind(row.created_at)
        .bind(row.last_active_at)
        .bind(row.idle_stop_secs.map(|v| v as i64))
        .bind(row.idle_hibernate_secs.map(|v| v as i64))
        .bind(id)
        .bind(crate::caller::POOL_TENANT)
        .execute(&self.pool)
        .await;
        match res {
            Ok(r) => Ok(r.rows_affected() == 1),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(CoreError::Conflict(format!(
                    "a sandbox named {:?} already exists",
                    row.name.as_deref().unwrap_or("")
                )))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// A running pooled sandbox of `template` (`None`: of no template), oldest first.
    pub async fn pool_candidate_of(
        &self,
        template: Option<&str>,
        image: &str,
        disk_bytes: u64,
    ) -> Result<Option<String>> {
        Ok(sqlx::query_scalar(
            "SELECT s.id FROM sandboxes s LEFT JOIN template_uses u ON u.sandbox = s.id \
             WHERE s.tenant = ? AND s.state = 'running' AND s.image = ? AND s.disk_bytes = ? \
             AND u.template IS ? ORDER BY s.created_at, s.id LIMIT 1",
        )
        .bind(crate::caller::POOL_TENANT)
        .bind(image)
        .bind(disk_bytes as i64)
        .bind(template)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Forgets uses whose sandbox is gone (start).
    pub async fn sweep_template_uses(&self) -> Result<()> {
        sqlx::query("DELETE FROM template_uses WHERE sandbox NOT IN (SELECT id FROM sandboxes)")
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
