//! One HTTP/1 exchange with the daemon: connect (unix socket or TCP, each within a
//! connect timeout), send, and read the answer within a bound on its size.

use crate::error::{code_for_status, ClientError, Result};
use crate::url::Endpoint;
use crate::Client;
use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;
use threadbox_api::ErrorResponse;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type ReqBody = UnsyncBoxBody<Bytes, BoxError>;

/// How long a connect may take, on TCP and on the unix socket alike (a socket path on a
/// hung filesystem, or a daemon whose accept backlog is full, must not hang the CLI).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on a JSON answer. The largest the daemon sends are an exec result (two streams
/// of at most 8 MiB each, escaped or base64) and a listing of 50,000 entries.
pub const MAX_JSON_RESPONSE_BYTES: usize = 128 << 20;
/// Bound on an error answer: a code and a sentence.
pub const MAX_ERROR_BODY_BYTES: usize = 64 << 10;

pub(crate) fn empty_body() -> ReqBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub(crate) fn full_body(bytes: impl Into<Bytes>) -> ReqBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

pub(crate) fn json_body<T: Serialize>(value: &T) -> Result<ReqBody> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| ClientError::Decode(format!("cannot encode the request: {e}")))?;
    Ok(full_body(bytes))
}

/// First pause between connect attempts while the daemon's backlog is full; doubles up to
/// [`BACKLOG_RETRY_MAX`].
const BACKLOG_RETRY_FIRST: Duration = Duration::from_millis(5);
const BACKLOG_RETRY_MAX: Duration = Duration::from_millis(200);

/// Connects to a unix socket, waiting while its accept backlog is full. A non-blocking
/// unix connect fails at once with `EAGAIN` there (a blocking one would sleep until room
/// is made), and the kernel offers nothing to wait on: retry with a growing pause. A busy
/// daemon is then waited for, within the caller's connect timeout, instead of reported
/// as absent.
pub(crate) async fn connect_unix(
    path: &std::path::Path,
) -> std::io::Result<tokio::net::UnixStream> {
    let mut pause = BACKLOG_RETRY_FIRST;
    loop {
        match tokio::net::UnixStream::connect(path).await {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(BACKLOG_RETRY_MAX);
            }
            other => return other,
        }
    }
}

impl Client {
    pub(crate) async fn send(
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
                let stream = self.within_connect_timeout(connect_unix(path)).await?;
                self.round_trip(TokioIo::new(stream), request).await
            }
            Endpoint::Tcp { authority, .. } => {
                let stream = self
                    .within_connect_timeout(tokio::net::TcpStream::connect(authority.as_str()))
                    .await?;
                let _ = stream.set_nodelay(true);
                self.round_trip(TokioIo::new(stream), request).await
            }
        }
    }

    pub(crate) async fn within_connect_timeout<S>(
        &self,
        connect: impl std::future::Future<Output = std::io::Result<S>>,
    ) -> Result<S> {
        tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| {
                self.connect_error(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("connection timed out after {:?}", self.connect_timeout),
                ))
            })?
            .map_err(|source| self.connect_error(source))
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
        let body = match self
            .read_bounded(response, MAX_ERROR_BODY_BYTES, "an error answer")
            .await
        {
            Ok(body) => body,
            Err(e @ ClientError::TooLarge { .. }) => return Err(e),
            // A connection cut mid-error still reports the status it answered.
            Err(_) => Bytes::new(),
        };
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

    /// The whole body, or [`ClientError::TooLarge`] as soon as it passes `limit`.
    async fn read_bounded(
        &self,
        response: Response<Incoming>,
        limit: usize,
        what: &'static str,
    ) -> Result<Bytes> {
        match Limited::new(response.into_body(), limit).collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(err) => match err.downcast::<hyper::Error>() {
                Ok(source) => Err(ClientError::Http {
                    url: self.url.clone(),
                    source: *source,
                }),
                // `Limited`'s only other error is its `LengthLimitError`.
                Err(_) => Err(ClientError::TooLarge {
                    url: self.url.clone(),
                    what,
                    limit,
                }),
            },
        }
    }

    /// Reads and discards an answer whose content does not matter (within the JSON bound).
    pub(crate) async fn read_body(&self, response: Response<Incoming>) -> Result<Bytes> {
        self.read_bounded(response, MAX_JSON_RESPONSE_BYTES, "an answer")
            .await
    }

    pub(crate) async fn json<T: DeserializeOwned>(
        &self,
        response: Response<Incoming>,
    ) -> Result<T> {
        let body = self
            .read_bounded(response, MAX_JSON_RESPONSE_BYTES, "a JSON answer")
            .await?;
        serde_json::from_slice(&body).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub(crate) async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self.send(Method::GET, path, empty_body(), None).await?;
        self.json(resp).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP server on a unix socket that answers `status` with a chunked body
    /// of `body_bytes` bytes of `x` (neither JSON nor the error shape).
    async fn serve_once(status: &'static str, body_bytes: usize) -> (Client, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("tb-client-{}-{}", std::process::id(), body_bytes));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("s.sock");
        let listener = tokio::net::UnixListener::bind(&path).expect("bind");
        tokio::spawn(async move {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n\
                 Transfer-Encoding: chunked\r\n\r\n"
            );
            if s.write_all(head.as_bytes()).await.is_err() {
                return;
            }
            let chunk = vec![b'x'; 1 << 20];
            let mut left = body_bytes;
            while left > 0 {
                let n = left.min(chunk.len());
                let frame = [format!("{n:x}\r\n").as_bytes(), &chunk[..n], b"\r\n"].concat();
                // The client hangs up once it has seen enough: that ends the server.
                if s.write_all(&frame).await.is_err() {
                    return;
                }
                left -= n;
            }
            let _ = s.write_all(b"0\r\n\r\n").await;
        });
        let client = Client::new(&format!("unix://{}", path.display())).expect("client");
        (client, dir)
    }

    #[tokio::test]
    async fn a_json_answer_past_the_bound_is_a_clear_error() {
        let (client, dir) = serve_once("200 OK", MAX_JSON_RESPONSE_BYTES + (1 << 20)).await;
        let err = client.health().await.expect_err("too large");
        assert!(
            matches!(err, ClientError::TooLarge { limit, .. } if limit == MAX_JSON_RESPONSE_BYTES),
            "{err:?}"
        );
        assert!(err.to_string().contains("larger than"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn an_error_answer_past_its_bound_is_a_clear_error() {
        let (client, dir) = serve_once("500 Internal Server Error", MAX_ERROR_BODY_BYTES + 1).await;
        let err = client.health().await.expect_err("too large");
        assert!(
            matches!(err, ClientError::TooLarge { limit, .. } if limit == MAX_ERROR_BODY_BYTES),
            "{err:?}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn answers_within_the_bounds_read_as_before() {
        // A short non-JSON error keeps its status and text.
        let (client, dir) = serve_once("503 Service Unavailable", 10).await;
        let err = client.health().await.expect_err("an error");
        assert_eq!(err.code(), Some(threadbox_api::ErrorCode::Unavailable));
        assert!(err.to_string().contains("xxxxxxxxxx"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[cfg(test)]
mod connect_tests {
    use crate::{Client, ClientError};
    use std::time::Duration;
    use tokio::net::{UnixListener, UnixSocket, UnixStream};

    /// A listener that never accepts, with its backlog full: the kernel refuses further
    /// non-blocking connects with `EAGAIN` until it drains.
    async fn full_listener(dir: &std::path::Path) -> (UnixListener, Vec<UnixStream>, String) {
        let path = dir.join("d.sock");
        let socket = UnixSocket::new_stream().unwrap();
        socket.bind(&path).unwrap();
        let listener = socket.listen(0).unwrap();
        let mut held = Vec::new();
        loop {
            match UnixStream::connect(&path).await {
                Ok(s) => held.push(s),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("filling the backlog: {e}"),
            }
            assert!(held.len() < 64, "the backlog does not fill");
        }
        (listener, held, format!("unix://{}", path.display()))
    }

    fn tempdir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "threadbox-client-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn rand_suffix() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::SeqCst)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_unix_connect_to_a_daemon_that_never_accepts_times_out() {
        let dir = tempdir();
        let (_listener, _held, url) = full_listener(&dir).await;
        let client = Client::new(&url)
            .unwrap()
            .with_connect_timeout(Duration::from_millis(200));
        // The outer bound only turns a hang into a failure; it is not what is tested.
        let err = tokio::time::timeout(Duration::from_secs(60), client.health())
            .await
            .expect("the connect must end by itself")
            .unwrap_err();
        match &err {
            ClientError::Connect { source, .. } => {
                assert_eq!(source.kind(), std::io::ErrorKind::TimedOut, "{err}");
                assert!(source.to_string().contains("timed out"), "{source}");
            }
            other => panic!("{other}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A full backlog is a busy daemon, not an absent one: the connect waits for room
    /// (as a blocking connect does) within the timeout instead of failing at once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_unix_connect_waits_for_a_full_backlog_to_drain() {
        let dir = tempdir();
        let (listener, held, url) = full_listener(&dir).await;
        let client = Client::new(&url)
            .unwrap()
            .with_connect_timeout(Duration::from_secs(60));
        let mut call = tokio::spawn(async move { client.health().await });
        // Let the call make its first attempt (one runtime thread: it runs when we yield).
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        drop(held);
        // Drain the backlog (the fillers), then the call's own connection: closed unanswered.
        let mut accepted = 0;
        let result = loop {
            tokio::select! {
                r = listener.accept() => {
                    drop(r.unwrap());
                    accepted += 1;
                }
                r = &mut call => break r.unwrap(),
            }
        };
        let err = result.unwrap_err();
        assert!(
            !matches!(err, ClientError::Connect { .. }),
            "the connect must wait for room, got: {err}"
        );
        assert!(accepted >= 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
