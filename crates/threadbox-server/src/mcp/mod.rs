//! threadbox as an MCP server (rmcp): the same tool set behind two doors.
//!
//! - `/mcp` on the daemon: Streamable HTTP, stateless (no MCP session is kept: every
//!   POST is answered on its own, with JSON), calling the manager in process
//!   ([`ManagerBackend`]). It is nested in the daemon's router, so it sits behind the same
//!   layers as the REST API.
//! - `threadbox mcp`: stdio, calling the daemon's REST API through `threadbox-client`
//!   (the backend lives in the binary).
//!
//! See ADR 0007.

mod backend;
mod run_code;
mod tools;

#[cfg(test)]
mod tests;

pub use backend::{
    read_bounded, Backend, BackendError, BackendResult, JsonOp, ManagerBackend, RunOps,
};
pub use run_code::{cell_result, RunCodeArgs, DEFAULT_CONTEXT, MAX_IMAGES};
pub use tools::{
    tools, CreateResult, DeleteArgs, DeleteResult, ExecArgs, ListArgs, ListFilesArgs, ReadFileArgs,
    ReadFileResult, ResolveBackend, RunPythonArgs, SandboxArgs, ThreadboxMcp, ToolError,
    WriteFileArgs, WriteFileResult, DEFAULT_READ_BYTES, DEFAULT_TIMEOUT_SECS, MAX_OUTPUT_BYTES,
    MAX_READ_BYTES,
};

use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;
use std::sync::Arc;

/// Bound on one `/mcp` request body (a `write_file` carries the file in JSON).
pub const MAX_MCP_BODY_BYTES: usize = 64 << 20;

/// Which `Host` and `Origin` headers `/mcp` accepts (DNS-rebinding and cross-site
/// protection).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpOptions {
    /// Hostnames (any port) or `host:port` authorities accepted in `Host`. `*` accepts
    /// any host. Default: `localhost`, `127.0.0.1`, `::1`.
    pub allowed_hosts: Vec<String>,
    /// Browser origins accepted in `Origin`, e.g. `https://app.example.com:443`. Requests
    /// without an `Origin` header (every non-browser client) always pass; with the
    /// default empty list any request that carries one is refused. `*` accepts any.
    pub allowed_origins: Vec<String>,
}

impl Default for McpOptions {
    fn default() -> Self {
        McpOptions {
            allowed_hosts: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            allowed_origins: Vec::new(),
        }
    }
}

impl McpOptions {
    /// Adds hosts to the defaults (what `--mcp-allowed-host` does).
    pub fn with_extra_hosts(mut self, hosts: impl IntoIterator<Item = String>) -> Self {
        for h in hosts {
            if !self.allowed_hosts.contains(&h) {
                self.allowed_hosts.push(h);
            }
        }
        self
    }

    fn http_config(&self) -> StreamableHttpServerConfig {
        let mut config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .with_max_request_body_bytes(MAX_MCP_BODY_BYTES);
        config = if self.allowed_hosts.iter().any(|h| h == "*") {
            config.disable_allowed_hosts()
        } else {
            config.with_allowed_hosts(self.allowed_hosts.clone())
        };
        if self.allowed_origins.iter().any(|o| o == "*") {
            config.disable_allowed_origins()
        } else {
            config
                .with_allowed_origins(self.allowed_origins.clone())
                .enforce_origin_validation()
        }
    }
}

/// The `/mcp` tower service; `resolve` picks the backend of each call from its HTTP
/// request (the caller the auth layer identified).
pub fn http_service(
    resolve: ResolveBackend,
    options: &McpOptions,
) -> StreamableHttpService<ThreadboxMcp, NeverSessionManager> {
    let server = ThreadboxMcp::per_request(resolve);
    StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        options.http_config(),
    )
}

#[derive(Debug, thiserror::Error)]
pub enum McpServeError {
    #[error("the MCP client did not initialize the session")]
    Initialize(#[source] Box<rmcp::service::ServerInitializeError>),
    #[error("the MCP server task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Serves the tools over stdin/stdout until the client closes the stream.
pub async fn serve_stdio(backend: Arc<dyn Backend>) -> Result<(), McpServeError> {
    let running = ThreadboxMcp::new(backend)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpServeError::Initialize(Box::new(e)))?;
    running.waiting().await.map_err(McpServeError::Task)?;
    Ok(())
}
