//! `FakeDriver`: a tier without isolation, for tests. It boots instantly and speaks the
//! real agent protocol: each sandbox is the real `threadbox-agent` binary started as a
//! plain host process in its host test mode (`--listen unix:PATH`), so everything above
//! the driver (manager, pool, reconcile, router) runs unchanged over it. It needs no root
//! (as root, calls run as the agent's users on the host; without root, only calls as the
//! agent's own user work).
//!
//! What stands in for the jail: the disk is a directory, freeze and thaw are SIGSTOP and
//! SIGCONT of the agent and every process below it, limits are recorded (not enforced),
//! usage is read from `/proc`. What a sandbox is lives in files under its directory (the
//! agent's pid, the frozen flag), so a second `FakeDriver` over the same root (a restarted
//! daemon) finds the agents the first one started, as the jail driver finds its cgroups.
//!
//! NOT a sandbox: processes run on the host with the daemon's rights. Never register it in
//! a daemon that serves anyone.

use crate::driver::{AgentStream, Driver, Limits, SandboxSpec, Usage};
use crate::error::{CoreError, Result};
use crate::store::ImageRow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// The tier name a `FakeDriver` registers under unless told another.
pub const FAKE_TIER: &str = "fake";

/// The `threadbox-agent` binary of this build: `$THREADBOX_AGENT`, or the one next to the
/// running test binary's directory (`target/<profile>/`). Tests of other crates pass it to
/// [`FakeDriver::new`]; it must have been built (`cargo build -p threadbox-agent`).
pub fn agent_binary() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("THREADBOX_AGENT") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe().map_err(|e| internal("find the test binary", e))?;
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    for dir in exe.ancestors().skip(1).take(2) {
        let p = dir.join("threadbox-agent");
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(CoreError::Internal(format!(
        "no threadbox-agent binary near {} (build it: cargo build -p threadbox-agent, or set \
         THREADBOX_AGENT)",
        exe.display()
    )))
}

/// Longest a freeze waits for the agent to stop (the jail's cgroup freeze waits as long).
const FREEZE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Failures a test can inject into the next call of that kind (each fires once).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FakeFault {
    Prepare,
    Launch,
    Freeze,
    Thaw,
    SetLimits,
    Destroy,
}

pub struct FakeDriver {
    tier: &'static str,
    root: PathBuf,
    agent_path: PathBuf,
    /// The agents this instance started, kept to reap them (a sandbox adopted from an
    /// earlier instance is known by its pid file alone).
    children: Mutex<HashMap<String, Child>>,
    limits: Mutex<HashMap<String, Limits>>,
    faults: Mutex<BTreeMap<FakeFault, u32>>,
    oom_kills: Mutex<HashMap<String, u64>>,
}

impl FakeDriver {
    /// A fake tier keeping its sandboxes under `root/<id>/`, booting `agent_path`.
    pub fn new(root: impl Into<PathBuf>, agent_path: impl Into<PathBuf>) -> FakeDriver {
        FakeDriver {
            tier: FAKE_TIER,
            root: root.into(),
            agent_path: agent_path.into(),
            children: Mutex::new(HashMap::new()),
            limits: Mutex::new(HashMap::new()),
            faults: Mutex::new(BTreeMap::new()),
            oom_kills: Mutex::new(HashMap::new()),
        }
    }

    /// The same fake under another tier name (e.g. the default tier of a router test).
    pub fn with_tier(mut self, tier: &'static str) -> FakeDriver {
        self.tier = tier;
        self
    }

    /// Makes the next `n` calls of `kind` fail with `internal`.
    pub fn fail_next(&self, kind: FakeFault, n: u32) {
        *lock(&self.faults).entry(kind).or_default() += n;
    }

    /// The limits last applied to sandbox `id` (at launch or by `set_limits`).
    pub fn limits(&self, id: &str) -> Option<Limits> {
        lock(&self.limits).get(id).copied()
    }

    /// Counts one OOM kill in sandbox `id` (what the kernel would report).
    pub fn record_oom_kill(&self, id: &str) {
        *lock(&self.oom_kills).entry(id.to_string()).or_default() += 1;
    }

    /// The agent's pid of sandbox `id` while its process exists.
    pub fn agent_pid(&self, id: &str) -> Option<i32> {
        let pid: i32 = std::fs::read_to_string(self.dir(id).join("agent.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        if let Some(child) = lock(&self.children).get_mut(id) {
            // Started by this instance: its own child, not reaped yet, is exactly it (its
            // command line may still be empty right after the exec).
            return (child.id() as i32 == pid && matches!(child.try_wait(), Ok(None)))
                .then_some(pid);
        }
        // Pids are reused: it is ours only while its command line names our socket.
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let sock = self.socket(id);
        let ours = cmdline
            .split(|b| *b == 0)
            .any(|a| a.strip_prefix(b"unix:") == Some(sock.as_os_str().as_encoded_bytes()));
        (ours && !is_zombie(pid)).then_some(pid)
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }

    fn disk(&self, id: &str) -> PathBuf {
        self.dir(id).join("disk")
    }

    fn socket(&self, id: &str) -> PathBuf {
        self.dir(id).join("agent.sock")
    }

    fn frozen_flag(&self, id: &str) -> PathBuf {
        self.dir(id).join("frozen")
    }

    fn fault(&self, kind: FakeFault) -> Result<()> {
        let mut faults = lock(&self.faults);
        match faults.get_mut(&kind) {
            Some(n) if *n > 0 => {
                *n -= 1;
                Err(CoreError::Internal(format!(
                    "fake driver: injected {kind:?} failure"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Signals the agent and every process below it: the agent first when stopping (so
    /// it starts no more), the others first when continuing (so none misses the agent).
    fn signal_tree(&self, id: &str, sig: i32) {
        let Some(pid) = self.agent_pid(id) else {
            return;
        };
        let below = descendants(pid);
        if sig == libc::SIGCONT {
            for p in below {
                let _ = threadbox_sys::child::kill(p, sig);
            }
            let _ = threadbox_sys::child::kill(pid, sig);
        } else {
            let _ = threadbox_sys::child::kill(pid, sig);
            for p in below {
                let _ = threadbox_sys::child::kill(p, sig);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn internal(what: &str, e: impl std::fmt::Display) -> CoreError {
    CoreError::Internal(format!("fake driver: {what}: {e}"))
}

/// `/proc/<pid>/stat` fields after the command name (state is the first).
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = s.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

fn is_zombie(pid: i32) -> bool {
    stat_fields(pid).is_none_or(|f| f.first().is_some_and(|s| s == "Z" || s == "X"))
}

/// Every process below `pid` (by parent links in `/proc`; children of a subreaper agent
/// stay below it).
fn descendants(pid: i32) -> Vec<i32> {
    let mut parent_of: Vec<(i32, i32)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if let Some(ppid) = stat_fields(p).and_then(|f| f.get(1)?.parse().ok()) {
                parent_of.push((p, ppid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent_of {
            if pp == p && !out.contains(&c) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// Bytes allocated under `dir`, not following symlinks.
fn tree_usage(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(md) = e.path().symlink_metadata() else {
                continue;
            };
            total = total.saturating_add(md.blocks().saturating_mul(512));
            if md.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

/// The work itself, synchronous: every step is quick (no helper, no mount).
impl FakeDriver {
    fn has_disk(&self, id: &str) -> bool {
        self.disk(id).is_dir()
    }

    fn memory_current(&self, id: &str) -> Result<u64> {
        let Some(pid) = self.agent_pid(id) else {
            return Ok(0);
        };
        let mut pids = descendants(pid);
        pids.push(pid);
        // Resident pages (statm's second field), counted as 4 KiB each.
        Ok(pids
            .into_iter()
            .filter_map(|p| {
                let s = std::fs::read_to_string(format!("/proc/{p}/statm")).ok()?;
                s.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .sum::<u64>()
            .saturating_mul(4096))
    }

    fn disk_usage(&self, id: &str) -> u64 {
        tree_usage(&self.disk(id))
    }

    fn set_limits(&self, id: &str, limits: &Limits) -> Result<()> {
        self.fault(FakeFault::SetLimits)?;
        lock(&self.limits).insert(id.to_string(), *limits);
        Ok(())
    }

    fn prepare(&self, id: &str) -> Result<()> {
        self.fault(FakeFault::Prepare)?;
        std::fs::create_dir_all(self.disk(id)).map_err(|e| internal("make the disk", e))
    }

    fn launch(&self, req: &SandboxSpec) -> Result<i32> {
        self.fault(FakeFault::Launch)?;
        if !self.has_disk(&req.id) {
            return Err(CoreError::Conflict(format!(
                "the disk of sandbox {} is missing on the host; it cannot be started",
                &req.id
            )));
        }
        // What an earlier boot left running goes first, as the jail's stop would.
        self.stop(&req.id)?;
        let dir = self.dir(&req.id);
        let log = std::fs::File::create(dir.join("agent.log"))
            .map_err(|e| internal("create the agent log", e))?;
        let sock = self.socket(&req.id);
        let mut listen = std::ffi::OsString::from("unix:");
        listen.push(&sock);
        use std::os::unix::process::CommandExt;
        let child = Command::new(&self.agent_path)
            .arg("--listen")
            .arg(listen)
            // The host may not enforce Landlock; a fake enforces nothing anyway.
            .arg("--allow-no-landlock")
            .current_dir(&dir)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group: a signal meant for the test's group leaves it alone.
            .process_group(0)
            .spawn()
            .map_err(|e| internal(&format!("start {}", self.agent_path.display()), e))?;
        let pid = child.id() as i32;
        std::fs::write(dir.join("agent.pid"), pid.to_string())
            .map_err(|e| internal("record the agent's pid", e))?;
        let _ = std::fs::remove_file(self.frozen_flag(&req.id));
        lock(&self.children).insert(req.id.clone(), child);
        lock(&self.limits).insert(req.id.clone(), req.limits);
        // The caller connects with its own deadline; the socket appears when the agent
        // is ready to accept.
        Ok(pid)
    }

    fn freeze(&self, id: &str) -> Result<()> {
        self.fault(FakeFault::Freeze)?;
        self.signal_tree(id, libc::SIGSTOP);
        // Signals are delivered asynchronously: frozen means the agent has stopped, as
        // the jail's freeze waits for its cgroup to report frozen.
        if let Some(pid) = self.agent_pid(id) {
            let deadline = std::time::Instant::now() + FREEZE_DEADLINE;
            while !stat_fields(pid)
                .is_none_or(|f| f.first().is_some_and(|s| s != "R" && s != "S" && s != "D"))
            {
                if std::time::Instant::now() > deadline {
                    self.signal_tree(id, libc::SIGCONT);
                    return Err(CoreError::Unavailable(format!(
                        "fake driver: sandbox {id} did not stop within {}s",
                        FREEZE_DEADLINE.as_secs()
                    )));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        std::fs::write(self.frozen_flag(id), b"1").map_err(|e| internal("freeze", e))
    }

    fn thaw(&self, id: &str) -> Result<()> {
        self.fault(FakeFault::Thaw)?;
        self.signal_tree(id, libc::SIGCONT);
        match std::fs::remove_file(self.frozen_flag(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(internal("thaw", e)),
        }
    }

    fn is_frozen(&self, id: &str) -> Result<bool> {
        Ok(self.agent_pid(id).is_some() && self.frozen_flag(id).is_file())
    }

    fn stop(&self, id: &str) -> Result<()> {
        if let Some(pid) = self.agent_pid(id) {
            // Stopped first, so nothing forks while the tree is being killed.
            let _ = threadbox_sys::child::kill(pid, libc::SIGSTOP);
            for p in descendants(pid) {
                let _ = threadbox_sys::child::kill(p, libc::SIGKILL);
            }
            let _ = threadbox_sys::child::kill(pid, libc::SIGKILL);
        }
        if let Some(mut child) = lock(&self.children).remove(id) {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.socket(id));
        let _ = std::fs::remove_file(self.dir(id).join("agent.pid"));
        let _ = std::fs::remove_file(self.frozen_flag(id));
        Ok(())
    }

    fn destroy(&self, id: &str) -> Result<()> {
        self.fault(FakeFault::Destroy)?;
        self.stop(id)?;
        lock(&self.limits).remove(id);
        match std::fs::remove_dir_all(self.dir(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(internal("remove the sandbox's directory", e)),
        }
    }

    fn cpu_usage_usec(&self, id: &str) -> Result<u64> {
        let Some(pid) = self.agent_pid(id) else {
            return Ok(0);
        };
        let mut pids = descendants(pid);
        pids.push(pid);
        // utime + stime, in clock ticks of USER_HZ (100 on every Linux for /proc).
        let ticks: u64 = pids
            .into_iter()
            .filter_map(|p| {
                let f = stat_fields(p)?;
                Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
            })
            .sum();
        Ok(ticks.saturating_mul(10_000))
    }

    fn agent_alive(&self, id: &str, pid: i32) -> bool {
        self.agent_pid(id) == Some(pid)
    }

    fn oom_kills(&self, id: &str) -> Result<u64> {
        Ok(lock(&self.oom_kills).get(id).copied().unwrap_or(0))
    }
}

#[async_trait::async_trait]
impl Driver for FakeDriver {
    fn tier(&self) -> &'static str {
        self.tier
    }

    fn capabilities(&self) -> Vec<&'static str> {
        // `egress`: policies are accepted and stored (the manager's own tests need that),
        // never enforced (no netns of its own; see `egress_netns`).
        use crate::driver::capability::*;
        vec![CHECKPOINTS, EGRESS]
    }

    fn isolation_warnings(&self) -> Vec<String> {
        vec![format!(
            "{}: a test tier without isolation (FakeDriver)",
            self.tier
        )]
    }

    async fn resolve_image(&self, _image: &ImageRow) -> Result<()> {
        // The agent runs on the host's own file system whatever the image.
        Ok(())
    }

    async fn has_disk(&self, id: &str) -> bool {
        FakeDriver::has_disk(self, id)
    }

    async fn prepare(&self, spec: &SandboxSpec) -> Result<()> {
        FakeDriver::prepare(self, &spec.id)
    }

    async fn launch(&self, spec: &SandboxSpec) -> Result<i32> {
        FakeDriver::launch(self, spec)
    }

    async fn connect(&self, id: &str) -> Result<AgentStream> {
        // The agent binds its socket once it is ready: until then, wait (the caller's
        // deadline bounds this), unless the agent is gone.
        let sock = self.socket(id);
        loop {
            match tokio::net::UnixStream::connect(&sock).await {
                Ok(s) => return Ok(Box::new(s)),
                Err(e) if self.agent_pid(id).is_none() => {
                    return Err(CoreError::Unavailable(format!(
                        "connection to the sandbox agent failed: {e}"
                    )))
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        }
    }

    async fn freeze(&self, id: &str) -> Result<()> {
        FakeDriver::freeze(self, id)
    }

    async fn thaw(&self, id: &str) -> Result<()> {
        FakeDriver::thaw(self, id)
    }

    async fn is_frozen(&self, id: &str) -> Result<bool> {
        FakeDriver::is_frozen(self, id)
    }

    /// The fake has no memory of its own to move: hibernate is the freeze (which the
    /// manager has done), so the state machine can be driven on this tier.
    async fn hibernate(&self, id: &str) -> Result<u64> {
        if !FakeDriver::is_frozen(self, id)? {
            return Err(CoreError::Internal(format!("{id} is not frozen")));
        }
        Ok(0)
    }

    async fn stop(&self, id: &str) -> Result<()> {
        FakeDriver::stop(self, id)
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        FakeDriver::destroy(self, id)
    }

    async fn set_limits(&self, id: &str, limits: &Limits) -> Result<()> {
        FakeDriver::set_limits(self, id, limits)
    }

    async fn usage(&self, id: &str, disk: bool) -> Usage {
        Usage {
            memory_bytes: self.memory_current(id).ok(),
            cpu_usec: self.cpu_usage_usec(id).ok(),
            oom_kills: self.oom_kills(id).ok(),
            disk_bytes: disk.then(|| self.disk_usage(id)),
        }
    }

    async fn agent_alive(&self, id: &str, pid: i32) -> bool {
        FakeDriver::agent_alive(self, id, pid)
    }

    async fn checkpoint_disk(
        &self,
        id: &str,
        ckpt: &str,
        _agent_pid: Option<i32>,
    ) -> Result<crate::driver::DiskClone> {
        FakeDriver::checkpoint_disk(self, id, ckpt)
    }

    async fn restore_disk(&self, id: &str, ckpt: &str) -> Result<()> {
        FakeDriver::restore_disk(self, id, id, ckpt)
    }

    async fn fork_disk(
        &self,
        spec: &SandboxSpec,
        from: &str,
        _from_index: u32,
        ckpt: &str,
    ) -> Result<()> {
        FakeDriver::restore_disk(self, &spec.id, from, ckpt)
    }

    async fn remove_checkpoint_disk(&self, id: &str, ckpt: &str) -> Result<()> {
        FakeDriver::remove_checkpoint_disk(self, id, ckpt)
    }

    async fn checkpoint_disks(&self, id: &str) -> Vec<String> {
        FakeDriver::checkpoint_disks(self, id)
    }

    async fn save_template_disk(
        &self,
        from: &str,
        _from_index: u32,
        ckpt: &str,
        tpl: &str,
    ) -> Result<crate::driver::DiskClone> {
        FakeDriver::save_template_disk(self, from, ckpt, tpl)
    }

    async fn template_disk(&self, spec: &SandboxSpec, tpl: &str) -> Result<()> {
        FakeDriver::template_disk(self, &spec.id, tpl)
    }

    async fn remove_template_disk(&self, tpl: &str) -> Result<()> {
        FakeDriver::remove_template_disk(self, tpl)
    }

    async fn template_disks(&self) -> Vec<String> {
        FakeDriver::template_disks(self)
    }
}

mod checkpoint;
mod templates;
#[cfg(test)]
mod tests;
