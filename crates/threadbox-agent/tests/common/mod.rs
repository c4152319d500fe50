//! Test harness: starts the agent binary in host test mode (`--listen unix:`), optionally
//! with a real cgroup v2 directory, and speaks threadbox-proto to it over a blocking socket.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};
use threadbox_proto::*;

pub const CGROUP2_ROOT: &str = "/sys/fs/cgroup/unified";

static COUNTER: AtomicU32 = AtomicU32::new(0);

pub fn is_root() -> bool {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

/// Returns true (and prints why) when the test cannot run here. Under `CI` it fails
/// instead: a skipped test must never read as a passed one there.
pub fn skip_unless_root() -> bool {
    if !is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "the agent tests need root (setuid to 1000, cgroups) and CI is set: \
             run them as root, not skipped"
        );
        eprintln!("SKIPPED: the agent tests need root (setuid to 1000, cgroups)");
        return true;
    }
    false
}

fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

/// A scratch directory every user may write to (mode 1777), removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new() -> Scratch {
        let p = std::env::temp_dir().join(unique("threadbox-agent-test"));
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777)).unwrap();
        Scratch(p)
    }
    pub fn path(&self, rel: &str) -> String {
        self.0.join(rel).to_string_lossy().into_owned()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A delegated-looking cgroup v2 directory for one test, removed (children first) on drop.
pub struct TestCgroup(pub PathBuf);

impl TestCgroup {
    pub fn new() -> Option<TestCgroup> {
        if !Path::new(CGROUP2_ROOT).join("cgroup.procs").exists() {
            return None;
        }
        let p = Path::new(CGROUP2_ROOT).join(unique("threadbox-agent-test"));
        std::fs::create_dir(&p).ok()?;
        if !p.join("cgroup.kill").exists() {
            let _ = std::fs::remove_dir(&p);
            return None;
        }
        Some(TestCgroup(p))
    }

    pub fn children(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Kill whatever is left, then remove children and the directory.
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            for c in self.children() {
                let _ = std::fs::remove_dir(self.0.join(c));
            }
            if std::fs::remove_dir(&self.0).is_ok() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

pub struct Agent {
    pub child: Child,
    pub sock: PathBuf,
    _dir: Scratch,
}

impl Agent {
    pub fn start() -> Agent {
        Self::start_with(None)
    }

    /// Starts the agent; with a cgroup, its directory is passed as fd 5 (`--cgroup-fd 5`)
    /// through a shell redirection, as the jail passes an inherited fd.
    pub fn start_with(cgroup: Option<&TestCgroup>) -> Agent {
        let dir = Scratch::new();
        let sock = dir.0.join("agent.sock");
        let bin = env!("CARGO_BIN_EXE_threadbox-agent");
        let child = match cgroup {
            None => Command::new(bin)
                .arg("--listen")
                .arg(format!("unix:{}", sock.display()))
                .spawn(),
            Some(cg) => Command::new("/bin/sh")
                .arg("-c")
                .arg(r#"exec "$0" --listen "unix:$1" --cgroup-fd 5 5<"$2""#)
                .arg(bin)
                .arg(&sock)
                .arg(&cg.0)
                .spawn(),
        }
        .expect("start the agent");
        Agent {
            child,
            sock,
            _dir: dir,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn connect(&self) -> Client {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match UnixStream::connect(&self.sock) {
                Ok(s) => return Client::handshake(s),
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) => panic!("the agent did not listen: {e}"),
            }
        }
    }

    /// A line of /proc/<agent>/status, e.g. `VmHWM`.
    pub fn status_field(&self, name: &str) -> String {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        s.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Client {
    stream: UnixStream,
    decoder: FrameDecoder,
    next_id: u64,
    pub peer: Hello,
}

impl Client {
    fn handshake(stream: UnixStream) -> Client {
        stream
            .set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut c = Client {
            stream,
            decoder: FrameDecoder::new(),
            next_id: 1,
            peer: Hello::ours("", &[]),
        };
        c.send_frame(&Frame::Hello(Hello::ours("agent-tests", &[])));
        match c.recv() {
            Frame::Hello(h) => c.peer = h,
            other => panic!("expected Hello, got {other:?}"),
        }
        c
    }

    pub fn send_frame(&mut self, f: &Frame) {
        self.stream.write_all(&encode_frame(f).unwrap()).unwrap();
    }

    /// Next frame; panics on timeout or EOF.
    pub fn recv(&mut self) -> Frame {
        self.try_recv().expect("connection closed")
    }

    pub fn try_recv(&mut self) -> Option<Frame> {
        let mut buf = [0u8; 65536];
        loop {
            if let Some(f) = self.decoder.next_frame().unwrap() {
                return Some(f);
            }
            let n = self
                .stream
                .read(&mut buf)
                .expect("read from the agent (timeout?)");
            if n == 0 {
                return None;
            }
            self.decoder.feed(&buf[..n]);
        }
    }

    pub fn send(&mut self, req: Request) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_frame(&Frame::Request { id, req });
        id
    }

    /// Sends `req` and collects every response frame up to the final one.
    pub fn call_all(&mut self, req: Request) -> Vec<Response> {
        let id = self.send(req);
        let mut out = Vec::new();
        loop {
            match self.recv() {
                Frame::Response { id: got, resp } if got == id => {
                    let fin = resp.is_final();
                    out.push(resp);
                    if fin {
                        return out;
                    }
                }
                other => panic!("unexpected frame {other:?}"),
            }
        }
    }

    pub fn call(&mut self, req: Request) -> Response {
        self.call_all(req).pop().unwrap()
    }

    pub fn exec(&mut self, spec: ExecSpec) -> ExecResult {
        match self.call(Request::Exec(spec)) {
            Response::Exited(r) => r,
            other => panic!("exec failed: {other:?}"),
        }
    }

    pub fn sh(&mut self, script: &str) -> ExecResult {
        self.exec(shell(script))
    }
}

pub fn shell(script: &str) -> ExecSpec {
    ExecSpec {
        command: threadbox_proto::Command::Shell(script.into()),
        env: BTreeMap::new(),
        cwd: Some("/tmp".into()),
        user: RunAs::User,
        stdin: None,
        timeout_ms: Some(30_000),
        max_output: DEFAULT_MAX_OUTPUT,
        stream: false,
    }
}

pub fn argv(args: &[&str]) -> ExecSpec {
    ExecSpec {
        command: threadbox_proto::Command::Argv(args.iter().map(|s| s.to_string()).collect()),
        ..shell("")
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Polls `cond` every 10 ms until it holds or `timeout` passes.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `pid` is a live (non-zombie) process.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z") | Some("X"))
        }
        Err(_) => false,
    }
}

/// Reads a pid written by a test script (waiting until the file is complete).
pub fn read_pid(path: &str) -> i32 {
    let mut pid = 0;
    assert!(
        wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.strip_suffix('\n').and_then(|v| v.parse().ok()))
                .map(|p| pid = p)
                .is_some()
        }),
        "no pid in {path}"
    );
    pid
}

pub fn kill9(pid: i32) {
    let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
}
