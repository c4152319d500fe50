//! F9: a flood of requests with bad API keys must not write one fsynced audit row each
//! (they would contend with every state transition for SQLite's one writer). The real
//! daemon over TCP; the audit log read back through the CLI.

mod common;

use common::{require_root, serial, Daemon};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Requests sent in the flood. The bound on rows is what the daemon allows per minute,
/// far below this.
const FLOOD: usize = 300;
/// `auth.refused` rows a flood within one minute may write: the daemon's budget per
/// window (see `threadbox_core::audit::RefusalBudget`) and a summary row.
const MAX_ROWS: usize = 12;

/// One request with `key`; returns the HTTP status.
fn status_with_key(port: u16, path: &str, key: &str) -> u16 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the daemon");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("set a read timeout");
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Authorization: Bearer {key}\r\n\r\n"
    );
    s.write_all(req.as_bytes()).expect("send the request");
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp);
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP status in {text:?}"))
}

#[test]
fn a_flood_of_bad_keys_writes_a_bounded_number_of_audit_rows() {
    if !require_root("a_flood_of_bad_keys_writes_a_bounded_number_of_audit_rows") {
        return;
    }
    let _serial = serial();
    let d = Daemon::start();
    // The first refusal, on a path of its own so that its row can be told apart.
    assert_eq!(
        status_with_key(d.port, "/v1/sandboxes/first-probe", "tb_nope_first"),
        401
    );
    for i in 0..FLOOD {
        assert_eq!(
            status_with_key(d.port, "/v1/sandboxes", &format!("tb_nope_{i}")),
            401
        );
    }

    let export = d.cli(&["audit", "export"]).ok().stdout_str();
    let refused: Vec<Value> = export
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSONL"))
        .filter(|e| e["action"] == "auth.refused")
        .collect();
    assert!(
        refused
            .first()
            .is_some_and(|e| e["target"] == "GET /v1/sandboxes/first-probe"),
        "the first refusal is recorded: {refused:?}"
    );
    assert!(
        refused.len() <= MAX_ROWS,
        "{} refusal rows for {} refused requests",
        refused.len(),
        FLOOD + 1
    );
    let v = d.cli(&["audit", "verify", "--json"]).ok().json();
    assert_eq!(v["ok"], true, "{v}");
    d.cli(&["audit", "verify"]).ok();
}
