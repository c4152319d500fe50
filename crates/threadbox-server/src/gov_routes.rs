//! Governance routes: API keys, quotas, usage, the audit log, Prometheus metrics. Each
//! handler parses HTTP into one `threadbox_api::ops` governance operation and answers
//! its output (ADR 0057).

use crate::auth::{Auth, TENANT_HEADER};
use crate::error::ApiError;
use crate::routes::{ApiJson, ApiPath, ApiQuery, St};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use threadbox_api::*;
use threadbox_core::ops;
use utoipa::IntoParams;

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct KeysQuery {
    /// Only this tenant's keys.
    pub tenant: Option<String>,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// Tenant to report (an admin may name any; default: the caller's, or every tenant
    /// for an admin).
    pub tenant: Option<String>,
    /// RFC 3339: tenant totals count from this time's UTC day.
    pub since: Option<String>,
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// RFC 3339: only entries from this time on.
    pub since: Option<String>,
    /// Only entries after this position (for paging).
    pub after: Option<u64>,
    /// At most this many entries (default 1000, at most 10000).
    pub limit: Option<u32>,
}

#[utoipa::path(post, path = "/v1/keys", tag = "governance",
    request_body = CreateKeyRequest,
    responses(
        (status = 201, description = "The new key; `key` is shown only this once", body = CreatedKey),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn create_key(
    State(st): St,
    Auth(caller): Auth,
    ApiJson(req): ApiJson<CreateKeyRequest>,
) -> Result<(StatusCode, ApiJson<CreatedKey>), ApiError> {
    let key = st.run(&caller, ops::CreateKey(req)).await?;
    Ok((StatusCode::CREATED, ApiJson(key)))
}

#[utoipa::path(get, path = "/v1/keys", tag = "governance", params(KeysQuery),
    responses(
        (status = 200, description = "Keys (never the keys themselves)", body = ApiKeyList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn list_keys(
    State(st): St,
    Auth(caller): Auth,
    ApiQuery(q): ApiQuery<KeysQuery>,
) -> Result<ApiJson<ApiKeyList>, ApiError> {
    let op = ops::ListKeys { tenant: q.tenant };
    Ok(ApiJson(st.run(&caller, op).await?))
}

#[utoipa::path(delete, path = "/v1/keys/{key_id}", tag = "governance",
    params(("key_id" = String, Path, description = "Key id")),
    responses(
        (status = 204, description = "Revoked (also when it already was)"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn revoke_key(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(key_id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    st.run(&caller, ops::RevokeKey { key_id }).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/quotas/{tenant}", tag = "governance",
    params(("tenant" = String, Path, description = "Tenant")),
    responses(
        (status = 200, description = "The tenant's quota and current use", body = TenantQuota),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn get_quota(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(tenant): ApiPath<String>,
) -> Result<ApiJson<TenantQuota>, ApiError> {
    Ok(ApiJson(st.run(&caller, ops::GetQuota { tenant }).await?))
}

#[utoipa::path(put, path = "/v1/quotas/{tenant}", tag = "governance",
    params(("tenant" = String, Path, description = "Tenant")),
    request_body(content = Quota, description = "The whole quota: absent fields are unlimited"),
    responses(
        (status = 200, description = "The tenant's quota and current use", body = TenantQuota),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn set_quota(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(tenant): ApiPath<String>,
    ApiJson(quota): ApiJson<Quota>,
) -> Result<ApiJson<TenantQuota>, ApiError> {
    Ok(ApiJson(
        st.run(&caller, ops::SetQuota { tenant, quota }).await?,
    ))
}

#[utoipa::path(get, path = "/v1/usage", tag = "governance", params(UsageQuery),
    responses(
        (status = 200, description = "Metered use per tenant and sandbox", body = UsageReport),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn usage(
    State(st): St,
    Auth(caller): Auth,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> Result<ApiJson<UsageReport>, ApiError> {
    // An admin acting for a tenant (header) means that tenant, not every tenant.
    let tenant = q.tenant.or_else(|| {
        headers
            .contains_key(TENANT_HEADER)
            .then(|| caller.tenant.clone())
    });
    let op = ops::GetUsage {
        tenant,
        since: q.since,
    };
    Ok(ApiJson(st.run(&caller, op).await?))
}

#[utoipa::path(get, path = "/v1/audit", tag = "governance", params(AuditQuery),
    responses(
        (status = 200, description = "Audit entries, oldest first", body = AuditList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn audit_list(
    State(st): St,
    Auth(caller): Auth,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> Result<ApiJson<AuditList>, ApiError> {
    let op = ops::ListAudit {
        after: q.after.unwrap_or(0),
        since: q.since,
        limit: q.limit,
    };
    Ok(ApiJson(st.run(&caller, op).await?))
}

#[utoipa::path(get, path = "/v1/audit/verify", tag = "governance",
    responses(
        (status = 200, description = "Whether the hash chain holds, else its first bad entry", body = AuditVerification),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn audit_verify(
    State(st): St,
    Auth(caller): Auth,
) -> Result<ApiJson<AuditVerification>, ApiError> {
    Ok(ApiJson(st.run(&caller, ops::VerifyAudit).await?))
}

#[utoipa::path(get, path = "/metrics", tag = "meta",
    responses(
        (status = 200, description = "Prometheus text format (needs the `admin` scope)", content_type = "text/plain"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn metrics(State(st): St, Auth(caller): Auth) -> Result<Response, ApiError> {
    let counts = st.run(&caller, ops::SandboxCounts).await?;
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        st.metrics.render(&counts, st.manager.metrics()),
    )
        .into_response())
}
