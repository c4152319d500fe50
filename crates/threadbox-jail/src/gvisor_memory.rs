//! A gvisor sandbox's memory limit (ADR 0205). gVisor enforces none in the sentry, so the
//! limit is held by three parts that fit together:
//! - the agent's watchdog (`threadbox-agent/src/oom.rs`, `--memory-max`) kills the largest
//!   sandbox process once gVisor's count of the container passes the limit;
//! - `/tmp` and `/dev/shm` (tmpfs in the sentry's memory, which no kill frees) are sized
//!   below it, so files alone get ENOSPC before the limit;
//! - the host cgroup around runsc gets room on top, for the sentry's own memory and what
//!   the sandbox can add while the watchdog reacts. Reaching it is what kills the sentry.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// What runsc holds in the host cgroup beyond the sandbox's own memory: the sentry's Go
/// heap, page tables, systrap's stubs and the gofer (~20 MB idle, ADR 0185), with room.
pub const RUNTIME_MEMORY: u64 = 64 << 20;

/// The host cgroup's memory limit for a sandbox limited to `limit` inside: runsc's own
/// memory, plus an eighth of the limit for what a sandbox allocates between two polls of
/// the watchdog (and for gVisor's lag in counting what an exited process gave back).
pub fn host_memory(limit: u64) -> u64 {
    limit
        .saturating_add(RUNTIME_MEMORY)
        .saturating_add(limit / 8)
}

/// `/tmp`'s size: half the limit, so a full `/tmp` leaves the other half to processes.
pub fn tmp_bytes(limit: u64) -> u64 {
    limit / 2
}

/// `/dev/shm`'s size: a quarter of the limit. Both full still leave a quarter of it.
pub fn shm_bytes(limit: u64) -> u64 {
    limit / 4
}

/// The file in the sandbox's socket directory (`/run/threadbox` inside) where the agent
/// counts its kills.
pub const KILLS_FILE: &str = "oom_kills";

/// The number of processes the agent's watchdog has killed in this boot, from the
/// sandbox's socket directory `dir`; `None` when it has killed none (no file).
///
/// Sandbox root can write that directory: the file is opened without following a
/// symlink nor blocking on a FIFO, only a regular file is read, and at most a few bytes.
/// A forged count only changes how this sandbox's own calls are reported.
pub fn watchdog_kills(dir: &Path) -> Option<u64> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(dir.join(KILLS_FILE))
        .ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut buf = Vec::with_capacity(24);
    f.take(24).read_to_end(&mut buf).ok()?;
    std::str::from_utf8(&buf).ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_fit_under_the_host_limit() {
        let m = 128 << 20;
        assert_eq!(host_memory(m), (128 + 64 + 16) << 20);
        assert_eq!(tmp_bytes(m) + shm_bytes(m), 96 << 20);
        assert_eq!(host_memory(u64::MAX), u64::MAX);
    }

    #[test]
    fn reads_only_a_regular_count_file() {
        let d = tempfile::tempdir().expect("tempdir");
        assert_eq!(watchdog_kills(d.path()), None);
        std::fs::write(d.path().join(KILLS_FILE), "3\n").expect("write");
        assert_eq!(watchdog_kills(d.path()), Some(3));
        std::fs::write(d.path().join(KILLS_FILE), "x").expect("write");
        assert_eq!(watchdog_kills(d.path()), None);
        std::fs::remove_file(d.path().join(KILLS_FILE)).expect("rm");
        std::fs::write(d.path().join("elsewhere"), "7").expect("write");
        std::os::unix::fs::symlink("elsewhere", d.path().join(KILLS_FILE)).expect("symlink");
        assert_eq!(watchdog_kills(d.path()), None);
    }
}
