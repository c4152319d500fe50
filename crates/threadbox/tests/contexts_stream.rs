//! Streamed executions through the real daemon (issue 15): `execute/stream` sends the
//! events as the cell runs, a client that goes away interrupts its cell (and the state
//! stays), and `GET .../executions/{id}` re-attaches: after a lost client, and after a
//! daemon restart in the middle of a cell, which goes on. A context whose worker the
//! OOM killer took is reported dead with reason `oom`, and its neighbours answer.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// An HTTP/1.1 response read as it arrives: the status, then the NDJSON lines of its
/// chunked body one by one.
struct Lines {
    status: u16,
    rd: BufReader<UnixStream>,
    chunk_left: usize,
    buf: Vec<u8>,
    done: bool,
}

fn request(d: &Daemon, method: &str, target: &str, body: Option<&Value>) -> Lines {
    let mut s = UnixStream::connect(d.root_path().join("threadbox.sock")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let mut rd = BufReader::new(s);
    let mut head = String::new();
    let mut chunked = false;
    loop {
        let mut l = String::new();
        rd.read_line(&mut l).expect("read the head");
        if l == "\r\n" || l.is_empty() {
            break;
        }
        if l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
        {
            chunked = true;
        }
        head.push_str(&l);
    }
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {head:?}"));
    let mut lines = Lines {
        status,
        rd,
        chunk_left: 0,
        buf: Vec::new(),
        done: false,
    };
    if !chunked {
        // An error answer: the whole body is one JSON document.
        let _ = lines.rd.read_to_end(&mut lines.buf);
        lines.done = true;
    }
    lines
}

impl Lines {
    /// The next NDJSON line (keepalives skipped), or None at the end of the body.
    fn next_line(&mut self) -> Option<Value> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                let v: Value = serde_json::from_slice(&line).expect("an NDJSON line");
                if v["type"] != "keepalive" {
                    return Some(v);
                }
                continue;
            }
            if self.done {
                return None;
            }
            if self.chunk_left == 0 {
                let mut size = String::new();
                self.rd.read_line(&mut size).expect("chunk size");
                let n = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
                if n == 0 {
                    self.done = true;
                    continue;
                }
                self.chunk_left = n;
            }
            let mut data = vec![0u8; self.chunk_left];
            self.rd.read_exact(&mut data).expect("chunk data");
            self.chunk_left = 0;
            let mut crlf = [0u8; 2];
            self.rd.read_exact(&mut crlf).expect("chunk end");
            self.buf.extend_from_slice(&data);
        }
    }

    /// Every line to the end.
    fn rest(&mut self) -> Vec<Value> {
        std::iter::from_fn(|| self.next_line()).collect()
    }

    /// Lines up to the first that `stop` accepts (included).
    fn until(&mut self, mut stop: impl FnMut(&Value) -> bool) -> Vec<Value> {
        let mut got = Vec::new();
        while let Some(v) = self.next_line() {
            let last = stop(&v);
            got.push(v);
            if last {
                return got;
            }
        }
        panic!("the stream ended before the expected event: {got:?}");
    }

    /// Lines up to the point where the stdout read so far contains `text`.
    fn until_stdout(&mut self, text: &str) -> Vec<Value> {
        let mut out = String::new();
        self.until(|e| {
            if e["type"] == "stdout" {
                out.push_str(e["text"].as_str().unwrap_or(""));
            }
            out.contains(text)
        })
    }

    /// The body of a plain (not streamed) answer as JSON.
    fn error_body(&self) -> Value {
        serde_json::from_slice(&self.buf).expect("a JSON error body")
    }
}

fn stream(d: &Daemon, sb: &str, ctx: &str, code: &str) -> Lines {
    request(
        d,
        "POST",
        &format!("/v1/sandboxes/{sb}/contexts/{ctx}/execute/stream"),
        Some(&json!({ "code": code, "timeout_secs": 120 })),
    )
}

fn attach(d: &Daemon, sb: &str, ctx: &str, id: &str) -> Lines {
    request(
        d,
        "GET",
        &format!("/v1/sandboxes/{sb}/contexts/{ctx}/executions/{id}"),
        None,
    )
}

fn stdout_of(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "stdout")
        .filter_map(|e| e["text"].as_str())
        .collect()
}

fn run_code(d: &Daemon, sb: &str, ctx: &str, code: &str) -> Value {
    d.cli(&["run-code", "--json", "--context", ctx, sb, code])
        .ok()
        .json()
}

fn result_text(d: &Daemon, sb: &str, code: &str) -> Option<String> {
    let v = d.cli(&["run-code", "--json", sb, code]).ok().json();
    v["result"]["data"]["text/plain"].as_str().map(String::from)
}

#[test]
fn stream_sends_events_in_order_and_characters_whole() {
    if !require_root("stream_sends_events_in_order_and_characters_whole") {
        return;
    }
    let d = Daemon::start();
    let sb = d.create(&[]);
    // Python-level output, then fd-level output of a subprocess that writes a
    // two-byte character one byte at a time, then a display and the result.
    let code = r#"
import os, subprocess, sys, time
print("one", flush=True)
subprocess.run([sys.executable, "-c",
    "import os, time\nos.write(1, b'a\\xc3')\ntime.sleep(0.3)\nos.write(1, b'\\xa9b\\n')"])
class H:
    def _repr_html_(self): return "<b>h</b>"
display(H())
6 * 7
"#;
    let mut s = stream(&d, &sb, "python", code);
    assert_eq!(s.status, 200, "{:?}", s.error_body());
    let events = s.rest();
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types.first(), Some(&"start"), "{events:?}");
    assert_eq!(types.last(), Some(&"end"), "{events:?}");
    let pos = |t: &str| types.iter().position(|x| *x == t);
    assert!(pos("stdout") < pos("display"), "{types:?}");
    assert!(pos("display") < pos("result"), "{types:?}");
    assert_eq!(stdout_of(&events), "one\naéb\n", "{events:?}");
    let end = events.last().unwrap();
    assert_eq!(end["status"], "ok", "{end}");
    assert_eq!(end["execution_count"], 1);
    assert_eq!(end["context_created"], true);
    let start = &events[0];
    assert_eq!(start["execution_id"], end["execution_id"]);
    let result = events.iter().find(|e| e["type"] == "result").unwrap();
    assert_eq!(result["data"]["text/plain"], "42");

    // The execution is kept: a GET replays it whole.
    let id = start["execution_id"].as_str().unwrap();
    let replay = attach(&d, &sb, "python", id).rest();
    assert_eq!(replay, events);

    // A second cell while one runs is refused before any stream starts.
    let mut busy = stream(&d, &sb, "python", "import time\ntime.sleep(60)");
    busy.until(|e| e["type"] == "start");
    let refused = stream(&d, &sb, "python", "1");
    assert_eq!(refused.status, 409, "{:?}", refused.error_body());
    let msg = refused.error_body()["error"]["message"].to_string();
    assert!(msg.contains("context_busy"), "{msg}");
    // Unknown executions are 404.
    let lost = attach(&d, &sb, "python", "exe-0-999");
    assert_eq!(lost.status, 404);
}

#[test]
fn a_client_that_goes_away_interrupts_its_cell_and_the_state_stays() {
    if !require_root("a_client_that_goes_away_interrupts_its_cell_and_the_state_stays") {
        return;
    }
    let d = Daemon::start();
    let sb = d.create(&[]);
    d.cli(&["run-code", &sb, "x = 41"]).ok();
    let mut s = stream(
        &d,
        &sb,
        "python",
        "print('looping', flush=True)\nwhile True:\n    pass",
    );
    let got = s.until_stdout("looping\n");
    let id = got[0]["execution_id"].as_str().unwrap().to_string();
    drop(s);
    // Following it again shows what was kept, then its end: interrupted.
    let events = attach(&d, &sb, "python", &id).rest();
    assert_eq!(events[0]["type"], "start", "{events:?}");
    assert_eq!(stdout_of(&events), "looping\n");
    let end = events.last().unwrap();
    assert_eq!(end["type"], "end", "{events:?}");
    assert_eq!(end["status"], "interrupted", "{end}");
    assert_eq!(end["context_restarted"], false, "{end}");
    assert_eq!(result_text(&d, &sb, "x + 1").as_deref(), Some("42"));
}

#[test]
fn a_cell_goes_on_through_a_daemon_restart_and_is_reattached() {
    if !require_root("a_cell_goes_on_through_a_daemon_restart_and_is_reattached") {
        return;
    }
    let mut d = Daemon::start();
    let sb = d.create(&[]);
    // The cell waits for a file the test makes after the restart.
    let code = r#"
import os, time
print("before", flush=True)
while not os.path.exists("/tmp/go"):
    time.sleep(0.02)
print("after", flush=True)
y = 5
y * 2
"#;
    let mut s = stream(&d, &sb, "python", code);
    let got = s.until_stdout("before\n");
    let id = got[0]["execution_id"].as_str().unwrap().to_string();
    d.kill9();
    drop(s);
    d.restart();

    let mut a = attach(&d, &sb, "python", &id);
    assert_eq!(a.status, 200, "{:?}", a.error_body());
    let replayed = a.until_stdout("before\n");
    assert_eq!(replayed[0]["type"], "start");
    assert_eq!(stdout_of(&replayed), "before\n");
    d.cli(&["exec", &sb, "--", "touch", "/tmp/go"]).ok();
    let rest = a.rest();
    assert_eq!(stdout_of(&rest), "after\n", "{rest:?}");
    let result = rest.iter().find(|e| e["type"] == "result").unwrap();
    assert_eq!(result["data"]["text/plain"], "10");
    let end = rest.last().unwrap();
    assert_eq!(end["status"], "ok", "{end}");
    assert_eq!(result_text(&d, &sb, "y").as_deref(), Some("5"));
}

#[test]
fn a_cell_past_the_memory_limit_loses_its_context_and_the_neighbours_answer() {
    if !require_root("a_cell_past_the_memory_limit_loses_its_context_and_the_neighbours_answer") {
        return;
    }
    let d = Daemon::start();
    let sb = d.create(&["--memory", "256M"]);
    let other = d.create(&[]);
    d.cli(&["run-code", &sb, "kept = 1"]).ok();
    // A second context in the same sandbox, with its own state.
    let url = format!("/v1/sandboxes/{sb}/contexts");
    let made = request(&d, "POST", &url, Some(&json!({"name": "hog"})));
    assert_eq!(made.status, 201);
    let made = made.error_body();
    assert_eq!(made["name"], "hog", "{made}");
    // Zero-filling 1 GiB touches every page: the OOM killer takes the worker.
    let v = run_code(&d, &sb, "hog", "b = bytearray(1 << 30)");
    assert_eq!(v["status"], "context_died", "{v}");
    assert_eq!(v["reason"], "oom", "{v}");
    let hog = request(&d, "GET", &format!("{url}/hog"), None).error_body();
    assert_eq!(hog["state"], "lost", "{hog}");
    assert_eq!(hog["reason"], "oom", "{hog}");
    // The neighbour context keeps its variables; the other sandbox answers.
    assert_eq!(result_text(&d, &sb, "kept + 1").as_deref(), Some("2"));
    assert_eq!(result_text(&d, &other, "1 + 1").as_deref(), Some("2"));
    // The next execution in the lost context starts a new worker and says so.
    let v = run_code(&d, &sb, "hog", "'b' in globals()");
    assert_eq!(v["context_created"], true, "{v}");
    assert_eq!(v["result"]["data"]["text/plain"], "False", "{v}");
}

#[test]
fn contexts_of_a_stopped_sandbox_are_lost_with_a_reason_and_recreated_by_name() {
    if !require_root("contexts_of_a_stopped_sandbox_are_lost_with_a_reason_and_recreated_by_name") {
        return;
    }
    let mut d = Daemon::start();
    let sb = d.create(&[]);
    d.cli(&["run", &sb, "-c", "x = 1"]).ok();
    let url = format!("/v1/sandboxes/{sb}/contexts");
    let js = json!({"name": "js", "language": "javascript"});
    assert_eq!(request(&d, "POST", &url, Some(&js)).status, 201);
    let states = |d: &Daemon| -> Vec<(String, String, String)> {
        let list = request(d, "GET", &url, None).error_body();
        let mut v: Vec<_> = list["contexts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap_or("").to_string(),
                    c["state"].as_str().unwrap_or("").to_string(),
                    c["reason"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        v.sort();
        v
    };
    // The control: while the agent has them, they are idle.
    let idle = |n: &str| (n.to_string(), "idle".to_string(), String::new());
    assert_eq!(states(&d), vec![idle("js"), idle("python")]);

    d.cli(&["stop", &sb]).ok();
    d.cli(&["start", &sb]).ok();
    let lost = |n: &str| (n.to_string(), "lost".to_string(), "stopped".to_string());
    assert_eq!(states(&d), vec![lost("js"), lost("python")]);
    // The store keeps them through a daemon restart.
    d.kill9();
    d.restart();
    assert_eq!(states(&d), vec![lost("js"), lost("python")]);

    // A get-or-create of the name makes it again and says so.
    let again = request(&d, "POST", &url, Some(&js));
    assert_eq!(again.status, 201);
    let again = again.error_body();
    assert_eq!(again["recreated"], true, "{again}");
    assert_eq!(again["lost_reason"], "stopped", "{again}");
    assert_eq!(again["state"], "idle", "{again}");
    // So does the execute that makes `python` again; its variables are gone.
    let v = d.cli(&["run", "--json", &sb, "-c", "x"]).ok().json();
    assert_eq!(v["context_recreated"], true, "{v}");
    assert_eq!(v["lost_reason"], "stopped", "{v}");
    assert_eq!(v["exception"]["name"], "NameError", "{v}");
    let v = d.cli(&["run", "--json", &sb, "-c", "x = 2"]).ok().json();
    assert_eq!(v["context_recreated"], false, "{v}");
    assert_eq!(states(&d), vec![idle("js"), idle("python")]);
    // A context deleted on purpose is not lost: it is gone.
    assert_eq!(
        request(&d, "DELETE", &format!("{url}/js"), None).status,
        204
    );
    assert_eq!(states(&d), vec![idle("python")]);
}
