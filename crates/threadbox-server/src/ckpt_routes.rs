//! Checkpoints, rewind and fork (issue 14, ADR 0100): thin handlers over the operations of
//! `threadbox_api::checkpoints`.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::routes::{ApiJson, ApiPath, St};
use axum::extract::State;
use axum::http::StatusCode;
use threadbox_api::checkpoints::*;
use threadbox_api::{routes, ErrorResponse, Sandbox};

#[utoipa::path(post, path = routes::CHECKPOINTS, tag = "checkpoints",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    request_body = CreateCheckpointRequest,
    responses(
        (status = 201, description = "Taken (the sandbox was frozen for the instant)", body = Checkpoint),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn create_checkpoint(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiJson(request): ApiJson<CreateCheckpointRequest>,
) -> Result<(StatusCode, ApiJson<Checkpoint>), ApiError> {
    let out = st
        .run(&caller, CreateCheckpoint { sandbox, request })
        .await?;
    Ok((StatusCode::CREATED, ApiJson(out)))
}

#[utoipa::path(get, path = routes::CHECKPOINTS, tag = "checkpoints",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "The sandbox's checkpoints, oldest first", body = CheckpointList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn list_checkpoints(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<CheckpointList>, ApiError> {
    Ok(ApiJson(st.run(&caller, ListCheckpoints { sandbox }).await?))
}

#[utoipa::path(delete, path = routes::CHECKPOINT, tag = "checkpoints",
    params(("sandbox" = String, Path, description = "Sandbox id or name"),
        ("checkpoint" = String, Path, description = "Checkpoint label or id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn delete_checkpoint(
    State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, checkpoint)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    st.run(
        &caller,
        DeleteCheckpoint {
            sandbox,
            checkpoint,
        },
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = routes::SANDBOX_REWIND, tag = "checkpoints",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    request_body = RewindRequest,
    responses(
        (status = 200, description = "Running on the checkpoint's disk (processes restarted; id and name kept)", body = Sandbox),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn rewind(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiJson(request): ApiJson<RewindRequest>,
) -> Result<ApiJson<Sandbox>, ApiError> {
    Ok(ApiJson(st.run(&caller, Rewind { sandbox, request }).await?))
}

#[utoipa::path(post, path = routes::SANDBOX_FORK, tag = "checkpoints",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    request_body = ForkRequest,
    responses(
        (status = 201, description = "The new sandboxes, running, with the sandbox's files at this instant", body = ForkResponse),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn fork(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiJson(request): ApiJson<ForkRequest>,
) -> Result<(StatusCode, ApiJson<ForkResponse>), ApiError> {
    let out = st.run(&caller, Fork { sandbox, request }).await?;
    Ok((StatusCode::CREATED, ApiJson(out)))
}
