//! Test-only: a wake that drops an isolation layer, for the positive control of the
//! security suite's after-wake check (`tests/security/after_wake.rs`, ADR 0150). Exists only
//! with the `insecure-test-hooks` feature; release builds contain none of it.
//!
//! A process's seccomp filter and Landlock domain cannot be taken from it once it runs, so
//! what a wake on this tier could lose is the mount namespace's masks; `wake-unmask`
//! unmounts them, as a restore that rebuilt the mounts without them would.

use threadbox_core::{CoreError, Result};
use threadbox_sys::cgroup::SandboxCgroup;

/// Masks `wake-unmask` removes: a masked file (bound over by `/dev/null`) and a
/// read-only bind, so both kinds of mask are seen to go.
const UNMASK: &[&str] = &["/proc/timer_list", "/proc/sys"];

pub(crate) fn after_wake(cg: &SandboxCgroup) -> Result<()> {
    let weaken = threadbox_sys::testhooks::Weaken::from_env().map_err(CoreError::Internal)?;
    if !weaken.has("wake-unmask") {
        return Ok(());
    }
    // Any process of the sandbox is in its mount namespace (frozen is fine: setns only
    // opens /proc/PID/ns/mnt).
    let Some(pid) = cg.pids()?.into_iter().next() else {
        return Ok(());
    };
    // The pid namespace too: umount reads /proc/self/mountinfo, and the sandbox's /proc
    // only has a `self` for its own processes.
    for target in UNMASK {
        let out = std::process::Command::new("nsenter")
            .args([
                "-t",
                &pid.to_string(),
                "-m",
                "-p",
                "-r",
                "umount",
                "-l",
                target,
            ])
            .output()
            .map_err(|e| CoreError::Internal(format!("nsenter: {e}")))?;
        if !out.status.success() {
            return Err(CoreError::Internal(format!(
                "wake-unmask: umount {target}: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
    }
    tracing::warn!(
        pid,
        "INSECURE TEST BUILD: wake-unmask unmounted the /proc masks"
    );
    Ok(())
}
