//! The exec stream's NDJSON body, split into typed events with a bound on each line.

use crate::error::{ClientError, Result};
use bytes::BytesMut;
use futures::stream::BoxStream;
use futures::StreamExt;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use threadbox_api::interp::CodeEvent;
use threadbox_api::ExecEvent;

/// An event of an NDJSON stream: which ones end it.
pub(crate) trait StreamEvent: serde::de::DeserializeOwned + Send + 'static {
    fn is_terminal(&self) -> bool;
}

impl StreamEvent for ExecEvent {
    fn is_terminal(&self) -> bool {
        matches!(self, ExecEvent::End { .. } | ExecEvent::Error { .. })
    }
}

impl StreamEvent for CodeEvent {
    fn is_terminal(&self) -> bool {
        matches!(self, CodeEvent::End { .. } | CodeEvent::Error { .. })
    }
}

/// Bound on one NDJSON line of an exec stream.
const MAX_EVENT_LINE_BYTES: usize = 64 << 20;

/// Splits an NDJSON body into events. A body that ends without a terminal event yields
/// a final error, so callers never mistake a cut stream for a finished process.
pub(crate) fn ndjson_events<T: StreamEvent>(
    body: Incoming,
    url: String,
) -> BoxStream<'static, Result<T>> {
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
                let item = serde_json::from_slice::<T>(line)
                    .map_err(|e| ClientError::Decode(format!("bad stream event: {e}")));
                if item.as_ref().map_or(true, T::is_terminal) {
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
                        let item = serde_json::from_slice::<T>(&st.buf)
                            .map_err(|e| ClientError::Decode(format!("bad stream event: {e}")));
                        if item.as_ref().is_ok_and(T::is_terminal) {
                            return Some((item, st));
                        }
                    }
                    return Some((
                        Err(ClientError::Decode(
                            "the stream ended before its end event".to_string(),
                        )),
                        st,
                    ));
                }
            }
        }
    })
    .boxed()
}
