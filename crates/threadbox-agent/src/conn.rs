//! One host connection: handshake, then requests handled concurrently (each in its own
//! local task), responses funnelled through one writer task. Connections are independent;
//! the host may reconnect at any time (daemon restart) and may hold several at once.

use crate::agent::Agent;
use crate::error::AgentError;
use crate::{background, exec, files, interp, log, pty, selftest};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use threadbox_proto::{encode_frame, ErrorKind, Frame, FrameDecoder, Hello, Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};

pub const CAPABILITIES: &[&str] = &[
    "exec",
    "stream",
    "background",
    "files",
    "selftest",
    "interpreter",
    "pty",
];

/// Frames queued for the writer; producers wait when it is full (flow control).
const OUTBOX: usize = 64;

type Cancels = Rc<RefCell<HashMap<u64, oneshot::Sender<()>>>>;

pub async fn serve(agent: Rc<Agent>, stream: UnixStream) {
    let (mut rd, wr) = stream.into_split();
    let (tx, rx) = mpsc::channel::<Frame>(OUTBOX);
    let mut quiesced = agent.quiesce.subscribe();
    let writer = tokio::task::spawn_local(write_frames(wr, rx, agent.quiesce.subscribe()));
    let software = format!("threadbox-agent {}", env!("CARGO_PKG_VERSION"));
    let _ = tx
        .send(Frame::Hello(Hello::ours(&software, CAPABILITIES)))
        .await;

    let cancels: Cancels = Rc::new(RefCell::new(HashMap::new()));
    let mut decoder = FrameDecoder::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut greeted = false;
    'conn: loop {
        let read = tokio::select! {
            r = rd.read(&mut buf) => r,
            // A memory checkpoint is coming: this connection must not exist during it.
            _ = quiesced.changed() => break,
        };
        let n = match read {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                log(&format!("connection read: {e}"));
                break;
            }
        };
        decoder.feed(&buf[..n]);
        loop {
            let frame = match decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    log(&format!("closing a connection: {e}"));
                    break 'conn;
                }
            };
            match frame {
                Frame::Hello(h) => {
                    if let Err(e) = h.check() {
                        log(&format!("refusing peer {:?}: {e}", h.software));
                        break 'conn;
                    }
                    greeted = true;
                }
                _ if !greeted => {
                    log("closing a connection that did not start with Hello");
                    break 'conn;
                }
                Frame::Request { id, req } => dispatch(&agent, &tx, &cancels, id, req),
                Frame::Cancel { id } => {
                    if let Some(c) = cancels.borrow_mut().remove(&id) {
                        let _ = c.send(());
                    }
                }
                Frame::Response { .. } => log("ignoring a response frame from the host"),
            }
        }
    }
    // Calls in flight go on (their timeouts still apply); their results are dropped. The
    // writer ends once every task holding a sender has finished.
    cancels.borrow_mut().clear();
    drop(tx);
    // The socket's descriptor closes, its event-loop registration is leaked: see
    // `close_leaking_owner` (a late event of a host socket under gVisor, ADR 0196).
    if let Ok(wr) = writer.await {
        if let Ok(stream) = rd.reunite(wr) {
            threadbox_sys::fs::close_leaking_owner(stream);
        }
    }
}

async fn write_frames(
    mut wr: tokio::net::unix::OwnedWriteHalf,
    mut rx: mpsc::Receiver<Frame>,
    mut quiesced: tokio::sync::watch::Receiver<crate::agent::Quiesce>,
) -> tokio::net::unix::OwnedWriteHalf {
    loop {
        let frame = tokio::select! {
            biased;
            f = rx.recv() => match f {
                Some(f) => f,
                None => return wr,
            },
            // Quiescing: what is queued (the `Prepared` answer) still goes out, then the
            // socket closes even though calls in flight hold senders.
            _ = quiesced.changed() => {
                while let Ok(frame) = rx.try_recv() {
                    if let Ok(bytes) = encode_frame(&frame) {
                        if wr.write_all(&bytes).await.is_err() {
                            break;
                        }
                    }
                }
                let _ = wr.flush().await;
                return wr;
            }
        };
        let bytes = match encode_frame(&frame) {
            Ok(b) => b,
            Err(e) => {
                let Frame::Response { id, .. } = frame else {
                    log(&format!("dropping a frame that cannot be encoded: {e}"));
                    continue;
                };
                let resp = AgentError::internal(format!("the response could not be sent: {e}"))
                    .into_response();
                match encode_frame(&Frame::Response { id, resp }) {
                    Ok(b) => b,
                    Err(_) => continue,
                }
            }
        };
        if wr.write_all(&bytes).await.is_err() {
            // The host went away; keep draining so senders never block on a dead peer.
            while rx.recv().await.is_some() {}
            return wr;
        }
    }
}

fn dispatch(agent: &Rc<Agent>, tx: &mpsc::Sender<Frame>, cancels: &Cancels, id: u64, req: Request) {
    let (cancel_tx, cancel_rx) = oneshot::channel();
    {
        let mut c = cancels.borrow_mut();
        if c.contains_key(&id) {
            let tx = tx.clone();
            let resp =
                AgentError::invalid(format!("request id {id} is already in use")).into_response();
            tokio::task::spawn_local(async move {
                let _ = tx.send(Frame::Response { id, resp }).await;
            });
            return;
        }
        c.insert(id, cancel_tx);
    }
    let agent = agent.clone();
    let tx = tx.clone();
    let cancels = cancels.clone();
    let prepare = match req {
        Request::PrepareCheckpoint { rebind_after_ms } => Some(rebind_after_ms),
        _ => None,
    };
    tokio::task::spawn_local(async move {
        let resp = handle(agent.clone(), id, req, tx.clone(), cancel_rx).await;
        cancels.borrow_mut().remove(&id);
        let prepared = resp == Response::Prepared;
        let _ = tx.send(Frame::Response { id, resp }).await;
        if let (Some(rebind_after_ms), true) = (prepare, prepared) {
            // The answer is queued: now the listener and every connection close.
            agent.quiesce.send_modify(|q| {
                q.generation += 1;
                q.rebind_after_ms = rebind_after_ms;
            });
        }
    });
}

async fn handle(
    agent: Rc<Agent>,
    id: u64,
    req: Request,
    tx: mpsc::Sender<Frame>,
    cancel: oneshot::Receiver<()>,
) -> Response {
    let done = |r: Result<Response, AgentError>| r.unwrap_or_else(AgentError::into_response);
    match req {
        Request::Ping => Response::Pong,
        Request::Exec(spec) => exec::exec(agent, id, spec, tx, cancel).await,
        Request::BackgroundStart(spec) => done(background::start_background(&agent, spec)),
        Request::BackgroundList => background::list_background(&agent),
        Request::BackgroundLogs { bg_id } => done(background::background_logs(&agent, bg_id)),
        Request::BackgroundKill { bg_id, signal } => {
            done(background::kill_background(&agent, bg_id, signal))
        }
        Request::FileRead {
            path,
            user,
            offset,
            limit,
        } => done(files::read(&agent, &path, user, offset, limit).await),
        Request::FileWrite {
            path,
            user,
            data,
            append,
            mode,
            make_parents,
        } => done(files::write(&agent, &path, user, &data, append, mode, make_parents).await),
        Request::FileList { path, user } => done(files::list(&agent, &path, user).await),
        Request::FileStat { path, user } => done(files::stat(&agent, &path, user)),
        Request::Mkdir {
            path,
            user,
            parents,
        } => done(files::mkdir(&agent, &path, user, parents)),
        Request::Remove {
            path,
            user,
            recursive,
        } => done(files::remove(&agent, &path, user, recursive).await),
        Request::Rename { from, to, user } => done(files::rename(&agent, &from, &to, user)),
        Request::Selftest => selftest::selftest(agent).await,
        Request::Stats => Response::Stats {
            processes: selftest::count_processes(),
        },
        Request::ContextCreate(spec) => done(interp::create(&agent, spec).await),
        Request::ContextList => interp::list(&agent),
        Request::ContextDelete { ctx } => done(interp::delete(&agent, &ctx)),
        Request::ContextRestart { ctx } => done(interp::restart(&agent, &ctx).await),
        Request::ContextInterrupt { ctx } => done(interp::interrupt(&agent, &ctx)),
        Request::ContextExecute(spec) => interp::execute(agent, id, spec, tx, cancel).await,
        Request::ContextAttach {
            ctx,
            execution,
            from,
        } => interp::attach(agent, id, ctx, execution, from, tx, cancel).await,
        Request::ContextReason { ctx, reason } => interp::set_reason(&agent, &ctx, reason),
        Request::PrepareCheckpoint { .. } => prepare_checkpoint(&agent),
        Request::PtyStart(spec) => pty::start(agent, id, spec, tx, cancel).await,
        Request::PtyInput { pid, data } => pty::input(&agent, pid, data).await,
        Request::PtyResize { pid, cols, rows } => pty::resize(&agent, pid, rows, cols).await,
        #[allow(unreachable_patterns)]
        _ => AgentError::new(
            ErrorKind::InvalidArgument,
            "this agent does not know the request",
        )
        .into_response(),
    }
}

/// `PrepareCheckpoint`: only an agent that bound its own listener can bind it again; what
/// the sandbox wrote reaches the host's files before the memory is saved.
fn prepare_checkpoint(agent: &Agent) -> Response {
    if agent.listen_path.is_none() {
        return AgentError::invalid(
            "this agent serves an inherited listener and cannot bind it again after a checkpoint",
        )
        .into_response();
    }
    threadbox_sys::child::sync_all();
    // The last line before the checkpoint: nothing may be writing to the host's log file
    // while it is taken, so what is logged from here on is held until the agent binds
    // again (main.rs).
    log("closing the listener and connections for a checkpoint");
    crate::hold_log();
    Response::Prepared
}
