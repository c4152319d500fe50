//! The agent's process API, end to end over the protocol (host test mode, as root).

mod common;

use common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use threadbox_proto::*;

#[test]
fn handshake_announces_version_and_capabilities() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    assert_eq!(c.peer.version, PROTOCOL_VERSION);
    for cap in ["exec", "stream", "background", "files", "selftest"] {
        assert!(c.peer.capabilities.iter().any(|c| c == cap), "{cap}");
    }
    assert_eq!(c.call(Request::Ping), Response::Pong);
}

#[test]
fn wrong_protocol_version_is_refused() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    // A second connection that claims another version gets closed.
    let stream = std::os::unix::net::UnixStream::connect(&agent.sock).unwrap();
    let mut bad = Hello::ours("old", &[]);
    bad.version = PROTOCOL_VERSION + 1;
    use std::io::{Read, Write};
    let mut s = stream;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&encode_frame(&Frame::Hello(bad)).unwrap())
        .unwrap();
    s.write_all(
        &encode_frame(&Frame::Request {
            id: 1,
            req: Request::Ping,
        })
        .unwrap(),
    )
    .unwrap();
    let mut all = Vec::new();
    s.read_to_end(&mut all).unwrap(); // EOF: the agent closed the connection
    let mut d = FrameDecoder::new();
    d.feed(&all);
    assert!(matches!(d.next_frame().unwrap(), Some(Frame::Hello(_))));
    assert_eq!(
        d.next_frame().unwrap(),
        None,
        "no answer to a request after a bad hello"
    );
    // The first connection is unaffected.
    assert_eq!(c.call(Request::Ping), Response::Pong);
}

#[test]
fn argv_and_shell() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let frames = c.call_all(Request::Exec(argv(&["echo", "hello", "world"])));
    assert!(matches!(frames[0], Response::Started { pid } if pid > 0));
    let Response::Exited(r) = frames.last().unwrap() else {
        panic!("{frames:?}")
    };
    assert_eq!(text(&r.stdout), "hello world\n");
    assert_eq!(r.exit_code, Some(0));
    assert!(!r.timed_out);

    let r = c.sh("echo $((40+2)); echo oops >&2; exit 3");
    assert_eq!(text(&r.stdout), "42\n");
    assert_eq!(text(&r.stderr), "oops\n");
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(r.signal, None);
}

#[test]
fn env_cwd_stdin_and_user() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let dir = Scratch::new();
    let mut spec =
        shell(r#"cat; echo "[$FOO] $HOME $USER $LOGNAME $LANG"; echo "$PATH"; pwd; id -u; id -G"#);
    spec.env = BTreeMap::from([("FOO".to_string(), "bar baz".to_string())]);
    spec.cwd = Some(dir.0.to_string_lossy().into());
    spec.stdin = Some(b"from stdin\n".to_vec());
    let r = c.exec(spec);
    let out = text(&r.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "from stdin");
    assert_eq!(lines[1], "[bar baz] /home/user user user C.UTF-8");
    assert_eq!(
        lines[2],
        "/home/user/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:\
         /opt/threadbox/bin"
    );
    assert_eq!(lines[3], dir.0.to_str().unwrap());
    assert_eq!(lines[4], "1000");
    assert_eq!(lines[5], "1000");

    // The request's env overrides the base one.
    let mut spec = shell("echo $PATH");
    spec.env.insert("PATH".into(), "/bin".into());
    assert_eq!(text(&c.exec(spec).stdout), "/bin\n");

    // Root: uid 0, home /root.
    let mut spec = shell("id -u; echo $HOME");
    spec.user = RunAs::Root;
    assert_eq!(text(&c.exec(spec).stdout), "0\n/root\n");

    // No stdin: /dev/null, so `cat` ends at once.
    assert_eq!(c.sh("cat; echo end").stdout, b"end\n");
}

#[test]
fn bad_requests_are_clear_errors() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let mut spec = shell("true");
    spec.cwd = Some("/nonexistent/dir".into());
    match c.call(Request::Exec(spec)) {
        Response::Error {
            kind: ErrorKind::NotFound,
            message,
        } => {
            assert!(
                message.contains("working directory /nonexistent/dir"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    match c.call(Request::Exec(argv(&["definitely-not-a-command-xyz"]))) {
        Response::Exited(r) => {
            assert_eq!(r.exit_code, Some(127));
            assert!(String::from_utf8_lossy(&r.stderr).contains("command not found"));
        }
        other => panic!("{other:?}"),
    }
    match c.call(Request::Exec(argv(&[]))) {
        Response::Error {
            kind: ErrorKind::InvalidArgument,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    match c.call(Request::Exec(argv(&["echo", "a\0b"]))) {
        Response::Error {
            kind: ErrorKind::InvalidArgument,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    // A working directory the user may not enter.
    let dir = Scratch::new();
    let locked = dir.0.join("locked");
    std::fs::create_dir(&locked).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut spec = shell("true");
    spec.cwd = Some(locked.to_string_lossy().into());
    match c.call(Request::Exec(spec)) {
        Response::Error {
            kind: ErrorKind::PermissionDenied,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    // The agent is still fine.
    assert_eq!(c.call(Request::Ping), Response::Pong);
}

#[test]
fn exit_codes_and_signals() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let r = c.sh("kill -9 $$");
    assert_eq!(r.exit_code, Some(137));
    assert_eq!(r.signal, Some(9));
    let r = c.sh("kill -TERM $$");
    assert_eq!(r.exit_code, Some(143));
    assert_eq!(r.signal, Some(15));
    assert_eq!(c.sh("exit 255").exit_code, Some(255));
}

#[test]
fn binary_output_is_preserved() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let r = c.sh(r"printf '\377\376\000abc\200'; printf '\303\050' >&2");
    assert_eq!(r.stdout, b"\xff\xfe\x00abc\x80");
    assert_eq!(r.stderr, b"\xc3\x28");
}

#[test]
fn huge_output_is_bounded_and_never_blocks_the_writer() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let mut spec = shell("head -c 50000000 /dev/zero; echo THE-END; echo done >&2");
    spec.max_output = 1 << 20;
    let r = c.exec(spec);
    assert_eq!(
        r.exit_code,
        Some(0),
        "the writer finished: the pipe kept being drained"
    );
    // Head and tail are kept (the summary a program prints last survives), with a
    // marker line between them.
    let marker = b"bytes of output cut here by the sandbox";
    let at = r
        .stdout
        .windows(marker.len())
        .position(|w| w == marker)
        .expect("a cut marker between head and tail");
    assert!(r.stdout[..at].starts_with(&[0u8; 1024]));
    assert!(
        r.stdout.ends_with(b"\0\0THE-END\n"),
        "the tail is the real end"
    );
    assert!(r.stdout.len() <= 1 << 20 && r.stdout.len() > (1 << 20) - 200);
    assert!(r.stdout_truncated);
    assert_eq!(r.stderr, b"done\n");
    assert!(!r.stderr_truncated);
    // Peak resident memory of the agent stays far below the 50 MB written.
    let hwm_kb: u64 = agent
        .status_field("VmHWM")
        .trim_end_matches(" kB")
        .trim()
        .parse()
        .unwrap();
    assert!(hwm_kb < 40 * 1024, "agent peak RSS {hwm_kb} kB");
}

#[test]
fn stream_mode_sends_output_frames() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let mut spec = shell("echo one; sleep 0.2; echo two >&2; echo three");
    spec.stream = true;
    let frames = c.call_all(Request::Exec(spec));
    assert!(matches!(frames[0], Response::Started { .. }));
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for f in &frames[1..frames.len() - 1] {
        match f {
            Response::Output {
                stream: Stream::Stdout,
                data,
            } => out.extend_from_slice(data),
            Response::Output {
                stream: Stream::Stderr,
                data,
            } => err.extend_from_slice(data),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(out, b"one\nthree\n");
    assert_eq!(err, b"two\n");
    let Response::Exited(r) = frames.last().unwrap() else {
        panic!()
    };
    assert_eq!(r.exit_code, Some(0));
    assert!(
        r.stdout.is_empty() && r.stderr.is_empty(),
        "stream mode leaves the final result empty"
    );
}

#[test]
fn background_child_holding_the_pipe_does_not_hang_the_call() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let dir = Scratch::new();
    let pidfile = dir.path("bg.pid");
    let t = Instant::now();
    let r = c.sh(&format!("sleep 100 & echo $! > {pidfile}; echo started"));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(text(&r.stdout), "started\n");
    // The background process survives the call (that is how dev servers stay up).
    let pid = read_pid(&pidfile);
    assert!(alive(pid));
    kill9(pid);
}

#[test]
fn timeout_kills_the_process_group_and_keeps_earlier_output() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let dir = Scratch::new();
    let pidfile = dir.path("child.pid");
    let mut spec = shell(&format!(
        "echo before; sleep 1000 & echo $! > {pidfile}; wait"
    ));
    spec.timeout_ms = Some(500);
    let t = Instant::now();
    let r = c.exec(spec);
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "reply took {:?}",
        t.elapsed()
    );
    assert!(r.timed_out);
    assert_eq!(r.exit_code, None);
    assert_eq!(text(&r.stdout), "before\n");
    let pid = read_pid(&pidfile);
    assert!(
        wait_until(Duration::from_secs(5), || !alive(pid)),
        "child {pid} survived the timeout"
    );
}

#[test]
fn cancel_kills_the_call() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let id = c.send(Request::Exec(shell("sleep 1000")));
    let Frame::Response {
        resp: Response::Started { pid },
        ..
    } = c.recv()
    else {
        panic!()
    };
    c.send_frame(&Frame::Cancel { id });
    match c.recv() {
        Frame::Response {
            id: got,
            resp:
                Response::Error {
                    kind: ErrorKind::Cancelled,
                    ..
                },
        } => assert_eq!(got, id),
        other => panic!("{other:?}"),
    }
    assert!(wait_until(Duration::from_secs(5), || !alive(pid)));
}

#[test]
fn requests_run_concurrently() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let slow = c.send(Request::Exec(shell("sleep 2; echo slow")));
    let fast = c.send(Request::FileStat {
        path: "/tmp".into(),
        user: RunAs::User,
    });
    let t = Instant::now();
    // The stat answer arrives while the exec is still running.
    let mut got_stat_at = None;
    let mut exited = false;
    while !exited {
        match c.recv() {
            Frame::Response {
                id,
                resp: Response::FileStat(_),
            } if id == fast => got_stat_at = Some(t.elapsed()),
            Frame::Response {
                id,
                resp: Response::Started { .. },
            } if id == slow => {}
            Frame::Response {
                id,
                resp: Response::Exited(r),
            } if id == slow => {
                assert_eq!(r.stdout, b"slow\n");
                exited = true;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(got_stat_at.expect("stat answered") < Duration::from_secs(1));
}

#[test]
fn second_connection_and_reconnect() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut a = agent.connect();
    let mut b = agent.connect();
    assert_eq!(a.sh("echo a").stdout, b"a\n");
    assert_eq!(b.sh("echo b").stdout, b"b\n");
    drop(a);
    let mut again = agent.connect();
    assert_eq!(again.call(Request::Ping), Response::Pong);
}

#[test]
fn orphans_are_reaped() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    let dir = Scratch::new();
    let pids = dir.path("orphans");
    // Ten orphans that outlive their parent briefly; they are re-parented to the agent.
    c.sh(&format!(
        "for i in 1 2 3 4 5 6 7 8 9 10; do (sleep 0.3 & echo $! >> {pids}); done"
    ));
    let pids: Vec<i32> = std::fs::read_to_string(&pids)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(pids.len(), 10);
    let agent_pid = agent.pid().to_string();
    let parent_of = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().nth(1).map(str::to_string))
            })
    };
    // Positive control: while alive they are the agent's children, so only the agent can
    // reap them.
    assert!(pids
        .iter()
        .any(|&p| parent_of(p).as_deref() == Some(agent_pid.as_str())));
    // Reaped = gone from /proc entirely (a zombie would stay).
    assert!(
        wait_until(Duration::from_secs(5), || pids
            .iter()
            .all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())),
        "orphans left as zombies"
    );
}

#[test]
fn agent_stays_single_threaded_and_not_dumpable() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    c.sh("echo warm-up");
    assert_eq!(agent.status_field("Threads"), "1");
    let _ = c.call(Request::Selftest);
    assert_eq!(agent.status_field("Threads"), "1");
}

#[test]
fn child_posture_under_the_policy() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    for (user, uid) in [(RunAs::User, "1000"), (RunAs::Root, "0")] {
        let mut spec = argv(&["cat", "/proc/self/status"]);
        spec.user = user;
        let status = text(&c.exec(spec).stdout);
        let field = |n: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(n).and_then(|v| v.strip_prefix(':')))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        assert_eq!(field("Seccomp"), "2");
        assert_eq!(field("NoNewPrivs"), "1");
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(
                u64::from_str_radix(&field(set), 16),
                Ok(0),
                "{set} for {user:?}"
            );
        }
        assert!(
            field("Uid").split_whitespace().all(|u| u == uid),
            "{}",
            field("Uid")
        );
        assert!(
            field("Groups").split_whitespace().all(|g| g == uid),
            "{}",
            field("Groups")
        );
    }
    // The layers act: namespaces, netlink, mounts refused; Landlock keeps /usr and / read-only.
    let r = c.sh("unshare -U true 2>&1; echo rc=$?");
    assert!(text(&r.stdout).contains("rc=1"), "{}", text(&r.stdout));
    let mut spec = shell("touch /landlock-probe 2>&1; echo rc=$?");
    spec.user = RunAs::Root;
    let r = c.exec(spec);
    assert!(text(&r.stdout).contains("rc=1"), "{}", text(&r.stdout));
    assert!(!std::path::Path::new("/landlock-probe").exists());
    // oom_score_adj raised so the OOM killer prefers user processes to the agent.
    assert_eq!(c.sh("cat /proc/self/oom_score_adj").stdout, b"500\n");
}

#[test]
fn stats_count_processes() {
    if skip_unless_root() {
        return;
    }
    let agent = Agent::start();
    let mut c = agent.connect();
    match c.call(Request::Stats) {
        Response::Stats { processes } => assert!(processes >= 2, "{processes}"),
        other => panic!("{other:?}"),
    }
}
