//! The posture check, seen from inside: a child forked into exactly the policy of a user
//! process (uid 1000, no capabilities, no_new_privs, Landlock, seccomp) probes what it can
//! see and do, and reports one line per check. Like youki's `runtimetest`, but in the agent.
//!
//! The checks depend on the tier (`--tier`, ADR 0145): on gvisor the sentry answers the
//! probes, so a jail layer it does not have (Landlock, a host uid map) is reported as not
//! applying, with the reason, and the probes that read a `/proc/self/status` line the
//! sentry leaves out ask the kernel instead. No check is dropped.

use crate::agent::{identity, Agent};
use crate::error::{AgentError, Result};
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;
use threadbox_proto::{PostureCheck, Response, RunAs};
use threadbox_sys::child as syschild;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;

/// The whole selftest must finish within this (the egress probe is the slow part).
const DEADLINE: Duration = Duration::from_secs(15);
const MAX_REPORT: usize = 1024 * 1024;

/// /dev entries a sandbox may have; the symlinks a /dev usually carries are also accepted.
const DEV_ALLOWED: &[&str] = &[
    "null", "zero", "full", "random", "urandom", "tty", "pts", "shm",
];
const DEV_ALLOWED_SYMLINKS: &[&str] = &["fd", "stdin", "stdout", "stderr", "ptmx", "core"];

/// The isolation tier the agent was started on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Tier {
    #[default]
    Jail,
    Gvisor,
}

impl std::str::FromStr for Tier {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Tier, String> {
        match s {
            "jail" => Ok(Tier::Jail),
            "gvisor" => Ok(Tier::Gvisor),
            other => Err(format!("unknown tier {other:?} (jail or gvisor)")),
        }
    }
}

/// /dev entries the sentry adds: its own FUSE and tun devices, implemented inside the
/// sentry, which open no host device.
const DEV_ALLOWED_GVISOR: &[&str] = &["fuse", "net"];

/// Kernel files the jail masks (bound to /dev/null, or an empty read-only tmpfs) and
/// files that never belong in a sandbox: each must be absent, unreadable or empty.
const MASKED: &[&str] = &[
    "/proc/kcore",
    "/proc/kmsg",
    "/proc/keys",
    "/proc/key-users",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/proc/kpagecount",
    "/proc/kpageflags",
    "/proc/kpagecgroup",
    "/proc/kallsyms",
    "/proc/vmallocinfo",
    "/proc/slabinfo",
    "/proc/mtrr",
    "/sys/firmware/efi",
    "/sys/kernel/security",
    "/sys/kernel/debug",
];

/// The host-bound unix socket the agent listens on under gVisor (`--host-uds=create`).
const GVISOR_AGENT_SOCKET: &str = "/run/threadbox/agent.sock";

fn check(name: &str, ok: bool, detail: impl Into<String>) -> PostureCheck {
    PostureCheck {
        name: name.into(),
        ok,
        detail: detail.into(),
        applies: true,
    }
}

/// A check that does not apply on this tier: reported, with the reason, never dropped.
fn not_applicable(name: &str, reason: impl Into<String>) -> PostureCheck {
    PostureCheck {
        name: name.into(),
        ok: true,
        detail: reason.into(),
        applies: false,
    }
}

pub async fn selftest(agent: Rc<Agent>) -> Response {
    match run(&agent).await {
        Ok(checks) => Response::Selftest { checks },
        Err(e) => e.into_response(),
    }
}

async fn run(agent: &Rc<Agent>) -> Result<Vec<PostureCheck>> {
    let who = identity(RunAs::User);
    let root_dir = agent
        .root
        .open_dir(Path::new("/"))
        .map_err(|e| AgentError::internal(format!("selftest: open /: {e}")))?;
    let policy = agent.child_policy(&who, root_dir, None)?;
    let (reader, writer) =
        std::io::pipe().map_err(|e| AgentError::internal(format!("selftest pipe: {e}")))?;
    let landlock = agent.policy.landlock.as_ref().map(|r| r.abi());
    let keep = [writer.as_raw_fd()];
    let tier = agent.tier;
    let pid = syschild::run_forked(&policy, &keep, move || {
        let checks = child_checks(tier, landlock);
        let mut w = writer;
        match serde_json::to_vec(&checks) {
            Ok(json) if w.write_all(&json).is_ok() => 0,
            _ => 1,
        }
    })
    .map_err(|e| AgentError::internal(format!("could not fork the selftest: {e}")))?;
    // Registered before any `.await`, so the reaper cannot take the status first.
    let exit = agent.wait_for(pid);
    let mut rx = pipe::Receiver::from_owned_fd(OwnedFd::from(reader))
        .map_err(|e| AgentError::internal(format!("selftest pipe: {e}")))?;

    let mut report = Vec::new();
    let read = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match rx.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) if report.len() + n <= MAX_REPORT => report.extend_from_slice(&buf[..n]),
                Ok(_) => break,
            }
        }
    };
    if tokio::time::timeout(DEADLINE, read).await.is_err() {
        let _ = syschild::kill(pid, libc::SIGKILL);
        return Err(AgentError::internal("the selftest did not finish in time"));
    }
    let status = tokio::time::timeout(Duration::from_secs(5), exit).await;
    let mut checks: Vec<PostureCheck> = match serde_json::from_slice(&report) {
        Ok(c) => c,
        Err(_) => {
            let _ = syschild::kill(pid, libc::SIGKILL);
            return Err(AgentError::internal(format!(
                "the selftest child reported nothing usable (status {status:?}); it may have been \
                 unable to enter the policy"
            )));
        }
    };
    let me = std::process::id();
    checks.push(check(
        "agent_is_pid1",
        me == 1,
        format!("the agent runs as pid {me}"),
    ));
    Ok(checks)
}

/// Everything below runs in the child, under the policy.
fn child_checks(tier: Tier, landlock_abi: Option<u32>) -> Vec<PostureCheck> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_else(|| "missing".into())
    };
    let mut out = Vec::new();

    let s = field("Seccomp");
    out.push(check(
        "seccomp",
        s == "2",
        format!("Seccomp: {s} (2 = filter)"),
    ));
    out.push(no_new_privs_check(tier, &field("NoNewPrivs")));

    out.push(capabilities_check(tier, &field));

    let uid = field("Uid");
    let gid = field("Gid");
    let ids_ok =
        uid.split_whitespace().all(|u| u == "1000") && gid.split_whitespace().all(|g| g == "1000");
    out.push(check("user", ids_ok, format!("Uid: {uid}; Gid: {gid}")));

    out.push(match tier {
        Tier::Jail => uid_map_check(),
        Tier::Gvisor => not_applicable(
            "uid_map",
            "gvisor: the sentry keeps its own user namespace (an identity map inside a \
             user-space kernel; the sandbox's uid 0 is the sentry's, not a host uid); the \
             user check covers the ids",
        ),
    });
    out.push(interfaces_check());
    out.push(routes_check());

    let target: SocketAddr = ([1, 1, 1, 1], 53).into();
    out.push(
        match TcpStream::connect_timeout(&target, Duration::from_secs(2)) {
            Ok(_) => check("egress_blocked", false, "connected to 1.1.1.1:53"),
            Err(e) => check(
                "egress_blocked",
                true,
                format!("connect to 1.1.1.1:53 failed: {e}"),
            ),
        },
    );

    out.push(match syschild::probe_unshare(libc::CLONE_NEWUSER) {
        Ok(()) => check("unshare_refused", false, "unshare(CLONE_NEWUSER) succeeded"),
        Err(e) => check(
            "unshare_refused",
            true,
            format!("unshare(CLONE_NEWUSER): {e}"),
        ),
    });

    let old = syschild::probe_mount_tmpfs(Path::new("/tmp"));
    let new = syschild::probe_fsopen();
    out.push(check(
        "mount_refused",
        old.is_err() && new.is_err(),
        format!(
            "mount(tmpfs): {}; fsopen(tmpfs): {}",
            outcome(&old),
            outcome(&new)
        ),
    ));

    let mut writable = Vec::new();
    for f in [
        "/proc/sys/kernel/core_pattern",
        "/proc/sysrq-trigger",
        "/sys/kernel/uevent_helper",
    ] {
        if std::fs::OpenOptions::new().write(true).open(f).is_ok() {
            writable.push(f);
        }
    }
    out.push(check(
        "kernel_files_read_only",
        writable.is_empty(),
        if writable.is_empty() {
            "core_pattern, sysrq-trigger, uevent_helper are not writable".to_string()
        } else {
            format!("writable: {}", writable.join(", "))
        },
    ));

    out.push(dev_check(tier));
    out.push(masked_check());
    out.push(agent_socket_check(tier));

    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    out.push(check(
        "hostname",
        !host.is_empty(),
        format!("hostname {host:?}"),
    ));

    let ppid = std::os::unix::process::parent_id();
    let pids = count_processes();
    out.push(match tier {
        Tier::Jail => check(
            "pid_namespace",
            ppid == 1,
            format!("parent (the agent) is pid {ppid}; {pids} processes visible"),
        ),
        // The agent is outside the sandbox's pid namespace (ADR 0218): this process's
        // parent has no pid in it (0), and pid 1 is the namespace's bare init.
        Tier::Gvisor => {
            let init = std::fs::read("/proc/1/cmdline").unwrap_or_default();
            let init_ok =
                init.split(|b| *b == 0).nth(1) == Some(syschild::pidns::INIT_ARG.as_bytes());
            check(
                "pid_namespace",
                ppid == 0 && init_ok,
                format!(
                    "parent (the agent) {}; pid 1 {}; {pids} processes visible",
                    if ppid == 0 {
                        "outside this pid namespace".to_string()
                    } else {
                        format!("is pid {ppid}")
                    },
                    if init_ok {
                        "is the namespace's init"
                    } else {
                        "is not the namespace's init"
                    }
                ),
            )
        }
    });

    out.push(match tier {
        Tier::Jail => landlock_check(landlock_abi),
        Tier::Gvisor => not_applicable(
            "landlock",
            "gvisor: the sentry has no Landlock; on this tier the sentry is the boundary \
             (it answers every system call; the agent runs with --allow-no-landlock)",
        ),
    });
    out
}

/// Asked of the kernel (`PR_GET_NO_NEW_PRIVS`); where `/proc/self/status` shows the
/// line (the jail), it must agree. gVisor's status has no such line.
fn no_new_privs_check(tier: Tier, status_line: &str) -> PostureCheck {
    let asked = syschild::no_new_privs();
    let shown = match (tier, status_line) {
        (Tier::Gvisor, "missing") => "not shown by the sentry's /proc".to_string(),
        (_, v) => v.to_string(),
    };
    let line_ok = status_line == "1" || (tier == Tier::Gvisor && status_line == "missing");
    let ok = matches!(asked, Ok(true)) && line_ok;
    let asked = match asked {
        Ok(v) => u8::from(v).to_string(),
        Err(e) => e.to_string(),
    };
    check(
        "no_new_privs",
        ok,
        format!("PR_GET_NO_NEW_PRIVS: {asked}; NoNewPrivs: {shown}"),
    )
}

/// Every set of `/proc/self/status` empty, and the ambient set asked of the kernel too
/// (`PR_CAP_AMBIENT_IS_SET`: gVisor's status has no `CapAmb` line). A set missing from
/// status fails, except `CapAmb` on gvisor.
fn capabilities_check(tier: Tier, field: &dyn Fn(&str) -> String) -> PostureCheck {
    let mut bad: Vec<String> = Vec::new();
    for s in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let v = field(s);
        if s == "CapAmb" && v == "missing" && tier == Tier::Gvisor {
            continue;
        }
        if u64::from_str_radix(&v, 16) != Ok(0) {
            bad.push(format!("{s}={v}"));
        }
    }
    let mut ambient = "ambient asked of the kernel";
    match syschild::ambient_capabilities(63) {
        Ok(a) if a.is_empty() => {}
        Ok(a) => bad.push(format!("ambient (PR_CAP_AMBIENT_IS_SET): {a:?}")),
        // The sentry implements no ambient set: PR_CAP_AMBIENT is EINVAL for every cap.
        Err(e) if tier == Tier::Gvisor && e.raw_os_error() == Some(libc::EINVAL) => {
            ambient = "the sentry has no ambient set (PR_CAP_AMBIENT: EINVAL)";
        }
        Err(e) => bad.push(format!("PR_CAP_AMBIENT_IS_SET failed: {e}")),
    }
    check(
        "capabilities",
        bad.is_empty(),
        if bad.is_empty() {
            format!("every capability set is empty ({ambient})")
        } else {
            bad.join(" ")
        },
    )
}

/// The masked kernel files: absent, unreadable, or empty when read.
fn masked_check() -> PostureCheck {
    let mut readable = Vec::new();
    let mut absent = 0;
    for p in MASKED {
        match std::fs::File::open(p) {
            Ok(mut f) => {
                let mut buf = [0u8; 64];
                if let Ok(n) = std::io::Read::read(&mut f, &mut buf) {
                    if n > 0 {
                        readable.push(*p);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => absent += 1,
            Err(_) => {}
        }
    }
    check(
        "mount_masks",
        readable.is_empty(),
        if readable.is_empty() {
            format!(
                "{} kernel files masked ({absent} absent, the rest empty or unreadable)",
                MASKED.len()
            )
        } else {
            format!("readable: {}", readable.join(", "))
        },
    )
}

/// The agent's own socket is not a way in for a sandbox user. On gvisor it is a host
/// unix socket bound through the sentry in a root-only directory: connecting must fail.
/// On the jail the agent listens on an inherited descriptor: no path of it exists inside.
fn agent_socket_check(tier: Tier) -> PostureCheck {
    match tier {
        Tier::Jail => {
            let present = Path::new("/run/threadbox").exists();
            check(
                "agent_socket",
                !present,
                if present {
                    "/run/threadbox exists inside the jail".to_string()
                } else {
                    "no socket path: the agent listens on an inherited descriptor".to_string()
                },
            )
        }
        Tier::Gvisor => match std::os::unix::net::UnixStream::connect(GVISOR_AGENT_SOCKET) {
            Ok(_) => check(
                "agent_socket",
                false,
                format!("a sandbox user connected to the host-bound {GVISOR_AGENT_SOCKET}"),
            ),
            Err(e) => check(
                "agent_socket",
                true,
                format!("connect to the host-bound {GVISOR_AGENT_SOCKET}: {e}"),
            ),
        },
    }
}

fn outcome(r: &std::io::Result<()>) -> String {
    match r {
        Ok(()) => "succeeded".into(),
        Err(e) => e.to_string(),
    }
}

fn uid_map_check() -> PostureCheck {
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let first = map
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let to_host_root = map
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("0"));
    let ok = !map.trim().is_empty() && !to_host_root;
    let detail = if to_host_root {
        format!("uid_map {first:?} maps onto host uid 0")
    } else {
        format!("uid_map {first:?}")
    };
    check("uid_map", ok, detail)
}

fn interfaces_check() -> PostureCheck {
    let dev = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
    let names: Vec<&str> = dev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    check(
        "network_interfaces",
        names == ["lo"],
        format!("interfaces: {}", names.join(", ")),
    )
}

fn routes_check() -> PostureCheck {
    let v4 = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let v4_routes = v4.lines().skip(1).filter(|l| !l.trim().is_empty()).count();
    let v6 = std::fs::read_to_string("/proc/net/ipv6_route").unwrap_or_default();
    let v6_routes = v6
        .lines()
        .filter(|l| l.split_whitespace().last().is_some_and(|d| d != "lo"))
        .count();
    check(
        "no_routes",
        v4_routes == 0 && v6_routes == 0,
        format!("{v4_routes} IPv4 routes, {v6_routes} IPv6 routes off loopback"),
    )
}

fn dev_check(tier: Tier) -> PostureCheck {
    let mut extra = Vec::new();
    let mut seen = Vec::new();
    match std::fs::read_dir("/dev") {
        Ok(rd) => {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let is_link = e.file_type().map(|t| t.is_symlink()).unwrap_or(false);
                let sentry_own =
                    tier == Tier::Gvisor && DEV_ALLOWED_GVISOR.contains(&name.as_str());
                if DEV_ALLOWED.contains(&name.as_str())
                    || (is_link && DEV_ALLOWED_SYMLINKS.contains(&name.as_str()))
                    || sentry_own
                {
                    seen.push(name);
                } else {
                    extra.push(name);
                }
            }
        }
        Err(e) => return check("dev_entries", false, format!("cannot list /dev: {e}")),
    }
    extra.sort();
    let own: Vec<&String> = seen
        .iter()
        .filter(|n| tier == Tier::Gvisor && DEV_ALLOWED_GVISOR.contains(&n.as_str()))
        .collect();
    let detail = if extra.is_empty() && !own.is_empty() {
        let own: Vec<&str> = own.iter().map(|s| s.as_str()).collect();
        format!(
            "{} allowed entries ({} the sentry's own devices, no host device)",
            seen.len(),
            own.join(", ")
        )
    } else if extra.is_empty() {
        format!("{} allowed entries", seen.len())
    } else {
        let shown: Vec<_> = extra.iter().take(10).cloned().collect();
        format!(
            "{} unexpected entries: {}{}",
            extra.len(),
            shown.join(" "),
            if extra.len() > 10 { " ..." } else { "" }
        )
    };
    check("dev_entries", extra.is_empty(), detail)
}

/// DAC lets a dumpable process write its own /proc/self/comm; only Landlock (which grants
/// read-only access under /) refuses it.
fn landlock_check(abi: Option<u32>) -> PostureCheck {
    let Some(abi) = abi else {
        return check(
            "landlock",
            false,
            "not enforced: the kernel has no Landlock",
        );
    };
    if let Err(e) = syschild::set_dumpable(true) {
        return check("landlock", false, format!("probe failed: {e}"));
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .open("/proc/self/comm")
    {
        Ok(_) => check(
            "landlock",
            false,
            format!("ABI {abi}: writing /proc/self/comm was allowed"),
        ),
        Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
            check("landlock", true, format!("enforced (ABI {abi})"))
        }
        Err(e) => check(
            "landlock",
            false,
            format!("ABI {abi}: unexpected probe result: {e}"),
        ),
    }
}

/// Processes visible in /proc (the sandbox's own pid namespace).
pub fn count_processes() -> u32 {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                })
                .count() as u32
        })
        .unwrap_or(0)
}
