//! Interpreter contexts (issue 15, ADR 0080): one standard-library Python worker per
//! context, started through the exec spawn path (its own child cgroup `ctx-<n>`, the
//! sandbox's seccomp, Landlock and user) and spoken to over a private socketpair with
//! NDJSON. fds 1/2 of the worker are pipes to the agent, so subprocess and C-level output
//! is captured; Python-level output comes on the control socket, ordered with displays.

mod journal;
mod utf8;

use crate::agent::{self, Agent};
use crate::error::{AgentError, Result};
use crate::exec::{credit_frozen, spawn_passing, Spawned};
use journal::{Journal, Journals};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use threadbox_proto::interp::{
    CellEnd, CellOutput, CellStatus, ContextState, ExceptionInfo, MAX_CODE, MAX_CONTEXTS,
};
use threadbox_proto::{
    CellSpec, CodeEvent, Command as ProtoCommand, ContextInfo, ContextSpec, ErrorKind, Execution,
    Frame, Response, CHUNK, MAX_OUTPUT_LIMIT,
};
use threadbox_sys::child::{self as syschild, WaitStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::time::sleep_until;
use utf8::Utf8Carry;

const WORKER: &str = include_str!("worker.py");
const BOOTSTRAP: &str = include_str!("bootstrap.py");
const JS_WORKER: &str = include_str!("worker.js");
const JS_BOOTSTRAP: &str = include_str!("bootstrap.js");
const BASH_WORKER: &str = include_str!("worker.sh");
const BASH_BOOTSTRAP: &str = include_str!("bootstrap.sh");
/// How long a new worker has to say `ready`.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// After SIGINT, how long the cell has to stop before the worker is killed (its state
/// is then lost, and the result says so).
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);
/// Longest line the worker may send (a display value is bounded at 8 MiB before base64).
const MAX_LINE: usize = 24 * 1024 * 1024;
const FROZEN_TICK: Duration = Duration::from_millis(200);

/// The worker's fd 1 and 2. Between cells a drain task reads and drops what a leftover
/// subprocess writes, so a full pipe never blocks it; during a cell the cell reads them.
struct Pipes {
    out: pipe::Receiver,
    err: pipe::Receiver,
    busy: Cell<bool>,
    gone: Cell<bool>,
    out_eof: Cell<bool>,
    err_eof: Cell<bool>,
    wake: Notify,
}

impl Pipes {
    fn new(out: pipe::Receiver, err: pipe::Receiver) -> Rc<Pipes> {
        let p = Rc::new(Pipes {
            out,
            err,
            busy: Cell::new(false),
            gone: Cell::new(false),
            out_eof: Cell::new(false),
            err_eof: Cell::new(false),
            wake: Notify::new(),
        });
        tokio::task::spawn_local(drain_idle(p.clone()));
        p
    }

    fn set_busy(&self, busy: bool) {
        self.busy.set(busy);
        self.wake.notify_one();
    }

    /// Drops what is in the pipes now, without waiting.
    fn discard(&self) {
        let mut buf = vec![0u8; CHUNK];
        for (pipe, eof) in [(&self.out, &self.out_eof), (&self.err, &self.err_eof)] {
            while !eof.get() {
                match pipe.try_read(&mut buf) {
                    Ok(0) => eof.set(true),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        }
    }
}

async fn drain_idle(p: Rc<Pipes>) {
    loop {
        if p.gone.get() || (p.out_eof.get() && p.err_eof.get()) {
            return;
        }
        if p.busy.get() {
            p.wake.notified().await;
            continue;
        }
        tokio::select! {
            _ = p.out.readable(), if !p.out_eof.get() => {}
            _ = p.err.readable(), if !p.err_eof.get() => {}
            _ = p.wake.notified() => continue,
        }
        // The cell may have taken the pipes while this task waited.
        if !p.busy.get() {
            p.discard();
        }
    }
}

/// What is in a pipe now, without waiting. Not `try_read`: that trusts tokio's cached
/// readiness, which may not know yet of output written just before the worker's `done`
/// (a bash cell's `echo` was lost that way under load).
fn read_now(pipe: &pipe::Receiver, buf: &mut [u8]) -> std::io::Result<usize> {
    let f = std::fs::File::from(pipe.as_fd().try_clone_to_owned()?);
    std::io::Read::read(&mut &f, buf)
}

/// The next chunk of a pipe (0 at EOF).
async fn read_pipe(pipe: &pipe::Receiver, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        pipe.readable().await?;
        match pipe.try_read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// A running worker and its channels; held by the context while idle, by the execution
/// while a cell runs.
struct Worker {
    pid: i32,
    cgroup: Option<String>,
    ctl: UnixStream,
    buf: Vec<u8>,
    exit: oneshot::Receiver<WaitStatus>,
    pipes: Rc<Pipes>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Ends the drain task (the pipes close once the worker's processes are gone).
        self.pipes.gone.set(true);
        self.pipes.wake.notify_one();
    }
}

pub struct Ctx {
    info: RefCell<ContextInfo>,
    spec: ContextSpec,
    worker: RefCell<Option<Worker>>,
    /// The worker's pid and cgroup, also while a cell holds the worker.
    pid: Cell<Option<i32>>,
    cgroup: RefCell<Option<String>>,
    running: RefCell<Option<String>>,
    interrupt: Notify,
}

#[derive(Default)]
pub struct Registry {
    contexts: BTreeMap<String, Rc<Ctx>>,
    next: u64,
    next_exec: u64,
    journals: Journals,
    /// Makes execution ids unique across restarts of the agent (a stop/start), so an
    /// id of an earlier boot never names a new execution.
    boot: Option<u64>,
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn find(agent: &Agent, key: &str) -> Option<Rc<Ctx>> {
    let reg = agent.contexts.borrow();
    reg.contexts.get(key).cloned().or_else(|| {
        reg.contexts
            .values()
            .find(|c| c.info.borrow().name == key)
            .cloned()
    })
}

fn not_found(key: &str) -> AgentError {
    AgentError::new(ErrorKind::NotFound, format!("no context {key:?}"))
}

impl Ctx {
    fn snapshot(&self) -> ContextInfo {
        let mut i = self.info.borrow().clone();
        // The worker as the sandbox knows it (ADR 0218).
        i.pid = self.pid.get().map(threadbox_sys::child::pidns::view);
        i.state = if self.running.borrow().is_some() {
            ContextState::Busy
        } else if self.pid.get().is_some() {
            ContextState::Idle
        } else {
            ContextState::Dead
        };
        i.created = false;
        i
    }
}

/// Reads the next NDJSON line of the worker (None at EOF). A line beyond [`MAX_LINE`]
/// is an error: the worker (or a cell writing on its socket) is misbehaving.
async fn read_line(
    ctl: &mut UnixStream,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<serde_json::Value>> {
    loop {
        if let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            return match serde_json::from_slice(&line) {
                Ok(v) => Ok(Some(v)),
                Err(_) => Err(std::io::Error::other("malformed line from the worker")),
            };
        }
        if buf.len() > MAX_LINE {
            return Err(std::io::Error::other("the worker sent an oversized line"));
        }
        let mut chunk = vec![0u8; CHUNK];
        let n = ctl.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// How a language's worker is started: its program, the bootstrap given on its command
/// line (it reads the worker's source from the control socket) and that source.
struct Runtime {
    program: &'static str,
    flag: &'static str,
    bootstrap: &'static str,
    worker: &'static str,
}

fn runtime(language: &str) -> Option<Runtime> {
    Some(match language {
        "python" => Runtime {
            program: "python3",
            flag: "-c",
            bootstrap: BOOTSTRAP,
            worker: WORKER,
        },
        "javascript" => Runtime {
            program: "node",
            flag: "-e",
            bootstrap: JS_BOOTSTRAP,
            worker: JS_WORKER,
        },
        "bash" => Runtime {
            program: "bash",
            flag: "-c",
            bootstrap: BASH_BOOTSTRAP,
            worker: BASH_WORKER,
        },
        _ => return None,
    })
}

async fn start_worker(agent: &Rc<Agent>, spec: &ContextSpec) -> Result<Worker> {
    let Some(rt) = runtime(&spec.language) else {
        return Err(AgentError::invalid(format!(
            "language {:?} is not available (python, javascript or bash)",
            spec.language
        )));
    };
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| AgentError::internal(format!("socketpair: {e}")))?;
    let mut env = spec.env.clone();
    env.insert("THREADBOX_CTL_FD".into(), theirs.as_raw_fd().to_string());
    let cmd = ProtoCommand::Argv(vec![rt.program.into(), rt.flag.into(), rt.bootstrap.into()]);
    let prepared = agent::prepare(&agent.root, &cmd, &env, spec.cwd.as_deref(), spec.user)?;
    let p = spawn_passing(
        agent,
        prepared,
        rt.program,
        "ctx",
        false,
        Some(theirs.as_fd()),
    )
    .map_err(|e| {
        if e.kind == ErrorKind::NotFound {
            AgentError::new(
                ErrorKind::NotFound,
                format!(
                    "language_unavailable: {} is not installed in this sandbox",
                    rt.program
                ),
            )
        } else {
            e
        }
    })?;
    drop(theirs);
    let ctl = ours
        .set_nonblocking(true)
        .and_then(|()| UnixStream::from_std(ours));
    let ctl = match ctl {
        Ok(c) => c,
        Err(e) => {
            agent.kill_tree(p.cgroup.as_deref(), p.pid);
            return Err(AgentError::internal(format!("control socket: {e}")));
        }
    };
    let Spawned {
        pid,
        exit,
        stdout,
        stderr,
        cgroup,
        ..
    } = p;
    let mut w = Worker {
        pid,
        cgroup,
        ctl,
        buf: Vec::new(),
        exit,
        pipes: Pipes::new(stdout, stderr),
    };
    // Until `ready`, the pipes are this function's (a start error is read from stderr).
    w.pipes.set_busy(true);
    let mut hello = format!("{}\n", rt.worker.len()).into_bytes();
    hello.extend_from_slice(rt.worker.as_bytes());
    let ready = tokio::time::timeout(START_TIMEOUT, async {
        w.ctl.write_all(&hello).await?;
        read_line(&mut w.ctl, &mut w.buf).await
    })
    .await;
    match ready {
        Ok(Ok(Some(v))) if v["ev"] == "ready" => {
            w.pipes.set_busy(false);
            Ok(w)
        }
        other => {
            agent.kill_tree(w.cgroup.as_deref(), w.pid);
            let mut err = vec![0u8; 4096];
            let n = match tokio::time::timeout(
                Duration::from_millis(500),
                read_pipe(&w.pipes.err, &mut err),
            )
            .await
            {
                Ok(Ok(n)) => n,
                _ => 0,
            };
            Err(AgentError::internal(format!(
                "the {} worker did not start ({}): {}",
                spec.language,
                match other {
                    Err(_) => "timed out".to_string(),
                    Ok(Err(e)) => e.to_string(),
                    _ => "it exited".to_string(),
                },
                String::from_utf8_lossy(&err[..n]).trim()
            )))
        }
    }
}

fn install(ctx: &Ctx, w: Worker) {
    ctx.pid.set(Some(w.pid));
    *ctx.cgroup.borrow_mut() = w.cgroup.clone();
    *ctx.worker.borrow_mut() = Some(w);
}

/// Kills the current worker (its whole cgroup) and forgets it.
fn kill_worker(agent: &Agent, ctx: &Ctx) {
    if let Some(pid) = ctx.pid.take() {
        let cg = ctx.cgroup.borrow_mut().take();
        agent.kill_tree(cg.as_deref(), pid);
        if let Some(name) = cg {
            agent.release_cgroup(name);
        }
    }
    ctx.worker.borrow_mut().take();
}

pub async fn create(agent: &Rc<Agent>, spec: ContextSpec) -> Result<Response> {
    if let Some(name) = &spec.name {
        if name.is_empty() || name.len() > 128 {
            return Err(AgentError::invalid(
                "a context name has 1 to 128 characters",
            ));
        }
        if let Some(c) = find(agent, name) {
            return Ok(Response::Context(c.snapshot()));
        }
    }
    if agent.contexts.borrow().contexts.len() >= MAX_CONTEXTS {
        return Err(AgentError::invalid(format!(
            "too_many_contexts: a sandbox has at most {MAX_CONTEXTS} contexts"
        )));
    }
    let w = start_worker(agent, &spec).await?;
    // Another create of the same name may have won while the worker started.
    if let Some(name) = &spec.name {
        if let Some(c) = find(agent, name) {
            agent.kill_tree(w.cgroup.as_deref(), w.pid);
            return Ok(Response::Context(c.snapshot()));
        }
    }
    let id = {
        let mut reg = agent.contexts.borrow_mut();
        reg.next += 1;
        format!("ctx-{}", reg.next)
    };
    let ctx = Rc::new(Ctx {
        info: RefCell::new(ContextInfo {
            id: id.clone(),
            name: spec.name.clone().unwrap_or_else(|| id.clone()),
            language: spec.language.clone(),
            cwd: spec.cwd.clone(),
            user: spec.user,
            state: ContextState::Idle,
            execution_count: 0,
            generation: 1,
            pid: None,
            created_at: now_secs(),
            reason: None,
            created: true,
        }),
        spec,
        worker: RefCell::new(None),
        pid: Cell::new(None),
        cgroup: RefCell::new(None),
        running: RefCell::new(None),
        interrupt: Notify::new(),
    });
    install(&ctx, w);
    agent.contexts.borrow_mut().contexts.insert(id, ctx.clone());
    let mut info = ctx.snapshot();
    info.created = true;
    Ok(Response::Context(info))
}

pub fn list(agent: &Agent) -> Response {
    Response::Contexts {
        contexts: agent
            .contexts
            .borrow()
            .contexts
            .values()
            .map(|c| c.snapshot())
            .collect(),
    }
}

pub fn delete(agent: &Agent, key: &str) -> Result<Response> {
    let ctx = find(agent, key).ok_or_else(|| not_found(key))?;
    kill_worker(agent, &ctx);
    let id = ctx.info.borrow().id.clone();
    agent.contexts.borrow_mut().contexts.remove(&id);
    Ok(Response::Done)
}

pub async fn restart(agent: &Rc<Agent>, key: &str) -> Result<Response> {
    let ctx = find(agent, key).ok_or_else(|| not_found(key))?;
    kill_worker(agent, &ctx);
    {
        let mut i = ctx.info.borrow_mut();
        i.generation += 1;
        i.execution_count = 0;
        i.reason = None;
    }
    let w = start_worker(agent, &ctx.spec).await?;
    install(&ctx, w);
    Ok(Response::Context(ctx.snapshot()))
}

pub fn set_reason(agent: &Agent, key: &str, reason: String) -> Response {
    if let Some(ctx) = find(agent, key) {
        if ctx.pid.get().is_none() {
            ctx.info.borrow_mut().reason = Some(reason);
        }
    }
    Response::Done
}

pub fn interrupt(agent: &Agent, key: &str) -> Result<Response> {
    let ctx = find(agent, key).ok_or_else(|| not_found(key))?;
    let busy = ctx.running.borrow().is_some();
    if busy {
        ctx.interrupt.notify_one();
    }
    Ok(Response::Interrupted { interrupted: busy })
}

/// Collects the events of one execution: keeps them in its journal (for re-attach),
/// sends them in stream mode, folds them always.
struct Fold {
    id: u64,
    stream: bool,
    tx: mpsc::Sender<Frame>,
    ex: Execution,
    journal: Rc<Journal>,
    limit: usize,
    out_bytes: usize,
    err_bytes: usize,
}

impl Fold {
    async fn emit(&mut self, ev: CodeEvent) {
        let ev = match ev {
            CodeEvent::Stdout { text } => match self.bound(true, text) {
                Some(text) => CodeEvent::Stdout { text },
                None => return,
            },
            CodeEvent::Stderr { text } => match self.bound(false, text) {
                Some(text) => CodeEvent::Stderr { text },
                None => return,
            },
            other => other,
        };
        match &ev {
            // In stream mode the text went out in events; the final frame stays small.
            CodeEvent::Stdout { text } if !self.stream => self.ex.stdout.push_str(text),
            CodeEvent::Stderr { text } if !self.stream => self.ex.stderr.push_str(text),
            CodeEvent::Display(o) => self.ex.outputs.push(o.clone()),
            CodeEvent::Result(o) => self.ex.result = Some(o.clone()),
            CodeEvent::Exception(e) => self.ex.exception = Some(e.clone()),
            _ => {}
        }
        if self.stream {
            self.journal.push(ev.clone());
            self.send(ev).await;
        } else {
            self.journal.push(ev);
        }
    }

    /// The part of `text` within the stream's bound (None when nothing is left).
    fn bound(&mut self, is_out: bool, mut text: String) -> Option<String> {
        if text.is_empty() {
            return None;
        }
        let used = if is_out {
            &mut self.out_bytes
        } else {
            &mut self.err_bytes
        };
        let room = self.limit.saturating_sub(*used);
        if room == 0 {
            self.ex.truncated = true;
            return None;
        }
        if text.len() > room {
            let mut cut = room;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            self.ex.truncated = true;
        }
        *used += text.len();
        (!text.is_empty()).then_some(text)
    }

    async fn send(&self, ev: CodeEvent) {
        let _ = self
            .tx
            .send(Frame::Response {
                id: self.id,
                resp: Response::Cell(ev),
            })
            .await;
    }
}

fn output(v: &serde_json::Value) -> CellOutput {
    CellOutput {
        data: v["data"].as_object().cloned().unwrap_or_default(),
        metadata: v["metadata"].as_object().cloned().unwrap_or_default(),
    }
}

fn death_reason(
    agent: &Agent,
    status: Option<WaitStatus>,
    oom_before: Option<u64>,
    cg: Option<&str>,
) -> String {
    if let (Some(before), Some(after)) = (oom_before, cg.and_then(|c| oom_kills(agent, c))) {
        if after > before {
            return "oom".into();
        }
    }
    match status {
        Some(WaitStatus::Exited(c)) => format!("exited:{c}"),
        Some(WaitStatus::Signaled(libc::SIGKILL)) => "killed".into(),
        Some(WaitStatus::Signaled(s)) => format!("signal:{s}"),
        None => "killed".into(),
    }
}

/// `oom_kill` of the context cgroup's `memory.events`, where readable.
fn oom_kills(agent: &Agent, cgroup: &str) -> Option<u64> {
    let dir = agent.cgroup.as_ref()?;
    let fd = dir.open_read(&format!("{cgroup}/memory.events")).ok()?;
    let mut f = std::fs::File::from(fd);
    let mut s = String::new();
    std::io::Read::read_to_string(&mut f, &mut s).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
}

enum Stop {
    Interrupted,
    TimedOut,
}

pub async fn execute(
    agent: Rc<Agent>,
    id: u64,
    spec: CellSpec,
    tx: mpsc::Sender<Frame>,
    mut cancel: oneshot::Receiver<()>,
) -> Response {
    match execute_inner(&agent, id, spec, tx, &mut cancel).await {
        Ok(ex) => Response::Executed(ex),
        Err(e) => e.into_response(),
    }
}

async fn execute_inner(
    agent: &Rc<Agent>,
    id: u64,
    spec: CellSpec,
    tx: mpsc::Sender<Frame>,
    cancel: &mut oneshot::Receiver<()>,
) -> Result<Execution> {
    if spec.code.len() > MAX_CODE {
        return Err(AgentError::invalid(format!(
            "the code is larger than {MAX_CODE} bytes"
        )));
    }
    for k in spec.env.keys() {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(AgentError::invalid(format!(
                "invalid environment variable name {k:?}"
            )));
        }
    }
    let started = Instant::now();
    let mut context_created = false;
    let ctx = match find(agent, &spec.ctx) {
        Some(c) => c,
        // The language names are get-or-create on execute.
        None if runtime(&spec.ctx).is_some() => {
            let r = create(
                agent,
                ContextSpec {
                    name: Some(spec.ctx.clone()),
                    language: spec.ctx.clone(),
                    cwd: None,
                    env: BTreeMap::new(),
                    user: Default::default(),
                },
            )
            .await?;
            context_created = matches!(r, Response::Context(ref i) if i.created);
            find(agent, &spec.ctx).ok_or_else(|| not_found(&spec.ctx))?
        }
        None => return Err(not_found(&spec.ctx)),
    };
    if ctx.spec.language == "bash" {
        check_bash_cell(&spec)?;
    }
    if let Some(running) = ctx.running.borrow().as_ref() {
        return Err(AgentError::new(
            ErrorKind::AlreadyExists,
            format!("context_busy: the context is running {running}"),
        ));
    }
    let (execution_id, journal) = {
        let mut reg = agent.contexts.borrow_mut();
        reg.next_exec += 1;
        let boot = *reg.boot.get_or_insert_with(|| {
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0)
        });
        let eid = format!("exe-{boot:x}-{}", reg.next_exec);
        let j = Journal::new(eid.clone(), ctx.info.borrow().id.clone());
        reg.journals.add(j.clone());
        (eid, j)
    };
    *ctx.running.borrow_mut() = Some(execution_id.clone());
    let r = run_cell(
        agent,
        &ctx,
        Fold {
            id,
            stream: spec.stream,
            tx,
            ex: Execution {
                execution_id: execution_id.clone(),
                ..Default::default()
            },
            journal: journal.clone(),
            limit: spec.max_output.min(MAX_OUTPUT_LIMIT) as usize,
            out_bytes: 0,
            err_bytes: 0,
        },
        spec,
        cancel,
        context_created,
        started,
    )
    .await;
    *ctx.running.borrow_mut() = None;
    match &r {
        Ok(ex) => journal.finish(ex.clone()),
        // The cell did not run (its worker would not start): an end, so that a client
        // following the execution stops.
        Err(e) => {
            let ex = Execution {
                execution_id,
                context_id: journal.context_id.clone(),
                status: CellStatus::ContextDied,
                reason: Some(e.message.clone()),
                ..Default::default()
            };
            journal.push(CodeEvent::End(CellEnd {
                status: ex.status,
                reason: ex.reason.clone(),
                ..Default::default()
            }));
            journal.finish(ex);
        }
    }
    agent.contexts.borrow_mut().journals.trim();
    r
}

/// A bash cell's text and environment go through bash variables, which cannot hold NUL;
/// the environment's names are exported, so they must be shell names.
fn check_bash_cell(spec: &CellSpec) -> Result<()> {
    if spec.code.contains('\0') {
        return Err(AgentError::invalid("a bash cell cannot contain NUL bytes"));
    }
    for (k, v) in &spec.env {
        let name_ok = k
            .bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()));
        if !name_ok || v.contains('\0') {
            return Err(AgentError::invalid(format!(
                "invalid environment variable {k:?} for a bash context"
            )));
        }
    }
    Ok(())
}

/// `'...'` for bash, any text but NUL.
fn bash_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', "'\\''"))
}

/// The request of a bash cell (see `worker.sh`): a header, then the environment's
/// prologue, the code and the epilogue that restores the environment.
fn bash_request(count: u64, code: &str, env: &BTreeMap<String, String>) -> Vec<u8> {
    let mut pro = String::new();
    let mut epi = String::new();
    for (k, v) in env {
        pro.push_str(&format!(
            "__tb_h_{k}=${{{k}+1}}; __tb_s_{k}=${{{k}-}}; export {k}={}\n",
            bash_quote(v)
        ));
        epi.push_str(&format!(
            "if [[ -n $__tb_h_{k} ]]; then {k}=$__tb_s_{k}; else unset {k}; fi; unset __tb_h_{k} __tb_s_{k}\n"
        ));
    }
    let mut out = format!("{count} {} {} {}\n", pro.len(), code.len(), epi.len()).into_bytes();
    out.extend_from_slice(pro.as_bytes());
    out.extend_from_slice(code.as_bytes());
    out.extend_from_slice(epi.as_bytes());
    out
}

/// Pids in the context's cgroup other than the worker: the processes its cells spawned.
fn cell_children(agent: &Agent, cgroup: Option<&str>, worker: i32) -> Vec<i32> {
    let (Some(dir), Some(cg)) = (agent.cgroup.as_ref(), cgroup) else {
        // No call cgroups (the gvisor tier): the worker's descendants by parent pid.
        return descendants(worker);
    };
    let Ok(fd) = dir.open_read(&format!("{cg}/cgroup.procs")) else {
        return Vec::new();
    };
    let mut s = String::new();
    if std::io::Read::read_to_string(&mut std::fs::File::from(fd), &mut s).is_err() {
        return Vec::new();
    }
    s.lines()
        .filter_map(|l| l.trim().parse::<i32>().ok())
        .filter(|&p| p != worker)
        .collect()
}

/// Every descendant of `root`, from the parent pids in `/proc/*/stat` (the sandbox's own
/// pid namespace: a handful of processes). A process reparented away (a daemonized
/// grandchild) is not found: without call cgroups that is the tier's documented limit.
fn descendants(root: i32) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    for pid in threadbox_sys::child::pidns::proc_pids().unwrap_or_default() {
        let Ok(stat) = threadbox_sys::child::pidns::read_proc(&format!("{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if let Some(ppid) = ppid {
            parent_of.push((pid, ppid));
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(child, _) in parent_of.iter().filter(|(_, pp)| *pp == p) {
            if !out.contains(&child) && child != root {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}

/// Where the escalation of a stop request is.
#[derive(PartialEq, Eq)]
enum Escalation {
    /// SIGINT sent; waiting for the cell to stop.
    Signalled,
    /// The cell's children were killed; waiting again before the worker goes.
    ChildrenKilled,
}

async fn run_cell(
    agent: &Rc<Agent>,
    ctx: &Rc<Ctx>,
    mut f: Fold,
    spec: CellSpec,
    cancel: &mut oneshot::Receiver<()>,
    mut context_created: bool,
    started: Instant,
) -> Result<Execution> {
    // A worker that died while idle (or in an earlier cell) is replaced, and the answer
    // says the context is new.
    let idle = ctx.worker.borrow_mut().take();
    let mut w = match idle {
        Some(w) => w,
        None => {
            let w = start_worker(agent, &ctx.spec).await?;
            context_created = true;
            let mut i = ctx.info.borrow_mut();
            if i.execution_count > 0 || i.reason.is_some() {
                i.generation += 1;
            }
            i.execution_count = 0;
            i.reason = None;
            ctx.pid.set(Some(w.pid));
            *ctx.cgroup.borrow_mut() = w.cgroup.clone();
            w
        }
    };
    if w.exit.try_recv().is_ok() {
        // Died while idle: start over.
        agent.kill_tree(w.cgroup.as_deref(), w.pid);
        w = start_worker(agent, &ctx.spec).await?;
        context_created = true;
        let mut i = ctx.info.borrow_mut();
        i.generation += 1;
        i.execution_count = 0;
        ctx.pid.set(Some(w.pid));
        *ctx.cgroup.borrow_mut() = w.cgroup.clone();
    }
    // The pipes are the cell's now; what leftover processes wrote before it is not its.
    let pipes = w.pipes.clone();
    pipes.set_busy(true);
    pipes.discard();
    let generation = ctx.info.borrow().generation;
    let count = {
        let mut i = ctx.info.borrow_mut();
        i.execution_count += 1;
        i.execution_count
    };
    let context_id = ctx.info.borrow().id.clone();
    f.ex.context_id = context_id.clone();
    f.ex.execution_count = count;
    f.ex.context_created = context_created;
    f.emit(CodeEvent::Start {
        execution_id: f.ex.execution_id.clone(),
        context_id,
        execution_count: count,
        context_created,
    })
    .await;
    let oom_before = w.cgroup.as_deref().and_then(|c| oom_kills(agent, c));
    let bash = ctx.spec.language == "bash";
    let line = if bash {
        bash_request(count, &spec.code, &spec.env)
    } else {
        let req = serde_json::json!({
            "op": "execute", "code": spec.code, "env": spec.env, "execution_count": count,
        });
        let mut line = req.to_string().into_bytes();
        line.push(b'\n');
        line
    };
    let mut status = CellStatus::Ok;
    let mut stop: Option<Stop> = None;
    let mut escalation: Option<Escalation> = None;
    let mut escalate_at: Option<tokio::time::Instant> = None;
    let mut died: Option<Option<WaitStatus>> = None;
    let mut worker_truncated = false;
    let mut worker_interrupted = false;
    let mut timeout_at = spec
        .timeout_ms
        .map(|ms| tokio::time::Instant::from_std(started) + Duration::from_millis(ms));
    let mut last_seen = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(FROZEN_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let far = || tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
    let mut obuf = vec![0u8; CHUNK];
    let mut ebuf = vec![0u8; CHUNK];
    let (mut out_text, mut err_text) = (Utf8Carry::default(), Utf8Carry::default());
    let mut cancel_open = true;

    if let Err(e) = w.ctl.write_all(&line).await {
        died = Some(None);
        f.ex.reason = Some(format!("the worker's socket failed: {e}"));
    }
    // SIGINT is sent once the worker said the cell runs (before, its handler ignores it).
    let mut cell_running = false;
    let signal_int = |pid: i32, cell_running: bool| {
        if cell_running {
            if bash {
                // As a terminal's Ctrl-C reaches the foreground job: the command the
                // cell waits on stops, and the shell's trap ends the cell.
                for child in cell_children(agent, ctx.cgroup.borrow().as_deref(), pid) {
                    let _ = syschild::kill(child, libc::SIGINT);
                }
            }
            let _ = syschild::kill(pid, libc::SIGINT);
        }
    };
    while died.is_none() {
        credit_frozen(&mut timeout_at, &mut last_seen);
        let new_stop = tokio::select! {
            biased;
            r = &mut *cancel, if cancel_open => {
                cancel_open = false;
                // The client went away: interrupt the cell (a lost connection without a
                // Cancel, as in a daemon restart, leaves it running under its timeout).
                r.is_ok().then_some(Stop::Interrupted)
            }
            _ = ctx.interrupt.notified(), if stop.is_none() => Some(Stop::Interrupted),
            _ = tick.tick(), if timeout_at.is_some() || escalate_at.is_some() => None,
            _ = sleep_until(timeout_at.unwrap_or_else(far)), if timeout_at.is_some() && stop.is_none() => {
                if credit_frozen(&mut timeout_at, &mut last_seen) {
                    continue;
                }
                Some(Stop::TimedOut)
            }
            _ = sleep_until(escalate_at.unwrap_or_else(far)), if escalate_at.is_some() => {
                let mut e = escalate_at;
                if credit_frozen(&mut e, &mut last_seen) {
                    escalate_at = e;
                    continue;
                }
                let children = cell_children(agent, w.cgroup.as_deref(), w.pid);
                if escalation == Some(Escalation::Signalled) && !children.is_empty() {
                    // Research §5.3 step 2: the cell may be waiting on a process it
                    // started; killing only those keeps the worker and its variables.
                    for pid in children {
                        let _ = syschild::kill(pid, libc::SIGKILL);
                    }
                    escalation = Some(Escalation::ChildrenKilled);
                    escalate_at = Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
                } else {
                    // The cell did not stop: the worker goes, and its state with it.
                    agent.kill_tree(w.cgroup.as_deref(), w.pid);
                    escalate_at = None;
                    died = Some(None);
                    f.ex.context_restarted = true;
                }
                None
            }
            st = &mut w.exit => {
                died = Some(st.ok());
                None
            }
            r = read_pipe(&pipes.out, &mut obuf), if !pipes.out_eof.get() => {
                match r {
                    Ok(n) if n > 0 => {
                        let text = out_text.push(&obuf[..n]);
                        f.emit(CodeEvent::Stdout { text }).await;
                    }
                    _ => pipes.out_eof.set(true),
                }
                None
            }
            r = read_pipe(&pipes.err, &mut ebuf), if !pipes.err_eof.get() => {
                match r {
                    Ok(n) if n > 0 => {
                        let text = err_text.push(&ebuf[..n]);
                        f.emit(CodeEvent::Stderr { text }).await;
                    }
                    _ => pipes.err_eof.set(true),
                }
                None
            }
            l = read_line(&mut w.ctl, &mut w.buf) => {
                match l {
                    Ok(Some(v)) => match v["ev"].as_str().unwrap_or("") {
                        "started" => {
                            cell_running = true;
                            if stop.is_some() {
                                signal_int(w.pid, cell_running);
                            }
                        }
                        "stream" => {
                            let text = v["text"].as_str().unwrap_or("").to_string();
                            let ev = if v["name"] == "stderr" {
                                CodeEvent::Stderr { text }
                            } else {
                                CodeEvent::Stdout { text }
                            };
                            f.emit(ev).await;
                        }
                        "display" => f.emit(CodeEvent::Display(output(&v))).await,
                        "result" => f.emit(CodeEvent::Result(output(&v))).await,
                        "exception" => {
                            let e = ExceptionInfo {
                                name: v["name"].as_str().unwrap_or("").into(),
                                value: v["value"].as_str().unwrap_or("").into(),
                                traceback: v["traceback"].as_str().unwrap_or("").into(),
                                frames: v["frames"].as_array().cloned().unwrap_or_default(),
                            };
                            f.emit(CodeEvent::Exception(e)).await;
                        }
                        "done" => {
                            worker_truncated = v["truncated"] == true;
                            worker_interrupted = v["interrupted"] == true;
                            if v["status"] == "exception" {
                                status = CellStatus::Exception;
                            }
                            break;
                        }
                        _ => {}
                    },
                    Ok(None) | Err(_) => {
                        // The socket closed or carried garbage: the worker is not usable.
                        agent.kill_tree(w.cgroup.as_deref(), w.pid);
                        let st = tokio::time::timeout(Duration::from_secs(5), &mut w.exit).await;
                        died = Some(st.ok().and_then(|s| s.ok()));
                    }
                }
                None
            }
        };
        if let Some(s) = new_stop {
            if stop.is_none() {
                signal_int(w.pid, cell_running);
                stop = Some(s);
                escalation = Some(Escalation::Signalled);
                escalate_at = Some(tokio::time::Instant::now() + INTERRUPT_GRACE);
            }
        }
    }
    // Output of the cell's subprocesses written before the worker answered is in the
    // pipes already: take what is there without waiting.
    for is_out in [true, false] {
        let (pipe, eof, buf, carry) = if is_out {
            (&pipes.out, &pipes.out_eof, &mut obuf, &mut out_text)
        } else {
            (&pipes.err, &pipes.err_eof, &mut ebuf, &mut err_text)
        };
        while !eof.get() {
            match read_now(pipe, buf) {
                Ok(n) if n > 0 => {
                    let text = carry.push(&buf[..n]);
                    f.emit(if is_out {
                        CodeEvent::Stdout { text }
                    } else {
                        CodeEvent::Stderr { text }
                    })
                    .await;
                }
                Ok(_) => eof.set(true),
                Err(_) => break,
            }
        }
        // A character cut by the end of the cell is not completed by the next one.
        let text = carry.finish();
        f.emit(if is_out {
            CodeEvent::Stdout { text }
        } else {
            CodeEvent::Stderr { text }
        })
        .await;
    }
    if let Some(st) = died {
        let cg = w.cgroup.clone();
        agent.kill_tree(cg.as_deref(), w.pid);
        let st = match st {
            Some(s) => Some(s),
            None => tokio::time::timeout(Duration::from_secs(5), &mut w.exit)
                .await
                .ok()
                .and_then(|s| s.ok()),
        };
        if let Some(name) = cg {
            agent.release_cgroup(name);
        }
        let reason = death_reason(agent, st, oom_before, w.cgroup.as_deref());
        let restarted = f.ex.context_restarted;
        status = match (&stop, restarted) {
            (Some(Stop::TimedOut), _) => CellStatus::TimedOut,
            (Some(Stop::Interrupted), _) => CellStatus::Interrupted,
            _ => CellStatus::ContextDied,
        };
        f.ex.reason = Some(if restarted {
            "the cell did not stop after SIGINT; the worker was killed and its state lost".into()
        } else {
            reason.clone()
        });
        ctx.pid.set(None);
        ctx.cgroup.borrow_mut().take();
        {
            let mut i = ctx.info.borrow_mut();
            i.reason = Some(reason);
        }
        drop(w);
        if restarted && ctx.info.borrow().generation == generation {
            // A fresh worker now, so the context answers at once; its state is empty.
            if let Ok(nw) = start_worker(agent, &ctx.spec).await {
                let mut i = ctx.info.borrow_mut();
                i.generation += 1;
                i.execution_count = 0;
                i.reason = None;
                drop(i);
                install(ctx, nw);
            }
        }
    } else {
        if let Some(s) = &stop {
            let interrupted = worker_interrupted
                || f.ex
                    .exception
                    .as_ref()
                    .is_some_and(|e| e.name == "KeyboardInterrupt");
            // A cell that ignored SIGINT but ended once its children were killed was
            // stopped too, even though it raised nothing.
            if interrupted || escalation == Some(Escalation::ChildrenKilled) {
                status = match s {
                    Stop::TimedOut => CellStatus::TimedOut,
                    Stop::Interrupted => CellStatus::Interrupted,
                };
            }
        }
        if ctx.info.borrow().generation == generation {
            pipes.set_busy(false);
            *ctx.worker.borrow_mut() = Some(w);
        } else {
            agent.kill_tree(w.cgroup.as_deref(), w.pid);
        }
    }
    f.ex.status = status;
    f.ex.truncated |= worker_truncated;
    f.ex.duration_ms = started.elapsed().as_millis() as u64;
    let end = CellEnd {
        status,
        execution_count: count,
        duration_ms: f.ex.duration_ms,
        truncated: f.ex.truncated,
        context_restarted: f.ex.context_restarted,
        reason: f.ex.reason.clone(),
    };
    f.emit(CodeEvent::End(end)).await;
    Ok(f.ex)
}

/// Follows an execution (`ContextAttach`): its kept events from `from` on, then the new
/// ones as they come, then its final `Executed`. Leaving does not interrupt the cell:
/// only the execute's own caller does that.
pub async fn attach(
    agent: Rc<Agent>,
    id: u64,
    ctx: String,
    execution: String,
    from: u64,
    tx: mpsc::Sender<Frame>,
    mut cancel: oneshot::Receiver<()>,
) -> Response {
    let journal = agent.contexts.borrow().journals.get(&execution);
    let Some(j) = journal else {
        return AgentError::new(
            ErrorKind::NotFound,
            format!("no execution {execution:?} (not of this boot, or no longer kept)"),
        )
        .into_response();
    };
    let of_ctx = j.context_id == ctx
        || find(&agent, &ctx).is_some_and(|c| c.info.borrow().id == j.context_id);
    if !of_ctx {
        return not_found(&format!("{execution} in context {ctx}")).into_response();
    }
    let mut next = usize::try_from(from).unwrap_or(usize::MAX);
    loop {
        let changed = j.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let batch: Vec<CodeEvent> = {
            let evs = j.events.borrow();
            let b = evs
                .get(next..)
                .map(<[CodeEvent]>::to_vec)
                .unwrap_or_default();
            next = next.max(evs.len());
            b
        };
        for ev in batch {
            let frame = Frame::Response {
                id,
                resp: Response::Cell(ev),
            };
            if tx.send(frame).await.is_err() {
                return Response::Done;
            }
        }
        if let Some(ex) = j.done.borrow().clone() {
            if next >= j.events.borrow().len() {
                return Response::Executed(ex);
            }
            continue;
        }
        tokio::select! {
            _ = &mut cancel => return Response::Done,
            _ = changed => {}
        }
    }
}
