//! The `gvisor` tier (issue 16, ADR 0120): the same agent over the same protocol, as the
//! init of a gVisor container. The sentry (`runsc`, a user-space kernel) is the boundary:
//! a sandbox's system calls reach the host kernel only through it.
//!
//! It shares the jail's host-side bookkeeping (in this crate): the disk image (ADR 0011),
//! the overlay of the same image layers, the cgroup (around every runsc process of the
//! sandbox) and the paths under `sandboxes/<id>/`. What is its own:
//! - `runsc` is found at `serve --runsc PATH` or on `PATH`, and probed once (`--version`,
//!   then a `runsc do uname -r`, which also gives the sentry's kernel). Without it the
//!   tier stays registered and answers every create with the probe's reason: a create
//!   that names it is refused, never booted on another tier.
//! - `sandboxes/<id>/bundle/config.json` (OCI) and `sandboxes/<id>/run/gvisor/`, bound at
//!   `/run/threadbox` inside, where the agent binds its socket (`--host-uds=create`): the
//!   daemon connects to it from the host.
//! - runsc's state lives in `<root>/gvisor/state`; the container id is the sandbox id.

#[path = "gvisor_control.rs"]
pub(crate) mod control;
#[path = "gvisor_disk.rs"]
mod disk;
#[path = "gvisor_fork.rs"]
mod fork;
#[path = "gvisor_memckpt.rs"]
mod memckpt;
#[path = "gvisor_state.rs"]
pub(crate) mod state;

use crate::{cg_limits, gvisor_memory, mkdir, Jail, JailDriver, SANDBOX_NOFILE};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use threadbox_core::driver::{
    blocking, AgentStream, Driver, HostCheck, Limits, SandboxSpec, TierStatus, Usage,
};
use threadbox_core::error::{CoreError, Result};
use threadbox_core::store::ImageRow;
use threadbox_sys::gvisor::{GvisorLaunch, GvisorReport};
use threadbox_sys::jail::SANDBOX_USER_ID;

/// The tier's name, as `create --tier` takes it.
pub const GVISOR_TIER: &str = "gvisor";

/// Threads runsc itself runs inside the sandbox's cgroup whatever the sandbox does (the Go
/// runtime's threads of the sentry and the gofer), added to the pids limit so the
/// sandbox's own processes get what the API says.
pub const RUNTIME_PIDS: u32 = 256;

/// The host cgroup's pids limit for a sandbox held at `pids` inside the sentry (ADR 0185,
/// 0214). systrap gives every address space a stub process with up to GOMAXPROCS sysmsg
/// threads and a syscall thread (runsc 20240729, `systrap.go`, `maxChildThreads`), so
/// `pids` processes inside can take `pids × (CPUs + 2)` host tasks; the host refusing one
/// kills the sentry, which a fork bomb held at the limit inside must not reach.
fn host_pids(pids: u32) -> u32 {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    pids.saturating_mul(cpus.saturating_add(2))
        .saturating_add(RUNTIME_PIDS)
}

/// The sandbox's pids limit inside the sentry (gVisor's own pids cgroup, ADR 0185): what
/// the API says, so a fork bomb ends with EAGAIN in the sentry, below the host cgroup,
/// whose limit the sentry itself would not survive.
fn sentry_pids(limits: &Limits) -> u32 {
    crate::gvisor_weaken::limits(cg_limits(limits)).pids
}

/// The sandbox's memory limit inside the sentry, which the agent's watchdog enforces
/// (ADR 0205): what the API says (lifted by the `no-memory-limit` weakening).
fn sentry_memory(limits: &Limits) -> u64 {
    crate::gvisor_weaken::limits(cg_limits(limits)).memory_bytes
}

/// Longest the probe, a launch or a runsc command may take (the kvm platform hangs on
/// this host's PVM: a hang must not hold the daemon).
pub(crate) const RUNSC_DEADLINE: Duration = Duration::from_secs(60);

/// Longest a halt waits for a runsc command of the container that holds runsc's lock on
/// its state before it leaves the state to `runsc delete` (which waits on the same lock).
const STATE_LOCK_WAIT: Duration = Duration::from_secs(5);

/// Where the agent's socket directory is bound inside the sandbox.
const SOCKET_DIR_INSIDE: &str = "/run/threadbox";
/// Where the agent binary is bound inside (read-only).
const AGENT_INSIDE: &str = "/.threadbox/agent";

/// What the tier knows of its runsc after the probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunscInfo {
    pub path: PathBuf,
    /// `runsc --version`'s first line.
    pub version: String,
    /// `uname -r` inside the sentry (gVisor reports a Linux version of its own).
    pub kernel: String,
}

/// The tier of one daemon.
#[derive(Clone)]
pub struct GvisorDriver(pub(crate) Arc<Gvisor>);

pub(crate) struct Gvisor {
    jail: JailDriver,
    /// `serve --runsc PATH`; `None`: the first `runsc` on `PATH`.
    runsc: Option<PathBuf>,
    probe: OnceLock<std::result::Result<RunscInfo, String>>,
}

impl GvisorDriver {
    /// The tier over the same root as `jail` (whose uid range, cgroup layout and disk
    /// images it shares). Nothing is probed until the tier is first used.
    pub fn new(jail: JailDriver, runsc: Option<PathBuf>) -> GvisorDriver {
        GvisorDriver(Arc::new(Gvisor {
            jail,
            runsc,
            probe: OnceLock::new(),
        }))
    }

    /// The probe's result (run once, then cached): runsc's version and kernel, or why
    /// the tier cannot run here.
    pub async fn availability(&self) -> std::result::Result<RunscInfo, String> {
        let g = self.0.clone();
        blocking(move || Ok(g.probe().clone()))
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
    }

    pub(crate) async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Gvisor) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let g = self.0.clone();
        blocking(move || f(&g)).await
    }
}

/// Finds `name` on `PATH`.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs `cmd` to its end within `deadline` (killed past it); its stdout, or why not.
pub(crate) fn run_bounded(
    mut cmd: std::process::Command,
    deadline: Duration,
) -> std::result::Result<String, String> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run it: {e}"))?;
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(deadline) {
        Ok(out) => out.map_err(|e| e.to_string())?,
        Err(_) => {
            let _ = threadbox_sys::child::kill(pid, libc::SIGKILL);
            let _ = rx.recv();
            return Err(format!("did not finish within {}s", deadline.as_secs()));
        }
    };
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!(
            "{}: {}",
            out.status,
            err.trim().lines().last().unwrap_or("no output")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Gvisor {
    pub(crate) fn j(&self) -> &Jail {
        self.jail.jail()
    }

    pub(crate) fn state_dir(&self) -> PathBuf {
        self.j().config.root.join("gvisor").join("state")
    }

    fn bundle(&self, id: &str) -> PathBuf {
        self.j().paths(id).dir.join("bundle")
    }

    fn socket_dir(&self, id: &str) -> PathBuf {
        self.j().paths(id).run.join("gvisor")
    }

    pub(crate) fn socket(&self, id: &str) -> PathBuf {
        self.socket_dir(id).join("agent.sock")
    }

    fn probe(&self) -> &std::result::Result<RunscInfo, String> {
        self.probe.get_or_init(|| {
            let r = self.probe_now();
            match &r {
                Ok(i) => tracing::info!(runsc = %i.path.display(), version = %i.version, kernel = %i.kernel, "gvisor tier available"),
                Err(e) => tracing::warn!("gvisor tier unavailable: {e}"),
            }
            r
        })
    }

    fn probe_now(&self) -> std::result::Result<RunscInfo, String> {
        let path = match &self.runsc {
            Some(p) if p.is_file() => p.clone(),
            Some(p) => {
                return Err(format!(
                    "runsc not found at {} (serve --runsc)",
                    p.display()
                ))
            }
            None => on_path("runsc").ok_or_else(|| {
                "runsc not found on PATH (install gVisor's runsc or pass serve --runsc PATH; \
                 see the README)"
                    .to_string()
            })?,
        };
        let mut v = std::process::Command::new(&path);
        v.arg("--version");
        let version = run_bounded(v, RUNSC_DEADLINE)
            .map_err(|e| format!("{} --version failed: {e}", path.display()))?;
        let version = version.lines().next().unwrap_or("").trim().to_string();
        if !version.starts_with("runsc version") {
            return Err(format!(
                "{} --version answered {version:?}: not gVisor's runsc",
                path.display()
            ));
        }
        // A tiny sandbox of the host's own root: the sentry boots and runs a process.
        let dir = self.j().config.root.join("gvisor").join("probe");
        let _ = std::fs::remove_dir_all(&dir);
        mkdir(&dir).map_err(|e| e.to_string())?;
        let mut d = std::process::Command::new(&path);
        d.arg("--root")
            .arg(&dir)
            .args(["--platform=systrap", "--network=none", "--ignore-cgroups"])
            .args(["do", "/bin/uname", "-r"]);
        let kernel = run_bounded(d, RUNSC_DEADLINE);
        let _ = std::fs::remove_dir_all(&dir);
        let kernel = kernel.map_err(|e| format!("runsc cannot run a sandbox here: {e}"))?;
        Ok(RunscInfo {
            path,
            version,
            kernel: kernel.trim().to_string(),
        })
    }

    pub(crate) fn runsc(&self) -> Result<RunscInfo> {
        self.probe()
            .clone()
            .map_err(|e| CoreError::Unavailable(format!("the gvisor tier is unavailable: {e}")))
    }

    /// runsc's global flags for this daemon's sandboxes.
    pub(crate) fn global_args(&self) -> Vec<String> {
        let mut args = self.global_args_without_debug();
        // For an operator chasing a runsc failure: runsc's own debug logs, one file per
        // command, in this directory (large; never on by default).
        if let Some(dir) = std::env::var_os("THREADBOX_RUNSC_DEBUG_LOG") {
            args.push("--debug".into());
            args.push(format!("--debug-log={}/", dir.to_string_lossy()));
            if std::env::var_os("THREADBOX_RUNSC_STRACE").is_some() {
                args.push("--strace".into());
            }
        }
        args
    }

    fn global_args_without_debug(&self) -> Vec<String> {
        vec![
            "--root".into(),
            self.state_dir().display().to_string(),
            // ptrace is slower, kvm hangs under this host's nested hypervisor.
            "--platform=systrap".into(),
            // The agent binds its listener on a host directory; nothing inside may
            // connect out to a host socket.
            "--host-uds=create".into(),
            // Our cgroup is around runsc (the helper joins it): runsc makes none.
            "--ignore-cgroups".into(),
            // The root is our own overlay on the sandbox's disk (persistent, per
            // sandbox); runsc adds no overlay of its own over it.
            "--overlay2=none".into(),
        ]
    }

    pub(crate) fn runsc_cmd(&self, info: &RunscInfo, args: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new(&info.path);
        c.args(self.global_args()).args(args);
        c
    }

    fn prepare(&self, spec: &SandboxSpec) -> Result<()> {
        self.runsc()?;
        self.j().prepare(&spec.id, spec.index, spec.disk_bytes)?;
        let p = self.j().paths(&spec.id);
        // The jail's home belongs to the slot's mapped uid; gVisor maps none.
        let home = p.upper.join("home/user");
        if home.is_dir() {
            std::os::unix::fs::chown(&home, Some(SANDBOX_USER_ID), Some(SANDBOX_USER_ID))?;
        }
        Ok(())
    }

    fn config_json(
        &self,
        spec: &SandboxSpec,
        layers: &threadbox_core::images::ImageSpec,
        egress: bool,
    ) -> serde_json::Value {
        use serde_json::json;
        let p = self.j().paths(&spec.id);
        let memory = sentry_memory(&spec.limits);
        let caps = [
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_DAC_READ_SEARCH",
            "CAP_FOWNER",
            "CAP_FSETID",
            "CAP_KILL",
            "CAP_SETGID",
            "CAP_SETUID",
            "CAP_SETPCAP",
            "CAP_NET_BIND_SERVICE",
            "CAP_SYS_CHROOT",
            "CAP_AUDIT_WRITE",
            // For the agent alone, which makes the sentry's /proc/sys read-only with it
            // and then drops it (`threadbox_sys::gvisor::harden_proc_inside`, ADR 0191);
            // its children never had it (their policy drops every capability).
            "CAP_SYS_ADMIN",
        ];
        let mut mounts = vec![
            json!({"destination": "/proc", "type": "proc", "source": "proc"}),
            // runsc's default /sys is the sentry's sysfs, read-write; the jail's sandboxes
            // have an empty /sys: so do these, read-only (ADR 0191).
            json!({"destination": "/sys", "type": "tmpfs", "source": "tmpfs",
                   "options": ["ro", "nosuid", "nodev", "noexec", "size=0", "mode=555"]}),
            // Sized below the memory limit (tmpfs is sentry memory, which the watchdog
            // cannot free by a kill): full, both still leave a quarter of it (ADR 0205).
            json!({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "mode=1777",
                               format!("size={}", gvisor_memory::tmp_bytes(memory))]}),
            json!({"destination": "/dev/shm", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "mode=1777",
                               format!("size={}", gvisor_memory::shm_bytes(memory))]}),
            json!({"destination": SOCKET_DIR_INSIDE, "type": "bind",
                   "source": self.socket_dir(&spec.id), "options": ["rbind", "rw", "nosuid", "nodev", "noexec"]}),
            json!({"destination": AGENT_INSIDE, "type": "bind",
                   "source": self.j().config.agent_path, "options": ["bind", "ro", "nosuid", "nodev"]}),
            // gVisor's own cgroupfs, with the container in a cgroup of its own: the agent
            // sets its pids limit there (ADR 0185). Nothing of the host's cgroups is in it.
            json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                   "options": ["nosuid", "nodev", "noexec"]}),
        ];
        let run = self.j().paths(&spec.id).run;
        mounts.extend(crate::gvisor_net::ca_mount(
            &layers.lower,
            spec.trust_ca.as_deref(),
            &run,
        ));
        for b in &layers.binds {
            mounts.push(
                json!({"destination": b.target, "type": "bind", "source": b.source,
                               "options": ["rbind", "ro", "nosuid", "nodev"]}),
            );
        }
        mounts.extend(crate::gvisor_weaken::mounts());
        let mut agent_args: Vec<String> = vec![
            AGENT_INSIDE.into(),
            "--listen".into(),
            format!("unix:{SOCKET_DIR_INSIDE}/agent.sock"),
            // gVisor has no Landlock; the sentry is this tier's boundary.
            "--allow-no-landlock".into(),
            "--tier".into(),
            "gvisor".into(),
            "--pids-max".into(),
            sentry_pids(&spec.limits).to_string(),
            // gVisor has no OOM killer: the agent's watchdog is it (ADR 0205).
            "--memory-max".into(),
            memory.to_string(),
        ];
        agent_args.extend(crate::gvisor_weaken::agent_args());
        let nofile = crate::gvisor_weaken::nofile_limit(SANDBOX_NOFILE);
        json!({
            "ociVersion": "1.0.2",
            "process": {
                "user": {"uid": 0, "gid": 0},
                "args": agent_args,
                "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "cwd": "/",
                "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
                "rlimits": [{"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}],
                "noNewPrivileges": false
            },
            "root": {"path": p.rootfs, "readonly": false},
            "hostname": spec.hostname,
            "mounts": mounts,
            "linux": {"namespaces": crate::gvisor_net::namespaces(egress)}
        })
    }

    fn launch(&self, spec: &SandboxSpec) -> Result<i32> {
        // A fresh boot: whatever a hibernate left is of the processes a stop ended.
        self.remove_memory_image(&spec.id);
        self.launch_as(spec, None)
    }

    /// Boots `spec`'s container on its disk: `runsc run`, or `runsc restore` of the memory
    /// image `restore` (`gvisor_ckpt.rs`). Returns the sentry's host pid.
    pub(crate) fn launch_as(&self, spec: &SandboxSpec, restore: Option<&Path>) -> Result<i32> {
        let info = self.runsc()?;
        let j = self.j();
        let p = j.paths(&spec.id);
        let image = p.disk_image.is_file();
        if !image && !p.upper.is_dir() {
            return Err(CoreError::Conflict(format!(
                "the disk of sandbox {} is missing on the host; it cannot be started",
                spec.id
            )));
        }
        // A previous boot's container (a crash, a stop that did not finish) goes first.
        self.remove_container(&info, &spec.id);
        let layers = j.image_spec(&spec.image)?;
        let (upper, work) = if image {
            mkdir(&p.disk_mount)?;
            (p.disk_mount.join("upper"), p.disk_mount.join("work"))
        } else {
            (p.upper.clone(), p.work.clone())
        };
        mkdir(&p.run)?;
        let sock_dir = self.socket_dir(&spec.id);
        let _ = std::fs::remove_dir_all(&sock_dir);
        mkdir(&sock_dir)?;
        use std::os::unix::fs::PermissionsExt;
        // Only root inside may reach the agent's socket.
        std::fs::set_permissions(&sock_dir, std::fs::Permissions::from_mode(0o700))?;
        let bundle = self.bundle(&spec.id);
        mkdir(&bundle)?;
        let (egress, host_net) = crate::gvisor_net::boot_network(spec)?;
        j.forget_netns(&spec.id)?;
        let config = self.config_json(spec, &layers, host_net);
        std::fs::write(
            bundle.join("config.json"),
            serde_json::to_vec_pretty(&config).map_err(|e| CoreError::Internal(e.to_string()))?,
        )?;
        mkdir(&self.state_dir())?;
        let mut limits = crate::gvisor_weaken::limits(cg_limits(&spec.limits));
        limits.pids = host_pids(limits.pids);
        // Room for runsc itself and the watchdog's reaction on top of the sandbox's limit.
        limits.memory_bytes = gvisor_memory::host_memory(limits.memory_bytes);
        let cg = j.cgroup(&spec.id);
        cg.create(&limits, None)?;
        // runsc makes no cgroups under ours (--ignore-cgroups): bound the subtree as the
        // jail does, so nothing can (security case I6).
        if crate::gvisor_weaken::tree_limit() {
            cg.limit_tree(crate::CGROUP_MAX_DESCENDANTS, crate::CGROUP_MAX_DEPTH)?;
        }
        let mut args = self.global_args();
        // A global flag: before the subcommand (run, or restore of a hibernated image).
        // `host-userns` (a test weakening): runsc keeps the sentry in the host's user
        // namespace on its host network, here a fresh netns of its own (the spec's).
        let runsc_host_net = host_net || crate::gvisor_weaken::sentry_in_host_userns();
        args.push(crate::gvisor_net::network_flag(runsc_host_net).into());
        if let Some(image) = restore {
            args.extend([
                "restore".into(),
                "-image-path".into(),
                image.display().to_string(),
            ]);
        } else {
            args.push("run".into());
        }
        args.extend([
            "-detach".into(),
            "-bundle".into(),
            bundle.display().to_string(),
            spec.id.clone(),
        ]);
        let launch = GvisorLaunch {
            disk_image: image.then(|| p.disk_image.clone()),
            disk_mount: p.disk_mount.clone(),
            lower: layers.lower.clone(),
            upper,
            work,
            rootfs: p.rootfs.clone(),
            home_owner: SANDBOX_USER_ID,
            cgroup_procs: cg.procs_files(),
            runsc: info.path.clone(),
            args,
            log: p.run.join("agent.log"),
            egress,
        };
        let input = serde_json::to_vec(&launch).map_err(|e| CoreError::Internal(e.to_string()))?;
        // A restore runs under the image's lock (`gvisor_ckpt.rs`): a daemon restarted
        // meanwhile waits for it to finish before it judges the image.
        let mut cmd = match restore {
            Some(image) => {
                let mut c = crate::gvisor_ckpt::under_lock(image)?;
                c.arg(&j.config.helper_path);
                c
            }
            None => std::process::Command::new(&j.config.helper_path),
        };
        let child = cmd
            .arg("__gvisor-launch")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env_clear()
            .spawn()
            .map_err(|e| CoreError::Internal(format!("start the gvisor helper: {e}")))?;
        let out = match crate::run_helper(child, &input, RUNSC_DEADLINE) {
            Ok(out) => out,
            Err(e) => {
                let _ = self.halt(&spec.id);
                return Err(e);
            }
        };
        let line = String::from_utf8_lossy(&out.stdout);
        let report: Option<GvisorReport> =
            serde_json::from_str(line.lines().next().unwrap_or("")).ok();
        match report {
            Some(GvisorReport { ok: true, .. }) => {}
            other => {
                let _ = self.halt(&spec.id);
                return Err(CoreError::Internal(format!(
                    "gvisor sandbox setup failed: {}",
                    other
                        .and_then(|r| r.error)
                        .unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_string())
                )));
            }
        }
        // The sentry lives in the helper's netns: its identity is the sandbox's.
        let pid = self.sentry_pid(&info, &spec.id).and_then(|pid| {
            if egress.is_some() {
                j.record_netns(&spec.id, pid)?;
            }
            Ok(pid)
        });
        match pid {
            Ok(pid) => Ok(pid),
            Err(e) => {
                let _ = self.halt(&spec.id);
                Err(e)
            }
        }
    }

    /// Sets a limit inside a running sentry: `runsc exec` of the agent with `flag`
    /// (`--set-pids-max`, or `--set-memory-max` for the memory its watchdog enforces) and
    /// `value`; `what` names the limit in the error. A sandbox with no container takes
    /// the limit from its next boot's `config.json`.
    fn set_sentry_limit(&self, id: &str, flag: &str, value: u64, what: &str) -> Result<()> {
        let info = self.runsc()?;
        if self.sentry_pid(&info, id).is_err() {
            return Ok(());
        }
        let n = value.to_string();
        let cmd = self.runsc_cmd(&info, &["exec", id, AGENT_INSIDE, flag, &n]);
        run_bounded(cmd, RUNSC_DEADLINE)
            .map(drop)
            .map_err(|e| CoreError::Internal(format!("set the {what} limit inside {id}: {e}")))
    }

    /// The sentry's host pid (`runsc state`): what the manager records as the agent's
    /// pid, alive exactly while the sandbox is.
    pub(crate) fn sentry_pid(&self, info: &RunscInfo, id: &str) -> Result<i32> {
        // runsc saved it before `run`/`restore -detach` returned: read, it spares every
        // boot, wake and fork a runsc run (~20 ms, ADR 0217). `runsc state` only when the
        // file does not read.
        if let Some(pid) = state::ContainerState::new(&self.state_dir(), id).sandbox_pid() {
            return Ok(pid);
        }
        let out = run_bounded(self.runsc_cmd(info, &["state", id]), RUNSC_DEADLINE)
            .map_err(|e| CoreError::Internal(format!("runsc state {id}: {e}")))?;
        let v: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| CoreError::Internal(format!("runsc state {id}: {e}")))?;
        v["pid"]
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| CoreError::Internal(format!("runsc state {id}: no pid in {out}")))
    }

    /// Removes runsc's state of container `id` (best effort: a container that never
    /// existed is fine): by itself when the container's processes have exited and that is
    /// all `runsc delete` would do (`gvisor_state.rs`, ADR 0212), else `runsc delete
    /// --force`. Returns which, for the halt's debug line.
    pub(crate) fn remove_container(&self, info: &RunscInfo, id: &str) -> &'static str {
        // With no file of the container there is nothing to delete, and a runsc run (tens
        // of ms, more on a loaded host) is saved on every wake and boot.
        let st = state::ContainerState::new(&self.state_dir(), id);
        if !st.exists() {
            return "none";
        }
        match st.remove_exited(STATE_LOCK_WAIT) {
            Ok(()) => "removed",
            Err(e) => {
                tracing::debug!(sandbox = %id, "runsc delete, not removing its state: {e}");
                let _ = run_bounded(
                    self.runsc_cmd(info, &["delete", "-force", id]),
                    RUNSC_DEADLINE,
                );
                "runsc delete"
            }
        }
    }

    fn stop(&self, id: &str) -> Result<()> {
        // The processes end here: a memory image of them would be restored into a disk
        // that has moved on.
        self.remove_memory_image(id);
        self.halt(id)
    }

    /// Ends every process of the sandbox; a memory image stays.
    pub(crate) fn halt(&self, id: &str) -> Result<()> {
        let t0 = std::time::Instant::now();
        // Our cgroup is around every runsc process of the sandbox: emptied first, it
        // leaves runsc's state naming processes that have exited, which we remove without
        // runsc's wait for their reaping (ADR 0212). Its error is returned after runsc
        // was asked to end what is left.
        let killed = self.j().stop(id);
        let t1 = std::time::Instant::now();
        let how = match self.probe().clone() {
            Ok(info) => self.remove_container(&info, id),
            Err(_) => "no runsc",
        };
        let _ = std::fs::remove_file(self.socket(id));
        // Where a hibernate's teardown goes (ADR 0130's open question, ADR 0212).
        tracing::debug!(sandbox = %id, runsc_delete_ms = t1.elapsed().as_millis() as u64,
            cgroup_ms = (t1 - t0).as_millis() as u64, runsc_state = how, "halted");
        killed
    }

    fn destroy(&self, id: &str) -> Result<()> {
        self.stop(id)?;
        self.j().destroy(id)
    }
}

/// Connects to the agent's socket, waiting for an agent that has not bound it yet (runsc
/// returns once the container's init runs, before the agent listens).
///
/// A socket that exists but refuses for a while is an agent that closed its listener for
/// a checkpoint (ADR 0130) and was not told to bind again (a daemon that died in between):
/// `rebind` is called once.
async fn connect_waiting<F: std::future::Future<Output = Result<()>>>(
    path: &Path,
    rebind: impl FnOnce() -> F,
) -> Result<AgentStream> {
    let started = tokio::time::Instant::now();
    let deadline = started + RUNSC_DEADLINE;
    let mut rebind = Some(rebind);
    loop {
        match tokio::net::UnixStream::connect(path).await {
            Ok(s) => return Ok(Box::new(s)),
            Err(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused
                    && started.elapsed() > Duration::from_millis(200)
                    && rebind.is_some() =>
            {
                if let Some(f) = rebind.take() {
                    if let Err(e) = f().await {
                        tracing::debug!("asking the agent to bind again: {e}");
                    }
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => {
                return Err(CoreError::Unavailable(format!(
                    "connection to the sandbox agent failed: {e}"
                )))
            }
        }
    }
}

#[async_trait::async_trait]
impl Driver for GvisorDriver {
    fn tier(&self) -> &'static str {
        GVISOR_TIER
    }

    fn isolation_warnings(&self) -> Vec<String> {
        vec![
            "landlock: not applied inside gVisor (no Landlock in the sentry; the sentry is this tier's boundary)"
                .into(),
        ]
    }

    fn capabilities(&self) -> Vec<&'static str> {
        // Egress: a sandbox created with a policy boots in a netns of ours (ADR 0140).
        // Call cgroups: in the sentry's own pids hierarchy (ADR 0214). Not yet: Landlock
        // (none in the sentry).
        use threadbox_core::driver::capability::*;
        vec![
            CALL_CGROUPS,
            CHECKPOINTS,
            CHECKPOINT_MEMORY,
            EGRESS,
            HIBERNATE,
            HIBERNATE_IMAGE,
            FORK_MEMORY,
        ]
    }

    async fn hibernate(&self, id: &str) -> Result<u64> {
        let id = id.to_string();
        // Nothing of it is left in RAM: its cgroup is gone with its processes.
        self.run(move |g| g.hibernate(&id).map(|_| 0)).await
    }

    async fn wake(&self, spec: &SandboxSpec) -> Result<Option<i32>> {
        let spec = spec.clone();
        self.run(move |g| g.wake(&spec)).await
    }

    async fn recover_hibernated(&self, id: &str) -> bool {
        let id = id.to_string();
        self.run(move |g| Ok(g.recover_hibernated(&id)))
            .await
            .unwrap_or(false)
    }

    async fn status(&self) -> TierStatus {
        match self.availability().await {
            Ok(i) => TierStatus {
                unavailable: None,
                kernel: Some(i.kernel),
                version: Some(i.version),
            },
            Err(e) => TierStatus {
                unavailable: Some(e),
                ..TierStatus::default()
            },
        }
    }

    async fn resolve_image(&self, image: &ImageRow) -> Result<()> {
        let image = image.clone();
        self.run(move |g| {
            g.runsc()?;
            g.j().image_spec(&image).map(drop)
        })
        .await
    }

    async fn has_disk(&self, id: &str) -> bool {
        self.0.jail.has_disk(id).await
    }

    async fn prepare(&self, spec: &SandboxSpec) -> Result<()> {
        let spec = spec.clone();
        self.run(move |g| g.prepare(&spec)).await
    }

    async fn launch(&self, spec: &SandboxSpec) -> Result<i32> {
        let spec = spec.clone();
        self.run(move |g| g.launch(&spec)).await
    }

    async fn connect(&self, id: &str) -> Result<AgentStream> {
        connect_waiting(&self.0.socket(id), || self.rebind(id)).await
    }

    async fn freeze(&self, id: &str) -> Result<()> {
        self.0.jail.freeze(id).await
    }

    async fn thaw(&self, id: &str) -> Result<()> {
        self.0.jail.thaw(id).await
    }

    async fn is_frozen(&self, id: &str) -> Result<bool> {
        self.0.jail.is_frozen(id).await
    }

    async fn stop(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.run(move |g| g.stop(&id)).await
    }

    async fn destroy(&self, id: &str) -> Result<()> {
        let id = id.to_string();
        self.run(move |g| g.destroy(&id)).await
    }

    async fn set_limits(&self, id: &str, limits: &Limits) -> Result<()> {
        let mut l = *limits;
        l.pids = host_pids(l.pids);
        let memory = sentry_memory(limits);
        l.memory_bytes = gvisor_memory::host_memory(memory);
        let (id2, pids) = (id.to_string(), sentry_pids(limits));
        // The sentry's own limits first, so the host's never falls below them (ADR 0185,
        // 0205). A raise lets the watchdog allow the new limit for the moment before the
        // host's follows: the one order in which a lowering cannot kill the sentry.
        self.run(move |g| {
            g.set_sentry_limit(&id2, "--set-pids-max", u64::from(pids), "pids")?;
            g.set_sentry_limit(&id2, "--set-memory-max", memory, "memory")
        })
        .await?;
        self.0.jail.set_limits(id, &l).await
    }

    async fn usage(&self, id: &str, disk: bool) -> Usage {
        let mut u = self.0.jail.usage(id, disk).await;
        // The agent's watchdog kills count as the OOM kills they are (ADR 0205): a call
        // whose process died of one is reported `oom_killed`, as on the jail.
        let dir = self.0.socket_dir(id);
        let kills = blocking(move || Ok(gvisor_memory::watchdog_kills(&dir)))
            .await
            .ok()
            .flatten();
        if let Some(k) = kills {
            u.oom_kills = u.oom_kills.map(|h| h.saturating_add(k));
        }
        u
    }

    async fn agent_alive(&self, id: &str, pid: i32) -> bool {
        self.0.jail.agent_alive(id, pid).await
    }

    async fn agent_log_tail(&self, id: &str) -> Option<String> {
        let id = id.to_string();
        self.run(move |g| Ok(crate::log_tail(&g.j().paths(&id).run.join("agent.log"))))
            .await
            .ok()
            .flatten()
    }

    // Disk checkpoints, fork and templates (ADR 0135): `disk.rs`.

    async fn sync_disk(&self, id: &str, agent_pid: Option<i32>) -> Result<()> {
        let id = id.to_string();
        self.run(move |g| g.sync_disk(&id, agent_pid)).await
    }

    async fn checkpoint_disk(
        &self,
        id: &str,
        ckpt: &str,
        agent_pid: Option<i32>,
    ) -> Result<threadbox_core::driver::DiskClone> {
        let (id, ckpt) = (id.to_string(), ckpt.to_string());
        self.run(move |g| g.checkpoint_disk(&id, &ckpt, agent_pid))
            .await
    }

    async fn restore_disk(&self, id: &str, ckpt: &str) -> Result<()> {
        self.0.jail.restore_disk(id, ckpt).await
    }

    async fn fork_disk(&self, spec: &SandboxSpec, from: &str, _: u32, ckpt: &str) -> Result<()> {
        let (id, from, ckpt) = (spec.id.clone(), from.to_string(), ckpt.to_string());
        self.run(move |g| g.fork_disk(&id, &from, &ckpt)).await
    }

    async fn remove_checkpoint_disk(&self, id: &str, ckpt: &str) -> Result<()> {
        // Its memory image first (ADR 0195): a crash between leaves a clone without an
        // image, which is a disk-only checkpoint, never an image without its disk.
        let (id2, ckpt2) = (id.to_string(), ckpt.to_string());
        self.run(move |g| g.remove_memory_checkpoint(&id2, &ckpt2))
            .await?;
        self.0.jail.remove_checkpoint_disk(id, ckpt).await
    }

    async fn checkpoint_disks(&self, id: &str) -> Vec<String> {
        // Called at a start only (reconciliation): no fork or checkpoint is being made.
        let g = self.0.clone();
        let id2 = id.to_string();
        let _ = blocking(move || {
            g.remove_fork_leftovers(&id2);
            Ok(())
        })
        .await;
        let disks = self.0.jail.checkpoint_disks(id).await;
        let (g, id2, d) = (self.0.clone(), id.to_string(), disks.clone());
        let _ = blocking(move || {
            g.remove_memory_orphans(&id2, &d);
            Ok(())
        })
        .await;
        disks
    }

    // Checkpoints with memory (ADR 0195): `memckpt.rs`.

    async fn checkpoint_with_memory(
        &self,
        spec: &SandboxSpec,
        ckpt: &str,
    ) -> Result<threadbox_core::driver::MemorySaved> {
        let (spec, ckpt) = (spec.clone(), ckpt.to_string());
        self.run(move |g| g.checkpoint_with_memory(&spec, &ckpt))
            .await
    }

    async fn boot_memory_checkpoint(&self, spec: &SandboxSpec, ckpt: &str) -> Result<i32> {
        let (spec, ckpt) = (spec.clone(), ckpt.to_string());
        self.run(move |g| g.boot_memory_checkpoint(&spec, &ckpt))
            .await
    }

    async fn memory_checkpoints(&self, id: &str) -> Vec<String> {
        let id = id.to_string();
        self.run(move |g| Ok(g.memory_checkpoints(&id)))
            .await
            .unwrap_or_default()
    }

    async fn current_agent_pid(&self, id: &str) -> Option<i32> {
        let id = id.to_string();
        self.run(move |g| Ok(g.current_sentry(&id)))
            .await
            .ok()
            .flatten()
    }

    // Fork with memory (ADR 0136): `fork.rs`.

    async fn fork_memory_refusal(&self, id: &str) -> Option<String> {
        self.0.fork_memory_refusal(id)
    }

    async fn fork_checkpoint(&self, spec: &SandboxSpec, ckpt: &str) -> Result<i32> {
        let (spec, ckpt) = (spec.clone(), ckpt.to_string());
        self.run(move |g| g.fork_checkpoint(&spec, &ckpt)).await
    }

    async fn launch_fork(&self, spec: &SandboxSpec, from: &str, ckpt: &str) -> Result<i32> {
        let (spec, from, ckpt) = (spec.clone(), from.to_string(), ckpt.to_string());
        self.run(move |g| g.launch_fork(&spec, &from, &ckpt)).await
    }

    async fn remove_fork_image(&self, id: &str, ckpt: &str) -> Result<()> {
        let (id, ckpt) = (id.to_string(), ckpt.to_string());
        self.run(move |g| g.remove_fork_image(&id, &ckpt)).await
    }

    async fn save_template_disk(
        &self,
        from: &str,
        _: u32,
        ckpt: &str,
        tpl: &str,
    ) -> Result<threadbox_core::driver::DiskClone> {
        let (from, ckpt, tpl) = (from.to_string(), ckpt.to_string(), tpl.to_string());
        self.run(move |g| g.save_template_disk(&from, &ckpt, &tpl))
            .await
    }

    async fn template_disk(&self, spec: &SandboxSpec, tpl: &str) -> Result<()> {
        let (id, tpl) = (spec.id.clone(), tpl.to_string());
        self.run(move |g| g.template_disk(&id, &tpl)).await
    }

    async fn remove_template_disk(&self, tpl: &str) -> Result<()> {
        self.0.jail.remove_template_disk(tpl).await
    }

    async fn template_disks(&self) -> Vec<String> {
        self.0.jail.template_disks().await
    }

    async fn egress_netns(
        &self,
        id: &str,
        agent_pid: i32,
    ) -> Result<Option<threadbox_sys::net::NetNs>> {
        // The recorded pid is the sentry's, which runs in the sandbox's netns.
        self.0.jail.egress_netns(id, agent_pid).await
    }

    async fn host_posture(&self, id: &str, agent_pid: Option<i32>) -> Vec<HostCheck> {
        crate::gvisor_posture::sentry_checks(id, agent_pid)
    }
}
