//! Cases of the suite inside an interpreter context (issue 15, ADR 0087): a context must be
//! as confined as an exec. The chosen cases run through the same `run_case` and the same
//! judgement, but their program runs in a context instead of an exec: Python cases in the
//! context's worker process itself (`runpy`, as a cell), shell and C cases as children of
//! the worker. Each keeps its positive control (the same weakening must be detected).
//!
//! Beside them, what only contexts have: the worker's control channel (a socketpair fd)
//! is out of reach of every other process of the sandbox, and an output or memory bomb
//! in one context leaves the neighbour context (its variables) and a neighbour sandbox
//! answering.

use super::*;
use threadbox_api::interp::{
    CodeExecution, CodeStatus, CreateContext, CreateContextRequest, ExecuteCode, ExecuteCodeRequest,
};
use threadbox_api::ExecResponse;

/// Posture (seccomp, caps, namespaces, mounts, dangerous syscalls), the agent and host
/// files, the daemon's sockets and host loopback, a memory bomb, an output bomb, the
/// agent's limits.
pub const IN_CONTEXT: &[&str] = &[
    "A1", "A2", "A4", "A5", "A6", "B4", "B6", "C6", "D1", "E2", "G1", "I3",
];

/// Cases whose weakening does not reach a context: `no-output-cap` turns off the exec
/// path's output bound, while a cell's streams are bounded by the interpreter's own code
/// (checked, without a weakening, by `bombs_in_one_context_leave_the_neighbours_answering`).
const NO_CONTROL_IN_CONTEXT: &[&str] = &["G1"];

/// The cell that runs a case's argv inside the context and reports its exit status on
/// the last line of stdout.
const RUNNER: &str = r#"
import json as _j, runpy as _r, subprocess as _s, sys as _y
_argv = _j.loads(__TB_ARGV)
if _argv[0] == "python3":
    _y.argv = _argv[1:]
    try:
        _r.run_path(_argv[1], run_name="__main__")
        _code = 0
    except SystemExit as _e:
        _code = _e.code if isinstance(_e.code, int) else (0 if _e.code is None else 1)
    finally:
        _y.argv = [""]
else:
    _code = _s.run(_argv).returncode
_y.stdout.flush()
print("\n__TB_EXIT__=%d" % _code)
"#;

fn sandbox_call<O>(d: &Daemon, op: &O) -> Result<O::Output, String>
where
    O: threadbox_api::ops::Operation,
    O::Output: serde::de::DeserializeOwned,
{
    block(d.client.call(op)).map_err(|e| e.to_string())
}

fn context(d: &Daemon, id: &str, name: &str, user: User) -> Result<(), String> {
    let request = CreateContextRequest {
        name: Some(name.into()),
        language: "python".into(),
        cwd: None,
        env: BTreeMap::new(),
        user,
    };
    sandbox_call(
        d,
        &CreateContext {
            sandbox: id.into(),
            request,
        },
    )
    .map(drop)
}

fn cell(
    d: &Daemon,
    id: &str,
    ctx: &str,
    code: &str,
    timeout: u64,
    max_output: Option<u64>,
) -> CodeExecution {
    let op = ExecuteCode {
        sandbox: id.into(),
        context: ctx.into(),
        request: ExecuteCodeRequest {
            code: code.into(),
            env: BTreeMap::new(),
            timeout_secs: Some(timeout),
            max_output_bytes: max_output,
        },
    };
    sandbox_call(d, &op).unwrap_or_else(|e| panic!("execute in {ctx}: {e}\n{}", d.log()))
}

/// `run_case`'s exec, in a context of the case's user: the same request, answered as an
/// exec would be (exit code from the runner's last line, timeouts, truncation).
pub fn exec(d: &Daemon, id: &str, req: &ExecRequest) -> Result<ExecResponse, String> {
    let name = match req.user {
        User::Root => "case-root",
        User::User | User::Default => "case",
    };
    context(d, id, name, req.user)?;
    let argv = serde_json::to_string(&req.command.clone().unwrap_or_default())
        .map_err(|e| e.to_string())?;
    let code = format!("__TB_ARGV = {:?}\n{RUNNER}", argv);
    let timeout = req.timeout_secs.unwrap_or(60.0).ceil().max(1.0) as u64;
    let op = ExecuteCode {
        sandbox: id.into(),
        context: name.into(),
        request: ExecuteCodeRequest {
            code,
            env: req.env.clone(),
            timeout_secs: Some(timeout),
            max_output_bytes: req.max_output_bytes,
        },
    };
    let x = sandbox_call(d, &op)?;
    let mut stdout = x.stdout.clone();
    let mut exit_code = None;
    if let Some(at) = stdout.rfind("\n__TB_EXIT__=") {
        exit_code = stdout[at + 13..].trim().parse().ok();
        stdout.truncate(at);
    }
    let mut stderr = x.stderr.clone();
    if let Some(e) = &x.exception {
        stderr.push_str(&e.traceback);
    }
    if x.status == CodeStatus::ContextDied {
        stderr.push_str(&format!(
            "\n[the context died: {}]\n",
            x.reason.as_deref().unwrap_or("?")
        ));
    }
    Ok(ExecResponse {
        exit_code,
        signal: None,
        stdout,
        stderr,
        encoding: Encoding::Utf8,
        timed_out: x.status == CodeStatus::TimedOut,
        truncated: x.truncated,
        stdout_truncated: x.truncated,
        stderr_truncated: false,
        duration_ms: x.duration_ms,
        oom_killed: x.reason.as_deref() == Some("oom"),
        memory_limit_bytes: None,
    })
}

fn in_context_cases() -> Vec<Case> {
    let only = std::env::var("THREADBOX_SECURITY_CASES").ok();
    cases::all()
        .into_iter()
        .filter(|c| IN_CONTEXT.contains(&c.id))
        .filter(|c| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|x| x.trim() == c.id))
        })
        .collect()
}

#[test]
fn chosen_cases_hold_inside_a_context() {
    require_root!();
    let _s = serial();
    let mut d = Daemon::start(&normal_bins(), None);
    let mut ctx = new_ctx();
    ctx.in_context = true;
    let cases = in_context_cases();
    assert!(!cases.is_empty());
    let mut failures = Vec::new();
    for case in &cases {
        let (v, log) = run_case(&mut d, &mut ctx, case);
        eprintln!("in a context: {} {:?}", case.id, v);
        if !matches!(v, Verdict::Held) {
            failures.push(format!("{} ({}): {:?}\n{}", case.id, case.what, v, log));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn chosen_cases_detect_escapes_inside_a_context_when_weakened() {
    require_root!();
    let weak = weakened_bins();
    let _s = serial();
    let mut groups: BTreeMap<&str, Vec<Case>> = BTreeMap::new();
    for c in in_context_cases() {
        if NO_CONTROL_IN_CONTEXT.contains(&c.id) {
            continue;
        }
        if let Some(w) = c.control {
            groups.entry(w).or_default().push(c);
        }
    }
    let mut failures = Vec::new();
    for (weaken, cases) in &groups {
        let mut d = Daemon::start(&weak, Some(weaken));
        let mut ctx = new_ctx();
        ctx.in_context = true;
        for case in cases {
            let (v, log) = run_case(&mut d, &mut ctx, case);
            eprintln!("in a context, control {} [{weaken}] {:?}", case.id, v);
            if !matches!(v, Verdict::Escaped(_)) {
                failures.push(format!("{} under {weaken}: {:?}\n{}", case.id, v, log));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Run by another process of the sandbox against a worker's pid: every way to its fds
/// (ptrace, pidfd_getfd, /proc/<pid>/fd, process_vm_readv). Prints ESCAPE on success.
const CHANNEL_PROBE: &str = r#"
import ctypes, os, socket, sys
pid = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
SYS_ptrace, SYS_pidfd_open, SYS_pidfd_getfd = 101, 434, 438
fds = []
try:
    fds = sorted(int(f) for f in os.listdir("/proc/%d/fd" % pid))
except OSError as e:
    print("listing fds refused:", e)
if not fds:
    fds = list(range(0, 256))
print("worker fds:", fds[:20])
if libc.syscall(SYS_ptrace, 16, pid, 0, 0) == 0:  # PTRACE_ATTACH
    print("ESCAPE ptrace attached to the worker")
pidfd = libc.syscall(SYS_pidfd_open, pid, 0)
if pidfd >= 0:
    for n in fds:
        got = libc.syscall(SYS_pidfd_getfd, pidfd, n, 0)
        if got >= 0:
            try:
                s = socket.socket(fileno=os.dup(got))
                print("ESCAPE pidfd_getfd took the worker's fd %d (%s)" % (n, s.type))
            except OSError:
                print("ESCAPE pidfd_getfd took the worker's fd %d" % n)
for n in fds:
    try:
        f = os.open("/proc/%d/fd/%d" % (pid, n), os.O_RDWR)
        if "socket" in os.readlink("/proc/%d/fd/%d" % (pid, n)):
            print("ESCAPE opened the worker's socket fd %d" % n)
        os.close(f)
    except OSError:
        pass
print("END")
"#;

/// Starts a context per user, probes each worker's channel from another process as the
/// user and as sandbox root; the probes' outputs, then whether each context still
/// answers with its variables.
fn probe_channels(d: &Daemon) -> (Vec<String>, Vec<String>) {
    let id = d.create(LimitsRequest::default());
    d.write(&id, "/tmp/probe.py", User::Root, CHANNEL_PROBE.as_bytes());
    let (mut outs, mut broken) = (Vec::new(), Vec::new());
    for (user, name) in [(User::User, "u"), (User::Root, "r")] {
        context(d, &id, name, user).expect("context");
        let x = cell(
            d,
            &id,
            name,
            "secret = 41\nimport os; os.getpid()",
            30,
            None,
        );
        assert_eq!(x.status, CodeStatus::Ok, "{x:?}");
        let pid = plain(&x).expect("the worker's pid").to_string();
        for prober in [User::User, User::Root] {
            let r = d.exec(
                &id,
                &ExecRequest {
                    command: Some(vec!["python3".into(), "/tmp/probe.py".into(), pid.clone()]),
                    user: prober,
                    timeout_secs: Some(60.0),
                    ..Default::default()
                },
            );
            let out = format!("{}{}", r.stdout, r.stderr);
            eprintln!("probe as {prober:?} against the {user:?} worker:\n{out}");
            assert!(out.contains("END"), "the probe did not run: {out}");
            outs.push(format!("{prober:?} -> {user:?} worker: {out}"));
        }
        let x = cell(d, &id, name, "secret + 1", 30, None);
        if plain(&x) != Some("42") {
            broken.push(format!("the {user:?} context lost its state: {x:?}"));
        }
    }
    (outs, broken)
}

fn plain(x: &CodeExecution) -> Option<&str> {
    x.result.as_ref()?.data.get("text/plain")?.as_str()
}

#[test]
fn the_control_channel_is_out_of_reach_of_other_processes() {
    require_root!();
    let _s = serial();
    let d = Daemon::start(&normal_bins(), None);
    let (outs, broken) = probe_channels(&d);
    let escapes: Vec<&String> = outs.iter().filter(|o| o.contains("ESCAPE")).collect();
    assert!(escapes.is_empty(), "{escapes:#?}");
    assert!(broken.is_empty(), "{broken:#?}");
}

/// Positive control: without the seccomp filter and Landlock (each exec and each worker
/// is its own Landlock domain, which scopes ptrace-like access to siblings out),
/// `pidfd_getfd` takes the worker's socket, and the probe says so.
#[test]
fn the_control_channel_probe_detects_a_weakened_jail() {
    require_root!();
    let weak = weakened_bins();
    let _s = serial();
    let d = Daemon::start(&weak, Some("no-seccomp,no-landlock"));
    let (outs, _) = probe_channels(&d);
    assert!(
        outs.iter()
            .any(|o| o.starts_with("User -> User") && o.contains("ESCAPE pidfd_getfd")),
        "the probe missed the weakened jail: {outs:#?}"
    );
}

#[test]
fn bombs_in_one_context_leave_the_neighbours_answering() {
    require_root!();
    let _s = serial();
    let d = Daemon::start(&normal_bins(), None);
    let neighbour = Neighbour::start(&d);
    let id = d.create(LimitsRequest {
        memory_bytes: Some(256 << 20),
        ..Default::default()
    });
    context(&d, &id, "calm", User::User).expect("calm");
    context(&d, &id, "bomb", User::User).expect("bomb");
    let x = cell(
        &d,
        &id,
        "calm",
        "kept = list(range(1000))\nlen(kept)",
        30,
        None,
    );
    assert_eq!(x.status, CodeStatus::Ok, "{x:?}");
    let answers = |step: &str, count: u64| {
        let x = cell(&d, &id, "calm", "sum(kept)", 30, None);
        let v = x.result.as_ref().and_then(|r| r.data.get("text/plain"));
        assert_eq!(
            v.and_then(|v| v.as_str()),
            Some("499500"),
            "after {step}: {x:?}"
        );
        assert!(
            !x.context_created && !x.context_restarted,
            "after {step}: {x:?}"
        );
        assert_eq!(x.execution_count, count, "after {step}");
    };

    // An output bomb: Python-level and fd-level floods are cut at the bound.
    let bound = 65536;
    let x = cell(
        &d,
        &id,
        "bomb",
        "import os\nwhile True:\n    print('y' * 4096)\n    os.write(2, b'z' * 4096)",
        3,
        Some(bound),
    );
    assert_eq!(x.status, CodeStatus::TimedOut, "{:?}", x.status);
    assert!(x.truncated, "the flood is marked truncated");
    assert!(
        x.stdout.len() as u64 <= bound && x.stderr.len() as u64 <= bound,
        "unbounded: {} / {}",
        x.stdout.len(),
        x.stderr.len()
    );
    answers("the output bomb", 2);
    neighbour.progressed(2, "the neighbour sandbox after the output bomb");

    // A memory bomb over the sandbox's limit: the bomb's context ends (or gets a
    // MemoryError), the calm one keeps its variables.
    let x = cell(
        &d,
        &id,
        "bomb",
        "hog = []\nwhile True:\n    hog.append(bytearray(16 << 20))",
        60,
        None,
    );
    match x.status {
        CodeStatus::ContextDied => {
            eprintln!("the bomb's context died: {:?}", x.reason)
        }
        CodeStatus::Exception => assert_eq!(
            x.exception.as_ref().map(|e| e.name.as_str()),
            Some("MemoryError"),
            "{x:?}"
        ),
        other => panic!("the memory bomb ended with {other:?}: {x:?}"),
    }
    answers("the memory bomb", 3);
    neighbour.progressed(2, "the neighbour sandbox after the memory bomb");
    let f = neighbour.finish();
    assert!(f.is_empty(), "the neighbour sandbox failed: {f:#?}");
    if let Some(peak) = memory_peak(&id) {
        assert!(peak <= 256 << 20, "memory peak {peak} over the limit");
    }
}
