//! Class N11, DNS exhaustion (issue 13 scope 2, ADR 0074): one sandbox floods the daemon's
//! DNS with questions for names its policy allows (each one new, so each would be
//! forwarded). Judged by the names the test's stub resolver received (`dns.log`): at most
//! the per-sandbox bucket (burst 200, 50/s over the flood's own duration) get through, the
//! rest are refused and logged as rate-limited, and a neighbour's question, asked while the
//! flood goes on, is answered and reaches the stub. Control `egress-no-dns-cap`: every
//! question of the flood reaches the stub.

use super::egress::Up;
use super::harness::*;
use std::time::Duration;
use threadbox_api::{CreateSandboxRequest, StartProcessRequest, User};

const DEADLINE: Duration = Duration::from_secs(60);
/// Questions in the flood's counted phase.
const FLOOD: usize = 1000;
/// The daemon's per-sandbox bucket (threadbox-net `Limits::default`).
const BURST: f64 = 200.0;
const PER_SEC: f64 = 50.0;

fn create(d: &Daemon) -> String {
    let network = serde_json::from_value(serde_json::json!({"rules": [
        {"action": "allow", "host": "*.flood.test"},
    ]}))
    .expect("policy");
    let req = CreateSandboxRequest {
        network: Some(network),
        ..Default::default()
    };
    block(d.client.create(&req))
        .unwrap_or_else(|e| panic!("create: {e}\n{}", d.log()))
        .0
        .id
}

/// What one flood did.
#[derive(Debug)]
pub struct Flood {
    /// Questions of the counted phase that reached the stub resolver.
    pub forwarded: usize,
    /// What the bucket lets through over the phase's duration (with a margin of two
    /// seconds for questions the daemon read after the flooder stopped waiting).
    pub bound: usize,
    /// Answers the flooder got with REFUSED.
    pub refused: usize,
    pub secs: f64,
    /// Rows of the hog's egress log with a rate-limit reason.
    pub logged: usize,
}

pub fn flood(d: &Daemon, up: &Up) -> Flood {
    let hog = create(d);
    let neighbour = create(d);
    let tag = random_hex()[..10].to_string();
    // Windows of 50 questions sent at once, each waited for (up to 1 s) before the next:
    // fast, and never more than a socket buffer holds. After the counted phase it goes on
    // (other names) until told to stop, so the neighbour asks during a flood.
    let script = format!(
        r#"import json, os, socket, struct, time
def q(name, i):
    b = struct.pack('!HHHHHH', i & 0xffff, 0x100, 1, 0, 0, 0)
    for l in name.split('.'):
        b += bytes([len(l)]) + l.encode()
    return b + b'\0' + struct.pack('!HH', 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(1.0)
def window(prefix, start, n):
    got = refused = 0
    for i in range(start, start + n):
        s.sendto(q('%s%d-{tag}.flood.test' % (prefix, i), i), ('127.0.0.53', 53))
    while got < n:
        try:
            r, _ = s.recvfrom(512)
        except OSError:
            break
        got += 1
        refused += (r[3] & 0xf) == 5
    return refused
t0 = time.monotonic()
refused = 0
for w in range(0, {FLOOD}, 50):
    refused += window('f', w, 50)
secs = time.monotonic() - t0
open('/tmp/flood.tmp', 'w').write(json.dumps({{'refused': refused, 'secs': secs}}))
os.rename('/tmp/flood.tmp', '/tmp/flood.json')
i = 0
while not os.path.exists('/tmp/stop') and i < 200000:
    window('g', i, 50)
    i += 50
"#
    );
    d.write(&hog, "/tmp/flood.py", User::User, script.as_bytes());
    block(d.client.start_process(
        &hog,
        &StartProcessRequest {
            command: Some(vec!["python3".into(), "/tmp/flood.py".into()]),
            ..Default::default()
        },
    ))
    .expect("the flood");
    let mut stats = serde_json::Value::Null;
    wait_for(
        "the flood's counted phase",
        Duration::from_secs(180),
        || {
            let r = d.sh(&hog, User::User, "cat /tmp/flood.json");
            stats = serde_json::from_str(&r.stdout).unwrap_or(serde_json::Value::Null);
            r.exit_code == Some(0)
        },
    );
    // The neighbour, while the hog still floods.
    let name = format!("n-{tag}.flood.test");
    let r = d.sh(
        &neighbour,
        User::User,
        &format!("python3 -c \"import socket; print(socket.gethostbyname('{name}'))\""),
    );
    assert_eq!(
        r.exit_code,
        Some(0),
        "the neighbour did not resolve while a sandbox flooded DNS: {r:?}"
    );
    assert_eq!(r.stdout.trim(), up.addr(), "{r:?}");
    wait_for("the neighbour's question at the stub", DEADLINE, || {
        up.seen("dns.log").contains(&name)
    });
    d.sh(&hog, User::User, "touch /tmp/stop");
    let secs = stats["secs"].as_f64().unwrap_or(0.0);
    let refused = stats["refused"].as_u64().unwrap_or(0) as usize;
    let suffix = format!("-{tag}.flood.test");
    let forwarded = up
        .seen("dns.log")
        .lines()
        .filter(|l| l.starts_with('f') && l.ends_with(&suffix))
        .count();
    let log = block(d.client.call(&threadbox_api::net_log::GetNetworkLog {
        sandbox: hog.clone(),
        after: None,
        limit: Some(1000),
        wait_ms: None,
    }));
    let logged = log
        .ok()
        .and_then(|l| serde_json::to_value(l).ok())
        .and_then(|v| v["entries"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|e| e["reason"].as_str().is_some_and(|r| r.contains("rate")))
        .count();
    let _ = block(d.client.delete(&hog, true));
    let _ = block(d.client.delete(&neighbour, true));
    Flood {
        forwarded,
        bound: (BURST + PER_SEC * (secs + 2.0)) as usize,
        refused,
        secs,
        logged,
    }
}

fn daemon(up: &Up, bins: &Bins, weaken: Option<&str>) -> Daemon {
    let args = up.serve_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Daemon::start_with(bins, weaken, &args)
}

pub fn held() {
    let _s = serial();
    let up = Up::start();
    let d = daemon(&up, &normal_bins(), None);
    let f = flood(&d, &up);
    eprintln!("N11: {f:?}");
    assert!(
        f.forwarded <= f.bound,
        "N11: {} of {FLOOD} flood questions reached the resolver, over the cap's {} in {:.1} s",
        f.forwarded,
        f.bound,
        f.secs
    );
    assert!(f.refused > 0, "N11: no question was refused: {f:?}");
    assert!(f.logged > 0, "N11: no rate-limited row in the log: {f:?}");
}

pub fn control_detects() {
    let _s = serial();
    let up = Up::start();
    let d = daemon(&up, &weakened_bins(), Some("egress-no-dns-cap"));
    let f = flood(&d, &up);
    eprintln!("N11 control (egress-no-dns-cap): {f:?}");
    assert!(
        f.forwarded > f.bound,
        "N11 control: only {} questions got through without the cap (bound {}): {f:?}",
        f.forwarded,
        f.bound
    );
}
