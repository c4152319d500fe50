//! Egress on the gvisor tier (issue 16 scope 1, ADR 0140) beyond the policy tests that run
//! on every tier (`network.rs`, security class N): secrets swapped through the image's own
//! CA bundle, a preview of a server bound to the sandbox's loopback, and the boundary of
//! the design — a gvisor sandbox created without a policy has runsc's loopback-only
//! netstack, so a policy or a preview on it is refused with a sentence, changing nothing.

mod common;

use common::upstream::{daemon_with, Upstream, DEADLINE};
use common::{require_root, serial, tiers, Daemon};
use std::io::{Read, Write};
use std::net::TcpStream;

const VALUE: &str = "sk-gvisor-7f3a9c1e5b";

fn sh(d: &Daemon, sb: &str, script: &str) -> (i32, String) {
    let r = d.cli(&["exec", sb, "--", "bash", "-c", script]);
    (r.code, format!("{}{}", r.stdout_str(), r.stderr))
}

/// `GET target` from the daemon's TCP port; the status and the body.
fn get(d: &Daemon, target: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", d.port)).expect("connect to the daemon");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let req = format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).expect("send");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the answer");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    (status, body.to_string())
}

#[test]
fn gvisor_secrets_previews_and_the_sandboxes_without_a_network() {
    if !require_root("gvisor_secrets_previews_and_the_sandboxes_without_a_network") {
        return;
    }
    if !tiers::under_test().iter().any(|t| t == "gvisor") {
        eprintln!("skipped: gvisor is not among THREADBOX_TEST_TIERS");
        return;
    }
    let _s = serial();
    let up = Upstream::start();
    let ca = up.ca_file();
    let d = daemon_with(
        &up,
        true,
        &["--egress-upstream-ca", ca.to_str().expect("utf-8 path")],
    );
    if !tiers::runs_on(
        "gvisor",
        &d.cli(&["tiers", "--json"]).ok().json(),
        &["egress"],
    ) {
        return;
    }
    d.cli_stdin(
        &[
            "secret",
            "set",
            "API_KEY",
            "--host",
            "api.test",
            "--format",
            "Bearer {}",
        ],
        Some(format!("{VALUE}\n").as_bytes()),
    )
    .ok();
    let sb = d.create(&[
        "--tier", "gvisor", "--allow", "api.test", "--secret", "API_KEY",
    ]);

    // Secrets: the placeholder goes out, the value arrives; curl trusts the daemon's leaf
    // through the image's own bundle (the bind), no variable naming our copy.
    let (code, ph) = sh(&d, &sb, "printf %s \"$API_KEY\"");
    assert!(
        code == 0 && ph.starts_with("tb_secret_"),
        "placeholder: {ph}"
    );
    let (code, out) = sh(
        &d,
        &sb,
        "env -u SSL_CERT_FILE -u CURL_CA_BUNDLE -u REQUESTS_CA_BUNDLE curl -sS --max-time 20 \
         -H \"Authorization: $API_KEY\" https://api.test/gvisor-bearer",
    );
    assert_eq!(code, 0, "curl failed: {out}");
    assert_eq!(out, "hello over tls\n");
    let log = up.log("https.log");
    let seen = log
        .split("\n\n")
        .find(|r| r.lines().next() == Some("/gvisor-bearer"))
        .unwrap_or_else(|| panic!("the upstream never got /gvisor-bearer: {log}"));
    assert!(
        seen.contains(&format!("Authorization: Bearer {VALUE}")),
        "{seen}"
    );

    // A preview of a server bound to the sandbox's own loopback answers through the daemon.
    d.cli(&[
        "spawn",
        &sb,
        "--",
        "bash",
        "-c",
        "mkdir -p /tmp/www && echo preview-from-gvisor > /tmp/www/index.html && \
         cd /tmp/www && exec python3 -m http.server 8000 --bind 127.0.0.1",
    ])
    .ok();
    let probe = "import socket; socket.create_connection(('127.0.0.1', 8000), timeout=1).close()";
    d.wait_for("the server inside", DEADLINE, || {
        d.cli(&["exec", &sb, "--", "python3", "-c", probe]).code == 0
    });
    let p = d
        .cli(&["preview", &sb, "8000", "--public", "--json"])
        .ok()
        .json();
    assert!(p["path_url"].is_string(), "{p}");
    let (status, body) = get(&d, &format!("/preview/{sb}/8000/"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, "preview-from-gvisor\n");

    // Without a policy: runsc's own loopback. A preview and a live policy are refused with
    // a sentence, and nothing is stored.
    let closed = d.create(&["--tier", "gvisor"]);
    let r = d.cli(&["preview", &closed, "8000", "--public"]);
    assert_ne!(
        r.code, 0,
        "a preview of a sandbox without a netns was taken"
    );
    assert!(r.stderr.contains("publish a preview"), "{}", r.stderr);
    let r = d.cli(&["net", "set", &closed, "--allow", "api.test"]);
    assert_ne!(r.code, 0, "a policy was taken by a sandbox without a netns");
    assert!(
        r.stderr.contains("set a policy while it is stopped"),
        "{}",
        r.stderr
    );
    let info = d.cli(&["info", "--json", &closed]).ok().json();
    assert_eq!(info["network_generation"], 0, "{info}");
    // Positive control: stopped, the same policy is taken and the next boot has the netns.
    d.cli(&["stop", &closed]).ok();
    d.cli(&["net", "set", &closed, "--allow", "api.test:8080"])
        .ok();
    d.cli(&["start", &closed]).ok();
    let (code, out) = sh(
        &d,
        &closed,
        "curl -sS --max-time 10 http://api.test:8080/after-start",
    );
    assert_eq!(code, 0, "curl failed after the start: {out}");
    assert!(up.log("http.log").contains("/after-start"));
}
