//! The host <-> agent protocol.
//!
//! One connection carries many requests at once: every frame names the request it belongs
//! to (`id`), and a request may be answered by several frames (a stream) ending with one
//! marked final. A frame on the wire is a 4-byte big-endian length followed by that many
//! bytes of JSON. Frames larger than [`MAX_FRAME`] are refused by both sides, so a hostile
//! peer cannot make the other allocate without bound.
//!
//! The first frame in each direction is a [`Hello`] carrying the protocol version and the
//! capabilities of the sender; a peer with a different major version is refused.
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub mod codec;
pub mod interp;
pub mod pty;
pub use codec::{decode_frame, encode_frame, FrameDecoder};
pub use interp::{CellSpec, CodeEvent, ContextInfo, ContextSpec, Execution};
pub use pty::PtySpec;

/// Protocol version. The major part must match between host and agent.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest frame either side accepts (header excluded).
pub const MAX_FRAME: usize = 32 * 1024 * 1024;

/// Largest `max_output` the host asks for (each of stdout/stderr), so a final exec frame
/// (both streams, base64) always fits in [`MAX_FRAME`].
pub const MAX_OUTPUT_LIMIT: u64 = 8 * 1024 * 1024;

/// Largest chunk of process output or file data put in one frame.
pub const CHUNK: usize = 64 * 1024;

/// Default bound on captured stdout and stderr, each.
pub const DEFAULT_MAX_OUTPUT: u64 = 1024 * 1024;

/// Errors of the codec.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtoError {
    #[error("frame of {0} bytes exceeds the maximum of {MAX_FRAME}")]
    FrameTooLarge(usize),
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("peer speaks protocol version {0}, this side speaks {PROTOCOL_VERSION}")]
    VersionMismatch(u32),
}

/// Handshake, sent first by each side.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hello {
    pub version: u32,
    /// Feature names the sender supports (e.g. `exec`, `files`, `background`, `selftest`).
    pub capabilities: Vec<String>,
    /// Free-form build identification, for logs.
    pub software: String,
}

impl Hello {
    pub fn ours(software: &str, capabilities: &[&str]) -> Self {
        Hello {
            version: PROTOCOL_VERSION,
            capabilities: capabilities.iter().map(|s| s.to_string()).collect(),
            software: software.to_string(),
        }
    }

    /// Checks that the peer's version is compatible with ours.
    pub fn check(&self) -> Result<(), ProtoError> {
        if self.version != PROTOCOL_VERSION {
            return Err(ProtoError::VersionMismatch(self.version));
        }
        Ok(())
    }
}

/// Everything that travels on the connection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "t", rename_all = "snake_case")]
pub enum Frame {
    Hello(Hello),
    /// host -> agent
    Request {
        id: u64,
        req: Request,
    },
    /// agent -> host; `Response::is_final` says whether more frames follow for `id`.
    Response {
        id: u64,
        resp: Response,
    },
    /// host -> agent: stop the request `id` (e.g. the client went away).
    Cancel {
        id: u64,
    },
}

/// Which user a process or file operation runs as inside the sandbox.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum RunAs {
    /// uid/gid 1000, home `/home/user` (the default).
    #[default]
    User,
    /// uid 0 inside the user namespace, with no capabilities.
    Root,
    /// Any uid/gid of the sandbox's user namespace (an image config's `User`, ADR 0160):
    /// both below 65 536, so they map into the sandbox's own range. Name and home come
    /// from the sandbox's `/etc/passwd`.
    Id { uid: u32, gid: u32 },
}

/// What to run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    /// argv[0] is looked up in PATH.
    Argv(Vec<String>),
    /// Run with `/bin/sh -c`.
    Shell(String),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExecSpec {
    pub command: Command,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: RunAs,
    /// Bytes written to stdin, then stdin is closed. `None`: stdin is /dev/null.
    #[serde(default, with = "opt_b64")]
    pub stdin: Option<Vec<u8>>,
    /// Kill the whole tree of this call after this many milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Bound on captured stdout and stderr, each.
    #[serde(default = "default_max_output")]
    pub max_output: u64,
    /// Send output frames as it arrives instead of only in the final result.
    #[serde(default)]
    pub stream: bool,
}

fn default_max_output() -> u64 {
    DEFAULT_MAX_OUTPUT
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackgroundSpec {
    pub command: Command,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: RunAs,
    /// Bytes of each of stdout/stderr kept as a log (the most recent ones).
    #[serde(default = "default_max_output")]
    pub max_log: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Ping,
    Exec(ExecSpec),
    BackgroundStart(BackgroundSpec),
    BackgroundList,
    BackgroundLogs {
        bg_id: u64,
    },
    BackgroundKill {
        bg_id: u64,
        signal: Option<i32>,
    },
    FileRead {
        path: PathBytes,
        user: RunAs,
        offset: u64,
        limit: Option<u64>,
    },
    /// Writes a file; large files come as several requests with `append: true`.
    FileWrite {
        path: PathBytes,
        user: RunAs,
        #[serde(with = "b64")]
        data: Vec<u8>,
        append: bool,
        mode: Option<u32>,
        make_parents: bool,
    },
    FileList {
        path: PathBytes,
        user: RunAs,
    },
    FileStat {
        path: PathBytes,
        user: RunAs,
    },
    Mkdir {
        path: PathBytes,
        user: RunAs,
        parents: bool,
    },
    Remove {
        path: PathBytes,
        user: RunAs,
        recursive: bool,
    },
    /// Atomic rename within the sandbox (used to commit an upload written to a temp name).
    Rename {
        from: PathBytes,
        to: PathBytes,
        user: RunAs,
    },
    Selftest,
    /// Sum of CPU time etc. is read by the host from cgroups; this is what only the
    /// inside can tell.
    Stats,
    /// Get-or-create an interpreter context by name (`interp.rs`).
    ContextCreate(ContextSpec),
    ContextList,
    ContextDelete {
        ctx: String,
    },
    /// Replaces the worker: the context's state is lost, `generation` increases.
    ContextRestart {
        ctx: String,
    },
    /// SIGINT to the running cell; answered `Interrupted { interrupted: false }` when idle.
    ContextInterrupt {
        ctx: String,
    },
    ContextExecute(CellSpec),
    /// Follows an execution: its kept events from index `from`, then the new ones
    /// (`Cell`), then `Executed`. Leaving does not interrupt the cell.
    ContextAttach {
        ctx: String,
        execution: String,
        #[serde(default)]
        from: u64,
    },
    /// The host's verdict on why a dead worker died (`oom`, from the sandbox's memory
    /// cgroup, which the agent may not see). Ignored when the worker was replaced since.
    ContextReason {
        ctx: String,
        reason: String,
    },
    /// A process on a new terminal (`pty.rs`); streamed like `Exec`.
    PtyStart(PtySpec),
    /// Before a memory checkpoint (gvisor hibernate, ADR 0130): the agent syncs the file
    /// systems, answers `Prepared`, then closes its listener and every connection (runsc
    /// cannot save a host-bound socket) and binds again when it gets `SIGUSR2` (sent by
    /// the host after the restore, or after a checkpoint that failed), or by itself after
    /// `rebind_after_ms`, so a host that died in between still reaches it.
    PrepareCheckpoint {
        rebind_after_ms: u64,
    },
    /// Bytes typed into the terminal of the session `pid`.
    PtyInput {
        pid: i32,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// A new size for the terminal of the session `pid`.
    PtyResize {
        pid: i32,
        cols: u16,
        rows: u16,
    },
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
pub struct ExecResult {
    /// `None` when the process was killed by the timeout.
    pub exit_code: Option<i32>,
    /// Signal that ended the process, if any.
    pub signal: Option<i32>,
    pub timed_out: bool,
    #[serde(with = "b64")]
    pub stdout: Vec<u8>,
    #[serde(with = "b64")]
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Other,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileInfo {
    pub name: PathBytes,
    pub path: PathBytes,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Seconds since the epoch.
    pub mtime: i64,
    pub symlink_target: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackgroundInfo {
    pub bg_id: u64,
    pub pid: i32,
    pub command: Command,
    pub running: bool,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    /// Seconds since the epoch.
    pub started_at: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct BackgroundLogs {
    #[serde(with = "b64")]
    pub stdout: Vec<u8>,
    #[serde(with = "b64")]
    pub stderr: Vec<u8>,
    /// Bytes dropped from the front of each log because it outgrew `max_log`.
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
}

/// One check of the isolation posture, as seen from inside.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PostureCheck {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

/// Stable error kinds the agent reports; the host maps them to API error codes.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    NotFound,
    PermissionDenied,
    InvalidArgument,
    AlreadyExists,
    NotADirectory,
    IsADirectory,
    NoSpace,
    Internal,
    Cancelled,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "r", rename_all = "snake_case")]
pub enum Response {
    Pong,
    /// `PrepareCheckpoint`: synced; the listener and connections close next.
    Prepared,
    /// Streamed: the process started.
    Started {
        pid: i32,
    },
    /// Streamed: output as it arrives (only when `stream` was requested).
    Output {
        stream: Stream,
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
    /// Final frame of an exec.
    Exited(ExecResult),
    BackgroundStarted {
        bg_id: u64,
        pid: i32,
    },
    BackgroundList {
        processes: Vec<BackgroundInfo>,
    },
    BackgroundLogs(BackgroundLogs),
    /// Final frame of a file read: the bytes and whether the file goes on.
    FileData {
        #[serde(with = "b64")]
        data: Vec<u8>,
        eof: bool,
        size: u64,
    },
    FileList {
        entries: Vec<FileInfo>,
    },
    FileStat(FileInfo),
    Done,
    Selftest {
        checks: Vec<PostureCheck>,
    },
    Stats {
        processes: u32,
    },
    Context(ContextInfo),
    Contexts {
        contexts: Vec<ContextInfo>,
    },
    Interrupted {
        interrupted: bool,
    },
    /// Streamed: one event of an execution (in stream mode).
    Cell(CodeEvent),
    /// Final frame of a `ContextExecute`.
    Executed(Execution),
    Error {
        kind: ErrorKind,
        message: String,
    },
}

impl Response {
    /// Whether this frame ends the exchange for its request id.
    pub fn is_final(&self) -> bool {
        !matches!(
            self,
            Response::Started { .. } | Response::Output { .. } | Response::Cell(_)
        )
    }
}

/// Bytes as base64 strings in JSON.
pub mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

/// Optional bytes as base64 strings in JSON.
pub mod opt_b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_some(&base64::engine::general_purpose::STANDARD.encode(v)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let s = <Option<std::borrow::Cow<'de, str>>>::deserialize(d)?;
        match s {
            None => Ok(None),
            Some(s) => base64::engine::general_purpose::STANDARD
                .decode(s.as_bytes())
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// A file name or path as the kernel has it: bytes. In JSON a UTF-8 one is a string (as
/// before), any other `{"b64": "..."}`, so names that are not UTF-8 cross intact.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct PathBytes(pub Vec<u8>);

impl PathBytes {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The text, when it is UTF-8.
    pub fn to_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    /// A display form (U+FFFD for bytes that are not UTF-8).
    pub fn lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

impl std::ops::Deref for PathBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl PartialEq<str> for PathBytes {
    fn eq(&self, other: &str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl PartialEq<String> for PathBytes {
    fn eq(&self, other: &String) -> bool {
        self.0 == other.as_bytes()
    }
}

impl From<std::borrow::Cow<'_, str>> for PathBytes {
    fn from(s: std::borrow::Cow<'_, str>) -> Self {
        PathBytes(s.into_owned().into_bytes())
    }
}

impl PartialEq<&str> for PathBytes {
    fn eq(&self, other: &&str) -> bool {
        self.0 == other.as_bytes()
    }
}

impl From<&str> for PathBytes {
    fn from(s: &str) -> Self {
        PathBytes(s.as_bytes().to_vec())
    }
}

impl From<String> for PathBytes {
    fn from(s: String) -> Self {
        PathBytes(s.into_bytes())
    }
}

impl From<&[u8]> for PathBytes {
    fn from(b: &[u8]) -> Self {
        PathBytes(b.to_vec())
    }
}

impl From<Vec<u8>> for PathBytes {
    fn from(b: Vec<u8>) -> Self {
        PathBytes(b)
    }
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum PathRepr {
    Text(String),
    Raw {
        #[serde(with = "b64")]
        b64: Vec<u8>,
    },
}

impl Serialize for PathBytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.to_str() {
            Some(t) => s.serialize_str(t),
            None => PathRepr::Raw {
                b64: self.0.clone(),
            }
            .serialize(s),
        }
    }
}

impl<'de> Deserialize<'de> for PathBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match PathRepr::deserialize(d)? {
            PathRepr::Text(t) => PathBytes(t.into_bytes()),
            PathRepr::Raw { b64 } => PathBytes(b64),
        })
    }
}

#[cfg(test)]
mod path_bytes_tests {
    use super::PathBytes;

    #[test]
    fn utf8_is_a_string_and_other_bytes_are_base64() {
        let plain = PathBytes::from("caf\u{e9}.txt");
        assert_eq!(serde_json::to_string(&plain).unwrap(), "\"caf\u{e9}.txt\"");
        let raw = PathBytes(b"caf\xe9-\xff.txt".to_vec());
        let json = serde_json::to_string(&raw).unwrap();
        assert_eq!(json, r#"{"b64":"Y2Fm6S3/LnR4dA=="}"#);
        assert_eq!(serde_json::from_str::<PathBytes>(&json).unwrap(), raw);
        assert_eq!(
            serde_json::from_str::<PathBytes>("\"a/b\"").unwrap(),
            PathBytes::from("a/b")
        );
    }
}
