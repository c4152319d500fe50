//! Egress end to end (issue 13), with a real daemon and real sandboxes. Loopback upstreams
//! cannot work (a sandbox's 127/8 is its own), so the test makes its own netns
//! `tbt-up-<pid>` joined to the host by a veth pair (host `10.250.N.1/30`, netns
//! `10.250.N.2/30`) and runs there an HTTP server, a TCP sink that records every byte, and a
//! stub DNS resolver that records every name asked (`tests/network/upstream.py`). Verdicts
//! are judged by what reached those upstreams, never by a `connect()` that appeared to work.
//! The netns, the veth and the servers are removed on every path (a guard's `Drop`).

mod common;

use common::{require_root, serial, wait_for, Daemon};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(30);

/// The upstream netns, its veth and the servers in it.
struct Upstream {
    ns: String,
    host_if: String,
    server: Option<Child>,
    dir: tempfile::TempDir,
    /// `10.250.N`
    net: String,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Upstream {
    fn start() -> Upstream {
        let pid = std::process::id();
        let n = pid % 250 + 1;
        let mut up = Upstream {
            ns: format!("tbt-up-{pid}"),
            host_if: format!("tbth{pid}"),
            server: None,
            dir: tempfile::Builder::new()
                .prefix("tbt-up-")
                .tempdir()
                .expect("temp dir"),
            net: format!("10.250.{n}"),
        };
        let peer = format!("tbtp{pid}");
        let (host_addr, ns_addr) = (format!("{}.1/30", up.net), format!("{}.2/30", up.net));
        // `up` is built first so that its Drop cleans up whatever part of this was made.
        for args in [
            vec!["netns", "add", &up.ns],
            vec![
                "link",
                "add",
                &up.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &peer,
            ],
            vec!["link", "set", &peer, "netns", &up.ns],
            vec!["addr", "add", &host_addr, "dev", &up.host_if],
            vec!["link", "set", &up.host_if, "up"],
            vec!["-n", &up.ns, "addr", "add", &ns_addr, "dev", &peer],
            vec!["-n", &up.ns, "link", "set", &peer, "up"],
            vec!["-n", &up.ns, "link", "set", "lo", "up"],
        ] {
            assert!(ip(&args), "ip {args:?} failed");
        }
        let script = up.dir.path().join("upstream.py");
        std::fs::write(&script, include_str!("network/upstream.py")).expect("write script");
        let server = Command::new("ip")
            .args(["netns", "exec", &up.ns, "python3"])
            .arg(&script)
            .arg(up.addr())
            .arg(up.dir.path())
            .stdin(Stdio::null())
            .spawn()
            .expect("start the upstream servers");
        up.server = Some(server);
        let ready = up.dir.path().join("ready");
        wait_for("the upstream servers", DEADLINE, || ready.exists());
        up
    }

    /// The upstream's address (netns side).
    fn addr(&self) -> String {
        format!("{}.2", self.net)
    }

    fn log(&self, name: &str) -> String {
        std::fs::read(self.dir.path().join(name))
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    fn hosts_file(&self) -> PathBuf {
        let p = self.dir.path().join("hosts");
        std::fs::write(&p, format!("{} api.test\n", self.addr())).expect("write hosts");
        p
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Deleting the netns also deletes its end of the veth, and with it the host end;
        // the host end is deleted on its own too, in case the netns was never made.
        let _ = ip(&["netns", "del", &self.ns]);
        let _ = ip(&["link", "del", &self.host_if]);
    }
}

fn daemon(up: &Upstream, allow_private: bool) -> Daemon {
    let hosts = up.hosts_file();
    let private = format!("{}.0/30", up.net);
    let dns = format!("{}:53", up.addr());
    let mut args = vec![
        "--egress-hosts",
        hosts.to_str().expect("utf-8 path"),
        "--egress-dns",
        &dns,
    ];
    if allow_private {
        args.extend(["--egress-allow-private", &private]);
    }
    Daemon::start_with(&args)
}

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
