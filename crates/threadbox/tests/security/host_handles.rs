//! Class I, judged from the host: paths through the agent's handles must not reach the
//! host (a host UNIX socket that must see no connection, host files and directories that
//! must stay unseen and uncreated, the host cgroupfs untouched), and kernel counters one
//! sandbox holds must not be taken from host root or a neighbour.

use crate::cases::Case;
use crate::harness::*;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use threadbox_api::{ExecRequest, LimitsRequest, StartProcessRequest, User};

/// A host UNIX socket in the host's /tmp, world-connectable, counting connections.
struct HostSocket {
    path: PathBuf,
    hits: Arc<AtomicUsize>,
}

impl HostSocket {
    fn new() -> HostSocket {
        let path = PathBuf::from(format!("/tmp/tb-sec-sock-{}", &random_hex()[..12]));
        let l = UnixListener::bind(&path).expect("bind the host socket");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777))
            .expect("chmod the host socket");
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        std::thread::spawn(move || {
            for c in l.incoming() {
                if c.is_ok() {
                    h.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        HostSocket { path, hits }
    }

    fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

impl Drop for HostSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// I1: every planted link as a `cwd`, for exec and background processes, as user and root.
pub fn cwd(d: &Daemon, id: &str, escaped: &mut Vec<String>, log: &mut String) {
    let sock = HostSocket::new();
    let probe = format!(
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect('tmp/{}'); \
         s.send(b'x'); print('CONNECTED')",
        sock.name()
    );
    let mut links: Vec<String> = (3..=9).map(|n| format!("/tmp/h{n}")).collect();
    links.push("/tmp/h".into());
    links.push("/tmp/hroot".into());
    for user in [User::User, User::Root] {
        for link in &links {
            let req = ExecRequest {
                command: Some(vec![
                    "python3".into(),
                    "-I".into(),
                    "-c".into(),
                    probe.clone(),
                ]),
                cwd: Some(link.clone()),
                user,
                timeout_secs: Some(20.0),
                ..Default::default()
            };
            match block(d.client.exec(id, &req)) {
                Ok(r) => log.push_str(&format!(
                    "exec cwd {link} as {user:?}: exit {:?} {}{}\n",
                    r.exit_code,
                    r.stdout.trim(),
                    r.stderr.lines().last().unwrap_or("")
                )),
                Err(e) => log.push_str(&format!("exec cwd {link} as {user:?}: {e}\n")),
            }
        }
        let req = StartProcessRequest {
            command: Some(vec![
                "python3".into(),
                "-I".into(),
                "-c".into(),
                probe.clone(),
            ]),
            cwd: Some("/tmp/h".into()),
            user,
            ..Default::default()
        };
        match block(d.client.start_process(id, &req)) {
            Ok(p) => {
                wait_for(
                    "the background probe to end",
                    Duration::from_secs(20),
                    || {
                        block(d.client.list_processes(id))
                            .is_ok_and(|l| l.processes.iter().any(|q| q.id == p.id && !q.running))
                    },
                );
                log.push_str(&format!("spawn cwd /tmp/h as {user:?}: started\n"));
            }
            Err(e) => log.push_str(&format!("spawn cwd /tmp/h as {user:?}: {e}\n")),
        }
    }
    let hits = sock.hits.load(Ordering::SeqCst);
    if hits > 0 {
        escaped.push(format!(
            "{hits} connection(s) from the sandbox reached a host UNIX socket"
        ));
    }
}

/// The sandbox's cgroup2 directory on the host, on either layout.
pub fn host_cgroup_dir(id: &str) -> Option<PathBuf> {
    [
        format!("/sys/fs/cgroup/unified/threadbox/{id}"),
        format!("/sys/fs/cgroup/threadbox/{id}"),
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.join("cgroup.procs").exists())
}

/// I2: list, stat, read, mkdir, write (with parents), remove and rename through the link.
pub fn files(d: &Daemon, id: &str, escaped: &mut Vec<String>, log: &mut String) {
    let mark = format!("tb-sec-host-{}", &random_hex()[..12]);
    let host_dir = Path::new("/tmp").join(&mark);
    std::fs::create_dir(&host_dir).expect("host marker dir");
    std::fs::set_permissions(&host_dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::fs::write(host_dir.join("f"), b"host-secret\n").expect("host marker file");
    std::fs::set_permissions(host_dir.join("f"), std::fs::Permissions::from_mode(0o666))
        .expect("chmod");
    let cg = host_cgroup_dir(id);
    let mut note = |what: &str, r: String| log.push_str(&format!("{what}: {r}\n"));
    for user in [User::User, User::Root] {
        let u = format!("{user:?}");
        match block(d.client.list_files(id, "/tmp/h/tmp", user)) {
            Ok(l) if l.entries.iter().any(|e| e.name == mark) => {
                escaped.push(format!("{u}: listed the host's /tmp"))
            }
            other => note(
                "list /tmp/h/tmp",
                format!("{other:?}").chars().take(200).collect(),
            ),
        }
        if let Ok(l) = block(d.client.list_files(id, "/tmp/h/proc", user)) {
            if l.entries.len() > 10 {
                // The sandbox's /proc is refused by name; this would be the host's.
                escaped.push(format!("{u}: listed a /proc through the link"));
            }
        }
        match block(
            d.client
                .stat_file(id, &format!("/tmp/h/tmp/{mark}/f"), user),
        ) {
            Ok(st) => escaped.push(format!("{u}: stat of a host file: {st:?}")),
            Err(e) => note("stat", e.to_string()),
        }
        match block(
            d.client
                .read_file_bytes(id, &format!("/tmp/h/tmp/{mark}/f"), user),
        ) {
            Ok(b) if b == b"host-secret\n" => escaped.push(format!("{u}: read a host file")),
            other => note("read", format!("{other:?}")),
        }
        let made = format!("{mark}-mk-{u}");
        let r = block(
            d.client
                .mkdir(id, &format!("/tmp/h/tmp/{made}"), user, false),
        );
        note("mkdir", format!("{r:?}"));
        let made_p = format!("{mark}-p-{u}");
        let r = block(
            d.client
                .mkdir(id, &format!("/tmp/h/tmp/{made_p}/a/b"), user, true),
        );
        note("mkdir -p", format!("{r:?}"));
        let made_w = format!("{mark}-w-{u}");
        let r = block(d.client.write_file(
            id,
            &format!("/tmp/h/tmp/{made_w}/sub/f"),
            user,
            b"x".to_vec(),
        ));
        note("write", format!("{r:?}"));
        for m in [&made, &made_p, &made_w] {
            let p = Path::new("/tmp").join(m);
            if p.exists() {
                escaped.push(format!("{u}: created {} on the host", p.display()));
                let _ = std::fs::remove_dir_all(&p);
            }
        }
        let r = block(
            d.client
                .remove_file(id, &format!("/tmp/h/tmp/{mark}/f"), user, false),
        );
        note("remove", format!("{r:?}"));
        let r = block(
            d.client
                .remove_file(id, &format!("/tmp/h/tmp/{mark}"), user, true),
        );
        note("remove -r", format!("{r:?}"));
        if !host_dir.join("f").exists() {
            escaped.push(format!("{u}: removed a host file"));
            let _ = std::fs::write(host_dir.join("f"), b"host-secret\n");
        }
        if let Some(cg) = &cg {
            let evil = format!("tb-sec-evil-{u}");
            let r = block(d.client.mkdir(id, &format!("/tmp/cg/{evil}"), user, false));
            note("mkdir in the cgroup", format!("{r:?}"));
            if cg.join(&evil).exists() {
                escaped.push(format!("{u}: created a cgroup on the host"));
                let _ = std::fs::remove_dir(cg.join(&evil));
            }
        }
    }
    let _ = std::fs::remove_dir_all(&host_dir);
}

/// A small program that takes one unit of the counter case `id` holds: exit 0 when it
/// could, else the error on stderr. Run by host root and in a neighbour sandbox.
fn probe(id: &str) -> &'static str {
    match id {
        "I4" => {
            "import ctypes, os, sys\n\
             l = ctypes.CDLL(None, use_errno=True)\n\
             fd = l.inotify_init1(0)\n\
             sys.exit(0 if fd >= 0 else os.strerror(ctypes.get_errno()))"
        }
        "I7" => {
            "import ctypes, os, sys\n\
             l = ctypes.CDLL(None, use_errno=True)\n\
             fd = l.inotify_init1(0)\n\
             w = l.inotify_add_watch(fd, b'/tmp', 0x100) if fd >= 0 else -1\n\
             sys.exit(0 if w >= 0 else os.strerror(ctypes.get_errno()))"
        }
        "I9" => {
            "import signal, sys, threading\n\
             signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])\n\
             signal.pthread_kill(threading.get_ident(), signal.SIGRTMIN)\n\
             sys.exit(0)"
        }
        "I10" => {
            "import os, select\n\
             e = select.epoll()\n\
             r, w = os.pipe()\n\
             e.register(r, select.EPOLLIN)"
        }
        other => panic!("no probe for {other}"),
    }
}

/// Whether host root (this process's child) can still take one unit of the counter.
fn host_probe(id: &str) -> Result<(), String> {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(probe(id))
        .output()
        .map_err(|e| format!("python3 on the host: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// I4, I7, I9, I10: the case holds what it can of a per-user kernel counter in the
/// background; host root and a neighbour sandbox must still get their own.
pub fn counters(d: &Daemon, id: &str, case: &Case, escaped: &mut Vec<String>, log: &mut String) {
    // Positive control of the instrument: host root can before the case runs.
    if let Err(e) = host_probe(case.id) {
        log.push_str(&format!("the host probe fails before the case: {e}\n"));
        return;
    }
    // Made first, and the holder watched from the host: while a weakened jail lets the
    // holder drain host root's budget, the daemon itself (root) may not manage new
    // connections.
    let neighbour = d.create(LimitsRequest::default());
    let info = block(d.client.get(id));
    let Some(agent_pid) = info.as_ref().ok().and_then(|s| s.agent_pid) else {
        panic!("no host pid for the agent: {info:?}");
    };
    let held_file = PathBuf::from(format!("/proc/{agent_pid}/root/tmp/held"));
    let p = block(d.client.start_process(
        id,
        &StartProcessRequest {
            command: Some(vec!["python3".into(), "/tmp/case.py".into()]),
            user: case.user,
            ..Default::default()
        },
    ))
    .expect("start the holder");
    wait_for(
        "the holder to take what it can",
        Duration::from_secs(90),
        || std::fs::metadata(&held_file).is_ok_and(|m| m.len() > 0),
    );
    let held = std::fs::read_to_string(&held_file).unwrap_or_default();
    log.push_str(&format!("the sandbox holds {}\n", held.trim()));
    if let Err(e) = host_probe(case.id) {
        escaped.push(format!("host root cannot take its own: {e}"));
    }
    let req = ExecRequest {
        command: Some(vec!["python3".into(), "-c".into(), probe(case.id).into()]),
        timeout_secs: Some(30.0),
        ..Default::default()
    };
    match block(d.client.exec(&neighbour, &req)) {
        Ok(r) if r.exit_code == Some(0) => {}
        Ok(r) => escaped.push(format!(
            "a neighbour sandbox cannot take its own: {}{}",
            r.stdout, r.stderr
        )),
        Err(e) => escaped.push(format!("a neighbour's call failed meanwhile: {e}")),
    }
    let _ = block(d.client.kill_process(id, p.id, None));
    // In a weakened jail the holder may have drained a budget this process and the daemon
    // need too; once it is gone, go on only when host root has its own again.
    wait_for(
        "host root's budget to come back",
        Duration::from_secs(90),
        || host_probe(case.id).is_ok(),
    );
    let _ = block(d.client.delete(&neighbour, true));
}

/// I6: the sandbox's cgroup subtree is bounded on the host.
pub fn cgroup_tree(id: &str, escaped: &mut Vec<String>, log: &mut String) {
    let Some(cg) = host_cgroup_dir(id) else {
        log.push_str("no cgroup2 directory for the sandbox\n");
        escaped.push("no cgroup2 directory to check".into());
        return;
    };
    for f in ["cgroup.max.descendants", "cgroup.max.depth"] {
        let v = std::fs::read_to_string(cg.join(f)).unwrap_or_default();
        log.push_str(&format!("{f} = {}\n", v.trim()));
        if v.trim() == "max" || v.trim().is_empty() {
            escaped.push(format!("{f} is unbounded"));
        }
    }
}
