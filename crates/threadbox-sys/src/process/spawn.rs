//! Starting processes: `clone3(CLONE_INTO_CGROUP)` for the agent's execs, and a checked
//! `fork` for code that runs Rust in the child ([`run_forked`]).

use super::policy::ChildPolicy;
use crate::raw;
use crate::raw::process::{CStrArray, CloneArgs, Forked};
use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

/// A process started by [`spawn_in_cgroup`]: its pid and the parent's ends of its pipes.
#[derive(Debug)]
pub struct Spawned {
    pub pid: i32,
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
const SH: &CStr = c"/bin/sh";

fn cstring(b: &[u8]) -> io::Result<CString> {
    raw::process::cstring(b)
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
    spawn_in_cgroup_passing(cmd, cgroup_dir, policy, with_stdin, None)
}

/// [`spawn_in_cgroup`], and the child inherits `pass` (at the same fd number, which must
/// be ≥ 3): the private control socket of an interpreter worker. Every other fd of the
/// agent is closed in the child as usual.
pub fn spawn_in_cgroup_passing(
    cmd: &Command,
    cgroup_dir: Option<BorrowedFd<'_>>,
    policy: &ChildPolicy,
    with_stdin: bool,
    pass: Option<BorrowedFd<'_>>,
) -> io::Result<Spawned> {
    let (pid, pipes) = spawn_with(
        cmd,
        cgroup_dir,
        policy,
        StdioPlan::Pipes { with_stdin },
        pass,
    )?;
    let Some((stdin, stdout, stderr)) = pipes else {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    };
    Ok(Spawned {
        pid,
        stdin,
        stdout,
        stderr,
    })
}

/// [`spawn_in_cgroup`] on a terminal: `terminal` (the peer of a pty, see
/// [`super::pty`]) becomes the child's stdin, stdout, stderr and, after the policy's
/// `setsid`, its controlling terminal (`TIOCSCTTY`), so job control and `SIGWINCH` work.
/// Returns the pid; the caller keeps the master.
pub fn spawn_on_terminal(
    cmd: &Command,
    cgroup_dir: Option<BorrowedFd<'_>>,
    policy: &ChildPolicy,
    terminal: BorrowedFd<'_>,
) -> io::Result<i32> {
    spawn_with(
        cmd,
        cgroup_dir,
        policy,
        StdioPlan::Terminal(terminal.as_raw_fd()),
        None,
    )
    .map(|(pid, _)| pid)
}

/// Where a child's fds 0, 1 and 2 come from.
enum StdioPlan {
    Pipes { with_stdin: bool },
    Terminal(RawFd),
}

type Pipes = (Option<OwnedFd>, OwnedFd, OwnedFd);

fn spawn_with(
    cmd: &Command,
    cgroup_dir: Option<BorrowedFd<'_>>,
    policy: &ChildPolicy,
    plan: StdioPlan,
    pass: Option<BorrowedFd<'_>>,
) -> io::Result<(i32, Option<Pipes>)> {
    let pass = pass.map(|fd| fd.as_raw_fd());
    if matches!(pass, Some(fd) if fd < 3) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
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
    let argv_p = CStrArray::new(argv.iter().map(|c| c.as_c_str()));
    let envp_p = CStrArray::new(envp.iter().map(|c| c.as_c_str()));
    // For a file the kernel cannot execute (ENOEXEC: a script without `#!`), `execvp` runs
    // it with /bin/sh, and so do shells; slot 1 takes the candidate's path in the child.
    let mut sh_argv = CStrArray::new(
        [SH, SH]
            .into_iter()
            .chain(argv.iter().skip(1).map(|c| c.as_c_str())),
    );

    // The child's ends (dropped in the parent after the fork) and the parent's pipes.
    let (child_ends, stdio, ctty, parent_pipes): (Vec<OwnedFd>, [RawFd; 3], bool, Option<Pipes>) =
        match plan {
            StdioPlan::Pipes { with_stdin } => {
                let (stdin_child, stdin_parent) = if with_stdin {
                    let (r, w) = raw::fd::pipe_cloexec()?;
                    (r, Some(w))
                } else {
                    (
                        raw::fd::open(c"/dev/null", libc::O_RDONLY | libc::O_CLOEXEC)?,
                        None,
                    )
                };
                let (stdout_parent, stdout_child) = raw::fd::pipe_cloexec()?;
                let (stderr_parent, stderr_child) = raw::fd::pipe_cloexec()?;
                let stdio = [
                    stdin_child.as_raw_fd(),
                    stdout_child.as_raw_fd(),
                    stderr_child.as_raw_fd(),
                ];
                (
                    vec![stdin_child, stdout_child, stderr_child],
                    stdio,
                    false,
                    Some((stdin_parent, stdout_parent, stderr_parent)),
                )
            }
            StdioPlan::Terminal(fd) => (Vec::new(), [fd, fd, fd], true, None),
        };
    let (status_r, status_w) = raw::fd::pipe_cloexec()?;
    let ignored = ignored_signals();
    // In the gvisor sandbox's own pid namespace (ADR 0218) the child's pid there differs
    // from the one fork returns here: it sends it first, for the API to report.
    let report_pid = crate::process::pidns::init_pid().is_some();

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
    // The child side (below) makes raw system calls only and leaves by exec or _exit: the
    // contract of `raw::process::clone3`.
    let mut forked = raw::process::clone3(&mut args);
    if cgroup_dir.is_none() && matches!(&forked, Err(e) if e.raw_os_error() == Some(libc::ENOSYS)) {
        // No clone3 (< 5.3): the classic fork, same semantics without a cgroup.
        forked = raw::process::clone_fork();
    }
    let pid = match forked {
        Ok(Forked::Parent(pid)) => pid,
        Ok(Forked::Child) => {
            if report_pid {
                // getpid(2) and write(2) of a local buffer only (the child's contract).
                let me = std::process::id() as i32;
                let _ = raw::fd::write(status_w.as_fd(), &me.to_ne_bytes());
            }
            let code = child_exec(
                ignored,
                stdio,
                ctty,
                status_w.as_raw_fd(),
                pass,
                policy,
                &candidates,
                &argv_p,
                &mut sh_argv,
                &envp_p,
            );
            // 4 bytes from a local buffer, then the child ends without running anything of
            // the parent's.
            let _ = raw::fd::write(status_w.as_fd(), &code.to_ne_bytes());
            raw::process::exit_now(127)
        }
        Err(e) => {
            // Kept raw where the caller falls back; otherwise named, so that an EPERM of
            // the cgroup is not mistaken for the program's own "permission denied".
            return Err(if clone3_unavailable(&e) {
                e
            } else {
                io::Error::other(format!("clone3 into the call's cgroup: {e}"))
            });
        }
    };
    drop((child_ends, status_w));
    if report_pid {
        match read_i32(status_r.as_fd())? {
            Some(inner) => crate::process::pidns::record_view(pid, inner),
            // Gone before its first step (killed): the exec failed.
            None => return Err(io::Error::from_raw_os_error(libc::ECHILD)),
        }
    }
    // The status pipe closes on exec (success) or carries the child's errno.
    if let Some(errno) = read_i32(status_r.as_fd())? {
        // The child has exited with 127; the agent's reaper collects it.
        return Err(io::Error::from_raw_os_error(errno));
    }
    Ok((pid, parent_pipes))
}

/// The next 4 bytes of the status pipe as an `i32`; `None` at its end (fewer bytes).
fn read_i32(fd: BorrowedFd<'_>) -> io::Result<Option<i32>> {
    let mut buf = [0u8; 4];
    let mut got = 0;
    while got < buf.len() {
        match raw::fd::read(fd, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok((got == buf.len()).then(|| i32::from_ne_bytes(buf)))
}

/// The signals this process ignores (bit `n - 1` for signal `n`). Read once: the agent
/// sets its dispositions at start and never ignores more later.
fn ignored_signals() -> u64 {
    static IGNORED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *IGNORED.get_or_init(|| {
        (1..=64i32)
            .filter(|&sig| raw::process::signal_ignored(sig))
            .fold(0u64, |mask, sig| mask | 1u64 << (sig - 1))
    })
}

/// The child side of [`spawn_in_cgroup`]: raw system calls only. Returns the errno that
/// stopped it (it returns only on failure).
#[allow(clippy::too_many_arguments)]
fn child_exec<'a>(
    ignored: u64,
    stdio: [RawFd; 3],
    ctty: bool,
    status: RawFd,
    pass: Option<RawFd>,
    policy: &ChildPolicy,
    candidates: &'a [CString],
    argv: &CStrArray<'_>,
    sh_argv: &mut CStrArray<'a>,
    envp: &CStrArray<'_>,
) -> i32 {
    raw::process::unblock_all_signals();
    // Ignored signals stay ignored across exec (the agent ignores SIGPIPE; whatever
    // started the daemon may have ignored others): a user's program starts with every
    // disposition at its default. Handlers are reset by exec itself.
    for sig in 1..=64i32 {
        if ignored & (1u64 << (sig - 1)) != 0 {
            raw::process::signal_default(sig);
        }
    }
    for (target, fd) in stdio.iter().enumerate() {
        if let Err(e) = raw::fd::dup2(*fd, target as i32) {
            return e.raw_os_error().unwrap_or(libc::EBADF);
        }
    }
    let keep = match pass {
        Some(fd) => {
            // The agent's copy is close-on-exec; the child's must survive the exec.
            if let Err(e) = raw::fd::set_fd_flags(fd, 0) {
                return e.raw_os_error().unwrap_or(libc::EBADF);
            }
            [status, fd]
        }
        None => [status, status],
    };
    if let Err(e) = policy.enter_keeping(&keep) {
        return e.raw_os_error().unwrap_or(libc::EPERM);
    }
    // After the policy's setsid: the new session leader takes its terminal, whose
    // foreground process group becomes the leader's (job control).
    if ctty {
        if let Err(e) = raw::pty::set_controlling(0) {
            return e.raw_os_error().unwrap_or(libc::ENOTTY);
        }
    }
    let (mut err, mut denied) = (libc::ENOENT, false);
    for c in candidates {
        err = raw::process::execve(c, argv, envp);
        if err == libc::ENOEXEC {
            // Our own copy of the array (after fork): no allocation, no effect on the agent.
            sh_argv.set(1, c);
            return raw::process::execve(SH, sh_argv, envp);
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
    match raw::process::fork_single_threaded()? {
        Forked::Parent(pid) => Ok(pid),
        Forked::Child => {
            let code = match policy.enter_keeping(keep) {
                Ok(()) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(101),
                Err(_) => 126,
            };
            // Ends the child without unwinding into the parent's code.
            raw::process::exit_now(code)
        }
    }
}
