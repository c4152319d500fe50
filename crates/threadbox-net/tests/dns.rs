//! The per-sandbox DNS server against a stub upstream name server that records every question
//! it receives, so "never forwarded" is judged by what reached the upstream.

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{rdata::A, Name, RData, Record, RecordType};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use threadbox_api::network::{
    NetAction, NetLogEntry, NetReason, NetworkPolicySpec, NetworkRuleSpec,
};
use threadbox_net::{
    dns, Floor, Limits, NetworkPolicy, SandboxNet, SandboxNetConfig, UpstreamResolver,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::mpsc;

/// A stub name server: answers A questions from `zone` (NXDOMAIN otherwise) and records
/// every question name it was asked.
struct Stub {
    addr: SocketAddr,
    asked: Arc<Mutex<Vec<String>>>,
}

async fn stub(zone: HashMap<&'static str, Vec<Ipv4Addr>>) -> Stub {
    let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind stub");
    let addr = sock.local_addr().expect("addr");
    let asked = Arc::new(Mutex::new(Vec::new()));
    let log = asked.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                return;
            };
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut r = Message::response(q.metadata.id, OpCode::Query);
            r.add_queries(q.queries.iter().cloned());
            for query in &q.queries {
                let name = query.name.to_ascii().trim_end_matches('.').to_string();
                log.lock().expect("log").push(name.clone());
                match zone.get(name.as_str()) {
                    Some(ips) => {
                        for ip in ips {
                            r.add_answer(Record::from_rdata(
                                query.name.clone(),
                                3600,
                                RData::A(A(*ip)),
                            ));
                        }
                    }
                    None => r.metadata.response_code = ResponseCode::NXDomain,
                }
            }
            let _ = sock.send_to(&r.to_vec().expect("encode"), peer).await;
        }
    });
    Stub { addr, asked }
}

fn allow(host: &str) -> NetworkRuleSpec {
    NetworkRuleSpec {
        action: NetAction::Allow,
        host: Some(host.into()),
        cidr: None,
        ports: None,
        protocol: None,
    }
}

struct Setup {
    net: Arc<SandboxNet>,
    rows: mpsc::Receiver<NetLogEntry>,
    udp: SocketAddr,
    tcp: SocketAddr,
    stub: Stub,
}

async fn setup(rules: Vec<NetworkRuleSpec>, limits: Limits) -> Setup {
    let stub = stub(HashMap::from([
        (
            "allowed.test",
            vec![
                Ipv4Addr::new(93, 184, 216, 34),
                Ipv4Addr::new(93, 184, 216, 35),
            ],
        ),
        ("x.wild.test", vec![Ipv4Addr::new(93, 184, 216, 36)]),
        (
            "rebind.test",
            vec![Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 1)],
        ),
        (
            "half.test",
            vec![
                Ipv4Addr::new(169, 254, 169, 254),
                Ipv4Addr::new(93, 184, 216, 40),
            ],
        ),
        ("denied.test", vec![Ipv4Addr::new(93, 184, 216, 99)]),
    ]))
    .await;
    let spec = NetworkPolicySpec {
        rules,
        ..Default::default()
    };
    let (net, rows) = SandboxNet::new(SandboxNetConfig {
        sandbox: "sb-1".into(),
        policy: NetworkPolicy::from_spec(&spec, 1).expect("policy"),
        floor: Floor::default(),
        resolver: Arc::new(UpstreamResolver {
            servers: vec![stub.addr],
            timeout: Duration::from_secs(5),
        }),
        limits,
    });
    let udp_sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind udp");
    let udp = udp_sock.local_addr().expect("addr");
    let tcp_l = TcpListener::bind("127.0.0.1:0").await.expect("bind tcp");
    let tcp = tcp_l.local_addr().expect("addr");
    tokio::spawn(dns::serve_udp(net.clone(), udp_sock));
    tokio::spawn(dns::serve_tcp(net.clone(), tcp_l));
    Setup {
        net,
        rows,
        udp,
        tcp,
        stub,
    }
}

fn query(name: &str, t: RecordType) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).expect("name"), t));
    m.to_vec().expect("encode")
}

async fn ask_udp(server: SocketAddr, name: &str, t: RecordType) -> Message {
    let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let q = query(name, t);
    sock.send_to(&q, server).await.expect("send");
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(Duration::from_secs(10), sock.recv_from(&mut buf))
        .await
        .expect("an answer")
        .expect("recv");
    let m = Message::from_vec(&buf[..n]).expect("decode");
    assert_eq!(m.metadata.message_type, MessageType::Response);
    assert_eq!(m.metadata.id, Message::from_vec(&q).expect("q").metadata.id);
    m
}

fn a_records(m: &Message) -> Vec<Ipv4Addr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn allowed_names_resolve_and_are_pinned() {
    let mut s = setup(
        vec![allow("allowed.test"), allow("*.wild.test")],
        Limits::default(),
    )
    .await;
    let m = ask_udp(s.udp, "Allowed.Test.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(
        a_records(&m),
        vec![
            Ipv4Addr::new(93, 184, 216, 34),
            Ipv4Addr::new(93, 184, 216, 35)
        ]
    );
    assert!(m.answers.iter().all(|r| r.ttl == 300), "TTL clamped to 300");
    assert_eq!(
        s.net.pins_for(Ipv4Addr::new(93, 184, 216, 35)),
        vec!["allowed.test"]
    );
    let m = ask_udp(s.udp, "x.wild.test", RecordType::A).await;
    assert_eq!(a_records(&m), vec![Ipv4Addr::new(93, 184, 216, 36)]);
    let row = s.rows.recv().await.expect("row");
    assert_eq!(
        (row.decision, row.reason, row.name.as_deref()),
        (NetAction::Allow, NetReason::RuleAllow, Some("allowed.test"))
    );
    assert_eq!(row.answers, Some(2));
    assert_eq!(row.sandbox, "sb-1");
}

#[tokio::test]
async fn denied_names_get_nxdomain_and_never_reach_the_upstream() {
    let mut s = setup(
        vec![allow("allowed.test"), allow("*.wild.test")],
        Limits::default(),
    )
    .await;
    for name in [
        "denied.test.",
        "wild.test.",
        "allowed.test.evil.",
        "xallowed.test.",
    ] {
        for t in [
            RecordType::A,
            RecordType::AAAA,
            RecordType::TXT,
            RecordType::HTTPS,
        ] {
            let m = ask_udp(s.udp, name, t).await;
            assert_eq!(
                m.metadata.response_code,
                ResponseCode::NXDomain,
                "{name} {t}"
            );
            assert!(m.answers.is_empty());
        }
    }
    assert!(
        s.stub.asked.lock().expect("log").is_empty(),
        "nothing was forwarded"
    );
    let row = s.rows.recv().await.expect("row");
    assert_eq!(
        (row.decision, row.reason),
        (NetAction::Deny, NetReason::DefaultDeny)
    );
    // Positive control: the same stub does see an allowed name.
    ask_udp(s.udp, "allowed.test.", RecordType::A).await;
    assert_eq!(*s.stub.asked.lock().expect("log"), vec!["allowed.test"]);
}

#[tokio::test]
async fn aaaa_https_svcb_get_no_data_and_are_not_forwarded() {
    let s = setup(vec![allow("allowed.test")], Limits::default()).await;
    for t in [
        RecordType::AAAA,
        RecordType::HTTPS,
        RecordType::SVCB,
        RecordType::MX,
    ] {
        let m = ask_udp(s.udp, "allowed.test.", t).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{t}");
        assert!(m.answers.is_empty(), "{t}");
    }
    let m = ask_udp(s.udp, "allowed.test.", RecordType::PTR).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(s.stub.asked.lock().expect("log").is_empty());
}

#[tokio::test]
async fn answers_on_the_floor_are_dropped() {
    let mut s = setup(
        vec![allow("rebind.test"), allow("half.test")],
        Limits::default(),
    )
    .await;
    let m = ask_udp(s.udp, "rebind.test.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.answers.is_empty(), "127.0.0.1 and 10.0.0.1 dropped");
    assert!(s.net.pins_for(Ipv4Addr::new(127, 0, 0, 1)).is_empty());
    let row = s.rows.recv().await.expect("row");
    assert_eq!(
        (row.decision, row.reason),
        (NetAction::Deny, NetReason::Floor)
    );
    let m = ask_udp(s.udp, "half.test.", RecordType::A).await;
    assert_eq!(
        a_records(&m),
        vec![Ipv4Addr::new(93, 184, 216, 40)],
        "metadata address dropped"
    );
}

#[tokio::test]
async fn the_operator_exception_lets_a_private_answer_through() {
    let s = setup(vec![allow("rebind.test")], Limits::default()).await;
    s.net.set_floor(Floor {
        allow_private: vec!["127.0.0.0/8".parse().expect("net")],
        ..Floor::default()
    });
    let m = ask_udp(s.udp, "rebind.test.", RecordType::A).await;
    assert_eq!(
        a_records(&m),
        vec![Ipv4Addr::new(127, 0, 0, 1)],
        "10.0.0.1 is still dropped"
    );
}

#[tokio::test]
async fn dns_over_tcp_is_answered_the_same_way() {
    let s = setup(vec![allow("allowed.test")], Limits::default()).await;
    let mut c = TcpStream::connect(s.tcp).await.expect("connect");
    for (name, code) in [
        ("allowed.test.", ResponseCode::NoError),
        ("denied.test.", ResponseCode::NXDomain),
    ] {
        let q = query(name, RecordType::A);
        c.write_all(&u16::try_from(q.len()).expect("len").to_be_bytes())
            .await
            .expect("write");
        c.write_all(&q).await.expect("write");
        let n = c.read_u16().await.expect("len");
        let mut body = vec![0u8; usize::from(n)];
        c.read_exact(&mut body).await.expect("body");
        let m = Message::from_vec(&body).expect("decode");
        assert_eq!(m.metadata.response_code, code, "{name}");
    }
    assert_eq!(*s.stub.asked.lock().expect("log"), vec!["allowed.test"]);
}

#[tokio::test]
async fn live_policy_change_applies_to_the_next_question() {
    let s = setup(vec![], Limits::default()).await;
    assert_eq!(
        ask_udp(s.udp, "allowed.test.", RecordType::A)
            .await
            .metadata
            .response_code,
        ResponseCode::NXDomain
    );
    let spec = NetworkPolicySpec {
        rules: vec![allow("allowed.test")],
        ..Default::default()
    };
    s.net
        .set_policy(NetworkPolicy::from_spec(&spec, 2).expect("policy"));
    assert_eq!(
        a_records(&ask_udp(s.udp, "allowed.test.", RecordType::A).await).len(),
        2
    );
}

#[tokio::test]
async fn the_query_rate_is_capped_per_sandbox() {
    // A burst of 3 that refills once in 1000 s: the fourth question inside this test is refused.
    let limits = Limits {
        dns_burst: 3,
        dns_per_sec: 0.001,
        ..Limits::default()
    };
    let s = setup(vec![allow("allowed.test")], limits).await;
    for _ in 0..3 {
        assert_eq!(
            ask_udp(s.udp, "denied.test.", RecordType::A)
                .await
                .metadata
                .response_code,
            ResponseCode::NXDomain
        );
    }
    for _ in 0..3 {
        assert_eq!(
            ask_udp(s.udp, "allowed.test.", RecordType::A)
                .await
                .metadata
                .response_code,
            ResponseCode::Refused
        );
    }
    assert!(
        s.stub.asked.lock().expect("log").is_empty(),
        "refused questions are not forwarded"
    );
}

#[tokio::test]
async fn malformed_messages_do_not_stop_the_server() {
    let s = setup(vec![allow("allowed.test")], Limits::default()).await;
    let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    sock.send_to(&[1, 2, 3], s.udp).await.expect("send");
    let mut junk = vec![0xAB, 0xCD, 0x01, 0x00, 0x00, 0x01];
    junk.extend_from_slice(&[0xFF; 40]);
    sock.send_to(&junk, s.udp).await.expect("send");
    let mut buf = [0u8; 512];
    let (n, _) = tokio::time::timeout(Duration::from_secs(10), sock.recv_from(&mut buf))
        .await
        .expect("answer")
        .expect("recv");
    let m = Message::from_vec(&buf[..n]).expect("decode");
    assert_eq!(
        (m.metadata.id, m.metadata.response_code),
        (0xABCD, ResponseCode::FormErr)
    );
    assert_eq!(
        a_records(&ask_udp(s.udp, "allowed.test.", RecordType::A).await).len(),
        2
    );
}
