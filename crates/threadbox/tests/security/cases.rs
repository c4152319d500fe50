//! The adversarial cases, one per attack, grouped by the classes of SECURITY.md. Each runs
//! inside a fresh sandbox; the host judges it. `control` names the weakening of the jail
//! under which the case must report an escape (its positive control).

use threadbox_api::User;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lang {
    Sh,
    Py,
    C,
}

/// What the harness does around a case beyond running it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extra {
    None,
    /// Class C: a victim sandbox runs (marker process, abstract socket, SysV shm, file).
    Victim,
    /// Pause + resume the sandbox and kill -9 / restart the daemon before running.
    PauseResumeRestart,
    /// Host-side file-API attack through a planted magic link (H2).
    FileApiMagicLink,
    /// Host-side file-API attack racing a symlink swap (H3).
    FileApiRace,
    /// Host-side file-API path tricks (H1).
    FileApiPaths,
    /// Start as a background process, kill it through the API (F4).
    BackgroundKill,
    /// Compare the sandbox's peak memory with its limit (E4).
    MemoryPeak,
    /// The daemon's memory must stay flat (G5).
    DaemonRss,
    /// File API on FIFOs and devices planted by the sandbox (H5).
    FileApiSpecial,
    /// Stop and start the sandbox after the case: a full disk must still boot (E8, E9).
    Reboot,
    /// Execs and background processes with a `cwd` through the planted links; a host
    /// UNIX socket must see no connection (I1).
    HostHandleCwd,
    /// The file API through the planted links; host files and dirs must stay unseen and
    /// uncreated, the host cgroupfs untouched (I2).
    HostHandleFiles,
    /// The case holds a host-wide kernel counter in the background; host root and a
    /// neighbour sandbox must still get their own (I4).
    HostCounters,
    /// The sandbox's host cgroup must bound its subtree (I6).
    CgroupTree,
    /// The sandbox's host cgroup must carry the CPU quota the case asked for (E6). Read
    /// from the host, it is the same on an idle or a loaded machine, unlike the cores the
    /// spinners manage to use; the throttling counters are logged beside it.
    CpuQuota,
    /// The tier's host ids (A3): the jail's are judged inside by the uid map; on gvisor
    /// the host processes of the sandbox must not be in the host's user namespace.
    HostIds,
}

#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub id: &'static str,
    pub what: &'static str,
    pub lang: Lang,
    pub user: User,
    pub code: &'static str,
    /// Shell run as sandbox root before the case (must succeed).
    pub setup: Option<&'static str>,
    /// Shell run as sandbox root after the case; judged like the case's output.
    pub post: Option<&'static str>,
    pub timeout: f64,
    /// The case is expected to be ended by its timeout (no END needed).
    pub expect_timeout: bool,
    pub max_output: Option<u64>,
    pub extra: Extra,
    /// Weakenings under which the case must detect an escape; None = a containment check
    /// with no escape to simulate (documented in docs/security.md).
    pub control: Option<&'static str>,
    /// Sandbox limits (memory bytes, pids); None = defaults.
    pub limits: Option<(u64, u32)>,
    /// Disk quota in bytes; None = the default.
    pub disk: Option<u64>,
    /// CPU limit in cores; None = the default.
    pub cpus: Option<f64>,
    /// Tier capabilities the case needs (`GET /v1/tiers`): on a tier without one it is
    /// skipped there, by name, with the capability printed (ADR 0145).
    pub needs: &'static [&'static str],
}

pub const BASE: Case = Case {
    id: "",
    what: "",
    lang: Lang::Sh,
    user: User::User,
    code: "",
    setup: None,
    post: None,
    timeout: 60.0,
    expect_timeout: false,
    max_output: None,
    extra: Extra::None,
    control: None,
    limits: None,
    disk: None,
    cpus: None,
    needs: &[],
};

pub const E_LIMITS: Option<(u64, u32)> = Some((128 << 20, 64));

pub fn all() -> Vec<Case> {
    vec![
        // ------------------------------------------------------------------ A posture
        Case {
            id: "A1",
            what: "every process and thread runs under seccomp (mode 2) with no_new_privs",
            code: r##"
s=$(grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status); echo "$s"
echo "$s" | grep -q 'Seccomp:[[:space:]]*2' || echo "ESCAPE seccomp filter not in force"
# The sentry's status has no NoNewPrivs line (gvisor): there prctl below is the judge.
[ "$TB_TIER" = gvisor ] || echo "$s" | grep -q 'NoNewPrivs:[[:space:]]*1' || echo "ESCAPE no_new_privs not set"
python3 - <<'EOF'
import ctypes, os, threading
libc = ctypes.CDLL(None, use_errno=True)
def own(who):
    # Each thread asks the kernel (or the sentry) about itself: both tiers answer prctl.
    mode, nnp = libc.prctl(21, 0, 0, 0, 0), libc.prctl(39, 0, 0, 0, 0)  # PR_GET_SECCOMP, PR_GET_NO_NEW_PRIVS
    print(who, 'prctl: seccomp mode', mode, 'no_new_privs', nnp)
    if mode != 2: print('ESCAPE', who, 'seccomp mode', mode)
    if nnp != 1: print('ESCAPE', who, 'no_new_privs', nnp)
def chk():
    own('thread %d' % threading.get_native_id())
    for t in os.listdir('/proc/self/task'):
        st = open('/proc/self/task/%s/status' % t).read()
        if 'Seccomp:\t2' not in st:
            print('ESCAPE thread', t, 'without seccomp')
own('main')
ts = [threading.Thread(target=chk) for _ in range(3)]
[t.start() for t in ts]; [t.join() for t in ts]
EOF
echo END
"##,
            control: Some("no-seccomp"),
            ..BASE
        },
        Case {
            id: "A2",
            what: "sandbox root holds no capability in any set",
            user: User::Root,
            code: r##"
grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb):' /proc/self/status | while read k v; do
  [ "$v" = 0000000000000000 ] || echo "ESCAPE $k $v"
done
# a setuid-root program gains nothing either
cat /proc/self/status | grep -q '^CapEff:' || echo "ESCAPE no CapEff line"
echo END
"##,
            control: Some("keep-caps"),
            ..BASE
        },
        Case {
            id: "A3",
            what: "uid/gid maps send sandbox ids to an unprivileged host range, never to 0",
            user: User::Root,
            code: r##"
# The jail's maps are the host kernel's; the sentry's (gvisor) are its own identity map,
# which says nothing of the host: there the host judges the sandbox's processes (HostIds).
for m in uid_map gid_map; do
  while read inside outside count; do
    echo "$m: $inside $outside $count"
    [ "$TB_TIER" = gvisor ] || [ "$outside" -ge 1000000 ] || echo "ESCAPE $m maps $inside to host $outside"
  done < /proc/self/$m
done
[ "$(id -u)" = 0 ] || echo "ESCAPE not uid 0 inside as root"
echo END
"##,
            extra: Extra::HostIds,
            control: Some("host-userns"),
            ..BASE
        },
        Case {
            id: "A4",
            what: "new namespaces are refused (unshare, raw clone flags, clone3)",
            lang: Lang::C,
            user: User::Root,
            code: r##"
struct ca { uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls; };
int main(void) {
    MUST_EPERM("unshare(CLONE_NEWUSER)", syscall(SYS_unshare, CLONE_NEWUSER));
    MUST_EPERM("unshare(CLONE_NEWNS)", syscall(SYS_unshare, CLONE_NEWNS));
    MUST_EPERM("unshare(CLONE_NEWNET)", syscall(SYS_unshare, CLONE_NEWNET));
    MUST_EPERM("unshare(CLONE_NEWPID)", syscall(SYS_unshare, CLONE_NEWPID));
    MUST_EPERM("unshare(CLONE_NEWCGROUP)", syscall(SYS_unshare, CLONE_NEWCGROUP));
    MUST_EPERM("unshare(CLONE_NEWTIME)", syscall(SYS_unshare, 0x80));
    long p = syscall(SYS_clone, (unsigned long)(CLONE_NEWUSER | SIGCHLD), 0, 0, 0, 0);
    if (p == 0) _exit(0);
    if (p > 0) { waitpid(p, 0, 0); esc("clone(CLONE_NEWUSER)", p); }
    else printf("held clone(CLONE_NEWUSER): %s\n", strerror(errno));
    p = syscall(SYS_clone, (1UL << 32) | CLONE_NEWNET | SIGCHLD, 0, 0, 0, 0);
    if (p == 0) _exit(0);
    if (p > 0) { waitpid(p, 0, 0); esc("clone(high bits | CLONE_NEWNET)", p); }
    struct ca a = { .flags = CLONE_NEWUSER, .exit_signal = SIGCHLD };
    p = syscall(SYS_clone3, &a, sizeof a);
    if (p == 0) _exit(0);
    if (p > 0) { waitpid(p, 0, 0); esc("clone3(CLONE_NEWUSER)", p); }
    else if (errno != ENOSYS) { printf("ESCAPE clone3 reached the kernel: %s\n", strerror(errno)); }
    int fd = open("/proc/self/ns/net", O_RDONLY);
    if (fd >= 0) MUST_EPERM("setns(own netns)", syscall(SYS_setns, fd, 0));
    done();
    return 0;
}
"##,
            control: Some("no-seccomp"),
            ..BASE
        },
        Case {
            id: "A5",
            what: "mounts (old and new API), pivot_root and chroot are refused",
            lang: Lang::C,
            user: User::Root,
            code: r##"
int main(void) {
    mkdir("/tmp/m", 0755);
    MUST_FAIL("mount tmpfs", mount("none", "/tmp/m", "tmpfs", 0, NULL));
    MUST_FAIL("bind mount /", mount("/", "/tmp/m", NULL, MS_BIND, NULL));
    MUST_FAIL("fsopen(tmpfs)", syscall(SYS_fsopen, "tmpfs", 0));
    MUST_FAIL("open_tree(/)", syscall(SYS_open_tree, AT_FDCWD, "/", 1));
    MUST_FAIL("chroot(/tmp)", chroot("/tmp"));
    MUST_FAIL("pivot_root", syscall(SYS_pivot_root, "/tmp", "/tmp/m"));
    done();
    return 0;
}
"##,
            control: Some("host-userns,keep-caps,no-seccomp"),
            ..BASE
        },
        Case {
            id: "A6",
            what: "dangerous syscalls fail with the policy's EPERM",
            lang: Lang::C,
            user: User::Root,
            code: r##"
int main(void) {
    uint32_t battr[32] = { 2, 4, 4, 1 };
    MUST_EPERM("bpf(MAP_CREATE)", syscall(SYS_bpf, 0, battr, sizeof battr));
    struct perf_event_attr pe; memset(&pe, 0, sizeof pe);
    pe.type = PERF_TYPE_SOFTWARE; pe.size = sizeof pe; pe.config = PERF_COUNT_SW_CPU_CLOCK;
    pe.exclude_kernel = 1; pe.exclude_hv = 1;
    MUST_EPERM("perf_event_open", syscall(SYS_perf_event_open, &pe, 0, -1, -1, 0));
    MUST_EPERM("userfaultfd", syscall(SYS_userfaultfd, O_CLOEXEC | 1));
    char params[128]; memset(params, 0, sizeof params);
    MUST_EPERM("io_uring_setup", syscall(SYS_io_uring_setup, 4, params));
    MUST_EPERM("keyctl(GET_KEYRING_ID)", syscall(SYS_keyctl, 0, -3, 1));
    MUST_EPERM("add_key", syscall(SYS_add_key, "user", "tb", "x", 1, -3));
    char buf[8], dst[8]; struct iovec l = { dst, 8 }, r = { buf, 8 };
    MUST_EPERM("process_vm_readv(self)", syscall(SYS_process_vm_readv, getpid(), &l, 1, &r, 1, 0));
    MUST_EPERM("kcmp(self)", syscall(SYS_kcmp, getpid(), getpid(), 0, 0, 0));
    MUST_EPERM("init_module", syscall(SYS_init_module, NULL, 0, ""));
    MUST_EPERM("finit_module", syscall(SYS_finit_module, -1, "", 0));
    MUST_EPERM("kexec_load", syscall(SYS_kexec_load, 0, 0, NULL, 0));
    char h[136]; memset(h, 0, sizeof h); int mnt;
    MUST_EPERM("name_to_handle_at", syscall(SYS_name_to_handle_at, AT_FDCWD, "/", h, &mnt, 0));
    MUST_EPERM("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, h, O_RDONLY));
    MUST_EPERM("settimeofday(NULL)", syscall(SYS_settimeofday, NULL, NULL));
    char tx[256]; memset(tx, 0, sizeof tx);
    MUST_EPERM("clock_adjtime(query)", syscall(SYS_clock_adjtime, 0, tx));
    MUST_EPERM("reboot(bad magic)", syscall(SYS_reboot, 0, 0, 0, 0));
    MUST_EPERM("swapon", syscall(SYS_swapon, "/nonexistent", 0));
    MUST_EPERM("syslog(SIZE_BUFFER)", syscall(SYS_syslog, 10, NULL, 0));
    MUST_EPERM("iopl(3)", syscall(SYS_iopl, 3));
    MUST_EPERM("quotactl", syscall(SYS_quotactl, 0, "/", 0, NULL));
    MUST_EPERM("fanotify_init", syscall(SYS_fanotify_init, 0, 0));
    MUST_EPERM("pidfd_getfd", syscall(SYS_pidfd_getfd, -1, 0, 0));
    done();
    return 0;
}
"##,
            control: Some("no-seccomp"),
            ..BASE
        },
        Case {
            id: "A7",
            what: "i386 (int 0x80) and x32 entry points kill the process with SIGSYS",
            lang: Lang::C,
            code: r##"
static void i386_getpid(void) { long r; __asm__ volatile("int $0x80" : "=a"(r) : "a"(20L)); _exit(r > 0 ? 42 : 43); }
static void x32_getpid(void) { syscall(39 | 0x40000000); _exit(44); }
int main(void) {
    int st = in_child(i386_getpid);
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS) printf("held int 0x80\n");
    else esc("int 0x80 reached the kernel", st);
    st = in_child(x32_getpid);
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS) printf("held x32\n");
    else esc("x32 syscall reached the kernel", st);
    done();
    return 0;
}
"##,
            control: Some("no-seccomp"),
            ..BASE
        },
        Case {
            id: "A8",
            what: "personalities other than Linux are refused, also with high bits set",
            lang: Lang::C,
            code: r##"
int main(void) {
    MUST_EPERM("personality(READ_IMPLIES_EXEC)", syscall(SYS_personality, 0x0400000UL));
    MUST_EPERM("personality(ADDR_NO_RANDOMIZE)", syscall(SYS_personality, 0x0040000UL));
    MUST_EPERM("personality(PER_BSD)", syscall(SYS_personality, 6UL));
    MUST_EPERM("personality(high | ADDR_NO_RANDOMIZE)", syscall(SYS_personality, (1UL << 32) | 0x0040000UL));
    /* The query must pass the filter. The sentry (gvisor) implements no personality, not
       even the query: its EINVAL is not the filter's EPERM, which is still caught. */
    errno = 0;
    long q = syscall(SYS_personality, 0xffffffffUL);
    const char *tier = getenv("TB_TIER");
    int sentry = tier && !strcmp(tier, "gvisor");
    if (q < 0 && (!sentry || errno == EPERM)) esc("personality query refused", -1);
    else printf("personality query: %ld (%s)\n", q, q < 0 ? strerror(errno) : "ok");
    done();
    return 0;
}
"##,
            control: Some("no-seccomp"),
            ..BASE
        },
        Case {
            id: "A9",
            what: "setuid binaries gain nothing",
            setup: Some(
                r##"
printf '#include <stdio.h>\n#include <unistd.h>\nint main(void){printf("euid=%%d\\n",(int)geteuid());return 0;}\n' > /tmp/suid.c
gcc -o /home/user/rootdir/suid /tmp/suid.c && chmod 4755 /home/user/rootdir/suid
"##,
            ),
            code: r##"
out=$(/home/user/rootdir/suid); echo "$out"
[ "$out" = "euid=1000" ] || echo "ESCAPE setuid binary ran with $out"
for b in /usr/bin/su /bin/su /usr/bin/sudo /usr/bin/passwd; do
  [ -x "$b" ] || continue
  r=$($b -c id root </dev/null 2>/dev/null); case "$r" in *uid=0*) echo "ESCAPE $b gave root: $r";; esac
done
echo END
"##,
            control: Some("suid,no-seccomp,no-landlock"),
            ..BASE
        },
        // ----------------------------------------------------------- B procfs, sysfs, devices
        Case {
            id: "B1",
            what: "no write reaches core_pattern, sysrq-trigger, modprobe, binfmt_misc, uevent_helper",
            lang: Lang::C,
            user: User::Root,
            code: r##"
int main(void) {
    const char *targets[] = { "/proc/sys/kernel/core_pattern", "/proc/sysrq-trigger",
        "/proc/sys/kernel/modprobe", "/proc/sys/fs/binfmt_misc/register",
        "/sys/kernel/uevent_helper", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/hostname",
        "/sys/fs/cgroup/release_agent", 0 };
    for (int i = 0; targets[i]; i++) {
        char what[128]; snprintf(what, sizeof what, "open(%s, O_WRONLY)", targets[i]);
        int fd = open(targets[i], O_WRONLY);
        if (fd >= 0) { esc(what, fd); close(fd); } else printf("held %s: %s\n", what, strerror(errno));
    }
    done();
    return 0;
}
"##,
            control: Some("host-userns,keep-caps,no-proc-mask,no-seccomp,no-landlock"),
            ..BASE
        },
        Case {
            id: "B2",
            what: "kcore, keys, timer_list, kallsyms and friends are masked",
            user: User::Root,
            code: r##"
for f in kcore keys key-users timer_list sched_debug kallsyms modules interrupts vmallocinfo slabinfo sysrq-trigger; do
  [ -e /proc/$f ] || continue
  n=$(head -c 4096 /proc/$f 2>/dev/null | wc -c)
  [ "$n" -gt 0 ] && echo "ESCAPE /proc/$f is readable ($n bytes)"
done
for d in acpi scsi firmware; do
  [ -d /proc/$d ] && [ -n "$(ls -A /proc/$d 2>/dev/null)" ] && echo "ESCAPE /proc/$d not empty"
done
touch /proc/sys/kernel/tb 2>/dev/null && echo "ESCAPE /proc/sys writable"
echo END
"##,
            control: Some("no-proc-mask"),
            ..BASE
        },
        Case {
            id: "B3",
            what: "/dev holds only the minimal devices, no block devices",
            user: User::Root,
            code: r##"
# gvisor: /dev/fuse and /dev/net/tun are the sentry's own devices (its FUSE and its
# netstack's tun), no host device behind them; accepted there only, by their numbers.
sentry_dev() { [ "$TB_TIER" = gvisor ] && [ "$(stat -c %t:%T "$1")" = "$2" ]; }
for e in $(ls -A /dev); do
  case "$e" in null|zero|full|random|urandom|tty|pts|shm|ptmx|fd|stdin|stdout|stderr) ;;
  fuse) sentry_dev /dev/fuse a:e5 || echo "ESCAPE unexpected /dev/$e";;
  net) [ "$(ls -A /dev/net)" = tun ] && sentry_dev /dev/net/tun a:c8 || echo "ESCAPE unexpected /dev/$e: $(ls -A /dev/net)";;
  *) echo "ESCAPE unexpected /dev/$e";; esac
done
for e in /dev/* /dev/*/*; do [ -b "$e" ] && echo "ESCAPE block device $e"; done
echo END
"##,
            control: Some("host-dev"),
            ..BASE
        },
        Case {
            id: "B4",
            what: "the agent (PID 1) is unreachable: exe, mem, environ, fds; /proc/self/exe not writable",
            lang: Lang::C,
            user: User::Root,
            code: r##"
int main(void) {
    /* gvisor: pid 1 is the sandbox namespace's init, not the agent (ADR 0218); B8 checks
       that it holds nothing. Its procfs has no ETXTBSY: the agent's binary is a read-only
       bind there, which is what must refuse a write. */
    const char *tier = getenv("TB_TIER");
    int sentry = tier && !strcmp(tier, "gvisor");
    MUST_FAIL("open(/proc/1/exe)", open("/proc/1/exe", O_RDONLY));
    MUST_FAIL("open(/proc/1/exe, O_WRONLY)", open("/proc/1/exe", O_WRONLY));
    MUST_FAIL("open(/proc/1/mem)", open("/proc/1/mem", O_RDONLY));
    if (!sentry)
        MUST_FAIL("open(/proc/1/environ)", open("/proc/1/environ", O_RDONLY));
    char lnk[256];
    MUST_FAIL("readlink(/proc/1/fd/1)", readlink("/proc/1/fd/1", lnk, sizeof lnk));
    MUST_FAIL("readlink(/proc/1/cwd)", readlink("/proc/1/cwd", lnk, sizeof lnk));
    MUST_FAIL("open(/proc/1/fd/3)", open("/proc/1/fd/3", O_RDONLY));
    if (sentry)
        MUST_FAIL("open(/.threadbox/agent, O_WRONLY)", open("/.threadbox/agent", O_WRONLY));
    else
        MUST_FAIL("open(/proc/self/exe, O_WRONLY)", open("/proc/self/exe", O_WRONLY));
    done();
    return 0;
}
"##,
            // no-pidns: gvisor gives no child CAP_SYS_PTRACE, so there the probes of the
            // agent break only with the agent as pid 1 (a no-op on the jail).
            control: Some("keep-caps,no-seccomp,no-landlock,no-pidns"),
            ..BASE
        },
        Case {
            id: "B8",
            what: "nothing of the agent shows in the sandbox's /proc: pid 1's environ and fds",
            lang: Lang::C,
            user: User::Root,
            code: r##"
/* The jail: pid 1 is the agent, non-dumpable, so both are refused. gvisor: its procfs
   makes every environ world-readable and every fd/ listable (ADR 0187), so the agent
   lives outside the sandbox's pid namespace and pid 1 is an init holding nothing (ADR
   0218): its environ must read empty, its fd/ list nothing, and no process may carry the
   agent's --listen argument. */
int main(void) {
    const char *tier = getenv("TB_TIER");
    int sentry = tier && !strcmp(tier, "gvisor");
    if (!sentry) {
        MUST_FAIL("open(/proc/1/environ)", open("/proc/1/environ", O_RDONLY));
        char lnk[256];
        MUST_FAIL("readlink(/proc/1/fd/0)", readlink("/proc/1/fd/0", lnk, sizeof lnk));
        done();
        return 0;
    }
    char buf[4096];
    int fd = open("/proc/1/environ", O_RDONLY);
    long n = fd >= 0 ? read(fd, buf, sizeof buf) : -1;
    if (n > 0) esc("pid 1's environ has bytes", n);
    else printf("held pid 1's environ: %ld bytes\n", n);
    DIR *d = opendir("/proc/1/fd");
    struct dirent *e;
    int fds = 0;
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') fds++;
    if (fds) esc("pid 1 holds descriptors", fds);
    else printf("held pid 1's fds: none listed\n");
    DIR *p = opendir("/proc");
    while (p && (e = readdir(p))) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        char path[64];
        snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
        int c = open(path, O_RDONLY);
        if (c < 0) continue;
        long m = read(c, buf, sizeof buf - 1);
        close(c);
        if (m <= 0) continue;
        for (long i = 0; i + 8 <= m; i++)
            if (!memcmp(buf + i, "--listen", 8)) { esc("a sandbox process is the agent", atol(e->d_name)); break; }
    }
    done();
    return 0;
}
"##,
            control: Some("keep-caps,no-seccomp,no-landlock,no-pidns"),
            ..BASE
        },
        Case {
            id: "B5",
            what: "no fd, cwd, root or exe link leaks a host path",
            user: User::Root,
            code: r##"
for l in /proc/[0-9]*/fd/* /proc/[0-9]*/cwd /proc/[0-9]*/root /proc/[0-9]*/exe /proc/[0-9]*/map_files/*; do
  t=$(readlink "$l" 2>/dev/null) && echo "$l -> $t"
done
cat /proc/self/mountinfo
echo END
"##,
            control: Some("keep-caps,no-seccomp,no-landlock"),
            ..BASE
        },
        Case {
            id: "B6",
            what: "a world-readable host flag stays unread and host directories unwritten",
            user: User::Root,
            code: r##"
for f in $(find / \( -path /proc -o -path /sys \) -prune -o -name "$FLAG_DIR" -print 2>/dev/null); do
  echo "found $f"; cat "$f/flag"; echo pwned > "$f/pwned" 2>/dev/null
done
cat "/tmp/$FLAG_DIR/flag" 2>/dev/null
echo END
"##,
            control: Some("bind-host-tmp"),
            ..BASE
        },
        Case {
            id: "B7",
            what: "no fresh procfs/sysfs/debugfs/bpffs/cgroupfs can be mounted to bypass masking",
            lang: Lang::C,
            user: User::Root,
            code: r##"
int main(void) {
    const char *fs[] = { "proc", "sysfs", "debugfs", "securityfs", "tracefs", "bpf", "cgroup2", "devpts", 0 };
    mkdir("/tmp/fs", 0755);
    for (int i = 0; fs[i]; i++) {
        char what[64]; snprintf(what, sizeof what, "mount %s", fs[i]);
        MUST_FAIL(what, mount(fs[i], "/tmp/fs", fs[i], 0, NULL));
        umount2("/tmp/fs", MNT_DETACH);
    }
    /* On gvisor, /sys holds one thing: gVisor's own cgroupfs at /sys/fs/cgroup, where the
       agent sets the in-sentry pids limit (ADR 0185); it is the sentry's, no host file is
       behind it. Anything else there, on either tier, is a populated /sys. */
    const char *tier = getenv("TB_TIER");
    int gv = tier && !strcmp(tier, "gvisor");
    DIR *d = opendir("/sys"); int n = 0; struct dirent *e;
    while (d && (e = readdir(d))) if (e->d_name[0] != '.' && !(gv && !strcmp(e->d_name, "fs"))) n++;
    if (n) esc("/sys is populated", n);
    if (gv) {
        DIR *f = opendir("/sys/fs"); int m = 0;
        while (f && (e = readdir(f))) if (e->d_name[0] != '.' && strcmp(e->d_name, "cgroup")) m++;
        if (m) esc("/sys/fs holds more than gVisor's cgroupfs", m);
    }
    done();
    return 0;
}
"##,
            control: Some("host-userns,keep-caps,no-seccomp,no-landlock"),
            ..BASE
        },
        // ---------------------------------------------------------------- C cross-sandbox
        Case {
            id: "C1",
            what: "a sandbox sees only its own processes",
            code: r##"
# Pid 1: the jail's agent; on gvisor the init of the sandbox's own pid namespace, which
# the agent started (ADR 0218).
agent=threadbox-agent; [ "$TB_TIER" = gvisor ] && agent="threadbox-agent --ns-init"
tr '\0' ' ' </proc/1/cmdline | grep -q "$agent" || echo "ESCAPE pid 1 is not our agent: $(tr '\0' ' ' </proc/1/cmdline)"
for c in /proc/[0-9]*/cmdline; do
  s=$(tr '\0' ' ' < $c 2>/dev/null)
  case "$s" in *"$VICTIM_MARKER"*|*"threadbox serve"*|*systemd*|*cargo*) echo "ESCAPE sees $c: $s";; esac
done
echo END
"##,
            extra: Extra::Victim,
            control: Some("shared-pidns"),
            ..BASE
        },
        Case {
            id: "C2",
            what: "a sandbox cannot signal another sandbox's processes",
            lang: Lang::C,
            user: User::Root,
            code: r##"
int main(void) {
    const char *m = getenv("VICTIM_MARKER");
    DIR *d = opendir("/proc"); struct dirent *e;
    while (d && (e = readdir(d))) {
        int pid = atoi(e->d_name); if (pid <= 1 || pid == getpid()) continue;
        char p[64], buf[4096] = {0}; snprintf(p, sizeof p, "/proc/%d/cmdline", pid);
        int fd = open(p, O_RDONLY); if (fd < 0) continue;
        int n = read(fd, buf, sizeof buf - 1); close(fd);
        for (int i = 0; i < n; i++) if (!buf[i]) buf[i] = ' ';
        if (m && strstr(buf, m)) MUST_FAIL("kill(victim)", kill(pid, SIGKILL));
    }
    done();
    return 0;
}
"##,
            extra: Extra::Victim,
            control: Some("shared-pidns,host-userns,keep-caps,no-seccomp"),
            ..BASE
        },
        Case {
            id: "C3",
            what: "another sandbox's abstract unix socket is unreachable",
            lang: Lang::Py,
            code: r##"
import os, socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect('\0' + os.environ['VICTIM_ABSTRACT'])
    print('ESCAPE connected to the victim\'s abstract socket:', s.recv(100))
except OSError as e:
    print('held', e)
print('END')
"##,
            extra: Extra::Victim,
            control: Some("shared-netns"),
            ..BASE
        },
        Case {
            id: "C4",
            what: "another sandbox's SysV shared memory is unreachable",
            lang: Lang::C,
            code: r##"
int main(void) {
    key_t k = (key_t)strtol(getenv("SHM_KEY"), 0, 0);
    int id = shmget(k, 0, 0);
    if (id >= 0) {
        char *p = shmat(id, 0, SHM_RDONLY);
        if (p != (void *)-1) printf("read: %.40s\n", p);
        esc("shmget(victim key)", id);
    } else printf("held shmget: %s\n", strerror(errno));
    MUST_FAIL("msgget(victim key)", msgget(k, 0));
    MUST_FAIL("semget(victim key)", semget(k, 0, 0));
    done();
    return 0;
}
"##,
            extra: Extra::Victim,
            control: Some("shared-ipcns"),
            ..BASE
        },
        Case {
            id: "C5",
            what: "another sandbox's files are unreachable",
            user: User::Root,
            code: r##"
for f in $(find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -name "victim-$VICTIM_MARKER*" -print 2>/dev/null); do
  echo "found $f"; cat "$f"
done
echo END
"##,
            extra: Extra::Victim,
            control: Some("bind-host-tmp,host-userns,no-disk-quota"),
            ..BASE
        },
        Case {
            id: "C6",
            what: "the daemon's TCP and unix sockets are unreachable",
            lang: Lang::Py,
            code: r##"
import os, socket
try:
    c = socket.create_connection(('127.0.0.1', int(os.environ['DAEMON_PORT'])), timeout=2)
    c.sendall(b'GET /healthz HTTP/1.0\r\n\r\n')
    print('ESCAPE reached the daemon over TCP:', c.recv(200)[:60])
except OSError as e:
    print('held tcp', e)
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    u.connect(os.environ['DAEMON_SOCK'])
    print('ESCAPE reached the daemon socket')
except OSError as e:
    print('held unix', e)
print('END')
"##,
            control: Some("shared-netns"),
            ..BASE
        },
        // ------------------------------------------------------------------- D egress
        Case {
            id: "D1",
            what: "no TCP reaches a host loopback listener",
            lang: Lang::Py,
            code: r##"
import os, socket
try:
    c = socket.create_connection(('127.0.0.1', int(os.environ['TCP_PORT'])), timeout=2)
    c.sendall(b'tb-hello')
    print('ESCAPE connected to the host listener')
except OSError as e:
    print('held', e)
print('END')
"##,
            control: Some("shared-netns"),
            ..BASE
        },
        Case {
            id: "D2",
            what: "no TCP reaches the host's address, public, metadata or private ranges",
            lang: Lang::Py,
            code: r##"
import os, socket
targets = [(os.environ.get('HOST_IP') or '10.255.255.1', int(os.environ['TCP_PORT'])),
           ('1.1.1.1', 53), ('8.8.8.8', 53), ('169.254.169.254', 80), ('10.0.0.1', 80),
           ('192.168.0.1', 80), ('::ffff:127.0.0.1', int(os.environ['TCP_PORT']))]
for host, port in targets:
    try:
        c = socket.create_connection((host, port), timeout=1)
        print('ESCAPE connected to', host, port)
    except OSError as e:
        print('held', host, port, e)
print('END')
"##,
            control: Some("shared-netns"),
            ..BASE
        },
        Case {
            id: "D3",
            what: "no UDP datagram reaches the host",
            lang: Lang::Py,
            code: r##"
import os, socket
port = int(os.environ['UDP_PORT'])
for host in ['127.0.0.1', os.environ.get('HOST_IP') or '10.255.255.1']:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.sendto(b'tb-udp', (host, port)); print('sent', host)
    except OSError as e:
        print('held', host, e)
print('END')
"##,
            control: Some("shared-netns"),
            ..BASE
        },
        Case {
            id: "D4",
            what: "raw, packet, netlink, vsock and ping sockets are refused",
            lang: Lang::C,
            user: User::Root,
            code: r##"
int main(void) {
    MUST_FAIL("socket(AF_PACKET)", socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL)));
    MUST_FAIL("socket(AF_NETLINK, ROUTE)", socket(AF_NETLINK, SOCK_RAW, 0));
    MUST_FAIL("socket(AF_NETLINK) high bits", syscall(SYS_socket, (1UL << 32) | AF_NETLINK, SOCK_RAW, 0));
    MUST_FAIL("socket(AF_INET, SOCK_RAW)", socket(AF_INET, SOCK_RAW, IPPROTO_ICMP));
    MUST_FAIL("socket(AF_INET6, SOCK_RAW)", socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6));
    MUST_FAIL("socket(AF_VSOCK)", socket(40, SOCK_STREAM, 0));
    MUST_FAIL("socket(AF_KEY)", socket(AF_KEY, SOCK_RAW, 2));
    MUST_FAIL("socket(AF_ALG)", socket(38, SOCK_SEQPACKET, 0));
    MUST_FAIL("socket(AF_BLUETOOTH)", socket(31, SOCK_RAW, 0));
    done();
    return 0;
}
"##,
            control: Some("no-seccomp"),
            ..BASE
        },
        Case {
            id: "D5",
            what: "only loopback exists and no name resolves",
            code: r##"
tail -n +3 /proc/net/dev | while read ifc rest; do
  [ "$ifc" = "lo:" ] || echo "ESCAPE interface $ifc"
done
getent hosts example.com >/dev/null 2>&1 && echo "ESCAPE example.com resolves"
echo END
"##,
            control: Some("shared-netns"),
            ..BASE
        },
        Case {
            id: "D6",
            what: "the network stays closed after pause/resume and a daemon kill -9 + restart",
            lang: Lang::Py,
            code: r##"
import os, socket
try:
    socket.create_connection(('127.0.0.1', int(os.environ['TCP_PORT'])), timeout=2)
    print('ESCAPE connected to the host listener after restart')
except OSError as e:
    print('held', e)
print('END')
"##,
            extra: Extra::PauseResumeRestart,
            control: Some("shared-netns"),
            ..BASE
        },
        // ------------------------------------------------------------ E resource exhaustion
        Case {
            id: "E1",
            what: "a fork bomb stops at the pids limit",
            lang: Lang::C,
            code: r##"
int main(void) {
    static pid_t kids[400]; int n = 0;
    for (; n < 400; n++) { pid_t p = fork(); if (p == 0) { pause(); _exit(0); } if (p < 0) break; kids[n] = p; }
    printf("forked %d\n", n);
    if (n >= 400) esc("fork bomb reached 400 processes", n);
    for (int i = 0; i < n; i++) kill(kids[i], SIGKILL);
    for (int i = 0; i < n; i++) waitpid(kids[i], 0, 0);
    done();
    return 0;
}
"##,
            control: Some("no-pids-limit"),
            limits: E_LIMITS,
            ..BASE
        },
        Case {
            id: "E2",
            what: "an anonymous-memory bomb is stopped at the memory limit",
            lang: Lang::C,
            code: r##"
static void bomb(void) {
    for (int mb = 16; mb <= 512; mb += 16) {
        char *p = malloc(16 << 20); if (!p) _exit(3);
        memset(p, 1, 16 << 20);
        printf("allocated %d MiB\n", mb); fflush(stdout);
    }
    _exit(0);
}
int main(void) {
    int st = in_child(bomb);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) esc("allocated 512 MiB under a 128 MiB limit", 0);
    else printf("held: status %#x\n", st);
    done();
    return 0;
}
"##,
            control: Some("no-memory-limit"),
            limits: E_LIMITS,
            ..BASE
        },
        Case {
            id: "E3",
            what: "filling tmpfs (/tmp, /dev/shm) is bounded",
            code: r##"
for d in /tmp /dev/shm; do
  (dd if=/dev/zero of=$d/fill bs=1M count=384 2>/dev/null)
  s=$(stat -c %s $d/fill 2>/dev/null || echo 0)
  echo "$d: $s bytes"
  [ "$s" -ge $((384 << 20)) ] && echo "ESCAPE wrote 384 MiB to $d under a 128 MiB limit"
  rm -f $d/fill
done
echo END
"##,
            control: Some("no-memory-limit"),
            limits: E_LIMITS,
            ..BASE
        },
        Case {
            id: "E4",
            what: "page cache is charged to the sandbox and stays under its limit",
            code: r##"
dd if=/dev/zero of=/home/user/big bs=1M count=256 2>/dev/null
cat /home/user/big > /dev/null; cat /home/user/big > /dev/null
rm -f /home/user/big
echo END
"##,
            extra: Extra::MemoryPeak,
            control: Some("no-memory-limit"),
            limits: E_LIMITS,
            ..BASE
        },
        Case {
            id: "E5",
            what: "fd exhaustion stops at RLIMIT_NOFILE and cannot be raised past it",
            lang: Lang::Py,
            code: r##"
import os, resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
print('nofile', soft, hard)
if hard > 16384: print('ESCAPE hard nofile limit', hard)
try:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard + 1, hard + 1)); print('ESCAPE raised nofile')
except (ValueError, OSError) as e:
    print('held raise', e)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
fds = []
try:
    while len(fds) < 70000: fds.append(os.open('/dev/null', os.O_RDONLY))
except OSError as e:
    print('stopped after', len(fds), e)
if len(fds) > 16384: print('ESCAPE opened', len(fds))
for f in fds: os.close(f)
print('END')
"##,
            // The control inherits the daemon's hard limit, which must be above ours (16384)
            // to show: 20000 on this machine kind.
            control: Some("no-nofile-limit"),
            limits: E_LIMITS,
            ..BASE
        },
        Case {
            id: "E6",
            what: "CPU spinners are held to the CPU limit and killed by the timeout",
            lang: Lang::Py,
            // Three spinners for 2 s of wall time under a quarter-core limit use about 0.5 s
            // of CPU; without the limit they use one core or more (two on an idle 2-core
            // host), so 0.6 cores is far from both. That measure depends on how busy the
            // host is (0.53 cores seen unconfined on a loaded one), so the verdict that the
            // positive control relies on is the host's: the cgroup's configured quota.
            code: r##"
import os, time
kids = []
t0 = time.monotonic()
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        while time.monotonic() < t0 + 2.0: pass
        os._exit(0)
    kids.append(pid)
for pid in kids: os.waitpid(pid, 0)
wall = time.monotonic() - t0
t = os.times()
cores = (t.children_user + t.children_system) / wall
line = 'cores %.2f over %.2f s' % (cores, wall)
print(line, flush=True)
# The sentry (gvisor) counts a task's time by its own clock, whatever the host's throttling:
# there the figure is logged and the host's cgroup quota alone is the verdict.
if cores > 0.6 and os.environ.get('TB_TIER') != 'gvisor': print('ESCAPE used', line, 'under a 0.25-core limit', flush=True)
with open('/tmp/e6', 'w') as f: f.write(line + '\n')
for _ in range(3):
    if os.fork() == 0:
        while True: pass
while True: pass
"##,
            timeout: 8.0,
            expect_timeout: true,
            // The measurement must have happened before the timeout ended the spinners.
            post: Some("cat /tmp/e6 && echo END"),
            control: Some("no-cpu-limit"),
            limits: E_LIMITS,
            cpus: Some(0.25),
            extra: Extra::CpuQuota,
            ..BASE
        },
        Case {
            id: "E7",
            what: "a shell fork bomb in its own session is contained and cleaned up by the timeout",
            code: r##"
# The bomb runs in a new session, out of reach of a kill of the call's process group:
# only the call's cgroup ends it. The main shell forks exactly once, before any bomb
# process exists (dash forks every element of a background pipeline from the calling
# shell, so calling `bomb` here raced its own children for the pids limit).
# Every bomb process that could fork becomes a sleep, so the bomb fills the pids limit
# and holds it; the ones that cannot fork end with "Cannot fork".
setsid sh -c 'bomb() { bomb | bomb & exec sleep 1000; }; bomb' &
# exec, not a fork: once the bomb fills the pids limit the main shell could not fork a
# sleep, and would end before the timeout this case is about.
exec sleep 100
"##,
            timeout: 3.0,
            expect_timeout: true,
            post: Some(
                r##"
n=0; for i in $(seq 1 100); do n=$(ls -d /proc/[0-9]* | wc -l); [ "${n:-999}" -le 8 ] && break; sleep 0.1; done
# An empty count means this check could not fork: the sandbox is still full.
[ "${n:-999}" -le 8 ] || echo "ESCAPE ${n:-enough to fill the pids limit:} processes left after the timeout"
echo END
"##,
            ),
            control: Some("no-cgroup-kill"),
            limits: E_LIMITS,
            ..BASE
        },
        Case {
            id: "E8",
            what: "filling the writable disk stops at the sandbox's quota; it still boots after",
            code: r##"
dd if=/dev/zero of=/home/user/fill bs=1M count=160 2>/dev/null
s=$(stat -c %s /home/user/fill); echo "wrote $s"
[ "$s" -ge $((160 << 20)) ] && echo "ESCAPE wrote 160 MiB under a 64 MiB disk quota"
echo END
"##,
            extra: Extra::Reboot,
            control: Some("no-disk-quota"),
            limits: E_LIMITS,
            disk: Some(64 << 20),
            ..BASE
        },
        Case {
            id: "E9",
            what: "inode exhaustion stays inside the sandbox's own file system",
            lang: Lang::Py,
            code: r##"
import os
os.makedirs('/home/user/many', exist_ok=True)
n = 0
try:
    while n < 40000:
        open('/home/user/many/%d' % n, 'w').close(); n += 1
except OSError as e:
    print('stopped after', n, e)
if n >= 40000: print('ESCAPE created 40000 files in a 64 MiB disk')
print('END')
"##,
            extra: Extra::Reboot,
            control: Some("no-disk-quota"),
            limits: E_LIMITS,
            disk: Some(64 << 20),
            ..BASE
        },
        // ------------------------------------------------------------- F process lifecycle
        Case {
            id: "F1",
            what: "a timeout kills setsid'd, double-forked grandchildren",
            code: r##"
setsid sh -c 'exec sleep 7771' &
(setsid sh -c 'sleep 7772 & exit' &)
echo before; sleep 1000
"##,
            timeout: 2.0,
            expect_timeout: true,
            post: Some(
                r##"
alive() { for c in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $c 2>/dev/null | grep -q "^sleep $1" && echo $c; done; }
for i in $(seq 1 50); do [ -z "$(alive '777[12]')" ] && break; sleep 0.1; done
for c in $(alive '777[12]'); do echo "ESCAPE survivor $c: $(tr '\0' ' ' < $c)"; done
echo END
"##,
            ),
            control: Some("no-cgroup-kill"),
            needs: &["call_cgroups"],
            ..BASE
        },
        Case {
            id: "F2",
            what: "SIGTERM-ignoring double-forked daemons die at the timeout; earlier output is kept",
            lang: Lang::Py,
            code: r##"
import os, signal, sys, time
print('before', flush=True)
if os.fork() == 0:
    os.setsid(); signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        os.execvp('sh', ['sh', '-c', 'trap "" TERM HUP INT; sleep 7773'])
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
time.sleep(1000)
"##,
            timeout: 2.0,
            expect_timeout: true,
            post: Some(
                r##"
alive() { for c in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $c 2>/dev/null | grep -q "^sleep $1" && echo $c; done; }
for i in $(seq 1 50); do [ -z "$(alive '7773')" ] && break; sleep 0.1; done
for c in $(alive '7773'); do echo "ESCAPE survivor $c: $(tr '\0' ' ' < $c)"; done
echo END
"##,
            ),
            control: Some("no-cgroup-kill"),
            needs: &["call_cgroups"],
            ..BASE
        },
        Case {
            id: "F3",
            what: "orphaned zombies are reaped",
            lang: Lang::Py,
            code: r##"
import os
if os.fork() == 0:
    for _ in range(20):
        if os.fork() == 0: os._exit(0)
    os._exit(0)   # the 20 exited children are orphans now
os.wait()
print('END')
"##,
            post: Some(
                r##"
for i in $(seq 1 100); do z=$(cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == "Z"' | wc -l); [ "$z" = 0 ] && break; sleep 0.1; done
[ "$z" = 0 ] || echo "ESCAPE $z zombies left"
echo END
"##,
            ),
            control: Some("no-reaper"),
            ..BASE
        },
        Case {
            id: "F4",
            what: "killing a background process kills its whole tree",
            code: r##"setsid sh -c 'exec sleep 7774' & exec sleep 7775"##,
            extra: Extra::BackgroundKill,
            post: Some(
                r##"
alive() { for c in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $c 2>/dev/null | grep -q "^sleep $1" && echo $c; done; }
for i in $(seq 1 50); do [ -z "$(alive '777[45]')" ] && break; sleep 0.1; done
for c in $(alive '777[45]'); do echo "ESCAPE survivor $c: $(tr '\0' ' ' < $c)"; done
echo END
"##,
            ),
            control: Some("no-cgroup-kill"),
            needs: &["call_cgroups"],
            ..BASE
        },
        Case {
            id: "F5",
            what: "a timeout returns although a detached grandchild holds no pipe",
            code: r##"
(setsid sleep 7776 </dev/null >/dev/null 2>&1 &)
sleep 1000
"##,
            timeout: 2.0,
            expect_timeout: true,
            post: Some(
                r##"
alive() { for c in /proc/[0-9]*/cmdline; do tr '\0' ' ' < $c 2>/dev/null | grep -q "^sleep $1" && echo $c; done; }
for i in $(seq 1 50); do [ -z "$(alive '7776')" ] && break; sleep 0.1; done
for c in $(alive '7776'); do echo "ESCAPE survivor $c: $(tr '\0' ' ' < $c)"; done
echo END
"##,
            ),
            control: Some("no-cgroup-kill"),
            needs: &["call_cgroups"],
            ..BASE
        },
        // ---------------------------------------------------------------- G output
        Case {
            id: "G1",
            what: "infinite output is bounded and marked truncated",
            code: "yes",
            timeout: 3.0,
            expect_timeout: true,
            max_output: Some(65536),
            control: Some("no-output-cap"),
            ..BASE
        },
        Case {
            id: "G2",
            what: "one enormous line is bounded",
            code: "head -c 8000000 /dev/zero | tr '\\0' x; echo; echo END",
            max_output: Some(65536),
            control: Some("no-output-cap"),
            ..BASE
        },
        Case {
            id: "G3",
            what: "stderr and stdout floods are bounded independently",
            code: "yes err >&2 & yes out",
            timeout: 3.0,
            expect_timeout: true,
            max_output: Some(65536),
            control: Some("no-output-cap"),
            ..BASE
        },
        Case {
            id: "G4",
            what: "NUL bytes and invalid UTF-8 come back byte-exact (base64)",
            code: r##"printf 'a\000b\377\376END\n'"##,
            control: Some("lossy-output"),
            ..BASE
        },
        Case {
            id: "G5",
            what: "the daemon's memory stays flat under repeated 32 MiB floods",
            code: "head -c 33554432 /dev/zero; echo END",
            max_output: Some(1 << 20),
            extra: Extra::DaemonRss,
            control: Some("no-output-cap"),
            ..BASE
        },
        // ------------------------------------------------------------ H daemon and API
        Case {
            id: "H1",
            what: "file API: .., absolute, NUL and over-long paths never reach the host",
            code: "echo END",
            extra: Extra::FileApiPaths,
            control: Some("bind-host-tmp"),
            ..BASE
        },
        Case {
            id: "H2",
            what: "file API never follows a planted magic link to a host file",
            user: User::Root,
            code: "ln -sf /proc/1/fd/2 /tmp/h2 && ln -sf /proc/1/fd/2 /home/user/rootdir/h2 && echo END",
            extra: Extra::FileApiMagicLink,
            control: Some("files-follow"),
            ..BASE
        },
        Case {
            id: "H3",
            what: "file API: a symlink swapped between check and use never leads out",
            user: User::Root,
            code: r##"
while :; do
  ln -sfn /proc/1/fd/2 /tmp/h3.l; mv -f /tmp/h3.l /tmp/h3
  echo x > /tmp/h3.f; mv -f /tmp/h3.f /tmp/h3
done
"##,
            extra: Extra::FileApiRace,
            control: Some("files-follow"),
            ..BASE
        },
        Case {
            id: "H4",
            what: "file API as user never reads or writes a root-only file through a planted symlink",
            setup: Some("echo rootonly-secret > /home/user/rootdir/secret && chmod 600 /home/user/rootdir/secret && chmod 700 /home/user/rootdir"),
            code: "ln -sf /home/user/rootdir/secret /home/user/h4 && echo END",
            control: Some("files-as-root"),
            extra: Extra::FileApiMagicLink,
            ..BASE
        },
        Case {
            id: "H5",
            what: "file API refuses FIFOs, devices and /proc files planted as symlinks (no stall)",
            user: User::Root,
            code: "mkfifo /tmp/fifo && ln -sf /dev/zero /tmp/zero && ln -sf /proc/self/mem /tmp/mem && echo END",
            extra: Extra::FileApiSpecial,
            control: Some("files-any-type"),
            ..BASE
        },
        // ------------------------------------------- I the agent's handles, host counters
        Case {
            id: "I1",
            what: "an exec/spawn cwd through /proc/self/fd/N/.. never lands on the host's / (host UNIX socket)",
            code: r##"
for n in 3 4 5 6 7 8 9; do ln -sfn /proc/self/fd/$n/../../../../../../../.. /tmp/h$n; done
ln -sfn /proc/self/fd/4/../../../../../../../.. /tmp/h
ln -sfn /proc/1/root/../../../../.. /tmp/hroot
echo END
"##,
            extra: Extra::HostHandleCwd,
            control: Some("host-cgroup-fd,resolve-follow"),
            ..BASE
        },
        Case {
            id: "I2",
            what: "the file API through /proc/self/fd/N/.. never lists, stats, creates, moves or removes host files",
            code: r##"
ln -sfn /proc/self/fd/4/../../../../../../../.. /tmp/h
ln -sfn /proc/self/fd/4 /tmp/cg
echo END
"##,
            extra: Extra::HostHandleFiles,
            control: Some("host-cgroup-fd,resolve-follow"),
            ..BASE
        },
        Case {
            id: "I3",
            what: "sandbox root cannot change the agent's limits, priority, affinity or signal it",
            lang: Lang::Py,
            user: User::Root,
            code: r##"
import os, resource
checks = [
    ("prlimit(1, RLIMIT_CORE)", lambda: resource.prlimit(1, resource.RLIMIT_CORE, (0, 0))),
    ("kill(1, 0)", lambda: os.kill(1, 0)),
    ("pidfd_open(1)", lambda: os.close(os.pidfd_open(1))),
    ("sched_setaffinity(1)", lambda: os.sched_setaffinity(1, os.sched_getaffinity(0))),
    ("setpriority(PRIO_PROCESS, 1)", lambda: os.setpriority(os.PRIO_PROCESS, 1, 0)),
    ("setpriority(PRIO_USER, 0)", lambda: os.setpriority(os.PRIO_USER, 0, os.getpriority(os.PRIO_PROCESS, 0))),
]
for name, f in checks:
    try:
        f()
        print("ESCAPE", name, "reached the agent")
    except OSError as e:
        print("refused", name, e)
# Positive control inside the case: the same calls on itself work.
resource.prlimit(0, resource.RLIMIT_CORE, (0, 0))
os.setpriority(os.PRIO_PROCESS, 0, os.getpriority(os.PRIO_PROCESS, 0))
os.kill(os.getpid(), 0)
print("END")
"##,
            control: Some("no-seccomp"),
            ..BASE
        },
        Case {
            id: "I4",
            what: "inotify instances are the sandbox's own: holding all it can leaves host root and neighbours theirs",
            lang: Lang::Py,
            code: r##"
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
with open('/tmp/held.tmp', 'w') as f:
    f.write(str(len(fds)))
import os; os.rename('/tmp/held.tmp', '/tmp/held')
time.sleep(120)
"##,
            extra: Extra::HostCounters,
            control: Some("root-owned-userns"),
            needs: &["uid_ranges"],
            ..BASE
        },
        Case {
            id: "I7",
            what: "inotify watches are the sandbox's own: holding all it can leaves host root and neighbours theirs",
            lang: Lang::Py,
            code: r##"
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs('/tmp/w', exist_ok=True)
N = 25000
for i in range(N):
    open('/tmp/w/%d' % i, 'w').close()
total, fds, full = 0, [], False
while not full and len(fds) < 16:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
    for i in range(N):
        if libc.inotify_add_watch(fd, b'/tmp/w/%d' % i, 0x100) < 0:
            full = True
            break
        total += 1
with open('/tmp/held.tmp', 'w') as f:
    f.write('%d watches' % total)
os.rename('/tmp/held.tmp', '/tmp/held')
time.sleep(120)
"##,
            extra: Extra::HostCounters,
            control: Some("root-owned-userns"),
            timeout: 120.0,
            needs: &["uid_ranges"],
            ..BASE
        },
        Case {
            id: "I8",
            what: "POSIX message queues (bytes counted per user, host-wide) cannot be opened",
            lang: Lang::Py,
            code: r##"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
q = libc.mq_open(b'/tb-case', os.O_CREAT | os.O_RDWR, 0o600, None)
if q >= 0:
    print("ESCAPE mq_open succeeded")
    libc.mq_unlink(b'/tb-case')
else:
    print("refused mq_open:", os.strerror(ctypes.get_errno()))
print("END")
"##,
            control: Some("no-landlock"),
            needs: &["landlock"],
            ..BASE
        },
        Case {
            id: "I9",
            what: "pending signals are the sandbox's own: queueing all it can leaves host root and neighbours theirs",
            lang: Lang::Py,
            code: r##"
import os, signal, threading, time
sig = signal.SIGRTMIN
signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
me = threading.get_ident()
n = 0
try:
    # tgkill queues under RLIMIT_SIGPENDING (kill() of one's own RT signal is exempt).
    while n < 2000000:
        signal.pthread_kill(me, sig)
        n += 1
except OSError as e:
    err = str(e)
else:
    err = 'no limit reached'
with open('/tmp/held.tmp', 'w') as f:
    f.write('%d signals (%s)' % (n, err))
os.rename('/tmp/held.tmp', '/tmp/held')
time.sleep(120)
"##,
            extra: Extra::HostCounters,
            control: Some("root-owned-userns"),
            needs: &["uid_ranges"],
            ..BASE
        },
        Case {
            id: "I10",
            what: "epoll watches are counted per host user: sandbox root holding all it can leaves host root and neighbours theirs",
            lang: Lang::Py,
            user: User::Root,
            code: r##"
import os, select, time
fds = [os.eventfd(0) for _ in range(2800)]
eps, n, err = [], 0, 'no limit reached'
deadline = time.monotonic() + 40
try:
    while len(eps) < 2200 and time.monotonic() < deadline:
        e = select.epoll()
        eps.append(e)
        for fd in fds:
            e.register(fd, select.EPOLLIN)
            n += 1
except OSError as x:
    err = str(x)
with open('/tmp/held.tmp', 'w') as f:
    f.write('%d epoll watches (%s)' % (n, err))
os.rename('/tmp/held.tmp', '/tmp/held')
# Short: in a weakened jail this is host root's budget, the daemon's own included.
time.sleep(15)
"##,
            extra: Extra::HostCounters,
            // No positive control: the weakening that would show it (`host-userns`, the
            // case then runs as host root) drains the test host's own root budget, the
            // harness's and the daemon's event loops included. Epoll watches are counted
            // per host uid, which A3 checks is never host root's.
            control: None,
            limits: Some((4 << 30, 512)),
            needs: &["uid_ranges"],
            ..BASE
        },
        Case {
            id: "I5",
            what: "legacy AIO (a host-wide pool, fs.aio-nr) is refused",
            lang: Lang::Py,
            code: r##"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
ctx = ctypes.c_ulong(0)
r = libc.syscall(206, 64, ctypes.byref(ctx))  # io_setup
if r == 0:
    print("ESCAPE io_setup succeeded")
    libc.syscall(207, ctx)  # io_destroy
else:
    print("refused io_setup:", os.strerror(ctypes.get_errno()))
print("END")
"##,
            control: Some("no-seccomp"),
            ..BASE
        },
        Case {
            id: "I6",
            what: "the sandbox's host cgroup bounds its subtree (cgroup.max.descendants, max.depth)",
            code: "echo END",
            extra: Extra::CgroupTree,
            control: Some("no-cgroup-tree-limit"),
            ..BASE
        },
    ]
}
