//! Pulls from a real registry (Debian's docker-registry on loopback) of images these tests
//! build themselves: OCI and Docker v2 manifests, an index, gzip and zstd layers, a
//! whiteout and an opaque directory across layers, basic and bearer auth, and corrupted
//! blobs that must be refused with nothing left behind.

mod common;

use common::{push, AuthProxy, Guard, LocalRegistry};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::sync::Arc;
use threadbox_oci::layout::{LayerBlob, LayoutWriter};
use threadbox_oci::manifest::Platform;
use threadbox_oci::pull::{pull, Progress, PullOptions};
use threadbox_oci::reference::Reference;
use threadbox_oci::registry::Credentials;
use threadbox_oci::store::Store;
use threadbox_oci::OciError;

fn tar_of(entries: &[(&str, Option<&[u8]>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut h = tar::Header::new_gnu();
        match data {
            Some(d) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(d.len() as u64);
                h.set_cksum();
                b.append_data(&mut h, name, *d).unwrap();
            }
            None => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                h.set_cksum();
                b.append_data(&mut h, name, &[][..]).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// Two layers: the lower (gzip) has `etc/a`, `etc/b`, `cache/old`; the upper (zstd)
/// deletes `etc/a` with a whiteout and makes `cache` opaque with `cache/new`.
fn two_layer_layout(dir: &std::path::Path) -> (LayoutWriter, Vec<LayerBlob>) {
    let lower = tar_of(&[
        ("etc", None),
        ("etc/a", Some(b"A")),
        ("etc/b", Some(b"B")),
        ("cache", None),
        ("cache/old", Some(b"old")),
    ]);
    let upper = tar_of(&[
        ("etc/.wh.a", Some(b"")),
        ("cache", None),
        ("cache/.wh..wh..opq", Some(b"")),
        ("cache/new", Some(b"new")),
    ]);
    let w = LayoutWriter::create(dir).unwrap();
    (w, vec![LayerBlob::gzip(&lower), LayerBlob::zstd(&upper)])
}

/// The tar inside a zstd layer blob of the test.
fn zstd_tar(l: &LayerBlob) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    ruzstd::decoding::StreamingDecoder::new(&l.blob[..])
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn run_config() -> serde_json::Value {
    serde_json::json!({"Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"], "WorkingDir": "/work", "User": "1000"})
}

fn store() -> (tempfile::TempDir, Arc<Store>) {
    let d = tempfile::tempdir().unwrap();
    let s = Arc::new(Store::open(&d.path().join("oci")).unwrap());
    (d, s)
}

async fn pull_ref(
    s: &Arc<Store>,
    r: &str,
    opts: &PullOptions,
) -> Result<(threadbox_oci::store::ImageRecord, Vec<Progress>), OciError> {
    let mut seen = Vec::new();
    let rec = pull(s, &Reference::parse(r).unwrap(), opts, &mut |p| {
        seen.push(p)
    })
    .await?;
    Ok((rec, seen))
}

fn nothing_half_written(s: &Store) {
    let tmp: Vec<_> = std::fs::read_dir(s.root().join("tmp")).unwrap().collect();
    assert!(tmp.is_empty(), "tmp/ keeps {tmp:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_oci_and_docker_manifests_and_an_index_with_whiteouts() {
    let reg = LocalRegistry::start();
    let lay = tempfile::tempdir().unwrap();
    let (mut w, layers) = two_layer_layout(lay.path());
    let host = Platform::host();
    let img = w.image(&host, &layers, run_config()).unwrap();
    w.tag("one", &img).unwrap();
    // An index with the host's image and one for another architecture (same layers).
    let other = Platform::parse(if host.architecture == "s390x" {
        "linux/amd64"
    } else {
        "linux/s390x"
    })
    .unwrap();
    let img2 = w.image(&other, &layers, serde_json::json!({})).unwrap();
    let idx = w.index(&[img.clone(), img2]).unwrap();
    w.tag("multi", &idx).unwrap();
    push(
        lay.path(),
        "one",
        &format!("{}/t/oci:1", reg.host()),
        false,
        false,
    );
    // Docker v2 has no zstd: the same layers, both gzip (the same diff_ids).
    let lay2 = tempfile::tempdir().unwrap();
    let (mut w2, mut layers2) = two_layer_layout(lay2.path());
    let upper_tar = zstd_tar(&layers2[1]);
    layers2[1] = LayerBlob::gzip(&upper_tar);
    let img_d = w2.image(&host, &layers2, run_config()).unwrap();
    w2.tag("one", &img_d).unwrap();
    push(
        lay2.path(),
        "one",
        &format!("{}/t/docker:1", reg.host()),
        false,
        true,
    );
    push(
        lay.path(),
        "multi",
        &format!("{}/t/multi:1", reg.host()),
        true,
        false,
    );

    let (_d, s) = store();
    let (rec, seen) = pull_ref(
        &s,
        &format!("{}/t/oci:1", reg.host()),
        &PullOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(rec.layers.len(), 2);
    assert_eq!(rec.run.working_dir.as_deref(), Some("/work"));
    assert_eq!(rec.run.user.as_deref(), Some("1000"));
    assert!(matches!(seen[0], Progress::Resolved { layers: 2, .. }));
    let bytes: u64 = seen
        .iter()
        .filter_map(|p| match p {
            Progress::Bytes { n, .. } => Some(*n),
            _ => None,
        })
        .sum();
    assert_eq!(bytes, rec.compressed_bytes, "progress counted every byte");
    let upper = s.layer_path(&rec.layers[1]);
    let wh = std::fs::symlink_metadata(upper.join("etc/a")).unwrap();
    assert!(
        wh.file_type().is_char_device() && wh.rdev() == 0,
        "whiteout"
    );
    let f = std::fs::File::open(upper.join("cache")).unwrap();
    assert_eq!(
        threadbox_sys::fs::tree::get_xattr(&f, "trusted.overlay.opaque").unwrap(),
        Some(b"y".to_vec())
    );
    assert_eq!(
        std::fs::read(s.layer_path(&rec.layers[0]).join("etc/b")).unwrap(),
        b"B"
    );
    nothing_half_written(&s);

    // Docker v2 manifests of the same image: the same diff_ids, so nothing is fetched.
    let (rec2, seen2) = pull_ref(
        &s,
        &format!("{}/t/docker:1", reg.host()),
        &PullOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(rec2.layers, rec.layers);
    assert!(
        seen2.iter().all(|p| !matches!(p, Progress::Bytes { .. })),
        "layers shared"
    );
    assert!(seen2
        .iter()
        .any(|p| matches!(p, Progress::Layer { cached: true, .. })));

    // The index picks the host's platform; another platform is refused by name.
    let (d3, s3) = store();
    let (rec3, _) = pull_ref(
        &s3,
        &format!("{}/t/multi:1", reg.host()),
        &PullOptions::default(),
    )
    .await
    .unwrap();
    assert_eq!(rec3.manifest_digest, img.digest);
    let opts = PullOptions {
        platform: Some(Platform::parse("linux/mips64").unwrap()),
        ..Default::default()
    };
    let e = pull_ref(&s3, &format!("{}/t/multi:1", reg.host()), &opts)
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::NotFound(_)), "{e}");
    // By digest.
    let by_digest = format!("{}/t/oci@{}", reg.host(), img.digest);
    pull_ref(&s3, &by_digest, &PullOptions::default())
        .await
        .unwrap();
    drop(d3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_blob_is_refused_and_nothing_stays() {
    let reg = LocalRegistry::start();
    let lay = tempfile::tempdir().unwrap();
    let (mut w, layers) = two_layer_layout(lay.path());
    let img = w.image(&Platform::host(), &layers, run_config()).unwrap();
    w.tag("one", &img).unwrap();
    push(
        lay.path(),
        "one",
        &format!("{}/t/bad:1", reg.host()),
        false,
        false,
    );
    // Flip a byte of the stored gzip layer: same size, other digest.
    let lower = layers[0].blob.clone();
    let hex = threadbox_oci::Digest::of(&lower).hex().to_string();
    let p = reg.blob_file(&hex);
    let mut b = std::fs::read(&p).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0xff;
    std::fs::write(&p, &b).unwrap();

    let (_d, s) = store();
    let e = pull_ref(
        &s,
        &format!("{}/t/bad:1", reg.host()),
        &PullOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, OciError::Integrity(_)), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("blob sha256:{hex} arrived with digest")),
        "{e}"
    );
    nothing_half_written(&s);
    assert_eq!(
        std::fs::read_dir(s.root().join("layers")).unwrap().count(),
        0
    );
    assert_eq!(
        std::fs::read_dir(s.root().join("blobs/sha256"))
            .unwrap()
            .count(),
        0
    );
    assert!(s.images().is_empty());

    // Truncated: the registry's file is cut (its Content-Length follows the file, so the
    // size check is what refuses it).
    std::fs::write(&p, &lower[..lower.len() / 2]).unwrap();
    let e = pull_ref(
        &s,
        &format!("{}/t/bad:1", reg.host()),
        &PullOptions::default(),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, OciError::Integrity(_)), "{e}");
    nothing_half_written(&s);
    // The positive control: the intact blob pulls.
    std::fs::write(&p, &lower).unwrap();
    pull_ref(
        &s,
        &format!("{}/t/bad:1", reg.host()),
        &PullOptions::default(),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_and_bearer_auth_through_the_challenge() {
    let reg = LocalRegistry::start();
    let lay = tempfile::tempdir().unwrap();
    let (mut w, layers) = two_layer_layout(lay.path());
    let img = w.image(&Platform::host(), &layers, run_config()).unwrap();
    w.tag("one", &img).unwrap();
    push(
        lay.path(),
        "one",
        &format!("{}/guarded:1", reg.host()),
        false,
        false,
    );
    let creds = Some(Credentials {
        username: "alice".into(),
        password: "s3cret".into(),
    });

    let bearer = AuthProxy::start(
        reg.addr,
        Guard::Bearer {
            user: "alice".into(),
            pass: "s3cret".into(),
            token: "tok-123".into(),
        },
    );
    let r = format!("localhost:{}/guarded:1", bearer.addr.port());
    let (_d, s) = store();
    // No credentials: the token service refuses.
    let e = pull_ref(&s, &r, &PullOptions::default()).await.unwrap_err();
    assert!(matches!(e, OciError::Unauthorized(_)), "{e}");
    let opts = PullOptions {
        credentials: creds.clone(),
        ..Default::default()
    };
    let (rec, _) = pull_ref(&s, &r, &opts).await.unwrap();
    assert_eq!(rec.layers.len(), 2);
    assert_eq!(
        bearer
            .tokens_issued
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one token for the whole pull"
    );

    let basic = AuthProxy::start(
        reg.addr,
        Guard::Basic {
            user: "alice".into(),
            pass: "s3cret".into(),
        },
    );
    let r = format!("localhost:{}/guarded:1", basic.addr.port());
    let (_d2, s2) = store();
    let e = pull_ref(&s2, &r, &PullOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(e, OciError::Unauthorized(_)), "{e}");
    let wrong = PullOptions {
        credentials: Some(Credentials {
            username: "alice".into(),
            password: "nope".into(),
        }),
        ..Default::default()
    };
    let e = pull_ref(&s2, &r, &wrong).await.unwrap_err();
    assert!(matches!(e, OciError::Unauthorized(_)), "{e}");
    pull_ref(&s2, &r, &opts).await.unwrap();
}
