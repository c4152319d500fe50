//! A client of the OCI distribution protocol (pull side): manifests and blobs over HTTP/1.1
//! (TLS with rustls on ring), the `WWW-Authenticate` challenge flow for basic and bearer
//! auth, redirects to blob storage (without the registry's credentials). ADR 0105.

use crate::digest::Digest;
use crate::error::{OciError, Result};
use crate::manifest::{ACCEPT, MAX_DOCUMENT};
use crate::reference::Reference;
use crate::store::BlobWriter;
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::{header, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use std::sync::Mutex;

type Http = Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// A user name and password (or token) for a registry.
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credentials({}, <redacted>)", self.username)
    }
}

impl Credentials {
    fn basic(&self) -> String {
        let raw = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(raw)
        )
    }
}

/// One repository of one registry.
pub struct Registry {
    http: Http,
    base: String,
    repo: String,
    creds: Option<Credentials>,
    /// The `Authorization` value that last worked (a bearer token or basic).
    auth: Mutex<Option<String>>,
}

const USER_AGENT: &str = concat!("threadbox/", env!("CARGO_PKG_VERSION"));

/// A `WWW-Authenticate` challenge: the scheme and its parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub scheme: String,
    pub params: Vec<(String, String)>,
}

impl Challenge {
    pub fn parse(s: &str) -> Option<Challenge> {
        let s = s.trim();
        let (scheme, rest) = s.split_once(' ').unwrap_or((s, ""));
        let mut params = Vec::new();
        let b = rest.as_bytes();
        let mut i = 0;
        while i < b.len() {
            while i < b.len() && (b[i] == b',' || b[i] == b' ') {
                i += 1;
            }
            let ks = i;
            while i < b.len() && b[i] != b'=' {
                i += 1;
            }
            if i >= b.len() {
                break;
            }
            let key = rest[ks..i].trim().to_ascii_lowercase();
            i += 1;
            let mut val = String::new();
            if i < b.len() && b[i] == b'"' {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    if b[i] == b'\\' && i + 1 < b.len() {
                        i += 1;
                    }
                    val.push(b[i] as char);
                    i += 1;
                }
                i += 1;
            } else {
                let vs = i;
                while i < b.len() && b[i] != b',' {
                    i += 1;
                }
                val = rest[vs..i].trim().to_string();
            }
            params.push((key, val));
        }
        Some(Challenge {
            scheme: scheme.to_ascii_lowercase(),
            params,
        })
    }

    pub fn param(&self, k: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }
}

fn pct(s: &str) -> String {
    let mut o = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            o.push(b as char);
        } else {
            o.push_str(&format!("%{b:02X}"));
        }
    }
    o
}

fn host_of(url: &str) -> &str {
    let rest = url.split_once("://").map(|x| x.1).unwrap_or(url);
    rest.split('/').next().unwrap_or("")
}

impl Registry {
    /// A client for `r`'s repository. Loopback registries are spoken to over plain HTTP
    /// (as Docker does), as are those `insecure` names; all others over HTTPS only.
    pub fn new(r: &Reference, creds: Option<Credentials>, insecure: bool) -> Result<Registry> {
        let plain = insecure || r.is_loopback();
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let conn = if plain {
            let cfg = rustls::ClientConfig::builder()
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth();
            builder
                .with_tls_config(cfg)
                .https_or_http()
                .enable_http1()
                .build()
        } else {
            builder
                .with_native_roots()
                .map_err(|e| OciError::Registry(format!("no CA certificates on this host: {e}")))?
                .https_only()
                .enable_http1()
                .build()
        };
        let http = Client::builder(hyper_util::rt::TokioExecutor::new()).build(conn);
        let scheme = if plain { "http" } else { "https" };
        Ok(Registry {
            http,
            base: format!("{scheme}://{}", r.api_host()),
            repo: r.repository.clone(),
            creds,
            auth: Mutex::new(None),
        })
    }

    fn current_auth(&self) -> Option<String> {
        self.auth.lock().ok().and_then(|a| a.clone())
    }

    fn set_auth(&self, v: String) {
        if let Ok(mut a) = self.auth.lock() {
            *a = Some(v);
        }
    }

    async fn raw_get(
        &self,
        url: &str,
        accept: Option<&str>,
        auth: Option<&str>,
    ) -> Result<Response<Incoming>> {
        let mut req = Request::get(url).header(header::USER_AGENT, USER_AGENT);
        if let Some(a) = accept {
            req = req.header(header::ACCEPT, a);
        }
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| OciError::Invalid(format!("request {url}: {e}")))?;
        self.http
            .request(req)
            .await
            .map_err(|e| OciError::Registry(format!("GET {url}: {e}")))
    }

    /// Answers a challenge: basic with the credentials, or a bearer token from the realm.
    async fn authenticate(&self, ch: &Challenge) -> Result<()> {
        match ch.scheme.as_str() {
            "basic" => {
                let c = self.creds.as_ref().ok_or_else(|| {
                    OciError::Unauthorized(format!(
                        "{} asks for a user name and password",
                        self.base
                    ))
                })?;
                self.set_auth(c.basic());
                Ok(())
            }
            "bearer" => {
                let realm = ch
                    .param("realm")
                    .ok_or_else(|| OciError::Registry("bearer challenge without a realm".into()))?;
                if !(realm.starts_with("https://") || realm.starts_with("http://")) {
                    return Err(OciError::Registry(format!(
                        "token realm {realm:?} is not a URL"
                    )));
                }
                let mut url = realm.to_string();
                let mut sep = if url.contains('?') { '&' } else { '?' };
                if let Some(s) = ch.param("service") {
                    url.push_str(&format!("{sep}service={}", pct(s)));
                    sep = '&';
                }
                let scope = ch
                    .param("scope")
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("repository:{}:pull", self.repo));
                url.push_str(&format!("{sep}scope={}", pct(&scope)));
                let basic = self.creds.as_ref().map(|c| c.basic());
                let resp = self.raw_get(&url, None, basic.as_deref()).await?;
                let st = resp.status();
                let body = read_limited(resp, 64 << 10).await?;
                if st == StatusCode::UNAUTHORIZED || st == StatusCode::FORBIDDEN {
                    return Err(OciError::Unauthorized(format!(
                        "the token service of {} refused: {}",
                        self.base,
                        snippet(&body)
                    )));
                }
                if !st.is_success() {
                    return Err(OciError::Registry(format!(
                        "token service answered {st}: {}",
                        snippet(&body)
                    )));
                }
                #[derive(serde::Deserialize)]
                struct Tok {
                    token: Option<String>,
                    access_token: Option<String>,
                }
                let t: Tok = serde_json::from_slice(&body)
                    .map_err(|e| OciError::Registry(format!("token answer is not JSON: {e}")))?;
                let tok = t
                    .token
                    .or(t.access_token)
                    .ok_or_else(|| OciError::Registry("token answer without a token".into()))?;
                self.set_auth(format!("Bearer {tok}"));
                Ok(())
            }
            other => Err(OciError::Registry(format!(
                "unsupported auth scheme {other:?}"
            ))),
        }
    }

    /// GET `path` of the registry with auth and redirects.
    async fn get(&self, path: &str, accept: Option<&str>) -> Result<Response<Incoming>> {
        let mut url = format!("{}{}", self.base, path);
        let reg_host = host_of(&self.base).to_string();
        let mut retried = false;
        for _ in 0..8 {
            let ours = host_of(&url) == reg_host;
            // Credentials go to the registry only, never to the storage a redirect names.
            let auth = if ours { self.current_auth() } else { None };
            let resp = self.raw_get(&url, accept, auth.as_deref()).await?;
            let st = resp.status();
            if st == StatusCode::UNAUTHORIZED && ours && !retried {
                retried = true;
                let ch = resp
                    .headers()
                    .get(header::WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .and_then(Challenge::parse)
                    .ok_or_else(|| {
                        OciError::Unauthorized(format!("{} refused without a challenge", self.base))
                    })?;
                self.authenticate(&ch).await?;
                continue;
            }
            if st.is_redirection() {
                let loc = resp
                    .headers()
                    .get(header::LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| OciError::Registry(format!("{st} without a Location")))?;
                url = if loc.starts_with("http://") || loc.starts_with("https://") {
                    loc.to_string()
                } else if loc.starts_with('/') {
                    let scheme = url.split_once("://").map(|x| x.0).unwrap_or("https");
                    format!("{scheme}://{}{loc}", host_of(&url))
                } else {
                    return Err(OciError::Registry(format!("odd redirect {loc:?}")));
                };
                continue;
            }
            if st == StatusCode::UNAUTHORIZED || st == StatusCode::FORBIDDEN {
                return Err(OciError::Unauthorized(format!(
                    "{} refused access to {} ({st})",
                    self.base, self.repo
                )));
            }
            if st == StatusCode::NOT_FOUND {
                return Err(OciError::NotFound(format!(
                    "{}: {} not found",
                    self.base, path
                )));
            }
            if !st.is_success() {
                let body = read_limited(resp, 4096).await.unwrap_or_default();
                return Err(OciError::Registry(format!(
                    "GET {path}: {st}: {}",
                    snippet(&body)
                )));
            }
            return Ok(resp);
        }
        Err(OciError::Registry(format!(
            "GET {path}: too many redirects"
        )))
    }

    /// The manifest (or index) `reference` (a tag or a digest): its bytes, its content
    /// type and its digest. A digest reference is checked against the bytes.
    pub async fn manifest(&self, reference: &str) -> Result<(Vec<u8>, Option<String>, Digest)> {
        let resp = self
            .get(
                &format!("/v2/{}/manifests/{}", self.repo, reference),
                Some(ACCEPT),
            )
            .await?;
        let ct = resp
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = read_limited(resp, MAX_DOCUMENT).await?;
        let d = Digest::of(&body);
        if reference.starts_with("sha256:") && d.as_str() != reference {
            return Err(OciError::Integrity(format!(
                "manifest {reference} arrived with digest {d}: refused"
            )));
        }
        Ok((body, ct, d))
    }

    /// A small blob (a config) into memory, verified.
    pub async fn blob_bytes(&self, d: &Digest, size: u64) -> Result<Vec<u8>> {
        if size > MAX_DOCUMENT {
            return Err(OciError::Invalid(format!(
                "blob {d} of {size} bytes is too large a document"
            )));
        }
        let resp = self
            .get(&format!("/v2/{}/blobs/{d}", self.repo), None)
            .await?;
        let body = read_limited(resp, MAX_DOCUMENT).await?;
        let got = Digest::of(&body);
        if got != *d || body.len() as u64 != size {
            return Err(OciError::Integrity(format!(
                "blob {d} arrived as {got} ({} bytes): refused",
                body.len()
            )));
        }
        Ok(body)
    }

    /// Opens the blob `d` for streaming: its chunks come from [`BlobStream::next`].
    pub async fn blob_stream(&self, d: &Digest) -> Result<BlobStream> {
        let resp = self
            .get(&format!("/v2/{}/blobs/{d}", self.repo), None)
            .await?;
        Ok(BlobStream {
            digest: d.clone(),
            body: resp.into_body(),
            got: 0,
        })
    }

    /// Streams the blob `d` into `w` (which checks size and digest on commit), calling
    /// `progress` with each chunk's length.
    pub async fn blob_into(
        &self,
        d: &Digest,
        mut w: BlobWriter,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<()> {
        let mut s = self.blob_stream(d).await?;
        while let Some(data) = s.next().await? {
            w.write(&data)?;
            progress(data.len() as u64);
        }
        w.commit()
    }
}

/// The body of a blob as it arrives (unverified: whoever reads it checks its digest).
pub struct BlobStream {
    digest: Digest,
    body: Incoming,
    got: u64,
}

impl BlobStream {
    /// The next chunk; `None` at the end of the body.
    pub async fn next(&mut self) -> Result<Option<Bytes>> {
        while let Some(frame) = self.body.frame().await {
            let frame = frame.map_err(|e| {
                OciError::Integrity(format!(
                    "blob {}: the stream broke after {} bytes: {e}",
                    self.digest, self.got
                ))
            })?;
            if let Ok(data) = frame.into_data() {
                if data.is_empty() {
                    continue;
                }
                self.got += data.len() as u64;
                return Ok(Some(data));
            }
        }
        Ok(None)
    }
}

async fn read_limited(resp: Response<Incoming>, max: u64) -> Result<Vec<u8>> {
    let mut body = resp.into_body();
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| OciError::Registry(format!("reading an answer: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if out.len() as u64 + data.len() as u64 > max {
                return Err(OciError::Registry(format!(
                    "answer larger than {max} bytes"
                )));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

fn snippet(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse() {
        let c = Challenge::parse(
            r#"Bearer realm="https://auth.example/token",service="reg",scope="repository:a/b:pull,push""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.param("realm"), Some("https://auth.example/token"));
        assert_eq!(c.param("scope"), Some("repository:a/b:pull,push"));
        let c = Challenge::parse(r#"Basic realm="Registry Realm""#).unwrap();
        assert_eq!(c.scheme, "basic");
        assert_eq!(pct("repository:a/b:pull"), "repository%3Aa%2Fb%3Apull");
    }
}
