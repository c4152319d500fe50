//! Governance inside the manager: API keys, quotas (admission of new work and the daily
//! CPU cap), metering, and the audit log. Every door reaches these through the same
//! [`Caller`], so a check here covers REST, MCP and the CLI alike.

mod api_keys;
mod meter;
mod quota;

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

fn result_str<T>(r: &Result<T>) -> String {
    match r {
        Ok(_) => "ok".to_string(),
        Err(e) => e.code().as_str().to_string(),
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
                .map(|e| audit::to_api(e, crate::manager::rfc3339(e.record.ts_ms)))
                .collect(),
        })
    }

    /// Checks the whole chain; names the first entry that does not hold.
    pub async fn audit_verify(&self, caller: &Caller) -> Result<AuditVerification> {
        caller.require(Scope::Admin)?;
        // In pages within one read snapshot: never the whole log in memory (F9, ADR 0045).
        self.store.verify_audit().await
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
