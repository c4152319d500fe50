//! Authentication at the door. The unix socket (0600) is the operator's door: no key,
//! every scope, tenant `default`. TCP requires an API key (`Authorization: Bearer <key>`
//! or `X-API-Key: <key>`) unless the daemon was started with `--insecure-no-auth`
//! (loopback only). The caller found here travels as a request extension ([`Caller`]) to
//! the handlers, which pass it to the manager.
//!
//! The operator and admin keys may act for another tenant with `X-Threadbox-Tenant`.

use crate::error::ApiError;
use crate::routes::Shared;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use threadbox_api::ErrorCode;
use threadbox_core::audit::{RefusalAudit, RefusalBudget, REFUSALS_PER_WINDOW};
use threadbox_core::{Caller, Manager};

/// Header naming the tenant an operator or admin acts for.
pub const TENANT_HEADER: &str = "x-threadbox-tenant";
/// Alternative to `Authorization: Bearer`.
pub const API_KEY_HEADER: &str = "x-api-key";

/// Which door a request came through; installed as an extension by `serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// The local unix socket: the operator, no key.
    Socket,
    /// TCP with API keys required.
    Tcp,
    /// TCP opened with `--insecure-no-auth` (loopback only): treated as the operator.
    TcpInsecure,
}

/// The authenticated caller of a request (extractor).
pub struct Auth(pub Caller);

impl<S: Send + Sync> FromRequestParts<S> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Caller>()
            .cloned()
            .map(Auth)
            .ok_or_else(|| ApiError::new(ErrorCode::Unauthenticated, "missing API key"))
    }
}

/// Routes anyone may call: liveness and the API description.
fn is_public(path: &str) -> bool {
    path == threadbox_api::routes::HEALTHZ || path == threadbox_api::routes::OPENAPI
}

/// The key a request presents, if any. Never logged.
fn presented_key(headers: &HeaderMap) -> Option<Result<&str, ()>> {
    if let Some(v) = headers.get(header::AUTHORIZATION) {
        let Ok(v) = v.to_str() else {
            return Some(Err(()));
        };
        let mut parts = v.trim().splitn(2, ' ');
        let scheme = parts.next().unwrap_or("");
        let token = parts.next().unwrap_or("").trim();
        if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
            return Some(Err(()));
        }
        return Some(Ok(token));
    }
    headers
        .get(API_KEY_HEADER)
        .map(|v| v.to_str().map(str::trim).map_err(|_| ()))
}

/// Answers 401 and audits the refusal within the daemon's budget for them (F9: anyone
/// who reaches the port can be refused, and each row is an fsynced write).
pub(crate) async fn refuse(
    st: &Shared,
    key_id: Option<&str>,
    target: &str,
    reason: &str,
) -> Response {
    let audit = st.refusals.admit(std::time::Instant::now());
    match audit {
        RefusalAudit::Record { suppressed_before } => {
            let m = &st.manager;
            if suppressed_before > 0 {
                let summary = format!(
                    "{suppressed_before} more refused requests in the previous window were \
                     not recorded one by one (audit budget: {REFUSALS_PER_WINDOW} per {}s)",
                    RefusalBudget::WINDOW.as_secs()
                );
                m.record_refused_auth(None, "(refusals over budget)", &summary)
                    .await;
            }
            m.record_refused_auth(key_id, target, reason).await;
            tracing::info!(target_route = %target, key_id = ?key_id, reason, "authentication refused");
        }
        _ => {
            tracing::debug!(target_route = %target, key_id = ?key_id, reason, "authentication refused (not audited: over budget)");
        }
    }
    ApiError::new(ErrorCode::Unauthenticated, reason_message(reason)).into_response()
}

fn reason_message(reason: &str) -> String {
    match reason {
        "missing API key" => {
            "missing API key: send `Authorization: Bearer <key>` or `X-API-Key: <key>`".into()
        }
        other => other.to_string(),
    }
}

/// The middleware: finds the caller, or answers 401 (recorded in the audit log).
pub(crate) async fn authenticate(
    State(st): State<Arc<Shared>>,
    mut req: Request,
    next: Next,
) -> Response {
    // The dashboard's own routes check its session themselves (ui_routes.rs).
    if is_public(req.uri().path()) || crate::ui_routes::is_ui_path(req.uri().path()) {
        return next.run(req).await;
    }
    // A request a page of this origin made (origin.rs): only a dashboard session
    // authenticates it, never a door's operator default nor a key (ADR 0096).
    if req
        .extensions()
        .get::<crate::origin::PageRequest>()
        .is_some()
    {
        let (caller, csrf_from) = match crate::ui_routes::page_caller(&st, req.headers()).await {
            Ok(c) => c,
            Err(e) => {
                let mut resp = e.into_response();
                resp.extensions_mut()
                    .insert(crate::metrics::RejectReason("unauthenticated"));
                return resp;
            }
        };
        let mut caller = caller;
        if let Some(t) = req.headers().get(TENANT_HEADER) {
            let Ok(t) = t.to_str() else {
                return ApiError::invalid("X-Threadbox-Tenant is not valid text").into_response();
            };
            caller = match caller.acting_for(t.trim()) {
                Ok(c) => c,
                Err(e) => return ApiError::from(e).into_response(),
            };
        }
        req.extensions_mut().insert(caller);
        let mut resp = next.run(req).await;
        crate::ui_routes::echo_protocol(&mut resp, &csrf_from);
        return resp;
    }
    let door = req.extensions().get::<Door>().copied().unwrap_or(Door::Tcp);
    let mut caller = match door {
        Door::Socket | Door::TcpInsecure => Caller::operator(),
        Door::Tcp => {
            let target = format!("{} {}", req.method(), req.uri().path());
            match presented_key(req.headers()) {
                None => return refuse(&st, None, &target, "missing API key").await,
                Some(Err(())) => {
                    return refuse(&st, None, &target, "malformed Authorization header").await
                }
                Some(Ok(key)) => {
                    match st.manager.authenticate(key).await {
                        Ok(c) => c,
                        // The store failed, not the key: a 500 with its cause in the log,
                        // not a 401 that hides it.
                        Err(e) if e.code() == ErrorCode::Internal => {
                            return ApiError::from(e).into_response()
                        }
                        Err(e) => {
                            let key_id = Manager::presented_key_id(key).map(str::to_string);
                            let reason = e.public_message();
                            return refuse(&st, key_id.as_deref(), &target, &reason).await;
                        }
                    }
                }
            }
        }
    };
    if let Some(t) = req.headers().get(TENANT_HEADER) {
        let Ok(t) = t.to_str() else {
            return ApiError::invalid("X-Threadbox-Tenant is not valid text").into_response();
        };
        caller = match caller.acting_for(t.trim()) {
            Ok(c) => c,
            Err(e) => return ApiError::from(e).into_response(),
        };
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn keys_are_taken_from_bearer_or_x_api_key() {
        let mut h = HeaderMap::new();
        assert!(presented_key(&h).is_none());
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer abc"),
        );
        assert_eq!(presented_key(&h), Some(Ok("abc")));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  abc "),
        );
        assert_eq!(presented_key(&h), Some(Ok("abc")));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic abc"));
        assert_eq!(presented_key(&h), Some(Err(())));
        let mut h = HeaderMap::new();
        h.insert(API_KEY_HEADER, HeaderValue::from_static("k"));
        assert_eq!(presented_key(&h), Some(Ok("k")));
    }
}
