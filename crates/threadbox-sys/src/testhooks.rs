//! Deliberate weakenings of the sandbox, for the security suite's positive controls only.
//!
//! This module exists only with the `insecure-test-hooks` cargo feature; release and
//! default builds contain none of it (and no code that reads `THREADBOX_TEST_WEAKEN`).
//! Each weakening removes exactly one layer, so a test that still passes against it
//! proves nothing about that layer.

/// Environment variable read by a daemon built with the feature.
pub const ENV: &str = "THREADBOX_TEST_WEAKEN";

/// Every weakening and what it removes.
pub const KNOWN: &[(&str, &str)] = &[
    (
        "no-seccomp",
        "sandbox processes run without the seccomp filter",
    ),
    (
        "no-landlock",
        "sandbox processes run without the Landlock ruleset",
    ),
    (
        "keep-caps",
        "sandbox processes keep their capabilities (no drop, no secure bits)",
    ),
    (
        "host-userns",
        "no user namespace: sandbox uid 0 is host root",
    ),
    (
        "shared-pidns",
        "the sandbox shares the host's PID namespace",
    ),
    (
        "shared-netns",
        "the sandbox shares the host's network namespace",
    ),
    (
        "shared-ipcns",
        "the sandbox shares the host's IPC namespace",
    ),
    ("no-proc-mask", "/proc is neither masked nor read-only"),
    (
        "no-pidns",
        "gvisor: sandbox processes share the agent's pid namespace and /proc (ADR 0218)",
    ),
    ("host-dev", "the host's /dev is bound into the sandbox"),
    (
        "bind-host-tmp",
        "the host's /tmp is bound read-write at /host-tmp",
    ),
    (
        "no-cgroup-kill",
        "timeouts kill only the process group, not the call's cgroup",
    ),
    ("no-output-cap", "captured output is not bounded"),
    (
        "files-follow",
        "the file API follows magic links and opens kernel files",
    ),
    ("no-pids-limit", "the sandbox's cgroup has no pids limit"),
    (
        "egress-no-floor",
        "the egress floor excepts every address (as if --egress-allow-private 0.0.0.0/0,::/0)",
    ),
    (
        "egress-no-conn-cap",
        "a sandbox's egress has no connection cap",
    ),
    (
        "no-memory-limit",
        "the sandbox's cgroup has no memory limit (and /tmp no size)",
    ),
    (
        "files-as-root",
        "the file API ignores the requested user (the agent's own identity)",
    ),
    (
        "no-disk-quota",
        "new sandboxes get a plain upper directory on the host's disk",
    ),
    (
        "no-nofile-limit",
        "the sandbox keeps the daemon's RLIMIT_NOFILE instead of ours",
    ),
    (
        "no-cpu-limit",
        "the sandbox's cgroup gets a CPU quota of 64 cores (no limit on this host)",
    ),
    (
        "no-reaper",
        "the agent (PID 1) waits only for its own children and never reaps orphans",
    ),
    (
        "files-any-type",
        "the file API reads and writes FIFOs and devices, not only regular files",
    ),
    (
        "lossy-output",
        "exec output that is not UTF-8 is returned lossily as UTF-8 instead of base64",
    ),
    (
        "suid",
        "no no_new_privs, and the root overlay honours setuid bits",
    ),
    (
        "host-cgroup-fd",
        "the agent's cgroup directory is opened in the host's mount namespace (by host path)",
    ),
    (
        "resolve-follow",
        "the agent's path resolver follows magic links and leaves the sandbox root",
    ),
    (
        "root-owned-userns",
        "the sandbox's user namespace is owned by host root (kernel counters are root's)",
    ),
    (
        "no-landlock-kernel",
        "the agent behaves as on a kernel without Landlock",
    ),
    (
        "no-cgroup-tree-limit",
        "the sandbox's cgroup has no cgroup.max.descendants/max.depth limits",
    ),
    (
        "secrets-any-host",
        "the egress proxy intercepts every TLS host of a sandbox with secrets and swaps them there",
    ),
    (
        "secrets-host-switch",
        "an intercepted TLS session carries requests naming another Host (swapped there too)",
    ),
    (
        "egress-no-dns-cap",
        "a sandbox's DNS questions have no rate cap",
    ),
    (
        "wake-unmask",
        "a wake from hibernate unmounts the sandbox's /proc masks (a restore that drops a layer)",
    ),
];

/// A set of weakenings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Weaken(Vec<String>);

impl Weaken {
    /// Parses a comma-separated list; unknown names are refused.
    pub fn parse(list: &str) -> Result<Weaken, String> {
        let mut out = Vec::new();
        for w in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if !KNOWN.iter().any(|(k, _)| *k == w) {
                return Err(format!("unknown test weakening {w:?}"));
            }
            out.push(w.to_string());
        }
        Ok(Weaken(out))
    }

    /// Reads [`ENV`] (empty when unset).
    pub fn from_env() -> Result<Weaken, String> {
        Weaken::parse(&std::env::var(ENV).unwrap_or_default())
    }

    pub fn has(&self, w: &str) -> bool {
        self.0.iter().any(|x| x == w)
    }

    pub fn list(&self) -> &[String] {
        &self.0
    }

    pub fn to_arg(&self) -> String {
        self.0.join(",")
    }
}
