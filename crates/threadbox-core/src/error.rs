//! The one error type of the core; the server maps it to HTTP with [`CoreError::code`].

use threadbox_api::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    #[error("sandbox {0} not found")]
    NotFound(String),
    #[error("{0}")]
    NotFoundOther(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Conflict(String),
    #[error("sandbox {id} is {state}, not running")]
    NotRunning { id: String, state: String },
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    #[error("{0}")]
    Unauthenticated(String),
    /// A per-tenant quota would be exceeded; nothing was changed.
    #[error("quota exceeded: {quota} of tenant {tenant:?}: {used}, limit {limit}{extra}")]
    QuotaExceeded {
        tenant: String,
        quota: &'static str,
        /// Current use (or what was requested), e.g. "2 in use".
        used: String,
        limit: String,
        /// Further explanation, starting with "; " when present.
        extra: String,
    },
    #[error("{0}")]
    TooLarge(String),
    /// Something needed is not there right now (the agent, a tier, swap, a registry). The
    /// message names what; no prefix, because most of these are not about the agent.
    #[error("{0}")]
    Unavailable(String),
    #[error("store error")]
    Store(#[from] sqlx::Error),
    #[error("migration error")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("system error: {0}")]
    Sys(#[from] threadbox_sys::SysError),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("internal error: {0}")]
    Internal(String),
    /// A conditional change (`If-Match`) found another generation; nothing changed.
    #[error("{0}")]
    PreconditionFailed(String),
}

impl CoreError {
    /// The stable API code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            CoreError::NotFound(_) | CoreError::NotFoundOther(_) => ErrorCode::NotFound,
            CoreError::InvalidArgument(_) => ErrorCode::InvalidArgument,
            CoreError::Conflict(_) => ErrorCode::Conflict,
            CoreError::PreconditionFailed(_) => ErrorCode::PreconditionFailed,
            CoreError::NotRunning { .. } => ErrorCode::SandboxNotRunning,
            CoreError::PermissionDenied(_) => ErrorCode::PermissionDenied,
            CoreError::Unauthenticated(_) => ErrorCode::Unauthenticated,
            CoreError::QuotaExceeded { .. } => ErrorCode::QuotaExceeded,
            CoreError::TooLarge(_) => ErrorCode::PayloadTooLarge,
            CoreError::Unavailable(_) => ErrorCode::Unavailable,
            CoreError::Store(_)
            | CoreError::Migrate(_)
            | CoreError::Sys(_)
            | CoreError::Io(_)
            | CoreError::Internal(_) => ErrorCode::Internal,
        }
    }

    /// The error with its whole `source()` chain, for the log.
    pub fn chain(&self) -> String {
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        text
    }

    /// Logs the cause of an error a client sees as "internal error (see the daemon
    /// log)" (at `error`) or as "unavailable" (at `warn`): both levels are on by default.
    /// Other errors are the client's and are logged at `debug` only.
    pub fn log(&self, context: &str) {
        match self.code() {
            ErrorCode::Internal => {
                tracing::error!(error = %self.chain(), "{context} failed with an internal error")
            }
            ErrorCode::Unavailable => {
                tracing::warn!(error = %self.chain(), "{context} failed: sandbox unavailable")
            }
            _ => tracing::debug!(error = %self, "{context} refused"),
        }
    }

    /// Message safe to return to a client: internal details stay in the log.
    pub fn public_message(&self) -> String {
        match self.code() {
            ErrorCode::Internal => "internal error (see the daemon log)".to_string(),
            _ => self.to_string(),
        }
    }
}

pub type Result<T, E = CoreError> = std::result::Result<T, E>;
