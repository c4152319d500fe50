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
