//! The host side of the agent protocol: one multiplexed connection per sandbox.

use crate::error::{CoreError, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use threadbox_proto::{encode_frame, Frame, FrameDecoder, Hello, Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

type Pending = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<Response>>>>;

pub struct AgentConn {
    writer: mpsc::UnboundedSender<Vec<u8>>,
    pending: Pending,
    next_id: AtomicU64,
    closed: Arc<AtomicBool>,
    pub peer: Hello,
}

const CAPABILITIES: &[&str] = &["exec", "stream", "background", "files", "selftest"];

fn lost(e: impl std::fmt::Display) -> CoreError {
    CoreError::Unavailable(format!("connection to the sandbox agent failed: {e}"))
}

impl AgentConn {
    /// Connects through `driver` and performs the version handshake, all within
    /// `timeout` (the driver's connect waits for an agent still starting).
    pub async fn connect(
        driver: &dyn crate::driver::Driver,
        id: &str,
        timeout: Duration,
    ) -> Result<Arc<AgentConn>> {
        tokio::time::timeout(timeout, async {
            let stream = driver.connect(id).await?;
            Self::handshake(stream).await
        })
        .await
        .map_err(|_| CoreError::Unavailable("the sandbox agent did not answer in time".into()))?
    }

    /// Speaks the agent protocol over `stream`: the handshake, then the reader and
    /// writer tasks.
    pub async fn handshake(stream: crate::driver::AgentStream) -> Result<Arc<AgentConn>> {
        let (mut rd, mut wr) = tokio::io::split(stream);
        let hello = encode_frame(&Frame::Hello(Hello::ours(
            concat!("threadbox ", env!("CARGO_PKG_VERSION")),
            CAPABILITIES,
        )))
        .map_err(lost)?;
        wr.write_all(&hello).await.map_err(lost)?;

        let mut dec = FrameDecoder::new();
        let mut buf = vec![0u8; 64 * 1024];
        let peer = loop {
            if let Some(f) = dec.next_frame().map_err(lost)? {
                match f {
                    Frame::Hello(h) => {
                        h.check().map_err(lost)?;
                        break h;
                    }
                    _ => return Err(lost("agent did not start with a handshake")),
                }
            }
            let n = rd.read(&mut buf).await.map_err(lost)?;
            if n == 0 {
                return Err(lost("agent closed the connection during the handshake"));
            }
            dec.feed(&buf[..n]);
        };

        let (wtx, mut wrx) = mpsc::unbounded_channel::<Vec<u8>>();
        let pending: Pending = Arc::new(Mutex::new(HashMap::new()));
        let closed = Arc::new(AtomicBool::new(false));

        let closed_w = closed.clone();
        tokio::spawn(async move {
            while let Some(bytes) = wrx.recv().await {
                if wr.write_all(&bytes).await.is_err() {
                    break;
                }
            }
            closed_w.store(true, Ordering::SeqCst);
        });

        let pending_r = pending.clone();
        let closed_r = closed.clone();
        tokio::spawn(async move {
            'outer: loop {
                loop {
                    match dec.next_frame() {
                        Ok(Some(Frame::Response { id, resp })) => {
                            let fin = resp.is_final();
                            let mut map = pending_r.lock().unwrap_or_else(|p| p.into_inner());
                            if let Some(tx) = map.get(&id) {
                                let _ = tx.send(resp);
                            }
                            if fin {
                                map.remove(&id);
                            }
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!("agent protocol error: {e}");
                            break 'outer;
                        }
                    }
                }
                match rd.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => dec.feed(&buf[..n]),
                }
            }
            closed_r.store(true, Ordering::SeqCst);
            // Dropping the senders wakes every waiter with "connection lost".
            pending_r.lock().unwrap_or_else(|p| p.into_inner()).clear();
        });

        Ok(Arc::new(AgentConn {
            writer: wtx,
            pending,
            next_id: AtomicU64::new(1),
            closed,
            peer,
        }))
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Sends a request; the receiver yields every response frame, the last one final.
    pub fn send(&self, req: Request) -> Result<(u64, mpsc::UnboundedReceiver<Response>)> {
        if self.is_closed() {
            return Err(lost("connection closed"));
        }
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let bytes = encode_frame(&Frame::Request { id, req })
            .map_err(|e| CoreError::TooLarge(format!("request too large for the agent: {e}")))?;
        let (tx, rx) = mpsc::unbounded_channel();
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, tx);
        if self.writer.send(bytes).is_err() {
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return Err(lost("connection closed"));
        }
        Ok((id, rx))
    }

    /// Sends a request and waits for its final response.
    pub async fn call(&self, req: Request) -> Result<Response> {
        let (_, mut rx) = self.send(req)?;
        loop {
            match rx.recv().await {
                Some(r) if r.is_final() => return Ok(r),
                Some(_) => continue,
                None => return Err(lost("connection lost while waiting for an answer")),
            }
        }
    }

    pub fn cancel(&self, id: u64) {
        if let Ok(bytes) = encode_frame(&Frame::Cancel { id }) {
            let _ = self.writer.send(bytes);
        }
    }
}

/// Cancels an in-flight request when dropped (e.g. the HTTP client went away).
pub struct CancelGuard {
    pub conn: Arc<AgentConn>,
    pub id: u64,
    pub armed: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.armed {
            self.conn.cancel(self.id);
        }
    }
}
