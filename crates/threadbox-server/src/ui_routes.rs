//! The dashboard at `/ui/` (ADR 0096): a few static pages and one script bundle embedded
//! in the binary, a login that turns an API key into a session cookie, and the rules that
//! let the dashboard's own page — and only it — call the REST API with that cookie.
//!
//! The threat is a web page: a cross-site one (kept out by `SameSite=Strict` and the
//! Origin check in `origin.rs`) and, worse, a page of a path-form preview (ADR 0072), which
//! lives on the daemon's own origin, so the browser sends it the cookie and calls its
//! requests same-origin. What such a page cannot get is the session's CSRF token:
//!
//! - the token is written into the dashboard's HTML only for a top-level navigation
//!   (`Sec-Fetch-Mode: navigate`, `Sec-Fetch-Dest: document`); a `fetch` of `/ui/` by a page
//!   gets the login page;
//! - the dashboard cannot be framed (`frame-ancestors 'none'`) and a window a preview page
//!   opens on it is cut off from its opener (`Cross-Origin-Opener-Policy: same-origin`);
//! - every API request authenticated by the cookie must carry the token, reads included
//!   (`X-Threadbox-CSRF`; a WebSocket, which cannot set headers, offers it as the
//!   subprotocol `tb-csrf.<token>`).
//!
//! The key itself never leaves the login form's body: the cookie is a random session id,
//! and the session re-checks its key on every request (a revoked key ends its sessions).

use crate::error::ApiError;
use crate::routes::{Shared, St};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use threadbox_api::ErrorCode;
use threadbox_core::Caller;

/// The session cookie (a random id; HttpOnly, SameSite=Strict, Path=/).
pub(crate) const SESSION_COOKIE: &str = "tb_ui";
/// The header that carries a session's CSRF token on every cookie-authenticated request.
pub(crate) const CSRF_HEADER: &str = "x-threadbox-csrf";
/// A WebSocket offers its CSRF token as a subprotocol with this prefix.
pub(crate) const CSRF_PROTOCOL_PREFIX: &str = "tb-csrf.";
/// Where the dashboard lives; the auth layer lets these paths through to the handlers
/// here, which check the session themselves.
pub(crate) const UI_PREFIX: &str = "/ui";

/// A session ends this long after its last request.
pub(crate) const IDLE_EXPIRY: Duration = Duration::from_secs(30 * 60);
/// And this long after login, whatever its use.
pub(crate) const ABSOLUTE_EXPIRY: Duration = Duration::from_secs(12 * 3600);
/// At most this many live sessions; a login past it ends the oldest.
const MAX_SESSIONS: usize = 4096;

/// Is `path` a dashboard path (`/ui` or under `/ui/`)?
pub(crate) fn is_ui_path(path: &str) -> bool {
    path == UI_PREFIX || path.starts_with("/ui/")
}

struct Session {
    /// The API key the session logged in with, re-checked on every request. Kept in the
    /// daemon's memory only (sessions do not survive a restart).
    key: String,
    csrf: String,
    created: Instant,
    last: Instant,
}

/// The live dashboard sessions, by SHA-256 of their id (so a dump of this map opens
/// nothing by the cookie).
#[derive(Default)]
pub(crate) struct UiSessions {
    inner: Mutex<HashMap<[u8; 32], Session>>,
}

fn random_hex() -> Result<String, ApiError> {
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b)
        .map_err(|e| ApiError::new(ErrorCode::Internal, format!("no randomness: {e}")))?;
    Ok(hex::encode(b))
}

fn digest(sid: &str) -> [u8; 32] {
    Sha256::digest(sid.as_bytes()).into()
}

/// Compares without an early exit, so timing does not tell how much of a token matched.
fn same_token(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl UiSessions {
    /// A new session for `key`: (session id, CSRF token).
    fn create(&self, key: String, now: Instant) -> Result<(String, String), ApiError> {
        let sid = random_hex()?;
        let csrf = random_hex()?;
        let mut map = self.lock();
        map.retain(|_, s| alive(s, now));
        if map.len() >= MAX_SESSIONS {
            if let Some(oldest) = map.iter().min_by_key(|(_, s)| s.created).map(|(k, _)| *k) {
                map.remove(&oldest);
            }
        }
        map.insert(
            digest(&sid),
            Session {
                key,
                csrf: csrf.clone(),
                created: now,
                last: now,
            },
        );
        Ok((sid, csrf))
    }

    /// The key and CSRF token of a live session; touching it. An expired one is removed.
    fn lookup(&self, sid: &str, now: Instant) -> Option<(String, String)> {
        let mut map = self.lock();
        let d = digest(sid);
        let s = map.get_mut(&d)?;
        if !alive(s, now) {
            map.remove(&d);
            return None;
        }
        s.last = now;
        Some((s.key.clone(), s.csrf.clone()))
    }

    fn remove(&self, sid: &str) {
        self.lock().remove(&digest(sid));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        // A panic while holding the map leaves it consistent (single inserts/removes).
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn alive(s: &Session, now: Instant) -> bool {
    now.saturating_duration_since(s.last) < IDLE_EXPIRY
        && now.saturating_duration_since(s.created) < ABSOLUTE_EXPIRY
}

/// The value of cookie `name`, if the request carries it (the first one).
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| n.trim() == name)
        .map(|(_, v)| v.trim())
}

/// Where a cookie-authenticated request's CSRF token came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CsrfFrom {
    Header,
    /// The WebSocket subprotocol entry, echoed in the 101 if the handler chose none.
    Protocol(String),
}

fn presented_csrf(headers: &HeaderMap) -> Option<(String, CsrfFrom)> {
    if let Some(v) = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()) {
        return Some((v.trim().to_string(), CsrfFrom::Header));
    }
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find_map(|p| {
            p.strip_prefix(CSRF_PROTOCOL_PREFIX)
                .map(|t| (t.to_string(), CsrfFrom::Protocol(p.to_string())))
        })
}

/// The caller of a request the dashboard's page made (origin.rs marked it): only a live
/// session with its CSRF token authenticates it, whatever the door (a page never rides
/// on the socket's or `--insecure-no-auth`'s operator).
pub(crate) async fn page_caller(
    st: &Shared,
    headers: &HeaderMap,
) -> Result<(Caller, CsrfFrom), ApiError> {
    let unauth = |m: &str| ApiError::new(ErrorCode::Unauthenticated, m);
    let sid = cookie(headers, SESSION_COOKIE)
        .ok_or_else(|| unauth("a web page may call the API only from the dashboard (/ui/)"))?;
    let (key, csrf) = st
        .ui
        .lookup(sid, Instant::now())
        .ok_or_else(|| unauth("the dashboard session has expired: log in again at /ui/"))?;
    let (presented, from) = presented_csrf(headers).ok_or_else(|| {
        unauth("a dashboard request must carry its session's CSRF token (X-Threadbox-CSRF)")
    })?;
    if !same_token(&presented, &csrf) {
        return Err(unauth(
            "the CSRF token does not match the dashboard session",
        ));
    }
    match st.manager.authenticate(&key).await {
        Ok(c) => Ok((c, from)),
        Err(e) if e.code() == ErrorCode::Internal => Err(e.into()),
        Err(e) => {
            st.ui.remove(sid);
            Err(unauth(&format!(
                "the dashboard session's key no longer works ({})",
                e.public_message()
            )))
        }
    }
}

/// The echo a browser needs when it offered subprotocols and the handler chose none.
pub(crate) fn echo_protocol(resp: &mut Response, from: &CsrfFrom) {
    if let CsrfFrom::Protocol(p) = from {
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS
            && !resp.headers().contains_key(header::SEC_WEBSOCKET_PROTOCOL)
        {
            if let Ok(v) = HeaderValue::from_str(p) {
                resp.headers_mut().insert(header::SEC_WEBSOCKET_PROTOCOL, v);
            }
        }
    }
}

// ---- the pages ---------------------------------------------------------------------

const INDEX_HTML: &str = include_str!("../ui/dist/index.html");
const LOGIN_HTML: &str = include_str!("../ui/dist/login.html");
const APP_JS: &[u8] = include_bytes!("../ui/dist/app.js");
const APP_CSS: &[u8] = include_bytes!("../ui/dist/app.css");

/// The dashboard's Content-Security-Policy: scripts only from the daemon, no inline
/// script, connections only to the daemon. Inline styles are allowed because xterm.js
/// injects `<style>` elements (research B.5); nothing of a sandbox's is ever HTML here.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; \
     img-src 'self' data:; style-src 'self' 'unsafe-inline'; font-src 'self'; \
     frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

fn harden(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: with it Chromium sends `Origin: null` on the login form's POST,
    // which the Origin check must refuse. `same-origin` still tells no other site.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(
        "cross-origin-resource-policy",
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn html(status: StatusCode, body: String) -> Response {
    harden(
        (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            )],
            body,
        )
            .into_response(),
    )
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn login_page(status: StatusCode, message: &str) -> Response {
    let msg = if message.is_empty() {
        String::new()
    } else {
        format!("<p class=\"error\" role=\"alert\">{}</p>", escape(message))
    };
    html(status, LOGIN_HTML.replace("<!--MESSAGE-->", &msg))
}

fn see_other(to: &'static str) -> Response {
    harden((StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response())
}

/// A top-level navigation by the person, not a page's `fetch` or a frame.
fn is_navigation(headers: &HeaderMap) -> bool {
    let is = |name: &str, want: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case(want))
    };
    is("sec-fetch-mode", "navigate") && is("sec-fetch-dest", "document")
}

/// Does the browser's page have an `https` origin (TLS at the daemon or at a proxy in
/// front of it)? Then the cookie is `Secure`.
fn over_tls(headers: &HeaderMap) -> bool {
    headers
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|o| o.trim().to_ascii_lowercase().starts_with("https://"))
}

fn session_cookie(value: &str, max_age: u64, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    let c = format!(
        "{SESSION_COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}"
    );
    // Hex and fixed text only: always a valid header value.
    HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static("tb_ui=; Max-Age=0"))
}

async fn index(axum::extract::State(st): St, headers: HeaderMap) -> Response {
    let Some(sid) = cookie(&headers, SESSION_COOKIE) else {
        return login_page(StatusCode::OK, "");
    };
    let Some((key, csrf)) = st.ui.lookup(sid, Instant::now()) else {
        return login_page(StatusCode::OK, "Your session has ended. Log in again.");
    };
    let caller = match st.manager.authenticate(&key).await {
        Ok(c) => c,
        Err(e) if e.code() == ErrorCode::Internal => return ApiError::from(e).into_response(),
        Err(e) => {
            st.ui.remove(sid);
            return login_page(
                StatusCode::OK,
                &format!("The session's key no longer works: {}", e.public_message()),
            );
        }
    };
    if !is_navigation(&headers) {
        // A page's fetch of the dashboard (a preview page on this origin?) gets no token.
        return login_page(
            StatusCode::FORBIDDEN,
            "Open the dashboard by its address: it is not served to scripts or frames \
             (and needs a browser that sends fetch metadata, over loopback or TLS).",
        );
    }
    let scopes: Vec<String> = caller
        .scopes
        .iter()
        .map(|s| s.as_str().to_string())
        .collect();
    let page = INDEX_HTML
        .replace("{{CSRF}}", &csrf)
        .replace("{{TENANT}}", &escape(&caller.tenant))
        .replace(
            "{{KEY_ID}}",
            &escape(caller.key_id.as_deref().unwrap_or("")),
        )
        .replace("{{SCOPES}}", &escape(&scopes.join(" ")));
    html(StatusCode::OK, page)
}

/// The longest login form accepted (a key is well under 200 bytes).
const MAX_LOGIN_BODY: usize = 4096;

async fn login(axum::extract::State(st): St, req: Request) -> Response {
    let headers = req.headers().clone();
    let target = "POST /ui/login";
    let body = match axum::body::to_bytes(req.into_body(), MAX_LOGIN_BODY).await {
        Ok(b) => b,
        Err(_) => return login_page(StatusCode::PAYLOAD_TOO_LARGE, "The form is too large."),
    };
    let key = form_urlencoded::parse(&body)
        .find(|(k, _)| k == "key")
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    if key.is_empty() {
        return login_page(StatusCode::BAD_REQUEST, "Enter an API key.");
    }
    match st.manager.authenticate(&key).await {
        Ok(_) => {}
        Err(e) if e.code() == ErrorCode::Internal => return ApiError::from(e).into_response(),
        Err(e) => {
            let key_id = threadbox_core::Manager::presented_key_id(&key).map(str::to_string);
            let reason = e.public_message();
            // Audited within the refusal budget, as a refused API request is.
            let _ = crate::auth::refuse(&st, key_id.as_deref(), target, &reason).await;
            return login_page(
                StatusCode::UNAUTHORIZED,
                &format!("Login refused: {reason}"),
            );
        }
    }
    let (sid, _csrf) = match st.ui.create(key, Instant::now()) {
        Ok(s) => s,
        Err(e) => return e.into_response(),
    };
    let mut resp = see_other("/ui/");
    resp.headers_mut().insert(
        header::SET_COOKIE,
        session_cookie(&sid, ABSOLUTE_EXPIRY.as_secs(), over_tls(&headers)),
    );
    resp
}

async fn logout(axum::extract::State(st): St, headers: HeaderMap) -> Response {
    // A logout is a write: a live session's token is required (a page without it cannot
    // log the person out). A session that has already ended only has its cookie cleared.
    if let Some(sid) = cookie(&headers, SESSION_COOKIE) {
        if let Some((_, csrf)) = st.ui.lookup(sid, Instant::now()) {
            let ok = presented_csrf(&headers).is_some_and(|(p, _)| same_token(&p, &csrf));
            if !ok {
                return ApiError::new(
                    ErrorCode::Unauthenticated,
                    "a logout must carry its session's CSRF token (X-Threadbox-CSRF)",
                )
                .into_response();
            }
            st.ui.remove(sid);
        }
    }
    let mut resp = harden(StatusCode::NO_CONTENT.into_response());
    resp.headers_mut().insert(
        header::SET_COOKIE,
        session_cookie("", 0, over_tls(&headers)),
    );
    resp
}

fn asset(content_type: &'static str, body: &'static [u8]) -> Response {
    harden(
        (
            [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))],
            body,
        )
            .into_response(),
    )
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn app_css() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

async fn to_index() -> Response {
    see_other("/ui/")
}

/// The dashboard's routes (merged into the daemon's router).
pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/ui", get(to_index))
        .route("/ui/", get(index))
        .route("/ui/login", post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/app.js", get(app_js))
        .route("/ui/app.css", get(app_css))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_expire_when_idle_and_absolutely() {
        let s = UiSessions::default();
        let t0 = Instant::now();
        let (sid, csrf) = s.create("k".into(), t0).expect("a session");
        assert_eq!(s.lookup(&sid, t0), Some(("k".into(), csrf.clone())));
        assert_eq!(s.lookup("nope", t0), None);
        // Used every 20 minutes it lives until the absolute limit.
        let mut t = t0;
        while t + Duration::from_secs(20 * 60) < t0 + ABSOLUTE_EXPIRY {
            t += Duration::from_secs(20 * 60);
            assert!(s.lookup(&sid, t).is_some(), "alive at {:?}", t - t0);
        }
        assert!(s.lookup(&sid, t0 + ABSOLUTE_EXPIRY).is_none());
        // Idle past the limit: gone, and stays gone.
        let (sid, _) = s.create("k".into(), t0).expect("a session");
        assert!(s.lookup(&sid, t0 + IDLE_EXPIRY).is_none());
        assert!(s.lookup(&sid, t0).is_none());
    }

    #[test]
    fn the_csrf_token_is_read_from_the_header_or_the_websocket_protocol() {
        let mut h = HeaderMap::new();
        assert_eq!(presented_csrf(&h), None);
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("threadbox.pty, tb-csrf.abc"),
        );
        assert_eq!(
            presented_csrf(&h),
            Some(("abc".into(), CsrfFrom::Protocol("tb-csrf.abc".into())))
        );
        h.insert(CSRF_HEADER, HeaderValue::from_static("def"));
        assert_eq!(presented_csrf(&h), Some(("def".into(), CsrfFrom::Header)));
        assert!(same_token("abc", "abc"));
        assert!(!same_token("abc", "abd"));
        assert!(!same_token("abc", "abcd"));
    }

    #[test]
    fn a_101_echoes_the_offered_token_protocol_only_when_the_handler_chose_none() {
        let from = CsrfFrom::Protocol("tb-csrf.abc".into());
        let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
        echo_protocol(&mut resp, &from);
        assert_eq!(
            resp.headers()[header::SEC_WEBSOCKET_PROTOCOL],
            "tb-csrf.abc"
        );
        let mut resp = StatusCode::SWITCHING_PROTOCOLS.into_response();
        resp.headers_mut().insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("threadbox.pty"),
        );
        echo_protocol(&mut resp, &from);
        assert_eq!(
            resp.headers()[header::SEC_WEBSOCKET_PROTOCOL],
            "threadbox.pty"
        );
        for (status, from) in [
            (StatusCode::OK, from.clone()),
            (StatusCode::SWITCHING_PROTOCOLS, CsrfFrom::Header),
        ] {
            let mut resp = status.into_response();
            echo_protocol(&mut resp, &from);
            assert!(!resp.headers().contains_key(header::SEC_WEBSOCKET_PROTOCOL));
        }
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; tb_ui=xyz ; tb_preview=p"),
        );
        assert_eq!(cookie(&h, "tb_ui"), Some("xyz"));
        assert_eq!(cookie(&h, "tb_preview"), Some("p"));
        assert_eq!(cookie(&h, "b"), None);
        assert_eq!(
            escape("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
    }
}
