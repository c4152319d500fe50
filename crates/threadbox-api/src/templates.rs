//! Templates (issue 14, scope 5; ADR 0110): a named, immutable disk clone plus the defaults
//! new sandboxes start from. Wire types and their operations (ADR 0057).

use crate::network::NetworkPolicySpec;
use crate::ops::{HttpMethod, Operation};
use crate::{routes, LimitsRequest, Scope};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// A template: a disk and the defaults of the sandboxes created from it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema, JsonSchema)]
pub struct Template {
    /// `tp-…`, unique in the daemon.
    pub id: String,
    /// Unique in the tenant; `create --template` names it (or the id).
    pub name: String,
    /// Where the disk came from: `sandbox <id>[:<checkpoint label or id>]` or
    /// `image <name> + <n> steps`.
    pub source: String,
    /// The image the disk is an upper of; every sandbox of the template runs it.
    pub image: String,
    /// Isolation tier of the disk.
    pub tier: String,
    /// Defaults of the template's sandboxes (a create's own `limits` override them, except
    /// `disk_bytes`: the disk is a clone of this size).
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u32,
    pub disk_bytes: u64,
    /// Labels every sandbox of the template gets (a create's own labels win per key).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Egress policy its sandboxes get unless a create gives its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicySpec>,
    /// Bytes its disk holds on the host (allocated when made; under reflink shared with
    /// its source until either side overwrites them). Counted in the tenant's disk usage.
    pub size_bytes: u64,
    /// `reflink` (nothing copied) or `copy`.
    pub method: String,
    /// Existing sandboxes created from it. They do not depend on it: deleting the template
    /// leaves them intact (each disk is a clone).
    pub sandboxes: u32,
    /// RFC 3339.
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct TemplateList {
    /// Oldest first.
    pub templates: Vec<Template>,
}

/// `POST /v1/templates`: from a sandbox (`from`, optionally one of its checkpoints) or
/// from an image with build steps (`image`, `run`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTemplateRequest {
    /// 1–63 of `[a-z0-9._-]` starting with a letter or digit; unique in the tenant.
    pub name: String,
    /// A sandbox (id or name) whose disk becomes the template's, with its image, limits,
    /// labels and network policy as the defaults.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// With `from`: that checkpoint (label or id) of the sandbox; without it a fresh one is
    /// taken (the sandbox frozen for the instant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// Build from this image instead (`host` when neither `from` nor `image` is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Build steps, each a shell command line run in turn as `user` in a temporary
    /// sandbox; a step that exits non-zero fails the build and leaves nothing behind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub run: Vec<String>,
    /// The build sandbox's egress policy, kept as the template's default policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkPolicySpec>,
    /// Limits of the build sandbox, kept as the template's defaults.
    #[serde(default)]
    pub limits: LimitsRequest,
    /// Labels of the template's sandboxes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Seconds each build step may run (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_timeout_secs: Option<f64>,
}

/// One build step's result.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema, JsonSchema)]
pub struct BuildStep {
    pub run: String,
    /// `null` when the step was killed by its timeout.
    pub exit_code: Option<i32>,
    /// Output of the step (up to 1 MiB each, lossy UTF-8).
    pub stdout: String,
    pub stderr: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, ToSchema, JsonSchema)]
pub struct CreatedTemplate {
    pub template: Template,
    /// The build steps, in order (empty for a template taken from a sandbox).
    #[serde(default)]
    pub steps: Vec<BuildStep>,
}

fn to_json<T: Serialize>(v: &T) -> Option<serde_json::Value> {
    serde_json::to_value(v).ok()
}

/// Make a template.
#[derive(Debug, Clone)]
pub struct CreateTemplate {
    pub request: CreateTemplateRequest,
}

impl Operation for CreateTemplate {
    type Output = CreatedTemplate;
    const NAME: &'static str = "template.create";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::TEMPLATES;
    fn body(&self) -> Option<serde_json::Value> {
        to_json(&self.request)
    }
}

/// The tenant's templates, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListTemplates;

impl Operation for ListTemplates {
    type Output = TemplateList;
    const NAME: &'static str = "template.list";
    const SCOPE: Scope = Scope::SandboxesRead;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::TEMPLATES;
}

/// One template (name or id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetTemplate {
    pub template: String,
}

impl Operation for GetTemplate {
    type Output = Template;
    const NAME: &'static str = "template.get";
    const SCOPE: Scope = Scope::SandboxesRead;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::TEMPLATE;
    fn path_values(&self) -> Vec<String> {
        vec![self.template.clone()]
    }
}

/// Delete a template (name or id). Its sandboxes are untouched; refused while the warm
/// pool is configured to hold sandboxes of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteTemplate {
    pub template: String,
}

impl Operation for DeleteTemplate {
    type Output = ();
    const NAME: &'static str = "template.delete";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Delete;
    const PATH: &'static str = routes::TEMPLATE;
    fn path_values(&self) -> Vec<String> {
        vec![self.template.clone()]
    }
}
