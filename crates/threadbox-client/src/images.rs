//! OCI images (issue 14): the pull's NDJSON progress stream, import, removal.

use crate::error::{ClientError, Result};
use crate::transport::json_body;
use crate::Client;
use bytes::BytesMut;
use futures::stream::BoxStream;
use http_body_util::BodyExt;
use hyper::Method;
use threadbox_api::images::{ImageEvent, ImportImageRequest, PullImageRequest};
use threadbox_api::{ops, routes, Image};

/// Bound on one line of a pull's stream (an image with its facts is small).
const MAX_LINE: usize = 1 << 20;

impl Client {
    /// Pulls an image; yields `resolved`, `progress`, `layer` events, then `done` or
    /// `error` (a stream cut before either ends with an error item).
    pub async fn pull_image_stream(
        &self,
        req: &PullImageRequest,
    ) -> Result<BoxStream<'static, Result<ImageEvent>>> {
        let resp = self
            .send(
                Method::POST,
                routes::IMAGES_PULL,
                json_body(req)?,
                Some("application/json"),
            )
            .await?;
        let url = self.url.clone();
        let st = (resp.into_body(), BytesMut::new(), false);
        Ok(Box::pin(futures::stream::unfold(
            st,
            move |(mut body, mut buf, done)| {
                let url = url.clone();
                async move {
                    if done {
                        return None;
                    }
                    loop {
                        if let Some(i) = buf.iter().position(|b| *b == b'\n') {
                            let l = buf.split_to(i + 1);
                            if l[..i].iter().all(u8::is_ascii_whitespace) {
                                continue;
                            }
                            let item = serde_json::from_slice::<ImageEvent>(&l[..i])
                                .map_err(|e| ClientError::Decode(format!("bad image event: {e}")));
                            let end = !matches!(
                                item,
                                Ok(ImageEvent::Resolved { .. }
                                    | ImageEvent::Progress { .. }
                                    | ImageEvent::Layer { .. })
                            );
                            return Some((item, (body, buf, end)));
                        }
                        if buf.len() > MAX_LINE {
                            let e = ClientError::Decode("an image event line is too long".into());
                            return Some((Err(e), (body, buf, true)));
                        }
                        match body.frame().await {
                            Some(Ok(f)) => {
                                if let Ok(d) = f.into_data() {
                                    buf.extend_from_slice(&d);
                                }
                            }
                            Some(Err(source)) => {
                                return Some((
                                    Err(ClientError::Http { url, source }),
                                    (body, buf, true),
                                ))
                            }
                            None => {
                                let e = ClientError::Decode(
                                    "the pull's stream ended without `done` or `error`".into(),
                                );
                                return Some((Err(e), (body, buf, true)));
                            }
                        }
                    }
                }
            },
        )))
    }

    /// Pulls an image and waits for it (progress unseen).
    pub async fn pull_image(&self, req: &PullImageRequest) -> Result<Image> {
        use futures::StreamExt;
        // The route answers a stream, not one JSON value: read it to its last event.
        let mut s = self.pull_image_stream(req).await?;
        while let Some(ev) = s.next().await {
            match ev? {
                ImageEvent::Done { image } => return Ok(image),
                // A failure after the stream began: the HTTP status was 200 already.
                ImageEvent::Error { code, message } => {
                    return Err(ClientError::Api {
                        status: 200,
                        code,
                        message,
                    })
                }
                _ => {}
            }
        }
        Err(ClientError::Decode(
            "the pull's stream ended without an answer".into(),
        ))
    }

    /// Imports a `docker save` archive or an OCI layout on the daemon's host.
    pub async fn import_image(&self, req: &ImportImageRequest) -> Result<Image> {
        self.call(&ops::ImportImage(req.clone())).await
    }

    /// Removes an image (`conflict` while a sandbox uses it).
    pub async fn remove_image(&self, image: &str) -> Result<()> {
        self.call(&ops::RemoveImage {
            image: image.to_string(),
        })
        .await
    }
}
