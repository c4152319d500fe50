//! Descriptors and paths: `openat2`, filesystem types, inherited descriptors, the cgroup
//! directory handle ([`DirFd`]) and the agent's path resolver ([`resolve`]).

pub mod resolve;
pub mod tree;

use crate::raw;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// `RESOLVE_NO_MAGICLINKS`: /proc/<pid>/fd/* style links are not followed.
pub const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
/// `RESOLVE_NO_SYMLINKS`.
pub const RESOLVE_NO_SYMLINKS: u64 = 0x04;

/// Takes `fd`'s exclusive `flock(2)` lock without blocking: `false` while another open
/// file description holds it (e.g. a runsc command of the same container). The lock goes
/// with the descriptor's last close.
pub fn try_lock_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    match raw::fs::flock(fd, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `openat2(2)` relative to `dir` (or the cwd). `O_CLOEXEC` is always added. On kernels
/// without openat2 (< 5.6) falls back to `openat`, losing the `resolve` restrictions.
pub fn openat2(
    dir: Option<BorrowedFd<'_>>,
    path: &Path,
    flags: i32,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let dirfd = dir.map(|d| d.as_raw_fd()).unwrap_or(libc::AT_FDCWD);
    let flags = flags | libc::O_CLOEXEC;
    let mode = if flags & (libc::O_CREAT | libc::O_TMPFILE) != 0 {
        mode
    } else {
        0
    };
    match raw::fd::openat2(dirfd, &c, flags as u64, mode as u64, resolve) {
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            raw::fd::openat_mode(dirfd, &c, flags, mode)
        }
        other => other,
    }
}

/// The filesystem type (`f_type` of fstatfs) of an open file.
pub fn fs_type(fd: BorrowedFd<'_>) -> io::Result<i64> {
    Ok(raw::fs::fstatfs(fd)?.f_type as i64)
}

/// Total size in bytes of the file system holding an open file.
pub fn fs_total_bytes(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let st = raw::fs::fstatfs(fd)?;
    Ok((st.f_blocks as u64).saturating_mul(st.f_bsize as u64))
}

/// Pseudo filesystems that the file API must never read or write through a symlink.
pub fn is_kernel_interface_fs(f_type: i64) -> bool {
    const MAGICS: &[i64] = &[
        libc::PROC_SUPER_MAGIC,
        libc::SYSFS_MAGIC,
        libc::CGROUP2_SUPER_MAGIC,
        libc::CGROUP_SUPER_MAGIC,
        libc::DEBUGFS_MAGIC,
        libc::SECURITYFS_MAGIC,
        libc::BPF_FS_MAGIC,
        libc::TRACEFS_MAGIC,
        libc::DEVPTS_SUPER_MAGIC,
        0x4249_4e4d, // binfmt_misc
        0x6e73_6673, // nsfs
    ];
    MAGICS.contains(&f_type)
}

static TAKEN_FDS: AtomicU64 = AtomicU64::new(0);

/// Takes ownership of a descriptor inherited from the parent process (e.g. `--listen-fd
/// 3`) after checking that it is open, and marks it close-on-exec. Each fd number below 64
/// can be taken once; others are refused.
pub fn take_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    if !(3..64).contains(&fd) {
        return Err(io::Error::other(format!(
            "inherited fd {fd} is outside 3..64"
        )));
    }
    let bit = 1u64 << fd;
    if TAKEN_FDS.fetch_or(bit, Ordering::SeqCst) & bit != 0 {
        return Err(io::Error::other(format!("fd {fd} was already taken")));
    }
    let flags = raw::fd::get_fd_flags(fd)?;
    raw::fd::set_fd_flags(fd, flags | libc::FD_CLOEXEC)?;
    // Open (checked) and taken once (the bitmap).
    Ok(raw::fd::adopt_inherited(fd))
}

/// Closes the descriptor of `owner` and leaks `owner` itself, on purpose.
///
/// For a socket registered with an event loop that hands out pointers as epoll tokens
/// (tokio's `ScheduledIo`): under gVisor 20240729 an event of a host-backed socket can
/// still be delivered after the socket was removed from the epoll set and dropped, and
/// tokio then writes through a token whose registration was freed (a debug assertion in
/// `set_readiness`, a use after free in release builds). Leaking the owner keeps the
/// registration alive, so such an event lands on memory that is still tokio's; the
/// descriptor itself is closed, as the checkpoint that follows needs (ADR 0196). A few
/// hundred bytes per socket, for the listener and connections the agent drops.
pub fn close_leaking_owner<T: AsRawFd>(owner: T) {
    let fd = owner.as_raw_fd();
    std::mem::forget(owner);
    // `owner` is forgotten: nothing else closes `fd` or uses its number.
    raw::fd::close(fd);
}

/// A directory handle for `*at` operations (used for the sandbox's cgroup directory).
#[derive(Debug)]
pub struct DirFd(OwnedFd);

impl DirFd {
    /// Opens a directory by path.
    pub fn open(path: &Path) -> io::Result<DirFd> {
        openat2(None, path, libc::O_RDONLY | libc::O_DIRECTORY, 0, 0).map(DirFd)
    }

    /// Wraps an fd that must refer to a directory.
    pub fn from_fd(fd: OwnedFd) -> io::Result<DirFd> {
        let st = raw::fs::fstat(fd.as_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
        }
        Ok(DirFd(fd))
    }

    fn cname(name: &str) -> io::Result<CString> {
        CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }

    pub fn mkdir(&self, name: &str, mode: u32) -> io::Result<()> {
        raw::fs::mkdirat(self.0.as_fd(), &Self::cname(name)?, mode)
    }

    pub fn rmdir(&self, name: &str) -> io::Result<()> {
        raw::fs::unlinkat(self.0.as_fd(), &Self::cname(name)?, libc::AT_REMOVEDIR)
    }

    /// Opens the directory `rel` (no symlinks followed).
    pub fn open_dir(&self, rel: &str) -> io::Result<OwnedFd> {
        openat2(
            Some(self.0.as_fd()),
            Path::new(rel),
            libc::O_RDONLY | libc::O_DIRECTORY,
            0,
            RESOLVE_NO_SYMLINKS,
        )
    }

    /// Opens `rel` (no symlinks followed) for reading.
    pub fn open_read(&self, rel: &str) -> io::Result<OwnedFd> {
        openat2(
            Some(self.0.as_fd()),
            Path::new(rel),
            libc::O_RDONLY,
            0,
            RESOLVE_NO_SYMLINKS,
        )
    }

    /// Opens `rel` (no symlinks followed) for writing.
    pub fn open_write(&self, rel: &str) -> io::Result<OwnedFd> {
        openat2(
            Some(self.0.as_fd()),
            Path::new(rel),
            libc::O_WRONLY,
            0,
            RESOLVE_NO_SYMLINKS,
        )
    }

    /// Writes `data` to the file `rel` in one write (cgroup interface files want that).
    pub fn write_file(&self, rel: &str, data: &[u8]) -> io::Result<()> {
        let fd = self.open_write(rel)?;
        if raw::fd::write(fd.as_fd(), data)? != data.len() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openat2_refuses_magic_links() {
        let err = openat2(
            None,
            Path::new("/proc/self/fd/0"),
            libc::O_RDONLY,
            0,
            RESOLVE_NO_MAGICLINKS,
        )
        .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ELOOP));
        let fd = openat2(
            None,
            Path::new("/proc/self/status"),
            libc::O_RDONLY,
            0,
            RESOLVE_NO_MAGICLINKS,
        )
        .unwrap();
        assert!(is_kernel_interface_fs(fs_type(fd.as_fd()).unwrap()));
    }
}
