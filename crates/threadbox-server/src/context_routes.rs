//! Interpreter contexts (issue 15, ADR 0080): thin handlers over the operations of
//! `threadbox_api::interp`.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::routes::{ApiJson, ApiPath, St};
use axum::extract::State;
use axum::http::StatusCode;
use threadbox_api::interp::*;
use threadbox_api::{routes, ErrorResponse};

#[utoipa::path(post, path = routes::CONTEXTS, tag = "contexts",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    request_body = CreateContextRequest,
    responses(
        (status = 201, description = "Created", body = Context),
        (status = 200, description = "A context of that name already existed", body = Context),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn create_context(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiJson(request): ApiJson<CreateContextRequest>,
) -> Result<(StatusCode, ApiJson<Context>), ApiError> {
    let out = st.run(&caller, CreateContext { sandbox, request }).await?;
    let status = if out.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, ApiJson(out)))
}

#[utoipa::path(get, path = routes::CONTEXTS, tag = "contexts",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "The sandbox's contexts", body = ContextList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn list_contexts(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<ContextList>, ApiError> {
    Ok(ApiJson(st.run(&caller, ListContexts { sandbox }).await?))
}

#[utoipa::path(delete, path = routes::CONTEXT, tag = "contexts",
    params(("sandbox" = String, Path, description = "Sandbox id or name"),
        ("context" = String, Path, description = "Context id or name")),
    responses(
        (status = 204, description = "Deleted (its processes are killed)"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn delete_context(
    State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, context)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    st.run(&caller, DeleteContext { sandbox, context }).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = routes::CONTEXT_RESTART, tag = "contexts",
    params(("sandbox" = String, Path, description = "Sandbox id or name"),
        ("context" = String, Path, description = "Context id or name")),
    responses(
        (status = 200, description = "A fresh worker (`generation` + 1); the state is lost", body = Context),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn restart_context(
    State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, context)): ApiPath<(String, String)>,
) -> Result<ApiJson<Context>, ApiError> {
    Ok(ApiJson(
        st.run(&caller, RestartContext { sandbox, context }).await?,
    ))
}

#[utoipa::path(post, path = routes::CONTEXT_INTERRUPT, tag = "contexts",
    params(("sandbox" = String, Path, description = "Sandbox id or name"),
        ("context" = String, Path, description = "Context id or name")),
    responses(
        (status = 200, description = "Whether a running cell was interrupted", body = InterruptResult),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn interrupt_context(
    State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, context)): ApiPath<(String, String)>,
) -> Result<ApiJson<InterruptResult>, ApiError> {
    Ok(ApiJson(
        st.run(&caller, InterruptContext { sandbox, context })
            .await?,
    ))
}

#[utoipa::path(post, path = routes::CONTEXT_EXECUTE, tag = "contexts",
    params(("sandbox" = String, Path, description = "Sandbox id or name"),
        ("context" = String, Path, description = "Context id or name; `python` is created on first use")),
    request_body = ExecuteCodeRequest,
    responses(
        (status = 200, description = "The cell's outcome; an exception in the code is a result (`status: exception`)", body = CodeExecution),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn execute_code(
    State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, context)): ApiPath<(String, String)>,
    ApiJson(request): ApiJson<ExecuteCodeRequest>,
) -> Result<ApiJson<CodeExecution>, ApiError> {
    let op = ExecuteCode {
        sandbox,
        context,
        request,
    };
    Ok(ApiJson(st.run(&caller, op).await?))
}
