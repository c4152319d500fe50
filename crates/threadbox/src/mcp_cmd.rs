//! `threadbox mcp`: the MCP tools on stdio, backed by the daemon's REST API (the same
//! tool code as the daemon's `/mcp`, over a different transport of the same operations).

use std::sync::Arc;
use threadbox_api::ops::FileTarget;
use threadbox_api::ErrorCode;
use threadbox_client::{Client, ClientError};
use threadbox_server::mcp::{read_bounded, BackendError, BackendResult, JsonOp, RunOps};

/// The tools' backend in `threadbox mcp`: one REST call per tool call.
pub struct ClientBackend {
    client: Client,
}

impl ClientBackend {
    pub fn new(client: Client) -> Self {
        ClientBackend { client }
    }
}

/// A client error as the tools report it: the daemon's code and message when it
/// answered, else `unavailable` with what went wrong on the way.
/// MCP tools take paths as JSON strings, so a target's path is always UTF-8 here.
fn path_str(path: &[u8]) -> BackendResult<&str> {
    std::str::from_utf8(path)
        .map_err(|_| BackendError::new(ErrorCode::InvalidArgument, "path is not UTF-8"))
}

fn backend_error(err: ClientError) -> BackendError {
    match err {
        ClientError::Api { code, message, .. } => BackendError::new(code, message),
        ClientError::InvalidUrl { .. } => {
            BackendError::new(ErrorCode::InvalidArgument, describe(&err))
        }
        other => BackendError::new(ErrorCode::Unavailable, describe(&other)),
    }
}

fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut s = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        s.push_str(": ");
        s.push_str(&e.to_string());
        source = e.source();
    }
    s
}

/// One REST call per operation: the tools' operations are built once, in the blanket
/// `Backend` impl over [`RunOps`].
impl RunOps for ClientBackend {
    async fn call<O: JsonOp>(&self, op: O) -> BackendResult<O::Output>
    where
        O::Output: serde::de::DeserializeOwned,
    {
        self.client.call(&op).await.map_err(backend_error)
    }

    async fn read_file(&self, t: FileTarget, limit: u64) -> BackendResult<(Vec<u8>, bool)> {
        use futures::StreamExt;
        let stream = self
            .client
            // One byte past the bound tells whether the file goes on.
            .read_file_range(
                &t.sandbox,
                path_str(&t.path)?,
                t.user,
                0,
                Some(limit.saturating_add(1)),
            )
            .await
            .map_err(backend_error)?;
        let chunks = stream.map(|c| c.map(|b| b.to_vec()).map_err(backend_error));
        read_bounded(chunks, limit).await
    }

    async fn write_file(&self, t: FileTarget, data: Vec<u8>) -> BackendResult<()> {
        self.client
            .write_file(&t.sandbox, path_str(&t.path)?, t.user, data)
            .await
            .map_err(backend_error)
    }
}

/// Serves MCP on stdin/stdout until the client closes it. Logs go to stderr only: stdout
/// carries the protocol.
pub async fn run(url: Option<&str>) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let client = Client::from_env(url)?;
    // The daemon is checked once at start: a stdio client (Claude Desktop, LangChain's
    // MCP adapters) passes the server a minimal environment, so a THREADBOX_URL exported
    // in the user's shell is often not there. Failing at `initialize` with the URL tried
    // says so at once, instead of at the first tool call. Later outages are tool errors.
    if let Err(e) = client.health().await {
        let message = format!(
            "threadbox mcp: {}. Stdio MCP clients do not pass your shell's environment to the server: \
             give it the daemon's address in the client's server config, with \
             \"args\": [\"mcp\", \"--url\", \"http://HOST:PORT\"] or \
             \"env\": {{\"THREADBOX_URL\": \"http://HOST:PORT\", \"THREADBOX_API_KEY\": \"...\"}}",
            describe(&e)
        );
        refuse_initialize(&message).await?;
        anyhow::bail!("{message}");
    }
    threadbox_server::mcp::serve_stdio(Arc::new(ClientBackend::new(client))).await?;
    Ok(())
}

/// Answers the client's `initialize` with a JSON-RPC error carrying `message` (what an MCP
/// client shows for a server that cannot start), then returns.
async fn refuse_initialize(message: &str) -> anyhow::Result<()> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut stdout = tokio::io::stdout();
    while let Some(line) = lines.next_line().await? {
        let Ok(req) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if req.get("method").and_then(|m| m.as_str()) != Some("initialize") {
            continue;
        }
        let reply = serde_json::json!({
            "jsonrpc": "2.0",
            "id": req.get("id").cloned().unwrap_or(serde_json::Value::Null),
            "error": {"code": -32603, "message": message},
        });
        stdout.write_all(format!("{reply}\n").as_bytes()).await?;
        stdout.flush().await?;
        break;
    }
    Ok(())
}
