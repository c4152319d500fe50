//! The store's governance tables: API keys, quotas, metering, the audit log. Actions that
//! change only the store (keys, quotas) write their audit entry in the same transaction.

use crate::audit::{self, Record, Stored, GENESIS};
use crate::error::{CoreError, Result};
use crate::store::Store;
use sqlx::{Row, SqliteConnection};
use threadbox_api::{AuditVerification, Quota, Scope};

/// Entries read per page by [`Store::verify_audit`].
pub const AUDIT_PAGE: u32 = 1000;

#[derive(Debug, Clone)]
pub struct KeyRow {
    pub id: String,
    pub tenant: String,
    pub scopes: Vec<Scope>,
    pub key_hash: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    pub last_used_at: Option<i64>,
}

/// An audit entry to append (its seq and hashes are computed at append time).
#[derive(Debug, Clone)]
pub struct AuditNew {
    pub ts_ms: i64,
    pub tenant: String,
    pub key_id: Option<String>,
    pub action: String,
    pub target: String,
    pub result: String,
}

/// Metered use of one sandbox, as stored.
#[derive(Debug, Clone, Default)]
pub struct UsageRow {
    pub sandbox_id: String,
    pub tenant: String,
    pub name: Option<String>,
    pub cpu_usec: i64,
    pub mem_byte_ms: f64,
    pub peak_mem_bytes: i64,
    pub disk_bytes: i64,
    pub running_ms: i64,
    pub paused_ms: i64,
    pub last_cgroup_usec: i64,
    pub sampled_at: i64,
    pub deleted_at: Option<i64>,
}

/// One sample's increments.
#[derive(Debug, Clone)]
pub struct UsageDelta {
    pub sandbox_id: String,
    pub tenant: String,
    pub name: Option<String>,
    pub day: String,
    pub at: i64,
    pub cpu_usec: i64,
    pub cgroup_usec: i64,
    pub mem_byte_ms: f64,
    pub mem_bytes: i64,
    pub disk_bytes: Option<i64>,
    pub running_ms: i64,
    pub paused_ms: i64,
}

/// Totals of a tenant over a range of days.
#[derive(Debug, Clone, Default)]
pub struct DailyTotals {
    pub cpu_usec: i64,
    pub mem_byte_ms: f64,
    pub running_ms: i64,
    pub paused_ms: i64,
}

fn key_row(r: &sqlx::sqlite::SqliteRow) -> Result<KeyRow> {
    let scopes: String = r.try_get("scopes")?;
    let scopes: Vec<String> = serde_json::from_str(&scopes)
        .map_err(|e| CoreError::Internal(format!("bad scopes in the store: {e}")))?;
    Ok(KeyRow {
        id: r.try_get("id")?,
        tenant: r.try_get("tenant")?,
        scopes: scopes.iter().filter_map(|s| Scope::parse(s)).collect(),
        key_hash: r.try_get("key_hash")?,
        created_at: r.try_get("created_at")?,
        expires_at: r.try_get("expires_at")?,
        revoked_at: r.try_get("revoked_at")?,
        last_used_at: r.try_get("last_used_at")?,
    })
}

fn usage_row(r: &sqlx::sqlite::SqliteRow) -> Result<UsageRow> {
    Ok(UsageRow {
        sandbox_id: r.try_get("sandbox_id")?,
        tenant: r.try_get("tenant")?,
        name: r.try_get("name")?,
        cpu_usec: r.try_get("cpu_usec")?,
        mem_byte_ms: r.try_get("mem_byte_ms")?,
        peak_mem_bytes: r.try_get("peak_mem_bytes")?,
        disk_bytes: r.try_get("disk_bytes")?,
        running_ms: r.try_get("running_ms")?,
        paused_ms: r.try_get("paused_ms")?,
        last_cgroup_usec: r.try_get("last_cgroup_usec")?,
        sampled_at: r.try_get("sampled_at")?,
        deleted_at: r.try_get("deleted_at")?,
    })
}

fn opt_i64(v: Option<u64>) -> Option<i64> {
    v.map(|v| i64::try_from(v).unwrap_or(i64::MAX))
}

/// Appends one entry to the chain. The caller's transaction must have been opened with
/// `BEGIN IMMEDIATE`, so no other writer moves the head meanwhile.
async fn append_audit_tx(conn: &mut SqliteConnection, a: &AuditNew) -> Result<u64> {
    let head = sqlx::query("SELECT count, last_hash FROM audit_head WHERE id = 1")
        .fetch_one(&mut *conn)
        .await?;
    let count: i64 = head.try_get("count")?;
    let last: String = head.try_get("last_hash")?;
    let seq = count as u64 + 1;
    let prev = if count == 0 {
        GENESIS.to_string()
    } else {
        last
    };
    let record = Record {
        seq,
        ts_ms: a.ts_ms,
        tenant: a.tenant.clone(),
        key_id: a.key_id.clone(),
        action: a.action.clone(),
        target: a.target.clone(),
        result: a.result.clone(),
    };
    let hash = audit::chain_hash(&prev, &record);
    sqlx::query(
        "INSERT INTO audit_log (seq, ts, tenant, key_id, action, target, result, prev_hash, hash) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(seq as i64)
    .bind(a.ts_ms)
    .bind(&a.tenant)
    .bind(&a.key_id)
    .bind(&a.action)
    .bind(&a.target)
    .bind(&a.result)
    .bind(&prev)
    .bind(&hash)
    .execute(&mut *conn)
    .await?;
    sqlx::query("UPDATE audit_head SET count = ?, last_hash = ? WHERE id = 1")
        .bind(seq as i64)
        .bind(&hash)
        .execute(&mut *conn)
        .await?;
    Ok(seq)
}

impl Store {
    // ---- audit ------------------------------------------------------------------------

    pub async fn append_audit(&self, a: &AuditNew) -> Result<u64> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let seq = append_audit_tx(&mut tx, a).await?;
        tx.commit().await?;
        Ok(seq)
    }

    /// Entries with `seq > after`, oldest first, at most `limit`; `since_ms` and `tenant`
    /// filter further.
    pub async fn list_audit(
        &self,
        after: u64,
        since_ms: Option<i64>,
        tenant: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Stored>> {
        let rows = sqlx::query(
            "SELECT * FROM audit_log WHERE seq > ? AND (? IS NULL OR ts >= ?) \
             AND (? IS NULL OR tenant = ?) ORDER BY seq LIMIT ?",
        )
        .bind(after as i64)
        .bind(since_ms)
        .bind(since_ms)
        .bind(tenant)
        .bind(tenant)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(stored_audit).collect()
    }

    /// Every entry in `seq` order and the head, read in one snapshot. Loads the whole log:
    /// [`Store::verify_audit`] checks it without doing so.
    pub async fn audit_chain(&self) -> Result<(Vec<Stored>, u64, String)> {
        let mut tx = self.pool.begin().await?;
        let rows = sqlx::query("SELECT * FROM audit_log ORDER BY seq")
            .fetch_all(&mut *tx)
            .await?;
        let (count, last) = audit_head(&mut tx).await?;
        tx.commit().await?;
        let entries = rows.iter().map(stored_audit).collect::<Result<Vec<_>>>()?;
        Ok((entries, count, last))
    }

    /// Checks the whole chain against its head, reading the log in pages of
    /// [`AUDIT_PAGE`] entries inside one read transaction (one snapshot: appends made
    /// meanwhile are not seen, and the head read is the one that matches the pages).
    /// Memory stays one page whatever the log's length.
    pub async fn verify_audit(&self) -> Result<AuditVerification> {
        self.verify_audit_paged(AUDIT_PAGE).await
    }

    pub(crate) async fn verify_audit_paged(&self, page: u32) -> Result<AuditVerification> {
        let mut tx = self.pool.begin().await?;
        let (count, last) = audit_head(&mut tx).await?;
        let mut check = audit::ChainCheck::new();
        // Pages follow `seq` (the primary key) rather than OFFSET, which would rescan; a
        // missing `seq` still shows, since the check expects each next number.
        let mut after: i64 = 0;
        'pages: loop {
            let rows = sqlx::query("SELECT * FROM audit_log WHERE seq > ? ORDER BY seq LIMIT ?")
                .bind(after)
                .bind(i64::from(page.max(1)))
                .fetch_all(&mut *tx)
                .await?;
            let Some(last_row) = rows.last() else {
                break;
            };
            after = last_row.try_get("seq")?;
            let full = rows.len() as u32 >= page.max(1);
            for r in &rows {
                if !check.push(&stored_audit(r)?) {
                    break 'pages;
                }
            }
            if !full {
                break;
            }
        }
        tx.commit().await?;
        Ok(check.finish(count, &last))
    }

    // ---- keys -------------------------------------------------------------------------

    pub async fn insert_key(&self, k: &KeyRow, audit: &AuditNew) -> Result<()> {
        let scopes: Vec<&str> = k.scopes.iter().map(|s| s.as_str()).collect();
        let scopes =
            serde_json::to_string(&scopes).map_err(|e| CoreError::Internal(e.to_string()))?;
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "INSERT INTO api_keys (id, tenant, scopes, key_hash, created_at, expires_at) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(&k.id)
        .bind(&k.tenant)
        .bind(scopes)
        .bind(&k.key_hash)
        .bind(k.created_at)
        .bind(k.expires_at)
        .execute(&mut *tx)
        .await?;
        append_audit_tx(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn get_key(&self, id: &str) -> Result<Option<KeyRow>> {
        let r = sqlx::query("SELECT * FROM api_keys WHERE id = ?")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        r.as_ref().map(key_row).transpose()
    }

    pub async fn list_keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRow>> {
        let rows = sqlx::query(
            "SELECT * FROM api_keys WHERE (? IS NULL OR tenant = ?) ORDER BY created_at, id",
        )
        .bind(tenant)
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(key_row).collect()
    }

    /// Marks a key revoked (idempotent); false when there is no such key.
    pub async fn revoke_key(&self, id: &str, at: i64, audit: &AuditNew) -> Result<bool> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        let found = sqlx::query("SELECT id FROM api_keys WHERE id = ?")
            .bind(id)
            .fetch_optional(&mut *tx)
            .await?
            .is_some();
        if found {
            sqlx::query("UPDATE api_keys SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?")
                .bind(at)
                .bind(id)
                .execute(&mut *tx)
                .await?;
        }
        append_audit_tx(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(found)
    }

    pub async fn touch_key(&self, id: &str, at: i64) -> Result<()> {
        sqlx::query("UPDATE api_keys SET last_used_at = ? WHERE id = ?")
            .bind(at)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    // ---- quotas -----------------------------------------------------------------------

    pub async fn get_quota(&self, tenant: &str) -> Result<Option<Quota>> {
        let r = sqlx::query("SELECT * FROM quotas WHERE tenant = ?")
            .bind(tenant)
            .fetch_optional(&self.pool)
            .await?;
        r.as_ref().map(quota_row).transpose()
    }

    /// Every tenant that has a quota.
    pub async fn all_quotas(&self) -> Result<Vec<(String, Quota)>> {
        let rows = sqlx::query("SELECT * FROM quotas ORDER BY tenant")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get("tenant")?, quota_row(r)?)))
            .collect()
    }

    pub async fn set_quota(
        &self,
        tenant: &str,
        q: &Quota,
        at: i64,
        audit: &AuditNew,
    ) -> Result<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "INSERT INTO quotas (tenant, max_running, max_sandboxes, max_memory_bytes, max_cpus, \
             cpu_seconds_per_day, disk_bytes, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT(tenant) DO UPDATE SET max_running = excluded.max_running, \
             max_sandboxes = excluded.max_sandboxes, max_memory_bytes = excluded.max_memory_bytes, \
             max_cpus = excluded.max_cpus, cpu_seconds_per_day = excluded.cpu_seconds_per_day, \
             disk_bytes = excluded.disk_bytes, updated_at = excluded.updated_at",
        )
        .bind(tenant)
        .bind(opt_i64(q.max_running))
        .bind(opt_i64(q.max_sandboxes))
        .bind(opt_i64(q.max_memory_bytes))
        .bind(q.max_cpus)
        .bind(opt_i64(q.cpu_seconds_per_day))
        .bind(opt_i64(q.disk_bytes))
        .bind(at)
        .execute(&mut *tx)
        .await?;
        append_audit_tx(&mut tx, audit).await?;
        tx.commit().await?;
        Ok(())
    }

    /// (running or being created, all existing) sandboxes of a tenant.
    pub async fn count_sandboxes(&self, tenant: &str) -> Result<(u64, u64)> {
        let r = sqlx::query(
            "SELECT COALESCE(SUM(state IN ('running', 'creating')), 0) AS running, \
             COUNT(*) AS total FROM sandboxes WHERE tenant = ? AND state != 'deleting'",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        Ok((
            r.try_get::<i64, _>("running")? as u64,
            r.try_get::<i64, _>("total")? as u64,
        ))
    }

    // ---- metering ---------------------------------------------------------------------

    pub async fn get_usage(&self, sandbox_id: &str) -> Result<Option<UsageRow>> {
        let r = sqlx::query("SELECT * FROM sandbox_usage WHERE sandbox_id = ?")
            .bind(sandbox_id)
            .fetch_optional(&self.pool)
            .await?;
        r.as_ref().map(usage_row).transpose()
    }

    /// Usage rows of a tenant's sandboxes that still exist.
    pub async fn tenant_usage_rows(&self, tenant: &str) -> Result<Vec<UsageRow>> {
        let rows = sqlx::query(
            "SELECT * FROM sandbox_usage WHERE tenant = ? AND deleted_at IS NULL \
             ORDER BY sandbox_id",
        )
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(usage_row).collect()
    }

    /// Tenants that have any metered use or sandbox.
    pub async fn metered_tenants(&self) -> Result<Vec<String>> {
        let tenants: Vec<String> = sqlx::query_scalar(
            "SELECT tenant FROM usage_daily UNION SELECT tenant FROM sandboxes \
             UNION SELECT tenant FROM sandbox_usage ORDER BY 1",
        )
        .fetch_all(&self.pool)
        .await?;
        // The warm pool's sandboxes belong to no one.
        Ok(tenants
            .into_iter()
            .filter(|t| t != crate::caller::POOL_TENANT)
            .collect())
    }

    pub async fn apply_usage(&self, d: &UsageDelta) -> Result<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "INSERT INTO sandbox_usage (sandbox_id, tenant, name, cpu_usec, mem_byte_ms, \
             peak_mem_bytes, disk_bytes, running_ms, paused_ms, last_cgroup_usec, sampled_at) \
             VALUES (?, ?, ?, ?, ?, ?, COALESCE(?, 0), ?, ?, ?, ?) \
             ON CONFLICT(sandbox_id) DO UPDATE SET name = excluded.name, \
             cpu_usec = cpu_usec + excluded.cpu_usec, \
             mem_byte_ms = mem_byte_ms + excluded.mem_byte_ms, \
             peak_mem_bytes = MAX(peak_mem_bytes, excluded.peak_mem_bytes), \
             disk_bytes = COALESCE(?, disk_bytes), \
             running_ms = running_ms + excluded.running_ms, \
             paused_ms = paused_ms + excluded.paused_ms, \
             last_cgroup_usec = excluded.last_cgroup_usec, sampled_at = excluded.sampled_at",
        )
        .bind(&d.sandbox_id)
        .bind(&d.tenant)
        .bind(&d.name)
        .bind(d.cpu_usec)
        .bind(d.mem_byte_ms)
        .bind(d.mem_bytes)
        .bind(d.disk_bytes)
        .bind(d.running_ms)
        .bind(d.paused_ms)
        .bind(d.cgroup_usec)
        .bind(d.at)
        .bind(d.disk_bytes)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO usage_daily (tenant, day, cpu_usec, mem_byte_ms, running_ms, paused_ms) \
             VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(tenant, day) DO UPDATE SET \
             cpu_usec = cpu_usec + excluded.cpu_usec, \
             mem_byte_ms = mem_byte_ms + excluded.mem_byte_ms, \
             running_ms = running_ms + excluded.running_ms, \
             paused_ms = paused_ms + excluded.paused_ms",
        )
        .bind(&d.tenant)
        .bind(&d.day)
        .bind(d.cpu_usec)
        .bind(d.mem_byte_ms)
        .bind(d.running_ms)
        .bind(d.paused_ms)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn mark_usage_deleted(&self, sandbox_id: &str, at: i64) -> Result<()> {
        sqlx::query("UPDATE sandbox_usage SET deleted_at = ? WHERE sandbox_id = ?")
            .bind(at)
            .bind(sandbox_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Totals of a tenant over the days `>= since_day` (every day when `None`).
    pub async fn daily_totals(&self, tenant: &str, since_day: Option<&str>) -> Result<DailyTotals> {
        let r = sqlx::query(
            "SELECT COALESCE(SUM(cpu_usec), 0) AS cpu, COALESCE(SUM(mem_byte_ms), 0.0) AS mem, \
             COALESCE(SUM(running_ms), 0) AS running, COALESCE(SUM(paused_ms), 0) AS paused \
             FROM usage_daily WHERE tenant = ? AND (? IS NULL OR day >= ?)",
        )
        .bind(tenant)
        .bind(since_day)
        .bind(since_day)
        .fetch_one(&self.pool)
        .await?;
        Ok(DailyTotals {
            cpu_usec: r.try_get("cpu")?,
            mem_byte_ms: r.try_get("mem")?,
            running_ms: r.try_get("running")?,
            paused_ms: r.try_get("paused")?,
        })
    }

    /// CPU microseconds of a tenant on one UTC day.
    pub async fn cpu_usec_on(&self, tenant: &str, day: &str) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT COALESCE(SUM(cpu_usec), 0) FROM usage_daily WHERE tenant = ? AND day = ?",
        )
        .bind(tenant)
        .bind(day)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Disk bytes a tenant holds, allocated: each existing sandbox's allocated disk size,
    /// or its sampled use when that is larger (a sandbox without a disk image), plus its
    /// checkpoints (ADR 0100), templates (ADR 0110) and the distinct image layers they
    /// use (ADR 0165). This, not the sampled use alone, is what a new sandbox's disk must
    /// fit beside: an image can fill up between two samples.
    pub async fn allocated_disk_of(&self, tenant: &str) -> Result<i64> {
        Ok(self.disk_split_of(tenant, true).await?.total() as i64)
    }

    /// Disk bytes of a tenant's existing sandboxes at their last samples, plus their
    /// checkpoints, templates and distinct image layers.
    pub async fn disk_bytes_of(&self, tenant: &str) -> Result<i64> {
        Ok(self.disk_split_of(tenant, false).await?.total() as i64)
    }

    /// A tenant's disk, part by part (ADR 0165): the sandboxes' disks at their allocated
    /// size (`allocated`, what admission counts) or their last samples, checkpoints and
    /// templates at their size when made, and each distinct image layer (by digest) its
    /// sandboxes and templates use, once, at its unpacked size. One statement, so the
    /// parts are of one instant.
    pub async fn disk_split_of(&self, tenant: &str, allocated: bool) -> Result<DiskSplit> {
        let sandboxes = if allocated {
            "(SELECT COALESCE(SUM(MAX(s.disk_bytes, COALESCE(u.disk_bytes, 0))), 0) \
             FROM sandboxes s LEFT JOIN sandbox_usage u \
             ON u.sandbox_id = s.id AND u.deleted_at IS NULL WHERE s.tenant = ?)"
        } else {
            "(SELECT COALESCE(SUM(u.disk_bytes), 0) FROM sandbox_usage u JOIN sandboxes s \
             ON s.id = u.sandbox_id WHERE u.tenant = ? AND u.deleted_at IS NULL)"
        };
        let sql = format!(
            "SELECT {sandboxes} AS sandboxes, \
             (SELECT COALESCE(SUM(size_bytes), 0) FROM checkpoints WHERE tenant = ?) AS checkpoints, \
             (SELECT COALESCE(SUM(size_bytes), 0) FROM templates WHERE tenant = ?) AS templates, \
             {} AS layers",
            crate::store_layers::TENANT_LAYER_BYTES
        );
        let r = sqlx::query(&sql)
            .bind(tenant)
            .bind(tenant)
            .bind(tenant)
            .bind(tenant)
            .bind(tenant)
            .fetch_one(&self.pool)
            .await?;
        let u = |c: &str| -> Result<u64> { Ok(r.try_get::<i64, _>(c)?.max(0) as u64) };
        Ok(DiskSplit {
            sandboxes: u("sandboxes")?,
            checkpoints: u("checkpoints")?,
            templates: u("templates")?,
            layers: u("layers")?,
        })
    }
}

/// A tenant's disk usage by what holds it ([`Store::disk_split_of`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskSplit {
    pub sandboxes: u64,
    pub checkpoints: u64,
    pub templates: u64,
    pub layers: u64,
}

impl DiskSplit {
    /// `sandboxes S, checkpoints C, templates T, layers L`: for a refusal's message.
    pub fn parts(&self) -> String {
        format!(
            "sandboxes {}, checkpoints {}, templates {}, layers {}",
            self.sandboxes, self.checkpoints, self.templates, self.layers
        )
    }

    pub fn total(&self) -> u64 {
        self.sandboxes
            .saturating_add(self.checkpoints)
            .saturating_add(self.templates)
            .saturating_add(self.layers)
    }
}

impl From<DiskSplit> for threadbox_api::DiskUse {
    fn from(d: DiskSplit) -> Self {
        threadbox_api::DiskUse {
            sandboxes: d.sandboxes,
            checkpoints: d.checkpoints,
            templates: d.templates,
            layers: d.layers,
        }
    }
}

/// The chain's head: entry count and last hash (`u64::MAX` entries when the row is
/// missing, so the check reports it).
async fn audit_head(conn: &mut SqliteConnection) -> Result<(u64, String)> {
    let head = sqlx::query("SELECT count, last_hash FROM audit_head WHERE id = 1")
        .fetch_optional(&mut *conn)
        .await?;
    Ok(match head {
        Some(h) => (
            h.try_get::<i64, _>("count")? as u64,
            h.try_get::<String, _>("last_hash")?,
        ),
        None => (u64::MAX, String::new()),
    })
}

fn quota_row(r: &sqlx::sqlite::SqliteRow) -> Result<Quota> {
    let u = |c: &str| -> Result<Option<u64>> {
        Ok(r.try_get::<Option<i64>, _>(c)?.map(|v| v.max(0) as u64))
    };
    Ok(Quota {
        max_running: u("max_running")?,
        max_sandboxes: u("max_sandboxes")?,
        max_memory_bytes: u("max_memory_bytes")?,
        max_cpus: r.try_get("max_cpus")?,
        cpu_seconds_per_day: u("cpu_seconds_per_day")?,
        disk_bytes: u("disk_bytes")?,
    })
}

fn stored_audit(r: &sqlx::sqlite::SqliteRow) -> Result<Stored> {
    Ok(Stored {
        record: Record {
            seq: r.try_get::<i64, _>("seq")?.max(0) as u64,
            ts_ms: r.try_get("ts")?,
            tenant: r.try_get("tenant")?,
            key_id: r.try_get("key_id")?,
            action: r.try_get("action")?,
            target: r.try_get("target")?,
            result: r.try_get("result")?,
        },
        prev_hash: r.try_get("prev_hash")?,
        hash: r.try_get("hash")?,
    })
}

#[cfg(test)]
#[path = "gov_store_tests.rs"]
mod tests;
