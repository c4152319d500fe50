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

/// What one sandbox needs from a driver, whatever isolates it.
pub trait Driver: Send + Sync {
    /// Creates the sandbox's persistent disk.
    fn prepare(&self, id: &str, slot: u32) -> Result<()>;
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
}

/// Where a sandbox keeps its things on the host.
pub struct SandboxPaths {
    pub dir: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub rootfs: PathBuf,
    pub run: PathBuf,
}

pub fn id_base(slot: u32) -> u32 {
    ID_BASE_START + slot * ID_RANGE
}

impl JailDriver {
    pub fn new(config: Config) -> Result<JailDriver> {
        let layout = Layout::detect()?;
        tracing::info!(layout = layout.name(), "cgroup layout");
        Ok(JailDriver { config, layout })
    }

    pub fn paths(&self, id: &str) -> SandboxPaths {
        let dir = self.config.root.join("sandboxes").join(id);
        SandboxPaths {
            upper: dir.join("upper"),
            work: dir.join("work"),
            rootfs: dir.join("rootfs"),
            run: dir.join("run"),
            dir,
        }
    }

    pub fn cgroup(&self, id: &str) -> SandboxCgroup {
        SandboxCgroup::new(self.layout.clone(), &self.config.cgroup_parent, id)
    }

    pub fn disk_exists(&self, id: &str) -> bool {
        self.paths(id).upper.is_dir()
    }
}

fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir_all(p)
        .map_err(|e| CoreError::Internal(format!("mkdir {}: {e}", p.display())))
}

impl Driver for JailDriver {
    fn prepare(&self, id: &str, slot: u32) -> Result<()> {
        let p = self.paths(id);
        for d in [&p.dir, &p.upper, &p.work, &p.rootfs, &p.run] {
            mkdir(d)?;
        }
        use std::os::unix::fs::{chown, PermissionsExt};
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
        if !p.upper.is_dir() {
            return Err(CoreError::Conflict(format!(
                "the disk of sandbox {} is missing on the host; it cannot be started",
                req.id
            )));
        }
        mkdir(&p.run)?;
        // A previous agent's overlay workdir may hold leftovers overlayfs refuses to reuse.
        let _ = std::fs::remove_dir_all(&p.work);
        mkdir(&p.work)?;
        mkdir(&p.rootfs)?;
        let base = id_base(req.slot);
        let cg = self.cgroup(req.id);
        cg.create(&req.limits, Some((base, base)))?;
        let spec = JailSpec {
            hostname: req.hostname.to_string(),
            id_base: base,
            lower: req.image.lower.clone(),
            upper: p.upper.clone(),
            work: p.work.clone(),
            rootfs: p.rootfs.clone(),
            binds: req.image.binds.clone(),
            agent_path: self.config.agent_path.clone(),
            socket_path: p.run.join("agent.sock"),
            cgroup_procs: cg.procs_files(),
            cgroup_dir: Some(cg.v2_dir()),
            tmpfs_bytes: req.limits.memory_bytes,
            nofile: 65536,
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
}
