//! Background processes: started, followed to their exit, with bounded ring logs; listed,
//! read and signalled by id.

use crate::agent::{self, Agent};
use crate::error::{AgentError, Result};
use crate::exec::{exit_fields, program_name, spawn, Ring, Spawned, MAX_BACKGROUND};
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{SystemTime, UNIX_EPOCH};
use threadbox_proto::{
    BackgroundInfo, BackgroundLogs, BackgroundSpec, ErrorKind, Response, CHUNK, MAX_OUTPUT_LIMIT,
};
use threadbox_sys::child as syschild;
use tokio::io::AsyncReadExt;

#[derive(Debug)]
pub struct Background {
    /// What the API lists; its `pid` is the sandbox's view of the process (ADR 0218).
    pub info: BackgroundInfo,
    /// The process as the agent knows it (what it signals and waits for).
    pid: i32,
    stdout: Ring,
    stderr: Ring,
    cgroup: Option<String>,
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

pub fn start_background(agent: &Rc<Agent>, spec: BackgroundSpec) -> Result<Response> {
    {
        let mut bg = agent.background.borrow_mut();
        while bg.len() >= MAX_BACKGROUND {
            let oldest_done = bg
                .iter()
                .find(|(_, b)| !b.borrow().info.running)
                .map(|(k, _)| *k);
            match oldest_done {
                Some(k) => {
                    bg.remove(&k);
                }
                None => {
                    return Err(AgentError::invalid(format!(
                        "already {MAX_BACKGROUND} background processes running"
                    )))
                }
            }
        }
    }
    let program = program_name(&spec.command);
    let prepared = agent::prepare(
        &agent.root,
        &spec.command,
        &spec.env,
        spec.cwd.as_deref(),
        spec.user,
    )?;
    let p = spawn(agent, prepared, &program, "bg", false)?;
    let bg_id = agent.next_bg.get();
    agent.next_bg.set(bg_id + 1);
    let cap = spec.max_log.min(MAX_OUTPUT_LIMIT) as usize;
    let entry = Rc::new(RefCell::new(Background {
        info: BackgroundInfo {
            bg_id,
            pid: syschild::pidns::view(p.pid),
            command: spec.command,
            running: true,
            exit_code: None,
            signal: None,
            started_at: now_secs(),
        },
        stdout: Ring::new(cap),
        stderr: Ring::new(cap),
        pid: p.pid,
        cgroup: p.cgroup.clone(),
    }));
    agent.background.borrow_mut().insert(bg_id, entry.clone());
    let pid = syschild::pidns::view(p.pid);
    tokio::task::spawn_local(follow_background(agent.clone(), entry, p));
    Ok(Response::BackgroundStarted { bg_id, pid })
}

/// Feeds the ring logs until both pipes close and records the exit status.
async fn follow_background(agent: Rc<Agent>, entry: Rc<RefCell<Background>>, mut p: Spawned) {
    let mut obuf = vec![0u8; CHUNK];
    let mut ebuf = vec![0u8; CHUNK];
    let (mut out_eof, mut err_eof, mut exited) = (false, false, false);
    while !(out_eof && err_eof && exited) {
        tokio::select! {
            st = &mut p.exit, if !exited => {
                exited = true;
                let (exit_code, signal) = exit_fields(st.ok());
                let mut e = entry.borrow_mut();
                e.info.running = false;
                e.info.exit_code = exit_code;
                e.info.signal = signal;
            }
            r = p.stdout.read(&mut obuf), if !out_eof => match r {
                Ok(n) if n > 0 => entry.borrow_mut().stdout.push(&obuf[..n]),
                _ => out_eof = true,
            },
            r = p.stderr.read(&mut ebuf), if !err_eof => match r {
                Ok(n) if n > 0 => entry.borrow_mut().stderr.push(&ebuf[..n]),
                _ => err_eof = true,
            },
        }
    }
    if let Some(name) = p.cgroup.take() {
        agent.release_cgroup(name);
    }
}

pub fn list_background(agent: &Agent) -> Response {
    let processes = agent
        .background
        .borrow()
        .values()
        .map(|b| b.borrow().info.clone())
        .collect();
    Response::BackgroundList { processes }
}

fn find(agent: &Agent, bg_id: u64) -> Result<Rc<RefCell<Background>>> {
    agent
        .background
        .borrow()
        .get(&bg_id)
        .cloned()
        .ok_or_else(|| {
            AgentError::new(
                ErrorKind::NotFound,
                format!("no background process {bg_id}"),
            )
        })
}

pub fn background_logs(agent: &Agent, bg_id: u64) -> Result<Response> {
    let b = find(agent, bg_id)?;
    let b = b.borrow();
    Ok(Response::BackgroundLogs(BackgroundLogs {
        stdout: b.stdout.contents(),
        stderr: b.stderr.contents(),
        stdout_dropped: b.stdout.dropped,
        stderr_dropped: b.stderr.dropped,
    }))
}

/// SIGKILL (the default) kills the whole cgroup of the process, descendants included;
/// another signal goes to the process alone.
pub fn kill_background(agent: &Agent, bg_id: u64, signal: Option<i32>) -> Result<Response> {
    let b = find(agent, bg_id)?;
    let (pid, running, cgroup) = {
        let b = b.borrow();
        (b.pid, b.info.running, b.cgroup.clone())
    };
    let sig = signal.unwrap_or(libc::SIGKILL);
    if !(1..=64).contains(&sig) {
        return Err(AgentError::invalid(format!("invalid signal {sig}")));
    }
    if sig == libc::SIGKILL {
        // Without a cgroup, a group whose leader is gone is not signalled: its number may
        // belong to someone else by now.
        if running || cgroup.is_some() {
            agent.kill_tree(cgroup.as_deref(), pid);
        }
        return Ok(Response::Done);
    }
    if !running {
        return Err(AgentError::invalid(format!(
            "background process {bg_id} has already exited"
        )));
    }
    syschild::kill(pid, sig)
        .map_err(|e| AgentError::io(&e, &format!("signal to process {pid}")))?;
    Ok(Response::Done)
}
