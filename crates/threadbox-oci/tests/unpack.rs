//! The unpacker against hand-made archives, hostile ones included: each case says what an
//! attacker's layer tries and checks that nothing outside the layer changed.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use threadbox_oci::unpack::{unpack, Ownership};
use threadbox_oci::OciError;

/// A tar entry written by hand: the name goes in verbatim (tar::Builder refuses `..`).
fn entry(out: &mut Vec<u8>, name: &str, kind: tar::EntryType, mode: u32, link: &str, data: &[u8]) {
    let mut h = tar::Header::new_ustar();
    {
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(1000);
    h.set_gid(1000);
    h.set_mtime(1_600_000_000);
    h.set_size(data.len() as u64);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    let pad = (512 - data.len() % 512) % 512;
    out.extend(std::iter::repeat_n(0u8, pad));
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    out.extend(std::iter::repeat_n(0u8, 1024));
    out
}

struct Dirs {
    _t: tempfile::TempDir,
    layer: std::path::PathBuf,
    outside: std::path::PathBuf,
}

fn dirs() -> Dirs {
    let t = tempfile::tempdir().unwrap();
    let layer = t.path().join("layer");
    let outside = t.path().join("outside");
    std::fs::create_dir(&layer).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("victim"), b"untouched").unwrap();
    Dirs {
        _t: t,
        layer,
        outside,
    }
}

fn outside_untouched(d: &Dirs) {
    let names: Vec<_> = std::fs::read_dir(&d.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("victim")]);
    assert_eq!(
        std::fs::read(d.outside.join("victim")).unwrap(),
        b"untouched"
    );
}

use tar::EntryType as T;

#[test]
fn a_plain_layer_unpacks_with_modes_links_and_root_ownership() {
    let d = dirs();
    let mut t = Vec::new();
    entry(&mut t, "./", T::Directory, 0o755, "", b"");
    entry(&mut t, "usr/", T::Directory, 0o755, "", b"");
    entry(&mut t, "usr/bin/", T::Directory, 0o755, "", b"");
    entry(
        &mut t,
        "usr/bin/tool",
        T::Regular,
        0o4755,
        "",
        b"#!/bin/sh\n",
    );
    entry(&mut t, "usr/bin/same", T::Link, 0o755, "usr/bin/tool", b"");
    entry(&mut t, "bin", T::Symlink, 0o777, "usr/bin", b"");
    entry(&mut t, "etc/abs", T::Symlink, 0o777, "/etc/passwd", b"");
    entry(&mut t, "tmp/", T::Directory, 0o1777, "", b"");
    entry(&mut t, "dev/sda", T::Block, 0o660, "", b"");
    entry(&mut t, "dev/null", T::Char, 0o666, "", b"");
    entry(&mut t, "run/pipe", T::Fifo, 0o600, "", b"");
    let rep = unpack("test", &finish(t)[..], &d.layer, Ownership::Root).unwrap();
    let tool = d.layer.join("usr/bin/tool");
    let m = std::fs::metadata(&tool).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o755, "setuid cleared");
    assert_eq!((m.uid(), m.gid()), (0, 0));
    assert_eq!(m.mtime(), 1_600_000_000);
    assert_eq!(m.nlink(), 2, "the hard link shares the inode");
    assert_eq!(
        std::fs::read_link(d.layer.join("bin")).unwrap(),
        Path::new("usr/bin")
    );
    assert_eq!(
        std::fs::read_link(d.layer.join("etc/abs")).unwrap(),
        Path::new("/etc/passwd")
    );
    let tmp = std::fs::metadata(d.layer.join("tmp")).unwrap();
    assert_eq!(tmp.permissions().mode() & 0o7777, 0o1777);
    assert!(!d.layer.join("dev/sda").exists() && !d.layer.join("dev/null").exists());
    assert!(std::fs::symlink_metadata(d.layer.join("run/pipe"))
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(rep.skipped, 2);
    assert_eq!(rep.suid_cleared, 1);
    assert!(rep.diff_id.is_some());
}

#[test]
fn ownership_can_be_shifted_into_a_range() {
    let d = dirs();
    let mut t = Vec::new();
    entry(&mut t, "home/app/file", T::Regular, 0o640, "", b"x");
    unpack(
        "test",
        &finish(t)[..],
        &d.layer,
        Ownership::Shift(2_000_000),
    )
    .unwrap();
    let m = std::fs::metadata(d.layer.join("home/app/file")).unwrap();
    assert_eq!((m.uid(), m.gid()), (2_001_000, 2_001_000));
}

#[test]
fn the_image_ids_are_kept_and_setuid_still_cleared() {
    // What the store keeps (ADR 0175): the tar's own ids, 0-65535, so that an idmapped
    // lower shows `/home/app` as its user's inside; a setuid-root file stays cleared.
    let d = dirs();
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, kind: tar::EntryType, mode: u32, uid: u64| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_size(0);
        h.set_cksum();
        b.append_data(&mut h, name, &b""[..]).unwrap();
    };
    add("home/app", T::Directory, 0o700, 1000);
    add("home/app/.profile", T::Regular, 0o644, 1000);
    add("opt/wide", T::Regular, 0o644, 70_000);
    add("opt/edge", T::Regular, 0o644, 65_535);
    add("usr/bin/su", T::Regular, 0o4755, 0);
    let tar = b.into_inner().unwrap();
    assert_eq!(Ownership::default(), Ownership::Image);
    let rep = unpack("test", &tar[..], &d.layer, Ownership::Image).unwrap();
    let ids = |p: &str| {
        let m = std::fs::symlink_metadata(d.layer.join(p)).unwrap();
        (m.uid(), m.gid(), m.mode() & 0o7777)
    };
    assert_eq!(ids("home/app"), (1000, 1000, 0o700));
    assert_eq!(ids("home/app/.profile"), (1000, 1000, 0o644));
    assert_eq!(
        ids("opt/wide"),
        (65534, 65534, 0o644),
        "past the range: overflow"
    );
    assert_eq!(ids("opt/edge"), (65535, 65535, 0o644));
    assert_eq!(ids("usr/bin/su"), (0, 0, 0o755), "setuid cleared");
    assert_eq!(rep.suid_cleared, 1);
    // The directories the tar did not list are host root's (the image's root, inside).
    assert_eq!(ids("home").0, 0);
}

#[test]
fn whiteouts_and_opaque_dirs_become_overlay_markers() {
    let d = dirs();
    let mut t = Vec::new();
    entry(&mut t, "etc/.wh.gone", T::Regular, 0o644, "", b"");
    entry(&mut t, "var/cache/.wh..wh..opq", T::Regular, 0o644, "", b"");
    entry(&mut t, "var/cache/kept", T::Regular, 0o644, "", b"k");
    entry(&mut t, ".wh..wh.plnk", T::Regular, 0o644, "", b"");
    let rep = unpack("test", &finish(t)[..], &d.layer, Ownership::Root).unwrap();
    let wh = std::fs::symlink_metadata(d.layer.join("etc/gone")).unwrap();
    assert!(wh.file_type().is_char_device());
    assert_eq!(wh.rdev(), 0);
    assert!(!d.layer.join("etc/.wh.gone").exists());
    let f = std::fs::File::open(d.layer.join("var/cache")).unwrap();
    assert_eq!(
        threadbox_sys::fs::tree::get_xattr(&f, "trusted.overlay.opaque").unwrap(),
        Some(b"y".to_vec())
    );
    assert_eq!((rep.whiteouts, rep.opaque_dirs, rep.skipped), (1, 1, 1));
}

fn refused(t: Vec<u8>) -> (Dirs, OciError) {
    let d = dirs();
    let e = unpack("evil", &finish(t)[..], &d.layer, Ownership::Root).unwrap_err();
    outside_untouched(&d);
    (d, e)
}

#[test]
fn dotdot_paths_are_refused() {
    let mut t = Vec::new();
    entry(&mut t, "../outside/victim", T::Regular, 0o644, "", b"pwned");
    let (_d, e) = refused(t);
    assert!(matches!(e, OciError::Hostile { .. }), "{e}");
    let mut t = Vec::new();
    entry(
        &mut t,
        "a/../../outside/new",
        T::Regular,
        0o644,
        "",
        b"pwned",
    );
    assert!(matches!(refused(t).1, OciError::Hostile { .. }));
}

#[test]
fn a_symlink_then_a_file_through_it_is_refused() {
    // The classic: `esc -> ../outside` (or an absolute path), then `esc/victim`.
    for target in ["../outside", "/"] {
        let d = dirs();
        let target = if target == "/" {
            d.outside.display().to_string()
        } else {
            target.to_string()
        };
        let mut t = Vec::new();
        entry(&mut t, "esc", T::Symlink, 0o777, &target, b"");
        entry(&mut t, "esc/victim", T::Regular, 0o644, "", b"pwned");
        let e = unpack("evil", &finish(t)[..], &d.layer, Ownership::Root).unwrap_err();
        assert!(matches!(e, OciError::Hostile { .. }), "{e}");
        outside_untouched(&d);
    }
}

#[test]
fn a_whiteout_through_a_symlink_is_refused() {
    let d = dirs();
    let mut t = Vec::new();
    entry(
        &mut t,
        "esc",
        T::Symlink,
        0o777,
        &d.outside.display().to_string(),
        b"",
    );
    entry(&mut t, "esc/.wh.victim", T::Regular, 0o644, "", b"");
    let e = unpack("evil", &finish(t)[..], &d.layer, Ownership::Root).unwrap_err();
    assert!(matches!(e, OciError::Hostile { .. }), "{e}");
    outside_untouched(&d);
}

#[test]
fn hard_links_cannot_reach_outside() {
    let d = dirs();
    // Through `..`, and through a symlink planted first.
    let mut t = Vec::new();
    entry(&mut t, "ln", T::Link, 0o644, "../outside/victim", b"");
    let e = unpack("evil", &finish(t)[..], &d.layer, Ownership::Root).unwrap_err();
    assert!(matches!(e, OciError::Hostile { .. }), "{e}");
    let d = dirs();
    let mut t = Vec::new();
    entry(
        &mut t,
        "esc",
        T::Symlink,
        0o777,
        &d.outside.display().to_string(),
        b"",
    );
    entry(&mut t, "ln", T::Link, 0o644, "esc/victim", b"");
    let e = unpack("evil", &finish(t)[..], &d.layer, Ownership::Root).unwrap_err();
    assert!(matches!(e, OciError::Hostile { .. }), "{e}");
    outside_untouched(&d);
    // Then writing through the link would change the victim: it must not exist.
    assert!(!d.layer.join("ln").exists());
}

#[test]
fn a_file_replaces_a_symlink_instead_of_writing_through_it() {
    let d = dirs();
    let mut t = Vec::new();
    entry(
        &mut t,
        "f",
        T::Symlink,
        0o777,
        &d.outside.join("victim").display().to_string(),
        b"",
    );
    entry(&mut t, "f", T::Regular, 0o644, "", b"new");
    unpack("test", &finish(t)[..], &d.layer, Ownership::Root).unwrap();
    assert_eq!(std::fs::read(d.layer.join("f")).unwrap(), b"new");
    assert!(!std::fs::symlink_metadata(d.layer.join("f"))
        .unwrap()
        .file_type()
        .is_symlink());
    outside_untouched(&d);
}

#[test]
fn gzip_and_zstd_layers_give_the_same_tree_and_diff_id() {
    let mut t = Vec::new();
    entry(&mut t, "a/b", T::Regular, 0o644, "", b"hello");
    let tar = finish(t);
    let plain = {
        let d = dirs();
        unpack("p", &tar[..], &d.layer, Ownership::Root)
            .unwrap()
            .diff_id
    };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("blob");
    std::fs::write(&p, &gz).unwrap();
    let d = dirs();
    let r = threadbox_oci::unpack::decompressed(std::fs::File::open(&p).unwrap()).unwrap();
    let rep = unpack("g", r, &d.layer, Ownership::Root).unwrap();
    assert_eq!(rep.diff_id, plain);
    assert_eq!(std::fs::read(d.layer.join("a/b")).unwrap(), b"hello");
}

#[test]
fn a_truncated_layer_is_an_error() {
    let mut t = Vec::new();
    entry(&mut t, "big", T::Regular, 0o644, "", &[7u8; 4000]);
    let tar = finish(t);
    let d = dirs();
    let e = unpack("t", &tar[..1500], &d.layer, Ownership::Root).unwrap_err();
    assert!(matches!(e, OciError::Integrity(_)), "{e}");
}
