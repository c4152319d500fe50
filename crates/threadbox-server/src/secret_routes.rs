//! REST handlers of a tenant's secrets (issue 13, ADR 0068): thin over `SetSecret`,
//! `ListSecrets` and `DeleteSecret` (ADR 0057). No handler answers a value.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::routes::{ApiJson, ApiPath, St};
use axum::extract::State;
use axum::http::StatusCode;
use threadbox_api::secrets::{
    DeleteSecret, ListSecrets, SecretInfo, SecretList, SetSecret, SetSecretRequest,
};
use threadbox_api::*;

#[utoipa::path(put, path = routes::SECRET, tag = "secrets",
    params(("name" = String, Path, description = "Secret name (the env variable of its placeholder)")),
    request_body = SetSecretRequest,
    responses(
        (status = 200, description = "Stored (sealed); the answer never holds the value", body = SecretInfo),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn set_secret(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(name): ApiPath<String>,
    ApiJson(req): ApiJson<SetSecretRequest>,
) -> Result<ApiJson<SecretInfo>, ApiError> {
    Ok(ApiJson(st.run(&caller, SetSecret { name, req }).await?))
}

#[utoipa::path(get, path = routes::SECRETS, tag = "secrets",
    responses(
        (status = 200, description = "The tenant's secrets: names, hosts, headers; never values", body = SecretList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn list_secrets(
    State(st): St,
    Auth(caller): Auth,
) -> Result<ApiJson<SecretList>, ApiError> {
    Ok(ApiJson(st.run(&caller, ListSecrets).await?))
}

#[utoipa::path(delete, path = routes::SECRET, tag = "secrets",
    params(("name" = String, Path, description = "Secret name")),
    responses(
        (status = 204, description = "Removed; sandboxes holding its placeholder no longer get the value"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn delete_secret(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    st.run(&caller, DeleteSecret { name }).await?;
    Ok(StatusCode::NO_CONTENT)
}
