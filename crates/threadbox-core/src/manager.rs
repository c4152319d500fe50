//! The manager: the one place that owns sandbox state transitions. Every door (REST, MCP,
//! CLI, ...) turns a user's request into one call here.

use crate::error::{CoreError, Result};
use crate::Config;
use bytes_stream::{ByteStream, ByteSink};
use std::collections::BTreeMap;
use std::sync::Arc;
use threadbox_api::*;
use tokio::sync::mpsc;

/// Streams of bytes in and out of file operations.
pub mod bytes_stream {
    use futures::stream::BoxStream;
    /// Chunks of a file read from a sandbox.
    pub type ByteStream = BoxStream<'static, Result<Vec<u8>, crate::CoreError>>;
    /// Chunks of a request body written into a sandbox.
    pub type ByteSink = BoxStream<'static, Result<Vec<u8>, String>>;
}

pub struct Manager {
    _config: Config,
}

impl Manager {
    /// Opens the store under `config.root`, reconciles it with what runs on the host and
    /// starts the background tasks (idle pause, TTL).
    pub async fn open(config: Config) -> Result<Arc<Manager>> {
        let _ = config;
        Err(CoreError::Internal("not yet".into()))
    }

    /// Creates a sandbox, or returns the existing one of that name (`created == false`).
    pub async fn create(&self, req: CreateSandboxRequest) -> Result<(Sandbox, bool)> {
        let _ = req;
        unimplemented!()
    }
    pub async fn get(&self, id_or_name: &str) -> Result<Sandbox> {
        let _ = id_or_name;
        unimplemented!()
    }
    pub async fn list(
        &self,
        labels: &BTreeMap<String, String>,
        state: Option<SandboxState>,
    ) -> Result<Vec<Sandbox>> {
        let _ = (labels, state);
        unimplemented!()
    }
    pub async fn pause(&self, id_or_name: &str) -> Result<Sandbox> {
        let _ = id_or_name;
        unimplemented!()
    }
    pub async fn resume(&self, id_or_name: &str) -> Result<Sandbox> {
        let _ = id_or_name;
        unimplemented!()
    }
    pub async fn stop(&self, id_or_name: &str) -> Result<Sandbox> {
        let _ = id_or_name;
        unimplemented!()
    }
    pub async fn start(&self, id_or_name: &str) -> Result<Sandbox> {
        let _ = id_or_name;
        unimplemented!()
    }
    /// Deletes a sandbox and everything it left on the host. Without `force`, a running
    /// sandbox is refused with `conflict`.
    pub async fn delete(&self, id_or_name: &str, force: bool) -> Result<()> {
        let _ = (id_or_name, force);
        unimplemented!()
    }
    pub async fn exec(&self, id_or_name: &str, req: ExecRequest) -> Result<ExecResponse> {
        let _ = (id_or_name, req);
        unimplemented!()
    }
    /// Runs a command and streams its events; the last event is `End` or `Error`.
    pub async fn exec_stream(
        &self,
        id_or_name: &str,
        req: ExecRequest,
    ) -> Result<mpsc::Receiver<ExecEvent>> {
        let _ = (id_or_name, req);
        unimplemented!()
    }
    pub async fn start_process(
        &self,
        id_or_name: &str,
        req: StartProcessRequest,
    ) -> Result<ProcessInfo> {
        let _ = (id_or_name, req);
        unimplemented!()
    }
    pub async fn list_processes(&self, id_or_name: &str) -> Result<ProcessList> {
        let _ = id_or_name;
        unimplemented!()
    }
    pub async fn process_logs(&self, id_or_name: &str, process_id: u64) -> Result<ProcessLogs> {
        let _ = (id_or_name, process_id);
        unimplemented!()
    }
    pub async fn kill_process(
        &self,
        id_or_name: &str,
        process_id: u64,
        signal: Option<i32>,
    ) -> Result<()> {
        let _ = (id_or_name, process_id, signal);
        unimplemented!()
    }
    /// Reads a file; the stream yields chunks until the end of the file.
    pub async fn read_file(&self, id_or_name: &str, path: &str, user: User) -> Result<ByteStream> {
        let _ = (id_or_name, path, user);
        unimplemented!()
    }
    /// Writes (replaces) a file from a stream of chunks; returns the bytes written.
    pub async fn write_file(
        &self,
        id_or_name: &str,
        path: &str,
        user: User,
        body: ByteSink,
    ) -> Result<u64> {
        let _ = (id_or_name, path, user, body);
        unimplemented!()
    }
    pub async fn list_files(&self, id_or_name: &str, path: &str, user: User) -> Result<FileList> {
        let _ = (id_or_name, path, user);
        unimplemented!()
    }
    pub async fn stat_file(&self, id_or_name: &str, path: &str, user: User) -> Result<FileEntry> {
        let _ = (id_or_name, path, user);
        unimplemented!()
    }
    pub async fn mkdir(&self, id_or_name: &str, path: &str, user: User, parents: bool) -> Result<()> {
        let _ = (id_or_name, path, user, parents);
        unimplemented!()
    }
    pub async fn remove_file(
        &self,
        id_or_name: &str,
        path: &str,
        user: User,
        recursive: bool,
    ) -> Result<()> {
        let _ = (id_or_name, path, user, recursive);
        unimplemented!()
    }
    pub async fn selftest(&self, id_or_name: &str) -> Result<SelftestReport> {
        let _ = id_or_name;
        unimplemented!()
    }
    pub async fn add_image(&self, req: AddImageRequest) -> Result<Image> {
        let _ = req;
        unimplemented!()
    }
    pub async fn list_images(&self) -> Result<ImageList> {
        unimplemented!()
    }
    /// Stops background tasks and closes the store. Sandboxes keep running.
    pub async fn shutdown(&self) {}
}
