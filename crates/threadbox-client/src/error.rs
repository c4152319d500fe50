//! The client's one error type, and the code of an error answer that is not in the API's
//! error shape.

use hyper::StatusCode;
use threadbox_api::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon answered with an error.
    #[error("{message}")]
    Api {
        status: u16,
        code: ErrorCode,
        message: String,
    },
    #[error(
        "cannot connect to the threadbox daemon at {url} (is it running? start it with \
         `threadbox serve`, or set THREADBOX_URL)"
    )]
    Connect {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid daemon URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("the connection to the daemon at {url} failed")]
    Http {
        url: String,
        #[source]
        source: hyper::Error,
    },
    #[error("cannot decode the daemon's response: {0}")]
    Decode(String),
    #[error("cannot read the data to send")]
    Body(#[source] std::io::Error),
    /// A response body longer than the client accepts for its kind; nothing of it is
    /// returned.
    #[error("the daemon at {url} sent {what} larger than {limit} bytes")]
    TooLarge {
        url: String,
        what: &'static str,
        limit: usize,
    },
}

impl ClientError {
    /// The API error code, when the daemon answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// The fallback code of an error response that is not in the API's error shape.
pub(crate) fn code_for_status(status: StatusCode) -> ErrorCode {
    match status.as_u16() {
        400 | 405 | 415 | 422 => ErrorCode::InvalidArgument,
        401 => ErrorCode::Unauthenticated,
        403 => ErrorCode::PermissionDenied,
        404 => ErrorCode::NotFound,
        409 => ErrorCode::Conflict,
        412 => ErrorCode::PreconditionFailed,
        413 => ErrorCode::PayloadTooLarge,
        429 => ErrorCode::QuotaExceeded,
        502..=504 => ErrorCode::Unavailable,
        _ => ErrorCode::Internal,
    }
}
