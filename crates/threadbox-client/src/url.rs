//! Where the daemon is: the URL the CLI resolves from its environment, and its parse into
//! an endpoint (a unix socket, or TCP with an optional path prefix).

use crate::error::{ClientError, Result};
use std::path::{Path, PathBuf};

/// Default root of the daemon's state; `THREADBOX_ROOT` overrides it.
pub const DEFAULT_ROOT: &str = "/var/lib/threadbox";
/// Name of the daemon's unix socket inside its root.
pub const SOCKET_NAME: &str = "threadbox.sock";
/// TCP address tried when no socket is found.
pub const DEFAULT_HTTP_URL: &str = "http://127.0.0.1:7420";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Unix(PathBuf),
    /// `host:port`, plus a path prefix without a trailing slash.
    Tcp {
        authority: String,
        prefix: String,
    },
}

/// The URL the CLI talks to: `explicit`, else `THREADBOX_URL`, else the local socket
/// `<THREADBOX_ROOT or /var/lib/threadbox>/threadbox.sock` when it exists, else
/// `http://127.0.0.1:7420`.
pub fn resolve_url(explicit: Option<&str>) -> String {
    if let Some(url) = explicit.filter(|u| !u.is_empty()) {
        return url.to_string();
    }
    if let Some(url) = std::env::var("THREADBOX_URL")
        .ok()
        .filter(|u| !u.is_empty())
    {
        return url;
    }
    let root = std::env::var_os("THREADBOX_ROOT")
        .filter(|r| !r.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT));
    let socket = root.join(SOCKET_NAME);
    if socket.exists() {
        return format!("unix://{}", socket.display());
    }
    DEFAULT_HTTP_URL.to_string()
}

/// The path of the daemon's socket under `root`.
pub fn socket_path(root: &Path) -> PathBuf {
    root.join(SOCKET_NAME)
}

pub(crate) fn parse_url(url: &str) -> Result<Endpoint> {
    let invalid = |reason: &str| ClientError::InvalidUrl {
        url: url.to_string(),
        reason: reason.to_string(),
    };
    if let Some(path) = url.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(invalid(
                "a unix socket URL needs an absolute path: unix:///path/to.sock",
            ));
        }
        return Ok(Endpoint::Unix(PathBuf::from(path)));
    }
    if let Some(rest) = url.strip_prefix("http://") {
        let (authority, prefix) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(invalid("missing host"));
        }
        if authority.contains('@') || authority.contains('?') || authority.contains('#') {
            return Err(invalid("expected http://host:port"));
        }
        let authority = if has_port(authority) {
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        return Ok(Endpoint::Tcp {
            authority,
            prefix: prefix.to_string(),
        });
    }
    if url.starts_with("https://") {
        return Err(invalid(
            "https is not supported yet; use http:// on loopback or unix://",
        ));
    }
    Err(invalid("expected unix:///path/to.sock or http://host:port"))
}

fn has_port(authority: &str) -> bool {
    match authority.rfind(':') {
        // `[::1]:7420` has a port, `[::1]` has none.
        Some(i) => !authority[i..].contains(']'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        assert_eq!(
            parse_url("unix:///var/lib/threadbox/threadbox.sock").unwrap(),
            Endpoint::Unix(PathBuf::from("/var/lib/threadbox/threadbox.sock"))
        );
        assert_eq!(
            parse_url("http://127.0.0.1:7420").unwrap(),
            Endpoint::Tcp {
                authority: "127.0.0.1:7420".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            parse_url("http://localhost/api/").unwrap(),
            Endpoint::Tcp {
                authority: "localhost:80".into(),
                prefix: "/api".into()
            }
        );
        assert_eq!(
            parse_url("http://[::1]").unwrap(),
            Endpoint::Tcp {
                authority: "[::1]:80".into(),
                prefix: String::new()
            }
        );
        for bad in [
            "unix://relative",
            "ftp://x",
            "https://x",
            "http://",
            "127.0.0.1:7420",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }
}
