//! Posture probes for the agent's selftest, each run in a disposable child: they try what a
//! sandbox process must not be able to do.

use crate::raw;
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Tries `unshare(flags)`. Only for posture probes in a disposable child: on success the
/// caller is in new namespaces.
pub fn probe_unshare(flags: i32) -> io::Result<()> {
    raw::process::unshare(flags)
}

/// Tries to mount a tmpfs on `target`. Only for posture probes in a disposable child.
pub fn probe_mount_tmpfs(target: &Path) -> io::Result<()> {
    let t = CString::new(target.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    raw::mount::mount(Some(c"none"), &t, Some(c"tmpfs"), 0, None)
}

/// Tries `fsopen("tmpfs")` (the new mount API). Only for posture probes; a returned fd is
/// closed at once.
pub fn probe_fsopen() -> io::Result<()> {
    raw::mount::fsopen(c"tmpfs", 0).map(drop)
}

/// `prctl(PR_GET_NO_NEW_PRIVS)`: whether no_new_privs is set on the caller. Asked of the
/// kernel, not read from `/proc/self/status` (gVisor's status has no `NoNewPrivs` line).
pub fn no_new_privs() -> io::Result<bool> {
    raw::process::prctl_query(libc::PR_GET_NO_NEW_PRIVS, 0, 0).map(|v| v == 1)
}

/// The capabilities (numbers `0..=last`) in the caller's ambient set, asked one by one
/// with `PR_CAP_AMBIENT_IS_SET` (gVisor's status has no `CapAmb` line). A number the
/// kernel does not know (EINVAL) ends the walk.
pub fn ambient_capabilities(last: u32) -> io::Result<Vec<u32>> {
    let mut set = Vec::new();
    for cap in 0..=last {
        match raw::process::prctl_query(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_IS_SET as libc::c_ulong,
            libc::c_ulong::from(cap),
        ) {
            Ok(1) => set.push(cap),
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && cap > 0 => break,
            Err(e) => return Err(e),
        }
    }
    Ok(set)
}
