//! The gvisor tier's pid namespace for sandbox processes (ADR 0218).
//!
//! gVisor's procfs makes every process's `environ` world-readable and its `fd/` links
//! readable by anyone, with no ptrace check (ADR 0187), so a sandbox process could read
//! the agent's environment and descriptors while the agent is in its pid namespace. On
//! that tier the agent, single-threaded and still holding `CAP_SYS_ADMIN`, calls
//! [`enter_sandbox_namespace`] before anything of the sandbox runs:
//!
//! - `unshare(CLONE_NEWPID | CLONE_NEWNS)`: the agent stays where it is (pid 1 of the
//!   container), and every process it forks from then on is born in a new pid namespace,
//!   still the agent's direct child (so `waitpid` and the reaper work as before);
//! - its first child becomes that namespace's init: it mounts a procfs of the new
//!   namespace on `/proc` (in the new mount namespace, which the agent and every later
//!   child share) and re-executes the agent binary as [`init_main`] with an empty
//!   environment, no descriptors and no capabilities, non-dumpable;
//! - the agent keeps a descriptor of the container's own procfs ([`read_proc`],
//!   [`proc_pids`]) for what it reads about processes: the new `/proc` shows only the
//!   namespace's processes, with their pids in it, and no `self` for the agent.
//!
//! A sandbox process then sees `/proc/1` as that init, and nothing of the agent.
//! Why not `unshare` in a helper: `setns` into a pid namespace is refused by runsc
//! (EINVAL), and a thread that has unshared its children's pid namespace can no longer
//! create threads; the agent creates none.

use crate::raw;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::CString;
use std::io;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::{Mutex, OnceLock};

/// The argument that makes the agent binary the namespace's init ([`init_main`]).
pub const INIT_ARG: &str = "--ns-init";

/// The container's procfs, opened before `/proc` became the new namespace's.
static HOST_PROC: OnceLock<OwnedFd> = OnceLock::new();
/// The namespace init's pid, as the agent sees it.
static INIT_PID: OnceLock<i32> = OnceLock::new();

/// The procfs the agent reads processes from: the pinned one, or `/proc`.
fn proc_dir() -> io::Result<OwnedFd> {
    match HOST_PROC.get() {
        Some(fd) => fd.try_clone(),
        None => raw::fd::open(
            c"/proc",
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        ),
    }
}

fn rel_cstring(rel: &str) -> io::Result<CString> {
    if rel.starts_with('/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    CString::new(rel).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Reads `rel` (such as `"42/status"` or `"self/task"`'s files) from the agent's procfs.
pub fn read_proc(rel: &str) -> io::Result<String> {
    let dir = proc_dir()?;
    let fd = raw::fd::openat(
        dir.as_fd(),
        &rel_cstring(rel)?,
        libc::O_RDONLY | libc::O_CLOEXEC,
    )?;
    let mut s = String::new();
    std::fs::File::from(fd).read_to_string(&mut s)?;
    Ok(s)
}

/// The numeric entries of the directory `rel` of the agent's procfs (`""`: the pids,
/// `"self/task"`: this process's threads).
pub fn proc_numbers(rel: &str) -> io::Result<Vec<i32>> {
    let dir = proc_dir()?;
    let fd = if rel.is_empty() {
        dir
    } else {
        raw::fd::openat(
            dir.as_fd(),
            &rel_cstring(rel)?,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )?
    };
    Ok(crate::resolve::read_dir(fd.as_fd(), usize::MAX - 1)?
        .iter()
        .filter_map(|n| n.to_str().ok()?.parse::<i32>().ok())
        .collect())
}

/// Every pid of the agent's procfs.
pub fn proc_pids() -> io::Result<Vec<i32>> {
    proc_numbers("")
}

/// Pids of the agent's children in the sandbox's namespace, by the agent's pid of each
/// (what `fork` returned): the API reports the sandbox's view (`$$` and `ps` inside).
/// Bounded: the oldest entries go first, long after their processes ended.
static VIEW: Mutex<PidView> = Mutex::new(PidView {
    inner: BTreeMap::new(),
    order: VecDeque::new(),
});

/// Entries [`VIEW`] keeps.
const VIEW_MAX: usize = 1 << 16;

struct PidView {
    inner: BTreeMap<i32, i32>,
    order: VecDeque<i32>,
}

/// Records that the agent's child `outer` is `inner` in the sandbox's namespace.
pub(crate) fn record_view(outer: i32, inner: i32) {
    let Ok(mut v) = VIEW.lock() else { return };
    if v.inner.insert(outer, inner).is_none() {
        v.order.push_back(outer);
    }
    while v.order.len() > VIEW_MAX {
        if let Some(old) = v.order.pop_front() {
            v.inner.remove(&old);
        }
    }
}

/// The pid the sandbox's processes know the agent's child `outer` by: its pid in the
/// sandbox's namespace on gvisor, `outer` itself where the agent shares it (the jail).
pub fn view(outer: i32) -> i32 {
    VIEW.lock()
        .ok()
        .and_then(|v| v.inner.get(&outer).copied())
        .unwrap_or(outer)
}

/// The sandbox namespace's init, as the agent sees it; `None` where there is none (the
/// jail, the host test mode).
pub fn init_pid() -> Option<i32> {
    INIT_PID.get().copied()
}

/// Moves the children of the calling process into a new pid namespace with its own
/// `/proc` and starts its init (see the module's documentation). Returns the init's pid.
///
/// Must run while the process has one thread and `CAP_SYS_ADMIN`, before any other
/// child exists. Not undone: called once, at the agent's start.
pub fn enter_sandbox_namespace() -> io::Result<i32> {
    let host = raw::fd::open(
        c"/proc",
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
    )?;
    let exe = raw::fd::open(c"/proc/self/exe", libc::O_RDONLY | libc::O_CLOEXEC)?;
    if HOST_PROC.set(host).is_err() {
        return Err(io::Error::other(
            "the sandbox's pid namespace exists already",
        ));
    }
    raw::process::unshare(libc::CLONE_NEWPID | libc::CLONE_NEWNS)
        .map_err(|e| io::Error::new(e.kind(), format!("unshare(CLONE_NEWPID|CLONE_NEWNS): {e}")))?;
    // The new /proc stays in this mount namespace.
    raw::mount::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(|e| io::Error::new(e.kind(), format!("make / private: {e}")))?;
    let argv0 = CString::new("threadbox-agent").map_err(io::Error::other)?;
    let arg = CString::new(INIT_ARG).map_err(io::Error::other)?;
    let argv = raw::process::CStrArray::new([argv0.as_c_str(), arg.as_c_str()]);
    let envp = raw::process::CStrArray::new(std::iter::empty::<&std::ffi::CStr>());
    let (status_r, status_w) = raw::fd::pipe_cloexec()?;
    match raw::process::fork_single_threaded()? {
        raw::process::Forked::Child => {
            // Pid 1 of the new namespace: only a procfs mounted by a process inside it
            // shows the namespace.
            let err = match raw::mount::mount(
                Some(c"proc"),
                c"/proc",
                Some(c"proc"),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                None,
            ) {
                Ok(()) => raw::process::execveat_fd(exe.as_raw_fd(), &argv, &envp),
                Err(e) => e,
            };
            let code = err.raw_os_error().unwrap_or(libc::EIO);
            let _ = raw::fd::write(status_w.as_fd(), &code.to_ne_bytes());
            raw::process::exit_now(127)
        }
        raw::process::Forked::Parent(pid) => {
            drop(status_w);
            let mut buf = [0u8; 4];
            let mut got = 0;
            while got < buf.len() {
                match raw::fd::read(status_r.as_fd(), &mut buf[got..]) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                    Err(e) => return Err(e),
                }
            }
            if got == buf.len() {
                let _ = raw::process::waitpid(pid, 0);
                let e = io::Error::from_raw_os_error(i32::from_ne_bytes(buf));
                return Err(io::Error::new(
                    e.kind(),
                    format!("the sandbox namespace's init: {e}"),
                ));
            }
            let _ = INIT_PID.set(pid);
            Ok(pid)
        }
    }
}

/// The namespace's init (the agent binary run with [`INIT_ARG`]): it holds the namespace
/// and reaps the orphans that come to it, and does nothing else. Non-dumpable, with no
/// descriptor, no capability and every signal blocked (a namespace's init receives only
/// signals it has handlers for; it has none).
pub fn init_main() -> ! {
    let _ = raw::process::prctl(libc::PR_SET_DUMPABLE, 0);
    // Each of 0-2 by itself: runsc 20240729's close_range left them open from 0.
    for fd in 0..3 {
        raw::fd::close(fd);
    }
    let _ = raw::fd::close_range(3, u32::MAX, 0);
    // `ps` shows "init" (an exec of a descriptor would show "/").
    let _ = raw::process::set_name(c"init");
    let _ = raw::process::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
    );
    for cap in 0..64 {
        if raw::process::prctl(libc::PR_CAPBSET_DROP, cap).is_err() {
            break;
        }
    }
    let _ = raw::process::capset_none();
    let _ = raw::process::prctl(libc::PR_SET_NO_NEW_PRIVS, 1);
    raw::process::block_all_signals();
    loop {
        if raw::process::waitpid(-1, 0).is_err() {
            // No child (ECHILD): the next orphan's SIGCHLD stays pending until taken here.
            let _ = raw::process::wait_signal(libc::SIGCHLD);
        }
    }
}
