//! Isolation drivers. The `jail` driver (namespaces + seccomp + Landlock + cgroups, our
//! own code in `threadbox-sys`) is the default; stronger tiers (gVisor, microVM) will
//! implement the same [`Driver`] trait.

use crate::error::{CoreError, Result};
use crate::images::ImageSpec;
use crate::Config;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use threadbox_sys::cgroup::{Layout, Limits, SandboxCgroup};
use threadbox_sys::jail::{JailSpec, LaunchReport, ID_RANGE, SANDBOX_USER_ID};

/// First host uid given to sandboxes: far above the ranges distributions hand out in
/// /etc/subuid (100000..) and never 0.
pub const ID_BASE_START: u32 = 1_000_000;
/// RLIMIT_NOFILE (soft = hard) of every sandbox process, or the daemon's hard limit when
/// that is lower. Below the hard limits hosts commonly give a root daemon (20000 on our CI
/// machine kind, 524288 under systemd), so the limit in force is ours, not the host's.
pub const SANDBOX_NOFILE: u64 = 16384;

/// What one sandbox needs from a driver, whatever isolates it.
pub trait Driver: Send + Sync {
    /// Creates the sandbox's persistent disk: an image of `disk_bytes` (0 = a plain
    /// directory without quota).
    fn prepare(&self, id: &str, slot: u32, disk_bytes: u64) -> Result<()>;
    /// Starts the sandbox's agent; returns its host pid.
    fn launch(&self, req: &LaunchRequest) -> Result<i32>;
    fn freeze(&self, id: &str) -> Result<()>;
    fn thaw(&self, id: &str) -> Result<()>;
    fn is_frozen(&self, id: &str) -> Result<bool>;
    /// Ends every process; the disk stays.
    fn stop(&self, id: &str) -> Result<()>;
    /// Removes everything the sandbox left on the host.
    fn destroy(&self, id: &str) -> Result<()>;
    fn socket_path(&self, id: &str) -> PathBuf;
    fn cpu_usage_usec(&self, id: &str) -> Result<u64>;
    /// How many processes of the sandbox the kernel's OOM killer has ended so far
    /// (the cgroup's `oom_kill` counter; `memory.oom_control` on v1).
    fn oom_kills(&self, id: &str) -> Result<u64>;
}

pub struct LaunchRequest<'a> {
    pub id: &'a str,
    pub hostname: &'a str,
    pub slot: u32,
    pub image: &'a ImageSpec,
    pub limits: Limits,
}

pub struct JailDriver {
    config: Config,
    layout: Layout,
    /// One sealed memfd of the agent shared by every boot, remade when the file changes.
    agent_memfd: std::sync::Mutex<Option<std::sync::Arc<AgentMemfd>>>,
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

pub fn id_base(slot: u32) -> u32 {
    ID_BASE_START + slot * ID_RANGE
}

impl JailDriver {
    pub fn new(config: Config) -> Result<JailDriver> {
        let layout = Layout::detect()?;
        tracing::info!(layout = layout.name(), "cgroup layout");
        Ok(JailDriver {
            config,
            layout,
            agent_memfd: std::sync::Mutex::new(None),
        })
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

impl Driver for JailDriver {
    fn prepare(&self, id: &str, slot: u32, disk_bytes: u64) -> Result<()> {
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
        let uid = id_base(slot) + SANDBOX_USER_ID;
        chown(&home, Some(uid), Some(uid))?;
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755))?;
        Ok(())
    }

    fn launch(&self, req: &LaunchRequest) -> Result<i32> {
        let p = self.paths(req.id);
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
        let base = id_base(req.slot);
        let cg = self.cgroup(req.id);
        #[cfg(feature = "insecure-test-hooks")]
        let weaken = threadbox_sys::testhooks::Weaken::from_env().map_err(CoreError::Internal)?;
        #[allow(unused_mut)]
        let mut limits = req.limits;
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
        cg.create(&limits, Some((base, base)))?;
        // Held until the helper has exited, so the fd it opens stays valid.
        let memfd = self.agent_memfd();
        let spec = JailSpec {
            hostname: req.hostname.to_string(),
            id_base: base,
            lower: req.image.lower.clone(),
            upper,
            work,
            disk_image: image.then(|| p.disk_image.clone()),
            home_owner: base + SANDBOX_USER_ID,
            rootfs: p.rootfs.clone(),
            binds: req.image.binds.clone(),
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
            #[cfg(feature = "insecure-test-hooks")]
            test_weaken: weaken.list().to_vec(),
        };
        let input = serde_json::to_vec(&spec).map_err(|e| CoreError::Internal(e.to_string()))?;
        let mut child = std::process::Command::new(&self.config.helper_path)
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
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(&input)?;
        }
        let out = child.wait_with_output()?;
        let line = String::from_utf8_lossy(&out.stdout);
        let report: LaunchReport = serde_json::from_str(line.lines().next().unwrap_or(""))
            .map_err(|_| {
                CoreError::Internal(format!(
                    "jail helper failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            })?;
        match (report.ok, report.agent_pid) {
            (true, Some(pid)) => Ok(pid),
            _ => {
                let _ = self.stop(req.id);
                Err(CoreError::Internal(format!(
                    "sandbox setup failed: {}",
                    report.error.unwrap_or_else(|| "unknown error".into())
                )))
            }
        }
    }

    fn freeze(&self, id: &str) -> Result<()> {
        Ok(self.cgroup(id).freeze(Duration::from_secs(10))?)
    }

    fn thaw(&self, id: &str) -> Result<()> {
        Ok(self.cgroup(id).thaw()?)
    }

    fn is_frozen(&self, id: &str) -> Result<bool> {
        let cg = self.cgroup(id);
        if !cg.exists() {
            return Ok(false);
        }
        Ok(cg.is_frozen()?)
    }

    fn stop(&self, id: &str) -> Result<()> {
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

    fn destroy(&self, id: &str) -> Result<()> {
        self.stop(id)?;
        let p = self.paths(id);
        match std::fs::remove_dir_all(&p.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(CoreError::Internal(format!(
                "remove {}: {e}",
                p.dir.display()
            ))),
        }
    }

    fn socket_path(&self, id: &str) -> PathBuf {
        self.paths(id).run.join("agent.sock")
    }

    fn cpu_usage_usec(&self, id: &str) -> Result<u64> {
        Ok(self.cgroup(id).cpu_usage_usec()?)
    }

    fn oom_kills(&self, id: &str) -> Result<u64> {
        Ok(self.cgroup(id).oom_kills()?)
    }
}
