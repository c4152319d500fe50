//! Template disks in the reflink store (issue 14, ADR 0162): a template's disk is made in
//! `ROOT/sandboxes/.templates/`, inside the store image the daemon mounts on
//! `ROOT/sandboxes` (ADR 0101), so making the template and `create --template` are both
//! reflinks: the store's free space does not drop by the template's data. The positive
//! control: with the store off on a root that cannot reflink, the template is a copy.

mod common;

use common::{require_root, serial, Daemon};
use std::path::Path;

/// Free bytes of the file system holding `dir`.
fn free_bytes(dir: &Path) -> u64 {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", "%a %S"])
        .arg(dir)
        .output()
        .expect("stat -f");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text
        .split_whitespace()
        .map(|v| v.parse::<u64>().expect("a number"));
    it.next().expect("free blocks") * it.next().expect("block size")
}

fn sh(d: &Daemon, sb: &str, script: &str) -> String {
    let run = d.cli(&["exec", sb, "--", "sh", "-c", script]).ok();
    String::from_utf8_lossy(&run.stdout).into_owned()
}

/// Whether the temp directory's own file system reflinks (then no store image is made,
/// and the control cannot copy).
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

const MIB: u64 = 1 << 20;

#[test]
fn templates_and_creates_from_them_are_reflinks_in_the_store() {
    if !require_root("templates_and_creates_from_them_are_reflinks_in_the_store") {
        return;
    }
    let _s = serial();
    // Explicit: the test command runs every other daemon with THREADBOX_STORE_IMAGE=off.
    let d = Daemon::start_with(&["--store-image", "auto"]);
    let sandboxes = d
        .root_path()
        .canonicalize()
        .expect("root")
        .join("sandboxes");
    d.create(&["--name", "src"]);
    sh(
        &d,
        "src",
        "head -c 64000000 /dev/urandom > ~/big; md5sum ~/big > ~/sum; sync",
    );
    let t = d
        .cli(&["template", "create", "t1", "--from", "src", "--json"])
        .ok()
        .json();
    assert_eq!(t["template"]["method"], "reflink", "{t}");
    let disk = format!("{}.img", t["template"]["id"].as_str().expect("an id"));
    assert!(sandboxes.join(".templates").join(&disk).is_file(), "{t}");
    assert!(!d.root_path().join("templates").join(&disk).exists());

    // Three sandboxes of it: a copy each would take 3 × 64 MB of the store.
    let before = free_bytes(&sandboxes);
    for n in ["a", "b", "c"] {
        d.create(&["--template", "t1", "--name", n]);
    }
    let after = free_bytes(&sandboxes);
    let used = before.saturating_sub(after);
    assert!(
        used < 64 * MIB,
        "creates from the template used {used} bytes of the store"
    );
    for n in ["a", "b", "c"] {
        assert_eq!(sh(&d, n, "md5sum -c ~/sum --quiet && echo ok"), "ok\n");
    }
    // Their own writes; the template deleted under them.
    sh(&d, "a", "echo mine > ~/own");
    d.cli(&["template", "rm", "t1"]).ok();
    assert!(!sandboxes.join(".templates").join(&disk).exists());
    assert_eq!(sh(&d, "a", "cat ~/own"), "mine\n");
    assert_eq!(sh(&d, "b", "md5sum -c ~/sum --quiet && echo ok"), "ok\n");
    for n in ["a", "b", "c", "src"] {
        d.cli(&["rm", "--force", n]).ok();
    }
}

/// The positive control: the store off, on a root that cannot reflink, the same
/// template is a copy.
#[test]
fn with_the_store_off_a_template_is_a_copy() {
    if !require_root("with_the_store_off_a_template_is_a_copy") {
        return;
    }
    if tmp_reflinks() {
        eprintln!("skipped: the temp file system reflinks by itself");
        return;
    }
    let _s = serial();
    let d = Daemon::start_with(&["--store-image", "off"]);
    d.create(&["--name", "src"]);
    sh(&d, "src", "echo x > ~/f");
    let t = d
        .cli(&["template", "create", "t1", "--from", "src", "--json"])
        .ok()
        .json();
    assert_eq!(t["template"]["method"], "copy", "{t}");
    d.cli(&["template", "rm", "t1"]).ok();
    d.cli(&["rm", "--force", "src"]).ok();
}
