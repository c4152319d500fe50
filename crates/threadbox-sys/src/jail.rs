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

use crate::{Result, SysError};
use serde::{Deserialize, Serialize};
use std::ffi::{CString, OsStr};
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
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
    pub upper: PathBuf,
    pub work: PathBuf,
    /// The sandbox's disk image (ext4): mounted by the helper, in the sandbox's mount
    /// namespace only, on the parent directory of `upper` and `work` (ADR 0011).
    #[serde(default)]
    pub disk_image: Option<PathBuf>,
    /// Host uid/gid that owns `home/user` when the helper creates a fresh upper.
    #[serde(default)]
    pub home_owner: u32,
    /// Empty directory the overlay is mounted on.
    pub rootfs: PathBuf,
    pub binds: Vec<Bind>,
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
    /// Test-only weakenings (see `testhooks`); absent from release builds.
    #[cfg(feature = "insecure-test-hooks")]
    #[serde(default)]
    pub test_weaken: Vec<String>,
}

#[cfg(feature = "insecure-test-hooks")]
fn weakened(spec: &JailSpec, w: &str) -> bool {
    spec.test_weaken.iter().any(|x| x == w)
}

#[cfg(not(feature = "insecure-test-hooks"))]
fn weakened(_spec: &JailSpec, _w: &str) -> bool {
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
}

/// Paths under `/proc` hidden behind `/dev/null` or an empty read-only tmpfs.
const MASKED_PROC: &[&str] = &[
    "kcore",
    "keys",
    "key-users",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "sysrq-trigger",
    "acpi",
    "scsi",
    "asound",
    "firmware",
    "interrupts",
    "kallsyms",
    "modules",
    "vmallocinfo",
    "buddyinfo",
    "pagetypeinfo",
    "zoneinfo",
    "slabinfo",
    "mtrr",
];
/// Paths under `/proc` made read-only.
const READONLY_PROC: &[&str] = &[
    "sys", "irq", "bus", "fs", "sysvipc", "driver", "tty", "pressure",
];
/// Device nodes bound from the host into the sandbox's `/dev`.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Entry point of `threadbox __jail-launch`. Reads a [`JailSpec`] from stdin, prints a
/// [`LaunchReport`], returns the process exit code. Must run in a single-threaded process.
pub fn helper_main() -> i32 {
    let report = match run_helper() {
        Ok(pid) => LaunchReport {
            ok: true,
            agent_pid: Some(pid),
            error: None,
            refused: false,
        },
        Err(e) => LaunchReport {
            ok: false,
            agent_pid: None,
            refused: matches!(e, SysError::Refused(_)),
            error: Some(e.to_string()),
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
    let spec: JailSpec =
        serde_json::from_str(&input).map_err(|e| SysError::Other(format!("bad jail spec: {e}")))?;
    launch(&spec)
}

fn cstr(p: impl AsRef<OsStr>) -> Result<CString> {
    CString::new(p.as_ref().as_bytes())
        .map_err(|_| SysError::Other("path contains a NUL byte".into()))
}

fn check(ret: libc::c_int, what: impl FnOnce() -> String) -> Result<()> {
    if ret < 0 {
        Err(SysError::last(what()))
    } else {
        Ok(())
    }
}

fn mount(
    src: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<()> {
    let src_c = src.map(cstr).transpose()?;
    let target_c = cstr(target)?;
    let fstype_c = fstype.map(cstr).transpose()?;
    let data_c = data.map(cstr).transpose()?;
    // SAFETY: all pointers are either null or point to NUL-terminated strings that live
    // until the call returns.
    let ret = unsafe {
        libc::mount(
            src_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            target_c.as_ptr(),
            fstype_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            flags,
            data_c
                .as_ref()
                .map_or(std::ptr::null(), |c| c.as_ptr() as *const libc::c_void),
        )
    };
    check(ret, || {
        format!("mount {} ({})", target.display(), fstype.unwrap_or("bind"))
    })
}

/// Bind-mounts `src` on `target` read-only, nosuid, nodev.
fn bind_ro(src: &Path, target: &Path) -> Result<()> {
    mount(Some(src), target, None, libc::MS_BIND | libc::MS_REC, None)?;
    mount(
        None,
        target,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
        None,
    )
}

/// Copies the agent binary into a sealed memfd, so nothing in a sandbox can ever write
/// to the copy it executes (nor, through /proc/self/exe, to the host's file).
pub fn sealed_agent(path: &Path) -> Result<OwnedFd> {
    let bytes =
        fs::read(path).map_err(|e| SysError::os(format!("read agent {}", path.display()), e))?;
    let name = cstr("threadbox-agent")?;
    // SAFETY: name is a valid C string; the returned fd is checked and then owned.
    let fd =
        unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    check(fd, || "memfd_create".into())?;
    // SAFETY: fd was just returned by memfd_create and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = fs::File::from(owned);
    file.write_all(&bytes)
        .map_err(|e| SysError::os("fill agent memfd", e))?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a valid fd with integer arguments.
    let ret = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) };
    check(ret, || "seal agent memfd".into())?;
    Ok(OwnedFd::from(file))
}

/// Opens an agent memfd made by [`sealed_agent`] (through `/proc/<pid>/fd/<n>`), only if
/// it is sealed against any write, shrink or growth: a sandbox's agent never runs from a
/// file that can change.
fn open_sealed(path: &Path) -> Option<OwnedFd> {
    let file = fs::File::open(path).ok()?;
    // SAFETY: fcntl on a valid fd with an integer command.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    (seals >= 0 && seals & need == need).then(|| OwnedFd::from(file))
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
    let mut fds = [0; 2];
    // SAFETY: fds points to two writable ints.
    let ret = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    check(ret, || "pipe2".into())?;
    // SAFETY: both fds were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn read_all(fd: OwnedFd) -> Vec<u8> {
    let mut f = fs::File::from(fd);
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    buf
}

/// Builds the sandbox and returns the host pid of its agent.
pub fn launch(spec: &JailSpec) -> Result<i32> {
    for procs in &spec.cgroup_procs {
        fs::write(procs, "0")
            .map_err(|e| SysError::os(format!("join cgroup {}", procs.display()), e))?;
    }
    let agent = match spec.agent_memfd.as_deref().and_then(open_sealed) {
        Some(fd) => fd,
        None => sealed_agent(&spec.agent_path)?,
    };
    let listener = listen_socket(&spec.socket_path)?;
    // A handle on the sandbox's cgroup2 directory by its host path. It never reaches the
    // agent (unless weakened): a directory fd of the host's mount namespace is a way out
    // through `/proc/self/fd/N/..`. The child mounts its own view of the cgroup (below)
    // and only uses this one to check that both are the same directory.
    let mut cgroup_fd = match &spec.cgroup_dir {
        Some(dir) => Some(
            crate::child::openat2(None, dir, libc::O_PATH | libc::O_DIRECTORY, 0, 0)
                .map_err(|e| SysError::os(format!("open {}", dir.display()), e))?,
        ),
        None => None,
    };

    // Only the PID namespace is entered here (it applies to the next child); the child
    // makes the others, so the helper stays in the host's mount namespace and can write
    // the child's id maps through the host's /proc.
    if !weakened(spec, "shared-pidns") {
        // SAFETY: unshare takes integer flags; this process is single-threaded.
        check(unsafe { libc::unshare(libc::CLONE_NEWPID) }, || {
            "unshare pid namespace".into()
        })?;
    }

    // child -> parent: "the user namespace exists, write my maps"; then errors, if any.
    let (ready_r, ready_w) = pipe()?;
    // parent -> child: "maps written".
    let (go_r, go_w) = pipe()?;
    // child -> parent: error text; EOF without data means the agent was exec'd.
    let (err_r, err_w) = pipe()?;

    // SAFETY: this process is single-threaded (the launch helper), so the child may do
    // anything a normal process does.
    let pid = unsafe { libc::fork() };
    check(pid, || "fork the sandbox init".into())?;
    if pid == 0 {
        drop(ready_r);
        drop(go_w);
        drop(err_r);
        let err = match sandbox_init(spec, &agent, &listener, cgroup_fd.take(), ready_w, go_r) {
            Ok(never) => match never {},
            Err(e) => e,
        };
        let mut f = fs::File::from(err_w);
        let text = match &err {
            SysError::Refused(m) => format!("{REFUSED_PREFIX}{m}"),
            other => other.to_string(),
        };
        let _ = f.write_all(text.as_bytes());
        // SAFETY: _exit ends the child without running the parent's atexit handlers.
        unsafe { libc::_exit(1) };
    }
    drop(ready_w);
    drop(go_r);
    drop(err_w);
    drop(agent);
    drop(listener);
    drop(cgroup_fd);

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
        // SAFETY: kill and waitpid on our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        return Err(e);
    }
    Ok(pid)
}

enum Never {}

/// Runs in the sandbox's PID 1 (still host root): filesystem, network, user namespace,
/// then exec of the agent. Returns only on error.
fn sandbox_init(
    spec: &JailSpec,
    agent: &OwnedFd,
    listener: &OwnedFd,
    cgroup_fd: Option<OwnedFd>,
    ready_w: OwnedFd,
    go_r: OwnedFd,
) -> Result<Never> {
    // The agent's log lives next to its socket, outside the sandbox root.
    let log_path = spec.socket_path.with_file_name("agent.log");
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| SysError::os(format!("open {}", log_path.display()), e))?;
    let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWCGROUP;
    if !weakened(spec, "shared-netns") {
        flags |= libc::CLONE_NEWNET;
    }
    if !weakened(spec, "shared-ipcns") {
        flags |= libc::CLONE_NEWIPC;
    }
    // SAFETY: unshare takes integer flags; this process is single-threaded.
    check(unsafe { libc::unshare(flags) }, || {
        "unshare namespaces".into()
    })?;
    // The agent's cgroup directory: the root of a cgroup2 mount made in the new cgroup
    // namespace (so it *is* the sandbox's cgroup) and never attached anywhere. `..` at the
    // root of a detached mount stays there, so no path through this fd leads further.
    let cgroup_fd = match cgroup_fd {
        Some(host) if !weakened(spec, "host-cgroup-fd") => Some(detached_cgroup(host)?),
        other => other.map(|fd| reopen_dir(&fd)).transpose()?,
    };
    build_root(spec)?;
    set_hostname(&spec.hostname)?;
    if !weakened(spec, "shared-netns") {
        loopback_up()?;
    }
    pivot(&spec.rootfs)?;

    if !weakened(spec, "host-userns") {
        if !weakened(spec, "root-owned-userns") {
            own_userns_by(spec.id_base)?;
        }
        // SAFETY: unshare with an integer flag; this process is single-threaded.
        check(unsafe { libc::unshare(libc::CLONE_NEWUSER) }, || {
            "unshare user namespace".into()
        })?;
    }
    let mut w = fs::File::from(ready_w);
    w.write_all(b"r")
        .map_err(|e| SysError::os("signal the helper", e))?;
    drop(w);
    let mut byte = [0u8; 1];
    let mut r = fs::File::from(go_r);
    if r.read(&mut byte).ok() != Some(1) {
        return Err(SysError::Other(
            "the helper did not write the id maps".into(),
        ));
    }
    // Become uid/gid 0 of the new namespace (= the unprivileged host base id).
    // SAFETY: plain id-setting syscalls; we hold CAP_SETUID/SETGID (and CAP_SETPCAP, for
    // the secure bits set by `own_userns_by`) in the new namespace.
    unsafe {
        check(libc::prctl(libc::PR_SET_SECUREBITS, 0, 0, 0, 0), || {
            "reset the secure bits".into()
        })?;
        check(libc::setgroups(0, std::ptr::null()), || "setgroups".into())?;
        check(libc::setresgid(0, 0, 0), || "setresgid".into())?;
        check(libc::setresuid(0, 0, 0), || "setresuid".into())?;
    }
    if !weakened(spec, "no-nofile-limit") {
        set_rlimits(spec.nofile)?;
    }

    // Fixed fd numbers for the agent: 0 = /dev/null, 1 and 2 = its log, 3 = listening
    // socket, 4 = cgroup dir. Move everything above 10 first so no dup2 clobbers another.
    let agent_fd = dup_above(agent.as_raw_fd(), 10)?;
    let listen_fd = dup_above(listener.as_raw_fd(), 10)?;
    let cg_fd = cgroup_fd
        .as_ref()
        .map(|cg| dup_above(cg.as_raw_fd(), 10))
        .transpose()?;
    let null = fs::File::open("/dev/null").map_err(|e| SysError::os("open /dev/null", e))?;
    let null_fd = dup_above(null.as_raw_fd(), 10)?;
    let log_fd = dup_above(log.as_raw_fd(), 10)?;
    dup_to(null_fd, 0)?;
    dup_to(log_fd, 1)?;
    dup_to(log_fd, 2)?;
    dup_to(listen_fd, 3)?;
    let mut args: Vec<CString> = vec![cstr("threadbox-agent")?, cstr("--listen-fd")?, cstr("3")?];
    #[cfg(feature = "insecure-test-hooks")]
    if !spec.test_weaken.is_empty() {
        args.push(cstr("--test-weaken")?);
        args.push(cstr(spec.test_weaken.join(","))?);
    }
    // Fail closed: Landlock is one of the documented layers. The agent checks again (it
    // builds the ruleset); checking here gives the create a clear error.
    let landlock = if weakened(spec, "no-landlock-kernel") {
        Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    } else {
        crate::landlock::abi_version()
    };
    if let Err(e) = landlock {
        if !spec.allow_no_landlock {
            return Err(SysError::Refused(format!(
                "Landlock is not available on this kernel ({e}): refusing to start a sandbox \
                 without it (the operator may allow it: serve --insecure-allow-no-landlock)"
            )));
        }
    }
    if spec.allow_no_landlock {
        args.push(cstr("--allow-no-landlock")?);
    }
    if let Some(cg) = cg_fd {
        dup_to(cg, 4)?;
        args.push(cstr("--cgroup-fd")?);
        args.push(cstr("4")?);
    }
    // Close everything else the helper inherited.
    // SAFETY: close_range on numbers we do not use any more.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            5u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let empty = cstr("")?;
    // SAFETY: argv and envp are NULL-terminated arrays of valid C strings that outlive
    // the call; on success the call does not return.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            agent_fd,
            empty.as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        );
    }
    Err(SysError::last("exec the agent"))
}

/// Makes the next user namespace belong to the host uid/gid `id` instead of root.
///
/// The kernel charges what it counts per user — inotify instances and watches, pending
/// signals, POSIX message queue bytes, user namespaces — at every level of the namespace
/// tree, and above the sandbox's own level to the *owner* of its namespace. Owned by root,
/// every sandbox would share host root's budget (128 inotify instances here): one sandbox
/// could take them from all others and from the host's own root services. Owned by the
/// sandbox's base uid, each sandbox has its own budget.
///
/// Only the effective ids change, with `SECBIT_NO_SETUID_FIXUP` so the capabilities stay
/// (creating the namespace then is a privileged operation, which restrictive hosts
/// require); the real and saved ids stay 0 until the maps are written.
fn own_userns_by(id: u32) -> Result<()> {
    const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
    // SAFETY: prctl and id-setting syscalls with integer arguments; single-threaded.
    unsafe {
        check(
            libc::prctl(libc::PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP, 0, 0, 0),
            || "set the secure bits".into(),
        )?;
        check(
            libc::syscall(libc::SYS_setresgid, u32::MAX, id, u32::MAX) as libc::c_int,
            || "set the effective gid".into(),
        )?;
        check(
            libc::syscall(libc::SYS_setresuid, u32::MAX, id, u32::MAX) as libc::c_int,
            || "set the effective uid".into(),
        )?;
    }
    Ok(())
}

/// Mounts cgroup2 in the current (new) cgroup namespace as a detached mount
/// (`fsopen`/`fsmount`, attached nowhere) and returns a directory fd on its root, after
/// checking that it is the directory `host` names.
fn detached_cgroup(host: OwnedFd) -> Result<OwnedFd> {
    let fstype = cstr("cgroup2")?;
    // SAFETY: NUL-terminated name and integer flags.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), 1u32) }; // FSOPEN_CLOEXEC
    check(fs as libc::c_int, || "fsopen cgroup2".into())?;
    // SAFETY: a new fd owned by nobody else.
    let fs = unsafe { OwnedFd::from_raw_fd(fs as RawFd) };
    // SAFETY: FSCONFIG_CMD_CREATE (6) takes no key or value.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            6u32,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    check(rc as libc::c_int, || "create the cgroup2 mount".into())?;
    // FSMOUNT_CLOEXEC (1); nosuid, nodev, noexec (MOUNT_ATTR_* 0x2|0x4|0x8).
    // SAFETY: integer arguments on the fd just configured.
    let mnt = unsafe { libc::syscall(libc::SYS_fsmount, fs.as_raw_fd(), 1u32, 0xeu32) };
    check(mnt as libc::c_int, || "fsmount cgroup2".into())?;
    // SAFETY: a new fd owned by nobody else.
    let mnt = unsafe { OwnedFd::from_raw_fd(mnt as RawFd) };
    // The mount fd is an O_PATH handle; the agent needs a directory it can read.
    let dir = reopen_dir(&mnt)?;
    let same = |a: &OwnedFd, b: &OwnedFd| -> Result<bool> {
        let st = |fd: &OwnedFd| {
            // SAFETY: stat is plain data; zeroed is a valid value.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: valid fd and out-pointer.
            check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, || {
                "fstat a cgroup directory".into()
            })?;
            Ok::<_, SysError>((st.st_dev, st.st_ino))
        };
        Ok(st(a)? == st(b)?)
    };
    if !same(&dir, &host)? {
        return Err(SysError::Other(
            "the cgroup namespace's root is not the sandbox's cgroup".into(),
        ));
    }
    Ok(dir)
}

/// `openat(fd, ".", O_RDONLY | O_DIRECTORY)`: a readable directory fd for a handle.
fn reopen_dir(fd: &OwnedFd) -> Result<OwnedFd> {
    crate::child::openat2(
        Some(fd.as_fd()),
        Path::new("."),
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
        0,
    )
    .map_err(|e| SysError::os("open the cgroup directory", e))
}

fn dup_to(fd: RawFd, target: RawFd) -> Result<()> {
    if fd == target {
        // Clear close-on-exec so the agent inherits it.
        // SAFETY: fcntl with integer arguments on an fd we own.
        check(unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }, || {
            "fcntl".into()
        })?;
        return Ok(());
    }
    // SAFETY: dup2 on valid fd numbers; the new fd has no CLOEXEC.
    check(unsafe { libc::dup2(fd, target) }, || {
        format!("dup2 to {target}")
    })
}

fn dup_above(fd: RawFd, min: RawFd) -> Result<RawFd> {
    // SAFETY: fcntl F_DUPFD_CLOEXEC with integer arguments.
    let n = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, min) };
    check(n, || "dup agent fd".into())?;
    Ok(n)
}

fn set_rlimits(nofile: u64) -> Result<()> {
    let lim = |res, v: u64| {
        let r = libc::rlimit {
            rlim_cur: v,
            rlim_max: v,
        };
        // SAFETY: r is a valid rlimit struct.
        unsafe { libc::setrlimit(res, &r) }
    };
    // Lowering limits needs no privilege; failures to raise are ignored.
    lim(libc::RLIMIT_CORE, 0);
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: cur is a valid rlimit struct to fill.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut cur) };
    let want = nofile.min(cur.rlim_max);
    check(lim(libc::RLIMIT_NOFILE, want), || "setrlimit NOFILE".into())
}

fn mkdir_p(p: &Path) -> Result<()> {
    fs::create_dir_all(p).map_err(|e| SysError::os(format!("mkdir {}", p.display()), e))
}

fn inside(root: &Path, p: &Path) -> PathBuf {
    root.join(p.strip_prefix("/").unwrap_or(p))
}

/// `struct loop_config` of LOOP_CONFIGURE (linux/loop.h).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: [u8; 232],
    reserved: [u64; 8],
}

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// Offset of `lo_flags` in `struct loop_info64`.
const LO_FLAGS_OFFSET: usize = 52;

/// Attaches `image` to a free loop device with autoclear: the device is released as soon
/// as its last user (our mount, in the sandbox's mount namespace) is gone.
fn attach_loop(image: &Path) -> Result<(OwnedFd, PathBuf)> {
    let backing = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|e| SysError::os(format!("open {}", image.display()), e))?;
    let ctl = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
        .map_err(|e| SysError::os("open /dev/loop-control", e))?;
    // Another helper may take the same free device between GET_FREE and CONFIGURE.
    for _ in 0..32 {
        // SAFETY: ioctl with an integer request and no argument on an fd we own.
        let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
        check(n, || "LOOP_CTL_GET_FREE".into())?;
        let dev = PathBuf::from(format!("/dev/loop{n}"));
        let loopf = match fs::OpenOptions::new().read(true).write(true).open(&dev) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(SysError::os(format!("open {}", dev.display()), e)),
        };
        let mut cfg = LoopConfig {
            fd: backing.as_raw_fd() as u32,
            block_size: 0,
            info: [0; 232],
            reserved: [0; 8],
        };
        cfg.info[LO_FLAGS_OFFSET..LO_FLAGS_OFFSET + 4]
            .copy_from_slice(&LO_FLAGS_AUTOCLEAR.to_ne_bytes());
        // SAFETY: `cfg` is a valid loop_config that lives for the call; the kernel only
        // reads it.
        let rc = unsafe { libc::ioctl(loopf.as_raw_fd(), LOOP_CONFIGURE, &cfg) };
        if rc == 0 {
            return Ok((OwnedFd::from(loopf), dev));
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EBUSY) {
            return Err(SysError::os(
                format!("LOOP_CONFIGURE {}", dev.display()),
                err,
            ));
        }
    }
    Err(SysError::Other("no free loop device".into()))
}

/// Mounts the sandbox's disk image on the parent of `upper` (in this, the sandbox's, mount
/// namespace) and prepares upper/work inside it.
fn mount_disk(image: &Path, spec: &JailSpec) -> Result<()> {
    let target = spec
        .upper
        .parent()
        .ok_or_else(|| SysError::Other("upper has no parent".into()))?;
    let (loopfd, dev) = attach_loop(image)?;
    mount(
        Some(&dev),
        target,
        Some("ext4"),
        libc::MS_NOSUID | libc::MS_NODEV,
        None,
    )?;
    // The mount holds the device now; autoclear detaches it when the mount goes away.
    drop(loopfd);
    // Inodes held back for this boot: ext4 reserves blocks for root but no inodes, and
    // overlayfs needs a few in its workdir at mount time, even when the sandbox has
    // used up every other inode. Refilled by `refill_inode_reserve` after the mount.
    let reserve = target.join(INODE_RESERVE_DIR);
    if reserve.is_dir() {
        fs::remove_dir_all(&reserve)
            .map_err(|e| SysError::os(format!("clear {}", reserve.display()), e))?;
    }
    // A previous agent's workdir may hold leftovers overlayfs refuses to reuse.
    if spec.work.exists() {
        fs::remove_dir_all(&spec.work)
            .map_err(|e| SysError::os(format!("clear {}", spec.work.display()), e))?;
    }
    mkdir_p(&spec.work)?;
    if !spec.upper.exists() {
        let home = spec.upper.join("home/user");
        mkdir_p(&home)?;
        std::os::unix::fs::chown(&home, Some(spec.home_owner), Some(spec.home_owner))
            .map_err(|e| SysError::os("chown home/user", e))?;
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&home, fs::Permissions::from_mode(0o755))
            .map_err(|e| SysError::os("chmod home/user", e))?;
    }
    Ok(())
}

/// Directory in the root of a sandbox's disk image (outside upper/work, so invisible
/// inside) holding placeholder files whose inodes the next boot may use.
const INODE_RESERVE_DIR: &str = "inode-reserve";
const INODE_RESERVE: usize = 32;

/// Best effort: takes back up to [`INODE_RESERVE`] inodes for the next boot.
fn refill_inode_reserve(spec: &JailSpec) {
    let Some(disk) = spec.upper.parent() else {
        return;
    };
    let reserve = disk.join(INODE_RESERVE_DIR);
    if fs::create_dir_all(&reserve).is_err() {
        return;
    }
    for i in 0..INODE_RESERVE {
        if fs::write(reserve.join(i.to_string()), b"").is_err() {
            return;
        }
    }
}

/// `target` as a path relative to `base` (both absolute), using `..` where needed.
fn relative_to(base: &Path, target: &Path) -> PathBuf {
    let b: Vec<_> = base.components().collect();
    let t: Vec<_> = target.components().collect();
    let common = b.iter().zip(&t).take_while(|(x, y)| x == y).count();
    let mut out = PathBuf::new();
    for _ in common..b.len() {
        out.push("..");
    }
    for c in &t[common..] {
        out.push(c);
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

fn build_root(spec: &JailSpec) -> Result<()> {
    let root = &spec.rootfs;
    // Nothing we mount here may propagate back to the host.
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )?;

    if let Some(image) = &spec.disk_image {
        mount_disk(image, spec)?;
    }

    // The options are mounted relative to the sandbox's directory: overlayfs shows them
    // verbatim in /proc/self/mountinfo, which must not reveal host paths.
    let base = spec.upper.parent().unwrap_or(Path::new("/"));
    std::env::set_current_dir(base)
        .map_err(|e| SysError::os(format!("chdir {}", base.display()), e))?;
    let lower = spec
        .lower
        .iter()
        .map(|p| relative_to(base, p).display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower,
        relative_to(base, &spec.upper).display(),
        relative_to(base, &spec.work).display()
    );
    let overlay_flags = if weakened(spec, "suid") {
        libc::MS_NODEV
    } else {
        libc::MS_NOSUID | libc::MS_NODEV
    };
    mount(
        Some(Path::new("overlay")),
        root,
        Some("overlay"),
        overlay_flags,
        Some(&opts),
    )?;
    if spec.disk_image.is_some() {
        refill_inode_reserve(spec);
    }

    for b in &spec.binds {
        let t = inside(root, &b.target);
        if b.source.is_dir() {
            mkdir_p(&t)?;
        } else if !t.exists() {
            if let Some(parent) = t.parent() {
                mkdir_p(parent)?;
            }
            fs::write(&t, b"").map_err(|e| SysError::os(format!("create {}", t.display()), e))?;
        }
        bind_ro(&b.source, &t)?;
    }

    // /proc, fresh for the new PID namespace, with the dangerous parts masked.
    let proc_dir = root.join("proc");
    mkdir_p(&proc_dir)?;
    mount(
        Some(Path::new("proc")),
        &proc_dir,
        Some("proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )?;
    let mask_proc = !weakened(spec, "no-proc-mask");
    for name in READONLY_PROC.iter().filter(|_| mask_proc) {
        let p = proc_dir.join(name);
        if p.exists() {
            bind_ro(&p, &p)?;
        }
    }
    for name in MASKED_PROC.iter().filter(|_| mask_proc) {
        let p = proc_dir.join(name);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => mount(
                Some(Path::new("tmpfs")),
                &p,
                Some("tmpfs"),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                Some("size=0,mode=555"),
            )?,
            Ok(_) => mount(Some(Path::new("/dev/null")), &p, None, libc::MS_BIND, None)?,
            Err(_) => {}
        }
    }

    // A minimal /dev.
    let dev = root.join("dev");
    mkdir_p(&dev)?;
    mount(
        Some(Path::new("tmpfs")),
        &dev,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("size=64k,mode=755"),
    )?;
    for d in DEVICES {
        let t = dev.join(d);
        fs::write(&t, b"").map_err(|e| SysError::os(format!("create {}", t.display()), e))?;
        mount(
            Some(&Path::new("/dev").join(d)),
            &t,
            None,
            libc::MS_BIND,
            None,
        )?;
        mount(
            None,
            &t,
            None,
            libc::MS_BIND | libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NOEXEC,
            None,
        )?;
    }
    let pts = dev.join("pts");
    mkdir_p(&pts)?;
    let pts_opts = format!(
        "newinstance,ptmxmode=0666,mode=0620,gid={}",
        spec.id_base + 5
    );
    mount(
        Some(Path::new("devpts")),
        &pts,
        Some("devpts"),
        libc::MS_NOSUID | libc::MS_NOEXEC,
        Some(&pts_opts),
    )?;
    let shm = dev.join("shm");
    mkdir_p(&shm)?;
    let shm_opts = format!("size={},mode=1777", spec.tmpfs_bytes);
    mount(
        Some(Path::new("tmpfs")),
        &shm,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(&shm_opts),
    )?;
    for (link, target) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, dev.join(link))
            .map_err(|e| SysError::os(format!("symlink /dev/{link}"), e))?;
    }
    mount(
        None,
        &dev,
        None,
        libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NOEXEC,
        Some("size=64k,mode=755"),
    )?;

    if weakened(spec, "host-dev") {
        mount(
            Some(Path::new("/dev")),
            &dev,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )?;
    }
    if weakened(spec, "bind-host-tmp") {
        let t = root.join("host-tmp");
        mkdir_p(&t)?;
        mount(
            Some(Path::new("/tmp")),
            &t,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        )?;
    }

    // /tmp: writable, charged to the sandbox's memory limit.
    let tmp = root.join("tmp");
    mkdir_p(&tmp)?;
    let tmp_opts = format!("size={},mode=1777", spec.tmpfs_bytes);
    mount(
        Some(Path::new("tmpfs")),
        &tmp,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&tmp_opts),
    )?;
    Ok(())
}

fn set_hostname(name: &str) -> Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes.
    let ret = unsafe { libc::sethostname(name.as_ptr() as *const libc::c_char, name.len()) };
    check(ret, || "sethostname".into())
}

/// Brings `lo` up in the new network namespace: the only interface a sandbox has.
fn loopback_up() -> Result<()> {
    // SAFETY: socket with integer arguments; the fd is owned right after the check.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    check(fd, || "socket for ioctl".into())?;
    // SAFETY: fd was just created.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS fills ifr, which is a valid ifreq.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) };
    check(ret, || "get lo flags".into())?;
    // SAFETY: reading and writing the flags member of the union set by the kernel.
    unsafe {
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads ifr, a valid ifreq.
    let ret = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) };
    check(ret, || "bring lo up".into())
}

fn pivot(root: &Path) -> Result<()> {
    let root_c = cstr(root)?;
    let dot = cstr(".")?;
    let slash = cstr("/")?;
    // SAFETY: valid C strings; pivot_root(".", ".") stacks the old root on the new one,
    // which we then detach, leaving no path to the host's filesystem.
    unsafe {
        check(libc::chdir(root_c.as_ptr()), || {
            "chdir to the new root".into()
        })?;
        check(
            libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) as libc::c_int,
            || "pivot_root".into(),
        )?;
        check(libc::umount2(dot.as_ptr(), libc::MNT_DETACH), || {
            "detach the old root".into()
        })?;
        check(libc::chdir(slash.as_ptr()), || "chdir /".into())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
        let spec = JailSpec {
            hostname: "t".into(),
            id_base: 1_000_000,
            lower: vec!["/a".into()],
            upper: "/u".into(),
            work: "/w".into(),
            disk_image: None,
            home_owner: 0,
            rootfs: "/r".into(),
            binds: vec![Bind {
                source: "/usr".into(),
                target: "/usr".into(),
            }],
            agent_path: "/x".into(),
            agent_memfd: None,
            socket_path: "/s".into(),
            cgroup_procs: vec![],
            cgroup_dir: None,
            tmpfs_bytes: 1,
            nofile: 1024,
            allow_no_landlock: false,
            #[cfg(feature = "insecure-test-hooks")]
            test_weaken: vec![],
        };
        let back: JailSpec = serde_json::from_str(&serde_json::to_string(&spec).unwrap()).unwrap();
        assert_eq!(back, spec);
    }
}
