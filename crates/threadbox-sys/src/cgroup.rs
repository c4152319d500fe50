//! Sandbox cgroups on cgroup v2 and on v1/v2 hybrid hosts.
//!
//! Limits go where the controllers are: on a pure v2 host everything is in one directory;
//! on a hybrid host memory/pids/cpu limits are set in the v1 hierarchies while freezing,
//! killing and CPU accounting use the v2 (unified) directory, whose core files
//! (`cgroup.freeze`, `cgroup.kill`, `cpu.stat`) work without any controller attached.

use crate::{Result, SysError};
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How cgroups are mounted on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Pure cgroup v2 at `root`.
    V2 { root: PathBuf },
    /// v1 controllers under `v1_root/<controller>`, cgroup2 at `unified`.
    Hybrid { v1_root: PathBuf, unified: PathBuf },
}

impl Layout {
    /// Detects the layout under `/sys/fs/cgroup`.
    pub fn detect() -> Result<Layout> {
        Self::detect_at(Path::new("/sys/fs/cgroup"))
    }

    pub fn detect_at(base: &Path) -> Result<Layout> {
        if base.join("cgroup.controllers").exists() {
            return Ok(Layout::V2 {
                root: base.to_path_buf(),
            });
        }
        let unified = base.join("unified");
        if unified.join("cgroup.procs").exists() && base.join("memory").exists() {
            return Ok(Layout::Hybrid {
                v1_root: base.to_path_buf(),
                unified,
            });
        }
        Err(SysError::Other(format!(
            "no usable cgroup2 mount under {} (need pure cgroup v2, or a hybrid layout with \
             cgroup2 at {}/unified)",
            base.display(),
            base.display()
        )))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Layout::V2 { .. } => "v2",
            Layout::Hybrid { .. } => "hybrid",
        }
    }
}

/// Limits written to a sandbox's cgroup.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u32,
}

const CPU_PERIOD_US: u64 = 100_000;
const V1_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// The cgroup(s) of one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxCgroup {
    layout: Layout,
    /// Relative path, e.g. `threadbox/<id>`.
    rel: PathBuf,
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value)
        .map_err(|e| SysError::os(format!("write {:?} to {}", value, path.display()), e))
}

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|e| SysError::os(format!("read {}", path.display()), e))
}

fn mkdir(path: &Path) -> Result<()> {
    match fs::create_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) => Err(SysError::os(format!("create cgroup {}", path.display()), e)),
    }
}

impl SandboxCgroup {
    pub fn new(layout: Layout, parent: &str, id: &str) -> Self {
        SandboxCgroup {
            layout,
            rel: Path::new(parent).join(id),
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The cgroup2 directory (freeze, kill, cpu.stat, per-exec children).
    pub fn v2_dir(&self) -> PathBuf {
        match &self.layout {
            Layout::V2 { root } => root.join(&self.rel),
            Layout::Hybrid { unified, .. } => unified.join(&self.rel),
        }
    }

    fn v1_dir(&self, controller: &str) -> Option<PathBuf> {
        match &self.layout {
            Layout::V2 { .. } => None,
            Layout::Hybrid { v1_root, .. } => Some(v1_root.join(controller).join(&self.rel)),
        }
    }

    fn all_dirs(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.v2_dir()];
        for c in V1_CONTROLLERS {
            if let Some(d) = self.v1_dir(c) {
                dirs.push(d);
            }
        }
        dirs
    }

    /// The `cgroup.procs` files a process must join to be in this sandbox.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.all_dirs()
            .into_iter()
            .map(|d| d.join("cgroup.procs"))
            .collect()
    }

    /// Creates the cgroup(s), writes the limits and delegates the v2 directory to
    /// `owner` (uid, gid) so the sandbox's agent can make per-call child cgroups.
    pub fn create(&self, limits: &Limits, owner: Option<(u32, u32)>) -> Result<()> {
        if let Layout::V2 { root } = &self.layout {
            // Controllers must be enabled on every ancestor for the limits to exist.
            let mut dir = root.clone();
            for comp in self.rel.parent().into_iter().flat_map(|p| p.components()) {
                enable_controllers(&dir)?;
                dir = dir.join(comp);
                mkdir(&dir)?;
            }
            enable_controllers(&dir)?;
        }
        for d in self.all_dirs() {
            mkdir(&d)?;
        }
        self.set_limits(limits)?;
        if let Some((uid, gid)) = owner {
            let d = self.v2_dir();
            for p in [
                d.clone(),
                d.join("cgroup.procs"),
                d.join("cgroup.threads"),
                d.join("cgroup.subtree_control"),
            ] {
                chown(&p, Some(uid), Some(gid))
                    .map_err(|e| SysError::os(format!("delegate {}", p.display()), e))?;
            }
        }
        Ok(())
    }

    /// Bounds the tree below the sandbox's cgroup (v2): at most `descendants` cgroups,
    /// `depth` levels. Per-call cgroups and contexts need a few; without a bound, whoever
    /// can create cgroups there creates them without end, in the host's cgroupfs.
    pub fn limit_tree(&self, descendants: u32, depth: u32) -> Result<()> {
        let d = self.v2_dir();
        write(&d.join("cgroup.max.descendants"), &descendants.to_string())?;
        write(&d.join("cgroup.max.depth"), &depth.to_string())
    }

    pub fn set_limits(&self, limits: &Limits) -> Result<()> {
        let quota = ((limits.cpus * CPU_PERIOD_US as f64).round() as u64).max(1000);
        match &self.layout {
            Layout::V2 { .. } => {
                let d = self.v2_dir();
                write(&d.join("memory.max"), &limits.memory_bytes.to_string())?;
                // No swap: a memory limit that swap could bypass is no limit.
                let _ = fs::write(d.join("memory.swap.max"), "0");
                write(&d.join("pids.max"), &limits.pids.to_string())?;
                write(&d.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
            }
            Layout::Hybrid { .. } => {
                let mem = self.v1_dir("memory").expect("hybrid has v1");
                write(
                    &mem.join("memory.limit_in_bytes"),
                    &limits.memory_bytes.to_string(),
                )?;
                let memsw = mem.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    let _ = fs::write(&memsw, limits.memory_bytes.to_string());
                }
                let pids = self.v1_dir("pids").expect("hybrid has v1");
                write(&pids.join("pids.max"), &limits.pids.to_string())?;
                let cpu = self.v1_dir("cpu").expect("hybrid has v1");
                write(&cpu.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                write(&cpu.join("cpu.cfs_quota_us"), &quota.to_string())?;
            }
        }
        Ok(())
    }

    pub fn exists(&self) -> bool {
        self.v2_dir().exists()
    }

    /// Freezes every process of the sandbox and waits until the kernel reports it frozen.
    pub fn freeze(&self, timeout: Duration) -> Result<()> {
        let d = self.v2_dir();
        write(&d.join("cgroup.freeze"), "1")?;
        let deadline = Instant::now() + timeout;
        loop {
            if self.is_frozen()? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(SysError::Other("the sandbox did not freeze in time".into()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn thaw(&self) -> Result<()> {
        write(&self.v2_dir().join("cgroup.freeze"), "0")
    }

    /// Whether the cgroup is (completely) frozen, from `cgroup.events`.
    pub fn is_frozen(&self) -> Result<bool> {
        let events = read(&self.v2_dir().join("cgroup.events"))?;
        Ok(events.lines().any(|l| l.trim() == "frozen 1"))
    }

    pub fn is_populated(&self) -> Result<bool> {
        let events = read(&self.v2_dir().join("cgroup.events"))?;
        Ok(events.lines().any(|l| l.trim() == "populated 1"))
    }

    /// Kills every process of the sandbox (children cgroups included) and waits until the
    /// cgroup is empty.
    pub fn kill_all(&self, timeout: Duration) -> Result<()> {
        let d = self.v2_dir();
        if !d.exists() {
            return Ok(());
        }
        let kill = d.join("cgroup.kill");
        if kill.exists() {
            write(&kill, "1")?;
        } else {
            // Kernels before 5.14: freeze, signal every pid, thaw.
            let _ = self.freeze(Duration::from_secs(2));
            for pid in self.pids()? {
                let _ = crate::raw::process::kill(pid, libc::SIGKILL);
            }
            let _ = self.thaw();
        }
        let deadline = Instant::now() + timeout;
        while self.is_populated()? {
            if Instant::now() > deadline {
                return Err(SysError::Other(
                    "sandbox processes did not exit in time".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }

    /// Every pid in the sandbox's cgroup tree (host pid namespace).
    pub fn pids(&self) -> Result<Vec<i32>> {
        let mut out = Vec::new();
        collect_pids(&self.v2_dir(), &mut out)?;
        Ok(out)
    }

    /// Removes the cgroup directories (children first). Processes must be gone.
    pub fn remove(&self) -> Result<()> {
        for d in self.all_dirs() {
            remove_tree(&d)?;
        }
        Ok(())
    }

    /// CPU time used by the sandbox, microseconds.
    pub fn cpu_usage_usec(&self) -> Result<u64> {
        let stat = read(&self.v2_dir().join("cpu.stat"))?;
        for line in stat.lines() {
            if let Some(v) = line.strip_prefix("usage_usec ") {
                return v
                    .trim()
                    .parse()
                    .map_err(|_| SysError::Other(format!("bad cpu.stat line {line:?}")));
            }
        }
        Err(SysError::Other("cpu.stat has no usage_usec".into()))
    }

    /// Memory charged to the sandbox now, bytes.
    pub fn memory_current(&self) -> Result<u64> {
        let path = match &self.layout {
            Layout::V2 { .. } => self.v2_dir().join("memory.current"),
            Layout::Hybrid { .. } => self
                .v1_dir("memory")
                .expect("hybrid")
                .join("memory.usage_in_bytes"),
        };
        read(&path)?
            .trim()
            .parse()
            .map_err(|_| SysError::Other("bad memory usage value".into()))
    }

    /// Pushes the (frozen) sandbox's memory out to swap: hibernate on the jail tier
    /// (issue 16, ADR 0129). Returns the bytes still charged to the cgroup afterwards.
    ///
    /// v1 (hybrid hosts): `memory.force_empty` reclaims every page it can, swapping
    /// anonymous memory, with the tasks still in the cgroup; the memsw limit (memory +
    /// swap, set equal to the memory limit) is untouched, so swap never widens the limit.
    /// v2: swap is closed for sandboxes (`memory.swap.max` 0, see `set_limits`); it is
    /// opened up to the memory limit for the reclaim and closed again by
    /// [`SandboxCgroup::close_swap`] on wake. `memory.reclaim` answers EAGAIN when it
    /// could not reclaim all it was asked: what is left is reported, not an error.
    pub fn reclaim(&self) -> Result<u64> {
        match &self.layout {
            Layout::Hybrid { .. } => {
                let mem = self.v1_dir("memory").expect("hybrid has v1");
                write(&mem.join("memory.force_empty"), "0")?;
            }
            Layout::V2 { .. } => {
                let d = self.v2_dir();
                let max = read(&d.join("memory.max"))?;
                write(&d.join("memory.swap.max"), max.trim())?;
                let current = self.memory_current()?;
                match fs::write(d.join("memory.reclaim"), current.to_string()) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
                    Err(e) => return Err(SysError::os("write memory.reclaim", e)),
                }
            }
        }
        self.memory_current()
    }

    /// Closes swap for the sandbox again after a wake (v2; a no-op on v1, where the memsw
    /// limit bounds memory + swap together). Pages already in swap come back on use.
    pub fn close_swap(&self) -> Result<()> {
        if let Layout::V2 { .. } = &self.layout {
            write(&self.v2_dir().join("memory.swap.max"), "0")?;
        }
        Ok(())
    }

    /// Number of OOM kills in the sandbox so far.
    pub fn oom_kills(&self) -> Result<u64> {
        let path = match &self.layout {
            Layout::V2 { .. } => self.v2_dir().join("memory.events"),
            Layout::Hybrid { .. } => self
                .v1_dir("memory")
                .expect("hybrid")
                .join("memory.oom_control"),
        };
        let text = read(&path)?;
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("oom_kill ") {
                return Ok(v.trim().parse().unwrap_or(0));
            }
        }
        Ok(0)
    }
}

/// Free swap on the host, bytes (0 without swap or zram), from `/proc/meminfo`.
pub fn host_swap_free() -> Result<u64> {
    let text = read(Path::new("/proc/meminfo"))?;
    let kib = text
        .lines()
        .find_map(|l| l.strip_prefix("SwapFree:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    Ok(kib * 1024)
}

fn enable_controllers(dir: &Path) -> Result<()> {
    let available = read(&dir.join("cgroup.controllers")).unwrap_or_default();
    let enabled = read(&dir.join("cgroup.subtree_control")).unwrap_or_default();
    for c in ["memory", "pids", "cpu"] {
        let has = |s: &str| s.split_whitespace().any(|x| x == c);
        if has(&available) && !has(&enabled) {
            write(&dir.join("cgroup.subtree_control"), &format!("+{c}"))?;
        }
    }
    Ok(())
}

fn collect_pids(dir: &Path, out: &mut Vec<i32>) -> Result<()> {
    let procs = match fs::read_to_string(dir.join("cgroup.procs")) {
        Ok(s) => s,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(SysError::os(
                format!("read {}/cgroup.procs", dir.display()),
                e,
            ))
        }
    };
    out.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    for entry in
        fs::read_dir(dir).map_err(|e| SysError::os(format!("list {}", dir.display()), e))?
    {
        let entry = entry.map_err(|e| SysError::os("list cgroup", e))?;
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            collect_pids(&entry.path(), out)?;
        }
    }
    Ok(())
}

fn remove_tree(dir: &Path) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(SysError::os(format!("list {}", dir.display()), e)),
    };
    for entry in entries.flatten() {
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            remove_tree(&entry.path())?;
        }
    }
    // A cgroup whose last process just exited can stay busy for a moment.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(SysError::os(format!("remove cgroup {}", dir.display()), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_layouts_from_marker_files() {
        let t = std::env::temp_dir().join(format!("tb-cg-{}", std::process::id()));
        let _ = fs::remove_dir_all(&t);
        fs::create_dir_all(t.join("unified")).unwrap();
        fs::create_dir_all(t.join("memory")).unwrap();
        assert!(Layout::detect_at(&t).is_err());
        fs::write(t.join("unified/cgroup.procs"), "").unwrap();
        assert_eq!(Layout::detect_at(&t).unwrap().name(), "hybrid");
        fs::write(t.join("cgroup.controllers"), "").unwrap();
        assert_eq!(Layout::detect_at(&t).unwrap().name(), "v2");
        fs::remove_dir_all(&t).unwrap();
    }
}
