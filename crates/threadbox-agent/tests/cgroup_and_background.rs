//! Per-call cgroups (with a real cgroup v2 directory passed as `--cgroup-fd`) and
//! background processes.

mod common;

use common::*;
use std::time::{Duration, Instant};
use threadbox_proto::*;

fn session_of(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

fn cgroup_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        .unwrap_or_default()
}

#[test]
fn without_cgroup_the_fallback_misses_setsid_grandchildren() {
    if skip_unless_root() {
        return;
    }
    // Documents the weakness of the process-group fallback: a grandchild that called
    // setsid survives a timeout. The cgroup test below shows it does not with a cgroup.
    let agent = Agent::start();
    let mut c = agent.connect();
    let dir = Scratch::new();
    let pidfile = dir.path("gc.pid");
    let mut spec = shell(&format!(
        "setsid sh -c 'echo $$ > {pidfile}; exec sleep 1000' & sleep 1000"
    ));
    spec.timeout_ms = Some(500);
    let r = c.exec(spec);
    assert!(r.timed_out);
    let gc = read_pid(&pidfile);
    let survived = alive(gc);
    kill9(gc);
    assert!(
        survived,
        "expected the setsid grandchild to escape the process-group kill"
    );
}

#[test]
fn timeout_kills_setsid_grandchildren_through_the_cgroup() {
    if skip_unless_root() {
        return;
    }
    let Some(cg) = TestCgroup::new() else {
        eprintln!("SKIPPED: no cgroup v2 with cgroup.kill at {CGROUP2_ROOT}");
        return;
    };
    let agent = Agent::start_with(Some(&cg));
    let mut c = agent.connect();
    let dir = Scratch::new();
    let pidfile = dir.path("gc.pid");
    let mut spec = shell(&format!(
        "echo before; setsid sh -c 'echo $$ > {pidfile}; exec sleep 1000' & sleep 1000"
    ));
    spec.timeout_ms = Some(1000);
    let id = c.send(Request::Exec(spec));
    let Frame::Response {
        resp: Response::Started { pid },
        ..
    } = c.recv()
    else {
        panic!()
    };
    let gc = read_pid(&pidfile);
    // The grandchild really left the call's session and process group...
    assert_ne!(session_of(gc), session_of(pid));
    // ...but not the call's cgroup.
    let call_cg = cgroup_of(pid);
    assert!(
        call_cg.ends_with(&format!(
            "{}/exec-1",
            cg.0.file_name().unwrap().to_string_lossy()
        )),
        "{call_cg}"
    );
    assert_eq!(cgroup_of(gc), call_cg);
    let t = Instant::now();
    let r = match c.recv() {
        Frame::Response {
            id: got,
            resp: Response::Exited(r),
        } if got == id => r,
        other => panic!("{other:?}"),
    };
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(r.timed_out);
    assert_eq!(r.exit_code, None);
    assert_eq!(r.stdout, b"before\n");
    assert!(
        wait_until(Duration::from_secs(5), || !alive(gc)),
        "grandchild {gc} survived"
    );
    assert!(!alive(pid));
    // The emptied exec cgroup is removed (at once or by the periodic sweep).
    assert!(
        wait_until(Duration::from_secs(6), || !cg
            .children()
            .iter()
            .any(|n| n.starts_with("exec-"))),
        "left: {:?}",
        cg.children()
    );
}

#[test]
fn each_call_gets_its_own_cgroup_and_it_is_cleaned_up() {
    if skip_unless_root() {
        return;
    }
    let Some(cg) = TestCgroup::new() else {
        eprintln!("SKIPPED: no cgroup v2 at {CGROUP2_ROOT}");
        return;
    };
    let agent = Agent::start_with(Some(&cg));
    let mut c = agent.connect();
    let a = text(&c.sh("cat /proc/self/cgroup").stdout);
    let b = text(&c.sh("cat /proc/self/cgroup").stdout);
    assert!(a.trim_end().ends_with("/exec-1"), "{a}");
    assert!(b.trim_end().ends_with("/exec-2"), "{b}");
    assert!(
        wait_until(Duration::from_secs(5), || cg.children().is_empty()),
        "{:?}",
        cg.children()
    );

    // A call that leaves `server &` behind: its cgroup stays while the server lives, and is
    // swept once it is gone.
    let dir = Scratch::new();
    let pidfile = dir.path("srv.pid");
    c.sh(&format!("sleep 1000 & echo $! > {pidfile}"));
    let srv = read_pid(&pidfile);
    assert!(alive(srv));
    assert_eq!(cg.children(), vec!["exec-3".to_string()]);
    kill9(srv);
    assert!(
        wait_until(Duration::from_secs(6), || cg.children().is_empty()),
        "{:?}",
        cg.children()
    );
}

#[test]
fn background_processes() {
    if skip_unless_root() {
        return;
    }
    let cg = TestCgroup::new();
    let agent = Agent::start_with(cg.as_ref());
    let mut c = agent.connect();
    let dir = Scratch::new();
    let pidfile = dir.path("bgchild.pid");
    let spec = BackgroundSpec {
        command: threadbox_proto::Command::Shell(format!(
            "echo out; echo err >&2; sleep 1000 & echo $! > {pidfile}; sleep 1000"
        )),
        env: Default::default(),
        cwd: Some("/tmp".into()),
        user: RunAs::User,
        max_log: 1024,
    };
    let (bg_id, pid) = match c.call(Request::BackgroundStart(spec.clone())) {
        Response::BackgroundStarted { bg_id, pid } => (bg_id, pid),
        other => panic!("{other:?}"),
    };
    let list = |c: &mut Client| match c.call(Request::BackgroundList) {
        Response::BackgroundList { processes } => processes,
        other => panic!("{other:?}"),
    };
    let info = list(&mut c).into_iter().find(|p| p.bg_id == bg_id).unwrap();
    assert!(info.running);
    assert_eq!(info.pid, pid);
    assert!(wait_until(Duration::from_secs(5), || {
        match c.call(Request::BackgroundLogs { bg_id }) {
            Response::BackgroundLogs(l) => l.stdout == b"out\n" && l.stderr == b"err\n",
            other => panic!("{other:?}"),
        }
    }));
    let child = read_pid(&pidfile);

    // A non-kill signal goes to the process only.
    assert_eq!(
        c.call(Request::BackgroundKill {
            bg_id,
            signal: Some(libc::SIGTERM)
        }),
        Response::Done
    );
    assert!(wait_until(Duration::from_secs(5), || {
        let p = list(&mut c).into_iter().find(|p| p.bg_id == bg_id).unwrap();
        !p.running && p.signal == Some(libc::SIGTERM) && p.exit_code == Some(128 + libc::SIGTERM)
    }));
    if cg.is_some() {
        // Its child lives on in the bg cgroup until a SIGKILL of the whole cgroup.
        assert!(alive(child));
        assert_eq!(
            c.call(Request::BackgroundKill {
                bg_id,
                signal: None
            }),
            Response::Done
        );
        assert!(
            wait_until(Duration::from_secs(5), || !alive(child)),
            "bg grandchild survived"
        );
    } else {
        kill9(child);
    }

    // SIGKILL (the default) of a running one.
    let spec2 = BackgroundSpec {
        command: threadbox_proto::Command::Shell("sleep 1000".into()),
        ..spec
    };
    let Response::BackgroundStarted {
        bg_id: id2,
        pid: pid2,
    } = c.call(Request::BackgroundStart(spec2))
    else {
        panic!()
    };
    assert_eq!(
        c.call(Request::BackgroundKill {
            bg_id: id2,
            signal: None
        }),
        Response::Done
    );
    assert!(wait_until(Duration::from_secs(5), || !alive(pid2)));
    assert!(wait_until(Duration::from_secs(5), || {
        let p = list(&mut c).into_iter().find(|p| p.bg_id == id2).unwrap();
        !p.running && p.signal == Some(9)
    }));

    // Unknown ids and signals to exited processes are clear errors.
    assert!(matches!(
        c.call(Request::BackgroundLogs { bg_id: 999 }),
        Response::Error {
            kind: ErrorKind::NotFound,
            ..
        }
    ));
    assert!(matches!(
        c.call(Request::BackgroundKill {
            bg_id: id2,
            signal: Some(15)
        }),
        Response::Error {
            kind: ErrorKind::InvalidArgument,
            ..
        }
    ));
    if let Some(cg) = &cg {
        assert!(
            wait_until(Duration::from_secs(6), || cg.children().is_empty()),
            "{:?}",
            cg.children()
        );
    }
}

#[test]
fn background_logs_are_bounded_rings() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let spec = BackgroundSpec {
        command: threadbox_proto::Command::Shell("seq 1 20000; echo last".into()),
        env: Default::default(),
        cwd: None,
        user: RunAs::User,
        max_log: 100,
    };
    let Response::BackgroundStarted { bg_id, .. } = c.call(Request::BackgroundStart(spec)) else {
        panic!()
    };
    let total = {
        let mut n = 0usize;
        for i in 1..=20000 {
            n += format!("{i}\n").len();
        }
        n + "last\n".len()
    };
    assert!(wait_until(Duration::from_secs(10), || {
        match c.call(Request::BackgroundLogs { bg_id }) {
            Response::BackgroundLogs(l) => l.stdout_dropped as usize + l.stdout.len() == total,
            other => panic!("{other:?}"),
        }
    }));
    let Response::BackgroundLogs(l) = c.call(Request::BackgroundLogs { bg_id }) else {
        panic!()
    };
    assert_eq!(l.stdout.len(), 100);
    assert!(l.stdout.ends_with(b"19999\n20000\nlast\n"));
}
