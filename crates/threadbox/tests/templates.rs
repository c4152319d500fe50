//! Templates (issue 14 scope 5, ADR 0110) through the real daemon and CLI (from a
//! sandbox: on every tier with `checkpoints`, ADR 0135; the rest on the jail): from a sandbox's checkpoint, from a fresh one, from an image with build steps; a
//! failing step leaves nothing; sandboxes of a template see its files, keep their own
//! writes, carry its policy and outlive it; the warm pool holds sandboxes of a template.

mod common;

use common::{require_root, serial, Daemon};
use std::time::Duration;

fn sh(d: &Daemon, sb: &str, script: &str) -> String {
    d.cli(&["exec", sb, "--", "sh", "-c", script])
        .ok()
        .stdout_str()
}

fn templates(d: &Daemon) -> Vec<serde_json::Value> {
    d.cli(&["template", "ls", "--json"]).ok().json()["templates"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn names(d: &Daemon) -> Vec<String> {
    templates(d)
        .iter()
        .map(|t| t["name"].as_str().unwrap_or("").to_string())
        .collect()
}

/// Everything under the daemon's template directory (disks and leftovers), in the
/// sandboxes' store (ADR 0162).
fn template_files(d: &Daemon) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d.root_path().join("sandboxes/.templates"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn sandbox_count(d: &Daemon) -> usize {
    d.cli(&["ls", "--json"]).ok().json()["sandboxes"]
        .as_array()
        .map_or(0, |a| a.len())
}

#[test]
fn templates_from_a_sandbox_and_its_sandboxes() {
    if !require_root("templates_from_a_sandbox_and_its_sandboxes") {
        return;
    }
    let _s = serial();
    common::each_tier(&["checkpoints"], templates_from_a_sandbox_on);
}

fn templates_from_a_sandbox_on(d: Daemon, tier: &str) {
    // A network policy where the tier can hold one (it is copied to the template).
    let egress = tier == "jail";
    let mut args = vec!["--name", "src", "--label", "team=a", "--memory", "768M"];
    args.extend(["--tier", tier]);
    if egress {
        args.extend(["--allow", "example.com"]);
    }
    d.create(&args);
    sh(
        &d,
        "src",
        "echo clean > ~/f; mkdir ~/d; ln -s /etc/passwd ~/d/l",
    );
    d.cli(&["checkpoint", "src", "--label", "clean"]).ok();
    sh(&d, "src", "echo later > ~/f");

    // From a labelled checkpoint: its files, not the sandbox's current ones.
    d.cli(&["template", "create", "base", "--from", "src:clean"])
        .ok();
    // From the sandbox as it is now (a fresh internal checkpoint).
    d.cli(&["template", "create", "now", "--from", "src"]).ok();
    let list = templates(&d);
    assert_eq!(names(&d), ["base", "now"], "{list:?}");
    let base = &list[0];
    let src = d.cli(&["info", "src", "--json"]).ok().json()["id"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert_eq!(base["source"], format!("sandbox {src}:clean"));
    assert_eq!(list[1]["source"], format!("sandbox {src}"));
    assert_eq!(base["labels"]["team"], "a");
    assert_eq!(base["memory_bytes"], 768u64 << 20);
    assert_eq!(base["sandboxes"], 0);
    assert!(base["size_bytes"].as_u64().unwrap_or(0) > 0, "{base}");
    assert_eq!(base["tier"], tier, "{base}");
    assert_eq!(
        base["network"]["rules"].to_string().contains("example.com"),
        egress,
        "the policy is copied to the template: {base}"
    );
    assert_eq!(template_files(&d).len(), 2, "{:?}", template_files(&d));

    // Bad input changes nothing.
    let dup = d.cli(&["template", "create", "base", "--from", "src"]);
    assert_ne!(dup.code, 0, "a name is unique in the tenant");
    let bad = d.cli(&["template", "create", "Bad/Name", "--from", "src"]);
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("template name"), "{}", bad.stderr);
    let nock = d.cli(&["template", "create", "x", "--from", "src:nope"]);
    assert_ne!(nock.code, 0);
    let img = d.cli(&["create", "--template", "base", "--image", "other"]);
    assert_ne!(img.code, 0, "another image than the template's is refused");
    assert_eq!(names(&d), ["base", "now"]);
    assert_eq!(template_files(&d).len(), 2);

    // Sandboxes of a template: its files, owned by their own sandbox user, defaults
    // carried (labels, limits, policy), own writes kept apart.
    let a = d.create(&["--name", "a", "--template", "base"]);
    let b = d.create(&["--name", "b", "--template", "base", "--label", "team=b"]);
    assert_eq!(
        sh(
            &d,
            "a",
            "cat ~/f; stat -c '%u %g' ~/f ~/d ~/d/l; readlink ~/d/l"
        ),
        "clean\n1000 1000\n1000 1000\n1000 1000\n/etc/passwd\n"
    );
    let ia = d.cli(&["info", "a", "--json"]).ok().json();
    assert_eq!(ia["labels"]["team"], "a");
    assert_eq!(ia["limits"]["memory_bytes"], 768u64 << 20);
    assert_eq!(ia["tier"], tier, "a template's sandboxes are of its tier");
    assert_eq!(
        ia["network"]["rules"].to_string().contains("example.com"),
        egress,
        "the policy is copied to the template's sandboxes: {ia}"
    );
    let ib = d.cli(&["info", "b", "--json"]).ok().json();
    assert_eq!(ib["labels"]["team"], "b", "a create's own labels win");
    sh(&d, "a", "echo mine > ~/f; touch ~/only-a");
    assert_eq!(sh(&d, "b", "cat ~/f; ls ~"), "clean\nd\nf\n");
    let c = d.create(&["--template", "now"]);
    assert_eq!(
        sh(&d, &c, "cat ~/f"),
        "later\n",
        "a fresh checkpoint's files"
    );
    assert_eq!(templates(&d)[0]["sandboxes"], 2, "{:?}", templates(&d));

    // Deleting the template leaves its sandboxes intact (their disks are clones), also
    // across a restart of theirs.
    d.cli(&["template", "rm", "base"]).ok();
    assert_eq!(names(&d), ["now"]);
    assert_eq!(template_files(&d).len(), 1);
    d.cli(&["stop", &a]).ok();
    d.cli(&["start", &a]).ok();
    assert_eq!(sh(&d, "a", "cat ~/f; ls ~"), "mine\nd\nf\nonly-a\n");
    let gone = d.cli(&["create", "--template", "base"]);
    assert_ne!(gone.code, 0);
    assert!(gone.stderr.contains("base"), "{}", gone.stderr);
    let _ = b;
}

#[test]
fn templates_from_an_image_with_build_steps() {
    if !require_root("templates_from_an_image_with_build_steps") {
        return;
    }
    let _s = serial();
    let d = Daemon::start();
    let before = sandbox_count(&d);
    // A failing step: an error naming it with its stderr, and nothing left behind (no
    // template, no disk, no build sandbox).
    let bad = d.cli(&[
        "template",
        "create",
        "broken",
        "--run",
        "echo ok > ~/x",
        "--run",
        "echo boom >&2; exit 3",
    ]);
    assert_ne!(bad.code, 0);
    assert!(
        bad.stderr.contains("step 2") && bad.stderr.contains("exited with 3"),
        "{}",
        bad.stderr
    );
    assert!(bad.stderr.contains("boom"), "{}", bad.stderr);
    assert!(names(&d).is_empty());
    assert!(template_files(&d).is_empty(), "{:?}", template_files(&d));
    assert_eq!(sandbox_count(&d), before, "the build sandbox is gone");

    let out = d
        .cli(&[
            "template",
            "create",
            "built",
            "--image",
            "host",
            "--run",
            "echo hi > /home/user/x",
            "--run",
            "mkdir -p ~/.cache/tool && echo step-two && echo done > ~/.cache/tool/y",
            "--allow",
            "example.com",
            "--json",
        ])
        .ok()
        .json();
    let steps = out["steps"].as_array().cloned().unwrap_or_default();
    assert_eq!(steps.len(), 2, "{out}");
    assert_eq!(steps[1]["exit_code"], 0);
    assert_eq!(
        steps[1]["stdout"], "step-two\n",
        "each step's output is shown"
    );
    assert_eq!(out["template"]["source"], "image host + 2 steps");
    assert_eq!(sandbox_count(&d), before, "the build sandbox is deleted");
    let sb = d.create(&["--template", "built"]);
    assert_eq!(sh(&d, &sb, "cat ~/x ~/.cache/tool/y"), "hi\ndone\n");
    let info = d.cli(&["info", &sb, "--json"]).ok().json();
    assert!(
        info["network"]["rules"].to_string().contains("example.com"),
        "the build's policy is the template's: {info}"
    );
}

#[test]
fn warm_pool_holds_sandboxes_of_a_template() {
    if !require_root("warm_pool_holds_sandboxes_of_a_template") {
        return;
    }
    let _s = serial();
    let d = Daemon::start_with(&["--warm-pool-template", "warm=1"]);
    d.cli(&["template", "create", "warm", "--run", "echo warm > ~/w"])
        .ok();
    // Making the template wakes the refill task, which boots one of it.
    d.wait_for(
        "a pooled sandbox of the template",
        Duration::from_secs(60),
        || d.log().contains("warm pool: sandbox ready"),
    );
    let second = d.create(&["--template", "warm"]);
    assert!(
        d.log()
            .lines()
            .any(|l| l.contains("created from the warm pool") && l.contains(&second)),
        "the create took the pooled sandbox: {}",
        d.log()
    );
    assert_eq!(sh(&d, &second, "cat ~/w; stat -c %u ~/w"), "warm\n1000\n");
    // The pool depends on it: refused.
    let rm = d.cli(&["template", "rm", "warm"]);
    assert_ne!(rm.code, 0);
    assert!(rm.stderr.contains("pool"), "{}", rm.stderr);
}

/// Problems of the template store after a restart: a listed template without its disk, or
/// anything in `templates/` that is not the disk of a listed template.
fn template_problems(d: &Daemon) -> Vec<String> {
    let listed: Vec<String> = templates(d)
        .iter()
        .filter_map(|t| t["id"].as_str().map(|i| format!("{i}.img")))
        .collect();
    let files = template_files(d);
    let mut problems = Vec::new();
    for l in &listed {
        if !files.contains(l) {
            problems.push(format!("template without its disk: {l}"));
        }
    }
    for f in &files {
        if !listed.contains(f) {
            problems.push(format!("left in templates/: {f}"));
        }
    }
    problems
}

#[test]
fn kill9_mid_template_create_or_use_then_restart_is_consistent() {
    if !require_root("kill9_mid_template_create_or_use_then_restart_is_consistent") {
        return;
    }
    let _s = serial();
    let mut d = Daemon::start();
    let base = d.create(&["--name", "base"]);
    sh(&d, "base", "echo base > ~/f");
    d.cli(&["template", "create", "start", "--from", "base"])
        .ok();
    let seed = std::env::var("THREADBOX_KILL9_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|t| t.as_nanos() as u64)
                .unwrap_or(1)
        })
        | 1;
    eprintln!("kill -9 trials, seed {seed}");
    let mut x = seed;
    for trial in 0..6 {
        let name = format!("t{trial}");
        let op: Vec<&str> = match trial % 3 {
            0 => vec!["template", "create", &name, "--from", "base"],
            1 => vec!["template", "create", &name, "--run", "cp /dev/null ~/built"],
            _ => vec!["create", "--template", "start"],
        };
        let child = std::process::Command::new(common::threadbox_bin())
            .args(&op)
            .env("THREADBOX_URL", &d.url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("cli");
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // The kill lands at a random point of the operation (0–800 ms in).
        let delay = x % 800;
        std::thread::sleep(Duration::from_millis(delay));
        d.kill9();
        let _ = child.wait_with_output();
        d.restart();
        let mut problems = template_problems(&d);
        // Every template left works: a sandbox of it has the source's files.
        for t in templates(&d) {
            let n = t["name"].as_str().unwrap_or("").to_string();
            let sb = d.create(&["--template", &n]);
            let f = sh(
                &d,
                &sb,
                "cat ~/f 2>/dev/null; test -e ~/built && echo built; true",
            );
            let want = if t["source"]
                .as_str()
                .is_some_and(|s| s.starts_with("sandbox"))
            {
                "base\n"
            } else {
                "built\n"
            };
            if f != want {
                problems.push(format!("{n}: ~/f and ~/built give {f:?}"));
            }
            d.cli(&["rm", "--force", &sb]).ok();
        }
        assert!(
            problems.is_empty(),
            "trial {trial} ({op:?}, kill after {delay} ms, seed {seed}): {problems:#?}\n{}",
            d.log()
        );
        // Sandboxes of a use, and a build's sandbox a kill left, pile up otherwise.
        let list = d.cli(&["ls", "--json"]).ok().json();
        for s in list["sandboxes"].as_array().into_iter().flatten() {
            if let Some(id) = s["id"].as_str().filter(|i| *i != base) {
                d.cli(&["rm", "--force", id]).ok();
            }
        }
        for t in templates(&d) {
            if let Some(n) = t["name"].as_str().filter(|n| *n != "start") {
                d.cli(&["template", "rm", n]).ok();
            }
        }
    }
    assert!(template_problems(&d).is_empty());
}
