//! The security suite (docs/security.md): hostile programs in C, Python and shell run inside
//! real sandboxes; the host judges. Every escape case also runs against a deliberately
//! weakened jail (binaries built with the `insecure-test-hooks` feature into a separate
//! target dir) and must then report the escape: its positive control.
//!
//! Needs root and `cargo build --workspace --bins` first.

mod after_wake;
mod cases;
mod egress;
mod egress_dns;
mod egress_secrets;
mod harness;
mod host_handles;
mod posture;
mod robustness;
#[path = "../common/swap.rs"]
mod swap;
#[path = "../common/tiers.rs"]
mod tiers;
#[path = "../common/tls.rs"]
mod tls;

use base64::Engine;
use cases::{Case, Extra, Lang};
use harness::*;
use std::collections::BTreeMap;
use std::net::{TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use threadbox_api::{Encoding, ExecRequest, LimitsRequest, StartProcessRequest, User};

const PRELUDE: &str = include_str!("prelude.h");

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

// After `require_root!`, which it uses.
mod in_context;

/// How a case ended, as judged from the host.
#[derive(Debug)]
pub enum Verdict {
    Held,
    Escaped(Vec<String>),
    /// The case could not do its job (did not compile, did not finish): never a pass.
    Broken(String),
}

/// Host-side listeners that count what reaches them.
struct Sinks {
    tcp_port: u16,
    tcp_hits: Arc<AtomicUsize>,
    udp: UdpSocket,
}

impl Sinks {
    fn new() -> Sinks {
        let l = TcpListener::bind("0.0.0.0:0").expect("tcp sink");
        let tcp_port = l.local_addr().expect("addr").port();
        let tcp_hits = Arc::new(AtomicUsize::new(0));
        let hits = tcp_hits.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                if c.is_ok() {
                    hits.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        let udp = UdpSocket::bind("0.0.0.0:0").expect("udp sink");
        udp.set_nonblocking(true).expect("nonblocking");
        Sinks {
            tcp_port,
            tcp_hits,
            udp,
        }
    }

    fn udp_received(&self) -> usize {
        let mut n = 0;
        let mut buf = [0u8; 64];
        while self.udp.recv_from(&mut buf).is_ok() {
            n += 1;
        }
        n
    }
}

/// Class C's victim: a sandbox with a marker process, an abstract socket, SysV IPC, a file.
struct Victim {
    /// The victim's sandbox and its marker process (the agent's background process id).
    sandbox: String,
    process: u64,
    marker: String,
    abstract_name: String,
    shm_key: u32,
}

const VICTIM_PY: &str = r##"
import ctypes, socket, sys
marker = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind('\0tb-victim-' + marker); s.listen(8)
libc = ctypes.CDLL(None)
key = int(sys.argv[2])
shm = libc.shmget(key, 4096, 0o1666)
libc.shmat.restype = ctypes.c_void_p
addr = libc.shmat(shm, None, 0)
ctypes.memmove(addr, b'VICTIMSECRET' + marker.encode(), 12 + len(marker))
libc.msgget(key, 0o1666); libc.semget(key, 1, 0o1666)
open('/tmp/victim-ready', 'w').close()
while True:
    c, _ = s.accept(); c.sendall(b'VICTIMSECRET' + marker.encode()); c.close()
"##;

fn start_victim(d: &Daemon) -> Victim {
    let marker = random_hex()[..12].to_string();
    let shm_key = u32::from_str_radix(&random_hex()[..6], 16).expect("hex") + 1;
    let id = d.create(LimitsRequest::default());
    d.write(
        &id,
        &format!("/home/user/victim-{marker}.txt"),
        User::Root,
        format!("VICTIMSECRET{marker}").as_bytes(),
    );
    let req = StartProcessRequest {
        command: Some(vec![
            "python3".into(),
            "-c".into(),
            VICTIM_PY.into(),
            marker.clone(),
            shm_key.to_string(),
        ]),
        ..Default::default()
    };
    let p = block(d.client.start_process(&id, &req)).expect("victim process");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while d.sh(&id, User::User, "test -f /tmp/victim-ready").exit_code != Some(0) {
        if std::time::Instant::now() > deadline {
            panic!(
                "the victim did not start: {:?}",
                block(d.client.process_logs(&id, p.id))
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Victim {
        sandbox: id,
        process: p.id,
        abstract_name: format!("tb-victim-{marker}"),
        marker,
        shm_key,
    }
}

/// Whether the victim's marker process still runs. On the jail, judged by host pids (its
/// python runs on the host kernel); on gvisor the host sees only the victim's sentry, so
/// by what the victim's own agent sees in its sentry: the marker process still running.
fn victim_alive(d: &Daemon, v: &Victim) -> bool {
    if d.tier == "jail" {
        return !host_pids_with(&v.marker).is_empty();
    }
    block(d.client.list_processes(&v.sandbox))
        .map(|l| l.processes.iter().any(|p| p.id == v.process && p.running))
        .unwrap_or(false)
}

/// A3 on gvisor: every host process of the sandbox (its cgroup: the sentry, its stubs, the
/// gofer) runs in a user namespace that is not the host's, so none holds a capability of
/// the host's; sandbox root is the sentry's uid 0, which maps to no host identity by
/// itself. Networked gvisor sandboxes do not have this (runsc keeps the sentry in the
/// host's user namespace on `--network=host`: docs/tiers.md); this case's has none.
fn host_userns(id: &str, escaped: &mut Vec<String>, log: &mut String) -> Result<(), String> {
    let host = std::fs::read_link("/proc/self/ns/user").map_err(|e| format!("own userns: {e}"))?;
    let mut pids = Vec::new();
    for dir in [
        format!("/sys/fs/cgroup/threadbox/{id}"),
        format!("/sys/fs/cgroup/unified/threadbox/{id}"),
        format!("/sys/fs/cgroup/pids/threadbox/{id}"),
    ] {
        let mut stack = vec![std::path::PathBuf::from(dir)];
        while let Some(d) = stack.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
            let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
            pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    if pids.is_empty() {
        return Err(format!("no host process found in the cgroup of {id}"));
    }
    for pid in pids {
        let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/user")) else {
            continue; // exited meanwhile
        };
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmd: String = String::from_utf8_lossy(&cmd)
            .replace('\0', " ")
            .chars()
            .take(40)
            .collect();
        log.push_str(&format!("host pid {pid} ({cmd}): {}\n", ns.display()));
        if ns == host {
            escaped.push(format!(
                "host pid {pid} ({cmd}) of the sandbox runs in the host's user namespace"
            ));
        }
    }
    Ok(())
}

/// Everything a run of cases shares.
struct Ctx {
    flag: Flag,
    sinks: Sinks,
    host_ip: Option<String>,
    victim: Option<Victim>,
    /// Run each case's program in an interpreter context, not an exec (in_context.rs).
    in_context: bool,
}

fn decode(s: &str, enc: Encoding) -> Vec<u8> {
    match enc {
        Encoding::Utf8 => s.as_bytes().to_vec(),
        Encoding::Base64 => base64::engine::general_purpose::STANDARD
            .decode(s)
            .unwrap_or_default(),
    }
}

fn daemon_rss_kib(d: &Daemon) -> u64 {
    let pid = d.pid().expect("daemon running");
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Runs one case in a fresh sandbox and judges it from the host.
fn run_case(d: &mut Daemon, ctx: &mut Ctx, case: &Case) -> (Verdict, String) {
    let mut log = String::new();
    let mut escaped: Vec<String> = Vec::new();
    let mut broken: Option<String> = None;
    let limits = case
        .limits
        .map(|(m, p)| LimitsRequest {
            memory_bytes: Some(m),
            pids: Some(p),
            ..Default::default()
        })
        .unwrap_or_default();
    let limits = LimitsRequest {
        disk_bytes: case.disk,
        cpus: case.cpus,
        ..limits
    };
    if case.extra == Extra::Victim && ctx.victim.is_none() {
        ctx.victim = Some(start_victim(d));
    }
    let id = d.create(limits);
    let watched = [d.bins.agent.clone(), ctx.flag.path()];
    let watched: Vec<&std::path::Path> = watched.iter().map(|p| p.as_path()).collect();
    let hashes = host_hashes(&watched);
    let flag_before = ctx.flag.snapshot();
    let tcp_before = ctx.sinks.tcp_hits.load(Ordering::SeqCst);
    ctx.sinks.udp_received();

    let mut env = BTreeMap::new();
    let flag_dir = ctx
        .flag
        .dir
        .path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    env.insert("FLAG_DIR".to_string(), flag_dir);
    env.insert("DAEMON_PORT".into(), d.port.to_string());
    // The tier the case runs on, for a probe whose inside view differs by tier (the
    // sentry's /proc is not the host kernel's); the host-side judgement is the same.
    env.insert("TB_TIER".into(), d.tier.clone());
    env.insert(
        "DAEMON_SOCK".into(),
        d.root_path().join("threadbox.sock").display().to_string(),
    );
    env.insert("TCP_PORT".into(), ctx.sinks.tcp_port.to_string());
    env.insert(
        "UDP_PORT".into(),
        ctx.sinks
            .udp
            .local_addr()
            .map(|a| a.port())
            .unwrap_or(0)
            .to_string(),
    );
    env.insert("HOST_IP".into(), ctx.host_ip.clone().unwrap_or_default());
    if let Some(v) = &ctx.victim {
        env.insert("VICTIM_MARKER".into(), v.marker.clone());
        env.insert("VICTIM_ABSTRACT".into(), v.abstract_name.clone());
        env.insert("SHM_KEY".into(), v.shm_key.to_string());
    }

    // A directory owned by sandbox root (the image's own directories are not).
    block(d.client.mkdir(&id, "/home/user/rootdir", User::Root, false)).expect("mkdir rootdir");
    if let Some(setup) = case.setup {
        let r = d.sh(&id, User::Root, setup);
        if r.exit_code != Some(0) {
            broken = Some(format!("setup failed: {}{}", r.stdout, r.stderr));
        }
    }
    let (path, argv): (&str, Vec<String>) = match case.lang {
        Lang::Sh => ("/tmp/case.sh", vec!["sh".into(), "/tmp/case.sh".into()]),
        Lang::Py => (
            "/tmp/case.py",
            vec!["python3".into(), "/tmp/case.py".into()],
        ),
        Lang::C => ("/tmp/case.c", vec!["/tmp/case".into()]),
    };
    let source = match case.lang {
        Lang::C => format!("{PRELUDE}\n{}", case.code),
        _ => case.code.to_string(),
    };
    d.write(&id, path, User::Root, source.as_bytes());
    if case.lang == Lang::C {
        let r = d.sh(&id, case.user, "gcc -O0 -w -o /tmp/case /tmp/case.c");
        if r.exit_code != Some(0) {
            broken = Some(format!("gcc failed: {}{}", r.stdout, r.stderr));
        }
    }
    if case.extra == Extra::PauseResumeRestart {
        block(d.client.pause(&id)).expect("pause");
        block(d.client.resume(&id)).expect("resume");
        d.kill9();
        d.restart();
    }
    let rss_before = daemon_rss_kib(d);

    let mut text = String::new();
    let req = ExecRequest {
        command: Some(argv.clone()),
        env: env.clone(),
        user: case.user,
        timeout_secs: Some(case.timeout),
        max_output_bytes: case.max_output,
        ..Default::default()
    };
    if broken.is_none() {
        match case.extra {
            Extra::BackgroundKill => {
                let p = block(d.client.start_process(
                    &id,
                    &StartProcessRequest {
                        shell: Some(case.code.to_string()),
                        user: case.user,
                        ..Default::default()
                    },
                ))
                .expect("start background process");
                wait_for("the background tree", Duration::from_secs(20), || {
                    d.sh(&id, User::Root, "for c in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $c | grep -q '^sleep 7774' && exit 0; done; exit 1")
                        .exit_code
                        == Some(0)
                });
                block(d.client.kill_process(&id, p.id, None)).expect("kill");
                text.push_str("END\n");
            }
            Extra::HostCounters => {
                host_handles::counters(d, &id, case, &mut escaped, &mut log);
                text.push_str("END\n");
            }
            Extra::FileApiRace => {
                let swapper = block(d.client.start_process(
                    &id,
                    &StartProcessRequest {
                        shell: Some(case.code.to_string()),
                        user: case.user,
                        ..Default::default()
                    },
                ))
                .expect("swapper");
                let marker = format!("TBMARK{}", random_hex());
                for _ in 0..150 {
                    let _ = block(d.client.write_file(
                        &id,
                        "/tmp/h3",
                        User::Root,
                        marker.clone().into_bytes(),
                    ));
                    if let Ok(b) = block(d.client.read_file_bytes(&id, "/tmp/h3", User::Root)) {
                        let s = String::from_utf8_lossy(&b);
                        if s.contains("threadbox-agent") {
                            escaped.push("read the host's agent log through the race".into());
                        }
                    }
                }
                let _ = block(d.client.kill_process(&id, swapper.id, None));
                let agent_log = d.root_path().join(format!("sandboxes/{id}/run/agent.log"));
                let logtext = std::fs::read_to_string(&agent_log).unwrap_or_default();
                if logtext.contains(&marker) || logtext.is_empty() {
                    escaped.push("wrote into the host's agent log through the race".into());
                }
                text.push_str("END\n");
            }
            _ => {
                let r = if ctx.in_context {
                    in_context::exec(d, &id, &req)
                } else {
                    block(d.client.exec(&id, &req)).map_err(|e| e.to_string())
                };
                let r = match r {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = block(d.client.delete(&id, true));
                        return (Verdict::Broken(format!("exec failed: {e}")), log);
                    }
                };
                let out = decode(&r.stdout, r.encoding);
                let err = decode(&r.stderr, r.encoding);
                log.push_str(&format!(
                    "exit {:?} signal {:?} timed_out {} truncated {}\n",
                    r.exit_code, r.signal, r.timed_out, r.truncated
                ));
                if case.expect_timeout && !r.timed_out {
                    broken = Some("expected the timeout to end it".into());
                }
                // Ended by the expected timeout, or cut at the bound: ran as far as it could.
                let finished = (case.expect_timeout && r.timed_out)
                    || (case.max_output.is_some() && r.exit_code == Some(0));
                if let Some(max) = case.max_output {
                    if out.len() as u64 > max || err.len() as u64 > max {
                        escaped.push(format!(
                            "output not bounded: {} / {} bytes over {max}",
                            out.len(),
                            err.len()
                        ));
                    } else if !r.truncated && case.id != "G4" {
                        broken = Some("output was not marked truncated".into());
                    }
                }
                if case.id == "G4" {
                    // Lost bytes are what this case guards against: an escape, not a break.
                    if r.encoding != Encoding::Base64 || out != b"a\0b\xff\xfeEND\n" {
                        escaped.push(format!("not byte-exact: {:?} {:?}", r.encoding, out));
                    }
                    text.push_str("END\n");
                }
                if case.id == "G5" {
                    // Repeat the flood; the daemon must not keep what it cut off.
                    for _ in 0..4 {
                        d.exec(&id, &req);
                    }
                    let grown = daemon_rss_kib(d).saturating_sub(rss_before);
                    log.push_str(&format!("daemon RSS grew {grown} KiB\n"));
                    if grown > 64 * 1024 {
                        escaped.push(format!("daemon RSS grew by {grown} KiB"));
                    }
                }
                if case.max_output.is_none() {
                    text.push_str(&String::from_utf8_lossy(&out));
                    text.push_str(&String::from_utf8_lossy(&err));
                }
                if finished && case.post.is_none() {
                    text.push_str("END\n");
                }
            }
        }
    }
    match case.extra {
        Extra::FileApiMagicLink if case.id == "H2" => {
            let marker = format!("TBMARK{}", random_hex());
            for p in ["/tmp/h2", "/home/user/rootdir/h2"] {
                if let Ok(b) = block(d.client.read_file_bytes(&id, p, User::Root)) {
                    if String::from_utf8_lossy(&b).contains("threadbox-agent") {
                        escaped.push(format!("read the host's agent log through {p}"));
                    }
                }

                let _ = block(
                    d.client
                        .write_file(&id, p, User::Root, marker.clone().into_bytes()),
                );
            }
            let agent_log = d.root_path().join(format!("sandboxes/{id}/run/agent.log"));
            let logtext = std::fs::read_to_string(&agent_log).unwrap_or_default();
            if logtext.contains(&marker) || logtext.is_empty() {
                escaped.push("wrote into the host's agent log".into());
            }
        }
        Extra::FileApiMagicLink => {
            // H4: the user's file API must not pass through to a root-only file.
            if let Ok(b) = block(d.client.read_file_bytes(&id, "/home/user/h4", User::User)) {
                escaped.push(format!(
                    "user read a root-only file: {}",
                    String::from_utf8_lossy(&b)
                ));
            }
            let _ = block(
                d.client
                    .write_file(&id, "/home/user/h4", User::User, "pwned"),
            );
            let secret = block(d.client.read_file_bytes(
                &id,
                "/home/user/rootdir/secret",
                User::Root,
            ));
            match secret {
                Ok(b) if b == b"rootonly-secret\n" => {}
                other => escaped.push(format!("the root-only file changed: {other:?}")),
            }
        }
        Extra::FileApiSpecial => {
            for p in [
                "/tmp/fifo",
                "/tmp/zero",
                "/tmp/mem",
                "/dev/zero",
                "/proc/self/environ",
            ] {
                match block(d.client.read_file_bytes(&id, p, User::Root)) {
                    Ok(b) => escaped.push(format!("file API read {} bytes from {p}", b.len())),
                    Err(e) => log.push_str(&format!("refused {p}: {e}\n")),
                }
            }
        }
        Extra::FileApiPaths => {
            let flag_dir = ctx
                .flag
                .dir
                .path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let long = "a/".repeat(3000);
            let paths = [
                format!("../../../../../../tmp/{flag_dir}/flag"),
                format!("/home/user/../../../tmp/{flag_dir}/flag"),
                format!("/host-tmp/{flag_dir}/flag"),
                format!("/home/user/../../host-tmp/{flag_dir}/flag"),
                format!("/proc/1/root/tmp/{flag_dir}/flag"),
                format!("/proc/self/root/../../tmp/{flag_dir}/flag"),
                "/proc/1/environ".to_string(),
                "/proc/kcore".to_string(),
                "/etc/passwd\0/../../flag".to_string(),
                long,
            ];
            for p in &paths {
                match block(d.client.read_file_bytes(&id, p, User::Root)) {
                    Ok(b) => {
                        let s = String::from_utf8_lossy(&b);
                        if s.contains(&ctx.flag.secret) {
                            escaped.push(format!("file API read the host flag via {p}"));
                        }
                        log.push_str(&format!("read {p}: {} bytes\n", b.len()));
                    }
                    Err(e) => log.push_str(&format!("refused {p}: {e}\n")),
                }
                let _ = block(d.client.write_file(&id, p, User::Root, "pwned"));
            }
        }
        Extra::HostHandleCwd => host_handles::cwd(d, &id, &mut escaped, &mut log),
        Extra::HostHandleFiles => host_handles::files(d, &id, &mut escaped, &mut log),
        Extra::CgroupTree => host_handles::cgroup_tree(&id, &mut escaped, &mut log),
        // The jail's ids are judged inside (its uid_map is the host's mapping); the
        // sentry's map is its own, so on gvisor the host processes are judged.
        Extra::HostIds if d.tier != "jail" => {
            if let Err(e) = host_userns(&id, &mut escaped, &mut log) {
                broken = Some(e);
            }
        }
        _ => {}
    }
    if case.extra == Extra::Reboot {
        let booted = block(d.client.stop(&id)).and_then(|_| block(d.client.start(&id)));
        match booted {
            Ok(_) if d.sh(&id, User::User, "echo up").stdout == "up\n" => {}
            other => {
                broken = Some(format!(
                    "the sandbox does not boot after the case: {other:?}"
                ))
            }
        }
    }
    if let Some(post) = case.post {
        // A sandbox the case took down answers no check: that is the case's verdict
        // (Broken), not a harness failure (E7 on gvisor loses its sentry in some runs).
        let req = ExecRequest {
            shell: Some(post.to_string()),
            user: User::Root,
            timeout_secs: Some(60.0),
            ..Default::default()
        };
        match block(d.client.exec(&id, &req)) {
            Ok(r) => {
                text.push_str(&r.stdout);
                text.push_str(&r.stderr);
            }
            Err(e) => {
                broken = broken.or(Some(format!("the check after the case could not run: {e}")))
            }
        }
    }

    // ---- judgement from the host
    for l in text.lines().filter(|l| l.contains("ESCAPE")) {
        escaped.push(l.to_string());
    }
    if text.contains(&ctx.flag.secret) {
        escaped.push("the host flag was read".into());
    }
    let root_name = d
        .root_path()
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if text.contains(&root_name) {
        escaped.push(format!("a host path ({root_name}) is visible inside"));
    }
    if let Some(v) = &ctx.victim {
        if text.contains(&format!("VICTIMSECRET{}", v.marker)) {
            escaped.push("read the victim's data".into());
        }
        if case.extra == Extra::Victim && !victim_alive(d, v) {
            escaped.push("the victim's process was killed".into());
            ctx.victim = None;
        }
    }
    let after = host_hashes(&watched);
    for (k, v) in &hashes {
        if after.get(k) != Some(v) {
            escaped.push(format!("host file {k} changed"));
        }
    }
    if ctx.flag.snapshot() != flag_before {
        escaped.push("the host flag directory changed".into());
        let _ = std::fs::remove_file(ctx.flag.dir.path().join("pwned"));
    }
    let outside = processes_outside_cgroups();
    if !outside.is_empty() {
        escaped.push(format!("processes outside the cgroups: {outside:?}"));
    }
    if ctx.sinks.tcp_hits.load(Ordering::SeqCst) != tcp_before {
        escaped.push("a TCP connection reached the host".into());
    }
    if ctx.sinks.udp_received() > 0 {
        escaped.push("a UDP datagram reached the host".into());
    }
    if case.extra == Extra::MemoryPeak {
        let (limit, _) = case.limits.unwrap_or((u64::MAX, 0));
        // On gvisor the host cgroup holds runsc as well as the sandbox, and has room on
        // top of the sandbox's limit, which the agent's watchdog holds inside (ADR 0205):
        // the host's peak is judged against that, as the pids backstop is (ADR 0185).
        let limit = if d.tier == "gvisor" {
            threadbox_jail::gvisor_memory::host_memory(limit)
        } else {
            limit
        };
        match memory_peak(&id) {
            Some(peak) if peak > limit => {
                escaped.push(format!("memory peak {peak} over the limit {limit}"))
            }
            Some(peak) => log.push_str(&format!("memory peak {peak}\n")),
            None => broken = Some("no memory peak file".into()),
        }
    }
    if case.extra == Extra::CpuQuota {
        let asked = case.cpus.unwrap_or(1.0);
        match cpu_quota_cores(&id) {
            Some((cores, file)) => {
                log.push_str(&format!("{file}: {cores:?} cores (asked {asked})\n"));
                // Rounded to whole microseconds of a 100 ms period by the daemon.
                if cores.is_none_or(|c| c > asked + 0.01) {
                    escaped.push(format!(
                        "the cgroup's CPU quota is {cores:?} cores, not the {asked} asked"
                    ));
                }
            }
            None => broken = Some("no CPU quota file for the sandbox's cgroup".into()),
        }
        if let Some((file, stat)) = cpu_throttling(&id) {
            log.push_str(&format!("{file}: {}\n", stat.replace('\n', ", ")));
        }
    }
    if !d.healthy() {
        escaped.push("the daemon stopped answering".into());
    }
    if !text.contains("END") && broken.is_none() {
        broken = Some("the program did not run to its end".into());
    }
    log.push_str(&text);
    if d.tier == "gvisor" && case.limits.is_some() {
        // The figures of ADR 0205: how close the host cgroup came to its limit, and what
        // the agent's watchdog did.
        eprintln!(
            "{} [gvisor] host memory peak {:?}",
            case.id,
            memory_peak(&id)
        );
        let agent_log = d.root_path().join(format!("sandboxes/{id}/run/agent.log"));
        for l in std::fs::read_to_string(agent_log)
            .unwrap_or_default()
            .lines()
        {
            if l.contains("oom:") {
                eprintln!("{} [gvisor] {l}", case.id);
            }
        }
    }
    let _ = block(d.client.delete(&id, true));
    escaped.dedup();
    escaped.truncate(8);
    let verdict = if !escaped.is_empty() {
        Verdict::Escaped(escaped)
    } else if let Some(b) = broken {
        Verdict::Broken(b)
    } else {
        Verdict::Held
    };
    (verdict, log)
}

/// The CPU quota of the sandbox's host cgroup in cores (`None`: unlimited), and the file
/// it was read from: `cpu.max` on cgroup v2, `cpu.cfs_quota_us` on v1 (hybrid hosts).
fn cpu_quota_cores(id: &str) -> Option<(Option<f64>, String)> {
    let v2 = [
        format!("/sys/fs/cgroup/unified/threadbox/{id}/cpu.max"),
        format!("/sys/fs/cgroup/threadbox/{id}/cpu.max"),
    ];
    for file in v2 {
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let mut f = text.split_whitespace();
        let (quota, period) = (f.next()?, f.next()?.parse::<f64>().ok()?);
        let cores = match quota {
            "max" => None,
            q => Some(q.parse::<f64>().ok()? / period),
        };
        return Some((cores, file));
    }
    let dir = format!("/sys/fs/cgroup/cpu/threadbox/{id}");
    let read = |f: &str| -> Option<f64> {
        std::fs::read_to_string(format!("{dir}/{f}"))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let (quota, period) = (read("cpu.cfs_quota_us")?, read("cpu.cfs_period_us")?);
    let cores = (quota >= 0.0).then(|| quota / period);
    Some((cores, format!("{dir}/cpu.cfs_quota_us")))
}

/// The sandbox cgroup's `cpu.stat` (throttled periods and time), on the layout that has
/// the cpu controller.
fn cpu_throttling(id: &str) -> Option<(String, String)> {
    [
        format!("/sys/fs/cgroup/unified/threadbox/{id}/cpu.stat"),
        format!("/sys/fs/cgroup/threadbox/{id}/cpu.stat"),
        format!("/sys/fs/cgroup/cpu/threadbox/{id}/cpu.stat"),
    ]
    .into_iter()
    .filter_map(|f| Some((std::fs::read_to_string(&f).ok()?, f)))
    .find(|(text, _)| text.contains("throttled"))
    .map(|(text, f)| (f, text.trim().to_string()))
}

fn new_ctx() -> Ctx {
    Ctx {
        flag: Flag::new(),
        sinks: Sinks::new(),
        host_ip: host_ipv4(),
        victim: None,
        in_context: false,
    }
}

/// A neighbour sandbox running execs in a loop while cases run.
struct Neighbour {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicUsize>,
    failed: Arc<std::sync::Mutex<Vec<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Neighbour {
    fn start(d: &Daemon) -> Neighbour {
        let id = d.create(LimitsRequest::default());
        let client = d.client.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s, o, f) = (stop.clone(), ok.clone(), failed.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let req = ExecRequest {
                    command: Some(vec!["echo".into(), "alive".into()]),
                    timeout_secs: Some(60.0),
                    ..Default::default()
                };
                let health = block(client.health());
                match (block(client.exec(&id, &req)), health) {
                    (Ok(r), Ok(_)) if r.exit_code == Some(0) && r.stdout == "alive\n" => {
                        o.fetch_add(1, Ordering::SeqCst);
                    }
                    (r, h) => f
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(format!("{r:?} / {h:?}")),
                }
            }
        });
        Neighbour {
            stop,
            ok,
            failed,
            thread: Some(thread),
        }
    }

    /// Waits until the neighbour has completed `n` more execs.
    fn progressed(&self, n: usize, what: &str) {
        let start = self.ok.load(Ordering::SeqCst);
        wait_for(what, Duration::from_secs(60), || {
            self.ok.load(Ordering::SeqCst) >= start + n
        });
    }

    fn finish(mut self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        f.clone()
    }
}

#[test]
fn every_case_holds_against_the_real_jail() {
    require_root!();
    if !tiers::under_test().iter().any(|t| t == "jail") {
        eprintln!("skipped on tier jail: not in THREADBOX_TEST_TIERS");
        return;
    }
    let _s = serial();
    every_case_holds(Daemon::start(&normal_bins(), None));
}

/// The same cases on the gvisor tier (ADR 0145): one daemon, each case in a fresh gvisor
/// sandbox, judged from the host the same way; a case needing a capability the tier lacks
/// is skipped by name.
#[test]
fn every_case_holds_on_gvisor() {
    require_root!();
    if !tiers::under_test().iter().any(|t| t == "gvisor") {
        eprintln!("skipped on tier gvisor: not in THREADBOX_TEST_TIERS");
        return;
    }
    let _s = serial();
    let d = Daemon::start(&normal_bins(), None).on_tier("gvisor");
    if d.runs("gvisor", &[]) {
        every_case_holds(d);
    }
}

/// Cases that do not hold on gvisor yet, each with why (docs/tiers.md, "Not yet"): a
/// ratchet, not a skip. Each still runs and prints its verdict; one that holds fails the
/// test until it is taken off this list, and any case not on it must hold. The probes
/// written for the jail judge per tier now (ADR 0190); what is left are open gaps of the
/// tier.
const GVISOR_OPEN: &[(&str, &str)] = &[
    ("E7", "open gap: the call's cgroup ends the setsid'd bomb when the sentry survives it (ADR 0214), but systrap's host tasks and memory for a bomb held at 64 processes inside vary run to run (250 to 832 tasks, 81 to over 208 MiB; once past Go's 10000-thread limit), and the host cgroup's refusal or OOM kill takes the sentry"),
];

/// Cases of `GVISOR_OPEN` that hold in some runs and not in others (E7: whether the sentry
/// survives the bomb, ADR 0214): a run where one holds prints so instead of failing.
const GVISOR_SOMETIMES: &[&str] = &["E7"];

/// The cases a daemon's tier can run: every case, less those needing a capability it
/// lacks (each printed), less those `THREADBOX_SECURITY_CASES` leaves out.
fn cases_for(d: &Daemon, all: Vec<Case>) -> Vec<Case> {
    all.into_iter()
        .filter(|c| {
            c.needs.is_empty() || {
                let runs = d.runs(&d.tier, c.needs);
                if !runs {
                    eprintln!("{} skipped on tier {} (needs {:?})", c.id, d.tier, c.needs);
                }
                runs
            }
        })
        .collect()
}

fn every_case_holds(mut d: Daemon) {
    let mut ctx = new_ctx();
    let mut cases = cases::all();
    let mut per_class: BTreeMap<char, usize> = BTreeMap::new();
    for c in &cases {
        *per_class
            .entry(c.id.chars().next().unwrap_or('?'))
            .or_default() += 1;
    }
    for class in "ABCDEFGHI".chars() {
        assert!(
            per_class.get(&class).copied().unwrap_or(0) >= 5,
            "class {class} has fewer than five cases: {per_class:?}"
        );
    }
    let mut cases = cases_for(&d, std::mem::take(&mut cases));
    // For a developer chasing one case: THREADBOX_SECURITY_CASES=E7,B2 runs only those
    // (here and in the positive controls). CI never sets it, so CI runs every case.
    if let Ok(only) = std::env::var("THREADBOX_SECURITY_CASES") {
        let wanted: Vec<&str> = only.split(',').map(str::trim).collect();
        cases.retain(|c| wanted.contains(&c.id));
        assert!(
            !cases.is_empty(),
            "THREADBOX_SECURITY_CASES matched no case"
        );
    }
    // Class E runs with a neighbour sandbox exec'ing in a loop: it must keep succeeding.
    let mut neighbour: Option<Neighbour> = None;
    let mut failures = Vec::new();
    for case in &cases {
        let is_e = case.id.starts_with('E');
        if is_e && neighbour.is_none() {
            neighbour = Some(Neighbour::start(&d));
        }
        if !is_e {
            if let Some(n) = neighbour.take() {
                let f = n.finish();
                assert!(f.is_empty(), "the neighbour failed during class E: {f:#?}");
            }
        }
        let (v, log) = run_case(&mut d, &mut ctx, case);
        eprintln!("{} [{}] {:?}", case.id, d.tier, v);
        let open = GVISOR_OPEN
            .iter()
            .find(|(id, _)| d.tier == "gvisor" && *id == case.id);
        match (v, open) {
            (Verdict::Held, None) => {}
            (Verdict::Held, Some((_, why))) if GVISOR_SOMETIMES.contains(&case.id) => {
                eprintln!("{} held on gvisor this run (still open: {why})", case.id)
            }
            (Verdict::Held, Some(_)) => failures.push(format!(
                "{} now holds on gvisor: take it off GVISOR_OPEN (and docs/tiers.md)",
                case.id
            )),
            (other, Some((_, why))) => {
                eprintln!("{} open on gvisor ({why}): {other:?}", case.id)
            }
            (other, None) => {
                failures.push(format!("{} ({}): {:?}\n{}", case.id, case.what, other, log))
            }
        }
        if let Some(n) = &neighbour {
            n.progressed(
                2,
                &format!("the neighbour to keep running after {}", case.id),
            );
        }
    }
    if let Some(n) = neighbour.take() {
        let f = n.finish();
        assert!(f.is_empty(), "the neighbour failed during class E: {f:#?}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn positive_controls_detect_every_escape() {
    require_root!();
    let weak = weakened_bins();
    let _s = serial();
    let mut groups: BTreeMap<&str, Vec<Case>> = BTreeMap::new();
    let only = std::env::var("THREADBOX_SECURITY_CASES").ok();
    for c in cases::all() {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|x| x.trim() == c.id))
        {
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
        for case in cases {
            let (v, log) = run_case(&mut d, &mut ctx, case);
            eprintln!("control {} [{weaken}] {:?}", case.id, v);
            if !matches!(v, Verdict::Escaped(_)) {
                failures.push(format!(
                    "{} did not detect the escape under {weaken}: {:?}\n{}",
                    case.id, v, log
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Weakenings the gvisor launch does not honour, each with why (ADR 0192, docs/tiers.md):
/// a control made only of these is not run on gvisor, and says so. Every other weakening
/// removes its layer on gvisor too (the agent's through `--test-weaken`, the launch's in
/// `gvisor_weaken.rs`).
const GVISOR_UNWEAKENABLE: &[(&str, &str)] = &[
    ("no-landlock", "the sentry has no Landlock: there is no such layer to remove"),
    ("no-landlock-kernel", "the agent on gvisor runs without Landlock already"),
    ("shared-pidns", "each sandbox is a sentry of its own, whose pids are its own: no launch puts two sandboxes' processes in one pid space"),
    ("shared-ipcns", "SysV IPC and POSIX queues are the sentry's own objects, one set per sandbox"),
    ("root-owned-userns", "gvisor maps no host uid range per sandbox (no uid_ranges): those counters are the sentry's"),
    ("host-cgroup-fd", "the agent gets no host cgroup directory on gvisor: its call cgroups are the sentry's own (ADR 0214)"),
    ("wake-unmask", "the gvisor wake restores the sentry's mount table from its image: no mask is made at the wake to drop"),
];

/// Cases whose control shows nothing on gvisor although some of its weakenings are
/// honoured there, each with why: the layer the control removes on the jail is not what
/// keeps the case on gvisor.
const GVISOR_CONTROL_MOOT: &[(&str, &str)] = &[
    ("C2", "the victim's processes are in another sentry: no weakening of this sandbox's makes them its own to signal"),
    ("C3", "abstract unix sockets are the sentry's own, also on the host network (shared-netns)"),
];

/// Cases whose control is shown on gvisor (run by the test below, which must see each
/// escape). A case holding on gvisor with a control that means something there but not on
/// this list is printed as not shown yet (docs/tiers.md): the list grows as each is run.
const GVISOR_CONTROLS: &[&str] = &[
    "A1", "A3", "A8", "B1", "B3", "B4", "B7", "B8", "C5", "E2", "E3", "E6", "F1", "F2", "F4", "F5",
];

/// The gvisor half of the positive controls (ADR 0192): each case that holds on gvisor,
/// with a control that means something there, runs against a weakened gvisor launch and
/// must report its escape. What is not run says why, by name.
#[test]
fn positive_controls_detect_every_escape_on_gvisor() {
    require_root!();
    if !tiers::under_test().iter().any(|t| t == "gvisor") {
        eprintln!("skipped on tier gvisor: not in THREADBOX_TEST_TIERS");
        return;
    }
    let weak = weakened_bins();
    let _s = serial();
    let only = std::env::var("THREADBOX_SECURITY_CASES").ok();
    let all: Vec<Case> = cases::all()
        .into_iter()
        .filter(|c| {
            only.as_deref()
                .is_none_or(|o| o.split(',').any(|x| x.trim() == c.id))
        })
        .collect();
    let probe = Daemon::start(&weak, None).on_tier("gvisor");
    if !probe.runs("gvisor", &[]) {
        return;
    }
    let runnable = cases_for(&probe, all);
    drop(probe);
    let mut groups: BTreeMap<&str, Vec<Case>> = BTreeMap::new();
    for c in runnable {
        let Some(control) = c.control else { continue };
        if let Some((_, why)) = GVISOR_OPEN.iter().find(|(id, _)| *id == c.id) {
            eprintln!(
                "control {} [gvisor]: not run, the case does not hold on gvisor yet ({why})",
                c.id
            );
            continue;
        }
        let mut honoured = Vec::new();
        for w in control.split(',') {
            match GVISOR_UNWEAKENABLE.iter().find(|(n, _)| *n == w) {
                Some((_, why)) => eprintln!(
                    "control {} [gvisor]: {w} has no gvisor meaning: {why}",
                    c.id
                ),
                None => honoured.push(w),
            }
        }
        if honoured.is_empty() {
            eprintln!(
                "control {} [gvisor]: not run, none of {control} has a gvisor meaning",
                c.id
            );
            continue;
        }
        if let Some((_, why)) = GVISOR_CONTROL_MOOT.iter().find(|(id, _)| *id == c.id) {
            eprintln!("control {} [gvisor]: not run: {why}", c.id);
            continue;
        }
        if !GVISOR_CONTROLS.contains(&c.id) {
            eprintln!(
                "control {} [gvisor]: not shown on gvisor yet ({control})",
                c.id
            );
            continue;
        }
        groups.entry(control).or_default().push(c);
    }
    let mut failures = Vec::new();
    for (weaken, cases) in &groups {
        let mut d = Daemon::start(&weak, Some(weaken)).on_tier("gvisor");
        let mut ctx = new_ctx();
        for case in cases {
            let (v, log) = run_case(&mut d, &mut ctx, case);
            eprintln!("control {} [gvisor] [{weaken}] {:?}", case.id, v);
            if !matches!(v, Verdict::Escaped(_)) {
                failures.push(format!(
                    "{} did not detect the escape on gvisor under {weaken}: {:?}\n{}",
                    case.id, v, log
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn default_binaries_contain_no_test_hooks() {
    require_root!();
    let _s = serial();
    let bins = normal_bins();
    for b in [&bins.threadbox, &bins.agent] {
        let bytes = std::fs::read(b).expect("read binary");
        for needle in [
            &b"THREADBOX_TEST_WEAKEN"[..],
            b"--test-weaken",
            b"INSECURE TEST BUILD",
        ] {
            assert!(
                !bytes.windows(needle.len()).any(|w| w == needle),
                "{} contains {:?}",
                b.display(),
                String::from_utf8_lossy(needle)
            );
        }
    }
    // And a default daemon given the variable still builds the full jail.
    let d = Daemon::start(
        &bins,
        Some("no-seccomp,keep-caps,host-userns,shared-netns,no-proc-mask"),
    );
    let id = d.create(LimitsRequest::default());
    let r = d.sh(
        &id,
        User::Root,
        "grep -E '^(Seccomp|CapEff|NoNewPrivs):' /proc/self/status; cat /proc/self/uid_map; wc -l < /proc/net/dev",
    );
    let out = r.stdout;
    assert!(out.contains("Seccomp:\t2"), "{out}");
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(!out.contains(" 0 4294967295"), "{out}");
    assert!(out.trim_end().ends_with('3'), "only lo expected: {out}");
}

/// Class N: egress bypasses with a policy set, judged by bytes at a test upstream (ADR 0069).
#[test]
fn egress_bypasses_hold() {
    require_root!();
    egress::held_everywhere();
}

/// Class N's positive controls: each case shows its escape against a weakened build.
#[test]
fn egress_controls_detect_every_bypass() {
    require_root!();
    egress::controls_detect();
}

/// Class N, secrets (S1–S3): placeholders to other hosts, a switched Host, the value
/// searched everywhere (ADR 0073).
#[test]
fn egress_secrets_hold() {
    require_root!();
    egress_secrets::held_everywhere();
}

/// S1–S3's positive controls: weakened builds swap where they must not; planted values
/// are found by the same searches.
#[test]
fn egress_secrets_controls_detect() {
    require_root!();
    egress_secrets::controls_detect();
}

/// N11: a DNS flood from one sandbox is capped while a neighbour still resolves.
#[test]
fn egress_dns_flood_is_capped() {
    require_root!();
    egress_dns::held();
}

/// N11's positive control: without the cap (`egress-no-dns-cap`) the flood gets through.
#[test]
fn egress_dns_flood_control_detects() {
    require_root!();
    egress_dns::control_detects();
}

/// Class W: Landlock, seccomp and the masks of a process started before hibernation,
/// after the wake (a daemon restart between) and in each fork with memory (ADR 0150).
#[test]
fn layers_hold_across_hibernate_and_wake() {
    require_root!();
    after_wake::held_on_each_tier();
}

/// Class W's positive controls: a wake that drops the masks is caught; each probe sees
/// its layer missing in a build without it.
#[test]
fn after_wake_controls_detect_a_dropped_layer() {
    require_root!();
    after_wake::controls_detect();
}
