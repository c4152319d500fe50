//! Test support: forking from the (multithreaded) test harness, and raw system calls by
//! number for the seccomp and Landlock tests.

use std::io;

/// Runs `f` in a forked child and returns the child's wait status. Contract: `f` makes raw
/// system calls only (the harness is multithreaded, so the child must not allocate) and
/// returns the exit code.
pub(crate) fn in_child(f: impl FnOnce() -> i32) -> i32 {
    // SAFETY: by the contract above the child makes only async-signal-safe calls before
    // `_exit`, so no lock of another thread matters.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
    if pid == 0 {
        super::process::exit_now(f());
    }
    let (reaped, status) = super::process::waitpid(pid, 0).expect("waitpid");
    assert_eq!(reaped, pid);
    status
}

/// The system call `nr` with six integer arguments: its return value and errno. Only for
/// tests under a seccomp filter, with calls whose integer arguments name no memory.
pub(crate) fn syscall6(nr: i64, args: [u64; 6]) -> (i64, i32) {
    // SAFETY: test-only; callers pass numbers and integer arguments that either fail in
    // the filter or act on no memory of ours (getpid, a zero-argument call in a child).
    let r = unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) };
    (r, super::errno())
}
