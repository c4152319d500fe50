//! Interpreter contexts (issue 15, ADR 0080): the manager's side is thin; the agent keeps
//! the contexts (they are its children, so they survive pause/resume and a daemon
//! restart) and this module maps the operations onto its requests.

use super::*;
use crate::ops::Run;
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
        },
        state: match i.state {
            proto::interp::ContextState::Idle => ContextState::Idle,
            proto::interp::ContextState::Busy => ContextState::Busy,
            proto::interp::ContextState::Dead => ContextState::Dead,
        },
        execution_count: i.execution_count,
        generation: i.generation,
        pid: i.pid,
        created_at: rfc3339(i.created_at.saturating_mul(1000)),
        reason: i.reason,
        created: i.created,
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
    }
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
    if r.language != "python" {
        return Err(CoreError::InvalidArgument(format!(
            "language {:?} is not available (only \"python\" for now)",
            r.language
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
            let row = self.resolve(caller, sandbox).await?;
            self.secret_env(&row.id, &mut env).await?;
            let spec = proto::ContextSpec {
                name: req.name,
                language: req.language,
                cwd: req.cwd,
                env,
                user: run_as(req.user),
            };
            match self
                .call(caller, sandbox, true, proto::Request::ContextCreate(spec))
                .await?
            {
                proto::Response::Context(i) => Ok(context_of(i)),
                other => Err(unexpected(other)),
            }
        }
        .await;
        self.audit(caller, CreateContext::NAME, sandbox, &r).await;
        r
    }

    pub async fn list_contexts(&self, caller: &Caller, sandbox: &str) -> Result<ContextList> {
        caller.require(ListContexts::SCOPE)?;
        match self
            .call(caller, sandbox, false, proto::Request::ContextList)
            .await?
        {
            proto::Response::Contexts { contexts } => Ok(ContextList {
                contexts: contexts.into_iter().map(context_of).collect(),
            }),
            other => Err(unexpected(other)),
        }
    }

    pub async fn delete_context(&self, caller: &Caller, sandbox: &str, ctx: &str) -> Result<()> {
        let r = async {
            caller.require(DeleteContext::SCOPE)?;
            validate_context_key(ctx)?;
            self.call_done(
                caller,
                sandbox,
                true,
                proto::Request::ContextDelete { ctx: ctx.into() },
            )
            .await
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
            let spec = proto::CellSpec {
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
                stream: false,
            };
            // `work`: a running cell counts as in flight (blocks idle auto-pause); an
            // idle context does not, since nothing is in flight between calls.
            let (conn, _inflight) = self.running_conn(caller, sandbox, true).await?;
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
                        return Ok(execution_of(e));
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
