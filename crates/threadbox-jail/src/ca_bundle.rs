//! The egress CA in the image's own bundle (issue 13 scope 4, ADR 0075): a sandbox with
//! secrets gets the image's `/etc/ssl/certs/ca-certificates.crt` plus the daemon's CA,
//! written on the host and bound read-only over the image's file at boot, so programs
//! that read only their defaults (curl without `--cacert`, Python's
//! `ssl.create_default_context()`, Go, OpenSSL) trust the intercepted hosts. Nothing is
//! written into a shared lower layer.

use std::path::{Path, PathBuf};
use threadbox_sys::jail::Bind;

/// Where the image's bundle is, inside the sandbox (Debian, Ubuntu, Alpine, the host image).
pub const IMAGE_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// A bundle larger than this is not an image's CA bundle.
const MAX_BUNDLE: u64 = 16 << 20;

/// The image's bundle: the topmost lower layer that has the path decides (an overlay
/// shows that one). `None` if none has it as a plain file reached through real
/// directories (a symlinked bundle, as on Fedora, keeps only the env variables).
fn image_bundle(lower: &[PathBuf]) -> Option<Vec<u8>> {
    for layer in lower {
        let mut p = layer.clone();
        let mut through_dirs = true;
        for part in ["etc", "ssl", "certs"] {
            p.push(part);
            match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return None,
                Err(_) => {
                    through_dirs = false;
                    break;
                }
            }
        }
        if !through_dirs {
            continue;
        }
        p.push("ca-certificates.crt");
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_file() && m.len() <= MAX_BUNDLE => return std::fs::read(&p).ok(),
            Ok(_) => return None,
            Err(_) => continue,
        }
    }
    None
}

/// Writes `run/ca-bundle.pem` (the image's bundle, then `ca`) and returns the bind of it
/// over [`IMAGE_BUNDLE`]; `None` (the env variables alone) when the image has no bundle
/// or it cannot be written.
pub fn bind(lower: &[PathBuf], ca: &str, run: &Path) -> Option<Bind> {
    let mut bundle = image_bundle(lower)?;
    if !bundle.is_empty() && !bundle.ends_with(b"\n") {
        bundle.push(b'\n');
    }
    bundle.extend_from_slice(ca.as_bytes());
    let source = run.join("ca-bundle.pem");
    if let Err(e) = std::fs::write(&source, &bundle) {
        tracing::warn!(
            "the egress CA bundle was not written ({}): {e}",
            source.display()
        );
        return None;
    }
    Some(Bind {
        source,
        target: IMAGE_BUNDLE.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_topmost_layer_with_a_plain_bundle_decides() {
        let top = tempfile::tempdir().unwrap();
        let low = tempfile::tempdir().unwrap();
        let run = tempfile::tempdir().unwrap();
        let certs = low.path().join("etc/ssl/certs");
        std::fs::create_dir_all(&certs).unwrap();
        std::fs::write(certs.join("ca-certificates.crt"), "IMAGE ROOTS").unwrap();
        let layers = vec![top.path().to_path_buf(), low.path().to_path_buf()];
        let b = bind(&layers, "OUR CA\n", run.path()).expect("a bind");
        assert_eq!(b.target, PathBuf::from(IMAGE_BUNDLE));
        assert_eq!(
            std::fs::read_to_string(&b.source).unwrap(),
            "IMAGE ROOTS\nOUR CA\n"
        );
        // A symlinked bundle in the top layer hides the lower one: no bind.
        let tcerts = top.path().join("etc/ssl/certs");
        std::fs::create_dir_all(&tcerts).unwrap();
        std::os::unix::fs::symlink("/etc/shadow", tcerts.join("ca-certificates.crt")).unwrap();
        assert!(bind(&layers, "OUR CA\n", run.path()).is_none());
        // No bundle anywhere: no bind.
        assert!(bind(&[run.path().to_path_buf()], "OUR CA\n", run.path()).is_none());
    }
}
