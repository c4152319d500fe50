//! Rust client of the threadbox REST API, over a unix socket (`unix:///path/to.sock`) or
//! TCP (`http://host:port`). One HTTP/1 connection per request: calls are few and long
//! (exec), and a fresh connection never trips over a daemon restart.
//!
//! `transport` holds the exchange (timeouts, body bounds), `url` where the daemon is,
//! `error` the one error type, `ndjson` the exec stream's parser; the endpoints below and
//! in `governance` build their paths from `threadbox_api::routes`, as the router does.
#![forbid(unsafe_code)]

mod error;
mod governance;
mod images;
mod ndjson;
mod transport;
mod url;
mod ws;

pub use error::{ClientError, Result};
pub use transport::{CONNECT_TIMEOUT, MAX_ERROR_BODY_BYTES, MAX_JSON_RESPONSE_BYTES};
pub use url::{resolve_url, socket_path, DEFAULT_HTTP_URL, DEFAULT_ROOT, SOCKET_NAME};
pub use ws::{Io, Socket};

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::Method;
use ndjson::ndjson_events;
use std::collections::BTreeMap;
use std::time::Duration;
use threadbox_api::ops::{self, FileTarget, HttpMethod, Operation};
use threadbox_api::routes::{self, fill};
use threadbox_api::*;
use tokio::io::{AsyncRead, AsyncReadExt};
use transport::{empty_body, full_body, json_body, BoxError, ReqBody};
use url::{parse_url, Endpoint};

/// A client of one daemon.
#[derive(Debug, Clone)]
pub struct Client {
    url: String,
    endpoint: Endpoint,
    api_key: Option<String>,
    /// Sent as `X-Threadbox-Tenant`: the tenant an operator or admin acts for.
    tenant: Option<String>,
    connect_timeout: Duration,
}

fn target(sandbox: &str, path: &str, user: User) -> FileTarget {
    FileTarget {
        sandbox: sandbox.into(),
        path: path.into(),
        user,
    }
}

fn file_query(path: &str, user: User, extra: &[(&str, &str)]) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("path", path);
    if user != User::Default {
        q.append_pair("user", user.as_str());
    }
    for (k, v) in extra {
        q.append_pair(k, v);
    }
    q.finish()
}

impl Client {
    /// A client of the daemon at `url` (`unix:///path/to.sock` or `http://host:port`).
    pub fn new(url: &str) -> Result<Self> {
        Ok(Client {
            url: url.to_string(),
            endpoint: parse_url(url)?,
            api_key: None,
            tenant: None,
            connect_timeout: CONNECT_TIMEOUT,
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

    /// Bounds each connect, on the unix socket and on TCP (default [`CONNECT_TIMEOUT`]).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// A sandbox's path from its template, with an optional query string.
    fn sandbox_path(template: &str, sandbox: &str, query: Option<&str>) -> String {
        let path = fill(template, &[sandbox]);
        match query {
            Some(q) => format!("{path}?{q}"),
            None => path,
        }
    }

    /// Sends one operation and decodes its answer: every JSON endpoint below is this
    /// with the operation's type (its method, route, query and body; ADR 0057).
    pub async fn call<O>(&self, op: &O) -> Result<O::Output>
    where
        O: Operation,
        O::Output: serde::de::DeserializeOwned,
    {
        let values = op.path_values();
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        let mut path = fill(O::PATH, &values);
        let query = op.query();
        if !query.is_empty() {
            let mut q = form_urlencoded::Serializer::new(String::new());
            for (k, v) in &query {
                q.append_pair(k, v);
            }
            path = format!("{path}?{}", q.finish());
        }
        let method = match O::METHOD {
            HttpMethod::Get => Method::GET,
            HttpMethod::Post => Method::POST,
            HttpMethod::Put => Method::PUT,
            HttpMethod::Delete => Method::DELETE,
        };
        let (body, content_type) = match op.body() {
            Some(json) => (json_body(&json)?, Some("application/json")),
            None => (empty_body(), None),
        };
        let resp = self.send(method, &path, body, content_type).await?;
        let bytes = self.read_body(resp).await?;
        // A `204 No Content` answers `()`, which JSON spells `null`.
        let bytes: &[u8] = if bytes.is_empty() { b"null" } else { &bytes };
        serde_json::from_slice(bytes).map_err(|e| ClientError::Decode(e.to_string()))
    }

    // ---- meta -----------------------------------------------------------------------

    pub async fn health(&self) -> Result<Health> {
        self.get_json(routes::HEALTHZ).await
    }

    /// The daemon's OpenAPI document.
    pub async fn openapi(&self) -> Result<serde_json::Value> {
        self.get_json(routes::OPENAPI).await
    }

    // ---- sandboxes ------------------------------------------------------------------

    /// Creates a sandbox; `created` is false when a sandbox of that name already existed.
    pub async fn create(&self, req: &CreateSandboxRequest) -> Result<(Sandbox, bool)> {
        let out = self.call(&ops::CreateSandbox(req.clone())).await?;
        Ok((out.sandbox, out.created))
    }

    pub async fn list(
        &self,
        labels: &BTreeMap<String, String>,
        state: Option<SandboxState>,
    ) -> Result<SandboxList> {
        let labels = labels.clone();
        self.call(&ops::ListSandboxes { labels, state }).await
    }

    pub async fn get(&self, sandbox: &str) -> Result<Sandbox> {
        let sandbox = sandbox.to_string();
        self.call(&ops::GetSandbox { sandbox }).await
    }

    pub async fn delete(&self, sandbox: &str, force: bool) -> Result<()> {
        let sandbox = sandbox.to_string();
        self.call(&ops::DeleteSandbox { sandbox, force }).await
    }

    pub async fn pause(&self, sandbox: &str) -> Result<Sandbox> {
        let sandbox = sandbox.to_string();
        self.call(&ops::PauseSandbox { sandbox }).await
    }

    pub async fn hibernate(&self, sandbox: &str) -> Result<Sandbox> {
        let sandbox = sandbox.into();
        self.call(&ops::HibernateSandbox { sandbox }).await
    }

    pub async fn resume(&self, sandbox: &str) -> Result<Sandbox> {
        let sandbox = sandbox.to_string();
        self.call(&ops::ResumeSandbox { sandbox }).await
    }

    pub async fn stop(&self, sandbox: &str) -> Result<Sandbox> {
        let sandbox = sandbox.to_string();
        self.call(&ops::StopSandbox { sandbox }).await
    }

    pub async fn start(&self, sandbox: &str) -> Result<Sandbox> {
        let sandbox = sandbox.to_string();
        self.call(&ops::StartSandbox { sandbox }).await
    }

    pub async fn selftest(&self, sandbox: &str) -> Result<SelftestReport> {
        let sandbox = sandbox.to_string();
        self.call(&ops::Selftest { sandbox }).await
    }

    // ---- exec -------------------------------------------------------------------------

    /// Runs a command to completion.
    pub async fn exec(&self, sandbox: &str, req: &ExecRequest) -> Result<ExecResponse> {
        let (sandbox, request) = (sandbox.to_string(), req.clone());
        self.call(&ops::Exec { sandbox, request }).await
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
                &Self::sandbox_path(routes::EXEC_STREAM, sandbox, None),
                json_body(req)?,
                Some("application/json"),
            )
            .await?;
        Ok(ndjson_events(resp.into_body(), self.url.clone()))
    }

    /// Runs code in a context and yields its events as the cell makes them (`start`,
    /// output, `end` or `error`). Dropping the stream interrupts the cell.
    pub async fn execute_code_stream(
        &self,
        sandbox: &str,
        context: &str,
        req: &threadbox_api::interp::ExecuteCodeRequest,
    ) -> Result<BoxStream<'static, Result<threadbox_api::interp::CodeEvent>>> {
        let path = fill(routes::CONTEXT_EXECUTE_STREAM, &[sandbox, context]);
        let resp = self
            .send(
                Method::POST,
                &path,
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
        let (sandbox, request) = (sandbox.to_string(), req.clone());
        self.call(&ops::StartProcess { sandbox, request }).await
    }

    pub async fn list_processes(&self, sandbox: &str) -> Result<ProcessList> {
        let sandbox = sandbox.to_string();
        self.call(&ops::ListProcesses { sandbox }).await
    }

    pub async fn process_logs(&self, sandbox: &str, process_id: u64) -> Result<ProcessLogs> {
        let sandbox = sandbox.to_string();
        self.call(&ops::GetProcessLogs {
            sandbox,
            process_id,
        })
        .await
    }

    /// Sends `signal` (default 9) to a background process.
    pub async fn kill_process(
        &self,
        sandbox: &str,
        process_id: u64,
        signal: Option<i32>,
    ) -> Result<()> {
        let sandbox = sandbox.to_string();
        self.call(&ops::KillProcess {
            sandbox,
            process_id,
            signal,
        })
        .await
    }

    // ---- files ------------------------------------------------------------------------

    /// Reads a file as a stream of chunks.
    pub async fn read_file(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
    ) -> Result<BoxStream<'static, Result<Bytes>>> {
        self.read_file_range(sandbox, path, user, 0, None).await
    }

    /// Reads at most `length` bytes of a file from `offset` (to the end when `None`); the
    /// daemon sends only those bytes. A range past the end of the file reads as empty.
    pub async fn read_file_range(
        &self,
        sandbox: &str,
        path: &str,
        user: User,
        offset: u64,
        length: Option<u64>,
    ) -> Result<BoxStream<'static, Result<Bytes>>> {
        let offset_s = offset.to_string();
        let length_s = length.map(|l| l.to_string());
        let mut extra = Vec::new();
        if offset != 0 {
            extra.push(("offset", offset_s.as_str()));
        }
        if let Some(l) = length_s.as_deref() {
            extra.push(("length", l));
        }
        let resp = self
            .send(
                Method::GET,
                &Self::sandbox_path(
                    routes::FILES,
                    sandbox,
                    Some(&file_query(path, user, &extra)),
                ),
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
                &Self::sandbox_path(routes::FILES, sandbox, Some(&file_query(path, user, &[]))),
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
        let target = target(sandbox, path, user);
        self.call(&ops::RemoveFile { target, recursive }).await
    }

    pub async fn list_files(&self, sandbox: &str, path: &str, user: User) -> Result<FileList> {
        self.call(&ops::ListFiles(target(sandbox, path, user)))
            .await
    }

    pub async fn stat_file(&self, sandbox: &str, path: &str, user: User) -> Result<FileEntry> {
        self.call(&ops::StatFile(target(sandbox, path, user))).await
    }

    pub async fn mkdir(&self, sandbox: &str, path: &str, user: User, parents: bool) -> Result<()> {
        let target = target(sandbox, path, user);
        self.call(&ops::Mkdir { target, parents }).await
    }

    // ---- images -------------------------------------------------------------------------

    pub async fn list_images(&self) -> Result<ImageList> {
        self.call(&ops::ListImages).await
    }

    /// Registers a root filesystem directory on the daemon's host as an image.
    pub async fn add_image(&self, req: &AddImageRequest) -> Result<Image> {
        self.call(&ops::AddImage(req.clone())).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_queries_are_encoded() {
        assert_eq!(
            Client::sandbox_path(routes::FILES, "my box/1", Some("path=%2F")),
            "/v1/sandboxes/my%20box%2F1/files?path=%2F"
        );
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
