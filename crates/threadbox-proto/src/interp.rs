//! Interpreter contexts (issue 15, ADR 0080): a persistent Python worker per context,
//! supervised by the agent. The requests and the events of one execution.

use crate::RunAs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A MIME bundle: MIME type → value (text; base64 for binary types; JSON for `*/json`).
pub type MimeBundle = serde_json::Map<String, serde_json::Value>;

/// Default bound on a cell's stdout and stderr, each (as exec's).
pub const DEFAULT_CELL_OUTPUT: u64 = crate::DEFAULT_MAX_OUTPUT;
/// Largest cell source the agent accepts.
pub const MAX_CODE: usize = 4 * 1024 * 1024;
/// Contexts per sandbox.
pub const MAX_CONTEXTS: usize = 8;

fn python() -> String {
    "python".into()
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContextSpec {
    /// Get-or-create key; `None` creates an unnamed context (named by its id).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default = "python")]
    pub language: String,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub user: RunAs,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ContextState {
    Idle,
    Busy,
    /// The worker ended (crash, `os._exit`, OOM); the next execute starts a new one and
    /// says so (`context_created`).
    Dead,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ContextInfo {
    pub id: String,
    pub name: String,
    pub language: String,
    pub cwd: Option<String>,
    pub user: RunAs,
    pub state: ContextState,
    pub execution_count: u64,
    /// Increases each time the worker is replaced (restart, escalated interrupt, death).
    pub generation: u64,
    pub pid: Option<i32>,
    /// Seconds since the epoch.
    pub created_at: i64,
    /// Why the worker died, when `state` is `dead` (`oom`, `killed`, `exited:<code>`).
    #[serde(default)]
    pub reason: Option<String>,
    /// True in a create's answer when the context was made by this call.
    #[serde(default)]
    pub created: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CellSpec {
    /// Context id or name.
    pub ctx: String,
    pub code: String,
    /// Set for this cell only, restored afterwards.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Running time (frozen time excluded) after which the cell is interrupted.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Bound on stdout and stderr, each.
    #[serde(default = "default_cell_output")]
    pub max_output: u64,
    /// Send events as they happen (`Response::Cell`) before the final `Executed`.
    #[serde(default)]
    pub stream: bool,
}

fn default_cell_output() -> u64 {
    DEFAULT_CELL_OUTPUT
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    #[default]
    Ok,
    /// The cell raised: the `exception` says what. Not an error of the call.
    Exception,
    /// Stopped by an interrupt request.
    Interrupted,
    /// Stopped by its timeout.
    TimedOut,
    /// The worker ended during the cell (`reason` says how); its state is lost.
    ContextDied,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ExceptionInfo {
    pub name: String,
    pub value: String,
    /// Text of the traceback, user frames only, with the cells' source lines.
    pub traceback: String,
    #[serde(default)]
    pub frames: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct CellOutput {
    pub data: MimeBundle,
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// One event of an execution, in order.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeEvent {
    Start {
        execution_id: String,
        context_id: String,
        execution_count: u64,
        /// The context was made (or remade after its worker died) for this execution.
        context_created: bool,
    },
    Stdout {
        text: String,
    },
    Stderr {
        text: String,
    },
    Display(CellOutput),
    /// The value of the cell's last expression.
    Result(CellOutput),
    Exception(ExceptionInfo),
    End(CellEnd),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct CellEnd {
    pub status: CellStatus,
    pub execution_count: u64,
    pub duration_ms: u64,
    /// Some output was cut (a stream over its bound, a value or display dropped).
    pub truncated: bool,
    /// The worker was replaced: every variable of the context is gone.
    pub context_restarted: bool,
    #[serde(default)]
    pub reason: Option<String>,
}

/// The folded outcome of an execution (the final frame).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct Execution {
    pub execution_id: String,
    pub context_id: String,
    pub execution_count: u64,
    pub context_created: bool,
    pub status: CellStatus,
    /// Empty in stream mode (the text went in `Cell` frames).
    pub stdout: String,
    pub stderr: String,
    /// `display()` outputs and flushed figures, in order.
    pub outputs: Vec<CellOutput>,
    pub result: Option<CellOutput>,
    pub exception: Option<ExceptionInfo>,
    pub duration_ms: u64,
    pub truncated: bool,
    pub context_restarted: bool,
    pub reason: Option<String>,
}
