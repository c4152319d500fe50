//! Path normalisation of the file API: every path a client names is made absolute, free
//! of `.`/`..`/empty components, and refused under the kernel interfaces. This is only the
//! first gate: the file operations themselves run as the requesting user, never follow
//! magic links, and refuse kernel file systems (see `files.rs`).

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

/// Longest accepted path, in bytes (PATH_MAX).
pub const MAX_PATH: usize = 4096;

/// Trees the file API never touches.
pub const FORBIDDEN_ROOTS: &[&str] = &["/proc", "/sys", "/dev"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathError {
    Empty,
    Nul,
    TooLong,
    /// Under one of [`FORBIDDEN_ROOTS`].
    Forbidden {
        path: PathBuf,
        root: &'static str,
    },
}

/// Absolute (or relative to `home`), without `.`/`..`/empty components. `..` at `/` stays
/// at `/`, which is the sandbox's root. A path is bytes: names need not be UTF-8.
pub fn normalize<P: AsRef<[u8]> + ?Sized>(path: &P, home: &str) -> Result<PathBuf, PathError> {
    let path = path.as_ref();
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.contains(&0) {
        return Err(PathError::Nul);
    }
    if path.len() > MAX_PATH {
        return Err(PathError::TooLong);
    }
    let joined: Vec<u8> = if path.starts_with(b"/") {
        path.to_vec()
    } else {
        [home.as_bytes(), b"/", path].concat()
    };
    let mut parts: Vec<&[u8]> = Vec::new();
    for c in joined.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let mut out = Vec::with_capacity(joined.len() + 1);
    for c in &parts {
        out.push(b'/');
        out.extend_from_slice(c);
    }
    if out.is_empty() {
        out.push(b'/');
    }
    Ok(PathBuf::from(OsString::from_vec(out)))
}

/// [`normalize`] plus the refusal of kernel interfaces.
pub fn checked<P: AsRef<[u8]> + ?Sized>(path: &P, home: &str) -> Result<PathBuf, PathError> {
    let p = normalize(path, home)?;
    for root in FORBIDDEN_ROOTS {
        if p.starts_with(root) {
            return Err(PathError::Forbidden { path: p, root });
        }
    }
    Ok(p)
}
