//! Egress end to end (issue 13), with a real daemon and real sandboxes. Loopback upstreams
//! cannot work (a sandbox's 127/8 is its own), so the test makes its own netns
//! (`common/upstream.rs`) joined to the host by a veth pair (host `10.250.N.1/30`, netns
//! `10.250.N.2/30`) and runs there an HTTP server, a TCP sink that records every byte, and a
//! stub DNS resolver that records every name asked (`tests/network/upstream.py`). Verdicts
//! are judged by what reached those upstreams, never by a `connect()` that appeared to work.
//! The netns, the veth and the servers are removed on every path (a guard's `Drop`).

mod common;

use common::upstream::{daemon, Upstream, DEADLINE};
use common::{require_root, serial, wait_for, Daemon};

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
    let d = daemon(&up, true);
    let port_rule = "api.test:8080,9000";
    let sb = d.create(&["--allow", port_rule, "--allow", "up.test:8080"]);
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
    let closed = d.create(&[]);
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
    let d2 = daemon(&up, false);
    let floored = d2.create(&["--allow", &format!("{}:9000", up.addr())]);
    send(&d2, &floored, &up.addr(), 9000, "FLOORED");
    // By name too: the name resolves to an address on the floor, which is never dialled.
    let sb1 = d2.create(&["--allow", "api.test:8080"]);
    let (code, out) = sh(
        &d2,
        &sb1,
        "curl -sS --max-time 5 http://api.test:8080/floor",
    );
    assert_ne!(code, 0, "a floor address was dialled by name: {out}");
    drop(d2);
    // Positive control on the same upstream, after the floored attempt closed: these bytes
    // arrive, the floored ones never did.
    let d3 = daemon(&up, true);
    let ctl = d3.create(&["--allow", &format!("{}:9000", up.addr())]);
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
