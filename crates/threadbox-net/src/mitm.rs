//! TLS interception for the hosts a secret names, and only those (issue 13 scope 4,
//! ADR 0068). The daemon holds a CA (key on the host only, 0600); the sandbox trusts it
//! through its CA bundle. For an intercepted host the proxy terminates the sandbox's TLS
//! with a leaf minted for that name (cached), opens its own TLS to the upstream verified
//! against the host's roots, and reads the sandbox's HTTP/1.1 requests one by one: each must
//! name the intercepted host (a switched Host ends the session, nothing more is sent) and
//! the placeholders in the secret's header are swapped (`secrets.rs`). Responses are passed
//! back unread. ALPN offers `http/1.1` only, so a client that insists on h2 is refused by
//! the handshake rather than passed through unswapped.
//!
//! Every other TLS connection is spliced as before, with no CA involved.

use crate::secrets::{self, Body, Refused, SecretSwap};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

/// The common name of every threadbox egress CA (its DN is rebuilt from this on load).
const CA_NAME: &str = "threadbox egress CA";
/// How long a minted leaf is valid, and after how long the cache mints a new one.
const LEAF_VALID: Duration = Duration::from_secs(7 * 24 * 3600);
const LEAF_REFRESH: Duration = Duration::from_secs(24 * 3600);
/// Largest request head and chunk-size line read.
const MAX_HEAD: usize = 64 * 1024;
const MAX_LINE: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum MitmError {
    #[error("certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("tls: {0}")]
    Tls(#[from] rustls::Error),
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("bad PEM: {0}")]
    Pem(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn ca_params() -> Result<CertificateParams, MitmError> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    dn.push(DnType::OrganizationName, "threadbox");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(p)
}

/// A new CA: (certificate PEM, private key PEM). The caller stores the key 0600.
pub fn generate_ca() -> Result<(String, String), MitmError> {
    let key = KeyPair::generate()?;
    let mut p = ca_params()?;
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::days(1);
    p.not_after = now + time::Duration::days(3650);
    let cert = p.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Every certificate in a PEM bundle (other blocks skipped).
pub fn certs_from_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, MitmError> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| MitmError::Pem(e.to_string()))
}

/// The daemon's interceptor: its CA, the leaves minted so far, the upstream TLS config.
pub struct Mitm {
    ca_key: KeyPair,
    /// The CA as an issuer: parameters rebuilt from [`CA_NAME`] with the stored key, so
    /// leaves name the stored certificate's subject and key identifier.
    ca: rcgen::Certificate,
    leaves: Mutex<HashMap<String, (Instant, Arc<rustls::ServerConfig>)>>,
    upstream: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for Mitm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Mitm")
    }
}

impl Mitm {
    /// From the CA key (PEM) and the roots upstreams are verified against.
    pub fn new(ca_key_pem: &str, roots: &[CertificateDer<'static>]) -> Result<Self, MitmError> {
        let ca_key = KeyPair::from_pem(ca_key_pem)?;
        let ca = ca_params()?.self_signed(&ca_key)?;
        let mut store = rustls::RootCertStore::empty();
        let (_, ignored) = store.add_parsable_certificates(roots.iter().cloned());
        if ignored > 0 {
            tracing::debug!(ignored, "egress: upstream roots that did not parse");
        }
        let mut upstream = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(store)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Mitm {
            ca_key,
            ca,
            leaves: Mutex::new(HashMap::new()),
            upstream: Arc::new(upstream),
        })
    }

    /// The server side for `host`: a leaf for that name signed by the CA (cached).
    fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, MitmError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, c)) = leaves.get(host) {
            if at.elapsed() < LEAF_REFRESH {
                return Ok(c.clone());
            }
        }
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(vec![host.to_string()])?;
        p.distinguished_name = DistinguishedName::new();
        p.distinguished_name.push(DnType::CommonName, host);
        let now = time::OffsetDateTime::now_utc();
        p.not_before = now - time::Duration::hours(1);
        p.not_after = now + time::Duration::seconds(LEAF_VALID.as_secs() as i64);
        p.use_authority_key_identifier_extension = true;
        p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let cert = p.signed_by(&key, &self.ca, &self.ca_key)?;
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], der)?;
        // HTTP/1.1 only: the swap reads HTTP/1 heads (h2 clients fall back or fail).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() > 4096 {
            leaves.clear();
        }
        leaves.insert(host.to_string(), (Instant::now(), config.clone()));
        Ok(config)
    }

    /// Serves one intercepted connection for `sni` until either side closes: `replay` is
    /// what the proxy already read from `client` (the ClientHello). Bytes counted as the
    /// plaintext carried each way.
    #[allow(clippy::too_many_arguments)]
    pub async fn serve<C, U>(
        &self,
        sandbox: &str,
        sni: &str,
        swaps: &[SecretSwap],
        client: C,
        replay: Vec<u8>,
        upstream: U,
        up: &AtomicU64,
        down: &AtomicU64,
        host_switch: bool,
    ) -> Result<(), MitmError>
    where
        C: AsyncRead + AsyncWrite + Unpin,
        U: AsyncRead + AsyncWrite + Unpin,
    {
        let acceptor = tokio_rustls::TlsAcceptor::from(self.server_config(sni)?);
        let client = acceptor
            .accept(Prefixed {
                pre: replay,
                pos: 0,
                inner: client,
            })
            .await?;
        let name = ServerName::try_from(sni.to_string())
            .map_err(|e| MitmError::Pem(format!("server name {sni:?}: {e}")))?;
        let connector = tokio_rustls::TlsConnector::from(self.upstream.clone());
        let upstream = connector.connect(name, upstream).await?;
        let (mut cr, mut cw) = tokio::io::split(client);
        let (mut ur, mut uw) = tokio::io::split(upstream);
        let responses = async {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let n = ur.read(&mut buf).await?;
                if n == 0 {
                    break;
                }
                cw.write_all(&buf[..n]).await?;
                down.fetch_add(n as u64, Ordering::Relaxed);
            }
            cw.shutdown().await
        };
        let requests = async {
            let r = requests(sandbox, sni, swaps, &mut cr, &mut uw, up, host_switch).await;
            let _ = uw.shutdown().await;
            r
        };
        tokio::pin!(responses, requests);
        tokio::select! {
            r = &mut requests => match r {
                // The client finished: let the last response through.
                Ok(()) => { let _ = responses.await; Ok(()) }
                Err(e) => Err(e),
            },
            r = &mut responses => r.map_err(MitmError::from),
        }
    }
}

/// Reads more into `buf`; `false` at EOF.
async fn fill<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> io::Result<bool> {
    let mut chunk = [0u8; 8192];
    let n = r.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n > 0)
}

fn eof() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the client closed mid-request",
    )
}

/// Forwards exactly `n` bytes, starting with those already in `buf`.
async fn forward<R, W>(
    r: &mut R,
    w: &mut W,
    buf: &mut Vec<u8>,
    mut n: u64,
    up: &AtomicU64,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    while n > 0 {
        if buf.is_empty() && !fill(r, buf).await? {
            return Err(eof());
        }
        let take = (buf.len() as u64).min(n) as usize;
        w.write_all(&buf[..take]).await?;
        up.fetch_add(take as u64, Ordering::Relaxed);
        buf.drain(..take);
        n -= take as u64;
    }
    Ok(())
}

/// One CRLF-terminated line from `buf` (filled as needed), with its CRLF.
async fn line<R: AsyncRead + Unpin>(r: &mut R, buf: &mut Vec<u8>) -> io::Result<Vec<u8>> {
    loop {
        if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
            return Ok(buf.drain(..i + 2).collect());
        }
        if buf.len() > MAX_LINE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "chunk line too long",
            ));
        }
        if !fill(r, buf).await? {
            return Err(eof());
        }
    }
}

/// The request direction: head by head, swapped, bodies passed through by their framing.
async fn requests<R, W>(
    sandbox: &str,
    sni: &str,
    swaps: &[SecretSwap],
    r: &mut R,
    w: &mut W,
    up: &AtomicU64,
    host_switch: bool,
) -> Result<(), MitmError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = Vec::new();
    loop {
        let end = loop {
            if let Some(e) = secrets::head_end(&buf) {
                break e;
            }
            if buf.len() > MAX_HEAD {
                return Err(
                    io::Error::new(io::ErrorKind::InvalidData, "request head too large").into(),
                );
            }
            if !fill(r, &mut buf).await? {
                if buf.is_empty() {
                    return Ok(());
                }
                return Err(eof().into());
            }
        };
        let head: Vec<u8> = buf.drain(..end).collect();
        let rw = match secrets::rewrite_request(&head, sni, swaps) {
            Ok(rw) => rw,
            // The weakened build of the positive control only (`Intercept::host_switch`).
            Err(Refused::HostSwitch(other)) if host_switch => {
                let moved: Vec<SecretSwap> = swaps
                    .iter()
                    .cloned()
                    .map(|mut s| {
                        s.host = other.clone();
                        s
                    })
                    .collect();
                secrets::rewrite_request(&head, &other, &moved).map_err(|_| {
                    MitmError::from(io::Error::new(
                        io::ErrorKind::PermissionDenied,
                        "a malformed request",
                    ))
                })?
            }
            Err(why) => {
                // Nothing of this request is sent: the session ends here.
                let what = match &why {
                    Refused::Malformed => "a malformed request".to_string(),
                    Refused::NoHost => "a request without Host".to_string(),
                    Refused::HostSwitch(h) => format!("a request for {h:?}"),
                };
                tracing::warn!(
                    sandbox,
                    host = sni,
                    "egress: intercepted session refused: {what}"
                );
                return Err(io::Error::new(io::ErrorKind::PermissionDenied, what).into());
            }
        };
        for name in &rw.swapped {
            // The name and host only: never the value or the placeholder.
            tracing::info!(sandbox, secret = %name, host = sni, "egress: secret swapped into a request");
        }
        w.write_all(&rw.head).await?;
        up.fetch_add(rw.head.len() as u64, Ordering::Relaxed);
        match rw.body {
            Body::None => {}
            Body::Length(n) => forward(r, w, &mut buf, n, up).await?,
            Body::Chunked => loop {
                let size_line = line(r, &mut buf).await?;
                w.write_all(&size_line).await?;
                let text = String::from_utf8_lossy(&size_line);
                let hex = text.trim().split(';').next().unwrap_or("").trim();
                let size = u64::from_str_radix(hex, 16)
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))?;
                if size == 0 {
                    // Trailers, up to the blank line.
                    loop {
                        let t = line(r, &mut buf).await?;
                        w.write_all(&t).await?;
                        if t == b"\r\n" {
                            break;
                        }
                    }
                    break;
                }
                forward(r, w, &mut buf, size + 2, up).await?;
            },
            Body::Raw => {
                // An upgrade: no more HTTP to read; the rest passes through unchanged.
                w.write_all(&buf).await?;
                up.fetch_add(buf.len() as u64, Ordering::Relaxed);
                buf.clear();
                let mut chunk = vec![0u8; 16 * 1024];
                loop {
                    let n = r.read(&mut chunk).await?;
                    if n == 0 {
                        return Ok(());
                    }
                    w.write_all(&chunk[..n]).await?;
                    up.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
    }
}

/// A stream that yields `pre` before its inner stream's bytes (the peeked ClientHello).
struct Prefixed<S> {
    pre: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.pre.len() {
            let n = (self.pre.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.pre[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What one sandbox's connections are intercepted with: the daemon's [`Mitm`] and the
/// sandbox's secrets. Set on its `SandboxNet` by the manager.
#[derive(Debug, Clone)]
pub struct Intercept {
    pub mitm: Arc<Mitm>,
    pub swaps: Arc<Vec<SecretSwap>>,
    /// Test-only weakening (ADR 0009, `secrets-any-host`): intercept every host and swap
    /// every secret there. Only a daemon built with `insecure-test-hooks` sets it; it is
    /// the positive control of the "placeholder to another host" cases.
    pub any_host: bool,
    /// Test-only weakening (ADR 0009, `secrets-host-switch`): a request naming another
    /// Host inside an intercepted session is sent (and swapped) instead of ending it; the
    /// positive control of the "Host switched inside a session" case.
    pub host_switch: bool,
}

impl Intercept {
    /// Whether connections for `host` (normalised) are intercepted: a secret names it.
    pub fn covers(&self, host: &str) -> bool {
        self.any_host || self.swaps.iter().any(|s| s.host == host)
    }

    /// The secrets that apply to `host`.
    pub fn swaps_for(&self, host: &str) -> Vec<SecretSwap> {
        self.swaps
            .iter()
            .filter(|s| self.any_host || s.host == host)
            .cloned()
            .map(|mut s| {
                s.host = host.to_string();
                s
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::{TcpListener, TcpStream};

    /// A TLS upstream with its own test CA, recording each request head.
    async fn upstream() -> (
        u16,
        Vec<CertificateDer<'static>>,
        tokio::sync::mpsc::UnboundedReceiver<String>,
    ) {
        let (ca_pem, ca_key) = generate_ca().unwrap();
        let roots = certs_from_pem(ca_pem.as_bytes()).unwrap();
        let m = Mitm::new(&ca_key, &[]).unwrap();
        let cfg = m.server_config("api.test").unwrap();
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (s, _) = l.accept().await.unwrap();
                let acc = tokio_rustls::TlsAcceptor::from(cfg.clone());
                let tx = tx.clone();
                tokio::spawn(async move {
                    let Ok(mut t) = acc.accept(s).await else {
                        return;
                    };
                    let mut buf = Vec::new();
                    loop {
                        if let Some(e) = secrets::head_end(&buf) {
                            let head: Vec<u8> = buf.drain(..e).collect();
                            let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
                            let _ = t
                                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                                .await;
                            continue;
                        }
                        if !fill(&mut t, &mut buf).await.unwrap_or(false) {
                            return;
                        }
                    }
                });
            }
        });
        (port, roots, rx)
    }

    #[tokio::test]
    async fn swaps_on_the_intercepted_host_and_refuses_a_host_switch() {
        let (port, up_roots, mut seen) = upstream().await;
        let (ca_pem, ca_key) = generate_ca().unwrap();
        let mitm = Arc::new(Mitm::new(&ca_key, &up_roots).unwrap());
        let swaps = vec![SecretSwap {
            name: "K".into(),
            host: "api.test".into(),
            header: "Authorization".into(),
            format: "Bearer {}".into(),
            placeholder: "tb_secret_x".into(),
            value: "REAL".into(),
        }];
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_port = l.local_addr().unwrap().port();
        let m2 = mitm.clone();
        tokio::spawn(async move {
            let (c, _) = l.accept().await.unwrap();
            let u = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let (a, b) = (AtomicU64::new(0), AtomicU64::new(0));
            let _ = m2
                .serve("sb", "api.test", &swaps, c, Vec::new(), u, &a, &b, false)
                .await;
        });
        // The sandbox's side: trusts the daemon's CA only.
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(certs_from_pem(ca_pem.as_bytes()).unwrap());
        let cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = TcpStream::connect(("127.0.0.1", proxy_port)).await.unwrap();
        let mut t = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(ServerName::try_from("api.test").unwrap(), tcp)
            .await
            .unwrap();
        t.write_all(b"GET /one HTTP/1.1\r\nHost: api.test\r\nAuthorization: tb_secret_x\r\n\r\n")
            .await
            .unwrap();
        let first = seen.recv().await.unwrap();
        assert!(first.contains("Authorization: Bearer REAL\r\n"), "{first}");
        t.write_all(b"GET /two HTTP/1.1\r\nHost: other.test\r\nAuthorization: tb_secret_x\r\n\r\n")
            .await
            .unwrap();
        let mut rest = Vec::new();
        let _ = t.read_to_end(&mut rest).await;
        // The session ended and the second request never reached the upstream.
        assert!(seen.try_recv().is_err());
    }
}
