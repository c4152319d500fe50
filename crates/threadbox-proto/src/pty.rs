//! Terminal sessions (ADR 0092): a process on a new pty in the sandbox.
//!
//! `PtyStart` is a streamed request like a streamed `Exec`: `Started { pid }`, then the
//! terminal's output as `Output { stream: stdout }` frames, then `Exited` (the shell's
//! exit code; output fields empty). Input and size changes are separate requests that
//! name the session by that pid (unique in the sandbox while the session lives), each
//! answered `Done`, or `NotFound` once the session is over.

use crate::{Command, RunAs};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Largest terminal side accepted (rows or columns).
pub const MAX_TERMINAL_SIDE: u16 = 1000;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PtySpec {
    pub command: Command,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: RunAs,
    pub cols: u16,
    pub rows: u16,
}
