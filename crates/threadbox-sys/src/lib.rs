//! The only threadbox crate with `unsafe` and raw syscalls. Everything OS-specific the
//! jail needs lives here, behind safe functions.
//!
//! Layers: [`raw`] holds every `unsafe` (one safe function per system call, each with its
//! `// SAFETY:` comment; the workspace denies `unsafe_code` everywhere else). Above it,
//! safe policy modules: [`process`] (the child policy, spawning, reaping), [`fs`]
//! (`openat2`, the path resolver), [`jail`] (the launch helper, the sandbox's init and its
//! mount plan), [`seccomp`], [`landlock`], [`cgroup`], [`sparse`]. `child` and `resolve`
//! are the old paths of `process` and `fs`, kept for the crates that import them.

pub mod alloc;
pub mod cgroup;
pub mod child;
pub mod clonefile;
pub mod fs;
pub mod gvisor;
pub mod jail;
pub mod landlock;
pub mod net;
pub mod process;
#[allow(unsafe_code)]
mod raw;
pub mod seccomp;
pub mod sparse;

/// The old path of [`fs::resolve`].
pub mod resolve {
    pub use crate::fs::resolve::*;
}
#[cfg(feature = "insecure-test-hooks")]
pub mod testhooks;

/// Errors of system calls and system files, naming what was being done.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    #[error("{what}: {source}")]
    Os {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
    /// The host cannot give the sandbox a layer it is documented to have, and the
    /// operator did not allow going without it: a refusal, not a failure.
    #[error("{0}")]
    Refused(String),
}

impl SysError {
    pub fn os(what: impl Into<String>, source: std::io::Error) -> Self {
        SysError::Os {
            what: what.into(),
            source,
        }
    }
    pub fn last(what: impl Into<String>) -> Self {
        SysError::Os {
            what: what.into(),
            source: std::io::Error::last_os_error(),
        }
    }
}

pub type Result<T, E = SysError> = std::result::Result<T, E>;
