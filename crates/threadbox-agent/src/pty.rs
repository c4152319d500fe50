//! Terminal sessions (ADR 0092): a process on a new pty, under the same policy as an
//! exec (its own cgroup, the user, Landlock, seccomp), with the pty's peer as its stdio
//! and controlling terminal. The session streams the terminal's output, takes input and
//! size changes by pid (`PtyInput`, `PtyResize`), and ends with the process: then
//! whatever is left of its tree is killed, as a hangup would, and the exit is reported.

use crate::agent::{self, Agent, CallCgroup};
use crate::error::{AgentError, Result};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::rc::Rc;
use std::time::{Duration, Instant};
use threadbox_proto::pty::MAX_TERMINAL_SIDE;
use threadbox_proto::{ErrorKind, ExecResult, Frame, PtySpec, Response, Stream, CHUNK};
use threadbox_sys::child::{self as syschild, WaitStatus};
use threadbox_sys::process::pty as syspty;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, oneshot};

/// After the process exits, the terminal's last output is read this long at most.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(250);
/// Input requests queued for one session before `PtyInput` waits (flow control).
const INPUT_BACKLOG: usize = 16;

/// What the input and resize requests send to their session.
pub enum PtyCtl {
    Input(Vec<u8>),
    Resize { rows: u16, cols: u16 },
}

fn check_size(rows: u16, cols: u16) -> Result<()> {
    if rows == 0 || cols == 0 || rows > MAX_TERMINAL_SIDE || cols > MAX_TERMINAL_SIDE {
        return Err(AgentError::invalid(format!(
            "a terminal is 1 to {MAX_TERMINAL_SIDE} rows and columns, not {rows}x{cols}"
        )));
    }
    Ok(())
}

/// Starts the process on a new terminal; returns its pid and the master.
fn spawn(agent: &Agent, spec: &PtySpec) -> Result<(i32, File, Option<String>)> {
    check_size(spec.rows, spec.cols)?;
    let mut env = spec.env.clone();
    env.entry("TERM".into())
        .or_insert_with(|| "xterm-256color".into());
    let mut prepared = agent::prepare(
        &agent.root,
        &spec.command,
        &env,
        spec.cwd.as_deref(),
        spec.user,
    )?;
    let who = prepared.who;
    let pty = syspty::open_pty(spec.rows, spec.cols, Some((who.uid, who.gid)))
        .map_err(|e| AgentError::internal(format!("could not open a terminal: {e}")))?;
    let cg = agent.new_cgroup("pty")?;
    let cgroup = cg.as_ref().map(|c: &CallCgroup| c.name.clone());
    let fail = |e: AgentError| {
        if let Some(name) = &cgroup {
            agent.release_cgroup(name.clone());
        }
        e
    };
    let Some(cwd) = prepared.cwd.take() else {
        return Err(fail(AgentError::internal(
            "the working directory was not resolved",
        )));
    };
    let mut policy = agent.child_policy(&who, cwd, None).map_err(&fail)?;
    let direct = match &cg {
        // gVisor's v1 hierarchy (ADR 0214): no clone3 into it.
        Some(_) if agent.cgroup_v1 => None,
        Some(c) => match syschild::spawn_on_terminal(
            &prepared.cmd,
            Some(c.dir.as_fd()),
            &policy,
            pty.peer.as_fd(),
        ) {
            Err(e) if syschild::clone3_unavailable(&e) => None,
            other => Some(other),
        },
        None => None,
    };
    let started = match direct {
        Some(r) => r,
        None => {
            if let Some(name) = &cgroup {
                policy.cgroup_procs = agent.cgroup_procs(name).map_err(&fail)?;
            }
            syschild::spawn_on_terminal(&prepared.cmd, None, &policy, pty.peer.as_fd())
        }
    };
    drop(policy);
    let pid =
        started.map_err(|e| fail(spawn_error(&e, &crate::exec::program_name(&spec.command))))?;
    // The session sees EIO on the master once the child's copies close: the agent's own
    // peer must not keep the terminal open.
    drop(pty.peer);
    Ok((pid, File::from(pty.master), cgroup))
}

fn spawn_error(e: &io::Error, program: &str) -> AgentError {
    match e.raw_os_error() {
        Some(libc::ENOENT) => {
            AgentError::new(ErrorKind::NotFound, format!("command not found: {program}"))
        }
        Some(libc::EACCES) | Some(libc::EPERM) => AgentError::new(
            ErrorKind::PermissionDenied,
            format!("permission denied: {program}"),
        ),
        _ => AgentError::internal(format!("could not start {program} on a terminal: {e}")),
    }
}

/// Runs one `PtyStart` request: `Started`, `Output` frames, then the final `Exited`.
pub async fn start(
    agent: Rc<Agent>,
    id: u64,
    spec: PtySpec,
    tx: mpsc::Sender<Frame>,
    mut cancel: oneshot::Receiver<()>,
) -> Response {
    let started = Instant::now();
    let (pid, master, cgroup) = match spawn(&agent, &spec) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    // No `.await` since the fork: the reaper cannot have taken the status yet.
    let mut exit = agent.wait_for(pid);
    // Sessions are named by the sandbox's view of the pid (ADR 0218), as `$$` inside says.
    let session = syschild::pidns::view(pid);
    let (ctl_tx, mut ctl) = mpsc::channel::<PtyCtl>(INPUT_BACKLOG);
    agent.ptys.borrow_mut().insert(session, ctl_tx);
    // `new` is deprecated because a `T: AsRawFd` need not own its descriptor; a `File`
    // does, and it lives inside the `AsyncFd` until both are dropped, which is the
    // soundness `register` (unsafe, and this crate forbids unsafe) asks the caller for.
    #[allow(deprecated)]
    let master = match AsyncFd::new(master) {
        Ok(m) => m,
        Err(e) => {
            agent.ptys.borrow_mut().remove(&session);
            agent.kill_tree(cgroup.as_deref(), pid);
            if let Some(name) = cgroup {
                agent.release_cgroup(name);
            }
            return AgentError::internal(format!("could not watch the terminal: {e}"))
                .into_response();
        }
    };
    let _ = tx
        .send(Frame::Response {
            id,
            resp: Response::Started { pid: session },
        })
        .await;

    let mut buf = vec![0u8; CHUNK];
    let mut input: VecDeque<u8> = VecDeque::new();
    let mut status: Option<WaitStatus> = None;
    let mut exited = false;
    let mut cancelled = false;
    let mut cancel_open = true;
    let mut drain_until: Option<tokio::time::Instant> = None;
    let far = || tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
    loop {
        tokio::select! {
            biased;
            r = &mut cancel, if cancel_open && !exited => {
                cancel_open = false;
                // A closed channel is a connection that went away: nobody can reach the
                // session's output any more (it is tied to its request), so it ends too.
                let _ = r;
                cancelled = true;
                agent.kill_tree(cgroup.as_deref(), pid);
                drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            }
            st = &mut exit, if !exited => {
                exited = true;
                status = st.ok();
                // The session is over: what the shell left behind on its terminal goes
                // too (a hangup), so its output ends and the master reports EIO.
                agent.kill_tree(cgroup.as_deref(), pid);
                drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
            }
            _ = tokio::time::sleep_until(drain_until.unwrap_or_else(far)), if drain_until.is_some() => break,
            c = ctl.recv(), if input.is_empty() && drain_until.is_none() => match c {
                Some(PtyCtl::Input(data)) => input.extend(data),
                Some(PtyCtl::Resize { rows, cols }) => {
                    let _ = syspty::resize(master.get_ref().as_fd(), rows, cols);
                }
                None => {}
            },
            w = master.writable(), if !input.is_empty() && drain_until.is_none() => {
                let Ok(mut guard) = w else { input.clear(); continue };
                let (front, _) = input.as_slices();
                let chunk = front.len().min(CHUNK);
                match guard.try_io(|f| f.get_ref().write(&input.as_slices().0[..chunk])) {
                    Ok(Ok(n)) => { input.drain(..n); }
                    // EIO: the terminal is gone; the exit comes next.
                    Ok(Err(_)) => input.clear(),
                    Err(_would_block) => {}
                }
            }
            r = master.readable() => {
                let Ok(mut guard) = r else { break };
                match guard.try_io(|f| f.get_ref().read(&mut buf)) {
                    Ok(Ok(0)) | Ok(Err(_)) => {
                        // EIO: every copy of the peer is closed. The exit status may
                        // still be on its way.
                        if exited || cancelled {
                            break;
                        }
                        match (&mut exit).await {
                            Ok(st) => status = Some(st),
                            Err(_) => status = None,
                        }
                        exited = true;
                        agent.kill_tree(cgroup.as_deref(), pid);
                        break;
                    }
                    Ok(Ok(n)) => {
                        let frame = Frame::Response {
                            id,
                            resp: Response::Output { stream: Stream::Stdout, data: buf[..n].to_vec() },
                        };
                        // Waiting here is the flow control: a slow viewer stops the
                        // reads, and the program blocks on a full terminal.
                        if tx.send(frame).await.is_err() && !exited {
                            cancelled = true;
                            agent.kill_tree(cgroup.as_deref(), pid);
                            drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
                        }
                    }
                    Err(_would_block) => {}
                }
            }
        }
    }
    agent.ptys.borrow_mut().remove(&session);
    if let Some(name) = cgroup {
        agent.release_cgroup(name);
    }
    if cancelled && !exited {
        return AgentError::new(ErrorKind::Cancelled, "the session was cancelled").into_response();
    }
    let (exit_code, signal) = crate::exec::exit_fields(status);
    Response::Exited(ExecResult {
        exit_code,
        signal,
        duration_ms: started.elapsed().as_millis() as u64,
        ..Default::default()
    })
}

/// `PtyInput`: queues bytes for the session's terminal.
pub async fn input(agent: &Agent, pid: i32, data: Vec<u8>) -> Response {
    let tx = agent.ptys.borrow().get(&pid).cloned();
    match tx {
        Some(tx) if tx.send(PtyCtl::Input(data)).await.is_ok() => Response::Done,
        _ => not_found(pid),
    }
}

/// `PtyResize`: a new size for the session's terminal.
pub async fn resize(agent: &Agent, pid: i32, rows: u16, cols: u16) -> Response {
    if let Err(e) = check_size(rows, cols) {
        return e.into_response();
    }
    let tx = agent.ptys.borrow().get(&pid).cloned();
    match tx {
        Some(tx) if tx.send(PtyCtl::Resize { rows, cols }).await.is_ok() => Response::Done,
        _ => not_found(pid),
    }
}

fn not_found(pid: i32) -> Response {
    AgentError::new(ErrorKind::NotFound, format!("no terminal session {pid}")).into_response()
}
