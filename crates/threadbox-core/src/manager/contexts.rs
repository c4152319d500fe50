//! Interpreter contexts (issue 15, ADR 0080): the manager's side is thin; the agent keeps
//! the contexts (they are its children, so they survive pause/resume and a daemon
//! restart) and this module maps the operations onto its requests.

use super::*;
use crate::ops::Run;
use contexts_lost::LostWatch;
use threadbox_api::interp::*;
use threadbox_api::ops::Operation;

/// Default running time of a cell before it is interrupted.
const DEFAULT_CELL_TIMEOUT_SECS: u64 = 300;
/// Largest cell timeout accepted.
const MAX_CELL_TIMEOUT_SECS: u64 = 24 * 3600;

fn context_of(i: proto::ContextInfo) -> Context {
    Context {
        id: i.id,
        name: i.name,
        language: i.language,
        cwd: i.cwd,
        user: match i.user {
            proto::RunAs::User => User::User,
            proto::RunAs::Root => User::Root,
            // An image's own user (ADR 0160): the context's creator left `user` out.
            proto::RunAs::Id { .. } => User::Default,
        },
        state: match i.state {
            proto::interp::ContextState::Idle => ContextState::Idle,
            proto::interp::ContextState::Busy => ContextState::Busy,
            proto::interp::ContextState::Dead => ContextState::Lost,
        },
        execution_count: i.execution_count,
        generation: i.generation,
        pid: i.pid,
        created_at: rfc3339(i.created_at.saturating_mul(1000)),
        reason: i.reason,
        created: i.created,
        recreated: false,
        lost_reason: None,
    }
}

fn output_of(o: proto::interp::CellOutput) -> CodeOutput {
    CodeOutput {
        data: o.data,
        metadata: o.metadata,
    }
}

fn execution_of(e: proto::Execution) -> CodeExecution {
    use proto::interp::CellStatus as S;
    CodeExecution {
        execution_id: e.execution_id,
        context_id: e.context_id,
        execution_count: e.execution_count,
        context_created: e.context_created,
        status: match e.status {
            S::Ok => CodeStatus::Ok,
            S::Exception => CodeStatus::Exception,
            S::Interrupted => CodeStatus::Interrupted,
            S::TimedOut => CodeStatus::TimedOut,
            S::ContextDied => CodeStatus::ContextDied,
        },
        stdout: e.stdout,
        stderr: e.stderr,
        outputs: e.outputs.into_iter().map(output_of).collect(),
        result: e.result.map(output_of),
        exception: e.exception.map(|x| CodeException {
            name: x.name,
            value: x.value,
            traceback: x.traceback,
        }),
        duration_ms: e.duration_ms,
        truncated: e.truncated,
        context_restarted: e.context_restarted,
        reason: e.reason,
        context_recreated: false,
        lost_reason: None,
    }
}

/// The public event of an agent's one; `None` for the agent's `end` (the final
/// `Executed` makes the public `end`, with the whole summary).
fn event_of(ev: proto::CodeEvent) -> Option<CodeEvent> {
    use proto::CodeEvent as P;
    Some(match ev {
        P::Start {
            execution_id,
            context_id,
            execution_count,
            context_created,
        } => CodeEvent::Start {
            execution_id,
            context_id,
            execution_count,
            context_created,
        },
        P::Stdout { text } => CodeEvent::Stdout { text },
        P::Stderr { text } => CodeEvent::Stderr { text },
        P::Display(o) => CodeEvent::Display {
            data: o.data,
            metadata: o.metadata,
        },
        P::Result(o) => CodeEvent::Result {
            data: o.data,
            metadata: o.metadata,
        },
        P::Exception(e) => CodeEvent::Exception {
            name: e.name,
            value: e.value,
            traceback: e.traceback,
        },
        P::End(_) => return None,
    })
}

fn end_of(e: CodeExecution) -> CodeEvent {
    CodeEvent::End {
        execution_id: e.execution_id,
        context_id: e.context_id,
        execution_count: e.execution_count,
        context_created: e.context_created,
        status: e.status,
        duration_ms: e.duration_ms,
        truncated: e.truncated,
        context_restarted: e.context_restarted,
        reason: e.reason,
        context_recreated: e.context_recreated,
        lost_reason: e.lost_reason,
    }
}

/// What is needed to tell an OOM kill of a worker: the sandbox's OOM counter before the
/// cell (the agent cannot always see the memory cgroup: cgroup v1 memory in hybrid).
struct OomWatch {
    driver: Arc<dyn crate::driver::Driver>,
    row: SandboxRow,
    before: Option<u64>,
    conn: Arc<AgentConn>,
}

impl OomWatch {
    /// A worker that died by SIGKILL while the sandbox's counter went up died of OOM:
    /// the execution says so, and so does the agent's record of the context.
    async fn check(&self, e: &mut CodeExecution) {
        if e.status != CodeStatus::ContextDied || e.reason.as_deref() != Some("killed") {
            return;
        }
        let verdict =
            oom_verdict(self.driver.as_ref(), &self.row, self.before, None, Some(9)).await;
        if verdict.is_some() {
            e.reason = Some("oom".into());
            let req = proto::Request::ContextReason {
                ctx: e.context_id.clone(),
                reason: "oom".into(),
            };
            if let Ok((_, mut rx)) = self.conn.send(req) {
                let _ = rx.recv().await;
            }
        }
    }
}

/// Forwards an agent's execution frames as public events until the end. The first
/// frame was read by the caller (so an early refusal is an HTTP error, not a line).
/// A client that leaves (the receiver is dropped) cancels the agent's request: for an
/// execute that interrupts the cell, for an attach it only stops following.
fn forward_events(
    guard: CancelGuard,
    mut rx: mpsc::UnboundedReceiver<proto::Response>,
    first: CodeEvent,
    inflight: Inflight,
    what: String,
    oom: Option<OomWatch>,
    lost: Option<LostWatch>,
) -> mpsc::Receiver<CodeEvent> {
    let (tx, out) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut guard = guard;
        let _inflight = inflight;
        let ended = matches!(first, CodeEvent::End { .. });
        if tx.send(first).await.is_err() || ended {
            return;
        }
        loop {
            let next = tokio::select! {
                r = rx.recv() => r,
                // The client left while the cell was silent: the guard cancels.
                () = tx.closed() => return,
            };
            let ev = match next {
                Some(proto::Response::Cell(ev)) => match event_of(ev) {
                    Some(ev) => ev,
                    None => continue,
                },
                Some(proto::Response::Executed(e)) => {
                    guard.armed = false;
                    let mut e = execution_of(e);
                    if let Some(w) = &oom {
                        w.check(&mut e).await;
                    }
                    if let Some(l) = &lost {
                        l.check(&mut e).await;
                    }
                    let _ = tx.send(end_of(e)).await;
                    return;
                }
                Some(other) => {
                    guard.armed = false;
                    let e = unexpected(other);
                    e.log(&what);
                    let _ = tx
                        .send(CodeEvent::Error {
                            code: e.code(),
                            message: e.public_message(),
                        })
                        .await;
                    return;
                }
                None => {
                    guard.armed = false;
                    tracing::warn!("{what}: the sandbox's agent went away during the call");
                    let _ = tx
                        .send(CodeEvent::Error {
                            code: ErrorCode::Unavailable,
                            message: "the sandbox's agent went away during the call".into(),
                        })
                        .await;
                    return;
                }
            };
            if tx.send(ev).await.is_err() {
                return;
            }
        }
    });
    out
}

/// The first frame of a streamed execution: its `start`, or the refusal as an error.
async fn first_event(
    guard: &mut CancelGuard,
    rx: &mut mpsc::UnboundedReceiver<proto::Response>,
) -> Result<CodeEvent> {
    loop {
        match rx.recv().await {
            Some(proto::Response::Cell(ev)) => {
                if let Some(ev) = event_of(ev) {
                    return Ok(ev);
                }
            }
            // A finished execution with no events left to replay (not expected: its
            // journal holds at least `start`), or an early end.
            Some(proto::Response::Executed(e)) => {
                guard.armed = false;
                return Ok(end_of(execution_of(e)));
            }
            Some(other) => {
                guard.armed = false;
                return Err(unexpected(other));
            }
            None => {
                guard.armed = false;
                return Err(CoreError::Unavailable(
                    "the sandbox's agent went away during the call".into(),
                ));
            }
        }
    }
}

fn validate_execution_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    {
        return Err(CoreError::InvalidArgument(
            "an execution id is `exe-...` (letters, digits and dashes)".into(),
        ));
    }
    Ok(())
}

fn validate_context_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > 128 || key.contains('\0') {
        return Err(CoreError::InvalidArgument(
            "a context id or name has 1 to 128 characters".into(),
        ));
    }
    Ok(())
}

fn validate_create(r: &CreateContextRequest) -> Result<()> {
    if let Some(name) = &r.name {
        validate_name(name)?;
    }
    if canonical_language(&r.language).is_none() {
        return Err(CoreError::InvalidArgument(format!(
            "language {:?} is not available (one of {})",
            r.language,
            LANGUAGES.join(", ")
        )));
    }
    validate_env(&r.env)?;
    r.cwd.as_deref().map_or(Ok(()), validate_path)
}

fn validate_execute(r: &ExecuteCodeRequest) -> Result<()> {
    if r.code.len() > proto::interp::MAX_CODE {
        return Err(CoreError::TooLarge(format!(
            "code is larger than {} bytes",
            proto::interp::MAX_CODE
        )));
    }
    if matches!(r.timeout_secs, Some(0)) || r.timeout_secs > Some(MAX_CELL_TIMEOUT_SECS) {
        return Err(CoreError::InvalidArgument(format!(
            "timeout_secs must be between 1 and {MAX_CELL_TIMEOUT_SECS}"
        )));
    }
    validate_env(&r.env)
}

impl Manager {
    pub async fn create_context(
        &self,
        caller: &Caller,
        sandbox: &str,
        req: CreateContextRequest,
    ) -> Result<Context> {
        let r = async {
            caller.require(CreateContext::SCOPE)?;
            validate_create(&req)?;
            let mut env = req.env;
            let mut cwd = req.cwd;
            let mut user = run_as(req.user);
            let row = self.resolve(caller, sandbox).await?;
            self.image_run(&row.image)
                .await?
                .apply(&mut env, &mut cwd, req.user, &mut user);
            self.secret_env(&row.id, &mut env).await?;
            let spec = proto::ContextSpec {
                name: req.name,
                // Checked by `validate_create`; the agent knows the canonical names only.
                language: canonical_language(&req.language)
                    .unwrap_or("python")
                    .to_string(),
                cwd,
                env,
                user,
            };
            let name = spec.name.clone();
            let mut c = match self
                .call(caller, sandbox, true, proto::Request::ContextCreate(spec))
                .await?
            {
                proto::Response::Context(i) => context_of(i),
                other => return Err(unexpected(other)),
            };
            if c.created {
                let earlier = self.record_context(&row.id, name.as_deref(), &c).await;
                if let Some(reason) = earlier {
                    c.recreated = true;
                    c.lost_reason = Some(reason);
                }
            }
            Ok(c)
        }
        .await;
        self.audit(caller, CreateContext::NAME, sandbox, &r).await;
        r
    }

    pub async fn list_contexts(&self, caller: &Caller, sandbox: &str) -> Result<ContextList> {
        caller.require(ListContexts::SCOPE)?;
        let row = self.resolve(caller, sandbox).await?;
        let live = match self
            .call(caller, sandbox, false, proto::Request::ContextList)
            .await?
        {
            proto::Response::Contexts { contexts } => contexts,
            other => return Err(unexpected(other)),
        };
        let mut contexts: Vec<Context> = live.into_iter().map(context_of).collect();
        // The agent is the truth for what runs; the store remembers what it lost.
        for lost in self.lost_contexts(&row.id, &contexts).await? {
            contexts.push(lost);
        }
        Ok(ContextList { contexts })
    }

    /// One context, by id or name (from the agent's list: the agent is the truth).
    pub async fn get_context(&self, caller: &Caller, sandbox: &str, ctx: &str) -> Result<Context> {
        caller.require(GetContext::SCOPE)?;
        validate_context_key(ctx)?;
        let all = self.list_contexts(caller, sandbox).await?.contexts;
        let by_id = all.iter().position(|c| c.id == ctx);
        let i = by_id.or_else(|| all.iter().position(|c| c.name == ctx));
        match i {
            Some(i) => Ok(all.into_iter().nth(i).expect("an index of the list")),
            None => Err(CoreError::NotFound(format!("no context {ctx:?}"))),
        }
    }

    pub async fn delete_context(&self, caller: &Caller, sandbox: &str, ctx: &str) -> Result<()> {
        let r = async {
            caller.require(DeleteContext::SCOPE)?;
            validate_context_key(ctx)?;
            let row = self.resolve(caller, sandbox).await?;
            let r = self
                .call_done(
                    caller,
                    sandbox,
                    true,
                    proto::Request::ContextDelete { ctx: ctx.into() },
                )
                .await;
            // Deleted on purpose (or already gone with the agent): not lost.
            if r.is_ok() || matches!(r, Err(CoreError::NotFound(_))) {
                if let Some(s) = self.stored_context(&row.id, ctx).await {
                    let _ = self.store.delete_stored_context(&row.id, &s.name).await;
                    return Ok(());
                }
            }
            r
        }
        .await;
        self.audit(caller, DeleteContext::NAME, sandbox, &r).await;
        r
    }

    pub async fn restart_context(
        &self,
        caller: &Caller,
        sandbox: &str,
        ctx: &str,
    ) -> Result<Context> {
        let r = async {
            caller.require(RestartContext::SCOPE)?;
            validate_context_key(ctx)?;
            match self
                .call(
                    caller,
                    sandbox,
                    true,
                    proto::Request::ContextRestart { ctx: ctx.into() },
                )
                .await?
            {
                proto::Response::Context(i) => Ok(context_of(i)),
                other => Err(unexpected(other)),
            }
        }
        .await;
        self.audit(caller, RestartContext::NAME, sandbox, &r).await;
        r
    }

    pub async fn interrupt_context(
        &self,
        caller: &Caller,
        sandbox: &str,
        ctx: &str,
    ) -> Result<InterruptResult> {
        let r = async {
            caller.require(InterruptContext::SCOPE)?;
            validate_context_key(ctx)?;
            match self
                .call(
                    caller,
                    sandbox,
                    false,
                    proto::Request::ContextInterrupt { ctx: ctx.into() },
                )
                .await?
            {
                proto::Response::Interrupted { interrupted } => Ok(InterruptResult { interrupted }),
                other => Err(unexpected(other)),
            }
        }
        .await;
        self.audit(caller, InterruptContext::NAME, sandbox, &r)
            .await;
        r
    }

    /// Runs a cell to its end. A caller that goes away (the future is dropped) cancels
    /// the request, which interrupts the cell in the agent.
    pub async fn execute_code(
        &self,
        caller: &Caller,
        sandbox: &str,
        ctx: &str,
        req: ExecuteCodeRequest,
    ) -> Result<CodeExecution> {
        let r = async {
            caller.require(ExecuteCode::SCOPE)?;
            validate_context_key(ctx)?;
            validate_execute(&req)?;
            let spec = cell_spec(ctx, req, false);
            // `work`: a running cell counts as in flight (blocks idle auto-pause); an
            // idle context does not, since nothing is in flight between calls.
            let (conn, _inflight, row) = self.running_conn_row(caller, sandbox, true).await?;
            let lost = self.lost_watch(&row.id, ctx).await?;
            let oom = self.oom_watch(&conn, row).await?;
            let (id, mut rx) = conn.send(proto::Request::ContextExecute(spec))?;
            let mut guard = crate::agent::CancelGuard {
                conn: conn.clone(),
                id,
                armed: true,
            };
            loop {
                match rx.recv().await {
                    Some(proto::Response::Executed(e)) => {
                        guard.armed = false;
                        let mut e = execution_of(e);
                        oom.check(&mut e).await;
                        lost.check(&mut e).await;
                        return Ok(e);
                    }
                    Some(proto::Response::Cell(_)) => {}
                    Some(other) => {
                        guard.armed = false;
                        return Err(unexpected(other));
                    }
                    None => {
                        guard.armed = false;
                        return Err(CoreError::Unavailable(
                            "the sandbox's agent went away during the call".into(),
                        ));
                    }
                }
            }
        }
        .await;
        self.audit(caller, ExecuteCode::NAME, sandbox, &r).await;
        r
    }
}

fn cell_spec(ctx: &str, req: ExecuteCodeRequest, stream: bool) -> proto::CellSpec {
    proto::CellSpec {
        ctx: ctx.into(),
        code: req.code,
        env: req.env,
        timeout_ms: Some(
            req.timeout_secs
                .unwrap_or(DEFAULT_CELL_TIMEOUT_SECS)
                .saturating_mul(1000),
        ),
        max_output: req
            .max_output_bytes
            .unwrap_or(proto::DEFAULT_MAX_OUTPUT)
            .min(proto::MAX_OUTPUT_LIMIT),
        stream,
    }
}

impl Manager {
    async fn oom_watch(&self, conn: &Arc<AgentConn>, row: SandboxRow) -> Result<OomWatch> {
        let driver = self.driver_for(&row)?;
        let before = driver.usage(&row.id, false).await.oom_kills;
        Ok(OomWatch {
            driver,
            row,
            before,
            conn: conn.clone(),
        })
    }

    /// Runs a cell and streams its events. Refusals before the cell starts (a busy
    /// context, an unknown one) are errors of the call; later failures are an `error`
    /// event. A client that drops the receiver interrupts the cell.
    pub async fn execute_code_stream(
        &self,
        caller: &Caller,
        sandbox: &str,
        ctx: &str,
        req: ExecuteCodeRequest,
    ) -> Result<mpsc::Receiver<CodeEvent>> {
        let r = async {
            caller.require(ExecuteCode::SCOPE)?;
            validate_context_key(ctx)?;
            validate_execute(&req)?;
            let spec = cell_spec(ctx, req, true);
            let (conn, inflight, row) = self.running_conn_row(caller, sandbox, true).await?;
            let lost = self.lost_watch(&row.id, ctx).await?;
            let oom = self.oom_watch(&conn, row).await?;
            let (id, mut rx) = conn.send(proto::Request::ContextExecute(spec))?;
            let mut guard = crate::agent::CancelGuard {
                conn: conn.clone(),
                id,
                armed: true,
            };
            let first = first_event(&mut guard, &mut rx).await?;
            Ok(forward_events(
                guard,
                rx,
                first,
                inflight,
                format!("code stream in sandbox {sandbox:?}"),
                Some(oom),
                Some(lost),
            ))
        }
        .await;
        self.audit(caller, ExecuteCode::NAME, sandbox, &r).await;
        r
    }

    /// Follows an execution of a context from its first kept event: after a lost
    /// client, or after a daemon restart (the agent kept it). Running cells count as
    /// work while followed, as they do for their own caller.
    pub async fn get_execution(
        &self,
        caller: &Caller,
        sandbox: &str,
        ctx: &str,
        execution: &str,
    ) -> Result<mpsc::Receiver<CodeEvent>> {
        caller.require(GetExecution::SCOPE)?;
        validate_context_key(ctx)?;
        validate_execution_id(execution)?;
        let (conn, inflight) = self.running_conn(caller, sandbox, true).await?;
        let (id, mut rx) = conn.send(proto::Request::ContextAttach {
            ctx: ctx.into(),
            execution: execution.into(),
            from: 0,
        })?;
        let mut guard = crate::agent::CancelGuard {
            conn: conn.clone(),
            id,
            armed: true,
        };
        let first = first_event(&mut guard, &mut rx).await?;
        Ok(forward_events(
            guard,
            rx,
            first,
            inflight,
            format!("execution {execution:?} in sandbox {sandbox:?}"),
            None,
            None,
        ))
    }
}

/// Run code in a context and stream its events (`execute/stream`); the last one is
/// `end` or `error`. A client that goes away interrupts the cell.
#[derive(Debug, Clone)]
pub struct ExecuteCodeStream(pub ExecuteCode);

impl Operation for ExecuteCodeStream {
    type Output = mpsc::Receiver<CodeEvent>;
    const NAME: &'static str = ExecuteCode::NAME;
    const SCOPE: Scope = ExecuteCode::SCOPE;
    const METHOD: ops::HttpMethod = ops::HttpMethod::Post;
    const PATH: &'static str = routes::CONTEXT_EXECUTE_STREAM;
}

impl Run for ExecuteCodeStream {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Self::Output> {
        let e = self.0;
        m.execute_code_stream(caller, &e.sandbox, &e.context, e.request)
            .await
    }
}

/// Follow an execution (`GET .../executions/{execution}`): the events kept (a bounded
/// number of recent executions per sandbox), then the new ones to its `end`. Leaving
/// does not interrupt the cell.
#[derive(Debug, Clone)]
pub struct GetExecution {
    pub sandbox: String,
    pub context: String,
    pub execution: String,
}

impl Operation for GetExecution {
    type Output = mpsc::Receiver<CodeEvent>;
    const NAME: &'static str = "code.execution";
    const SCOPE: Scope = Scope::SandboxesRead;
    const METHOD: ops::HttpMethod = ops::HttpMethod::Get;
    const PATH: &'static str = routes::CONTEXT_EXECUTION;
    fn path_values(&self) -> Vec<String> {
        vec![
            self.sandbox.clone(),
            self.context.clone(),
            self.execution.clone(),
        ]
    }
}

impl Run for GetExecution {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Self::Output> {
        m.get_execution(caller, &self.sandbox, &self.context, &self.execution)
            .await
    }
}

impl Run for CreateContext {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Context> {
        m.create_context(caller, &self.sandbox, self.request).await
    }
}

impl Run for ListContexts {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<ContextList> {
        m.list_contexts(caller, &self.sandbox).await
    }
}

impl Run for GetContext {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Context> {
        m.get_context(caller, &self.sandbox, &self.context).await
    }
}

impl Run for DeleteContext {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<()> {
        m.delete_context(caller, &self.sandbox, &self.context).await
    }
}

impl Run for RestartContext {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Context> {
        m.restart_context(caller, &self.sandbox, &self.context)
            .await
    }
}

impl Run for InterruptContext {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<InterruptResult> {
        m.interrupt_context(caller, &self.sandbox, &self.context)
            .await
    }
}

impl Run for ExecuteCode {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<CodeExecution> {
        m.execute_code(caller, &self.sandbox, &self.context, self.request)
            .await
    }
}
