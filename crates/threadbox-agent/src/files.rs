//! The file API. Every operation runs with the filesystem uid/gid of the requesting user
//! (so DAC applies as for that user and new files belong to them), on a lexically
//! normalised path that is refused under /proc, /sys and /dev. Regular files are opened
//! with `openat2(RESOLVE_NO_MAGICLINKS)`, non-blocking (a FIFO cannot stall the agent),
//! and refused unless they are regular files outside kernel pseudo filesystems, so a
//! symlink planted in the sandbox cannot turn the API towards /proc or a device.

use crate::agent::{identity, Identity};
use crate::error::{AgentError, Result};
use std::fs::{File, Metadata};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use threadbox_agent::path::{self, PathError};
use threadbox_proto::{ErrorKind, FileInfo, FileKind, Response, RunAs};
use threadbox_sys::child::{self as syschild, openat2, RESOLVE_NO_MAGICLINKS};

/// Longest path accepted.
pub use threadbox_agent::path::MAX_PATH;
/// Most bytes one `FileRead` returns.
pub const MAX_READ: u64 = 4 * 1024 * 1024;
/// Most entries one `FileList` returns (beyond: an error, never a silent cut).
pub const MAX_LIST: usize = 50_000;

/// Absolute (or relative to `home`), without `.`/`..`/empty components (see
/// [`threadbox_agent::path`]).
pub fn normalize(path: &str, home: &str) -> Result<PathBuf> {
    path::normalize(path, home).map_err(path_error)
}

/// [`normalize`] plus the refusal of kernel interfaces.
pub fn checked_path(path: &str, home: &str) -> Result<PathBuf> {
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

fn open(p: &Path, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    openat2(
        None,
        p,
        flags | libc::O_NONBLOCK | libc::O_NOCTTY,
        mode,
        if crate::testhooks::has("files-follow") {
            0
        } else {
            RESOLVE_NO_MAGICLINKS
        },
    )
}

pub fn read(path: &str, user: RunAs, offset: u64, limit: Option<u64>) -> Result<Response> {
    let who = identity(user);
    let p = checked_path(path, who.home)?;
    as_user(&who, || {
        let fd = open(&p, libc::O_RDONLY, 0).map_err(|e| AgentError::io(&e, &shown(&p)))?;
        let file = regular_file(fd, &p)?;
        let size = file
            .metadata()
            .map_err(|e| AgentError::io(&e, &shown(&p)))?
            .len();
        let want = limit
            .unwrap_or(MAX_READ)
            .min(MAX_READ)
            .min(size.saturating_sub(offset)) as usize;
        let mut data = vec![0u8; want];
        let mut got = 0;
        while got < want {
            match file.read_at(&mut data[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(AgentError::io(&e, &shown(&p))),
            }
        }
        data.truncate(got);
        let eof = offset + got as u64 >= size;
        Ok(Response::FileData { data, eof, size })
    })
}

pub fn write(
    path: &str,
    user: RunAs,
    data: &[u8],
    append: bool,
    mode: Option<u32>,
    make_parents: bool,
) -> Result<Response> {
    let who = identity(user);
    let p = checked_path(path, who.home)?;
    if p == Path::new("/") {
        return Err(AgentError::new(
            ErrorKind::IsADirectory,
            "/: is a directory",
        ));
    }
    // Only permission bits: no setuid/setgid/sticky through the API.
    let perm = mode.unwrap_or(0o644) & 0o777;
    as_user(&who, || {
        if make_parents {
            if let Some(parent) = p.parent() {
                std::fs::create_dir_all(parent).map_err(|e| AgentError::io(&e, &shown(parent)))?;
            }
        }
        let (fd, created) = match open(&p, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, perm) {
            Ok(fd) => (fd, true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => (
                open(&p, libc::O_WRONLY, 0).map_err(|e| AgentError::io(&e, &shown(&p)))?,
                false,
            ),
            Err(e) => return Err(AgentError::io(&e, &shown(&p))),
        };
        let mut file = regular_file(fd, &p)?;
        let err = |e: std::io::Error| AgentError::io(&e, &shown(&p));
        if created || mode.is_some() {
            // The umask must not change what the caller asked for.
            file.set_permissions(std::fs::Permissions::from_mode(perm))
                .map_err(err)?;
        }
        if append {
            let end = file.metadata().map_err(err)?.len();
            file.write_all_at(data, end).map_err(err)?;
        } else {
            file.set_len(0).map_err(err)?;
            file.write_all(data).map_err(err)?;
        }
        Ok(Response::Done)
    })
}

fn kind_of(meta: &Metadata) -> FileKind {
    let t = meta.file_type();
    if t.is_symlink() {
        FileKind::Symlink
    } else if t.is_dir() {
        FileKind::Dir
    } else if t.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// Names that are not UTF-8 are shown with U+FFFD (the protocol carries strings).
fn info(p: &Path, meta: &Metadata) -> FileInfo {
    let kind = kind_of(meta);
    let symlink_target = if kind == FileKind::Symlink {
        std::fs::read_link(p)
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    FileInfo {
        name: p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into()),
        path: shown(p),
        kind,
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime: meta.mtime(),
        symlink_target,
    }
}

pub fn list(path: &str, user: RunAs) -> Result<Response> {
    let who = identity(user);
    let p = checked_path(path, who.home)?;
    as_user(&who, || {
        let err = |e: std::io::Error| AgentError::io(&e, &shown(&p));
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(&p).map_err(err)? {
            let entry = entry.map_err(err)?;
            if entries.len() == MAX_LIST {
                return Err(AgentError::invalid(format!(
                    "{}: more than {MAX_LIST} entries; list a subdirectory",
                    shown(&p)
                )));
            }
            let child = p.join(entry.file_name());
            // The entry may vanish between readdir and lstat: skip it.
            if let Ok(meta) = std::fs::symlink_metadata(&child) {
                entries.push(info(&child, &meta));
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response::FileList { entries })
    })
}

pub fn stat(path: &str, user: RunAs) -> Result<Response> {
    let who = identity(user);
    let p = checked_path(path, who.home)?;
    as_user(&who, || {
        let meta = std::fs::symlink_metadata(&p).map_err(|e| AgentError::io(&e, &shown(&p)))?;
        Ok(Response::FileStat(info(&p, &meta)))
    })
}

pub fn mkdir(path: &str, user: RunAs, parents: bool) -> Result<Response> {
    let who = identity(user);
    let p = checked_path(path, who.home)?;
    as_user(&who, || {
        let r = if parents {
            std::fs::create_dir_all(&p)
        } else {
            std::fs::create_dir(&p)
        };
        r.map_err(|e| AgentError::io(&e, &shown(&p)))?;
        Ok(Response::Done)
    })
}

/// Removes a file, symlink (not its target) or directory (`recursive` for a non-empty
/// one; the walk never follows symlinks).
pub fn remove(path: &str, user: RunAs, recursive: bool) -> Result<Response> {
    let who = identity(user);
    let p = checked_path(path, who.home)?;
    if p == Path::new("/") {
        return Err(AgentError::invalid("refusing to remove /"));
    }
    as_user(&who, || {
        let err = |e: std::io::Error| AgentError::io(&e, &shown(&p));
        let meta = std::fs::symlink_metadata(&p).map_err(err)?;
        if meta.is_dir() {
            if recursive {
                std::fs::remove_dir_all(&p).map_err(err)?;
            } else {
                std::fs::remove_dir(&p).map_err(err)?;
            }
        } else {
            std::fs::remove_file(&p).map_err(err)?;
        }
        Ok(Response::Done)
    })
}

/// Renames within the sandbox (atomic on one file system; replaces an existing file).
pub fn rename(from: &str, to: &str, user: RunAs) -> Result<Response> {
    let who = identity(user);
    let src = checked_path(from, who.home)?;
    let dst = checked_path(to, who.home)?;
    if src == Path::new("/") || dst == Path::new("/") {
        return Err(AgentError::invalid("cannot rename /"));
    }
    as_user(&who, || {
        std::fs::rename(&src, &dst).map_err(|e| {
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
