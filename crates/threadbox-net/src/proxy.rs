//! The accept loop of one sandbox's redirect listener (research/network.md §8.5): learn the
//! name (SNI, Host, or the DNS pins of the original address), decide, dial **the name** with
//! the daemon's own resolution (or the original address for CIDR rules and pins), check the
//! floor on every address dialled, then splice. A policy swap closes connections it revokes.

use crate::peek::{self, Peeked};
use crate::policy::{FloorHit, NetworkPolicy, RuleMatch};
use crate::sandbox::SandboxNet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use threadbox_api::network::{NetAction, NetLogEntry, NetLogKind, NetProtocol, NetReason};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// Splice buffer size, each way (measured best in research/network.md §4).
pub const SPLICE_BUF: usize = 64 * 1024;

/// Where the sandbox meant to go: `SO_ORIGINAL_DST` of the accepted socket, from
/// `threadbox-sys::net::original_dst` in the daemon, or a table in tests.
pub type OriginalDst = Arc<dyn Fn(&TcpStream) -> io::Result<SocketAddr> + Send + Sync>;

/// What the decision says to dial.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Resolve this name with the daemon's resolver and dial the result.
    ByName {
        name: String,
        m: RuleMatch,
    },
    /// Dial the original address (CIDR rule, or a pin of it allowed by name).
    ByIp {
        name: Option<String>,
        m: RuleMatch,
    },
    Deny {
        reason: NetReason,
        m: RuleMatch,
    },
}

/// The pure part of the decision: no resolution, no floor (those happen when dialling).
pub fn plan(policy: &NetworkPolicy, od: SocketAddr, name: Option<&str>, pins: &[String]) -> Plan {
    let port = od.port();
    if let Some(name) = name {
        let m = policy.match_name(name, port);
        if m.action == NetAction::Allow {
            return Plan::ByName {
                name: name.to_string(),
                m,
            };
        }
        if let Some(c) = policy.cidr_allows(od.ip(), port) {
            return Plan::ByIp {
                name: Some(name.to_string()),
                m: c,
            };
        }
        let reason = if m.rule.is_some() {
            NetReason::RuleDeny
        } else {
            NetReason::DefaultDeny
        };
        return Plan::Deny { reason, m };
    }
    for pin in pins {
        let m = policy.match_name(pin, port);
        if m.action == NetAction::Allow {
            return Plan::ByIp {
                name: Some(pin.clone()),
                m,
            };
        }
    }
    let m = policy.match_ip(od.ip(), port);
    match (m.action, m.rule) {
        (NetAction::Allow, _) => Plan::ByIp { name: None, m },
        (NetAction::Deny, Some(_)) => Plan::Deny {
            reason: NetReason::RuleDeny,
            m,
        },
        (NetAction::Deny, None) => Plan::Deny {
            reason: NetReason::NoName,
            m,
        },
    }
}

/// Serves the redirect listener until the sandbox shuts down.
pub async fn serve(net: Arc<SandboxNet>, listener: TcpListener, original_dst: OriginalDst) {
    let mut shutdown = net.watch_shutdown();
    let own = listener.local_addr().ok();
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::debug!(sandbox = %net.sandbox, error = %e, "egress: accept failed");
                    continue;
                }
            },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let od = original_dst(&stream);
        let Ok(permit) = net.conns.clone().try_acquire_owned() else {
            reset(&stream);
            let port = od.as_ref().map_or(0, SocketAddr::port);
            net.emit(row(
                od.ok().map(|a| a.ip()),
                port,
                None,
                NetReason::ConnLimit,
                NetAction::Deny,
            ));
            continue;
        };
        let net = net.clone();
        tokio::spawn(async move {
            let mut shutdown = net.watch_shutdown();
            tokio::select! {
                _ = connection(&net, stream, od, own) => {}
                _ = shutdown.wait_for(|s| *s) => {}
            }
            drop(permit);
        });
    }
}

fn row(
    ip: Option<IpAddr>,
    port: u16,
    name: Option<String>,
    reason: NetReason,
    decision: NetAction,
) -> NetLogEntry {
    NetLogEntry {
        at_ms: 0,
        sandbox: String::new(),
        kind: NetLogKind::Tcp,
        name,
        ip: ip.map(|i| i.to_string()),
        port,
        bytes_up: 0,
        bytes_down: 0,
        decision,
        reason,
        rule: None,
        name_ip_mismatch: false,
        qtype: None,
        answers: None,
    }
}

/// Closes with RST, so a denied raw TCP client sees "connection reset" at once.
fn reset(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Reads until the peek function decides, the buffer is full, the time is up or EOF.
async fn peek_name(
    net: &SandboxNet,
    stream: &mut TcpStream,
    mode: NetProtocol,
    buf: &mut Vec<u8>,
) -> Option<String> {
    let f: fn(&[u8]) -> Peeked = match mode {
        NetProtocol::Tls => peek::client_hello_sni,
        NetProtocol::Http => peek::http_host,
        NetProtocol::Tcp => return None,
    };
    let deadline = tokio::time::Instant::now() + net.limits.peek_timeout;
    let mut chunk = vec![0u8; 4096];
    loop {
        match f(buf) {
            Peeked::Name(n) => return Some(n),
            Peeked::NoName | Peeked::NotThis => return None,
            Peeked::NeedMore => {}
        }
        if buf.len() >= net.limits.peek_bytes {
            return None;
        }
        let room = (net.limits.peek_bytes - buf.len()).min(chunk.len());
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk[..room])).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => return None,
        }
    }
}

async fn deny(stream: &mut TcpStream, mode: NetProtocol, reason: NetReason, name: Option<&str>) {
    match mode {
        NetProtocol::Http => {
            let body = serde_json_line(reason, name);
            let head = format!(
                "HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        // A fatal access_denied (49) alert, in a TLS 1.2-versioned record.
        NetProtocol::Tls => {
            let _ = stream.write_all(&[21, 3, 3, 0, 2, 2, 49]).await;
            let _ = stream.shutdown().await;
        }
        NetProtocol::Tcp => reset(stream),
    }
}

fn serde_json_line(reason: NetReason, name: Option<&str>) -> String {
    let body = serde_json::json!({ "error": "egress_denied", "reason": reason, "host": name });
    format!("{body}\n")
}

/// Dials each candidate that passes the floor, in order, until one answers.
async fn dial(
    net: &SandboxNet,
    candidates: &[IpAddr],
    port: u16,
) -> Result<(TcpStream, IpAddr), NetReason> {
    let floor = net.floor();
    let mut reason = NetReason::Floor;
    let mut any_allowed = false;
    for &ip in candidates {
        match floor.check(ip, Some(port)) {
            Err(FloorHit::DaemonPort) => {
                reason = NetReason::DaemonPort;
                continue;
            }
            Err(_) => continue,
            Ok(()) => {}
        }
        any_allowed = true;
        let addr = SocketAddr::new(crate::policy::canonical(ip), port);
        if let Ok(Ok(s)) =
            tokio::time::timeout(net.limits.dial_timeout, TcpStream::connect(addr)).await
        {
            return Ok((s, addr.ip()));
        }
    }
    Err(if any_allowed {
        NetReason::DialFailed
    } else {
        reason
    })
}

async fn connection(
    net: &SandboxNet,
    mut client: TcpStream,
    od: io::Result<SocketAddr>,
    own: Option<SocketAddr>,
) {
    let od = match od {
        Ok(a) if Some(a) != own => a,
        other => {
            let ip = other.as_ref().ok().map(SocketAddr::ip);
            reset(&client);
            net.emit(row(ip, 0, None, NetReason::Loop, NetAction::Deny));
            return;
        }
    };
    let port = od.port();
    let mut policy_rx = net.watch_policy();
    let policy = policy_rx.borrow_and_update().clone();
    let mode = policy.peek_for_port(port);
    let mut replay = Vec::new();
    let name = peek_name(net, &mut client, mode, &mut replay).await;
    let od_v4 = match crate::policy::canonical(od.ip()) {
        IpAddr::V4(v4) => Some(v4),
        IpAddr::V6(_) => None,
    };
    let pins = od_v4.map(|ip| net.pins_for(ip)).unwrap_or_default();
    // Judge against the policy in force now: it may have changed while we peeked.
    let policy = policy_rx.borrow_and_update().clone();
    let decided = plan(&policy, od, name.as_deref(), &pins);
    let mut entry = row(
        Some(od.ip()),
        port,
        name.clone(),
        NetReason::RuleAllow,
        NetAction::Allow,
    );
    let (mut upstream, m) = match &decided {
        Plan::Deny { reason, m } => {
            deny(&mut client, mode, *reason, name.as_deref()).await;
            entry.decision = NetAction::Deny;
            entry.reason = *reason;
            entry.rule = m.rule;
            net.emit(entry);
            return;
        }
        Plan::ByName { name, m } => {
            entry.name_ip_mismatch = !pins.iter().any(|p| p == name);
            let candidates = match net.resolver.lookup_v4(name).await {
                Ok(a) => a
                    .into_iter()
                    .map(|(ip, _)| IpAddr::V4(ip))
                    .collect::<Vec<_>>(),
                Err(_) => {
                    deny(&mut client, mode, NetReason::ResolveFailed, Some(name)).await;
                    entry.decision = NetAction::Deny;
                    entry.reason = NetReason::ResolveFailed;
                    entry.rule = m.rule;
                    net.emit(entry);
                    return;
                }
            };
            match dial(net, &candidates, port).await {
                Ok((s, ip)) => {
                    entry.ip = Some(ip.to_string());
                    (s, *m)
                }
                Err(reason) => {
                    deny(&mut client, mode, reason, Some(name)).await;
                    entry.decision = NetAction::Deny;
                    entry.reason = reason;
                    entry.rule = m.rule;
                    net.emit(entry);
                    return;
                }
            }
        }
        Plan::ByIp { name: pinned, m } => {
            entry.name = pinned.clone().or(entry.name);
            match dial(net, &[od.ip()], port).await {
                Ok((s, _)) => (s, *m),
                Err(reason) => {
                    deny(&mut client, mode, reason, name.as_deref()).await;
                    entry.decision = NetAction::Deny;
                    entry.reason = reason;
                    entry.rule = m.rule;
                    net.emit(entry);
                    return;
                }
            }
        }
    };
    entry.rule = m.rule;
    entry.reason = if m.rule.is_some() {
        NetReason::RuleAllow
    } else {
        NetReason::DefaultAllow
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let up = Arc::new(AtomicU64::new(0));
    let down = Arc::new(AtomicU64::new(0));
    // Secrets (ADR 0068): TLS dialled by name for a host a secret names is intercepted.
    let intercept = match (&decided, mode) {
        (Plan::ByName { name, .. }, NetProtocol::Tls) => net.intercept_for(name),
        _ => None,
    };
    if let (Some(i), Some(sni)) = (intercept, name.as_deref()) {
        let replay = std::mem::take(&mut replay);
        let swaps = i.swaps_for(sni);
        {
            let session = i.mitm.serve(
                &net.sandbox,
                sni,
                &swaps,
                &mut client,
                replay,
                &mut upstream,
                &up,
                &down,
                i.host_switch,
            );
            tokio::pin!(session);
            let mut shutdown = net.watch_shutdown();
            loop {
                tokio::select! {
                    r = &mut session => {
                        if let Err(e) = r {
                            tracing::debug!(sandbox = %net.sandbox, host = sni, "egress: intercepted session: {e}");
                        }
                        break;
                    }
                    _ = shutdown.wait_for(|s| *s) => break,
                    // Like a spliced connection: a new policy that refuses it closes it.
                    changed = policy_rx.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let p = policy_rx.borrow_and_update().clone();
                        if let Plan::Deny { .. } = plan(&p, od, name.as_deref(), &pins) {
                            entry.reason = NetReason::PolicyRevoked;
                            break;
                        }
                    }
                }
            }
        }
        if entry.reason == NetReason::PolicyRevoked {
            reset(&client);
            reset(&upstream);
        }
        entry.bytes_up = up.load(Ordering::Relaxed);
        entry.bytes_down = down.load(Ordering::Relaxed);
        net.emit(entry);
        return;
    }
    if upstream.write_all(&replay).await.is_err() {
        entry.reason = NetReason::DialFailed;
        entry.decision = NetAction::Deny;
        net.emit(entry);
        return;
    }
    up.fetch_add(replay.len() as u64, Ordering::Relaxed);
    {
        let mut a = Counted {
            inner: &mut client,
            n: &up,
        };
        let mut b = Counted {
            inner: &mut upstream,
            n: &down,
        };
        let splice =
            tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, SPLICE_BUF, SPLICE_BUF);
        tokio::pin!(splice);
        loop {
            tokio::select! {
                _ = &mut splice => break,
                changed = policy_rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let p = policy_rx.borrow_and_update().clone();
                    if let Plan::Deny { .. } = plan(&p, od, name.as_deref(), &pins) {
                        entry.reason = NetReason::PolicyRevoked;
                        break;
                    }
                }
            }
        }
    }
    if entry.reason == NetReason::PolicyRevoked {
        reset(&client);
        reset(&upstream);
    }
    entry.bytes_up = up.load(Ordering::Relaxed);
    entry.bytes_down = down.load(Ordering::Relaxed);
    net.emit(entry);
}

/// Counts the bytes read through it; writes pass straight on.
struct Counted<'a> {
    inner: &'a mut TcpStream,
    n: &'a AtomicU64,
}

impl AsyncRead for Counted<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut *self.inner).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        self.n.fetch_add(read as u64, Ordering::Relaxed);
        r
    }
}

impl AsyncWrite for Counted<'_> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.inner).poll_shutdown(cx)
    }
}
