//! OCI images (issue 14, ADR 0108): pull with an NDJSON progress stream, import, remove.
//! Thin handlers over the operations of `threadbox_api::image_ops`.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::routes::{ApiJson, ApiPath, St};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use threadbox_api::images::*;
use threadbox_api::{ops, routes, ErrorCode, ErrorResponse, Image};
use threadbox_core::error::CoreError;
use threadbox_core::oci::PullImageWithProgress;
use tokio::sync::mpsc;

fn line(ev: &ImageEvent) -> Bytes {
    let mut l = serde_json::to_vec(ev).unwrap_or_else(|_| {
        br#"{"event":"error","code":"internal","message":"cannot serialize an image event"}"#
            .to_vec()
    });
    l.push(b'\n');
    Bytes::from(l)
}

#[utoipa::path(post, path = routes::IMAGES_PULL, tag = "images",
    request_body = PullImageRequest,
    responses(
        (status = 200, description = "NDJSON: one `ImageEvent` per line: `resolved`, `progress` and `layer` lines, then `done` (with the image) or `error`",
            body = ImageEvent, content_type = "application/x-ndjson"),
        (status = "default", description = "Error before the first layer (bad reference, refused credentials, no such image)", body = ErrorResponse)))]
pub(crate) async fn pull_image(
    State(st): St,
    Auth(caller): Auth,
    ApiJson(request): ApiJson<PullImageRequest>,
) -> Result<Response, ApiError> {
    let (tx, mut rx) = mpsc::channel::<ImageEvent>(256);
    let (done_tx, mut done_rx) = mpsc::channel::<Result<Image, CoreError>>(1);
    let st2 = st.clone();
    tokio::spawn(async move {
        let r = st2
            .manager
            .run(
                &caller,
                PullImageWithProgress {
                    request,
                    events: tx,
                },
            )
            .await;
        let _ = done_tx.send(r).await;
    });
    // Until the manifest is resolved, a failure is an HTTP error; after it, a line.
    let first = tokio::select! {
        ev = rx.recv() => ev,
        r = done_rx.recv() => match r {
            Some(Ok(image)) => Some(ImageEvent::Done { image }),
            Some(Err(e)) => return Err(e.into()),
            None => None,
        },
    };
    let stream = futures::stream::unfold(
        (first, rx, done_rx, false),
        |(pending, mut rx, mut done_rx, finished)| async move {
            if finished {
                return None;
            }
            let ev = match pending {
                Some(ev) => ev,
                None => match rx.recv().await {
                    Some(ev) => ev,
                    None => match done_rx.recv().await {
                        Some(Ok(image)) => ImageEvent::Done { image },
                        Some(Err(e)) => ImageEvent::Error {
                            code: e.code(),
                            message: e.to_string(),
                        },
                        None => ImageEvent::Error {
                            code: ErrorCode::Internal,
                            message: "the pull ended without an answer".into(),
                        },
                    },
                },
            };
            let end = matches!(ev, ImageEvent::Done { .. } | ImageEvent::Error { .. });
            Some((
                Ok::<_, std::convert::Infallible>(line(&ev)),
                (None, rx, done_rx, end),
            ))
        },
    );
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-ndjson"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

#[utoipa::path(post, path = routes::IMAGES_IMPORT, tag = "images",
    request_body = ImportImageRequest,
    responses(
        (status = 201, description = "Imported", body = Image),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn import_image(
    State(st): St,
    Auth(caller): Auth,
    ApiJson(req): ApiJson<ImportImageRequest>,
) -> Result<(StatusCode, ApiJson<Image>), ApiError> {
    let image = st.run(&caller, ops::ImportImage(req)).await?;
    Ok((StatusCode::CREATED, ApiJson(image)))
}

#[utoipa::path(delete, path = routes::IMAGE, tag = "images",
    params(("image" = String, Path, description = "Image name")),
    responses(
        (status = 204, description = "Removed (with the layers no other image uses)"),
        (status = 409, description = "A sandbox uses the image", body = ErrorResponse),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn remove_image(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(image): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    st.run(&caller, ops::RemoveImage { image }).await?;
    Ok(StatusCode::NO_CONTENT)
}
