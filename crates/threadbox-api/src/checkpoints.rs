//! Checkpoints, rewind and fork of a sandbox's disk (issue 14, ADR 0100): wire types and
//! their operations (ADR 0057).

use crate::ops::{HttpMethod, Operation};
use crate::{routes, Sandbox, Scope};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One checkpoint of a sandbox's disk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct Checkpoint {
    /// `ck-…`, unique in the daemon.
    pub id: String,
    /// The sandbox's id.
    pub sandbox: String,
    /// Unique among the sandbox's checkpoints; a rewind names it (or the id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The checkpoint the disk descended from when this one was taken (the last one
    /// taken or rewound to), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Bytes the checkpoint holds on the host (allocated when taken; under reflink the
    /// blocks are shared with the sandbox's disk until it overwrites them). Counted in the
    /// tenant's disk usage.
    pub size_bytes: u64,
    /// `reflink` (nothing copied) or `copy` (the daemon's root cannot share extents).
    pub method: String,
    /// RFC 3339.
    pub created_at: String,
    /// The checkpoint also holds the sandbox's memory and processes (taken with
    /// `with_memory`, issue 16 scope 4, ADR 0195): a rewind to it brings them back.
    #[serde(default)]
    pub with_memory: bool,
    /// Bytes of the memory image, when there is one (included in `size_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct CheckpointList {
    /// Oldest first.
    pub checkpoints: Vec<Checkpoint>,
}

/// `POST /v1/sandboxes/{sandbox}/checkpoints`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateCheckpointRequest {
    /// 1–128 of `[A-Za-z0-9._-]`, not starting with `ck-`; unique per sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Also save the memory and running processes, at the same instant as the disk
    /// (issue 16 scope 4, ADR 0195): a rewind to it brings the processes back where they
    /// were. Needs a tier with the `checkpoint_memory` capability (gvisor) and a running
    /// sandbox; `true` on the jail is refused before anything changes. Default `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub with_memory: bool,
}

/// `POST /v1/sandboxes/{sandbox}/rewind`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindRequest {
    /// A checkpoint's label or id.
    pub to: String,
    /// Also delete the checkpoints taken after it.
    #[serde(default)]
    pub drop_later: bool,
}

/// `POST /v1/sandboxes/{sandbox}/fork`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// How many forks (1–16, default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// Names the forks `<prefix>-1` … `<prefix>-N`; without it they have no name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_prefix: Option<String>,
    /// The forks' exact names (one fork each; not with `name_prefix`; `count`, if given,
    /// must be their number). How a LangGraph thread's sandbox forks into
    /// `thread-<new thread id>` (ADR 0115).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub names: Option<Vec<String>>,
    /// Fork the disk as it was at this checkpoint (label or id) instead of as it is now;
    /// the sandbox is not frozen then, and the checkpoint is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// Labels of the forks, over the parent's (a key given here replaces the parent's
    /// value): a LangGraph thread's fork names its own thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<std::collections::BTreeMap<String, String>>,
    /// Fork memory and running processes too, not only the disk (issue 16 scope 4, ADR
    /// 0136): a tier with the `fork_memory` capability (gvisor) and a running sandbox.
    /// Unset: with memory where the tier can and the sandbox runs, else the disk only.
    /// `true` where the tier cannot (the jail forks disks only) is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub with_memory: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
pub struct ForkResponse {
    /// The new sandboxes, running.
    pub sandboxes: Vec<Sandbox>,
    /// Whether the forks got the parent's memory and processes (else its disk only, and
    /// their processes started afresh).
    #[serde(default)]
    pub with_memory: bool,
}

fn to_json<T: Serialize>(v: &T) -> Option<serde_json::Value> {
    serde_json::to_value(v).ok()
}

/// Take a checkpoint (the sandbox frozen for the instant, then as it was).
#[derive(Debug, Clone)]
pub struct CreateCheckpoint {
    pub sandbox: String,
    pub request: CreateCheckpointRequest,
}

impl Operation for CreateCheckpoint {
    type Output = Checkpoint;
    const NAME: &'static str = "checkpoint.create";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::CHECKPOINTS;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
    fn body(&self) -> Option<serde_json::Value> {
        to_json(&self.request)
    }
}

/// A sandbox's checkpoints, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCheckpoints {
    pub sandbox: String,
}

impl Operation for ListCheckpoints {
    type Output = CheckpointList;
    const NAME: &'static str = "checkpoint.list";
    const SCOPE: Scope = Scope::SandboxesRead;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::CHECKPOINTS;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
}

/// Delete one checkpoint (by label or id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteCheckpoint {
    pub sandbox: String,
    pub checkpoint: String,
}

impl Operation for DeleteCheckpoint {
    type Output = ();
    const NAME: &'static str = "checkpoint.delete";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Delete;
    const PATH: &'static str = routes::CHECKPOINT;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone(), self.checkpoint.clone()]
    }
}

/// Return the disk to a checkpoint; the processes are restarted on it, id and name kept.
#[derive(Debug, Clone)]
pub struct Rewind {
    pub sandbox: String,
    pub request: RewindRequest,
}

impl Operation for Rewind {
    type Output = Sandbox;
    const NAME: &'static str = "sandbox.rewind";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::SANDBOX_REWIND;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
    fn body(&self) -> Option<serde_json::Value> {
        to_json(&self.request)
    }
}

/// N new running sandboxes with the sandbox's files at this instant, its limits, image,
/// network policy and labels; the sandbox keeps running.
#[derive(Debug, Clone)]
pub struct Fork {
    pub sandbox: String,
    pub request: ForkRequest,
}

impl Operation for Fork {
    type Output = ForkResponse;
    const NAME: &'static str = "sandbox.fork";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::SANDBOX_FORK;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
    fn body(&self) -> Option<serde_json::Value> {
        to_json(&self.request)
    }
}
