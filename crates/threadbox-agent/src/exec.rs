//! Running processes: `Exec` (to completion, captured or streamed, with a timeout that
//! kills the whole tree). Background processes are in `background.rs`.

use crate::agent::{self, Agent, CallCgroup};
use crate::error::{AgentError, Result};

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};
use threadbox_proto::{
    ErrorKind, ExecResult, ExecSpec, Frame, Response, Stream, CHUNK, MAX_OUTPUT_LIMIT,
};
use threadbox_sys::child::{self as syschild, WaitStatus};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot};
use tokio::time::sleep_until;

/// After the main process exits, output is still drained this long at most: a background
/// child (`server &`) holding the pipes open must not make the call hang.
const GRACE_AFTER_EXIT: Duration = Duration::from_millis(250);
/// After a timeout or cancel kills the tree, what is left in the pipes is read this long.
const DRAIN_AFTER_KILL: Duration = Duration::from_millis(100);
/// Output frames queued for the connection before we stop reading the pipes (which then
/// blocks the writer: flow control instead of memory).
const STREAM_BACKLOG: usize = 16;
/// Background processes remembered; beyond that the oldest finished ones are forgotten.
pub(crate) const MAX_BACKGROUND: usize = 256;

/// Bounded capture of one output stream: the first half of the bound is kept as it
/// comes, the second half as a ring of the latest bytes, so the end of a long output
/// (where test runners and compilers print their summary) is never lost.
struct Capture {
    stream: Stream,
    limit: usize,
    head_limit: usize,
    accepted: usize,
    kept: Vec<u8>,
    tail: Ring,
    truncated: bool,
    eof: bool,
}

/// The marker line is at most this long (111 bytes); a bound below 4x this keeps only the
/// head, as captures did before they kept a tail.
const MARKER_RESERVE: usize = 128;

/// The line put between the head and the tail of an output that was cut.
pub fn cut_marker(dropped: u64) -> Vec<u8> {
    format!(
        "\n[... {dropped} bytes of output cut here by the sandbox: the first and the last part are kept ...]\n"
    )
    .into_bytes()
}

impl Capture {
    fn new(stream: Stream, limit: usize) -> Self {
        // A bound too small to share keeps only the head, as before.
        let (head_limit, tail_limit) = if limit >= 4 * MARKER_RESERVE {
            (limit / 2, limit - limit / 2)
        } else {
            (limit, 0)
        };
        Capture {
            stream,
            limit,
            head_limit,
            accepted: 0,
            kept: Vec::new(),
            tail: Ring::new(tail_limit),
            truncated: false,
            eof: false,
        }
    }

    /// The part of `chunk` that belongs to the head; the rest goes to the tail ring
    /// (whose oldest bytes are dropped, which marks truncation).
    fn admit<'a>(&mut self, chunk: &'a [u8]) -> &'a [u8] {
        let take = chunk.len().min(self.head_limit - self.accepted);
        self.accepted += take;
        if take < chunk.len() {
            self.tail.push(&chunk[take..]);
            if self.tail.dropped > 0 {
                self.truncated = true;
            }
        }
        &chunk[..take]
    }

    /// Bytes dropped between the head and the tail.
    fn dropped(&self) -> u64 {
        self.tail.dropped
    }

    /// What follows the head at the end: the tail, behind a marker when bytes were
    /// dropped between them (empty when everything fitted in the head).
    /// Output that fitted in the bound comes back whole; otherwise the oldest bytes of the
    /// tail make room for the marker, so head + marker + tail stay within the bound.
    fn finish(&mut self) -> Vec<u8> {
        let tail = self.tail.contents();
        if self.dropped() == 0 || self.tail.cap == 0 {
            return tail;
        }
        let room = self.limit - self.accepted;
        let widest = cut_marker(self.dropped() + tail.len() as u64).len();
        let keep = tail.len().min(room.saturating_sub(widest));
        let cut = (tail.len() - keep) as u64;
        let mut out = cut_marker(self.dropped() + cut);
        out.extend_from_slice(&tail[tail.len() - keep..]);
        out
    }
}

fn receiver(fd: impl Into<OwnedFd>) -> io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd(fd.into())
}

fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(86400 * 365)
}

pub(crate) fn exit_fields(status: Option<WaitStatus>) -> (Option<i32>, Option<i32>) {
    match status {
        Some(WaitStatus::Exited(c)) => (Some(c), None),
        Some(WaitStatus::Signaled(s)) => (Some(128 + s), Some(s)),
        None => (None, None),
    }
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
        Some(libc::E2BIG) => AgentError::invalid("the argument list and environment are too long"),
        Some(libc::ENOEXEC) => AgentError::invalid(format!("{program}: exec format error")),
        _ => AgentError::internal(format!("could not start {program}: {e}")),
    }
}

/// A program that cannot be started is a result, as a shell reports it (127: not found,
/// 126: not executable), not an error of the call: callers tell "no such sandbox" from
/// "no such program" by the result, and the model sees the same thing a shell shows.
fn start_failure(e: AgentError, started: Instant) -> Response {
    let code = if e.message.starts_with("command not found") {
        127
    } else if e.message.starts_with("permission denied: ")
        || e.message.ends_with("exec format error")
    {
        126
    } else {
        return e.into_response();
    };
    Response::Exited(threadbox_proto::ExecResult {
        exit_code: Some(code),
        stderr: format!("threadbox: {}\n", e.message).into_bytes(),
        duration_ms: started.elapsed().as_millis() as u64,
        ..Default::default()
    })
}

pub(crate) fn program_name(command: &threadbox_proto::Command) -> String {
    match command {
        threadbox_proto::Command::Argv(v) => v.first().cloned().unwrap_or_default(),
        threadbox_proto::Command::Shell(_) => "/bin/sh".into(),
    }
}

/// A spawned process with its pipes, its cgroup and its exit-status waiter.
pub(crate) struct Spawned {
    pub(crate) pid: i32,
    pub(crate) exit: oneshot::Receiver<WaitStatus>,
    pub(crate) stdin: Option<pipe::Sender>,
    pub(crate) stdout: pipe::Receiver,
    pub(crate) stderr: pipe::Receiver,
    pub(crate) cgroup: Option<String>,
}

pub(crate) fn spawn(
    agent: &Agent,
    prepared: agent::Prepared,
    program: &str,
    cgroup_prefix: &str,
    with_stdin: bool,
) -> Result<Spawned> {
    spawn_passing(agent, prepared, program, cgroup_prefix, with_stdin, None)
}

/// [`spawn`], the child inheriting `pass` (an interpreter worker's control socket).
pub(crate) fn spawn_passing(
    agent: &Agent,
    prepared: agent::Prepared,
    program: &str,
    cgroup_prefix: &str,
    with_stdin: bool,
    pass: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<Spawned> {
    let cg = agent.new_cgroup(cgroup_prefix)?;
    let cgroup = cg.as_ref().map(|c: &CallCgroup| c.name.clone());
    let release = |agent: &Agent| {
        if let Some(name) = &cgroup {
            agent.release_cgroup(name.clone());
        }
    };
    let mut prepared = prepared;
    let Some(cwd) = prepared.cwd.take() else {
        release(agent);
        return Err(AgentError::internal(
            "the working directory was not resolved",
        ));
    };
    let mut policy = match agent.child_policy(&prepared.who, cwd, None) {
        Ok(p) => p,
        Err(e) => {
            release(agent);
            return Err(e);
        }
    };
    // Created in its cgroup by clone3; where the kernel cannot (no clone3 or no cgroup v2
    // there), the child writes itself into the cgroup after a plain fork.
    let direct = match &cg {
        // gVisor's v1 hierarchy (ADR 0214): no clone3 into it.
        Some(_) if agent.cgroup_v1 => None,
        Some(c) => {
            match syschild::spawn_in_cgroup_passing(
                &prepared.cmd,
                Some(c.dir.as_fd()),
                &policy,
                with_stdin,
                pass,
            ) {
                Err(e) if syschild::clone3_unavailable(&e) => None,
                other => Some(other),
            }
        }
        None => None,
    };
    let started = match direct {
        Some(r) => r,
        None => {
            if let Some(name) = &cgroup {
                policy.cgroup_procs = match agent.cgroup_procs(name) {
                    Ok(fd) => fd,
                    Err(e) => {
                        release(agent);
                        return Err(e);
                    }
                };
            }
            syschild::spawn_in_cgroup_passing(&prepared.cmd, None, &policy, with_stdin, pass)
        }
    };
    drop(policy);
    let s = match started {
        Ok(s) => s,
        Err(e) => {
            release(agent);
            return Err(spawn_error(&e, program));
        }
    };
    let pid = s.pid;
    // No `.await` since the fork: the reaper cannot have taken the status yet.
    let exit = agent.wait_for(pid);
    let pipes = (|| -> io::Result<_> {
        let stdin = s.stdin.map(pipe::Sender::from_owned_fd).transpose()?;
        Ok((stdin, receiver(s.stdout)?, receiver(s.stderr)?))
    })();
    match pipes {
        Ok((stdin, stdout, stderr)) => Ok(Spawned {
            pid,
            exit,
            stdin,
            stdout,
            stderr,
            cgroup,
        }),
        Err(e) => {
            agent.kill_tree(cgroup.as_deref(), pid);
            release(agent);
            Err(AgentError::internal(format!(
                "could not set up the process's pipes: {e}"
            )))
        }
    }
}

/// How often a call with a timeout wakes up while its process runs.
const FROZEN_TICK: Duration = Duration::from_millis(200);
/// A gap between two wake-ups longer than this is time the sandbox spent frozen. Far above
/// the tick, so scheduling delays on a busy host do not count (at worst they extend a
/// deadline by the delay).
const FROZEN_GAP: Duration = Duration::from_secs(1);

/// Moves `deadline` by the time since `last_seen` when that is a freeze; records now.
/// True when it moved.
pub(crate) fn credit_frozen(
    deadline: &mut Option<tokio::time::Instant>,
    last_seen: &mut tokio::time::Instant,
) -> bool {
    let now = tokio::time::Instant::now();
    let gap = now.saturating_duration_since(*last_seen);
    *last_seen = now;
    match deadline {
        Some(d) if gap > FROZEN_GAP => {
            *d += gap;
            true
        }
        _ => false,
    }
}

enum Ending {
    Exited,
    TimedOut,
    Cancelled,
}

/// Runs one `Exec` request. Sends `Started` (and `Output` frames in stream mode) on `tx`
/// and returns the final response.
///
/// Stream mode sends the output only as `Output` frames: the final `Exited` then has
/// empty `stdout`/`stderr` (the truncation flags still say whether bytes were dropped).
/// Both modes admit at most `max_output` bytes per stream (capped at
/// [`MAX_OUTPUT_LIMIT`]) and keep reading beyond it, discarding, so the writer never blocks
/// on a full pipe.
pub async fn exec(
    agent: Rc<Agent>,
    id: u64,
    mut spec: ExecSpec,
    tx: mpsc::Sender<Frame>,
    mut cancel: oneshot::Receiver<()>,
) -> Response {
    let started = Instant::now();
    let program = program_name(&spec.command);
    let prepared = match agent::prepare(
        &agent.root,
        &spec.command,
        &spec.env,
        spec.cwd.as_deref(),
        spec.user,
    ) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let mut p = match spawn(&agent, prepared, &program, "exec", spec.stdin.is_some()) {
        Ok(p) => p,
        Err(e) => return start_failure(e, started),
    };
    let pid = p.pid;
    let stdin_task = match (p.stdin.take(), spec.stdin.take()) {
        (Some(mut w), Some(data)) => Some(tokio::task::spawn_local(async move {
            // EPIPE when the process does not read its input is not an error of the call.
            let _ = w.write_all(&data).await;
        })),
        _ => None,
    };
    let _ = tx
        .send(Frame::Response {
            id,
            // The sandbox's view of the pid (ADR 0218), as `$$` inside says.
            resp: Response::Started {
                pid: syschild::pidns::view(pid),
            },
        })
        .await;

    let mut limit = spec.max_output.min(MAX_OUTPUT_LIMIT) as usize;
    if crate::testhooks::has("no-output-cap") {
        limit = 4 << 20;
    }
    let mut out = Capture::new(Stream::Stdout, limit);
    let mut err = Capture::new(Stream::Stderr, limit);
    let mut obuf = vec![0u8; CHUNK];
    let mut ebuf = vec![0u8; CHUNK];
    let mut pending: VecDeque<Frame> = VecDeque::new();
    let mut timeout_at = spec
        .timeout_ms
        .map(|ms| tokio::time::Instant::from_std(started) + Duration::from_millis(ms));
    // A timeout measures time the sandbox ran: while its cgroup is frozen (pause) the
    // agent does not run either, so a wake-up long after the previous one is time spent
    // frozen, and moves the deadline. The tick keeps wake-ups frequent while a timed call
    // runs, so the gap seen after a thaw is the freeze.
    let mut last_seen = tokio::time::Instant::now();
    let mut tick = tokio::time::interval(FROZEN_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut status: Option<WaitStatus> = None;
    let mut exited = false;
    let mut ending: Option<Ending> = None;
    let mut stop_at: Option<tokio::time::Instant> = None;
    let mut cancel_open = true;

    loop {
        credit_frozen(&mut timeout_at, &mut last_seen);
        let pipes_done = out.eof && err.eof;
        if pipes_done && (exited || ending.is_some()) && pending.is_empty() {
            break;
        }
        let reading = pending.len() < STREAM_BACKLOG;
        tokio::select! {
            biased;
            r = &mut cancel, if cancel_open && ending.is_none() && !exited => {
                cancel_open = false;
                // A closed channel means the connection went away: the call goes on (its
                // timeout still applies) and its result is dropped.
                if r.is_ok() {
                    agent.kill_tree(p.cgroup.as_deref(), pid);
                    ending = Some(Ending::Cancelled);
                    stop_at = Some(tokio::time::Instant::now() + DRAIN_AFTER_KILL);
                }
            }
            _ = tick.tick(), if timeout_at.is_some() && ending.is_none() && !exited => {}
            _ = sleep_until(timeout_at.unwrap_or_else(far_future)), if timeout_at.is_some() && ending.is_none() && !exited => {
                if credit_frozen(&mut timeout_at, &mut last_seen) {
                    // Woken by the thaw, not by running out of time.
                    continue;
                }
                agent.kill_tree(p.cgroup.as_deref(), pid);
                ending = Some(Ending::TimedOut);
                stop_at = Some(tokio::time::Instant::now() + DRAIN_AFTER_KILL);
            }
            st = &mut p.exit, if !exited && ending.is_none() => {
                exited = true;
                status = st.ok();
                ending = Some(Ending::Exited);
                stop_at = Some(tokio::time::Instant::now() + GRACE_AFTER_EXIT);
            }
            _ = sleep_until(stop_at.unwrap_or_else(far_future)), if stop_at.is_some() => break,
            permit = tx.reserve(), if !pending.is_empty() => {
                match (permit, pending.pop_front()) {
                    (Ok(permit), Some(frame)) => permit.send(frame),
                    // The connection is gone: nobody reads the stream any more.
                    _ => pending.clear(),
                }
            }
            r = p.stdout.read(&mut obuf), if reading && !out.eof => {
                handle_read(r, &obuf, &mut out, &spec, id, &mut pending);
            }
            r = p.stderr.read(&mut ebuf), if reading && !err.eof => {
                handle_read(r, &ebuf, &mut err, &spec, id, &mut pending);
            }
        }
    }
    // Frames admitted before the end are still delivered, in order, before `Exited`;
    // then the tail kept past the head (in stream mode as frames of its own).
    for cap in [&mut out, &mut err] {
        let rest = cap.finish();
        if rest.is_empty() {
            continue;
        }
        if spec.stream {
            for chunk in rest.chunks(CHUNK) {
                pending.push_back(Frame::Response {
                    id,
                    resp: Response::Output {
                        stream: cap.stream,
                        data: chunk.to_vec(),
                    },
                });
            }
        } else {
            cap.kept.extend_from_slice(&rest);
        }
    }
    for frame in pending {
        if tx.send(frame).await.is_err() {
            break;
        }
    }
    if let Some(t) = stdin_task {
        t.abort();
    }
    if let Some(name) = p.cgroup.take() {
        agent.release_cgroup(name);
    }
    let duration_ms = started.elapsed().as_millis() as u64;
    match ending {
        Some(Ending::Cancelled) => {
            AgentError::new(ErrorKind::Cancelled, "the call was cancelled").into_response()
        }
        other => {
            let timed_out = matches!(other, Some(Ending::TimedOut));
            let (exit_code, signal) = if timed_out {
                (None, None)
            } else {
                exit_fields(status)
            };
            Response::Exited(ExecResult {
                exit_code,
                signal,
                timed_out,
                stdout: out.kept,
                stderr: err.kept,
                stdout_truncated: out.truncated,
                stderr_truncated: err.truncated,
                duration_ms,
            })
        }
    }
}

fn handle_read(
    r: io::Result<usize>,
    buf: &[u8],
    cap: &mut Capture,
    spec: &ExecSpec,
    id: u64,
    pending: &mut VecDeque<Frame>,
) {
    match r {
        Ok(0) | Err(_) => cap.eof = true,
        Ok(n) => {
            let kept = cap.admit(&buf[..n]);
            if kept.is_empty() {
                return;
            }
            if spec.stream {
                pending.push_back(Frame::Response {
                    id,
                    resp: Response::Output {
                        stream: cap.stream,
                        data: kept.to_vec(),
                    },
                });
            } else {
                cap.kept.extend_from_slice(kept);
            }
        }
    }
}

/// The last `cap` bytes of a stream.
#[derive(Debug)]
pub(crate) struct Ring {
    pub(crate) buf: VecDeque<u8>,
    pub(crate) cap: usize,
    pub(crate) dropped: u64,
}

impl Ring {
    pub(crate) fn new(cap: usize) -> Self {
        Ring {
            buf: VecDeque::new(),
            cap,
            dropped: 0,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        let data = if data.len() > self.cap {
            self.dropped += (data.len() - self.cap) as u64;
            &data[data.len() - self.cap..]
        } else {
            data
        };
        let overflow = (self.buf.len() + data.len()).saturating_sub(self.cap);
        self.buf.drain(..overflow);
        self.dropped += overflow as u64;
        self.buf.extend(data);
    }

    pub(crate) fn contents(&self) -> Vec<u8> {
        self.buf.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_tail() {
        let mut r = Ring::new(4);
        r.push(b"ab");
        r.push(b"cde");
        assert_eq!(r.contents(), b"bcde");
        assert_eq!(r.dropped, 1);
        r.push(b"123456");
        assert_eq!(r.contents(), b"3456");
        assert_eq!(r.dropped, 1 + 4 + 2);
    }

    #[test]
    fn capture_keeps_head_and_tail_within_the_bound() {
        let limit = 1024;
        let mut c = Capture::new(Stream::Stdout, limit);
        let head = vec![b'h'; 512];
        assert_eq!(c.admit(&head), &head[..]);
        assert_eq!(c.admit(&[b'm'; 5000]), b"");
        assert!(c.truncated, "bytes fell off the tail ring");
        assert_eq!(c.admit(&[b't'; 512]), b"");
        let rest = c.finish();
        let tail = rest.iter().rev().take_while(|&&b| b == b't').count();
        let mut expected = cut_marker((5000 + 512 - tail) as u64);
        expected.extend_from_slice(&vec![b't'; tail]);
        assert_eq!(rest, expected);
        assert!(tail > 300, "most of the tail is kept");
        assert!(
            512 + rest.len() <= limit,
            "head + marker + tail stay within the bound"
        );
        assert!(cut_marker(u64::MAX).len() <= MARKER_RESERVE);
    }

    #[test]
    fn capture_within_the_bound_is_whole() {
        let mut c = Capture::new(Stream::Stdout, 1024);
        let data = vec![b'x'; 1000];
        let head = c.admit(&data).len();
        assert!(!c.truncated);
        let mut all = data[..head].to_vec();
        all.extend(c.finish());
        assert_eq!(all, data);
    }

    #[test]
    fn a_small_bound_keeps_only_the_head() {
        let mut c = Capture::new(Stream::Stdout, 5);
        assert_eq!(c.admit(b"abc"), b"abc");
        assert_eq!(c.admit(b"defg"), b"de");
        assert!(c.truncated);
        assert_eq!(c.finish(), b"");
    }
}
