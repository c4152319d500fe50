//! The seccomp policy of every process inside a sandbox, kept as data.
//!
//! (Over 600 lines on purpose: the tables are the policy, and a reviewer reads them in one
//! place. The compiler is in `bpf.rs`, loading in `install.rs`, the proofs in `tests.rs`.)
//!
//! The policy is a default-deny allowlist: a system call that no table below names fails
//! with `ENOSYS`, so C libraries fall back to older calls (glibc retries `clone3` as `clone`)
//! and new kernel features stay closed until someone reviews them. Calls that are known to
//! be dangerous are refused with `EPERM` (what a program expects from a missing privilege),
//! and a few calls are allowed only for harmless arguments.
//!
//! The compiled program (x86_64 only) is:
//!
//! 1. a prefix: a wrong architecture (i386 `int 0x80`) or an x32 system call number
//!    (bit 30 set) kills the process;
//! 2. a binary search over the system call number: the numbers 0..2^30 are cut into runs
//!    with one action each ([`ALLOW`] → allow, [`DENY`] → EPERM, [`NOT_IMPLEMENTED`] and
//!    unnamed numbers → ENOSYS, each [`CONDITIONAL`] call → its own argument check), and
//!    the program tests `nr >= start of a run` down a balanced tree of those runs.
//!
//! Why a tree and not a chain of `jeq`s (what `seccompiler` emits, ~1800 instructions for
//! this policy): the kernel prepares every new filter by emulating it for every system
//! call number (the per-filter allow cache) and checks and translates each instruction, so
//! loading cost grows with chain length, and the filter is loaded once per process we
//! start. The tree is ~4× shorter and each path ~9 tests deep; loading it is what made an
//! exec round trip ~1 ms slower than it needed to be (docs/performance.md).

mod bpf;
mod install;
#[cfg(test)]
mod tests;

pub use bpf::{agent_filter, sandbox_filter};
pub use install::{apply, apply_to_agent};

pub use seccompiler::sock_filter;

/// A classic BPF program.
pub type BpfProgram = Vec<sock_filter>;

/// One system call of the policy.
#[derive(Debug, Clone, Copy)]
pub struct Syscall {
    ident: &'static str,
    /// Its number on x86_64.
    pub nr: i64,
}

impl Syscall {
    /// The system call's name (`openat`, not `SYS_openat`).
    pub fn name(&self) -> &'static str {
        self.ident.trim_start_matches("SYS_")
    }
}

/// A group of system calls with one purpose and one reason.
#[derive(Debug)]
pub struct Group {
    pub purpose: &'static str,
    pub reason: &'static str,
    pub calls: &'static [Syscall],
}

/// System call numbers: libc's, plus x86_64 numbers newer than the libc crate knows.
#[allow(non_upper_case_globals)]
mod nr {
    pub use libc::*;
    pub const SYS_io_pgetevents: i64 = 333;
    pub const SYS_map_shadow_stack: i64 = 453;
    pub const SYS_futex_wake: i64 = 454;
    pub const SYS_futex_wait: i64 = 455;
    pub const SYS_futex_requeue: i64 = 456;
}

macro_rules! calls {
    ($($id:ident),* $(,)?) => {
        &[$(Syscall { ident: stringify!($id), nr: nr::$id }),*]
    };
}

/// Allowed unconditionally.
pub static ALLOW: &[Group] = &[
    Group {
        purpose: "file I/O",
        reason: "reading and writing files and descriptors is what every program does",
        calls: calls![
            SYS_read,
            SYS_write,
            SYS_open,
            SYS_openat,
            SYS_openat2,
            SYS_close,
            SYS_close_range,
            SYS_creat,
            SYS_lseek,
            SYS_pread64,
            SYS_pwrite64,
            SYS_readv,
            SYS_writev,
            SYS_preadv,
            SYS_pwritev,
            SYS_preadv2,
            SYS_pwritev2,
            SYS_sendfile,
            SYS_splice,
            SYS_tee,
            SYS_vmsplice,
            SYS_copy_file_range,
            SYS_dup,
            SYS_dup2,
            SYS_dup3,
            SYS_fcntl,
            SYS_flock,
            SYS_fsync,
            SYS_fdatasync,
            SYS_sync,
            SYS_syncfs,
            SYS_sync_file_range,
            SYS_truncate,
            SYS_ftruncate,
            SYS_fallocate,
            SYS_fadvise64,
            SYS_readahead,
        ],
    },
    Group {
        purpose: "file metadata and directories",
        reason: "stat, directory listing and path operations; DAC and Landlock decide access",
        calls: calls![
            SYS_stat,
            SYS_fstat,
            SYS_lstat,
            SYS_newfstatat,
            SYS_statx,
            SYS_statfs,
            SYS_fstatfs,
            SYS_access,
            SYS_faccessat,
            SYS_faccessat2,
            SYS_getdents,
            SYS_getdents64,
            SYS_getcwd,
            SYS_chdir,
            SYS_fchdir,
            SYS_rename,
            SYS_renameat,
            SYS_renameat2,
            SYS_mkdir,
            SYS_mkdirat,
            SYS_rmdir,
            SYS_link,
            SYS_linkat,
            SYS_unlink,
            SYS_unlinkat,
            SYS_symlink,
            SYS_symlinkat,
            SYS_readlink,
            SYS_readlinkat,
            SYS_chmod,
            SYS_fchmod,
            SYS_fchmodat,
            SYS_fchmodat2,
            SYS_chown,
            SYS_fchown,
            SYS_lchown,
            SYS_fchownat,
            SYS_umask,
            SYS_utime,
            SYS_utimes,
            SYS_futimesat,
            SYS_utimensat,
            SYS_mknod,
            SYS_mknodat,
            SYS_setxattr,
            SYS_lsetxattr,
            SYS_fsetxattr,
            SYS_getxattr,
            SYS_lgetxattr,
            SYS_fgetxattr,
            SYS_listxattr,
            SYS_llistxattr,
            SYS_flistxattr,
            SYS_removexattr,
            SYS_lremovexattr,
            SYS_fremovexattr,
        ],
    },
    Group {
        purpose: "memory",
        reason: "allocation and mapping; limits come from the cgroup",
        calls: calls![
            SYS_brk,
            SYS_mmap,
            SYS_munmap,
            SYS_mremap,
            SYS_mprotect,
            SYS_msync,
            SYS_mincore,
            SYS_madvise,
            SYS_mlock,
            SYS_mlock2,
            SYS_munlock,
            SYS_mlockall,
            SYS_munlockall,
            SYS_memfd_create,
            SYS_membarrier,
            SYS_pkey_mprotect,
            SYS_pkey_alloc,
            SYS_pkey_free,
            SYS_mbind,
            SYS_get_mempolicy,
            SYS_set_mempolicy,
            SYS_map_shadow_stack,
        ],
    },
    Group {
        purpose: "processes",
        reason: "fork/exec/wait inside the sandbox's own pid namespace (clone is filtered)",
        calls: calls![
            SYS_fork,
            SYS_vfork,
            SYS_execve,
            SYS_execveat,
            SYS_exit,
            SYS_exit_group,
            SYS_wait4,
            SYS_waitid,
            SYS_getpid,
            SYS_getppid,
            SYS_gettid,
            SYS_getpgid,
            SYS_setpgid,
            SYS_getpgrp,
            SYS_getsid,
            SYS_setsid,
            SYS_set_tid_address,
            SYS_arch_prctl,
            SYS_prctl,
            SYS_getrlimit,
            SYS_setrlimit,
            SYS_getrusage,
            SYS_times,
            SYS_getpriority,
            SYS_sched_yield,
            SYS_sched_getaffinity,
            SYS_sched_getparam,
            SYS_sched_getscheduler,
            SYS_sched_get_priority_max,
            SYS_sched_get_priority_min,
            SYS_sched_rr_get_interval,
            SYS_sched_getattr,
            SYS_ioprio_get,
            SYS_getcpu,
            SYS_pidfd_send_signal,
            SYS_seccomp,
            SYS_landlock_create_ruleset,
            SYS_landlock_add_rule,
            SYS_landlock_restrict_self,
        ],
    },
    Group {
        purpose: "credentials",
        reason: "querying and lowering ids; without capabilities nothing can be raised",
        calls: calls![
            SYS_getuid,
            SYS_geteuid,
            SYS_getgid,
            SYS_getegid,
            SYS_getresuid,
            SYS_getresgid,
            SYS_getgroups,
            SYS_setuid,
            SYS_setgid,
            SYS_setreuid,
            SYS_setregid,
            SYS_setresuid,
            SYS_setresgid,
            SYS_setfsuid,
            SYS_setfsgid,
            SYS_setgroups,
            SYS_capget,
            SYS_capset,
        ],
    },
    Group {
        purpose: "threads and synchronisation",
        reason: "pthreads, futexes and restartable sequences used by every libc",
        calls: calls![
            SYS_futex,
            SYS_futex_waitv,
            SYS_futex_wake,
            SYS_futex_wait,
            SYS_futex_requeue,
            SYS_set_robust_list,
            SYS_get_robust_list,
            SYS_rseq,
        ],
    },
    Group {
        purpose: "signals",
        reason: "signal handling; kill reaches only processes of the same pid namespace",
        calls: calls![
            SYS_rt_sigaction,
            SYS_rt_sigprocmask,
            SYS_rt_sigreturn,
            SYS_rt_sigpending,
            SYS_rt_sigtimedwait,
            SYS_rt_sigsuspend,
            SYS_sigaltstack,
            SYS_pause,
            SYS_signalfd,
            SYS_signalfd4,
        ],
    },
    Group {
        purpose: "time",
        reason: "reading clocks and sleeping (setting clocks is refused)",
        calls: calls![
            SYS_clock_gettime,
            SYS_clock_getres,
            SYS_clock_nanosleep,
            SYS_gettimeofday,
            SYS_time,
            SYS_nanosleep,
            SYS_alarm,
            SYS_getitimer,
            SYS_setitimer,
            SYS_timer_create,
            SYS_timer_settime,
            SYS_timer_gettime,
            SYS_timer_getoverrun,
            SYS_timer_delete,
            SYS_timerfd_create,
            SYS_timerfd_settime,
            SYS_timerfd_gettime,
        ],
    },
    Group {
        purpose: "event loops",
        reason: "poll/select/epoll/eventfd/inotify used by every runtime (node, python asyncio)",
        calls: calls![
            SYS_poll,
            SYS_ppoll,
            SYS_select,
            SYS_pselect6,
            SYS_epoll_create,
            SYS_epoll_create1,
            SYS_epoll_ctl,
            SYS_epoll_wait,
            SYS_epoll_pwait,
            SYS_epoll_pwait2,
            SYS_eventfd,
            SYS_eventfd2,
            SYS_inotify_init,
            SYS_inotify_init1,
            SYS_inotify_add_watch,
            SYS_inotify_rm_watch,
            SYS_pipe,
            SYS_pipe2,
            SYS_restart_syscall,
        ],
    },
    Group {
        purpose: "sockets",
        reason: "networking inside the sandbox's own namespace (socket() is filtered by family)",
        calls: calls![
            SYS_socketpair,
            SYS_connect,
            SYS_accept,
            SYS_accept4,
            SYS_bind,
            SYS_listen,
            SYS_getsockname,
            SYS_getpeername,
            SYS_sendto,
            SYS_recvfrom,
            SYS_sendmsg,
            SYS_recvmsg,
            SYS_sendmmsg,
            SYS_recvmmsg,
            SYS_shutdown,
            SYS_setsockopt,
            SYS_getsockopt,
        ],
    },
    Group {
        purpose: "System V and POSIX IPC",
        reason: "confined to the sandbox's own IPC namespace",
        calls: calls![
            SYS_shmget,
            SYS_shmat,
            SYS_shmdt,
            SYS_shmctl,
            SYS_semget,
            SYS_semop,
            SYS_semtimedop,
            SYS_semctl,
            SYS_msgget,
            SYS_msgsnd,
            SYS_msgrcv,
            SYS_msgctl,
            SYS_mq_open,
            SYS_mq_unlink,
            SYS_mq_timedsend,
            SYS_mq_timedreceive,
            SYS_mq_notify,
            SYS_mq_getsetattr,
        ],
    },
    Group {
        purpose: "system information",
        reason: "harmless queries every libc makes",
        calls: calls![SYS_uname, SYS_sysinfo, SYS_getrandom],
    },
];

/// Refused with `EPERM`: kernel attack surface or host-wide effects a sandbox never needs.
pub static DENY: &[Group] = &[
    Group {
        purpose: "namespaces and mounts",
        reason: "new namespaces and mounts expose kernel code reachable only with privileges",
        calls: calls![
            SYS_unshare,
            SYS_setns,
            SYS_mount,
            SYS_umount2,
            SYS_pivot_root,
            SYS_chroot,
            SYS_fsopen,
            SYS_fsconfig,
            SYS_fsmount,
            SYS_fspick,
            SYS_move_mount,
            SYS_open_tree,
            SYS_mount_setattr,
        ],
    },
    Group {
        purpose: "kernel extension and introspection",
        reason: "eBPF, perf, userfaultfd and io_uring are the usual local privilege escalations",
        calls: calls![
            SYS_bpf,
            SYS_perf_event_open,
            SYS_userfaultfd,
            SYS_io_uring_setup,
            SYS_io_uring_enter,
            SYS_io_uring_register,
            SYS_lookup_dcookie,
            SYS_fanotify_init,
        ],
    },
    Group {
        purpose: "keyrings",
        reason: "kernel keyrings are not namespaced",
        calls: calls![SYS_add_key, SYS_request_key, SYS_keyctl],
    },
    Group {
        purpose: "other processes' memory",
        reason: "tracing and cross-process memory access (kcmp, pidfd_getfd are ptrace-like)",
        calls: calls![
            SYS_ptrace,
            SYS_process_vm_readv,
            SYS_process_vm_writev,
            SYS_kcmp,
            SYS_pidfd_getfd,
            SYS_process_madvise,
            SYS_migrate_pages,
            SYS_move_pages,
        ],
    },
    Group {
        purpose: "modules and kexec",
        reason: "loading code into or replacing the host kernel",
        calls: calls![
            SYS_init_module,
            SYS_finit_module,
            SYS_delete_module,
            SYS_kexec_load,
            SYS_kexec_file_load,
        ],
    },
    Group {
        purpose: "file handles",
        reason: "open_by_handle_at bypasses path checks (the 'shocker' container escape)",
        calls: calls![SYS_open_by_handle_at, SYS_name_to_handle_at],
    },
    Group {
        purpose: "clocks",
        reason: "the system clock is host-wide",
        calls: calls![
            SYS_settimeofday,
            SYS_clock_settime,
            SYS_clock_adjtime,
            SYS_adjtimex
        ],
    },
    Group {
        purpose: "host administration",
        reason: "host-wide effects: reboot, swap, accounting, quotas, kernel log, hostname",
        calls: calls![
            SYS_reboot,
            SYS_swapon,
            SYS_swapoff,
            SYS_acct,
            SYS_quotactl,
            SYS_quotactl_fd,
            SYS_syslog,
            SYS_vhangup,
            SYS_sethostname,
            SYS_setdomainname,
        ],
    },
    Group {
        purpose: "hardware access",
        reason: "direct I/O port access",
        calls: calls![SYS_iopl, SYS_ioperm],
    },
];

/// Refused with `ENOSYS` on purpose (also the default, listed here for the reader).
pub static NOT_IMPLEMENTED: &[Group] = &[
    Group {
        purpose: "clone3",
        reason:
            "its flags live in memory seccomp cannot read; ENOSYS makes glibc fall back to clone",
        calls: calls![SYS_clone3],
    },
    Group {
        purpose: "asynchronous I/O (legacy AIO)",
        reason: "fs.aio-nr is one host-wide pool one sandbox could drain; libaio users fall back \
                 on ENOSYS and glibc's POSIX aio uses threads (io_uring is refused too)",
        calls: calls![
            SYS_io_setup,
            SYS_io_destroy,
            SYS_io_getevents,
            SYS_io_pgetevents,
            SYS_io_submit,
            SYS_io_cancel
        ],
    },
];

/// What the agent's own filter ([`agent_filter`]) allows beyond the sandbox policy.
///
/// A filter installed in the agent is inherited by every process it starts, and stacked
/// filters all apply (the strictest verdict wins), so the agent's filter is a ceiling on
/// what any sandbox process may do: it must allow everything [`ALLOW`] and [`CONDITIONAL`]
/// allow, or user programs would lose calls. It can only add what the agent and the child
/// setup before the child's own filter need beyond that; everything else of [`DENY`]
/// (mount, unshare, setns, pivot_root, bpf, ptrace, keyctl, io_uring, kexec...) and every
/// unnamed number stay refused for the agent itself (ADR 0040).
pub static AGENT_ALLOW: &[Group] = &[Group {
    purpose: "starting sandbox processes",
    reason: "clone3(CLONE_INTO_CGROUP) creates each exec in its call's cgroup (ADR 0014); \
             the children's own filter refuses it again",
    calls: calls![SYS_clone3],
}];

/// Allowed except for the arguments named; those fail with `EPERM`.
pub struct Conditional {
    pub call: Syscall,
    /// When the call is refused, in words.
    pub refused_when: &'static str,
    pub reason: &'static str,
    refuse: Refuse,
}

/// When a [`Conditional`] call is refused, as a test of the low 32 bits of one argument.
#[derive(Debug, Clone, Copy)]
enum Refuse {
    /// Any bit of the mask is set.
    AnyBit { arg: u32, mask: u32 },
    /// The argument is one of these values.
    OneOf { arg: u32, values: &'static [u32] },
    /// The argument is none of these values.
    NoneOf { arg: u32, values: &'static [u32] },
    /// Any of these tests holds.
    Any(&'static [Refuse]),
}

/// The agent is PID 1 of the sandbox's PID namespace.
const AGENT_PID: u32 = 1;
/// `PRIO_PROCESS`, `PRIO_PGRP` (`PRIO_USER` with 0 would be every process of the caller's
/// uid, the agent's included for sandbox root).
const PRIO_SELF_OR_GROUP: &[u32] = &[0, 1];
/// `IOPRIO_WHO_PROCESS`, `IOPRIO_WHO_PGRP` (as above, `IOPRIO_WHO_USER` reaches the agent).
const IOPRIO_SELF_OR_GROUP: &[u32] = &[1, 2];

const fn sys(ident: &'static str, nr: i64) -> Syscall {
    Syscall { ident, nr }
}

/// A call that acts on a process named by its first argument: only on the caller (0).
const fn self_only(ident: &'static str, nr: i64, reason: &'static str) -> Conditional {
    Conditional {
        call: sys(ident, nr),
        refused_when: "the target pid is not 0 (the caller itself)",
        reason,
        refuse: Refuse::NoneOf {
            arg: 0,
            values: &[0],
        },
    }
}

/// A signal call whose first argument is a pid: refused at the agent.
const fn not_at_agent(ident: &'static str, nr: i64) -> Conditional {
    Conditional {
        call: sys(ident, nr),
        refused_when: "the target is pid 1 (the agent)",
        reason: "sandbox root has the agent's uid; the agent is the sandbox's control channel",
        refuse: Refuse::OneOf {
            arg: 0,
            values: &[AGENT_PID],
        },
    }
}

/// Every `CLONE_NEW*` flag `clone()` accepts.
const CLONE_NEW_MASK: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | 0x80) as u32; // CLONE_NEWTIME

/// The kernel reads clone's flags, socket's family, ioctl's request and personality's
/// persona as 32-bit values, so every comparison is on the low 32 bits (`Dword`): a set
/// high half cannot slip past the filter.
pub static CONDITIONAL: &[Conditional] = &[
    Conditional {
        call: Syscall {
            ident: "SYS_clone",
            nr: libc::SYS_clone,
        },
        refused_when: "flags contain any CLONE_NEW* bit",
        reason: "threads and fork are needed; new namespaces are not",
        refuse: Refuse::AnyBit {
            arg: 0,
            mask: CLONE_NEW_MASK,
        },
    },
    Conditional {
        call: Syscall {
            ident: "SYS_socket",
            nr: libc::SYS_socket,
        },
        refused_when: "family is not AF_UNIX, AF_INET or AF_INET6",
        reason: "netlink, packet, vsock, bluetooth... sockets are kernel attack surface",
        refuse: Refuse::NoneOf {
            arg: 0,
            values: &[
                libc::AF_UNIX as u32,
                libc::AF_INET as u32,
                libc::AF_INET6 as u32,
            ],
        },
    },
    Conditional {
        call: Syscall {
            ident: "SYS_ioctl",
            nr: libc::SYS_ioctl,
        },
        refused_when: "request is TIOCSTI or TIOCLINUX",
        reason: "both inject input into a terminal another process reads",
        refuse: Refuse::OneOf {
            arg: 1,
            values: &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32],
        },
    },
    self_only(
        "SYS_prlimit64",
        libc::SYS_prlimit64,
        "sandbox root could lower the agent's limits (open files: every call fails)",
    ),
    self_only(
        "SYS_sched_setaffinity",
        libc::SYS_sched_setaffinity,
        "only the caller's own scheduling: never the agent's",
    ),
    self_only(
        "SYS_sched_setparam",
        libc::SYS_sched_setparam,
        "only the caller's own scheduling: never the agent's",
    ),
    self_only(
        "SYS_sched_setscheduler",
        libc::SYS_sched_setscheduler,
        "only the caller's own scheduling: never the agent's",
    ),
    self_only(
        "SYS_sched_setattr",
        libc::SYS_sched_setattr,
        "only the caller's own scheduling: never the agent's",
    ),
    Conditional {
        call: sys("SYS_setpriority", libc::SYS_setpriority),
        refused_when: "who is not 0, or which is PRIO_USER",
        reason: "only the caller's own priority or its process group's: never the agent's",
        refuse: Refuse::Any(&[
            Refuse::NoneOf {
                arg: 0,
                values: PRIO_SELF_OR_GROUP,
            },
            Refuse::NoneOf {
                arg: 1,
                values: &[0],
            },
        ]),
    },
    Conditional {
        call: sys("SYS_ioprio_set", libc::SYS_ioprio_set),
        refused_when: "who is not 0, or which is IOPRIO_WHO_USER",
        reason: "only the caller's own I/O priority or its process group's: never the agent's",
        refuse: Refuse::Any(&[
            Refuse::NoneOf {
                arg: 0,
                values: IOPRIO_SELF_OR_GROUP,
            },
            Refuse::NoneOf {
                arg: 1,
                values: &[0],
            },
        ]),
    },
    not_at_agent("SYS_kill", libc::SYS_kill),
    not_at_agent("SYS_tkill", libc::SYS_tkill),
    not_at_agent("SYS_rt_sigqueueinfo", libc::SYS_rt_sigqueueinfo),
    not_at_agent("SYS_rt_tgsigqueueinfo", libc::SYS_rt_tgsigqueueinfo),
    not_at_agent("SYS_pidfd_open", libc::SYS_pidfd_open),
    Conditional {
        call: sys("SYS_tgkill", libc::SYS_tgkill),
        refused_when: "the thread group or thread is pid 1 (the agent)",
        reason: "sandbox root has the agent's uid; the agent is the sandbox's control channel",
        refuse: Refuse::Any(&[
            Refuse::OneOf {
                arg: 0,
                values: &[AGENT_PID],
            },
            Refuse::OneOf {
                arg: 1,
                values: &[AGENT_PID],
            },
        ]),
    },
    Conditional {
        call: Syscall {
            ident: "SYS_personality",
            nr: libc::SYS_personality,
        },
        refused_when: "persona is not PER_LINUX (0) or the query 0xffffffff",
        reason: "other personalities change the address-space layout and syscall semantics",
        refuse: Refuse::NoneOf {
            arg: 0,
            values: &[0, 0xffff_ffff],
        },
    },
];

/// What the filter does with one system call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Allowed, except for the arguments described (then `EPERM`).
    AllowUnless(&'static str),
    /// Fails with this errno.
    Errno(i32),
}

/// Every system call the policy names with its verdict, in table order. Anything else
/// fails with `ENOSYS`; x32 and non-x86_64 entry points kill the process.
pub fn policy_table() -> Vec<(&'static str, Verdict)> {
    let mut out = Vec::new();
    for g in ALLOW {
        out.extend(g.calls.iter().map(|c| (c.name(), Verdict::Allow)));
    }
    for c in CONDITIONAL {
        out.push((c.call.name(), Verdict::AllowUnless(c.refused_when)));
    }
    for g in DENY {
        out.extend(
            g.calls
                .iter()
                .map(|c| (c.name(), Verdict::Errno(libc::EPERM))),
        );
    }
    for g in NOT_IMPLEMENTED {
        out.extend(
            g.calls
                .iter()
                .map(|c| (c.name(), Verdict::Errno(libc::ENOSYS))),
        );
    }
    out
}
