//! What a sandbox process goes through between fork and exec, and the few raw calls the
//! agent (PID 1) needs: reaping, signals, filesystem identity, `openat2`, inherited fds.
//!
//! [`ChildPolicy`] is built before fork (all allocation happens there) and
//! [`ChildPolicy::enter`] runs in the child using raw system calls only, so it is
//! async-signal-safe and may run in a `pre_exec` hook.

use crate::landlock::Ruleset;
use crate::seccomp::sock_filter;
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Everything a child needs to drop into the sandbox's process policy.
#[derive(Debug)]
pub struct ChildPolicy {
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub groups: Vec<libc::gid_t>,
    /// The working directory, as a handle the agent resolved under the sandbox root
    /// ([`crate::resolve::Root`]); the child `fchdir`s to it after dropping its ids, so the
    /// user's search permission applies and no path is walked between fork and exec.
    pub cwd: Option<OwnedFd>,
    /// An fd of a cgroup v2 `cgroup.procs` file opened for writing; the child moves itself
    /// there first, so everything it starts is in that cgroup.
    pub cgroup_procs: Option<OwnedFd>,
    pub landlock: Option<Arc<Ruleset>>,
    pub seccomp: Arc<Vec<sock_filter>>,
    /// Test-only weakenings (positive controls of the security suite). Always present so
    /// that the struct has one shape whichever crates enable the feature (F14); without
    /// the feature it is zero-sized and nothing reads it.
    pub weaken: Weaken,
}

/// The weakenings a child applies (the security suite's positive controls).
#[cfg(feature = "insecure-test-hooks")]
pub use crate::testhooks::Weaken;

/// No weakening exists in a build without the `insecure-test-hooks` feature.
#[cfg(not(feature = "insecure-test-hooks"))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Weaken;

const OOM_SCORE_ADJ: &CStr = c"/proc/self/oom_score_adj";
/// User processes are the OOM killer's first choice, before the agent.
const OOM_SCORE_ADJ_VALUE: &[u8] = b"500";

/// All bits that can be set in the secure bits (see capabilities(7)): no privilege for uid 0
/// on exec, no capability fix-up on uid changes, no ambient raise; each locked.
const SECUREBITS: libc::c_ulong = (1 << 0) // NOROOT
    | (1 << 1) // NOROOT_LOCKED
    | (1 << 2) // NO_SETUID_FIXUP
    | (1 << 3) // NO_SETUID_FIXUP_LOCKED
    | (1 << 5) // KEEP_CAPS_LOCKED (KEEP_CAPS itself off)
    | (1 << 6) // NO_CAP_AMBIENT_RAISE
    | (1 << 7); // NO_CAP_AMBIENT_RAISE_LOCKED

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn check(rc: libc::c_long) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl ChildPolicy {
    /// Enters the policy. Runs in the forked child before exec: raw system calls only,
    /// no allocation, no locks. The order matters:
    ///
    /// 1. every inherited fd ≥ 3 is closed except the few the child itself needs (its cwd
    ///    handle, cgroup.procs, the Landlock ruleset, `keep`): nothing of the agent — its
    ///    sockets, the sandbox's cgroup directory — exists in the child past this point;
    /// 2. join the cgroup, `setsid`, raise `oom_score_adj`;
    /// 3. while still privileged: clear ambient caps, empty the bounding set, lock the
    ///    secure bits (where permitted);
    /// 4. `setgroups`, `setresgid`, `setresuid` (raw syscalls, not glibc's setxid broadcast);
    /// 5. `capset` to zero every set, `chdir` as the user;
    /// 6. no_new_privs, Landlock, and seccomp last (it would refuse the calls above).
    pub fn enter(&self) -> io::Result<()> {
        self.enter_keeping(&[])
    }

    /// [`ChildPolicy::enter`], keeping the descriptors `keep` open as well.
    pub fn enter_keeping(&self, keep: &[RawFd]) -> io::Result<()> {
        self.close_fds(keep)?;

        if let Some(fd) = &self.cgroup_procs {
            // SAFETY: writes one byte from a static buffer to an fd we own.
            let n = unsafe { libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1) };
            if n != 1 {
                return Err(io::Error::last_os_error());
            }
        }
        // SAFETY: no arguments.
        check(unsafe { libc::setsid() } as libc::c_long)?;

        // Best effort: a missing /proc must not stop the process.
        // SAFETY: NUL-terminated static path; the fd is closed below.
        let fd = unsafe { libc::open(OOM_SCORE_ADJ.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if fd >= 0 {
            // SAFETY: static buffer of the given length; `fd` is ours and closed once.
            unsafe {
                libc::write(
                    fd,
                    OOM_SCORE_ADJ_VALUE.as_ptr().cast(),
                    OOM_SCORE_ADJ_VALUE.len(),
                );
                libc::close(fd);
            }
        }

        #[cfg(feature = "insecure-test-hooks")]
        if self.weaken.has("keep-caps") {
            return self.enter_keeping_caps();
        }

        // SAFETY: integer arguments only.
        let rc = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            )
        };
        if rc != 0 && errno() != libc::EINVAL {
            return Err(io::Error::last_os_error());
        }
        for cap in 0..64 {
            // SAFETY: integer arguments only.
            let present = unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap, 0, 0, 0) };
            if present < 0 {
                break; // EINVAL: past CAP_LAST_CAP
            }
            if present == 1 {
                // SAFETY: integer arguments only.
                check(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } as libc::c_long)?;
            }
        }
        // Where permitted (needs CAP_SETPCAP; may be locked already by an outer layer).
        // SAFETY: integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0) };

        // SAFETY: `groups` is a live slice of gid_t of the given length.
        check(unsafe {
            libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr())
        })?;
        // SAFETY: integer arguments only.
        check(unsafe { libc::syscall(libc::SYS_setresgid, self.gid, self.gid, self.gid) })?;
        // SAFETY: integer arguments only.
        check(unsafe { libc::syscall(libc::SYS_setresuid, self.uid, self.uid, self.uid) })?;

        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        // SAFETY: header and a two-element data array as capset(2) requires for version 3.
        check(unsafe {
            libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr())
        })?;

        self.change_dir()?;
        self.restrict()
    }

    fn change_dir(&self) -> io::Result<()> {
        if let Some(cwd) = &self.cwd {
            // SAFETY: fchdir on a descriptor owned by `self`.
            check(unsafe { libc::fchdir(cwd.as_raw_fd()) } as libc::c_long)?;
            // The handle has done its job; the program must not inherit it.
            // SAFETY: closes our copy (after fork) of a descriptor of `self`; nothing uses
            // it again in this process.
            unsafe { libc::close(cwd.as_raw_fd()) };
        }
        Ok(())
    }

    /// Closes every fd ≥ 3 but the child's own and `keep`. Raw calls, no allocation.
    fn close_fds(&self, keep: &[RawFd]) -> io::Result<()> {
        let own = [
            self.cwd.as_ref().map(|f| f.as_raw_fd()),
            self.cgroup_procs.as_ref().map(|f| f.as_raw_fd()),
            self.landlock.as_ref().map(|r| r.raw_fd()),
        ];
        // The smallest kept fd at or above `lo`, repeatedly: the gaps between are closed.
        let mut lo: RawFd = 3;
        loop {
            let next = own
                .iter()
                .flatten()
                .chain(keep.iter())
                .copied()
                .filter(|&fd| fd >= lo)
                .min();
            let hi = match next {
                Some(fd) => fd - 1,
                None => RawFd::MAX,
            };
            if hi >= lo {
                // SAFETY: integer arguments only; closes descriptors nothing in the child
                // uses (every one it needs is kept).
                let rc =
                    unsafe { libc::syscall(libc::SYS_close_range, lo as u32, hi as u32, 0u32) };
                check(rc)?;
            }
            match next {
                Some(fd) if fd < RawFd::MAX => lo = fd + 1,
                _ => return Ok(()),
            }
        }
    }

    /// no_new_privs, Landlock, seccomp.
    fn restrict(&self) -> io::Result<()> {
        #[cfg(feature = "insecure-test-hooks")]
        let nnp = !self.weaken.has("suid");
        #[cfg(not(feature = "insecure-test-hooks"))]
        let nnp = true;
        if nnp {
            // SAFETY: integer arguments only.
            check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } as libc::c_long)?;
        }
        #[cfg(feature = "insecure-test-hooks")]
        let landlock = if self.weaken.has("no-landlock") {
            None
        } else {
            self.landlock.as_ref()
        };
        #[cfg(not(feature = "insecure-test-hooks"))]
        let landlock = self.landlock.as_ref();
        if let Some(rs) = landlock {
            rs.restrict_self()?;
        }
        #[cfg(feature = "insecure-test-hooks")]
        if self.weaken.has("no-seccomp") {
            return Ok(());
        }
        crate::seccomp::apply(&self.seccomp)
    }

    /// Test-only: ids are still set, but no capability is dropped.
    #[cfg(feature = "insecure-test-hooks")]
    fn enter_keeping_caps(&self) -> io::Result<()> {
        // SAFETY: integer arguments only; KEEP_CAPS keeps the permitted set across setresuid.
        unsafe { libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) };
        // SAFETY: `groups` is a live slice of gid_t of the given length.
        check(unsafe {
            libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr())
        })?;
        // SAFETY: integer arguments only.
        check(unsafe { libc::syscall(libc::SYS_setresgid, self.gid, self.gid, self.gid) })?;
        // SAFETY: integer arguments only.
        check(unsafe { libc::syscall(libc::SYS_setresuid, self.uid, self.uid, self.uid) })?;
        self.change_dir()?;
        self.restrict()
    }
}

/// A process started by [`spawn_in_cgroup`]: its pid and the parent's ends of its pipes.
#[derive(Debug)]
pub struct Spawned {
    pub pid: i32,
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// `struct clone_args` of clone3(2), up to and including `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
const SH: &CStr = c"/bin/sh";

fn pipe_cloexec() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds points to two writable ints.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } as libc::c_long)?;
    // SAFETY: both fds were just created and belong to nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

fn cstring(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// Whether an error of [`spawn_in_cgroup`] means "clone3 into a cgroup is not available
/// here" (old kernel, no cgroup v2), so the caller should start the process another way.
pub fn clone3_unavailable(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::E2BIG))
}

/// Starts `cmd`'s program, arguments and environment (its stdio settings are ignored) in the
/// cgroup `cgroup_dir` (or, without one, where the agent is; `policy.cgroup_procs` then
/// moves the child), entering `policy` between fork and exec, with fresh pipes for stdout
/// and stderr and, when `with_stdin`, stdin (else `/dev/null`).
///
/// Why not `Command::spawn` plus the child writing itself into `cgroup.procs`: moving a
/// process between cgroups takes the kernel's global threadgroup lock for writing, which
/// waits for an RCU grace period unless another move happened moments before — ~7 ms on
/// this project's machines, paid by the first exec after every pause in an agent's work.
/// `clone3(CLONE_INTO_CGROUP)` creates the child in its cgroup; nothing moves.
///
/// The program is looked up in the `PATH` of `cmd`'s environment the way `execvp` does
/// (`EACCES` wins over `ENOENT`). An exec failure comes back as the error of this call.
pub fn spawn_in_cgroup(
    cmd: &Command,
    cgroup_dir: Option<BorrowedFd<'_>>,
    policy: &ChildPolicy,
    with_stdin: bool,
) -> io::Result<Spawned> {
    // Everything the child touches is allocated here, before the fork.
    let program = cmd.get_program().as_bytes();
    let mut argv = vec![cstring(program)?];
    for a in cmd.get_args() {
        argv.push(cstring(a.as_bytes())?);
    }
    let mut envp = Vec::new();
    let mut path: &[u8] = b"/usr/local/bin:/usr/bin:/bin";
    for (k, v) in cmd.get_envs() {
        let Some(v) = v else { continue };
        if k.as_bytes() == b"PATH" {
            path = v.as_bytes();
        }
        let mut kv = k.as_bytes().to_vec();
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        envp.push(cstring(&kv)?);
    }
    let candidates: Vec<CString> = if program.contains(&b'/') {
        vec![cstring(program)?]
    } else if program.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    } else {
        path.split(|b| *b == b':')
            .map(|dir| {
                let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
                let mut p = dir.to_vec();
                p.push(b'/');
                p.extend_from_slice(program);
                cstring(&p)
            })
            .collect::<io::Result<_>>()?
    };
    let argv_p: Vec<*const libc::c_char> = argv
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp_p: Vec<*const libc::c_char> = envp
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    // For a file the kernel cannot execute (ENOEXEC: a script without `#!`), `execvp` runs
    // it with /bin/sh, and so do shells; slot 1 takes the candidate's path in the child.
    let mut sh_argv: Vec<*const libc::c_char> = [SH.as_ptr(), std::ptr::null()]
        .into_iter()
        .chain(argv.iter().skip(1).map(|c| c.as_ptr()))
        .chain(std::iter::once(std::ptr::null()))
        .collect();

    let (stdin_child, stdin_parent) = if with_stdin {
        let (r, w) = pipe_cloexec()?;
        (r, Some(w))
    } else {
        // SAFETY: NUL-terminated static path.
        let fd = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        check(fd as libc::c_long)?;
        // SAFETY: just opened, owned by nobody else.
        (unsafe { OwnedFd::from_raw_fd(fd) }, None)
    };
    let (stdout_parent, stdout_child) = pipe_cloexec()?;
    let (stderr_parent, stderr_child) = pipe_cloexec()?;
    let (status_r, status_w) = pipe_cloexec()?;
    let ignored = ignored_signals();

    let mut args = CloneArgs {
        flags: if cgroup_dir.is_some() {
            CLONE_INTO_CGROUP
        } else {
            0
        },
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup_dir.map(|d| d.as_raw_fd() as u64).unwrap_or(0),
        ..CloneArgs::default()
    };
    // SAFETY: `args` is a valid clone_args of the size given. Without CLONE_VM the child
    // runs on a copy of our address space, like fork; it only makes raw system calls
    // (below) and leaves by exec or `_exit`.
    let mut pid = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid < 0 && cgroup_dir.is_none() && errno() == libc::ENOSYS {
        // No clone3 (< 5.3): the classic fork, same semantics without a cgroup.
        // SAFETY: clone with SIGCHLD only is fork(2); the child behaves as above.
        pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0) };
    }
    if pid < 0 {
        let e = io::Error::last_os_error();
        // Kept raw where the caller falls back; otherwise named, so that an EPERM of the
        // cgroup is not mistaken for the program's own "permission denied".
        return Err(if clone3_unavailable(&e) {
            e
        } else {
            io::Error::other(format!("clone3 into the call's cgroup: {e}"))
        });
    }
    if pid == 0 {
        let code = child_exec(
            ignored,
            [
                stdin_child.as_raw_fd(),
                stdout_child.as_raw_fd(),
                stderr_child.as_raw_fd(),
            ],
            status_w.as_raw_fd(),
            policy,
            &candidates,
            &argv_p,
            &mut sh_argv,
            &envp_p,
        );
        let bytes = code.to_ne_bytes();
        // SAFETY: writes 4 bytes from a local buffer, then ends the child without running
        // anything of the parent's.
        unsafe {
            libc::write(status_w.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
            libc::_exit(127)
        };
    }
    drop((stdin_child, stdout_child, stderr_child, status_w));
    // The status pipe closes on exec (success) or carries the child's errno.
    let mut buf = [0u8; 4];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: reads into the unfilled part of a local buffer.
        let n = unsafe {
            libc::read(
                status_r.as_raw_fd(),
                buf[got..].as_mut_ptr().cast(),
                buf.len() - got,
            )
        };
        match n {
            0 => break,
            n if n > 0 => got += n as usize,
            _ if errno() == libc::EINTR => continue,
            _ => return Err(io::Error::last_os_error()),
        }
    }
    if got == buf.len() {
        // The child has exited with 127; the agent's reaper collects it.
        return Err(io::Error::from_raw_os_error(i32::from_ne_bytes(buf)));
    }
    Ok(Spawned {
        pid: pid as i32,
        stdin: stdin_parent,
        stdout: stdout_parent,
        stderr: stderr_parent,
    })
}

/// The signals this process ignores (bit `n - 1` for signal `n`). Read once: the agent
/// sets its dispositions at start and never ignores more later.
fn ignored_signals() -> u64 {
    static IGNORED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *IGNORED.get_or_init(|| {
        let mut mask = 0u64;
        for sig in 1..=64i32 {
            let mut old = KernelSigaction {
                handler: 0,
                flags: 0,
                restorer: 0,
                mask: 0,
            };
            // SAFETY: a query (no new action) into a local struct of the kernel's layout.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    std::ptr::null::<KernelSigaction>(),
                    &mut old as *mut KernelSigaction,
                    8usize,
                )
            };
            if rc == 0 && old.handler == libc::SIG_IGN {
                mask |= 1u64 << (sig - 1);
            }
        }
        mask
    })
}

/// The kernel's `struct sigaction` on x86_64 (not glibc's).
#[repr(C)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// The child side of [`spawn_in_cgroup`]: raw system calls only. Returns the errno that
/// stopped it (it returns only on failure).
#[allow(clippy::too_many_arguments)]
fn child_exec(
    ignored: u64,
    stdio: [RawFd; 3],
    status: RawFd,
    policy: &ChildPolicy,
    candidates: &[CString],
    argv: &[*const libc::c_char],
    sh_argv: &mut [*const libc::c_char],
    envp: &[*const libc::c_char],
) -> i32 {
    // SAFETY: plain signal-state and fd calls; the sigset and the sigaction passed by
    // pointer are locals that outlive the calls.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        // Ignored signals stay ignored across exec (the agent ignores SIGPIPE; whatever
        // started the daemon may have ignored others): a user's program starts with every
        // disposition at its default. Handlers are reset by exec itself.
        // Raw rt_sigaction: glibc's wrapper refuses its internal signals 32 and 33, which
        // the agent's ancestry leaves ignored.
        let dfl = KernelSigaction {
            handler: libc::SIG_DFL,
            flags: 0,
            restorer: 0,
            mask: 0,
        };
        for sig in 1..=64i32 {
            if ignored & (1u64 << (sig - 1)) != 0 {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &dfl as *const KernelSigaction,
                    std::ptr::null_mut::<KernelSigaction>(),
                    8usize,
                );
            }
        }
        for (target, fd) in stdio.iter().enumerate() {
            if libc::dup2(*fd, target as i32) < 0 {
                return errno();
            }
        }
    }
    if let Err(e) = policy.enter_keeping(&[status]) {
        return e.raw_os_error().unwrap_or(libc::EPERM);
    }
    let (mut err, mut denied) = (libc::ENOENT, false);
    for c in candidates {
        // SAFETY: NUL-terminated path and NULL-terminated pointer arrays that live in this
        // (copied) address space until exec replaces it.
        unsafe { libc::execve(c.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
        err = errno();
        if err == libc::ENOEXEC {
            // Our own copy of the array (after fork): no allocation, no effect on the agent.
            sh_argv[1] = c.as_ptr();
            // SAFETY: as above; `sh_argv` is NULL-terminated and its strings live on.
            unsafe { libc::execve(SH.as_ptr(), sh_argv.as_ptr(), envp.as_ptr()) };
            return errno();
        }
        match err {
            libc::ENOENT | libc::ENOTDIR => {}
            libc::EACCES => denied = true,
            _ => break,
        }
    }
    if denied && matches!(err, libc::ENOENT | libc::ENOTDIR) {
        libc::EACCES
    } else {
        err
    }
}

/// Forks a child that enters `policy`, runs `f` and exits with its return value (126 when
/// the policy could not be entered, 101 when `f` panicked). Returns the child's pid; the
/// caller reaps it.
///
/// Refused unless the calling process has exactly one thread: only then may the child run
/// ordinary (allocating) Rust code after fork.
/// Every fd of the caller is closed in the child but `keep` (what `f` uses).
pub fn run_forked<F: FnOnce() -> i32>(
    policy: &ChildPolicy,
    keep: &[RawFd],
    f: F,
) -> io::Result<i32> {
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    if threads != 1 {
        return Err(io::Error::other(format!(
            "refusing to fork a process with {threads} threads"
        )));
    }
    // SAFETY: the process is single-threaded (checked above), so no lock can be held by a
    // thread that does not exist in the child; the child never returns from this function.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        let code = match policy.enter_keeping(keep) {
            Ok(()) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101),
            Err(_) => 126,
        };
        // SAFETY: ends the child without unwinding into the parent's code.
        unsafe { libc::_exit(code) };
    }
    Ok(pid)
}

/// How a child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitStatus {
    Exited(i32),
    Signaled(i32),
}

/// Reaps one terminated child of any pid without blocking: `Ok(None)` when none is
/// waiting (or there are no children).
pub fn reap_any() -> io::Result<Option<(i32, WaitStatus)>> {
    reap(-1)
}

/// Like [`reap_any`], but only for the child `pid` (other children stay unreaped).
pub fn reap_pid(pid: i32) -> io::Result<Option<(i32, WaitStatus)>> {
    reap(pid)
}

fn reap(which: i32) -> io::Result<Option<(i32, WaitStatus)>> {
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer.
        let pid = unsafe { libc::waitpid(which, &mut status, libc::WNOHANG) };
        if pid == 0 {
            return Ok(None);
        }
        if pid < 0 {
            match errno() {
                libc::EINTR => continue,
                libc::ECHILD => return Ok(None),
                _ => return Err(io::Error::last_os_error()),
            }
        }
        let ws = if libc::WIFSIGNALED(status) {
            WaitStatus::Signaled(libc::WTERMSIG(status))
        } else if libc::WIFEXITED(status) {
            WaitStatus::Exited(libc::WEXITSTATUS(status))
        } else {
            continue; // stopped/continued: not requested, not expected
        };
        return Ok(Some((pid, ws)));
    }
}

/// Sends `sig` to one process. `pid` must be positive (0 and -1 would reach many).
pub fn kill(pid: i32, sig: i32) -> io::Result<()> {
    if pid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: integer arguments only.
    check(unsafe { libc::kill(pid, sig) } as libc::c_long)
}

/// Sends `sig` to every process of process group `pgid` (which must be > 1).
pub fn kill_group(pgid: i32, sig: i32) -> io::Result<()> {
    if pgid <= 1 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: integer arguments only.
    check(unsafe { libc::kill(-pgid, sig) } as libc::c_long)
}

/// PR_SET_DUMPABLE: a non-dumpable process cannot be ptraced or have its /proc files read
/// by other users (the agent is non-dumpable).
pub fn set_dumpable(on: bool) -> io::Result<()> {
    // SAFETY: integer arguments only.
    check(
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, on as libc::c_ulong, 0, 0, 0) } as libc::c_long,
    )
}

/// Orphans of our descendants are re-parented to us (so we reap them) even when we are not
/// PID 1, as in the agent's host test mode.
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } as libc::c_long)
}

/// Sets the process umask.
pub fn set_umask(mask: u32) {
    // SAFETY: umask cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) };
}

/// Empties the supplementary group list of the calling process, so file operations done
/// under a temporary fsuid/fsgid get no group rights of ours.
pub fn clear_supplementary_groups() -> io::Result<()> {
    // SAFETY: a zero-length list with a null pointer is valid.
    check(unsafe { libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) })
}

/// While alive, the calling thread's filesystem uid/gid are the given ones (so permission
/// checks and the owner of new files are those of that user); dropping restores them.
#[derive(Debug)]
pub struct FsIdentity {
    prev_uid: libc::uid_t,
    prev_gid: libc::gid_t,
}

fn set_fsgid(gid: libc::gid_t) -> libc::gid_t {
    // SAFETY: integer argument; returns the previous fsgid.
    unsafe { libc::setfsgid(gid) as libc::gid_t }
}

fn set_fsuid(uid: libc::uid_t) -> libc::uid_t {
    // SAFETY: integer argument; returns the previous fsuid.
    unsafe { libc::setfsuid(uid) as libc::uid_t }
}

/// Switches the filesystem identity of the calling thread (see [`FsIdentity`]).
pub fn assume_fs_identity(uid: libc::uid_t, gid: libc::gid_t) -> io::Result<FsIdentity> {
    let prev_gid = set_fsgid(gid);
    // setfsgid(-1) fails and returns the current value: the only way to check.
    if set_fsgid(u32::MAX) != gid {
        set_fsgid(prev_gid);
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    let prev_uid = set_fsuid(uid);
    if set_fsuid(u32::MAX) != uid {
        set_fsuid(prev_uid);
        set_fsgid(prev_gid);
        return Err(io::Error::from_raw_os_error(libc::EPERM));
    }
    Ok(FsIdentity { prev_uid, prev_gid })
}

impl Drop for FsIdentity {
    fn drop(&mut self) {
        set_fsuid(self.prev_uid);
        set_fsgid(self.prev_gid);
    }
}

/// `RESOLVE_NO_MAGICLINKS`: /proc/<pid>/fd/* style links are not followed.
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
/// `RESOLVE_NO_SYMLINKS`.
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// `openat2(2)` relative to `dir` (or the cwd). `O_CLOEXEC` is always added. On kernels
/// without openat2 (< 5.6) falls back to `openat`, losing the `resolve` restrictions.
pub fn openat2(
    dir: Option<BorrowedFd<'_>>,
    path: &Path,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let dirfd = dir.map(|d| d.as_raw_fd()).unwrap_or(libc::AT_FDCWD);
    let flags = flags | libc::O_CLOEXEC;
    let mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        mode
    } else {
        0
    };
    let how = OpenHow {
        flags: flags as u64,
        mode: mode as u64,
        resolve,
    };
    // SAFETY: `c` is NUL-terminated and `how` is a valid open_how of the size passed.
    let mut rc = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd,
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if rc < 0 && errno() == libc::ENOSYS {
        // SAFETY: as above, with the classic calling convention.
        rc =
            unsafe { libc::openat(dirfd, c.as_ptr(), flags, mode as libc::c_uint) } as libc::c_long;
    }
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as RawFd) })
}

/// The filesystem type (`f_type` of fstatfs) of an open file.
pub fn fs_type(fd: BorrowedFd<'_>) -> io::Result<i64> {
    // SAFETY: statfs is plain data; zeroed is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out-pointer.
    check(unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } as libc::c_long)?;
    Ok(st.f_type as i64)
}

/// Pseudo filesystems that the file API must never read or write through a symlink.
pub fn is_kernel_interface_fs(f_type: i64) -> bool {
    const MAGICS: &[i64] = &[
        libc::PROC_SUPER_MAGIC,
        libc::SYSFS_MAGIC,
        libc::CGROUP2_SUPER_MAGIC,
        libc::CGROUP_SUPER_MAGIC,
        libc::DEBUGFS_MAGIC,
        libc::SECURITYFS_MAGIC,
        libc::BPF_FS_MAGIC,
        libc::TRACEFS_MAGIC,
        libc::DEVPTS_SUPER_MAGIC,
        0x4249_4e4d, // binfmt_misc
        0x6e73_6673, // nsfs
    ];
    MAGICS.contains(&f_type)
}

static TAKEN_FDS: AtomicU64 = AtomicU64::new(0);

/// Takes ownership of a descriptor inherited from the parent process (e.g. `--listen-fd
/// 3`) after checking that it is open, and marks it close-on-exec. Each fd number below 64
/// can be taken once; others are refused.
pub fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if !(3..64).contains(&fd) {
        return Err(io::Error::other(format!(
            "inherited fd {fd} is outside 3..64"
        )));
    }
    let bit = 1u64 << fd;
    if TAKEN_FDS.fetch_or(bit, Ordering::SeqCst) & bit != 0 {
        return Err(io::Error::other(format!("fd {fd} was already taken")));
    }
    // SAFETY: F_GETFD only queries the descriptor.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFD on a descriptor known to be open.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } as libc::c_long)?;
    // SAFETY: the fd is open (checked), was handed to this process for it to own, and the
    // bitmap guarantees no second OwnedFd is made from it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A directory handle for `*at` operations (used for the sandbox's cgroup directory).
#[derive(Debug)]
pub struct DirFd(OwnedFd);

impl DirFd {
    /// Opens a directory by path.
    pub fn open(path: &Path) -> io::Result<DirFd> {
        openat2(None, path, libc::O_RDONLY | libc::O_DIRECTORY, 0, 0).map(DirFd)
    }

    /// Wraps an fd that must refer to a directory.
    pub fn from_fd(fd: OwnedFd) -> io::Result<DirFd> {
        // SAFETY: stat is plain data; zeroed is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd and out-pointer.
        check(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } as libc::c_long)?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(DirFd(fd))
    }

    fn cname(name: &str) -> io::Result<CString> {
        CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    pub fn mkdir(&self, name: &str, mode: u32) -> io::Result<()> {
        let c = Self::cname(name)?;
        // SAFETY: valid dirfd and NUL-terminated name.
        check(
            unsafe { libc::mkdirat(self.0.as_raw_fd(), c.as_ptr(), mode as libc::mode_t) }
                as libc::c_long,
        )
    }

    pub fn rmdir(&self, name: &str) -> io::Result<()> {
        let c = Self::cname(name)?;
        // SAFETY: valid dirfd and NUL-terminated name.
        check(
            unsafe { libc::unlinkat(self.0.as_raw_fd(), c.as_ptr(), libc::AT_REMOVEDIR) }
                as libc::c_long,
        )
    }

    /// Opens the directory `rel` (no symlinks followed).
    pub fn open_dir(&self, rel: &str) -> io::Result<OwnedFd> {
        openat2(
            Some(self.0.as_fd_borrow()),
            Path::new(rel),
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
            RESOLVE_NO_SYMLINKS,
        )
    }

    /// Opens `rel` (no symlinks followed) for writing.
    pub fn open_write(&self, rel: &str) -> io::Result<OwnedFd> {
        openat2(
            Some(self.0.as_fd_borrow()),
            Path::new(rel),
            libc::O_WRONLY,
            0,
            RESOLVE_NO_SYMLINKS,
        )
    }

    /// Writes `data` to the file `rel` in one write (cgroup interface files want that).
    pub fn write_file(&self, rel: &str, data: &[u8]) -> io::Result<()> {
        let fd = self.open_write(rel)?;
        // SAFETY: valid fd and buffer of the given length.
        let n = unsafe { libc::write(fd.as_raw_fd(), data.as_ptr().cast(), data.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n as usize != data.len() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

trait AsFdBorrow {
    fn as_fd_borrow(&self) -> BorrowedFd<'_>;
}

impl AsFdBorrow for OwnedFd {
    fn as_fd_borrow(&self) -> BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(self)
    }
}

/// Tries `unshare(flags)`. Only for posture probes in a disposable child: on success the
/// caller is in new namespaces.
pub fn probe_unshare(flags: i32) -> io::Result<()> {
    // SAFETY: integer argument only.
    check(unsafe { libc::unshare(flags) } as libc::c_long)
}

/// Tries to mount a tmpfs on `target`. Only for posture probes in a disposable child.
pub fn probe_mount_tmpfs(target: &Path) -> io::Result<()> {
    let t = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: NUL-terminated strings; no data argument.
    check(unsafe {
        libc::mount(
            c"none".as_ptr(),
            t.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            std::ptr::null(),
        )
    } as libc::c_long)
}

/// Tries `fsopen("tmpfs")` (the new mount API). Only for posture probes.
pub fn probe_fsopen() -> io::Result<()> {
    // SAFETY: NUL-terminated string and integer flags; a returned fd is closed at once.
    let rc = unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), 0u32) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new fd owned by nobody else.
    drop(unsafe { OwnedFd::from_raw_fd(rc as RawFd) });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_refuses_broadcast_pids() {
        assert!(kill(0, 0).is_err());
        assert!(kill(-1, 0).is_err());
        assert!(kill_group(1, 0).is_err());
    }

    #[test]
    fn openat2_refuses_magic_links() {
        let err = openat2(
            None,
            Path::new("/proc/self/fd/0"),
            libc::O_RDONLY,
            0,
            RESOLVE_NO_MAGICLINKS,
        )
        .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        let fd = openat2(
            None,
            Path::new("/proc/self/status"),
            libc::O_RDONLY,
            0,
            RESOLVE_NO_MAGICLINKS,
        )
        .unwrap();
        assert!(is_kernel_interface_fs(
            fs_type(std::os::fd::AsFd::as_fd(&fd)).unwrap()
        ));
    }
}
