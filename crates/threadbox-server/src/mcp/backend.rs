//! What the MCP tools need from threadbox, as one small trait with two implementations:
//! [`ManagerBackend`] here (the daemon's `/mcp`, calling the manager in process) and the
//! REST client's in the `threadbox` binary (`threadbox mcp` over stdio). The tools are
//! written once, over `dyn Backend` (see ADR 0007).

use crate::metrics::Metrics;
use async_trait::async_trait;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use threadbox_api::{
    CreateSandboxRequest, ErrorCode, ExecRequest, ExecResponse, FileList, Sandbox, SandboxState,
    User,
};
use threadbox_core::ops::{self, Run};
use threadbox_core::{Caller, CoreError, Manager};

/// A failed call, as the API reports it: a stable code and a message safe for a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", code.as_str())]
pub struct BackendError {
    pub code: ErrorCode,
    pub message: String,
}

impl BackendError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        BackendError {
            code,
            message: message.into(),
        }
    }
}

impl From<CoreError> for BackendError {
    fn from(err: CoreError) -> Self {
        // The same logging and client-safe message as the REST door.
        let api = crate::ApiError::from(err);
        BackendError::new(api.code, api.message)
    }
}

pub type BackendResult<T> = Result<T, BackendError>;

/// The operations behind the MCP tools. Every sandbox is named by id or name.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Get-or-create by name; `true` when it was created by this call.
    async fn create(&self, req: CreateSandboxRequest) -> BackendResult<(Sandbox, bool)>;
    async fn list(
        &self,
        labels: BTreeMap<String, String>,
        state: Option<SandboxState>,
    ) -> BackendResult<Vec<Sandbox>>;
    async fn get(&self, sandbox: &str) -> BackendResult<Sandbox>;
    async fn pause(&self, sandbox: &str) -> BackendResult<Sandbox>;
    /// Makes a sandbox run again whatever its state (the `start` operation: boots a
    /// stopped one on its disk, thaws a paused one). `sandbox_resume` is this operation,
    /// the same as REST's `POST /start` (ADR 0058).
    async fn start(&self, sandbox: &str) -> BackendResult<Sandbox>;
    async fn delete(&self, sandbox: &str, force: bool) -> BackendResult<()>;
    async fn exec(&self, sandbox: &str, req: ExecRequest) -> BackendResult<ExecResponse>;
    /// Reads at most `limit` bytes of a file; `true` when the file is longer.
    async fn read_file(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        limit: u64,
    ) -> BackendResult<(Vec<u8>, bool)>;
    async fn write_file(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        data: Vec<u8>,
    ) -> BackendResult<()>;
    async fn list_files(&self, sandbox: &str, path: &str, user: User) -> BackendResult<FileList>;
}

/// Collects at most `limit` bytes from a stream of chunks; `true` when more were left.
pub async fn read_bounded<S, E>(mut chunks: S, limit: u64) -> Result<(Vec<u8>, bool), E>
where
    S: futures::Stream<Item = Result<Vec<u8>, E>> + Unpin,
{
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        if out.len() + chunk.len() > limit {
            let take = limit - out.len();
            out.extend_from_slice(&chunk[..take]);
            return Ok((out, true));
        }
        out.extend_from_slice(&chunk);
    }
    Ok((out, false))
}

/// The daemon's own backend: one operation per tool call, acting for one caller.
#[derive(Clone)]
pub struct ManagerBackend {
    manager: Option<Arc<Manager>>,
    caller: Caller,
    /// The daemon's `/metrics`: an exec through MCP is counted as one through REST.
    metrics: Option<Arc<Metrics>>,
}

impl ManagerBackend {
    pub fn new(manager: Arc<Manager>, caller: Caller) -> Self {
        ManagerBackend {
            manager: Some(manager),
            caller,
            metrics: None,
        }
    }

    /// Counts this backend's execs in `metrics` (the daemon's `/metrics`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// A backend whose every call answers `unavailable` (router tests without a jail).
    pub fn unavailable() -> Self {
        ManagerBackend {
            manager: None,
            caller: Caller::operator(),
            metrics: None,
        }
    }

    /// Runs one operation for this backend's caller.
    async fn run<O: Run>(&self, op: O) -> BackendResult<O::Output> {
        match self.manager.as_deref() {
            Some(m) => Ok(m.run(&self.caller, op).await?),
            None => Err(BackendError::new(
                ErrorCode::Unavailable,
                "the sandbox manager is not running",
            )),
        }
    }
}

#[async_trait]
impl Backend for ManagerBackend {
    async fn create(&self, req: CreateSandboxRequest) -> BackendResult<(Sandbox, bool)> {
        let out = self.run(ops::CreateSandbox(req)).await?;
        Ok((out.sandbox, out.created))
    }

    async fn list(
        &self,
        labels: BTreeMap<String, String>,
        state: Option<SandboxState>,
    ) -> BackendResult<Vec<Sandbox>> {
        let op = ops::ListSandboxes { labels, state };
        Ok(self.run(op).await?.sandboxes)
    }

    async fn get(&self, sandbox: &str) -> BackendResult<Sandbox> {
        self.run(ops::GetSandbox {
            sandbox: sandbox.into(),
        })
        .await
    }

    async fn pause(&self, sandbox: &str) -> BackendResult<Sandbox> {
        self.run(ops::PauseSandbox {
            sandbox: sandbox.into(),
        })
        .await
    }

    async fn start(&self, sandbox: &str) -> BackendResult<Sandbox> {
        self.run(ops::StartSandbox {
            sandbox: sandbox.into(),
        })
        .await
    }

    async fn delete(&self, sandbox: &str, force: bool) -> BackendResult<()> {
        let sandbox = sandbox.into();
        self.run(ops::DeleteSandbox { sandbox, force }).await
    }

    async fn exec(&self, sandbox: &str, req: ExecRequest) -> BackendResult<ExecResponse> {
        let started = std::time::Instant::now();
        let op = ops::Exec {
            sandbox: sandbox.into(),
            request: req,
        };
        let resp = self.run(op).await?;
        if let Some(metrics) = &self.metrics {
            metrics.record_exec(started.elapsed());
        }
        Ok(resp)
    }

    async fn read_file(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        limit: u64,
    ) -> BackendResult<(Vec<u8>, bool)> {
        // One byte past the bound tells whether the file goes on.
        let op = ops::ReadFile {
            target: target(sandbox, path, user),
            offset: 0,
            length: Some(limit.saturating_add(1)),
        };
        let stream = self.run(op).await?;
        Ok(read_bounded(stream, limit).await?)
    }

    async fn write_file(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        data: Vec<u8>,
    ) -> BackendResult<()> {
        let body = futures::stream::iter([Ok::<_, String>(data)]).boxed();
        let target = target(sandbox, path, user);
        self.run(ops::WriteFile { target, body }).await?;
        Ok(())
    }

    async fn list_files(&self, sandbox: &str, path: &str, user: User) -> BackendResult<FileList> {
        self.run(ops::ListFiles(target(sandbox, path, user))).await
    }
}

fn target(sandbox: &str, path: &str, user: User) -> ops::FileTarget {
    ops::FileTarget {
        sandbox: sandbox.into(),
        path: path.into(),
        user,
    }
}
