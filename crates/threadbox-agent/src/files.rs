//! The file API. Every operation runs with the filesystem uid/gid of the requesting user
//! (so DAC applies as for that user and new files belong to them). A path is first
//! normalised lexically (absolute, no `.`/`..`, refused under /proc, /sys and /dev: a
//! clear error, not the defence), then resolved by the kernel under the sandbox root
//! (`threadbox_sys::resolve`: `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS` at every step),
//! and the operation acts on the descriptors that came back: `*at` calls on a resolved
//! parent with one name. Regular files are opened non-blocking (a FIFO cannot stall the
//! agent) and refused unless they are regular files outside kernel pseudo filesystems.

use crate::agent::{identity, Agent, Identity};
use crate::error::{AgentError, Result};
use std::ffi::{CStr, OsStr};
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use threadbox_agent::path::{self, PathError};
use threadbox_proto::{ErrorKind, FileInfo, FileKind, Response, RunAs};
use threadbox_sys::child as syschild;
use threadbox_sys::resolve::{self, Root, Stat};

/// Longest path accepted.
pub use threadbox_agent::path::MAX_PATH;
/// Most bytes one `FileRead` returns.
pub const MAX_READ: u64 = 4 * 1024 * 1024;
/// Most entries one `FileList` returns (beyond: an error, never a silent cut).
pub const MAX_LIST: usize = 50_000;
/// Directory entries handled between two yields of a long operation (remove, list).
const STEP_ENTRIES: usize = 256;
/// Bytes read between two yields of a large read.
const STEP_BYTES: usize = 256 * 1024;

/// Absolute (or relative to `home`), without `.`/`..`/empty components (see
/// [`threadbox_agent::path`]).
pub fn normalize<P: AsRef<[u8]> + ?Sized>(path: &P, home: &str) -> Result<PathBuf> {
    path::normalize(path, home).map_err(path_error)
}

/// [`normalize`] plus the refusal of kernel interfaces.
pub fn checked_path<P: AsRef<[u8]> + ?Sized>(path: &P, home: &str) -> Result<PathBuf> {
    path::checked(path, home).map_err(path_error)
}

fn path_error(e: PathError) -> AgentError {
    match e {
        PathError::Empty => AgentError::invalid("the path is empty"),
        PathError::Nul => AgentError::invalid("the path contains a NUL byte"),
        PathError::TooLong => {
            AgentError::invalid(format!("the path is longer than {MAX_PATH} bytes"))
        }
        PathError::Forbidden { path, root } => AgentError::new(
            ErrorKind::PermissionDenied,
            format!(
                "{}: {root} is not accessible through the file API",
                path.display()
            ),
        ),
    }
}

fn shown(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Runs `f` with the filesystem identity of `who`; restored when `f` returns.
fn as_user<T>(who: &Identity, f: impl FnOnce() -> Result<T>) -> Result<T> {
    if crate::testhooks::has("files-as-root") {
        return f();
    }
    let _guard = syschild::assume_fs_identity(who.uid, who.gid).map_err(|e| {
        AgentError::internal(format!("could not switch the file system identity: {e}"))
    })?;
    f()
}

/// Accepts `fd` only as a regular file outside kernel pseudo filesystems.
fn regular_file(fd: OwnedFd, p: &Path) -> Result<File> {
    let fs = syschild::fs_type(fd.as_fd()).map_err(|e| AgentError::io(&e, &shown(p)))?;
    if syschild::is_kernel_interface_fs(fs) && !crate::testhooks::has("files-follow") {
        return Err(AgentError::new(
            ErrorKind::PermissionDenied,
            format!("{}: leads into a kernel interface file system", shown(p)),
        ));
    }
    let file = File::from(fd);
    let meta = file.metadata().map_err(|e| AgentError::io(&e, &shown(p)))?;
    if meta.is_dir() {
        return Err(AgentError::new(
            ErrorKind::IsADirectory,
            format!("{}: is a directory", shown(p)),
        ));
    }
    if !meta.is_file() && !crate::testhooks::has("files-any-type") {
        return Err(AgentError::invalid(format!(
            "{}: not a regular file",
            shown(p)
        )));
    }
    Ok(file)
}

fn open(root: &Root, p: &Path, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    root.open_at(p, flags | libc::O_NONBLOCK | libc::O_NOCTTY, mode)
}

/// Opens as the user (DAC is checked at open), then reads in steps with a yield between
/// them, so a 4 MiB read does not hold the agent's only thread (ADR 0043).
pub async fn read(
    agent: &Agent,
    path: &[u8],
    user: RunAs,
    offset: u64,
    limit: Option<u64>,
) -> Result<Response> {
    crate::agent::check_identity(user)?;
    let who = identity(user);
    let p = checked_path(path, &who.home)?;
    let (file, size) = as_user(&who, || {
        let fd =
            open(&agent.root, &p, libc::O_RDONLY, 0).map_err(|e| AgentError::io(&e, &shown(&p)))?;
        let file = regular_file(fd, &p)?;
        let size = file
            .metadata()
            .map_err(|e| AgentError::io(&e, &shown(&p)))?
            .len();
        Ok((file, size))
    })?;
    let want = limit
        .unwrap_or(MAX_READ)
        .min(MAX_READ)
        .min(size.saturating_sub(offset)) as usize;
    let mut data = vec![0u8; want];
    let mut got = 0;
    while got < want {
        let end = want.min(got + STEP_BYTES);
        match file.read_at(&mut data[got..end], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(AgentError::io(&e, &shown(&p))),
        }
        if got < want {
            tokio::task::yield_now().await;
        }
    }
    data.truncate(got);
    let eof = offset + got as u64 >= size;
    Ok(Response::FileData { data, eof, size })
}

/// Opens (or creates) as the user, then writes in steps with a yield between them (a
/// frame may carry tens of MiB; ADR 0043). The descriptor needs no identity once open.
pub async fn write(
    agent: &Agent,
    path: &[u8],
    user: RunAs,
    data: &[u8],
    append: bool,
    mode: Option<u32>,
    make_parents: bool,
) -> Result<Response> {
    crate::agent::check_identity(user)?;
    let who = identity(user);
    let p = checked_path(path, &who.home)?;
    if p == Path::new("/") {
        return Err(AgentError::new(
            ErrorKind::IsADirectory,
            "/: is a directory",
        ));
    }
    // Only permission bits: no setuid/setgid/sticky through the API.
    let perm = mode.unwrap_or(0o644) & 0o777;
    let root = &agent.root;
    let (file, start) = as_user(&who, || {
        if make_parents {
            if let Some(parent) = p.parent() {
                root.create_dir_all(parent, 0o755)
                    .map_err(|e| AgentError::io(&e, &shown(parent)))?;
            }
        }
        let (fd, created) = match open(
            root,
            &p,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL,
            perm,
        ) {
            Ok(fd) => (fd, true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => (
                open(root, &p, libc::O_WRONLY, 0).map_err(|e| AgentError::io(&e, &shown(&p)))?,
                false,
            ),
            Err(e) => return Err(AgentError::io(&e, &shown(&p))),
        };
        let file = regular_file(fd, &p)?;
        let err = |e: std::io::Error| AgentError::io(&e, &shown(&p));
        if created || mode.is_some() {
            // The umask must not change what the caller asked for.
            file.set_permissions(std::fs::Permissions::from_mode(perm))
                .map_err(err)?;
        }
        let start = if append {
            file.metadata().map_err(err)?.len()
        } else {
            file.set_len(0).map_err(err)?;
            0
        };
        Ok((file, start))
    })?;
    let mut written = 0u64;
    for (i, chunk) in data.chunks(STEP_BYTES).enumerate() {
        if i > 0 {
            tokio::task::yield_now().await;
        }
        file.write_all_at(chunk, start + written)
            .map_err(|e| AgentError::io(&e, &shown(&p)))?;
        written += chunk.len() as u64;
    }
    Ok(Response::Done)
}

fn kind_of(st: &Stat) -> FileKind {
    if st.is_symlink() {
        FileKind::Symlink
    } else if st.is_dir() {
        FileKind::Dir
    } else if st.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// Names and paths go as the bytes they are (the protocol carries bytes that are not
/// UTF-8 as base64). `link` is the symlink's target when the entry is one (read by the
/// caller with `readlinkat` on the entry's resolved parent); it is shown lossily.
fn info(p: &Path, st: &Stat, link: Option<Vec<u8>>) -> FileInfo {
    FileInfo {
        name: p
            .file_name()
            .map(|n| n.as_bytes().into())
            .unwrap_or_else(|| "/".into()),
        path: p.as_os_str().as_bytes().into(),
        kind: kind_of(st),
        size: st.size,
        mode: st.mode & 0o7777,
        uid: st.uid,
        gid: st.gid,
        mtime: st.mtime,
        symlink_target: link.map(|t| String::from_utf8_lossy(&t).into_owned()),
    }
}

/// The metadata of `name` in `dir` (not following a symlink) and its target if a symlink.
fn entry_info(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &CStr,
    p: &Path,
) -> std::io::Result<FileInfo> {
    let st = resolve::stat_at(dir, name)?;
    let link = if st.is_symlink() {
        resolve::readlink_at(dir, name).ok()
    } else {
        None
    };
    Ok(info(p, &st, link))
}

/// Reads the names as the user, then stats them in steps (the identity taken for each
/// step, a yield between them: up to [`MAX_LIST`] entries, ADR 0043).
pub async fn list(agent: &Agent, path: &[u8], user: RunAs) -> Result<Response> {
    crate::agent::check_identity(user)?;
    let who = identity(user);
    let p = checked_path(path, &who.home)?;
    let err = |e: std::io::Error| AgentError::io(&e, &shown(&p));
    let (dir, names) = as_user(&who, || {
        let dir = agent
            .root
            .open_at(&p, libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map_err(err)?;
        refuse_kernel_fs(&dir, &p)?;
        let names = resolve::read_dir(dir.as_fd(), MAX_LIST).map_err(err)?;
        Ok((dir, names))
    })?;
    if names.len() > MAX_LIST {
        return Err(AgentError::invalid(format!(
            "{}: more than {MAX_LIST} entries; list a subdirectory",
            shown(&p)
        )));
    }
    let mut entries = Vec::with_capacity(names.len());
    for (i, chunk) in names.chunks(STEP_ENTRIES).enumerate() {
        if i > 0 {
            tokio::task::yield_now().await;
        }
        as_user(&who, || {
            for name in chunk {
                let child = p.join(OsStr::from_bytes(name.to_bytes()));
                // The entry may vanish between readdir and fstatat: skip it.
                if let Ok(fi) = entry_info(dir.as_fd(), name, &child) {
                    entries.push(fi);
                }
            }
            Ok(())
        })?;
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Response::FileList { entries })
}

/// Refuses a directory in a kernel interface file system (the lexical check keeps /proc,
/// /sys and /dev out; this keeps out whatever a symlink leads to).
fn refuse_kernel_fs(fd: &OwnedFd, p: &Path) -> Result<()> {
    let fs = syschild::fs_type(fd.as_fd()).map_err(|e| AgentError::io(&e, &shown(p)))?;
    if syschild::is_kernel_interface_fs(fs) && !crate::testhooks::has("files-follow") {
        return Err(AgentError::new(
            ErrorKind::PermissionDenied,
            format!("{}: leads into a kernel interface file system", shown(p)),
        ));
    }
    Ok(())
}

/// The resolved parent of `p` and its last name; `/` has none.
fn entry(root: &Root, p: &Path) -> Result<resolve::Entry> {
    let e = root
        .entry(p)
        .map_err(|e| AgentError::io(&e, &shown(p.parent().unwrap_or(Path::new("/")))))?;
    refuse_kernel_fs(&e.dir, p)?;
    Ok(e)
}

pub fn stat(agent: &Agent, path: &[u8], user: RunAs) -> Result<Response> {
    crate::agent::check_identity(user)?;
    let who = identity(user);
    let p = checked_path(path, &who.home)?;
    as_user(&who, || {
        let err = |e: std::io::Error| AgentError::io(&e, &shown(&p));
        if p == Path::new("/") {
            let fd = agent.root.open_dir(&p).map_err(err)?;
            let st = resolve::stat_fd(fd.as_fd()).map_err(err)?;
            return Ok(Response::FileStat(info(&p, &st, None)));
        }
        let e = entry(&agent.root, &p)?;
        let fi = entry_info(e.dir.as_fd(), &e.name, &p).map_err(err)?;
        Ok(Response::FileStat(fi))
    })
}

pub fn mkdir(agent: &Agent, path: &[u8], user: RunAs, parents: bool) -> Result<Response> {
    crate::agent::check_identity(user)?;
    let who = identity(user);
    let p = checked_path(path, &who.home)?;
    as_user(&who, || {
        let err = |e: std::io::Error| AgentError::io(&e, &shown(&p));
        if parents {
            agent.root.create_dir_all(&p, 0o755).map_err(err)?;
            return Ok(Response::Done);
        }
        if p == Path::new("/") {
            return Err(AgentError::new(
                ErrorKind::AlreadyExists,
                "/: already exists",
            ));
        }
        let e = entry(&agent.root, &p)?;
        resolve::mkdir_at(e.dir.as_fd(), &e.name, 0o755).map_err(err)?;
        Ok(Response::Done)
    })
}

/// Removes a file, symlink (not its target) or directory (`recursive` for a non-empty
/// one; the walk never follows symlinks and never leaves the directory it removes).
///
/// A recursive remove runs in bounded steps with a yield between them (ADR 0043): the
/// agent has one thread, and a large tree removed in one go would stall every other call
/// in the sandbox, exec timeouts and output pumping included. The filesystem identity is
/// taken for each step and given back before the yield, so other calls never run with it.
pub async fn remove(agent: &Agent, path: &[u8], user: RunAs, recursive: bool) -> Result<Response> {
    crate::agent::check_identity(user)?;
    let who = identity(user);
    let p = checked_path(path, &who.home)?;
    if p == Path::new("/") {
        return Err(AgentError::invalid("refusing to remove /"));
    }
    let err = |e: std::io::Error| AgentError::io(&e, &shown(&p));
    let walk = as_user(&who, || {
        let e = entry(&agent.root, &p)?;
        let st = resolve::stat_at(e.dir.as_fd(), &e.name).map_err(err)?;
        if !st.is_dir() {
            resolve::unlink_at(e.dir.as_fd(), &e.name, false).map_err(err)?;
            return Ok(None);
        }
        if !recursive {
            resolve::unlink_at(e.dir.as_fd(), &e.name, true).map_err(err)?;
            return Ok(None);
        }
        let sub = resolve::open_subdir(e.dir.as_fd(), &e.name).map_err(err)?;
        Ok(Some((e, sub)))
    })?;
    let Some((e, sub)) = walk else {
        return Ok(Response::Done);
    };
    let mut contents = resolve::RemoveContents::new();
    while !as_user(&who, || {
        contents.step(sub.as_fd(), STEP_ENTRIES).map_err(err)
    })? {
        tokio::task::yield_now().await;
    }
    drop(sub);
    as_user(&who, || {
        resolve::unlink_at(e.dir.as_fd(), &e.name, true).map_err(err)?;
        Ok(Response::Done)
    })
}

/// Renames within the sandbox (atomic on one file system; replaces an existing file).
pub fn rename(agent: &Agent, from: &[u8], to: &[u8], user: RunAs) -> Result<Response> {
    crate::agent::check_identity(user)?;
    let who = identity(user);
    let src = checked_path(from, &who.home)?;
    let dst = checked_path(to, &who.home)?;
    if src == Path::new("/") || dst == Path::new("/") {
        return Err(AgentError::invalid("cannot rename /"));
    }
    as_user(&who, || {
        let s = entry(&agent.root, &src)?;
        let d = entry(&agent.root, &dst)?;
        resolve::rename_at(s.dir.as_fd(), &s.name, d.dir.as_fd(), &d.name).map_err(|e| {
            let subject = format!("{} -> {}", shown(&src), shown(&dst));
            AgentError::io(&e, &subject)
        })?;
        Ok(Response::Done)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation() {
        let n = |p| normalize(p, "/home/user").unwrap();
        assert_eq!(n("a/b"), PathBuf::from("/home/user/a/b"));
        assert_eq!(n("/a/./b//c/"), PathBuf::from("/a/b/c"));
        assert_eq!(n("/../../etc"), PathBuf::from("/etc"));
        assert_eq!(n("../../../x"), PathBuf::from("/x"));
        assert_eq!(n("/"), PathBuf::from("/"));
    }

    #[test]
    fn refusals() {
        let kind = |p: &str| checked_path(p, "/home/user").unwrap_err().kind;
        assert_eq!(kind("/proc/1/mem"), ErrorKind::PermissionDenied);
        assert_eq!(kind("/home/../proc"), ErrorKind::PermissionDenied);
        assert_eq!(kind("../../sys/kernel"), ErrorKind::PermissionDenied);
        assert_eq!(kind("/dev"), ErrorKind::PermissionDenied);
        assert_eq!(kind("a\0b"), ErrorKind::InvalidArgument);
        assert_eq!(kind(""), ErrorKind::InvalidArgument);
        assert_eq!(kind(&"a".repeat(MAX_PATH + 1)), ErrorKind::InvalidArgument);
        // Only whole components count.
        assert!(checked_path("/processes", "/").is_ok());
        assert!(checked_path("/device/x", "/").is_ok());
    }
}
