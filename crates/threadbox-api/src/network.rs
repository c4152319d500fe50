//! Wire types of a sandbox's network policy and its egress log (issue 13). Only serde and
//! schema derives live here; matching, validation and the floor are in `threadbox-net`, which
//! turns a [`NetworkPolicySpec`] into its checked form and refuses bad input with a sentence.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a rule (or the default) does with what it matches.
#[derive(
    Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq, Hash, ToSchema, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum NetAction {
    Allow,
    #[default]
    Deny,
}

/// How the daemon learns the name on a rule's ports: `tls` peeks the SNI of the ClientHello,
/// `http` the Host header, `tcp` neither (the name then comes from the DNS pins). Ports 443 and
/// 80 are `tls` and `http` without being told.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, ToSchema, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetProtocol {
    Tls,
    Http,
    Tcp,
}

/// One rule. Exactly one of `host` and `cidr` is set.
///
/// * `host`: `example.com` (that name only) or `*.example.com` (its subdomains, not the name
///   itself); case-insensitive, a trailing dot is ignored.
/// * `cidr`: `203.0.113.0/24` or a bare address.
/// * `ports`: each `"443"`, `"8000-8100"` or `"any"`. A host rule without ports covers 80 and
///   443; a CIDR rule without ports covers every port.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkRuleSpec {
    pub action: NetAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<NetProtocol>,
}

/// A sandbox's egress policy as the API takes it. Rules are tried in order and the first that
/// matches decides; the named `presets` (e.g. `python-packages`, `npm`, `github`) are tried
/// after the explicit rules, so an explicit deny can carve a hole in a preset.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkPolicySpec {
    #[serde(default)]
    pub rules: Vec<NetworkRuleSpec>,
    #[serde(default)]
    pub presets: Vec<String>,
    #[serde(default)]
    pub default: NetAction,
}

/// What one egress log row is about.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetLogKind {
    Tcp,
    Dns,
}

/// Why a connection or DNS answer was decided the way it was. A stable enum: scripts match on
/// these strings.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Hash, ToSchema, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetReason {
    /// A rule allowed it (see `rule`).
    RuleAllow,
    /// A rule denied it (see `rule`).
    RuleDeny,
    /// No rule matched and the policy's default allows.
    DefaultAllow,
    /// No rule matched and the policy's default denies.
    DefaultDeny,
    /// Every address it would have reached is on the operator floor (loopback, private,
    /// metadata, the host's own addresses…).
    Floor,
    /// It would have reached one of the daemon's own ports.
    DaemonPort,
    /// No name (SNI, Host or DNS pin) and no CIDR rule for the address.
    NoName,
    /// The original destination was missing or was the redirect listener itself.
    Loop,
    /// The sandbox has as many egress connections open as it may.
    ConnLimit,
    /// The sandbox asked more DNS questions than its rate allows.
    RateLimited,
    /// The daemon's resolver could not resolve the name.
    ResolveFailed,
    /// Every dial of an allowed destination failed.
    DialFailed,
    /// A policy update revoked an open connection.
    PolicyRevoked,
    /// The DNS question was of a type answered with no data (AAAA, HTTPS, SVCB…).
    NoDataType,
    /// The DNS question was malformed or not a plain query.
    BadQuery,
}

/// One row of a sandbox's egress log: a connection (written when it closes) or a DNS answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct NetLogEntry {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub sandbox: String,
    pub kind: NetLogKind,
    /// The name the decision was about: SNI, Host, DNS pin, or the DNS question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// For a connection: the address dialled (or the sandbox's original destination when
    /// nothing was dialled). For DNS: the first address answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    pub port: u16,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub decision: NetAction,
    pub reason: NetReason,
    /// Index of the deciding rule in the checked policy (explicit rules first, then presets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<usize>,
    /// The SNI/Host name does not match the address the sandbox chose (it was dialled by name).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub name_ip_mismatch: bool,
    /// DNS only: the question's type and how many addresses were answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers: Option<u32>,
}

/// A sandbox's policy as the daemon holds it. `policy` is absent while the sandbox has none
/// (then every connection is refused by the kernel); `generation` grows with every change and
/// is what `If-Match` names.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct NetworkInfo {
    pub generation: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<NetworkPolicySpec>,
}

/// A sandbox's egress policy (`GET /v1/sandboxes/{sandbox}/network`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetNetwork {
    /// Id or name of the sandbox.
    pub sandbox: String,
}

impl crate::ops::Operation for GetNetwork {
    type Output = NetworkInfo;
    const NAME: &'static str = "network.get";
    const SCOPE: crate::Scope = crate::Scope::SandboxesRead;
    const METHOD: crate::ops::HttpMethod = crate::ops::HttpMethod::Get;
    const PATH: &'static str = crate::routes::SANDBOX_NETWORK;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
}

/// Replaces a sandbox's egress policy at once (`PUT /v1/sandboxes/{sandbox}/network`, the
/// policy as the body). With `if_match` (the `If-Match` header) the change is made only if
/// the policy is still that generation, else 412. Open connections the new policy refuses
/// are closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetNetwork {
    pub sandbox: String,
    pub policy: NetworkPolicySpec,
    pub if_match: Option<u64>,
}

impl crate::ops::Operation for SetNetwork {
    type Output = NetworkInfo;
    const NAME: &'static str = "network.set";
    const SCOPE: crate::Scope = crate::Scope::SandboxesWrite;
    const METHOD: crate::ops::HttpMethod = crate::ops::HttpMethod::Put;
    const PATH: &'static str = crate::routes::SANDBOX_NETWORK;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
    fn query(&self) -> Vec<(&'static str, String)> {
        // The Rust client has no header channel per operation: the generation also goes as
        // `?if_match=N`, which the handler treats as the header.
        self.if_match
            .map(|g| vec![("if_match", g.to_string())])
            .unwrap_or_default()
    }
    fn body(&self) -> Option<serde_json::Value> {
        serde_json::to_value(&self.policy).ok()
    }
}
