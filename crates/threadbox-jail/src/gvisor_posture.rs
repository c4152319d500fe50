//! The selftest's host-side checks on the gvisor tier (ADR 0145): what the sandbox cannot
//! see from inside — the confinement of the sentry, the host process that answers its
//! system calls. The recorded agent pid of a gvisor sandbox is the sentry's host pid.

use std::os::unix::fs::MetadataExt;
use threadbox_core::driver::HostCheck;

/// Namespaces the sentry must not share with the host (the daemon's own). Not `pid`:
/// runsc 20240729 leaves the sentry in the host's pid namespace (the sandbox's pids are
/// the sentry's own, kept in user space).
const NAMESPACES: &[&str] = &["user", "mnt", "net", "ipc", "uts"];

fn check(name: &str, ok: bool, detail: String) -> HostCheck {
    HostCheck {
        name: name.into(),
        ok,
        detail,
    }
}

/// The sentry's seccomp filter and no_new_privs, its namespaces, its root and its cgroup,
/// read from `/proc/<pid>` on the host. `id` names the sandbox's cgroup.
pub fn sentry_checks(id: &str, sentry_pid: Option<i32>) -> Vec<HostCheck> {
    let Some(pid) = sentry_pid else {
        return vec![check(
            "sentry",
            false,
            "no sentry pid is recorded for the sandbox".into(),
        )];
    };
    let proc = format!("/proc/{pid}");
    let status = match std::fs::read_to_string(format!("{proc}/status")) {
        Ok(s) => s,
        Err(e) => {
            return vec![check(
                "sentry",
                false,
                format!("cannot read the sentry's status (pid {pid}): {e}"),
            )]
        }
    };
    let field = |name: &str| -> String {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(':')))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| "missing".into())
    };
    let mut out = Vec::new();
    let (sc, nnp) = (field("Seccomp"), field("NoNewPrivs"));
    out.push(check(
        "sentry_seccomp",
        sc == "2" && nnp == "1",
        format!("the sentry (host pid {pid}) runs under runsc's filter: Seccomp: {sc}, NoNewPrivs: {nnp}"),
    ));

    let shared: Vec<&str> = NAMESPACES
        .iter()
        .copied()
        .filter(|ns| {
            let theirs = std::fs::read_link(format!("{proc}/ns/{ns}"));
            let ours = std::fs::read_link(format!("/proc/self/ns/{ns}"));
            // Unreadable counts as shared: the check must prove the difference.
            !matches!((theirs, ours), (Ok(t), Ok(o)) if t != o)
        })
        .collect();
    out.push(check(
        "sentry_namespaces",
        shared.is_empty(),
        if shared.is_empty() {
            format!("own {} namespaces (not the host's)", NAMESPACES.join(", "))
        } else {
            format!("shares the host's {} namespace(s)", shared.join(", "))
        },
    ));

    // The sentry pivots into an empty directory: its `/` is not the host's.
    let roots = (
        std::fs::metadata(format!("{proc}/root")),
        std::fs::metadata("/"),
    );
    out.push(match roots {
        (Ok(t), Ok(h)) => check(
            "sentry_root",
            (t.dev(), t.ino()) != (h.dev(), h.ino()),
            if (t.dev(), t.ino()) == (h.dev(), h.ino()) {
                "the sentry's root is the host's /".into()
            } else {
                "the sentry's root is not the host's / (runsc's empty pivot)".into()
            },
        ),
        (Err(e), _) | (_, Err(e)) => {
            check("sentry_root", false, format!("cannot compare roots: {e}"))
        }
    });

    let cg = std::fs::read_to_string(format!("{proc}/cgroup")).unwrap_or_default();
    // The limiting hierarchies (v2's unified one; v1's memory and pids on a hybrid
    // host) must hold the sentry; the others (v1 name=systemd, cpuset…) are not ours.
    let ours = format!("/threadbox/{id}");
    let limiting: Vec<&str> = cg
        .lines()
        .filter(|l| {
            let ctl = l.split(':').nth(1).unwrap_or("");
            ctl.is_empty() || ctl.split(',').any(|c| c == "memory" || c == "pids")
        })
        .collect();
    let inside = !limiting.is_empty() && limiting.iter().all(|l| l.ends_with(&ours));
    out.push(check(
        "sentry_cgroup",
        inside,
        if inside {
            format!("in the sandbox's cgroup threadbox/{id}")
        } else {
            format!("cgroups: {}", cg.trim().replace('\n', "; "))
        },
    ));
    out
}
