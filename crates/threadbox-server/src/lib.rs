//! The threadbox daemon: the axum router ([`app`]), its OpenAPI document and [`serve`].
#![forbid(unsafe_code)]

pub mod auth;
mod ckpt_routes;
mod context_routes;
pub mod error;
mod gov_routes;
mod image_routes;
pub mod mcp;
pub mod metrics;
mod net_log_routes;
mod net_routes;
pub mod openapi;
mod origin;
pub mod otlp_relay;
mod preview_routes;
mod pty_routes;
pub mod routes;
mod secret_routes;
pub mod serve;
pub mod telemetry;
mod template_routes;
mod tier_routes;
mod ui_routes;

pub use error::ApiError;
pub use mcp::McpOptions;
pub use openapi::{openapi_json, ApiDoc};
pub use routes::{app, AppState, DEFAULT_MAX_UPLOAD_BYTES, MAX_JSON_BODY_BYTES};
pub use serve::{serve, ServeError, ServeOptions, DEFAULT_LISTEN, PID_FILE_NAME, SOCKET_NAME};

#[cfg(test)]
mod gov_tests;
#[cfg(test)]
mod test_app;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod ui_tests;
