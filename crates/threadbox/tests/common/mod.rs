//! Test fixture: a real `threadbox serve` on a temp root and a free loopback port, and
//! helpers to run the CLI against it. Needs root and `cargo build --workspace` first (the
//! daemon uses the `threadbox-agent` binary next to `threadbox`).
#![allow(dead_code)]

pub mod inproc;
pub mod tiers;
pub mod tls;
pub mod upstream;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `f` once per tier under test ([`tiers::under_test`]) that has every capability in
/// `needs`, each on a daemon of its own, with the tier's name for `create --tier`.
pub fn each_tier(needs: &[&str], mut f: impl FnMut(Daemon, &str)) {
    for tier in tiers::under_test() {
        let d = Daemon::start();
        let listed = d.cli(&["tiers", "--json"]).ok().json();
        if tiers::runs_on(&tier, &listed, needs) {
            f(d, &tier);
        }
    }
}

/// How long the daemon may take to answer /healthz.
const START_DEADLINE: Duration = Duration::from_secs(30);

pub fn threadbox_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_threadbox"))
}

pub fn agent_bin() -> PathBuf {
    threadbox_bin().with_file_name("threadbox-agent")
}

/// True when running as root; otherwise prints why the test is skipped. Under `CI` it
/// fails instead: a skipped test must never read as a passed one there.
pub fn require_root(test: &str) -> bool {
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !root {
        assert!(
            std::env::var_os("CI").is_none(),
            "{test} needs root (namespaces and cgroups) and CI is set: run it as root, \
             not skipped"
        );
        eprintln!("skipping {test}: needs root (sandboxes need namespaces and cgroups)");
    }
    root
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("no free loopback port")
}

/// Output of one CLI run.
pub struct Run {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Run {
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not one JSON document ({e}):\n{}\nstderr:\n{}",
                self.stdout_str(),
                self.stderr
            )
        })
    }

    /// Panics with the whole output unless the exit code is `code`.
    pub fn expect_code(self, code: i32) -> Self {
        assert_eq!(
            self.code,
            code,
            "exit code {} (expected {code})\nstdout:\n{}\nstderr:\n{}",
            self.code,
            self.stdout_str(),
            self.stderr
        );
        self
    }

    pub fn ok(self) -> Self {
        self.expect_code(0)
    }
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: o.stdout,
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// A running daemon; stopped (and its sandboxes deleted) on drop.
pub struct Daemon {
    child: Option<Child>,
    pub root: tempfile::TempDir,
    pub port: u16,
    pub url: String,
    /// Extra `serve` arguments, kept across restarts.
    serve_args: Vec<String>,
    /// Extra environment of `serve` (e.g. its own `RUST_LOG`), kept across restarts.
    serve_env: Vec<(String, String)>,
}

impl Daemon {
    pub fn start() -> Daemon {
        Self::start_with(&[])
    }

    /// Starts a daemon with extra `serve` arguments (e.g. `--warm-pool 2`).
    pub fn start_with(serve_args: &[&str]) -> Daemon {
        Self::start_with_env(serve_args, &[])
    }

    /// Starts a daemon with extra `serve` arguments and environment variables (which win
    /// over the fixture's `RUST_LOG`).
    pub fn start_with_env(serve_args: &[&str], serve_env: &[(&str, &str)]) -> Daemon {
        let agent = agent_bin();
        assert!(
            agent.is_file(),
            "{} is missing: run `cargo build --workspace` before these tests",
            agent.display()
        );
        let root = tempfile::Builder::new()
            .prefix("threadbox-test-")
            .tempdir()
            .expect("temp root");
        let port = free_port();
        // The CLI talks through the operator's socket: TCP requires API keys.
        let url = format!("unix://{}", root.path().join("threadbox.sock").display());
        let mut daemon = Daemon {
            child: None,
            url,
            root,
            port,
            serve_args: serve_args.iter().map(|a| a.to_string()).collect(),
            serve_env: serve_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        daemon.spawn();
        daemon
    }

    pub fn root_path(&self) -> &Path {
        self.root.path()
    }

    fn log_path(&self) -> PathBuf {
        self.root.path().join("daemon.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("daemon log file");
        let child = Command::new(threadbox_bin())
            .arg("serve")
            .arg("--root")
            .arg(self.root.path())
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--agent")
            .arg(agent_bin())
            .args(&self.serve_args)
            .env("RUST_LOG", "info,threadbox=debug")
            .envs(self.serve_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("cannot start threadbox serve");
        self.child = Some(child);
        self.wait_healthy();
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + START_DEADLINE;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("threadbox serve exited with {status}:\n{}", self.log());
                }
            }
            if healthz(self.port) {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "threadbox serve did not answer /healthz within {START_DEADLINE:?}:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs the daemon (no clean shutdown); sandboxes keep running.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERMs the daemon and waits (bounded) for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("the daemon is not running");
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the daemon ignored SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `unix://` URL of the daemon's socket.
    pub fn socket_url(&self) -> String {
        format!(
            "unix://{}",
            self.root.path().join("threadbox.sock").display()
        )
    }

    /// Starts the daemon again on the same root and port.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the daemon is still running");
        self.spawn();
    }

    /// Runs `threadbox ARGS` against this daemon.
    pub fn cli(&self, args: &[&str]) -> Run {
        self.cli_stdin(args, None)
    }

    /// Runs `threadbox ARGS` with `stdin` as its standard input.
    pub fn cli_stdin(&self, args: &[&str], stdin: Option<&[u8]>) -> Run {
        run_cli(&self.url, args, stdin)
    }

    /// Creates a sandbox and returns its id.
    pub fn create(&self, extra: &[&str]) -> String {
        let mut args = vec!["create", "--json"];
        args.extend_from_slice(extra);
        let run = self.cli(&args).ok();
        run.json()["id"]
            .as_str()
            .expect("create --json has an id")
            .to_string()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            release_store(self.root.path());
            return;
        };
        // Sandboxes outlive the daemon by design: delete them so tests leave nothing.
        if matches!(child.try_wait(), Ok(None)) {
            let list = self.cli(&["ls", "--json"]);
            if list.code == 0 {
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&list.stdout) {
                    for sb in v["sandboxes"].as_array().into_iter().flatten() {
                        if let Some(id) = sb["id"].as_str() {
                            let _ = self.cli(&["rm", "--force", id]);
                        }
                    }
                }
            }
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() > deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
        release_store(self.root.path());
        if std::thread::panicking() {
            eprintln!("---- daemon log ----\n{}", self.log());
        }
    }
}

/// The daemon unmounts its reflink store (ADR 0101) at a clean stop when no sandbox uses
/// it; after a `kill -9` or with sandboxes left it stays: detach it so the temp root can
/// be removed (the loop device goes with the last user).
pub fn release_store(root: &Path) {
    let dir = root.join("sandboxes");
    let mounted = std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
        m.lines()
            .any(|l| l.split(' ').nth(4) == Some(&*dir.to_string_lossy()))
    });
    if mounted {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs the CLI with `THREADBOX_URL=url`.
pub fn run_cli(url: &str, args: &[&str], stdin: Option<&[u8]>) -> Run {
    let mut cmd = Command::new(threadbox_bin());
    cmd.args(args)
        .env("THREADBOX_URL", url)
        .env_remove("THREADBOX_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = cmd.spawn().expect("cannot run threadbox");
    if let Some(data) = stdin {
        let mut pipe = child.stdin.take().expect("stdin pipe");
        let data = data.to_vec();
        // A writer thread, so a large input cannot deadlock against unread output.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        });
    }
    child.wait_with_output().expect("threadbox output").into()
}

/// GET /healthz over plain TCP, with short timeouts.
fn healthz(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(
        &format!("127.0.0.1:{port}").parse().expect("addr"),
        Duration::from_millis(500),
    ) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut resp = String::new();
    let _ = s.read_to_string(&mut resp);
    resp.starts_with("HTTP/1.1 200") && resp.contains("\"ok\"")
}

/// Serializes the tests of one binary: daemons on the same host share the cgroup parent,
/// and two cores do not run many sandboxes at once gracefully.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Polls `cond` every 50 ms until it holds; panics with `what` after `limit`. A deadline,
/// not a sleep: the wait ends as soon as the condition does.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Daemon {
    /// [`wait_for`], with the daemon's log in the panic message.
    pub fn wait_for(&self, what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + limit;
        while !cond() {
            if Instant::now() >= deadline {
                panic!("timed out waiting for {what}; daemon log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
