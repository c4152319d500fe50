//! The JSON documents of an image: indexes (manifest lists), manifests and the image
//! config, in both their OCI and Docker v2 spellings (the same fields under other media
//! types). Only the fields threadbox uses are read; unknown ones are ignored.

use crate::digest::Digest;
use crate::error::{OciError, Result};
use serde::{Deserialize, Serialize};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// What a manifest request accepts, in order of preference.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.docker.distribution.manifest.v2+json";
/// The largest manifest or config read into memory.
pub const MAX_DOCUMENT: u64 = 4 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

impl Platform {
    /// The host's platform in OCI's words (`linux/amd64`, `linux/arm64/v8`).
    pub fn host() -> Platform {
        let (arch, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "aarch64" => ("arm64", Some("v8")),
            "x86" => ("386", None),
            "arm" => ("arm", Some("v7")),
            "powerpc64" => ("ppc64le", None),
            "s390x" => ("s390x", None),
            "riscv64" => ("riscv64", None),
            other => (other, None),
        };
        Platform {
            architecture: arch.into(),
            os: "linux".into(),
            variant: variant.map(Into::into),
        }
    }

    /// `os/arch[/variant]`.
    pub fn parse(s: &str) -> Result<Platform> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok =
            |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: None,
            }),
            [os, arch, v] if ok(os) && ok(arch) && ok(v) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: Some(v.to_string()),
            }),
            _ => Err(OciError::Invalid(format!(
                "platform {s:?} must be os/arch or os/arch/variant (e.g. linux/amd64)"
            ))),
        }
    }

    /// Whether an index entry of platform `other` runs here. A missing variant on either
    /// side matches (most indexes leave `v8` out for arm64).
    pub fn matches(&self, other: &Platform) -> bool {
        self.os == other.os
            && self.architecture == other.architecture
            && match (&self.variant, &other.variant) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

/// An index or a manifest: which one is told by the fields present (and the media type).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Document {
    #[serde(default)]
    pub schema_version: u32,
    #[serde(default)]
    pub media_type: Option<String>,
    #[serde(default)]
    pub manifests: Option<Vec<Descriptor>>,
    #[serde(default)]
    pub config: Option<Descriptor>,
    #[serde(default)]
    pub layers: Option<Vec<Descriptor>>,
}

/// A parsed manifest document.
#[derive(Debug, Clone)]
pub enum Parsed {
    Index(Vec<Descriptor>),
    Manifest {
        config: Descriptor,
        layers: Vec<Descriptor>,
    },
}

pub fn parse_document(bytes: &[u8], content_type: Option<&str>) -> Result<Parsed> {
    let doc: Document = serde_json::from_slice(bytes)
        .map_err(|e| OciError::Registry(format!("manifest is not valid JSON: {e}")))?;
    if doc.schema_version != 2 {
        return Err(OciError::Registry(format!(
            "manifest schema version {} is not supported (only 2: Docker v2 and OCI)",
            doc.schema_version
        )));
    }
    let mt = doc
        .media_type
        .clone()
        .or_else(|| content_type.map(|c| c.split(';').next().unwrap_or("").trim().to_string()))
        .unwrap_or_default();
    if let Some(m) = doc.manifests {
        if !mt.is_empty() && mt != OCI_INDEX && mt != DOCKER_LIST {
            return Err(OciError::Registry(format!(
                "unexpected index media type {mt}"
            )));
        }
        return Ok(Parsed::Index(m));
    }
    match (doc.config, doc.layers) {
        (Some(config), Some(layers)) => Ok(Parsed::Manifest { config, layers }),
        _ => Err(OciError::Registry(format!(
            "manifest of media type {mt:?} has neither manifests nor config and layers"
        ))),
    }
}

/// Picks the manifest for `want` from an index (attestation entries, `unknown/unknown`,
/// never match).
pub fn choose<'a>(entries: &'a [Descriptor], want: &Platform) -> Result<&'a Descriptor> {
    entries
        .iter()
        .find(|d| d.platform.as_ref().is_some_and(|p| want.matches(p)))
        .ok_or_else(|| {
            let have: Vec<String> = entries
                .iter()
                .filter_map(|d| d.platform.as_ref().map(|p| p.to_string()))
                .filter(|p| !p.starts_with("unknown"))
                .collect();
            OciError::NotFound(format!(
                "the image has no {want} variant (it has: {})",
                have.join(", ")
            ))
        })
}

/// The part of the image config a sandbox takes its defaults from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunConfig {
    #[serde(rename = "Env", default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<String>>,
    #[serde(
        rename = "WorkingDir",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub working_dir: Option<String>,
    #[serde(rename = "User", default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(
        rename = "Entrypoint",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd", default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub diff_ids: Vec<Digest>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub variant: Option<String>,
    #[serde(default)]
    pub config: Option<RunConfig>,
    #[serde(default)]
    pub rootfs: RootFs,
}

impl ImageConfig {
    pub fn parse(bytes: &[u8]) -> Result<ImageConfig> {
        serde_json::from_slice(bytes)
            .map_err(|e| OciError::Registry(format!("image config is not valid: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platforms_parse_and_match() {
        let a = Platform::parse("linux/arm64/v8").unwrap();
        assert!(a.matches(&Platform::parse("linux/arm64").unwrap()));
        assert!(!a.matches(&Platform::parse("linux/amd64").unwrap()));
        assert!(Platform::parse("linux").is_err());
        assert_eq!(Platform::host().os, "linux");
    }
}
