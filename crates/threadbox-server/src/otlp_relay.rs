//! What the in-sandbox OTLP endpoint serves (ADR 0091): `POST /v1/traces` (protobuf or
//! JSON, as the exporter sent it) forwarded unchanged to the daemon's own collector, the
//! collector's status answered back. Everything else is 404. Bounded: a body of at most
//! [`MAX_BODY`], [`MAX_CONNECTIONS`] at once per sandbox, a deadline on the request head and
//! on the forward, so a sandbox can neither stall the daemon nor flood the collector faster
//! than it answers.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::sync::Arc;
use std::time::Duration;
use threadbox_core::relay::{ServeFuture, TraceSink};
use tokio::sync::Semaphore;

/// Largest export request taken from a sandbox (the OTLP SDKs batch 512 spans, well under).
pub const MAX_BODY: usize = 4 << 20;
/// Connections served at once per sandbox; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 4;
const DEADLINE: Duration = Duration::from_secs(10);

/// Forwards to the collector's traces URL (`…/v1/traces`).
pub struct Forwarder {
    pub traces: hyper::Uri,
}

impl TraceSink for Forwarder {
    fn serve(&self, sandbox: String, listener: tokio::net::TcpListener) -> ServeFuture {
        let traces = self.traces.clone();
        Box::pin(async move {
            let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let stream = match listener.accept().await {
                    Ok((s, _)) => s,
                    Err(e) => {
                        tracing::debug!(sandbox = %sandbox, "OTLP endpoint accept: {e}");
                        continue;
                    }
                };
                let traces = traces.clone();
                let sandbox = sandbox.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let svc = hyper::service::service_fn(move |req| {
                        forward(traces.clone(), sandbox.clone(), req)
                    });
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(DEADLINE)
                        .serve_connection(TokioIo::new(stream), svc);
                    let _ = conn.await;
                });
            }
        })
    }
}

fn answer(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r
}

async fn forward(
    traces: hyper::Uri,
    sandbox: String,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    if req.uri().path() != "/v1/traces" {
        return Ok(answer(
            StatusCode::NOT_FOUND,
            "only /v1/traces is relayed\n",
        ));
    }
    if req.method() != Method::POST {
        return Ok(answer(StatusCode::METHOD_NOT_ALLOWED, "POST only\n"));
    }
    let content_type = req.headers().get(hyper::header::CONTENT_TYPE).cloned();
    let body =
        match tokio::time::timeout(DEADLINE, Limited::new(req.into_body(), MAX_BODY).collect())
            .await
        {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(_)) => return Ok(answer(StatusCode::PAYLOAD_TOO_LARGE, "body too large\n")),
            Err(_) => return Ok(answer(StatusCode::REQUEST_TIMEOUT, "body too slow\n")),
        };
    let mut out = Request::new(body);
    *out.method_mut() = Method::POST;
    *out.uri_mut() = traces;
    if let Some(ct) = content_type {
        out.headers_mut().insert(hyper::header::CONTENT_TYPE, ct);
    }
    let len = out.body().len();
    match tokio::time::timeout(DEADLINE, crate::telemetry::send(out)).await {
        Ok(Ok(resp)) => {
            tracing::debug!(sandbox = %sandbox, bytes = len, status = %resp.status(), "relayed spans");
            let (parts, body) = resp.into_parts();
            Ok(Response::from_parts(parts, Full::new(body)))
        }
        Ok(Err(e)) => {
            tracing::warn!(sandbox = %sandbox, "relaying spans failed: {e}");
            Ok(answer(
                StatusCode::BAD_GATEWAY,
                "the collector could not be reached\n",
            ))
        }
        Err(_) => Ok(answer(
            StatusCode::GATEWAY_TIMEOUT,
            "the collector did not answer\n",
        )),
    }
}
