//! The REST routes: thin translators from HTTP to one [`Manager`] call each.
//!
//! (Over 600 lines: one short handler per route, each parsing HTTP into one operation
//! (`threadbox_api::ops`) and answering its output, plus the router's own tests. The
//! handlers still repeat one shape (duplicates D38); a generic handler over `Operation`
//! for the path-only routes is the next step.)

use crate::auth::{self, Auth};
use crate::error::ApiError;
use crate::mcp::{
    self, Backend, BackendError, ManagerBackend, McpOptions, ResolveBackend, ThreadboxMcp,
};
use crate::metrics::{self, Metrics};
use crate::openapi;
use crate::origin;
use crate::{context_routes, gov_routes, image_routes};
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures::StreamExt;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::StreamableHttpService;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use threadbox_api::routes;
use threadbox_api::*;
use threadbox_core::ops::{self, FileTarget, Run};
use threadbox_core::{Caller, Manager};
use utoipa::{IntoParams, ToSchema};

/// Bound on JSON request bodies.
pub const MAX_JSON_BODY_BYTES: usize = 1 << 20;
/// Default bound on a file upload (`PUT /files`).
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 1 << 30;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<Manager>,
    /// Bound on one file upload, in bytes.
    pub max_upload_bytes: u64,
    /// Host/Origin checks of every route (`/mcp` and `/v1`; see origin.rs).
    pub mcp: McpOptions,
}

impl AppState {
    pub fn new(manager: Arc<Manager>) -> Self {
        AppState {
            manager,
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            mcp: McpOptions::default(),
        }
    }
}

/// The router's state.
pub(crate) struct Shared {
    pub(crate) manager: Arc<Manager>,
    max_upload_bytes: u64,
    mcp: McpOptions,
    pub(crate) metrics: Arc<Metrics>,
    /// How many refused authentications reach the audit log (see auth.rs).
    pub(crate) refusals: threadbox_core::audit::RefusalBudget,
    /// The dashboard's sessions (ui_routes.rs).
    pub(crate) ui: crate::ui_routes::UiSessions,
}

impl Shared {
    /// Runs one operation for `caller`: the whole of most handlers.
    pub(crate) async fn run<O: Run>(&self, caller: &Caller, op: O) -> Result<O::Output, ApiError> {
        Ok(self.manager.run(caller, op).await?)
    }
}

pub(crate) type St = State<Arc<Shared>>;

/// The daemon's HTTP application.
pub fn app(state: AppState) -> Router {
    router(Shared {
        manager: state.manager,
        max_upload_bytes: state.max_upload_bytes,
        mcp: state.mcp,
        metrics: Arc::default(),
        refusals: Default::default(),
        ui: Default::default(),
    })
}

/// The application over `manager` as reached through `door` (router tests: the
/// manager runs over the fake tier, see `test_app.rs`).
#[cfg(test)]
pub(crate) fn app_for_tests(
    manager: Arc<Manager>,
    max_upload_bytes: u64,
    door: auth::Door,
) -> Router {
    router(Shared {
        manager,
        max_upload_bytes,
        mcp: McpOptions::default(),
        metrics: Arc::default(),
        refusals: Default::default(),
        ui: Default::default(),
    })
    .layer(axum::Extension(door))
}

/// `/mcp`: the MCP tools over Streamable HTTP, one manager call per tool call.
///
/// Auth: `/mcp` is a route of this router, so its layers run first: the auth layer
/// answers 401 without a valid key, else puts the [`Caller`] in the request's
/// extensions, and each tool call acts for that caller. No caller (which the auth layer
/// never lets through) fails closed.
fn mcp_service(shared: &Shared) -> StreamableHttpService<ThreadboxMcp, NeverSessionManager> {
    let manager = shared.manager.clone();
    let metrics = shared.metrics.clone();
    let resolve: ResolveBackend = Arc::new(move |parts| {
        let caller = parts
            .and_then(|p| p.extensions.get::<Caller>().cloned())
            .ok_or_else(|| BackendError::new(ErrorCode::Unauthenticated, "missing API key"))?;
        let backend: Arc<dyn Backend> =
            Arc::new(ManagerBackend::new(manager.clone(), caller).with_metrics(metrics.clone()));
        Ok(backend)
    });
    mcp::http_service(resolve, &shared.mcp)
}

fn router(shared: Shared) -> Router {
    let mcp = mcp_service(&shared);
    let host_origin = Arc::new(shared.mcp.clone());
    let gateway = Arc::new(crate::preview_routes::Gateway {
        manager: shared.manager.clone(),
        domain: shared.manager.preview_domain(),
    });
    let shared = Arc::new(shared);
    Router::new()
        .route(routes::HEALTHZ, get(healthz))
        // Stateless Streamable HTTP: POST only (GET and DELETE answer 405).
        .route_service(routes::MCP, mcp)
        .route(routes::OPENAPI, get(openapi_document))
        .route(routes::SANDBOXES, post(create_sandbox).get(list_sandboxes))
        .route(routes::SANDBOX, get(get_sandbox).delete(delete_sandbox))
        .route(routes::SANDBOX_PAUSE, post(pause_sandbox))
        .route(routes::SANDBOX_HIBERNATE, post(hibernate_sandbox))
        .route(routes::SANDBOX_RESUME, post(resume_sandbox))
        .route(routes::SANDBOX_STOP, post(stop_sandbox))
        .route(routes::SANDBOX_START, post(start_sandbox))
        .route(routes::EXEC, post(exec))
        .route(routes::EXEC_STREAM, post(exec_stream))
        .route(routes::PROCESSES, post(start_process).get(list_processes))
        .route(routes::PROCESS_LOGS, get(process_logs))
        .route(routes::PROCESS_KILL, post(kill_process))
        .route(
            routes::FILES,
            get(read_file).put(write_file).delete(remove_file),
        )
        .route(routes::FILES_LIST, get(list_files))
        .route(routes::FILES_STAT, get(stat_file))
        .route(routes::FILES_MKDIR, post(mkdir))
        .route(routes::SANDBOX_SELFTEST, get(selftest))
        .route(
            routes::CONTEXTS,
            post(context_routes::create_context).get(context_routes::list_contexts),
        )
        .route(
            routes::CONTEXT,
            axum::routing::delete(context_routes::delete_context).get(context_routes::get_context),
        )
        .route(
            routes::CONTEXT_RESTART,
            post(context_routes::restart_context),
        )
        .route(
            routes::CONTEXT_INTERRUPT,
            post(context_routes::interrupt_context),
        )
        .route(routes::CONTEXT_EXECUTE, post(context_routes::execute_code))
        .route(
            routes::CONTEXT_EXECUTE_STREAM,
            post(context_routes::execute_code_stream),
        )
        .route(
            routes::CONTEXT_EXECUTION,
            get(context_routes::get_execution),
        )
        .route(
            routes::SANDBOX_NETWORK,
            get(crate::net_routes::get_network).put(crate::net_routes::set_network),
        )
        .route(routes::SECRETS, get(crate::secret_routes::list_secrets))
        .route(
            routes::SECRET,
            axum::routing::put(crate::secret_routes::set_secret)
                .delete(crate::secret_routes::delete_secret),
        )
        .route(
            routes::SANDBOX_PREVIEWS,
            post(crate::preview_routes::create_preview).get(crate::preview_routes::list_previews),
        )
        .route(
            routes::SANDBOX_PREVIEW,
            axum::routing::delete(crate::preview_routes::delete_preview),
        )
        .route(
            routes::CHECKPOINTS,
            post(crate::ckpt_routes::create_checkpoint).get(crate::ckpt_routes::list_checkpoints),
        )
        .route(
            routes::CHECKPOINT,
            axum::routing::delete(crate::ckpt_routes::delete_checkpoint),
        )
        .route(routes::SANDBOX_REWIND, post(crate::ckpt_routes::rewind))
        .route(routes::SANDBOX_FORK, post(crate::ckpt_routes::fork))
        .route(
            routes::TEMPLATES,
            post(crate::template_routes::create_template)
                .get(crate::template_routes::list_templates),
        )
        .route(
            routes::TEMPLATE,
            get(crate::template_routes::get_template)
                .delete(crate::template_routes::delete_template),
        )
        .route(
            routes::SANDBOX_NETWORK_LOG,
            get(crate::net_log_routes::network_log),
        )
        .route(routes::TIERS, get(crate::tier_routes::list_tiers))
        .route(routes::SANDBOX_PTY, post(crate::pty_routes::open_pty))
        .route(routes::SANDBOX_PTY_WS, get(crate::pty_routes::pty_ws))
        .route(routes::EXEC_WS, get(crate::pty_routes::exec_ws))
        .route(routes::IMAGES, get(list_images).post(add_image))
        .route(routes::IMAGES_PULL, post(image_routes::pull_image))
        .route(routes::IMAGES_IMPORT, post(image_routes::import_image))
        .route(
            routes::IMAGE,
            axum::routing::delete(image_routes::remove_image),
        )
        .route(
            routes::KEYS,
            post(gov_routes::create_key).get(gov_routes::list_keys),
        )
        .route(routes::KEY, axum::routing::delete(gov_routes::revoke_key))
        .route(
            routes::QUOTA,
            get(gov_routes::get_quota).put(gov_routes::set_quota),
        )
        .route(routes::USAGE, get(gov_routes::usage))
        .route(routes::AUDIT, get(gov_routes::audit_list))
        .route(routes::AUDIT_VERIFY, get(gov_routes::audit_verify))
        .route(routes::METRICS, get(gov_routes::metrics))
        .merge(crate::ui_routes::routes())
        // Must come after the routes: it is installed on each existing method router.
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(route_not_found)
        // Applies to the buffering extractors (JSON, optional kill body); file uploads
        // read the raw body and enforce `max_upload_bytes` themselves.
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY_BYTES))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            panic_response,
        ))
        // Every route but /healthz and /v1/openapi.json needs a caller (see auth.rs).
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            auth::authenticate,
        ))
        // Before authentication: a browser page with a foreign Host or Origin gets a 403
        // and nothing else (see origin.rs).
        .layer(axum::middleware::from_fn_with_state(
            host_origin,
            origin::check_host_and_origin,
        ))
        .layer(axum::middleware::from_fn_with_state(
            shared.metrics.clone(),
            metrics::count_errors,
        ))
        // Outermost: refusals (401, 403, 429) are traced too (ADR 0090).
        .layer(axum::middleware::from_fn(crate::telemetry::trace_http))
        // Outside everything: a request addressed to a preview (by Host or `/preview/`)
        // is proxied to its sandbox and never meets the API's checks or routes
        // (preview_routes.rs, ADR 0072).
        .layer(axum::middleware::from_fn_with_state(
            gateway,
            crate::preview_routes::dispatch,
        ))
        .with_state(shared)
}

// ---- extractors whose rejections use the one error shape ------------------------------

/// `axum::Json` with rejections answered as [`ApiError`].
#[derive(FromRequest)]
#[from_request(via(axum::Json), rejection(ApiError))]
pub struct ApiJson<T>(pub T);

impl<T: Serialize> IntoResponse for ApiJson<T> {
    fn into_response(self) -> Response {
        axum::Json(self.0).into_response()
    }
}

/// `axum::extract::Query` with rejections answered as [`ApiError`].
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub struct ApiQuery<T>(pub T);

/// `axum::extract::Path` with rejections answered as [`ApiError`].
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub struct ApiPath<T>(pub T);

fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response {
    let cause = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("(no message)");
    tracing::error!(cause, "a request handler panicked");
    ApiError::new(ErrorCode::Internal, "internal error (see the daemon log)").into_response()
}

async fn route_not_found() -> ApiError {
    ApiError::not_found("no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

// ---- query parameters -----------------------------------------------------------------

/// `?force=true` on delete.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// Delete even when the sandbox is running.
    pub force: Option<bool>,
}

/// A path inside the sandbox and who accesses it.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FileQuery {
    /// Path inside the sandbox (relative paths are relative to the user's home).
    pub path: Option<String>,
    /// The path's bytes in base64, for a path that is not UTF-8 (instead of `path`).
    pub path_b64: Option<String>,
    /// `user` (default) or `root`.
    #[param(value_type = Option<User>)]
    pub user: Option<String>,
}

/// A path to read, who reads it, and optionally which bytes.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReadFileQuery {
    /// Path inside the sandbox (relative paths are relative to the user's home).
    pub path: Option<String>,
    /// The path's bytes in base64, for a path that is not UTF-8 (instead of `path`).
    pub path_b64: Option<String>,
    /// `user` (default) or `root`.
    #[param(value_type = Option<User>)]
    pub user: Option<String>,
    /// First byte to return (default 0). At or past the end of the file: an empty body.
    pub offset: Option<u64>,
    /// Most bytes to return (default: to the end of the file); at least 1.
    pub length: Option<u64>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RemoveFileQuery {
    /// Path inside the sandbox.
    pub path: Option<String>,
    /// The path's bytes in base64, for a path that is not UTF-8 (instead of `path`).
    pub path_b64: Option<String>,
    /// Remove a directory and everything in it.
    pub recursive: Option<bool>,
    /// `user` (default) or `root`.
    #[param(value_type = Option<User>)]
    pub user: Option<String>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct MkdirQuery {
    /// Path inside the sandbox.
    pub path: Option<String>,
    /// The path's bytes in base64, for a path that is not UTF-8 (instead of `path`).
    pub path_b64: Option<String>,
    /// Create missing parents; no error when the directory exists.
    pub parents: Option<bool>,
    /// `user` (default) or `root`.
    #[param(value_type = Option<User>)]
    pub user: Option<String>,
}

/// Raw bytes of a file, for the OpenAPI document.
#[derive(ToSchema)]
#[schema(value_type = String, format = Binary)]
pub struct RawBytes(#[allow(dead_code)] Vec<u8>);

fn parse_user(user: Option<&str>) -> Result<User, ApiError> {
    match user {
        None => Ok(User::Default),
        Some(s) => User::parse(s).ok_or_else(|| {
            ApiError::invalid(format!(
                "invalid user {s:?}: expected `user`, `root` or `default`"
            ))
        }),
    }
}

/// The file an operation names: the sandbox in the path, `path` (or `path_b64`, for a
/// path that is not UTF-8; ADR 0026) and `user` in the query.
fn target(
    sandbox: String,
    path: Option<String>,
    path_b64: Option<String>,
    user: Option<&str>,
) -> Result<FileTarget, ApiError> {
    use base64::Engine;
    let path = match (path, path_b64) {
        (Some(p), None) => p.into_bytes(),
        (None, Some(b)) => {
            // A `+` that was not percent-encoded arrives as a space.
            let b = b.trim().replace(' ', "+");
            base64::engine::general_purpose::STANDARD
                .decode(&b)
                .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(&b))
                .map_err(|e| ApiError::invalid(format!("`path_b64` is not base64: {e}")))?
        }
        (Some(_), Some(_)) => return Err(ApiError::invalid("give `path` or `path_b64`, not both")),
        (None, None) => return Err(ApiError::invalid("missing `path` (or `path_b64`)")),
    };
    Ok(FileTarget {
        sandbox,
        path,
        user: parse_user(user)?,
    })
}

fn file_target(sandbox: String, q: FileQuery) -> Result<FileTarget, ApiError> {
    target(sandbox, q.path, q.path_b64, q.user.as_deref())
}

/// Parses `label=k=v` (repeatable) and `state=...` of the list route.
pub(crate) fn parse_list_query(
    raw: Option<&str>,
) -> Result<(BTreeMap<String, String>, Option<SandboxState>), ApiError> {
    let mut labels = BTreeMap::new();
    let mut state = None;
    for (key, value) in form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        match key.as_ref() {
            "label" => {
                let (k, v) = value.split_once('=').ok_or_else(|| {
                    ApiError::invalid(format!(
                        "invalid label filter {value:?}: expected `key=value`"
                    ))
                })?;
                if k.is_empty() {
                    return Err(ApiError::invalid(format!(
                        "invalid label filter {value:?}: the key is empty"
                    )));
                }
                labels.insert(k.to_string(), v.to_string());
            }
            "state" => {
                let s = SandboxState::parse(&value).ok_or_else(|| {
                    ApiError::invalid(format!(
                        "invalid state {value:?}: expected creating, running, paused or stopped"
                    ))
                })?;
                state = Some(s);
            }
            other => {
                return Err(ApiError::invalid(format!(
                    "unknown query parameter {other:?}: expected `label` or `state`"
                )))
            }
        }
    }
    Ok((labels, state))
}

// ---- handlers -------------------------------------------------------------------------

#[utoipa::path(get, path = routes::HEALTHZ, tag = "meta",
    responses((status = 200, description = "The daemon is up", body = Health)))]
pub(crate) async fn healthz() -> ApiJson<Health> {
    ApiJson(Health {
        status: "ok".to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
    })
}

#[utoipa::path(get, path = routes::OPENAPI, tag = "meta",
    responses((status = 200, description = "This OpenAPI document", content_type = "application/json")))]
pub(crate) async fn openapi_document() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        openapi::openapi_json_cached(),
    )
        .into_response()
}

#[utoipa::path(post, path = routes::SANDBOXES, tag = "sandboxes",
    request_body = CreateSandboxRequest,
    responses(
        (status = 201, description = "Created", body = CreatedSandbox),
        (status = 200, description = "A sandbox of that name already existed", body = CreatedSandbox),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn create_sandbox(
    State(st): St,
    Auth(caller): Auth,
    ApiJson(req): ApiJson<CreateSandboxRequest>,
) -> Result<(StatusCode, ApiJson<CreatedSandbox>), ApiError> {
    let out = st.run(&caller, ops::CreateSandbox(req)).await?;
    let status = if out.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, ApiJson(out)))
}

#[utoipa::path(get, path = routes::SANDBOXES, tag = "sandboxes",
    params(
        ("label" = Option<Vec<String>>, Query, explode = true,
            description = "`key=value`; repeat to require several labels"),
        ("state" = Option<SandboxState>, Query, description = "Only sandboxes in this state")),
    responses(
        (status = 200, description = "Matching sandboxes", body = SandboxList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn list_sandboxes(
    State(st): St,
    Auth(caller): Auth,
    RawQuery(raw): RawQuery,
) -> Result<ApiJson<SandboxList>, ApiError> {
    let (labels, state) = parse_list_query(raw.as_deref())?;
    let op = ops::ListSandboxes { labels, state };
    Ok(ApiJson(st.run(&caller, op).await?))
}

#[utoipa::path(get, path = routes::SANDBOX, tag = "sandboxes",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "The sandbox", body = Sandbox),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn get_sandbox(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<Sandbox>, ApiError> {
    Ok(ApiJson(st.run(&caller, ops::GetSandbox { sandbox }).await?))
}

#[utoipa::path(delete, path = routes::SANDBOX, tag = "sandboxes",
    params(("sandbox" = String, Path, description = "Sandbox id or name"), DeleteQuery),
    responses(
        (status = 204, description = "Deleted"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn delete_sandbox(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiQuery(q): ApiQuery<DeleteQuery>,
) -> Result<StatusCode, ApiError> {
    let force = q.force.unwrap_or(false);
    st.run(&caller, ops::DeleteSandbox { sandbox, force })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = routes::SANDBOX_PAUSE, tag = "sandboxes",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "The paused sandbox", body = Sandbox),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn pause_sandbox(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<Sandbox>, ApiError> {
    Ok(ApiJson(
        st.run(&caller, ops::PauseSandbox { sandbox }).await?,
    ))
}

#[utoipa::path(post, path = routes::SANDBOX_HIBERNATE, tag = "sandboxes",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "The hibernated sandbox", body = Sandbox),
        (status = 503, description = "The tier or the host cannot hibernate (e.g. no swap)", body = ErrorResponse),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn hibernate_sandbox(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<Sandbox>, ApiError> {
    Ok(ApiJson(
        st.run(&caller, ops::HibernateSandbox { sandbox }).await?,
    ))
}

#[utoipa::path(post, path = routes::SANDBOX_RESUME, tag = "sandboxes",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "The resumed sandbox", body = Sandbox),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn resume_sandbox(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<Sandbox>, ApiError> {
    Ok(ApiJson(
        st.run(&caller, ops::ResumeSandbox { sandbox }).await?,
    ))
}

#[utoipa::path(post, path = routes::SANDBOX_STOP, tag = "sandboxes",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "The stopped sandbox", body = Sandbox),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn stop_sandbox(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<Sandbox>, ApiError> {
    Ok(ApiJson(
        st.run(&caller, ops::StopSandbox { sandbox }).await?,
    ))
}

#[utoipa::path(post, path = routes::SANDBOX_START, tag = "sandboxes",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "The started sandbox", body = Sandbox),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn start_sandbox(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<Sandbox>, ApiError> {
    Ok(ApiJson(
        st.run(&caller, ops::StartSandbox { sandbox }).await?,
    ))
}

#[utoipa::path(post, path = routes::EXEC, tag = "exec",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    request_body = ExecRequest,
    responses(
        (status = 200, description = "The process ran to completion (or timed out)", body = ExecResponse),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn exec(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiJson(req): ApiJson<ExecRequest>,
) -> Result<ApiJson<ExecResponse>, ApiError> {
    let started = std::time::Instant::now();
    let op = ops::Exec {
        sandbox,
        request: req,
    };
    let result = st.run(&caller, op).await?;
    st.metrics.record_exec(started.elapsed());
    Ok(ApiJson(result))
}

#[utoipa::path(post, path = routes::EXEC_STREAM, tag = "exec",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    request_body = ExecRequest,
    responses(
        (status = 200, description = "NDJSON: one `ExecEvent` per line: `start`, then `stdout`/`stderr`, then `end` or `error`",
            body = ExecEvent, content_type = "application/x-ndjson"),
        (status = "default", description = "Error before the process started", body = ErrorResponse)))]
pub(crate) async fn exec_stream(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiJson(req): ApiJson<ExecRequest>,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let op = ops::ExecStream(ops::Exec {
        sandbox,
        request: req,
    });
    let rx = st.run(&caller, op).await?;
    let lines = exec_event_lines(rx, st.metrics.clone(), started);
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(lines),
    )
        .into_response())
}

/// The NDJSON lines of a streamed exec. Stops after the terminal event; a channel that
/// closes without one ends with an `error` event, so a client never mistakes a cut stream
/// for a finished process. The `end` event records the call in the exec histogram, from
/// `started` (the request) to the process's end, as `exec` does for a buffered call.
fn exec_event_lines(
    rx: tokio::sync::mpsc::Receiver<ExecEvent>,
    metrics: Arc<Metrics>,
    started: std::time::Instant,
) -> impl futures::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    futures::stream::unfold((rx, false), move |(mut rx, finished)| {
        let metrics = metrics.clone();
        async move {
            if finished {
                return None;
            }
            let (event, terminal) = match rx.recv().await {
                Some(ev) => {
                    let terminal = matches!(ev, ExecEvent::End { .. } | ExecEvent::Error { .. });
                    (ev, terminal)
                }
                None => (
                    {
                        tracing::error!("an exec stream ended without an end event");
                        ExecEvent::Error {
                            code: ErrorCode::Internal,
                            message: "the exec stream ended without an end event".to_string(),
                        }
                    },
                    true,
                ),
            };
            if matches!(event, ExecEvent::End { .. }) {
                metrics.record_exec(started.elapsed());
            }
            Some((Ok(ndjson_line(&event)), (rx, terminal)))
        }
    })
}

fn ndjson_line(event: &ExecEvent) -> Bytes {
    let mut line = serde_json::to_vec(event).unwrap_or_else(|err| {
        tracing::error!(%err, "cannot serialize an exec event");
        br#"{"type":"error","code":"internal","message":"cannot serialize an exec event"}"#.to_vec()
    });
    line.push(b'\n');
    Bytes::from(line)
}

#[utoipa::path(post, path = routes::PROCESSES, tag = "processes",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    request_body = StartProcessRequest,
    responses(
        (status = 201, description = "Started", body = ProcessInfo),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn start_process(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiJson(req): ApiJson<StartProcessRequest>,
) -> Result<(StatusCode, ApiJson<ProcessInfo>), ApiError> {
    let op = ops::StartProcess {
        sandbox,
        request: req,
    };
    let info = st.run(&caller, op).await?;
    Ok((StatusCode::CREATED, ApiJson(info)))
}

#[utoipa::path(get, path = routes::PROCESSES, tag = "processes",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "Background processes", body = ProcessList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn list_processes(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<ProcessList>, ApiError> {
    Ok(ApiJson(
        st.run(&caller, ops::ListProcesses { sandbox }).await?,
    ))
}

#[utoipa::path(get, path = routes::PROCESS_LOGS, tag = "processes",
    params(
        ("sandbox" = String, Path, description = "Sandbox id or name"),
        ("process_id" = u64, Path, description = "Background process id")),
    responses(
        (status = 200, description = "Captured output", body = ProcessLogs),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn process_logs(
    State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, process_id)): ApiPath<(String, u64)>,
) -> Result<ApiJson<ProcessLogs>, ApiError> {
    let op = ops::GetProcessLogs {
        sandbox,
        process_id,
    };
    Ok(ApiJson(st.run(&caller, op).await?))
}

#[utoipa::path(post, path = routes::PROCESS_KILL, tag = "processes",
    params(
        ("sandbox" = String, Path, description = "Sandbox id or name"),
        ("process_id" = u64, Path, description = "Background process id")),
    request_body(content = Option<KillProcessRequest>, description = "Optional; default signal 9"),
    responses(
        (status = 204, description = "Signal sent"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn kill_process(
    State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, process_id)): ApiPath<(String, u64)>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let req: KillProcessRequest = if body.iter().all(u8::is_ascii_whitespace) {
        KillProcessRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|err| ApiError::invalid(format!("invalid kill request: {err}")))?
    };
    let op = ops::KillProcess {
        sandbox,
        process_id,
        signal: req.signal,
    };
    st.run(&caller, op).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = routes::FILES, tag = "files",
    params(("sandbox" = String, Path, description = "Sandbox id or name"), ReadFileQuery),
    responses(
        (status = 200, description = "The file's bytes (those of `offset`/`length` when given)", body = RawBytes, content_type = "application/octet-stream"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn read_file(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiQuery(q): ApiQuery<ReadFileQuery>,
) -> Result<Response, ApiError> {
    let op = ops::ReadFile {
        target: target(sandbox, q.path, q.path_b64, q.user.as_deref())?,
        offset: q.offset.unwrap_or(0),
        length: q.length,
    };
    let chunks = st.run(&caller, op).await?;
    let body = chunks.map(|chunk| {
        chunk.map(Bytes::from).map_err(|err| {
            // Headers are gone already: the client sees a cut body.
            tracing::warn!(error = %crate::error::ErrorChain(&err), "file read failed mid-stream");
            std::io::Error::other(err.public_message())
        })
    });
    // A sandbox's file is hostile content: never rendered on the daemon's origin (where
    // the dashboard's session lives), always a download (ADR 0096).
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            ),
            (
                header::CONTENT_DISPOSITION,
                HeaderValue::from_static("attachment"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (
                header::CONTENT_SECURITY_POLICY,
                HeaderValue::from_static("sandbox"),
            ),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

#[utoipa::path(put, path = routes::FILES, tag = "files",
    params(("sandbox" = String, Path, description = "Sandbox id or name"), FileQuery),
    request_body(content = RawBytes, content_type = "application/octet-stream",
        description = "The new contents (replaces the file)"),
    responses(
        (status = 204, description = "Written"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn write_file(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let target = file_target(sandbox, q)?;
    let limit = st.max_upload_bytes;
    let too_large = || ApiError::too_large(format!("file uploads are limited to {limit} bytes"));
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        if len > limit {
            return Err(too_large());
        }
    }
    let exceeded = Arc::new(AtomicBool::new(false));
    let flag = exceeded.clone();
    let mut seen: u64 = 0;
    let body = body
        .into_data_stream()
        .map(move |chunk| match chunk {
            Ok(bytes) => {
                seen = seen.saturating_add(bytes.len() as u64);
                if seen > limit {
                    flag.store(true, Ordering::Relaxed);
                    Err(format!("file uploads are limited to {limit} bytes"))
                } else {
                    Ok(bytes.to_vec())
                }
            }
            Err(err) => Err(format!("reading the request body failed: {err}")),
        })
        .boxed();
    let result = st.run(&caller, ops::WriteFile { target, body }).await;
    if exceeded.load(Ordering::Relaxed) {
        return Err(too_large());
    }
    result?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(delete, path = routes::FILES, tag = "files",
    params(("sandbox" = String, Path, description = "Sandbox id or name"), RemoveFileQuery),
    responses(
        (status = 204, description = "Removed"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn remove_file(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiQuery(q): ApiQuery<RemoveFileQuery>,
) -> Result<StatusCode, ApiError> {
    let op = ops::RemoveFile {
        target: target(sandbox, q.path, q.path_b64, q.user.as_deref())?,
        recursive: q.recursive.unwrap_or(false),
    };
    st.run(&caller, op).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = routes::FILES_LIST, tag = "files",
    params(("sandbox" = String, Path, description = "Sandbox id or name"), FileQuery),
    responses(
        (status = 200, description = "Directory entries", body = FileList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn list_files(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> Result<ApiJson<FileList>, ApiError> {
    let op = ops::ListFiles(file_target(sandbox, q)?);
    Ok(ApiJson(st.run(&caller, op).await?))
}

#[utoipa::path(get, path = routes::FILES_STAT, tag = "files",
    params(("sandbox" = String, Path, description = "Sandbox id or name"), FileQuery),
    responses(
        (status = 200, description = "The entry", body = FileEntry),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn stat_file(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiQuery(q): ApiQuery<FileQuery>,
) -> Result<ApiJson<FileEntry>, ApiError> {
    let op = ops::StatFile(file_target(sandbox, q)?);
    Ok(ApiJson(st.run(&caller, op).await?))
}

#[utoipa::path(post, path = routes::FILES_MKDIR, tag = "files",
    params(("sandbox" = String, Path, description = "Sandbox id or name"), MkdirQuery),
    responses(
        (status = 204, description = "Created"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn mkdir(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiQuery(q): ApiQuery<MkdirQuery>,
) -> Result<StatusCode, ApiError> {
    let op = ops::Mkdir {
        target: target(sandbox, q.path, q.path_b64, q.user.as_deref())?,
        parents: q.parents.unwrap_or(false),
    };
    st.run(&caller, op).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = routes::SANDBOX_SELFTEST, tag = "sandboxes",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "Isolation checks run inside the sandbox", body = SelftestReport),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn selftest(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<SelftestReport>, ApiError> {
    Ok(ApiJson(st.run(&caller, ops::Selftest { sandbox }).await?))
}

#[utoipa::path(get, path = routes::IMAGES, tag = "images",
    responses(
        (status = 200, description = "Known images", body = ImageList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn list_images(
    State(st): St,
    Auth(caller): Auth,
) -> Result<ApiJson<ImageList>, ApiError> {
    Ok(ApiJson(st.run(&caller, ops::ListImages).await?))
}

#[utoipa::path(post, path = routes::IMAGES, tag = "images",
    request_body = AddImageRequest,
    responses(
        (status = 201, description = "Added", body = Image),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn add_image(
    State(st): St,
    Auth(caller): Auth,
    ApiJson(req): ApiJson<AddImageRequest>,
) -> Result<(StatusCode, ApiJson<Image>), ApiError> {
    let image = st.run(&caller, ops::AddImage(req)).await?;
    Ok((StatusCode::CREATED, ApiJson(image)))
}

#[cfg(test)]
mod exec_stream_tests {
    use super::*;

    fn exec_count(metrics: &Metrics) -> String {
        let text = metrics.render(
            &threadbox_api::ops::MetricsSnapshot::default(),
            &threadbox_core::metrics::CoreMetrics::default(),
        );
        text.lines()
            .find(|l| l.starts_with("threadbox_exec_duration_seconds_count "))
            .map(str::to_string)
            .unwrap_or_default()
    }

    async fn drain(events: Vec<ExecEvent>, metrics: Arc<Metrics>) -> Vec<Bytes> {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        for ev in events {
            tx.send(ev).await.expect("the receiver is alive");
        }
        drop(tx);
        exec_event_lines(rx, metrics, std::time::Instant::now())
            .map(|line| match line {
                Ok(bytes) => bytes,
                Err(never) => match never {},
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn a_streamed_exec_is_counted_in_the_exec_histogram_once_it_ends() {
        let metrics = Arc::new(Metrics::default());
        let lines = drain(
            vec![
                ExecEvent::Start { pid: 7 },
                ExecEvent::Stdout {
                    data: "hi\n".into(),
                    encoding: Encoding::Utf8,
                },
                ExecEvent::End {
                    exit_code: Some(0),
                    signal: None,
                    timed_out: false,
                    truncated: false,
                    duration_ms: 1,
                    oom_killed: false,
                    memory_limit_bytes: None,
                },
            ],
            metrics.clone(),
        )
        .await;
        assert_eq!(lines.len(), 3);
        assert_eq!(
            exec_count(&metrics),
            "threadbox_exec_duration_seconds_count 1"
        );
    }

    #[tokio::test]
    async fn a_stream_cut_before_its_end_is_not_counted() {
        let metrics = Arc::new(Metrics::default());
        let lines = drain(vec![ExecEvent::Start { pid: 7 }], metrics.clone()).await;
        assert_eq!(lines.len(), 2, "start, then the synthetic error");
        assert!(String::from_utf8_lossy(&lines[1]).contains("\"error\""));
        assert_eq!(
            exec_count(&metrics),
            "threadbox_exec_duration_seconds_count 0"
        );
    }
}

#[cfg(test)]
mod route_table_tests {
    use super::*;
    use axum::http::{Method, Request};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    /// The router and `threadbox_api::routes` (which the Rust client builds its URLs
    /// from) are one table: every template there is routed here.
    #[tokio::test]
    async fn every_shared_path_template_is_routed() {
        let app = crate::test_app::TestApp::socket(1024).await;
        for template in routes::ALL {
            let values: Vec<&str> = routes::placeholders(template).iter().map(|_| "7").collect();
            let uri = routes::fill(template, &values);
            let mut routed = false;
            for method in [Method::GET, Method::POST, Method::PUT, Method::DELETE] {
                let req = Request::builder()
                    .method(method)
                    .uri(&uri)
                    .body(Body::empty())
                    .expect("a request");
                let resp = app
                    .router
                    .clone()
                    .oneshot(req)
                    .await
                    .expect("the router is infallible");
                let status = resp.status();
                let body = resp.into_body().collect().await.expect("a body").to_bytes();
                if !(status == StatusCode::NOT_FOUND
                    && String::from_utf8_lossy(&body).contains("no such route"))
                {
                    routed = true;
                    break;
                }
            }
            assert!(routed, "{template} ({uri}) is not routed");
        }
        // And the check can fail: a path outside the table is not routed.
        let resp = app
            .router
            .clone()
            .oneshot(
                Request::get("/v1/sandboxes/7/nope")
                    .body(Body::empty())
                    .expect("a request"),
            )
            .await
            .expect("the router is infallible");
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    }
}
