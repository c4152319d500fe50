//! REST handlers of a sandbox's egress policy (issue 13): thin over the operations
//! `GetNetwork` / `SetNetwork` (ADR 0057).

use crate::auth::Auth;
use crate::error::ApiError;
use crate::routes::{ApiJson, ApiPath, ApiQuery, St};
use axum::extract::State;
use axum::http::{header, HeaderMap};
use serde::Deserialize;
use threadbox_api::network::{GetNetwork, NetworkInfo, NetworkPolicySpec, SetNetwork};
use threadbox_api::*;
use utoipa::IntoParams;

#[utoipa::path(get, path = routes::SANDBOX_NETWORK, tag = "network",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "The sandbox's egress policy and its generation", body = NetworkInfo),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn get_network(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<NetworkInfo>, ApiError> {
    Ok(ApiJson(st.run(&caller, GetNetwork { sandbox }).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
pub(crate) struct SetNetworkQuery {
    /// The generation the change is conditional on (the same as the `If-Match` header).
    if_match: Option<u64>,
}

/// `If-Match: "3"` or `If-Match: 3` (a generation); `*` or no header: unconditional.
fn if_match(headers: &HeaderMap) -> Result<Option<u64>, ApiError> {
    let Some(v) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let text = v.to_str().unwrap_or("").trim();
    let text = text.strip_prefix("W/").unwrap_or(text).trim_matches('"');
    if text == "*" {
        return Ok(None);
    }
    text.parse().map(Some).map_err(|_| {
        ApiError::new(
            ErrorCode::InvalidArgument,
            "If-Match must be a policy generation (a number)",
        )
    })
}

#[utoipa::path(put, path = routes::SANDBOX_NETWORK, tag = "network",
    params(("sandbox" = String, Path, description = "Sandbox id or name"),
           ("If-Match" = Option<String>, Header, description = "Change only if the policy is still this generation (else 412)"),
           SetNetworkQuery),
    request_body = NetworkPolicySpec,
    responses(
        (status = 200, description = "The new policy, in force at once; open connections it refuses are closed", body = NetworkInfo),
        (status = 412, description = "The policy is no longer the generation named", body = ErrorResponse),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn set_network(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiQuery(q): ApiQuery<SetNetworkQuery>,
    headers: HeaderMap,
    ApiJson(policy): ApiJson<NetworkPolicySpec>,
) -> Result<ApiJson<NetworkInfo>, ApiError> {
    let if_match = if_match(&headers)?.or(q.if_match);
    let op = SetNetwork {
        sandbox,
        policy,
        if_match,
    };
    Ok(ApiJson(st.run(&caller, op).await?))
}
