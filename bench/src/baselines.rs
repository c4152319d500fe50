//! The sandboxes people would pick instead, driven through their CLIs: bare fork+exec,
//! `bwrap --unshare-all`, and OCI runtimes (`runc`, `runsc`) on a bundle this program
//! builds from the host image (an empty rootfs with the host's `/usr` and `/etc`
//! bind-mounted read-only, like threadbox's built-in `host` image).

use crate::stats::ms;
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Finds `name` in PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn run_timed(cmd: &mut Command, what: &str) -> Result<f64> {
    let t = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {what}"))?;
    let el = t.elapsed();
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(ms(el))
}

/// A bare fork+exec of `argv`, waiting for its output: the baseline of every figure.
pub fn bare(argv: &[&str]) -> Result<f64> {
    run_timed(Command::new(argv[0]).args(&argv[1..]), "bare fork+exec")
}

/// `bwrap --unshare-all` with the host's `/usr` and `/etc` read-only, proc, dev, tmpfs.
pub struct Bwrap {
    bin: PathBuf,
}

impl Bwrap {
    pub fn probe() -> std::result::Result<Bwrap, String> {
        let bin = which("bwrap").ok_or("bwrap not installed (apt: bubblewrap)")?;
        let b = Bwrap { bin };
        b.run(&["true"])
            .map_err(|e| format!("bwrap cannot run here: {e}"))?;
        Ok(b)
    }

    pub fn run(&self, argv: &[&str]) -> Result<f64> {
        let mut c = Command::new(&self.bin);
        c.args([
            "--unshare-all",
            "--die-with-parent",
            "--ro-bind",
            "/usr",
            "/usr",
        ]);
        for (l, t) in [
            ("/bin", "usr/bin"),
            ("/lib", "usr/lib"),
            ("/lib64", "usr/lib64"),
            ("/sbin", "usr/sbin"),
        ] {
            c.args(["--symlink", t, l]);
        }
        c.args([
            "--ro-bind",
            "/etc",
            "/etc",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
        ])
        .args(["--tmpfs", "/tmp", "--"])
        .args(argv);
        run_timed(&mut c, "bwrap")
    }
}

/// An OCI runtime CLI (`runc` or `runsc`) with a bundle of its own.
pub struct Oci {
    pub name: &'static str,
    bin: PathBuf,
    extra: Vec<String>,
    state_root: PathBuf,
    bundle: PathBuf,
    seq: u64,
    /// Containers left running (exec / pause / density), deleted on drop.
    live: Vec<String>,
}

fn write_bundle(bundle: &Path, args: &[&str], id: &str) -> Result<()> {
    let rootfs = bundle.join("rootfs");
    for d in ["usr", "etc", "proc", "dev", "tmp"] {
        std::fs::create_dir_all(rootfs.join(d))?;
    }
    for (l, t) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        let p = rootfs.join(l);
        if p.symlink_metadata().is_err() {
            std::os::unix::fs::symlink(t, &p)?;
        }
    }
    let ro = json!(["rbind", "ro", "nosuid", "nodev"]);
    let config = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp"],
            "cwd": "/",
            "capabilities": {"bounding": [], "effective": [], "permitted": []},
            "noNewPrivileges": true
        },
        "root": {"path": "rootfs", "readonly": true},
        "hostname": "bench",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
             "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]},
            {"destination": "/usr", "type": "bind", "source": "/usr", "options": ro},
            {"destination": "/etc", "type": "bind", "source": "/etc", "options": ro}
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "ipc"},
                           {"type": "uts"}, {"type": "mount"}],
            // One cgroup per container: a shared path lets one container's exit kill another.
            "cgroupsPath": format!("/threadbox-bench/{id}"),
            "resources": {"memory": {"limit": 1u64 << 30}, "pids": {"limit": 512},
                          "cpu": {"quota": 100000, "period": 100000}}
        }
    });
    std::fs::write(
        bundle.join("config.json"),
        serde_json::to_vec_pretty(&config)?,
    )?;
    Ok(())
}

impl Oci {
    /// `runc` or `runsc` (ptrace platform: KVM is not usable here), checked by running
    /// `true` in a container once.
    pub fn probe(name: &'static str, work: &Path) -> std::result::Result<Oci, String> {
        let bin = which(name).ok_or_else(|| {
            format!(
                "{name} not installed (apt: {}; `threadbox-bench setup`)",
                if name == "runsc" { "runsc" } else { name }
            )
        })?;
        let extra = if name == "runsc" {
            vec!["--platform=ptrace".into(), "--network=none".into()]
        } else {
            vec![]
        };
        let mut o = Oci {
            name,
            bin,
            extra,
            state_root: work.join(format!("{name}-state")),
            bundle: work.join(format!("{name}-bundle")),
            seq: 0,
            live: Vec::new(),
        };
        o.run(&["true"])
            .map_err(|e| format!("{name} cannot run here: {e:#}"))?;
        Ok(o)
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.bin);
        c.arg("--root").arg(&self.state_root).args(&self.extra);
        c
    }

    fn next_id(&mut self) -> String {
        self.seq += 1;
        format!("tbb-{}-{}-{}", self.name, std::process::id(), self.seq)
    }

    /// `<runtime> run` of `argv` to completion: create → first result.
    pub fn run(&mut self, argv: &[&str]) -> Result<f64> {
        let id = self.next_id();
        write_bundle(&self.bundle, argv, &id)?;
        let mut c = self.cmd();
        c.args(["run", "--bundle"]).arg(&self.bundle).arg(&id);
        let r = run_timed(&mut c, self.name);
        if r.is_err() {
            let _ = self.delete(&id);
        }
        r
    }

    /// Starts a detached container running `sleep infinity`; returns its id.
    pub fn start_sleeper(&mut self) -> Result<String> {
        let id = self.next_id();
        write_bundle(&self.bundle, &["sleep", "infinity"], &id)?;
        // The container inherits runc's stdio: a pipe would never reach EOF.
        let errf = self.bundle.join("detach.err");
        let st = self
            .cmd()
            .args(["run", "--detach", "--bundle"])
            .arg(&self.bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&errf)?)
            .status()?;
        if !st.success() {
            bail!(
                "{} run --detach failed: {}",
                self.name,
                std::fs::read_to_string(&errf).unwrap_or_default().trim()
            );
        }
        self.live.push(id.clone());
        Ok(id)
    }

    pub fn exec(&self, id: &str, argv: &[&str]) -> Result<f64> {
        let mut c = self.cmd();
        c.args(["exec", id]).args(argv);
        run_timed(&mut c, self.name)
    }

    pub fn pause(&self, id: &str) -> Result<f64> {
        run_timed(self.cmd().args(["pause", id]), self.name)
    }

    pub fn resume(&self, id: &str) -> Result<f64> {
        run_timed(self.cmd().args(["resume", id]), self.name)
    }

    /// The host pid of a container's init.
    pub fn pid(&self, id: &str) -> Result<i32> {
        let out = self.cmd().args(["state", id]).output()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        v["pid"]
            .as_i64()
            .map(|p| p as i32)
            .context("no pid in runtime state")
    }

    pub fn delete(&mut self, id: &str) -> Result<()> {
        self.live.retain(|x| x != id);
        let out = self
            .cmd()
            .args(["delete", "--force", id])
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            bail!("{} delete failed", self.name);
        }
        Ok(())
    }

    pub fn delete_all(&mut self) {
        for id in std::mem::take(&mut self.live) {
            let _ = self.delete(&id);
        }
    }
}

impl Drop for Oci {
    fn drop(&mut self) {
        self.delete_all();
    }
}

/// Installs the baselines with apt (bubblewrap, runc, runsc). Debian's `runsc` is
/// gVisor 2022-12; bookworm-backports has a newer one, not needed for these figures.
pub fn setup() -> Result<()> {
    let missing: Vec<&str> = [
        ("bwrap", "bubblewrap"),
        ("runc", "runc"),
        ("runsc", "runsc"),
    ]
    .into_iter()
    .filter(|(b, _)| which(b).is_none())
    .map(|(_, p)| p)
    .collect();
    if missing.is_empty() {
        eprintln!("baselines already installed");
        return Ok(());
    }
    eprintln!("installing {missing:?} with apt-get");
    let st = Command::new("apt-get").arg("update").status()?;
    if !st.success() {
        bail!("apt-get update failed");
    }
    let st = Command::new("apt-get")
        .args(["install", "-y", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()?;
    if !st.success() {
        bail!("apt-get install {missing:?} failed");
    }
    Ok(())
}

/// Bytes of memory charged to the cgroup of `pid` (v1 memory controller, else v2).
pub fn cgroup_memory(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mut v2 = None;
    for line in s.lines() {
        let mut it = line.splitn(3, ':');
        let (_, ctrl, path) = (it.next()?, it.next()?, it.next()?);
        if ctrl.split(',').any(|c| c == "memory") {
            let p = format!("/sys/fs/cgroup/memory{path}/memory.usage_in_bytes");
            if let Some(v) = std::fs::read_to_string(p)
                .ok()
                .and_then(|x| x.trim().parse().ok())
            {
                return Some(v);
            }
        }
        if ctrl.is_empty() {
            v2 = Some(path.to_string());
        }
    }
    let path = v2?;
    for base in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
        let p = format!("{base}{path}/memory.current");
        if let Some(v) = std::fs::read_to_string(p)
            .ok()
            .and_then(|x| x.trim().parse().ok())
        {
            return Some(v);
        }
    }
    None
}

/// `MemTotal - MemAvailable` in bytes: what the host has spent.
pub fn host_used() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/meminfo")?;
    let get = |k: &str| -> Option<u64> {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    let (t, a) = (
        get("MemTotal:").context("MemTotal")?,
        get("MemAvailable:").context("MemAvailable")?,
    );
    Ok((t - a) * 1024)
}
