//! The proxy on loopback. The "sandbox" is a client connecting to the redirect listener; the
//! original destination comes from a table keyed by the client's local address (what
//! `SO_ORIGINAL_DST` gives the daemon). Upstreams are servers the test starts, and every
//! verdict is judged by the bytes an upstream received, not by `connect()`.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use threadbox_api::network::{
    NetAction, NetLogEntry, NetProtocol, NetReason, NetworkPolicySpec, NetworkRuleSpec,
};
use threadbox_net::proxy::{self, OriginalDst};
use threadbox_net::{Floor, Limits, NetworkPolicy, SandboxNet, SandboxNetConfig, StaticResolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;

const T: Duration = Duration::from_secs(20);

/// An upstream that records everything it receives (per connection) and answers `banner`
/// once it has read anything, then echoes.
struct Upstream {
    addr: SocketAddr,
    got: Arc<Mutex<Vec<u8>>>,
}

async fn upstream(ip: Ipv4Addr, banner: &'static [u8]) -> Upstream {
    let l = TcpListener::bind((ip, 0)).await.expect("bind upstream");
    let addr = l.local_addr().expect("addr");
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let g = g.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let mut sent = false;
                loop {
                    let n = match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => n,
                    };
                    g.lock().expect("got").extend_from_slice(&buf[..n]);
                    if !sent {
                        sent = true;
                        if s.write_all(banner).await.is_err() {
                            return;
                        }
                    } else if s.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Upstream { addr, got }
}

struct Setup {
    net: Arc<SandboxNet>,
    rows: mpsc::Receiver<NetLogEntry>,
    listener: SocketAddr,
    table: Arc<Mutex<HashMap<SocketAddr, SocketAddr>>>,
}

fn rule(
    action: NetAction,
    host: Option<&str>,
    cidr: Option<&str>,
    ports: &[&str],
) -> NetworkRuleSpec {
    NetworkRuleSpec {
        action,
        host: host.map(Into::into),
        cidr: cidr.map(Into::into),
        ports: (!ports.is_empty()).then(|| ports.iter().map(|s| s.to_string()).collect()),
        protocol: None,
    }
}

fn policy(rules: Vec<NetworkRuleSpec>, generation: u64) -> NetworkPolicy {
    NetworkPolicy::from_spec(
        &NetworkPolicySpec {
            rules,
            ..Default::default()
        },
        generation,
    )
    .expect("policy")
}

async fn setup(
    rules: Vec<NetworkRuleSpec>,
    hosts: &[(&str, Ipv4Addr)],
    floor: Floor,
    limits: Limits,
) -> Setup {
    let mut r = StaticResolver::new(60);
    for (name, ip) in hosts {
        r.insert(name, vec![*ip]).expect("name");
    }
    let (net, rows) = SandboxNet::new(SandboxNetConfig {
        sandbox: "sb-1".into(),
        policy: policy(rules, 1),
        floor,
        resolver: Arc::new(r),
        limits,
    });
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind listener");
    let listener = l.local_addr().expect("addr");
    let table: Arc<Mutex<HashMap<SocketAddr, SocketAddr>>> = Arc::default();
    let t = table.clone();
    let od: OriginalDst = Arc::new(move |s: &TcpStream| {
        let peer = s.peer_addr()?;
        t.lock()
            .expect("table")
            .get(&peer)
            .copied()
            .ok_or_else(|| std::io::Error::other("no original destination"))
    });
    tokio::spawn(proxy::serve(net.clone(), l, od));
    Setup {
        net,
        rows,
        listener,
        table,
    }
}

fn loopback_floor() -> Floor {
    Floor {
        allow_private: vec!["127.0.0.0/8".parse().expect("net")],
        ..Floor::default()
    }
}

/// Connects "to `dst`" as a sandbox would: through the listener, with `dst` as the original
/// destination.
async fn connect(s: &Setup, dst: SocketAddr) -> TcpStream {
    let sock = TcpSocket::new_v4().expect("socket");
    sock.bind("127.0.0.1:0".parse().expect("addr"))
        .expect("bind");
    let local = sock.local_addr().expect("local");
    s.table.lock().expect("table").insert(local, dst);
    sock.connect(s.listener).await.expect("connect")
}

/// Sends `data`, then reads until the peer closes or `want` bytes came.
async fn exchange(c: &mut TcpStream, data: &[u8], want: usize) -> Vec<u8> {
    c.write_all(data).await.expect("send");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.len() < want {
        match tokio::time::timeout(T, c.read(&mut buf))
            .await
            .expect("no stall")
        {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}

async fn next_row(rows: &mut mpsc::Receiver<NetLogEntry>) -> NetLogEntry {
    tokio::time::timeout(T, rows.recv())
        .await
        .expect("a row in time")
        .expect("row")
}

fn client_hello(sni: Option<&str>) -> Vec<u8> {
    let mut exts = Vec::new();
    if let Some(name) = sni {
        let n = name.as_bytes();
        let mut list = vec![0u8];
        list.extend_from_slice(&(n.len() as u16).to_be_bytes());
        list.extend_from_slice(n);
        let mut data = (list.len() as u16).to_be_bytes().to_vec();
        data.extend_from_slice(&list);
        exts.extend_from_slice(&[0, 0]);
        exts.extend_from_slice(&(data.len() as u16).to_be_bytes());
        exts.extend_from_slice(&data);
    }
    let mut body = vec![3, 3];
    body.extend_from_slice(&[9u8; 32]);
    body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1u8];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    // Split across two records, as large ClientHellos are.
    let (a, b) = hs.split_at(hs.len() / 2);
    let mut out = Vec::new();
    for part in [a, b] {
        out.extend_from_slice(&[22, 3, 1]);
        out.extend_from_slice(&(part.len() as u16).to_be_bytes());
        out.extend_from_slice(part);
    }
    out
}

fn public(port: u16) -> SocketAddr {
    SocketAddr::from(([93, 184, 216, 34], port))
}

#[tokio::test]
async fn tls_is_dialled_by_sni_not_by_the_address_the_sandbox_chose() {
    let good = upstream(Ipv4Addr::new(127, 0, 0, 2), b"server-hello").await;
    let chosen = upstream(Ipv4Addr::new(127, 0, 0, 3), b"wrong").await;
    let tls = NetworkRuleSpec {
        protocol: Some(NetProtocol::Tls),
        ..rule(
            NetAction::Allow,
            Some("allowed.test"),
            None,
            &[&good.addr.port().to_string()],
        )
    };
    let mut s = setup(
        vec![tls],
        &[("allowed.test", Ipv4Addr::new(127, 0, 0, 2))],
        loopback_floor(),
        Limits::default(),
    )
    .await;
    let hello = client_hello(Some("Allowed.Test"));
    // The sandbox asks for 127.0.0.3 (another upstream) with SNI allowed.test.
    let mut c = connect(&s, SocketAddr::new(chosen.addr.ip(), good.addr.port())).await;
    let reply = exchange(&mut c, &hello, 12).await;
    assert_eq!(reply, b"server-hello");
    assert_eq!(
        *good.got.lock().expect("got"),
        hello,
        "the ClientHello was replayed unchanged"
    );
    assert!(
        chosen.got.lock().expect("got").is_empty(),
        "the address the sandbox chose got nothing"
    );
    drop(c);
    let row = next_row(&mut s.rows).await;
    assert_eq!(
        (row.decision, row.reason),
        (NetAction::Allow, NetReason::RuleAllow)
    );
    assert_eq!(row.name.as_deref(), Some("allowed.test"));
    assert_eq!(row.ip.as_deref(), Some("127.0.0.2"));
    assert!(row.name_ip_mismatch);
    assert_eq!((row.bytes_up, row.bytes_down), (hello.len() as u64, 12));
}

#[tokio::test]
async fn denied_sni_gets_a_tls_alert_and_no_bytes_go_out() {
    let up = upstream(Ipv4Addr::new(127, 0, 0, 2), b"x").await;
    let tls = NetworkRuleSpec {
        protocol: Some(NetProtocol::Tls),
        ..rule(
            NetAction::Allow,
            Some("allowed.test"),
            None,
            &[&up.addr.port().to_string()],
        )
    };
    let mut s = setup(
        vec![tls],
        &[("denied.test", Ipv4Addr::new(127, 0, 0, 2))],
        loopback_floor(),
        Limits::default(),
    )
    .await;
    let mut c = connect(&s, up.addr).await;
    let reply = exchange(&mut c, &client_hello(Some("denied.test")), 7).await;
    assert_eq!(reply, [21, 3, 3, 0, 2, 2, 49], "fatal access_denied alert");
    let row = next_row(&mut s.rows).await;
    assert_eq!(
        (row.decision, row.reason),
        (NetAction::Deny, NetReason::DefaultDeny)
    );
    // No SNI at all, to an address no rule names: denied too.
    let mut c = connect(&s, up.addr).await;
    let reply = exchange(&mut c, &client_hello(None), 7).await;
    assert_eq!(reply.len(), 7);
    assert_eq!(next_row(&mut s.rows).await.reason, NetReason::NoName);
    assert!(up.got.lock().expect("got").is_empty());
}

#[tokio::test]
async fn http_is_dialled_by_host_and_denied_with_a_403() {
    let up = upstream(Ipv4Addr::new(127, 0, 0, 2), b"HTTP/1.1 200 OK\r\n\r\n").await;
    let port = up.addr.port().to_string();
    let http = NetworkRuleSpec {
        protocol: Some(NetProtocol::Http),
        ..rule(NetAction::Allow, Some("web.test"), None, &[&port])
    };
    let mut s = setup(
        vec![http],
        &[
            ("web.test", Ipv4Addr::new(127, 0, 0, 2)),
            ("other.test", Ipv4Addr::new(127, 0, 0, 2)),
        ],
        loopback_floor(),
        Limits::default(),
    )
    .await;
    let req = format!("GET / HTTP/1.1\r\nHost: web.test:{port}\r\n\r\n");
    let mut c = connect(&s, public(up.addr.port())).await;
    assert_eq!(
        exchange(&mut c, req.as_bytes(), 19).await,
        b"HTTP/1.1 200 OK\r\n\r\n"
    );
    assert_eq!(*up.got.lock().expect("got"), req.as_bytes());
    drop(c);
    assert_eq!(next_row(&mut s.rows).await.decision, NetAction::Allow);
    let mut c = connect(&s, up.addr).await;
    let reply = exchange(
        &mut c,
        b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n",
        usize::MAX,
    )
    .await;
    let text = String::from_utf8(reply).expect("utf8");
    assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{text}");
    assert!(
        text.ends_with(
            "{\"error\":\"egress_denied\",\"host\":\"other.test\",\"reason\":\"default_deny\"}\n"
        ),
        "{text}"
    );
    assert_eq!(
        up.got.lock().expect("got").len(),
        req.len(),
        "nothing more reached the upstream"
    );
}

#[tokio::test]
async fn cidr_rules_allow_their_port_only_and_other_tcp_is_reset() {
    let up = upstream(Ipv4Addr::new(127, 0, 0, 2), b"hi").await;
    let other = upstream(Ipv4Addr::new(127, 0, 0, 2), b"no").await;
    let port = up.addr.port().to_string();
    let mut s = setup(
        vec![rule(NetAction::Allow, None, Some("127.0.0.2/32"), &[&port])],
        &[],
        loopback_floor(),
        Limits::default(),
    )
    .await;
    let mut c = connect(&s, up.addr).await;
    assert_eq!(exchange(&mut c, b"ping", 2).await, b"hi");
    drop(c);
    assert_eq!(next_row(&mut s.rows).await.reason, NetReason::RuleAllow);
    let mut c = connect(&s, other.addr).await;
    let _ = c.write_all(b"ping").await;
    let mut buf = [0u8; 8];
    let r = tokio::time::timeout(T, c.read(&mut buf))
        .await
        .expect("no stall");
    assert!(matches!(r, Err(_) | Ok(0)), "reset or closed: {r:?}");
    assert!(other.got.lock().expect("got").is_empty());
    assert_eq!(next_row(&mut s.rows).await.reason, NetReason::NoName);
}

#[tokio::test]
async fn the_floor_holds_without_the_operator_exception() {
    // The policy names the loopback upstream outright; without --egress-allow-private the
    // floor still refuses it (and the daemon's port even with the exception).
    let up = upstream(Ipv4Addr::new(127, 0, 0, 2), b"hi").await;
    let port = up.addr.port().to_string();
    let rules = vec![
        rule(NetAction::Allow, Some("loop.test"), None, &["any"]),
        rule(NetAction::Allow, None, Some("0.0.0.0/0"), &[]),
    ];
    let mut s = setup(
        rules,
        &[("loop.test", Ipv4Addr::new(127, 0, 0, 2))],
        Floor::default(),
        Limits::default(),
    )
    .await;
    let mut c = connect(&s, up.addr).await;
    let _ = exchange(&mut c, b"ping", 2).await;
    assert_eq!(next_row(&mut s.rows).await.reason, NetReason::Floor);
    let mut c = connect(&s, SocketAddr::from(([169, 254, 169, 254], 80))).await;
    let reply = exchange(
        &mut c,
        format!("GET / HTTP/1.1\r\nHost: loop.test:{port}\r\n\r\n").as_bytes(),
        usize::MAX,
    )
    .await;
    assert!(
        reply.starts_with(b"HTTP/1.1 403"),
        "dialled by name, whose address is on the floor"
    );
    assert_eq!(next_row(&mut s.rows).await.reason, NetReason::Floor);
    assert!(
        up.got.lock().expect("got").is_empty(),
        "no byte reached the loopback upstream"
    );
    // Positive control: the same policy with the operator exception reaches it…
    s.net.set_floor(loopback_floor());
    let mut c = connect(&s, up.addr).await;
    assert_eq!(exchange(&mut c, b"ping", 2).await, b"hi");
    drop(c);
    assert_eq!(next_row(&mut s.rows).await.reason, NetReason::RuleAllow);
    // …but never the daemon's own port.
    s.net.set_floor(Floor {
        daemon_ports: [up.addr.port()].into_iter().collect(),
        ..loopback_floor()
    });
    let before = up.got.lock().expect("got").len();
    let mut c = connect(&s, up.addr).await;
    let _ = exchange(&mut c, b"ping", 2).await;
    assert_eq!(next_row(&mut s.rows).await.reason, NetReason::DaemonPort);
    assert_eq!(up.got.lock().expect("got").len(), before);
}

#[tokio::test]
async fn raw_tcp_to_a_pinned_address_is_allowed_by_its_name() {
    let up = upstream(Ipv4Addr::new(127, 0, 0, 2), b"SSH-2.0-test\r\n").await;
    let port = up.addr.port().to_string();
    let hosts = [("git.test", Ipv4Addr::new(127, 0, 0, 2))];
    let mut s = setup(
        vec![rule(NetAction::Allow, Some("git.test"), None, &[&port])],
        &hosts,
        loopback_floor(),
        Limits::default(),
    )
    .await;
    // No pin yet: a raw TCP port carries no name.
    let mut c = connect(&s, up.addr).await;
    let _ = exchange(&mut c, b"x", 1).await;
    assert_eq!(next_row(&mut s.rows).await.reason, NetReason::NoName);
    assert!(up.got.lock().expect("got").is_empty());
    // The sandbox resolves git.test through its DNS server, which pins 127.0.0.2 to it.
    let reply = threadbox_net::dns::answer(&s.net, &dns_query("git.test."))
        .await
        .expect("answer");
    assert!(!reply.is_empty());
    assert_eq!(
        next_row(&mut s.rows).await.kind,
        threadbox_api::network::NetLogKind::Dns
    );
    assert_eq!(
        s.net.pins_for(Ipv4Addr::new(127, 0, 0, 2)),
        vec!["git.test"]
    );
    let mut c = connect(&s, up.addr).await;
    assert_eq!(
        exchange(&mut c, b"SSH-2.0-client\r\n", 14).await,
        b"SSH-2.0-test\r\n"
    );
    drop(c);
    let row = next_row(&mut s.rows).await;
    assert_eq!(
        (row.decision, row.name.as_deref()),
        (NetAction::Allow, Some("git.test"))
    );
}

fn dns_query(name: &str) -> Vec<u8> {
    use hickory_proto::op::{Message, Query};
    use hickory_proto::rr::{Name, RecordType};
    let mut m = Message::query();
    m.add_query(Query::query(
        Name::from_ascii(name).expect("name"),
        RecordType::A,
    ));
    m.to_vec().expect("encode")
}

#[tokio::test]
async fn a_policy_swap_closes_revoked_connections_and_opens_new_ones() {
    let up = upstream(Ipv4Addr::new(127, 0, 0, 2), b"hi").await;
    let port = up.addr.port().to_string();
    let allow = vec![rule(NetAction::Allow, None, Some("127.0.0.2/32"), &[&port])];
    let mut s = setup(allow.clone(), &[], loopback_floor(), Limits::default()).await;
    let mut c = connect(&s, up.addr).await;
    assert_eq!(exchange(&mut c, b"ping", 2).await, b"hi");
    assert_eq!(exchange(&mut c, b"echo", 4).await, b"echo");
    s.net.set_policy(policy(vec![], 2));
    let mut buf = [0u8; 8];
    let r = tokio::time::timeout(T, c.read(&mut buf))
        .await
        .expect("closed in time");
    assert!(matches!(r, Err(_) | Ok(0)), "revoked: {r:?}");
    let row = next_row(&mut s.rows).await;
    assert_eq!(row.reason, NetReason::PolicyRevoked);
    assert_eq!((row.bytes_up, row.bytes_down), (8, 6));
    // New connections are denied under the new policy…
    let mut c = connect(&s, up.addr).await;
    let _ = exchange(&mut c, b"ping", 2).await;
    assert_eq!(next_row(&mut s.rows).await.decision, NetAction::Deny);
    // …and allowed again once the rule is back, without a restart. A swap that keeps the
    // connection allowed leaves it open.
    s.net.set_policy(policy(allow.clone(), 3));
    let mut c = connect(&s, up.addr).await;
    assert_eq!(exchange(&mut c, b"ping", 2).await, b"hi");
    s.net.set_policy(policy(allow, 4));
    assert_eq!(exchange(&mut c, b"more", 4).await, b"more");
}

#[tokio::test]
async fn the_connection_cap_is_per_sandbox() {
    let up = upstream(Ipv4Addr::new(127, 0, 0, 2), b"hi").await;
    let rules = vec![rule(NetAction::Allow, None, Some("127.0.0.2/32"), &[])];
    let mut s = setup(
        rules,
        &[],
        loopback_floor(),
        Limits {
            max_conns: 2,
            ..Limits::default()
        },
    )
    .await;
    let mut a = connect(&s, up.addr).await;
    let mut b = connect(&s, up.addr).await;
    assert_eq!(exchange(&mut a, b"1", 2).await, b"hi");
    assert_eq!(exchange(&mut b, b"2", 2).await, b"hi");
    let mut c = connect(&s, up.addr).await;
    let _ = exchange(&mut c, b"3", 2).await;
    assert_eq!(next_row(&mut s.rows).await.reason, NetReason::ConnLimit);
    assert_eq!(*up.got.lock().expect("got"), b"12");
    assert_eq!(s.net.open_connections(), 2);
    drop(a);
    assert_eq!(next_row(&mut s.rows).await.reason, NetReason::RuleAllow);
    // The permit is back once the closed connection's task ends.
    let deadline = tokio::time::Instant::now() + T;
    while s.net.open_connections() > 1 {
        assert!(tokio::time::Instant::now() < deadline, "permit returned");
        tokio::task::yield_now().await;
    }
    let mut d = connect(&s, up.addr).await;
    assert_eq!(exchange(&mut d, b"4", 2).await, b"hi");
}

#[tokio::test]
async fn a_missing_original_destination_is_refused() {
    let up = upstream(Ipv4Addr::new(127, 0, 0, 2), b"hi").await;
    let mut s = setup(
        vec![rule(NetAction::Allow, None, Some("127.0.0.0/8"), &[])],
        &[],
        loopback_floor(),
        Limits::default(),
    )
    .await;
    let mut c = TcpStream::connect(s.listener).await.expect("connect");
    let _ = exchange(&mut c, b"x", 1).await;
    assert_eq!(next_row(&mut s.rows).await.reason, NetReason::Loop);
    let mut c = connect(&s, s.listener).await;
    let _ = exchange(&mut c, b"x", 1).await;
    assert_eq!(
        next_row(&mut s.rows).await.reason,
        NetReason::Loop,
        "the listener itself"
    );
    assert!(up.got.lock().expect("got").is_empty());
}
