//! Processes: fork and clone3, exec, wait, signals, ids, capabilities, prctl, limits.

use super::{cvt, cvt_int};
use std::ffi::{CStr, CString};
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

/// Where a fork-like call returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Forked {
    /// In the parent, with the child's pid.
    Parent(i32),
    /// In the child.
    Child,
}

fn forked(rc: libc::c_long) -> io::Result<Forked> {
    match cvt(rc)? {
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid as i32)),
    }
}

/// The number of threads of this process (`/proc/self/task`, of the procfs the agent
/// reads processes from: on gvisor, `/proc` shows a namespace the agent is not in).
pub(crate) fn thread_count() -> io::Result<usize> {
    Ok(crate::process::pidns::proc_numbers("self/task")?.len())
}

/// `fork()`, refused unless the process has exactly one thread: only then may the child
/// run ordinary (allocating) Rust code, since no lock can be held by a thread that does
/// not exist in the child.
pub(crate) fn fork_single_threaded() -> io::Result<Forked> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "refusing to fork a process with {threads} threads"
        )));
    }
    // SAFETY: the process is single-threaded (checked just above), so the child's copy of
    // the address space holds no lock of another thread; libc's fork runs its atfork
    // handlers and resets its thread state.
    forked(unsafe { libc::fork() } as libc::c_long)
}

/// `struct clone_args` of clone3(2), up to and including `cgroup` (CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Debug, Default)]
pub(crate) struct CloneArgs {
    pub flags: u64,
    pub pidfd: u64,
    pub child_tid: u64,
    pub parent_tid: u64,
    pub exit_signal: u64,
    pub stack: u64,
    pub stack_size: u64,
    pub tls: u64,
    pub set_tid: u64,
    pub set_tid_size: u64,
    pub cgroup: u64,
}

/// `clone3(args)` without `CLONE_VM`: the child gets a copy of the address space.
///
/// Contract: in [`Forked::Child`] the caller makes raw system calls only (this module's
/// functions, no allocation, no lock) and leaves by exec or [`exit_now`]. Unlike glibc's
/// `fork`, a raw clone3 runs no atfork handler and does not reset libc's thread
/// descriptor (its cached TID, its internal locks), which is why nothing of libc beyond
/// plain system call wrappers may run in the child. No pointer flag (`CLONE_PIDFD`,
/// `CLONE_SETTLS`, `CLONE_VM`, a stack) is accepted: `args` may carry only flags, an exit
/// signal and a cgroup fd.
pub(crate) fn clone3(args: &mut CloneArgs) -> io::Result<Forked> {
    const POINTER_FLAGS: u64 = (libc::CLONE_VM
        | libc::CLONE_PIDFD
        | libc::CLONE_SETTLS
        | libc::CLONE_PARENT_SETTID
        | libc::CLONE_CHILD_SETTID
        | libc::CLONE_CHILD_CLEARTID) as u64;
    if args.flags & POINTER_FLAGS != 0 || args.stack != 0 || args.set_tid != 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `args` is a valid clone_args of the size given that names no memory (checked
    // above); without CLONE_VM the child runs on a copy of our address space and, by the
    // contract above, only makes raw system calls before exec or _exit.
    forked(unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    })
}

/// `clone(SIGCHLD)`, i.e. fork(2) without libc's handlers: the fallback of [`clone3`] on
/// kernels without it, under the same contract.
pub(crate) fn clone_fork() -> io::Result<Forked> {
    // SAFETY: clone with SIGCHLD only and no stack is fork(2); the child keeps the
    // contract of `clone3` above.
    forked(unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_ulong, 0, 0, 0, 0) })
}

/// `_exit(code)`: ends the process without unwinding or running atexit handlers.
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions and does not return.
    unsafe { libc::_exit(code) }
}

/// A NULL-terminated array of C string pointers for exec, borrowing its strings.
#[derive(Debug)]
pub(crate) struct CStrArray<'a> {
    ptrs: Vec<*const libc::c_char>,
    _strings: PhantomData<&'a CStr>,
}

impl<'a> CStrArray<'a> {
    pub(crate) fn new<I: IntoIterator<Item = &'a CStr>>(items: I) -> CStrArray<'a> {
        let mut ptrs: Vec<*const libc::c_char> = items.into_iter().map(|c| c.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        CStrArray {
            ptrs,
            _strings: PhantomData,
        }
    }

    /// Replaces entry `i` (not the terminating NULL) with `s`, without allocating (the
    /// child side of a fork may do this).
    pub(crate) fn set(&mut self, i: usize, s: &'a CStr) {
        if i + 1 < self.ptrs.len() {
            self.ptrs[i] = s.as_ptr();
        }
    }
}

/// `execve(path, argv, envp)`: returns only on failure, with its errno.
pub(crate) fn execve(path: &CStr, argv: &CStrArray<'_>, envp: &CStrArray<'_>) -> i32 {
    // SAFETY: `path` is NUL-terminated; both arrays are NULL-terminated and point to
    // strings that outlive the call (their lifetime is tied to the arrays).
    unsafe { libc::execve(path.as_ptr(), argv.ptrs.as_ptr(), envp.ptrs.as_ptr()) };
    super::errno()
}

/// `execveat(fd, "", argv, envp, AT_EMPTY_PATH)`: runs the file open on `fd`; returns
/// only on failure.
pub(crate) fn execveat_fd(fd: RawFd, argv: &CStrArray<'_>, envp: &CStrArray<'_>) -> io::Error {
    // SAFETY: an empty NUL-terminated path with AT_EMPTY_PATH; both arrays are
    // NULL-terminated and point to strings that outlive the call.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd,
            c"".as_ptr(),
            argv.ptrs.as_ptr(),
            envp.ptrs.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    io::Error::last_os_error()
}

/// `waitpid(which, &status, flags)`: the pid reaped (0 with WNOHANG and none ready) and
/// its raw status.
pub(crate) fn waitpid(which: i32, flags: i32) -> io::Result<(i32, i32)> {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer.
    let pid = cvt_int(unsafe { libc::waitpid(which, &mut status, flags) })?;
    Ok((pid, status))
}

/// `kill(pid, sig)`. `pid` is passed as is (callers refuse 0 and -1 where they must).
pub(crate) fn kill(pid: i32, sig: i32) -> io::Result<()> {
    // SAFETY: integer arguments; kill(2) has no memory effect on this process.
    cvt_int(unsafe { libc::kill(pid, sig) }).map(drop)
}

/// `setsid()`.
pub(crate) fn setsid() -> io::Result<()> {
    // SAFETY: no arguments.
    cvt_int(unsafe { libc::setsid() }).map(drop)
}

/// `prctl(option, arg2, arg3, 0, 0)` for the read-only queries the selftest makes:
/// `PR_GET_NO_NEW_PRIVS` and `PR_CAP_AMBIENT` with `PR_CAP_AMBIENT_IS_SET`. Any other
/// option or sub-command is refused with EINVAL.
pub(crate) fn prctl_query(
    option: i32,
    arg2: libc::c_ulong,
    arg3: libc::c_ulong,
) -> io::Result<i32> {
    let allowed = option == libc::PR_GET_NO_NEW_PRIVS
        || (option == libc::PR_CAP_AMBIENT && arg2 == libc::PR_CAP_AMBIENT_IS_SET as libc::c_ulong);
    if !allowed {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: both queries read integer arguments only and write no memory of ours.
    cvt_int(unsafe { libc::prctl(option, arg2, arg3, 0, 0) })
}

/// `prctl(option, arg2, 0, 0, 0)` for the options that take integers only and touch no
/// memory of ours. Any other option is refused with EINVAL.
pub(crate) fn prctl(option: i32, arg2: libc::c_ulong) -> io::Result<i32> {
    const INTEGER_ONLY: &[i32] = &[
        libc::PR_CAP_AMBIENT,
        libc::PR_CAPBSET_READ,
        libc::PR_CAPBSET_DROP,
        libc::PR_SET_SECUREBITS,
        libc::PR_SET_NO_NEW_PRIVS,
        libc::PR_SET_KEEPCAPS,
        libc::PR_SET_DUMPABLE,
        libc::PR_SET_CHILD_SUBREAPER,
    ];
    if !INTEGER_ONLY.contains(&option) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: one of the options above, each of which reads integer arguments only.
    cvt_int(unsafe { libc::prctl(option, arg2, 0, 0, 0) })
}

/// `setgroups(groups)` (the raw system call: this thread only, no libc broadcast).
pub(crate) fn setgroups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: a live slice of gid_t of the given length (null and 0 for an empty one is
    // valid too; a slice pointer is never null).
    cvt(unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) }).map(drop)
}

/// `setresgid(r, e, s)` (raw system call; `u32::MAX` leaves an id unchanged).
pub(crate) fn setresgid(r: u32, e: u32, s: u32) -> io::Result<()> {
    // SAFETY: integer arguments only.
    cvt(unsafe { libc::syscall(libc::SYS_setresgid, r, e, s) }).map(drop)
}

/// `setresuid(r, e, s)` (raw system call; `u32::MAX` leaves an id unchanged).
pub(crate) fn setresuid(r: u32, e: u32, s: u32) -> io::Result<()> {
    // SAFETY: integer arguments only.
    cvt(unsafe { libc::syscall(libc::SYS_setresuid, r, e, s) }).map(drop)
}

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

/// `capset` emptying the effective, permitted and inheritable sets of this thread.
pub(crate) fn capset_none() -> io::Result<()> {
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: a header and a two-element data array as capset(2) requires for version 3,
    // both alive for the call; the kernel only reads them.
    cvt(unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) })
        .map(drop)
}

/// `geteuid()` and `getegid()`.
pub(crate) fn effective_ids() -> (libc::uid_t, libc::gid_t) {
    // SAFETY: no arguments; geteuid always succeeds.
    let uid = unsafe { libc::geteuid() };
    // SAFETY: no arguments; getegid always succeeds.
    let gid = unsafe { libc::getegid() };
    (uid, gid)
}

/// `setfsuid(uid)`: returns the previous fsuid (`u32::MAX` queries).
pub(crate) fn setfsuid(uid: libc::uid_t) -> libc::uid_t {
    // SAFETY: integer argument; returns the previous fsuid.
    unsafe { libc::setfsuid(uid) as libc::uid_t }
}

/// `setfsgid(gid)`: returns the previous fsgid (`u32::MAX` queries).
pub(crate) fn setfsgid(gid: libc::gid_t) -> libc::gid_t {
    // SAFETY: integer argument; returns the previous fsgid.
    unsafe { libc::setfsgid(gid) as libc::gid_t }
}

/// `umask(mask)`.
pub(crate) fn umask(mask: u32) {
    // SAFETY: umask cannot fail and touches no memory.
    unsafe { libc::umask(mask as libc::mode_t) };
}

/// `sync()`: every file system's dirty data on its way to storage.
pub(crate) fn sync() {
    // SAFETY: sync takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::sync() };
}

/// `fchdir(fd)`.
pub(crate) fn fchdir(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a valid descriptor.
    cvt_int(unsafe { libc::fchdir(fd.as_raw_fd()) }).map(drop)
}

/// `chdir(path)`.
pub(crate) fn chdir(path: &CStr) -> io::Result<()> {
    // SAFETY: a NUL-terminated path that lives for the call.
    cvt_int(unsafe { libc::chdir(path.as_ptr()) }).map(drop)
}

/// `unshare(flags)`. Contract: the process is single-threaded where the flags require it
/// (CLONE_NEWUSER, CLONE_NEWNS with shared fs), which the kernel checks itself.
pub(crate) fn unshare(flags: i32) -> io::Result<()> {
    // SAFETY: integer flags; unshare changes kernel state only, no memory of ours.
    cvt_int(unsafe { libc::unshare(flags) }).map(drop)
}

/// `sethostname(name)`.
pub(crate) fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes; the kernel only reads them.
    cvt_int(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// `setrlimit(resource, {v, v})`.
pub(crate) fn setrlimit(resource: libc::__rlimit_resource_t, v: u64) -> io::Result<()> {
    let r = libc::rlimit {
        rlim_cur: v,
        rlim_max: v,
    };
    // SAFETY: `r` is a valid rlimit the kernel only reads.
    cvt_int(unsafe { libc::setrlimit(resource, &r) }).map(drop)
}

/// `getrlimit(resource)`.
pub(crate) fn getrlimit(resource: libc::__rlimit_resource_t) -> io::Result<libc::rlimit> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit to fill.
    cvt_int(unsafe { libc::getrlimit(resource, &mut r) })?;
    Ok(r)
}

/// The kernel's `struct sigaction` on x86_64 (not glibc's).
#[repr(C)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// Whether signal `sig` is ignored (raw `rt_sigaction` query: glibc's wrapper refuses its
/// internal signals 32 and 33).
pub(crate) fn signal_ignored(sig: i32) -> bool {
    let mut old = KernelSigaction {
        handler: 0,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: a query (no new action) into a local struct of the kernel's layout and size.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            std::ptr::null::<KernelSigaction>(),
            &mut old as *mut KernelSigaction,
            8usize,
        )
    };
    rc == 0 && old.handler == libc::SIG_IGN
}

/// Resets signal `sig` to its default disposition (raw `rt_sigaction`, see above). No
/// handler address is ever installed: nothing of ours can be called by the kernel.
pub(crate) fn signal_default(sig: i32) {
    let dfl = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: SIG_DFL from a local struct of the kernel's layout and size.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            &dfl as *const KernelSigaction,
            std::ptr::null_mut::<KernelSigaction>(),
            8usize,
        )
    };
}

/// Unblocks every signal of this thread (`sigprocmask(SIG_SETMASK, {})`).
pub(crate) fn unblock_all_signals() {
    let set = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: a zeroed sigset_t is the empty set on Linux (what sigemptyset writes); the
    // set outlives the call and no old set is asked for.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, set.as_ptr(), std::ptr::null_mut()) };
}

/// Makes a C string of `b`, EINVAL at an inner NUL.
pub(crate) fn cstring(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// `capget` then `capset`: `cap` leaves the effective, permitted and inheritable sets of
/// this thread (the others stay).
pub(crate) fn capset_without(cap: u32) -> io::Result<()> {
    if cap >= 64 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: a header and a two-element data array as capget(2) requires for version 3,
    // both alive for the call; the kernel writes only into `data`.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_capget,
            &header as *const CapHeader,
            data.as_mut_ptr(),
        )
    })?;
    let (word, bit) = ((cap / 32) as usize, 1u32 << (cap % 32));
    data[word].effective &= !bit;
    data[word].permitted &= !bit;
    data[word].inheritable &= !bit;
    // SAFETY: as above; capset(2) only reads both.
    cvt(unsafe { libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr()) })
        .map(drop)
}

/// Blocks every signal of this thread (`sigprocmask(SIG_SETMASK, full)`): the pid
/// namespace's init takes SIGCHLD with [`wait_signal`] only.
pub(crate) fn block_all_signals() {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: `set` is valid for writes.
    unsafe { libc::sigfillset(set.as_mut_ptr()) };
    // SAFETY: `set` was initialised by sigfillset; no old set is asked for.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, set.as_ptr(), std::ptr::null_mut()) };
}

/// Waits until `sig` (blocked by the caller) is pending and takes it (`sigwaitinfo`).
pub(crate) fn wait_signal(sig: i32) -> io::Result<()> {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: `set` is valid for writes.
    unsafe { libc::sigemptyset(set.as_mut_ptr()) };
    // SAFETY: `set` was initialised by sigemptyset.
    unsafe { libc::sigaddset(set.as_mut_ptr(), sig) };
    // SAFETY: `set` is initialised; no siginfo is asked for (NULL is allowed).
    cvt_int(unsafe { libc::sigwaitinfo(set.as_ptr(), std::ptr::null_mut()) }).map(|_| ())
}

/// `prctl(PR_SET_NAME, name)`: the calling thread's name (its `comm`, at most 15 bytes).
pub(crate) fn set_name(name: &CStr) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and outlives the call; the kernel copies at most 16
    // bytes of it.
    cvt_int(unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) }).map(drop)
}
