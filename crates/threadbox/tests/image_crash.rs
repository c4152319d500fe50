//! `kill -9` of the daemon at random points of `image pull` (issue 14): after each
//! restart the image store holds the image whole or not at all — no record without its
//! catalog row, no layer or blob that no record names, every layer of a listed image
//! present — and a later pull completes. Against a local docker-registry; no internet.

mod common;
#[path = "../../threadbox-oci/tests/common/mod.rs"]
mod oci_common;

use common::{require_root, serial, Daemon};
use oci_common::{push, LocalRegistry};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};
use threadbox_oci::layout::{LayerBlob, LayoutWriter};
use threadbox_oci::manifest::Platform;

/// A layer of `files` small files and one incompressible MiB, under `dir/`.
fn layer(dir: &str, files: usize, seed: u64) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    for i in 0..files {
        add(&format!("{dir}/f{i}"), format!("{dir} {i}\n").as_bytes());
    }
    let mut x = seed | 1;
    let big: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    add(&format!("{dir}/big"), &big);
    b.into_inner().unwrap()
}

fn names_in(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn hex(d: &str) -> String {
    d.strip_prefix("sha256:").unwrap_or(d).to_string()
}

/// What is wrong with the image store of `d` (nothing when consistent).
fn store_problems(d: &Daemon) -> Vec<String> {
    let oci = d.root_path().join("oci");
    let mut problems = Vec::new();
    let ls = d.cli(&["image", "ls", "--json"]).ok().json();
    let listed: BTreeSet<String> = ls["images"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["kind"] == "oci")
        .filter_map(|i| i["digest"].as_str().map(hex))
        .collect();
    let mut live_layers = BTreeSet::new();
    let mut live_blobs = BTreeSet::new();
    for rec in names_in(&oci.join("images")) {
        let Some(h) = rec.strip_suffix(".json") else {
            problems.push(format!("stray file images/{rec}"));
            continue;
        };
        if !listed.contains(h) {
            problems.push(format!("record {h} without a catalog row"));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(oci.join("images").join(&rec)).unwrap())
                .unwrap_or_default();
        live_blobs.insert(hex(v["manifest_digest"].as_str().unwrap_or_default()));
        live_blobs.insert(hex(v["config_digest"].as_str().unwrap_or_default()));
        for l in v["layers"].as_array().into_iter().flatten() {
            let l = hex(l.as_str().unwrap_or_default());
            if !oci.join("layers").join(&l).is_dir() {
                problems.push(format!("image {h} names missing layer {l}"));
            }
            live_layers.insert(l);
        }
    }
    for h in &listed {
        if !oci.join("images").join(format!("{h}.json")).is_file() {
            problems.push(format!("catalog row {h} without a record"));
        }
    }
    for l in names_in(&oci.join("layers")) {
        if !live_layers.contains(&l) {
            problems.push(format!("orphan layer {l}"));
        }
    }
    for b in names_in(&oci.join("blobs/sha256")) {
        if !live_blobs.contains(&b) {
            problems.push(format!("orphan blob {b}"));
        }
    }
    problems
}

#[test]
fn kill9_mid_pull_then_restart_leaves_the_image_whole_or_absent() {
    if !require_root("kill9_mid_pull_then_restart_leaves_the_image_whole_or_absent") {
        return;
    }
    let _s = serial();
    let reg = LocalRegistry::start();
    let lay = tempfile::tempdir().unwrap();
    let mut w = LayoutWriter::create(lay.path()).unwrap();
    let layers: Vec<LayerBlob> = (0..3)
        .map(|i| LayerBlob::gzip(&layer(&format!("l{i}"), 1500, i + 7)))
        .collect();
    let img = w
        .image(
            &Platform::host(),
            &layers,
            serde_json::json!({
                "User": "1000:1000",
                "Entrypoint": ["/bin/sh", "-c"],
                "Cmd": ["echo hi"],
            }),
        )
        .unwrap();
    w.tag("1", &img).unwrap();
    let reference = format!("{}/tb/crash:1", reg.host());
    push(lay.path(), "1", &reference, false, false);

    let mut d = Daemon::start();
    // One whole pull first: how long one takes, so the kills land inside it.
    let t0 = Instant::now();
    d.cli(&["image", "pull", &reference, "--name", "crash"])
        .ok();
    let whole = t0.elapsed();
    assert!(store_problems(&d).is_empty(), "{:?}", store_problems(&d));
    d.cli(&["image", "rm", "crash"]).ok();
    assert!(names_in(&d.root_path().join("oci/layers")).is_empty());

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
    eprintln!("kill -9 pull trials, seed {seed}, a whole pull takes {whole:?}");
    let span = (whole.as_millis() as u64).max(50);
    let mut x = seed;
    let mut whole_after = 0;
    for trial in 0..9 {
        let child = std::process::Command::new(common::threadbox_bin())
            .args(["image", "pull", &reference, "--name", "crash"])
            .env("THREADBOX_URL", &d.url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("cli");
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Anywhere in the pull, and now and then just after it.
        let delay = x % (span + span / 5);
        std::thread::sleep(Duration::from_millis(delay));
        d.kill9();
        let _ = child.wait_with_output();
        d.restart();
        let problems = store_problems(&d);
        assert!(
            problems.is_empty(),
            "trial {trial} (kill after {delay} ms of ~{span}, seed {seed}): {problems:#?}\n{}",
            d.log()
        );
        let ls = d.cli(&["image", "ls", "--json"]).ok().json();
        let present = ls["images"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|i| i["name"] == "crash");
        if present {
            whole_after += 1;
            d.cli(&["image", "rm", "crash"]).ok();
        }
    }
    eprintln!("{whole_after} of 9 pulls had finished before the kill");
    // After all that, a pull completes and the layers hold what was pushed.
    let out = d
        .cli(&["image", "pull", &reference, "--name", "crash", "--json"])
        .ok()
        .json();
    assert_eq!(out["layers"], 3, "{out}");
    // The config's User, Entrypoint and Cmd are shown (ADR 0104), nothing is started.
    assert_eq!(out["user"], "1000:1000", "{out}");
    assert_eq!(
        out["entrypoint"],
        serde_json::json!(["/bin/sh", "-c"]),
        "{out}"
    );
    assert_eq!(out["cmd"], serde_json::json!(["echo hi"]), "{out}");
    assert!(store_problems(&d).is_empty(), "{:?}", store_problems(&d));
    for l in names_in(&d.root_path().join("oci/layers")) {
        let dir = d.root_path().join("oci/layers").join(&l);
        let sub = names_in(&dir);
        assert_eq!(sub.len(), 1, "{sub:?}");
        let files = names_in(&dir.join(sub.iter().next().unwrap()));
        assert_eq!(files.len(), 1501, "layer {l}");
    }
}
