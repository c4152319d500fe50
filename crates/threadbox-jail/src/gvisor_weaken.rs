//! The security suite's positive controls on the gvisor tier (ADR 0009, 0145): the
//! weakenings this tier honours. The agent's own (its filter, the child policy, the file
//! API, the reaper, call kills) reach it through `--test-weaken`; the cgroup limits around
//! runsc are lifted like the jail's. The jail's namespace, mount and uid-range weakenings
//! have no counterpart here: the sentry's confinement is runsc's, not ours to weaken.
//! Without the `insecure-test-hooks` feature nothing here changes anything.

/// The agent's extra arguments: `--test-weaken LIST` in a weakened build with
/// `THREADBOX_TEST_WEAKEN` set, else none.
pub fn agent_args() -> Vec<String> {
    #[cfg(feature = "insecure-test-hooks")]
    if let Ok(w) = threadbox_sys::testhooks::Weaken::from_env() {
        if !w.list().is_empty() {
            return vec!["--test-weaken".into(), w.list().join(",")];
        }
    }
    Vec::new()
}

/// `limits` with the limit weakenings in force lifted.
#[allow(unused_mut)]
pub fn limits(mut limits: threadbox_sys::cgroup::Limits) -> threadbox_sys::cgroup::Limits {
    #[cfg(feature = "insecure-test-hooks")]
    if let Ok(w) = threadbox_sys::testhooks::Weaken::from_env() {
        if w.has("no-pids-limit") {
            limits.pids = 1 << 22;
        }
        if w.has("no-memory-limit") {
            limits.memory_bytes = 1 << 40;
        }
        if w.has("no-cpu-limit") {
            limits.cpus = 64.0;
        }
    }
    limits
}

/// Whether the sandbox cgroup's subtree is bounded (`no-cgroup-tree-limit` lifts it).
pub fn tree_limit() -> bool {
    #[cfg(feature = "insecure-test-hooks")]
    if let Ok(w) = threadbox_sys::testhooks::Weaken::from_env() {
        return !w.has("no-cgroup-tree-limit");
    }
    true
}

/// Mounts of the container the weakenings in force add (ADR 0192): `bind-host-tmp` binds
/// the host's `/tmp` read-write at `/host-tmp`, `host-dev` the host's `/dev` over the
/// sentry's (read-only: the probes list it, nothing needs to write a host device), both
/// through the gofer as the jail binds them.
pub fn mounts() -> Vec<serde_json::Value> {
    #[allow(unused_mut)]
    let mut out = Vec::new();
    #[cfg(feature = "insecure-test-hooks")]
    if let Ok(w) = threadbox_sys::testhooks::Weaken::from_env() {
        if w.has("bind-host-tmp") {
            out.push(
                serde_json::json!({"destination": "/host-tmp", "type": "bind",
                "source": "/tmp", "options": ["rbind", "rw"]}),
            );
        }
        if w.has("host-dev") {
            out.push(serde_json::json!({"destination": "/dev", "type": "bind",
                "source": "/dev", "options": ["rbind", "ro", "nosuid", "noexec"]}));
        }
    }
    out
}

/// Whether the sentry runs in the host's user namespace (`host-userns`): runsc does so on
/// `--network=host`, which is what the weakened launch passes (in a fresh, empty netns of
/// runsc's: the sandbox's network stays closed, only its user namespace is the host's).
pub fn sentry_in_host_userns() -> bool {
    #[cfg(feature = "insecure-test-hooks")]
    if let Ok(w) = threadbox_sys::testhooks::Weaken::from_env() {
        return w.has("host-userns");
    }
    false
}

/// The container's RLIMIT_NOFILE (soft = hard): `ours`, or under `no-nofile-limit` the
/// daemon's own hard limit, as the jail's weakening keeps it (`/proc/self/limits`).
pub fn nofile_limit(ours: u64) -> u64 {
    #[cfg(feature = "insecure-test-hooks")]
    if let Ok(w) = threadbox_sys::testhooks::Weaken::from_env() {
        if w.has("no-nofile-limit") {
            let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
            let hard = limits
                .lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(4)?.parse::<u64>().ok());
            return hard.unwrap_or(ours);
        }
    }
    ours
}
