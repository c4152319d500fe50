//! The dashboard's door (ADR 0096), one rule a test, over the real router and manager
//! (fake tier): login into a cookie, the cookie's flags, the CSRF token on every
//! cookie-authenticated request, same-origin only, the token only for a navigation,
//! the security headers, logout, a revoked key, and no key in a URL.

use crate::auth::Door;
use crate::test_app::TestApp;
use axum::body::Body;
use axum::http::{header, HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use threadbox_api::{CreateKeyRequest, Scope};
use threadbox_core::Caller;
use tower::ServiceExt;

const HOST: &str = "127.0.0.1:7420";
const SELF_ORIGIN: &str = "http://127.0.0.1:7420";

async fn send(app: &TestApp, req: Request<Body>) -> (StatusCode, HeaderMap, String) {
    let resp = app.router.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("a body").to_bytes();
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

async fn key(app: &TestApp, scopes: Vec<Scope>) -> (String, String) {
    let k = app
        .manager
        .create_key(
            &Caller::operator(),
            CreateKeyRequest {
                tenant: "acme".into(),
                scopes,
                expires_in_secs: None,
            },
        )
        .await
        .expect("a key");
    (k.id, k.key)
}

fn login_req(key: &str, origin: &str) -> Request<Body> {
    Request::post("/ui/login")
        .header(header::HOST, HOST)
        .header(header::ORIGIN, origin)
        .header("sec-fetch-site", "same-origin")
        .header("sec-fetch-mode", "navigate")
        .header("sec-fetch-dest", "document")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("key={key}")))
        .expect("a request")
}

/// Logs in; returns the cookie pair (`tb_ui=…`) and the whole Set-Cookie line.
async fn login(app: &TestApp, key: &str) -> (String, String) {
    let (status, headers, body) = send(app, login_req(key, SELF_ORIGIN)).await;
    assert_eq!(status, StatusCode::SEE_OTHER, "{body}");
    assert_eq!(headers[header::LOCATION], "/ui/");
    let set = headers[header::SET_COOKIE]
        .to_str()
        .expect("text")
        .to_string();
    let pair = set.split(';').next().expect("a pair").to_string();
    (pair, set)
}

fn navigate(cookie: &str) -> Request<Body> {
    Request::get("/ui/")
        .header(header::HOST, HOST)
        .header(header::COOKIE, cookie)
        .header("sec-fetch-site", "none")
        .header("sec-fetch-mode", "navigate")
        .header("sec-fetch-dest", "document")
        .body(Body::empty())
        .expect("a request")
}

/// The CSRF token the dashboard's page gets (from its HTML).
async fn csrf(app: &TestApp, cookie: &str) -> String {
    let (status, _, body) = send(app, navigate(cookie)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let at = body
        .find("name=\"tb-csrf\" content=\"")
        .expect("the token's meta");
    let rest = &body[at + "name=\"tb-csrf\" content=\"".len()..];
    rest[..rest.find('"').expect("its end")].to_string()
}

/// A same-origin `fetch` by a page: no Origin on a GET, `Sec-Fetch-Site: same-origin`.
fn page_get(uri: &str, cookie: &str, token: Option<&str>) -> Request<Body> {
    let mut b = Request::get(uri)
        .header(header::HOST, HOST)
        .header(header::COOKIE, cookie)
        .header("sec-fetch-site", "same-origin")
        .header("sec-fetch-mode", "cors")
        .header("sec-fetch-dest", "empty");
    if let Some(t) = token {
        b = b.header("x-threadbox-csrf", t);
    }
    b.body(Body::empty()).expect("a request")
}

fn page_post(uri: &str, cookie: &str, token: Option<&str>, origin: &str) -> Request<Body> {
    let mut b = Request::post(uri)
        .header(header::HOST, HOST)
        .header(header::ORIGIN, origin)
        .header(header::COOKIE, cookie)
        .header("sec-fetch-site", "same-origin")
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        b = b.header("x-threadbox-csrf", t);
    }
    b.body(Body::from(
        r#"{"tenant":"acme","scopes":["sandboxes:read"]}"#,
    ))
    .expect("a request")
}

#[tokio::test]
async fn login_sets_an_httponly_samesite_strict_cookie_and_never_echoes_the_key() {
    let app = TestApp::tcp().await;
    let (_, k) = key(&app, vec![Scope::SandboxesRead]).await;
    let (pair, set) = login(&app, &k).await;
    assert!(pair.starts_with("tb_ui="), "{set}");
    for flag in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="] {
        assert!(set.contains(flag), "{flag} missing: {set}");
    }
    assert!(!set.contains("Secure"), "plain http: no Secure ({set})");
    assert!(!set.contains(&k), "the key is not the cookie");
    // Over TLS (the page's origin is https) the cookie is Secure too.
    let (status, headers, _) = send(&app, login_req(&k, "https://127.0.0.1:7420")).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let set = headers[header::SET_COOKIE].to_str().expect("text");
    assert!(set.contains("; Secure"), "{set}");
    // The page of a live session never carries the key either.
    let (_, _, page) = send(&app, navigate(&pair)).await;
    assert!(!page.contains(&k));
}

#[tokio::test]
async fn a_wrong_key_or_a_key_in_the_url_logs_nobody_in() {
    let app = TestApp::tcp().await;
    let (_, k) = key(&app, vec![Scope::SandboxesRead]).await;
    let (status, headers, body) = send(&app, login_req("tbk_nope.nope", SELF_ORIGIN)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(headers.get(header::SET_COOKIE).is_none());
    assert!(body.contains("Login refused"), "{body}");
    // The key in the query instead of the body: not read.
    let req = Request::post(format!("/ui/login?key={k}"))
        .header(header::HOST, HOST)
        .header(header::ORIGIN, SELF_ORIGIN)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::empty())
        .expect("a request");
    let (status, headers, _) = send(&app, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(headers.get(header::SET_COOKIE).is_none());
    // Nor by the API.
    for q in ["api_key", "key", "token"] {
        let req = Request::get(format!("/v1/sandboxes?{q}={k}"))
            .header(header::HOST, HOST)
            .body(Body::empty())
            .expect("a request");
        let (status, _, _) = send(&app, req).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "?{q}=");
    }
    // Positive control: the same key in its header works.
    let req = Request::get("/v1/sandboxes")
        .header(header::HOST, HOST)
        .header("x-api-key", &k)
        .body(Body::empty())
        .expect("a request");
    assert_eq!(send(&app, req).await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_cookie_request_needs_the_sessions_csrf_token_reads_and_writes() {
    let app = TestApp::tcp().await;
    let (_, k) = key(&app, vec![Scope::SandboxesRead, Scope::Admin]).await;
    let (cookie, _) = login(&app, &k).await;
    let token = csrf(&app, &cookie).await;
    // With the token: the key's caller (tenant acme).
    let (status, _, body) = send(&app, page_get("/v1/sandboxes", &cookie, Some(&token))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _, body) = send(
        &app,
        page_post("/v1/keys", &cookie, Some(&token), SELF_ORIGIN),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // Without it, or with another: refused, reads included.
    for t in [None, Some("0".repeat(64).as_str()), Some("")] {
        let (status, _, body) = send(&app, page_get("/v1/sandboxes", &cookie, t)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{t:?}: {body}");
        let (status, _, _) = send(&app, page_post("/v1/keys", &cookie, t, SELF_ORIGIN)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{t:?}");
    }
    // A token offered as a WebSocket subprotocol counts (browsers cannot set headers there).
    let mut req = page_get("/v1/sandboxes", &cookie, None);
    req.headers_mut().insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        format!("tb-csrf.{token}").parse().expect("a value"),
    );
    assert_eq!(send(&app, req).await.0, StatusCode::OK);
    // A made-up cookie with a token of its own: refused.
    let (status, _, _) = send(&app, page_get("/v1/sandboxes", "tb_ui=feed", Some(&token))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_page_never_rides_on_a_keyless_door() {
    // `--insecure-no-auth`: a request without a key is the operator, but a page's is not.
    let app = TestApp::open(1024, Door::TcpInsecure).await;
    let (status, _, _) = send(&app, page_get("/v1/sandboxes", "tb_ui=planted", None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Without any cookie a page is refused by the Origin rule (ADR 0072), as before.
    let req = Request::get("/v1/sandboxes")
        .header(header::HOST, HOST)
        .header("sec-fetch-site", "same-origin")
        .body(Body::empty())
        .expect("a request");
    assert_eq!(send(&app, req).await.0, StatusCode::FORBIDDEN);
    // Positive control: a program (no fetch metadata) is the operator there.
    let req = Request::get("/v1/sandboxes")
        .header(header::HOST, HOST)
        .body(Body::empty())
        .expect("a request");
    assert_eq!(send(&app, req).await.0, StatusCode::OK);
    // And the dashboard still logs in by key on that door.
    let (_, k) = key(&app, vec![Scope::SandboxesRead]).await;
    let (cookie, _) = login(&app, &k).await;
    let token = csrf(&app, &cookie).await;
    let (status, _, body) = send(&app, page_get("/v1/sandboxes", &cookie, Some(&token))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn cross_origin_requests_and_websocket_upgrades_are_refused() {
    let app = TestApp::tcp().await;
    let (_, k) = key(&app, vec![Scope::SandboxesRead, Scope::Admin]).await;
    let (cookie, _) = login(&app, &k).await;
    let token = csrf(&app, &cookie).await;
    for origin in [
        "http://evil.example",
        "http://127.0.0.1:7421",
        "http://localhost:7420",
        "null",
    ] {
        let (status, _, _) = send(&app, page_post("/v1/keys", &cookie, Some(&token), origin)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{origin}");
        // A WebSocket upgrade (the terminal's) with that Origin.
        let req = Request::get("/v1/sandboxes/sb-0/pty/p/ws")
            .header(header::HOST, HOST)
            .header(header::ORIGIN, origin)
            .header(header::COOKIE, &cookie)
            .header(header::CONNECTION, "upgrade")
            .header(header::UPGRADE, "websocket")
            .header(header::SEC_WEBSOCKET_VERSION, "13")
            .header(header::SEC_WEBSOCKET_KEY, "dGhlIHNhbXBsZSBub25jZQ==")
            .header(header::SEC_WEBSOCKET_PROTOCOL, format!("tb-csrf.{token}"))
            .body(Body::empty())
            .expect("a request");
        assert_eq!(send(&app, req).await.0, StatusCode::FORBIDDEN, "{origin}");
        // The login form from there.
        let (status, headers, _) = send(&app, login_req(&k, origin)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{origin}");
        assert!(headers.get(header::SET_COOKIE).is_none());
    }
    // Positive control: the same write from the daemon's own origin.
    let (status, _, _) = send(
        &app,
        page_post("/v1/keys", &cookie, Some(&token), SELF_ORIGIN),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
}

#[tokio::test]
async fn the_token_is_only_in_a_navigation_and_pages_carry_a_strict_csp() {
    let app = TestApp::tcp().await;
    let (_, k) = key(&app, vec![Scope::SandboxesRead]).await;
    let (cookie, _) = login(&app, &k).await;
    let token = csrf(&app, &cookie).await;
    assert_eq!(token.len(), 64);
    // A page's fetch of /ui/ (a preview page on this origin) or a frame: no token.
    for (mode, dest) in [
        ("cors", "empty"),
        ("navigate", "iframe"),
        ("no-cors", "script"),
    ] {
        let req = Request::get("/ui/")
            .header(header::HOST, HOST)
            .header(header::COOKIE, &cookie)
            .header("sec-fetch-site", "same-origin")
            .header("sec-fetch-mode", mode)
            .header("sec-fetch-dest", dest)
            .body(Body::empty())
            .expect("a request");
        let (status, _, body) = send(&app, req).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{mode} {dest}");
        assert!(!body.contains(&token), "{mode} {dest}");
    }
    // Without a browser's fetch metadata at all: no token either.
    let req = Request::get("/ui/")
        .header(header::HOST, HOST)
        .header(header::COOKIE, &cookie)
        .body(Body::empty())
        .expect("a request");
    let (_, _, body) = send(&app, req).await;
    assert!(!body.contains(&token));
    // Every dashboard answer carries the headers; the CSP allows no inline script.
    for path in ["/ui/", "/ui/app.js", "/ui/app.css"] {
        let (status, h, _) = send(&app, navigate(&cookie)).await;
        assert_eq!(status, StatusCode::OK);
        let req = Request::get(path)
            .header(header::HOST, HOST)
            .header(header::COOKIE, &cookie)
            .header("sec-fetch-site", "same-origin")
            .header("sec-fetch-mode", "no-cors")
            .header("sec-fetch-dest", "script")
            .body(Body::empty())
            .expect("a request");
        let (_, h2, _) = send(&app, req).await;
        for h in [&h, &h2] {
            let csp = h[header::CONTENT_SECURITY_POLICY].to_str().expect("text");
            assert!(csp.contains("script-src 'self'"), "{path}: {csp}");
            assert!(!csp.contains("script-src 'self' 'unsafe-inline'"), "{csp}");
            assert!(csp.contains("connect-src 'self'"), "{csp}");
            assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
            assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert_eq!(h["cross-origin-opener-policy"], "same-origin");
        }
    }
    // The login page (no session) has them too, and no token.
    let (status, h, body) = send(&app, navigate("tb_ui=none")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("action=\"/ui/login\""));
    assert!(h.contains_key(header::CONTENT_SECURITY_POLICY));
}

#[tokio::test]
async fn logout_needs_the_token_and_ends_the_session_and_so_does_revoking_the_key() {
    let app = TestApp::tcp().await;
    let (id, k) = key(&app, vec![Scope::SandboxesRead]).await;
    let (cookie, _) = login(&app, &k).await;
    let token = csrf(&app, &cookie).await;
    let logout = |t: Option<&str>| {
        let mut b = Request::post("/ui/logout")
            .header(header::HOST, HOST)
            .header(header::ORIGIN, SELF_ORIGIN)
            .header(header::COOKIE, &cookie);
        if let Some(t) = t {
            b = b.header("x-threadbox-csrf", t);
        }
        b.body(Body::empty()).expect("a request")
    };
    assert_eq!(send(&app, logout(None)).await.0, StatusCode::UNAUTHORIZED);
    let (status, _, _) = send(&app, page_get("/v1/sandboxes", &cookie, Some(&token))).await;
    assert_eq!(status, StatusCode::OK, "a refused logout ended nothing");
    let (status, h, _) = send(&app, logout(Some(&token))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert!(h[header::SET_COOKIE]
        .to_str()
        .expect("text")
        .contains("Max-Age=0"));
    let (status, _, _) = send(&app, page_get("/v1/sandboxes", &cookie, Some(&token))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Revoking the key ends a live session at its next request.
    let (cookie, _) = login(&app, &k).await;
    let token = csrf(&app, &cookie).await;
    app.manager
        .revoke_key(&Caller::operator(), &id)
        .await
        .expect("revoked");
    let (status, _, body) = send(&app, page_get("/v1/sandboxes", &cookie, Some(&token))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.contains("revoked"), "{body}");
}
