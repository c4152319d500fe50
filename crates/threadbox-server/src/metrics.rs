//! Prometheus metrics: API errors by code, exec latency, sandboxes by state (read from
//! the manager at scrape time). Text exposition format, written by hand: a few series do
//! not need a metrics library.

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use threadbox_api::ErrorCode;

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
}

impl Metrics {
    pub fn record_error(&self, code: ErrorCode) {
        let mut m = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(code.as_str()).or_default() += 1;
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

    /// The exposition text, with the sandbox counts read by the caller.
    pub fn render(&self, sandboxes: &BTreeMap<String, u64>) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# HELP threadbox_sandboxes Sandboxes by state.");
        let _ = writeln!(out, "# TYPE threadbox_sandboxes gauge");
        for (state, n) in sandboxes {
            let _ = writeln!(out, "threadbox_sandboxes{{state=\"{state}\"}} {n}");
        }
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

/// Counts every error response by its code (set by `ApiError` as a response extension).
pub(crate) async fn count_errors(
    State(metrics): State<Arc<Metrics>>,
    req: Request,
    next: Next,
) -> Response {
    let resp = next.run(req).await;
    if let Some(code) = resp.extensions().get::<ErrorCode>() {
        metrics.record_error(*code);
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
        m.record_error(ErrorCode::QuotaExceeded);
        let mut s = BTreeMap::new();
        s.insert("running".to_string(), 2);
        let text = m.render(&s);
        assert!(text.contains("threadbox_sandboxes{state=\"running\"} 2"));
        assert!(text.contains("threadbox_exec_duration_seconds_bucket{le=\"0.05\"} 1"));
        assert!(text.contains("threadbox_exec_duration_seconds_bucket{le=\"5\"} 2"));
        assert!(text.contains("threadbox_exec_duration_seconds_count 2"));
        assert!(text.contains("threadbox_api_errors_total{code=\"quota_exceeded\"} 1"));
    }
}
