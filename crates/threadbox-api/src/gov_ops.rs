//! The governance operations (API keys, quotas, usage, the audit log, sandbox counts),
//! one type each, as [`crate::ops`] declares the sandbox ones (ADR 0057): the daemon's
//! core runs them (`threadbox-core/src/gov_ops.rs`), REST parses HTTP into them
//! (`threadbox-server/src/gov_routes.rs`) and the Rust client sends them
//! (`Client::call`). Re-exported from [`crate::ops`].
//!
//! `SCOPE` is what every caller needs; the manager asks for more where the input says
//! so (another tenant than the caller's needs `admin`).

use crate::ops::{HttpMethod, Operation};
use crate::routes;
use crate::*;
use std::collections::BTreeMap;

fn to_json<T: Serialize>(v: &T) -> Option<serde_json::Value> {
    // Plain structs of strings, numbers and maps: serialization cannot fail.
    serde_json::to_value(v).ok()
}

/// Query pairs of the values that are set, in order.
fn some_pairs<const N: usize>(
    pairs: [(&'static str, Option<String>); N],
) -> Vec<(&'static str, String)> {
    pairs
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
}

/// Create an API key; the answer's `key` is shown only this once.
#[derive(Debug, Clone)]
pub struct CreateKey(pub CreateKeyRequest);

impl Operation for CreateKey {
    type Output = CreatedKey;
    const NAME: &'static str = "key.create";
    const SCOPE: Scope = Scope::Admin;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::KEYS;
    fn body(&self) -> Option<serde_json::Value> {
        to_json(&self.0)
    }
}

/// The keys (never the keys themselves), optionally of one tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListKeys {
    pub tenant: Option<String>,
}

impl Operation for ListKeys {
    type Output = ApiKeyList;
    const NAME: &'static str = "key.list";
    const SCOPE: Scope = Scope::Admin;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::KEYS;
    fn query(&self) -> Vec<(&'static str, String)> {
        some_pairs([("tenant", self.tenant.clone())])
    }
}

/// Revoke a key (also when it already was); `not_found` when there is no such key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RevokeKey {
    pub key_id: String,
}

impl Operation for RevokeKey {
    type Output = ();
    const NAME: &'static str = "key.revoke";
    const SCOPE: Scope = Scope::Admin;
    const METHOD: HttpMethod = HttpMethod::Delete;
    const PATH: &'static str = routes::KEY;
    fn path_values(&self) -> Vec<String> {
        vec![self.key_id.clone()]
    }
}

/// A tenant's quota and current use (another tenant than the caller's needs `admin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetQuota {
    pub tenant: String,
}

impl Operation for GetQuota {
    type Output = TenantQuota;
    const NAME: &'static str = "quota.get";
    const SCOPE: Scope = Scope::SandboxesRead;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::QUOTA;
    fn path_values(&self) -> Vec<String> {
        vec![self.tenant.clone()]
    }
}

/// Replace a tenant's whole quota (absent fields: unlimited).
#[derive(Debug, Clone)]
pub struct SetQuota {
    pub tenant: String,
    pub quota: Quota,
}

impl Operation for SetQuota {
    type Output = TenantQuota;
    const NAME: &'static str = "quota.set";
    const SCOPE: Scope = Scope::Admin;
    const METHOD: HttpMethod = HttpMethod::Put;
    const PATH: &'static str = routes::QUOTA;
    fn path_values(&self) -> Vec<String> {
        vec![self.tenant.clone()]
    }
    fn body(&self) -> Option<serde_json::Value> {
        to_json(&self.quota)
    }
}

/// Metered use: one tenant (the caller's, or `tenant` for an admin), or every tenant for
/// an admin who names none. `since` (RFC 3339): tenant totals count from its UTC day.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GetUsage {
    pub tenant: Option<String>,
    pub since: Option<String>,
}

impl Operation for GetUsage {
    type Output = UsageReport;
    const NAME: &'static str = "usage.get";
    const SCOPE: Scope = Scope::SandboxesRead;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::USAGE;
    fn query(&self) -> Vec<(&'static str, String)> {
        some_pairs([
            ("tenant", self.tenant.clone()),
            ("since", self.since.clone()),
        ])
    }
}

/// One page of the audit log, oldest first: entries after position `after`, at most
/// `limit` (default 1000, at most 10000), optionally from time `since` (RFC 3339) on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListAudit {
    pub after: u64,
    pub since: Option<String>,
    pub limit: Option<u32>,
}

impl Operation for ListAudit {
    type Output = AuditList;
    const NAME: &'static str = "audit.list";
    const SCOPE: Scope = Scope::Admin;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::AUDIT;
    fn query(&self) -> Vec<(&'static str, String)> {
        some_pairs([
            ("after", (self.after > 0).then(|| self.after.to_string())),
            ("since", self.since.clone()),
            ("limit", self.limit.map(|l| l.to_string())),
        ])
    }
}

/// Whether the audit log's hash chain holds, else its first bad entry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyAudit;

impl Operation for VerifyAudit {
    type Output = AuditVerification;
    const NAME: &'static str = "audit.verify";
    const SCOPE: Scope = Scope::Admin;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::AUDIT_VERIFY;
}

/// How many sandboxes are in each state, and what each tenant uses. Its REST door is
/// `/metrics`, which renders it with the daemon's counters as Prometheus text (so
/// `Client::call` cannot decode it: the client's `metrics()` reads the text).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxCounts;

/// What `/metrics` reads from the manager at scrape time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Sandboxes by state (every state shown, 0 included).
    pub sandboxes: BTreeMap<String, u64>,
    /// Per tenant (the warm pool's own sandboxes belong to none).
    pub tenants: BTreeMap<String, TenantGauges>,
}

/// One tenant's use, as `/metrics` shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantGauges {
    /// CPU time of its sandboxes that still exist, as metered (a counter while they do).
    pub cpu_seconds: f64,
    /// Memory its running and paused sandboxes hold now.
    pub memory_bytes: u64,
    /// Disk its sandboxes used at their last sample.
    pub disk_bytes: u64,
}

impl Operation for SandboxCounts {
    type Output = MetricsSnapshot;
    const NAME: &'static str = "sandbox.counts";
    const SCOPE: Scope = Scope::Admin;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::METRICS;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_values_are_not_sent() {
        assert!(ListKeys::default().query().is_empty());
        assert!(
            ListAudit::default().query().is_empty(),
            "after 0 is the start"
        );
        let q = ListAudit {
            after: 7,
            since: None,
            limit: Some(5),
        }
        .query();
        assert_eq!(
            q,
            vec![("after", "7".to_string()), ("limit", "5".to_string())]
        );
        let q = GetUsage {
            tenant: Some("t".into()),
            since: Some("2026-01-01T00:00:00Z".into()),
        }
        .query();
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn every_governance_path_is_a_shared_route() {
        for path in [
            CreateKey::PATH,
            RevokeKey::PATH,
            GetQuota::PATH,
            GetUsage::PATH,
            ListAudit::PATH,
            VerifyAudit::PATH,
            SandboxCounts::PATH,
        ] {
            assert!(routes::ALL.contains(&path), "{path}");
        }
    }
}
