//! Port previews (issue 13, scope 5; ADR 0072): the REST handlers of
//! `threadbox_api::previews` and the **preview gateway**, the outermost layer of the
//! router, which takes every request addressed to a preview before the API sees it.
//!
//! A request is a preview request when
//! - its `Host` is `{port}-{id}.<preview domain>` (the host form; any path), or
//! - its path starts with `/preview/` (the path form, `/preview/{id}/{port}/...`).
//!
//! Such a request never reaches the API's routes, its Host/Origin checks or its
//! authentication, and an API request never reaches a sandbox: the two are told apart
//! here, once, by Host and path. A preview visitor holds no API key; the gateway checks
//! the preview's own token or cookie (core `manager/previews.rs`), strips every
//! credential of ours (`Authorization`, `X-API-Key`, the preview token and cookie, the
//! tenant header) and proxies HTTP/1.1, WebSocket upgrades included, to 127.0.0.1:{port}
//! inside the sandbox's network namespace. How the API is kept from preview pages: see
//! `origin.rs` (`Sec-Fetch-Site`) and ADR 0072.

use crate::auth::{Auth, API_KEY_HEADER, TENANT_HEADER};
use crate::error::ApiError;
use crate::routes::{ApiJson, ApiPath, St};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use threadbox_api::previews::*;
use threadbox_api::{routes, ErrorCode, ErrorResponse};
use threadbox_core::manager::previews::{
    PreviewCredentials, PREVIEW_COOKIE, PREVIEW_PATH_PREFIX, PREVIEW_TOKEN_HEADER,
    PREVIEW_TOKEN_QUERY,
};
use threadbox_core::{CoreError, Manager};

// ---- REST -----------------------------------------------------------------------------

#[utoipa::path(post, path = routes::SANDBOX_PREVIEWS, tag = "previews",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    request_body = PreviewRequest,
    responses(
        (status = 201, description = "Published; a private preview's token is in this answer only", body = Preview),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn create_preview(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiJson(request): ApiJson<PreviewRequest>,
) -> Result<(StatusCode, ApiJson<Preview>), ApiError> {
    let out = st.run(&caller, CreatePreview { sandbox, request }).await?;
    Ok((StatusCode::CREATED, ApiJson(out)))
}

#[utoipa::path(get, path = routes::SANDBOX_PREVIEWS, tag = "previews",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 200, description = "The sandbox's published ports (no tokens)", body = PreviewList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn list_previews(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
) -> Result<ApiJson<PreviewList>, ApiError> {
    Ok(ApiJson(st.run(&caller, ListPreviews { sandbox }).await?))
}

#[utoipa::path(delete, path = routes::SANDBOX_PREVIEW, tag = "previews",
    params(("sandbox" = String, Path, description = "Sandbox id or name"),
        ("port" = u16, Path, description = "The published port")),
    responses(
        (status = 204, description = "Unpublished: the URL answers 404, its token and cookies are void"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn delete_preview(
    State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, port)): ApiPath<(String, u16)>,
) -> Result<StatusCode, ApiError> {
    st.run(&caller, DeletePreview { sandbox, port }).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---- the gateway ----------------------------------------------------------------------

/// How long the app may take to send the head of its answer.
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);
/// Longest life of an upgraded (WebSocket) connection through a preview.
const UPGRADED_LIFETIME: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// What the gateway needs: the manager and the preview domain (lowercase, no dots around).
pub(crate) struct Gateway {
    pub(crate) manager: Arc<Manager>,
    pub(crate) domain: String,
}

/// Which preview a request addresses, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    /// Host form: the whole path belongs to the app.
    Host { sandbox: String, port: u16 },
    /// Path form: `prefix` (`/preview/{id}/{port}`) is ours, the rest the app's.
    Path {
        sandbox: String,
        port: u16,
        prefix: String,
    },
    /// Addressed to a preview, but to none that can exist (a malformed label or path).
    Malformed,
}

impl Target {
    fn sandbox_port(&self) -> Option<(&str, u16)> {
        match self {
            Target::Host { sandbox, port } | Target::Path { sandbox, port, .. } => {
                Some((sandbox, *port))
            }
            Target::Malformed => None,
        }
    }
}

/// `{port}-{id}`: a port without leading zeros and a sandbox id (`sb-` and lowercase hex).
fn parse_label(label: &str) -> Option<(String, u16)> {
    let (port, id) = label.split_once('-')?;
    let port = parse_port(port)?;
    valid_id(id).then(|| (id.to_string(), port))
}

fn parse_port(s: &str) -> Option<u16> {
    if s.is_empty() || s.len() > 5 || s.starts_with('0') || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|p| *p != 0)
}

fn valid_id(id: &str) -> bool {
    id.strip_prefix("sb-").is_some_and(|hex| {
        !hex.is_empty()
            && hex.len() <= 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The request's host name, lowercase, without port or trailing dot.
fn request_host(req: &Request) -> Option<String> {
    let raw = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.as_str().to_string()))?;
    let authority = axum::http::uri::Authority::try_from(raw.trim()).ok()?;
    Some(authority.host().trim_end_matches('.').to_ascii_lowercase())
}

fn target(domain: &str, req: &Request) -> Option<Target> {
    if let Some(host) = request_host(req) {
        if let Some(label) = host.strip_suffix(domain).and_then(|h| h.strip_suffix('.')) {
            return Some(match parse_label(label) {
                Some((sandbox, port)) => Target::Host { sandbox, port },
                None => Target::Malformed,
            });
        }
    }
    let rest = req.uri().path().strip_prefix(PREVIEW_PATH_PREFIX)?;
    let mut parts = rest.splitn(3, '/');
    let (Some(id), Some(port)) = (parts.next(), parts.next()) else {
        return Some(Target::Malformed);
    };
    match (valid_id(id), parse_port(port)) {
        (true, Some(port)) => Some(Target::Path {
            sandbox: id.to_string(),
            port,
            prefix: format!("{PREVIEW_PATH_PREFIX}{id}/{port}"),
        }),
        _ => Some(Target::Malformed),
    }
}

/// The middleware: preview requests are answered here and never go further.
pub(crate) async fn dispatch(State(g): State<Arc<Gateway>>, req: Request, next: Next) -> Response {
    match target(&g.domain, &req) {
        None => next.run(req).await,
        Some(t) => serve_preview(&g, t, req).await,
    }
}

fn error(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Response {
    (status, axum::Json(ApiError::new(code, message).body())).into_response()
}

fn no_such_preview() -> Response {
    error(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        "no such preview",
    )
}

/// The `tb_preview` query value, and the query without it.
fn split_query(query: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(q) = query else {
        return (None, None);
    };
    let mut token = None;
    let mut kept = form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (k, v) in form_urlencoded::parse(q.as_bytes()) {
        if k == PREVIEW_TOKEN_QUERY {
            token = Some(v.into_owned());
        } else {
            kept.append_pair(&k, &v);
            any = true;
        }
    }
    if token.is_none() {
        // Untouched: the app gets its query byte for byte.
        return (None, Some(q.to_string()));
    }
    (token, any.then(|| kept.finish()))
}

/// Values of our cookie in the `Cookie` headers, and those headers without it.
fn split_cookies(headers: &HeaderMap) -> (Vec<String>, Option<String>) {
    let mut ours = Vec::new();
    let mut kept = Vec::new();
    for v in headers.get_all(header::COOKIE) {
        let Ok(v) = v.to_str() else { continue };
        for pair in v.split(';') {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            match pair.split_once('=') {
                Some((name, value)) if name.trim() == PREVIEW_COOKIE => {
                    ours.push(value.trim().to_string())
                }
                // The dashboard's session (ADR 0096) is ours too and never forwarded.
                Some((name, _)) if name.trim() == crate::ui_routes::SESSION_COOKIE => {}
                _ => kept.push(pair.to_string()),
            }
        }
    }
    let kept = (!kept.is_empty()).then(|| kept.join("; "));
    (ours, kept)
}

/// In the path form every preview shares the daemon's origin, so a page of one preview
/// could fetch another with the visitor's cookie and read the answer. A browser's
/// same-origin request authenticated by cookie must therefore come from a page of the same
/// preview (its `Referer` under the same prefix); a request without fetch metadata (not a
/// browser, or an old one) or a navigation the user started (`Sec-Fetch-Site: none`)
/// passes. ADR 0072.
fn path_cookie_allowed(headers: &HeaderMap, prefix: &str) -> bool {
    let site = headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_ascii_lowercase());
    match site.as_deref() {
        Some("same-origin") => {
            let Some(referer) = headers
                .get(header::REFERER)
                .and_then(|v| v.to_str().ok())
                .and_then(|r| r.parse::<Uri>().ok())
            else {
                return false;
            };
            let path = referer.path();
            path == prefix || path.starts_with(&format!("{prefix}/"))
        }
        _ => true,
    }
}

async fn serve_preview(g: &Gateway, t: Target, mut req: Request) -> Response {
    let Some((sandbox, port)) = t.sandbox_port() else {
        return no_such_preview();
    };
    let (sandbox, port) = (sandbox.to_string(), port);
    // `/preview/{id}/{port}` without the slash is sent to it first (it tells nothing about
    // the preview), or the app's relative links would resolve outside the prefix.
    if let Target::Path { prefix, .. } = &t {
        if req.uri().path().len() == prefix.len() {
            let q = req
                .uri()
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            return redirect(&format!("{prefix}/{q}"), None);
        }
    }
    let (query_token, app_query) = split_query(req.uri().query());
    let header_token = req
        .headers()
        .get(PREVIEW_TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string());
    let (mut cookies, app_cookies) = split_cookies(req.headers());
    if let Target::Path { prefix, .. } = &t {
        if !path_cookie_allowed(req.headers(), prefix) {
            cookies.clear();
        }
    }
    let cookie_refs: Vec<&str> = cookies.iter().map(String::as_str).collect();
    let creds = PreviewCredentials {
        token: query_token.as_deref().or(header_token.as_deref()),
        cookies: &cookie_refs,
    };
    let grant = match g.manager.preview_authorize(&sandbox, port, creds).await {
        Ok(grant) => grant,
        Err(CoreError::Unauthenticated(m)) => {
            return error(StatusCode::UNAUTHORIZED, ErrorCode::Unauthenticated, m)
        }
        Err(CoreError::NotFound(_) | CoreError::NotFoundOther(_)) => return no_such_preview(),
        Err(e) => return ApiError::from(e).into_response(),
    };

    // The app's path: the prefix of the path form is ours.
    let app_path = match &t {
        Target::Path { prefix, .. } => req.uri().path()[prefix.len()..].to_string(),
        _ => req.uri().path().to_string(),
    };
    let app_uri = match &app_query {
        Some(q) => format!("{app_path}?{q}"),
        None => app_path.clone(),
    };

    // A token in the URL is exchanged for a cookie, and the browser sent on to the URL
    // without it: it does not stay in the history, the address bar or a Referer.
    if let (Some(_), Some(cookie)) = (&query_token, &grant.cookie) {
        if matches!(*req.method(), Method::GET | Method::HEAD) {
            let (location, cookie_path) = match &t {
                Target::Path { prefix, .. } => (format!("{prefix}{app_uri}"), format!("{prefix}/")),
                _ => (app_uri.clone(), "/".to_string()),
            };
            let set =
                format!("{PREVIEW_COOKIE}={cookie}; Path={cookie_path}; HttpOnly; SameSite=Lax");
            return redirect(&location, Some(&set));
        }
    }

    let conn = match g.manager.preview_connect(&sandbox, port).await {
        Ok(c) => c,
        Err(CoreError::NotFound(_) | CoreError::NotFoundOther(_)) => return no_such_preview(),
        Err(CoreError::Unavailable(m)) => {
            return error(StatusCode::BAD_GATEWAY, ErrorCode::Unavailable, m)
        }
        Err(e) => return ApiError::from(e).into_response(),
    };

    let original_host = req.headers().get(header::HOST).cloned().or_else(|| {
        req.uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    let upgrade = is_upgrade(req.headers());
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let mut headers = parts.headers;
    strip_for_sandbox(&mut headers, upgrade);
    if let Some(c) = app_cookies {
        if let Ok(v) = HeaderValue::from_str(&c) {
            headers.insert(header::COOKIE, v);
        }
    }
    // Dev servers (Vite, webpack) refuse Host names they do not know: the app sees the
    // address it listens on, and the visitor's host in X-Forwarded-Host.
    if let Ok(v) = HeaderValue::from_str(&format!("localhost:{port}")) {
        headers.insert(header::HOST, v);
    }
    if let Some(h) = original_host {
        headers.insert(HeaderName::from_static("x-forwarded-host"), h);
    }
    headers.insert(
        HeaderName::from_static("x-forwarded-proto"),
        HeaderValue::from_static("http"),
    );
    if let Target::Path { prefix, .. } = &t {
        if let Ok(v) = HeaderValue::from_str(prefix) {
            headers.insert(HeaderName::from_static("x-forwarded-prefix"), v);
        }
    }
    let mut upstream = axum::http::Request::new(body);
    *upstream.method_mut() = parts.method;
    *upstream.version_mut() = axum::http::Version::HTTP_11;
    *upstream.headers_mut() = headers;
    *upstream.uri_mut() = match app_uri.parse() {
        Ok(u) => u,
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidArgument,
                "bad path",
            )
        }
    };

    let guard = Arc::new(conn.guard);
    let (mut sender, connection) =
        match hyper::client::conn::http1::handshake(TokioIo::new(conn.stream)).await {
            Ok(x) => x,
            Err(e) => {
                return error(
                    StatusCode::BAD_GATEWAY,
                    ErrorCode::Unavailable,
                    format!("the app on port {port} did not speak HTTP/1.1: {e}"),
                )
            }
        };
    let held = guard.clone();
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!("preview connection: {e}");
        }
        drop(held);
    });
    // Bounded, so an app that accepts and never answers does not hold the sandbox busy
    // (no idle pause) for ever; streamed bodies (SSE) are not bounded, only the head.
    let answered = tokio::time::timeout(ANSWER_TIMEOUT, sender.send_request(upstream)).await;
    let mut resp = match answered {
        Err(_) => {
            return error(
                StatusCode::GATEWAY_TIMEOUT,
                ErrorCode::Unavailable,
                format!(
                    "the app on port {port} did not answer within {}s",
                    ANSWER_TIMEOUT.as_secs()
                ),
            )
        }
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return error(
                StatusCode::BAD_GATEWAY,
                ErrorCode::Unavailable,
                format!("the app on port {port} did not answer: {e}"),
            )
        }
    };
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client) = client_upgrade {
            let app = hyper::upgrade::on(&mut resp);
            tokio::spawn(async move {
                match (client.await, app.await) {
                    (Ok(c), Ok(a)) => {
                        let (mut c, mut a) = (TokioIo::new(c), TokioIo::new(a));
                        let copy = tokio::io::copy_bidirectional(&mut c, &mut a);
                        if tokio::time::timeout(UPGRADED_LIFETIME, copy).await.is_err() {
                            tracing::info!(
                                "a preview WebSocket reached its lifetime and was closed"
                            );
                        }
                    }
                    (Err(e), _) | (_, Err(e)) => tracing::debug!("preview upgrade: {e}"),
                }
                drop(guard);
            });
        }
    }
    let (mut parts, body) = resp.into_parts();
    if parts.status != StatusCode::SWITCHING_PROTOCOLS {
        strip_hop_by_hop(&mut parts.headers);
    }
    Response::from_parts(parts, Body::new(body))
}

fn redirect(location: &str, set_cookie: Option<&str>) -> Response {
    let mut r = StatusCode::FOUND.into_response();
    if let Ok(v) = HeaderValue::from_str(location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    if let Some(c) = set_cookie.and_then(|c| HeaderValue::from_str(c).ok()) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) and those named in `Connection`.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    for n in named {
        headers.remove(n.as_str());
    }
    for h in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
    ] {
        headers.remove(h);
    }
    headers.remove("keep-alive");
}

/// What the sandbox must never see: our credentials (the API key in either header, the
/// preview token; the cookie is taken out by the caller), the tenant header, hop-by-hop
/// headers (an upgrade keeps `Connection: upgrade` and `Upgrade`).
fn strip_for_sandbox(headers: &mut HeaderMap, upgrade: bool) {
    let upgrade_to = headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(headers);
    for h in [
        header::AUTHORIZATION.as_str(),
        API_KEY_HEADER,
        PREVIEW_TOKEN_HEADER,
        TENANT_HEADER,
    ] {
        headers.remove(h);
    }
    headers.remove(header::COOKIE);
    headers.remove("x-forwarded-for");
    if upgrade {
        if let Some(u) = upgrade_to {
            headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            headers.insert(header::UPGRADE, u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(host: &str, path: &str) -> Request {
        axum::http::Request::builder()
            .uri(path)
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap()
    }

    const ID: &str = "sb-0123456789abcdef0123456789abcdef";

    #[test]
    fn host_and_path_forms_are_told_from_the_api() {
        let d = "localhost";
        assert_eq!(
            target(
                d,
                &req(&format!("8000-{ID}.localhost:7420"), "/v1/sandboxes")
            ),
            Some(Target::Host {
                sandbox: ID.into(),
                port: 8000
            }),
            "a preview host's /v1 goes to the app, never to the API"
        );
        assert_eq!(
            target(
                d,
                &req("127.0.0.1:7420", &format!("/preview/{ID}/8000/x?a=1"))
            ),
            Some(Target::Path {
                sandbox: ID.into(),
                port: 8000,
                prefix: format!("/preview/{ID}/8000")
            })
        );
        assert_eq!(target(d, &req("localhost:7420", "/v1/sandboxes")), None);
        assert_eq!(target(d, &req("127.0.0.1:7420", "/previewx")), None);
        for bad in [
            format!("08000-{ID}.localhost"),
            format!("0-{ID}.localhost"),
            format!("70000-{ID}.localhost"),
            "8000-sb-XYZ.localhost".to_string(),
            format!("a.8000-{ID}.localhost"),
            "localhost.localhost".to_string(),
        ] {
            assert_eq!(target(d, &req(&bad, "/")), Some(Target::Malformed), "{bad}");
        }
        assert_eq!(
            target(d, &req("x", "/preview/sb-zz/80/")),
            Some(Target::Malformed)
        );
        assert_eq!(
            target(d, &req("x", &format!("/preview/{ID}"))),
            Some(Target::Malformed)
        );
    }

    #[test]
    fn our_token_and_cookie_are_split_from_the_apps() {
        let (t, q) = split_query(Some("a=1&tb_preview=tok&b=2"));
        assert_eq!(t.as_deref(), Some("tok"));
        assert_eq!(q.as_deref(), Some("a=1&b=2"));
        assert_eq!(
            split_query(Some("tb_preview=tok")),
            (Some("tok".into()), None)
        );
        assert_eq!(split_query(Some("x=%2F")), (None, Some("x=%2F".into())));
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; tb_preview=c1"),
        );
        h.append(
            header::COOKIE,
            HeaderValue::from_static("tb_preview=c2; b=2"),
        );
        let (ours, kept) = split_cookies(&h);
        assert_eq!(ours, ["c1", "c2"]);
        assert_eq!(kept.as_deref(), Some("a=1; b=2"));
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; tb_ui=session; tb_preview=c"),
        );
        let (ours, kept) = split_cookies(&h);
        assert_eq!(ours, ["c"]);
        assert_eq!(
            kept.as_deref(),
            Some("a=1"),
            "the dashboard's session stays here"
        );
    }

    #[test]
    fn credentials_never_reach_the_sandbox() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        h.insert("x-api-key", HeaderValue::from_static("k"));
        h.insert("x-threadbox-preview-token", HeaderValue::from_static("t"));
        h.insert("x-threadbox-tenant", HeaderValue::from_static("t"));
        h.insert(header::COOKIE, HeaderValue::from_static("tb_preview=c"));
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("Upgrade, x-secret"),
        );
        h.insert("x-secret", HeaderValue::from_static("s"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-app", HeaderValue::from_static("kept"));
        strip_for_sandbox(&mut h, true);
        let names: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(h.get("x-app").unwrap(), "kept");
        assert_eq!(h.get(header::UPGRADE).unwrap(), "websocket");
        assert_eq!(h.get(header::CONNECTION).unwrap(), "upgrade");
        assert_eq!(names.len(), 3, "{names:?}");
    }

    #[test]
    fn a_path_form_cookie_opens_only_from_its_own_pages() {
        let p = format!("/preview/{ID}/8000");
        let mut h = HeaderMap::new();
        assert!(
            path_cookie_allowed(&h, &p),
            "no fetch metadata: not a browser"
        );
        h.insert("sec-fetch-site", HeaderValue::from_static("none"));
        assert!(path_cookie_allowed(&h, &p), "the user's own navigation");
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(
            !path_cookie_allowed(&h, &p),
            "same origin without a Referer"
        );
        let other = format!("http://127.0.0.1:7420/preview/{ID}/9000/");
        h.insert(header::REFERER, HeaderValue::from_str(&other).unwrap());
        assert!(!path_cookie_allowed(&h, &p), "a page of another preview");
        let own = format!("http://127.0.0.1:7420/preview/{ID}/8000/app.js");
        h.insert(header::REFERER, HeaderValue::from_str(&own).unwrap());
        assert!(path_cookie_allowed(&h, &p));
        let sneaky = format!("http://127.0.0.1:7420/preview/{ID}/80000/");
        h.insert(header::REFERER, HeaderValue::from_str(&sneaky).unwrap());
        assert!(!path_cookie_allowed(&h, &p));
    }
}
