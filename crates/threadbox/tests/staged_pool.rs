//! Staged slots (ADR 0180), with a real daemon started with `--staged-pool 3`: a fork of
//! 3 is served by slots booted before the call (up to the point where the disk is
//! needed), the forks are correct (the parent's files, their own writes, hostnames and
//! uid ranges), nothing of any disk is in a slot before its attach, an attach that fails
//! destroys the slot and the fork boots cold, and a `kill -9` of the daemon leaves no
//! slot behind after the next start. Every wait is a condition polled against a deadline.

mod common;

use common::{require_root, serial, Daemon};
use std::collections::BTreeSet;
use std::time::Duration;

const POOL_DEADLINE: Duration = Duration::from_secs(90);
const SLOTS: usize = 3;

fn wait_for(what: &str, d: &Daemon, f: impl FnMut() -> bool) {
    d.wait_for(what, POOL_DEADLINE, f)
}

/// A sandbox id (`sb-` and 32 hex digits) in a log line.
fn sandbox_id_in(line: &str) -> Option<String> {
    let start = line.find("sb-")?;
    let id: String = line[start..].chars().take(35).collect();
    (id.len() == 35 && id[3..].chars().all(|c| c.is_ascii_hexdigit())).then_some(id)
}

/// Ids of the log lines containing `what`, in order.
fn ids_logged(d: &Daemon, what: &str) -> Vec<String> {
    d.log()
        .lines()
        .filter(|l| l.contains(what))
        .filter_map(sandbox_id_in)
        .collect()
}

/// Slots staged so far, in order.
fn staged_ids(d: &Daemon) -> Vec<String> {
    ids_logged(d, "staged pool: slot ready")
}

/// Slots staged and not yet taken or removed.
fn waiting_slots(d: &Daemon) -> BTreeSet<String> {
    let taken: BTreeSet<String> = ids_logged(d, "staged pool: slot taken by a fork")
        .into_iter()
        .chain(ids_logged(d, "removed a pooled sandbox"))
        .chain(ids_logged(d, "slot gone"))
        .collect();
    staged_ids(d)
        .into_iter()
        .filter(|id| !taken.contains(id) && sandbox_dir(d, id).exists())
        .collect()
}

fn sandbox_dir(d: &Daemon, id: &str) -> std::path::PathBuf {
    d.root_path().join("sandboxes").join(id)
}

fn sandbox_dirs(d: &Daemon) -> BTreeSet<String> {
    std::fs::read_dir(d.root_path().join("sandboxes"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Host pids in a cgroup of sandbox `id`.
fn pids_of(id: &str) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(id))
        })
        .collect()
}

fn ppid_of(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The staged slot's init: the process of its cgroup whose parent (the helper) is too.
fn init_of(id: &str) -> Option<u32> {
    let pids = pids_of(id);
    pids.iter()
        .copied()
        .find(|p| ppid_of(*p).is_some_and(|pp| pids.contains(&pp)))
}

fn sh(d: &Daemon, sb: &str, script: &str) -> String {
    d.cli(&["exec", sb, "--", "/bin/sh", "-c", script])
        .ok()
        .stdout_str()
}

fn wait_slots(d: &Daemon, n: usize) {
    wait_for(&format!("{n} staged slots"), d, || {
        waiting_slots(d).len() >= n
    });
}

#[test]
fn staged_slots_serve_forks_and_leak_nothing() {
    let _serial = serial();
    if !require_root("staged_slots_serve_forks_and_leak_nothing") {
        return;
    }
    let mut d = Daemon::start_with(&["--staged-pool", &SLOTS.to_string()]);
    wait_slots(&d, SLOTS);
    let slots = waiting_slots(&d);
    assert!(
        d.cli(&["ls", "--json"]).ok().json()["sandboxes"]
            .as_array()
            .is_some_and(|a| a.is_empty()),
        "staged slots must not be listed"
    );
    // Nothing of any disk before the attach: no image in the slot's directory, and none
    // of its paths mounted in its init's mount namespace.
    for id in &slots {
        let dir = sandbox_dir(&d, id);
        assert!(
            !dir.join("disk.img").exists(),
            "{id} has a disk before its attach"
        );
        let init = init_of(id).unwrap_or_else(|| panic!("staged slot {id} has no init"));
        let mounts = std::fs::read_to_string(format!("/proc/{init}/mountinfo")).unwrap_or_default();
        assert!(!mounts.is_empty(), "mountinfo of {init}");
        assert!(
            !mounts.contains(&dir.display().to_string()),
            "{id} has a mount of its own before its attach:\n{mounts}"
        );
    }

    // The parent boots cold (no warm pool), a fork of 3 takes the three slots.
    let parent = d.create(&["--name", "work"]);
    assert!(!slots.contains(&parent));
    sh(&d, "work", "echo parent > ~/f; mkdir ~/d; echo x > ~/d/g");
    let out = d
        .cli(&[
            "fork",
            "work",
            "--count",
            "3",
            "--name-prefix",
            "kid",
            "--json",
        ])
        .ok()
        .json();
    let kids: Vec<String> = out["sandboxes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|k| k["id"].as_str().map(str::to_string))
        .collect();
    assert_eq!(kids.len(), 3, "{out}");
    let served: BTreeSet<String> = ids_logged(&d, "staged slot attached").into_iter().collect();
    for k in &kids {
        assert!(slots.contains(k), "{k} was not a staged slot {slots:?}");
        assert!(served.contains(k), "{k} was not booted by an attach");
    }
    let mut maps = BTreeSet::new();
    maps.insert(
        sh(&d, "work", "cat /proc/self/uid_map")
            .split_whitespace()
            .nth(1)
            .unwrap_or("")
            .to_string(),
    );
    for i in 1..=3 {
        let name = format!("kid-{i}");
        assert_eq!(sh(&d, &name, "hostname"), format!("{name}\n"));
        assert_eq!(
            sh(&d, &name, "cat ~/f ~/d/g; stat -c '%u %g' ~/f ~/d"),
            "parent\nx\n1000 1000\n1000 1000\n",
            "{name}: the parent's files and owners"
        );
        let map = sh(&d, &name, "cat /proc/self/uid_map");
        maps.insert(map.split_whitespace().nth(1).unwrap_or("").to_string());
        assert_eq!(
            d.cli(&["selftest", &name, "--json"]).ok().json()["ok"],
            true,
            "selftest of {name}"
        );
    }
    assert_eq!(
        maps.len(),
        4,
        "parent and forks each have their own uid range: {maps:?}"
    );
    sh(&d, "kid-1", "echo mine > ~/f");
    assert_eq!(
        sh(&d, "kid-2", "cat ~/f"),
        "parent\n",
        "each fork has its own upper"
    );
    assert_eq!(sh(&d, "work", "cat ~/f"), "parent\n");

    // The pool refills in the background.
    wait_slots(&d, SLOTS);

    // An attach that fails destroys the slot and the fork boots cold: every waiting
    // slot's init is killed (its helper, waiting for the attach, does not know).
    let doomed = waiting_slots(&d);
    for id in &doomed {
        let init = init_of(id).unwrap_or_else(|| panic!("staged slot {id} has no init"));
        let st = std::process::Command::new("kill")
            .args(["-9", &init.to_string()])
            .status()
            .expect("kill");
        assert!(st.success());
    }
    let out = d
        .cli(&["fork", "work", "--name-prefix", "cold", "--json"])
        .ok()
        .json();
    let cold = out["sandboxes"][0]["id"].as_str().unwrap_or("").to_string();
    assert!(
        doomed.contains(&cold),
        "{cold} did not take a (doomed) staged slot"
    );
    assert!(
        d.log()
            .lines()
            .any(|l| l.contains("attach failed") && l.contains(&cold)),
        "no failed attach was logged for {cold}"
    );
    assert!(!ids_logged(&d, "staged slot attached").contains(&cold));
    assert_eq!(sh(&d, "cold-1", "hostname; cat ~/d/g"), "cold-1\nx\n");
    assert_eq!(
        d.cli(&["selftest", "cold-1", "--json"]).ok().json()["ok"],
        true,
        "selftest of the cold-booted fork"
    );

    // kill -9 with staged slots: the next start destroys them and stages new ones.
    let dead: Vec<String> = doomed.iter().filter(|id| **id != cold).cloned().collect();
    wait_slots(&d, 1);
    let old = waiting_slots(&d);
    d.kill9();
    d.restart();
    wait_for("new slots after the crash", &d, || {
        let w = waiting_slots(&d);
        w.len() >= SLOTS && w.is_disjoint(&old)
    });
    for id in old.iter().chain(dead.iter()) {
        wait_for("the crashed daemon's slots to be gone", &d, || {
            pids_of(id).is_empty() && !sandbox_dir(&d, id).exists()
        });
    }
    // The forks survive the crash, re-adopted.
    for name in ["kid-1", "kid-2", "kid-3", "cold-1"] {
        assert_eq!(sh(&d, name, "hostname"), format!("{name}\n"));
    }
    assert_eq!(sh(&d, "kid-1", "cat ~/f"), "mine\n");

    // A clean shutdown removes the slots.
    let left = waiting_slots(&d);
    for sb in ["work", "kid-1", "kid-2", "kid-3", "cold-1"] {
        d.cli(&["rm", "--force", sb]).ok();
    }
    assert!(d.terminate().success());
    assert!(
        sandbox_dirs(&d).is_empty(),
        "left after shutdown: {:?}",
        sandbox_dirs(&d)
    );
    for id in &left {
        wait_for("the slots' processes to be gone", &d, || {
            pids_of(id).is_empty()
        });
    }
}
