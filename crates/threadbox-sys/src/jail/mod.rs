//! Building a sandbox: the single-threaded launch helper.
//!
//! The daemon is multithreaded, and `fork()` from a multithreaded process is only safe for
//! an immediate `exec`. So the daemon runs `threadbox __jail-launch` (a fresh, single-
//! threaded process) with a [`JailSpec`] on stdin; [`helper_main`] joins the sandbox's
//! cgroups, creates the namespaces, forks the sandbox's PID 1, which builds the root
//! filesystem, pivots into it, enters a new user namespace mapped onto an unprivileged
//! host uid range and execs the agent from a sealed memfd. The helper prints a
//! [`LaunchReport`] on stdout and exits; the agent is reparented and outlives the daemon.
//!
//! All mounts are made as host root in a mount namespace that belongs to the host's user
//! namespace; the agent then moves into a child user namespace, so neither it nor anything
//! it runs holds a capability over its mounts, network or PID namespace.

//!
//! Modules: this one is the helper's side (the spec, the pipe protocol with the sandbox's
//! init, the id maps); [`init`] the sandbox's PID 1 up to the exec of the agent;
//! [`rootfs`] the mount plan, over a syscall trait so that it is unit-tested without root;
//! [`disk`] the loop device of the disk image.

pub(crate) mod disk;
mod init;
pub(crate) use init::loopback_up;
pub mod rootfs;
mod store;

pub use disk::{
    nobarrier_disks, restore_barrier, shift_owners, unmount_leftover, with_image_mounted, Barrier,
    BOOT_DISK_OPTIONS,
};
pub use init::set_hostname;
pub use rootfs::DEVICES;
pub use store::{mount_store, unmount_store};

use crate::raw;
use crate::raw::process::Forked;
use crate::{Result, SysError};
use serde::{Deserialize, Serialize};
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Marks a refusal on the way from the sandbox's init to the helper's report.
const REFUSED_PREFIX: &str = "refused: ";

/// Size of the uid/gid range given to each sandbox.
pub const ID_RANGE: u32 = 65536;
/// uid/gid of the unprivileged `user` inside every sandbox.
pub const SANDBOX_USER_ID: u32 = 1000;

/// A read-only bind mount of a host path into the sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Bind {
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: PathBuf,
}

/// Everything the helper needs to build one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JailSpec {
    pub hostname: String,
    /// First host uid/gid of the sandbox's range; sandbox uid 0 maps to it.
    pub id_base: u32,
    /// Overlay lower layers, topmost first (read-only).
    pub lower: Vec<PathBuf>,
    /// The lowers hold an image's own ids (0–65535: an OCI image's layers, ADR 0175):
    /// each is mounted idmapped, `[0, ID_RANGE)` on disk seen as `[id_base, id_base +
    /// ID_RANGE)`. Off for host-root-owned lowers (the host image, rootfs directories),
    /// which stay the overflow id inside. Left out of the JSON when off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lower_idmap: bool,
    /// Set by the helper: the fd of the user namespace holding the lowers' idmap.
    #[serde(skip)]
    pub lower_userns_fd: Option<i32>,
    pub upper: PathBuf,
    pub work: PathBuf,
    /// The sandbox's disk image (ext4): mounted by the helper, in the sandbox's mount
    /// namespace only, on the parent directory of `upper` and `work` (ADR 0011).
    #[serde(default)]
    pub disk_image: Option<PathBuf>,
    /// The host uid base the disk image's owners are stored relative to, when it is not
    /// `id_base` (a fork's or a template's clone, ADR 0100): the disk is then mounted
    /// idmapped, `[base, base + ID_RANGE)` on disk seen as the sandbox's own range.
    #[serde(default)]
    pub disk_owner_base: Option<u32>,
    /// Set by the helper: the fd of the user namespace holding that idmap.
    #[serde(skip)]
    pub disk_userns_fd: Option<i32>,
    /// Host uid/gid that owns `home/user` when the helper creates a fresh upper.
    #[serde(default)]
    pub home_owner: u32,
    /// Empty directory the overlay is mounted on.
    pub rootfs: PathBuf,
    pub binds: Vec<Bind>,
    /// Read-only binds onto files the image already has (the egress CA bundle over the
    /// image's own, ADR 0075). Each is skipped unless its target is an existing file
    /// reached through real directories only: the upper is the sandbox's, so a symlink
    /// there must never steer a mount (or a file creation) made as host root.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub file_binds: Vec<Bind>,
    pub agent_path: PathBuf,
    /// A sealed memfd holding the agent, made once by the daemon and shared by every
    /// sandbox (`/proc/<daemon>/fd/<n>`): saves a copy of the agent per boot, in time and
    /// in memory. Without it (or if it is not sealed) the helper copies `agent_path`.
    #[serde(default)]
    pub agent_memfd: Option<PathBuf>,
    /// Host path where the agent's listening socket is created.
    pub socket_path: PathBuf,
    /// `cgroup.procs` files the sandbox joins.
    pub cgroup_procs: Vec<PathBuf>,
    /// The sandbox's cgroup2 directory, handed to the agent as an fd.
    pub cgroup_dir: Option<PathBuf>,
    /// Size limit of `/tmp` and `/dev/shm` (tmpfs, charged to the sandbox's memory).
    pub tmpfs_bytes: u64,
    /// Open-file limit of every sandbox process.
    pub nofile: u64,
    /// The operator allows sandboxes without Landlock where the kernel cannot enforce it
    /// (`serve --insecure-allow-no-landlock`); otherwise such a sandbox does not start.
    #[serde(default)]
    pub allow_no_landlock: bool,
    /// Test-only weakenings (see `testhooks`). Always a field, so the feature only adds
    /// behaviour (F14: a crate built without it still constructs the spec); a build
    /// without `insecure-test-hooks` ignores it.
    #[serde(default)]
    pub test_weaken: Vec<String>,
}

/// What the helper reads on stdin: a [`JailSpec`] and the launch options that are off
/// unless set. They sit beside the spec rather than in it, so that a spec without them
/// is the same JSON byte for byte (today's sandboxes are launched exactly as before) and
/// the daemon's `JailSpec` literals need no change until it uses them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LaunchSpec {
    #[serde(flatten)]
    pub jail: JailSpec,
    /// The egress kernel side (issue 13, [`crate::net::install_egress`]) in the
    /// sandbox's netns. Off (absent) by default: loopback only, no table, no route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::net::EgressConfig>,
}

#[cfg(feature = "insecure-test-hooks")]
pub(crate) fn weakened(spec: &JailSpec, w: &str) -> bool {
    spec.test_weaken.iter().any(|x| x == w)
}

#[cfg(not(feature = "insecure-test-hooks"))]
pub(crate) fn weakened(_spec: &JailSpec, _w: &str) -> bool {
    false
}

/// What the helper prints on stdout (one JSON line).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LaunchReport {
    pub ok: bool,
    /// Host pid of the agent (the sandbox's PID 1).
    pub agent_pid: Option<i32>,
    pub error: Option<String>,
    /// The error is a refusal of this host's posture (see `SysError::Refused`).
    #[serde(default)]
    pub refused: bool,
    /// Microseconds from the helper's start to the end of each phase (where a boot's time
    /// goes; the daemon logs them at debug level).
    #[serde(default)]
    pub phases_us: Vec<(String, u64)>,
}

/// The helper's start and its phase marks so far.
type Phases = (Option<std::time::Instant>, Vec<(String, u64)>);

thread_local! {
    /// The helper's phase marks (it is single-threaded; the init child never reports).
    static PHASES: std::cell::RefCell<Phases> = const { std::cell::RefCell::new((None, Vec::new())) };
}

/// Marks the end of a phase of the helper (see [`LaunchReport::phases_us`]).
fn phase(name: &str) {
    PHASES.with(|p| {
        let mut p = p.borrow_mut();
        let t0 = *p.0.get_or_insert_with(std::time::Instant::now);
        let us = t0.elapsed().as_micros() as u64;
        p.1.push((name.to_string(), us));
    });
}

/// Entry point of `threadbox __jail-launch`. Reads a [`JailSpec`] from stdin, prints a
/// [`LaunchReport`], returns the process exit code. Must run in a single-threaded process.
pub fn helper_main() -> i32 {
    phase("start");
    if std::env::args_os().nth(2).as_deref() == Some(OsStr::new("--staged")) {
        return staged_main();
    }
    print_report(run_helper())
}

/// Prints the [`LaunchReport`] of `result` (with the phases marked since the last one)
/// as one JSON line; returns the helper's exit code.
fn print_report(result: Result<i32>) -> i32 {
    let phases_us = PHASES.with(|p| std::mem::take(&mut p.borrow_mut().1));
    let report = match result {
        Ok(pid) => LaunchReport {
            ok: true,
            agent_pid: Some(pid),
            error: None,
            refused: false,
            phases_us,
        },
        Err(e) => LaunchReport {
            ok: false,
            agent_pid: None,
            refused: matches!(e, SysError::Refused(_)),
            error: Some(e.to_string()),
            phases_us,
        },
    };
    let code = if report.ok { 0 } else { 1 };
    let line = serde_json::to_string(&report).unwrap_or_else(|_| "{\"ok\":false}".to_string());
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
    code
}

fn run_helper() -> Result<i32> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| SysError::os("read the jail spec", e))?;
    let spec: LaunchSpec =
        serde_json::from_str(&input).map_err(|e| SysError::Other(format!("bad jail spec: {e}")))?;
    phase("spec");
    launch_with(&spec.jail, spec.egress.as_ref())
}

pub(crate) fn cstr(p: impl AsRef<OsStr>) -> Result<CString> {
    CString::new(p.as_ref().as_bytes())
        .map_err(|_| SysError::Other("path contains a NUL byte".into()))
}

/// Copies the agent binary into a sealed memfd, so nothing in a sandbox can ever write
/// to the copy it executes (nor, through /proc/self/exe, to the host's file).
pub fn sealed_agent(path: &Path) -> Result<OwnedFd> {
    let bytes =
        fs::read(path).map_err(|e| SysError::os(format!("read agent {}", path.display()), e))?;
    let name = cstr("threadbox-agent")?;
    let owned = raw::fd::memfd_create(&name, libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        .map_err(|e| SysError::os("memfd_create", e))?;
    let mut file = fs::File::from(owned);
    file.write_all(&bytes)
        .map_err(|e| SysError::os("fill agent memfd", e))?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    raw::fd::add_seals(file.as_fd(), seals).map_err(|e| SysError::os("seal agent memfd", e))?;
    Ok(OwnedFd::from(file))
}

/// Opens an agent memfd made by [`sealed_agent`] (through `/proc/<pid>/fd/<n>`), only if
/// it is sealed against any write, shrink or growth: a sandbox's agent never runs from a
/// file that can change.
fn open_sealed(path: &Path) -> Option<OwnedFd> {
    let file = fs::File::open(path).ok()?;
    let seals = raw::fd::get_seals(file.as_fd()).ok()?;
    let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    (seals & need == need).then(|| OwnedFd::from(file))
}

/// Creates the agent's listening socket at a host path outside the sandbox root.
fn listen_socket(path: &Path) -> Result<OwnedFd> {
    let _ = fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)
        .map_err(|e| SysError::os(format!("bind agent socket {}", path.display()), e))?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .map_err(|e| SysError::os("chmod agent socket", e))?;
    Ok(OwnedFd::from(listener))
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    raw::fd::pipe_cloexec().map_err(|e| SysError::os("pipe2", e))
}

fn read_all(fd: OwnedFd) -> Vec<u8> {
    let mut f = fs::File::from(fd);
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    buf
}

/// Builds the sandbox and returns the host pid of its agent.
pub fn launch(spec: &JailSpec) -> Result<i32> {
    launch_with(spec, None)
}

/// [`launch`], with the egress kernel side installed in the sandbox's netns when `egress`
/// is set.
pub fn launch_with(spec: &JailSpec, egress: Option<&crate::net::EgressConfig>) -> Result<i32> {
    let pre = before_fork(spec, egress)?;
    // The idmap of a disk whose owners are another range's: its user namespace is made
    // here, in the host's PID namespace (its holder's maps are written through /proc).
    let idmap_ns = match spec.disk_owner_base.filter(|b| *b != spec.id_base) {
        Some(base) if spec.disk_image.is_some() => {
            Some(disk::idmap_userns(base, spec.id_base, ID_RANGE)?)
        }
        _ => None,
    };
    // The layers' idmap (ADR 0175): `0 id_base ID_RANGE`, made here for the same reason.
    let lower_ns = if spec.lower_idmap {
        Some(disk::range_userns(spec.id_base, ID_RANGE)?)
    } else {
        None
    };
    phase("idmap");
    let with_ns;
    let spec = if idmap_ns.is_some() || lower_ns.is_some() {
        use std::os::fd::AsRawFd;
        with_ns = JailSpec {
            disk_userns_fd: idmap_ns.as_ref().map(|ns| ns.as_raw_fd()),
            lower_userns_fd: lower_ns.as_ref().map(|ns| ns.as_raw_fd()),
            ..spec.clone()
        };
        &with_ns
    } else {
        spec
    };
    let (pid, pipes, _) = fork_init(
        spec,
        pre,
        None,
        |spec, agent, listener, cgroup_fd, ready_w, go_r| {
            init::sandbox_init(spec, egress, agent, listener, cgroup_fd, ready_w, go_r)
        },
    )?;
    after_fork(spec, pid, pipes)
}

/// What the daemon sends a staged helper when it hands the slot out (ADR 0180): one
/// JSON line on the helper's stdin, after the [`LaunchSpec`]'s.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StagedAttach {
    pub hostname: String,
    /// Size limit of `/tmp` and `/dev/shm` (the limits may have been rewritten).
    pub tmpfs_bytes: u64,
    /// As [`JailSpec::disk_owner_base`], for the disk now in the slot's directory.
    pub disk_owner_base: Option<u32>,
}

/// `threadbox __jail-launch --staged` (ADR 0180): reads a [`LaunchSpec`] line, builds the
/// sandbox up to the point where its disk is needed and prints a first [`LaunchReport`]
/// (the init's pid); then waits for a [`StagedAttach`] line (EOF: the slot is destroyed),
/// finishes the boot as a cold one would and prints the second report.
fn staged_main() -> i32 {
    use std::io::BufRead;
    let mut input = std::io::stdin().lock();
    let mut line = String::new();
    let staged = input
        .read_line(&mut line)
        .map_err(|e| SysError::os("read the jail spec", e))
        .and_then(|_| {
            serde_json::from_str::<LaunchSpec>(&line)
                .map_err(|e| SysError::Other(format!("bad jail spec: {e}")))
        })
        .and_then(|spec| {
            phase("spec");
            let staged = stage(&spec.jail, spec.egress.as_ref())?;
            Ok((spec, staged))
        });
    let (spec, (pid, pipes, attach_w)) = match staged {
        Ok(s) => s,
        Err(e) => return print_report(Err(e)),
    };
    print_report(Ok(pid));
    let result = (|| {
        let mut line = String::new();
        let n = input
            .read_line(&mut line)
            .map_err(|e| SysError::os("read the attach", e))?;
        if n == 0 {
            return Err(SysError::Other("the staged slot was closed".into()));
        }
        // The second report's phases count from the attach.
        PHASES.with(|p| p.borrow_mut().0 = Some(std::time::Instant::now()));
        phase("attach");
        let a: StagedAttach =
            serde_json::from_str(&line).map_err(|e| SysError::Other(format!("bad attach: {e}")))?;
        let idmap_ns = match a.disk_owner_base.filter(|b| *b != spec.jail.id_base) {
            Some(base) => Some(disk::idmap_userns(base, spec.jail.id_base, ID_RANGE)?),
            None => None,
        };
        phase("idmap");
        let msg = init::InitAttach {
            hostname: a.hostname,
            tmpfs_bytes: a.tmpfs_bytes,
            disk_owner_base: a.disk_owner_base,
            disk_userns_path: idmap_ns.as_ref().map(|ns| {
                use std::os::fd::AsRawFd;
                PathBuf::from(format!(
                    "/proc/{}/fd/{}",
                    std::process::id(),
                    ns.as_raw_fd()
                ))
            }),
        };
        let text = serde_json::to_vec(&msg).map_err(|e| SysError::Other(e.to_string()))?;
        let mut w = fs::File::from(attach_w);
        w.write_all(&text)
            .map_err(|e| SysError::os("send the attach to the sandbox init", e))?;
        drop(w);
        Ok(idmap_ns)
    })();
    let result = match result {
        // The namespace stays open until the init has opened it (before its ready).
        Ok(idmap_ns) => {
            let r = after_fork(&spec.jail, pid, pipes);
            drop(idmap_ns);
            r
        }
        Err(e) => {
            let _ = raw::process::kill(pid, libc::SIGKILL);
            let _ = raw::process::waitpid(pid, 0);
            Err(e)
        }
    };
    print_report(result)
}

/// Builds a staged slot: everything [`launch_with`] makes before the disk is needed.
/// Returns the init's pid, the pipes to it and the attach pipe's write end.
fn stage(
    spec: &JailSpec,
    egress: Option<&crate::net::EgressConfig>,
) -> Result<(i32, InitPipes, OwnedFd)> {
    if spec.disk_image.is_none() || spec.disk_owner_base.is_some() {
        return Err(SysError::Other(
            "a staged slot is made for a disk image, attached later".into(),
        ));
    }
    // The layers' idmap (ADR 0175) is made at launch, not at attach: a staged slot has
    // only host-root-owned lowers (the host image), so an image's layers boot cold.
    if spec.lower_idmap {
        return Err(SysError::Other(
            "a staged slot is made for host-owned lowers, not an image's idmapped layers".into(),
        ));
    }
    let pre = before_fork(spec, egress)?;
    // helper -> init: the attach (EOF without data: the slot is destroyed).
    let (attach_r, attach_w) = pipe()?;
    let (pid, pipes, attach_w) = fork_init(
        spec,
        pre,
        Some(attach_w),
        move |spec, agent, listener, cgroup_fd, ready_w, go_r| {
            init::staged_init(
                spec, egress, agent, listener, cgroup_fd, ready_w, go_r, attach_r,
            )
        },
    )?;
    match attach_w {
        Some(w) => Ok((pid, pipes, w)),
        None => Err(SysError::Other("the attach pipe was lost".into())),
    }
}

/// What the helper makes before the fork of the init: the cgroups joined, the agent's
/// memfd, its listening socket and the cgroup handle.
struct PreFork {
    agent: OwnedFd,
    listener: OwnedFd,
    cgroup_fd: Option<OwnedFd>,
}

fn before_fork(spec: &JailSpec, egress: Option<&crate::net::EgressConfig>) -> Result<PreFork> {
    if let Some(cfg) = egress {
        // Refused before anything is made: bad input changes nothing.
        cfg.validate()?;
        if weakened(spec, "shared-netns") {
            // The table and the route would land in the host's netns.
            return Err(SysError::Other(
                "egress needs the sandbox's own network namespace (shared-netns is set)".into(),
            ));
        }
    }
    for procs in &spec.cgroup_procs {
        fs::write(procs, "0")
            .map_err(|e| SysError::os(format!("join cgroup {}", procs.display()), e))?;
    }
    // A cgroup move waits for an RCU grace period when none ran lately (ADR 0014).
    phase("cgroup-join");
    let agent = match spec.agent_memfd.as_deref().and_then(open_sealed) {
        Some(fd) => fd,
        None => sealed_agent(&spec.agent_path)?,
    };
    let listener = listen_socket(&spec.socket_path)?;
    phase("agent+socket");
    // A handle on the sandbox's cgroup2 directory by its host path. It never reaches the
    // agent (unless weakened): a directory fd of the host's mount namespace is a way out
    // through `/proc/self/fd/N/..`. The child mounts its own view of the cgroup (below)
    // and only uses this one to check that both are the same directory.
    let cgroup_fd = match &spec.cgroup_dir {
        Some(dir) => Some(
            crate::fs::openat2(None, dir, libc::O_PATH | libc::O_DIRECTORY, 0, 0)
                .map_err(|e| SysError::os(format!("open {}", dir.display()), e))?,
        ),
        None => None,
    };
    Ok(PreFork {
        agent,
        listener,
        cgroup_fd,
    })
}

/// The helper's ends of the pipes to the init.
struct InitPipes {
    ready_r: OwnedFd,
    go_w: OwnedFd,
    err_r: OwnedFd,
}

/// Enters the PID namespace and forks the init, which runs `body`.
/// `parent_only` is closed in the child and handed back to the caller.
fn fork_init(
    spec: &JailSpec,
    pre: PreFork,
    parent_only: Option<OwnedFd>,
    body: impl FnOnce(
        &JailSpec,
        &OwnedFd,
        &OwnedFd,
        Option<OwnedFd>,
        OwnedFd,
        OwnedFd,
    ) -> Result<init::Never>,
) -> Result<(i32, InitPipes, Option<OwnedFd>)> {
    let PreFork {
        agent,
        listener,
        mut cgroup_fd,
    } = pre;
    // Only the PID namespace is entered here (it applies to the next child); the child
    // makes the others, so the helper stays in the host's mount namespace and can write
    // the child's id maps through the host's /proc.
    if !weakened(spec, "shared-pidns") {
        raw::process::unshare(libc::CLONE_NEWPID)
            .map_err(|e| SysError::os("unshare pid namespace", e))?;
    }

    // child -> parent: "the user namespace exists, write my maps"; then errors, if any.
    let (ready_r, ready_w) = pipe()?;
    // parent -> child: "maps written".
    let (go_r, go_w) = pipe()?;
    // child -> parent: error text; EOF without data means the agent was exec'd.
    let (err_r, err_w) = pipe()?;

    // The launch helper is single-threaded; the fork refuses otherwise (F10), since the
    // child runs ordinary Rust code.
    let forked = raw::process::fork_single_threaded()
        .map_err(|e| SysError::os("fork the sandbox init", e))?;
    let Forked::Parent(pid) = forked else {
        drop(ready_r);
        drop(go_w);
        drop(err_r);
        drop(parent_only);
        let err = match body(spec, &agent, &listener, cgroup_fd.take(), ready_w, go_r) {
            Ok(never) => match never {},
            Err(e) => e,
        };
        let mut f = fs::File::from(err_w);
        let text = match &err {
            SysError::Refused(m) => format!("{REFUSED_PREFIX}{m}"),
            other => other.to_string(),
        };
        let _ = f.write_all(text.as_bytes());
        // Ends the child without running the parent's atexit handlers.
        raw::process::exit_now(1)
    };
    drop(ready_w);
    drop(go_r);
    drop(err_w);
    drop(agent);
    drop(listener);
    drop(cgroup_fd);
    phase("fork");
    Ok((
        pid,
        InitPipes {
            ready_r,
            go_w,
            err_r,
        },
        parent_only,
    ))
}

/// Waits for the init's user namespace, writes its maps, lets it exec the agent and
/// reads its verdict. On error the init is killed and reaped.
fn after_fork(spec: &JailSpec, pid: i32, pipes: InitPipes) -> Result<i32> {
    let InitPipes {
        ready_r,
        go_w,
        err_r,
    } = pipes;
    let result = (|| {
        let mut byte = [0u8; 1];
        let mut rf = fs::File::from(ready_r);
        match rf.read(&mut byte) {
            Ok(1) => {}
            _ => {
                return Err(SysError::Other(format!(
                    "sandbox setup failed: {}",
                    String::from_utf8_lossy(&read_all(err_r))
                )))
            }
        }
        // The child has its namespaces, disk, overlay root and pivot, and its user ns.
        phase("root");
        if !weakened(spec, "host-userns") {
            let map = format!("0 {} {}\n", spec.id_base, ID_RANGE);
            fs::write(format!("/proc/{pid}/uid_map"), &map)
                .map_err(|e| SysError::os("write uid_map", e))?;
            fs::write(format!("/proc/{pid}/gid_map"), &map)
                .map_err(|e| SysError::os("write gid_map", e))?;
        }
        let mut gf = fs::File::from(go_w);
        gf.write_all(b"g")
            .map_err(|e| SysError::os("signal the sandbox init", e))?;
        drop(gf);
        let err = read_all(err_r);
        phase("agent-exec");
        if !err.is_empty() {
            let text = String::from_utf8_lossy(&err);
            if let Some(m) = text.strip_prefix(REFUSED_PREFIX) {
                return Err(SysError::Refused(m.to_string()));
            }
            return Err(SysError::Other(format!("sandbox setup failed: {text}")));
        }
        Ok(())
    })();
    if let Err(e) = result {
        // Our own child: killed and reaped.
        let _ = raw::process::kill(pid, libc::SIGKILL);
        let _ = raw::process::waitpid(pid, 0);
        return Err(e);
    }
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::rootfs::relative_to;
    use super::*;

    #[test]
    fn relative_paths() {
        let r = |a: &str, b: &str| relative_to(Path::new(a), Path::new(b));
        assert_eq!(
            r("/r/sandboxes/x", "/r/sandboxes/x/upper"),
            Path::new("upper")
        );
        assert_eq!(
            r("/r/sandboxes/x", "/r/images/host"),
            Path::new("../../images/host")
        );
        assert_eq!(r("/r/sandboxes/x", "/usr"), Path::new("../../../usr"));
        assert_eq!(r("/a", "/a"), Path::new("."));
    }

    #[test]
    fn spec_round_trips_as_json() {
        for disk in [false, true] {
            let spec = super::rootfs::tests::spec(disk);
            let back: JailSpec =
                serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
            assert_eq!(back, spec);
        }
    }

    #[test]
    fn launch_spec_net_egress_is_off_unless_set_and_changes_no_byte_when_off() {
        let jail: JailSpec = serde_json::from_str(
            r#"{"hostname":"t","id_base":1000000,"lower":[],"upper":"/u","work":"/w",
                "rootfs":"/r","binds":[],"agent_path":"/x","socket_path":"/s",
                "cgroup_procs":[],"cgroup_dir":null,"tmpfs_bytes":1,"nofile":1024}"#,
        )
        .unwrap();
        let sent = serde_json::to_string(&jail).unwrap();
        // What the daemon sends today is a launch spec without egress...
        let read: LaunchSpec = serde_json::from_str(&sent).unwrap();
        assert_eq!(read.egress, None);
        assert_eq!(read.jail, jail);
        // ...and a launch spec without egress is that same JSON, byte for byte.
        assert_eq!(serde_json::to_string(&read).unwrap(), sent);
        let on = LaunchSpec {
            jail: jail.clone(),
            egress: Some(crate::net::EgressConfig::default()),
        };
        let text = serde_json::to_string(&on).unwrap();
        assert!(
            text.contains(r#""egress":{"redirect_port":1,"dns_addr":"127.0.0.53:53"}"#),
            "{text}"
        );
        let back: LaunchSpec = serde_json::from_str(&text).unwrap();
        assert_eq!(back, on);
    }

    #[test]
    fn launch_with_bad_egress_is_refused_before_anything_is_made() {
        let jail: JailSpec = serde_json::from_str(
            r#"{"hostname":"t","id_base":1000000,"lower":[],"upper":"/u","work":"/w",
                "rootfs":"/r","binds":[],"agent_path":"/x","socket_path":"/nonexistent/s",
                "cgroup_procs":["/nonexistent/cgroup.procs"],"cgroup_dir":null,
                "tmpfs_bytes":1,"nofile":1024}"#,
        )
        .unwrap();
        let bad = crate::net::EgressConfig {
            redirect_port: 8080,
            ..Default::default()
        };
        let err = launch_with(&jail, Some(&bad)).unwrap_err().to_string();
        assert!(err.contains("redirect port 8080"), "{err}");
    }
}
