//! Wire types of OCI images (issue 14, ADR 0108): pulls with their progress events,
//! imports of archives, removal.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Pull an image from an OCI distribution registry.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PullImageRequest {
    /// `[registry/]repository[:tag][@sha256:…]`; Docker Hub when no registry is named.
    pub reference: String,
    /// The catalog name of the image (what `create --image` takes); default: the
    /// reference as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `os/arch[/variant]`; default: the daemon host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
    /// Registry credentials (basic, or for the registry's token service). Never stored
    /// and never audited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Plain HTTP to a registry that is not on loopback (loopback always is).
    #[serde(default)]
    pub insecure: bool,
}

/// Import an image from a file on the daemon's host: a `docker save` archive or an OCI
/// layout (a directory, or a tar of one).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportImageRequest {
    /// Absolute path on the daemon's host.
    pub path: String,
    /// The catalog name; default: the archive's own tag (`RepoTags`, or the layout's
    /// `org.opencontainers.image.ref.name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `os/arch[/variant]` to pick from a multi-platform archive; default: the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
}

/// One line of a pull's NDJSON stream. The last line is `done` or `error`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
// One `done` per pull, carrying the image: boxing it would save nothing worth the noise.
#[allow(clippy::large_enum_variant)]
pub enum ImageEvent {
    /// The manifest is known: `layers` layers of `bytes` compressed bytes.
    Resolved {
        digest: String,
        layers: u32,
        bytes: u64,
    },
    /// Bytes fetched so far, of all layers (sent about every MiB).
    Progress { bytes: u64, total: u64 },
    /// Layer `index` (0 = lowest) is stored; `cached` when it already was.
    Layer { index: u32, cached: bool },
    /// The image is in the catalog.
    Done { image: crate::Image },
    Error {
        code: crate::ErrorCode,
        message: String,
    },
}
