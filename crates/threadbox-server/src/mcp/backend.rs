//! What the MCP tools need from threadbox, as one small trait with two implementations:
//! [`ManagerBackend`] here (the daemon's `/mcp`, calling the manager in process) and the
//! REST client's in the `threadbox` binary (`threadbox mcp` over stdio). The tools are
//! written once, over `dyn Backend` (see ADR 0007).

use async_trait::async_trait;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use threadbox_api::{
    CreateSandboxRequest, ErrorCode, ExecRequest, ExecResponse, FileList, Sandbox, SandboxState,
    User,
};
use threadbox_core::{Caller, CoreError, FileRange, Manager};

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
    async fn resume(&self, sandbox: &str) -> BackendResult<Sandbox>;
    /// Boots a stopped sandbox again on its disk.
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

/// The daemon's own backend: one manager call per tool call, acting for one caller.
#[derive(Clone)]
pub struct ManagerBackend {
    manager: Option<Arc<Manager>>,
    caller: Caller,
}

impl ManagerBackend {
    pub fn new(manager: Arc<Manager>, caller: Caller) -> Self {
        ManagerBackend {
            manager: Some(manager),
            caller,
        }
    }

    /// A backend whose every call answers `unavailable` (router tests without a jail).
    pub fn unavailable() -> Self {
        ManagerBackend {
            manager: None,
            caller: Caller::operator(),
        }
    }

    fn m(&self) -> BackendResult<(&Manager, &Caller)> {
        match self.manager.as_deref() {
            Some(m) => Ok((m, &self.caller)),
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
        let (m, c) = self.m()?;
        Ok(m.create(c, req).await?)
    }

    async fn list(
        &self,
        labels: BTreeMap<String, String>,
        state: Option<SandboxState>,
    ) -> BackendResult<Vec<Sandbox>> {
        let (m, c) = self.m()?;
        Ok(m.list(c, &labels, state).await?)
    }

    async fn get(&self, sandbox: &str) -> BackendResult<Sandbox> {
        let (m, c) = self.m()?;
        Ok(m.get(c, sandbox).await?)
    }

    async fn pause(&self, sandbox: &str) -> BackendResult<Sandbox> {
        let (m, c) = self.m()?;
        Ok(m.pause(c, sandbox).await?)
    }

    async fn resume(&self, sandbox: &str) -> BackendResult<Sandbox> {
        let (m, c) = self.m()?;
        Ok(m.resume(c, sandbox).await?)
    }

    async fn start(&self, sandbox: &str) -> BackendResult<Sandbox> {
        let (m, c) = self.m()?;
        Ok(m.start(c, sandbox).await?)
    }

    async fn delete(&self, sandbox: &str, force: bool) -> BackendResult<()> {
        let (m, c) = self.m()?;
        Ok(m.delete(c, sandbox, force).await?)
    }

    async fn exec(&self, sandbox: &str, req: ExecRequest) -> BackendResult<ExecResponse> {
        let (m, c) = self.m()?;
        Ok(m.exec(c, sandbox, req).await?)
    }

    async fn read_file(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        limit: u64,
    ) -> BackendResult<(Vec<u8>, bool)> {
        let (m, c) = self.m()?;
        // One byte past the bound tells whether the file goes on.
        let range = FileRange::new(0, Some(limit.saturating_add(1)))?;
        let stream = m
            .read_file(c, sandbox, path.as_bytes(), user, range)
            .await?;
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
        let (m, c) = self.m()?;
        m.write_file(c, sandbox, path.as_bytes(), user, body)
            .await?;
        Ok(())
    }

    async fn list_files(&self, sandbox: &str, path: &str, user: User) -> BackendResult<FileList> {
        let (m, c) = self.m()?;
        Ok(m.list_files(c, sandbox, path.as_bytes(), user).await?)
    }
}
