//! The per-sandbox DNS server (research/network.md §8.4). Only names some allow rule covers
//! are resolved, through the daemon's [`Resolver`]; every other name gets a local NXDOMAIN and
//! is never sent anywhere. Answers on the floor are dropped (DNS rebinding), AAAA, HTTPS and
//! SVCB get NOERROR with no data (no IPv6, no ECH or h3 hints), and every address answered is
//! pinned to its name for the proxy.

use crate::policy::normalize_name;
use crate::sandbox::SandboxNet;
use async_trait::async_trait;
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use threadbox_api::network::{NetAction, NetLogEntry, NetLogKind, NetReason};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};

/// Answers carry at most this many addresses (keeps every answer well under 512 bytes).
const MAX_ANSWERS: usize = 16;
/// TTLs handed to the sandbox are clamped to this range.
const TTL_MIN: u32 = 5;
const TTL_MAX: u32 = 300;

/// Why the daemon's resolver gave no address.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolveError {
    #[error("the name does not exist")]
    NotFound,
    #[error("resolution failed: {0}")]
    Failed(String),
}

/// How the daemon resolves an allowed name, on the host.
#[async_trait]
pub trait Resolver: Send + Sync {
    /// IPv4 addresses of `name` (normalised) with their TTL in seconds.
    async fn lookup_v4(&self, name: &str) -> Result<Vec<(Ipv4Addr, u32)>, ResolveError>;
}

/// A fixed map of names to addresses: the operator's `--egress-hosts`, and the tests'.
#[derive(Debug, Default, Clone)]
pub struct StaticResolver {
    hosts: HashMap<String, Vec<Ipv4Addr>>,
    ttl: u32,
}

impl StaticResolver {
    pub fn new(ttl: u32) -> Self {
        StaticResolver {
            hosts: HashMap::new(),
            ttl,
        }
    }
    /// Adds `name → addrs`; a name that is not a host name is refused.
    pub fn insert(&mut self, name: &str, addrs: Vec<Ipv4Addr>) -> Result<(), &'static str> {
        self.hosts.insert(normalize_name(name)?, addrs);
        Ok(())
    }
}

#[async_trait]
impl Resolver for StaticResolver {
    async fn lookup_v4(&self, name: &str) -> Result<Vec<(Ipv4Addr, u32)>, ResolveError> {
        match self.hosts.get(name) {
            Some(a) if !a.is_empty() => Ok(a.iter().map(|ip| (*ip, self.ttl.max(1))).collect()),
            _ => Err(ResolveError::NotFound),
        }
    }
}

/// Tries one resolver, then another (a static map in front of the host's resolver).
pub struct ChainResolver(pub Vec<Arc<dyn Resolver>>);

#[async_trait]
impl Resolver for ChainResolver {
    async fn lookup_v4(&self, name: &str) -> Result<Vec<(Ipv4Addr, u32)>, ResolveError> {
        let mut last = ResolveError::NotFound;
        for r in &self.0 {
            match r.lookup_v4(name).await {
                Ok(a) => return Ok(a),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// The host's own resolver through `getaddrinfo` (`tokio::net::lookup_host`): `/etc/hosts`,
/// nsswitch and resolv.conf as the host has them. It does not report TTLs, so every answer
/// gets `ttl`.
#[derive(Debug, Clone)]
pub struct SystemResolver {
    pub ttl: u32,
}

#[async_trait]
impl Resolver for SystemResolver {
    async fn lookup_v4(&self, name: &str) -> Result<Vec<(Ipv4Addr, u32)>, ResolveError> {
        let addrs = tokio::net::lookup_host((name, 0))
            .await
            .map_err(|e| ResolveError::Failed(e.to_string()))?;
        let mut out: Vec<(Ipv4Addr, u32)> = Vec::new();
        for a in addrs {
            if let IpAddr::V4(v4) = a.ip() {
                if !out.iter().any(|(x, _)| *x == v4) {
                    out.push((v4, self.ttl));
                }
            }
        }
        if out.is_empty() {
            return Err(ResolveError::NotFound);
        }
        Ok(out)
    }
}

/// A stub resolver that asks the given name servers (UDP, then TCP when the answer is
/// truncated) and keeps their TTLs. `from_resolv_conf` reads the host's `nameserver` lines.
#[derive(Debug, Clone)]
pub struct UpstreamResolver {
    pub servers: Vec<SocketAddr>,
    pub timeout: Duration,
}

impl UpstreamResolver {
    pub fn from_resolv_conf(path: &Path, timeout: Duration) -> std::io::Result<Self> {
        let text = std::fs::read_to_string(path)?;
        let servers = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("nameserver"))
            .filter_map(|rest| rest.trim().parse::<IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, 53))
            .collect();
        Ok(UpstreamResolver { servers, timeout })
    }

    async fn ask(&self, server: SocketAddr, query: &[u8], id: u16) -> Result<Message, String> {
        let bind: SocketAddr = if server.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let sock = UdpSocket::bind(bind).await.map_err(|e| e.to_string())?;
        sock.connect(server).await.map_err(|e| e.to_string())?;
        sock.send(query).await.map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 4096];
        let reply = loop {
            let n = sock.recv(&mut buf).await.map_err(|e| e.to_string())?;
            match Message::from_vec(&buf[..n]) {
                // Only the answer to our question (a spoofed or stale datagram is skipped).
                Ok(m)
                    if m.metadata.id == id && m.metadata.message_type == MessageType::Response =>
                {
                    break m
                }
                _ => continue,
            }
        };
        if !reply.metadata.truncation {
            return Ok(reply);
        }
        let mut tcp = TcpStream::connect(server)
            .await
            .map_err(|e| e.to_string())?;
        let len = u16::try_from(query.len()).map_err(|e| e.to_string())?;
        tcp.write_all(&len.to_be_bytes())
            .await
            .map_err(|e| e.to_string())?;
        tcp.write_all(query).await.map_err(|e| e.to_string())?;
        let n = tcp.read_u16().await.map_err(|e| e.to_string())?;
        let mut body = vec![0u8; usize::from(n)];
        tcp.read_exact(&mut body).await.map_err(|e| e.to_string())?;
        Message::from_vec(&body).map_err(|e| e.to_string())
    }
}

#[async_trait]
impl Resolver for UpstreamResolver {
    async fn lookup_v4(&self, name: &str) -> Result<Vec<(Ipv4Addr, u32)>, ResolveError> {
        let qname = Name::from_ascii(format!("{name}.")).map_err(|_| ResolveError::NotFound)?;
        let mut msg = Message::query();
        msg.metadata.recursion_desired = true;
        msg.add_query(Query::query(qname, RecordType::A));
        let id = msg.metadata.id;
        let bytes = msg
            .to_vec()
            .map_err(|e| ResolveError::Failed(e.to_string()))?;
        let mut last = ResolveError::Failed("no name server configured".into());
        for &server in &self.servers {
            match tokio::time::timeout(self.timeout, self.ask(server, &bytes, id)).await {
                Err(_) => last = ResolveError::Failed(format!("{server} timed out")),
                Ok(Err(e)) => last = ResolveError::Failed(format!("{server}: {e}")),
                Ok(Ok(reply)) => match reply.metadata.response_code {
                    ResponseCode::NXDomain => return Err(ResolveError::NotFound),
                    ResponseCode::NoError => {
                        // CNAME chains are flattened: every A in the answer belongs to the name.
                        let out: Vec<(Ipv4Addr, u32)> = reply
                            .answers
                            .iter()
                            .filter_map(|r| match &r.data {
                                RData::A(a) => Some((a.0, r.ttl)),
                                _ => None,
                            })
                            .collect();
                        if out.is_empty() {
                            return Err(ResolveError::NotFound);
                        }
                        return Ok(out);
                    }
                    code => last = ResolveError::Failed(format!("{server} answered {code}")),
                },
            }
        }
        Err(last)
    }
}

fn dns_row(
    name: Option<String>,
    qtype: RecordType,
    decision: NetAction,
    reason: NetReason,
) -> NetLogEntry {
    NetLogEntry {
        at_ms: 0,
        sandbox: String::new(),
        kind: NetLogKind::Dns,
        name,
        ip: None,
        port: 53,
        bytes_up: 0,
        bytes_down: 0,
        decision,
        reason,
        rule: None,
        name_ip_mismatch: false,
        qtype: Some(qtype.to_string()),
        answers: None,
    }
}

/// Answers one DNS message from the sandbox; `None` means send nothing (not a query at all).
pub async fn answer(net: &SandboxNet, request: &[u8]) -> Option<Vec<u8>> {
    let req = match Message::from_vec(request) {
        Ok(m) => m,
        Err(_) => {
            // A header we can read gets FORMERR; anything shorter is dropped.
            if request.len() < 12 {
                return None;
            }
            let id = u16::from_be_bytes([request[0], request[1]]);
            return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
                .to_vec()
                .ok();
        }
    };
    if req.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
    resp.metadata.recursion_desired = req.metadata.recursion_desired;
    resp.metadata.recursion_available = true;
    let reply = |mut resp: Message, code| {
        resp.metadata.response_code = code;
        resp.to_vec().ok()
    };
    if !net.take_dns_token() {
        resp.add_queries(req.queries.iter().cloned());
        let qtype = req.queries.first().map_or(RecordType::A, |q| q.query_type);
        net.emit(dns_row(
            None,
            qtype,
            NetAction::Deny,
            NetReason::RateLimited,
        ));
        return reply(resp, ResponseCode::Refused);
    }
    if req.metadata.op_code != OpCode::Query {
        return reply(resp, ResponseCode::NotImp);
    }
    let [q] = req.queries.as_slice() else {
        return reply(resp, ResponseCode::FormErr);
    };
    resp.add_query(q.clone());
    let qtype = q.query_type;
    if q.query_class != DNSClass::IN {
        net.emit(dns_row(None, qtype, NetAction::Deny, NetReason::BadQuery));
        return reply(resp, ResponseCode::Refused);
    }
    let ascii = q.name.to_ascii();
    let Ok(name) = normalize_name(&ascii) else {
        net.emit(dns_row(
            Some(ascii),
            qtype,
            NetAction::Deny,
            NetReason::BadQuery,
        ));
        return reply(resp, ResponseCode::NXDomain);
    };
    let policy = net.policy();
    let Some(m) = policy.name_resolvable(&name) else {
        // Never forwarded: the name does not leave the daemon.
        let reason = if policy.match_name(&name, 443).rule.is_some() {
            NetReason::RuleDeny
        } else {
            NetReason::DefaultDeny
        };
        net.emit(dns_row(Some(name), qtype, NetAction::Deny, reason));
        return reply(resp, ResponseCode::NXDomain);
    };
    let allow_reason = if m.rule.is_some() {
        NetReason::RuleAllow
    } else {
        NetReason::DefaultAllow
    };
    match qtype {
        RecordType::A => {}
        RecordType::PTR => {
            net.emit(dns_row(
                Some(name),
                qtype,
                NetAction::Deny,
                NetReason::NoDataType,
            ));
            return reply(resp, ResponseCode::NXDomain);
        }
        // AAAA (no IPv6 route), HTTPS/SVCB (ECH keys, h3 hints) and the rest: no data.
        _ => {
            net.emit(dns_row(
                Some(name),
                qtype,
                NetAction::Allow,
                NetReason::NoDataType,
            ));
            return reply(resp, ResponseCode::NoError);
        }
    }
    let addrs = match net.resolver.lookup_v4(&name).await {
        Ok(a) => a,
        Err(ResolveError::NotFound) => {
            let mut row = dns_row(Some(name), qtype, NetAction::Allow, allow_reason);
            row.answers = Some(0);
            net.emit(row);
            return reply(resp, ResponseCode::NXDomain);
        }
        Err(e) => {
            tracing::debug!(sandbox = %net.sandbox, %name, error = %e, "dns: resolution failed");
            net.emit(dns_row(
                Some(name),
                qtype,
                NetAction::Deny,
                NetReason::ResolveFailed,
            ));
            return reply(resp, ResponseCode::ServFail);
        }
    };
    let floor = net.floor();
    let kept: Vec<(Ipv4Addr, u32)> = addrs
        .into_iter()
        .filter(|(ip, _)| floor.check(IpAddr::V4(*ip), None).is_ok())
        .take(MAX_ANSWERS)
        .collect();
    if kept.is_empty() {
        // Every address was on the floor: a rebinding attempt or a private name.
        net.emit(dns_row(
            Some(name),
            qtype,
            NetAction::Deny,
            NetReason::Floor,
        ));
        return reply(resp, ResponseCode::NoError);
    }
    let owner = q.name.clone();
    for (ip, ttl) in &kept {
        net.pin(*ip, &name, Duration::from_secs(u64::from(*ttl)));
        let ttl = (*ttl).clamp(TTL_MIN, TTL_MAX);
        resp.add_answer(Record::from_rdata(
            owner.clone(),
            ttl,
            RData::A(hickory_proto::rr::rdata::A(*ip)),
        ));
    }
    let mut row = dns_row(Some(name), qtype, NetAction::Allow, allow_reason);
    row.rule = m.rule;
    row.ip = kept.first().map(|(ip, _)| ip.to_string());
    row.answers = u32::try_from(kept.len()).ok();
    net.emit(row);
    reply(resp, ResponseCode::NoError)
}

/// Serves DNS over UDP on `socket` until the sandbox shuts down. One question at a time per
/// sandbox on purpose: the rate cap already bounds the work, and a slow upstream then delays
/// only this sandbox.
pub async fn serve_udp(net: Arc<SandboxNet>, socket: UdpSocket) {
    let mut shutdown = net.watch_shutdown();
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = tokio::select! {
            r = socket.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::debug!(sandbox = %net.sandbox, error = %e, "dns: udp receive failed");
                    continue;
                }
            },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let out = tokio::select! {
            out = answer(&net, &buf[..n]) => out,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        if let Some(out) = out {
            let _ = socket.send_to(&out, peer).await;
        }
    }
}

/// Serves DNS over TCP on `listener` until the sandbox shuts down.
pub async fn serve_tcp(net: Arc<SandboxNet>, listener: TcpListener) {
    let mut shutdown = net.watch_shutdown();
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::debug!(sandbox = %net.sandbox, error = %e, "dns: tcp accept failed");
                    continue;
                }
            },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let Ok(permit) = net.dns_tcp.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let net = net.clone();
        tokio::spawn(async move {
            let mut shutdown = net.watch_shutdown();
            tokio::select! {
                _ = tcp_conn(&net, stream) => {}
                _ = shutdown.wait_for(|s| *s) => {}
            }
            drop(permit);
        });
    }
}

async fn tcp_conn(net: &SandboxNet, mut stream: TcpStream) {
    let idle = net.limits.dns_tcp_idle;
    loop {
        let Ok(Ok(len)) = tokio::time::timeout(idle, stream.read_u16()).await else {
            return;
        };
        let mut body = vec![0u8; usize::from(len)];
        if !matches!(
            tokio::time::timeout(idle, stream.read_exact(&mut body)).await,
            Ok(Ok(_))
        ) {
            return;
        }
        let Some(out) = answer(net, &body).await else {
            return;
        };
        let Ok(n) = u16::try_from(out.len()) else {
            return;
        };
        if stream.write_all(&n.to_be_bytes()).await.is_err()
            || stream.write_all(&out).await.is_err()
        {
            return;
        }
    }
}
