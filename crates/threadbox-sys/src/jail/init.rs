//! The sandbox's PID 1, from fork to the exec of the agent (still host root): the
//! namespaces, the root filesystem ([`super::rootfs`]), the network, the user namespace
//! and the agent's fixed descriptors.

use super::{cstr, rootfs, weakened, JailSpec};
use crate::raw;
use crate::raw::process::CStrArray;
use crate::{Result, SysError};
use std::ffi::CString;
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::Path;

pub(super) enum Never {}

/// Runs in the sandbox's PID 1 (still host root): filesystem, network, user namespace,
/// then exec of the agent. Returns only on error.
pub(super) fn sandbox_init(
    spec: &JailSpec,
    egress: Option<&crate::net::EgressConfig>,
    agent: &OwnedFd,
    listener: &OwnedFd,
    cgroup_fd: Option<OwnedFd>,
    ready_w: OwnedFd,
    go_r: OwnedFd,
) -> Result<Never> {
    let (log, cgroup_fd) = enter_namespaces(spec, cgroup_fd)?;
    rootfs::build_root(&rootfs::Host, spec)?;
    set_hostname(&spec.hostname)?;
    network_up(spec, egress)?;
    finish(spec, agent, listener, cgroup_fd, log, ready_w, go_r)
}

/// What a staged init (ADR 0180) reads on its attach pipe: what tells one fork from
/// another, everything else being the slot's own.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct InitAttach {
    pub hostname: String,
    pub tmpfs_bytes: u64,
    pub disk_owner_base: Option<u32>,
    /// `/proc/<helper>/fd/<n>`: the idmap user namespace the helper made for this disk
    /// (the init, already in the sandbox's PID namespace, cannot make it itself).
    pub disk_userns_path: Option<std::path::PathBuf>,
}

/// A staged sandbox's PID 1 (ADR 0180): its namespaces, `lo` and the egress table are
/// made, then it blocks on `attach_r` until the helper sends the disk's attach (EOF: the
/// slot is being destroyed, it exits). From there on it runs what a cold boot runs from
/// the root filesystem on. Nothing of any disk is mounted, and nothing but this code
/// runs, before the attach.
#[allow(clippy::too_many_arguments)]
pub(super) fn staged_init(
    spec: &JailSpec,
    egress: Option<&crate::net::EgressConfig>,
    agent: &OwnedFd,
    listener: &OwnedFd,
    cgroup_fd: Option<OwnedFd>,
    ready_w: OwnedFd,
    go_r: OwnedFd,
    attach_r: OwnedFd,
) -> Result<Never> {
    let (log, cgroup_fd) = enter_namespaces(spec, cgroup_fd)?;
    network_up(spec, egress)?;
    let mut text = Vec::new();
    fs::File::from(attach_r)
        .read_to_end(&mut text)
        .map_err(|e| SysError::os("read the attach", e))?;
    if text.is_empty() {
        return Err(SysError::Other("the staged slot was closed".into()));
    }
    let attach: InitAttach =
        serde_json::from_slice(&text).map_err(|e| SysError::Other(format!("bad attach: {e}")))?;
    // Opened, not inherited: this process was forked before the namespace existed.
    let userns = match &attach.disk_userns_path {
        Some(p) => Some(OwnedFd::from(
            fs::File::open(p).map_err(|e| SysError::os("open the idmap namespace", e))?,
        )),
        None => None,
    };
    let spec = JailSpec {
        hostname: attach.hostname,
        tmpfs_bytes: attach.tmpfs_bytes,
        disk_owner_base: attach.disk_owner_base,
        disk_userns_fd: userns.as_ref().map(|fd| fd.as_raw_fd()),
        ..spec.clone()
    };
    rootfs::build_root(&rootfs::Host, &spec)?;
    set_hostname(&spec.hostname)?;
    drop(userns);
    finish(&spec, agent, listener, cgroup_fd, log, ready_w, go_r)
}

/// The sandbox's namespaces (all but PID, which the helper entered, and user, made last)
/// and the agent's view of its cgroup; returns the agent's log file too.
fn enter_namespaces(
    spec: &JailSpec,
    cgroup_fd: Option<OwnedFd>,
) -> Result<(fs::File, Option<OwnedFd>)> {
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
    raw::process::unshare(flags).map_err(|e| SysError::os("unshare namespaces", e))?;
    // The agent's cgroup directory: the root of a cgroup2 mount made in the new cgroup
    // namespace (so it *is* the sandbox's cgroup) and never attached anywhere. `..` at the
    // root of a detached mount stays there, so no path through this fd leads further.
    let cgroup_fd = match cgroup_fd {
        Some(host) if !weakened(spec, "host-cgroup-fd") => Some(detached_cgroup(host)?),
        other => other.map(|fd| reopen_dir(&fd)).transpose()?,
    };
    Ok((log, cgroup_fd))
}

/// `lo` up and the egress table, in the sandbox's own netns.
fn network_up(spec: &JailSpec, egress: Option<&crate::net::EgressConfig>) -> Result<()> {
    if !weakened(spec, "shared-netns") {
        loopback_up()?;
        // Still host root in the fresh netns, before the user namespace: the table and
        // the route belong to the host's user namespace, so nothing inside can change
        // them. Off by default (`launch_with` refuses it with a shared netns).
        if let Some(cfg) = egress {
            crate::net::install_egress(cfg)?;
        }
    }
    Ok(())
}

/// From the pivot to the exec of the agent.
fn finish(
    spec: &JailSpec,
    agent: &OwnedFd,
    listener: &OwnedFd,
    cgroup_fd: Option<OwnedFd>,
    log: fs::File,
    ready_w: OwnedFd,
    go_r: OwnedFd,
) -> Result<Never> {
    pivot(&spec.rootfs)?;

    if !weakened(spec, "host-userns") {
        if !weakened(spec, "root-owned-userns") {
            own_userns_by(spec.id_base)?;
        }
        raw::process::unshare(libc::CLONE_NEWUSER)
            .map_err(|e| SysError::os("unshare user namespace", e))?;
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
    // We hold CAP_SETUID/SETGID (and CAP_SETPCAP, for the secure bits set by
    // `own_userns_by`) in the new namespace. Raw system calls: this process has one thread,
    // so libc's broadcast to every thread would do the same.
    raw::process::prctl(libc::PR_SET_SECUREBITS, 0)
        .map_err(|e| SysError::os("reset the secure bits", e))?;
    raw::process::setgroups(&[]).map_err(|e| SysError::os("setgroups", e))?;
    raw::process::setresgid(0, 0, 0).map_err(|e| SysError::os("setresgid", e))?;
    raw::process::setresuid(0, 0, 0).map_err(|e| SysError::os("setresuid", e))?;
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
    // Close everything else the helper inherited (marked close-on-exec: nothing here
    // uses the numbers above 4 again, and what counts is what the agent inherits).
    let _ = raw::fd::close_range(5, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
    let argv = CStrArray::new(args.iter().map(|a| a.as_c_str()));
    let envp = CStrArray::new([]);
    let err = raw::process::execveat_fd(agent_fd, &argv, &envp);
    Err(SysError::os("exec the agent", err))
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
pub(super) fn own_userns_by(id: u32) -> Result<()> {
    const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
    raw::process::prctl(libc::PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP)
        .map_err(|e| SysError::os("set the secure bits", e))?;
    raw::process::setresgid(u32::MAX, id, u32::MAX)
        .map_err(|e| SysError::os("set the effective gid", e))?;
    raw::process::setresuid(u32::MAX, id, u32::MAX)
        .map_err(|e| SysError::os("set the effective uid", e))?;
    Ok(())
}

/// Mounts cgroup2 in the current (new) cgroup namespace as a detached mount
/// (`fsopen`/`fsmount`, attached nowhere) and returns a directory fd on its root, after
/// checking that it is the directory `host` names.
fn detached_cgroup(host: OwnedFd) -> Result<OwnedFd> {
    const FSOPEN_CLOEXEC: u32 = 1;
    const FSMOUNT_CLOEXEC: u32 = 1;
    // MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC.
    const ATTRS: u32 = 0x2 | 0x4 | 0x8;
    let fs = raw::mount::fsopen(c"cgroup2", FSOPEN_CLOEXEC)
        .map_err(|e| SysError::os("fsopen cgroup2", e))?;
    raw::mount::fsconfig_create(fs.as_fd())
        .map_err(|e| SysError::os("create the cgroup2 mount", e))?;
    let mnt = raw::mount::fsmount(fs.as_fd(), FSMOUNT_CLOEXEC, ATTRS)
        .map_err(|e| SysError::os("fsmount cgroup2", e))?;
    // The mount fd is an O_PATH handle; the agent needs a directory it can read.
    let dir = reopen_dir(&mnt)?;
    let same = |a: &OwnedFd, b: &OwnedFd| -> Result<bool> {
        let st = |fd: &OwnedFd| {
            let st = raw::fs::fstat(fd.as_fd())
                .map_err(|e| SysError::os("fstat a cgroup directory", e))?;
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
    crate::fs::openat2(
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
        return raw::fd::set_fd_flags(fd, 0).map_err(|e| SysError::os("fcntl", e));
    }
    // The new fd has no CLOEXEC.
    raw::fd::dup2(fd, target).map_err(|e| SysError::os(format!("dup2 to {target}"), e))
}

fn dup_above(fd: RawFd, min: RawFd) -> Result<RawFd> {
    raw::fd::dup_above(fd, min).map_err(|e| SysError::os("dup agent fd", e))
}

fn set_rlimits(nofile: u64) -> Result<()> {
    // Lowering limits needs no privilege; failures to raise are ignored.
    let _ = raw::process::setrlimit(libc::RLIMIT_CORE, 0);
    // An unreadable limit reads as 0 (and is then set to 0), as before the raw layer.
    let max = raw::process::getrlimit(libc::RLIMIT_NOFILE)
        .map(|r| r.rlim_max)
        .unwrap_or(0);
    let want = nofile.min(max);
    raw::process::setrlimit(libc::RLIMIT_NOFILE, want)
        .map_err(|e| SysError::os("setrlimit NOFILE", e))
}

/// `sethostname` in the caller's UTS namespace (the jail's init; the gvisor tier's agent
/// for a fork restored with its parent's, ADR 0136).
pub fn set_hostname(name: &str) -> Result<()> {
    raw::process::sethostname(name).map_err(|e| SysError::os("sethostname", e))
}

/// Brings `lo` up in the new network namespace: the only interface a sandbox has.
pub(crate) fn loopback_up() -> Result<()> {
    let sock = raw::net::inet_dgram_socket().map_err(|e| SysError::os("socket for ioctl", e))?;
    let flags = raw::net::if_flags(&sock, b"lo").map_err(|e| SysError::os("get lo flags", e))?;
    let up = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    raw::net::set_if_flags(&sock, b"lo", up).map_err(|e| SysError::os("bring lo up", e))
}

/// pivot_root(".", ".") stacks the old root on the new one, which is then detached,
/// leaving no path to the host's filesystem.
fn pivot(root: &Path) -> Result<()> {
    let root_c = cstr(root)?;
    raw::process::chdir(&root_c).map_err(|e| SysError::os("chdir to the new root", e))?;
    raw::mount::pivot_root(c".", c".").map_err(|e| SysError::os("pivot_root", e))?;
    raw::mount::umount2(c".", libc::MNT_DETACH)
        .map_err(|e| SysError::os("detach the old root", e))?;
    raw::process::chdir(c"/").map_err(|e| SysError::os("chdir /", e))
}
