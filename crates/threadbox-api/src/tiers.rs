//! The isolation tiers a daemon has (issue 16, ADR 0121): `GET /v1/tiers`. A tier the host
//! cannot run (`gvisor` without runsc) is listed unavailable with the reason, which is
//! also what a create naming it is refused with.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One isolation tier.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct Tier {
    /// What `create --tier` takes (`jail`, `gvisor`).
    pub name: String,
    /// Sandboxes whose create names no tier get this one.
    pub default: bool,
    /// Whether this host can boot sandboxes of the tier now.
    pub available: bool,
    /// Why not, when unavailable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The kernel the sandbox's processes see (`uname -r` inside: gVisor's sentry has its
    /// own), when the tier reports one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// The runtime's version (runsc's), when the tier has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// What the tier supports beyond running processes and files: `checkpoints`
    /// (disk checkpoints, rewind, fork), `egress` (network policies, previews, the OTLP
    /// endpoint), `landlock`, `call_cgroups` (a timeout reaches `setsid` descendants), `uid_ranges` (a host uid
    /// range per sandbox). Tests skip by these, saying so.
    pub capabilities: Vec<String>,
}

/// Every tier of the daemon, by name.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct TierList {
    pub tiers: Vec<Tier>,
}

/// Lists the daemon's tiers (`GET /v1/tiers`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListTiers;

impl crate::ops::Operation for ListTiers {
    type Output = TierList;
    const NAME: &'static str = "tier.list";
    const SCOPE: crate::Scope = crate::Scope::SandboxesRead;
    const METHOD: crate::ops::HttpMethod = crate::ops::HttpMethod::Get;
    const PATH: &'static str = crate::routes::TIERS;
}
