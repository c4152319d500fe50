//! The operations of [`threadbox_api::ops`], run by the manager: the arrow every door
//! follows is door → [`Manager::run`] → the manager's method for that operation
//! (`manager/*.rs`, which checks [`Operation::SCOPE`], validates with
//! `manager/validate.rs`, asks the transition table and audits as [`Operation::NAME`]).
//!
//! A door builds the operation's type from its own input (HTTP, MCP arguments) and
//! answers its output; it validates nothing itself (ADR 0057).

use crate::error::Result;
use crate::manager::bytes_stream::{ByteSink, ByteStream};
use crate::{Caller, FileRange, Manager};
use std::future::Future;
pub use threadbox_api::ops::*;
use threadbox_api::{
    routes, CreatedSandbox, ExecEvent, ExecResponse, FileEntry, FileList, Image, ImageList,
    ProcessInfo, ProcessList, ProcessLogs, Sandbox, SandboxList, Scope, SelftestReport,
};

/// An operation the manager can run.
pub trait Run: Operation + Sized {
    /// Runs the operation for `caller`.
    fn run(self, m: &Manager, caller: &Caller)
        -> impl Future<Output = Result<Self::Output>> + Send;
}

impl Manager {
    /// Runs one operation for `caller`: what every door calls.
    pub async fn run<O: Run>(&self, caller: &Caller, op: O) -> Result<O::Output> {
        use tracing::Instrument;
        // One span per operation, whatever the door (ADR 0090): named after the audit
        // action, with the GenAI `execute_tool` attributes; what the operation touches and
        // how it ended is added by the manager (`crate::telemetry`).
        let span = tracing::debug_span!(
            "op",
            name = O::NAME,
            tenant = %caller.tenant,
            otel.name = O::NAME,
            otel.kind = "internal",
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = O::NAME,
            threadbox.tenant = %caller.tenant,
            otel.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let started = std::time::Instant::now();
        let out = op.run(self, caller).instrument(span.clone()).await;
        let outcome = match &out {
            Ok(_) => "ok",
            Err(e) => {
                span.record("otel.status_code", "ERROR");
                span.record("error.type", e.code().as_str());
                e.code().as_str()
            }
        };
        self.metrics()
            .ops
            .observe([O::NAME, outcome], started.elapsed());
        out
    }
}

impl Run for CreateSandbox {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<CreatedSandbox> {
        let (sandbox, created) = m.create(caller, self.0).await?;
        Ok(CreatedSandbox { sandbox, created })
    }
}

impl Run for ListSandboxes {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<SandboxList> {
        let sandboxes = m.list(caller, &self.labels, self.state).await?;
        Ok(SandboxList { sandboxes })
    }
}

impl Run for GetSandbox {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Sandbox> {
        m.get(caller, &self.sandbox).await
    }
}

impl Run for PauseSandbox {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Sandbox> {
        m.pause(caller, &self.sandbox).await
    }
}

impl Run for HibernateSandbox {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Sandbox> {
        m.hibernate(caller, &self.sandbox).await
    }
}

impl Run for ResumeSandbox {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Sandbox> {
        m.resume(caller, &self.sandbox).await
    }
}

impl Run for StopSandbox {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Sandbox> {
        m.stop(caller, &self.sandbox).await
    }
}

impl Run for StartSandbox {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Sandbox> {
        m.start(caller, &self.sandbox).await
    }
}

impl Run for DeleteSandbox {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<()> {
        m.delete(caller, &self.sandbox, self.force).await
    }
}

impl Run for Selftest {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<SelftestReport> {
        m.selftest(caller, &self.sandbox).await
    }
}

impl Run for Exec {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<ExecResponse> {
        m.exec(caller, &self.sandbox, self.request).await
    }
}

impl Run for StartProcess {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<ProcessInfo> {
        m.start_process(caller, &self.sandbox, self.request).await
    }
}

impl Run for ListProcesses {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<ProcessList> {
        m.list_processes(caller, &self.sandbox).await
    }
}

impl Run for GetProcessLogs {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<ProcessLogs> {
        m.process_logs(caller, &self.sandbox, self.process_id).await
    }
}

impl Run for KillProcess {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<()> {
        m.kill_process(caller, &self.sandbox, self.process_id, self.signal)
            .await
    }
}

impl Run for ListFiles {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<FileList> {
        let t = self.0;
        m.list_files(caller, &t.sandbox, &t.path, t.user).await
    }
}

impl Run for StatFile {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<FileEntry> {
        let t = self.0;
        m.stat_file(caller, &t.sandbox, &t.path, t.user).await
    }
}

impl Run for Mkdir {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<()> {
        let t = self.target;
        m.mkdir(caller, &t.sandbox, &t.path, t.user, self.parents)
            .await
    }
}

impl Run for RemoveFile {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<()> {
        let t = self.target;
        m.remove_file(caller, &t.sandbox, &t.path, t.user, self.recursive)
            .await
    }
}

impl Run for ListImages {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<ImageList> {
        m.list_images(caller).await
    }
}

impl Run for AddImage {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Image> {
        m.add_image(caller, self.0).await
    }
}

impl Run for PullImage {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Image> {
        m.pull_image(caller, self.0, None).await
    }
}

impl Run for ImportImage {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Image> {
        m.import_image(caller, self.0).await
    }
}

impl Run for RemoveImage {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<()> {
        m.remove_image(caller, &self.image).await
    }
}

// ---- operations whose input or output is a stream: their types are core's, since the
// client and the wire speak bytes there, not one JSON value.

/// A file's bytes, or those of a range, as a stream of chunks.
pub struct ReadFile {
    pub target: FileTarget,
    /// First byte (0: the start).
    pub offset: u64,
    /// Most bytes (`None`: to the end of the file).
    pub length: Option<u64>,
}

impl ReadFile {
    /// The whole file.
    pub fn all(target: FileTarget) -> ReadFile {
        ReadFile {
            target,
            offset: 0,
            length: None,
        }
    }
}

impl Operation for ReadFile {
    type Output = ByteStream;
    const NAME: &'static str = "file.read";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::FILES;
}

impl Run for ReadFile {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<ByteStream> {
        let range = FileRange::new(self.offset, self.length)?;
        let t = self.target;
        m.read_file(caller, &t.sandbox, &t.path, t.user, range)
            .await
    }
}

/// Write (replace) a file with what `body` yields; answers the bytes written.
pub struct WriteFile {
    pub target: FileTarget,
    pub body: ByteSink,
}

impl Operation for WriteFile {
    type Output = u64;
    const NAME: &'static str = "file.write";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Put;
    const PATH: &'static str = routes::FILES;
}

impl Run for WriteFile {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<u64> {
        let t = self.target;
        m.write_file(caller, &t.sandbox, &t.path, t.user, self.body)
            .await
    }
}

/// Run a command and stream its events; the last one is `End` or `Error`.
pub struct ExecStream(pub Exec);

impl Operation for ExecStream {
    type Output = tokio::sync::mpsc::Receiver<ExecEvent>;
    const NAME: &'static str = Exec::NAME;
    const SCOPE: Scope = Exec::SCOPE;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::EXEC_STREAM;
}

impl Run for ExecStream {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Self::Output> {
        let e = self.0;
        m.exec_stream(caller, &e.sandbox, e.request).await
    }
}
