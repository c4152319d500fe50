//! OCI images end to end (issue 14): an image built here from the suite's Debian rootfs
//! (two layers, the upper one with a whiteout), pushed to a local docker-registry, pulled
//! by the daemon, run as a sandbox (Python in it, the config's Env and WorkingDir as
//! defaults), and removed with its layers once no sandbox uses it. No internet.

mod common;
#[path = "../../threadbox-oci/tests/common/mod.rs"]
mod oci_common;

use common::Daemon;
use oci_common::{push, LocalRegistry};
use std::path::PathBuf;
use threadbox_oci::layout::{tar_dir, LayerBlob, LayoutWriter};
use threadbox_oci::manifest::Platform;

fn rootfs() -> Option<PathBuf> {
    let p = std::env::var("THREADBOX_TEST_ROOTFS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-rootfs/debian")
        });
    p.join("usr/bin/python3").exists().then_some(p)
}

/// The upper layer: `/work/hello.py`, and a whiteout of `/etc/debian_version`.
fn upper_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8], dir: bool| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(if dir {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        h.set_mode(if dir { 0o755 } else { 0o644 });
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    add("work", b"", true);
    add(
        "work/hello.py",
        b"import os\nprint('hello from', os.getcwd(), 6 * 7)\n",
        false,
    );
    add("etc/.wh.debian_version", b"", false);
    b.into_inner().unwrap()
}

#[test]
fn a_pulled_image_runs_python_with_its_config_and_is_refcounted() {
    if !common::require_root("a_pulled_image_runs_python_with_its_config_and_is_refcounted") {
        return;
    }
    let Some(rootfs) = rootfs() else {
        eprintln!("skipped: no Debian rootfs (scripts/test.sh makes target/test-rootfs/debian)");
        return;
    };
    let reg = LocalRegistry::start();
    let lay = tempfile::tempdir().unwrap();
    let mut w = LayoutWriter::create(lay.path()).unwrap();
    let base = tar_dir(&rootfs).unwrap();
    let layers = vec![LayerBlob::gzip(&base), LayerBlob::gzip(&upper_tar())];
    drop(base);
    let run = serde_json::json!({
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin", "GREETING=from-the-image"],
        "WorkingDir": "/work",
    });
    let img = w.image(&Platform::host(), &layers, run).unwrap();
    w.tag("1", &img).unwrap();
    let reference = format!("{}/tb/debian:1", reg.host());
    push(lay.path(), "1", &reference, false, false);

    let d = Daemon::start();
    // Bad input changes nothing.
    assert_ne!(d.cli(&["image", "pull", "UPPER/Case"]).code, 0);
    let missing = d.cli(&["image", "pull", &format!("{}/tb/missing:1", reg.host())]);
    assert_ne!(missing.code, 0);
    assert!(missing.stderr.contains("not found"), "{}", missing.stderr);
    let out = d
        .cli(&["image", "pull", &reference, "--name", "deb", "--json"])
        .ok()
        .json();
    assert_eq!(out["kind"], "oci", "{out}");
    assert_eq!(out["layers"], 2, "{out}");
    assert_eq!(out["digest"], img.digest.as_str(), "{out}");
    // Again: the same digest, nothing fetched, the same row.
    d.cli(&["image", "pull", &reference, "--name", "deb"]).ok();

    let id = d.create(&["--image", "deb"]);
    let r = d
        .cli(&[
            "exec",
            &id,
            "--json",
            "--",
            "sh",
            "-c",
            "python3 hello.py; echo $GREETING; test -e /etc/debian_version && echo present || echo whited-out",
        ])
        .json();
    assert_eq!(r["exit_code"], 0, "{r}");
    let stdout = r["stdout"].as_str().unwrap();
    assert_eq!(
        stdout, "hello from /work 42\nfrom-the-image\nwhited-out\n",
        "{r}"
    );

    // In use: the image cannot vanish under the sandbox.
    let ls = d.cli(&["image", "ls", "--json"]).ok().json();
    let deb = ls["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["name"] == "deb")
        .unwrap()
        .clone();
    assert_eq!(deb["sandboxes"], 1, "{ls}");
    let busy = d.cli(&["image", "rm", "deb"]);
    assert_ne!(busy.code, 0);
    assert!(busy.stderr.contains("used by 1 sandbox"), "{}", busy.stderr);
    let layers_dir = d.root_path().join("oci/layers");
    assert_eq!(std::fs::read_dir(&layers_dir).unwrap().count(), 2);
    d.cli(&["rm", "--force", &id]).ok();
    d.cli(&["image", "rm", "deb"]).ok();
    assert_eq!(
        std::fs::read_dir(&layers_dir).unwrap().count(),
        0,
        "unused layers go"
    );
    assert_ne!(d.cli(&["create", "--image", "deb"]).code, 0);
}
