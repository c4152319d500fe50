//! The reflink store (issue 14, ADR 0101): on a root whose file system cannot reflink
//! (this machine's and CI's ext4), `serve` keeps sandbox disks on an xfs image mounted
//! on `ROOT/sandboxes`, so checkpoints are reflinks; a restart reuses it.

mod common;

use common::{require_root, serial, Daemon};
use std::path::Path;

fn mount_of(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let dir = dir.to_string_lossy();
    text.lines()
        .rfind(|l| l.split(' ').nth(4) == Some(&*dir))
        .and_then(|l| l.split(" - ").nth(1))
        .and_then(|rest| rest.split(' ').next())
        .map(str::to_string)
}

/// Whether the temp directory's own file system reflinks (then the store is not needed).
fn tmp_reflinks() -> bool {
    let d = tempfile::tempdir().expect("tempdir");
    let a = d.path().join("a");
    std::fs::write(&a, [1u8; 4096]).expect("write");
    std::process::Command::new("cp")
        .arg("--reflink=always")
        .arg(&a)
        .arg(d.path().join("b"))
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The daemon's last "sandbox disks" line, without colours.
fn last_store_line(d: &Daemon) -> String {
    let log = d.log();
    let line = log
        .lines()
        .rfind(|l| l.contains("sandbox disks"))
        .unwrap_or_default();
    let mut out = String::new();
    let mut esc = false;
    for c in line.chars() {
        match (esc, c) {
            (false, '\u{1b}') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

fn sh(d: &Daemon, sb: &str, script: &str) -> String {
    let run = d.cli(&["exec", sb, "--", "sh", "-c", script]).ok();
    String::from_utf8_lossy(&run.stdout).into_owned()
}

#[test]
fn checkpoints_reflink_on_the_store_image_and_a_restart_reuses_it() {
    if !require_root("checkpoints_reflink_on_the_store_image_and_a_restart_reuses_it") {
        return;
    }
    let _s = serial();
    let native = tmp_reflinks();
    // Explicit: the test command runs every other daemon with THREADBOX_STORE_IMAGE=off.
    let mut d = Daemon::start_with(&["--store-image", "auto"]);
    let root = d.root_path().canonicalize().expect("root");
    let sandboxes = root.join("sandboxes");
    if !native {
        assert_eq!(mount_of(&sandboxes).as_deref(), Some("xfs"), "{}", d.log());
        assert!(root.join("store.xfs").is_file());
    }
    d.create(&["--name", "w"]);
    sh(
        &d,
        "w",
        "head -c 4000000 /dev/urandom > ~/f; md5sum ~/f > ~/sum",
    );
    let ck = d
        .cli(&["checkpoint", "w", "--label", "one", "--json"])
        .ok()
        .json();
    assert_eq!(ck["method"], "reflink", "{ck}");

    // A stop with a sandbox running: its disk is in use, the store stays and is reused.
    assert!(d.terminate().success());
    d.restart();
    assert!(
        native || last_store_line(&d).contains("reused=true"),
        "{}",
        d.log()
    );
    assert_eq!(sh(&d, "w", "md5sum -c ~/sum --quiet && echo ok"), "ok\n");
    sh(&d, "w", "rm ~/f");
    d.cli(&["rewind", "w", "--to", "one"]).ok();
    assert_eq!(sh(&d, "w", "md5sum -c ~/sum --quiet && echo ok"), "ok\n");
    let ck2 = d
        .cli(&["checkpoint", "w", "--label", "two", "--json"])
        .ok()
        .json();
    assert_eq!(ck2["method"], "reflink", "{ck2}");

    // Nothing running: a clean stop unmounts it; the next start mounts the same image.
    d.cli(&["stop", "w"]).ok();
    assert!(d.terminate().success());
    if !native {
        assert_eq!(mount_of(&sandboxes), None, "{}", d.log());
    }
    d.restart();
    if !native {
        assert_eq!(mount_of(&sandboxes).as_deref(), Some("xfs"));
        assert!(last_store_line(&d).contains("reused=true"), "{}", d.log());
    }
    d.cli(&["start", "w"]).ok();
    assert_eq!(sh(&d, "w", "md5sum -c ~/sum --quiet && echo ok"), "ok\n");
    let list = d.cli(&["checkpoints", "w", "--json"]).ok().json();
    assert_eq!(
        list["checkpoints"].as_array().map(Vec::len),
        Some(2),
        "{list}"
    );
}

/// The positive control: with the store off, the same checkpoint is a copy on this root.
#[test]
fn store_image_off_checkpoints_copy() {
    if !require_root("store_image_off_checkpoints_copy") {
        return;
    }
    if tmp_reflinks() {
        eprintln!("the temp directory reflinks by itself: nothing to compare");
        return;
    }
    let _s = serial();
    let d = Daemon::start_with(&["--store-image", "off"]);
    assert_eq!(mount_of(&d.root_path().join("sandboxes")), None);
    assert!(!d.root_path().join("store.xfs").exists());
    d.create(&["--name", "w"]);
    let ck = d
        .cli(&["checkpoint", "w", "--label", "one", "--json"])
        .ok()
        .json();
    assert_eq!(ck["method"], "copy", "{ck}");
}

#[test]
fn a_bad_store_flag_is_refused_before_anything_is_made() {
    let root = tempfile::tempdir().expect("tempdir");
    let out = std::process::Command::new(common::threadbox_bin())
        .args(["serve", "--store-image", "on", "--root"])
        .arg(root.path())
        .output()
        .expect("run threadbox");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("auto or off"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!root.path().join("store.xfs").exists());
}

/// A fork's disk keeps its parent's stored owners and is mounted idmapped (ADR 0102):
/// inside the fork, and a fork of the fork, every file is the sandbox user's and writable.
#[test]
fn forks_of_forks_see_their_own_owners_through_the_idmap() {
    if !require_root("forks_of_forks_see_their_own_owners_through_the_idmap") {
        return;
    }
    let _s = serial();
    let d = Daemon::start();
    d.create(&["--name", "p"]);
    sh(&d, "p", "echo a > ~/a; mkdir ~/dir; touch ~/dir/x");
    d.cli(&["fork", "p", "--name-prefix", "k"]).ok();
    assert_eq!(
        sh(
            &d,
            "k-1",
            "echo b > ~/b; echo more >> ~/a; stat -c '%u %g' ~/a ~/b ~/dir/x"
        ),
        "1000 1000\n1000 1000\n1000 1000\n"
    );
    d.cli(&["fork", "k-1", "--name-prefix", "g"]).ok();
    let out = sh(
        &d,
        "g-1",
        "echo c >> ~/b && touch ~/dir/y && id -u && stat -c '%u %g' ~/a ~/b ~/dir/y && cat ~/a ~/b",
    );
    assert_eq!(
        out,
        "1000\n1000 1000\n1000 1000\n1000 1000\na\nmore\nb\nc\n"
    );
    // The parent never saw any of it.
    assert_eq!(sh(&d, "p", "cat ~/a; ls ~"), "a\na\ndir\n");
    // A checkpoint and rewind of the fork keep its owners too.
    d.cli(&["checkpoint", "g-1", "--label", "c"]).ok();
    sh(&d, "g-1", "rm ~/a");
    d.cli(&["rewind", "g-1", "--to", "c"]).ok();
    assert_eq!(
        sh(&d, "g-1", "stat -c '%u %g' ~/a; echo w >> ~/a && echo ok"),
        "1000 1000\nok\n"
    );
}
