//! Unpacking one layer (a tar, plain, gzip or zstd) into a directory in overlayfs's
//! format, safely (ADR 0106):
//!
//! - OCI whiteouts become overlayfs ones: `.wh.NAME` → a character device 0/0 named
//!   `NAME`; `.wh..wh..opq` → `trusted.overlay.opaque=y` on its directory.
//! - Every write goes through [`threadbox_sys::fs::tree`]: directories are reached from the
//!   layer's root with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, entries made with `*at`
//!   calls. An entry whose path has a `..` component, or whose parent is a symlink (an
//!   earlier entry of the same archive), or a hard link to a path outside the layer, is
//!   refused and the whole layer with it.
//! - No device nodes (skipped and counted); setuid, setgid and sticky bits are cleared on
//!   files (a directory keeps its sticky bit: `/tmp`); the overlay is `nosuid` as well.
//! - Ownership: by default every entry keeps the image's own uid and gid (0–65535; a
//!   larger id becomes 65534, the overflow id), as Docker stores them: the jail mounts each
//!   layer idmapped onto the sandbox's range, so they show inside as in the image (ADR
//!   0175). [`Ownership::Root`] flattens everything to host root (how layers were stored
//!   before); [`Ownership::Shift`] maps the image's ids onto one host range.
//! - The uncompressed stream is hashed on the way: the caller compares it with the
//!   config's `diff_id`.

use crate::digest::{Digest, HashReader};
use crate::error::{OciError, Result};
use std::ffi::CString;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};
use threadbox_sys::fs::tree::{self, Tree};

/// Whose files the unpacked entries are on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ownership {
    /// The image's own ids: `n` below 65536 stays `n`; larger ids become 65534 (the
    /// overflow id). What the layer store keeps (ADR 0175): the ids are never a host
    /// user's inside a sandbox, since every lower is mounted idmapped onto its range.
    #[default]
    Image,
    /// All host root (uid and gid 0).
    Root,
    /// Image id `n` below 65536 becomes host id `base + n`; larger ids become `base +
    /// 65534` (the overflow id).
    Shift(u32),
}

impl Ownership {
    fn map(self, id: u64) -> u32 {
        match self {
            Ownership::Image => Ownership::Shift(0).map(id),
            Ownership::Root => 0,
            Ownership::Shift(base) => {
                base.saturating_add(if id < 65536 { id as u32 } else { 65534 })
            }
        }
    }
}

/// What an unpack did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpackReport {
    /// The digest and size of the uncompressed tar (the layer's `diff_id`).
    pub diff_id: Option<Digest>,
    pub tar_bytes: u64,
    pub entries: u64,
    pub whiteouts: u64,
    pub opaque_dirs: u64,
    /// Device nodes and unknown entry types left out.
    pub skipped: u64,
    /// Files whose setuid/setgid bits were cleared.
    pub suid_cleared: u64,
}

/// The compression of a blob, by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    pub fn sniff(head: &[u8]) -> Compression {
        if head.starts_with(&[0x1f, 0x8b]) {
            Compression::Gzip
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// The decompressed stream of a layer blob file.
pub fn decompressed(blob: File) -> Result<Box<dyn Read + Send>> {
    decompress(blob)
}

/// The decompressed stream of a layer blob read from `r` (a file, or the body of a blob
/// as it arrives), its compression told by its first bytes.
pub fn decompress<'a, R: Read + Send + 'a>(mut r: R) -> Result<Box<dyn Read + Send + 'a>> {
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < head.len() {
        let n = r
            .read(&mut head[got..])
            .map_err(|e| OciError::io("read layer", e))?;
        if n == 0 {
            break;
        }
        got += n;
    }
    let kind = Compression::sniff(&head[..got]);
    // The sniffed bytes are put back in front: `r` need not be seekable.
    let r = BufReader::with_capacity(256 * 1024, io::Cursor::new(head[..got].to_vec()).chain(r));
    Ok(match kind {
        Compression::None => Box::new(r),
        // The bufread decoder reads straight from our buffer (the read one adds another).
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(r)),
        Compression::Zstd => Box::new(
            ruzstd::decoding::StreamingDecoder::new(r)
                .map_err(|e| OciError::Integrity(format!("zstd layer: {e}")))?,
        ),
    })
}

/// The path of an entry inside the layer: relative, normal components only. `None` for
/// the root itself (`./`). A `..` component or anything odd is refused.
fn entry_path(layer: &str, raw: &Path) -> Result<Option<PathBuf>> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(OciError::Hostile {
                    layer: layer.into(),
                    what: format!("entry {raw:?} has a `..` component"),
                })
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

fn hostile(layer: &str, path: &Path, e: io::Error) -> OciError {
    let what = match e.raw_os_error() {
        Some(libc::ELOOP) | Some(libc::EXDEV) => {
            format!(
                "entry {path:?} goes through a symlink (refused: it could lead out of the layer)"
            )
        }
        _ => format!("entry {path:?}: {e}"),
    };
    OciError::Hostile {
        layer: layer.into(),
        what,
    }
}

/// Unpacks the tar stream `r` into the existing, empty directory `dir`. Nothing is synced:
/// the store syncs a layer once, before the rename that publishes it.
pub fn unpack(layer: &str, r: impl Read, dir: &Path, own: Ownership) -> Result<UnpackReport> {
    let t = Tree::open(dir).map_err(|e| OciError::io(format!("open {}", dir.display()), e))?;
    let mut hr = HashReader::new(r);
    let mut rep = UnpackReport::default();
    {
        let mut ar = tar::Archive::new(&mut hr);
        let entries = ar
            .entries()
            .map_err(|e| OciError::Integrity(format!("layer {layer}: not a tar: {e}")))?;
        for e in entries {
            let mut e =
                e.map_err(|e| OciError::Integrity(format!("layer {layer}: bad tar entry: {e}")))?;
            let raw = e
                .path()
                .map_err(|err| OciError::Integrity(format!("layer {layer}: bad path: {err}")))?
                .into_owned();
            rep.entries += 1;
            let Some(path) = entry_path(layer, &raw)? else {
                continue; // `./` itself: the layer's root exists
            };
            write_entry(layer, &t, &mut e, &path, own, &mut rep).map_err(|err| match err {
                OciError::Io { source, .. } => hostile(layer, &path, source),
                other => other,
            })?;
        }
    }
    let (d, n) = hr
        .finish()
        .map_err(|e| OciError::Integrity(format!("layer {layer}: {e}")))?;
    rep.diff_id = Some(d);
    rep.tar_bytes = n;
    Ok(rep)
}

fn io(e: io::Error) -> OciError {
    OciError::io("unpack", e)
}

fn write_entry<R: Read>(
    layer: &str,
    t: &Tree,
    e: &mut tar::Entry<'_, R>,
    path: &Path,
    own: Ownership,
    rep: &mut UnpackReport,
) -> Result<()> {
    let parent = path.parent().unwrap_or(Path::new(""));
    let base = path.file_name().unwrap_or_default();
    let bname = base.as_bytes();
    let h = e.header();
    let mode = h.mode().unwrap_or(0o644);
    let uid = own.map(h.uid().unwrap_or(0));
    let gid = own.map(h.gid().unwrap_or(0));
    let mtime = h.mtime().unwrap_or(0);
    let kind = h.entry_type();

    // Whiteouts: names overlayfs never sees, turned into its own markers.
    if let Some(rest) = bname.strip_prefix(b".wh.") {
        let d = t.dir(parent, Some(0o755)).map_err(io)?;
        if rest == b".wh..opq" {
            let f = t.open_dir(parent).map_err(io)?;
            tree::set_xattr(&f, "trusted.overlay.opaque", b"y").map_err(io)?;
            rep.opaque_dirs += 1;
        } else if rest.starts_with(b".wh.") || rest.is_empty() {
            rep.skipped += 1; // other AUFS metadata (`.wh..wh.plnk`): meaningless here
        } else {
            let n = tree::name(std::ffi::OsStr::from_bytes(rest)).map_err(io)?;
            tree::remove(d.as_fd(), &n).map_err(io)?;
            tree::whiteout(d.as_fd(), &n).map_err(io)?;
            rep.whiteouts += 1;
        }
        return Ok(());
    }

    let d = t.dir(parent, Some(0o755)).map_err(io)?;
    let n: CString = tree::name(base).map_err(io)?;
    let existing = tree::lstat(d.as_fd(), &n).map_err(io)?;
    use tar::EntryType as T;
    match kind {
        T::Directory => {
            match existing {
                Some(st) if st.is_dir() => {}
                Some(_) => {
                    tree::remove(d.as_fd(), &n).map_err(io)?;
                    tree::mkdir(d.as_fd(), &n, 0o700).map_err(io)?;
                }
                None => tree::mkdir(d.as_fd(), &n, 0o700).map_err(io)?,
            }
            let f = tree::open_child_dir(d.as_fd(), &n).map_err(io)?;
            tree::chown(d.as_fd(), &n, uid, gid).map_err(io)?;
            // A directory keeps its sticky bit (`/tmp`); setuid/setgid mean nothing on it.
            f.set_permissions(PermissionsExt::from_mode(mode & 0o1777))
                .map_err(io)?;
        }
        T::Regular | T::Continuous | T::GNUSparse => {
            if existing.is_some() {
                tree::remove(d.as_fd(), &n).map_err(io)?;
            }
            let mut f = tree::create_file(d.as_fd(), &n, 0o600).map_err(io)?;
            io::copy(e, &mut f)
                .map_err(|err| OciError::Integrity(format!("layer {layer}: {path:?}: {err}")))?;
            tree::chown(d.as_fd(), &n, uid, gid).map_err(io)?;
            if mode & 0o6000 != 0 {
                rep.suid_cleared += 1;
            }
            // chown cleared setuid anyway; the mode is set after it, without the bits.
            f.set_permissions(PermissionsExt::from_mode(mode & 0o777))
                .map_err(io)?;
            let _ = f.set_modified(UNIX_EPOCH + Duration::from_secs(mtime));
        }
        T::Symlink => {
            let target = e
                .link_name_bytes()
                .ok_or_else(|| {
                    OciError::Integrity(format!("layer {layer}: {path:?}: symlink without target"))
                })?
                .into_owned();
            if existing.is_some() {
                tree::remove(d.as_fd(), &n).map_err(io)?;
            }
            // Stored as written: it is resolved later inside the sandbox, never here.
            tree::symlink(d.as_fd(), &n, &target).map_err(io)?;
            tree::chown(d.as_fd(), &n, uid, gid).map_err(io)?;
        }
        T::Link => {
            let raw = e
                .link_name()
                .map_err(|err| OciError::Integrity(format!("layer {layer}: {path:?}: {err}")))?
                .ok_or_else(|| {
                    OciError::Integrity(format!(
                        "layer {layer}: {path:?}: hard link without target"
                    ))
                })?
                .into_owned();
            let Some(target) = entry_path(layer, &raw)? else {
                return Err(OciError::Hostile {
                    layer: layer.into(),
                    what: format!("hard link {path:?} to the layer's root"),
                });
            };
            if target == path {
                return Ok(());
            }
            if existing.is_some() {
                tree::remove(d.as_fd(), &n).map_err(io)?;
            }
            t.hardlink(&target, d.as_fd(), &n).map_err(io)?;
        }
        T::Fifo => {
            if existing.is_some() {
                tree::remove(d.as_fd(), &n).map_err(io)?;
            }
            tree::fifo(d.as_fd(), &n, mode).map_err(io)?;
            tree::chown(d.as_fd(), &n, uid, gid).map_err(io)?;
        }
        // Devices would reach the host's hardware through a mount that allowed them; the
        // sandbox gets its own minimal /dev instead.
        T::Char | T::Block => rep.skipped += 1,
        _ => rep.skipped += 1,
    }
    Ok(())
}
