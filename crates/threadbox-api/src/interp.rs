//! Interpreter contexts (issue 15, ADR 0080): persistent Python contexts in a sandbox and
//! the executions of code in them.

use crate::ops::{HttpMethod, Operation};
use crate::{routes, ErrorCode, Scope, User};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// A MIME bundle: MIME type → value (text; base64 for binary types such as `image/png`;
/// JSON for `application/json`).
pub type MimeBundle = serde_json::Map<String, serde_json::Value>;

fn python() -> String {
    "python".into()
}

/// The languages a context can run, by their canonical names (ADR 0080, 0083).
pub const LANGUAGES: &[&str] = &["python", "javascript", "bash"];

/// The canonical name of a language, accepting the usual aliases (`python3`, `js`,
/// `node`, `sh` is not bash and is refused).
pub fn canonical_language(name: &str) -> Option<&'static str> {
    match name {
        "python" | "python3" | "py" => Some("python"),
        "javascript" | "js" | "node" => Some("javascript"),
        "bash" => Some("bash"),
        _ => None,
    }
}

/// Body of `POST /v1/sandboxes/{sandbox}/contexts`: get-or-create by `name`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct CreateContextRequest {
    /// Unique within the sandbox; an existing context of that name is returned as is.
    #[serde(default)]
    pub name: Option<String>,
    /// `python` (default), `javascript` (node; also `js`, `node`) or `bash`.
    #[serde(default = "python")]
    pub language: String,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub user: User,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ContextState {
    Idle,
    Busy,
    /// The context's state is gone (`reason` says why): its worker died (`oom`,
    /// `killed`, `exited:<code>`, `signal:<n>`; the next execution starts a new one and
    /// says `context_created: true`), or the sandbox's agent no longer has it
    /// (`stopped`, `daemon-restart`, `agent-restart`; a get-or-create of its name makes
    /// it again and says `recreated: true`). Never recreated silently.
    Lost,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct Context {
    /// `ctx-<n>`.
    pub id: String,
    pub name: String,
    pub language: String,
    pub cwd: Option<String>,
    pub user: User,
    pub state: ContextState,
    pub execution_count: u64,
    /// Increases whenever the worker is replaced (restart, a cell that would not stop,
    /// a worker that died): the variables of an earlier generation are gone.
    pub generation: u64,
    pub pid: Option<i32>,
    /// RFC 3339.
    pub created_at: String,
    /// Why the worker died, when `state` is `dead`: `oom`, `killed`, `exited:<code>`.
    pub reason: Option<String>,
    /// True when this call made the context.
    #[serde(default)]
    pub created: bool,
    /// True when this call made the context again after it was lost: every variable of
    /// the earlier one is gone (`lost_reason` says why).
    #[serde(default)]
    pub recreated: bool,
    #[serde(default)]
    pub lost_reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct ContextList {
    pub contexts: Vec<Context>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct InterruptResult {
    /// False when the context was idle (nothing to interrupt).
    pub interrupted: bool,
}

/// Body of `POST .../contexts/{context}/execute`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct ExecuteCodeRequest {
    pub code: String,
    /// Set for this cell only, restored afterwards.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Running time (time paused excluded) before the cell is interrupted; default 300.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Bound on stdout and stderr, each (default 1 MiB).
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
}

#[derive(
    Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default, ToSchema, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum CodeStatus {
    #[default]
    Ok,
    /// The code raised; `exception` says what (a result, not an API error).
    Exception,
    Interrupted,
    TimedOut,
    /// The worker ended during the cell (`reason`); the context's state is lost.
    ContextDied,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default, ToSchema, JsonSchema)]
pub struct CodeException {
    pub name: String,
    pub value: String,
    /// The traceback's text, user frames only, with the cells' source lines.
    pub traceback: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct CodeOutput {
    /// MIME type → value (base64 for binary types, JSON for `application/json`).
    #[schema(value_type = Object)]
    pub data: MimeBundle,
    #[schema(value_type = Object)]
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// The outcome of one execution.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default, ToSchema, JsonSchema)]
pub struct CodeExecution {
    pub execution_id: String,
    pub context_id: String,
    pub execution_count: u64,
    /// The context was made (or remade after its worker died) by this execution.
    pub context_created: bool,
    pub status: CodeStatus,
    pub stdout: String,
    pub stderr: String,
    /// `display()` outputs and figures, in order.
    pub outputs: Vec<CodeOutput>,
    /// The value of the last expression.
    pub result: Option<CodeOutput>,
    pub exception: Option<CodeException>,
    pub duration_ms: u64,
    /// Some output was cut (a stream over its bound, a value or a display dropped).
    pub truncated: bool,
    /// The worker was replaced during the call: every variable is gone.
    pub context_restarted: bool,
    pub reason: Option<String>,
    /// This call made the context again after it was lost (a stop, an agent restart):
    /// the variables of the earlier one are gone; `lost_reason` says why.
    #[serde(default)]
    pub context_recreated: bool,
    #[serde(default)]
    pub lost_reason: Option<String>,
}

/// Get-or-create a context in a sandbox.
#[derive(Debug, Clone)]
pub struct CreateContext {
    pub sandbox: String,
    pub request: CreateContextRequest,
}

/// The contexts of a sandbox.
#[derive(Debug, Clone)]
pub struct ListContexts {
    pub sandbox: String,
}

/// One context by id or name: its state and, when its worker died, why.
#[derive(Debug, Clone)]
pub struct GetContext {
    pub sandbox: String,
    pub context: String,
}

/// A context by id or name: delete, restart, interrupt.
#[derive(Debug, Clone)]
pub struct DeleteContext {
    pub sandbox: String,
    pub context: String,
}

#[derive(Debug, Clone)]
pub struct RestartContext {
    pub sandbox: String,
    pub context: String,
}

#[derive(Debug, Clone)]
pub struct InterruptContext {
    pub sandbox: String,
    pub context: String,
}

/// Run code in a context (`python` is get-or-create).
#[derive(Debug, Clone)]
pub struct ExecuteCode {
    pub sandbox: String,
    pub context: String,
    pub request: ExecuteCodeRequest,
}

macro_rules! ctx_op {
    ($name:ident => $out:ty, $audit:literal, $scope:ident, $method:ident, $path:expr, $($field:ident),* ; $body:expr) => {
        impl Operation for $name {
            type Output = $out;
            const NAME: &'static str = $audit;
            const SCOPE: Scope = Scope::$scope;
            const METHOD: HttpMethod = HttpMethod::$method;
            const PATH: &'static str = $path;
            fn path_values(&self) -> Vec<String> {
                vec![$(self.$field.clone()),*]
            }
            fn body(&self) -> Option<serde_json::Value> {
                let f: fn(&Self) -> Option<serde_json::Value> = $body;
                f(self)
            }
        }
    };
}

ctx_op!(CreateContext => Context, "context.create", SandboxesWrite, Post, routes::CONTEXTS, sandbox;
    |s| serde_json::to_value(&s.request).ok());
ctx_op!(ListContexts => ContextList, "context.list", SandboxesRead, Get, routes::CONTEXTS, sandbox;
    |_| None);
ctx_op!(GetContext => Context, "context.get", SandboxesRead, Get, routes::CONTEXT, sandbox, context;
    |_| None);
ctx_op!(DeleteContext => (), "context.delete", SandboxesWrite, Delete, routes::CONTEXT, sandbox, context;
    |_| None);
ctx_op!(RestartContext => Context, "context.restart", SandboxesWrite, Post, routes::CONTEXT_RESTART, sandbox, context;
    |_| None);
ctx_op!(InterruptContext => InterruptResult, "context.interrupt", SandboxesWrite, Post, routes::CONTEXT_INTERRUPT, sandbox, context;
    |_| None);
ctx_op!(ExecuteCode => CodeExecution, "code.execute", SandboxesWrite, Post, routes::CONTEXT_EXECUTE, sandbox, context;
    |s| serde_json::to_value(&s.request).ok());

/// One line of the NDJSON stream of `execute/stream` and of `executions/{execution}`:
/// `start`, then `stdout`/`stderr`/`display`/`result`/`exception` in the order the cell
/// made them, then `end` (or `error` when the call failed).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeEvent {
    Start {
        /// Re-attach with `GET .../executions/{execution_id}`.
        execution_id: String,
        context_id: String,
        execution_count: u64,
        context_created: bool,
    },
    /// Text; a character is never split between two events.
    Stdout {
        text: String,
    },
    Stderr {
        text: String,
    },
    /// A `display()` output or a flushed figure.
    Display {
        #[schema(value_type = Object)]
        data: MimeBundle,
        #[schema(value_type = Object)]
        #[serde(default)]
        metadata: serde_json::Map<String, serde_json::Value>,
    },
    /// The value of the last expression.
    Result {
        #[schema(value_type = Object)]
        data: MimeBundle,
        #[schema(value_type = Object)]
        #[serde(default)]
        metadata: serde_json::Map<String, serde_json::Value>,
    },
    Exception {
        name: String,
        value: String,
        traceback: String,
    },
    /// The summary of the execution (the fields of `CodeExecution` without the outputs).
    End {
        execution_id: String,
        context_id: String,
        execution_count: u64,
        context_created: bool,
        status: CodeStatus,
        duration_ms: u64,
        truncated: bool,
        context_restarted: bool,
        reason: Option<String>,
        #[serde(default)]
        context_recreated: bool,
        #[serde(default)]
        lost_reason: Option<String>,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
    /// Sent after a few seconds without another event, so that a client that went away
    /// is noticed (and its cell interrupted) even while the cell is silent. Ignore it.
    Keepalive,
}
