//! What operators alert on, counted where it happens (issue 17): the latency of every
//! operation by outcome (recorded in [`crate::Manager::run`], the one place every door goes
//! through), boot failures, agent reconnects, freezes that did not settle, and store
//! latency. Plain atomics behind a lock only for the label map: a scrape renders them in
//! Prometheus' text format (`threadbox-server`'s `/metrics`), and the hot path pays one
//! short lock and a few relaxed adds per operation.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bounds of the latency buckets, seconds: from a store read (~100 µs) to a long
/// exec (a minute).
pub const BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// A cumulative latency histogram.
#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        // Only the first bucket that holds it: `render` accumulates, so an observation
        // costs one add here instead of one per bucket.
        if let Some(i) = BUCKETS.iter().position(|le| secs <= *le) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            d.as_micros().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The `_bucket`, `_sum` and `_count` lines of `name{labels}` (labels already
    /// formatted as `k="v",…`, or empty).
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut acc = 0;
        for (i, le) in BUCKETS.iter().enumerate() {
            acc += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {acc}");
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = |s: &str| {
            if s.is_empty() {
                String::new()
            } else {
                format!("{{{s}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(out, "{name}_count{} {count}", braces(labels));
    }
}

/// Histograms keyed by a fixed set of label values (`&'static str`: label values come from
/// operation names and error codes, never from user input, so the series are bounded).
#[derive(Default)]
pub struct HistogramVec<const N: usize> {
    series: Mutex<BTreeMap<[&'static str; N], Arc<Histogram>>>,
}

impl<const N: usize> HistogramVec<N> {
    pub fn observe(&self, labels: [&'static str; N], d: Duration) {
        self.with(labels).observe(d);
    }

    pub fn with(&self, labels: [&'static str; N]) -> Arc<Histogram> {
        let mut m = self.series.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(labels).or_default().clone()
    }

    fn snapshot(&self) -> Vec<([&'static str; N], Arc<Histogram>)> {
        let m = self.series.lock().unwrap_or_else(|p| p.into_inner());
        m.iter().map(|(k, v)| (*k, v.clone())).collect()
    }

    pub fn render(&self, out: &mut String, name: &str, help: &str, names: [&str; N]) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (values, h) in self.snapshot() {
            h.render(out, name, &labels(&names, &values));
        }
    }
}

/// Counters keyed by label values, bounded like [`HistogramVec`].
#[derive(Default)]
pub struct CounterVec<const N: usize> {
    series: Mutex<BTreeMap<[&'static str; N], u64>>,
}

impl<const N: usize> CounterVec<N> {
    pub fn inc(&self, labels: [&'static str; N]) {
        let mut m = self.series.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry(labels).or_default() += 1;
    }

    pub fn get(&self, labels: [&'static str; N]) -> u64 {
        let m = self.series.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&labels).copied().unwrap_or(0)
    }

    /// Renders the counter; `always` are label values shown at 0 before they happen, so
    /// an alert on `rate(...)` has a series to start from.
    pub fn render(
        &self,
        out: &mut String,
        name: &str,
        help: &str,
        names: [&str; N],
        always: &[[&'static str; N]],
    ) {
        let mut m = self
            .series
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for a in always {
            m.entry(*a).or_default();
        }
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} counter");
        for (values, n) in m {
            let l = labels(&names, &values);
            if l.is_empty() {
                let _ = writeln!(out, "{name} {n}");
            } else {
                let _ = writeln!(out, "{name}{{{l}}} {n}");
            }
        }
    }
}

fn labels(names: &[&str], values: &[&str]) -> String {
    names
        .iter()
        .zip(values)
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect::<Vec<_>>()
        .join(",")
}

/// A label value in the exposition format: backslash, quote and newline escaped.
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The core's own metrics, one set per [`crate::Manager`].
#[derive(Default)]
pub struct CoreMetrics {
    /// `op`, `outcome` (`ok` or the error code).
    pub ops: HistogramVec<2>,
    /// `reason`: `launch` (the tier could not start it) or `agent` (its agent never
    /// answered).
    pub boot_failures: CounterVec<1>,
    /// `cause` (`lost`: a call found the connection closed; `adopt`: a daemon start
    /// reconnected to a running sandbox), `outcome` (`ok`, `failed`).
    pub agent_reconnects: CounterVec<2>,
    /// Freezes that did not settle in time (undone; the pause failed).
    pub freeze_timeouts: CounterVec<0>,
    /// `query`: the store's hot statements.
    pub store: Arc<HistogramVec<1>>,
}

impl CoreMetrics {
    pub fn render(&self, out: &mut String) {
        self.ops.render(
            out,
            "threadbox_operation_duration_seconds",
            "Latency of every API operation (all doors) by operation and outcome.",
            ["op", "outcome"],
        );
        self.boot_failures.render(
            out,
            "threadbox_boot_failures_total",
            "Sandbox boots that failed, by reason.",
            ["reason"],
            &[["launch"], ["agent"]],
        );
        self.agent_reconnects.render(
            out,
            "threadbox_agent_reconnects_total",
            "Connections to a sandbox's agent made again, by cause and outcome.",
            ["cause", "outcome"],
            &[
                ["lost", "ok"],
                ["lost", "failed"],
                ["adopt", "ok"],
                ["adopt", "failed"],
            ],
        );
        self.freeze_timeouts.render(
            out,
            "threadbox_freeze_timeouts_total",
            "Pauses whose cgroup freeze did not settle in time (undone, the pause failed).",
            [],
            &[[]],
        );
        self.store.render(
            out,
            "threadbox_store_query_duration_seconds",
            "Latency of the store's hot statements.",
            ["query"],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_renders_cumulative_buckets() {
        let h = HistogramVec::<2>::default();
        h.observe(["exec", "ok"], Duration::from_millis(3));
        h.observe(["exec", "ok"], Duration::from_millis(30));
        h.observe(["exec", "ok"], Duration::from_secs(100));
        let mut s = String::new();
        h.render(&mut s, "x", "help", ["op", "outcome"]);
        assert!(
            s.contains("x_bucket{op=\"exec\",outcome=\"ok\",le=\"0.005\"} 1\n"),
            "{s}"
        );
        assert!(
            s.contains("x_bucket{op=\"exec\",outcome=\"ok\",le=\"0.05\"} 2\n"),
            "{s}"
        );
        assert!(
            s.contains("x_bucket{op=\"exec\",outcome=\"ok\",le=\"60\"} 2\n"),
            "{s}"
        );
        assert!(
            s.contains("x_bucket{op=\"exec\",outcome=\"ok\",le=\"+Inf\"} 3\n"),
            "{s}"
        );
        assert!(s.contains("x_count{op=\"exec\",outcome=\"ok\"} 3\n"), "{s}");
    }

    #[test]
    fn counters_show_their_zero_series_and_escape_values() {
        let c = CounterVec::<1>::default();
        c.inc(["a\"b"]);
        let mut s = String::new();
        c.render(&mut s, "y_total", "help", ["reason"], &[["launch"]]);
        assert!(s.contains("y_total{reason=\"launch\"} 0\n"), "{s}");
        assert!(s.contains("y_total{reason=\"a\\\"b\"} 1\n"), "{s}");
        let z = CounterVec::<0>::default();
        z.inc([]);
        let mut s = String::new();
        z.render(&mut s, "z_total", "help", [], &[[]]);
        assert!(s.contains("z_total 1\n"), "{s}");
    }
}
