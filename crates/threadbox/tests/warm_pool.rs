//! The warm pool (ADR 0010), with a real daemon started with `--warm-pool 2`: creates it
//! can satisfy adopt a sandbox booted before the call, the pool refills, get-or-create and
//! isolation are unchanged, pooled sandboxes never show, and nothing outlives the daemon.
//! Every wait is a condition polled against a deadline.

mod common;

use common::{require_root, serial, Daemon};
use std::collections::BTreeSet;
use std::time::Duration;

const POOL_DEADLINE: Duration = Duration::from_secs(60);

fn wait_for(what: &str, d: &Daemon, f: impl FnMut() -> bool) {
    d.wait_for(what, POOL_DEADLINE, f)
}

/// A sandbox id (`sb-` and 32 hex digits) in a log line.
fn sandbox_id_in(line: &str) -> Option<String> {
    let start = line.find("sb-")?;
    let id: String = line[start..].chars().take(35).collect();
    (id.len() == 35 && id[3..].chars().all(|c| c.is_ascii_hexdigit())).then_some(id)
}

/// Ids of the pooled sandboxes the daemon has booted so far, in order.
fn pooled_ids(d: &Daemon) -> Vec<String> {
    d.log()
        .lines()
        .filter(|l| l.contains("warm pool: sandbox ready"))
        .filter_map(sandbox_id_in)
        .collect()
}

/// Directories under `<root>/sandboxes`.
fn sandbox_dirs(d: &Daemon) -> BTreeSet<String> {
    std::fs::read_dir(d.root_path().join("sandboxes"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether any host process lives in a cgroup of sandbox `id`.
fn has_processes(id: &str) -> bool {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return false;
    };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .any(|e| std::fs::read_to_string(e.path().join("cgroup")).is_ok_and(|c| c.contains(id)))
}

fn listed(d: &Daemon) -> BTreeSet<String> {
    let v = d.cli(&["ls", "--json"]).ok().json();
    v["sandboxes"]
        .as_array()
        .expect("ls --json has sandboxes")
        .iter()
        .filter_map(|s| s["id"].as_str().map(str::to_string))
        .collect()
}

fn exec(d: &Daemon, id: &str, sh: &str) -> common::Run {
    d.cli(&["exec", id, "--", "/bin/sh", "-c", sh])
}

/// The memory limit the host applied to sandbox `id` (cgroup v2 or v1).
fn host_memory_limit(id: &str) -> Option<u64> {
    let candidates = [
        format!("/sys/fs/cgroup/threadbox/{id}/memory.max"),
        format!("/sys/fs/cgroup/unified/threadbox/{id}/memory.max"),
        format!("/sys/fs/cgroup/memory/threadbox/{id}/memory.limit_in_bytes"),
    ];
    candidates
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .find_map(|s| s.trim().parse().ok())
}

fn wait_pool_full(d: &Daemon, booted_before: usize) {
    wait_for("the pool to hold 2 ready sandboxes", d, || {
        pooled_ids(d).len() >= booted_before + 2 && sandbox_dirs(d).len() >= 2
    });
}

#[test]
fn warm_pool_adopts_refills_isolates_and_leaks_nothing() {
    let _serial = serial();
    if !require_root("warm_pool_adopts_refills_isolates_and_leaks_nothing") {
        return;
    }
    let mut d = Daemon::start_with(&["--warm-pool", "2"]);
    wait_pool_full(&d, 0);
    assert!(listed(&d).is_empty(), "pooled sandboxes must not be listed");

    // Fast path: the adopted sandbox's agent was booted before the create call.
    let ready: BTreeSet<String> = pooled_ids(&d).into_iter().collect();
    let a = d.create(&["--name", "a"]);
    assert!(
        ready.contains(&a),
        "{a} was not taken from the pool {ready:?}"
    );
    assert!(d.log().contains("created from the warm pool"));
    assert_eq!(exec(&d, &a, "echo ok").ok().stdout_str(), "ok\n");
    // ADR 0010: the UTS namespace was named at boot, so an adopted sandbox keeps its id.
    assert_eq!(
        exec(&d, &a, "cat /proc/sys/kernel/hostname")
            .ok()
            .stdout_str()
            .trim(),
        a
    );

    // The pool refills in the background.
    wait_for("the pool to refill", &d, || pooled_ids(&d).len() >= 3);

    // Get-or-create of a name stays idempotent.
    assert_eq!(d.create(&["--name", "a"]), a);

    // Other limits than the defaults are applied to the adopted sandbox's cgroup.
    let ready: BTreeSet<String> = pooled_ids(&d).into_iter().collect();
    let b = d.create(&["--memory", "256M"]);
    assert!(ready.contains(&b), "{b} was not taken from the pool");
    assert_eq!(host_memory_limit(&b), Some(256 << 20));
    assert_eq!(
        d.cli(&["info", &b, "--json"]).ok().json()["limits"]["memory_bytes"],
        256u64 << 20
    );

    // Another disk size than the pool's is a cold boot.
    let c = d.create(&["--disk", "64M"]);
    assert!(!pooled_ids(&d).contains(&c), "{c} must be a cold boot");

    // Isolation is intact: selftest, and files are not shared between adopted sandboxes.
    for id in [&a, &b] {
        assert_eq!(
            d.cli(&["selftest", id, "--json"]).ok().json()["ok"],
            true,
            "selftest of {id}"
        );
    }
    exec(&d, &a, "echo secret > /home/user/only-in-a").ok();
    exec(&d, &b, "test ! -e /home/user/only-in-a").ok();

    // Only the user's sandboxes are listed.
    assert_eq!(
        listed(&d),
        [a.clone(), b.clone(), c.clone()].into_iter().collect()
    );

    for id in [&a, &b, &c] {
        d.cli(&["rm", "--force", id]).ok();
        wait_for("a deleted sandbox's processes to be gone", &d, || {
            !has_processes(id)
        });
    }
    // Two adoptions: two refills.
    wait_for("the pool to be full again", &d, || {
        sandbox_dirs(&d).len() == 2 && pooled_ids(&d).len() >= 4
    });
    assert!(listed(&d).is_empty());

    // A clean shutdown removes the pool.
    let status = d.terminate();
    assert!(status.success(), "daemon exit: {status}");
    assert!(
        sandbox_dirs(&d).is_empty(),
        "left after shutdown: {:?}",
        sandbox_dirs(&d)
    );
    for id in pooled_ids(&d) {
        wait_for("pooled sandboxes' processes to be gone", &d, || {
            !has_processes(&id)
        });
    }

    // After a crash, the next start destroys the old pool and boots a new one.
    d.restart();
    let before = pooled_ids(&d).len();
    wait_pool_full(&d, before);
    let old: BTreeSet<String> = sandbox_dirs(&d);
    d.kill9();
    d.restart();
    wait_for("a new pool after the crash", &d, || {
        let dirs = sandbox_dirs(&d);
        dirs.len() == 2 && dirs.is_disjoint(&old)
    });
    for id in &old {
        wait_for("the crashed pool's processes to be gone", &d, || {
            !has_processes(id)
        });
    }
    assert!(listed(&d).is_empty());
    assert!(d.terminate().success());
    assert!(sandbox_dirs(&d).is_empty());
    for id in pooled_ids(&d) {
        wait_for("pooled sandboxes' processes to be gone", &d, || {
            !has_processes(&id)
        });
    }
}
