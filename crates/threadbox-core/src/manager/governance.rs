//! Governance inside the manager: API keys, quotas (admission of new work and the daily
//! CPU cap), metering, and the audit log. Every door reaches these through the same
//! [`Caller`], so a check here covers REST, MCP and the CLI alike.

use super::Manager;
use crate::audit;
use crate::caller::{validate_tenant, Caller, Scope};
use crate::error::{CoreError, Result};
use crate::gov_store::{AuditNew, KeyRow, UsageDelta, UsageRow};
use crate::keys;
use crate::store::{now_ms, SandboxRow, State};
use std::collections::BTreeMap;
use std::sync::Arc;
use threadbox_api::*;

/// Largest page of audit entries returned at once.
pub const MAX_AUDIT_PAGE: u32 = 10_000;
/// `last_used_at` of a key is written at most this often.
const KEY_TOUCH_MS: i64 = 60_000;

/// Governance state of the manager that is not in the store.
#[derive(Default)]
pub(crate) struct GovState {
    /// Serializes metering, so two samples never count the same interval twice.
    meter_lock: tokio::sync::Mutex<()>,
    /// Serializes the quota check with the transition it admits (create, resume, start).
    pub(crate) admission: tokio::sync::Mutex<()>,
    /// Quotas per tenant as last read from the store (None: the tenant has none), so the
    /// admission of every exec does not read them again. Only this daemon writes quotas
    /// (`set_quota`), which drops the entry after its commit.
    quotas: std::sync::Mutex<QuotaCache>,
}

#[derive(Default)]
struct QuotaCache {
    /// Bumped by every `set_quota`: a read that started before it is not cached.
    generation: u64,
    by_tenant: std::collections::HashMap<String, Option<Quota>>,
}

/// What a quota check is about.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Admit {
    /// A new sandbox with these limits.
    Create { memory_bytes: u64, cpus: f64 },
    /// A sandbox that is not running starts running (resume, start, exec on paused).
    Run,
    /// More work in a running sandbox (exec, processes, file writes).
    Work,
}

pub(crate) fn rfc3339_opt(ms: Option<i64>) -> Option<String> {
    ms.map(super::rfc3339)
}

/// `YYYY-MM-DD` of a unix-ms time, UTC.
pub fn utc_day(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let d = t.date();
    format!("{:04}-{:02}-{:02}", d.year(), u8::from(d.month()), d.day())
}

/// Parses a time into unix ms: RFC 3339, or an age such as `90s`, `15m`, `24h`, `7d`
/// (that long before now).
pub fn parse_time(s: &str) -> Result<i64> {
    if let Some(secs) = parse_age_secs(s) {
        return Ok(now_ms().saturating_sub(secs.saturating_mul(1000)));
    }
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map_err(|e| {
            CoreError::InvalidArgument(format!(
                "invalid time {s:?} (expected RFC 3339, e.g. 2025-01-31T00:00:00Z): {e}"
            ))
        })?;
    Ok((t.unix_timestamp_nanos() / 1_000_000) as i64)
}

fn parse_age_secs(s: &str) -> Option<i64> {
    let s = s.trim();
    let unit = s.chars().last()?;
    let mult = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return None,
    };
    let n: i64 = s[..s.len() - 1].parse().ok()?;
    (n >= 0).then(|| n.saturating_mul(mult))
}

fn key_info(k: &KeyRow, now: i64) -> ApiKeyInfo {
    let status = if k.revoked_at.is_some() {
        "revoked"
    } else if k.expires_at.is_some_and(|e| e <= now) {
        "expired"
    } else {
        "active"
    };
    ApiKeyInfo {
        id: k.id.clone(),
        tenant: k.tenant.clone(),
        scopes: k.scopes.clone(),
        created_at: super::rfc3339(k.created_at),
        expires_at: rfc3339_opt(k.expires_at),
        revoked_at: rfc3339_opt(k.revoked_at),
        last_used_at: rfc3339_opt(k.last_used_at),
        status: status.to_string(),
    }
}

fn result_str<T>(r: &Result<T>) -> String {
    match r {
        Ok(_) => "ok".to_string(),
        Err(e) => e.code().as_str().to_string(),
    }
}

fn sandbox_usage(u: &UsageRow, state: &str) -> SandboxUsage {
    SandboxUsage {
        id: u.sandbox_id.clone(),
        name: u.name.clone(),
        state: state.to_string(),
        cpu_seconds: u.cpu_usec as f64 / 1e6,
        memory_gib_seconds: u.mem_byte_ms / 1000.0 / (1u64 << 30) as f64,
        peak_memory_bytes: u.peak_mem_bytes.max(0) as u64,
        disk_bytes: u.disk_bytes.max(0) as u64,
        running_seconds: u.running_ms as f64 / 1000.0,
        paused_seconds: u.paused_ms as f64 / 1000.0,
    }
}

impl Manager {
    // ---- audit ------------------------------------------------------------------------

    /// Appends an audit entry for a call made by `caller`. A failure to write it is
    /// logged: the action itself has already happened.
    pub(crate) async fn audit<T>(
        &self,
        caller: &Caller,
        action: &str,
        target: &str,
        result: &Result<T>,
    ) {
        let entry = AuditNew {
            ts_ms: now_ms(),
            tenant: caller.tenant.clone(),
            key_id: caller.key_id.clone(),
            action: action.to_string(),
            target: target.to_string(),
            result: result_str(result),
        };
        if let Err(e) = self.store.append_audit(&entry).await {
            tracing::error!(action, target, "cannot write the audit log: {e}");
        }
    }

    fn audit_entry(&self, caller: &Caller, action: &str, target: &str, result: &str) -> AuditNew {
        AuditNew {
            ts_ms: now_ms(),
            tenant: caller.tenant.clone(),
            key_id: caller.key_id.clone(),
            action: action.to_string(),
            target: target.to_string(),
            result: result.to_string(),
        }
    }

    /// Records a refused authentication (`auth.refused`). `key_id` is the id part of the
    /// presented key when it had the right shape; the key itself is never recorded.
    pub async fn record_refused_auth(&self, key_id: Option<&str>, target: &str, reason: &str) {
        let tenant = match key_id {
            Some(id) => match self.store.get_key(id).await {
                Ok(Some(k)) => k.tenant,
                _ => "-".to_string(),
            },
            None => "-".to_string(),
        };
        let entry = AuditNew {
            ts_ms: now_ms(),
            tenant,
            key_id: key_id.map(str::to_string),
            action: "auth.refused".to_string(),
            target: target.chars().take(256).collect(),
            result: format!("unauthenticated: {reason}"),
        };
        if let Err(e) = self.store.append_audit(&entry).await {
            tracing::error!("cannot write the audit log: {e}");
        }
    }

    // ---- keys -------------------------------------------------------------------------

    /// Checks a presented API key; `unauthenticated` when it is unknown, wrong, revoked
    /// or expired.
    pub async fn authenticate(&self, key: &str) -> Result<Caller> {
        let invalid = || CoreError::Unauthenticated("invalid API key".into());
        let Some(id) = keys::key_id(key) else {
            return Err(invalid());
        };
        let Some(row) = self.store.get_key(id).await? else {
            // Same work as a known key, so timing does not tell known ids apart.
            let _ = keys::matches(key, &keys::hash(""));
            return Err(invalid());
        };
        if !keys::matches(key, &row.key_hash) {
            return Err(invalid());
        }
        let now = now_ms();
        if row.revoked_at.is_some() {
            return Err(CoreError::Unauthenticated("API key revoked".into()));
        }
        if row.expires_at.is_some_and(|e| e <= now) {
            return Err(CoreError::Unauthenticated("API key expired".into()));
        }
        if row.last_used_at.is_none_or(|t| now - t >= KEY_TOUCH_MS) {
            if let Err(e) = self.store.touch_key(&row.id, now).await {
                tracing::warn!(key_id = %row.id, "cannot record key use: {e}");
            }
        }
        Ok(Caller::key(&row.tenant, &row.id, row.scopes))
    }

    /// The tenant and key id a presented key names, for the audit of a refusal.
    pub fn presented_key_id(key: &str) -> Option<&str> {
        keys::key_id(key)
    }

    pub async fn create_key(&self, caller: &Caller, req: CreateKeyRequest) -> Result<CreatedKey> {
        let target = req.tenant.clone();
        let r = async {
            caller.require(Scope::Admin)?;
            validate_tenant(&req.tenant)?;
            if req.scopes.is_empty() {
                return Err(CoreError::InvalidArgument(
                    "a key needs at least one scope".into(),
                ));
            }
            let now = now_ms();
            let expires_at = match req.expires_in_secs {
                Some(s) if s == 0 || s > 10 * 365 * 24 * 3600 => {
                    return Err(CoreError::InvalidArgument(
                        "expires_in_secs must be between 1 and 315360000".into(),
                    ))
                }
                Some(s) => Some(now + s as i64 * 1000),
                None => None,
            };
            let mut scopes = req.scopes.clone();
            scopes.sort();
            scopes.dedup();
            let new = keys::generate()?;
            let row = KeyRow {
                id: new.id.clone(),
                tenant: req.tenant.clone(),
                scopes: scopes.clone(),
                key_hash: new.hash,
                created_at: now,
                expires_at,
                revoked_at: None,
                last_used_at: None,
            };
            let entry = self.audit_entry(
                caller,
                "key.create",
                &format!("{}/{}", row.tenant, row.id),
                "ok",
            );
            self.store.insert_key(&row, &entry).await?;
            tracing::info!(key_id = %row.id, tenant = %row.tenant, "API key created");
            Ok(CreatedKey {
                id: new.id,
                key: new.key,
                tenant: row.tenant,
                scopes,
                expires_at: rfc3339_opt(expires_at),
            })
        }
        .await;
        if r.is_err() {
            self.audit(caller, "key.create", &target, &r).await;
        }
        r
    }

    pub async fn list_keys(&self, caller: &Caller, tenant: Option<&str>) -> Result<ApiKeyList> {
        caller.require(Scope::Admin)?;
        let now = now_ms();
        Ok(ApiKeyList {
            keys: self
                .store
                .list_keys(tenant)
                .await?
                .iter()
                .map(|k| key_info(k, now))
                .collect(),
        })
    }

    /// Revokes a key (idempotent). `not_found` when there is no such key.
    pub async fn revoke_key(&self, caller: &Caller, key_id: &str) -> Result<()> {
        let r = async {
            caller.require(Scope::Admin)?;
            let entry = self.audit_entry(caller, "key.revoke", key_id, "ok");
            if self.store.get_key(key_id).await?.is_none() {
                return Err(CoreError::NotFoundOther(format!(
                    "API key {key_id} not found"
                )));
            }
            self.store.revoke_key(key_id, now_ms(), &entry).await?;
            tracing::info!(key_id, "API key revoked");
            Ok(())
        }
        .await;
        if r.is_err() {
            self.audit(caller, "key.revoke", key_id, &r).await;
        }
        r
    }

    // ---- quotas -----------------------------------------------------------------------

    async fn quota_use(&self, tenant: &str) -> Result<QuotaUse> {
        let (running, sandboxes) = self.store.count_sandboxes(tenant).await?;
        let cpu = self.store.cpu_usec_on(tenant, &utc_day(now_ms())).await?;
        let disk = self.store.disk_bytes_of(tenant).await?;
        Ok(QuotaUse {
            running,
            sandboxes,
            cpu_seconds_today: cpu as f64 / 1e6,
            disk_bytes: disk.max(0) as u64,
        })
    }

    pub async fn get_quota(&self, caller: &Caller, tenant: &str) -> Result<TenantQuota> {
        if tenant != caller.tenant {
            caller.require(Scope::Admin)?;
        }
        caller.require(Scope::SandboxesRead)?;
        validate_tenant(tenant)?;
        Ok(TenantQuota {
            tenant: tenant.to_string(),
            quota: self.store.get_quota(tenant).await?.unwrap_or_default(),
            usage: self.quota_use(tenant).await?,
        })
    }

    /// Replaces a tenant's quota (absent fields: unlimited).
    pub async fn set_quota(&self, caller: &Caller, tenant: &str, q: Quota) -> Result<TenantQuota> {
        let r = async {
            caller.require(Scope::Admin)?;
            validate_tenant(tenant)?;
            if let Some(c) = q.max_cpus {
                if !(c.is_finite() && c > 0.0) {
                    return Err(CoreError::InvalidArgument(
                        "max_cpus must be a positive number".into(),
                    ));
                }
            }
            let entry = self.audit_entry(caller, "quota.set", tenant, "ok");
            let written = self.store.set_quota(tenant, &q, now_ms(), &entry).await;
            {
                let mut cache = self.gov.quotas.lock().unwrap_or_else(|p| p.into_inner());
                cache.generation += 1;
                cache.by_tenant.remove(tenant);
            }
            written?;
            tracing::info!(tenant, quota = ?q, "quota set");
            Ok(())
        }
        .await;
        if r.is_err() {
            self.audit(caller, "quota.set", tenant, &r).await;
        }
        r?;
        self.get_quota(caller, tenant).await
    }

    /// The quota of `tenant` (None: none), from the cache when it holds it.
    async fn cached_quota(&self, tenant: &str) -> Result<Option<Quota>> {
        let generation = {
            let cache = self.gov.quotas.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(q) = cache.by_tenant.get(tenant) {
                return Ok(q.clone());
            }
            cache.generation
        };
        let q = self.store.get_quota(tenant).await?;
        let mut cache = self.gov.quotas.lock().unwrap_or_else(|p| p.into_inner());
        if cache.generation == generation {
            cache.by_tenant.insert(tenant.to_string(), q.clone());
        }
        Ok(q)
    }

    /// Refuses with `quota_exceeded` when `what` would exceed a quota of `tenant`.
    pub(crate) async fn admit(&self, tenant: &str, what: Admit) -> Result<()> {
        let Some(q) = self.cached_quota(tenant).await? else {
            return Ok(());
        };
        let exceeded = |quota: &'static str, used: String, limit: String, extra: &str| {
            CoreError::QuotaExceeded {
                tenant: tenant.to_string(),
                quota,
                used,
                limit,
                extra: extra.to_string(),
            }
        };
        let (running, total) = self.store.count_sandboxes(tenant).await?;
        if let Admit::Create { memory_bytes, cpus } = what {
            if let Some(max) = q.max_memory_bytes {
                if memory_bytes > max {
                    return Err(exceeded(
                        "max_memory_bytes",
                        format!("{memory_bytes} requested"),
                        max.to_string(),
                        " per sandbox",
                    ));
                }
            }
            if let Some(max) = q.max_cpus {
                if cpus > max + 1e-9 {
                    return Err(exceeded(
                        "max_cpus",
                        format!("{cpus} requested"),
                        max.to_string(),
                        " per sandbox",
                    ));
                }
            }
            if let Some(max) = q.max_sandboxes {
                if total >= max {
                    return Err(exceeded(
                        "max_sandboxes",
                        format!("{total} in use"),
                        max.to_string(),
                        "",
                    ));
                }
            }
        }
        if matches!(what, Admit::Create { .. } | Admit::Run) {
            if let Some(max) = q.max_running {
                if running >= max {
                    return Err(exceeded(
                        "max_running",
                        format!("{running} in use"),
                        max.to_string(),
                        "",
                    ));
                }
            }
        }
        if let Some(cap) = q.cpu_seconds_per_day {
            let used = self.store.cpu_usec_on(tenant, &utc_day(now_ms())).await?;
            if used as f64 >= cap as f64 * 1e6 {
                return Err(exceeded(
                    "cpu_seconds_per_day",
                    format!("{:.1} used today", used as f64 / 1e6),
                    cap.to_string(),
                    "; it resets at 00:00 UTC",
                ));
            }
        }
        if let Some(max) = q.disk_bytes {
            let used = self.store.disk_bytes_of(tenant).await?.max(0) as u64;
            if used >= max {
                return Err(exceeded(
                    "disk_bytes",
                    format!("{used} in use"),
                    max.to_string(),
                    "",
                ));
            }
        }
        Ok(())
    }

    /// The disk size a new sandbox of `tenant` gets, or `quota_exceeded`: it must fit in
    /// what the tenant's `disk_bytes` quota leaves beside the *allocated* disks of its
    /// sandboxes (ADR 0031). A size the request named is refused when it does not fit; the
    /// default (`requested` None) shrinks to the largest power of two that fits, so a
    /// small quota still gets a sandbox from a request that names no size. Call with the
    /// admission lock held.
    pub(crate) async fn admit_disk(
        &self,
        tenant: &str,
        requested: Option<u64>,
        default: u64,
    ) -> Result<u64> {
        let wanted = requested.unwrap_or(default);
        let Some(limit) = self.cached_quota(tenant).await?.and_then(|q| q.disk_bytes) else {
            return Ok(wanted);
        };
        let allocated = self.store.allocated_disk_of(tenant).await?.max(0) as u64;
        let left = limit.saturating_sub(allocated);
        if wanted <= left {
            return Ok(wanted);
        }
        if requested.is_none() && left >= crate::MIN_DISK_BYTES {
            // 2^floor(log2(left)): few distinct sizes, so few disk templates (ADR 0011).
            let fitted = 1u64 << (63 - left.leading_zeros());
            return Ok(fitted.min(default));
        }
        Err(CoreError::QuotaExceeded {
            tenant: tenant.to_string(),
            quota: "disk_bytes",
            used: format!(
                "{wanted} requested for the new sandbox's disk, {allocated} allocated to \
                 existing sandboxes"
            ),
            limit: limit.to_string(),
            extra: format!(
                "; {left} bytes are left: ask for at most that in limits.disk_bytes (the \
                 smallest disk is {} bytes) or delete sandboxes",
                crate::MIN_DISK_BYTES
            ),
        })
    }

    // ---- metering ---------------------------------------------------------------------

    /// Adds what `row` used since its last sample to its totals and its tenant's day.
    /// Errors are logged: metering never fails a user's call.
    pub(crate) async fn meter(&self, row: &SandboxRow, with_disk: bool) {
        let _g = self.gov.meter_lock.lock().await;
        if let Err(e) = self.meter_locked(row, with_disk).await {
            tracing::warn!(sandbox = %row.id, "metering failed: {e}");
        }
    }

    async fn meter_locked(&self, row: &SandboxRow, with_disk: bool) -> Result<()> {
        let prev = self.store.get_usage(&row.id).await?;
        let now = now_ms();
        let since = prev
            .as_ref()
            .map(|p| p.sampled_at)
            .unwrap_or(row.created_at);
        let elapsed = (now - since).max(0);
        let last_usec = prev.as_ref().map(|p| p.last_cgroup_usec).unwrap_or(0);
        let live = matches!(row.state, State::Running | State::Paused);
        let driver = self.driver_for(row)?;
        let id = row.id.clone();
        let usage = if live || with_disk {
            driver.usage(&id, with_disk).await
        } else {
            crate::driver::Usage::default()
        };
        let cpu = if live { usage.cpu_usec } else { None };
        let mem = if live { usage.memory_bytes } else { None };
        let disk = usage.disk_bytes;
        let (cpu_delta, cgroup_usec) = match cpu {
            // A counter below the last reading is a new cgroup (the sandbox was restarted).
            Some(c) => {
                let c = c as i64;
                (if c >= last_usec { c - last_usec } else { c }, c)
            }
            None => (0, 0),
        };
        let mem = mem.unwrap_or(0) as i64;
        let (running_ms, paused_ms) = match row.state {
            State::Running | State::Creating => (elapsed, 0),
            State::Paused => (0, elapsed),
            _ => (0, 0),
        };
        let delta = UsageDelta {
            sandbox_id: row.id.clone(),
            tenant: row.tenant.clone(),
            name: row.name.clone(),
            day: utc_day(now),
            at: now,
            cpu_usec: cpu_delta,
            cgroup_usec,
            mem_byte_ms: if live {
                mem as f64 * elapsed as f64
            } else {
                0.0
            },
            mem_bytes: mem,
            disk_bytes: disk.map(|d| d.min(i64::MAX as u64) as i64),
            running_ms,
            paused_ms,
        };
        self.store.apply_usage(&delta).await
    }

    /// Samples every running or paused sandbox, then enforces the daily CPU caps.
    pub(crate) async fn meter_all(&self) -> Result<()> {
        for row in self.store.all_sandboxes().await? {
            if row.tenant == crate::caller::POOL_TENANT {
                continue;
            }
            if matches!(row.state, State::Running | State::Paused) {
                self.meter(&row, true).await;
            }
        }
        self.enforce_cpu_caps().await
    }

    /// Pauses the running sandboxes of every tenant whose CPU-seconds of today reached
    /// its `cpu_seconds_per_day`.
    async fn enforce_cpu_caps(&self) -> Result<()> {
        let day = utc_day(now_ms());
        let mut over = Vec::new();
        for (tenant, q) in self.store.all_quotas().await? {
            let Some(cap) = q.cpu_seconds_per_day else {
                continue;
            };
            let used = self.store.cpu_usec_on(&tenant, &day).await?;
            if used as f64 >= cap as f64 * 1e6 {
                over.push(tenant);
            }
        }
        if over.is_empty() {
            return Ok(());
        }
        for row in self.store.all_sandboxes().await? {
            if row.state == State::Running && over.contains(&row.tenant) {
                let caller = Caller::system(&row.tenant);
                match self.pause_for(&caller, &row.id, super::Op::CapPause).await {
                    Ok(_) => tracing::info!(
                        sandbox = %row.id, tenant = %row.tenant,
                        "paused: the tenant reached its daily CPU cap"
                    ),
                    Err(e) => tracing::warn!(sandbox = %row.id, "CPU cap pause failed: {e}"),
                }
            }
        }
        Ok(())
    }

    /// Starts the metering task; it ends when the manager shuts down or is dropped.
    pub(crate) fn spawn_meter(self: &Arc<Self>, mut stop_rx: tokio::sync::watch::Receiver<bool>) {
        let weak = Arc::downgrade(self);
        let interval = self.config.meter_interval;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = stop_rx.changed() => break,
                }
                let Some(mgr) = weak.upgrade() else { break };
                if let Err(e) = mgr.meter_all().await {
                    tracing::warn!("metering sweep failed: {e}");
                }
            }
        });
    }

    /// `GET /v1/usage`: one tenant (the caller's, or `tenant` for an admin), or every
    /// tenant for an admin who names none. Live sandboxes are sampled first.
    pub async fn usage(
        &self,
        caller: &Caller,
        tenant: Option<&str>,
        since: Option<&str>,
    ) -> Result<UsageReport> {
        caller.require(Scope::SandboxesRead)?;
        let tenants: Vec<String> = match tenant {
            Some(t) => {
                validate_tenant(t)?;
                if t != caller.tenant {
                    caller.require(Scope::Admin)?;
                }
                vec![t.to_string()]
            }
            None if caller.has(Scope::Admin) => self.store.metered_tenants().await?,
            None => vec![caller.tenant.clone()],
        };
        let since_day = since.map(parse_time).transpose()?.map(utc_day);
        let rows = self.store.all_sandboxes().await?;
        for row in rows.iter().filter(|r| tenants.contains(&r.tenant)) {
            if matches!(row.state, State::Running | State::Paused) {
                self.meter(row, false).await;
            }
        }
        let today = utc_day(now_ms());
        let mut report = UsageReport::default();
        for t in tenants {
            let totals = self.store.daily_totals(&t, since_day.as_deref()).await?;
            let states: BTreeMap<&str, &str> = rows
                .iter()
                .filter(|r| r.tenant == t)
                .map(|r| (r.id.as_str(), r.state.as_str()))
                .collect();
            let sandboxes: Vec<SandboxUsage> = self
                .store
                .tenant_usage_rows(&t)
                .await?
                .iter()
                .map(|u| {
                    sandbox_usage(
                        u,
                        states
                            .get(u.sandbox_id.as_str())
                            .copied()
                            .unwrap_or("deleted"),
                    )
                })
                .filter(|s| s.state != "deleted")
                .collect();
            report.tenants.push(TenantUsage {
                tenant: t.clone(),
                since_day: since_day.clone(),
                cpu_seconds: totals.cpu_usec as f64 / 1e6,
                memory_gib_seconds: totals.mem_byte_ms / 1000.0 / (1u64 << 30) as f64,
                running_seconds: totals.running_ms as f64 / 1000.0,
                paused_seconds: totals.paused_ms as f64 / 1000.0,
                cpu_seconds_today: self.store.cpu_usec_on(&t, &today).await? as f64 / 1e6,
                disk_bytes: sandboxes.iter().map(|s| s.disk_bytes).sum(),
                sandboxes,
            });
        }
        Ok(report)
    }

    // ---- audit log --------------------------------------------------------------------

    /// Audit entries after `after` (a seq), at most `limit`, optionally since a time.
    pub async fn audit_list(
        &self,
        caller: &Caller,
        after: u64,
        since: Option<&str>,
        limit: Option<u32>,
    ) -> Result<AuditList> {
        caller.require(Scope::Admin)?;
        let since_ms = since.map(parse_time).transpose()?;
        let limit = limit.unwrap_or(1000).clamp(1, MAX_AUDIT_PAGE);
        let rows = self.store.list_audit(after, since_ms, None, limit).await?;
        Ok(AuditList {
            entries: rows
                .iter()
                .map(|e| audit::to_api(e, super::rfc3339(e.record.ts_ms)))
                .collect(),
        })
    }

    /// Checks the whole chain; names the first entry that does not hold.
    pub async fn audit_verify(&self, caller: &Caller) -> Result<AuditVerification> {
        caller.require(Scope::Admin)?;
        let (entries, count, head) = self.store.audit_chain().await?;
        Ok(audit::verify(&entries, count, &head))
    }

    /// Sandboxes per state over every tenant (for `/metrics`).
    pub async fn sandbox_counts(&self, caller: &Caller) -> Result<BTreeMap<String, u64>> {
        caller.require(Scope::Admin)?;
        let mut counts: BTreeMap<String, u64> = ["creating", "running", "paused", "stopped"]
            .into_iter()
            .map(|s| (s.to_string(), 0))
            .collect();
        for row in self.store.all_sandboxes().await? {
            if row.state != State::Deleting && row.tenant != crate::caller::POOL_TENANT {
                *counts.entry(row.state.as_str().to_string()).or_default() += 1;
            }
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_days_and_times() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(86_400_000 * 365), "1971-01-01");
        assert_eq!(parse_time("1970-01-02T00:00:00Z").unwrap(), 86_400_000);
        assert!(parse_time("yesterday").is_err());
        let hour_ago = parse_time("1h").unwrap();
        assert!((now_ms() - hour_ago - 3_600_000).abs() < 60_000);
    }
}
