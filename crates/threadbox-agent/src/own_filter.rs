//! The agent's own seccomp filter, installed once its setup is done (inherited fds taken,
//! policy parts built, root opened), before it serves anything.
//!
//! The filter is the sandbox policy plus `clone3` (`threadbox_sys::seccomp::AGENT_ALLOW`
//! says why it cannot be narrower: every process the agent starts inherits it). What it
//! takes away from the agent itself, which is root of its user namespace with every
//! capability there: mounts, new namespaces and `setns`, `pivot_root`, `bpf`, `ptrace`,
//! keyrings, io_uring, and every system call the policy does not name (ADR 0040).

use threadbox_sys::seccomp;

/// Installs the filter on the agent (every thread, though it has one). Fails closed: an
/// agent that cannot filter itself does not start. The security suite's `no-seccomp`
/// weakening skips it too, since the agent's filter would otherwise stand in for the
/// children's.
pub fn install() -> Result<(), String> {
    if crate::testhooks::has("no-seccomp") {
        return Ok(());
    }
    let prog = seccomp::agent_filter().map_err(|e| format!("the agent's seccomp policy: {e}"))?;
    seccomp::apply_to_agent(&prog).map_err(|e| format!("the agent's seccomp filter: {e}"))
}
