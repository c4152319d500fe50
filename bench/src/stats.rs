//! Result rows, percentiles and the human table.

use serde::Serialize;
use std::time::Duration;

/// One line of the result table. Latency figures fill `p50`/`p90`/`p99` (in `unit`, "ms");
/// density and throughput figures use the same fields for their value ("MiB", "execs/s").
#[derive(Serialize, Clone, Debug)]
pub struct Row {
    pub figure: String,
    pub contender: String,
    pub unit: String,
    /// Number of samples behind the percentiles (0 for a skipped contender).
    pub n: usize,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    /// p50 divided by the baseline's p50 in the same run (None for the baseline itself).
    pub ratio: Option<f64>,
    pub baseline: Option<String>,
    /// Extra context (e.g. the p99 latency of a throughput figure).
    pub note: Option<String>,
    /// Why this contender did not run, when it did not.
    pub skipped: Option<String>,
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

impl Row {
    pub fn from_samples(figure: &str, contender: &str, unit: &str, mut samples: Vec<f64>) -> Row {
        samples.sort_by(|a, b| a.total_cmp(b));
        Row {
            figure: figure.into(),
            contender: contender.into(),
            unit: unit.into(),
            n: samples.len(),
            p50: Some(percentile(&samples, 0.5)),
            p90: Some(percentile(&samples, 0.9)),
            p99: Some(percentile(&samples, 0.99)),
            ratio: None,
            baseline: None,
            note: None,
            skipped: None,
        }
    }

    pub fn value(figure: &str, contender: &str, unit: &str, v: f64, n: usize) -> Row {
        Row {
            figure: figure.into(),
            contender: contender.into(),
            unit: unit.into(),
            n,
            p50: Some(v),
            p90: None,
            p99: None,
            ratio: None,
            baseline: None,
            note: None,
            skipped: None,
        }
    }

    pub fn skipped(figure: &str, contender: &str, unit: &str, why: &str) -> Row {
        Row {
            figure: figure.into(),
            contender: contender.into(),
            unit: unit.into(),
            n: 0,
            p50: None,
            p90: None,
            p99: None,
            ratio: None,
            baseline: None,
            note: None,
            skipped: Some(why.into()),
        }
    }

    pub fn against(mut self, base: &Row) -> Row {
        if let (Some(a), Some(b)) = (self.p50, base.p50) {
            if b > 0.0 {
                self.ratio = Some(a / b);
                self.baseline = Some(base.contender.clone());
            }
        }
        self
    }

    pub fn note(mut self, n: impl Into<String>) -> Row {
        self.note = Some(n.into());
        self
    }
}

fn num(v: Option<f64>) -> String {
    match v {
        Some(x) if x >= 1000.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.2}"),
        None => "-".into(),
    }
}

/// The human table (plain text).
/// "base" for a row other rows of its figure are compared with, "-" for a row compared
/// with nothing.
fn is_base(rows: &[Row], r: &Row) -> bool {
    rows.iter()
        .any(|o| o.figure == r.figure && o.baseline.as_deref() == Some(r.contender.as_str()))
}

pub fn table(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<46} {:<26} {:>8} {:>9} {:>9} {:>9} {:>8}  {}\n",
        "figure", "contender", "unit", "p50", "p90", "p99", "ratio", "note"
    );
    for r in rows {
        let ratio = match (&r.skipped, r.ratio) {
            (Some(_), _) => "skipped".to_string(),
            (None, Some(x)) => format!("{x:.2}x"),
            (None, None) if is_base(rows, r) => "base".into(),
            (None, None) => "-".into(),
        };
        let note = r
            .skipped
            .clone()
            .or_else(|| r.note.clone())
            .unwrap_or_default();
        s.push_str(&format!(
            "{:<46} {:<26} {:>8} {:>9} {:>9} {:>9} {:>8}  {}\n",
            r.figure,
            r.contender,
            r.unit,
            num(r.p50),
            num(r.p90),
            num(r.p99),
            ratio,
            note
        ));
    }
    s
}

/// The same table in Markdown (for docs/performance.md).
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| figure | contender | unit | p50 | p90 | p99 | ratio | note |\n| --- | --- | --- | ---: | ---: | ---: | ---: | --- |\n",
    );
    for r in rows {
        let ratio = match (&r.skipped, r.ratio) {
            (Some(_), _) => "skipped".to_string(),
            (None, Some(x)) => format!("{x:.2}×"),
            (None, None) if is_base(rows, r) => "base".into(),
            (None, None) => "-".into(),
        };
        let note = r
            .skipped
            .clone()
            .or_else(|| r.note.clone())
            .unwrap_or_default()
            .replace('|', "\\|");
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.figure.replace('|', "\\|"),
            r.contender,
            r.unit,
            num(r.p50),
            num(r.p90),
            num(r.p99),
            ratio,
            note
        ));
    }
    s
}
