//! What the MCP tools need from threadbox. The tools are written once, over
//! `dyn Backend` (ADR 0007); [`Backend`] is implemented once, over [`RunOps`], which
//! runs one `threadbox_api::ops` operation: [`ManagerBackend`] here (the daemon's `/mcp`:
//! `Manager::run` in process) and the REST client's in the `threadbox` binary
//! (`threadbox mcp` over stdio: `Client::call`). So a tool's operation is built in one
//! place and each transport is a single generic call (ADR 0070).

use crate::metrics::Metrics;
use async_trait::async_trait;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use threadbox_api::checkpoints::{
    Checkpoint, CreateCheckpoint, CreateCheckpointRequest, Fork, ForkRequest, ForkResponse, Rewind,
    RewindRequest,
};
use threadbox_api::interp::{CodeExecution, CreateContextRequest, ExecuteCodeRequest};
use threadbox_api::{
    CreateSandboxRequest, ErrorCode, ExecRequest, ExecResponse, FileList, Sandbox, SandboxState,
    User,
};
use threadbox_core::ops::{self, FileTarget, Run};
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
    async fn hibernate(&self, sandbox: &str) -> BackendResult<Sandbox>;
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
    async fn checkpoint(
        &self,
        sandbox: &str,
        label: Option<String>,
        with_memory: bool,
    ) -> BackendResult<Checkpoint>;
    async fn rewind(&self, sandbox: &str, to: &str) -> BackendResult<Sandbox>;
    async fn fork(
        &self,
        sandbox: &str,
        count: Option<u32>,
        with_memory: Option<bool>,
    ) -> BackendResult<ForkResponse>;
    /// Runs a cell in a context (`run_code`). `create` is the get-or-create of a context
    /// other than `python` (which an execute makes on first use).
    async fn run_code(
        &self,
        sandbox: &str,
        context: &str,
        create: Option<CreateContextRequest>,
        request: ExecuteCodeRequest,
    ) -> BackendResult<CodeExecution>;
    /// Publishes a port as a URL through the daemon (issue 13, ADR 0072).
    async fn preview(
        &self,
        _sandbox: &str,
        _req: threadbox_api::previews::PreviewRequest,
    ) -> BackendResult<threadbox_api::previews::Preview> {
        Err(BackendError::new(
            ErrorCode::Unavailable,
            "previews are not offered by this backend",
        ))
    }

    /// A page of a sandbox's egress log (issue 13). Backends that do not carry it say so.
    async fn network_log(
        &self,
        op: threadbox_api::net_log::GetNetworkLog,
    ) -> BackendResult<threadbox_api::net_log::NetLogPage> {
        Err(BackendError::new(
            ErrorCode::InvalidArgument,
            format!("the egress log of {} is not available here", op.sandbox),
        ))
    }
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

/// An operation both transports can run: the manager runs it ([`Run`]), the client
/// sends it and decodes its JSON output.
pub trait JsonOp: Run + Sync {}
impl<O> JsonOp for O
where
    O: Run + Sync,
    O::Output: serde::de::DeserializeOwned,
{
}

/// One transport of the MCP tools' operations. Implement this, not [`Backend`]: the
/// blanket impl builds every tool's operation once.
pub trait RunOps: Send + Sync + 'static {
    /// Runs one JSON operation.
    fn call<O: JsonOp>(&self, op: O) -> impl Future<Output = BackendResult<O::Output>> + Send
    where
        O::Output: serde::de::DeserializeOwned;
    /// Reads at most `limit` bytes of a file (`ops::ReadFile`, a byte stream whose
    /// transport is each door's); `true` when the file is longer.
    fn read_file(
        &self,
        target: FileTarget,
        limit: u64,
    ) -> impl Future<Output = BackendResult<(Vec<u8>, bool)>> + Send;
    /// Replaces a file with `data` (`ops::WriteFile`).
    fn write_file(
        &self,
        target: FileTarget,
        data: Vec<u8>,
    ) -> impl Future<Output = BackendResult<()>> + Send;
    /// Called after an exec finished, with its duration (the daemon's `/metrics`).
    fn record_exec(&self, _elapsed: std::time::Duration) {}
}

#[async_trait]
impl<R: RunOps> Backend for R {
    async fn create(&self, req: CreateSandboxRequest) -> BackendResult<(Sandbox, bool)> {
        let out = self.call(ops::CreateSandbox(req)).await?;
        Ok((out.sandbox, out.created))
    }

    async fn list(
        &self,
        labels: BTreeMap<String, String>,
        state: Option<SandboxState>,
    ) -> BackendResult<Vec<Sandbox>> {
        let op = ops::ListSandboxes { labels, state };
        Ok(self.call(op).await?.sandboxes)
    }

    async fn get(&self, sandbox: &str) -> BackendResult<Sandbox> {
        let sandbox = sandbox.into();
        self.call(ops::GetSandbox { sandbox }).await
    }

    async fn pause(&self, sandbox: &str) -> BackendResult<Sandbox> {
        let sandbox = sandbox.into();
        self.call(ops::PauseSandbox { sandbox }).await
    }

    async fn hibernate(&self, sandbox: &str) -> BackendResult<Sandbox> {
        let sandbox = sandbox.into();
        self.call(ops::HibernateSandbox { sandbox }).await
    }

    async fn start(&self, sandbox: &str) -> BackendResult<Sandbox> {
        let sandbox = sandbox.into();
        self.call(ops::StartSandbox { sandbox }).await
    }

    async fn delete(&self, sandbox: &str, force: bool) -> BackendResult<()> {
        let sandbox = sandbox.into();
        self.call(ops::DeleteSandbox { sandbox, force }).await
    }

    async fn exec(&self, sandbox: &str, request: ExecRequest) -> BackendResult<ExecResponse> {
        let started = std::time::Instant::now();
        let sandbox = sandbox.into();
        let resp = self.call(ops::Exec { sandbox, request }).await?;
        self.record_exec(started.elapsed());
        Ok(resp)
    }

    async fn read_file(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        limit: u64,
    ) -> BackendResult<(Vec<u8>, bool)> {
        RunOps::read_file(self, target(sandbox, path, user), limit).await
    }

    async fn write_file(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        data: Vec<u8>,
    ) -> BackendResult<()> {
        RunOps::write_file(self, target(sandbox, path, user), data).await
    }

    async fn list_files(&self, sandbox: &str, path: &str, user: User) -> BackendResult<FileList> {
        self.call(ops::ListFiles(target(sandbox, path, user))).await
    }

    async fn checkpoint(
        &self,
        sandbox: &str,
        label: Option<String>,
        with_memory: bool,
    ) -> BackendResult<Checkpoint> {
        let op = CreateCheckpoint {
            sandbox: sandbox.into(),
            request: CreateCheckpointRequest { label, with_memory },
        };
        self.call(op).await
    }

    async fn rewind(&self, sandbox: &str, to: &str) -> BackendResult<Sandbox> {
        let op = Rewind {
            sandbox: sandbox.into(),
            request: RewindRequest {
                to: to.into(),
                drop_later: false,
            },
        };
        self.call(op).await
    }

    async fn fork(
        &self,
        sandbox: &str,
        count: Option<u32>,
        with_memory: Option<bool>,
    ) -> BackendResult<ForkResponse> {
        let op = Fork {
            sandbox: sandbox.into(),
            request: ForkRequest {
                count,
                name_prefix: None,
                with_memory,
                ..Default::default()
            },
        };
        self.call(op).await
    }

    async fn run_code(
        &self,
        sandbox: &str,
        context: &str,
        create: Option<CreateContextRequest>,
        request: ExecuteCodeRequest,
    ) -> BackendResult<CodeExecution> {
        use threadbox_api::interp::{CreateContext, ExecuteCode};
        if let Some(request) = create {
            let sandbox = sandbox.into();
            self.call(CreateContext { sandbox, request }).await?;
        }
        let op = ExecuteCode {
            sandbox: sandbox.into(),
            context: context.into(),
            request,
        };
        self.call(op).await
    }

    async fn preview(
        &self,
        sandbox: &str,
        request: threadbox_api::previews::PreviewRequest,
    ) -> BackendResult<threadbox_api::previews::Preview> {
        let sandbox = sandbox.to_string();
        self.call(threadbox_api::previews::CreatePreview { sandbox, request })
            .await
    }

    async fn network_log(
        &self,
        op: threadbox_api::net_log::GetNetworkLog,
    ) -> BackendResult<threadbox_api::net_log::NetLogPage> {
        self.call(op).await
    }
}

/// The daemon's own backend: one operation per tool call, acting for one caller.
#[derive(Clone)]
pub struct ManagerBackend {
    manager: Arc<Manager>,
    caller: Caller,
    /// The daemon's `/metrics`: an exec through MCP is counted as one through REST.
    metrics: Option<Arc<Metrics>>,
}

impl ManagerBackend {
    pub fn new(manager: Arc<Manager>, caller: Caller) -> Self {
        ManagerBackend {
            manager,
            caller,
            metrics: None,
        }
    }

    /// Counts this backend's execs in `metrics` (the daemon's `/metrics`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    async fn run<O: Run>(&self, op: O) -> BackendResult<O::Output> {
        Ok(self.manager.run(&self.caller, op).await?)
    }
}

impl RunOps for ManagerBackend {
    async fn call<O: JsonOp>(&self, op: O) -> BackendResult<O::Output>
    where
        O::Output: serde::de::DeserializeOwned,
    {
        self.run(op).await
    }

    async fn read_file(&self, target: FileTarget, limit: u64) -> BackendResult<(Vec<u8>, bool)> {
        // One byte past the bound tells whether the file goes on.
        let op = ops::ReadFile {
            target,
            offset: 0,
            length: Some(limit.saturating_add(1)),
        };
        let stream = self.run(op).await?;
        Ok(read_bounded(stream, limit).await?)
    }

    async fn write_file(&self, target: FileTarget, data: Vec<u8>) -> BackendResult<()> {
        let body = futures::stream::iter([Ok::<_, String>(data)]).boxed();
        self.run(ops::WriteFile { target, body }).await?;
        Ok(())
    }

    fn record_exec(&self, elapsed: std::time::Duration) {
        if let Some(metrics) = &self.metrics {
            metrics.record_exec(elapsed);
        }
    }
}

fn target(sandbox: &str, path: &str, user: User) -> FileTarget {
    FileTarget {
        sandbox: sandbox.into(),
        path: path.into(),
        user,
    }
}
