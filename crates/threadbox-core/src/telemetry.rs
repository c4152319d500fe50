//! Trace context and span attributes of the manager's operations (issue 17, ADR 0090).
//!
//! The core links only the OpenTelemetry *API* and `tracing-opentelemetry`'s span
//! extension: which spans are exported, and where to, is the daemon's business
//! (`threadbox_server::telemetry`). Without an OpenTelemetry layer installed every function
//! here is a no-op: `Span::context()` is empty and `set_attribute` goes nowhere, so no
//! `TRACEPARENT` reaches a sandbox and no cost beyond a lookup is paid.
//!
//! What goes on spans is listed in `docs/observability.md`. Never environment values,
//! stdin, file contents, keys or argv: only ids, sizes, codes and flags.

use crate::store::SandboxRow;
use opentelemetry::propagation::Injector;
use opentelemetry::trace::TraceContextExt;
use std::collections::BTreeMap;
use threadbox_api::ExecResponse;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The W3C baggage limit: a larger `BAGGAGE` is dropped rather than cut mid-entry.
const MAX_BAGGAGE: usize = 8192;

/// Puts the current span's context into `env` as the environment carrier
/// (`TRACEPARENT`, `TRACESTATE`, `BAGGAGE`), so OpenTelemetry code the sandbox runs
/// continues this trace. A carrier the caller set explicitly wins: it is not replaced.
/// Nothing is added when there is no valid span context (tracing disabled, or no span).
pub fn inject_env(env: &mut BTreeMap<String, String>) {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        return;
    }
    if env.keys().any(|k| k.eq_ignore_ascii_case("TRACEPARENT")) {
        return;
    }
    let mut carrier = EnvCarrier(BTreeMap::new());
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut carrier));
    for (k, v) in carrier.0 {
        // The propagator writes `tracestate: ""` for an empty state; an empty variable is
        // noise to the child (and some extractors reject it).
        if v.is_empty() || (k == "BAGGAGE" && v.len() > MAX_BAGGAGE) {
            continue;
        }
        env.entry(k).or_insert(v);
    }
}

/// Header names upper-cased, as the env-carrier spec names them.
struct EnvCarrier(BTreeMap<String, String>);

impl Injector for EnvCarrier {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_ascii_uppercase(), value);
    }
}

/// Names the sandbox an operation works on, on the current span.
pub fn record_sandbox(row: &SandboxRow) {
    let span = tracing::Span::current();
    span.set_attribute("threadbox.sandbox.id", row.id.clone());
    if let Some(name) = &row.name {
        span.set_attribute("threadbox.sandbox.name", name.clone());
    }
    span.set_attribute("threadbox.sandbox.tier", row.tier.clone());
    span.set_attribute("threadbox.sandbox.image", row.image.clone());
}

/// The outcome of a buffered exec, on the current span.
pub fn record_exec(resp: &ExecResponse) {
    let span = tracing::Span::current();
    if let Some(code) = resp.exit_code {
        span.set_attribute("process.exit.code", i64::from(code));
    }
    if let Some(sig) = resp.signal {
        span.set_attribute("threadbox.exec.signal", i64::from(sig));
    }
    span.set_attribute("threadbox.exec.timed_out", resp.timed_out);
    span.set_attribute("threadbox.output.truncated", resp.truncated);
    span.set_attribute("threadbox.exec.oom_killed", resp.oom_killed);
    span.set_attribute("threadbox.exec.duration_ms", resp.duration_ms as i64);
}

/// A byte count an operation moved (file reads and writes, exec output).
pub fn record_bytes(key: &'static str, n: u64) {
    tracing::Span::current().set_attribute(key, n.min(i64::MAX as u64) as i64);
}
