//! The only threadbox crate with `unsafe` and raw syscalls. Everything OS-specific the
//! jail needs lives here, behind safe functions.
// The workspace denies `unsafe_code`; this crate is where it lives (see raw/).
#![allow(unsafe_code)]

pub mod cgroup;
pub mod child;
pub mod jail;
pub mod landlock;
pub mod resolve;
pub mod seccomp;
pub mod sparse;
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
