//! The gvisor tier's OOM killer (ADR 0205). gVisor 20240729 enforces no memory limit in
//! the sentry: its cgroupfs `memory.limit_in_bytes` is a stub and it has no OOM killer.
//! Left alone, a sandbox process that eats memory drives the host cgroup around runsc to
//! its limit, whose OOM kill takes the whole sentry (the agent and every process). So the
//! agent does what the kernel's OOM killer does on the jail: it polls the container's
//! usage in gVisor's own cgroupfs and, past the limit, SIGKILLs the sandbox process with
//! the largest resident set (never itself).
//!
//! The limit lives in gVisor's `memory.limit_in_bytes` (which stores what is written and
//! enforces nothing): `--memory-max N` writes it at start, `--set-memory-max N` (the
//! daemon's `runsc exec` on a live change) rewrites it, and the watchdog reads it on
//! every poll, so a change needs no word to the running agent. Sandbox root can write it
//! too, as it can `pids.max` (ADR 0185): that only lets its sandbox reach the host
//! cgroup, which then kills its own sentry and nothing else.
//!
//! Each kill is counted in `/run/threadbox/oom_kills` (the host's socket directory of the
//! sandbox), which the daemon adds to the host cgroup's `oom_kill` count: a call whose
//! process died of SIGKILL while the count went up is reported `oom_killed`, as on the
//! jail.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The container's cgroup in gVisor's cgroupfs (mounted by the gvisor tier at
/// `/sys/fs/cgroup`; runsc puts the container at each hierarchy's root as it sees it).
const USAGE: &str = "/sys/fs/cgroup/memory/memory.usage_in_bytes";
const LIMIT: &str = "/sys/fs/cgroup/memory/memory.limit_in_bytes";

/// Where the host reads the number of kills (`sandboxes/<id>/run/gvisor/` on the host).
const COUNT_FILE: &str = "/run/threadbox/oom_kills";
const COUNT_TMP: &str = "/run/threadbox/.oom_kills.tmp";

/// Polling interval near the limit, and below half of it. The host cgroup has room for
/// one interval's growth on top of the limit (64 MiB + limit/8, `gvisor.rs`); gVisor
/// faults memory in at well under 64 MiB per 10 ms on this kind of host (ADR 0205's
/// figures). Far from the limit the slower poll keeps an idle sentry quiet.
const POLL_NEAR: Duration = Duration::from_millis(10);
const POLL_FAR: Duration = Duration::from_millis(50);

/// How long after its victim is gone the watchdog waits for gVisor's count to come down
/// before it picks another victim, unless usage keeps growing (gVisor releases an exited
/// process's memory shortly after, not at once: seen 110 MB still counted right after a
/// 117 MB process ended).
const SETTLE: Duration = Duration::from_millis(100);

/// Kills so far (this agent's life), as the host reads them.
static KILLS: AtomicU64 = AtomicU64::new(0);

/// `--memory-max N` / `--set-memory-max N`: the number, or why not.
pub fn parse_flag(flag: &str, v: Option<String>) -> Result<u64, String> {
    v.ok_or_else(|| format!("{flag} needs a value"))?
        .parse::<u64>()
        .map_err(|_| format!("{flag} needs a number of bytes"))
}

/// Writes the sandbox's memory limit where the watchdog reads it. Fails closed at start
/// (the caller refuses to run without it), as the pids limit does.
pub fn set_limit(n: u64) -> Result<(), String> {
    std::fs::write(LIMIT, n.to_string().as_bytes()).map_err(|e| format!("write {LIMIT} ({n}): {e}"))
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// What the watchdog does after a poll.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Nothing,
    Kill,
}

/// The watchdog's memory between polls: the last victim, until gVisor's count has had
/// time to come down after it.
#[derive(Debug, Default)]
struct Watch {
    /// The victim's pid while it has not exited.
    dying: Option<i32>,
    /// Until then after the victim exited, only growing usage makes another victim.
    settle_until: Option<(Instant, u64)>,
}

impl Watch {
    /// Decides from one poll: `alive` says whether the last victim still runs.
    fn step(&mut self, usage: u64, limit: u64, now: Instant, alive: impl Fn(i32) -> bool) -> Step {
        if let Some(pid) = self.dying {
            if alive(pid) {
                return Step::Nothing;
            }
            self.dying = None;
            self.settle_until = Some((now + SETTLE, usage));
        }
        if usage <= limit {
            self.settle_until = None;
            return Step::Nothing;
        }
        match self.settle_until {
            Some((until, floor)) if now < until => {
                if usage > floor {
                    // Someone allocates faster than the victim's memory is given back.
                    self.settle_until = None;
                    Step::Kill
                } else {
                    self.settle_until = Some((until, usage));
                    Step::Nothing
                }
            }
            _ => Step::Kill,
        }
    }
}

/// `VmRSS` of a `/proc/<pid>/status`, in KiB.
fn vm_rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Whether a `/proc/<pid>/status` is a process that has exited (a zombie holds no memory).
fn exited(status: &str) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .is_some_and(|s| s.trim_start().starts_with(['Z', 'X']))
}

fn alive(pid: i32) -> bool {
    threadbox_sys::child::pidns::read_proc(&format!("{pid}/status")).is_ok_and(|s| !exited(&s))
}

/// The process to kill: the largest resident set of the sandbox, never `own` (the agent)
/// nor pid 1. Its pid, VmRSS in KiB and name.
fn victim(own: u32) -> Option<(i32, u64, String)> {
    let mut best: Option<(i32, u64, String)> = None;
    let init = threadbox_sys::child::pidns::init_pid();
    for pid in threadbox_sys::child::pidns::proc_pids().ok()? {
        if pid <= 1 || pid as u32 == own || Some(pid) == init {
            continue;
        }
        let Ok(status) = threadbox_sys::child::pidns::read_proc(&format!("{pid}/status")) else {
            continue; // exited meanwhile
        };
        if exited(&status) {
            continue;
        }
        let rss = vm_rss_kib(&status).unwrap_or(0);
        if best.as_ref().is_none_or(|(_, b, _)| rss > *b) {
            let name = status
                .lines()
                .find_map(|l| l.strip_prefix("Name:"))
                .unwrap_or("")
                .trim()
                .to_string();
            best = Some((pid, rss, name));
        }
    }
    best
}

/// Publishes the kill count for the host (written whole, then renamed over the old one).
fn publish(n: u64) {
    let r = std::fs::write(COUNT_TMP, format!("{n}\n"))
        .and_then(|_| std::fs::rename(COUNT_TMP, COUNT_FILE));
    if let Err(e) = r {
        crate::log(&format!("oom: cannot publish the kill count: {e}"));
    }
}

/// The watchdog: runs on the agent's own (single-threaded) runtime for the agent's life.
pub async fn watch() {
    let own = std::process::id();
    let mut w = Watch::default();
    loop {
        let (usage, limit) = match (read_u64(USAGE), read_u64(LIMIT)) {
            (Some(u), Some(l)) => (u, l),
            // Nothing to judge by (should not happen under the gvisor tier's mounts):
            // said once a poll at the slow rate, not silently.
            _ => {
                crate::log(&format!("oom: cannot read {USAGE} or {LIMIT}"));
                tokio::time::sleep(POLL_FAR * 20).await;
                continue;
            }
        };
        if w.step(usage, limit, Instant::now(), alive) == Step::Kill {
            if let Some((pid, rss, name)) = victim(own) {
                // Counted before the kill: the call that owned the victim may answer the
                // host as soon as it dies, and the host reads the count then.
                let n = KILLS.fetch_add(1, Ordering::SeqCst) + 1;
                publish(n);
                match threadbox_sys::child::kill(pid, libc::SIGKILL) {
                    Ok(()) => {
                        w.dying = Some(pid);
                        crate::log(&format!(
                            "oom: memory use {usage} over the limit {limit}: killed pid {pid} \
                             ({name}, VmRSS {rss} KiB)"
                        ));
                    }
                    Err(e) => {
                        // Gone meanwhile: not a kill of ours.
                        KILLS.fetch_sub(1, Ordering::SeqCst);
                        publish(n - 1);
                        crate::log(&format!("oom: kill pid {pid}: {e}"));
                    }
                }
            }
        }
        let near = usage >= limit / 2;
        tokio::time::sleep(if near { POLL_NEAR } else { POLL_FAR }).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_rss_and_state() {
        let s = "Name:\tcase\nState:\tR (running)\nVmRSS:\t  131072 kB\n";
        assert_eq!(vm_rss_kib(s), Some(131072));
        assert!(!exited(s));
        assert!(exited("Name:\tx\nState:\tZ (zombie)\n"));
        assert_eq!(vm_rss_kib("Name:\tkthread\n"), None);
    }

    #[test]
    fn kills_past_the_limit_then_waits_for_the_victim() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        assert_eq!(w.step(100, 128, t0, |_| true), Step::Nothing);
        assert_eq!(w.step(128, 128, t0, |_| true), Step::Nothing);
        assert_eq!(w.step(129, 128, t0, |_| true), Step::Kill);
        w.dying = Some(7);
        // Still running: no second victim, however high usage is.
        assert_eq!(w.step(200, 128, t0, |_| true), Step::Nothing);
        // Gone, its memory not yet given back: wait, while usage does not grow.
        assert_eq!(w.step(140, 128, t0, |_| false), Step::Nothing);
        assert_eq!(w.step(135, 128, t0 + SETTLE / 2, |_| false), Step::Nothing);
        // Past the settle time and still over: the next victim.
        assert_eq!(w.step(135, 128, t0 + SETTLE * 2, |_| false), Step::Kill);
    }

    #[test]
    fn growing_usage_while_settling_kills_again() {
        let t0 = Instant::now();
        let mut w = Watch {
            dying: Some(7),
            settle_until: None,
        };
        assert_eq!(w.step(150, 128, t0, |_| false), Step::Nothing);
        assert_eq!(w.step(160, 128, t0, |_| false), Step::Kill);
    }

    #[test]
    fn under_the_limit_forgets_the_settle() {
        let t0 = Instant::now();
        let mut w = Watch {
            dying: Some(7),
            settle_until: None,
        };
        assert_eq!(w.step(100, 128, t0, |_| false), Step::Nothing);
        assert!(w.settle_until.is_none());
        assert_eq!(w.step(129, 128, t0, |_| false), Step::Kill);
    }

    #[test]
    fn parses_the_flag() {
        assert_eq!(
            parse_flag("--memory-max", Some("134217728".into())),
            Ok(128 << 20)
        );
        assert!(parse_flag("--memory-max", Some("lots".into())).is_err());
        assert!(parse_flag("--memory-max", None).is_err());
    }
}
