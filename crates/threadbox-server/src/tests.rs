//! Router tests without a socket and without a jail: routing, rejections, limits and the
//! OpenAPI document, over a real manager on the fake tier (`test_app.rs`). Calls that
//! name a sandbox name one that does not exist, so they reach the manager and stop there;
//! sandboxes that run are covered by the CLI's and the engine's integration suites.

use crate::test_app::TestApp;
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use threadbox_api::{ErrorCode, ErrorResponse, Health};
use tower::ServiceExt;

async fn call(req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let app = TestApp::socket(1024).await;
    send(app.router, req).await
}

async fn send(router: Router, req: Request<Body>) -> (StatusCode, Vec<u8>) {
    let resp = router.oneshot(req).await.expect("router is infallible");
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .expect("body collects")
        .to_bytes()
        .to_vec();
    (status, body)
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

/// A GET as a TCP client sends it (with the daemon's own `Host`).
fn get_tcp(uri: &str) -> Request<Body> {
    Request::get(uri)
        .header(header::HOST, "127.0.0.1:7420")
        .body(Body::empty())
        .unwrap()
}

fn post_json(uri: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.into())
        .unwrap()
}

/// Asserts the one error shape and returns its code.
fn error_code(status: StatusCode, body: &[u8]) -> ErrorCode {
    let err: ErrorResponse = serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "status {status}: body is not the error shape ({e}): {}",
            String::from_utf8_lossy(body)
        )
    });
    assert!(!err.error.message.is_empty());
    assert_eq!(status.as_u16(), err.error.code.http_status());
    err.error.code
}

#[tokio::test]
async fn healthz_reports_ok_and_version() {
    let (status, body) = call(get("/healthz")).await;
    assert_eq!(status, StatusCode::OK);
    let health: Health = serde_json::from_slice(&body).unwrap();
    assert_eq!(health.status, "ok");
    assert_eq!(health.version, env!("CARGO_PKG_VERSION"));
}

#[tokio::test]
async fn openapi_is_served_and_lists_every_route() {
    let (status, body) = call(get("/v1/openapi.json")).await;
    assert_eq!(status, StatusCode::OK);
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    for p in [
        "/healthz",
        "/v1/sandboxes",
        "/v1/sandboxes/{sandbox}",
        "/v1/sandboxes/{sandbox}/exec/stream",
        "/v1/sandboxes/{sandbox}/processes/{process_id}/kill",
        "/v1/sandboxes/{sandbox}/files",
        "/v1/sandboxes/{sandbox}/files/mkdir",
        "/v1/images",
    ] {
        assert!(paths.contains_key(p), "missing {p}");
    }
    assert_eq!(body, crate::openapi_json().into_bytes());
}

#[tokio::test]
async fn unknown_route_is_a_json_404() {
    for uri in ["/nope", "/v1/sandboxes/x/nope", "/v2/sandboxes"] {
        let (status, body) = call(get(uri)).await;
        assert_eq!(error_code(status, &body), ErrorCode::NotFound, "{uri}");
    }
}

#[tokio::test]
async fn wrong_method_is_a_json_405() {
    let req = Request::builder()
        .method(Method::PATCH)
        .uri("/v1/sandboxes")
        .body(Body::empty())
        .unwrap();
    let (status, body) = call(req).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let err: ErrorResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(err.error.code, ErrorCode::InvalidArgument);
}

#[tokio::test]
async fn malformed_json_is_invalid_argument() {
    for body in [
        "{",
        "not json",
        r#"{"name": 5}"#,
        r#"{"bogus": true}"#,
        r#"{"limits": {"memory_bytes": -1}}"#,
        "",
    ] {
        let (status, resp) = call(post_json("/v1/sandboxes", body)).await;
        assert_eq!(
            error_code(status, &resp),
            ErrorCode::InvalidArgument,
            "{body}"
        );
    }
}

#[tokio::test]
async fn missing_content_type_is_invalid_argument() {
    let req = Request::post("/v1/sandboxes")
        .body(Body::from("{}"))
        .unwrap();
    let (status, body) = call(req).await;
    assert_eq!(error_code(status, &body), ErrorCode::InvalidArgument);
}

#[tokio::test]
async fn too_large_json_body_is_413() {
    let big = format!(
        r#"{{"name": "{}"}}"#,
        "a".repeat(crate::MAX_JSON_BODY_BYTES + 10)
    );
    let (status, body) = call(post_json("/v1/sandboxes", big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_code(status, &body), ErrorCode::PayloadTooLarge);
}

#[tokio::test]
async fn too_large_upload_is_413_before_the_manager() {
    let req = Request::put("/v1/sandboxes/sb/files?path=/tmp/x")
        .header(header::CONTENT_LENGTH, "2048")
        .body(Body::from(vec![0u8; 2048]))
        .unwrap();
    let (status, body) = call(req).await;
    assert_eq!(error_code(status, &body), ErrorCode::PayloadTooLarge);
}

#[tokio::test]
async fn bad_query_strings_are_invalid_argument() {
    for uri in [
        "/v1/sandboxes?state=sleeping",
        "/v1/sandboxes?label=novalue",
        "/v1/sandboxes?label==v",
        "/v1/sandboxes?bogus=1",
        "/v1/sandboxes/sb?force=maybe",
        "/v1/sandboxes/sb/files",
        "/v1/sandboxes/sb/files?path=",
        "/v1/sandboxes/sb/files?path=/x&user=nobody",
        "/v1/sandboxes/sb/files/list?path=/x&extra=1",
        "/v1/sandboxes/sb/processes/notanumber/logs",
    ] {
        let method = if uri.starts_with("/v1/sandboxes/sb?") {
            Method::DELETE
        } else {
            Method::GET
        };
        let req = Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap();
        let (status, body) = call(req).await;
        assert_eq!(
            error_code(status, &body),
            ErrorCode::InvalidArgument,
            "{uri}"
        );
    }
}

#[tokio::test]
async fn bad_exec_requests_are_refused_early() {
    for body in [
        r#"{}"#,
        r#"{"command": []}"#,
        r#"{"command": ["ls"], "shell": "ls"}"#,
        r#"{"shell": "ls", "timeout_secs": -1}"#,
        r#"{"shell": "ls", "user": "nobody"}"#,
    ] {
        for uri in ["/v1/sandboxes/sb/exec", "/v1/sandboxes/sb/exec/stream"] {
            let (status, resp) = call(post_json(uri, body)).await;
            assert_eq!(
                error_code(status, &resp),
                ErrorCode::InvalidArgument,
                "{uri} {body}"
            );
        }
    }
}

#[tokio::test]
async fn kill_body_is_optional_but_checked() {
    let req = Request::post("/v1/sandboxes/sb/processes/1/kill")
        .body(Body::from(r#"{"signal": 0}"#))
        .unwrap();
    let (status, body) = call(req).await;
    assert_eq!(error_code(status, &body), ErrorCode::InvalidArgument);
    // No body: valid, so it reaches the manager, which has no such sandbox.
    let req = Request::post("/v1/sandboxes/sb/processes/1/kill")
        .body(Body::empty())
        .unwrap();
    let (status, body) = call(req).await;
    assert_eq!(error_code(status, &body), ErrorCode::NotFound);
}

#[tokio::test]
async fn valid_requests_reach_the_manager() {
    // One manager for every request: what they find is its state (no sandbox named `sb`,
    // the host image only).
    let app = TestApp::socket(1024).await;
    for (req, expected) in [
        (
            get("/v1/sandboxes?label=a=b&label=c=d%3De&state=running"),
            StatusCode::OK,
        ),
        (get("/v1/sandboxes/sb"), StatusCode::NOT_FOUND),
        (
            post_json("/v1/sandboxes/sb/exec", r#"{"command":["echo","hi"]}"#),
            StatusCode::NOT_FOUND,
        ),
        (
            get("/v1/sandboxes/sb/files?path=/etc/hostname&user=root"),
            StatusCode::NOT_FOUND,
        ),
        (get("/v1/images"), StatusCode::OK),
    ] {
        let uri = req.uri().to_string();
        let (status, body) = send(app.router.clone(), req).await;
        assert_eq!(
            status,
            expected,
            "{uri}: {}",
            String::from_utf8_lossy(&body)
        );
        if status == StatusCode::NOT_FOUND {
            assert_eq!(error_code(status, &body), ErrorCode::NotFound, "{uri}");
        }
    }
    let (status, body) = send(app.router.clone(), get("/v1/images")).await;
    assert_eq!(status, StatusCode::OK);
    let images: threadbox_api::ImageList = serde_json::from_slice(&body).unwrap();
    assert!(images.images.iter().any(|i| i.name == "host"), "{images:?}");
}

/// Bad input is refused by the manager's validation (`manager/validate.rs`), the only
/// one, before anything is looked up or changed: the store stays empty.
#[tokio::test]
async fn bad_input_is_refused_by_the_manager_and_changes_nothing() {
    let app = TestApp::socket(1024).await;
    for body in [
        r#"{"name":""}"#,
        r#"{"name":"a/b"}"#,
        r#"{"name":"x","labels":{"":"v"}}"#,
    ] {
        let (status, resp) = send(app.router.clone(), post_json("/v1/sandboxes", body)).await;
        assert_eq!(
            error_code(status, &resp),
            ErrorCode::InvalidArgument,
            "{body}: {}",
            String::from_utf8_lossy(&resp)
        );
    }
    let list = app
        .manager
        .run(
            &threadbox_core::Caller::operator(),
            threadbox_core::ops::ListSandboxes::default(),
        )
        .await
        .unwrap();
    assert!(list.sandboxes.is_empty(), "{list:?}");
}

#[test]
fn list_query_parses_repeated_labels() {
    let (labels, state) =
        crate::routes::parse_list_query(Some("label=a%3Db&label=c=d=e&state=paused")).unwrap();
    assert_eq!(labels.get("a").map(String::as_str), Some("b"));
    assert_eq!(labels.get("c").map(String::as_str), Some("d=e"));
    assert_eq!(state, Some(threadbox_api::SandboxState::Paused));
}

#[tokio::test]
async fn tcp_without_a_key_is_401_but_health_and_openapi_are_open() {
    let t = TestApp::tcp().await;
    let app = t.router.clone();
    for (uri, expected) in [
        ("/healthz", StatusCode::OK),
        ("/v1/openapi.json", StatusCode::OK),
        ("/v1/sandboxes", StatusCode::UNAUTHORIZED),
        ("/v1/keys", StatusCode::UNAUTHORIZED),
        ("/metrics", StatusCode::UNAUTHORIZED),
        ("/no/such/route", StatusCode::UNAUTHORIZED),
    ] {
        let resp = app.clone().oneshot(get_tcp(uri)).await.unwrap();
        let status = resp.status();
        assert_eq!(status, expected, "{uri}");
        if expected == StatusCode::UNAUTHORIZED {
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(error_code(status, &body), ErrorCode::Unauthenticated);
        }
    }
    let bad = Request::get("/v1/sandboxes")
        .header(header::HOST, "localhost")
        .header(header::AUTHORIZATION, "Basic Zm9vOmJhcg==")
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        app.oneshot(bad).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn foreign_host_and_origin_are_refused_before_authentication() {
    let t = TestApp::tcp().await;
    let app = t.router.clone();
    let req = |method: Method, host: &str, origin: Option<&str>| {
        let mut b = Request::builder()
            .method(method)
            .uri("/v1/sandboxes/b/pause")
            .header(header::HOST, host);
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        b.body(Body::empty()).unwrap()
    };
    // Control: the daemon's own Host, no Origin, reaches authentication (401).
    let resp = app
        .clone()
        .oneshot(req(Method::POST, "127.0.0.1:7420", None));
    assert_eq!(resp.await.unwrap().status(), StatusCode::UNAUTHORIZED);
    for (host, origin) in [
        ("rebind.evil.example:7420", None),
        ("127.0.0.1:7420", Some("http://evil.example")),
        ("localhost", Some("null")),
    ] {
        for method in [Method::POST, Method::GET, Method::DELETE] {
            let resp = app
                .clone()
                .oneshot(req(method.clone(), host, origin))
                .await
                .unwrap();
            let status = resp.status();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(
                error_code(status, &body),
                ErrorCode::PermissionDenied,
                "{method} Host {host} Origin {origin:?}"
            );
        }
    }
    // /healthz answers any Host (health probes), but not a foreign Origin.
    let health = |host: &str, origin: Option<&str>| {
        let mut b = Request::get("/healthz").header(header::HOST, host);
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        b.body(Body::empty()).unwrap()
    };
    let resp = app
        .clone()
        .oneshot(health("10.0.0.7:7420", None))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = app
        .oneshot(health("localhost", Some("http://evil.example")))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
}
