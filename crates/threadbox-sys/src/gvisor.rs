//! The `gvisor` tier's launch helper (`threadbox __gvisor-launch`): the host side of a
//! gVisor sandbox's root file system. It makes a mount namespace of its own, mounts the
//! sandbox's disk image and the overlay of the image's layers there (so, as with the jail,
//! nothing of a sandbox is mounted in the host's namespace), joins the sandbox's cgroups
//! and runs `runsc run -detach`. runsc's gofer and sentry inherit the namespace and the
//! cgroups; the namespace lives as long as they do.

use crate::raw;
use crate::{Result, SysError};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// What the helper mounts and runs (JSON on its stdin).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GvisorLaunch {
    /// The sandbox's ext4 disk image, mounted on `disk_mount`; `None`: `upper` and `work`
    /// are plain directories.
    pub disk_image: Option<PathBuf>,
    pub disk_mount: PathBuf,
    /// The image's layers, topmost first.
    pub lower: Vec<PathBuf>,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// Where the overlay is mounted: the OCI bundle's root.
    pub rootfs: PathBuf,
    /// Owner of `home/user` when the helper makes it (the sandbox's own uid: gVisor maps
    /// no ids, so the disk holds the ids the sandbox sees).
    pub home_owner: u32,
    /// `cgroup.procs` files the helper joins before runsc starts.
    pub cgroup_procs: Vec<PathBuf>,
    /// The runsc binary and its whole argument list.
    pub runsc: PathBuf,
    pub args: Vec<String>,
    /// The agent's log: runsc's and the container's stdout and stderr (appended).
    pub log: PathBuf,
    /// A network namespace of our own for the sandbox, with the egress table (ADR 0140):
    /// the helper unshares it, brings `lo` up and installs the table while it is host
    /// root there, and runsc (`--network=host`) runs in it. `None`: runsc's own netstack
    /// in a netns of runsc's (`--network=none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::net::EgressConfig>,
}

/// What the helper prints (one JSON line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GvisorReport {
    pub ok: bool,
    pub error: Option<String>,
}

/// Entry point of `threadbox __gvisor-launch`; must run before any thread exists (it
/// unshares its mount namespace).
pub fn helper_main() -> i32 {
    let report = match run_helper() {
        Ok(()) => GvisorReport {
            ok: true,
            error: None,
        },
        Err(e) => GvisorReport {
            ok: false,
            error: Some(e.to_string()),
        },
    };
    let line = serde_json::to_string(&report).unwrap_or_else(|_| "{\"ok\":false}".into());
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
    i32::from(!report.ok)
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| SysError::Other(format!("NUL in path {}", p.display())))
}

fn mount(
    src: &str,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<()> {
    let c = |s: &str| CString::new(s).map_err(|_| SysError::Other("NUL in mount argument".into()));
    let (src_c, fs_c, data_c) = (
        c(src)?,
        fstype.map(c).transpose()?,
        data.map(c).transpose()?,
    );
    raw::mount::mount(
        Some(&src_c),
        &cstr(target)?,
        fs_c.as_deref(),
        flags,
        data_c.as_deref(),
    )
    .map_err(|e| SysError::os(format!("mount {}", target.display()), e))
}

/// The sandbox's netns, made by this (host root) helper as the jail's init makes its own
/// (ADR 0065): it belongs to the host's user namespace, so neither the sentry (which
/// runsc leaves without `CAP_NET_ADMIN`) nor anything inside can change the table or
/// the route. runsc and the sentry inherit it.
fn enter_egress_netns(cfg: &crate::net::EgressConfig) -> Result<()> {
    cfg.validate()?;
    raw::process::unshare(libc::CLONE_NEWNET)
        .map_err(|e| SysError::os("unshare(CLONE_NEWNET)", e))?;
    crate::jail::loopback_up()?;
    crate::net::install_egress(cfg)
}

fn run_helper() -> Result<()> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| SysError::os("read the gvisor spec", e))?;
    let spec: GvisorLaunch = serde_json::from_str(&input)
        .map_err(|e| SysError::Other(format!("bad gvisor spec: {e}")))?;
    for f in &spec.cgroup_procs {
        std::fs::write(f, std::process::id().to_string())
            .map_err(|e| SysError::os(format!("join {}", f.display()), e))?;
    }
    if let Some(cfg) = &spec.egress {
        enter_egress_netns(cfg)?;
    }
    raw::process::unshare(libc::CLONE_NEWNS)
        .map_err(|e| SysError::os("unshare(CLONE_NEWNS)", e))?;
    // Nothing mounted here may propagate back to the host.
    raw::mount::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| SysError::os("make / private", e))?;
    if let Some(image) = &spec.disk_image {
        let (loopfd, dev) = crate::jail::disk::attach_loop(image)?;
        mount(
            &dev.display().to_string(),
            &spec.disk_mount,
            Some("ext4"),
            libc::MS_NOSUID | libc::MS_NODEV,
            None,
        )?;
        // The mount holds the device now; autoclear detaches it with the namespace.
        drop(loopfd);
        // The jail's inode reserve (ADR 0186): a sandbox that used up every inode of its
        // disk still boots, since the overlay's workdir below needs a few.
        crate::jail::rootfs::release_inode_reserve(&spec.disk_mount)?;
    }
    // A previous boot's overlay workdir may hold leftovers overlayfs refuses to reuse.
    if spec.work.exists() {
        std::fs::remove_dir_all(&spec.work)
            .map_err(|e| SysError::os(format!("clear {}", spec.work.display()), e))?;
    }
    std::fs::create_dir_all(&spec.work).map_err(|e| SysError::os("mkdir work", e))?;
    let home = spec.upper.join("home/user");
    if !spec.upper.exists() {
        std::fs::create_dir_all(&home).map_err(|e| SysError::os("mkdir home/user", e))?;
        std::os::unix::fs::chown(&home, Some(spec.home_owner), Some(spec.home_owner))
            .map_err(|e| SysError::os("chown home/user", e))?;
    }
    let lower = spec
        .lower
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let opts = format!(
        "lowerdir={lower},upperdir={},workdir={}",
        spec.upper.display(),
        spec.work.display()
    );
    std::fs::create_dir_all(&spec.rootfs).map_err(|e| SysError::os("mkdir rootfs", e))?;
    mount(
        "overlay",
        &spec.rootfs,
        Some("overlay"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&opts),
    )?;
    if spec.disk_image.is_some() {
        crate::jail::rootfs::refill_inode_reserve_at(&spec.disk_mount);
    }
    // The container's stdio is runsc's: a file, never a pipe someone must drain (the
    // detached sentry keeps it open for the sandbox's whole life).
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&spec.log)
        .map_err(|e| SysError::os(format!("open {}", spec.log.display()), e))?;
    let start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let err = log
        .try_clone()
        .map_err(|e| SysError::os("dup the log", e))?;
    let status = std::process::Command::new(&spec.runsc)
        .args(&spec.args)
        .stdin(std::process::Stdio::null())
        .stdout(log)
        .stderr(err)
        .status()
        .map_err(|e| SysError::os(format!("run {}", spec.runsc.display()), e))?;
    if !status.success() {
        let text = std::fs::read(&spec.log).unwrap_or_default();
        let tail = String::from_utf8_lossy(text.get(start as usize..).unwrap_or_default());
        return Err(SysError::Other(format!(
            "runsc run failed ({status}): {}",
            tail.trim().lines().last().unwrap_or("")
        )));
    }
    Ok(())
}

/// Paths under the sentry's `/proc` the agent makes read-only inside a gvisor sandbox, as
/// the jail does under its own (`jail/rootfs.rs`, `READONLY_PROC`), and `sysrq-trigger`,
/// which the jail masks: the sentry's is a no-op, but root inside could open it for
/// writing, and a program must see the same refusal on both tiers (ADR 0191). runsc
/// 20240729 ignores the OCI `readonlyPaths`/`maskedPaths`, so it is done from inside.
pub const READONLY_PROC_INSIDE: &[&str] = &[
    "sys",
    "sysrq-trigger",
    "irq",
    "bus",
    "fs",
    "sysvipc",
    "driver",
    "tty",
    "pressure",
];

/// Run by the agent as the init of a gvisor container, before it serves anything: binds
/// each existing path of [`READONLY_PROC_INSIDE`] onto itself read-only (the sentry's own
/// mount table: nothing on the host changes), unless `mask` is false (the security suite's
/// `no-proc-mask`), then gives up `CAP_SYS_ADMIN`, which the container was given for this
/// alone, unless `keep_sys_admin` (its `keep-caps`). Returns the paths made read-only.
pub fn harden_proc_inside(mask: bool, keep_sys_admin: bool) -> Result<Vec<String>> {
    let mut done = Vec::new();
    for name in READONLY_PROC_INSIDE.iter().filter(|_| mask) {
        let path = format!("/proc/{name}");
        if std::fs::symlink_metadata(&path).is_err() {
            continue;
        }
        let c = CString::new(path.clone()).map_err(|e| SysError::Other(e.to_string()))?;
        raw::mount::mount(Some(&c), &c, None, libc::MS_BIND | libc::MS_REC, None)
            .map_err(|e| SysError::os(format!("bind {path}"), e))?;
        raw::mount::mount(
            None,
            &c,
            None,
            libc::MS_BIND
                | libc::MS_REMOUNT
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC,
            None,
        )
        .map_err(|e| SysError::os(format!("make {path} read-only"), e))?;
        done.push(path);
    }
    if !keep_sys_admin {
        // CAP_SYS_ADMIN (linux/capability.h; the libc crate does not name it).
        let cap: u32 = 21;
        raw::process::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong)
            .map_err(|e| SysError::os("drop CAP_SYS_ADMIN from the bounding set", e))?;
        raw::process::capset_without(cap).map_err(|e| SysError::os("drop CAP_SYS_ADMIN", e))?;
    }
    Ok(done)
}
