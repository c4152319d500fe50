//! Wire types of the threadbox REST API. No I/O: the daemon, the Rust client and the
//! OpenAPI document are all derived from these types, so they cannot drift apart.
#![forbid(unsafe_code)]

use base64::Engine;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

pub mod checkpoints;
mod gov_ops;
mod governance;
mod image_ops;
pub mod images;
pub mod interp;
pub mod net_log;
pub mod network;
pub mod ops;
pub mod previews;
pub mod pty;
pub mod routes;
pub mod secrets;
pub mod templates;
pub mod tiers;
pub use governance::*;

/// Stable error codes. Scripts and SDKs match on these strings.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    NotFound,
    InvalidArgument,
    Conflict,
    Unauthenticated,
    PermissionDenied,
    QuotaExceeded,
    SandboxNotRunning,
    PayloadTooLarge,
    Unavailable,
    Internal,
    /// `If-Match` named a generation that is no longer the current one; nothing changed.
    PreconditionFailed,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "not_found",
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::Conflict => "conflict",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::QuotaExceeded => "quota_exceeded",
            ErrorCode::SandboxNotRunning => "sandbox_not_running",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::PreconditionFailed => "precondition_failed",
        }
    }

    /// The HTTP status that goes with the code.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::NotFound => 404,
            ErrorCode::InvalidArgument => 400,
            ErrorCode::Conflict => 409,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::PermissionDenied => 403,
            ErrorCode::QuotaExceeded => 429,
            ErrorCode::SandboxNotRunning => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::Unavailable => 503,
            ErrorCode::Internal => 500,
            ErrorCode::PreconditionFailed => 412,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
}

/// Every error response: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    Creating,
    Running,
    Paused,
    /// Frozen, its memory out of RAM (swap on the jail tier); any call wakes it.
    Hibernated,
    Stopped,
}

impl SandboxState {
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxState::Creating => "creating",
            SandboxState::Running => "running",
            SandboxState::Paused => "paused",
            SandboxState::Hibernated => "hibernated",
            SandboxState::Stopped => "stopped",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "creating" => SandboxState::Creating,
            "running" => SandboxState::Running,
            "paused" => SandboxState::Paused,
            "hibernated" => SandboxState::Hibernated,
            "stopped" => SandboxState::Stopped,
            _ => return None,
        })
    }
}

/// What happens when a sandbox's TTL expires.
#[derive(
    Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, ToSchema, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TtlAction {
    #[default]
    Stop,
    Delete,
}

/// Resource limits of one sandbox. Omitted fields take the daemon's defaults
/// (1 GiB memory, 1 CPU, 512 processes).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, ToSchema, JsonSchema)]
pub struct LimitsRequest {
    /// Memory limit in bytes (RAM + tmpfs + page cache of the sandbox).
    pub memory_bytes: Option<u64>,
    /// CPU limit in cores (e.g. 0.5, 2).
    pub cpus: Option<f64>,
    /// Maximum number of processes and threads.
    pub pids: Option<u32>,
    /// Size of the sandbox's writable disk in bytes (default 10 GiB; at least 16 MiB).
    #[serde(default)]
    pub disk_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema, JsonSchema)]
pub struct Limits {
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u32,
    /// Size of the writable disk in bytes; 0 for sandboxes created before disk quotas.
    #[serde(default)]
    pub disk_bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// Unique name; creating an existing name returns that sandbox (get-or-create).
    pub name: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Image name (default `host`).
    pub image: Option<String>,
    #[serde(default)]
    pub limits: LimitsRequest,
    /// Pause automatically after this many seconds without API activity.
    pub idle_pause_secs: Option<u64>,
    /// Stop automatically after this many seconds without API activity (files are kept;
    /// processes end). A TTL counted from the last call, so it never cuts a busy sandbox.
    pub idle_stop_secs: Option<u64>,
    /// Hibernate automatically after this many seconds without API activity (memory out
    /// of RAM; the next call wakes it). Usually longer than `idle_pause_secs`.
    #[serde(default)]
    pub idle_hibernate_secs: Option<u64>,
    /// Stop or delete (see `ttl_action`) this many seconds after creation.
    pub ttl_secs: Option<u64>,
    #[serde(default)]
    pub ttl_action: TtlAction,
    /// Isolation tier: `jail` (the default) or `gvisor` (`GET /v1/tiers` lists what this host
    /// supports).
    #[serde(default)]
    pub tier: Option<String>,
    /// Egress policy (issue 13): checked before anything is created, kept across
    /// stop/start and daemon restarts, changed live with `PUT .../network`. Without one the
    /// sandbox reaches nothing outside itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<network::NetworkPolicySpec>,
    /// Secrets of the tenant (issue 13, ADR 0068) the sandbox may use: each is an env
    /// variable holding a random placeholder, swapped for the value by the daemon only on
    /// requests to the secret's host. The policy must still allow that host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// An OTLP/HTTP endpoint inside the sandbox (`127.0.0.1:4318`, named in every exec's
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`) whose spans the daemon forwards to its own collector.
    /// Only on a daemon that exports traces (`serve --otlp-endpoint`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub otlp_relay: bool,
    /// A template (name or id, ADR 0110): the disk is a clone of the template's, and its
    /// image, limits, labels and network policy are the defaults of the fields not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Sandbox {
    pub id: String,
    pub name: Option<String>,
    pub state: SandboxState,
    pub labels: BTreeMap<String, String>,
    pub image: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339: last API call that touched this sandbox.
    pub last_active_at: String,
    pub limits: Limits,
    pub idle_pause_secs: Option<u64>,
    #[serde(default)]
    pub idle_stop_secs: Option<u64>,
    #[serde(default)]
    pub idle_hibernate_secs: Option<u64>,
    pub ttl_secs: Option<u64>,
    pub ttl_action: TtlAction,
    /// Process id of the sandbox's agent on the host, when running or paused; shown to
    /// the operator and admin keys only (null for other keys).
    pub agent_pid: Option<i32>,
    /// Isolation layers missing because the operator allowed a weaker posture (e.g.
    /// Landlock on a kernel without it); empty in the default posture.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub isolation_warnings: Vec<String>,
    /// The isolation tier that runs it (`jail`).
    #[serde(default = "default_tier")]
    pub tier: String,
    /// Its egress policy; absent while it has none (then it reaches nothing outside).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<network::NetworkPolicySpec>,
    /// The policy's generation (what `If-Match` names); 0 while it never had one.
    #[serde(default)]
    pub network_generation: u64,
    /// Its in-sandbox OTLP endpoint is on.
    #[serde(default)]
    pub otlp_relay: bool,
}

fn default_tier() -> String {
    "jail".to_string()
}

/// The answer of `POST /v1/sandboxes`: the sandbox, and whether this call created it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct CreatedSandbox {
    #[serde(flatten)]
    pub sandbox: Sandbox,
    /// True when this call created the sandbox; false when a sandbox of that name
    /// already existed and is returned as it is (get-or-create). A client that deletes
    /// "what it created" (a context manager) must look at this, never at the name.
    #[serde(default)]
    pub created: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<Sandbox>,
}

/// Who a process or file operation runs as inside the sandbox.
#[derive(
    Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, ToSchema, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum User {
    /// The sandbox's default (what an absent `user` means): the image config's `User`
    /// when the sandbox's image has one (ADR 0160), otherwise `user`.
    #[default]
    Default,
    /// uid 1000, home /home/user.
    User,
    /// uid 0 inside the sandbox's user namespace, without capabilities.
    Root,
}

impl User {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "default" => Some(User::Default),
            "user" | "1000" => Some(User::User),
            "root" | "0" => Some(User::Root),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            User::Default => "default",
            User::User => "user",
            User::Root => "root",
        }
    }
}

/// How bytes are carried in a JSON string.
#[derive(
    Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, ToSchema, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    #[default]
    Utf8,
    Base64,
}

/// Encodes bytes for JSON: UTF-8 text as is, anything else as base64.
pub fn encode_bytes(b: &[u8]) -> (String, Encoding) {
    match std::str::from_utf8(b) {
        Ok(s) => (s.to_string(), Encoding::Utf8),
        Err(_) => (
            base64::engine::general_purpose::STANDARD.encode(b),
            Encoding::Base64,
        ),
    }
}

/// Decodes a JSON string carrying bytes in the given encoding.
pub fn decode_bytes(s: &str, enc: Encoding) -> Result<Vec<u8>, String> {
    match enc {
        Encoding::Utf8 => Ok(s.as_bytes().to_vec()),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map_err(|e| format!("invalid base64: {e}")),
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// argv; the first element is looked up in PATH. Exactly one of `command` and
    /// `shell` must be given.
    pub command: Option<Vec<String>>,
    /// A shell command line, run with `/bin/sh -c`.
    pub shell: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the user's home).
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: User,
    /// Data written to the process's stdin, then closed.
    pub stdin: Option<String>,
    #[serde(default)]
    pub stdin_encoding: Encoding,
    /// Seconds after which the whole process tree of this call is killed.
    pub timeout_secs: Option<f64>,
    /// Bound on captured stdout and stderr, each (default 1 MiB).
    pub max_output_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema, JsonSchema)]
pub struct ExecResponse {
    /// `null` when the process was killed by the timeout.
    pub exit_code: Option<i32>,
    /// Signal that ended the process, if a signal did.
    pub signal: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// `utf8` when both streams were valid UTF-8, else both are base64.
    pub encoding: Encoding,
    pub timed_out: bool,
    /// Either stream was cut at `max_output_bytes`.
    pub truncated: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
    /// The kernel's OOM killer ended the call (the sandbox's cgroup counted an
    /// `oom_kill` during it and the process died of SIGKILL).
    #[serde(default)]
    pub oom_killed: bool,
    /// The sandbox's memory limit in bytes, given when `oom_killed` is true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit_bytes: Option<u64>,
}

/// One line of the NDJSON stream of `/exec/stream`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecEvent {
    Start {
        pid: i32,
    },
    Stdout {
        data: String,
        encoding: Encoding,
    },
    Stderr {
        data: String,
        encoding: Encoding,
    },
    End {
        exit_code: Option<i32>,
        signal: Option<i32>,
        timed_out: bool,
        truncated: bool,
        duration_ms: u64,
        /// As in `ExecResponse`.
        #[serde(default)]
        oom_killed: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory_limit_bytes: Option<u64>,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcessRequest {
    pub command: Option<Vec<String>>,
    pub shell: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: User,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ProcessInfo {
    /// Id of the background process within its sandbox.
    pub id: u64,
    pub pid: i32,
    pub command: Vec<String>,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub started_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ProcessList {
    pub processes: Vec<ProcessInfo>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ProcessLogs {
    pub stdout: String,
    pub stderr: String,
    pub encoding: Encoding,
    /// Oldest bytes dropped because the log outgrew its bound.
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KillProcessRequest {
    /// Signal number (default 9, SIGKILL).
    pub signal: Option<i32>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct FileEntry {
    /// The name; when it is not UTF-8, a display form with U+FFFD (see `name_b64`).
    pub name: String,
    /// The absolute path; when it is not UTF-8, a display form (see `path_b64`).
    pub path: String,
    /// The name's bytes in base64, present only when they are not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_b64: Option<String>,
    /// The path's bytes in base64, present only when they are not UTF-8; give it back as
    /// the `path_b64` query parameter of the file routes to name this entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_b64: Option<String>,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// RFC 3339.
    pub modified_at: String,
    pub symlink_target: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct FileList {
    pub entries: Vec<FileEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct PostureCheck {
    pub name: String,
    pub ok: bool,
    pub detail: String,
    /// False for a check that does not apply on the sandbox's tier (a jail layer gVisor
    /// does not have): `ok` is then true and `detail` gives the reason.
    pub applies: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct SelftestReport {
    /// True when every check passed.
    pub ok: bool,
    pub checks: Vec<PostureCheck>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Health {
    pub status: String,
    pub version: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddImageRequest {
    pub name: String,
    /// Absolute path of a root filesystem directory on the daemon's host.
    pub path: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct Image {
    pub name: String,
    /// `host` for the built-in image, `rootfs` for a directory, `oci` for a pulled or
    /// imported image.
    pub kind: String,
    pub path: Option<String>,
    pub created_at: String,
    /// `oci` images: where it came from (the reference, or `import:<path>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// `oci` images: the manifest's digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// `oci` images: the number of layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<u32>,
    /// `oci` images: compressed size of the layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Sandboxes that use the image (it cannot be removed while any does).
    #[serde(default)]
    pub sandboxes: u32,
    /// `oci` images: the config's `User`, as the image states it (shown; exec still runs
    /// as `user` or `root`, ADR 0104).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// `oci` images: the config's `Entrypoint` (shown; never started by the daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    /// `oci` images: the config's `Cmd` (shown; never started by the daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ImageList {
    pub images: Vec<Image>,
}

/// `256 MiB`, `1.5 GiB`, `512 KiB` or bytes.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if b >= size {
            let v = b as f64 / size as f64;
            return if b.is_multiple_of(size) {
                format!("{} {unit}", b / size)
            } else {
                format!("{v:.1} {unit}")
            };
        }
    }
    format!("{b} bytes")
}

/// The words for an OOM kill (`oom_killed`), the same in the CLI, MCP and the SDKs:
/// `killed: out of memory (limit 256 MiB)`.
pub fn oom_message(memory_limit_bytes: Option<u64>) -> String {
    let limit = memory_limit_bytes
        .map(|b| format!(" (limit {})", human_bytes(b)))
        .unwrap_or_default();
    format!("killed: out of memory{limit}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_both_encodings() {
        for b in [b"hello".to_vec(), vec![0xff, 0, 0xfe]] {
            let (s, e) = encode_bytes(&b);
            assert_eq!(decode_bytes(&s, e).unwrap(), b);
        }
        assert_eq!(encode_bytes(b"ok").1, Encoding::Utf8);
        assert_eq!(encode_bytes(&[0xff]).1, Encoding::Base64);
    }

    #[test]
    fn codes_are_stable_strings() {
        let v = serde_json::to_value(ErrorCode::SandboxNotRunning).unwrap();
        assert_eq!(v, "sandbox_not_running");
        assert_eq!(ErrorCode::QuotaExceeded.http_status(), 429);
    }

    #[test]
    fn unknown_fields_are_refused() {
        let r: Result<ExecRequest, _> = serde_json::from_str(r#"{"shell":"x","bogus":1}"#);
        assert!(r.is_err());
    }
}
