//! Image layers in the tenants' disk usage and quota (issue 14 scope 6, ADR 0165), on a
//! real daemon with an image built here from the suite's Debian rootfs, pushed to a
//! loopback `docker-registry` and pulled: a tenant's usage rises by the image's layers
//! once for two sandboxes of it, another tenant pays for them too without moving the
//! first's, the split (sandboxes, checkpoints, templates, layers) sums to `disk_bytes` in
//! `quota get` and `usage`, a template alone keeps its layers counted and stored across
//! a restart's GC, and creates, forks, checkpoints and templates that the layers push
//! over the quota are refused with nothing left behind (each with a control: the same
//! request admitted once the quota has the layers' room). No internet.

mod common;
#[path = "../../threadbox-oci/tests/common/mod.rs"]
mod oci_common;

use common::{require_root, serial, Daemon, Run};
use oci_common::{push, LocalRegistry};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use threadbox_oci::layout::{tar_dir, LayerBlob, LayoutWriter};
use threadbox_oci::manifest::Platform;

const MIB: u64 = 1 << 20;
const TENANTS: &[&str] = &["lq-one", "lq-two", "lq-three", "lq-four"];

fn rootfs() -> Option<PathBuf> {
    let p = std::env::var("THREADBOX_TEST_ROOTFS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-rootfs/debian")
        });
    p.join("usr/bin/python3").exists().then_some(p)
}

/// A layer holding 3 MiB that does not compress (so its size is plainly its own).
fn top_layer() -> Vec<u8> {
    let mut data = vec![0u8; 3 << 20];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    b.append_data(&mut h, "opt/blob.bin", &data[..]).unwrap();
    b.into_inner().unwrap()
}

/// `threadbox ARGS` through the operator's socket acting for `tenant`.
fn as_tenant(d: &Daemon, tenant: &str, args: &[&str]) -> Run {
    as_tenant_at(&d.url, tenant, args)
}

fn as_tenant_at(url: &str, tenant: &str, args: &[&str]) -> Run {
    Command::new(common::threadbox_bin())
        .args(args)
        .env("THREADBOX_URL", url)
        .env("THREADBOX_TENANT", tenant)
        .env_remove("THREADBOX_API_KEY")
        .stdin(Stdio::null())
        .output()
        .expect("run threadbox")
        .into()
}

/// Deletes the test tenants' sandboxes and templates when dropped, a failed test's too
/// (sandboxes outlive the daemon by design). Holds the daemon's URL, which a restart keeps.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for t in TENANTS {
            if let Ok(v) =
                serde_json::from_slice::<Value>(&as_tenant_at(&self.0, t, &["ls", "--json"]).stdout)
            {
                for sb in v["sandboxes"].as_array().into_iter().flatten() {
                    if let Some(id) = sb["id"].as_str() {
                        let _ = as_tenant_at(&self.0, t, &["rm", "--force", id]);
                    }
                }
            }
            if let Ok(v) = serde_json::from_slice::<Value>(
                &as_tenant_at(&self.0, t, &["template", "ls", "--json"]).stdout,
            ) {
                for tp in v["templates"].as_array().into_iter().flatten() {
                    if let Some(n) = tp["name"].as_str() {
                        let _ = as_tenant_at(&self.0, t, &["template", "rm", n]);
                    }
                }
            }
        }
    }
}

/// The tenant's disk use as `quota get` shows it: (`disk_bytes`, `disk`).
fn disk_of(d: &Daemon, tenant: &str) -> (u64, Value) {
    let q = d.cli(&["quota", "get", tenant, "--json"]).ok().json();
    let used = &q["usage"];
    let total = used["disk_bytes"].as_u64().expect("disk_bytes");
    let split = used["disk"].clone();
    let sum: u64 = ["sandboxes", "checkpoints", "templates", "layers"]
        .iter()
        .map(|k| split[k].as_u64().unwrap_or_else(|| panic!("disk.{k}: {q}")))
        .sum();
    assert_eq!(total, sum, "disk_bytes is the sum of its parts: {q}");
    (total, split)
}

fn layers_of(d: &Daemon, tenant: &str) -> u64 {
    disk_of(d, tenant).1["layers"].as_u64().unwrap()
}

/// What `du` says the unpacked layers occupy, each layer directory on its own (the
/// daemon's own walk is not used to check itself).
fn du_layers(root: &Path) -> u64 {
    let dir = root.join("oci/layers");
    let mut total = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let out = Command::new("du")
            .args(["-s", "-B1"])
            .arg(e.unwrap().path())
            .output()
            .expect("du");
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        total += text
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    total
}

/// Every path under the daemon's disk directories: what a refusal must not change.
fn disk_files(root: &Path) -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    let mut stack: Vec<PathBuf> = ["sandboxes", "templates"]
        .iter()
        .map(|d| root.join(d))
        .filter(|p| p.is_dir())
        .collect();
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            // A running sandbox's own root (its upper) is its business, not a refusal's.
            if p.file_name()
                .is_some_and(|n| n == "rootfs" || n == "upper" || n == "work")
            {
                continue;
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) && p.components().count() < 12 {
                stack.push(p.clone());
            }
            out.insert(p);
        }
    }
    out
}

fn count(d: &Daemon, tenant: &str, args: &[&str], key: &str) -> usize {
    as_tenant(d, tenant, args).ok().json()[key]
        .as_array()
        .unwrap()
        .len()
}

/// `args` refused with `quota_exceeded` on `disk_bytes` naming the layers' share, and
/// nothing of the tenant's or on disk changed.
fn refused(d: &Daemon, tenant: &str, args: &[&str], sandbox: Option<&str>) -> String {
    let files = disk_files(d.root_path());
    let sandboxes = count(d, tenant, &["ls", "--json"], "sandboxes");
    let templates = count(d, tenant, &["template", "ls", "--json"], "templates");
    let ckpts = sandbox.map(|s| count(d, tenant, &["checkpoints", s, "--json"], "checkpoints"));
    let before = disk_of(d, tenant);
    let r = as_tenant(d, tenant, args);
    assert_ne!(r.code, 0, "{args:?} was admitted: {}", r.stdout_str());
    assert!(
        r.stderr.contains("quota") && r.stderr.contains("disk_bytes"),
        "{args:?}: {}",
        r.stderr
    );
    assert_eq!(
        count(d, tenant, &["ls", "--json"], "sandboxes"),
        sandboxes,
        "{args:?}"
    );
    assert_eq!(
        count(d, tenant, &["template", "ls", "--json"], "templates"),
        templates,
        "{args:?}"
    );
    if let Some(s) = sandbox {
        assert_eq!(
            Some(count(
                d,
                tenant,
                &["checkpoints", s, "--json"],
                "checkpoints"
            )),
            ckpts,
            "{args:?}"
        );
    }
    assert_eq!(
        disk_files(d.root_path()),
        files,
        "{args:?} left files behind"
    );
    let after = disk_of(d, tenant);
    assert_eq!(after.1["layers"], before.1["layers"], "{args:?}");
    assert_eq!(after.1["checkpoints"], before.1["checkpoints"], "{args:?}");
    assert_eq!(after.1["templates"], before.1["templates"], "{args:?}");
    r.stderr
}

#[test]
fn layers_count_once_per_tenant_show_in_the_split_and_are_refused_past_the_quota() {
    if !require_root(
        "layers_count_once_per_tenant_show_in_the_split_and_are_refused_past_the_quota",
    ) {
        return;
    }
    let Some(rootfs) = rootfs() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "no Debian rootfs and CI is set: scripts/test.sh makes target/test-rootfs/debian"
        );
        eprintln!("skipped: no Debian rootfs (scripts/test.sh makes target/test-rootfs/debian)");
        return;
    };
    let _serial = serial();
    let reg = LocalRegistry::start();
    let lay = tempfile::tempdir().unwrap();
    let mut w = LayoutWriter::create(lay.path()).unwrap();
    // Uncompressed: the sizes that count are the unpacked ones, and gzip here is slow.
    let layers = vec![
        LayerBlob::plain(tar_dir(&rootfs).unwrap()),
        LayerBlob::plain(top_layer()),
    ];
    let img = w
        .image(
            &Platform::host(),
            &layers,
            serde_json::json!({"Env": ["PATH=/usr/bin:/bin"]}),
        )
        .unwrap();
    drop(layers);
    w.tag("1", &img).unwrap();
    let reference = format!("{}/tb/lq:1", reg.host());
    push(lay.path(), "1", &reference, false, false);

    let mut d = Daemon::start();
    let cleanup_root = d.root_path().to_path_buf();
    d.cli(&["image", "pull", &reference, "--name", "deb"]).ok();
    let l = du_layers(&cleanup_root);
    assert!(l > 100 * MIB, "the Debian rootfs unpacked: {l}");
    {
        let _cleanup = Cleanup(d.url.clone());
        let (one, two) = ("lq-one", "lq-two");
        assert_eq!(layers_of(&d, one), 0, "no sandbox, no layers");

        // Two sandboxes of the image: its layers count once.
        let a = as_tenant(
            &d,
            one,
            &["create", "--image", "deb", "--disk", "64M", "--json"],
        )
        .ok()
        .json()["id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(layers_of(&d, one), l, "the layers as du measures them");
        let b = as_tenant(
            &d,
            one,
            &["create", "--image", "deb", "--disk", "64M", "--json"],
        )
        .ok()
        .json()["id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(
            layers_of(&d, one),
            l,
            "a second sandbox of the image adds no layer"
        );
        // A sandbox of the built-in image brings none.
        let h = as_tenant(&d, one, &["create", "--disk", "64M", "--json"])
            .ok()
            .json()["id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(layers_of(&d, one), l);
        as_tenant(&d, one, &["rm", "--force", &h]).ok();

        // Another tenant pays for the same layers; the first's figure does not move.
        let c = as_tenant(
            &d,
            two,
            &["create", "--image", "deb", "--disk", "64M", "--json"],
        )
        .ok()
        .json()["id"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(layers_of(&d, two), l);
        assert_eq!(layers_of(&d, one), l);

        // Checkpoints and templates in the split, in `quota get` and `usage` alike.
        as_tenant(&d, one, &["checkpoint", &a, "--label", "k"]).ok();
        as_tenant(&d, one, &["template", "create", "lq-tpl", "--from", &a]).ok();
        let (total, split) = disk_of(&d, one);
        assert!(split["checkpoints"].as_u64().unwrap() > 0, "{split}");
        assert!(split["templates"].as_u64().unwrap() > 0, "{split}");
        let u = as_tenant(&d, one, &["usage", "--json"]).ok().json();
        let t = &u["tenants"][0];
        assert_eq!(t["tenant"], one, "{u}");
        assert_eq!(t["disk"]["layers"], l, "{u}");
        assert_eq!(t["disk"]["checkpoints"], split["checkpoints"], "{u}");
        assert_eq!(t["disk"]["templates"], split["templates"], "{u}");
        let usum: u64 = ["sandboxes", "checkpoints", "templates", "layers"]
            .iter()
            .map(|k| t["disk"][k].as_u64().unwrap())
            .sum();
        assert_eq!(t["disk_bytes"], usum, "{u}");
        assert!(total >= l, "{total}");
        let text = as_tenant(&d, one, &["usage"]).ok().stdout_str();
        assert!(text.contains(&format!("layers {l}")), "{text}");

        // The sandboxes go; the template alone keeps the layers counted, and stored
        // through a restart's GC (the image cannot be removed under it).
        for id in [&a, &b] {
            as_tenant(&d, one, &["rm", "--force", id]).ok();
        }
        assert_eq!(layers_of(&d, one), l, "the template uses them");
        let busy = d.cli(&["image", "rm", "deb"]);
        assert_ne!(busy.code, 0, "an image a template uses stays");
        as_tenant(&d, two, &["rm", "--force", &c]).ok();
        assert_eq!(layers_of(&d, two), 0);
        d.terminate();
        d.restart();
        assert_eq!(
            du_layers(&cleanup_root),
            l,
            "no layer of the template was collected"
        );
        assert_eq!(layers_of(&d, one), l);
        let from_tpl = as_tenant(&d, one, &["create", "--template", "lq-tpl", "--json"])
            .ok()
            .json()["id"]
            .as_str()
            .unwrap()
            .to_string();
        let r = as_tenant(
            &d,
            one,
            &["exec", &from_tpl, "--", "test", "-s", "/opt/blob.bin"],
        );
        assert_eq!(
            r.code, 0,
            "the template's sandbox boots on its layers: {}",
            r.stderr
        );
        as_tenant(&d, one, &["rm", "--force", &from_tpl]).ok();
        as_tenant(&d, one, &["template", "rm", "lq-tpl"]).ok();
        assert_eq!(layers_of(&d, one), 0);

        // A create the layers push over the quota: refused, naming them; the same disk
        // without layers (the built-in image) is the control that fits.
        let three = "lq-three";
        let q = l + 48 * MIB;
        d.cli(&["quota", "set", three, "--disk-bytes", &q.to_string()])
            .ok();
        let msg = refused(
            &d,
            three,
            &["create", "--image", "deb", "--disk", "64M"],
            None,
        );
        assert!(msg.contains("layers"), "{msg}");
        let ok = as_tenant(&d, three, &["create", "--disk", "64M", "--json"])
            .ok()
            .json();
        as_tenant(&d, three, &["rm", "--force", ok["id"].as_str().unwrap()]).ok();
        // A create naming no size gets a disk shrunk to fit beside the layers.
        let fitted = as_tenant(&d, three, &["create", "--image", "deb", "--json"])
            .ok()
            .json();
        let got = fitted["limits"]["disk_bytes"].as_u64().unwrap();
        assert!((16 * MIB..=48 * MIB).contains(&got), "{fitted}");
        as_tenant(
            &d,
            three,
            &["rm", "--force", fitted["id"].as_str().unwrap()],
        )
        .ok();

        // A sandbox that fits with its layers and 16 KiB to spare: a fork, a
        // checkpoint and a template of it do not fit, and nothing of them stays.
        let four = "lq-four";
        let q = l + 64 * MIB + 16 * 1024;
        d.cli(&["quota", "set", four, "--disk-bytes", &q.to_string()])
            .ok();
        let p = as_tenant(
            &d,
            four,
            &["create", "--image", "deb", "--disk", "64M", "--json"],
        )
        .ok()
        .json()["id"]
            .as_str()
            .unwrap()
            .to_string();
        as_tenant(
            &d,
            four,
            &["exec", &p, "--", "sh", "-c", "echo kept > /tmp/f; sync"],
        )
        .ok();
        refused(&d, four, &["fork", &p], Some(&p));
        refused(&d, four, &["checkpoint", &p, "--label", "x"], Some(&p));
        refused(
            &d,
            four,
            &["template", "create", "lq-t4", "--from", &p],
            Some(&p),
        );
        // Control: with the layers' room added, the same requests are admitted.
        d.cli(&["quota", "set", four, "--disk-bytes", &(q + l).to_string()])
            .ok();
        as_tenant(&d, four, &["checkpoint", &p, "--label", "x"]).ok();
        as_tenant(&d, four, &["template", "create", "lq-t4", "--from", &p]).ok();
        let forks = as_tenant(&d, four, &["fork", &p, "--json"]).ok().json();
        assert_eq!(
            layers_of(&d, four),
            l,
            "forks and templates share the layers: {forks}"
        );
    }
}
