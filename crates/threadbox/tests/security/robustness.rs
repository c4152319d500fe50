//! Class H beyond the file API: hostile HTTP, concurrent lifecycle calls, and kill -9 of
//! the daemon in the middle of operations, each followed by a consistency check of store
//! vs disk vs cgroups vs processes.

use crate::harness::*;
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use threadbox_api::{ExecRequest, LimitsRequest, SandboxState, User};

macro_rules! require_root {
    () => {
        if !is_root() {
            // Under CI a skip would read as a pass: fail instead.
            assert!(
                std::env::var_os("CI").is_none(),
                "the security suite needs root and CI is set"
            );
            eprintln!("skipped: the security suite needs root");
            return;
        }
    };
}

fn connect(d: &Daemon) -> UnixStream {
    let s = UnixStream::connect(d.root_path().join("threadbox.sock")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s.set_write_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    s
}

/// Sends `head` + `body` and returns the status code of the answer (0: connection closed
/// without an answer).
fn raw(d: &Daemon, head: &str, body: &[u8]) -> u16 {
    let mut s = connect(d);
    let _ = s.write_all(head.as_bytes());
    // The daemon may answer (413) and close before the body is all sent.
    for chunk in body.chunks(1 << 16) {
        if s.write_all(chunk).is_err() {
            break;
        }
    }
    let mut resp = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        resp.extend_from_slice(&buf[..n]);
        if resp.windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let text = String::from_utf8_lossy(&resp);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn post(d: &Daemon, path: &str, body: &[u8]) -> u16 {
    raw(
        d,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        ),
        body,
    )
}

#[test]
fn hostile_http_gets_4xx_and_the_daemon_keeps_answering() {
    require_root!();
    let _s = serial();
    let d = Daemon::start(&normal_bins(), None);
    let rss = |d: &Daemon| -> u64 {
        let pid = d.pid().expect("running");
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let rss0 = rss(&d);
    // Huge JSON body: refused by size, not parsed.
    let huge = vec![b' '; 64 << 20];
    let c = post(&d, "/v1/sandboxes", &huge);
    assert!(c == 413 || c == 0, "huge body: {c}");
    // Malformed, invalid UTF-8, wrong types, deeply nested.
    for body in [
        &b"{"[..],
        b"{\"name\": \"\xff\xfe\"}",
        b"{\"limits\": {\"memory_bytes\": \"lots\"}}",
        b"{\"limits\": {\"memory_bytes\": 1e400}}",
        b"[]",
        b"null",
    ] {
        let c = post(&d, "/v1/sandboxes", body);
        assert!(
            (400..500).contains(&c),
            "{:?}: {c}",
            String::from_utf8_lossy(body)
        );
    }
    let nested = format!("{}{}", "[".repeat(200_000), "]".repeat(200_000));
    let c = post(&d, "/v1/sandboxes", nested.as_bytes());
    assert!((400..500).contains(&c), "nested JSON: {c}");
    let nested_obj = "{\"labels\":".repeat(100_000);
    let c = post(&d, "/v1/sandboxes", nested_obj.as_bytes());
    assert!((400..500).contains(&c), "nested objects: {c}");
    // An enormous header line.
    let c = raw(
        &d,
        &format!(
            "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
            "a".repeat(1 << 20)
        ),
        b"",
    );
    assert!(c == 0 || (400..500).contains(&c), "header bomb: {c}");
    // Path traversal in the URL.
    let c = raw(
        &d,
        "GET /v1/sandboxes/..%2F..%2Fetc%2Fpasswd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"",
    );
    assert!((400..500).contains(&c), "traversal in the URL: {c}");

    // Slow clients: 64 connections trickling headers must not starve /healthz.
    let mut slow = Vec::new();
    for _ in 0..64 {
        let mut s = connect(&d);
        let _ = s.write_all(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n");
        slow.push(s);
    }
    for _ in 0..3 {
        for s in &mut slow {
            let _ = s.write_all(b"X-Slow: 1\r\n");
        }
        assert!(
            d.healthy(),
            "the daemon stopped answering under slow clients"
        );
    }
    let id = d.create(LimitsRequest::default());
    let r = d.sh(&id, User::User, "echo fine");
    assert_eq!(r.stdout, "fine\n");
    drop(slow);
    assert!(d.healthy());
    let grown = rss(&d).saturating_sub(rss0);
    assert!(grown < 128 * 1024, "daemon RSS grew by {grown} KiB");
}

/// Host-side traces of one sandbox: cgroup dirs, mounts, processes, disk.
fn traces(d: &Daemon, id: &str) -> Vec<String> {
    let mut out = Vec::new();
    for base in [
        "/sys/fs/cgroup/unified/threadbox",
        "/sys/fs/cgroup/threadbox",
        "/sys/fs/cgroup/memory/threadbox",
        "/sys/fs/cgroup/pids/threadbox",
        "/sys/fs/cgroup/cpu/threadbox",
    ] {
        let p = PathBuf::from(base).join(id);
        if p.exists() {
            out.push(format!("cgroup {}", p.display()));
        }
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for l in mounts.lines().filter(|l| l.contains(id)) {
        out.push(format!("host mount {l}"));
    }
    if d.root_path().join("sandboxes").join(id).exists() {
        out.push("disk".into());
    }
    for e in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let f = e.path().join("loop/backing_file");
        if std::fs::read_to_string(&f).is_ok_and(|b| b.contains(id)) {
            out.push(format!("loop device {}", e.path().display()));
        }
    }
    out
}

fn cgroup_procs(id: &str) -> Vec<String> {
    let mut out = Vec::new();
    for base in [
        "/sys/fs/cgroup/unified/threadbox",
        "/sys/fs/cgroup/threadbox",
    ] {
        let dir = PathBuf::from(base).join(id);
        let walk = std::fs::read_dir(&dir).into_iter().flatten().flatten();
        for e in walk.map(|e| e.path()).chain(std::iter::once(dir.clone())) {
            if let Ok(s) = std::fs::read_to_string(e.join("cgroup.procs")) {
                out.extend(s.lines().map(str::to_string));
            }
        }
    }
    out
}

#[test]
fn fifty_concurrent_lifecycle_calls_leak_nothing() {
    require_root!();
    let _s = serial();
    let d = Daemon::start(&normal_bins(), None);
    let id = d.create(LimitsRequest::default());
    let client = Arc::new(d.client.clone());
    let ops = [
        "pause", "resume", "stop", "start", "exec", "get", "exec", "resume",
    ];
    let results = block(async {
        let mut set = tokio::task::JoinSet::new();
        for i in 0..50 {
            let c = client.clone();
            let id = id.clone();
            let op = ops[i % ops.len()];
            set.spawn(async move {
                let r = match op {
                    "pause" => c.pause(&id).await.map(|_| ()),
                    "resume" => c.resume(&id).await.map(|_| ()),
                    "stop" => c.stop(&id).await.map(|_| ()),
                    "start" => c.start(&id).await.map(|_| ()),
                    "get" => c.get(&id).await.map(|_| ()),
                    _ => c
                        .exec(
                            &id,
                            &ExecRequest {
                                shell: Some("echo hi".into()),
                                timeout_secs: Some(30.0),
                                ..Default::default()
                            },
                        )
                        .await
                        .map(|_| ()),
                };
                (op, r.map_err(|e| e.to_string()))
            });
        }
        // A pause freezes execs in flight until the next resume (their timeouts stop
        // too): when calls stall, resume, as a client would.
        let mut out = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_secs(2), set.join_next()).await {
                Ok(Some(r)) => out.push(r.expect("task")),
                Ok(None) => break,
                Err(_) => {
                    let _ = client.resume(&id).await;
                }
            }
        }
        out
    });
    // Refusals must be clean API errors (409 and the like), never 5xx.
    for (op, r) in &results {
        if let Err(e) = r {
            assert!(
                !e.contains("500") && !e.to_lowercase().contains("internal"),
                "{op}: {e}"
            );
        }
    }
    // The sandbox is in one consistent state and usable after a start/resume.
    let sb = block(d.client.get(&id)).expect("get");
    match sb.state {
        SandboxState::Stopped => drop(block(d.client.start(&id)).expect("start")),
        SandboxState::Paused => drop(block(d.client.resume(&id)).expect("resume")),
        _ => {}
    }
    assert_eq!(d.sh(&id, User::User, "echo ok").stdout, "ok\n");
    block(d.client.delete(&id, true)).expect("delete");
    wait_for(
        "the sandbox's traces to go",
        Duration::from_secs(30),
        || traces(&d, &id).is_empty(),
    );
    let left = host_pids_with(&id);
    assert!(left.is_empty(), "processes left: {left:?}");
}

/// Store vs disk vs cgroups vs processes after a restart.
fn consistency(d: &Daemon, known: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    let list = match block(d.client.list(&Default::default(), None)) {
        Ok(l) => l.sandboxes,
        Err(e) => return vec![format!("list: {e}")],
    };
    let listed: BTreeSet<String> = list.iter().map(|s| s.id.clone()).collect();
    for sb in &list {
        let dir = d.root_path().join("sandboxes").join(&sb.id);
        if !dir.join("disk.img").is_file() && !dir.join("upper").is_dir() {
            problems.push(format!(
                "{}: listed ({:?}) but its disk is gone",
                sb.id, sb.state
            ));
        }
        match sb.state {
            SandboxState::Running => {
                let r = block(d.client.exec(
                    &sb.id,
                    &ExecRequest {
                        shell: Some("echo ok".into()),
                        timeout_secs: Some(30.0),
                        ..Default::default()
                    },
                ));
                if !matches!(&r, Ok(x) if x.stdout == "ok\n") {
                    problems.push(format!("{}: running but exec fails: {r:?}", sb.id));
                }
            }
            SandboxState::Stopped => {
                if !cgroup_procs(&sb.id).is_empty() {
                    problems.push(format!("{}: stopped but has processes", sb.id));
                }
            }
            SandboxState::Paused => {}
            other => problems.push(format!("{}: left in state {other:?}", sb.id)),
        }
    }
    let on_disk: BTreeSet<String> = std::fs::read_dir(d.root_path().join("sandboxes"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for id in on_disk.difference(&listed) {
        problems.push(format!("{id}: on disk but not in the store"));
    }
    for id in known.difference(&listed) {
        let t = traces(d, id);
        if !t.is_empty() {
            problems.push(format!("{id}: gone from the store but left {t:?}"));
        }
        if !cgroup_procs(id).is_empty() {
            problems.push(format!("{id}: gone from the store but has processes"));
        }
    }
    problems
}

/// A small xorshift generator: random kill points, reproducible from the printed seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn kill9_mid_operation_then_restart_is_consistent() {
    require_root!();
    let _s = serial();
    let mut d = Daemon::start(&normal_bins(), None);
    // THREADBOX_KILL9_SEED replays a printed seed (CI never sets it).
    let seed = std::env::var("THREADBOX_KILL9_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from_str_radix(&random_hex()[..12], 16).unwrap_or(1))
        | 1;
    eprintln!("kill -9 trials, seed {seed}");
    let mut rng = Rng(seed);
    let mut known: BTreeSet<String> = BTreeSet::new();
    let base = d.create(LimitsRequest::default());
    known.insert(base.clone());
    for trial in 0..20 {
        // The operation under test, started on the shared runtime; the kill lands at a
        // random point of it (0–400 ms in).
        let op = trial % 4;
        let client = d.client.clone();
        let target = block(d.client.list(&Default::default(), None))
            .ok()
            .and_then(|l| {
                l.sandboxes
                    .into_iter()
                    .find(|s| s.state == SandboxState::Running)
                    .map(|s| s.id)
            })
            .unwrap_or_else(|| base.clone());
        let handle = rt().spawn(async move {
            match op {
                0 => client
                    .create(&Default::default())
                    .await
                    .map(|(s, _)| Some(s.id))
                    .map_err(|e| e.to_string()),
                1 => client
                    .exec(
                        &target,
                        &ExecRequest {
                            shell: Some(
                                "dd if=/dev/zero of=/home/user/f bs=1M count=20 2>&1; sync".into(),
                            ),
                            timeout_secs: Some(30.0),
                            ..Default::default()
                        },
                    )
                    .await
                    .map(|_| None)
                    .map_err(|e| e.to_string()),
                2 => client
                    .write_file(
                        &target,
                        "/home/user/upload",
                        User::User,
                        vec![7u8; 16 << 20],
                    )
                    .await
                    .map(|_| None)
                    .map_err(|e| e.to_string()),
                _ => {
                    let (sb, _) = client
                        .create(&Default::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    client
                        .delete(&sb.id, true)
                        .await
                        .map(|_| Some(sb.id))
                        .map_err(|e| e.to_string())
                }
            }
        });
        let delay = rng.next() % 400;
        std::thread::sleep(Duration::from_millis(delay));
        d.kill9();
        if let Ok(Ok(Some(id))) = block(handle) {
            known.insert(id);
        }
        // Sandboxes created at the moment of the kill are only known from the disk.
        for e in std::fs::read_dir(d.root_path().join("sandboxes"))
            .into_iter()
            .flatten()
            .flatten()
        {
            known.insert(e.file_name().to_string_lossy().into_owned());
        }
        d.restart();
        let problems = consistency(&d, &known);
        assert!(
            problems.is_empty(),
            "trial {trial} (op {op}, kill after {delay} ms, seed {seed}): {problems:#?}\n{}",
            d.log()
        );
    }
    d.delete_all();
    for id in &known {
        wait_for(
            &format!("{id} to leave no trace"),
            Duration::from_secs(30),
            || traces(&d, id).is_empty(),
        );
    }
}
