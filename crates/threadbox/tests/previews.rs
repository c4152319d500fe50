//! Port previews end to end (issue 13, scope 5; ADR 0072), with a real daemon and real
//! sandboxes: an app bound to 127.0.0.1 *inside* the sandbox (`previews/echo_server.py`,
//! which answers with the path and headers it received) reached through the daemon's TCP
//! port in both URL forms; private previews by token → cookie; a cookie of one port or
//! sandbox opening no other; WebSocket upgrade; none of our credentials reaching the app;
//! a paused sandbox resumed by a request; a deleted one answering like an unknown one.

mod common;

use common::{require_root, serial, Daemon};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

const APP: &str = include_str!("previews/echo_server.py");
const DEADLINE: Duration = Duration::from_secs(30);

/// One HTTP/1.1 answer, read to the end (`Connection: close`).
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.head, self.body))
    }
}

/// Sends `GET target` with `Host: host` and `headers` to the daemon's TCP port.
fn get(d: &Daemon, host: &str, target: &str, headers: &[(&str, &str)]) -> Answer {
    let mut s = TcpStream::connect(("127.0.0.1", d.port)).expect("connect to the daemon");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let mut req = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
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
    Answer {
        status,
        head: head.to_string(),
        body: body.to_string(),
    }
}

fn host(d: &Daemon, sb: &str, port: u16) -> String {
    format!("{port}-{sb}.localhost:{}", d.port)
}

/// Every header name and value the app saw, lowercase names.
fn seen_headers(a: &Answer) -> Vec<(String, String)> {
    a.json()["headers"]
        .as_array()
        .expect("headers")
        .iter()
        .map(|h| {
            (
                h[0].as_str().unwrap_or("").to_string(),
                h[1].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Starts the echo app on 127.0.0.1:`port` inside `sb` and waits until it accepts.
fn start_app(d: &Daemon, sb: &str, port: u16) {
    d.cli_stdin(&["files", "write", sb, "/tmp/app.py"], Some(APP.as_bytes()))
        .ok();
    d.cli(&[
        "spawn",
        sb,
        "--",
        "python3",
        "/tmp/app.py",
        &port.to_string(),
    ])
    .ok();
    let probe = format!(
        "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1).close()"
    );
    d.wait_for("the app inside the sandbox", DEADLINE, || {
        d.cli(&["exec", sb, "--", "python3", "-c", &probe]).code == 0
    });
}

fn publish(d: &Daemon, sb: &str, port: u16, public: bool) -> serde_json::Value {
    let p = port.to_string();
    let mut args = vec!["preview", sb, &p, "--json"];
    if public {
        args.push("--public");
    }
    d.cli(&args).ok().json()
}

/// The cookie a 302 sets, as `tb_preview=VALUE`.
fn cookie_of(a: &Answer) -> String {
    let set = a
        .header("set-cookie")
        .unwrap_or_else(|| panic!("no Set-Cookie: {}", a.head));
    set.split(';').next().unwrap_or("").trim().to_string()
}

#[test]
fn previews_end_to_end() {
    if !require_root("previews_end_to_end") {
        return;
    }
    let _s = serial();
    let mut d = Daemon::start();
    let sb = d.create(&[]);
    let other = d.create(&[]);
    start_app(&d, &sb, 8000);
    start_app(&d, &sb, 8001);

    let a = publish(&d, &sb, 8000, false);
    let token = a["token"].as_str().expect("a private preview has a token");
    assert_eq!(
        a["url"],
        format!("http://8000-{sb}.localhost:{}/?tb_preview={token}", d.port)
    );
    assert_eq!(
        a["path_url"],
        format!(
            "http://127.0.0.1:{}/preview/{sb}/8000/?tb_preview={token}",
            d.port
        )
    );
    let b = publish(&d, &sb, 8001, false);
    let token_b = b["token"].as_str().expect("token").to_string();
    let o = publish(&d, &other, 8000, false);
    assert!(o["token"].is_string());
    let listed = d.cli(&["preview", &sb, "--list", "--json"]).ok().json();
    assert_eq!(listed["previews"].as_array().map(Vec::len), Some(2));
    assert!(
        !listed.to_string().contains(token),
        "a listing shows no token"
    );

    // ---- host form ----
    let h = host(&d, &sb, 8000);
    let r = get(&d, &h, "/", &[]);
    assert_eq!(
        r.status, 401,
        "a private preview without a token: {}",
        r.body
    );
    let r = get(&d, &h, "/", &[("Cookie", "tb_preview=forged")]);
    assert_eq!(r.status, 401);
    // The token is exchanged for a cookie and a redirect without it.
    let r = get(&d, &h, &format!("/page?x=1&tb_preview={token}"), &[]);
    assert_eq!(r.status, 302, "{}", r.head);
    assert_eq!(r.header("location").as_deref(), Some("/page?x=1"));
    let set = r.header("set-cookie").expect("Set-Cookie");
    assert!(set.contains("HttpOnly") && set.contains("Path=/;"), "{set}");
    let cookie = cookie_of(&r);
    assert!(!cookie.contains(token), "the cookie is not the token");
    // With the cookie, the app answers, and sees none of our credentials.
    let r = get(
        &d,
        &h,
        "/page?x=1",
        &[
            ("Cookie", &format!("app=1; {cookie}")),
            ("Authorization", "Bearer tbk_should_not_reach"),
            ("X-API-Key", "tbk_nor_this"),
            ("X-Threadbox-Tenant", "acme"),
        ],
    );
    assert_eq!(r.status, 200, "{} {}", r.head, r.body);
    assert_eq!(r.json()["port"], 8000);
    assert_eq!(r.json()["path"], "/page?x=1");
    let seen = seen_headers(&r);
    let value = |n: &str| seen.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(value("cookie").as_deref(), Some("app=1"), "{seen:?}");
    assert_eq!(value("host").as_deref(), Some("localhost:8000"));
    assert_eq!(value("x-forwarded-host"), Some(h.clone()));
    for banned in ["authorization", "x-api-key", "x-threadbox-tenant"] {
        assert_eq!(
            value(banned),
            None,
            "{banned} reached the sandbox: {seen:?}"
        );
    }
    let cookie_value = cookie.trim_start_matches("tb_preview=");
    assert!(
        !r.body.contains(cookie_value) && !r.body.contains(token),
        "our cookie or token reached the sandbox: {}",
        r.body
    );
    // A program may send the token in a header instead; that header is stripped too.
    let r = get(&d, &h, "/", &[("X-Threadbox-Preview-Token", token)]);
    assert_eq!(r.status, 200);
    assert!(!r.body.contains(token), "{}", r.body);
    // A preview host's /v1 is the app's, never the API's.
    let r = get(&d, &h, "/v1/sandboxes", &[("Cookie", &cookie)]);
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["path"], "/v1/sandboxes");

    // The cookie and token of port 8000 open neither port 8001 nor another sandbox.
    let r = get(&d, &host(&d, &sb, 8001), "/", &[("Cookie", &cookie)]);
    assert_eq!(r.status, 401, "port A's cookie opened port B");
    let r = get(
        &d,
        &host(&d, &sb, 8001),
        &format!("/?tb_preview={token}"),
        &[],
    );
    assert_eq!(r.status, 401, "port A's token opened port B");
    let r = get(&d, &host(&d, &other, 8000), "/", &[("Cookie", &cookie)]);
    assert_eq!(r.status, 401, "a cookie opened another sandbox");
    // Positive control: port B's own token opens it.
    let r = get(
        &d,
        &host(&d, &sb, 8001),
        "/",
        &[("X-Threadbox-Preview-Token", &token_b)],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["port"], 8001);

    // A port without a preview and an unknown sandbox answer the same 404.
    let unpublished = get(&d, &host(&d, &sb, 8002), "/", &[("Cookie", &cookie)]);
    let unknown = get(
        &d,
        &host(&d, "sb-0123456789abcdef0123456789abcdef", 8000),
        "/",
        &[],
    );
    assert_eq!(unpublished.status, 404);
    assert_eq!((unknown.status, &unknown.body), (404, &unpublished.body));

    // ---- path form ----
    let api_host = format!("127.0.0.1:{}", d.port);
    let prefix = format!("/preview/{sb}/8000");
    let r = get(&d, &api_host, &format!("{prefix}/"), &[]);
    assert_eq!(r.status, 401);
    let r = get(
        &d,
        &api_host,
        &format!("{prefix}/a/b?tb_preview={token}"),
        &[],
    );
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some(format!("{prefix}/a/b")));
    let set = r.header("set-cookie").expect("Set-Cookie");
    assert!(set.contains(&format!("Path={prefix}/;")), "{set}");
    let path_cookie = cookie_of(&r);
    let r = get(
        &d,
        &api_host,
        &format!("{prefix}/a/b?q=2"),
        &[("Cookie", &path_cookie)],
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["path"],
        "/a/b?q=2",
        "the prefix is ours, not the app's"
    );
    let seen = seen_headers(&r);
    assert!(
        seen.iter()
            .any(|(k, v)| k == "x-forwarded-prefix" && *v == prefix),
        "{seen:?}"
    );
    // Without the slash: sent to it, so relative links stay inside the prefix.
    let r = get(&d, &api_host, &prefix, &[]);
    assert_eq!(
        (r.status, r.header("location")),
        (302, Some(format!("{prefix}/")))
    );
    // A page of another preview on the same origin cannot use this preview's cookie...
    let other_page = format!("http://{api_host}/preview/{sb}/8001/");
    let r = get(
        &d,
        &api_host,
        &format!("{prefix}/"),
        &[
            ("Cookie", &path_cookie),
            ("Sec-Fetch-Site", "same-origin"),
            ("Referer", &other_page),
        ],
    );
    assert_eq!(
        r.status, 401,
        "another preview's page used this preview's cookie"
    );
    // ...its own pages can (positive control)...
    let own_page = format!("http://{api_host}{prefix}/index.html");
    let r = get(
        &d,
        &api_host,
        &format!("{prefix}/app.js"),
        &[
            ("Cookie", &path_cookie),
            ("Sec-Fetch-Site", "same-origin"),
            ("Referer", &own_page),
        ],
    );
    assert_eq!(r.status, 200);
    // ...and no page on the daemon's origin can call the API.
    let r = get(
        &d,
        &api_host,
        "/v1/sandboxes",
        &[("Sec-Fetch-Site", "same-origin")],
    );
    assert_eq!(r.status, 403, "{}", r.body);

    // ---- WebSocket through the private preview ----
    let mut s = TcpStream::connect(("127.0.0.1", d.port)).expect("connect");
    s.set_read_timeout(Some(DEADLINE)).expect("timeout");
    let upgrade = format!(
        "GET /ws HTTP/1.1\r\nHost: {h}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Cookie: {cookie}\r\n\r\n"
    );
    s.write_all(upgrade.as_bytes()).expect("send the upgrade");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = s.read(&mut byte).expect("read the 101");
        assert_eq!(n, 1, "closed before the end of the head: {head:?}");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s.write_all(b"ping-through-the-preview").expect("send");
    let mut echoed = [0u8; 24];
    s.read_exact(&mut echoed).expect("read the echo");
    assert_eq!(&echoed, b"ping-through-the-preview");
    drop(s);
    // Without credentials the upgrade is refused like any request.
    let r = get(
        &d,
        &h,
        "/ws",
        &[("Connection", "Upgrade"), ("Upgrade", "websocket")],
    );
    assert_eq!(r.status, 401);

    // ---- public: republishing replaces the token; no token needed ----
    let p = publish(&d, &sb, 8001, true);
    assert!(p.get("token").is_none(), "{p}");
    let r = get(&d, &host(&d, &sb, 8001), "/", &[]);
    assert_eq!(r.status, 200);

    // ---- a paused sandbox is resumed by a request ----
    d.cli(&["pause", &sb]).ok();
    let state = |id: &str| d.cli(&["info", "--json", id]).ok().json()["state"].clone();
    assert_eq!(state(&sb), "paused");
    let r = get(&d, &h, "/after-pause", &[("Cookie", &cookie)]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(state(&sb), "running");

    // ---- previews, tokens and cookies survive a daemon restart (the store) ----
    d.terminate();
    d.restart();
    let r = get(&d, &h, "/after-restart", &[("Cookie", &cookie)]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["path"], "/after-restart");

    // ---- unpublished, then deleted: the same 404 as an unknown sandbox ----
    d.cli(&["preview", &sb, "8000", "--delete"]).ok();
    let r = get(&d, &h, "/", &[("Cookie", &cookie)]);
    assert_eq!((r.status, &r.body), (404, &unknown.body));
    d.cli(&["rm", "--force", &sb]).ok();
    let r = get(&d, &host(&d, &sb, 8001), "/", &[]);
    assert_eq!(
        (r.status, &r.body),
        (404, &unknown.body),
        "a deleted sandbox's public preview"
    );
}
