//! The agent's shared state: the child policy ingredients, the pid → waiter map fed by the
//! reaper, per-call cgroups, and background processes.

use crate::background::Background;
use crate::error::{AgentError, Result};
use crate::log;
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use threadbox_proto::{Command as ProtoCommand, ErrorKind, RunAs};
use threadbox_sys::child::{self as syschild, ChildPolicy, DirFd, WaitStatus};
use threadbox_sys::landlock::{self, Ruleset};
use threadbox_sys::resolve::{self, Resolve, Root};
use threadbox_sys::seccomp::{self, sock_filter};
use tokio::sync::{mpsc, oneshot};

/// PATH of every sandbox process (the request's env may override it).
pub const BASE_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/threadbox/bin";

/// PATH for `who`: its `~/.local/bin` first (pip's user scripts and `npm -g` bins, ADR
/// 0067), as Debian's `~/.profile` does.
pub fn user_path(who: &Identity) -> String {
    format!("{}/.local/bin:{BASE_PATH}", who.home)
}

/// How often empty per-call cgroups are retried for removal (and children reaped, in case
/// a SIGCHLD notification was coalesced away).
const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// Who a process or file operation runs as.
#[derive(Debug, Clone)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub name: Cow<'static, str>,
    pub home: Cow<'static, str>,
}

/// The largest id of the sandbox's user namespace (its map is `0 <base> 65536`).
const MAX_NS_ID: u32 = 65_535;

pub fn identity(user: RunAs) -> Identity {
    match user {
        RunAs::User => Identity {
            uid: 1000,
            gid: 1000,
            name: Cow::Borrowed("user"),
            home: Cow::Borrowed("/home/user"),
        },
        RunAs::Root => Identity {
            uid: 0,
            gid: 0,
            name: Cow::Borrowed("root"),
            home: Cow::Borrowed("/root"),
        },
        RunAs::Id { uid, gid } => {
            // Name and home as the sandbox's own /etc/passwd says (the agent's root is the
            // sandbox's); an id it does not list is named by its number, at home in /.
            let (name, home) = passwd_entry(uid).unwrap_or_else(|| (uid.to_string(), "/".into()));
            Identity {
                uid,
                gid,
                name: Cow::Owned(name),
                home: Cow::Owned(home),
            }
        }
    }
}

/// Refuses ids outside the sandbox's user namespace (the daemon never sends them; a
/// spawn as one would fail with EINVAL, this says why).
pub fn check_identity(user: RunAs) -> Result<()> {
    match user {
        RunAs::Id { uid, gid } if uid > MAX_NS_ID || gid > MAX_NS_ID => Err(AgentError::invalid(
            format!("uid {uid}/gid {gid} is outside the sandbox's ids (0-{MAX_NS_ID})"),
        )),
        _ => Ok(()),
    }
}

/// `(name, home)` of `uid` in `/etc/passwd` (read at most 1 MiB; a home that is not
/// absolute is `/`).
fn passwd_entry(uid: u32) -> Option<(String, String)> {
    use std::io::Read;
    let f = std::fs::File::open("/etc/passwd").ok()?;
    let mut text = String::new();
    f.take(1 << 20).read_to_string(&mut text).ok()?;
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        if f.len() < 6 || f[2].parse::<u32>().ok()? != uid || f[0].is_empty() {
            return None;
        }
        let home = if f[5].starts_with('/') { f[5] } else { "/" };
        Some((f[0].to_string(), home.to_string()))
    })
}

/// Built once at start: the seccomp program and the Landlock ruleset shared by all children.
pub struct PolicyParts {
    pub seccomp: Arc<Vec<sock_filter>>,
    pub landlock: Option<Arc<Ruleset>>,
    /// Why Landlock is not enforced, when it is not.
    pub landlock_missing: Option<String>,
}

impl PolicyParts {
    pub fn load() -> std::result::Result<PolicyParts, String> {
        let seccomp =
            Arc::new(seccomp::sandbox_filter().map_err(|e| format!("seccomp policy: {e}"))?);
        let ruleset = if crate::testhooks::has("no-landlock-kernel") {
            Ok(None)
        } else {
            landlock::sandbox_ruleset()
        };
        let (landlock, landlock_missing) = match ruleset {
            Ok(Some(rs)) => (Some(Arc::new(rs)), None),
            Ok(None) => (None, Some("the kernel has no Landlock".to_string())),
            Err(e) => (None, Some(format!("building the ruleset failed: {e}"))),
        };
        Ok(PolicyParts {
            seccomp,
            landlock,
            landlock_missing,
        })
    }
}

/// The longest [`Agent::kill_listed`] goes on killing what a v1 call cgroup lists.
const KILL_LISTED_MAX: std::time::Duration = std::time::Duration::from_secs(2);
/// Between two rounds of [`Agent::kill_listed`].
const KILL_LISTED_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// The pids a cgroup's `cgroup.procs` (`rel` under `dir`) lists.
fn read_pids(dir: &DirFd, rel: &str) -> std::io::Result<Vec<i32>> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::from(dir.open_read(rel)?).read_to_string(&mut text)?;
    Ok(text
        .split_ascii_whitespace()
        .filter_map(|w| w.parse::<i32>().ok())
        .filter(|p| *p > 0)
        .collect())
}

/// A child cgroup of the sandbox's cgroup, for one call or background process.
#[derive(Debug)]
pub struct CallCgroup {
    pub name: String,
    /// The cgroup's directory, for `clone3(CLONE_INTO_CGROUP)`.
    pub dir: OwnedFd,
}

pub struct Agent {
    /// The sandbox's `/`: every path of a request is resolved under it (see
    /// `threadbox_sys::resolve`).
    pub root: Root,
    pub cgroup: Option<DirFd>,
    /// `cgroup` is a hierarchy of gVisor's own cgroupfs (cgroup v1 in the sentry, ADR 0214): it has
    /// no `cgroup.kill` and no `clone3` into it, so a call's child writes itself in and a
    /// call's processes are killed one by one from its `cgroup.procs`.
    pub cgroup_v1: bool,
    pub policy: PolicyParts,
    /// The tier the agent runs on (`--tier`): which posture checks apply.
    pub tier: crate::selftest::Tier,
    waiters: RefCell<HashMap<i32, oneshot::Sender<WaitStatus>>>,
    next_cgroup: Cell<u64>,
    /// Cgroups that still had processes when their call ended.
    leftover_cgroups: RefCell<Vec<String>>,
    pub background: RefCell<BTreeMap<u64, Rc<RefCell<Background>>>>,
    pub next_bg: Cell<u64>,
    /// Interpreter contexts (`interp/`).
    pub contexts: RefCell<crate::interp::Registry>,
    /// Terminal sessions by pid (`pty.rs`).
    pub ptys: RefCell<HashMap<i32, mpsc::Sender<crate::pty::PtyCtl>>>,
    /// Where the agent bound its listener (`--listen unix:PATH`), so it can bind there
    /// again after a memory checkpoint; `None` with an inherited listener (the jail).
    pub listen_path: Option<String>,
    /// Bumped by `PrepareCheckpoint`: the listener and every connection close (ADR 0130).
    pub quiesce: tokio::sync::watch::Sender<Quiesce>,
}

/// What the listener and connections are told to do ([`Agent::quiesce`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quiesce {
    /// Bumped by each `PrepareCheckpoint`.
    pub generation: u64,
    /// Bind again by itself after this long without the host's `SIGUSR2`.
    pub rebind_after_ms: u64,
}

impl Agent {
    pub fn new(
        root: Root,
        cgroup: Option<DirFd>,
        policy: PolicyParts,
        tier: crate::selftest::Tier,
    ) -> Agent {
        Agent {
            root,
            cgroup,
            cgroup_v1: false,
            policy,
            tier,
            waiters: RefCell::new(HashMap::new()),
            next_cgroup: Cell::new(1),
            leftover_cgroups: RefCell::new(Vec::new()),
            background: RefCell::new(BTreeMap::new()),
            next_bg: Cell::new(1),
            contexts: RefCell::new(Default::default()),
            ptys: RefCell::new(HashMap::new()),
            listen_path: None,
            quiesce: tokio::sync::watch::channel(Quiesce::default()).0,
        }
    }

    /// Registers interest in `pid`'s exit status. Must be called right after the fork,
    /// before the next `.await`, so the reaper cannot have taken the status yet.
    pub fn wait_for(&self, pid: i32) -> oneshot::Receiver<WaitStatus> {
        let (tx, rx) = oneshot::channel();
        self.waiters.borrow_mut().insert(pid, tx);
        rx
    }

    /// Reaps every terminated child: statuses go to their waiters; orphans are just reaped.
    pub fn reap(&self) {
        if crate::testhooks::has("no-reaper") {
            // Positive control of the zombie case: only the children we wait for.
            let pids: Vec<i32> = self.waiters.borrow().keys().copied().collect();
            for pid in pids {
                if let Ok(Some((pid, status))) = syschild::reap_pid(pid) {
                    if let Some(tx) = self.waiters.borrow_mut().remove(&pid) {
                        let _ = tx.send(status);
                    }
                }
            }
            return;
        }
        loop {
            match syschild::reap_any() {
                Ok(Some((pid, status))) => {
                    if let Some(tx) = self.waiters.borrow_mut().remove(&pid) {
                        let _ = tx.send(status);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    log(&format!("waitpid: {e}"));
                    break;
                }
            }
        }
    }

    /// Creates `<prefix>-<n>` under the sandbox's cgroup (None without one).
    pub fn new_cgroup(&self, prefix: &str) -> Result<Option<CallCgroup>> {
        let Some(dir) = &self.cgroup else {
            return Ok(None);
        };
        loop {
            let n = self.next_cgroup.get();
            self.next_cgroup.set(n + 1);
            let name = format!("{prefix}-{n}");
            match dir.mkdir(&name, 0o755) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => {
                    return Err(AgentError::internal(format!(
                        "could not create a cgroup for the call: {e}"
                    )))
                }
            }
            return match dir.open_dir(&name) {
                Ok(fd) => Ok(Some(CallCgroup { name, dir: fd })),
                Err(e) => {
                    let _ = dir.rmdir(&name);
                    Err(AgentError::internal(format!(
                        "could not open the call's cgroup: {e}"
                    )))
                }
            };
        }
    }

    /// Opens `cgroup.procs` of the call cgroup `name`, for a child that writes itself in
    /// (where clone3 into a cgroup is unavailable).
    pub fn cgroup_procs(&self, name: &str) -> Result<Option<OwnedFd>> {
        let Some(dir) = &self.cgroup else {
            return Ok(None);
        };
        dir.open_write(&format!("{name}/cgroup.procs"))
            .map(Some)
            .map_err(|e| AgentError::internal(format!("could not open the call's cgroup: {e}")))
    }

    /// Kills every process of a call: `cgroup.kill` when the call has a cgroup; otherwise
    /// the process group of its leader (`pgid == pid` after its setsid). The fallback
    /// misses descendants that left the group with their own `setsid` (double fork).
    pub fn kill_tree(&self, cgroup: Option<&str>, pid: i32) {
        let cgroup = cgroup.filter(|_| !crate::testhooks::has("no-cgroup-kill"));
        if let (Some(dir), Some(name), true) = (&self.cgroup, cgroup, self.cgroup_v1) {
            match self.kill_listed(dir, name) {
                Ok(()) => return,
                // Gone (removed once empty): as below.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return,
                Err(e) => log(&format!(
                    "killing the processes of {name} failed ({e}); killing the process group"
                )),
            }
        } else if let (Some(dir), Some(name)) = (&self.cgroup, cgroup) {
            match dir.write_file(&format!("{name}/cgroup.kill"), b"1") {
                Ok(()) => return,
                // The cgroup is gone (removed once empty): nothing is left to kill, and
                // the leader's pid may belong to someone else by now.
                Err(e)
                    if e.raw_os_error() == Some(libc::ENOENT)
                        && dir.open_write(&format!("{name}/cgroup.procs")).is_err() =>
                {
                    return
                }
                Err(e) => log(&format!(
                    "cgroup.kill of {name} failed ({e}); killing the process group"
                )),
            }
        }
        let _ = syschild::kill_group(pid, libc::SIGKILL);
        let _ = syschild::kill(pid, libc::SIGKILL);
    }

    /// Kills every process of the v1 call cgroup `name` (ADR 0214), where no `cgroup.kill`
    /// exists: SIGKILL to each pid its `cgroup.procs` lists, again until it lists none.
    /// A process cannot fork once its SIGKILL is pending, and a child forked before is in
    /// the cgroup before its parent's fork returns, so each round's listing holds every
    /// process that could still fork; rounds end when it is empty. The dead are reaped
    /// between rounds (orphans come to us, the sandbox's init). Bounded: zombies of
    /// processes that are not ours would stay listed, and a cgroup that will not empty is
    /// logged and left to the periodic sweep.
    fn kill_listed(&self, dir: &DirFd, name: &str) -> std::io::Result<()> {
        let procs = format!("{name}/cgroup.procs");
        let deadline = std::time::Instant::now() + KILL_LISTED_MAX;
        loop {
            let pids = read_pids(dir, &procs)?;
            if pids.is_empty() {
                return Ok(());
            }
            for p in &pids {
                let _ = syschild::kill(*p, libc::SIGKILL);
            }
            self.reap();
            if std::time::Instant::now() >= deadline {
                log(&format!(
                    "{name} still lists {} process(es) after killing them: left to the sweep",
                    pids.len()
                ));
                return Ok(());
            }
            // The sentry delivers SIGKILL asynchronously: give the dying a moment to go.
            std::thread::sleep(KILL_LISTED_PAUSE);
        }
    }

    /// Removes a call's cgroup, or remembers it for the periodic sweep while processes
    /// (e.g. `server &`) still live in it.
    pub fn release_cgroup(&self, name: String) {
        let Some(dir) = &self.cgroup else { return };
        match dir.rmdir(&name) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(_) => self.leftover_cgroups.borrow_mut().push(name),
        }
    }

    fn sweep_cgroups(&self) {
        let Some(dir) = &self.cgroup else { return };
        self.leftover_cgroups
            .borrow_mut()
            .retain(|name| match dir.rmdir(name) {
                Ok(()) => false,
                Err(e) => e.raw_os_error() != Some(libc::ENOENT),
            });
    }

    /// The policy a child of `who` enters, changing into `cwd` (a directory handle
    /// resolved under the sandbox root, see [`prepare`]).
    pub fn child_policy(
        &self,
        who: &Identity,
        cwd: OwnedFd,
        cgroup_procs: Option<OwnedFd>,
    ) -> Result<ChildPolicy> {
        Ok(ChildPolicy {
            uid: who.uid,
            gid: who.gid,
            groups: vec![who.gid],
            cwd: Some(cwd),
            cgroup_procs,
            landlock: self.policy.landlock.clone(),
            seccomp: self.policy.seccomp.clone(),
            weaken: crate::testhooks::get(),
        })
    }
}

/// Waits for SIGCHLD and reaps; also sweeps leftover cgroups now and then.
pub struct Reaper {
    sigchld: tokio::signal::unix::Signal,
}

impl Reaper {
    pub fn install() -> io::Result<Reaper> {
        let sigchld = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())?;
        Ok(Reaper { sigchld })
    }

    pub async fn run(mut self, agent: Rc<Agent>) {
        let mut tick = tokio::time::interval(SWEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.sigchld.recv() => {}
                _ = tick.tick() => agent.sweep_cgroups(),
            }
            agent.reap();
        }
    }
}

/// A command ready to spawn: the std `Command` (env set, stdio not yet) and where it runs.
pub struct Prepared {
    pub cmd: std::process::Command,
    pub who: Identity,
    /// The working directory, resolved under the sandbox root as `who` (taken by the
    /// child policy).
    pub cwd: Option<OwnedFd>,
}

fn no_nul(s: &str, what: &str) -> Result<()> {
    if s.contains('\0') {
        return Err(AgentError::invalid(format!("{what} contains a NUL byte")));
    }
    Ok(())
}

/// Validates a request's command, env and cwd and builds the `Command`. The working
/// directory is resolved here, under the sandbox root and as the user, so a missing or
/// forbidden one is a clear error rather than a failed spawn, and the child only has to
/// `fchdir` to the handle: no path of the request is walked between fork and exec.
pub fn prepare(
    root: &Root,
    command: &ProtoCommand,
    env: &BTreeMap<String, String>,
    cwd: Option<&str>,
    user: RunAs,
) -> Result<Prepared> {
    check_identity(user)?;
    let who = identity(user);
    let (program, args): (&str, Vec<&str>) = match command {
        ProtoCommand::Argv(v) => match v.split_first() {
            Some((p, rest)) if !p.is_empty() => {
                (p.as_str(), rest.iter().map(|s| s.as_str()).collect())
            }
            _ => return Err(AgentError::invalid("the command is empty")),
        },
        ProtoCommand::Shell(s) => ("/bin/sh", vec!["-c", s.as_str()]),
    };
    no_nul(program, "the command")?;
    for a in &args {
        no_nul(a, "an argument")?;
    }
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(AgentError::invalid(format!(
                "invalid environment variable name {k:?}"
            )));
        }
        no_nul(v, "an environment value")?;
    }

    let cwd = match cwd {
        Some(c) => {
            let p = crate::files::normalize(c, &who.home)?;
            open_cwd(root, &p, &who, c)?
        }
        None => {
            // The user's home; "/" when the image has none (the host test mode).
            match open_cwd(root, Path::new(&*who.home), &who, &who.home) {
                Ok(fd) => fd,
                Err(_) => open_cwd(root, Path::new("/"), &who, "/")?,
            }
        }
    };

    let mut cmd = std::process::Command::new(program);
    cmd.args(&args)
        .env_clear()
        .env("PATH", user_path(&who))
        .env("HOME", &*who.home)
        // `npm install -g` next to pip's user installs, on the sandbox's disk: the
        // image's /usr is read-only (ADR 0067).
        .env("NPM_CONFIG_PREFIX", format!("{}/.local", who.home))
        .env("USER", &*who.name)
        .env("LOGNAME", &*who.name)
        .env("LANG", "C.UTF-8")
        .envs(env);
    Ok(Prepared {
        cmd,
        who,
        cwd: Some(cwd),
    })
}

/// Opens `dir/.` under the root as `who`: it resolves only if `dir` exists, is a
/// directory and the user may search it. Kernel interface file systems are refused.
fn open_cwd(root: &Root, dir: &Path, who: &Identity, shown: &str) -> Result<OwnedFd> {
    let _as_user = syschild::assume_fs_identity(who.uid, who.gid).map_err(|e| {
        AgentError::internal(format!("could not switch the file system identity: {e}"))
    })?;
    match root.open_dir(&dir.join(".")) {
        Ok(fd) => {
            let fs = syschild::fs_type(fd.as_fd()).map_err(|e| AgentError::io(&e, shown))?;
            if syschild::is_kernel_interface_fs(fs) && root.resolve_flags() == Resolve::STRICT {
                return Err(AgentError::new(
                    ErrorKind::PermissionDenied,
                    format!("working directory {shown} is in a kernel interface file system"),
                ));
            }
            // The agent may hold capabilities its children do not (sandbox root's fsuid 0
            // keeps them): what the child's `fchdir` will check is the plain mode bits.
            let st = resolve::stat_fd(fd.as_fd()).map_err(|e| AgentError::io(&e, shown))?;
            let bit = if st.uid == who.uid {
                0o100
            } else if st.gid == who.gid {
                0o010
            } else {
                0o001
            };
            if st.mode & bit == 0 {
                return Err(AgentError::new(
                    ErrorKind::PermissionDenied,
                    format!("working directory {shown} is not accessible"),
                ));
            }
            Ok(fd)
        }
        Err(e) => {
            let (kind, what) = match e.raw_os_error() {
                Some(libc::ENOENT) => (ErrorKind::NotFound, "does not exist"),
                Some(libc::ENOTDIR) => (ErrorKind::NotADirectory, "is not a directory"),
                Some(libc::EACCES) | Some(libc::EPERM) => {
                    (ErrorKind::PermissionDenied, "is not accessible")
                }
                Some(libc::ELOOP) => (
                    ErrorKind::PermissionDenied,
                    "leads through a /proc magic link or too many symbolic links",
                ),
                _ => return Err(AgentError::io(&e, shown)),
            };
            Err(AgentError::new(
                kind,
                format!("working directory {shown} {what}"),
            ))
        }
    }
}
