//! Wire types of port previews (issue 13, scope 5; ADR 0072): a URL through the daemon to a
//! port inside a sandbox. Private by default (a token, shown once, exchanged for a cookie
//! scoped to that one sandbox and port); `public` needs none.

use crate::ops::{HttpMethod, Operation};
use crate::{routes, Scope};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Body of `POST /v1/sandboxes/{sandbox}/previews`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewRequest {
    /// The TCP port inside the sandbox (a server bound to 127.0.0.1 there is reachable).
    pub port: u16,
    /// No token: anyone who can reach the daemon and knows the URL opens it.
    #[serde(default)]
    pub public: bool,
}

/// A published port.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct Preview {
    /// The sandbox's id (never its name: the URL must not change with a rename).
    pub sandbox: String,
    pub port: u16,
    pub public: bool,
    /// Host form, `http://{port}-{id}.{preview_domain}:{daemon_port}/`. On create of a
    /// private preview it carries `?tb_preview=<token>`, exchanged on first use for a
    /// cookie and a redirect without it.
    pub url: String,
    /// Path form, `http://{daemon}/preview/{id}/{port}/`, for hosts without wildcard DNS
    /// (with the token on create, as `url`). Apps that use absolute paths (`/static/x.js`)
    /// break under it; see docs/network.md.
    pub path_url: String,
    /// The private token, only in the answer of the create that made it (stored hashed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// RFC 3339.
    pub created_at: String,
}

/// The previews of one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct PreviewList {
    pub previews: Vec<Preview>,
}

/// Publishes `port` of a sandbox (`POST /v1/sandboxes/{sandbox}/previews`). Publishing a
/// port again replaces its preview: a new token, the old token and cookies stop working.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatePreview {
    pub sandbox: String,
    pub request: PreviewRequest,
}

impl Operation for CreatePreview {
    type Output = Preview;
    const NAME: &'static str = "preview.create";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::SANDBOX_PREVIEWS;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
    fn body(&self) -> Option<serde_json::Value> {
        serde_json::to_value(&self.request).ok()
    }
}

/// The published ports of a sandbox (`GET /v1/sandboxes/{sandbox}/previews`), without tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPreviews {
    pub sandbox: String,
}

impl Operation for ListPreviews {
    type Output = PreviewList;
    const NAME: &'static str = "preview.list";
    const SCOPE: Scope = Scope::SandboxesRead;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::SANDBOX_PREVIEWS;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
}

/// Unpublishes a port (`DELETE /v1/sandboxes/{sandbox}/previews/{port}`): its URL answers
/// 404 at once, its token and cookies are void.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletePreview {
    pub sandbox: String,
    pub port: u16,
}

impl Operation for DeletePreview {
    type Output = ();
    const NAME: &'static str = "preview.delete";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Delete;
    const PATH: &'static str = routes::SANDBOX_PREVIEW;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone(), self.port.to_string()]
    }
}
