//! Path normalisation of the file API: every path a client names is made absolute, free
//! of `.`/`..`/empty components, and refused under the kernel interfaces. This is only the
//! first gate: the file operations themselves run as the requesting user, never follow
//! magic links, and refuse kernel file systems (see `files.rs`).

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
/// at `/`, which is the sandbox's root.
pub fn normalize(path: &str, home: &str) -> Result<PathBuf, PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.contains('\0') {
        return Err(PathError::Nul);
    }
    if path.len() > MAX_PATH {
        return Err(PathError::TooLong);
    }
    let joined = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{home}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    Ok(PathBuf::from(format!("/{}", parts.join("/"))))
}

/// [`normalize`] plus the refusal of kernel interfaces.
pub fn checked(path: &str, home: &str) -> Result<PathBuf, PathError> {
    let p = normalize(path, home)?;
    for root in FORBIDDEN_ROOTS {
        if p.starts_with(root) {
            return Err(PathError::Forbidden { path: p, root });
        }
    }
    Ok(p)
}
