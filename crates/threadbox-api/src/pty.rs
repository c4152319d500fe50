//! Wire types of terminal sessions (issue 17 scope 4, ADR 0092): a process on a pty in a
//! sandbox, reached over a WebSocket.
//!
//! The WebSocket (`GET /v1/sandboxes/{sandbox}/pty/{session}/ws`) speaks a fixed frame
//! protocol: binary frames are raw terminal bytes both ways; text frames are JSON
//! control, client → server [`PtyClientControl`] and server → client
//! [`PtyServerControl`] (after `exit` the server closes).

use crate::ops::{HttpMethod, Operation};
use crate::{routes, Scope, User};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// Body of `POST /v1/sandboxes/{sandbox}/pty`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyRequest {
    /// argv of the program on the terminal (default: `bash -l` where the image has
    /// bash, else `sh -l`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    /// Terminal width, 1 to 1000.
    pub cols: u16,
    /// Terminal height, 1 to 1000.
    pub rows: u16,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the user's home).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default)]
    pub user: User,
    /// Other keys of the tenant with `sandboxes:write` may type too, by attaching with
    /// `?write=1`. Without it only the key that opened the session types; everyone
    /// else who may read the sandbox watches.
    #[serde(default)]
    pub shared_write: bool,
}

/// An open terminal session.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct PtySession {
    /// The session's id, for the WebSocket path.
    pub session: String,
    /// The sandbox's id.
    pub sandbox: String,
    /// The program's pid inside the sandbox.
    pub pid: i32,
    pub shared_write: bool,
}

/// A text frame from a WebSocket client.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PtyClientControl {
    Resize { cols: u16, rows: u16 },
}

/// A text frame from the server.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PtyServerControl {
    /// The program ended (128 + the signal when a signal ended it); the server closes
    /// the socket next.
    Exit { code: i32 },
    /// Something went wrong (a refused resize, a viewer that fell behind, the sandbox
    /// stopped); fatal ones are followed by the close.
    Error { message: String },
}

/// Opens a terminal session (`POST /v1/sandboxes/{sandbox}/pty`). A paused sandbox is
/// resumed. The program starts now; output before the first viewer attaches is kept
/// (the last 64 KiB) and replayed to each viewer on attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenPty {
    pub sandbox: String,
    pub request: PtyRequest,
}

impl Operation for OpenPty {
    type Output = PtySession;
    const NAME: &'static str = "sandbox.pty";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::SANDBOX_PTY;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
    fn body(&self) -> Option<serde_json::Value> {
        serde_json::to_value(&self.request).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_frames_are_the_fixed_protocol() {
        assert_eq!(
            serde_json::from_str::<PtyClientControl>(r#"{"type":"resize","cols":80,"rows":24}"#)
                .unwrap(),
            PtyClientControl::Resize { cols: 80, rows: 24 }
        );
        assert_eq!(
            serde_json::to_string(&PtyServerControl::Exit { code: 3 }).unwrap(),
            r#"{"type":"exit","code":3}"#
        );
        assert_eq!(
            serde_json::to_string(&PtyServerControl::Error {
                message: "x".into()
            })
            .unwrap(),
            r#"{"type":"error","message":"x"}"#
        );
    }
}
