//! The reflink store (ADR 0101): where `<root>/sandboxes` cannot share extents (ext4, as
//! on most hosts' roots), `serve` puts it on a sparse xfs image (`<root>/store.xfs`,
//! `mkfs.xfs -m reflink=1`) mounted on a loop device, so a checkpoint, rewind or fork
//! clones a sandbox's disk in O(1) instead of copying it.
//!
//! The mount lives in the host's mount namespace (ADR 0011 mounts each sandbox's disk in
//! its own): it is made before anything uses `sandboxes/`, found again after a crash
//! (same mount, or the same loop device when only a sandbox's namespace still holds it),
//! and unmounted at a clean shutdown when nothing uses it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use threadbox_core::error::{CoreError, Result};
use threadbox_sys::clonefile::{clone_file, CloneMethod};

/// The image's name under the root.
pub const STORE_IMAGE: &str = "store.xfs";
/// xfs refuses file systems below 300 MB; the log alone takes 64 MiB.
pub const MIN_STORE_BYTES: u64 = 1 << 30;

/// `serve --store-image`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    /// Mount the store image where `sandboxes/` cannot reflink (the default).
    Auto,
    /// Never: clones copy where the file system cannot reflink.
    Off,
}

impl std::str::FromStr for StoreMode {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(StoreMode::Auto),
            "off" => Ok(StoreMode::Off),
            _ => Err(format!("--store-image {s:?}: expected auto or off")),
        }
    }
}

/// What [`prepare`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// `sandboxes/` reflinks already (xfs, btrfs: the operator's own file system).
    Native,
    /// The store image is mounted on `sandboxes/` (`reused`: it was there already).
    Mounted { bytes: u64, reused: bool },
    /// Not used (`--store-image off`, or a reason logged as a warning): clones copy.
    Unused(String),
}

impl Store {
    /// Whether a clone of a sandbox's disk is a reflink.
    pub fn reflinks(&self) -> bool {
        !matches!(self, Store::Unused(_))
    }
}

fn err(what: impl std::fmt::Display) -> CoreError {
    CoreError::Internal(what.to_string())
}

fn sandboxes_dir(root: &Path) -> PathBuf {
    root.join("sandboxes")
}

/// Makes `<root>/sandboxes` able to reflink, unless `mode` is off: see the module's doc.
/// `bytes`: the image's size when it is made (default: the size of the file system
/// holding the root, so the store is never the smaller bound); a larger size than the
/// existing image's grows it.
pub fn prepare(root: &Path, mode: StoreMode, bytes: Option<u64>) -> Result<Store> {
    let dir = sandboxes_dir(root);
    std::fs::create_dir_all(&dir)?;
    let root = root.canonicalize()?;
    let dir = dir.canonicalize()?;
    let image = root.join(STORE_IMAGE);
    if let Some(m) = mount_at(&dir)? {
        if m.fstype == "xfs" && loop_backing(&m.source).as_deref() == Some(image.as_path()) {
            let have = std::fs::metadata(&image)?.len();
            let bytes = grow(&image, &m.source, &dir, have, bytes)?;
            return Ok(Store::Mounted {
                bytes,
                reused: true,
            });
        }
    }
    if mode == StoreMode::Off {
        return Ok(Store::Unused("--store-image off".into()));
    }
    if reflinks(&dir)? {
        return Ok(Store::Native);
    }
    if std::fs::read_dir(&dir)?.next().is_some() {
        return Ok(Store::Unused(format!(
            "{} already holds sandboxes on a file system that cannot reflink; the store \
             image is only made for an empty one",
            dir.display()
        )));
    }
    let made = !image.exists();
    if made {
        let size = match bytes {
            Some(b) => b,
            None => fs_bytes(&root)?,
        }
        .max(MIN_STORE_BYTES);
        match make_image(&image, size) {
            Ok(()) => {}
            // Without xfsprogs the daemon still runs; its clones copy.
            Err(MakeError::NoMkfs(why)) => return Ok(Store::Unused(why)),
            Err(MakeError::Other(e)) => return Err(e),
        }
    }
    // A loop device still backed by the image: a crash left the store mounted only in a
    // sandbox's namespace. Mount that device again (the same file system).
    let existing = find_loop(&image);
    if let Err(e) = threadbox_sys::jail::mount_store(&image, &dir, existing.as_deref()) {
        // No loop devices or no xfs in this kernel (a container, say): run without it.
        return Ok(Store::Unused(format!(
            "cannot mount {}: {e}",
            image.display()
        )));
    }
    let have = std::fs::metadata(&image)?.len();
    let bytes = match mount_at(&dir)? {
        Some(m) => grow(&image, &m.source, &dir, have, bytes)?,
        None => have,
    };
    Ok(Store::Mounted {
        bytes,
        reused: !made,
    })
}

/// At a clean shutdown: unmounts the store if [`prepare`] mounted one and nothing uses
/// it; a running sandbox's namespace keeps its own copy of the mount, which is why the
/// next [`prepare`] looks for the loop device too.
pub fn release(root: &Path) -> Result<bool> {
    let dir = sandboxes_dir(root).canonicalize()?;
    let image = root.canonicalize()?.join(STORE_IMAGE);
    match mount_at(&dir)? {
        Some(m) if loop_backing(&m.source).as_deref() == Some(image.as_path()) => {
            threadbox_sys::jail::unmount_store(&dir).map_err(err)
        }
        _ => Ok(false),
    }
}

/// Whether `dir`'s file system shares extents: a 4 KiB file cloned (a copy otherwise).
fn reflinks(dir: &Path) -> Result<bool> {
    let a = dir.join(format!(".reflink-probe-{}", std::process::id()));
    let b = a.with_extension("clone");
    let _ = std::fs::remove_file(&b);
    std::fs::write(&a, [0u8; 4096])?;
    let r = clone_file(&a, &b);
    let _ = std::fs::remove_file(&a);
    let _ = std::fs::remove_file(&b);
    Ok(r.map_err(err)? == CloneMethod::Reflink)
}

fn fs_bytes(path: &Path) -> Result<u64> {
    use std::os::fd::AsFd;
    let f = std::fs::File::open(path)?;
    Ok(threadbox_sys::fs::fs_total_bytes(f.as_fd())?)
}

enum MakeError {
    /// `mkfs.xfs` is not installed.
    NoMkfs(String),
    Other(CoreError),
}

impl<E: Into<CoreError>> From<E> for MakeError {
    fn from(e: E) -> Self {
        MakeError::Other(e.into())
    }
}

/// A sparse image formatted xfs with reflink, renamed into place once whole.
fn make_image(image: &Path, bytes: u64) -> std::result::Result<(), MakeError> {
    let tmp = image.with_extension("xfs.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::fs::File::create(&tmp)?.set_len(bytes)?;
    let out = Command::new("mkfs.xfs")
        .args(["-q", "-m", "reflink=1"])
        .arg(&tmp)
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(MakeError::NoMkfs(format!(
                "cannot run mkfs.xfs ({e}): install xfsprogs for instant checkpoints"
            )));
        }
    };
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(MakeError::Other(err(format!(
            "mkfs.xfs failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))));
    }
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, image)?;
    if let Some(parent) = image.parent() {
        if let Ok(d) = std::fs::File::open(parent) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Grows the mounted store to `want` when that is larger than `have`: the file, then the
/// loop device's capacity, then the file system. Answers the size it has.
fn grow(image: &Path, dev: &str, dir: &Path, have: u64, want: Option<u64>) -> Result<u64> {
    let Some(want) = want.filter(|w| *w > have) else {
        return Ok(have);
    };
    std::fs::OpenOptions::new()
        .write(true)
        .open(image)?
        .set_len(want)?;
    for (prog, args) in [
        ("losetup", vec!["-c".to_string(), dev.to_string()]),
        ("xfs_growfs", vec![dir.display().to_string()]),
    ] {
        let out = Command::new(prog)
            .args(&args)
            .output()
            .map_err(|e| err(format!("cannot run {prog}: {e}")))?;
        if !out.status.success() {
            return Err(err(format!(
                "{prog} failed growing the store: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
    }
    Ok(want)
}

struct MountEntry {
    fstype: String,
    source: String,
}

/// The topmost mount whose mount point is `dir` (canonical), from `/proc/self/mountinfo`.
fn mount_at(dir: &Path) -> Result<Option<MountEntry>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let want = dir.as_os_str().as_encoded_bytes();
    let mut found = None;
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(point), Some(fstype), Some(source)) =
            (fields.get(4), fields.get(sep + 1), fields.get(sep + 2))
        else {
            continue;
        };
        if unescape(point) == want {
            found = Some(MountEntry {
                fstype: fstype.to_string(),
                source: source.to_string(),
            });
        }
    }
    Ok(found)
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = std::str::from_utf8(&b[i + 1..i + 4]).ok();
            if let Some(v) = oct.and_then(|o| u8::from_str_radix(o, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// The backing file of loop device `dev` (`/dev/loopN`).
fn loop_backing(dev: &str) -> Option<PathBuf> {
    let name = dev.strip_prefix("/dev/")?;
    if !name.starts_with("loop") {
        return None;
    }
    let s = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(s.trim_end_matches('\n')))
}

/// A loop device whose backing file is `image` (same inode: paths can be renamed).
fn find_loop(image: &Path) -> Option<PathBuf> {
    let want = std::fs::metadata(image).ok()?;
    for e in std::fs::read_dir("/sys/block").ok()?.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with("loop") {
            continue;
        }
        let Some(back) = loop_backing(&format!("/dev/{name}")) else {
            continue;
        };
        let same =
            std::fs::metadata(&back).is_ok_and(|m| m.dev() == want.dev() && m.ino() == want.ino());
        if same {
            return Some(PathBuf::from(format!("/dev/{name}")));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape(r"/a\040b"), b"/a b");
        assert_eq!(unescape(r"/plain"), b"/plain");
        assert_eq!(unescape(r"/x\134"), b"/x\\");
    }

    #[test]
    fn modes_parse() {
        assert_eq!("auto".parse::<StoreMode>(), Ok(StoreMode::Auto));
        assert_eq!("off".parse::<StoreMode>(), Ok(StoreMode::Off));
        assert!("on".parse::<StoreMode>().is_err());
    }
}
