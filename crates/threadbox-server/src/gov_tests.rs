//! The governance routes over a real manager (fake tier, `test_app.rs`): each is its
//! `threadbox_api::ops` operation, scope-checked, validated and audited by the manager.

use crate::test_app::TestApp;
use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use threadbox_api::ops::Operation;
use threadbox_api::*;
use tower::ServiceExt;

async fn send(app: &TestApp, req: Request<Body>) -> (StatusCode, serde_json::Value) {
    let resp = app.router.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let body = resp.into_body().collect().await.expect("a body").to_bytes();
    let json = if body.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&body).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&body).into_owned())
        })
    };
    (status, json)
}

fn json_req(method: &str, uri: &str, body: serde_json::Value) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .expect("a request")
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).expect("a request")
}

#[tokio::test]
async fn keys_quotas_and_the_audit_log_go_through_their_operations() {
    let app = TestApp::socket(1024).await;
    let (status, created) = send(
        &app,
        json_req(
            "POST",
            routes::KEYS,
            serde_json::json!({"tenant": "acme", "scopes": ["sandboxes:read"]}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let key: CreatedKey = serde_json::from_value(created).expect("a created key");

    let (status, list) = send(&app, get("/v1/keys?tenant=acme")).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    let list: ApiKeyList = serde_json::from_value(list).expect("a key list");
    assert_eq!(list.keys.len(), 1);

    // Bad input is the manager's refusal, and changes nothing.
    let (status, err) = send(
        &app,
        json_req(
            "POST",
            routes::KEYS,
            serde_json::json!({"tenant": "acme", "scopes": []}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");
    let (status, err) = send(
        &app,
        json_req("PUT", "/v1/quotas/no%20such", serde_json::json!({})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{err}");

    let (status, q) = send(
        &app,
        json_req(
            "PUT",
            "/v1/quotas/acme",
            serde_json::json!({"max_running": 2}),
        ),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{q}");
    let (status, q) = send(&app, get("/v1/quotas/acme")).await;
    assert_eq!(status, StatusCode::OK);
    let q: TenantQuota = serde_json::from_value(q).expect("a quota");
    assert_eq!(q.quota.max_running, Some(2));

    let key_route = routes::fill(routes::KEY, &[&key.id]);
    let (status, _) = send(
        &app,
        Request::delete(key_route.as_str())
            .body(Body::empty())
            .expect("a request"),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let (status, audit) = send(&app, get("/v1/audit")).await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    let audit: AuditList = serde_json::from_value(audit).expect("an audit list");
    let actions: Vec<(&str, &str)> = audit
        .entries
        .iter()
        .map(|e| (e.action.as_str(), e.result.as_str()))
        .collect();
    // One entry per write, named by its operation; a refused one records its code.
    assert_eq!(
        actions,
        [
            (ops::CreateKey::NAME, "ok"),
            (ops::CreateKey::NAME, "invalid_argument"),
            (ops::SetQuota::NAME, "invalid_argument"),
            (ops::SetQuota::NAME, "ok"),
            (ops::RevokeKey::NAME, "ok"),
        ],
    );
    let (status, v) = send(&app, get("/v1/audit/verify")).await;
    assert_eq!(status, StatusCode::OK);
    let v: AuditVerification = serde_json::from_value(v).expect("a verification");
    assert!(v.ok, "{v:?}");

    let (status, usage) = send(&app, get("/v1/usage")).await;
    assert_eq!(status, StatusCode::OK, "{usage}");
    let (status, text) = send(&app, get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(text.to_string().contains("threadbox_"), "{text}");
}
