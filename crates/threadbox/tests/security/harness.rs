//! The security suite's fixture: real daemons (normal or deliberately weakened builds) on
//! temp roots, driven over the keyless unix socket with the Rust client, and the host-side
//! observations every case is judged by (flag, hashes, cgroups, health).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use threadbox_api::{CreateSandboxRequest, ExecRequest, ExecResponse, LimitsRequest, User};
use threadbox_client::Client;

pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// One runtime for all blocking calls of the suite.
pub fn rt() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

pub fn block<F: std::future::Future>(f: F) -> F::Output {
    rt().block_on(f)
}

/// Serializes the tests of this binary: each drives real sandboxes on two cores.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The daemon and agent binaries a daemon runs.
#[derive(Debug, Clone)]
pub struct Bins {
    pub threadbox: PathBuf,
    pub agent: PathBuf,
    pub weakened: bool,
}

pub fn normal_bins() -> Bins {
    let threadbox = PathBuf::from(env!("CARGO_BIN_EXE_threadbox"));
    let agent = threadbox.with_file_name("threadbox-agent");
    assert!(
        agent.is_file(),
        "{} is missing: run `cargo build --workspace --bins` first",
        agent.display()
    );
    Bins {
        threadbox,
        agent,
        weakened: false,
    }
}

/// The workspace's target directory (`.../target`), from this test binary's location.
fn target_dir() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_threadbox"));
    // <target>/<profile>/threadbox
    exe.parent()
        .and_then(Path::parent)
        .expect("binary lives in <target>/<profile>")
        .to_path_buf()
}

/// Binaries built with the `insecure-test-hooks` feature into `<target>/weakened` (a
/// separate target dir, so the normal binaries never contain the hooks). Built once per
/// run with the same cargo that runs the tests; incremental afterwards.
pub fn weakened_bins() -> Bins {
    static BUILT: OnceLock<Result<Bins, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = target_dir().join("weakened");
            let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
            let out = Command::new(env!("CARGO"))
                .args([
                    "build",
                    "--bins",
                    "-p",
                    "threadbox",
                    "-p",
                    "threadbox-agent",
                ])
                .args([
                    "--features",
                    "threadbox/insecure-test-hooks,threadbox-agent/insecure-test-hooks",
                ])
                .arg("--manifest-path")
                .arg(&manifest)
                .arg("--target-dir")
                .arg(&dir)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .output()
                .map_err(|e| format!("run cargo: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "building the weakened binaries failed:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(Bins {
                threadbox: dir.join("debug/threadbox"),
                agent: dir.join("debug/threadbox-agent"),
                weakened: true,
            })
        })
        .clone()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A running daemon; its sandboxes are deleted and it is stopped on drop.
pub struct Daemon {
    child: Option<Child>,
    pub root: tempfile::TempDir,
    pub port: u16,
    pub bins: Bins,
    pub weaken: Option<String>,
    /// More `serve` flags.
    pub args: Vec<String>,
    pub client: Client,
    /// The tier its creates name (`jail` unless [`Daemon::on_tier`]; ADR 0123/0145).
    pub tier: String,
}

impl Daemon {
    /// Starts `bins`' daemon; `weaken` is put in `THREADBOX_TEST_WEAKEN`.
    pub fn start(bins: &Bins, weaken: Option<&str>) -> Daemon {
        Daemon::start_with(bins, weaken, &[])
    }

    /// [`Daemon::start`] with more `serve` flags.
    pub fn start_with(bins: &Bins, weaken: Option<&str>, args: &[&str]) -> Daemon {
        let root = tempfile::Builder::new()
            .prefix("tb-sec-")
            .tempdir()
            .expect("temp root");
        let url = format!("unix://{}", root.path().join("threadbox.sock").display());
        let client = Client::new(&url).expect("client");
        let mut d = Daemon {
            child: None,
            port: free_port(),
            root,
            bins: bins.clone(),
            weaken: weaken.map(str::to_string),
            args: args.iter().map(|a| a.to_string()).collect(),
            client,
            tier: "jail".into(),
        };
        d.spawn();
        d
    }

    pub fn root_path(&self) -> &Path {
        self.root.path()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.path().join("daemon.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.path().join("daemon.log"))
            .expect("log");
        let mut cmd = Command::new(&self.bins.threadbox);
        cmd.arg("serve")
            .arg("--root")
            .arg(self.root.path())
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .arg("--agent")
            .arg(&self.bins.agent)
            .args(&self.args)
            .env("RUST_LOG", "info")
            .env_remove("THREADBOX_TEST_WEAKEN")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        if let Some(w) = &self.weaken {
            cmd.env("THREADBOX_TEST_WEAKEN", w);
        }
        self.child = Some(cmd.spawn().expect("start threadbox serve"));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("daemon exited with {st}:\n{}", self.log());
            }
            if self.healthy() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not answer:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn healthy(&self) -> bool {
        block(async {
            tokio::time::timeout(Duration::from_secs(5), self.client.health())
                .await
                .is_ok_and(|r| r.is_ok())
        })
    }

    /// SIGKILL, no clean shutdown; sandboxes keep running.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "still running");
        self.spawn();
    }

    /// This daemon's later creates name `tier`.
    pub fn on_tier(mut self, tier: &str) -> Daemon {
        self.tier = tier.to_string();
        self
    }

    /// Whether this daemon runs `tier` with every capability of `needs`; prints why not
    /// (`common/tiers.rs`).
    pub fn runs(&self, tier: &str, needs: &[&str]) -> bool {
        let list = block(self.client.call(&threadbox_api::tiers::ListTiers))
            .unwrap_or_else(|e| panic!("tiers: {e}"));
        let json = serde_json::to_value(&list).expect("tiers as JSON");
        crate::tiers::runs_on(tier, &json, needs)
    }

    pub fn create(&self, limits: LimitsRequest) -> String {
        let req = CreateSandboxRequest {
            limits,
            tier: Some(self.tier.clone()),
            ..Default::default()
        };
        block(self.client.create(&req))
            .unwrap_or_else(|e| panic!("create: {e}\n{}", self.log()))
            .0
            .id
    }

    pub fn exec(&self, id: &str, req: &ExecRequest) -> ExecResponse {
        block(self.client.exec(id, req)).unwrap_or_else(|e| panic!("exec: {e}\n{}", self.log()))
    }

    pub fn sh(&self, id: &str, user: User, script: &str) -> ExecResponse {
        self.exec(
            id,
            &ExecRequest {
                shell: Some(script.to_string()),
                user,
                timeout_secs: Some(60.0),
                ..Default::default()
            },
        )
    }

    pub fn write(&self, id: &str, path: &str, user: User, data: &[u8]) {
        block(self.client.write_file(id, path, user, data.to_vec()))
            .unwrap_or_else(|e| panic!("write {path}: {e}"));
    }

    pub fn delete_all(&self) {
        let list = block(self.client.list(&BTreeMap::new(), None));
        if let Ok(list) = list {
            for sb in list.sandboxes {
                let _ = block(self.client.delete(&sb.id, true));
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        self.delete_all();
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- daemon log ----\n{}", self.log());
        }
    }
}

/// 16 random bytes as hex.
pub fn random_hex() -> String {
    let mut b = [0u8; 16];
    let mut f = std::fs::File::open("/dev/urandom").expect("urandom");
    std::io::Read::read_exact(&mut f, &mut b).expect("urandom");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A secret in a world-readable file on the host, outside every sandbox: only the
/// isolation keeps it from a sandbox.
pub struct Flag {
    pub dir: tempfile::TempDir,
    pub secret: String,
}

impl Flag {
    pub fn new() -> Flag {
        let dir = tempfile::Builder::new()
            .prefix("tb-flag-")
            .tempdir_in("/tmp")
            .expect("flag dir");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let secret = format!("TBFLAG{}", random_hex());
        let path = dir.path().join("flag");
        let mut f = std::fs::File::create(&path).expect("flag");
        f.write_all(secret.as_bytes()).expect("flag");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        Flag { dir, secret }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("flag")
    }

    /// Everything in the flag directory (names and contents).
    pub fn snapshot(&self) -> String {
        let mut out = String::new();
        let mut names: Vec<_> = std::fs::read_dir(self.dir.path())
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        names.sort();
        for p in names {
            let c = std::fs::read(&p).unwrap_or_default();
            out.push_str(&format!("{}:{}\n", p.display(), hash_bytes(&c)));
        }
        out
    }
}

fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// Host files whose contents must never change because of a sandbox.
pub fn host_hashes(extra: &[&Path]) -> BTreeMap<String, u64> {
    let mut files: Vec<PathBuf> = [
        "/etc/passwd",
        "/etc/hostname",
        "/usr/bin/env",
        "/proc/sys/kernel/core_pattern",
        "/proc/sys/kernel/modprobe",
        "/proc/sys/kernel/hostname",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    files.extend(extra.iter().map(|p| p.to_path_buf()));
    files
        .into_iter()
        .map(|p| {
            let h = std::fs::read(&p).map(|b| hash_bytes(&b)).unwrap_or(0);
            (p.display().to_string(), h)
        })
        .collect()
}

/// Host pids running under a sandbox uid range (host uid ≥ 1_000_000) that are not in a
/// threadbox cgroup.
pub fn processes_outside_cgroups() -> Vec<String> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let uid: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        if uid < 1_000_000 {
            continue;
        }
        let cg = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        if cg.is_empty() {
            continue; // exited meanwhile
        }
        if !cg.contains("/threadbox/") {
            out.push(format!("pid {name} uid {uid} cgroup {}", cg.trim()));
        }
    }
    out
}

/// Host pids whose command line contains `needle`.
pub fn host_pids_with(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid as u32 == std::process::id() {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmd).contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// The sandbox's memory cgroup file holding the peak usage, on either layout.
pub fn memory_peak(id: &str) -> Option<u64> {
    for p in [
        format!("/sys/fs/cgroup/memory/threadbox/{id}/memory.max_usage_in_bytes"),
        format!("/sys/fs/cgroup/threadbox/{id}/memory.peak"),
    ] {
        if let Ok(s) = std::fs::read_to_string(&p) {
            return s.trim().parse().ok();
        }
    }
    None
}

/// The first non-loopback IPv4 address of the host, if any.
pub fn host_ipv4() -> Option<String> {
    let out = Command::new("hostname").arg("-I").output().ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .find(|a| a.contains('.') && !a.starts_with("127."))
        .map(str::to_string)
}
