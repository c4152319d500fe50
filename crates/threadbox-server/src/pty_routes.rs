//! Terminal sessions over WebSocket (issue 17 scope 4, ADR 0092), and a WebSocket that
//! follows an exec's events.
//!
//! `POST /v1/sandboxes/{sandbox}/pty` opens a session; `GET .../pty/{session}/ws`
//! upgrades to its terminal. Frames (fixed; the dashboard speaks them too): binary =
//! raw terminal bytes both ways; text = JSON control, client → server
//! `{"type":"resize","cols":N,"rows":M}`, server → client `{"type":"exit","code":N}`
//! (then the close) and `{"type":"error","message":"..."}`.
//!
//! The upgrade is an ordinary request of the router: the Host/Origin layer refuses a
//! cross-origin upgrade (browsers send cookies on cross-site WebSocket handshakes and CORS
//! does not apply, so this check is what stops a hostile page), and the auth layer
//! decides the caller. Refusals happen before the upgrade, as HTTP errors.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::routes::{ApiJson, ApiPath, St};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::Query;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use threadbox_api::ops::Operation;
use threadbox_api::pty::*;
use threadbox_api::{routes, ErrorResponse, ExecEvent, ExecRequest};
use threadbox_core::manager::pty::{PtyEvent, PtyViewer};
use threadbox_core::ops;
use tokio::sync::broadcast::error::RecvError;
use utoipa::IntoParams;

/// Largest message a client may send (input is typed, or pasted).
const MAX_CLIENT_MESSAGE: usize = 1 << 20;

#[utoipa::path(post, path = routes::SANDBOX_PTY, tag = "terminal",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    request_body = PtyRequest,
    responses(
        (status = 201, description = "The session is open and its program running; attach to its WebSocket", body = PtySession),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn open_pty(
    axum::extract::State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiJson(request): ApiJson<PtyRequest>,
) -> Result<(StatusCode, ApiJson<PtySession>), ApiError> {
    let out = st.run(&caller, OpenPty { sandbox, request }).await?;
    Ok((StatusCode::CREATED, ApiJson(out)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AttachQuery {
    /// `1` to type (granted to the key that opened the session, and to other keys with
    /// `sandboxes:write` when it was opened with `shared_write`); `0` to watch only.
    /// Default: the opener types, everyone else watches.
    write: Option<String>,
}

#[utoipa::path(get, path = routes::SANDBOX_PTY_WS, tag = "terminal",
    params(("sandbox" = String, Path, description = "Sandbox id or name"),
           ("session" = String, Path, description = "The session's id"),
           AttachQuery),
    responses(
        (status = 101, description = "WebSocket: binary frames are terminal bytes both ways; text frames are JSON control (resize from the client; exit and error from the server)"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn pty_ws(
    axum::extract::State(st): St,
    Auth(caller): Auth,
    ApiPath((sandbox, session)): ApiPath<(String, String)>,
    Query(q): Query<AttachQuery>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let ws = ws.map_err(|e| ApiError::invalid(format!("a WebSocket upgrade is expected: {e}")))?;
    let want_write = match q.write.as_deref() {
        None => None,
        Some("1" | "true") => Some(true),
        Some("0" | "false") => Some(false),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "write must be 0 or 1, not {other:?}"
            )))
        }
    };
    let viewer = st
        .manager
        .attach_pty(&caller, &sandbox, &session, want_write)
        .await?;
    Ok(ws
        .max_message_size(MAX_CLIENT_MESSAGE)
        .on_upgrade(move |socket| serve_viewer(socket, viewer)))
}

fn control(c: &PtyServerControl) -> Message {
    Message::Text(serde_json::to_string(c).unwrap_or_default().into())
}

async fn close(socket: &mut WebSocket, reason: &str) {
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: axum::extract::ws::close_code::NORMAL,
            reason: reason.to_string().into(),
        })))
        .await;
}

/// Sends the end of a session and closes.
async fn finish(socket: &mut WebSocket, end: &PtyEvent) {
    let msg = match end {
        PtyEvent::Exit(code) => control(&PtyServerControl::Exit { code: *code }),
        PtyEvent::Error(message) => control(&PtyServerControl::Error {
            message: message.clone(),
        }),
        PtyEvent::Output(_) => return,
    };
    let _ = socket.send(msg).await;
    close(socket, "session over").await;
}

async fn serve_viewer(mut socket: WebSocket, viewer: PtyViewer) {
    let PtyViewer {
        session,
        replay,
        events,
        ended,
        write,
    } = viewer;
    if !replay.is_empty() && socket.send(Message::Binary(replay.into())).await.is_err() {
        return;
    }
    let Some(mut events) = events else {
        if let Some(end) = ended {
            finish(&mut socket, &end).await;
        }
        return;
    };
    loop {
        tokio::select! {
            ev = events.recv() => match ev {
                Ok(PtyEvent::Output(data)) => {
                    if socket.send(Message::Binary(data.to_vec().into())).await.is_err() {
                        return;
                    }
                }
                Ok(end) => {
                    finish(&mut socket, &end).await;
                    return;
                }
                Err(RecvError::Lagged(n)) => {
                    let _ = socket.send(control(&PtyServerControl::Error {
                        message: format!("this viewer fell {n} chunks behind the terminal and was dropped; attach again"),
                    })).await;
                    close(&mut socket, "fell behind").await;
                    return;
                }
                Err(RecvError::Closed) => return,
            },
            msg = socket.recv() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    // A viewer without the grant watches: its keys go nowhere.
                    if write {
                        if let Err(e) = session.input(data.to_vec()).await {
                            let e = ApiError::from(e);
                            let _ = socket.send(control(&PtyServerControl::Error { message: e.body().error.message })).await;
                        }
                    }
                }
                Some(Ok(Message::Text(text))) => {
                    let reply = match serde_json::from_str::<PtyClientControl>(&text) {
                        // The size follows the typing viewer's window; a watcher's resize
                        // would fight it.
                        Ok(PtyClientControl::Resize { cols, rows }) if write => {
                            session.resize(cols, rows).await.err().map(|e| ApiError::from(e).body().error.message)
                        }
                        Ok(PtyClientControl::Resize { .. }) => None,
                        Err(e) => Some(format!("unknown control message: {e}")),
                    };
                    if let Some(message) = reply {
                        let _ = socket.send(control(&PtyServerControl::Error { message })).await;
                    }
                }
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
}

#[utoipa::path(get, path = routes::EXEC_WS, tag = "terminal",
    params(("sandbox" = String, Path, description = "Sandbox id or name")),
    responses(
        (status = 101, description = "WebSocket: the client's first text frame is an ExecRequest; each event of the streamed exec follows as a text frame (the NDJSON stream's lines), the last one `end` or `error`, then the close"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn exec_ws(
    axum::extract::State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let ws = ws.map_err(|e| ApiError::invalid(format!("a WebSocket upgrade is expected: {e}")))?;
    // Checked before the upgrade, so a key that may not exec gets an HTTP 403.
    caller.require(ops::Exec::SCOPE).map_err(ApiError::from)?;
    Ok(ws
        .max_message_size(MAX_CLIENT_MESSAGE)
        .on_upgrade(move |socket| serve_exec(socket, st, caller, sandbox)))
}

async fn serve_exec(
    mut socket: WebSocket,
    st: std::sync::Arc<crate::routes::Shared>,
    caller: threadbox_core::Caller,
    sandbox: String,
) {
    let error = |message: String| {
        let ev = ExecEvent::Error {
            code: threadbox_api::ErrorCode::InvalidArgument,
            message,
        };
        Message::Text(serde_json::to_string(&ev).unwrap_or_default().into())
    };
    let request = loop {
        match socket.recv().await {
            Some(Ok(Message::Text(t))) => match serde_json::from_str::<ExecRequest>(&t) {
                Ok(r) => break r,
                Err(e) => {
                    let _ = socket
                        .send(error(format!(
                            "the first message must be an exec request: {e}"
                        )))
                        .await;
                    close(&mut socket, "bad request").await;
                    return;
                }
            },
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            _ => return,
        }
    };
    let op = ops::ExecStream(ops::Exec { sandbox, request });
    let mut rx = match st.run(&caller, op).await {
        Ok(rx) => rx,
        Err(e) => {
            let body = e.body();
            let ev = ExecEvent::Error {
                code: body.error.code,
                message: body.error.message,
            };
            let _ = socket
                .send(Message::Text(
                    serde_json::to_string(&ev).unwrap_or_default().into(),
                ))
                .await;
            close(&mut socket, "refused").await;
            return;
        }
    };
    loop {
        tokio::select! {
            ev = rx.recv() => {
                let Some(ev) = ev else {
                    let ev = ExecEvent::Error {
                        code: threadbox_api::ErrorCode::Unavailable,
                        message: "the stream ended without an end event".into(),
                    };
                    let _ = socket.send(Message::Text(serde_json::to_string(&ev).unwrap_or_default().into())).await;
                    break;
                };
                let last = matches!(ev, ExecEvent::End { .. } | ExecEvent::Error { .. });
                let text = serde_json::to_string(&ev).unwrap_or_default();
                if socket.send(Message::Text(text.into())).await.is_err() {
                    // Dropping the receiver cancels the call (the client left).
                    return;
                }
                if last {
                    break;
                }
            }
            msg = socket.recv() => match msg {
                // The client left: dropping the receiver cancels the process.
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            },
        }
    }
    close(&mut socket, "done").await;
}
