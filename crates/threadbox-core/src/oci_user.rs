//! An OCI image config's `User` as the sandbox's default user (issue 14, ADR 0160):
//! `name`, `uid`, `name:group`, `uid:gid` (and mixes), resolved against the image's own
//! `/etc/passwd` and `/etc/group`, read from its layers on the host without following a
//! single symlink, and kept inside the sandbox's 65 536 ids.

use std::io::Read;
use std::path::{Path, PathBuf};
use threadbox_proto::RunAs;

/// The highest id of a sandbox's user namespace (`0 <base> 65536`): any id up to it maps
/// into the sandbox's own host range, never onto a host id outside it.
pub const MAX_NS_ID: u32 = 65_535;

/// At most this much of `/etc/passwd` or `/etc/group` is read.
const MAX_DB: u64 = 1 << 20;

/// The uid/gid an image's `User` names, as the agent takes it: `Root` for 0:0, an `Id`
/// otherwise. `Ok(None)`: the image names no user (empty or absent `User`).
pub fn resolve(
    spec: Option<&str>,
    passwd: Option<&str>,
    group: Option<&str>,
) -> Result<Option<RunAs>, String> {
    let Some(spec) = spec.map(str::trim).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let (u, g) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if u.is_empty() || g.is_some_and(str::is_empty) {
        return Err(format!(
            "the image's User {spec:?} is not name[:group] or uid[:gid]"
        ));
    }
    let entry = |pred: &dyn Fn(&[&str]) -> bool| -> Option<(u32, u32)> {
        passwd?.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 4 || !pred(&f) {
                return None;
            }
            Some((f[2].parse().ok()?, f[3].parse().ok()?))
        })
    };
    let (uid, primary) = match u.parse::<u32>() {
        // A number need not be listed; unlisted, its group is 0 (as Docker does).
        Ok(uid) => (uid, entry(&|f| f[2] == u).map_or(0, |(_, g)| g)),
        Err(_) => entry(&|f| f[0] == u).ok_or_else(|| {
            format!(
                "the image's User {spec:?}: no user {u:?} in the image's /etc/passwd{}",
                if passwd.is_none() {
                    " (it has none)"
                } else {
                    ""
                }
            )
        })?,
    };
    let gid = match g {
        None => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => group
                .and_then(|t| {
                    t.lines().find_map(|l| {
                        let f: Vec<&str> = l.split(':').collect();
                        (f.len() >= 3 && f[0] == g)
                            .then(|| f[2].parse().ok())
                            .flatten()
                    })
                })
                .ok_or_else(|| {
                    format!("the image's User {spec:?}: no group {g:?} in the image's /etc/group")
                })?,
        },
    };
    if uid > MAX_NS_ID || gid > MAX_NS_ID {
        return Err(format!(
            "the image's User {spec:?} is uid {uid}, gid {gid}: a sandbox has ids 0-{MAX_NS_ID} only"
        ));
    }
    Ok(Some(match (uid, gid) {
        (0, 0) => RunAs::Root,
        _ => RunAs::Id { uid, gid },
    }))
}

/// The file `rel` (e.g. `etc/passwd`) as the image's merged tree shows it: from the
/// topmost layer (of `layers`, topmost first) that has an entry there. A regular file is
/// read; anything else there (an overlay whiteout, a symlink, a directory), or a
/// non-directory on the way, hides the layers below and reads as absent. No symlink is
/// followed: a layer's `etc` linking to the host's cannot be read through.
pub fn read_merged(layers: &[PathBuf], rel: &str) -> std::io::Result<Option<String>> {
    let parts: Vec<&str> = rel.split('/').collect();
    for layer in layers {
        let mut at = layer.clone();
        let mut hidden = false;
        let mut found = None;
        for (i, part) in parts.iter().enumerate() {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) => return Err(e),
                Ok(m) if i + 1 < parts.len() => {
                    if !m.is_dir() {
                        hidden = true;
                        break;
                    }
                    if opaque(&at) {
                        // An opaque directory: nothing below this layer shows through.
                        hidden = true;
                        if !at.join(parts[i + 1..].join("/")).exists() {
                            break;
                        }
                    }
                }
                Ok(m) if m.is_file() => found = Some(read_beneath(layer, rel)?),
                Ok(_) => hidden = true,
            }
        }
        if found.is_some() {
            return Ok(found);
        }
        if hidden {
            return Ok(None);
        }
    }
    Ok(None)
}

fn opaque(dir: &Path) -> bool {
    std::fs::File::open(dir)
        .ok()
        .and_then(|f| threadbox_sys::fs::tree::get_xattr(&f, "trusted.overlay.opaque").ok())
        .flatten()
        .is_some_and(|v| v.first() == Some(&b'y'))
}

/// Reads `rel` under `root` with no symlink anywhere on the way (openat2
/// `RESOLVE_NO_SYMLINKS`), a regular file only, at most [`MAX_DB`] bytes.
fn read_beneath(root: &Path, rel: &str) -> std::io::Result<String> {
    let dir = threadbox_sys::fs::DirFd::open(root)?;
    let fd = dir.open_read(rel)?;
    let f = std::fs::File::from(fd);
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other(format!(
            "{rel} is not a regular file"
        )));
    }
    let mut text = String::new();
    f.take(MAX_DB).read_to_string(&mut text)?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\napp:x:1234:2345::/home/app:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nstaff:x:50:\napp:x:2345:\n";

    fn r(s: &str) -> Result<Option<RunAs>, String> {
        resolve(Some(s), Some(PASSWD), Some(GROUP))
    }

    #[test]
    fn names_and_numbers_resolve_against_the_images_files() {
        assert_eq!(
            r("app"),
            Ok(Some(RunAs::Id {
                uid: 1234,
                gid: 2345
            }))
        );
        assert_eq!(r("app:staff"), Ok(Some(RunAs::Id { uid: 1234, gid: 50 })));
        assert_eq!(
            r("1234"),
            Ok(Some(RunAs::Id {
                uid: 1234,
                gid: 2345
            }))
        );
        assert_eq!(r("4242"), Ok(Some(RunAs::Id { uid: 4242, gid: 0 })));
        assert_eq!(r("4242:7"), Ok(Some(RunAs::Id { uid: 4242, gid: 7 })));
        assert_eq!(r("root"), Ok(Some(RunAs::Root)));
        assert_eq!(r("0"), Ok(Some(RunAs::Root)));
        assert_eq!(r(""), Ok(None));
        assert_eq!(resolve(None, None, None), Ok(None));
    }

    #[test]
    fn what_cannot_be_resolved_or_leaves_the_range_is_refused() {
        assert!(r("nobody").unwrap_err().contains("no user \"nobody\""));
        assert!(r("app:wheel").unwrap_err().contains("no group \"wheel\""));
        assert!(r("65536").unwrap_err().contains("0-65535"));
        assert!(r("1:70000").unwrap_err().contains("0-65535"));
        assert!(r(":1").is_err());
        assert!(r("app:").is_err());
        assert!(resolve(Some("app"), None, None)
            .unwrap_err()
            .contains("it has none"));
    }

    #[test]
    fn the_topmost_layer_wins_and_symlinks_are_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let (top, mid, low) = (
            t.path().join("top"),
            t.path().join("mid"),
            t.path().join("low"),
        );
        for l in [&top, &mid, &low] {
            std::fs::create_dir_all(l.join("etc")).unwrap();
        }
        std::fs::write(low.join("etc/passwd"), "low").unwrap();
        std::fs::write(mid.join("etc/passwd"), "mid").unwrap();
        let layers = vec![top.clone(), mid.clone(), low.clone()];
        assert_eq!(
            read_merged(&layers, "etc/passwd").unwrap().as_deref(),
            Some("mid")
        );
        // A symlink on top hides the rest and is never read through.
        let secret = t.path().join("secret");
        std::fs::write(&secret, "host").unwrap();
        std::os::unix::fs::symlink(&secret, top.join("etc/passwd")).unwrap();
        assert_eq!(read_merged(&layers, "etc/passwd").unwrap(), None);
        std::fs::remove_file(top.join("etc/passwd")).unwrap();
        // A symlinked directory on the way as well.
        std::fs::remove_dir(top.join("etc")).unwrap();
        std::fs::create_dir(t.path().join("hostetc")).unwrap();
        std::fs::write(t.path().join("hostetc/passwd"), "host").unwrap();
        std::os::unix::fs::symlink(t.path().join("hostetc"), top.join("etc")).unwrap();
        assert_eq!(read_merged(&layers, "etc/passwd").unwrap(), None);
        std::fs::remove_file(top.join("etc")).unwrap();
        assert_eq!(
            read_merged(&layers, "etc/passwd").unwrap().as_deref(),
            Some("mid")
        );
    }
}
