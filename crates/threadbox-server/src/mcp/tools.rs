//! The MCP tool set, written once over [`Backend`]. Nothing lives in the MCP session:
//! every tool that acts on a sandbox names it in its arguments, because clients such as
//! `langchain-mcp-adapters` open a new session for every call.
//!
//! Input and output schemas are derived (schemars) from the Rust types below, which reuse
//! the REST API's types (`CreateSandboxRequest`, `User`, `Encoding`, `Sandbox`,
//! `ExecResponse`, `FileList`): no schema is written by hand.
//!
//! (Over 600 lines: one argument type and one handler per tool; the tool set is read and
//! reviewed as one list, the way a model sees it.)

use super::backend::{Backend, BackendError, BackendResult};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use threadbox_api::{
    decode_bytes, encode_bytes, oom_message, CreateSandboxRequest, Encoding, ErrorCode,
    ExecRequest, ExecResponse, FileKind, FileList, Sandbox, SandboxList, SandboxState, User,
};
use tracing::Instrument;

/// Timeout of `exec` and `run_python` when the caller gives none, in seconds.
pub const DEFAULT_TIMEOUT_SECS: f64 = 300.0;
/// Bytes `read_file` returns when the caller gives no `max_bytes`.
pub const DEFAULT_READ_BYTES: u64 = 1 << 20;
/// Largest `max_bytes` accepted by `read_file`.
pub const MAX_READ_BYTES: u64 = 8 << 20;
/// Bound on each captured stream of `exec` and `run_python` (what a model can use).
pub const MAX_OUTPUT_BYTES: u64 = 1 << 20;

// ---- arguments --------------------------------------------------------------------------

/// Names one sandbox.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkLogArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// Only rows after this `seq` (the previous answer's `next_after`).
    pub after: Option<u64>,
    /// At most this many rows (default 100, at most 1000).
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListArgs {
    /// Only sandboxes carrying all of these labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Only sandboxes in this state.
    pub state: Option<SandboxState>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// Shell command line, run with `/bin/sh -c` (pipes, `&&`, redirections work).
    pub command: String,
    /// Seconds after which the command and every process it started are killed
    /// (default 300).
    pub timeout_secs: Option<f64>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the home directory `/home/user`).
    pub cwd: Option<String>,
    /// Run as `user` (uid 1000, the default) or `root` (uid 0 inside the sandbox).
    #[serde(default)]
    pub user: User,
    /// Text written to the command's standard input, which is then closed.
    pub stdin: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunPythonArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// Python 3 source code, run as a script by `python3`; print what you want to see.
    pub code: String,
    /// Seconds after which the program and every process it started are killed
    /// (default 300).
    pub timeout_secs: Option<f64>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the home directory `/home/user`).
    pub cwd: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// Absolute path, or relative to the home directory `/home/user`.
    pub path: String,
    /// Return at most this many bytes (default 1 MiB, at most 8 MiB).
    pub max_bytes: Option<u64>,
    #[serde(default)]
    pub user: User,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// Absolute path, or relative to the home directory `/home/user`. Parent directories
    /// are created; an existing file is replaced.
    pub path: String,
    /// The file's content.
    pub content: String,
    /// `utf8` (default) when `content` is the text itself, `base64` for binary data.
    #[serde(default)]
    pub encoding: Encoding,
    #[serde(default)]
    pub user: User,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// A label to rewind to later (unique per sandbox), e.g. `clean`.
    pub label: Option<String>,
    /// Keep memory and running processes too, so a rewind brings them back where they
    /// were (gvisor sandboxes). The jail tier checkpoints files only and refuses `true`.
    pub with_memory: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// The checkpoint's label or id.
    pub to: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// How many forks (1–16, default 1).
    pub count: Option<u32>,
    /// Copy memory and running processes too (gvisor sandboxes; the default there). The
    /// jail tier forks files only and refuses `true`.
    pub with_memory: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// Directory: absolute, or relative to the home directory (default: the home
    /// directory `/home/user`).
    pub path: Option<String>,
    #[serde(default)]
    pub user: User,
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// Delete even when it is running or paused (default true); with false, only a
    /// stopped sandbox is deleted.
    #[serde(default = "default_true")]
    pub force: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// The port a server listens on inside the sandbox (127.0.0.1 is fine).
    pub port: u16,
    /// No token: anyone who reaches the daemon and knows the URL opens it (default false).
    #[serde(default)]
    pub public: bool,
}

// ---- results (structuredContent) --------------------------------------------------------

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct CreateResult {
    /// False when a sandbox of that name already existed and was returned.
    pub created: bool,
    pub sandbox: Sandbox,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ReadFileResult {
    pub path: String,
    /// The bytes read: text as is (`utf8`), anything else as `base64`.
    pub content: String,
    pub encoding: Encoding,
    /// Bytes returned.
    pub size: u64,
    /// The file is longer than what was returned (see `max_bytes`).
    pub truncated: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct WriteFileResult {
    pub path: String,
    pub bytes_written: u64,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct DeleteResult {
    pub sandbox: String,
    pub deleted: bool,
}

/// `structuredContent` of a failed call (`isError: true`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ToolError {
    pub code: ErrorCode,
    pub message: String,
}

// ---- the tool table ---------------------------------------------------------------------

/// JSON Schema of `T`, draft 2020-12, every sub-schema inlined (some model APIs refuse
/// `$ref`), without the top-level title.
fn schema<T: JsonSchema>() -> Arc<JsonObject> {
    let settings = schemars::generate::SchemaSettings::draft2020_12().with(|s| {
        s.inline_subschemas = true;
    });
    let root = settings.into_generator().into_root_schema_for::<T>();
    let mut object = match serde_json::to_value(root) {
        Ok(serde_json::Value::Object(o)) => o,
        _ => JsonObject::new(),
    };
    object.remove("title");
    object.remove("$schema");
    for v in object.values_mut() {
        standard_formats_only(v);
    }
    Arc::new(object)
}

/// Replaces schemars' own `format`s (`uint64`, `int32`, `double`…), which JSON Schema
/// does not define and validators (LangChain.js's among them) warn about on every tool,
/// by the bounds they stand for. `minimum: 0` of unsigned types is already there.
fn standard_formats_only(schema: &mut serde_json::Value) {
    use serde_json::Value;
    match schema {
        Value::Object(o) => {
            let bounds: Option<(Option<i64>, i64)> = match o.get("format").and_then(Value::as_str) {
                Some("uint8") => Some((Some(0), u8::MAX.into())),
                Some("uint16") => Some((Some(0), u16::MAX.into())),
                Some("uint32") => Some((Some(0), u32::MAX.into())),
                Some("int8") => Some((Some(i8::MIN.into()), i8::MAX.into())),
                Some("int16") => Some((Some(i16::MIN.into()), i16::MAX.into())),
                Some("int32") => Some((Some(i32::MIN.into()), i32::MAX.into())),
                _ => None,
            };
            if let Some((min, max)) = bounds {
                if let Some(min) = min {
                    o.entry("minimum").or_insert(min.into());
                }
                o.entry("maximum").or_insert(max.into());
            }
            let nonstandard = matches!(
                o.get("format").and_then(Value::as_str),
                Some(
                    "uint"
                        | "uint8"
                        | "uint16"
                        | "uint32"
                        | "uint64"
                        | "uint128"
                        | "int"
                        | "int8"
                        | "int16"
                        | "int32"
                        | "int64"
                        | "int128"
                        | "float"
                        | "double"
                )
            );
            if nonstandard {
                o.remove("format");
            }
            // Walks every value: a property called `format` is an object, not the keyword.
            for v in o.values_mut() {
                standard_formats_only(v);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(standard_formats_only),
        _ => {}
    }
}

fn annotations(read_only: bool, destructive: bool, idempotent: bool) -> ToolAnnotations {
    ToolAnnotations::new()
        .read_only(read_only)
        .destructive(destructive)
        .idempotent(idempotent)
        .open_world(false)
}

fn tool<I: JsonSchema, O: JsonSchema>(
    name: &'static str,
    description: &'static str,
    ann: ToolAnnotations,
) -> Tool {
    Tool::new(name, description, schema::<I>())
        .with_raw_output_schema(schema::<O>())
        .with_annotations(ann)
}

/// Every tool the server offers, with its schemas.
pub fn tools() -> Vec<Tool> {
    vec![
        tool::<CreateSandboxRequest, CreateResult>(
            "sandbox_create",
            "Create an isolated Linux sandbox (its own disk and processes; no network unless \
             `network` allows hosts), or \
             return the existing one when `name` is already taken (get-or-create). Give each \
             conversation or task its own name and pass that name as `sandbox` to the other \
             tools. Files and background processes persist between calls.",
            annotations(false, false, true),
        ),
        tool::<ListArgs, SandboxList>(
            "sandbox_list",
            "List sandboxes, optionally only those with the given labels or state.",
            annotations(true, false, true),
        ),
        tool::<SandboxArgs, Sandbox>(
            "sandbox_info",
            "Show one sandbox: id, name, state (running, paused, stopped), labels, image, \
             limits.",
            annotations(true, false, true),
        ),
        tool::<ExecArgs, ExecResponse>(
            "exec",
            "Run a shell command in a sandbox and wait for it. Returns its exit code, stdout \
             and stderr. A non-zero exit code is a normal result, not a failure of the tool. \
             Programs started in the background (`cmd &`) keep running after the call.",
            annotations(false, true, false),
        ),
        tool::<RunPythonArgs, ExecResponse>(
            "run_python",
            "Run Python 3 code in a sandbox as a script and wait for it. Returns the exit \
             code, stdout and stderr (tracebacks appear in stderr). Use print() to see \
             values. Each call is a fresh interpreter; files written persist.",
            annotations(false, true, false),
        ),
        tool::<super::run_code::RunCodeArgs, threadbox_api::interp::CodeExecution>(
            "run_code",
            "Run code in a persistent context of a sandbox (a notebook-like Python session): \
             variables, imports and open files survive between calls with the same \
             `context`. Returns stdout, stderr, the value of the last expression, \
             display() outputs and matplotlib figures as images. An exception is a normal \
             result; the context keeps its variables.",
            annotations(false, true, false),
        ),
        tool::<ReadFileArgs, ReadFileResult>(
            "read_file",
            "Read a file from a sandbox. Text comes back as is, binary data as base64.",
            annotations(true, false, true),
        ),
        tool::<WriteFileArgs, WriteFileResult>(
            "write_file",
            "Write (create or replace) a file in a sandbox; parent directories are created.",
            annotations(false, true, true),
        ),
        tool::<ListFilesArgs, FileList>(
            "list_files",
            "List a directory in a sandbox: name, kind (file, dir, symlink), size, mode, \
             modification time.",
            annotations(true, false, true),
        ),
        tool::<SandboxArgs, Sandbox>(
            "sandbox_pause",
            "Freeze a sandbox: its processes keep their memory but use no CPU. Any later \
             call that runs something resumes it automatically.",
            annotations(false, false, true),
        ),
        tool::<SandboxArgs, Sandbox>(
            "sandbox_hibernate",
            "Hibernate a sandbox the conversation will not need for a while: frozen, its \
             memory moved out of RAM. Its processes (servers, interpreter variables) \
             continue where they were at the next call, which wakes it automatically.",
            annotations(false, false, true),
        ),
        tool::<SandboxArgs, Sandbox>(
            "sandbox_resume",
            "Make a sandbox run again: thaw a paused one, or boot a stopped one on its disk \
             (files are kept, earlier processes are not).",
            annotations(false, false, true),
        ),
        tool::<PreviewArgs, threadbox_api::previews::Preview>(
            "preview",
            "Publish a port of a sandbox (a dev server, a notebook, a web app) as a URL a \
             person can open in a browser. Private unless `public`: the URL carries a \
             one-time token. Start the server first (in the background, e.g. `python3 -m \
             http.server 8000 &`); it may listen on 127.0.0.1.",
            annotations(false, false, false),
        ),
        tool::<CheckpointArgs, threadbox_api::checkpoints::Checkpoint>(
            "checkpoint",
            "Checkpoint a sandbox's files (the whole disk, at this instant; processes keep \
             running). Rewind to it later by its label. With `with_memory` (gvisor \
             sandboxes) its memory and running processes are kept too, and the rewind \
             brings them back.",
            annotations(false, false, false),
        ),
        tool::<RewindArgs, Sandbox>(
            "rewind",
            "Return a sandbox's files to a checkpoint (by label or id): files written since \
             are gone, its processes are restarted; same sandbox name and id.",
            annotations(false, true, true),
        ),
        tool::<ForkArgs, threadbox_api::checkpoints::ForkResponse>(
            "fork",
            "Make `count` new running sandboxes with a copy of this sandbox's files, limits, \
             network policy and labels, e.g. to try several fixes in parallel (on gvisor also \
             its memory and running processes). Each has its own id; the original keeps \
             running.",
            annotations(false, false, false),
        ),
        tool::<NetworkLogArgs, threadbox_api::net_log::NetLogPage>(
            "network_log",
            "Show a sandbox's network log: one row per outgoing connection (name, address, \
             port, bytes each way, allowed or denied and why) and per DNS answer, oldest \
             first. Pass the answer's `next_after` as `after` to read on.",
            annotations(true, false, true),
        ),
        tool::<DeleteArgs, DeleteResult>(
            "sandbox_delete",
            "Delete a sandbox with its disk and processes. Irreversible.",
            annotations(false, true, true),
        ),
    ]
}

// ---- the server -------------------------------------------------------------------------

const INSTRUCTIONS: &str = "threadbox runs code in isolated Linux sandboxes. Call \
    sandbox_create with a name (get-or-create), then pass that name as `sandbox` to exec, \
    run_python, run_code, read_file, write_file and list_files. A sandbox keeps its files and \
    background processes between calls; python3 and the usual shell tools are installed; \
    there is no network access unless the sandbox was created with a `network` policy \
    (network_log shows its connections). The home directory is /home/user.";

/// Picks the backend for one call from the HTTP request it came in (`None` over stdio).
/// This is where the daemon's `/mcp` turns the caller identified by the auth layer (an
/// extension of the request) into a backend acting for that caller.
pub type ResolveBackend = Arc<
    dyn Fn(Option<&axum::http::request::Parts>) -> BackendResult<Arc<dyn Backend>> + Send + Sync,
>;

/// The MCP server: stateless, cheap to clone (one per session or per stdio connection).
#[derive(Clone)]
pub struct ThreadboxMcp {
    resolve: ResolveBackend,
}

impl ThreadboxMcp {
    /// A server whose every call goes to `backend`.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        ThreadboxMcp {
            resolve: Arc::new(move |_| Ok(backend.clone())),
        }
    }

    /// A server that picks the backend per request (see [`ResolveBackend`]).
    pub fn per_request(resolve: ResolveBackend) -> Self {
        ThreadboxMcp { resolve }
    }

    /// Runs one tool. Bad arguments and failed operations become `isError` results with
    /// a message the model can act on; an unknown tool is a protocol error.
    pub async fn call(
        &self,
        http: Option<&axum::http::request::Parts>,
        name: &str,
        args: JsonObject,
    ) -> Result<CallToolResult, ErrorData> {
        if !tools().iter().any(|t| t.name == name) {
            return Err(ErrorData::invalid_params(
                format!("unknown tool {name:?}"),
                None,
            ));
        }
        let result = match (self.resolve)(http) {
            Ok(backend) => Calls { backend }.run(name, args).await,
            Err(err) => Err(err),
        };
        Ok(result.unwrap_or_else(|err| error_result(name, err)))
    }
}

/// One tool call on one backend.
struct Calls {
    backend: Arc<dyn Backend>,
}

impl Calls {
    async fn run(&self, name: &str, args: JsonObject) -> Result<CallToolResult, BackendError> {
        match name {
            "sandbox_create" => self.create(parse(name, args)?).await,
            "sandbox_list" => self.list(parse(name, args)?).await,
            "sandbox_info" => {
                let a: SandboxArgs = parse(name, args)?;
                self.backend.get(&a.sandbox).await.map(sandbox_result)
            }
            "exec" => self.exec(parse(name, args)?).await,
            "run_python" => self.run_python(parse(name, args)?).await,
            "run_code" => super::run_code::run_code(&*self.backend, parse(name, args)?).await,
            "read_file" => self.read_file(parse(name, args)?).await,
            "write_file" => self.write_file(parse(name, args)?).await,
            "list_files" => self.list_files(parse(name, args)?).await,
            "sandbox_pause" => {
                let a: SandboxArgs = parse(name, args)?;
                self.backend.pause(&a.sandbox).await.map(sandbox_result)
            }
            "sandbox_hibernate" => {
                let a: SandboxArgs = parse(name, args)?;
                self.backend.hibernate(&a.sandbox).await.map(sandbox_result)
            }
            // The `start` operation, as REST's `POST /start` (ADR 0058).
            "sandbox_resume" => {
                let a: SandboxArgs = parse(name, args)?;
                self.backend.start(&a.sandbox).await.map(sandbox_result)
            }
            "sandbox_delete" => self.delete(parse(name, args)?).await,
            "preview" => {
                let a: PreviewArgs = parse(name, args)?;
                let req = threadbox_api::previews::PreviewRequest {
                    port: a.port,
                    public: a.public,
                };
                let p = self.backend.preview(&a.sandbox, req).await?;
                let access = if p.public { "Public" } else { "Private" };
                let text = format!(
                    "{access} preview of port {} in {}: {}\n(without wildcard DNS: {})",
                    p.port, a.sandbox, p.url, p.path_url
                );
                Ok(structured(text, &p))
            }
            "checkpoint" => {
                let a: CheckpointArgs = parse(name, args)?;
                let c = self
                    .backend
                    .checkpoint(&a.sandbox, a.label, a.with_memory.unwrap_or(false))
                    .await?;
                let text = format!(
                    "Checkpoint {} of sandbox {}{}{}.",
                    c.id,
                    a.sandbox,
                    c.label
                        .as_ref()
                        .map(|l| format!(" labelled {l:?}"))
                        .unwrap_or_default(),
                    if c.with_memory {
                        ", with its memory and running processes"
                    } else {
                        ""
                    }
                );
                Ok(structured(text, &c))
            }
            "rewind" => {
                let a: RewindArgs = parse(name, args)?;
                self.backend
                    .rewind(&a.sandbox, &a.to)
                    .await
                    .map(sandbox_result)
            }
            "fork" => {
                let a: ForkArgs = parse(name, args)?;
                let out = self
                    .backend
                    .fork(&a.sandbox, a.count, a.with_memory)
                    .await?;
                let ids: Vec<&str> = out.sandboxes.iter().map(|s| s.id.as_str()).collect();
                let text = format!(
                    "Forked {} into {} new running sandboxes ({}): {}",
                    a.sandbox,
                    ids.len(),
                    if out.with_memory {
                        "with its memory and running processes"
                    } else {
                        "files only; their processes started afresh"
                    },
                    ids.join(", ")
                );
                Ok(structured(text, &out))
            }
            "network_log" => self.network_log(parse(name, args)?).await,
            _ => Err(BackendError::new(
                ErrorCode::InvalidArgument,
                format!("unknown tool {name:?}"),
            )),
        }
    }

    async fn network_log(&self, a: NetworkLogArgs) -> Result<CallToolResult, BackendError> {
        let page = self
            .backend
            .network_log(threadbox_api::net_log::GetNetworkLog {
                sandbox: a.sandbox,
                after: a.after,
                limit: a.limit,
                wait_ms: None,
            })
            .await?;
        let text = format!(
            "{} row(s); next_after {}.\n{}",
            page.entries.len(),
            page.next_after,
            pretty(&page.entries)
        );
        Ok(structured(text, &page))
    }

    async fn create(&self, req: CreateSandboxRequest) -> Result<CallToolResult, BackendError> {
        let (sandbox, created) = self.backend.create(req).await?;
        let text = format!(
            "{} sandbox {} ({}): {}. Pass `sandbox: {:?}` to the other tools.\n{}",
            if created { "Created" } else { "Found existing" },
            display_name(&sandbox),
            sandbox.id,
            sandbox.state.as_str(),
            sandbox.name.as_deref().unwrap_or(&sandbox.id),
            pretty(&sandbox)
        );
        Ok(structured(text, &CreateResult { created, sandbox }))
    }

    async fn list(&self, a: ListArgs) -> Result<CallToolResult, BackendError> {
        let sandboxes = self.backend.list(a.labels, a.state).await?;
        let mut text = format!("{} sandbox(es)", sandboxes.len());
        for s in &sandboxes {
            text.push_str(&format!(
                "\n- {} ({}): {}",
                display_name(s),
                s.id,
                s.state.as_str()
            ));
        }
        Ok(structured(text, &SandboxList { sandboxes }))
    }

    async fn exec(&self, a: ExecArgs) -> Result<CallToolResult, BackendError> {
        let req = ExecRequest {
            shell: Some(a.command),
            env: a.env,
            cwd: a.cwd,
            user: a.user,
            stdin: a.stdin,
            timeout_secs: Some(a.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS)),
            max_output_bytes: Some(MAX_OUTPUT_BYTES),
            ..ExecRequest::default()
        };
        let timeout = req.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS);
        let resp = self.backend.exec(&a.sandbox, req).await?;
        Ok(structured(exec_text(&resp, timeout), &resp))
    }

    async fn run_python(&self, a: RunPythonArgs) -> Result<CallToolResult, BackendError> {
        // The program comes on stdin (`python3 -`): no argv length limit, no quoting.
        let req = ExecRequest {
            command: Some(vec!["python3".into(), "-".into()]),
            env: a.env,
            cwd: a.cwd,
            stdin: Some(a.code),
            timeout_secs: Some(a.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS)),
            max_output_bytes: Some(MAX_OUTPUT_BYTES),
            ..ExecRequest::default()
        };
        let timeout = req.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS);
        let resp = self.backend.exec(&a.sandbox, req).await?;
        Ok(structured(exec_text(&resp, timeout), &resp))
    }

    async fn read_file(&self, a: ReadFileArgs) -> Result<CallToolResult, BackendError> {
        let limit = a.max_bytes.unwrap_or(DEFAULT_READ_BYTES);
        if limit == 0 || limit > MAX_READ_BYTES {
            return Err(BackendError::new(
                ErrorCode::InvalidArgument,
                format!("max_bytes must be between 1 and {MAX_READ_BYTES}"),
            ));
        }
        let (data, truncated) = self
            .backend
            .read_file(&a.sandbox, &a.path, a.user, limit)
            .await?;
        let (content, encoding) = encode_bytes(&data);
        let mut text = match encoding {
            Encoding::Utf8 => content.clone(),
            Encoding::Base64 => format!("[{} bytes of binary data, base64]\n{content}", data.len()),
        };
        if truncated {
            text.push_str(&format!(
                "\n[truncated: only the first {} bytes are shown; pass a larger max_bytes, \
                 or use exec with head/tail/sed to read parts]",
                data.len()
            ));
        }
        let result = ReadFileResult {
            path: a.path,
            content,
            encoding,
            size: data.len() as u64,
            truncated,
        };
        Ok(structured(text, &result))
    }

    async fn write_file(&self, a: WriteFileArgs) -> Result<CallToolResult, BackendError> {
        let data = decode_bytes(&a.content, a.encoding)
            .map_err(|e| BackendError::new(ErrorCode::InvalidArgument, format!("content: {e}")))?;
        let n = data.len() as u64;
        self.backend
            .write_file(&a.sandbox, &a.path, a.user, data)
            .await?;
        let text = format!("Wrote {n} bytes to {}", a.path);
        Ok(structured(
            text,
            &WriteFileResult {
                path: a.path,
                bytes_written: n,
            },
        ))
    }

    async fn list_files(&self, a: ListFilesArgs) -> Result<CallToolResult, BackendError> {
        let path = a.path.unwrap_or_else(|| ".".to_string());
        let list = self.backend.list_files(&a.sandbox, &path, a.user).await?;
        let mut text = format!("{} entries in {path}", list.entries.len());
        for e in &list.entries {
            let kind = match e.kind {
                FileKind::Dir => "dir",
                FileKind::File => "file",
                FileKind::Symlink => "symlink",
                FileKind::Other => "other",
            };
            text.push_str(&format!("\n{kind:7} {:>10}  {}", e.size, e.name));
            if let Some(t) = &e.symlink_target {
                text.push_str(&format!(" -> {t}"));
            }
        }
        Ok(structured(text, &list))
    }

    async fn delete(&self, a: DeleteArgs) -> Result<CallToolResult, BackendError> {
        self.backend.delete(&a.sandbox, a.force).await?;
        let text = format!("Deleted sandbox {}", a.sandbox);
        Ok(structured(
            text,
            &DeleteResult {
                sandbox: a.sandbox,
                deleted: true,
            },
        ))
    }
}

impl ServerHandler for ThreadboxMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("threadbox", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let http = context.extensions.get::<axum::http::request::Parts>();
        let span = crate::telemetry::mcp_span(&request.name, &context.meta.0 .0, http);
        let out = self
            .call(http, &request.name, args)
            .instrument(span.clone())
            .await;
        crate::telemetry::record_mcp_outcome(&span, &out);
        Ok(out?.into())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools().into_iter().find(|t| t.name == name)
    }
}

// ---- helpers ----------------------------------------------------------------------------

/// Arguments into the tool's type; a mismatch is a tool error the model can fix.
fn parse<T: DeserializeOwned>(tool: &str, args: JsonObject) -> Result<T, BackendError> {
    serde_json::from_value(serde_json::Value::Object(args)).map_err(|e| {
        BackendError::new(
            ErrorCode::InvalidArgument,
            format!("invalid arguments for {tool}: {e}"),
        )
    })
}

fn pretty<T: Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

fn display_name(s: &Sandbox) -> &str {
    s.name.as_deref().unwrap_or(&s.id)
}

fn structured<T: Serialize>(text: String, value: &T) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
    result.structured_content = Some(serde_json::to_value(value).unwrap_or_default());
    result
}

fn sandbox_result(s: Sandbox) -> CallToolResult {
    let text = format!(
        "Sandbox {} ({}) is {}.\n{}",
        display_name(&s),
        s.id,
        s.state.as_str(),
        pretty(&s)
    );
    structured(text, &s)
}

/// What the model reads for a command's result.
fn exec_text(r: &ExecResponse, timeout: f64) -> String {
    let stream = |s: &str| match r.encoding {
        Encoding::Utf8 => s.to_string(),
        Encoding::Base64 => decode_bytes(s, Encoding::Base64)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default(),
    };
    let mut text = if r.timed_out {
        format!(
            "timed out after {timeout}s: the command and its processes were killed (pass a \
             larger timeout_secs, or start long jobs in the background with `cmd &`)"
        )
    } else if r.oom_killed {
        oom_message(r.memory_limit_bytes)
    } else {
        match (r.exit_code, r.signal) {
            (Some(code), _) => format!("exit_code: {code}"),
            (None, Some(sig)) => format!("killed by signal {sig}"),
            (None, None) => "exit_code: unknown".to_string(),
        }
    };
    let (out, err) = (stream(&r.stdout), stream(&r.stderr));
    if !out.is_empty() {
        text.push_str("\nstdout:\n");
        text.push_str(&out);
    }
    if !err.is_empty() {
        text.push_str("\nstderr:\n");
        text.push_str(&err);
    }
    if r.truncated {
        text.push_str(&format!(
            "\n[output truncated at {MAX_OUTPUT_BYTES} bytes per stream; redirect it to a \
             file and read parts of it]"
        ));
    }
    text
}

/// A failed operation as a tool result the model can act on.
fn error_result(tool: &str, err: BackendError) -> CallToolResult {
    let hint = match err.code {
        ErrorCode::NotFound if err.message.starts_with("sandbox ") => {
            " Create it with sandbox_create, or list existing ones with sandbox_list."
        }
        ErrorCode::SandboxNotRunning => " Start it again with sandbox_resume.",
        ErrorCode::InvalidArgument => " Fix the arguments and call the tool again.",
        ErrorCode::Unavailable => " The sandbox service is unavailable; retry later.",
        ErrorCode::QuotaExceeded => " A quota is exhausted; delete sandboxes you no longer need.",
        _ => "",
    };
    let text = format!(
        "{tool} failed ({}): {}.{hint}",
        err.code.as_str(),
        err.message.trim_end_matches('.')
    );
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    result.structured_content = serde_json::to_value(ToolError {
        code: err.code,
        message: err.message,
    })
    .ok();
    result
}

#[cfg(test)]
mod text_tests {
    use super::*;
    use threadbox_api::human_bytes;

    fn killed(oom: bool) -> ExecResponse {
        ExecResponse {
            exit_code: Some(137),
            signal: Some(9),
            stdout: String::new(),
            stderr: String::new(),
            encoding: Encoding::Utf8,
            timed_out: false,
            truncated: false,
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 5,
            oom_killed: oom,
            memory_limit_bytes: oom.then_some(256 << 20),
        }
    }

    #[test]
    fn an_oom_kill_is_named_with_the_limit() {
        assert_eq!(
            exec_text(&killed(true), 10.0),
            "killed: out of memory (limit 256 MiB)"
        );
        assert_eq!(exec_text(&killed(false), 10.0), "exit_code: 137");
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(256 << 20), "256 MiB");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
        assert_eq!(human_bytes(100), "100 bytes");
    }
}
