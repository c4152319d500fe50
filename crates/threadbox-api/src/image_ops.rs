//! The OCI image operations (issue 14, ADR 0108), declared as [`crate::ops`] declares the
//! others (ADR 0057); re-exported from there.

use crate::images::*;
use crate::ops::{HttpMethod, Operation};
use crate::*;

/// Pull an image; the REST answer is an NDJSON stream of [`ImageEvent`]s, the
/// operation's output the image when it is in the catalog.
#[derive(Debug, Clone)]
pub struct PullImage(pub PullImageRequest);

impl Operation for PullImage {
    type Output = Image;
    const NAME: &'static str = "image.pull";
    const SCOPE: Scope = Scope::Admin;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::IMAGES_PULL;
    fn body(&self) -> Option<serde_json::Value> {
        serde_json::to_value(&self.0).ok()
    }
}

/// Import a `docker save` archive or an OCI layout from the daemon's host.
#[derive(Debug, Clone)]
pub struct ImportImage(pub ImportImageRequest);

impl Operation for ImportImage {
    type Output = Image;
    const NAME: &'static str = "image.import";
    const SCOPE: Scope = Scope::Admin;
    const METHOD: HttpMethod = HttpMethod::Post;
    const PATH: &'static str = routes::IMAGES_IMPORT;
    fn body(&self) -> Option<serde_json::Value> {
        serde_json::to_value(&self.0).ok()
    }
}

/// Remove an image from the catalog (`conflict` while a sandbox uses it); layers no other
/// image uses are deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoveImage {
    pub image: String,
}

impl Operation for RemoveImage {
    type Output = ();
    const NAME: &'static str = "image.remove";
    const SCOPE: Scope = Scope::Admin;
    const METHOD: HttpMethod = HttpMethod::Delete;
    const PATH: &'static str = routes::IMAGE;
    fn path_values(&self) -> Vec<String> {
        vec![self.image.clone()]
    }
}
