//! Interpreter contexts (issue 15, ADR 0080): thin handlers over the operations of
//! `threadbox_api::interp`.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::routes::{ApiJson, ApiPath, St};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use threadbox_api::interp::*;
use threadbox_api::{routes, ErrorCode, ErrorResponse};
use threadbox_core::manager::{ExecuteCodeStream, GetExecution};

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

#[utoipa::path(get, path = routes::CONTEXT, tag = "contexts",
    params(("sandbox" = String, Path, description = "Sandbox id or name"),
        ("context" = String, Path, description = "Context id or name")),
    responses(
        (status = 200, description = "The context; `state: dead` with a `reason` (`oom`, `killed`, `exited:<code>`) when its worker died", body = Context),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn get_context(
    State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, context)): ApiPath<(String, String)>,
) -> Result<ApiJson<Context>, ApiError> {
    Ok(ApiJson(
        st.run(&caller, GetContext { sandbox, context }).await?,
    ))
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

#[utoipa::path(post, path = routes::CONTEXT_EXECUTE_STREAM, tag = "contexts",
    params(("sandbox" = String, Path, description = "Sandbox id or name"),
        ("context" = String, Path, description = "Context id or name; `python` is created on first use")),
    request_body = ExecuteCodeRequest,
    responses(
        (status = 200, description = "NDJSON: one `CodeEvent` per line as the cell runs: `start`, then `stdout`/`stderr`/`display`/`result`/`exception`, then `end` or `error`. Closing the connection interrupts the cell",
            body = CodeEvent, content_type = "application/x-ndjson"),
        (status = "default", description = "Error before the cell started (e.g. 409 `context_busy`)", body = ErrorResponse)))]
pub(crate) async fn execute_code_stream(
    State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, context)): ApiPath<(String, String)>,
    ApiJson(request): ApiJson<ExecuteCodeRequest>,
) -> Result<Response, ApiError> {
    let op = ExecuteCodeStream(ExecuteCode {
        sandbox,
        context,
        request,
    });
    Ok(ndjson(st.run(&caller, op).await?))
}

#[utoipa::path(get, path = routes::CONTEXT_EXECUTION, tag = "contexts",
    params(("sandbox" = String, Path, description = "Sandbox id or name"),
        ("context" = String, Path, description = "Context id or name"),
        ("execution" = String, Path, description = "The `execution_id` of a `start` event or a `CodeExecution`")),
    responses(
        (status = 200, description = "NDJSON, as `execute/stream`: the execution's kept events from its `start`, then the new ones to its `end`. Works after a daemon restart; leaving does not interrupt the cell",
            body = CodeEvent, content_type = "application/x-ndjson"),
        (status = "default", description = "Error (404: not an execution of this context, or no longer kept)", body = ErrorResponse)))]
pub(crate) async fn get_execution(
    State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, context, execution)): ApiPath<(String, String, String)>,
) -> Result<Response, ApiError> {
    let op = GetExecution {
        sandbox,
        context,
        execution,
    };
    Ok(ndjson(st.run(&caller, op).await?))
}

/// A silent stream writes a `keepalive` line this often: writing is how a client that
/// closed its connection is noticed (hyper does not watch an idle response's socket).
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(5);

/// The NDJSON response of a code event stream. It stops after `end` or `error`; a
/// channel that closes without one ends with an `error` line, so a client never takes
/// a cut stream for a finished cell.
fn ndjson(rx: tokio::sync::mpsc::Receiver<CodeEvent>) -> Response {
    let lines = futures::stream::unfold((rx, false), |(mut rx, finished)| async move {
        if finished {
            return None;
        }
        let ev = match tokio::time::timeout(KEEPALIVE, rx.recv()).await {
            Ok(Some(ev)) => ev,
            Ok(None) => CodeEvent::Error {
                code: ErrorCode::Internal,
                message: "the code stream ended without an end event".into(),
            },
            Err(_) => CodeEvent::Keepalive,
        };
        let terminal = matches!(ev, CodeEvent::End { .. } | CodeEvent::Error { .. });
        let mut line = serde_json::to_vec(&ev).unwrap_or_else(|err| {
            tracing::error!(%err, "cannot serialize a code event");
            br#"{"type":"error","code":"internal","message":"cannot serialize a code event"}"#
                .to_vec()
        });
        line.push(b'\n');
        Some((
            Ok::<_, std::convert::Infallible>(Bytes::from(line)),
            (rx, terminal),
        ))
    });
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(lines),
    )
        .into_response()
}
