//! Landlock's three system calls.

use super::{cvt, owned};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

const CREATE_RULESET_VERSION: u32 = 1 << 0;
const RULE_PATH_BENEATH: u32 = 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// `landlock_create_ruleset(NULL, 0, VERSION)`: the kernel's ABI version.
pub(crate) fn abi_version() -> io::Result<u32> {
    // SAFETY: the version query takes a null attribute pointer and size 0 by definition.
    let rc = cvt(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    })?;
    Ok(rc as u32)
}

/// `landlock_create_ruleset({handled_access_fs}, size, 0)`.
pub(crate) fn create_ruleset(handled_access_fs: u64) -> io::Result<OwnedFd> {
    let attr = RulesetAttr { handled_access_fs };
    // SAFETY: `attr` is a valid ruleset attribute of the size passed; the kernel copies it.
    owned(cvt(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    })?)
}

/// `landlock_add_rule(ruleset, PATH_BENEATH, {allowed, parent}, 0)`.
pub(crate) fn add_path_rule(
    ruleset: BorrowedFd<'_>,
    parent: BorrowedFd<'_>,
    allowed_access: u64,
) -> io::Result<()> {
    let attr = PathBeneathAttr {
        allowed_access,
        parent_fd: parent.as_raw_fd(),
    };
    // SAFETY: `attr` is a valid path-beneath attribute; both fds are open for the call.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        )
    })
    .map(drop)
}

/// `landlock_restrict_self(ruleset, 0)`: one system call, no allocation.
pub(crate) fn restrict_self(ruleset: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: integer arguments only; the ruleset fd is open for the call.
    cvt(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32) })
        .map(drop)
}
