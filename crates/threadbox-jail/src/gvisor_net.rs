//! Egress on the gvisor tier (issue 16 scope 1, ADR 0140): a sandbox that uses the network
//! (a policy, secrets or the OTLP endpoint) boots in a network namespace of ours with the
//! jail's fixed egress table (ADR 0065), made by the launch helper while it is host root,
//! and runsc runs with `--network=host`: the sentry's sockets are host sockets *in that
//! netns*, so every connection meets the table and the daemon's listeners exactly as a
//! jail sandbox's do, and the daemon reaches the sandbox's loopback (previews, the OTLP
//! endpoint) the same way. Everything else keeps runsc's own netstack with loopback only
//! (`--network=none`): runsc 20240729 refuses to checkpoint a sandbox on the host network,
//! and its `--network=sandbox` mode mistakes every netns for the host's on this kernel.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use threadbox_core::driver::SandboxSpec;
use threadbox_sys::net::EgressConfig;

/// The egress table of a boot of `spec`, if it uses the network.
pub(crate) fn egress_of(spec: &SandboxSpec) -> Option<EgressConfig> {
    spec.network.then(EgressConfig::default)
}

/// runsc's `--network` for a boot (a global flag: before `run`).
pub(crate) fn network_flag(egress: bool) -> &'static str {
    if egress {
        // The sentry's host network is the netns the helper made: lo and our table only.
        "--network=host"
    } else {
        // runsc's netstack, loopback only.
        "--network=none"
    }
}

/// The container's namespaces. With egress there is no `network` entry: one without a
/// path would make runsc create a fresh, empty netns for the sentry instead of keeping
/// the helper's.
pub(crate) fn namespaces(egress: bool) -> Value {
    let mut ns = vec![json!({"type": "pid"})];
    if !egress {
        ns.push(json!({"type": "network"}));
    }
    ns.extend([
        json!({"type": "ipc"}),
        json!({"type": "uts"}),
        json!({"type": "mount"}),
    ]);
    Value::Array(ns)
}

/// The image's CA bundle with the daemon's egress CA, bound read-only over the image's
/// own (ADR 0075), as the jail binds it.
pub(crate) fn ca_mount(lower: &[PathBuf], trust_ca: Option<&str>, run: &Path) -> Option<Value> {
    let b = crate::ca_bundle::bind(lower, trust_ca?, run)?;
    Some(
        json!({"destination": b.target, "type": "bind", "source": b.source,
                "options": ["bind", "ro", "nosuid", "nodev", "noexec"]}),
    )
}

/// What a boot runs with: the table the helper installs in a netns of its own, and
/// whether runsc uses the host network (of that netns, or under `shared-netns` of the
/// daemon's). `shared-netns` (a test weakening, ADR 0009) is the positive control of the
/// egress cases on this tier, and of the network cases of a sandbox without a policy
/// (ADR 0192): the sentry on the daemon's own network, no table.
pub(crate) fn boot_network(
    spec: &SandboxSpec,
) -> threadbox_core::error::Result<(Option<EgressConfig>, bool)> {
    let egress = egress_of(spec);
    #[cfg(feature = "insecure-test-hooks")]
    {
        let weaken = threadbox_sys::testhooks::Weaken::from_env()
            .map_err(threadbox_core::error::CoreError::Internal)?;
        if weaken.has("shared-netns") {
            return Ok((None, true));
        }
    }
    let host = egress.is_some();
    Ok((egress, host))
}

/// runsc 20240729 cannot checkpoint a sandbox on the host network ("checkpoint not
/// supported when using hostinet"): a sandbox booted with our netns is refused a memory
/// image (hibernate, fork with memory) with that reason, before runsc is asked.
pub(crate) fn refuse_memory_image(j: &crate::Jail, id: &str) -> threadbox_core::error::Result<()> {
    if j.paths(id).run.join(crate::NETNS_FILE).exists() {
        return Err(threadbox_core::error::CoreError::Conflict(format!(
            "sandbox {id} uses the network (a policy, secrets or the OTLP endpoint), so on the \
             gvisor tier it runs on the host network of a netns of ours, which runsc cannot \
             checkpoint: no hibernate or memory image for it (ADR 0140)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn egress_keeps_the_helpers_netns() {
        let with = namespaces(true).to_string();
        assert!(!with.contains("network"), "{with}");
        assert!(namespaces(false).to_string().contains("\"network\""));
        assert_eq!(network_flag(true), "--network=host");
        assert_eq!(network_flag(false), "--network=none");
    }
}
