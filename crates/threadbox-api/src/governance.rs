//! Wire types of governance: API keys and scopes, per-tenant quotas, usage, the audit log.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a key may do. `admin` implies every other scope.
#[derive(
    Debug,
    Clone,
    Copy,
    Serialize,
    Deserialize,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    ToSchema,
    JsonSchema,
)]
pub enum Scope {
    /// List sandboxes, show one, read usage. Nothing inside a sandbox.
    #[serde(rename = "sandboxes:read")]
    SandboxesRead,
    /// Create, exec, processes, files, pause/resume/stop/start.
    #[serde(rename = "sandboxes:write")]
    SandboxesWrite,
    /// Delete sandboxes.
    #[serde(rename = "sandboxes:delete")]
    SandboxesDelete,
    /// Keys, quotas, audit, metrics, images; may act for any tenant.
    #[serde(rename = "admin")]
    Admin,
}

impl Scope {
    pub const ALL: [Scope; 4] = [
        Scope::SandboxesRead,
        Scope::SandboxesWrite,
        Scope::SandboxesDelete,
        Scope::Admin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::SandboxesRead => "sandboxes:read",
            Scope::SandboxesWrite => "sandboxes:write",
            Scope::SandboxesDelete => "sandboxes:delete",
            Scope::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|sc| sc.as_str() == s)
    }
}

/// `POST /v1/keys`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateKeyRequest {
    /// Tenant the key acts for: 1-64 characters of a-z, A-Z, 0-9, '-', '_', '.'.
    pub tenant: String,
    /// At least one scope.
    pub scopes: Vec<Scope>,
    /// The key stops working this many seconds from now.
    #[serde(default)]
    pub expires_in_secs: Option<u64>,
}

/// A new key. `key` is shown only here, once; the daemon keeps only its SHA-256.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct CreatedKey {
    pub id: String,
    pub key: String,
    pub tenant: String,
    pub scopes: Vec<Scope>,
    /// RFC 3339.
    pub expires_at: Option<String>,
}

/// A key as listed (never the key itself).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ApiKeyInfo {
    pub id: String,
    pub tenant: String,
    pub scopes: Vec<Scope>,
    /// RFC 3339.
    pub created_at: String,
    pub expires_at: Option<String>,
    pub revoked_at: Option<String>,
    /// Updated at most once a minute.
    pub last_used_at: Option<String>,
    /// `active`, `expired` or `revoked`.
    pub status: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ApiKeyList {
    pub keys: Vec<ApiKeyInfo>,
}

/// Limits of one tenant; an absent field is unlimited.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Sandboxes running (or being created) at once; paused ones do not count.
    #[serde(default)]
    pub max_running: Option<u64>,
    /// Sandboxes in total, stopped and paused included.
    #[serde(default)]
    pub max_sandboxes: Option<u64>,
    /// Largest memory limit of one sandbox, bytes.
    #[serde(default)]
    pub max_memory_bytes: Option<u64>,
    /// Largest CPU limit of one sandbox, cores.
    #[serde(default)]
    pub max_cpus: Option<f64>,
    /// CPU-seconds per UTC day over all the tenant's sandboxes. Reaching it pauses the
    /// tenant's running sandboxes and refuses create/resume/start/exec until the next day.
    #[serde(default)]
    pub cpu_seconds_per_day: Option<u64>,
    /// Disk bytes over all the tenant holds: its sandboxes' disks, checkpoints, templates
    /// and the image layers they use (ADR 0165). A create, fork, checkpoint or template
    /// that would not fit is refused; reaching it refuses create/resume/start/exec/file
    /// writes.
    #[serde(default)]
    pub disk_bytes: Option<u64>,
}

/// A tenant's disk usage by what holds it (ADR 0165); `disk_bytes` is their sum.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema, JsonSchema,
)]
pub struct DiskUse {
    /// The sandboxes' disks (writable layers) at their last samples.
    pub sandboxes: u64,
    /// Checkpoints, at their size when taken.
    pub checkpoints: u64,
    /// Templates, at their size when made.
    pub templates: u64,
    /// Image layers the tenant's sandboxes and templates use, each distinct layer (by
    /// digest) once at its unpacked size on disk; a layer other tenants use too counts
    /// for each of them.
    pub layers: u64,
}

/// What a tenant uses now, in the units of its quota.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct QuotaUse {
    pub running: u64,
    pub sandboxes: u64,
    pub cpu_seconds_today: f64,
    /// What the `disk_bytes` quota counts: the sum of `disk`'s parts.
    pub disk_bytes: u64,
    /// `disk_bytes` part by part.
    #[serde(default)]
    pub disk: DiskUse,
}

/// `GET /v1/quotas/{tenant}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct TenantQuota {
    pub tenant: String,
    pub quota: Quota,
    pub usage: QuotaUse,
}

/// Metered use of one sandbox over its life.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct SandboxUsage {
    pub id: String,
    pub name: Option<String>,
    /// `running`, `paused`, `stopped`, or `deleted`.
    pub state: String,
    pub cpu_seconds: f64,
    pub memory_gib_seconds: f64,
    pub peak_memory_bytes: u64,
    /// Size of the writable layer at the last sample.
    pub disk_bytes: u64,
    pub running_seconds: f64,
    pub paused_seconds: f64,
    /// Egress bytes sent and received through the daemon's proxy (issue 13).
    #[serde(default)]
    pub egress_bytes_up: u64,
    #[serde(default)]
    pub egress_bytes_down: u64,
}

/// Metered use of one tenant.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct TenantUsage {
    pub tenant: String,
    /// UTC day (YYYY-MM-DD) from which the totals count, when `since` was given.
    pub since_day: Option<String>,
    /// Totals over the UTC days since `since` (all days when absent).
    pub cpu_seconds: f64,
    pub memory_gib_seconds: f64,
    pub running_seconds: f64,
    pub paused_seconds: f64,
    /// CPU-seconds of the current UTC day (what the daily cap counts).
    pub cpu_seconds_today: f64,
    /// Disk bytes the tenant holds now, what its `disk_bytes` quota counts: its
    /// existing sandboxes' disks, checkpoints, templates and image layers (`disk`).
    pub disk_bytes: u64,
    /// `disk_bytes` part by part.
    #[serde(default)]
    pub disk: DiskUse,
    /// Egress bytes sent and received over the UTC days counted (deleted sandboxes too).
    #[serde(default)]
    pub egress_bytes_up: u64,
    #[serde(default)]
    pub egress_bytes_down: u64,
    /// Per sandbox, over each sandbox's life (existing sandboxes only).
    pub sandboxes: Vec<SandboxUsage>,
}

/// `GET /v1/usage`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct UsageReport {
    pub tenants: Vec<TenantUsage>,
}

/// One entry of the audit log. `hash` = SHA-256 of `prev_hash` and this entry's canonical
/// form (see docs/governance.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct AuditEntry {
    /// Position in the chain, from 1.
    pub seq: u64,
    /// RFC 3339 with milliseconds.
    pub time: String,
    pub tenant: String,
    /// Key id of the caller; absent for the operator's socket and the daemon itself.
    pub key_id: Option<String>,
    /// e.g. `sandbox.create`, `key.revoke`, `auth.refused`.
    pub action: String,
    pub target: String,
    /// `ok` or the error code.
    pub result: String,
    pub prev_hash: String,
    pub hash: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct AuditList {
    pub entries: Vec<AuditEntry>,
}

/// `GET /v1/audit/verify`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct AuditVerification {
    pub ok: bool,
    /// Entries checked.
    pub entries: u64,
    /// Position (seq) of the first entry that does not hold.
    pub first_bad_seq: Option<u64>,
    pub reason: Option<String>,
}
