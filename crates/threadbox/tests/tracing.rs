//! Traces across the boundary (issue 17, ADR 0090), with a real daemon and a local OTLP/HTTP
//! collector the test starts (a tiny HTTP server that records what it receives):
//! a request carrying `traceparent` yields a SERVER span with that trace id and parent, the
//! operation's span is its child, the sandboxed process gets `TRACEPARENT` naming the
//! operation's span, and no environment value reaches the collector. Without an endpoint
//! nothing is traced and nothing reaches the sandbox. Every wait polls with a deadline.

mod common;

use common::{require_root, serial, Daemon};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
const SECRET: &str = "s3cr3t-env-value-never-exported";

/// Bodies the collector received on `/v1/traces`.
type Received = Arc<Mutex<Vec<Vec<u8>>>>;

/// Starts the collector on a free loopback port; answers every request `200 {}`.
fn collector() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind collector");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let got: Received = Arc::default();
    let sink = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let sink = sink.clone();
            std::thread::spawn(move || serve_one(conn, &sink));
        }
    });
    (url, got)
}

fn serve_one(conn: std::net::TcpStream, sink: &Received) {
    let mut w = match conn.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        if path == "/v1/traces" {
            sink.lock().unwrap().push(body);
        }
        let resp =
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if w.write_all(resp.as_bytes()).is_err() {
            return;
        }
    }
}

/// Every span the collector got, flattened out of the OTLP/JSON envelopes.
fn spans(got: &Received) -> Vec<Value> {
    let bodies = got.lock().unwrap().clone();
    let mut out = vec![];
    for b in bodies {
        let v: Value = serde_json::from_slice(&b).expect("OTLP/JSON body");
        for rs in v["resourceSpans"].as_array().into_iter().flatten() {
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                out.extend(ss["spans"].as_array().into_iter().flatten().cloned());
            }
        }
    }
    out
}

fn attr(span: &Value, key: &str) -> Option<Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| a["value"].clone())
}

/// One HTTP/1.1 request over the operator's socket: (status, headers, body).
fn request(
    d: &Daemon,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, Value) {
    let mut s = UnixStream::connect(d.root_path().join("threadbox.sock")).expect("socket");
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).expect("write");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    let (head, body) = resp.split_once("\r\n\r\n").expect("a response head");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status");
    (
        status,
        head.to_ascii_lowercase(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

fn exec_printenv(d: &Daemon, sb: &str, headers: &[(&str, &str)]) -> (String, Value) {
    let body = serde_json::json!({
        "command": ["printenv", "TRACEPARENT"],
        "env": {"SOME_SECRET": SECRET},
    })
    .to_string();
    let (status, head, v) = request(
        d,
        "POST",
        &format!("/v1/sandboxes/{sb}/exec"),
        headers,
        &body,
    );
    assert_eq!(status, 200, "exec: {v}");
    (head, v)
}

#[test]
fn a_traceparent_continues_through_the_daemon_into_the_sandbox() {
    if !require_root("a_traceparent_continues_through_the_daemon_into_the_sandbox") {
        return;
    }
    let _g = serial();
    let (url, got) = collector();
    let d = Daemon::start_with_env(
        &["--otlp-endpoint", &url],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let sb = d.create(&[]);
    let tp = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let (head, v) = exec_printenv(&d, &sb, &[("traceparent", &tp)]);

    // The process's TRACEPARENT: our trace, a new parent (the operation's span), sampled.
    let carried = v["stdout"].as_str().expect("stdout").trim().to_string();
    let parts: Vec<&str> = carried.split('-').collect();
    assert_eq!(parts.len(), 4, "TRACEPARENT in the sandbox: {carried:?}");
    assert_eq!(
        parts[1], TRACE_ID,
        "the sandbox continues the caller's trace"
    );
    assert_ne!(
        parts[2], PARENT_ID,
        "the process's parent is the daemon's span"
    );
    assert!(
        head.contains(&format!("x-threadbox-trace-id: {TRACE_ID}")),
        "{head}"
    );

    let exec_span_id = parts[2].to_string();
    let mut found = None;
    d.wait_for(
        "the exec spans at the collector",
        Duration::from_secs(30),
        || {
            let all = spans(&got);
            let http = all.iter().find(|s| {
                s["traceId"] == TRACE_ID && s["name"] == "POST /v1/sandboxes/{sandbox}/exec"
            });
            let op = all.iter().find(|s| s["spanId"] == exec_span_id.as_str());
            if let (Some(h), Some(o)) = (http, op) {
                found = Some((h.clone(), o.clone()));
                true
            } else {
                false
            }
        },
    );
    let (http, op) = found.expect("spans");
    assert_eq!(
        http["parentSpanId"], PARENT_ID,
        "the HTTP span's parent is the caller's"
    );
    assert_eq!(op["traceId"], TRACE_ID);
    assert_eq!(op["name"], "sandbox.exec");
    assert_eq!(
        op["parentSpanId"], http["spanId"],
        "the operation is a child of the request"
    );
    let sid = attr(&op, "threadbox.sandbox.id").expect("sandbox id attribute");
    assert_eq!(sid["stringValue"], sb.as_str());
    let code = attr(&op, "process.exit.code").expect("exit code attribute");
    assert!(code["intValue"] == 0 || code["intValue"] == "0", "{code}");
    assert_eq!(
        attr(&op, "gen_ai.operation.name").expect("genai op")["stringValue"],
        "execute_tool"
    );

    // Never an environment value, whatever span it would be on.
    for b in got.lock().unwrap().iter() {
        let text = String::from_utf8_lossy(b);
        assert!(!text.contains(SECRET), "an env value was exported");
    }
}

#[test]
fn without_an_endpoint_nothing_is_traced_or_carried() {
    if !require_root("without_an_endpoint_nothing_is_traced_or_carried") {
        return;
    }
    let _g = serial();
    let d = Daemon::start();
    let sb = d.create(&[]);
    let tp = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let (head, v) = exec_printenv(&d, &sb, &[("traceparent", &tp)]);
    // printenv exits 1 when the variable is unset.
    assert_eq!(v["exit_code"], 1, "{v}");
    assert_eq!(v["stdout"], "", "{v}");
    assert!(!head.contains("x-threadbox-trace-id"), "{head}");
    // No collector, no in-sandbox endpoint: refused with the reason, nothing created.
    let r = d.cli(&["create", "--name", "relayed", "--otlp-relay"]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("--otlp-endpoint"), "{}", r.stderr);
    assert!(
        d.cli(&["info", "relayed"]).code != 0,
        "a refused create left a sandbox"
    );
}

/// A program in the sandbox that exports one span with the OTLP/JSON wire format by hand
/// (the host image has no OpenTelemetry SDK): to `$OTEL_EXPORTER_OTLP_ENDPOINT/v1/traces`,
/// as the child of the span `TRACEPARENT` names. Prints the HTTP status, or `refused`.
const EXPORT_ONE_SPAN: &str = r#"
import json, os, time, urllib.request, urllib.error
tp = os.environ.get("TRACEPARENT", "00-" + "0" * 32 + "-" + "0" * 16 + "-01").split("-")
base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
now = time.time_ns()
span = {"traceId": tp[1], "spanId": os.urandom(8).hex(), "parentSpanId": tp[2],
        "name": "inside-the-sandbox", "kind": 1,
        "startTimeUnixNano": str(now - 1000), "endTimeUnixNano": str(now)}
body = {"resourceSpans": [{"resource": {"attributes": []},
        "scopeSpans": [{"scope": {"name": "sandboxed"}, "spans": [span]}]}]}
req = urllib.request.Request(base + "/v1/traces", data=json.dumps(body).encode(),
                             headers={"Content-Type": "application/json"}, method="POST")
try:
    print(urllib.request.urlopen(req, timeout=10).status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError:
    print("refused")
"#;

fn exec_export(d: &Daemon, sb: &str, tp: &str) -> String {
    let body = serde_json::json!({"command": ["python3", "-c", EXPORT_ONE_SPAN]}).to_string();
    let (status, _, v) = request(
        d,
        "POST",
        &format!("/v1/sandboxes/{sb}/exec"),
        &[("traceparent", tp)],
        &body,
    );
    assert_eq!(status, 200, "exec: {v}");
    v["stdout"].as_str().unwrap_or("").trim().to_string()
}

#[test]
fn spans_a_sandboxed_program_exports_reach_the_collector_through_the_daemon() {
    if !require_root("spans_a_sandboxed_program_exports_reach_the_collector") {
        return;
    }
    let _g = serial();
    let (url, got) = collector();
    let mut d = Daemon::start_with_env(
        &["--otlp-endpoint", &url],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let relayed = d.create(&["--otlp-relay"]);
    let info = d.cli(&["info", "--json", &relayed]).ok().json();
    assert_eq!(info["otlp_relay"], true, "{info}");
    let tp = format!("00-{TRACE_ID}-{PARENT_ID}-01");
    let (_, v) = exec_printenv(&d, &relayed, &[("traceparent", &tp)]);
    let exec_span = v["stdout"]
        .as_str()
        .expect("stdout")
        .trim()
        .split('-')
        .nth(2)
        .map(String::from);

    // Positive control first: a sandbox without the relay has no endpoint inside.
    let closed = d.create(&[]);
    assert_eq!(exec_export(&d, &closed, &tp), "refused");

    for round in ["before", "after a daemon restart"] {
        assert_eq!(exec_export(&d, &relayed, &tp), "200", "{round}");
        d.wait_for(
            "the sandboxed program's span at the collector",
            Duration::from_secs(30),
            || {
                // The daemon exports the exec's span when the exec ends, after the
                // program's own: wait for both.
                let all = spans(&got);
                all.iter().any(|s| {
                    s["name"] == "inside-the-sandbox"
                        && s["traceId"] == TRACE_ID
                        && all.iter().any(|p| p["spanId"] == s["parentSpanId"])
                })
            },
        );
        let all = spans(&got);
        let inside = all
            .iter()
            .find(|s| s["name"] == "inside-the-sandbox")
            .expect("the span");
        // Its parent is an exec operation's span of the daemon, in the same trace.
        let parent = all
            .iter()
            .find(|s| s["spanId"] == inside["parentSpanId"])
            .unwrap_or_else(|| panic!("the parent of {inside} was not exported"));
        assert_eq!(parent["name"], "sandbox.exec", "{round}");
        assert_eq!(parent["traceId"], TRACE_ID);
        assert!(exec_span.is_some());
        got.lock().unwrap().clear();
        // Killed, not stopped: the sandbox keeps running and the next daemon adopts it,
        // opening the endpoint again in the same netns.
        d.kill9();
        d.restart();
    }
    // Only /v1/traces is relayed.
    let other = EXPORT_ONE_SPAN.replace("/v1/traces", "/v1/metrics");
    let body = serde_json::json!({"command": ["python3", "-c", other]}).to_string();
    let (_, _, v) = request(
        &d,
        "POST",
        &format!("/v1/sandboxes/{relayed}/exec"),
        &[],
        &body,
    );
    assert_eq!(v["stdout"].as_str().unwrap_or("").trim(), "404", "{v}");
}

/// The spans named `name` the collector got, waiting (with a deadline) until `want` holds.
fn wait_spans(got: &Received, what: &str, want: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let all = spans(got);
        if want(&all) {
            return all;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}; spans: {:?}",
            all.iter().map(|s| s["name"].clone()).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn str_attr(span: &Value, key: &str) -> Option<String> {
    attr(span, key).and_then(|v| v["stringValue"].as_str().map(String::from))
}

#[test]
fn egress_decisions_are_spans_with_what_the_log_says() {
    if !require_root("egress_decisions_are_spans_with_what_the_log_says") {
        return;
    }
    let _g = serial();
    let (url, got) = collector();
    let up = common::upstream::Upstream::start();
    let hosts = up.hosts_file();
    let private = format!("{}.0/30", up.net);
    let dns = format!("{}:53", up.addr());
    let d = Daemon::start_with_env(
        &[
            "--otlp-endpoint",
            &url,
            "--egress-hosts",
            hosts.to_str().expect("utf-8 path"),
            "--egress-dns",
            &dns,
            "--egress-allow-private",
            &private,
        ],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let sb = d.create(&["--allow", "api.test:8080"]);
    let run = |script: &str| {
        d.cli(&["exec", &sb, "--", "sh", "-c", script]);
    };
    // One allowed connection (by name), one denied by the default (another port).
    run("curl -sS --max-time 10 http://api.test:8080/traced >/dev/null");
    run("curl -sS --max-time 5 http://api.test:9000/ >/dev/null 2>&1; true");
    let all = wait_spans(&got, "an allowed and a denied egress span", |all| {
        let conns: Vec<_> = all
            .iter()
            .filter(|s| s["name"] == "egress.connection")
            .collect();
        conns
            .iter()
            .any(|s| str_attr(s, "threadbox.egress.decision").as_deref() == Some("allow"))
            && conns
                .iter()
                .any(|s| str_attr(s, "threadbox.egress.decision").as_deref() == Some("deny"))
    });
    let allowed = all
        .iter()
        .find(|s| {
            s["name"] == "egress.connection"
                && str_attr(s, "threadbox.egress.decision").as_deref() == Some("allow")
        })
        .expect("allowed span");
    assert_eq!(
        str_attr(allowed, "threadbox.sandbox.id").as_deref(),
        Some(sb.as_str())
    );
    assert_eq!(
        str_attr(allowed, "server.address").as_deref(),
        Some("api.test")
    );
    assert_eq!(
        attr(allowed, "server.port").and_then(|v| v["intValue"].as_str().map(String::from)),
        Some("8080".into())
    );
    assert!(
        str_attr(allowed, "threadbox.egress.reason").is_some(),
        "{allowed}"
    );
    let denied = all
        .iter()
        .find(|s| {
            s["name"] == "egress.connection"
                && str_attr(s, "threadbox.egress.decision").as_deref() == Some("deny")
        })
        .expect("denied span");
    assert_eq!(
        attr(denied, "server.port").and_then(|v| v["intValue"].as_str().map(String::from)),
        Some("9000".into())
    );
    // DNS answers are spans too (the allowed name was asked of the daemon's resolver).
    assert!(
        all.iter().any(|s| s["name"] == "egress.dns"),
        "no egress.dns span"
    );
    // The request path never reaches a span.
    let text = serde_json::to_string(&all).expect("json");
    assert!(!text.contains("/traced"), "a request path reached a span");
}
