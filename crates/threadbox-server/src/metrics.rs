//! Prometheus metrics: API errors by code, requests refused by reason, exec latency,
//! sandboxes by state and each tenant's use (read from the manager at scrape time), and the
//! core's own latencies and failure counters (`threadbox_core::metrics`). Text exposition
//! format, written by hand: a few dozen series do not need a metrics library, and
//! `promtool check metrics` checks the text in the test suite.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use threadbox_api::ops::MetricsSnapshot;
use threadbox_api::ErrorCode;
use threadbox_core::metrics::{escape, CoreMetrics, CounterVec};

/// Why a request was refused before it reached an operation, when the error code alone
/// does not say (a response extension, set by the middleware that refused it).
#[derive(Clone, Copy, Debug)]
pub struct RejectReason(pub &'static str);

/// The refusal reason of an error code, if that code is a refusal (the caller's fault or
/// limit, not the daemon's).
fn rejected_because(code: ErrorCode) -> Option<&'static str> {
    Some(match code {
        ErrorCode::Unauthenticated => "unauthenticated",
        ErrorCode::PermissionDenied => "permission_denied",
        ErrorCode::QuotaExceeded => "quota_exceeded",
        ErrorCode::PayloadTooLarge => "payload_too_large",
        ErrorCode::InvalidArgument => "invalid_argument",
        _ => return None,
    })
}

/// Upper bounds of the exec latency buckets, seconds.
const EXEC_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

#[derive(Default)]
pub struct Metrics {
    errors: Mutex<BTreeMap<&'static str, u64>>,
    exec_buckets: [AtomicU64; EXEC_BUCKETS.len()],
    exec_count: AtomicU64,
    exec_sum_us: AtomicU64,
    rejected: CounterVec<1>,
}

impl Metrics {
    pub fn record_error(&self, code: ErrorCode, reason: Option<RejectReason>) {
        let mut m = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(code.as_str()).or_default() += 1;
        drop(m);
        if let Some(r) = reason.map(|r| r.0).or_else(|| rejected_because(code)) {
            self.rejected.inc([r]);
        }
    }

    pub fn record_exec(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, le) in EXEC_BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.exec_buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.exec_count.fetch_add(1, Ordering::Relaxed);
        self.exec_sum_us.fetch_add(
            d.as_micros().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// The exposition text, with what the manager holds read by the caller.
    pub fn render(&self, snap: &MetricsSnapshot, core: &CoreMetrics) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP threadbox_sandboxes Sandboxes by state.");
        let _ = writeln!(out, "# TYPE threadbox_sandboxes gauge");
        for (state, n) in &snap.sandboxes {
            let _ = writeln!(out, "threadbox_sandboxes{{state=\"{state}\"}} {n}");
        }
        render_tenants(&mut out, snap);
        core.render(&mut out);
        self.rejected.render(
            &mut out,
            "threadbox_requests_rejected_total",
            "Requests refused before any work, by reason.",
            ["reason"],
            &[
                ["unauthenticated"],
                ["permission_denied"],
                ["host_or_origin"],
                ["quota_exceeded"],
                ["payload_too_large"],
                ["invalid_argument"],
            ],
        );
        let _ = writeln!(
            out,
            "# HELP threadbox_exec_duration_seconds Latency of exec calls (request to result)."
        );
        let _ = writeln!(out, "# TYPE threadbox_exec_duration_seconds histogram");
        for (i, le) in EXEC_BUCKETS.iter().enumerate() {
            let n = self.exec_buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "threadbox_exec_duration_seconds_bucket{{le=\"{le}\"}} {n}"
            );
        }
        let count = self.exec_count.load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "threadbox_exec_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let sum = self.exec_sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "threadbox_exec_duration_seconds_sum {sum}");
        let _ = writeln!(out, "threadbox_exec_duration_seconds_count {count}");
        let _ = writeln!(out, "# HELP threadbox_api_errors_total API errors by code.");
        let _ = writeln!(out, "# TYPE threadbox_api_errors_total counter");
        let errors = self
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (code, n) in errors {
            let _ = writeln!(out, "threadbox_api_errors_total{{code=\"{code}\"}} {n}");
        }
        out
    }
}

/// Per-tenant gauges: CPU (metered), memory (now), disk (last sample).
fn render_tenants(out: &mut String, snap: &MetricsSnapshot) {
    type Get = fn(&threadbox_api::ops::TenantGauges) -> f64;
    let series: [(&str, &str, Get); 3] = [
        (
            "threadbox_tenant_cpu_seconds",
            "CPU time used by a tenant's existing sandboxes, as metered.",
            |g| g.cpu_seconds,
        ),
        (
            "threadbox_tenant_memory_bytes",
            "Memory held now by a tenant's running and paused sandboxes.",
            |g| g.memory_bytes as f64,
        ),
        (
            "threadbox_tenant_disk_bytes",
            "Disk used by a tenant's sandboxes at their last sample.",
            |g| g.disk_bytes as f64,
        ),
    ];
    for (name, help, get) in series {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} gauge");
        for (tenant, g) in &snap.tenants {
            let _ = writeln!(out, "{name}{{tenant=\"{}\"}} {}", escape(tenant), get(g));
        }
    }
}

/// Counts every error response by its code (set by `ApiError` as a response extension).
pub(crate) async fn count_errors(
    State(metrics): State<Arc<Metrics>>,
    req: Request,
    next: Next,
) -> Response {
    let resp = next.run(req).await;
    if let Some(code) = resp.extensions().get::<ErrorCode>() {
        metrics.record_error(*code, resp.extensions().get::<RejectReason>().copied());
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_histogram_and_errors() {
        let m = Metrics::default();
        m.record_exec(Duration::from_millis(30));
        m.record_exec(Duration::from_secs(3));
        m.record_error(ErrorCode::QuotaExceeded, None);
        m.record_error(
            ErrorCode::PermissionDenied,
            Some(RejectReason("host_or_origin")),
        );
        m.record_error(ErrorCode::Internal, None);
        let mut s = MetricsSnapshot::default();
        s.sandboxes.insert("running".to_string(), 2);
        s.tenants.insert(
            "t\"1".to_string(),
            threadbox_api::ops::TenantGauges {
                cpu_seconds: 1.5,
                memory_bytes: 4096,
                disk_bytes: 0,
            },
        );
        let text = m.render(&s, &CoreMetrics::default());
        assert!(text.contains("threadbox_sandboxes{state=\"running\"} 2"));
        assert!(text.contains("threadbox_exec_duration_seconds_bucket{le=\"0.05\"} 1"));
        assert!(text.contains("threadbox_exec_duration_seconds_bucket{le=\"5\"} 2"));
        assert!(text.contains("threadbox_exec_duration_seconds_count 2"));
        assert!(text.contains("threadbox_api_errors_total{code=\"quota_exceeded\"} 1"));
        assert!(text.contains("threadbox_requests_rejected_total{reason=\"quota_exceeded\"} 1"));
        assert!(text.contains("threadbox_requests_rejected_total{reason=\"host_or_origin\"} 1"));
        // A daemon fault is an error, not a refusal.
        assert!(text.contains("threadbox_api_errors_total{code=\"internal\"} 1"));
        assert!(!text.contains("reason=\"internal\""));
        assert!(text.contains("threadbox_tenant_memory_bytes{tenant=\"t\\\"1\"} 4096"));
        assert!(text.contains("threadbox_tenant_cpu_seconds{tenant=\"t\\\"1\"} 1.5"));
    }
}
