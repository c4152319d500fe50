//! Pull throughput against `skopeo copy` of the same image from the same local registry in
//! the same run (issue 14's figure). Ignored by default (it moves a few hundred MB):
//! `cargo test -p threadbox-oci --test bench_pull -- --ignored --nocapture`, with
//! `THREADBOX_TEST_ROOTFS` (or `target/test-rootfs/debian`) as the image's content.

mod common;

use common::{push, LocalRegistry};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use threadbox_oci::layout::{tar_dir, LayerBlob, LayoutWriter};
use threadbox_oci::manifest::Platform;
use threadbox_oci::pull::{pull, PullOptions};
use threadbox_oci::reference::Reference;
use threadbox_oci::store::Store;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn pull_throughput_against_skopeo_copy() {
    let rootfs = std::env::var("THREADBOX_TEST_ROOTFS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/test-rootfs/debian")
        });
    assert!(
        rootfs.join("usr/bin").is_dir(),
        "no rootfs at {}",
        rootfs.display()
    );
    let reg = LocalRegistry::start();
    let lay = tempfile::tempdir().unwrap();
    let mut w = LayoutWriter::create(lay.path()).unwrap();
    let tar = tar_dir(&rootfs).unwrap();
    let layer = LayerBlob::gzip(&tar);
    let (tar_len, blob_len) = (tar.len(), layer.blob.len());
    drop(tar);
    let img = w
        .image(&Platform::host(), &[layer], serde_json::json!({}))
        .unwrap();
    w.tag("1", &img).unwrap();
    let r = format!("{}/bench/debian:1", reg.host());
    push(lay.path(), "1", &r, false, false);

    let runs = 3;
    let (mut ours, mut skopeo, mut fetch) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let out = tempfile::tempdir().unwrap();
        let t = Instant::now();
        let st = std::process::Command::new("skopeo")
            .args([
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                "--insecure-policy",
            ])
            .arg(format!("docker://{r}"))
            .arg(format!("dir:{}", out.path().join("img").display()))
            .status()
            .unwrap();
        assert!(st.success());
        skopeo.push(t.elapsed().as_secs_f64());

        let d = tempfile::tempdir().unwrap();
        let s = Arc::new(Store::open(&d.path().join("oci")).unwrap());
        let t = Instant::now();
        pull(
            &s,
            &Reference::parse(&r).unwrap(),
            &PullOptions::default(),
            &mut |_| {},
        )
        .await
        .unwrap();
        ours.push(t.elapsed().as_secs_f64());

        // Fetch and verify alone (what skopeo copy to `dir:` does): the manifest's
        // layer into a fresh store, no unpack.
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(&d.path().join("oci")).unwrap();
        let reference = Reference::parse(&r).unwrap();
        let reg = threadbox_oci::registry::Registry::new(&reference, None, false).unwrap();
        let t = Instant::now();
        let (bytes, ct, _) = reg.manifest(&reference.manifest_ref()).await.unwrap();
        let threadbox_oci::manifest::Parsed::Manifest { layers, .. } =
            threadbox_oci::manifest::parse_document(&bytes, ct.as_deref()).unwrap()
        else {
            panic!("not a manifest")
        };
        for l in &layers {
            let w = s.blob_writer(&l.digest, Some(l.size)).unwrap();
            reg.blob_into(&l.digest, w, &mut |_| {}).await.unwrap();
        }
        fetch.push(t.elapsed().as_secs_f64());
    }
    let (mo, ms) = (median(ours.clone()), median(skopeo.clone()));
    let mb = blob_len as f64 / 1e6;
    println!(
        "image: one gzip layer of {:.1} MB ({:.1} MB uncompressed); {runs} runs each",
        mb,
        tar_len as f64 / 1e6
    );
    println!(
        "skopeo copy (fetch+verify):         median {ms:.2} s  {:.1} MB/s  {skopeo:?}",
        mb / ms
    );
    println!(
        "threadbox pull (fetch+verify+unpack): median {mo:.2} s  {:.1} MB/s  {ours:?}",
        mb / mo
    );
    let mf = median(fetch.clone());
    println!(
        "threadbox fetch+verify only:        median {mf:.2} s  {:.1} MB/s  {fetch:?}",
        mb / mf
    );
    println!(
        "ratio threadbox/skopeo: pull {:.2}, fetch+verify {:.2}",
        mo / ms,
        mf / ms
    );
}
