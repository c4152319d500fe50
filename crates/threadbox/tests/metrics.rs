//! `/metrics` against a real daemon (issue 17): after a little traffic, the operation
//! histograms by outcome, the refusals by reason, the per-tenant gauges and the store's
//! latency are there with the counts that traffic implies, and `promtool check metrics`
//! accepts the text.

mod common;

use common::{require_root, Daemon};
use std::path::PathBuf;
use std::process::Command;

/// `curl` one request; its HTTP status and body.
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "-o", "-", "-w", "\n%{http_code}", "--max-time", "30"])
        .args(args)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (status.trim().parse().unwrap_or(0), body.to_string())
}

/// The value of the series `name{labels}` exactly as written, if present.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `promtool`: `THREADBOX_PROMTOOL`, else `target/tools/promtool` (where `scripts/test.sh`
/// puts it), else the PATH.
fn promtool() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("THREADBOX_PROMTOOL") {
        return Some(p.into());
    }
    let local = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/tools/promtool");
    if local.is_file() {
        return Some(local);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file())
}

#[test]
fn metrics_count_operations_refusals_and_tenants_and_promtool_accepts_them() {
    if !require_root("metrics_count_operations_refusals_and_tenants") {
        return;
    }
    let d = Daemon::start();
    let sb = d.create(&[]);
    d.cli(&["exec", &sb, "--", "true"]).ok();
    d.cli(&["exec", &sb, "--", "sh", "-c", "exit 3"])
        .expect_code(3);
    // An operation that fails: counted under its error code.
    let missing = d.cli(&["exec", "no-such-sandbox", "--", "true"]);
    assert_ne!(missing.code, 0);
    // Refusals on TCP: no key, then a foreign Origin (refused before authentication).
    let base = format!("http://127.0.0.1:{}", d.port);
    let (s, _) = curl(&[&format!("{base}/v1/sandboxes")]);
    assert_eq!(s, 401);
    let (s, _) = curl(&[
        "-H",
        "Origin: https://evil.example",
        &format!("{base}/v1/sandboxes"),
    ]);
    assert_eq!(s, 403);

    let sock = d.root_path().join("threadbox.sock");
    let (s, text) = curl(&[
        "--unix-socket",
        sock.to_str().expect("utf-8 path"),
        "http://localhost/metrics",
    ]);
    assert_eq!(s, 200, "{text}");

    let count = |series: &str| value(&text, series).unwrap_or_else(|| panic!("no {series}"));
    assert_eq!(
        count("threadbox_operation_duration_seconds_count{op=\"sandbox.create\",outcome=\"ok\"}"),
        1.0
    );
    assert_eq!(
        count("threadbox_operation_duration_seconds_count{op=\"sandbox.exec\",outcome=\"ok\"}"),
        2.0,
        "a non-zero exit is a result, not a failed operation"
    );
    assert_eq!(
        count(
            "threadbox_operation_duration_seconds_count{op=\"sandbox.exec\",outcome=\"not_found\"}"
        ),
        1.0
    );
    assert_eq!(
        count("threadbox_requests_rejected_total{reason=\"unauthenticated\"}"),
        1.0
    );
    assert_eq!(
        count("threadbox_requests_rejected_total{reason=\"host_or_origin\"}"),
        1.0
    );
    // Nothing failed to boot or freeze: the zero series are there to alert on.
    assert_eq!(
        count("threadbox_boot_failures_total{reason=\"launch\"}"),
        0.0
    );
    assert_eq!(count("threadbox_freeze_timeouts_total"), 0.0);
    assert!(count("threadbox_tenant_memory_bytes{tenant=\"default\"}") > 0.0);
    assert!(
        count("threadbox_store_query_duration_seconds_count{query=\"get_sandbox\"}") >= 1.0,
        "{text}"
    );
    assert_eq!(count("threadbox_sandboxes{state=\"running\"}"), 1.0);

    match promtool() {
        Some(p) => {
            let mut child = Command::new(&p)
                .args(["check", "metrics"])
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("run promtool");
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .expect("feed promtool");
            let out = child.wait_with_output().expect("promtool");
            assert!(
                out.status.success(),
                "promtool check metrics refused the text:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        None => {
            assert!(
                std::env::var_os("CI").is_none(),
                "promtool is missing and CI is set: scripts/test.sh installs it"
            );
            eprintln!("promtool not found: the exposition text was not linted");
        }
    }
}
