//! A directory tree written only beneath its root: the image layer unpacker's file system
//! calls (ADR 0106). Every directory is reached from the root's descriptor with `openat2`
//! and `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`, one component at a time,
//! and every entry is then made with a `*at` call in that directory and one name. So no
//! symlink (absolute, `..`, or planted by an earlier entry of the same archive) and no
//! `..` component can make a write land outside the tree: the kernel refuses the step.

use super::{openat2, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS};
use crate::fs::resolve::{open_subdir, remove_contents, stat_at, unlink_at, Stat};
use crate::raw;
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// `RESOLVE_NO_XDEV` (linux/openat2.h).
pub const RESOLVE_NO_XDEV: u64 = 0x01;
/// `RESOLVE_BENEATH` (linux/openat2.h): the walk may not leave the directory fd.
pub const RESOLVE_BENEATH: u64 = 0x08;

const BENEATH: u64 =
    RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;

/// One name of a directory, checked: not empty, no `/`, no NUL, not `.` or `..`.
pub fn name(n: &OsStr) -> io::Result<CString> {
    let b = n.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The root of a tree being written.
#[derive(Debug)]
pub struct Tree {
    root: OwnedFd,
}

impl Tree {
    /// Opens the existing directory `path` as the tree's root.
    pub fn open(path: &Path) -> io::Result<Tree> {
        let root = openat2(None, path, libc::O_PATH | libc::O_DIRECTORY, 0, 0)?;
        Ok(Tree { root })
    }

    pub fn root(&self) -> BorrowedFd<'_> {
        self.root.as_fd()
    }

    /// The directory `rel` (relative, normal components only; empty is the root) as an
    /// `O_PATH` descriptor. With `create`, missing directories are made with that mode
    /// (the umask applies; callers set modes afterwards). A component that is a symlink or
    /// not a directory is an error (`ELOOP`, `ENOTDIR`), never followed or replaced.
    pub fn dir(&self, rel: &Path, create: Option<u32>) -> io::Result<OwnedFd> {
        let mut cur = openat2(
            Some(self.root.as_fd()),
            Path::new("."),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            BENEATH,
        )?;
        for c in rel.components() {
            let n = match c {
                Component::Normal(n) => n,
                Component::CurDir => continue,
                _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
            };
            let cn = name(n)?;
            let step = |cur: &OwnedFd| {
                openat2(
                    Some(cur.as_fd()),
                    Path::new(n),
                    libc::O_PATH | libc::O_DIRECTORY,
                    0,
                    BENEATH,
                )
            };
            cur = match step(&cur) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) && create.is_some() => {
                    match raw::fs::mkdirat(cur.as_fd(), &cn, create.unwrap_or(0o755)) {
                        Err(e) if e.raw_os_error() != Some(libc::EEXIST) => return Err(e),
                        _ => step(&cur)?,
                    }
                }
                other => other?,
            };
        }
        Ok(cur)
    }

    /// The directory `rel` opened for reading (for its extended attributes and mode).
    pub fn open_dir(&self, rel: &Path) -> io::Result<File> {
        let p = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        for c in p.components() {
            if !matches!(c, Component::Normal(_) | Component::CurDir) {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
        }
        openat2(
            Some(self.root.as_fd()),
            p,
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
            BENEATH,
        )
        .map(File::from)
    }

    /// Syncs the file system holding the tree.
    pub fn sync(&self) -> io::Result<()> {
        let fd = self.open_dir(Path::new(""))?;
        raw::tree::syncfs(fd.as_fd())
    }

    /// Makes the hard link `dir/name` to the tree's entry `target` (relative; reached like
    /// [`Tree::dir`], and the last component itself is not followed if it is a symlink).
    pub fn hardlink(&self, target: &Path, dir: BorrowedFd<'_>, name_: &CStr) -> io::Result<()> {
        let last = match target.components().next_back() {
            Some(Component::Normal(n)) => name(n)?,
            _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        };
        let parent = target.parent().unwrap_or(Path::new(""));
        let tdir = self.dir(parent, None)?;
        raw::tree::linkat(tdir.as_fd(), &last, dir, name_, 0)
    }
}

/// What is at `dir/name`, not following a symlink; `None` when nothing is.
pub fn lstat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Option<Stat>> {
    match stat_at(dir, name) {
        Ok(st) => Ok(Some(st)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Removes `dir/name` whatever it is (a directory with everything in it, never following
/// a symlink). Nothing there is not an error.
pub fn remove(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    match lstat(dir, name)? {
        None => Ok(()),
        Some(st) if st.is_dir() => {
            let sub = open_subdir(dir, name)?;
            remove_contents(sub.as_fd())?;
            unlink_at(dir, name, true)
        }
        Some(_) => unlink_at(dir, name, false),
    }
}

/// Creates the regular file `dir/name` (it must not exist; a symlink there is not
/// followed) for writing.
pub fn create_file(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<File> {
    raw::fd::openat_mode(
        dir.as_raw_fd(),
        name,
        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        mode,
    )
    .map(File::from)
}

/// `mkdirat(dir, name, mode)`.
pub fn mkdir(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    raw::fs::mkdirat(dir, name, mode)
}

/// Opens the directory `dir/name` for reading, not following a symlink.
pub fn open_child_dir(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<File> {
    open_subdir(dir, name).map(File::from)
}

/// `symlinkat(target, dir, name)`: the target is stored, never resolved here.
pub fn symlink(dir: BorrowedFd<'_>, name: &CStr, target: &[u8]) -> io::Result<()> {
    let t = CString::new(target).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    raw::tree::symlinkat(&t, dir, name)
}

/// An overlayfs whiteout: a character device 0/0.
pub fn whiteout(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    raw::tree::mknodat(dir, name, libc::S_IFCHR, 0)
}

/// A named pipe.
pub fn fifo(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    raw::tree::mknodat(dir, name, libc::S_IFIFO | (mode & 0o777), 0)
}

/// `fchownat(dir, name, uid, gid, AT_SYMLINK_NOFOLLOW)`.
pub fn chown(dir: BorrowedFd<'_>, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    raw::tree::fchownat(dir, name, uid, gid, libc::AT_SYMLINK_NOFOLLOW)
}

/// `FS_TOPDIR_FL` (linux/fs.h, `chattr +T`).
const FS_TOPDIR_FL: libc::c_int = 0x0002_0000;

/// Marks the open directory `f` as the top of directory hierarchies for ext4's Orlov
/// allocator (`chattr +T`): each directory made in it is placed in a block group of its
/// own choosing, as a directory made in `/` is, instead of next to its parent. What an
/// image layer needs: a layer is a whole root file system, and next to its parent it
/// shares the block group where the previous layers' inodes were just freed, which a
/// journal-less ext4 then scans on every file it creates (ADR 0170). Other file systems
/// answer `ENOTTY`/`EOPNOTSUPP`/`EINVAL`: the caller treats this as a hint.
pub fn mark_top_dir(f: &File) -> io::Result<()> {
    let flags = raw::tree::get_inode_flags(f.as_fd())?;
    if flags & FS_TOPDIR_FL != 0 {
        return Ok(());
    }
    raw::tree::set_inode_flags(f.as_fd(), flags | FS_TOPDIR_FL)
}

/// Whether the open directory `f` carries the top-of-hierarchy flag of [`mark_top_dir`].
pub fn is_top_dir(f: &File) -> io::Result<bool> {
    Ok(raw::tree::get_inode_flags(f.as_fd())? & FS_TOPDIR_FL != 0)
}

/// Sets the extended attribute `key` of an open file or directory.
pub fn set_xattr(f: &File, key: &str, value: &[u8]) -> io::Result<()> {
    let k = CString::new(key).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    raw::tree::fsetxattr(f.as_fd(), &k, value)
}

/// The extended attribute `key` of an open file or directory, `None` when it has none.
pub fn get_xattr(f: &File, key: &str) -> io::Result<Option<Vec<u8>>> {
    let k = CString::new(key).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut buf = vec![0u8; 4096];
    match raw::tree::fgetxattr(f.as_fd(), &k, &mut buf) {
        Ok(n) => {
            buf.truncate(n);
            Ok(Some(buf))
        }
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "tb-tree-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        ));
        std::fs::create_dir_all(d.join("root")).unwrap();
        d
    }

    #[test]
    fn dir_never_follows_a_symlink_out() {
        let d = tmp();
        let t = Tree::open(&d.join("root")).unwrap();
        std::os::unix::fs::symlink(&d, d.join("root/abs")).unwrap();
        std::os::unix::fs::symlink("..", d.join("root/up")).unwrap();
        for p in ["abs/x", "up/x", "../x"] {
            let e = t.dir(Path::new(p), Some(0o755)).unwrap_err();
            assert!(
                matches!(e.raw_os_error(), Some(libc::ELOOP) | Some(libc::EINVAL)),
                "{p}: {e}"
            );
        }
        assert!(!d.join("x").exists());
        // The positive control: a plain path is made.
        t.dir(Path::new("a/b"), Some(0o755)).unwrap();
        assert!(d.join("root/a/b").is_dir());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
