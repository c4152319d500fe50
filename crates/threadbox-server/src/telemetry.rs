//! Traces (issue 17, ADR 0090): the daemon continues the caller's W3C trace context and
//! exports its spans over OTLP/HTTP, only when an endpoint is configured.
//!
//! - [`Telemetry::from_config`] builds the exporter when `--otlp-endpoint`,
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, else
//!   nothing: no layer, no thread, no cost.
//! - [`trace_http`] is the outermost middleware: a SERVER span per request named after the
//!   route template, its parent taken from `traceparent`/`tracestate`/`baggage`.
//! - [`parent_from_meta`] does the same for MCP `params._meta`.
//! - The manager adds one span per operation and the environment carrier for the
//!   sandboxed process (`threadbox_core::telemetry`).
//!
//! The exporter speaks plain `http://` through a small hyper client that runs on the
//! daemon's runtime: no reqwest and no TLS stack, so no aws-lc (ADR 0090 says why, and how
//! to reach an `https://` backend: a local collector or agent).

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry::propagation::{Extractor, TextMapCompositePropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_http::{HeaderExtractor, HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use std::time::Duration;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::Layer;

/// The response header that names the daemon's trace id, for callers whose tracer cannot
/// be a W3C parent (LangSmith records it in the tool run's metadata).
pub const TRACE_ID_HEADER: &str = "x-threadbox-trace-id";

/// Why tracing could not be set up; the daemon refuses to start rather than run without
/// the traces it was asked for.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("the OTLP endpoint `{0}` is not an http:// URL (https is not supported yet: export to a local collector, see docs/observability.md)")]
    Endpoint(String),
    #[error("the OTLP exporter could not be built: {0}")]
    Build(String),
    #[error("tracing needs a tokio runtime to export on")]
    NoRuntime,
}

/// The tracer provider while tracing is on; [`Telemetry::shutdown`] flushes it.
pub struct Telemetry {
    provider: SdkTracerProvider,
    /// The collector's traces URL, also where in-sandbox endpoints forward (ADR 0091).
    traces: hyper::Uri,
}

impl Telemetry {
    /// Builds the exporter if an endpoint is configured: `flag` (a base URL, as
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`; `/v1/traces` is appended), else the standard
    /// environment variables. `Ok(None)`: tracing is off.
    ///
    /// Must run inside the daemon's tokio runtime: the exporter sends on it.
    pub fn from_config(flag: Option<&str>) -> Result<Option<Self>, TelemetryError> {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let signal = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        let base = env("OTEL_EXPORTER_OTLP_ENDPOINT");
        let endpoint = match (flag.filter(|f| !f.trim().is_empty()), signal, base) {
            (Some(f), _, _) => format!("{}/v1/traces", f.trim_end_matches('/')),
            (None, Some(s), _) => s,
            (None, None, Some(b)) => format!("{}/v1/traces", b.trim_end_matches('/')),
            (None, None, None) => return Ok(None),
        };
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let uri: hyper::Uri = endpoint
            .parse()
            .map_err(|_| TelemetryError::Endpoint(endpoint.clone()))?;
        if uri.scheme_str() != Some("http") || uri.host().is_none() {
            return Err(TelemetryError::Endpoint(endpoint));
        }
        let handle =
            tokio::runtime::Handle::try_current().map_err(|_| TelemetryError::NoRuntime)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint.clone())
            .with_http_client(RuntimeClient {
                handle,
                timeout: Duration::from_secs(10),
            })
            .build()
            .map_err(|e| TelemetryError::Build(e.to_string()))?;
        let mut resource = Resource::builder();
        if env("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("threadbox");
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        install_propagator();
        Ok(Some(Self {
            provider,
            traces: uri,
        }))
    }

    /// The `tracing` layer that turns the daemon's spans into OpenTelemetry spans. Only
    /// spans of threadbox's own crates are exported, and no events: log lines can name
    /// paths and commands, spans carry only the attributes `docs/observability.md` lists.
    pub fn layer<S>(&self) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("threadbox"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(filter_fn(|meta| {
                meta.is_span() && meta.target().starts_with("threadbox")
            }))
    }

    /// What sandboxes created with `otlp_relay` forward their spans through.
    pub fn relay(&self) -> threadbox_core::relay::TraceRelay {
        threadbox_core::relay::TraceRelay(std::sync::Arc::new(crate::otlp_relay::Forwarder {
            traces: self.traces.clone(),
        }))
    }

    /// Exports what is buffered and stops the exporter. Blocks: call it off the runtime's
    /// worker threads (`spawn_blocking`).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "the trace exporter did not shut down cleanly");
        }
    }
}

/// W3C trace context and baggage, the propagators the env carrier and the SDKs agree on.
pub fn install_propagator() {
    opentelemetry::global::set_text_map_propagator(TextMapCompositePropagator::new(vec![
        Box::new(TraceContextPropagator::new()),
        Box::new(BaggagePropagator::new()),
    ]));
}

/// The caller's context from HTTP headers (empty when there is none, or tracing is off).
pub fn parent_from_headers(headers: &axum::http::HeaderMap) -> Context {
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)))
}

/// The caller's context from MCP `params._meta` (`traceparent`, `tracestate`, `baggage`).
pub fn parent_from_meta(meta: &serde_json::Map<String, serde_json::Value>) -> Context {
    opentelemetry::global::get_text_map_propagator(|p| p.extract(&MetaExtractor(meta)))
}

struct MetaExtractor<'a>(&'a serde_json::Map<String, serde_json::Value>);

impl Extractor for MetaExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.as_str())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// The trace id of a span, as 32 hex digits; `None` when it has no valid context.
pub fn trace_id_of(span: &tracing::Span) -> Option<String> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// The outermost middleware: a SERVER span per request, continuing the caller's trace.
/// Without tracing on, the span is disabled and this costs a header lookup.
pub async fn trace_http(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        // Unmatched paths are not used as names: their number is the caller's to choose.
        .unwrap_or_else(|| "unmatched".into());
    let method = req.method().as_str().to_string();
    let span = tracing::info_span!(
        "http",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if span.is_disabled() {
        return next.run(req).await;
    }
    // Set the parent before the span is first used (tracing-opentelemetry refuses later).
    let _ = span.set_parent(parent_from_headers(req.headers()));
    let mut resp = next.run(req).instrument(span.clone()).await;
    let status = resp.status().as_u16();
    span.record("http.response.status_code", status);
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
    if let Some(id) = trace_id_of(&span) {
        if let Ok(v) = axum::http::HeaderValue::from_str(&id) {
            resp.headers_mut().insert(TRACE_ID_HEADER, v);
        }
    }
    resp
}

/// OTLP/HTTP over plain HTTP/1.1 on the daemon's runtime. The SDK's batch processor
/// exports from its own thread with a minimal executor; the request is spawned onto the
/// captured tokio runtime and its `JoinHandle` awaited, so the hyper I/O has a reactor.
#[derive(Debug)]
struct RuntimeClient {
    handle: tokio::runtime::Handle,
    timeout: Duration,
}

#[async_trait::async_trait]
impl HttpClient for RuntimeClient {
    async fn send_bytes(
        &self,
        request: axum::http::Request<Bytes>,
    ) -> Result<axum::http::Response<Bytes>, HttpError> {
        let timeout = self.timeout;
        let task = self.handle.spawn(async move {
            tokio::time::timeout(timeout, send(request))
                .await
                .map_err(|_| HttpError::from("the OTLP export timed out"))?
        });
        task.await.map_err(|e| HttpError::from(e.to_string()))?
    }
}

/// The collector's answer is bounded: it is read only for its status and error message.
const MAX_RESPONSE_BYTES: usize = 1024 * 1024;

pub(crate) async fn send(
    request: axum::http::Request<Bytes>,
) -> Result<axum::http::Response<Bytes>, HttpError> {
    let uri = request.uri().clone();
    let host = uri.host().ok_or("the OTLP endpoint has no host")?;
    let port = uri.port_u16().unwrap_or(80);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let stream = tokio::net::TcpStream::connect((host, port)).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let (mut parts, body) = request.into_parts();
    // HTTP/1.1 needs a Host header, and the request line carries only the path.
    if let Some(auth) = uri.authority() {
        if let Ok(v) = axum::http::HeaderValue::from_str(auth.as_str()) {
            parts.headers.insert(axum::http::header::HOST, v);
        }
    }
    parts.uri = uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/")
        .parse()?;
    let resp = sender
        .send_request(axum::http::Request::from_parts(parts, Full::new(body)))
        .await?;
    let (parts, body) = resp.into_parts();
    let limited = http_body_util::Limited::new(body, MAX_RESPONSE_BYTES);
    let body = limited.collect().await?.to_bytes();
    Ok(axum::http::Response::from_parts(parts, body))
}

/// The SERVER span of one MCP `tools/call`. Its parent is `params._meta`'s context (the
/// MCP semantic conventions), else the HTTP request's headers (what a client that cannot
/// set `_meta` sends, e.g. langchain-mcp-adapters with an interceptor), else none: rmcp
/// runs tools on the session's task, outside the HTTP request's span.
pub fn mcp_span(
    tool: &str,
    meta: &serde_json::Map<String, serde_json::Value>,
    http: Option<&axum::http::request::Parts>,
) -> tracing::Span {
    let span = tracing::info_span!(
        "mcp",
        otel.name = %format_args!("tools/call {tool}"),
        otel.kind = "server",
        mcp.method.name = "tools/call",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %tool,
        network.transport = if http.is_some() { "tcp" } else { "pipe" },
        error.type = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if span.is_disabled() {
        return span;
    }
    let from_meta = parent_from_meta(meta);
    let parent = if from_meta.span().span_context().is_valid() {
        from_meta
    } else {
        http.map(|p| parent_from_headers(&p.headers))
            .unwrap_or_default()
    };
    let _ = span.set_parent(parent);
    span
}

/// Marks a tool call that failed (a protocol error, or a tool result with `isError`).
pub fn record_mcp_outcome(
    span: &tracing::Span,
    out: &Result<rmcp::model::CallToolResult, rmcp::ErrorData>,
) {
    let failed = match out {
        Ok(r) => r.is_error == Some(true),
        Err(_) => true,
    };
    if failed {
        span.record("error.type", "tool_error");
        span.record("otel.status_code", "ERROR");
    }
}
