//! Hibernate on the jail tier (issue 16 scope 3, ADR 0129), through the real daemon and
//! CLI, judged from the host: a sandbox holding 200 MiB in a background process is frozen
//! and its memory pushed to swap (the cgroup's charge falls), any call wakes it, and the
//! process continues with its memory intact (it re-hashes its buffer on request). It stays
//! hibernated across a `kill -9` of the daemon. Without swap, hibernate is refused with
//! the reason and the sandbox is left running. The swap is a file this test makes and
//! removes (`swapon`/`swapoff`); every wait polls a condition with a deadline.
//!
//! On every tier with the `hibernate` capability (ADR 0123): a counter, a listening server
//! and an interpreter context's variable all continue after a wake. On gvisor (ADR 0130):
//! nothing of a hibernated sandbox runs (no cgroup, an image on disk), it stays hibernated
//! across a daemon restart, and `kill -9` of the daemon at each step of a hibernate or a
//! wake leaves it running or hibernated with a complete image, never lost.

mod common;
#[path = "common/swap.rs"]
mod swap;

use common::{each_tier, require_root, serial, threadbox_bin, tiers, Daemon};
use std::time::Duration;
use swap::Swap;

fn host_has_swap() -> bool {
    std::fs::read_to_string("/proc/swaps")
        .map(|s| s.lines().count() > 1)
        .unwrap_or(false)
}

/// Bytes charged to the sandbox's memory cgroup now (v1 on hybrid hosts, v2 otherwise).
fn charged(id: &str) -> u64 {
    for p in [
        format!("/sys/fs/cgroup/memory/threadbox/{id}/memory.usage_in_bytes"),
        format!("/sys/fs/cgroup/threadbox/{id}/memory.current"),
    ] {
        if let Ok(s) = std::fs::read_to_string(&p) {
            return s.trim().parse().expect("a number");
        }
    }
    panic!("no memory cgroup for {id}");
}

fn state(d: &Daemon, id: &str) -> String {
    d.cli(&["info", "--json", id]).ok().json()["state"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A background process holding 200 MiB of random bytes; on `/tmp/ask` it writes the
/// SHA-256 of the buffer to `/tmp/answer` (the first answer is written at start).
const HOLDER: &str = r#"
import hashlib, os, time
buf = bytearray(os.urandom(200 << 20))
open("/tmp/answer.tmp", "w").write(hashlib.sha256(buf).hexdigest())
os.rename("/tmp/answer.tmp", "/tmp/answer")
while True:
    if os.path.exists("/tmp/ask"):
        os.remove("/tmp/ask")
        open("/tmp/answer.tmp", "w").write(hashlib.sha256(buf).hexdigest())
        os.rename("/tmp/answer.tmp", "/tmp/answer")
    time.sleep(0.05)
"#;

fn read_answer(d: &Daemon, id: &str) -> String {
    d.cli(&["exec", id, "--", "cat", "/tmp/answer"])
        .ok()
        .stdout_str()
        .trim()
        .to_string()
}

fn start_holder(d: &Daemon, id: &str) -> String {
    d.cli(&["spawn", id, "--", "python3", "-c", HOLDER]).ok();
    d.wait_for("the holder's first hash", Duration::from_secs(60), || {
        d.cli(&["exec", id, "--", "test", "-s", "/tmp/answer"]).code == 0
    });
    read_answer(d, id)
}

/// Asks the holder to hash its buffer again and returns the new answer.
fn ask_again(d: &Daemon, id: &str) -> String {
    d.cli(&[
        "exec",
        id,
        "--",
        "sh",
        "-c",
        "rm -f /tmp/answer && touch /tmp/ask",
    ])
    .ok();
    d.wait_for("the holder's answer", Duration::from_secs(60), || {
        d.cli(&["exec", id, "--", "test", "-s", "/tmp/answer"]).code == 0
    });
    read_answer(d, id)
}

#[test]
fn hibernate_moves_the_memory_out_and_a_call_wakes_it_where_it_was() {
    if !require_root("hibernate_moves_the_memory_out_and_a_call_wakes_it_where_it_was") {
        return;
    }
    let _g = serial();
    let _swap = Swap::on(1024);
    let mut d = Daemon::start();
    let id = d.create(&["--memory", "512M"]);
    let hash = start_holder(&d, &id);
    let before = charged(&id);
    assert!(
        before > 200 << 20,
        "the holder's memory is charged: {before}"
    );

    let out = d.cli(&["hibernate", "--json", &id]).ok().json();
    assert_eq!(out["state"], "hibernated", "{out}");
    let after = charged(&id);
    eprintln!("charged to the sandbox: {before} bytes before hibernate, {after} after");
    assert!(
        after < before / 4,
        "hibernate moved the memory out of RAM: {before} bytes before, {after} after"
    );
    // It lists as hibernated, and a pause leaves it so.
    let ls = d
        .cli(&["ls", "--state", "hibernated", "--json"])
        .ok()
        .json();
    assert!(
        ls["sandboxes"]
            .as_array()
            .is_some_and(|a| a.iter().any(|s| s["id"] == id.as_str())),
        "{ls}"
    );
    assert_eq!(
        d.cli(&["pause", "--json", &id]).ok().json()["state"],
        "hibernated"
    );

    // The daemon dies and comes back: still hibernated, still frozen.
    d.kill9();
    d.restart();
    assert_eq!(state(&d, &id), "hibernated");

    // A call wakes it; the holder is the same process, and its memory is intact.
    assert_eq!(ask_again(&d, &id), hash, "the buffer came back as it was");
    assert_eq!(state(&d, &id), "running");
    let again = d.cli(&["hibernate", &id]);
    assert_eq!(
        again.code, 0,
        "a woken sandbox hibernates again: {}",
        again.stderr
    );
    assert_eq!(
        d.cli(&["resume", "--json", &id]).ok().json()["state"],
        "running"
    );
    assert_eq!(ask_again(&d, &id), hash);
}

#[test]
fn without_swap_hibernate_is_refused_with_the_reason_and_changes_nothing() {
    if !require_root("without_swap_hibernate_is_refused_with_the_reason_and_changes_nothing") {
        return;
    }
    let _g = serial();
    if host_has_swap() {
        // The host's own swap (not this test's: the other test's is off under `serial`).
        assert!(
            std::env::var_os("CI").is_none(),
            "CI machines have no swap of their own; this one does"
        );
        eprintln!("skipped: the host has swap configured, so the refusal cannot be seen");
        return;
    }
    let d = Daemon::start();
    let id = d.create(&[]);
    let r = d.cli(&["hibernate", &id]);
    assert_ne!(r.code, 0);
    assert!(
        r.stderr.contains("swap"),
        "the reason names swap: {}",
        r.stderr
    );
    assert_eq!(
        state(&d, &id),
        "running",
        "a refused hibernate leaves it running"
    );
    assert_eq!(
        d.cli(&["exec", &id, "--", "echo", "ok"])
            .ok()
            .stdout_str()
            .trim(),
        "ok"
    );
    // A paused sandbox stays paused.
    d.cli(&["pause", &id]).ok();
    assert_ne!(d.cli(&["hibernate", &id]).code, 0);
    assert_eq!(state(&d, &id), "paused");
}

#[test]
fn an_idle_sandbox_pauses_then_hibernates_and_a_call_wakes_it() {
    if !require_root("an_idle_sandbox_pauses_then_hibernates_and_a_call_wakes_it") {
        return;
    }
    let _g = serial();
    let _swap = Swap::on(1024);
    let d = Daemon::start();
    let id = d.create(&[
        "--memory",
        "512M",
        "--idle-pause",
        "1",
        "--idle-hibernate",
        "3",
    ]);
    let info = d.cli(&["info", "--json", &id]).ok().json();
    assert_eq!(info["idle_hibernate_secs"], 3, "{info}");
    let hash = start_holder(&d, &id);
    let before = charged(&id);
    // Idle: paused first (1 s), then hibernated (3 s); `info` is not activity.
    d.wait_for("the idle pause", Duration::from_secs(60), || {
        matches!(state(&d, &id).as_str(), "paused" | "hibernated")
    });
    d.wait_for("the idle hibernate", Duration::from_secs(60), || {
        state(&d, &id) == "hibernated"
    });
    let after = charged(&id);
    assert!(after < before / 4, "{before} bytes before, {after} after");
    assert_eq!(ask_again(&d, &id), hash, "woken by the call, memory intact");
    // Bad input changes nothing.
    let bad = d.cli(&["create", "--idle-hibernate", "0"]);
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("idle_hibernate_secs"), "{}", bad.stderr);
}

/// A counter in the background (`/tmp/count`, ten a second) and a server on :8000 serving
/// `/tmp`; the count so far.
fn start_workload(d: &Daemon, id: &str) -> u64 {
    d.cli(&[
        "spawn",
        id,
        "--",
        "sh",
        "-c",
        "i=0; while true; do i=$((i+1)); echo $i > /tmp/count.tmp; mv /tmp/count.tmp /tmp/count; sleep 0.1; done",
    ])
    .ok();
    d.cli(&[
        "spawn",
        id,
        "--",
        "python3",
        "-m",
        "http.server",
        "8000",
        "--directory",
        "/tmp",
    ])
    .ok();
    d.wait_for("the server", Duration::from_secs(60), || {
        fetch(d, id).is_some()
    });
    assert_eq!(run_code(d, id, "x = 41\nx + 1"), "42");
    count(d, id)
}

fn count(d: &Daemon, id: &str) -> u64 {
    d.cli(&["exec", id, "--", "cat", "/tmp/count"])
        .ok()
        .stdout_str()
        .trim()
        .parse()
        .expect("a count")
}

/// `/count` through the sandbox's own server, or `None` when it does not answer.
fn fetch(d: &Daemon, id: &str) -> Option<u64> {
    let r = d.cli(&[
        "exec",
        id,
        "--",
        "python3",
        "-c",
        "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/count', timeout=5).read().decode().strip())",
    ]);
    (r.code == 0)
        .then(|| r.stdout_str().trim().parse().ok())
        .flatten()
}

fn run_code(d: &Daemon, id: &str, code: &str) -> String {
    d.cli(&["run", id, code])
        .ok()
        .stdout_str()
        .trim()
        .to_string()
}

/// After a wake: the counter went on from where it was (not from 0), the server answers
/// and the context still has its variable.
fn assert_continued(d: &Daemon, id: &str, before: u64) {
    let now = count(d, id);
    assert!(
        now >= before,
        "the counter continued: {before} before, {now} after"
    );
    d.wait_for("the counter to move on", Duration::from_secs(30), || {
        count(d, id) > now
    });
    assert!(
        fetch(d, id).is_some_and(|c| c >= before),
        "the server answers"
    );
    assert_eq!(
        run_code(d, id, "x + 1"),
        "42",
        "the context kept its variable"
    );
}

fn gvisor_cgroup_gone(id: &str) -> bool {
    [
        format!("/sys/fs/cgroup/memory/threadbox/{id}"),
        format!("/sys/fs/cgroup/threadbox/{id}"),
        format!("/sys/fs/cgroup/pids/threadbox/{id}"),
    ]
    .iter()
    .all(|p| !std::path::Path::new(p).exists())
}

#[test]
fn hibernate_keeps_processes_servers_and_contexts_on_each_tier() {
    if !require_root("hibernate_keeps_processes_servers_and_contexts_on_each_tier") {
        return;
    }
    let _g = serial();
    let _swap = Swap::on(512);
    each_tier(&["hibernate"], |d, tier| {
        let id = d.create(&["--tier", tier, "--memory", "256M"]);
        let before = start_workload(&d, &id);
        let out = d.cli(&["hibernate", "--json", &id]).ok().json();
        assert_eq!(out["state"], "hibernated", "{out}");
        if tier == "gvisor" {
            // Nothing of it runs or is charged: its cgroup is gone, its image on disk.
            assert!(gvisor_cgroup_gone(&id), "no cgroup left for {id}");
            let image = d.root.path().join("sandboxes").join(&id).join("hibernate");
            assert!(image.is_dir(), "{} holds the image", image.display());
        }
        assert_continued(&d, &id, before);
        assert_eq!(state(&d, &id), "running");
        // Hibernated twice: the second wake is from the second image.
        let before = count(&d, &id);
        d.cli(&["hibernate", &id]).ok();
        assert_eq!(
            d.cli(&["resume", "--json", &id]).ok().json()["state"],
            "running"
        );
        assert_continued(&d, &id, before);
        d.cli(&["rm", "--force", &id]).ok();
    });
}

#[test]
fn a_hibernated_gvisor_sandbox_survives_a_daemon_restart() {
    if !require_root("a_hibernated_gvisor_sandbox_survives_a_daemon_restart") {
        return;
    }
    let _g = serial();
    let mut d = Daemon::start();
    if !tiers::runs_on(
        "gvisor",
        &d.cli(&["tiers", "--json"]).ok().json(),
        &["hibernate_image"],
    ) {
        return;
    }
    let id = d.create(&["--tier", "gvisor"]);
    let before = start_workload(&d, &id);
    d.cli(&["hibernate", &id]).ok();
    let image = d.root.path().join("sandboxes").join(&id).join("hibernate");
    assert!(image.is_dir());
    d.kill9();
    d.restart();
    assert_eq!(
        state(&d, &id),
        "hibernated",
        "reconcile keeps it hibernated"
    );
    assert!(gvisor_cgroup_gone(&id), "and nothing of it runs");
    assert_continued(&d, &id, before);
    assert!(!image.exists(), "the image is gone once it runs on");
    // A stop ends the processes: a start boots afresh, with no image left to restore.
    d.cli(&["hibernate", &id]).ok();
    d.cli(&["stop", &id]).ok();
    assert!(!image.exists(), "a stop removes the image");
    d.cli(&["start", &id]).ok();
    assert!(run_code(&d, &id, "'x' in globals()").contains("False"));
}

/// The daemon is killed at `point` of a hibernate or a wake; after a restart the sandbox
/// is running or hibernated, and once woken its processes continue.
fn crash_trial(point: &str) {
    let mut d = Daemon::start();
    if !tiers::runs_on(
        "gvisor",
        &d.cli(&["tiers", "--json"]).ok().json(),
        &["hibernate_image"],
    ) {
        return;
    }
    let id = d.create(&["--tier", "gvisor"]);
    let before = start_workload(&d, &id);
    let dir = d.root.path().join("sandboxes").join(&id);
    let log = dir.join("run").join("agent.log");
    let waking = point.starts_with("wake");
    if waking {
        d.cli(&["hibernate", &id]).ok();
    }
    let seen = |what: &str| std::fs::read_to_string(&log).is_ok_and(|l| l.contains(what));
    let prepares = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .matches("for a checkpoint")
        .count();
    let mut call = std::process::Command::new(threadbox_bin());
    if waking {
        call.args(["exec", &id, "--", "true"]);
    } else {
        call.args(["hibernate", &id]);
    }
    let mut child = call
        .env("THREADBOX_URL", &d.url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the call");
    d.wait_for(point, Duration::from_secs(60), || match point {
        // The agent has let go of its socket; the checkpoint has not begun.
        "hibernate-prepared" => {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .matches("for a checkpoint")
                .count()
                > prepares
        }
        // runsc is writing the image.
        "hibernate-checkpointing" => {
            dir.join(".hibernate.tmp").exists() || dir.join("hibernate").exists()
        }
        // The image is complete, the row may not say so yet.
        "hibernate-imaged" => dir.join("hibernate").exists(),
        // The restore is under way: the launch helper is in the sandbox's cgroup again,
        // the image not yet retired.
        "wake-restoring" => !gvisor_cgroup_gone(&id) && dir.join("hibernate").exists(),
        // Restored, the agent listening again.
        "wake-listening" => seen("listening again"),
        other => panic!("no crash point {other}"),
    });
    d.kill9();
    let _ = child.wait();
    d.restart();
    let st = state(&d, &id);
    assert!(
        st == "running" || st == "hibernated",
        "killed at {point}: the sandbox is {st}; daemon log:\n{}",
        d.log()
    );
    eprintln!("killed at {point}: {st}");
    assert_continued(&d, &id, before);
    d.cli(&["rm", "--force", &id]).ok();
}

#[test]
fn kill_9_during_a_gvisor_hibernate_or_wake_loses_nothing() {
    if !require_root("kill_9_during_a_gvisor_hibernate_or_wake_loses_nothing") {
        return;
    }
    let _g = serial();
    // THREADBOX_CRASH_POINTS narrows the trials to some points (a loop over one of them).
    let points: Vec<String> = match std::env::var("THREADBOX_CRASH_POINTS") {
        Ok(v) => v.split(',').map(str::to_string).collect(),
        Err(_) => [
            "hibernate-prepared",
            "hibernate-checkpointing",
            "hibernate-imaged",
            "wake-restoring",
            "wake-listening",
        ]
        .map(String::from)
        .to_vec(),
    };
    for point in &points {
        crash_trial(point);
    }
}
