//! Terminal sessions (issue 17 scope 4, ADR 0092): a process on a pty in a sandbox,
//! watched by any number of viewers and typed into by those granted it.
//!
//! A session starts its program when it is opened (`POST .../pty`), so nothing it prints
//! before the first viewer is lost: the last [`REPLAY_BYTES`] of output are kept and
//! replayed to every viewer on attach, then the live output follows. Replay and live
//! output are taken under one lock, so a viewer sees each byte once and in order.
//!
//! Who types: the key that opened the session, always; another key of the tenant with
//! `sandboxes:write` only when the session was opened with `shared_write` and it asks
//! (`?write=1`); everyone else who may read the sandbox watches. A viewer that falls
//! behind the live output by more than [`VIEWER_BACKLOG`] chunks is dropped (its socket
//! is closed with an error) instead of slowing the program for everyone.
//!
//! The session ends with its program (the agent then kills what is left of its tree) or
//! with the sandbox (stop, delete: the agent's connection closes). An ended session is
//! kept [`ENDED_KEPT`] so a viewer that attaches late (a command that was quick) still
//! gets the output and the exit code.

use super::*;
use std::collections::VecDeque;
use threadbox_api::pty::{OpenPty, PtyRequest, PtySession};
use tokio::sync::broadcast;

/// Output kept for replay on attach.
pub const REPLAY_BYTES: usize = 64 * 1024;
/// Chunks of live output a viewer may be behind before it is dropped.
pub const VIEWER_BACKLOG: usize = 1024;
/// How long an ended session stays attachable.
pub const ENDED_KEPT: Duration = Duration::from_secs(60);
/// Open sessions per sandbox.
pub const MAX_SESSIONS_PER_SANDBOX: usize = 16;

const DEFAULT_SHELL: &str =
    "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi";

/// What viewers receive after the replay.
#[derive(Debug, Clone)]
pub enum PtyEvent {
    Output(Arc<[u8]>),
    /// The program ended (128 + signal for a signal).
    Exit(i32),
    /// The session ended without an exit code (the sandbox stopped, the agent went away).
    Error(String),
}

struct Shared {
    replay: VecDeque<u8>,
    /// The last event, once the session is over.
    end: Option<PtyEvent>,
}

/// One terminal session.
pub struct PtySessionHandle {
    pub id: String,
    pub sandbox_id: String,
    pub tenant: String,
    /// The key that opened it (`None`: the operator).
    pub creator: Option<String>,
    pub shared_write: bool,
    pub pid: i32,
    conn: Arc<AgentConn>,
    state: Mutex<Shared>,
    events: broadcast::Sender<PtyEvent>,
}

/// A viewer's view of a session.
pub struct PtyViewer {
    pub session: Arc<PtySessionHandle>,
    /// Output before the attach (at most [`REPLAY_BYTES`]).
    pub replay: Vec<u8>,
    /// Live events; `None` when the session had ended already (see `ended`).
    pub events: Option<broadcast::Receiver<PtyEvent>>,
    pub ended: Option<PtyEvent>,
    /// Whether this viewer's input reaches the terminal.
    pub write: bool,
}

impl PtySessionHandle {
    fn push(&self, ev: PtyEvent) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match &ev {
            PtyEvent::Output(b) => {
                s.replay.extend(b.iter());
                let over = s.replay.len().saturating_sub(REPLAY_BYTES);
                s.replay.drain(..over);
            }
            PtyEvent::Exit(_) | PtyEvent::Error(_) => s.end = Some(ev.clone()),
        }
        // Under the lock, so an attach sees this either in its replay or live.
        let _ = self.events.send(ev);
    }

    pub fn ended(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .end
            .is_some()
    }

    /// Types `data` into the terminal (for a viewer allowed to).
    pub async fn input(&self, data: Vec<u8>) -> Result<()> {
        match self
            .conn
            .call(proto::Request::PtyInput {
                pid: self.pid,
                data,
            })
            .await?
        {
            proto::Response::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Resizes the terminal.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<()> {
        check_size(cols, rows)?;
        match self
            .conn
            .call(proto::Request::PtyResize {
                pid: self.pid,
                cols,
                rows,
            })
            .await?
        {
            proto::Response::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

fn check_size(cols: u16, rows: u16) -> Result<()> {
    let max = proto::pty::MAX_TERMINAL_SIDE;
    if cols == 0 || rows == 0 || cols > max || rows > max {
        return Err(CoreError::InvalidArgument(format!(
            "cols and rows must be 1 to {max}, not {cols}x{rows}"
        )));
    }
    Ok(())
}

/// The sessions of this daemon, by id.
#[derive(Default)]
pub(crate) struct PtySessions {
    map: Mutex<HashMap<String, Arc<PtySessionHandle>>>,
}

impl PtySessions {
    fn get(&self, id: &str) -> Option<Arc<PtySessionHandle>> {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    fn open_for(&self, sandbox_id: &str) -> usize {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| s.sandbox_id == sandbox_id && !s.ended())
            .count()
    }
}

fn pty_spec(req: &PtyRequest) -> Result<proto::PtySpec> {
    check_size(req.cols, req.rows)?;
    validate_env(&req.env)?;
    let command = match &req.cmd {
        Some(argv) if argv.is_empty() || argv[0].is_empty() => {
            return Err(CoreError::InvalidArgument("cmd must not be empty".into()))
        }
        Some(argv) => proto::Command::Argv(argv.clone()),
        None => proto::Command::Argv(vec!["/bin/sh".into(), "-c".into(), DEFAULT_SHELL.into()]),
    };
    Ok(proto::PtySpec {
        command,
        env: req.env.clone(),
        cwd: req.cwd.clone(),
        user: run_as(req.user),
        cols: req.cols,
        rows: req.rows,
    })
}

impl Manager {
    /// Opens a terminal session in a sandbox (resuming it when paused).
    pub async fn open_pty(&self, caller: &Caller, op: OpenPty) -> Result<PtySession> {
        let r = self.open_pty_inner(caller, &op).await;
        self.audit(caller, OpenPty::NAME, &op.sandbox, &r).await;
        r
    }

    async fn open_pty_inner(&self, caller: &Caller, op: &OpenPty) -> Result<PtySession> {
        caller.require(OpenPty::SCOPE)?;
        // Checked before the sandbox is touched.
        pty_spec(&op.request)?;
        let (conn, inflight, row) = self.running_conn_row(caller, &op.sandbox, true).await?;
        if !conn.peer.capabilities.iter().any(|c| c == "pty") {
            return Err(CoreError::PreconditionFailed(
                "this sandbox's agent has no terminal support (recreate the sandbox)".into(),
            ));
        }
        if self.ptys.open_for(&row.id) >= MAX_SESSIONS_PER_SANDBOX {
            return Err(CoreError::Conflict(format!(
                "the sandbox has {MAX_SESSIONS_PER_SANDBOX} terminal sessions open already"
            )));
        }
        let mut spec = pty_spec(&op.request)?;
        self.image_run(&row.image).await?.apply(
            &mut spec.env,
            &mut spec.cwd,
            op.request.user,
            &mut spec.user,
        );
        crate::telemetry::inject_env(&mut spec.env);
        self.secret_env(&row.id, &mut spec.env).await?;
        self.relay_env(&row, &mut spec.env);
        let (req_id, mut rx) = conn.send(proto::Request::PtyStart(spec))?;
        let mut guard = CancelGuard {
            conn: conn.clone(),
            id: req_id,
            armed: true,
        };
        let pid = match rx.recv().await {
            Some(proto::Response::Started { pid }) => pid,
            Some(other) => {
                guard.armed = false;
                return Err(unexpected(other));
            }
            None => {
                guard.armed = false;
                return Err(CoreError::Unavailable(
                    "the sandbox's agent went away while starting the terminal".into(),
                ));
            }
        };
        let (events, _) = broadcast::channel(VIEWER_BACKLOG);
        let session = Arc::new(PtySessionHandle {
            id: format!("pty-{}", uuid::Uuid::new_v4().simple()),
            sandbox_id: row.id.clone(),
            tenant: row.tenant.clone(),
            creator: caller.key_id.clone(),
            shared_write: op.request.shared_write,
            pid,
            conn: conn.clone(),
            state: Mutex::new(Shared {
                replay: VecDeque::new(),
                end: None,
            }),
            events,
        });
        self.ptys
            .map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.id.clone(), session.clone());
        let pump = session.clone();
        let sessions = Arc::downgrade(&self.ptys);
        tokio::spawn(async move {
            // An open terminal is activity: the sandbox is not paused for idleness
            // while its session lives.
            let _inflight = inflight;
            let _guard = guard;
            let end = loop {
                match rx.recv().await {
                    Some(proto::Response::Output { data, .. }) => {
                        pump.push(PtyEvent::Output(data.into()))
                    }
                    Some(proto::Response::Started { .. }) => {}
                    Some(proto::Response::Exited(r)) => {
                        break PtyEvent::Exit(r.exit_code.unwrap_or(-1));
                    }
                    Some(other) => break PtyEvent::Error(unexpected(other).public_message()),
                    None => {
                        break PtyEvent::Error("the sandbox stopped; the session is over".into())
                    }
                }
            };
            pump.push(end);
            tokio::time::sleep(ENDED_KEPT).await;
            if let Some(s) = sessions.upgrade() {
                s.map
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&pump.id);
            }
        });
        Ok(PtySession {
            session: session.id.clone(),
            sandbox: row.id,
            pid,
            shared_write: op.request.shared_write,
        })
    }

    /// Attaches a viewer to a session of `sandbox` (id or name). `want_write`: `None`
    /// for the default (the opener types, others watch), `Some(true)` to ask to type,
    /// `Some(false)` to watch only.
    pub async fn attach_pty(
        &self,
        caller: &Caller,
        sandbox: &str,
        session: &str,
        want_write: Option<bool>,
    ) -> Result<PtyViewer> {
        let r = self
            .attach_pty_inner(caller, sandbox, session, want_write)
            .await;
        let target = format!("{sandbox}/{session}");
        self.audit(caller, "sandbox.pty.attach", &target, &r).await;
        r
    }

    async fn attach_pty_inner(
        &self,
        caller: &Caller,
        sandbox: &str,
        session: &str,
        want_write: Option<bool>,
    ) -> Result<PtyViewer> {
        caller.require(Scope::SandboxesRead)?;
        let row = self.resolve(caller, sandbox).await?;
        let not_found = || CoreError::NotFoundOther(format!("no terminal session {session:?}"));
        let s = self.ptys.get(session).ok_or_else(not_found)?;
        // Tenancy: the session must be of this very sandbox, which the caller sees.
        if s.sandbox_id != row.id || s.tenant != row.tenant {
            return Err(not_found());
        }
        let may_write = caller.has(Scope::SandboxesWrite);
        let is_creator = caller.key_id == s.creator;
        let write = match want_write {
            Some(false) => false,
            None => is_creator && may_write,
            Some(true) if is_creator && may_write => true,
            Some(true) if s.shared_write && may_write => true,
            Some(true) => {
                return Err(CoreError::PermissionDenied(
                    "only the key that opened this session may type into it, unless it was \
                     opened with shared_write (and the key has sandboxes:write)"
                        .into(),
                ))
            }
        };
        let st = s.state.lock().unwrap_or_else(|p| p.into_inner());
        let replay: Vec<u8> = st.replay.iter().copied().collect();
        let (events, ended) = match &st.end {
            Some(end) => (None, Some(end.clone())),
            None => (Some(s.events.subscribe()), None),
        };
        drop(st);
        Ok(PtyViewer {
            session: s,
            replay,
            events,
            ended,
            write,
        })
    }
}

impl crate::ops::Run for OpenPty {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<PtySession> {
        m.open_pty(caller, self).await
    }
}
