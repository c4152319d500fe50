//! The one path resolver of the agent: every path a request names is resolved by the
//! kernel under the sandbox's root with `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`,
//! and every operation then acts on the descriptor that came back (`*at` calls with a
//! single component), never on a path string the kernel walks again.
//!
//! Why not lexical checks plus `std::fs`: a path walk by the kernel follows symlinks, and a
//! symlink planted in the sandbox can point through a magic link (`/proc/self/fd/N`,
//! `/proc/1/root`) to whatever that descriptor names — in the past, the host's own `/`
//! through a directory fd opened in the host's mount namespace. `RESOLVE_IN_ROOT` keeps
//! every step (`..` and absolute symlink targets included) under the root descriptor, and
//! `RESOLVE_NO_MAGICLINKS` refuses `/proc` magic links at any step, not only the last.
//!
//! `RESOLVE_NO_XDEV` is not used: a sandbox's root is several mounts (the overlay, `/tmp`,
//! `/dev/shm`, read-only binds) that the file API must cross. Kernel interface file
//! systems are refused by type on the opened descriptor instead (see
//! [`crate::fs::is_kernel_interface_fs`]).

use super::{openat2, RESOLVE_NO_MAGICLINKS};
use crate::raw;
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// `RESOLVE_IN_ROOT` (linux/openat2.h): `/` and `..` stop at the directory fd.
pub const RESOLVE_IN_ROOT: u64 = 0x10;

/// What the resolver may follow; test builds can weaken it (positive controls).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolve(u64);

impl Resolve {
    /// The production setting: in root, no magic links.
    pub const STRICT: Resolve = Resolve(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS);
    /// No restriction at all (only for the security suite's weakened builds).
    pub const NONE: Resolve = Resolve(0);
}

/// A directory every path is resolved under (the sandbox's `/` for the agent).
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    resolve: Resolve,
}

/// Metadata of one file, from `fstatat`/`fstat` (symlinks are not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub mtime: i64,
}

impl Stat {
    fn from_raw(st: &libc::stat) -> Stat {
        Stat {
            mode: st.st_mode,
            uid: st.st_uid,
            gid: st.st_gid,
            size: st.st_size.max(0) as u64,
            mtime: st.st_mtime,
        }
    }
    fn fmt(&self) -> u32 {
        self.mode & libc::S_IFMT
    }
    pub fn is_dir(&self) -> bool {
        self.fmt() == libc::S_IFDIR
    }
    pub fn is_file(&self) -> bool {
        self.fmt() == libc::S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.fmt() == libc::S_IFLNK
    }
}

fn cname(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A directory and one name in it: where an operation on a path really happens.
#[derive(Debug)]
pub struct Entry {
    pub dir: OwnedFd,
    pub name: CString,
}

impl Root {
    /// Opens `path` (normally `/` of the agent, i.e. the sandbox's root) as the root.
    pub fn open(path: &Path, resolve: Resolve) -> io::Result<Root> {
        let fd = openat2(None, path, libc::O_PATH | libc::O_DIRECTORY, 0, 0)?;
        Ok(Root { fd, resolve })
    }

    pub fn resolve_flags(&self) -> Resolve {
        self.resolve
    }

    /// Opens `path` (absolute or not: both are taken under the root) with `flags`.
    pub fn open_at(&self, path: &Path, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        let rel = relative(path);
        let mut tries = 0;
        loop {
            match openat2(Some(self.fd.as_fd()), &rel, flags, mode, self.resolve.0) {
                // A rename elsewhere in the tree during a `..` step: the kernel asks for a
                // retry rather than risk a wrong answer.
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < 16 => tries += 1,
                other => return other,
            }
        }
    }

    /// A directory as an `O_PATH` handle (for `fchdir`, `*at` calls, `clone3` cwd).
    pub fn open_dir(&self, path: &Path) -> io::Result<OwnedFd> {
        self.open_at(path, libc::O_PATH | libc::O_DIRECTORY, 0)
    }

    /// The parent directory of `path` (resolved) and its last component. `/` has none:
    /// `EINVAL`. `path` must be normalised (no `.`/`..` components; the agent's lexical
    /// step ensures it), so the last component is a real name.
    pub fn entry(&self, path: &Path) -> io::Result<Entry> {
        let name = match path.components().next_back() {
            Some(Component::Normal(n)) => n,
            _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
        };
        let parent = path.parent().unwrap_or(Path::new("/"));
        Ok(Entry {
            dir: self.open_dir(parent)?,
            name: cname(name)?,
        })
    }

    /// Creates `path` and every missing parent, each step resolved under the root, each
    /// new directory made with `mkdirat` in a resolved parent (so a planted symlink can
    /// neither redirect nor be replaced by a directory outside).
    pub fn create_dir_all(&self, path: &Path, mode: u32) -> io::Result<()> {
        let mut prefix = PathBuf::from("/");
        let mut dir = self.open_dir(&prefix)?;
        for c in path.components() {
            let Component::Normal(name) = c else { continue };
            prefix.push(name);
            match self.open_dir(&prefix) {
                Ok(d) => dir = d,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    match mkdir_at(dir.as_fd(), &cname(name)?, mode) {
                        Ok(()) => {}
                        // Created meanwhile by someone else: fine, it is opened below.
                        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                        Err(e) => return Err(e),
                    }
                    dir = self.open_dir(&prefix)?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The path with its leading `/` removed (an empty path becomes `.`): under
/// `RESOLVE_IN_ROOT` both mean the same, and a relative path also stays beneath the root
/// in a weakened build without it.
fn relative(path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    if rel.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        rel.to_path_buf()
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Stat> {
    raw::fs::fstatat(dir, name, libc::AT_SYMLINK_NOFOLLOW).map(|st| Stat::from_raw(&st))
}

/// `fstat` of an open descriptor (an `O_PATH` one included).
pub fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<Stat> {
    raw::fs::fstat(fd).map(|st| Stat::from_raw(&st))
}

/// `mkdirat(dir, name, mode)` (the umask applies).
pub fn mkdir_at(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    raw::fs::mkdirat(dir, name, mode)
}

/// `unlinkat(dir, name, AT_REMOVEDIR when dir_entry)`.
pub fn unlink_at(dir: BorrowedFd<'_>, name: &CStr, dir_entry: bool) -> io::Result<()> {
    let flags = if dir_entry { libc::AT_REMOVEDIR } else { 0 };
    raw::fs::unlinkat(dir, name, flags)
}

/// `renameat(from_dir, from, to_dir, to)` (replaces an existing file, like rename(2)).
pub fn rename_at(
    from_dir: BorrowedFd<'_>,
    from: &CStr,
    to_dir: BorrowedFd<'_>,
    to: &CStr,
) -> io::Result<()> {
    raw::fs::renameat(from_dir, from, to_dir, to)
}

/// The target of the symlink `name` in `dir`.
pub fn readlink_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    let n = raw::fs::readlinkat(dir, name, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// Opens the entry `name` of `dir` as a directory for reading, not following a symlink
/// (`O_NOFOLLOW`): for the recursive removal, which must never leave the tree it removes.
pub fn open_subdir(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    raw::fd::openat(
        dir,
        name,
        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
    )
}

/// The names in the directory open on `fd` (an `O_RDONLY | O_DIRECTORY` descriptor),
/// from its start, without `.` and `..`, at most `max + 1` of them (so a caller can tell
/// "more than max").
pub fn read_dir(fd: BorrowedFd<'_>, max: usize) -> io::Result<Vec<CString>> {
    raw::fd::lseek(fd, 0, libc::SEEK_SET)?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = raw::fs::getdents64(fd, &mut buf)?;
        if n == 0 {
            return Ok(out);
        }
        let mut off = 0usize;
        // struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }
        while off + 19 <= n {
            let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
            if reclen < 19 || off + reclen > n {
                return Err(io::Error::other("malformed directory entry"));
            }
            let name_bytes = &buf[off + 19..off + reclen];
            let end = name_bytes
                .iter()
                .position(|b| *b == 0)
                .unwrap_or(name_bytes.len());
            let name = &name_bytes[..end];
            if name != b"." && name != b".." {
                out.push(
                    CString::new(name).map_err(|_| io::Error::other("NUL in a directory entry"))?,
                );
                if out.len() > max {
                    return Ok(out);
                }
            }
            off += reclen;
        }
    }
}

/// Removes everything inside the directory open on `dir` (an `O_RDONLY | O_DIRECTORY`
/// descriptor), depth first, never following a symlink: each subdirectory is opened with
/// `O_NOFOLLOW` from its parent's descriptor. All at once; [`RemoveContents`] does the
/// same walk in bounded steps.
pub fn remove_contents(dir: BorrowedFd<'_>) -> io::Result<()> {
    let mut walk = RemoveContents::new();
    while !walk.step(dir, 1024)? {}
    Ok(())
}

/// The walk of [`remove_contents`] cut into steps, so a single-threaded caller can do
/// other work (and change its filesystem identity) between them. Each step reads at most
/// `batch` names of the directory being emptied and removes them, or descends into the
/// first non-empty subdirectory, or removes an emptied one and goes up. Every call is
/// checked with the caller's identity at that moment; the walk keeps only descriptors.
#[derive(Debug, Default)]
pub struct RemoveContents {
    /// Descriptors of the directories being emptied, outermost first; bounded by depth.
    stack: Vec<OwnedFd>,
    /// The name of each of them in its parent.
    names: Vec<CString>,
}

impl RemoveContents {
    pub fn new() -> RemoveContents {
        RemoveContents::default()
    }

    /// One bounded step of emptying `dir` (the same descriptor on every call). Returns
    /// `true` once `dir` is empty.
    pub fn step(&mut self, dir: BorrowedFd<'_>, batch: usize) -> io::Result<bool> {
        let cur = self.stack.last().map(|d| d.as_fd()).unwrap_or(dir);
        // Each step reads the level again from its start: what is left, if anything.
        let entries = read_dir(cur, batch.max(1))?;
        for name in &entries {
            let st = match stat_at(cur, name) {
                Ok(st) => st,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            if st.is_dir() {
                match unlink_at(cur, name, true) {
                    Ok(()) => {}
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {
                        let sub = open_subdir(cur, name)?;
                        self.stack.push(sub);
                        self.names.push(name.clone());
                        return Ok(false);
                    }
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(e),
                }
            } else {
                match unlink_at(cur, name, false) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if !entries.is_empty() {
            return Ok(false);
        }
        // This level is empty: remove it from its parent and go up.
        match (self.stack.pop(), self.names.pop()) {
            (Some(done), Some(name)) => {
                drop(done);
                let parent = self.stack.last().map(|d| d.as_fd()).unwrap_or(dir);
                unlink_at(parent, &name, true)?;
                Ok(false)
            }
            _ => Ok(true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stepped walk empties a nested tree, never follows a symlink out of it, and
    /// takes more than one step when the tree is bigger than a batch.
    #[test]
    fn remove_contents_in_steps() {
        let base = std::env::temp_dir().join(format!("threadbox-sys-rm-{}", std::process::id()));
        let tree = base.join("tree");
        let outside = base.join("outside");
        std::fs::create_dir_all(tree.join("a/b/c")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        for i in 0..40 {
            std::fs::write(tree.join(format!("f{i}")), b"x").unwrap();
            std::fs::write(tree.join(format!("a/b/c/g{i}")), b"x").unwrap();
        }
        std::os::unix::fs::symlink(&outside, tree.join("a/link")).unwrap();
        let dir = std::fs::File::open(&tree).unwrap();
        let mut walk = RemoveContents::new();
        let mut steps = 0;
        while !walk.step(dir.as_fd(), 8).unwrap() {
            steps += 1;
            assert!(steps < 1000, "the walk does not end");
        }
        assert!(steps > 10, "bounded steps, got {steps}");
        assert_eq!(std::fs::read_dir(&tree).unwrap().count(), 0);
        assert!(outside.join("keep").exists(), "a symlink is not followed");
        std::fs::remove_dir_all(&base).unwrap();
    }
}
