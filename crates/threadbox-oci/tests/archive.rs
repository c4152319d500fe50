//! Imports: an OCI layout directory, a tar of it, and the older `docker save` format.

use std::sync::Arc;
use threadbox_oci::archive::import_blocking;
use threadbox_oci::layout::{LayerBlob, LayoutWriter};
use threadbox_oci::manifest::Platform;
use threadbox_oci::store::Store;
use threadbox_oci::{Digest, OciError};

fn layer_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(2);
    h.set_cksum();
    b.append_data(&mut h, "etc/hi", &b"hi"[..]).unwrap();
    b.into_inner().unwrap()
}

fn store() -> (tempfile::TempDir, Arc<Store>) {
    let d = tempfile::tempdir().unwrap();
    let s = Arc::new(Store::open(&d.path().join("oci")).unwrap());
    (d, s)
}

#[test]
fn an_oci_layout_directory_and_a_tar_of_it_import() {
    let lay = tempfile::tempdir().unwrap();
    let mut w = LayoutWriter::create(lay.path()).unwrap();
    let img = w
        .image(
            &Platform::host(),
            &[LayerBlob::gzip(&layer_tar())],
            serde_json::json!({"WorkingDir": "/w"}),
        )
        .unwrap();
    w.tag("app:1", &img).unwrap();
    let (_d, s) = store();
    let (rec, tag) = import_blocking(&s, lay.path(), &Platform::host()).unwrap();
    assert_eq!(tag.as_deref(), Some("app:1"));
    assert_eq!(rec.manifest_digest, img.digest);
    assert_eq!(
        std::fs::read(s.layer_path(&rec.layers[0]).join("etc/hi")).unwrap(),
        b"hi"
    );

    // The same layout as a tar (what `oci-archive:` is).
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", lay.path()).unwrap();
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("img.tar");
    std::fs::write(&file, b.into_inner().unwrap()).unwrap();
    let (_d2, s2) = store();
    let (rec2, _) = import_blocking(&s2, &file, &Platform::host()).unwrap();
    assert_eq!(rec2.layers, rec.layers);
    assert!(std::fs::read_dir(s2.root().join("tmp"))
        .unwrap()
        .next()
        .is_none());

    // A tampered layer blob is refused.
    let blob = lay
        .path()
        .join("blobs/sha256")
        .join(Digest::of(&LayerBlob::gzip(&layer_tar()).blob).hex());
    let mut bytes = std::fs::read(&blob).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 1;
    std::fs::write(&blob, &bytes).unwrap();
    let (_d3, s3) = store();
    let e = import_blocking(&s3, lay.path(), &Platform::host()).unwrap_err();
    assert!(matches!(e, OciError::Integrity(_)), "{e}");
    assert!(s3.images().is_empty());
}

#[test]
fn a_docker_save_archive_imports() {
    let dir = tempfile::tempdir().unwrap();
    let tar = layer_tar();
    std::fs::create_dir(dir.path().join("abc")).unwrap();
    std::fs::write(dir.path().join("abc/layer.tar"), &tar).unwrap();
    let cfg = serde_json::json!({
        "architecture": Platform::host().architecture, "os": "linux",
        "config": {"Env": ["A=1"]},
        "rootfs": {"type": "layers", "diff_ids": [Digest::of(&tar).as_str()]},
    });
    std::fs::write(
        dir.path().join("cfg.json"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .unwrap();
    let m = serde_json::json!([{"Config": "cfg.json", "RepoTags": ["old:1"], "Layers": ["abc/layer.tar"]}]);
    std::fs::write(
        dir.path().join("manifest.json"),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    let (_d, s) = store();
    let (rec, tag) = import_blocking(&s, dir.path(), &Platform::host()).unwrap();
    assert_eq!(tag.as_deref(), Some("old:1"));
    assert_eq!(rec.run.env, Some(vec!["A=1".to_string()]));
    assert!(s.layer_path(&rec.layers[0]).join("etc/hi").is_file());

    // A layer path out of the archive is refused.
    let m = serde_json::json!([{"Config": "cfg.json", "Layers": ["../../etc/passwd"]}]);
    std::fs::write(
        dir.path().join("manifest.json"),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    let (_d2, s2) = store();
    assert!(matches!(
        import_blocking(&s2, dir.path(), &Platform::host()).unwrap_err(),
        OciError::Invalid(_)
    ));
}
