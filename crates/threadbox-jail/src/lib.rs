//! The `jail` tier: namespaces + seccomp + Landlock + cgroups, our own code in
//! `threadbox-sys`. It owns everything jail-shaped: each sandbox's uid range (from the
//! spec's index), its cgroup, its overlay paths and the launch helper.
//!
//! (Over 600 lines: the `Driver` impl and the jail's host-side bookkeeping it needs — paths,
//! disk images, the helper run with its deadline — read as one unit; the kernel work itself
//! is in threadbox-sys.)

#![forbid(unsafe_code)]

mod ca_bundle;
mod checkpoint;
pub mod gvisor;
pub mod gvisor_ckpt;
pub mod gvisor_memory;
mod gvisor_net;
mod gvisor_posture;
mod gvisor_weaken;
pub mod store;
mod templates;
pub mod uid_range;
#[cfg(feature = "insecure-test-hooks")]
mod wake_hooks;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use threadbox_core::driver::{blocking, AgentStream, Driver, Limits, SandboxSpec, DEFAULT_TIER};
use threadbox_core::error::{CoreError, Result};
use threadbox_core::images::ImageSpec;
use threadbox_core::store::ImageRow;
use threadbox_sys::cgroup::{Layout, SandboxCgroup};
use threadbox_sys::jail::{JailSpec, LaunchReport, LaunchSpec, SANDBOX_USER_ID};
use threadbox_sys::net::EgressConfig;
use uid_range::UidRange;

/// What the jail tier needs of the daemon's configuration.
#[derive(Debug, Clone)]
pub struct JailConfig {
    /// The daemon's root (`sandboxes/<id>/` holds each sandbox's disk and mount points).
    pub root: PathBuf,
    /// The `threadbox-agent` binary supplied to every sandbox.
    pub agent_path: PathBuf,
    /// The binary run as the single-threaded jail launch helper
    /// (`<exe> __jail-launch`), normally the `threadbox` binary itself.
    pub helper_path: PathBuf,
    /// Name of the cgroup directory under which sandbox cgroups are made.
    pub cgroup_parent: String,
    /// Sandboxes may run without Landlock where the kernel cannot enforce it
    /// (`serve --insecure-allow-no-landlock`); by default they refuse to start.
    pub allow_no_landlock: bool,
    /// The host-wide registry of uid ranges (one per root, see [`uid_range`]).
    pub uid_registry: PathBuf,
}

impl JailConfig {
    pub fn new(root: PathBuf, agent_path: PathBuf, helper_path: PathBuf) -> Self {
        JailConfig {
            root,
            agent_path,
            helper_path,
            cgroup_parent: "threadbox".to_string(),
            allow_no_landlock: false,
            uid_registry: PathBuf::from(uid_range::DEFAULT_REGISTRY),
        }
    }

    /// The isolation layers this configuration lets go missing, for sandbox info (empty
    /// in the default posture).
    pub fn isolation_warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        #[cfg(feature = "insecure-test-hooks")]
        let missing = threadbox_sys::testhooks::Weaken::from_env()
            .is_ok_and(|w| w.has("no-landlock-kernel"))
            || threadbox_sys::landlock::abi_version().is_err();
        #[cfg(not(feature = "insecure-test-hooks"))]
        let missing = threadbox_sys::landlock::abi_version().is_err();
        if self.allow_no_landlock && missing {
            out.push(
                "landlock: not enforced on this kernel (allowed by serve --insecure-allow-no-landlock)"
                    .to_string(),
            );
        }
        out
    }
}

/// RLIMIT_NOFILE (soft = hard) of every sandbox process, or the daemon's hard limit when
/// that is lower. Below the hard limits hosts commonly give a root daemon (20000 on our CI
/// machine kind, 524288 under systemd), so the limit in force is ours, not the host's.
pub const SANDBOX_NOFILE: u64 = 16384;

/// Most cgroups below a sandbox's own: one per running call or background process (at
/// most 256 of those), leftovers still emptying, interpreter contexts.
pub const CGROUP_MAX_DESCENDANTS: u32 = 1024;
/// Levels below a sandbox's cgroup: a call's cgroup, and one more for what a call may
/// group (contexts).
pub const CGROUP_MAX_DEPTH: u32 = 2;

/// Where the identity of a sandbox's netns is recorded at boot (in its `run/`).
pub(crate) const NETNS_FILE: &str = "netns.json";

/// Most directory entries one disk-usage walk reads (a sandbox without a disk image).
const MAX_DU_ENTRIES: usize = 2_000_000;

/// The jail tier (cheap to clone; the work happens on the blocking pool).
#[derive(Clone)]
pub struct JailDriver(Arc<Jail>);

fn cg_limits(l: &Limits) -> threadbox_sys::cgroup::Limits {
    threadbox_sys::cgroup::Limits {
        memory_bytes: l.memory_bytes,
        cpus: l.cpus,
        pids: l.pids,
    }
}

pub struct Jail {
    config: JailConfig,
    uid_range: UidRange,
    layout: Layout,
    /// One sealed memfd of the agent shared by every boot, remade when the file changes.
    agent_memfd: std::sync::Mutex<Option<std::sync::Arc<AgentMemfd>>>,
    /// The launch helpers of staged slots (ADR 0180), by sandbox id, waiting for their
    /// attach.
    staged: std::sync::Mutex<std::collections::HashMap<String, Staged>>,
    /// The threads turning write barriers back on for the disks of sandboxes just booted
    /// (ADR 0216), by sandbox id: a stop waits for its sandbox's first.
    barriers: std::sync::Mutex<std::collections::HashMap<String, BarrierThread>>,
    /// Boots in flight; a barrier thread waits for none (ADR 0216).
    boots: std::sync::Arc<Boots>,
}

/// A [`Jail::restore_barrier_later`] thread and its cancel flag, set by a stop: a thread
/// still waiting for the boots in flight ends without remounting (the disk is about to be
/// unmounted), one already remounting finishes first.
struct BarrierThread {
    handle: std::thread::JoinHandle<()>,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// The boots in flight and when the last one ended, with a wake-up when that changes
/// (ADR 0216): a disk's barriers are turned back on once no boot has run for
/// [`BARRIER_SETTLE`], so that the remount's flush slows neither a fork's other attaches
/// nor the end of its request (the store's own commits).
#[derive(Default)]
struct Boots {
    state: std::sync::Mutex<BootState>,
    cv: std::sync::Condvar,
}

#[derive(Default)]
struct BootState {
    in_flight: usize,
    last_end: Option<std::time::Instant>,
}

impl Boots {
    fn enter(self: &std::sync::Arc<Self>) -> BootGuard {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .in_flight += 1;
        BootGuard(self.clone())
    }

    /// Waits until no boot has run for [`BARRIER_SETTLE`], `cancel` is set, or `limit`
    /// has passed.
    fn wait_quiet(&self, cancel: &std::sync::atomic::AtomicBool, limit: Duration) {
        let now = std::time::Instant::now;
        let deadline = now() + limit;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        while !cancel.load(std::sync::atomic::Ordering::Acquire) {
            let settled = match st.last_end {
                _ if st.in_flight > 0 => None,
                Some(t) => Some(t + BARRIER_SETTLE),
                None => break,
            };
            let until = match settled {
                Some(t) if t <= now() => break,
                Some(t) => t.min(deadline),
                None => deadline,
            };
            let left = until.saturating_duration_since(now());
            if now() >= deadline {
                return;
            }
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn wake(&self) {
        // Taken so a waiter between its check and its wait cannot miss the wake-up.
        let _st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.cv.notify_all();
    }
}

/// One boot in flight, counted until dropped.
struct BootGuard(std::sync::Arc<Boots>);

impl Drop for BootGuard {
    fn drop(&mut self) {
        let mut st = self.0.state.lock().unwrap_or_else(|p| p.into_inner());
        st.in_flight = st.in_flight.saturating_sub(1);
        st.last_end = Some(std::time::Instant::now());
        self.0.cv.notify_all();
    }
}

/// How long no boot must have run before a barrier thread remounts (ADR 0216): a fork's
/// request ends within it after its last attach.
const BARRIER_SETTLE: Duration = Duration::from_millis(50);

/// Longest a barrier thread waits for the boots beside it to end (ADR 0216): a host
/// booting without pause still gets its barriers back.
const BARRIER_QUIET_MAX: Duration = Duration::from_secs(1);

/// A staged slot's launch helper: alive, its stdin open (closing it destroys the slot).
struct Staged {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    /// The helper's stdout, line by line (a reader thread).
    lines: std::sync::mpsc::Receiver<String>,
    /// The init's host pid: the agent's once attached.
    pid: i32,
    /// The limits its cgroup was made with.
    limits: threadbox_sys::cgroup::Limits,
}

impl Staged {
    /// Kills the helper (its init then exits on the attach pipe's EOF, and `stop` kills
    /// the cgroup anyway) and reaps it.
    fn kill(mut self) {
        let _ = self.child.kill();
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

struct AgentMemfd {
    fd: std::os::fd::OwnedFd,
    stamp: (std::time::SystemTime, u64),
}

/// Where a sandbox keeps its things on the host.
pub struct SandboxPaths {
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub rootfs: PathBuf,
    pub run: PathBuf,
    /// The sandbox's disk image (ADR 0011) and where the helper mounts it (in the
    /// sandbox's mount namespace only); upper and work then live inside it.
    pub disk_image: PathBuf,
    pub disk_mount: PathBuf,
}

impl Jail {
    /// The jail of `config.root`: claims the root's host uid range (before the store
    /// exists, a root without a range and without a database is new) and detects the
    /// cgroup layout.
    pub fn new(config: JailConfig) -> Result<Jail> {
        if !config.agent_path.is_file() {
            return Err(CoreError::InvalidArgument(format!(
                "agent binary {} not found (build it with `cargo build --workspace`)",
                config.agent_path.display()
            )));
        }
        std::fs::create_dir_all(&config.root)?;
        let uid_range = uid_range::claim(&config.root, &config.uid_registry)?;
        tracing::info!(
            range = uid_range.index,
            first_uid = uid_range.base(),
            "host uid range"
        );
        let layout = Layout::detect()?;
        tracing::info!(layout = layout.name(), "cgroup layout");
        Ok(Jail {
            config,
            uid_range,
            layout,
            agent_memfd: std::sync::Mutex::new(None),
            staged: std::sync::Mutex::new(std::collections::HashMap::new()),
            barriers: std::sync::Mutex::new(std::collections::HashMap::new()),
            boots: std::sync::Arc::default(),
        })
        .inspect(Jail::restore_barriers_left)
    }

    /// At start: the disks of sandboxes still running without write barriers, because a
    /// daemon was killed between their boot and [`Jail::restore_barrier_later`]'s thread
    /// (ADR 0216), get them back before anything else can stop or boot them.
    fn restore_barriers_left(&self) {
        let left = match threadbox_sys::jail::nobarrier_disks() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("cannot list disks without write barriers: {e}");
                return;
            }
        };
        if left.is_empty() {
            return;
        }
        let Ok(dirs) = std::fs::read_dir(self.config.root.join("sandboxes")) else {
            return;
        };
        for d in dirs.flatten() {
            let id = d.file_name().to_string_lossy().into_owned();
            let p = self.paths(&id);
            let Ok(md) = std::fs::metadata(&p.disk_image) else {
                continue;
            };
            use std::os::unix::fs::MetadataExt;
            if left.contains(&(md.dev(), md.ino())) {
                match threadbox_sys::jail::restore_barrier(&p.disk_image, &p.disk_mount) {
                    Ok(b) => {
                        tracing::info!(sandbox = %id, result = ?b, "write barriers of a disk left without them")
                    }
                    Err(e) => tracing::warn!(sandbox = %id, "write barriers: {e}"),
                }
            }
        }
    }

    /// After a boot: turns the disk's write barriers back on in a thread of its own
    /// (ADR 0216), off the create's path; [`Jail::stop`] waits for it.
    fn restore_barrier_later(&self, id: &str) {
        let p = self.paths(id);
        if !p.disk_image.is_file() {
            return;
        }
        let sandbox = id.to_string();
        let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (boots, cancel2) = (self.boots.clone(), cancel.clone());
        let spawned = std::thread::Builder::new()
            .name("tb-barrier".into())
            .spawn(move || {
                boots.wait_quiet(&cancel2, BARRIER_QUIET_MAX);
                if cancel2.load(std::sync::atomic::Ordering::Acquire) {
                    tracing::debug!(sandbox, "write barriers: the sandbox stops first");
                    return;
                }
                let t = std::time::Instant::now();
                match threadbox_sys::jail::restore_barrier(&p.disk_image, &p.disk_mount) {
                    Ok(b) => tracing::debug!(sandbox, result = ?b,
                        us = t.elapsed().as_micros() as u64, "write barriers"),
                    Err(e) => tracing::warn!(sandbox, "write barriers not turned back on: {e}"),
                }
            });
        match spawned {
            Ok(handle) => {
                let old = self
                    .barriers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(id.to_string(), BarrierThread { handle, cancel });
                if let Some(t) = old {
                    t.cancel.store(true, std::sync::atomic::Ordering::Release);
                    self.boots.wake();
                    let _ = t.handle.join();
                }
            }
            Err(e) => tracing::warn!(sandbox = %id, "write barriers: no thread: {e}"),
        }
    }

    /// Ends `id`'s [`Jail::restore_barrier_later`] thread, if one runs: cancelled while it
    /// waits, waited for while it remounts.
    fn wait_barrier(&self, id: &str) {
        let h = self
            .barriers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(t) = h {
            t.cancel.store(true, std::sync::atomic::Ordering::Release);
            self.boots.wake();
            let _ = t.handle.join();
        }
    }

    pub fn paths(&self, id: &str) -> SandboxPaths {
        let dir = self.config.root.join("sandboxes").join(id);
        SandboxPaths {
            upper: dir.join("upper"),
            work: dir.join("work"),
            rootfs: dir.join("rootfs"),
            run: dir.join("run"),
            disk_image: dir.join("disk.img"),
            disk_mount: dir.join("disk"),
            dir,
        }
    }

    pub fn cgroup(&self, id: &str) -> SandboxCgroup {
        SandboxCgroup::new(self.layout.clone(), &self.config.cgroup_parent, id)
    }

    /// The shared sealed memfd of the agent (None: the helper copies the file itself).
    fn agent_memfd(&self) -> Option<std::sync::Arc<AgentMemfd>> {
        let meta = std::fs::metadata(&self.config.agent_path).ok()?;
        let stamp = (meta.modified().ok()?, meta.len());
        let mut slot = self.agent_memfd.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = slot.as_ref().filter(|m| m.stamp == stamp) {
            return Some(m.clone());
        }
        let fd = threadbox_sys::jail::sealed_agent(&self.config.agent_path).ok()?;
        let m = std::sync::Arc::new(AgentMemfd { fd, stamp });
        *slot = Some(m.clone());
        Some(m)
    }

    pub fn disk_exists(&self, id: &str) -> bool {
        let p = self.paths(id);
        p.disk_image.is_file() || p.upper.is_dir()
    }
}

/// Longest a launch helper may take: it mounts, forks and execs, normally in tens of
/// milliseconds; one stuck in the kernel must not hold its caller forever (F7).
const HELPER_DEADLINE: Duration = Duration::from_secs(60);

/// Feeds the helper its spec and waits for it to exit, at most `deadline`; past it the
/// helper is killed. The helper is reaped on every path (F18).
fn run_helper(
    mut child: std::process::Child,
    input: &[u8],
    deadline: Duration,
) -> Result<std::process::Output> {
    if let Some(mut stdin) = child.stdin.take() {
        if let Err(e) = stdin.write_all(input) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.into());
        }
    }
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(out) => Ok(out?),
        Err(_) => {
            let _ = threadbox_sys::child::kill(pid, libc::SIGKILL);
            // The waiting thread reaps it.
            let _ = rx.recv();
            Err(CoreError::Unavailable(format!(
                "the jail helper did not finish within {}s",
                deadline.as_secs()
            )))
        }
    }
}

/// The helper's next report line, waited for at most `deadline`.
fn next_report(
    lines: &std::sync::mpsc::Receiver<String>,
    deadline: Duration,
) -> Result<LaunchReport> {
    use std::sync::mpsc::RecvTimeoutError;
    match lines.recv_timeout(deadline) {
        Ok(line) => serde_json::from_str(&line)
            .map_err(|_| CoreError::Internal(format!("jail helper: bad report {line:?}"))),
        Err(RecvTimeoutError::Timeout) => Err(CoreError::Unavailable(format!(
            "the jail helper did not answer within {}s",
            deadline.as_secs()
        ))),
        Err(RecvTimeoutError::Disconnected) => Err(CoreError::Internal(
            "the jail helper exited without a report".into(),
        )),
    }
}

/// Gives a sandbox its disk image: a sparse copy of a template made once per size under
/// `templates` (mkfs costs ~10 ms per create; the copy moves the few MiB the empty file
/// system occupies). Templates are only ever read after their atomic rename.
fn make_disk_image(templates: &Path, path: &Path, bytes: u64) -> Result<()> {
    let template = templates.join(format!("ext4-{bytes}.img"));
    if !template.is_file() {
        mkdir(templates)?;
        let tmp = templates.join(format!(
            ".ext4-{bytes}.{}.tmp",
            uuid::Uuid::new_v4().simple()
        ));
        let made = make_fresh_disk_image(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &template).map_err(CoreError::from));
        if let Err(e) = made {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    }
    if let Err(e) = threadbox_sys::sparse::copy_sparse(&template, path) {
        let _ = std::fs::remove_file(path);
        return Err(CoreError::Internal(format!(
            "disk image for the sandbox (host disk full?): {e}"
        )));
    }
    Ok(())
}

/// Creates a sparse file of `bytes` and an ext4 file system on it (ADR 0011). 1% of the
/// blocks stay reserved for host root: a sandbox that filled its disk can still be booted
/// (overlayfs needs room in its workdir at mount time).
fn make_fresh_disk_image(path: &Path, bytes: u64) -> Result<()> {
    let f = std::fs::File::create(path)
        .map_err(|e| CoreError::Internal(format!("create {}: {e}", path.display())))?;
    f.set_len(bytes)
        .map_err(|e| CoreError::Internal(format!("size {}: {e}", path.display())))?;
    drop(f);
    let mkfs = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            CoreError::Internal("disk quotas need mkfs.ext4 (e2fsprogs) on the host".into())
        })?;
    let out = std::process::Command::new(mkfs)
        .args(["-q", "-F", "-m", "1", "-E"])
        .arg("lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0")
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| CoreError::Internal(format!("run {}: {e}", mkfs.display())))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(path);
        return Err(CoreError::Internal(format!(
            "mkfs.ext4 failed (host disk full?): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir_all(p)
        .map_err(|e| CoreError::Internal(format!("mkdir {}: {e}", p.display())))
}

impl Jail {
    pub fn prepare(&self, id: &str, slot: u32, disk_bytes: u64) -> Result<()> {
        #[cfg(feature = "insecure-test-hooks")]
        let disk_bytes = match threadbox_sys::testhooks::Weaken::from_env() {
            Ok(w) if w.has("no-disk-quota") => 0,
            _ => disk_bytes,
        };
        let p = self.paths(id);
        use std::os::unix::fs::{chown, PermissionsExt};
        if disk_bytes > 0 {
            for d in [&p.dir, &p.disk_mount, &p.rootfs, &p.run] {
                mkdir(d)?;
            }
            std::fs::set_permissions(&p.dir, std::fs::Permissions::from_mode(0o700))?;
            // The launch helper creates upper/, work/ and home/user inside on first boot.
            let templates = self.config.root.join("images").join(".disk-templates");
            return make_disk_image(&templates, &p.disk_image, disk_bytes);
        }
        for d in [&p.dir, &p.upper, &p.work, &p.rootfs, &p.run] {
            mkdir(d)?;
        }
        std::fs::set_permissions(&p.dir, std::fs::Permissions::from_mode(0o700))?;
        let home = p.upper.join("home/user");
        mkdir(&home)?;
        let uid = self.uid_range.slot_base(slot)? + SANDBOX_USER_ID;
        chown(&home, Some(uid), Some(uid))?;
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755))?;
        Ok(())
    }

    /// Boots `req`: into its staged slot when it has one (ADR 0180), else cold. An attach
    /// that fails destroys the slot (its processes and cgroup) and boots cold.
    pub fn launch(&self, req: &SandboxSpec, layers: &ImageSpec) -> Result<i32> {
        let _boot = self.boots.enter();
        let staged = self
            .staged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&req.id);
        if let Some(st) = staged {
            match self.attach(req, st) {
                Ok(pid) => {
                    self.restore_barrier_later(&req.id);
                    return Ok(pid);
                }
                Err(e) => {
                    tracing::warn!(sandbox = %req.id, "staged slot: attach failed ({e}); slot destroyed, booting cold");
                    self.stop(&req.id)?;
                }
            }
        }
        let pid = self.launch_cold(req, layers)?;
        self.restore_barrier_later(&req.id);
        Ok(pid)
    }

    /// The limits `req`'s cgroup is given (test weakenings applied).
    fn limits_of(&self, req: &SandboxSpec) -> Result<threadbox_sys::cgroup::Limits> {
        #[cfg(feature = "insecure-test-hooks")]
        let weaken = threadbox_sys::testhooks::Weaken::from_env().map_err(CoreError::Internal)?;
        #[allow(unused_mut)]
        let mut limits = cg_limits(&req.limits);
        #[cfg(feature = "insecure-test-hooks")]
        {
            if weaken.has("no-pids-limit") {
                limits.pids = 1 << 22;
            }
            if weaken.has("no-memory-limit") {
                limits.memory_bytes = 1 << 40;
            }
            if weaken.has("no-cpu-limit") {
                limits.cpus = 64.0;
            }
        }
        Ok(limits)
    }

    /// Stages slot `req` (ADR 0180): its cgroup, and a launch helper that has built
    /// everything up to the disk, then waits for [`Jail::launch`] to attach one. `req`
    /// has no disk yet: the one attached is made into its directory later.
    pub fn stage(&self, req: &SandboxSpec, layers: &ImageSpec) -> Result<()> {
        let r = self.stage_inner(req, layers);
        if r.is_err() {
            let _ = self.stop(&req.id);
        }
        r
    }

    fn stage_inner(&self, req: &SandboxSpec, layers: &ImageSpec) -> Result<()> {
        let p = self.paths(&req.id);
        if p.disk_image.exists() || p.upper.exists() {
            // Never: a staged slot has no disk before its attach.
            return Err(CoreError::Internal(format!(
                "sandbox {} has a disk; it cannot be staged",
                req.id
            )));
        }
        use std::os::unix::fs::PermissionsExt;
        for d in [&p.dir, &p.disk_mount, &p.rootfs, &p.run] {
            mkdir(d)?;
        }
        std::fs::set_permissions(&p.dir, std::fs::Permissions::from_mode(0o700))?;
        let limits = self.limits_of(req)?;
        let (spec, memfd) = self.staged_spec(req, layers, &limits)?;
        let mut input =
            serde_json::to_vec(&spec).map_err(|e| CoreError::Internal(e.to_string()))?;
        input.push(b'\n');
        let mut child = std::process::Command::new(&self.config.helper_path)
            .arg("__jail-launch")
            .arg("--staged")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .env_clear()
            .spawn()
            .map_err(|e| {
                CoreError::Internal(format!(
                    "start the jail helper {}: {e}",
                    self.config.helper_path.display()
                ))
            })?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(CoreError::Internal("the jail helper has no pipes".into()));
        };
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut st = Staged {
            child,
            stdin,
            lines,
            pid: 0,
            limits,
        };
        let first = match st.stdin.write_all(&input).map_err(CoreError::from) {
            Ok(()) => next_report(&st.lines, HELPER_DEADLINE),
            Err(e) => Err(e),
        };
        // The helper opened the memfd before its first report.
        drop(memfd);
        let report = match first {
            Ok(r) => r,
            Err(e) => {
                st.kill();
                return Err(e);
            }
        };
        tracing::debug!(sandbox = %req.id, phases_us = ?report.phases_us, "jail staged");
        match (report.ok, report.agent_pid) {
            (true, Some(pid)) => {
                st.pid = pid;
                self.staged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(req.id.clone(), st);
                Ok(())
            }
            _ => {
                st.kill();
                Err(CoreError::Internal(format!(
                    "staging a sandbox failed: {}",
                    report.error.unwrap_or_else(|| "unknown error".into())
                )))
            }
        }
    }

    /// Hands staged slot `st` the disk now in `req`'s directory and finishes its boot.
    /// On error the slot's helper is killed (the caller stops the rest).
    fn attach(&self, req: &SandboxSpec, mut st: Staged) -> Result<i32> {
        let t0 = std::time::Instant::now();
        let r = (|| {
            let p = self.paths(&req.id);
            if !p.disk_image.is_file() {
                return Err(CoreError::Internal(format!(
                    "staged slot {}: no disk image to attach",
                    req.id
                )));
            }
            let base = self.uid_range.slot_base(req.index)?;
            let limits = self.limits_of(req)?;
            if limits != st.limits {
                self.cgroup(&req.id).set_limits(&limits)?;
            }
            let attach = threadbox_sys::jail::StagedAttach {
                hostname: req.hostname.to_string(),
                tmpfs_bytes: limits.memory_bytes,
                disk_owner_base: checkpoint::disk_owner_base(&p.dir).filter(|b| *b != base),
            };
            let mut line =
                serde_json::to_vec(&attach).map_err(|e| CoreError::Internal(e.to_string()))?;
            line.push(b'\n');
            st.stdin.write_all(&line)?;
            st.stdin.flush()?;
            let report = next_report(&st.lines, HELPER_DEADLINE)?;
            tracing::debug!(
                sandbox = %req.id,
                attach_us = t0.elapsed().as_micros() as u64,
                phases_us = ?report.phases_us,
                "jail attached"
            );
            match (report.ok, report.agent_pid) {
                (true, Some(pid)) if pid == st.pid => {
                    tracing::info!(sandbox = %req.id, agent_pid = pid, "staged slot attached");
                    Ok(pid)
                }
                _ => Err(CoreError::Internal(format!(
                    "sandbox setup failed: {}",
                    report.error.unwrap_or_else(|| "unknown error".into())
                ))),
            }
        })();
        let pid = match r {
            Ok(pid) => pid,
            Err(e) => {
                st.kill();
                return Err(e);
            }
        };
        // The helper exits after its second report.
        drop(st.stdin);
        let _ = st.child.wait();
        #[cfg(feature = "insecure-test-hooks")]
        let egress = !threadbox_sys::testhooks::Weaken::from_env()
            .map_err(CoreError::Internal)?
            .has("shared-netns");
        #[cfg(not(feature = "insecure-test-hooks"))]
        let egress = true;
        if egress {
            self.record_netns(&req.id, pid)?;
        }
        Ok(pid)
    }

    /// Whether `id` is a staged slot waiting for its attach, its helper alive.
    pub fn is_staged(&self, id: &str) -> bool {
        let mut map = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        match map.get_mut(id) {
            Some(st) => matches!(st.child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The staged helper's spec for slot `req` (its disk image is attached later, no
    /// trusted CA: a sandbox with secrets boots cold), its cgroup made; the agent memfd is
    /// held by the caller until the helper has opened it.
    fn staged_spec(
        &self,
        req: &SandboxSpec,
        layers: &ImageSpec,
        limits: &threadbox_sys::cgroup::Limits,
    ) -> Result<(LaunchSpec, Option<std::sync::Arc<AgentMemfd>>)> {
        let p = self.paths(&req.id);
        let base = self.uid_range.slot_base(req.index)?;
        let cg = self.cgroup(&req.id);
        #[cfg(feature = "insecure-test-hooks")]
        let weaken = threadbox_sys::testhooks::Weaken::from_env().map_err(CoreError::Internal)?;
        cg.create(limits, Some((base, base)))?;
        #[cfg(feature = "insecure-test-hooks")]
        let tree_limit = !weaken.has("no-cgroup-tree-limit");
        #[cfg(not(feature = "insecure-test-hooks"))]
        let tree_limit = true;
        if tree_limit {
            cg.limit_tree(CGROUP_MAX_DESCENDANTS, CGROUP_MAX_DEPTH)?;
        }
        let memfd = self.agent_memfd();
        let spec = JailSpec {
            hostname: req.hostname.to_string(),
            id_base: base,
            lower: layers.lower.clone(),
            // Staged slots are of the host image only (ADR 0180), whose lowers are host
            // root's: never idmapped (ADR 0175).
            lower_idmap: false,
            lower_userns_fd: None,
            upper: p.disk_mount.join("upper"),
            work: p.disk_mount.join("work"),
            disk_image: Some(p.disk_image.clone()),
            disk_owner_base: None,
            disk_userns_fd: None,
            home_owner: base + SANDBOX_USER_ID,
            rootfs: p.rootfs.clone(),
            binds: layers.binds.clone(),
            file_binds: Vec::new(),
            agent_path: self.config.agent_path.clone(),
            agent_memfd: memfd.as_ref().map(|m| {
                use std::os::fd::AsRawFd;
                PathBuf::from(format!(
                    "/proc/{}/fd/{}",
                    std::process::id(),
                    m.fd.as_raw_fd()
                ))
            }),
            socket_path: p.run.join("agent.sock"),
            cgroup_procs: cg.procs_files(),
            cgroup_dir: Some(cg.v2_dir()),
            tmpfs_bytes: limits.memory_bytes,
            nofile: SANDBOX_NOFILE,
            allow_no_landlock: self.config.allow_no_landlock,
            #[cfg(feature = "insecure-test-hooks")]
            test_weaken: weaken.list().to_vec(),
            #[cfg(not(feature = "insecure-test-hooks"))]
            test_weaken: Vec::new(),
        };
        #[cfg(feature = "insecure-test-hooks")]
        let egress = (!weaken.has("shared-netns")).then(EgressConfig::default);
        #[cfg(not(feature = "insecure-test-hooks"))]
        let egress = Some(EgressConfig::default());
        Ok((LaunchSpec { jail: spec, egress }, memfd))
    }

    fn launch_cold(&self, req: &SandboxSpec, layers: &ImageSpec) -> Result<i32> {
        let p = self.paths(&req.id);
        let image = p.disk_image.is_file();
        if !image && !p.upper.is_dir() {
            return Err(CoreError::Conflict(format!(
                "the disk of sandbox {} is missing on the host; it cannot be started",
                req.id
            )));
        }
        mkdir(&p.run)?;
        let (upper, work) = if image {
            // Inside the image; the helper clears the workdir after mounting it.
            mkdir(&p.disk_mount)?;
            (p.disk_mount.join("upper"), p.disk_mount.join("work"))
        } else {
            // A previous agent's overlay workdir may hold leftovers overlayfs refuses to
            // reuse.
            let _ = std::fs::remove_dir_all(&p.work);
            mkdir(&p.work)?;
            (p.upper.clone(), p.work.clone())
        };
        mkdir(&p.rootfs)?;
        let base = self.uid_range.slot_base(req.index)?;
        let cg = self.cgroup(&req.id);
        #[cfg(feature = "insecure-test-hooks")]
        let weaken = threadbox_sys::testhooks::Weaken::from_env().map_err(CoreError::Internal)?;
        #[allow(unused_mut)]
        let mut limits = cg_limits(&req.limits);
        #[cfg(feature = "insecure-test-hooks")]
        {
            if weaken.has("no-pids-limit") {
                limits.pids = 1 << 22;
            }
            if weaken.has("no-memory-limit") {
                limits.memory_bytes = 1 << 40;
            }
            if weaken.has("no-cpu-limit") {
                limits.cpus = 64.0;
            }
        }
        let t0 = std::time::Instant::now();
        cg.create(&limits, Some((base, base)))?;
        #[cfg(feature = "insecure-test-hooks")]
        let tree_limit = !weaken.has("no-cgroup-tree-limit");
        #[cfg(not(feature = "insecure-test-hooks"))]
        let tree_limit = true;
        if tree_limit {
            cg.limit_tree(CGROUP_MAX_DESCENDANTS, CGROUP_MAX_DEPTH)?;
        }
        // Held until the helper has exited, so the fd it opens stays valid.
        let memfd = self.agent_memfd();
        let spec = JailSpec {
            hostname: req.hostname.to_string(),
            id_base: base,
            lower: layers.lower.clone(),
            // An OCI image's layers keep the image's ids on disk (ADR 0175).
            lower_idmap: layers.image_owners,
            lower_userns_fd: None,
            upper,
            work,
            disk_image: image.then(|| p.disk_image.clone()),
            disk_owner_base: image
                .then(|| checkpoint::disk_owner_base(&p.dir))
                .flatten()
                .filter(|b| *b != base),
            disk_userns_fd: None,
            home_owner: base + SANDBOX_USER_ID,
            rootfs: p.rootfs.clone(),
            binds: layers.binds.clone(),
            file_binds: req
                .trust_ca
                .as_deref()
                .and_then(|ca| ca_bundle::bind(&layers.lower, ca, &p.run))
                .into_iter()
                .collect(),
            agent_path: self.config.agent_path.clone(),
            agent_memfd: memfd.as_ref().map(|m| {
                use std::os::fd::AsRawFd;
                PathBuf::from(format!(
                    "/proc/{}/fd/{}",
                    std::process::id(),
                    m.fd.as_raw_fd()
                ))
            }),
            socket_path: p.run.join("agent.sock"),
            cgroup_procs: cg.procs_files(),
            cgroup_dir: Some(cg.v2_dir()),
            tmpfs_bytes: limits.memory_bytes,
            nofile: SANDBOX_NOFILE,
            allow_no_landlock: self.config.allow_no_landlock,
            #[cfg(feature = "insecure-test-hooks")]
            test_weaken: weaken.list().to_vec(),
            #[cfg(not(feature = "insecure-test-hooks"))]
            test_weaken: Vec::new(),
        };
        // Every sandbox boots with the fixed egress table (ADR 0061): a policy can then be set
        // live, and a pooled sandbox gets one at adoption, without a reboot. With no policy
        // the daemon opens no listener in the netns and the kernel refuses everything.
        // `shared-netns` (a test weakening) has no netns of its own to hold the table.
        #[cfg(feature = "insecure-test-hooks")]
        let egress = (!weaken.has("shared-netns")).then(EgressConfig::default);
        #[cfg(not(feature = "insecure-test-hooks"))]
        let egress = Some(EgressConfig::default());
        let spec = LaunchSpec { jail: spec, egress };
        let egress = spec.egress;
        let input = serde_json::to_vec(&spec).map_err(|e| CoreError::Internal(e.to_string()))?;
        let t1 = std::time::Instant::now();
        let child = std::process::Command::new(&self.config.helper_path)
            .arg("__jail-launch")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_clear()
            .spawn()
            .map_err(|e| {
                CoreError::Internal(format!(
                    "start the jail helper {}: {e}",
                    self.config.helper_path.display()
                ))
            })?;
        let out = match run_helper(child, &input, HELPER_DEADLINE) {
            Ok(out) => out,
            Err(e) => {
                // Nothing the helper started for this sandbox is left running.
                let _ = self.stop(&req.id);
                return Err(e);
            }
        };
        let line = String::from_utf8_lossy(&out.stdout);
        let report: LaunchReport = serde_json::from_str(line.lines().next().unwrap_or(""))
            .map_err(|_| {
                CoreError::Internal(format!(
                    "jail helper failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            })?;
        // Where a boot's time goes (issue 14's fork target, ADR 0155).
        tracing::debug!(
            sandbox = %req.id,
            cgroup_us = (t1 - t0).as_micros() as u64,
            helper_us = t1.elapsed().as_micros() as u64,
            phases_us = ?report.phases_us,
            "jail launched"
        );
        match (report.ok, report.agent_pid) {
            (true, Some(pid)) => {
                if egress.is_some() {
                    if let Err(e) = self.record_netns(&req.id, pid) {
                        let _ = self.stop(&req.id);
                        return Err(e);
                    }
                }
                Ok(pid)
            }
            _ if report.refused => {
                let _ = self.stop(&req.id);
                Err(CoreError::Unavailable(
                    report.error.unwrap_or_else(|| "refused".into()),
                ))
            }
            _ => {
                let _ = self.stop(&req.id);
                Err(CoreError::Internal(format!(
                    "sandbox setup failed: {}",
                    report.error.unwrap_or_else(|| "unknown error".into())
                )))
            }
        }
    }

    pub fn freeze(&self, id: &str) -> Result<()> {
        Ok(self.cgroup(id).freeze(Duration::from_secs(10))?)
    }

    pub fn thaw(&self, id: &str) -> Result<()> {
        Ok(self.cgroup(id).thaw()?)
    }

    pub fn is_frozen(&self, id: &str) -> Result<bool> {
        let cg = self.cgroup(id);
        if !cg.exists() {
            return Ok(false);
        }
        Ok(cg.is_frozen()?)
    }

    pub fn stop(&self, id: &str) -> Result<()> {
        // Never end a sandbox while its disk is mounted a second time (ADR 0216).
        self.wait_barrier(id);
        let staged = self
            .staged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some(st) = staged {
            st.kill();
        }
        let cg = self.cgroup(id);
        if cg.exists() {
            cg.kill_all(Duration::from_secs(10))?;
            // Killed processes of a frozen cgroup die, but leave it frozen for new ones.
            let _ = cg.thaw();
            cg.remove()?;
        } else {
            // v1 dirs may exist alone after a crash between creating them.
            let _ = cg.remove();
        }
        let p = self.paths(id);
        let _ = std::fs::remove_file(p.run.join("agent.sock"));
        Ok(())
    }

    pub fn destroy(&self, id: &str) -> Result<()> {
        self.stop(id)?;
        let p = self.paths(id);
        // A fork interrupted while its clone was mounted (ADR 0100): never walk into it.
        threadbox_sys::jail::unmount_leftover(&p.disk_mount)
            .map_err(|e| CoreError::Internal(e.to_string()))?;
        match std::fs::remove_dir_all(&p.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CoreError::Internal(format!(
                "remove {}: {e}",
                p.dir.display()
            ))),
        }
    }

    /// Records the netns identity of `pid` (a process of the sandbox that booted with the
    /// egress table) at boot; every later open is checked against it (a reused pid is
    /// refused).
    pub(crate) fn record_netns(&self, id: &str, pid: i32) -> Result<()> {
        let ns = threadbox_sys::net::netns_inode(pid)?;
        let b = serde_json::to_vec(&ns).map_err(|e| CoreError::Internal(e.to_string()))?;
        Ok(std::fs::write(self.paths(id).run.join(NETNS_FILE), b)?)
    }

    /// Forgets the recorded netns (a boot without the egress table).
    pub(crate) fn forget_netns(&self, id: &str) -> Result<()> {
        match std::fs::remove_file(self.paths(id).run.join(NETNS_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// The sandbox's network namespace if it booted with the egress table, checked against
    /// the identity recorded at boot and against the host's own.
    pub fn egress_netns(&self, id: &str, pid: i32) -> Result<Option<threadbox_sys::net::NetNs>> {
        let path = self.paths(id).run.join(NETNS_FILE);
        let recorded: threadbox_sys::net::NetnsId = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| CoreError::Internal(format!("{}: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if !self.agent_alive(id, pid) {
            return Err(CoreError::Unavailable(format!(
                "the agent of sandbox {id} is not running"
            )));
        }
        let ns = threadbox_sys::net::NetNs::open_pid_checked(pid, recorded)?;
        if ns.id() == threadbox_sys::net::NetNs::current()?.id() {
            return Err(CoreError::Internal(format!(
                "sandbox {id} shares the daemon's network namespace"
            )));
        }
        Ok(Some(ns))
    }

    pub fn socket_path(&self, id: &str) -> PathBuf {
        self.paths(id).run.join("agent.sock")
    }

    /// The overlay layers of `img`.
    pub fn image_spec(&self, img: &ImageRow) -> Result<ImageSpec> {
        Ok(match img.kind.as_str() {
            "host" => threadbox_core::images::host_image_spec(&self.config.root),
            threadbox_core::oci::OCI_KIND => {
                threadbox_core::oci::image_spec(&self.config.root, img)?
            }
            _ => ImageSpec {
                lower: vec![img.path.clone().unwrap_or_default().into()],
                binds: vec![],
                image_owners: false,
            },
        })
    }

    pub fn cpu_usage_usec(&self, id: &str) -> Result<u64> {
        Ok(self.cgroup(id).cpu_usage_usec()?)
    }

    pub fn agent_alive(&self, id: &str, pid: i32) -> bool {
        let cg = self.cgroup(id);
        cg.exists() && cg.pids().is_ok_and(|p| p.contains(&pid))
    }

    pub fn oom_kills(&self, id: &str) -> Result<u64> {
        Ok(self.cgroup(id).oom_kills()?)
    }

    /// Hibernate (ADR 0129): the frozen sandbox's memory goes to swap. Refused, with the
    /// reason, when the host's free swap cannot hold what the sandbox holds now.
    pub fn hibernate(&self, id: &str) -> Result<u64> {
        let cg = self.cgroup(id);
        let held = cg.memory_current()?;
        let free = threadbox_sys::cgroup::host_swap_free()?;
        if free == 0 {
            return Err(CoreError::Unavailable(
                "hibernate needs swap or zram on the host, and it has none \
                 (docs/hibernate.md says how to add some)"
                    .into(),
            ));
        }
        if free < held {
            return Err(CoreError::Unavailable(format!(
                "hibernate needs {held} bytes of free swap for this sandbox; the host has {free}"
            )));
        }
        Ok(cg.reclaim()?)
    }

    /// After a hibernate, before the thaw: swap closed again (v2).
    pub fn wake(&self, id: &str) -> Result<()> {
        let cg = self.cgroup(id);
        if cg.exists() {
            cg.close_swap()?;
        }
        #[cfg(feature = "insecure-test-hooks")]
        wake_hooks::after_wake(&cg)?;
        Ok(())
    }

    pub fn memory_current(&self, id: &str) -> Result<u64> {
        Ok(self.cgroup(id).memory_current()?)
    }

    pub fn disk_usage(&self, id: &str) -> u64 {
        // A quota'd sandbox's writable layer lives in its disk image (ADR 0011): what it
        // occupies on the host is the image's allocated size.
        use std::os::unix::fs::MetadataExt;
        let p = self.paths(id);
        match std::fs::metadata(&p.disk_image) {
            Ok(m) if m.is_file() => m.blocks().saturating_mul(512),
            _ => tree_usage(&p.upper),
        }
    }

    pub fn set_limits(&self, id: &str, limits: &Limits) -> Result<()> {
        Ok(self.cgroup(id).set_limits(&cg_limits(limits))?)
    }
}

/// Bytes allocated under `dir`, not following symlinks (what `du` reports).
fn tree_usage(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > MAX_DU_ENTRIES {
                return total;
            }
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

impl JailDriver {
    /// The jail of `config.root`: claims the root's host uid range (call it before the
    /// manager opens the store: a root without a range and without a database is new).
    pub fn new(config: JailConfig) -> Result<JailDriver> {
        Ok(JailDriver(Arc::new(Jail::new(config)?)))
    }

    /// The synchronous jail underneath (paths, cgroups), for the security suite.
    pub fn jail(&self) -> &Jail {
        &self.0
    }

    /// Runs `f` on the jail on the blocking pool.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Jail) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let j = self.0.clone();
        blocking(move || f(&j)).await
    }
}

#[async_trait::async_trait]
impl Driver for JailDriver {
    fn tier(&self) -> &'static str {
        DEFAULT_TIER
    }

    fn isolation_warnings(&self) -> Vec<String> {
        self.0.config.isolation_warnings()
    }

    fn capabilities(&self) -> Vec<&'static str> {
        use threadbox_core::driver::capability::*;
        vec![
            CHECKPOINTS,
            EGRESS,
            LANDLOCK,
            CALL_CGROUPS,
            UID_RANGES,
            HIBERNATE,
            HIBERNATE_SWAP,
        ]
    }

    async fn resolve_image(&self, image: &ImageRow) -> Result<()> {
        // Every kind the store holds is an overlay lower layer (or the host skeleton);
        // an OCI image's layers must all be in the layer store.
        self.0.image_spec(image).map(drop)
    }

    async fn has_disk(&self, id: &str) -> bool {
        self.0.disk_exists(id)
    }

    async fn prepare(&self, spec: &SandboxSpec) -> Result<()> {
        let (id, index, disk) = (spec.id.clone(), spec.index, spec.disk_bytes);
        self.run(move |j| j.prepare(&id, index, disk)).await
    }

    async fn launch(&self, spec: &SandboxSpec) -> Result<i32> {
        let spec = spec.clone();
        self.run(move |j| {
            let image = j.image_spec(&spec.image)?;
            j.launch(&spec, &image)
        })
        .await
    }

    async fn stage(&self, spec: &SandboxSpec) -> Result<()> {
        let spec = spec.clone();
        self.run(move |j| {
            let image = j.image_spec(&spec.image)?;
            j.stage(&spec, &image)
        })
        .await
    }

    async fn is_staged(&self, id: &str) -> bool {
        let id = id.to_string();
        self.run(move |j| Ok(j.is_staged(&id)))
            .await
            .unwrap_or(false)
    }

    async fn connect(&self, id: &str) -> Result<AgentStream> {
        // The helper returns once the agent listens (it inherits a bound socket).
        let s = tokio::net::UnixStream::connect(self.0.socket_path(id))
            .await
            .map_err(|e| {
                CoreError::Unavailable(format!("connection to the sandbox agent failed: {e}"))
            })?;
        Ok(Box::new(s))
    }

    async fn sync_disk(&self, id: &str, agent_pid: Option<i32>) -> Result<()> {
        let id = id.to_string();
        self.run(move |j| j.sync_disk(&id, agent_pid)).await
    }

    async fn checkpoint_disk(
        &self,
        id: &str,
        ckpt: &str,
        agent_pid: Option<i32>,
    ) -> Result<threadbox_core::driver::DiskClone> {
        let (id, ckpt) = (id.to_string(), ckpt.to_string());
        self.run(move |j| j.checkpoint_disk(&id, &ckpt, agent_pid))
            .await
    }

    async fn restore_disk(&self, id: &str, ckpt: &str) -> Result<()> {
        let (id, ckpt) = (id.to_string(), ckpt.to_string());
        self.run(move |j| j.restore_disk(&id, &ckpt)).await
    }

    async fn fork_disk(
        &self,
        spec: &SandboxSpec,
        from: &str,
        from_index: u32,
        ckpt: &str,
    ) -> Result<()> {
        let (id, index) = (spec.id.clone(), spec.index);
        let (from, ckpt) = (from.to_string(), ckpt.to_string());
        self.run(move |j| j.fork_disk(&id, index, &from, from_index, &ckpt))
            .await
    }

    async fn remove_checkpoint_disk(&self, id: &str, ckpt: &str) -> Result<()> {
        let (id, ckpt) = (id.to_string(), ckpt.to_string());
        self.run(move |j| j.remove_checkpoint_disk(&id, &ckpt))
            .await
    }

    async fn checkpoint_disks(&self, id: &str) -> Vec<String> {
        let id = id.to_string();
        self.run(move |j| Ok(j.checkpoint_disks(&id)))
            .await
            .unwrap_or_default()
    }

    async fn save_template_disk(
        &self,
        from: &str,
        from_index: u32,
        ckpt: &str,
        tpl: &str,
    ) -> Result<threadbox_core::driver::DiskClone> {
        let (from, ckpt, tpl) = (from.to_string(), ckpt.to_string(), tpl.to_string());
        self.run(move |j| j.save_template_disk(&from, from_index, &ckpt, &tpl))
            .await
    }

    async fn template_disk(&self, spec: &SandboxSpec, tpl: &str) -> Result<()> {
        let (id, index, tpl) = (spec.id.clone(), spec.index, tpl.to_string());
        self.run(move |j| j.template_disk(&id, index, &tpl)).await
    }

    async fn remove_template_disk(&self, tpl: &str) -> Result<()> {
        let tpl = tpl.to_string();
        self.run(move |j| j.remove_template_disk(&tpl)).await
    }

    async fn template_disks(&self) -> Vec<String> {
        self.run(|j| Ok(j.template_disks()))
            .await
            .unwrap_or_default()
    }

    async fn freeze(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.run(move |j| j.freeze(&id)).await
    }

    async fn hibernate(&self, id: &str) -> Result<u64> {
        let id = id.to_string();
        self.run(move |j| j.hibernate(&id)).await
    }

    async fn wake(&self, spec: &SandboxSpec) -> Result<Option<i32>> {
        let id = spec.id.clone();
        self.run(move |j| j.wake(&id)).await.map(|()| None)
    }

    async fn thaw(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.run(move |j| j.thaw(&id)).await
    }

    async fn is_frozen(&self, id: &str) -> Result<bool> {
        let id = id.to_string();
        self.run(move |j| j.is_frozen(&id)).await
    }

    async fn stop(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.run(move |j| j.stop(&id)).await
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.run(move |j| j.destroy(&id)).await
    }

    async fn set_limits(&self, id: &str, limits: &Limits) -> Result<()> {
        let (id, limits) = (id.to_string(), *limits);
        self.run(move |j| j.set_limits(&id, &limits)).await
    }

    async fn usage(&self, id: &str, disk: bool) -> threadbox_core::driver::Usage {
        let id = id.to_string();
        self.run(move |j| {
            Ok(threadbox_core::driver::Usage {
                memory_bytes: j.memory_current(&id).ok(),
                cpu_usec: j.cpu_usage_usec(&id).ok(),
                oom_kills: j.oom_kills(&id).ok(),
                disk_bytes: disk.then(|| j.disk_usage(&id)),
            })
        })
        .await
        .unwrap_or_default()
    }

    async fn agent_alive(&self, id: &str, pid: i32) -> bool {
        let id = id.to_string();
        self.run(move |j| Ok(j.agent_alive(&id, pid)))
            .await
            .unwrap_or(false)
    }

    async fn egress_netns(
        &self,
        id: &str,
        agent_pid: i32,
    ) -> Result<Option<threadbox_sys::net::NetNs>> {
        let id = id.to_string();
        self.run(move |j| j.egress_netns(&id, agent_pid)).await
    }
}

/// The last 4 KiB of a log file, as text (`None` when it cannot be read or is empty).
pub(crate) fn log_tail(path: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL: u64 = 4096;
    let mut f = std::fs::File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(TAIL))).ok()?;
    let mut buf = Vec::new();
    f.take(TAIL).read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).trim().to_string();
    (!text.is_empty()).then_some(text)
}
