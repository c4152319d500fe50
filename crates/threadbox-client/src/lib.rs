//! Rust client of the threadbox REST API, over a unix socket (`unix:///path/to.sock`) or
//! TCP (`http://host:port`). One HTTP/1 connection per request: calls are few and long
//! (exec), and a fresh connection never trips over a daemon restart.
#![forbid(unsafe_code)]

mod governance;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use threadbox_api::*;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Default root of the daemon's state; `THREADBOX_ROOT` overrides it.
pub const DEFAULT_ROOT: &str = "/var/lib/threadbox";
/// Name of the daemon's unix socket inside its root.
pub const SOCKET_NAME: &str = "threadbox.sock";
/// TCP address tried when no socket is found.
pub const DEFAULT_HTTP_URL: &str = "http://127.0.0.1:7420";

/// Bound on one NDJSON line of an exec stream.
const MAX_EVENT_LINE_BYTES: usize = 64 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon answered with an error.
    #[error("{message}")]
    Api {
        status: u16,
        code: ErrorCode,
        message: String,
    },
    #[error(
        "cannot connect to the threadbox daemon at {url} (is it running? start it with \
         `threadbox serve`, or set THREADBOX_URL)"
    )]
    Connect {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid daemon URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("the connection to the daemon at {url} failed")]
    Http {
        url: String,
        #[source]
        source: hyper::Error,
    },
    #[error("cannot decode the daemon's response: {0}")]
    Decode(String),
    #[error("cannot read the data to send")]
    Body(#[source] std::io::Error),
}

impl ClientError {
    /// The API error code, when the daemon answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ReqBody = UnsyncBoxBody<Bytes, BoxError>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    Unix(PathBuf),
    /// `host:port`, plus a path prefix without a trailing slash.
    Tcp {
        authority: String,
        prefix: String,
    },
}

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Client {
    url: String,
    endpoint: Endpoint,
    api_key: Option<String>,
    /// Sent as `X-Threadbox-Tenant`: the tenant an operator or admin acts for.
    tenant: Option<String>,
}

/// The URL the CLI talks to: `explicit`, else `THREADBOX_URL`, else the local socket
/// `<THREADBOX_ROOT or /var/lib/threadbox>/threadbox.sock` when it exists, else
/// `http://127.0.0.1:7420`.
pub fn resolve_url(explicit: Option<&str>) -> String {
    if let Some(url) = explicit.filter(|u| !u.is_empty()) {
        return url.to_string();
    }
    if let Some(url) = std::env::var("THREADBOX_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        return url;
    }
    let root = std::env::var_os("THREADBOX_ROOT")
        .filter(|r| !r.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT));
    let socket = root.join(SOCKET_NAME);
    if socket.exists() {
        return format!("unix://{}", socket.display());
    }
    DEFAULT_HTTP_URL.to_string()
}

fn parse_url(url: &str) -> Result<Endpoint> {
    let invalid = |reason: &str| ClientError::InvalidUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    if let Some(path) = url.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(invalid(
                "a unix socket URL needs an absolute path: unix:///path/to.sock",
            ));
        }
        return Ok(Endpoint::Unix(PathBuf::from(path)));
    }
    if let Some(rest) = url.strip_prefix("http://") {
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(invalid("missing host"));
        }
        if authority.contains('@') || authority.contains('?') || authority.contains('#') {
            return Err(invalid("expected http://host:port"));
        }
        let authority = if has_port(authority) {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        return Ok(Endpoint::Tcp {
            authority,
            prefix: prefix.to_string(),
        });
    }
    if url.starts_with("https://") {
        return Err(invalid(
            "https is not supported yet; use http:// on loopback or unix://",
        ));
    }
    Err(invalid("expected unix:///path/to.sock or http://host:port"))
}

fn has_port(authority: &str) -> bool {
    match authority.rfind(':') {
        // `[::1]:7420` has a port, `[::1]` has none.
        Some(i) => !authority[i..].contains(']'),
        None => false,
    }
}

/// Percent-encodes one path segment (a sandbox id or name).
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn user_str(user: User) -> &'static str {
    match user {
        User::User => "user",
        User::Root => "root",
    }
}

fn file_query(path: &str, user: User, extra: &[(&str, &str)]) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("path", path);
    q.append_pair("user", user_str(user));
    for (k, v) in extra {
        q.append_pair(k, v);
    }
    q.finish()
}

fn empty_body() -> ReqBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn full_body(bytes: impl Into<Bytes>) -> ReqBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn json_body<T: Serialize>(value: &T) -> Result<ReqBody> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| ClientError::Decode(format!("cannot encode the request: {e}")))?;
    Ok(full_body(bytes))
}

/// The fallback code of an error response that is not in the API's error shape.
fn code_for_status(status: StatusCode) -> ErrorCode {
    match status.as_u16() {
        400 | 405 | 415 | 422 => ErrorCode::InvalidArgument,
        401 => ErrorCode::Unauthenticated,
        403 => ErrorCode::PermissionDenied,
        404 => ErrorCode::NotFound,
        409 => ErrorCode::Conflict,
        413 => ErrorCode::PayloadTooLarge,
        429 => ErrorCode::QuotaExceeded,
        502..=504 => ErrorCode::Unavailable,
        _ => ErrorCode::Internal,
    }
}

impl Client {
    /// A client of the daemon at `url` (`unix:///path/to.sock` or `http://host:port`).
    pub fn new(url: &str) -> Result<Self> {
        Ok(Client {
            url: url.to_string(),
            endpoint: parse_url(url)?,
            api_key: None,
            tenant: None,
        })
    }

    /// A client of [`resolve_url`]`(explicit)`, authenticating with `THREADBOX_API_KEY`
    /// when it is set.
    pub fn from_env(explicit: Option<&str>) -> Result<Self> {
        let client = Client::new(&resolve_url(explicit))?;
        let key = std::env::var("THREADBOX_API_KEY")
            .ok()
            .filter(|k| !k.is_empty());
        let tenant = std::env::var("THREADBOX_TENANT")
            .ok()
            .filter(|t| !t.is_empty());
        Ok(client.with_api_key(key).with_tenant(tenant))
    }

    /// Acts for `tenant` (`X-Threadbox-Tenant`; the operator's socket and admin keys only).
    pub fn with_tenant(mut self, tenant: Option<String>) -> Self {
        self.tenant = tenant;
        self
    }

    /// Sends `Authorization: Bearer <key>` with every request.
    pub fn with_api_key(mut self, key: Option<String>) -> Self {
        self.api_key = key;
        self
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    // ---- transport ----------------------------------------------------------------

    async fn send(
        &self,
        method: Method,
        path_and_query: &str,
        body: ReqBody,
        content_type: Option<&'static str>,
    ) -> Result<Response<Incoming>> {
        let (uri, host) = match &self.endpoint {
            Endpoint::Unix(_) => (path_and_query.to_string(), "localhost".to_string()),
            Endpoint::Tcp { authority, prefix } => {
                (format!("{prefix}{path_and_query}"), authority.clone())
            }
        };
        let mut builder = Request::builder()
            .method(method)
            .uri(&uri)
            .header(header::HOST, host)
            .header(
                header::USER_AGENT,
                concat!("threadbox-client/", env!("CARGO_PKG_VERSION")),
            );
        if let Some(ct) = content_type {
            builder = builder.header(header::CONTENT_TYPE, ct);
        }
        if let Some(key) = &self.api_key {
            let value = HeaderValue::from_str(&format!("Bearer {key}")).map_err(|_| {
                ClientError::InvalidUrl {
                    url: self.url.clone(),
                    reason: "THREADBOX_API_KEY contains characters not allowed in a header"
                        .to_string(),
                }
            })?;
            builder = builder.header(header::AUTHORIZATION, value);
        }
        if let Some(t) = &self.tenant {
            let value = HeaderValue::from_str(t).map_err(|_| ClientError::InvalidUrl {
                url: self.url.clone(),
                reason: "THREADBOX_TENANT contains characters not allowed in a header".into(),
            })?;
            builder = builder.header("x-threadbox-tenant", value);
        }
        let request = builder.body(body).map_err(|e| ClientError::InvalidUrl {
            url: format!("{}{uri}", self.url),
            reason: e.to_string(),
        })?;
        match &self.endpoint {
            Endpoint::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path)
                    .await
                    .map_err(|source| self.connect_error(source))?;
                self.round_trip(TokioIo::new(stream), request).await
            }
            Endpoint::Tcp { authority, .. } => {
                let stream = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    tokio::net::TcpStream::connect(authority.as_str()),
                )
                .await
                .map_err(|_| {
                    self.connect_error(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connection timed out",
                    ))
                })?
                .map_err(|source| self.connect_error(source))?;
                let _ = stream.set_nodelay(true);
                self.round_trip(TokioIo::new(stream), request).await
            }
        }
    }

    fn connect_error(&self, source: std::io::Error) -> ClientError {
        ClientError::Connect {
            url: self.url.clone(),
            source,
        }
    }

    async fn round_trip<T>(&self, io: T, request: Request<ReqBody>) -> Result<Response<Incoming>>
    where
        T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let http_err = |source| ClientError::Http {
            url: self.url.clone(),
            source,
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(http_err)?;
        // The connection task ends when the response body is consumed or dropped.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let response = sender.send_request(request).await.map_err(http_err)?;
        self.check(response).await
    }

    /// Turns a non-2xx answer into [`ClientError::Api`].
    async fn check(&self, response: Response<Incoming>) -> Result<Response<Incoming>> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        match serde_json::from_slice::<ErrorResponse>(&body) {
            Ok(err) => Err(ClientError::Api {
                status: status.as_u16(),
                code: err.error.code,
                message: err.error.message,
            }),
            Err(_) => {
                let text = String::from_utf8_lossy(&body);
                let text = text.trim();
                Err(ClientError::Api {
                    status: status.as_u16(),
                    code: code_for_status(status),
                    message: if text.is_empty() {
                        format!("the daemon answered {status}")
                    } else {
                        format!("the daemon answered {status}: {text}")
                    },
                })
            }
        }
    }

    async fn read_body(&self, response: Response<Incoming>) -> Result<Bytes> {
        response
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|source| ClientError::Http {
                url: self.url.clone(),
                source,
            })
    }

    async fn json<T: DeserializeOwned>(&self, response: Response<Incoming>) -> Result<T> {
        let body = self.read_body(response).await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self.send(Method::GET, path, empty_body(), None).await?;
        self.json(resp).await
    }

    async fn post_json<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T> {
        let resp = self
            .send(
                Method::POST,
                path,
                json_body(body)?,
                Some("application/json"),
            )
            .await?;
        self.json(resp).await
    }

    async fn post_empty<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self.send(Method::POST, path, empty_body(), None).await?;
        self.json(resp).await
    }

    async fn no_content(&self, method: Method, path: &str) -> Result<()> {
        let resp = self.send(method, path, empty_body(), None).await?;
        self.read_body(resp).await?;
        Ok(())
    }

    fn sandbox_path(sandbox: &str, rest: &str) -> String {
        format!("/v1/sandboxes/{}{rest}", segment(sandbox))
    }

    // ---- meta -----------------------------------------------------------------------

    pub async fn health(&self) -> Result<Health> {
        self.get_json("/healthz").await
    }

    /// The daemon's OpenAPI document.
    pub async fn openapi(&self) -> Result<serde_json::Value> {
        self.get_json("/v1/openapi.json").await
    }

    // ---- sandboxes ------------------------------------------------------------------

    /// Creates a sandbox; `created` is false when a sandbox of that name already existed.
    pub async fn create(&self, req: &CreateSandboxRequest) -> Result<(Sandbox, bool)> {
        let resp = self
            .send(
                Method::POST,
                "/v1/sandboxes",
                json_body(req)?,
                Some("application/json"),
            )
            .await?;
        let created = resp.status() == StatusCode::CREATED;
        Ok((self.json(resp).await?, created))
    }

    pub async fn list(
        &self,
        labels: &BTreeMap<String, String>,
        state: Option<SandboxState>,
    ) -> Result<SandboxList> {
        // In a block: the serializer is not `Send` and must not live across the await.
        let q = {
            let mut q = form_urlencoded::Serializer::new(String::new());
            for (k, v) in labels {
                q.append_pair("label", &format!("{k}={v}"));
            }
            if let Some(s) = state {
                q.append_pair("state", s.as_str());
            }
            q.finish()
        };
        let path = if q.is_empty() {
            "/v1/sandboxes".to_string()
        } else {
            format!("/v1/sandboxes?{q}")
        };
        self.get_json(&path).await
    }

    pub async fn get(&self, sandbox: &str) -> Result<Sandbox> {
        self.get_json(&Self::sandbox_path(sandbox, "")).await
    }

    pub async fn delete(&self, sandbox: &str, force: bool) -> Result<()> {
        let path = Self::sandbox_path(sandbox, if force { "?force=true" } else { "" });
        self.no_content(Method::DELETE, &path).await
    }

    pub async fn pause(&self, sandbox: &str) -> Result<Sandbox> {
        self.post_empty(&Self::sandbox_path(sandbox, "/pause"))
            .await
    }

    pub async fn resume(&self, sandbox: &str) -> Result<Sandbox> {
        self.post_empty(&Self::sandbox_path(sandbox, "/resume"))
            .await
    }

    pub async fn stop(&self, sandbox: &str) -> Result<Sandbox> {
        self.post_empty(&Self::sandbox_path(sandbox, "/stop")).await
    }

    pub async fn start(&self, sandbox: &str) -> Result<Sandbox> {
        self.post_empty(&Self::sandbox_path(sandbox, "/start"))
            .await
    }

    pub async fn selftest(&self, sandbox: &str) -> Result<SelftestReport> {
        self.get_json(&Self::sandbox_path(sandbox, "/selftest"))
            .await
    }

    // ---- exec -------------------------------------------------------------------------

    /// Runs a command to completion.
    pub async fn exec(&self, sandbox: &str, req: &ExecRequest) -> Result<ExecResponse> {
        self.post_json(&Self::sandbox_path(sandbox, "/exec"), req)
            .await
    }

    /// Runs a command and yields its events as they arrive: `start`, `stdout`/`stderr`,
    /// then `end` or `error`.
    pub async fn exec_stream(
        &self,
        sandbox: &str,
        req: &ExecRequest,
    ) -> Result<BoxStream<'static, Result<ExecEvent>>> {
        let resp = self
            .send(
                Method::POST,
                &Self::sandbox_path(sandbox, "/exec/stream"),
                json_body(req)?,
                Some("application/json"),
            )
            .await?;
        Ok(ndjson_events(resp.into_body(), self.url.clone()))
    }

    // ---- background processes ---------------------------------------------------------

    pub async fn start_process(
        &self,
        sandbox: &str,
        req: &StartProcessRequest,
    ) -> Result<ProcessInfo> {
        self.post_json(&Self::sandbox_path(sandbox, "/processes"), req)
            .await
    }

    pub async fn list_processes(&self, sandbox: &str) -> Result<ProcessList> {
        self.get_json(&Self::sandbox_path(sandbox, "/processes"))
            .await
    }

    pub async fn process_logs(&self, sandbox: &str, process_id: u64) -> Result<ProcessLogs> {
        self.get_json(&Self::sandbox_path(
            sandbox,
            &format!("/processes/{process_id}/logs"),
        ))
        .await
    }

    /// Sends `signal` (default 9) to a background process.
    pub async fn kill_process(
        &self,
        sandbox: &str,
        process_id: u64,
        signal: Option<i32>,
    ) -> Result<()> {
        let body = json_body(&KillProcessRequest { signal })?;
        let resp = self
            .send(
                Method::POST,
                &Self::sandbox_path(sandbox, &format!("/processes/{process_id}/kill")),
                body,
                Some("application/json"),
            )
            .await?;
        self.read_body(resp).await?;
        Ok(())
    }

    // ---- files ------------------------------------------------------------------------

    /// Reads a file as a stream of chunks.
    pub async fn read_file(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
    ) -> Result<BoxStream<'static, Result<Bytes>>> {
        let resp = self
            .send(
                Method::GET,
                &Self::sandbox_path(sandbox, &format!("/files?{}", file_query(path, user, &[]))),
                empty_body(),
                None,
            )
            .await?;
        let url = self.url.clone();
        Ok(
            futures::stream::unfold(Some(resp.into_body()), move |body| {
                let url = url.clone();
                async move {
                    let mut body = body?;
                    loop {
                        match body.frame().await {
                            None => return None,
                            Some(Err(source)) => {
                                return Some((Err(ClientError::Http { url, source }), None))
                            }
                            Some(Ok(frame)) => {
                                if let Ok(data) = frame.into_data() {
                                    return Some((Ok(data), Some(body)));
                                }
                            }
                        }
                    }
                }
            })
            .boxed(),
        )
    }

    /// Reads a whole file into memory.
    pub async fn read_file_bytes(&self, sandbox: &str, path: &str, user: User) -> Result<Vec<u8>> {
        let mut stream = self.read_file(sandbox, path, user).await?;
        let mut out = Vec::new();
        while let Some(chunk) = stream.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }

    /// Writes (replaces) a file with `data`.
    pub async fn write_file(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        data: impl Into<Bytes>,
    ) -> Result<()> {
        self.write_file_body(sandbox, path, user, full_body(data))
            .await
    }

    /// Writes (replaces) a file with everything `reader` yields, streamed.
    pub async fn write_file_from<R>(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        reader: R,
    ) -> Result<()>
    where
        R: AsyncRead + Send + Unpin + 'static,
    {
        let chunks = futures::stream::unfold(Some(reader), |reader| async move {
            let mut reader = reader?;
            let mut buf = BytesMut::with_capacity(64 * 1024);
            match reader.read_buf(&mut buf).await {
                Ok(0) => None,
                Ok(_) => Some((Ok(Frame::data(buf.freeze())), Some(reader))),
                Err(e) => Some((Err(Box::new(e) as BoxError), None)),
            }
        });
        self.write_file_body(sandbox, path, user, StreamBody::new(chunks).boxed_unsync())
            .await
    }

    async fn write_file_body(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        body: ReqBody,
    ) -> Result<()> {
        let resp = self
            .send(
                Method::PUT,
                &Self::sandbox_path(sandbox, &format!("/files?{}", file_query(path, user, &[]))),
                body,
                Some("application/octet-stream"),
            )
            .await?;
        self.read_body(resp).await?;
        Ok(())
    }

    pub async fn remove_file(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        recursive: bool,
    ) -> Result<()> {
        let extra: &[(&str, &str)] = if recursive {
            &[("recursive", "true")]
        } else {
            &[]
        };
        self.no_content(
            Method::DELETE,
            &Self::sandbox_path(
                sandbox,
                &format!("/files?{}", file_query(path, user, extra)),
            ),
        )
        .await
    }

    pub async fn list_files(&self, sandbox: &str, path: &str, user: User) -> Result<FileList> {
        self.get_json(&Self::sandbox_path(
            sandbox,
            &format!("/files/list?{}", file_query(path, user, &[])),
        ))
        .await
    }

    pub async fn stat_file(&self, sandbox: &str, path: &str, user: User) -> Result<FileEntry> {
        self.get_json(&Self::sandbox_path(
            sandbox,
            &format!("/files/stat?{}", file_query(path, user, &[])),
        ))
        .await
    }

    pub async fn mkdir(&self, sandbox: &str, path: &str, user: User, parents: bool) -> Result<()> {
        let extra: &[(&str, &str)] = if parents { &[("parents", "true")] } else { &[] };
        self.no_content(
            Method::POST,
            &Self::sandbox_path(
                sandbox,
                &format!("/files/mkdir?{}", file_query(path, user, extra)),
            ),
        )
        .await
    }

    // ---- images -------------------------------------------------------------------------

    pub async fn list_images(&self) -> Result<ImageList> {
        self.get_json("/v1/images").await
    }

    /// Registers a root filesystem directory on the daemon's host as an image.
    pub async fn add_image(&self, req: &AddImageRequest) -> Result<Image> {
        self.post_json("/v1/images", req).await
    }
}

/// Splits an NDJSON body into events. A body that ends without a terminal event yields
/// a final error, so callers never mistake a cut stream for a finished process.
fn ndjson_events(body: Incoming, url: String) -> BoxStream<'static, Result<ExecEvent>> {
    struct St {
        body: Incoming,
        buf: BytesMut,
        done: bool,
        url: String,
    }
    let st = St {
        body,
        buf: BytesMut::new(),
        done: false,
        url,
    };
    futures::stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            if let Some(i) = st.buf.iter().position(|b| *b == b'\n') {
                let line = st.buf.split_to(i + 1);
                let line = &line[..i];
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let item = serde_json::from_slice::<ExecEvent>(line)
                    .map_err(|e| ClientError::Decode(format!("bad exec event: {e}")));
                if matches!(
                    item,
                    Ok(ExecEvent::End { .. } | ExecEvent::Error { .. }) | Err(_)
                ) {
                    st.done = true;
                }
                return Some((item, st));
            }
            if st.buf.len() > MAX_EVENT_LINE_BYTES {
                st.done = true;
                return Some((
                    Err(ClientError::Decode(
                        "an exec event line is too long".to_string(),
                    )),
                    st,
                ));
            }
            match st.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        st.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(source)) => {
                    st.done = true;
                    let url = st.url.clone();
                    return Some((Err(ClientError::Http { url, source }), st));
                }
                None => {
                    st.done = true;
                    if !st.buf.iter().all(u8::is_ascii_whitespace) {
                        // A last line without its newline.
                        let item = serde_json::from_slice::<ExecEvent>(&st.buf)
                            .map_err(|e| ClientError::Decode(format!("bad exec event: {e}")));
                        if matches!(item, Ok(ExecEvent::End { .. } | ExecEvent::Error { .. })) {
                            return Some((item, st));
                        }
                    }
                    return Some((
                        Err(ClientError::Decode(
                            "the exec stream ended before the process did".to_string(),
                        )),
                        st,
                    ));
                }
            }
        }
    })
    .boxed()
}

/// The path of the daemon's socket under `root`.
pub fn socket_path(root: &Path) -> PathBuf {
    root.join(SOCKET_NAME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        assert_eq!(
            parse_url("unix:///var/lib/threadbox/threadbox.sock").unwrap(),
            Endpoint::Unix(PathBuf::from("/var/lib/threadbox/threadbox.sock"))
        );
        assert_eq!(
            parse_url("http://127.0.0.1:7420").unwrap(),
            Endpoint::Tcp {
                authority: "127.0.0.1:7420".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            parse_url("http://localhost/api/").unwrap(),
            Endpoint::Tcp {
                authority: "localhost:80".into(),
                prefix: "/api".into()
            }
        );
        assert_eq!(
            parse_url("http://[::1]").unwrap(),
            Endpoint::Tcp {
                authority: "[::1]:80".into(),
                prefix: String::new()
            }
        );
        for bad in [
            "unix://relative",
            "ftp://x",
            "https://x",
            "http://",
            "127.0.0.1:7420",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn segments_and_queries_are_encoded() {
        assert_eq!(segment("my box/1"), "my%20box%2F1");
        assert_eq!(segment("sb-1_a.b~"), "sb-1_a.b~");
        assert_eq!(
            file_query("/tmp/a b&c", User::Root, &[("recursive", "true")]),
            "path=%2Ftmp%2Fa+b%26c&user=root&recursive=true"
        );
    }

    #[tokio::test]
    async fn connect_error_names_the_url_and_serve() {
        let client = Client::new("unix:///nonexistent/threadbox.sock").unwrap();
        let err = client.health().await.unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ClientError::Connect { .. }));
        assert!(msg.contains("unix:///nonexistent/threadbox.sock"), "{msg}");
        assert!(msg.contains("threadbox serve"), "{msg}");
    }
}
