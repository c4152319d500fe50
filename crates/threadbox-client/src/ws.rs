//! WebSockets to the daemon (terminal sessions, ADR 0092): the same doors, key and tenant
//! headers as every other request, over the unix socket or TCP.

use crate::error::code_for_status;
use crate::url::Endpoint;
use crate::{Client, ClientError, Result};
use std::pin::Pin;
use threadbox_api::pty::{OpenPty, PtyRequest, PtySession};
use threadbox_api::routes::fill;
use threadbox_api::{routes, ErrorResponse};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::WebSocketStream;

/// The byte stream under a WebSocket: a unix or TCP connection.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// A WebSocket to the daemon.
pub type Socket = WebSocketStream<Pin<Box<dyn Io>>>;

impl Client {
    /// Opens a terminal session (`POST /v1/sandboxes/{sandbox}/pty`).
    pub async fn open_pty(&self, sandbox: &str, request: PtyRequest) -> Result<PtySession> {
        self.call(&OpenPty {
            sandbox: sandbox.into(),
            request,
        })
        .await
    }

    /// Attaches to a session's terminal (`write`: `None` for the default grant).
    pub async fn attach_pty(
        &self,
        sandbox: &str,
        session: &str,
        write: Option<bool>,
    ) -> Result<Socket> {
        let mut path = fill(routes::SANDBOX_PTY_WS, &[sandbox, session]);
        if let Some(w) = write {
            path.push_str(if w { "?write=1" } else { "?write=0" });
        }
        self.websocket(&path, &[]).await
    }

    /// Upgrades `GET path_and_query` to a WebSocket, with `extra` headers.
    pub async fn websocket(&self, path_and_query: &str, extra: &[(&str, &str)]) -> Result<Socket> {
        let (url, io): (String, Pin<Box<dyn Io>>) = match &self.endpoint {
            Endpoint::Unix(path) => {
                let s = self
                    .within_connect_timeout(crate::transport::connect_unix(path))
                    .await?;
                (format!("ws://localhost{path_and_query}"), Box::pin(s))
            }
            Endpoint::Tcp { authority, prefix } => {
                let s = self
                    .within_connect_timeout(tokio::net::TcpStream::connect(authority.as_str()))
                    .await?;
                let _ = s.set_nodelay(true);
                (
                    format!("ws://{authority}{prefix}{path_and_query}"),
                    Box::pin(s),
                )
            }
        };
        let invalid = |reason: String| ClientError::InvalidUrl {
            url: url.clone(),
            reason,
        };
        let mut req = url
            .as_str()
            .into_client_request()
            .map_err(|e| invalid(e.to_string()))?;
        let headers = req.headers_mut();
        let value = |v: &str| {
            HeaderValue::from_str(v).map_err(|_| invalid("a header value is not valid".into()))
        };
        if let Some(key) = &self.api_key {
            headers.insert("authorization", value(&format!("Bearer {key}"))?);
        }
        if let Some(t) = &self.tenant {
            headers.insert("x-threadbox-tenant", value(t)?);
        }
        for (k, v) in extra {
            let name = tokio_tungstenite::tungstenite::http::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| invalid(format!("bad header name {k:?}")))?;
            headers.insert(name, value(v)?);
        }
        match tokio_tungstenite::client_async(req, io).await {
            Ok((socket, _)) => Ok(socket),
            Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
                let status = resp.status();
                let body = resp.body().as_deref().unwrap_or_default();
                Err(match serde_json::from_slice::<ErrorResponse>(body) {
                    Ok(e) => ClientError::Api {
                        status: status.as_u16(),
                        code: e.error.code,
                        message: e.error.message,
                    },
                    Err(_) => ClientError::Api {
                        status: status.as_u16(),
                        code: code_for_status(
                            hyper::StatusCode::from_u16(status.as_u16())
                                .unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR),
                        ),
                        message: format!("the WebSocket upgrade was refused ({status})"),
                    },
                })
            }
            Err(e) => Err(ClientError::Decode(format!("WebSocket handshake: {e}"))),
        }
    }
}
