//! Landlock through its raw system calls (no library): a second, path-based layer under
//! the mount layout and DAC. A process inside a sandbox may read and execute everything
//! under `/`, and write only below the top-level directories meant for it.
//!
//! The kernel's ABI version decides which access rights exist; rights the running kernel
//! does not know are masked out, so the same code runs on every Landlock-capable kernel.
//! Without Landlock (`ENOSYS`/`EOPNOTSUPP`) [`sandbox_ruleset`] returns `None` and callers
//! report it rather than fail.

use crate::raw;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub const ACCESS_FS_EXECUTE: u64 = 1 << 0;
pub const ACCESS_FS_WRITE_FILE: u64 = 1 << 1;
pub const ACCESS_FS_READ_FILE: u64 = 1 << 2;
pub const ACCESS_FS_READ_DIR: u64 = 1 << 3;
pub const ACCESS_FS_REMOVE_DIR: u64 = 1 << 4;
pub const ACCESS_FS_REMOVE_FILE: u64 = 1 << 5;
pub const ACCESS_FS_MAKE_CHAR: u64 = 1 << 6;
pub const ACCESS_FS_MAKE_DIR: u64 = 1 << 7;
pub const ACCESS_FS_MAKE_REG: u64 = 1 << 8;
pub const ACCESS_FS_MAKE_SOCK: u64 = 1 << 9;
pub const ACCESS_FS_MAKE_FIFO: u64 = 1 << 10;
pub const ACCESS_FS_MAKE_BLOCK: u64 = 1 << 11;
pub const ACCESS_FS_MAKE_SYM: u64 = 1 << 12;
/// ABI 2.
pub const ACCESS_FS_REFER: u64 = 1 << 13;
/// ABI 3.
pub const ACCESS_FS_TRUNCATE: u64 = 1 << 14;
/// ABI 5.
pub const ACCESS_FS_IOCTL_DEV: u64 = 1 << 15;

/// Rights that make sense on a file (the others apply to directories only).
const FILE_RIGHTS: u64 = ACCESS_FS_EXECUTE
    | ACCESS_FS_WRITE_FILE
    | ACCESS_FS_READ_FILE
    | ACCESS_FS_TRUNCATE
    | ACCESS_FS_IOCTL_DEV;

const READ_EXECUTE: u64 = ACCESS_FS_EXECUTE | ACCESS_FS_READ_FILE | ACCESS_FS_READ_DIR;

/// Everything but creating device nodes (impossible without CAP_MKNOD anyway).
const READ_WRITE: u64 = READ_EXECUTE
    | ACCESS_FS_WRITE_FILE
    | ACCESS_FS_REMOVE_DIR
    | ACCESS_FS_REMOVE_FILE
    | ACCESS_FS_MAKE_DIR
    | ACCESS_FS_MAKE_REG
    | ACCESS_FS_MAKE_SOCK
    | ACCESS_FS_MAKE_FIFO
    | ACCESS_FS_MAKE_SYM
    | ACCESS_FS_REFER
    | ACCESS_FS_TRUNCATE
    | ACCESS_FS_IOCTL_DEV;

/// The Landlock ABI version of the running kernel; an error when Landlock is missing or
/// disabled.
pub fn abi_version() -> io::Result<u32> {
    raw::landlock::abi_version()
}

/// Filesystem rights known to a kernel of this ABI.
pub fn fs_rights_of_abi(abi: u32) -> u64 {
    let mut rights = (1u64 << 13) - 1;
    if abi >= 2 {
        rights |= ACCESS_FS_REFER;
    }
    if abi >= 3 {
        rights |= ACCESS_FS_TRUNCATE;
    }
    if abi >= 5 {
        rights |= ACCESS_FS_IOCTL_DEV;
    }
    rights
}

/// A Landlock ruleset under construction or ready to be enforced.
#[derive(Debug)]
pub struct Ruleset {
    fd: OwnedFd,
    abi: u32,
    handled: u64,
}

impl Ruleset {
    /// A ruleset that handles every filesystem right the kernel knows: whatever a rule does
    /// not allow is denied once enforced.
    pub fn new_fs() -> io::Result<Ruleset> {
        let abi = abi_version()?;
        let handled = fs_rights_of_abi(abi) & READ_WRITE;
        let fd = raw::landlock::create_ruleset(handled)?;
        Ok(Ruleset { fd, abi, handled })
    }

    pub fn abi(&self) -> u32 {
        self.abi
    }

    /// The ruleset's descriptor number (a child keeps it open until it restricts itself).
    pub fn raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Allows read+execute (`read_only`) or read+write access beneath `path` (a directory)
    /// or to `path` itself (a file: only the file rights apply).
    pub fn allow_path(&mut self, path: &Path, read_only: bool) -> io::Result<()> {
        let c = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let parent = raw::fd::open(&c, libc::O_PATH | libc::O_CLOEXEC)?;
        let is_dir = std::fs::metadata(path)?.is_dir();
        let mut rights = if read_only { READ_EXECUTE } else { READ_WRITE } & self.handled;
        if !is_dir {
            rights &= FILE_RIGHTS;
        }
        raw::landlock::add_path_rule(self.fd.as_fd(), parent.as_fd(), rights)
    }

    /// Enforces the ruleset on the calling thread. Requires no_new_privs (or
    /// CAP_SYS_ADMIN). Async-signal-safe: one system call, no allocation.
    pub fn restrict_self(&self) -> io::Result<()> {
        raw::landlock::restrict_self(self.fd.as_fd())
    }
}

/// Top-level directories of `/` that stay read-only (or are covered entry by entry).
const NOT_WRITABLE_TOP: &[&str] = &["proc", "sys", "usr", "dev"];

/// Entries of /dev a process may write (those that exist).
pub const DEV_WRITABLE: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/pts",
    "/dev/shm",
];

/// The ruleset of every sandbox process: read+execute on `/`; read+write on each
/// top-level directory except /proc, /sys, /usr and /dev, and on the [`DEV_WRITABLE`]
/// entries. `Ok(None)` when the kernel has no Landlock.
pub fn sandbox_ruleset() -> io::Result<Option<Ruleset>> {
    let mut rs = match Ruleset::new_fs() {
        Ok(rs) => rs,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
            ) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    rs.allow_path(Path::new("/"), true)?;
    for entry in std::fs::read_dir("/")? {
        let entry = entry?;
        let name = entry.file_name();
        if NOT_WRITABLE_TOP
            .iter()
            .any(|n| name.as_bytes() == n.as_bytes())
        {
            continue;
        }
        // Symlinks (/bin -> usr/bin) are skipped: they lead into a read-only tree.
        if entry.file_type()?.is_dir() {
            rs.allow_path(&entry.path(), false)?;
        }
    }
    for dev in DEV_WRITABLE {
        match rs.allow_path(Path::new(dev), false) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(rs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rights_follow_the_abi() {
        assert_eq!(fs_rights_of_abi(1), (1 << 13) - 1);
        assert_eq!(fs_rights_of_abi(3) & ACCESS_FS_TRUNCATE, ACCESS_FS_TRUNCATE);
        assert_eq!(fs_rights_of_abi(4) & ACCESS_FS_IOCTL_DEV, 0);
    }

    /// In a forked child: after enforcing a ruleset that allows only reading `/`, creating
    /// a file in a world-writable directory is refused although DAC would allow it.
    #[test]
    fn enforced_ruleset_blocks_writes() {
        let Ok(mut rs) = Ruleset::new_fs() else {
            eprintln!("skipped: kernel without Landlock");
            return;
        };
        rs.allow_path(Path::new("/"), true).unwrap();
        let dir = std::env::temp_dir().join(format!("tb-landlock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = CString::new(dir.join("f").as_os_str().as_bytes()).unwrap();
        // The child makes only raw system calls before _exit.
        let status = crate::raw::testing::in_child(|| {
            let _ = crate::raw::process::prctl(libc::PR_SET_NO_NEW_PRIVS, 1);
            match rs.restrict_self() {
                Err(_) => 2,
                Ok(()) => match crate::raw::fd::openat_mode(
                    libc::AT_FDCWD,
                    &target,
                    libc::O_CREAT | libc::O_WRONLY,
                    0o600,
                ) {
                    Err(e) if e.raw_os_error() == Some(libc::EACCES) => 0,
                    _ => 1,
                },
            }
        });
        std::fs::remove_dir_all(&dir).ok();
        assert!(libc::WIFEXITED(status));
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }
}
