//! Image references as Docker and the OCI tools write them: `[registry/]repo[:tag][@digest]`,
//! with Docker Hub's defaults (`docker.io`, `library/`, `latest`).

use crate::digest::Digest;
use crate::error::{OciError, Result};
use std::fmt;

/// The registry Docker Hub's API is served from.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// `host[:port]` as written (`docker.io` for Docker Hub).
    pub registry: String,
    /// The repository path (`library/python`).
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

fn is_component(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
}

impl Reference {
    pub fn parse(s: &str) -> Result<Reference> {
        let bad = |why: &str| OciError::Invalid(format!("image reference {s:?}: {why}"));
        if s.is_empty() || s.len() > 512 {
            return Err(bad("must be 1-512 characters"));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(Digest::parse(d)?)),
            None => (s, None),
        };
        let (name, tag) = match rest.rfind(':') {
            Some(i) if !rest[i + 1..].contains('/') => {
                (&rest[..i], Some(rest[i + 1..].to_string()))
            }
            _ => (rest, None),
        };
        if let Some(t) = &tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
                && t.as_bytes()[0] != b'.'
                && t.as_bytes()[0] != b'-';
            if !ok {
                return Err(bad("the tag must be 1-128 of A-Z a-z 0-9 _ . -"));
            }
        }
        let (registry, repo) = match name.split_once('/') {
            Some((first, more))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), more.to_string())
            }
            _ => ("docker.io".to_string(), name.to_string()),
        };
        let repository = if registry == "docker.io" && !repo.contains('/') {
            format!("library/{repo}")
        } else {
            repo
        };
        if !repository.split('/').all(is_component) {
            return Err(bad(
                "the repository must be lowercase path components of a-z 0-9 . _ -",
            ));
        }
        if registry.is_empty()
            || !registry
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
        {
            return Err(bad("bad registry host"));
        }
        if !registry.starts_with('[') {
            if let Some((_, port)) = registry.split_once(':') {
                if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad("the registry's port must be a number"));
                }
            }
        }
        let tag = if tag.is_none() && digest.is_none() {
            Some("latest".to_string())
        } else {
            tag
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The host the API is reached at (Docker Hub's differs from its name).
    pub fn api_host(&self) -> &str {
        if self.registry == "docker.io" {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// What goes after `/manifests/`: the digest when there is one (it pins), else the tag.
    pub fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }

    /// Whether the registry is on this host (spoken to over plain HTTP, as Docker does).
    pub fn is_loopback(&self) -> bool {
        let host = match self.registry.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => &self.registry,
        };
        host == "localhost" || host.starts_with("127.") || host == "[::1]"
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_hub_defaults_and_registries() {
        let r = Reference::parse("python:3.12-slim").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("docker.io", "library/python", Some("3.12-slim"))
        );
        assert_eq!(r.api_host(), DOCKER_HUB_API);
        let r = Reference::parse("localhost:5000/team/app").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("localhost:5000", "team/app", Some("latest"))
        );
        assert!(r.is_loopback());
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("ghcr.io/o/r@{d}")).unwrap();
        assert_eq!(r.manifest_ref(), d);
        assert_eq!(r.tag, None);
        assert!(!r.is_loopback());
        for bad in ["", "UPPER/case", "a:b:c/d", "x:", "r@sha256:zz", "a//b"] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }
}
