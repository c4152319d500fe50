//! Errors returned to the host: a stable kind and a message a user can read. Messages
//! name sandbox paths only.

use std::io;
use threadbox_proto::{ErrorKind, Response};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentError {
    pub kind: ErrorKind,
    pub message: String,
}

pub type Result<T, E = AgentError> = std::result::Result<T, E>;

impl AgentError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        AgentError {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// Maps an OS error about `subject` (a sandbox path or a short description).
    pub fn io(e: &io::Error, subject: &str) -> Self {
        use ErrorKind::*;
        let (kind, what) = match e.raw_os_error() {
            Some(libc::ENOENT) => (NotFound, "no such file or directory"),
            Some(libc::EACCES) | Some(libc::EPERM) => (PermissionDenied, "permission denied"),
            Some(libc::EROFS) => (PermissionDenied, "read-only file system"),
            Some(libc::EEXIST) => (AlreadyExists, "already exists"),
            Some(libc::ENOTDIR) => (NotADirectory, "not a directory"),
            Some(libc::EISDIR) => (IsADirectory, "is a directory"),
            Some(libc::ENOSPC) => (NoSpace, "no space left on device"),
            Some(libc::EDQUOT) => (NoSpace, "disk quota exceeded"),
            Some(libc::ENOTEMPTY) => (InvalidArgument, "directory not empty"),
            Some(libc::ELOOP) => (
                InvalidArgument,
                "too many symbolic links, or a /proc magic link",
            ),
            Some(libc::ENAMETOOLONG) => (InvalidArgument, "name too long"),
            Some(libc::EXDEV) => (InvalidArgument, "cannot move across file systems"),
            Some(libc::ETXTBSY) => (PermissionDenied, "text file busy"),
            Some(libc::EFBIG) => (NoSpace, "file too large"),
            _ => return Self::internal(format!("{subject}: {e}")),
        };
        Self::new(kind, format!("{subject}: {what}"))
    }

    pub fn into_response(self) -> Response {
        Response::Error {
            kind: self.kind,
            message: self.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        let e = |n| AgentError::io(&io::Error::from_raw_os_error(n), "/x").kind;
        assert_eq!(e(libc::ENOENT), ErrorKind::NotFound);
        assert_eq!(e(libc::EACCES), ErrorKind::PermissionDenied);
        assert_eq!(e(libc::EPERM), ErrorKind::PermissionDenied);
        assert_eq!(e(libc::EEXIST), ErrorKind::AlreadyExists);
        assert_eq!(e(libc::ENOTDIR), ErrorKind::NotADirectory);
        assert_eq!(e(libc::EISDIR), ErrorKind::IsADirectory);
        assert_eq!(e(libc::ENOSPC), ErrorKind::NoSpace);
        assert_eq!(e(libc::EDQUOT), ErrorKind::NoSpace);
        assert_eq!(e(libc::EIO), ErrorKind::Internal);
        assert_eq!(
            AgentError::io(&io::Error::from_raw_os_error(libc::ENOENT), "/x").message,
            "/x: no such file or directory"
        );
    }
}
