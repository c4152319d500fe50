//! Egress end to end (issue 13), with a real daemon and real sandboxes. Loopback upstreams
//! cannot work (a sandbox's 127/8 is its own), so the test makes its own netns
//! (`common/upstream.rs`) joined to the host by a veth pair (host `10.250.N.1/30`, netns
//! `10.250.N.2/30`) and runs there an HTTP server, a TCP sink that records every byte, and a
//! stub DNS resolver that records every name asked (`tests/network/upstream.py`). Verdicts
//! are judged by what reached those upstreams, never by a `connect()` that appeared to work.
//! The netns, the veth and the servers are removed on every path (a guard's `Drop`).

mod common;

use common::upstream::{daemon, Upstream, DEADLINE};
use common::{require_root, serial, tiers, wait_for, Daemon};

/// Runs `script` with bash in sandbox `sb`; its exit code and stdout.
fn sh(d: &Daemon, sb: &str, script: &str) -> (i32, String) {
    let r = d.cli(&["exec", sb, "--", "bash", "-c", script]);
    (r.code, r.stdout_str())
}

/// Sends `payload` over a new TCP connection to `host:port` from inside `sb` and waits for
/// the far side to close it (or 5 s).
fn send(d: &Daemon, sb: &str, host: &str, port: u16, payload: &str) -> i32 {
    sh(
        d,
        sb,
        &format!(
            "exec 3<>/dev/tcp/{host}/{port} || exit 7; printf %s {payload} >&3; \
             timeout 5 cat <&3 >/dev/null; exit 0"
        ),
    )
    .0
}

fn file_in(d: &Daemon, sb: &str, path: &str) -> bool {
    sh(d, sb, &format!("test -e {path}")).0 == 0
}

#[test]
fn egress_by_policy_end_to_end() {
    if !require_root("egress_by_policy_end_to_end") {
        return;
    }
    let _s = serial();
    let up = Upstream::start();
    // On every tier under test with egress (ADR 0123, ADR 0140 for gvisor).
    for tier in tiers::under_test() {
        let d = daemon(&up, true);
        if tiers::runs_on(&tier, &d.cli(&["tiers", "--json"]).ok().json(), &["egress"]) {
            egress_by_policy_on(&up, d, &tier);
        }
    }
}

fn egress_by_policy_on(up: &Upstream, d: Daemon, tier: &str) {
    let t = ["--tier", tier];
    let with_tier =
        |args: &[&str]| -> Vec<String> { t.iter().chain(args).map(|a| a.to_string()).collect() };
    let create = |d: &Daemon, args: &[&str]| {
        let a = with_tier(args);
        d.create(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let port_rule = "api.test:8080,9000";
    let sb = create(&d, &["--allow", port_rule, "--allow", "up.test:8080"]);
    let info = d.cli(&["info", "--json", &sb]).ok().json();
    assert_eq!(info["network_generation"], 1, "{info}");
    assert_eq!(info["network"]["rules"][0]["host"], "api.test", "{info}");

    // An allowed name (from --egress-hosts) gets the upstream's body, by name.
    let (code, out) = sh(
        &d,
        &sb,
        "curl -sS --max-time 10 http://api.test:8080/by-name",
    );
    assert_eq!(code, 0, "curl failed: {out}");
    assert_eq!(out, "hello from the upstream\n");
    assert!(up.log("http.log").contains("/by-name"));

    // An allowed name the hosts file does not know is asked of the stub (positive control
    // for the next check), and reached.
    let (code, out) = sh(
        &d,
        &sb,
        "curl -sS --max-time 10 http://up.test:8080/via-stub",
    );
    assert_eq!(code, 0, "curl failed: {out}");
    assert!(
        up.log("dns.log").contains("up.test"),
        "{}",
        up.log("dns.log")
    );

    // A denied name: NXDOMAIN, and the stub never heard of it.
    let (code, out) = sh(&d, &sb, "getent hosts denied.test; echo rc=$?");
    assert_eq!(code, 0);
    assert!(out.contains("rc=2"), "denied.test resolved: {out}");
    assert!(
        !up.log("dns.log").contains("denied.test"),
        "{}",
        up.log("dns.log")
    );

    // Floor, positive control: with --egress-allow-private a CIDR rule reaches the sink.
    let net = d
        .cli(&[
            "net",
            "set",
            &sb,
            "--if-match",
            "1",
            "--allow",
            port_rule,
            "--allow",
            &format!("{}:9000", up.addr()),
        ])
        .ok()
        .stdout_str();
    assert!(net.contains("generation 2"), "{net}");
    // A stale generation changes nothing.
    let stale = d.cli(&["net", "set", &sb, "--if-match", "1"]);
    assert_ne!(stale.code, 0, "a stale If-Match was taken");
    assert_eq!(send(&d, &sb, &up.addr(), 9000, "CONTROL"), 0);
    wait_for("the control bytes", DEADLINE, || {
        up.log("sink.log").contains("CONTROL")
    });

    // A live change closes an open connection it no longer allows.
    let spawned = d
        .cli(&[
            "spawn",
            &sb,
            "--",
            "bash",
            "-c",
            "exec 3<>/dev/tcp/api.test/9000; printf OPEN >&3; cat <&3; touch /tmp/closed",
        ])
        .ok();
    assert_eq!(spawned.code, 0);
    wait_for("the open connection", DEADLINE, || {
        up.log("sink.log").contains("OPEN")
    });
    assert!(
        !file_in(&d, &sb, "/tmp/closed"),
        "the connection closed on its own"
    );
    d.cli(&["net", "set", &sb, "--allow", "up.test:8080"]).ok();
    d.wait_for("the revoked connection to close", DEADLINE, || {
        file_in(&d, &sb, "/tmp/closed")
    });
    let (code, _) = sh(
        &d,
        &sb,
        "curl -sS --max-time 5 http://api.test:8080/after-revoke",
    );
    assert_ne!(code, 0, "a revoked name was reached");
    assert!(!up.log("http.log").contains("/after-revoke"));

    // A sandbox without a policy reaches nothing, by name or by address.
    let closed = create(&d, &[]);
    let (code, _) = sh(
        &d,
        &closed,
        "curl -sS --max-time 5 http://api.test:8080/no-policy",
    );
    assert_ne!(code, 0);
    send(&d, &closed, &up.addr(), 9000, "NOPOLICY");
    let (code, _) = sh(
        &d,
        &closed,
        &format!(
            "curl -sS --max-time 5 http://{}:8080/no-policy-ip",
            up.addr()
        ),
    );
    assert_ne!(code, 0);
    drop(d);

    // Without --egress-allow-private the floor holds even for a policy naming the address.
    let d2 = daemon(up, false);
    let floored = create(&d2, &["--allow", &format!("{}:9000", up.addr())]);
    send(&d2, &floored, &up.addr(), 9000, "FLOORED");
    // By name too: the name resolves to an address on the floor, which is never dialled.
    let sb1 = create(&d2, &["--allow", "api.test:8080"]);
    let (code, out) = sh(
        &d2,
        &sb1,
        "curl -sS --max-time 5 http://api.test:8080/floor",
    );
    assert_ne!(code, 0, "a floor address was dialled by name: {out}");
    drop(d2);
    // Positive control on the same upstream, after the floored attempt closed: these bytes
    // arrive, the floored ones never did.
    let d3 = daemon(up, true);
    let ctl = create(&d3, &["--allow", &format!("{}:9000", up.addr())]);
    assert_eq!(send(&d3, &ctl, &up.addr(), 9000, "AFTER"), 0);
    wait_for("the last control bytes", DEADLINE, || {
        up.log("sink.log").contains("AFTER")
    });
    let sink = up.log("sink.log");
    assert!(
        !sink.contains("FLOORED"),
        "the floor let bytes through: {sink}"
    );
    assert!(
        !sink.contains("NOPOLICY"),
        "a sandbox without policy sent bytes: {sink}"
    );
    assert!(!up.log("http.log").contains("/no-policy"));
    assert!(!up.log("http.log").contains("/floor"));
    drop(d3);
}

/// The egress log's rows as `net log --json` prints them.
fn log_rows(d: &Daemon, sb: &str) -> Vec<serde_json::Value> {
    let out = d.cli(&["net", "log", sb, "--json"]).ok().stdout_str();
    out.lines()
        .map(|l| serde_json::from_str(l).expect("net log --json prints JSON lines"))
        .collect()
}

#[test]
fn egress_log_rows_match_what_reached_the_upstream() {
    if !require_root("egress_log_rows_match_what_reached_the_upstream") {
        return;
    }
    let _s = serial();
    let up = Upstream::start();
    let d = daemon(&up, true);
    let sb = d.create(&["--allow", "api.test:8080,9000"]);

    // Follow the log from before the first row (a long poll the daemon holds open).
    let mut follow = std::process::Command::new(common::threadbox_bin())
        .args(["net", "log", &sb, "--follow", "--json"])
        .env("THREADBOX_URL", &d.url)
        .env_remove("THREADBOX_API_KEY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("net log --follow");
    let followed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    {
        let followed = followed.clone();
        let stdout = follow.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let mut f = followed.lock().unwrap_or_else(|p| p.into_inner());
                f.push_str(&line);
                f.push('\n');
            }
        });
    }

    // 1000 bytes to the sink by name, then our end closes: the proxy's row is written
    // when the connection closes.
    let payload = format!("LOGGED{}", "x".repeat(994));
    let (code, out) = sh(
        &d,
        &sb,
        &format!("exec 3<>/dev/tcp/api.test/9000 || exit 7; printf %s {payload} >&3; exec 3>&-"),
    );
    assert_eq!(code, 0, "{out}");
    wait_for("the payload at the sink", DEADLINE, || {
        up.log("sink.log").contains(&payload)
    });
    // An HTTP exchange: bytes both ways.
    let (code, body) = sh(
        &d,
        &sb,
        "curl -sS --max-time 10 http://api.test:8080/logged",
    );
    assert_eq!(code, 0, "{body}");
    // A denied name: a DNS row, never asked upstream.
    sh(&d, &sb, "getent hosts denied.test");

    let mut rows = Vec::new();
    d.wait_for("the log rows", DEADLINE, || {
        rows = log_rows(&d, &sb);
        rows.iter().filter(|r| r["kind"] == "tcp").count() >= 2
            && rows.iter().any(|r| r["name"] == "denied.test")
    });
    let sink = rows
        .iter()
        .find(|r| r["kind"] == "tcp" && r["port"] == 9000)
        .unwrap_or_else(|| panic!("no row for the sink: {rows:?}"));
    assert_eq!(sink["decision"], "allow", "{sink}");
    assert_eq!(sink["name"], "api.test", "{sink}");
    assert_eq!(sink["ip"], up.addr(), "{sink}");
    assert_eq!(
        sink["bytes_up"],
        payload.len(),
        "the row counts exactly the bytes the sink got: {sink}"
    );
    assert_eq!(sink["bytes_down"], 0, "{sink}");
    let http = rows
        .iter()
        .find(|r| r["kind"] == "tcp" && r["port"] == 8080)
        .unwrap_or_else(|| panic!("no row for the HTTP call: {rows:?}"));
    assert!(
        http["bytes_down"].as_u64().unwrap_or(0) > body.len() as u64,
        "the answer's head and body came down: {http}"
    );
    assert!(http["bytes_up"].as_u64().unwrap_or(0) > 0, "{http}");
    let dns_ok = rows
        .iter()
        .find(|r| r["kind"] == "dns" && r["name"] == "api.test")
        .unwrap_or_else(|| panic!("no DNS row for api.test: {rows:?}"));
    assert_eq!(dns_ok["decision"], "allow", "{dns_ok}");
    let dns_denied = rows
        .iter()
        .find(|r| r["kind"] == "dns" && r["name"] == "denied.test")
        .expect("the denied name's row");
    assert_eq!(dns_denied["decision"], "deny", "{dns_denied}");
    assert!(!up.log("dns.log").contains("denied.test"));
    // Rows are in order, and paging from a seq gives only what follows.
    let seqs: Vec<u64> = rows.iter().filter_map(|r| r["seq"].as_u64()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let after = seqs[0].to_string();
    let rest = d
        .cli(&["net", "log", &sb, "--json", "--after", &after])
        .ok()
        .stdout_str();
    assert_eq!(rest.lines().count(), rows.len() - 1);

    // The follower saw the same rows as they came.
    d.wait_for("the follower to print the sink's row", DEADLINE, || {
        followed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains("\"port\":9000")
    });
    let _ = follow.kill();
    let _ = follow.wait();

    // The bytes are metered, and the policy change is in the audit chain.
    let usage = d.cli(&["usage", "--json"]).ok().json();
    let mine = usage["tenants"][0]["sandboxes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["id"] == sb.as_str())
        .cloned()
        .unwrap_or_else(|| panic!("no usage for {sb}: {usage}"));
    let up_bytes: u64 = rows.iter().filter_map(|r| r["bytes_up"].as_u64()).sum();
    assert_eq!(mine["egress_bytes_up"], up_bytes, "{mine}");
    assert!(
        usage["tenants"][0]["egress_bytes_up"].as_u64().unwrap_or(0) >= up_bytes,
        "{usage}"
    );
    d.cli(&["net", "set", &sb, "--allow", "api.test:8080"]).ok();
    let audit = d.cli(&["audit", "ls", "--json"]).ok().json();
    assert!(
        audit["entries"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["action"] == "network.set" && e["target"] == sb.as_str()),
        "{audit}"
    );

    // Rows go with the sandbox.
    d.cli(&["rm", "--force", &sb]).ok();
    let gone = d.cli(&["net", "log", &sb]);
    assert_ne!(gone.code, 0, "a deleted sandbox's log still answers");
}

/// A TCP listener on the host at `ip` recording every byte it receives; its port.
fn record_tcp(ip: &str) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    use std::io::Read;
    let l = std::net::TcpListener::bind((ip, 0)).expect("bind the host listener");
    let port = l.local_addr().expect("local addr").port();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = got.clone();
    // Left blocked in accept when the test ends: the process exits with it.
    std::thread::spawn(move || {
        for mut s in l.incoming().flatten() {
            let mut buf = Vec::new();
            let _ = s.read_to_end(&mut buf);
            sink.lock().unwrap_or_else(|p| p.into_inner()).extend(buf);
        }
    });
    (port, got)
}

fn send_and_close(d: &Daemon, sb: &str, host: &str, port: u16, payload: &str) {
    sh(
        d,
        sb,
        &format!("exec 3<>/dev/tcp/{host}/{port} || exit 7; printf %s {payload} >&3; exec 3>&-"),
    );
}

/// The reason of the log's TCP row for `port`, once there is one.
fn tcp_reason(d: &Daemon, sb: &str, port: u16) -> String {
    let mut reason = String::new();
    d.wait_for("the connection's log row", DEADLINE, || {
        reason = log_rows(d, sb)
            .iter()
            .find(|r| r["kind"] == "tcp" && r["port"] == port)
            .map(|r| r["reason"].as_str().unwrap_or("").to_string())
            .unwrap_or_default();
        !reason.is_empty()
    });
    reason
}

#[test]
fn the_floor_holds_the_hosts_own_addresses_and_the_daemons_port() {
    if !require_root("the_floor_holds_the_hosts_own_addresses_and_the_daemons_port") {
        return;
    }
    let _s = serial();
    let up = Upstream::start();
    // A public-looking address of the host's own: on no range of the floor but the host's.
    let n = up.net.rsplit('.').next().expect("10.250.N");
    let own = format!("203.0.114.{n}");
    up.add_host_addr(&format!("{own}/32"));
    let (port, got) = record_tcp(&own);

    let d = daemon(&up, true);
    let sb = d.create(&["--allow", &format!("{own}:{port}")]);
    send_and_close(&d, &sb, &own, port, "HOSTFLOOR");
    assert_eq!(tcp_reason(&d, &sb, port), "floor");
    drop(d);

    // Positive control: the operator opens that address; the same policy reaches it. The
    // daemon's own port stays closed on it even so.
    let hosts = up.hosts_file();
    let d2 = Daemon::start_with(&[
        "--egress-hosts",
        hosts.to_str().expect("utf-8 path"),
        "--egress-dns",
        &format!("{}:53", up.addr()),
        "--egress-allow-private",
        &format!("{own}/32"),
    ]);
    let api = d2.port;
    let ctl = d2.create(&[
        "--allow",
        &format!("{own}:{port}"),
        "--allow",
        &format!("{own}:{api}"),
    ]);
    send_and_close(&d2, &ctl, &own, port, "HOSTCONTROL");
    wait_for("the control bytes at the host listener", DEADLINE, || {
        got.lock()
            .unwrap_or_else(|p| p.into_inner())
            .ends_with(b"HOSTCONTROL")
    });
    assert_eq!(tcp_reason(&d2, &ctl, port), "rule_allow");
    send_and_close(&d2, &ctl, &own, api, "GET");
    assert_eq!(tcp_reason(&d2, &ctl, api), "daemon_port");
    let seen = String::from_utf8_lossy(&got.lock().unwrap_or_else(|p| p.into_inner())).into_owned();
    assert!(
        !seen.contains("HOSTFLOOR"),
        "the floor let bytes through: {seen}"
    );
}
