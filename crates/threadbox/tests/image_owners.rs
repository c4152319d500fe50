//! An OCI image's file owners inside the sandbox, as in the image (issue 14, ADR 0175):
//! a layer's `/home/app` of uid 1000 is the image user's own home, writable by it (a
//! `touch`, a `pip install --user`-style write into its user site), what it makes is
//! its own; a root-owned directory of the image stays unwritable for it; a setuid-root
//! file of a layer is neither setuid inside nor on the host. On every tier, and in a fork
//! (whose disk is idmapped from its parent's range while its layers are mapped onto its
//! own, on the jail). The image is the suite's Debian rootfs plus one layer, imported
//! from an OCI layout (no registry needed). Waits have deadlines, no sleeps.

mod common;

use common::{each_tier, require_root, serial, Daemon};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
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

/// The layer over the rootfs: user `app` (1000:1000) in passwd and group, its home
/// `0700` and owned by it (with a `.profile` of its own), a root-owned `/opt/rootonly`,
/// and a setuid-root copy of `id`.
fn app_layer(rootfs: &Path) -> Vec<u8> {
    let mut passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap();
    passwd.push_str("app:x:1000:1000:App:/home/app:/bin/sh\n");
    let mut group = std::fs::read_to_string(rootfs.join("etc/group")).unwrap();
    group.push_str("app:x:1000:\n");
    let id = std::fs::read(rootfs.join("usr/bin/id")).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8], mode: u32, owner: u64, dir: bool| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(if dir {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        h.set_mode(mode);
        h.set_uid(owner);
        h.set_gid(owner);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    add("etc/passwd", passwd.as_bytes(), 0o644, 0, false);
    add("etc/group", group.as_bytes(), 0o644, 0, false);
    add("home/app", b"", 0o700, 1000, true);
    add("home/app/.profile", b"# app's\n", 0o644, 1000, false);
    add("opt/rootonly", b"", 0o755, 0, true);
    add("opt/rootonly/conf", b"root's\n", 0o644, 0, false);
    add("usr/local/bin/suid-id", &id, 0o4755, 0, false);
    b.into_inner().unwrap()
}

/// `sh -c script` in `sb` as `user` (`None`: the image's): (exit code, stdout, stderr).
fn sh(d: &Daemon, sb: &str, user: Option<&str>, script: &str) -> (i64, String, String) {
    let mut args = vec!["exec", sb, "--json"];
    if let Some(u) = user {
        args.extend(["--user", u]);
    }
    args.extend(["--", "sh", "-c", script]);
    let r = d.cli(&args).json();
    (
        r["exit_code"].as_i64().unwrap_or(-1),
        r["stdout"].as_str().unwrap_or("").to_string(),
        r["stderr"].as_str().unwrap_or("").to_string(),
    )
}

/// What must hold in every sandbox of the image (the parent and its fork alike).
fn owners_hold(d: &Daemon, sb: &str, tier: &str, touch: &str) {
    // The layer's owners, as in the image; the home is the image user's.
    let (code, out, err) = sh(
        d,
        sb,
        None,
        "id -un; stat -c '%n %U:%G %a' /home/app /home/app/.profile /opt/rootonly /etc/passwd",
    );
    assert_eq!(code, 0, "{tier}: {err}");
    assert_eq!(
        out,
        "app\n/home/app app:app 700\n/home/app/.profile app:app 644\n\
         /opt/rootonly root:root 755\n/etc/passwd root:root 644\n",
        "{tier}"
    );
    // `touch ~/x`, and what app makes is app's.
    let (code, out, err) = sh(
        d,
        sb,
        None,
        &format!(
            "cd && touch {touch} && echo more >> .profile && stat -c '%U:%G' {touch} .profile"
        ),
    );
    assert_eq!(
        (code, out.as_str()),
        (0, "app:app\napp:app\n"),
        "{tier}: {err}"
    );
    // A `pip install --user`-style write: a module in the user site, imported from it.
    let (code, out, err) = sh(
        d,
        sb,
        None,
        "python3 -c \"import os, site; p = site.getusersitepackages(); \
         os.makedirs(p, exist_ok=True); open(p + '/tbmod.py', 'w').write('X = 42')\" && \
         python3 -c 'import tbmod; print(tbmod.X, tbmod.__file__)'",
    );
    assert_eq!(code, 0, "{tier}: {err}");
    assert!(
        out.starts_with("42 /home/app/.local/lib/python3") && out.ends_with("/tbmod.py\n"),
        "{tier}: {out}"
    );
    // The image's root-owned files stay unwritable for app...
    for script in [
        "touch /opt/rootonly/mine",
        "echo x >> /opt/rootonly/conf",
        "echo x >> /etc/passwd",
    ] {
        let (code, _, err) = sh(d, sb, None, script);
        assert_ne!(code, 0, "{tier}: app could `{script}`");
        assert!(err.contains("Permission denied"), "{tier}: {script}: {err}");
    }
    // ...and the same probes as the sandbox's root succeed (so they can detect a write;
    // root owns the image's root-owned files inside, copied up into its own disk).
    let (code, _, err) = sh(
        d,
        sb,
        Some("root"),
        "touch /opt/rootonly/by-root && echo x >> /opt/rootonly/conf && rm /opt/rootonly/by-root",
    );
    assert_eq!(code, 0, "{tier}: root: {err}");
    // A setuid-root file of a layer: the bit is gone, and app running it stays app;
    // root running it shows that the probe reports the effective uid.
    let (code, out, err) = sh(
        d,
        sb,
        None,
        "stat -c '%U %a' /usr/local/bin/suid-id; /usr/local/bin/suid-id -u",
    );
    assert_eq!(
        (code, out.as_str()),
        (0, "root 755\n1000\n"),
        "{tier}: {err}"
    );
    let (_, out, _) = sh(d, sb, Some("root"), "/usr/local/bin/suid-id -u");
    assert_eq!(out, "0\n", "{tier}");
}

#[test]
fn the_image_user_owns_its_home_and_the_images_root_files_stay_roots() {
    if !require_root("the_image_user_owns_its_home_and_the_images_root_files_stay_roots") {
        return;
    }
    let Some(rootfs) = rootfs() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "no Debian rootfs and CI is set (scripts/test.sh makes target/test-rootfs/debian)"
        );
        eprintln!("skipped: no Debian rootfs (scripts/test.sh makes target/test-rootfs/debian)");
        return;
    };
    let _s = serial();
    let lay = tempfile::tempdir().unwrap();
    let mut w = LayoutWriter::create(lay.path()).unwrap();
    let layers = vec![
        LayerBlob::plain(tar_dir(&rootfs).unwrap()),
        LayerBlob::plain(app_layer(&rootfs)),
    ];
    let config = serde_json::json!({
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
        "User": "app",
    });
    let img = w.image(&Platform::host(), &layers, config).unwrap();
    w.tag("app", &img).unwrap();
    drop(layers);
    let layout = lay.path().to_str().unwrap().to_string();

    each_tier(&[], |d, tier| {
        d.cli(&["image", "import", &layout, "--name", "app"]).ok();
        // On the host: the store is root's alone (its files carry the image's uids, which
        // are host users' too), the home is stored as uid 1000, the setuid bit is gone.
        let store = d.root_path().join("oci");
        let mode = std::fs::metadata(&store).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700, "{tier}: the layer store is {mode:o}");
        let mut homes = 0;
        for l in std::fs::read_dir(store.join("layers")).unwrap() {
            let l = l.unwrap().path();
            if let Ok(m) = std::fs::symlink_metadata(l.join("home/app")) {
                assert_eq!((m.uid(), m.gid()), (1000, 1000), "{tier}");
                homes += 1;
            }
            if let Ok(m) = std::fs::symlink_metadata(l.join("usr/local/bin/suid-id")) {
                assert_eq!((m.uid(), m.mode() & 0o7777), (0, 0o755), "{tier}");
            }
            if let Ok(m) = std::fs::symlink_metadata(l.join("usr/bin/su")) {
                assert_eq!(m.mode() & 0o6000, 0, "{tier}: su keeps a setuid bit");
            }
        }
        assert_eq!(homes, 1, "{tier}");

        let sb = d.create(&["--image", "app", "--tier", tier, "--name", "own"]);
        owners_hold(&d, &sb, tier, "x");

        // A fork: the parent's files, the same owners, writable by app again.
        let mut fork = vec!["fork", "own", "--name-prefix", "kid", "--json"];
        if tier == "gvisor" {
            fork.push("--disk-only");
        }
        let out = d.cli(&fork).ok().json();
        let kid = out["sandboxes"][0]["id"].as_str().unwrap_or("").to_string();
        assert!(!kid.is_empty(), "{tier}: {out}");
        let (code, out, err) = sh(&d, &kid, None, "cd && stat -c '%U:%G' x && cat .profile");
        assert_eq!(
            (code, out.as_str()),
            (0, "app:app\n# app's\nmore\n"),
            "{tier}: {err}"
        );
        owners_hold(&d, &kid, tier, "y");

        for id in [&kid, &sb] {
            d.cli(&["rm", "--force", id]).ok();
        }
        d.cli(&["image", "rm", "app"]).ok();
    });
}
