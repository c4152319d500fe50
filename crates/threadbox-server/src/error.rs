//! The one error type of the HTTP layer and its single `IntoResponse`: a stable code and a
//! client-safe message go out; internal details go to the log.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use threadbox_api::{ErrorBody, ErrorCode, ErrorResponse};
use threadbox_core::CoreError;

/// An error answered as `{"error": {"code": "...", "message": "..."}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// Overrides the status implied by `code` (405 for a wrong method).
    status: Option<StatusCode>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
            status: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::PayloadTooLarge, message)
    }

    pub fn method_not_allowed() -> Self {
        ApiError {
            code: ErrorCode::InvalidArgument,
            message: "method not allowed on this route".to_string(),
            status: Some(StatusCode::METHOD_NOT_ALLOWED),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.status.unwrap_or_else(|| {
            StatusCode::from_u16(self.code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        })
    }

    pub fn body(&self) -> ErrorResponse {
        ErrorResponse {
            error: ErrorBody {
                code: self.code,
                message: self.message.clone(),
            },
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<CoreError> for ApiError {
    fn from(err: CoreError) -> Self {
        // Internal errors at `error`, unavailable at `warn`: on at the default level, so
        // every "internal error (see the daemon log)" has its cause there.
        err.log("request");
        ApiError::new(err.code(), err.public_message())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rej: JsonRejection) -> Self {
        if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::too_large("request body is too large");
        }
        let message = match &rej {
            JsonRejection::MissingJsonContentType(_) => {
                "expected a request with `Content-Type: application/json`".to_string()
            }
            _ => rej.body_text(),
        };
        ApiError::invalid(message)
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rej: QueryRejection) -> Self {
        ApiError::invalid(rej.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rej: PathRejection) -> Self {
        ApiError::invalid(rej.body_text())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status(), axum::Json(self.body())).into_response();
        // For the error counter of /metrics.
        resp.extensions_mut().insert(self.code);
        resp
    }
}

/// Displays an error with its whole `source()` chain, for the log.
pub(crate) struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}
