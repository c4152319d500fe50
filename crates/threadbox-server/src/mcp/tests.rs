//! The tool handlers through rmcp's own client (in-memory transport), over a fake
//! backend: schemas, results, structured content, and which failures are `isError`.
//! The real daemon behind both doors is covered by python/tests/test_mcp*.py.
//! (A test module: one test per tool behaviour, kept beside the tools.)

use super::*;
use async_trait::async_trait;
use rmcp::model::{CallToolRequestParams, CallToolResult, JsonObject, ProtocolVersion};
use rmcp::service::{RoleClient, RunningService};
use rmcp::ServiceExt;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Mutex;
use threadbox_api::interp::{
    CodeException, CodeExecution, CodeOutput, CodeStatus, CreateContextRequest, ExecuteCodeRequest,
};
use threadbox_api::{
    CreateSandboxRequest, Encoding, ErrorCode, ExecRequest, ExecResponse, FileList, Limits,
    Sandbox, SandboxState, TtlAction, User,
};

/// One `run_code` call: sandbox, context, the get-or-create asked for, the request.
type Cell = (
    String,
    String,
    Option<CreateContextRequest>,
    ExecuteCodeRequest,
);

/// An in-memory stand-in for the manager: sandboxes by name, files in a map, and an
/// `exec` that understands just enough to be told apart.
#[derive(Default)]
struct Fake {
    sandboxes: Mutex<BTreeMap<String, Sandbox>>,
    files: Mutex<BTreeMap<(String, String), Vec<u8>>>,
    execs: Mutex<Vec<(String, ExecRequest)>>,
    /// Checkpoints: (sandbox id, label) -> that sandbox's files then.
    checkpoints: Mutex<BTreeMap<(String, String), SavedFiles>>,
    /// `run_code` calls: sandbox, context, the get-or-create asked for, the request.
    cells: Mutex<Vec<Cell>>,
}

/// A sandbox's files as a checkpoint of the fake keeps them: (path, content).
type SavedFiles = Vec<(String, Vec<u8>)>;

fn sandbox(name: &str) -> Sandbox {
    Sandbox {
        id: format!("sb-{name}"),
        name: Some(name.to_string()),
        state: SandboxState::Running,
        labels: BTreeMap::new(),
        image: "host".into(),
        created_at: "2026-01-01T00:00:00Z".into(),
        last_active_at: "2026-01-01T00:00:00Z".into(),
        limits: Limits {
            memory_bytes: 1 << 30,
            cpus: 1.0,
            pids: 512,
            disk_bytes: 10 << 30,
        },
        idle_pause_secs: None,
        idle_stop_secs: None,
        idle_hibernate_secs: None,
        ttl_secs: None,
        ttl_action: TtlAction::Stop,
        agent_pid: Some(42),
        isolation_warnings: Vec::new(),
        tier: "jail".into(),
        network: None,
        network_generation: 0,
        otlp_relay: false,
    }
}

impl Fake {
    fn find(&self, s: &str) -> BackendResult<Sandbox> {
        let map = self.sandboxes.lock().unwrap();
        map.values()
            .find(|b| b.id == s || b.name.as_deref() == Some(s))
            .cloned()
            .ok_or_else(|| BackendError::new(ErrorCode::NotFound, format!("sandbox {s} not found")))
    }

    fn set_state(&self, s: &str, state: SandboxState) -> BackendResult<Sandbox> {
        let found = self.find(s)?;
        let mut map = self.sandboxes.lock().unwrap();
        let entry = map
            .get_mut(found.name.as_deref().unwrap_or_default())
            .unwrap();
        entry.state = state;
        Ok(entry.clone())
    }
}

#[async_trait]
impl Backend for Fake {
    async fn create(&self, req: CreateSandboxRequest) -> BackendResult<(Sandbox, bool)> {
        let name = req.name.unwrap_or_else(|| "anon".into());
        if name.contains(' ') {
            return Err(BackendError::new(
                ErrorCode::InvalidArgument,
                "invalid argument: name may not contain spaces",
            ));
        }
        let mut map = self.sandboxes.lock().unwrap();
        if let Some(s) = map.get(&name) {
            return Ok((s.clone(), false));
        }
        let mut s = sandbox(&name);
        s.labels = req.labels;
        if let Some(m) = req.limits.memory_bytes {
            s.limits.memory_bytes = m;
        }
        map.insert(name, s.clone());
        Ok((s, true))
    }

    async fn list(
        &self,
        labels: BTreeMap<String, String>,
        state: Option<SandboxState>,
    ) -> BackendResult<Vec<Sandbox>> {
        Ok(self
            .sandboxes
            .lock()
            .unwrap()
            .values()
            .filter(|s| state.is_none_or(|st| s.state == st))
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .cloned()
            .collect())
    }

    async fn get(&self, s: &str) -> BackendResult<Sandbox> {
        self.find(s)
    }

    async fn pause(&self, s: &str) -> BackendResult<Sandbox> {
        self.set_state(s, SandboxState::Paused)
    }

    async fn hibernate(&self, s: &str) -> BackendResult<Sandbox> {
        self.set_state(s, SandboxState::Hibernated)
    }

    async fn start(&self, s: &str) -> BackendResult<Sandbox> {
        self.set_state(s, SandboxState::Running)
    }

    async fn delete(&self, s: &str, force: bool) -> BackendResult<()> {
        let found = self.find(s)?;
        if !force && found.state != SandboxState::Stopped {
            return Err(BackendError::new(ErrorCode::Conflict, "stop it first"));
        }
        let name = found.name.unwrap_or_default();
        self.sandboxes.lock().unwrap().remove(&name);
        Ok(())
    }

    async fn exec(&self, s: &str, req: ExecRequest) -> BackendResult<ExecResponse> {
        let found = self.find(s)?;
        if found.state == SandboxState::Stopped {
            return Err(BackendError::new(
                ErrorCode::SandboxNotRunning,
                format!("sandbox {} is stopped, not running", found.id),
            ));
        }
        self.execs
            .lock()
            .unwrap()
            .push((found.id.clone(), req.clone()));
        let shell = req.shell.clone().unwrap_or_default();
        let (code, stdout, stderr, timed_out) = if shell == "false" {
            (Some(1), String::new(), "failed\n".to_string(), false)
        } else if shell.starts_with("sleep") {
            (None, String::new(), String::new(), true)
        } else if let Some(code) = &req.stdin {
            (
                Some(0),
                format!("ran {} bytes of python\n", code.len()),
                String::new(),
                false,
            )
        } else {
            (Some(0), format!("{shell}\n"), String::new(), false)
        };
        Ok(ExecResponse {
            exit_code: code,
            signal: None,
            stdout,
            stderr,
            encoding: Encoding::Utf8,
            timed_out,
            truncated: false,
            stdout_truncated: false,
            stderr_truncated: false,
            duration_ms: 1,
            oom_killed: false,
            memory_limit_bytes: None,
        })
    }

    async fn read_file(
        &self,
        s: &str,
        path: &str,
        _user: User,
        limit: u64,
    ) -> BackendResult<(Vec<u8>, bool)> {
        let id = self.find(s)?.id;
        let data = self
            .files
            .lock()
            .unwrap()
            .get(&(id, path.to_string()))
            .cloned()
            .ok_or_else(|| {
                BackendError::new(ErrorCode::NotFound, format!("{path}: no such file"))
            })?;
        let chunks =
            futures::stream::iter(data.chunks(3).map(|c| Ok::<_, BackendError>(c.to_vec())));
        read_bounded(chunks, limit).await
    }

    async fn write_file(
        &self,
        s: &str,
        path: &str,
        _user: User,
        data: Vec<u8>,
    ) -> BackendResult<()> {
        let id = self.find(s)?.id;
        self.files
            .lock()
            .unwrap()
            .insert((id, path.to_string()), data);
        Ok(())
    }

    async fn list_files(&self, s: &str, _path: &str, _user: User) -> BackendResult<FileList> {
        self.find(s)?;
        Ok(FileList { entries: vec![] })
    }

    async fn checkpoint(
        &self,
        s: &str,
        label: Option<String>,
        _with_memory: bool,
    ) -> BackendResult<threadbox_api::checkpoints::Checkpoint> {
        let id = self.find(s)?.id;
        let label = label.unwrap_or_else(|| "unlabelled".into());
        let files: Vec<_> = self
            .files
            .lock()
            .unwrap()
            .iter()
            .filter(|((sb, _), _)| *sb == id)
            .map(|((_, p), d)| (p.clone(), d.clone()))
            .collect();
        self.checkpoints
            .lock()
            .unwrap()
            .insert((id.clone(), label.clone()), files);
        Ok(threadbox_api::checkpoints::Checkpoint {
            id: format!("ck-{label}"),
            sandbox: id,
            label: Some(label),
            parent: None,
            size_bytes: 0,
            method: "copy".into(),
            created_at: "2026-01-01T00:00:00Z".into(),
            with_memory: false,
            memory_bytes: None,
        })
    }

    async fn rewind(&self, s: &str, to: &str) -> BackendResult<Sandbox> {
        let sb = self.find(s)?;
        let saved = self
            .checkpoints
            .lock()
            .unwrap()
            .get(&(sb.id.clone(), to.to_string()))
            .cloned()
            .ok_or_else(|| BackendError::new(ErrorCode::NotFound, format!("checkpoint {to:?}")))?;
        let mut files = self.files.lock().unwrap();
        files.retain(|(id, _), _| *id != sb.id);
        for (p, d) in saved {
            files.insert((sb.id.clone(), p), d);
        }
        Ok(sb)
    }

    async fn fork(
        &self,
        s: &str,
        count: Option<u32>,
        _with_memory: Option<bool>,
    ) -> BackendResult<threadbox_api::checkpoints::ForkResponse> {
        let parent = self.find(s)?;
        let mut out = Vec::new();
        for i in 1..=count.unwrap_or(1) {
            let name = format!("{}-fork{i}", parent.name.clone().unwrap_or_default());
            let sb = sandbox(&name);
            let copied: Vec<_> = self
                .files
                .lock()
                .unwrap()
                .iter()
                .filter(|((id, _), _)| *id == parent.id)
                .map(|((_, p), d)| ((sb.id.clone(), p.clone()), d.clone()))
                .collect();
            self.files.lock().unwrap().extend(copied);
            self.sandboxes.lock().unwrap().insert(name, sb.clone());
            out.push(sb);
        }
        Ok(threadbox_api::checkpoints::ForkResponse {
            sandboxes: out,
            with_memory: false,
        })
    }

    /// A cell whose code says what it makes: `raise` an exception, `plot N` N figures
    /// (PNG displays), anything else the value `2`.
    async fn run_code(
        &self,
        s: &str,
        context: &str,
        create: Option<CreateContextRequest>,
        request: ExecuteCodeRequest,
    ) -> BackendResult<CodeExecution> {
        let id = self.find(s)?.id;
        let code = request.code.clone();
        let mut cells = self.cells.lock().unwrap();
        cells.push((id, context.to_string(), create, request));
        let count = cells.iter().filter(|c| c.1 == context).count() as u64;
        let bundle = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
                .collect::<serde_json::Map<_, _>>()
        };
        let mut exec = CodeExecution {
            execution_id: format!("ex-{count}"),
            context_id: "ctx-1".into(),
            execution_count: count,
            context_created: count == 1,
            stdout: "hello\n".into(),
            ..CodeExecution::default()
        };
        if code == "raise" {
            exec.status = CodeStatus::Exception;
            exec.exception = Some(CodeException {
                name: "ValueError".into(),
                value: "boom".into(),
                traceback: "Traceback (most recent call last):\nValueError: boom\n".into(),
            });
        } else if let Some(n) = code.strip_prefix("plot ") {
            let n: usize = n.parse().unwrap_or(1);
            exec.outputs = (0..n)
                .map(|i| CodeOutput {
                    data: bundle(&[
                        ("image/png", &format!("iVBORw0KGgo{i}")),
                        ("text/plain", "<Figure size 640x480 with 1 Axes>"),
                    ]),
                    metadata: Default::default(),
                })
                .collect();
        } else {
            exec.result = Some(CodeOutput {
                data: bundle(&[("text/plain", "2")]),
                metadata: Default::default(),
            });
        }
        Ok(exec)
    }
}

type Client = RunningService<RoleClient, ()>;

/// A server over `backend` and rmcp's client, connected in memory.
async fn connect(backend: Arc<Fake>) -> Client {
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    let server = ThreadboxMcp::new(backend);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io).await.expect("client initializes")
}

async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let args: JsonObject = match args {
        Value::Object(o) => o,
        other => panic!("arguments must be an object, got {other}"),
    };
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: protocol error {e}"))
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

fn structured(r: &CallToolResult) -> Value {
    r.structured_content
        .clone()
        .unwrap_or_else(|| panic!("no structuredContent: {}", text(r)))
}

fn is_error(r: &CallToolResult) -> bool {
    r.is_error == Some(true)
}

#[tokio::test]
async fn lists_every_tool_with_object_schemas_from_the_api_types() {
    let client = connect(Arc::new(Fake::default())).await;
    let info = client.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|i| i.name.as_str()),
        Some("threadbox")
    );
    assert!(info.capabilities.tools.is_some());

    let listed = client.list_all_tools().await.unwrap();
    let names: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
    for want in [
        "sandbox_create",
        "sandbox_list",
        "sandbox_info",
        "exec",
        "run_python",
        "read_file",
        "write_file",
        "list_files",
        "sandbox_pause",
        "sandbox_hibernate",
        "sandbox_resume",
        "sandbox_delete",
        "checkpoint",
        "rewind",
        "fork",
        "run_code",
        "preview",
        "network_log",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert_eq!(names.len(), 18);
    for t in &listed {
        let input = Value::Object((*t.input_schema).clone());
        assert_eq!(input["type"], "object", "{}: {input}", t.name);
        assert!(
            !input.to_string().contains("$ref"),
            "{}: sub-schemas are inlined: {input}",
            t.name
        );
        let output = t.output_schema.as_ref().expect("output schema");
        assert_eq!(output["type"], "object", "{}", t.name);
        assert!(t.description.as_deref().is_some_and(|d| d.len() > 20));
        // Every tool acting on one sandbox names it: nothing lives in the session.
        if !matches!(t.name.as_ref(), "sandbox_create" | "sandbox_list") {
            let required = input["required"].as_array().expect("required");
            assert!(required.contains(&json!("sandbox")), "{}: {input}", t.name);
        }
    }
    let create = listed.iter().find(|t| t.name == "sandbox_create").unwrap();
    let props = &create.input_schema["properties"];
    // CreateSandboxRequest itself: the REST body is the tool's input.
    for field in [
        "name",
        "labels",
        "image",
        "limits",
        "idle_pause_secs",
        "idle_stop_secs",
        "ttl_secs",
        "network",
    ] {
        assert!(props.get(field).is_some(), "sandbox_create lacks {field}");
    }
    assert!(props["limits"]["properties"].get("memory_bytes").is_some());
    let exec = listed.iter().find(|t| t.name == "exec").unwrap();
    assert_eq!(
        exec.input_schema["required"],
        json!(["sandbox", "command"]),
        "{:?}",
        exec.input_schema
    );
    assert_eq!(exec.input_schema["additionalProperties"], json!(false));
    client.cancel().await.unwrap();
}

/// The `format` values JSON Schema 2020-12 defines (§7.3 of the validation vocabulary).
/// Validators such as LangChain.js's warn on anything else, on every tool.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// Every non-standard `format` keyword under `schema`, with its JSON pointer.
fn nonstandard_formats(schema: &Value, at: &str, found: &mut Vec<String>) {
    match schema {
        Value::Object(o) => {
            for (k, v) in o {
                let here = format!("{at}/{k}");
                // A string under `format` is the keyword; an object there is a property
                // that happens to be called `format`, walked like any other.
                match (k.as_str(), v) {
                    ("format", Value::String(f)) if !STANDARD_FORMATS.contains(&f.as_str()) => {
                        found.push(format!("{here} = {f}"))
                    }
                    _ => nonstandard_formats(v, &here, found),
                }
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                nonstandard_formats(v, &format!("{at}/{i}"), found);
            }
        }
        _ => {}
    }
}

#[test]
fn the_format_walk_finds_what_schemars_emits() {
    // The check must be able to fail: schemars' own formats are caught, and a property
    // named `format` is not taken for the keyword.
    let mut found = Vec::new();
    let schema = json!({"properties": {
        "n": {"type": "integer", "format": "uint64"},
        "format": {"type": "string", "format": "date-time"},
        "x": {"anyOf": [{"type": "number", "format": "double"}]}
    }});
    nonstandard_formats(&schema, "", &mut found);
    assert_eq!(
        found,
        [
            "/properties/n/format = uint64",
            "/properties/x/anyOf/0/format = double"
        ]
    );
}

#[tokio::test]
async fn tool_schemas_use_only_standard_formats() {
    let client = connect(Arc::new(Fake::default())).await;
    let listed = client.list_all_tools().await.unwrap();
    let mut found = Vec::new();
    for t in &listed {
        let input = Value::Object((*t.input_schema).clone());
        nonstandard_formats(&input, &format!("{}:input", t.name), &mut found);
        if let Some(output) = &t.output_schema {
            let output = Value::Object((**output).clone());
            nonstandard_formats(&output, &format!("{}:output", t.name), &mut found);
        }
    }
    assert!(found.is_empty(), "non-standard formats: {found:#?}");
    // Integer bounds that the formats carried survive as standard keywords.
    let create = listed.iter().find(|t| t.name == "sandbox_create").unwrap();
    let pids = &create.input_schema["properties"]["limits"]["properties"]["pids"];
    assert_eq!(pids["minimum"], json!(0), "{pids}");
    assert_eq!(pids["maximum"], json!(u32::MAX), "{pids}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn create_is_get_or_create_and_exec_returns_structured_results() {
    let fake = Arc::new(Fake::default());
    let client = connect(fake.clone()).await;
    let r = call(
        &client,
        "sandbox_create",
        json!({"name": "t1", "labels": {"team": "a"}, "limits": {"memory_bytes": 536870912u64}}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    let s = structured(&r);
    assert_eq!(s["created"], true);
    assert_eq!(s["sandbox"]["name"], "t1");
    assert_eq!(s["sandbox"]["limits"]["memory_bytes"], 536870912u64);
    let again = structured(&call(&client, "sandbox_create", json!({"name": "t1"})).await);
    assert_eq!(again["created"], false);
    assert_eq!(again["sandbox"]["id"], s["sandbox"]["id"]);

    let r = call(
        &client,
        "exec",
        json!({"sandbox": "t1", "command": "echo hi", "env": {"A": "1"}, "cwd": "/tmp", "timeout_secs": 5}),
    )
    .await;
    assert!(!is_error(&r));
    let out = structured(&r);
    assert_eq!(out["exit_code"], 0);
    assert_eq!(out["timed_out"], false);
    assert_eq!(out["stdout"], "echo hi\n");
    assert!(text(&r).contains("exit_code: 0"), "{}", text(&r));
    {
        let execs = fake.execs.lock().unwrap();
        let (id, req) = execs.last().unwrap();
        assert_eq!(id, "sb-t1");
        assert_eq!(req.shell.as_deref(), Some("echo hi"));
        assert_eq!(req.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(req.cwd.as_deref(), Some("/tmp"));
        assert_eq!(req.timeout_secs, Some(5.0));
    }

    // A failing command is a normal result, not a tool error.
    let r = call(
        &client,
        "exec",
        json!({"sandbox": "t1", "command": "false"}),
    )
    .await;
    assert!(!is_error(&r), "a non-zero exit is not isError");
    assert_eq!(structured(&r)["exit_code"], 1);
    assert!(text(&r).contains("exit_code: 1") && text(&r).contains("failed"));

    let r = call(
        &client,
        "exec",
        json!({"sandbox": "t1", "command": "sleep 9"}),
    )
    .await;
    assert!(!is_error(&r));
    assert_eq!(structured(&r)["timed_out"], true);
    assert!(text(&r).contains("timed out"), "{}", text(&r));

    let r = call(
        &client,
        "run_python",
        json!({"sandbox": "t1", "code": "print(6*7)"}),
    )
    .await;
    assert!(!is_error(&r));
    {
        let execs = fake.execs.lock().unwrap();
        let (_, req) = execs.last().unwrap();
        assert_eq!(
            req.command,
            Some(vec!["python3".to_string(), "-".to_string()])
        );
        assert_eq!(req.stdin.as_deref(), Some("print(6*7)"));
        assert_eq!(req.timeout_secs, Some(DEFAULT_TIMEOUT_SECS));
    }
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn checkpoint_rewind_and_fork_tools() {
    let client = connect(Arc::new(Fake::default())).await;
    call(&client, "sandbox_create", json!({"name": "c"})).await;
    let write = |content: &'static str| json!({"sandbox": "c", "path": "f", "content": content});
    call(&client, "write_file", write("one")).await;
    let r = call(
        &client,
        "checkpoint",
        json!({"sandbox": "c", "label": "clean"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["label"], "clean");
    assert!(text(&r).contains("clean"), "{}", text(&r));
    call(&client, "write_file", write("two")).await;
    let r = call(&client, "rewind", json!({"sandbox": "c", "to": "clean"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let r = call(&client, "read_file", json!({"sandbox": "c", "path": "f"})).await;
    assert_eq!(structured(&r)["content"], "one");
    let r = call(&client, "rewind", json!({"sandbox": "c", "to": "nope"})).await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["code"], "not_found");
    let r = call(&client, "fork", json!({"sandbox": "c", "count": 2})).await;
    assert!(!is_error(&r), "{}", text(&r));
    let forks = structured(&r)["sandboxes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(forks.len(), 2);
    assert!(text(&r).contains("sb-c-fork1"), "{}", text(&r));
    let r = call(
        &client,
        "read_file",
        json!({"sandbox": "c-fork2", "path": "f"}),
    )
    .await;
    assert_eq!(structured(&r)["content"], "one");
    let r = call(&client, "checkpoint", json!({"sandbox": "c", "bogus": 1})).await;
    assert!(is_error(&r), "unknown arguments are refused");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn files_round_trip_text_and_binary_with_a_bound() {
    let client = connect(Arc::new(Fake::default())).await;
    call(&client, "sandbox_create", json!({"name": "f"})).await;
    let r = call(
        &client,
        "write_file",
        json!({"sandbox": "f", "path": "notes.txt", "content": "hello world"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["bytes_written"], 11);
    let r = call(
        &client,
        "read_file",
        json!({"sandbox": "f", "path": "notes.txt"}),
    )
    .await;
    assert_eq!(structured(&r)["content"], "hello world");
    assert_eq!(structured(&r)["truncated"], false);
    assert_eq!(text(&r), "hello world");

    let r = call(
        &client,
        "read_file",
        json!({"sandbox": "f", "path": "notes.txt", "max_bytes": 5}),
    )
    .await;
    assert_eq!(structured(&r)["content"], "hello");
    assert_eq!(structured(&r)["truncated"], true);
    assert!(text(&r).contains("truncated"));

    // Binary data goes in and out as base64.
    let r = call(
        &client,
        "write_file",
        json!({"sandbox": "f", "path": "b.bin", "content": "/wD+", "encoding": "base64"}),
    )
    .await;
    assert_eq!(structured(&r)["bytes_written"], 3);
    let r = call(
        &client,
        "read_file",
        json!({"sandbox": "f", "path": "b.bin"}),
    )
    .await;
    assert_eq!(structured(&r)["encoding"], "base64");
    assert_eq!(structured(&r)["content"], "/wD+");

    let r = call(
        &client,
        "write_file",
        json!({"sandbox": "f", "path": "x", "content": "not base64!", "encoding": "base64"}),
    )
    .await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["code"], "invalid_argument");

    let r = call(
        &client,
        "read_file",
        json!({"sandbox": "f", "path": "notes.txt", "max_bytes": 0}),
    )
    .await;
    assert!(is_error(&r));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn failures_are_tool_errors_the_model_can_act_on() {
    let client = connect(Arc::new(Fake::default())).await;
    // Unknown sandbox: isError, with the code and what to do next.
    let r = call(
        &client,
        "exec",
        json!({"sandbox": "nope", "command": "true"}),
    )
    .await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["code"], "not_found");
    assert!(text(&r).contains("sandbox_create"), "{}", text(&r));

    // Arguments that do not fit the schema: isError, naming the problem.
    let r = call(&client, "exec", json!({"sandbox": "x"})).await;
    assert!(is_error(&r));
    assert!(text(&r).contains("command"), "{}", text(&r));
    let r = call(
        &client,
        "exec",
        json!({"sandbox": "x", "command": "true", "bogus": 1}),
    )
    .await;
    assert!(is_error(&r));
    assert!(text(&r).contains("bogus"), "{}", text(&r));
    let r = call(&client, "sandbox_create", json!({"name": "has space"})).await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["code"], "invalid_argument");

    // An unknown tool is a protocol error.
    let err = client
        .call_tool(CallToolRequestParams::new("no_such_tool"))
        .await;
    assert!(err.is_err());
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn lifecycle_tools_pause_resume_start_and_delete() {
    let fake = Arc::new(Fake::default());
    let client = connect(fake.clone()).await;
    call(
        &client,
        "sandbox_create",
        json!({"name": "l", "labels": {"k": "v"}}),
    )
    .await;
    call(&client, "sandbox_create", json!({"name": "m"})).await;
    let r = call(&client, "sandbox_pause", json!({"sandbox": "l"})).await;
    assert_eq!(structured(&r)["state"], "paused");
    let r = call(&client, "sandbox_list", json!({"state": "paused"})).await;
    assert_eq!(structured(&r)["sandboxes"].as_array().unwrap().len(), 1);
    let r = call(&client, "sandbox_list", json!({"labels": {"k": "v"}})).await;
    assert_eq!(structured(&r)["sandboxes"][0]["name"], "l");
    let r = call(&client, "sandbox_resume", json!({"sandbox": "l"})).await;
    assert_eq!(structured(&r)["state"], "running");

    // A stopped sandbox: exec says how to recover, and resume boots it.
    fake.set_state("l", SandboxState::Stopped).unwrap();
    let r = call(&client, "exec", json!({"sandbox": "l", "command": "true"})).await;
    assert!(is_error(&r));
    assert!(text(&r).contains("sandbox_resume"), "{}", text(&r));
    let r = call(&client, "sandbox_resume", json!({"sandbox": "l"})).await;
    assert!(!is_error(&r), "{}", text(&r));
    assert_eq!(structured(&r)["state"], "running");

    let r = call(&client, "sandbox_info", json!({"sandbox": "sb-l"})).await;
    assert_eq!(structured(&r)["name"], "l");
    let r = call(
        &client,
        "sandbox_delete",
        json!({"sandbox": "l", "force": false}),
    )
    .await;
    assert!(is_error(&r));
    assert_eq!(structured(&r)["code"], "conflict");
    let r = call(&client, "sandbox_delete", json!({"sandbox": "l"})).await;
    assert_eq!(structured(&r)["deleted"], true);
    let r = call(&client, "sandbox_info", json!({"sandbox": "l"})).await;
    assert!(is_error(&r));
    client.cancel().await.unwrap();
}

/// Raw JSON-RPC over the in-memory transport: what clients of each protocol version get.
async fn initialize_raw(version: &str) -> Value {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let (server_io, client_io) = tokio::io::duplex(1 << 16);
    let server = ThreadboxMcp::new(Arc::new(Fake::default()));
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    let (read, mut write) = tokio::io::split(client_io);
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version, "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"}}});
    write
        .write_all(format!("{init}\n").as_bytes())
        .await
        .unwrap();
    let mut lines = BufReader::new(read).lines();
    let line = lines.next_line().await.unwrap().expect("a reply");
    serde_json::from_str(&line).unwrap()
}

#[tokio::test]
async fn negotiates_the_versions_current_clients_send() {
    for v in ["2025-03-26", "2025-06-18", "2025-11-25"] {
        let reply = initialize_raw(v).await;
        assert_eq!(reply["result"]["protocolVersion"], v, "{reply}");
    }
    // A newer (or unknown) version gets the newest one with an initialize handshake.
    let reply = initialize_raw("2099-01-01").await;
    assert_eq!(
        reply["result"]["protocolVersion"],
        ProtocolVersion::LATEST_WITH_INITIALIZE.as_str(),
        "{reply}"
    );
}

// ---- /mcp over HTTP, through the daemon's router ---------------------------------------

mod http {
    use super::super::McpOptions;
    use axum::body::Body;
    use axum::http::{header, Request, StatusCode};
    use http_body_util::BodyExt;
    use serde_json::{json, Value};
    use tower::ServiceExt;

    fn post(host: &str, origin: Option<&str>, body: Value) -> Request<Body> {
        let mut b = Request::post("/mcp")
            .header(header::HOST, host)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-11-25");
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        b.body(Body::from(body.to_string())).unwrap()
    }

    async fn send(router: axum::Router, req: Request<Body>) -> (StatusCode, String) {
        let resp = router.oneshot(req).await.expect("infallible");
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn ping() -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    }

    fn router(options: McpOptions) -> axum::Router {
        // Only pings: the backend is never called.
        let backend: std::sync::Arc<dyn super::Backend> =
            std::sync::Arc::new(super::Fake::default());
        let resolve: super::super::ResolveBackend =
            std::sync::Arc::new(move |_| Ok(backend.clone()));
        axum::Router::new().route_service("/mcp", super::super::http_service(resolve, &options))
    }

    #[tokio::test]
    async fn the_daemon_router_serves_stateless_json_on_mcp() {
        let t = crate::test_app::TestApp::socket(1024).await;
        let app = t.router.clone();
        let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "0"}}});
        let (status, body) = send(app.clone(), post("127.0.0.1:7420", None, init)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let v: Value = serde_json::from_str(&body).expect("a JSON reply, not SSE");
        assert_eq!(v["result"]["protocolVersion"], "2025-11-25");

        // No session: a tool call needs no initialize before it.
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "sandbox_info", "arguments": {"sandbox": "x"}}});
        let (status, body) = send(app.clone(), post("localhost", None, call)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["result"]["isError"], true, "{v}");
        assert_eq!(v["result"]["structuredContent"]["code"], "not_found");

        // GET (a standalone SSE stream) has no meaning without sessions.
        let get = Request::get("/mcp")
            .header(header::HOST, "localhost")
            .header(header::ACCEPT, "text/event-stream")
            .body(Body::empty())
            .unwrap();
        let (status, _) = send(app, get).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    }

    #[tokio::test]
    async fn unknown_hosts_and_origins_are_refused_unless_configured() {
        let defaults = router(McpOptions::default());
        let (status, _) = send(defaults.clone(), post("evil.example", None, ping())).await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, _) = send(
            defaults.clone(),
            post("localhost", Some("https://evil.example"), ping()),
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN);
        let (status, body) = send(defaults, post("[::1]:7420", None, ping())).await;
        assert_eq!(status, StatusCode::OK, "{body}");

        let mut opts = McpOptions::default().with_extra_hosts(["sbx.internal".to_string()]);
        opts.allowed_origins = vec!["https://app.example:443".into()];
        let configured = router(opts);
        let (status, body) =
            send(configured.clone(), post("sbx.internal:7420", None, ping())).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, _) = send(
            configured.clone(),
            post("sbx.internal", Some("https://app.example"), ping()),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = send(configured, post("other.internal", None, ping())).await;
        assert_eq!(status, StatusCode::FORBIDDEN);

        let any = router(McpOptions {
            allowed_hosts: vec!["*".into()],
            allowed_origins: vec!["*".into()],
        });
        let (status, _) = send(
            any,
            post("anything.example", Some("https://x.example"), ping()),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
}

// ---- run_code (issue 15, ADR 0085) -------------------------------------------------------

fn images(r: &CallToolResult) -> Vec<(String, String)> {
    r.content
        .iter()
        .filter_map(|c| c.as_image().map(|i| (i.mime_type.clone(), i.data.clone())))
        .collect()
}

#[tokio::test]
async fn run_code_sends_figures_as_image_content_once() {
    let fake = Arc::new(Fake::default());
    let client = connect(fake.clone()).await;
    call(&client, "sandbox_create", json!({"name": "nb"})).await;
    let r = call(
        &client,
        "run_code",
        json!({"sandbox": "nb", "code": "plot 2"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    // Block 0 is the text, then one ImageContent per figure, in order.
    assert!(r.content[0].as_text().is_some());
    assert_eq!(
        images(&r),
        vec![
            ("image/png".to_string(), "iVBORw0KGgo0".to_string()),
            ("image/png".to_string(), "iVBORw0KGgo1".to_string()),
        ]
    );
    let t = text(&r);
    assert!(t.starts_with("ok (context python, cell 1)"), "{t}");
    assert!(t.contains("stdout:\nhello"), "{t}");
    assert!(
        t.contains("[display 2: image/png image, content block 2]"),
        "{t}"
    );
    assert!(t.contains("<Figure size 640x480"), "{t}");
    // The typed result, without the image bytes a second time: each image names its block.
    let s = structured(&r);
    assert_eq!(s["status"], "ok");
    assert_eq!(
        s["outputs"][1]["metadata"]["threadbox"]["content_block"]["image/png"],
        2
    );
    assert!(s["outputs"][0]["data"].get("image/png").is_none(), "{s}");
    assert_eq!(
        s["outputs"][0]["data"]["text/plain"],
        "<Figure size 640x480 with 1 Axes>"
    );
    assert!(!s.to_string().contains("iVBORw0KGgo"), "{s}");
    // Bounded like exec: the tool sets the cell's timeout and output bound.
    let (_, ctx, create, req) = fake.cells.lock().unwrap()[0].clone();
    assert_eq!(ctx, "python");
    assert!(
        create.is_none(),
        "the default context is made by its first execute"
    );
    assert_eq!(req.timeout_secs, Some(300));
    assert_eq!(req.max_output_bytes, Some(1 << 20));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn run_code_bounds_the_images_of_one_call() {
    let client = connect(Arc::new(Fake::default())).await;
    call(&client, "sandbox_create", json!({"name": "nb"})).await;
    let r = call(
        &client,
        "run_code",
        json!({"sandbox": "nb", "code": "plot 11"}),
    )
    .await;
    assert_eq!(images(&r).len(), MAX_IMAGES);
    let t = text(&r);
    assert!(t.contains("[3 image(s) not sent"), "{t}");
    assert!(t.contains("[display 11: image/png image, not sent"), "{t}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn run_code_names_contexts_and_reports_exceptions_as_results() {
    let fake = Arc::new(Fake::default());
    let client = connect(fake.clone()).await;
    call(&client, "sandbox_create", json!({"name": "nb"})).await;
    let r = call(
        &client,
        "run_code",
        json!({"sandbox": "nb", "code": "1+1", "context": "stats", "timeout_secs": 5}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    assert!(text(&r).contains("result:\n2"), "{}", text(&r));
    assert_eq!(structured(&r)["result"]["data"]["text/plain"], "2");
    let r = call(
        &client,
        "run_code",
        json!({"sandbox": "nb", "code": "raise", "context": "stats"}),
    )
    .await;
    // An exception in the user's code is a result, not a failed tool call.
    assert!(!is_error(&r), "{}", text(&r));
    let t = text(&r);
    assert!(
        t.starts_with("exception ValueError (context stats, cell 2)"),
        "{t}"
    );
    assert!(
        t.contains("exception:\nTraceback (most recent call last):\nValueError: boom"),
        "{t}"
    );
    assert_eq!(structured(&r)["exception"]["name"], "ValueError");
    {
        let cells = fake.cells.lock().unwrap();
        // A named context is get-or-create before each execute.
        let create = cells[0].2.as_ref().expect("a named context is created");
        assert_eq!(create.name.as_deref(), Some("stats"));
        assert_eq!(create.language, "python");
        assert_eq!(cells[0].3.timeout_secs, Some(5));
    }
    // A language without a context runs in that language's own context.
    let r = call(
        &client,
        "run_code",
        json!({"sandbox": "nb", "code": "1+1", "language": "javascript"}),
    )
    .await;
    assert!(!is_error(&r), "{}", text(&r));
    {
        let cells = fake.cells.lock().unwrap();
        let last = cells.last().expect("a cell");
        assert_eq!(last.1, "javascript");
        let create = last.2.as_ref().expect("the language's context is created");
        assert_eq!(create.name.as_deref(), Some("javascript"));
        assert_eq!(create.language, "javascript");
    }
    // Bad arguments and unknown sandboxes are tool errors the model can act on.
    let r = call(&client, "run_code", json!({"sandbox": "nb"})).await;
    assert!(
        is_error(&r) && text(&r).contains("invalid arguments for run_code"),
        "{}",
        text(&r)
    );
    let r = call(&client, "run_code", json!({"sandbox": "nope", "code": "1"})).await;
    assert!(
        is_error(&r) && text(&r).contains("sandbox_create"),
        "{}",
        text(&r)
    );
    client.cancel().await.unwrap();
}
