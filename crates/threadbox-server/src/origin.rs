//! `Host` and `Origin` checks for every route (DNS rebinding and cross-site requests).
//!
//! A web page the operator visits can send requests to `127.0.0.1:7420`: a form post or a
//! body-less `fetch` needs no CORS preflight, and a DNS-rebinding page even becomes
//! same-origin with the daemon. Without API keys (`--insecure-no-auth`) either one drives
//! the daemon as the operator. So, with the same allowlists as `/mcp` ([`McpOptions`],
//! `--allowed-host`/`--allowed-origin`):
//!
//! - **Host**, on the TCP doors: a `Host` that is not allowed is refused (403). A rebinding
//!   page's requests carry its own hostname, never `127.0.0.1`. `/healthz` is exempt: it
//!   carries no data, and health probes (Kubernetes, load balancers) send the address
//!   they dialled.
//! - **Origin**, on every door: a request that carries an `Origin` not in the list is
//!   refused (403), whatever its method. Non-browser clients send none and always pass.
//!   The unix socket is included because a local reverse proxy may forward browser
//!   requests to it.
//!
//! - **Pages without an Origin**: a request whose `Sec-Fetch-Site` says a page made it
//!   (anything but `none`) and that carries no allowed `Origin` is refused (403): pages
//!   of path-form previews live on the daemon's own origin (ADR 0072).
//!
//! The unix socket does not check `Host` (ADR 0030): only the socket's owner can connect,
//! and clients send whatever they like there (`curl --unix-socket` sends `localhost`).
//! `/mcp` is checked here and again by rmcp with the same lists; rmcp checks `Host` on the
//! socket too, as it always did.
//!
//! Matching follows rmcp's, so both layers agree: hosts are compared case-insensitively
//! without brackets; an allowed entry without a port matches any port. Origins match by
//! (scheme, host, port); an allowed origin without a port or with `:*` matches any port.

use crate::auth::Door;
use crate::error::ApiError;
use crate::mcp::McpOptions;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use threadbox_api::ErrorCode;

/// A host and optional port, normalised for comparison.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Authority {
    host: String,
    port: Option<u16>,
}

fn normalize_host(host: &str) -> String {
    host.trim_matches(['[', ']']).to_ascii_lowercase()
}

fn parse_authority(text: &str) -> Option<Authority> {
    let a = axum::http::uri::Authority::try_from(text.trim()).ok()?;
    // userinfo in a Host header is never legitimate.
    if a.as_str().contains('@') {
        return None;
    }
    Some(Authority {
        host: normalize_host(a.host()),
        port: a.port_u16(),
    })
}

fn host_allowed(host: &Authority, allowed: &[String]) -> bool {
    allowed.iter().any(|entry| {
        let entry = entry.trim();
        if entry == "*" {
            return true;
        }
        let a = parse_authority(entry).unwrap_or_else(|| Authority {
            host: normalize_host(entry),
            port: None,
        });
        a.host == host.host && a.port.is_none_or(|p| host.port == Some(p))
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    Null,
    Tuple {
        scheme: String,
        host: String,
        port: Option<u16>,
    },
}

fn parse_origin(text: &str) -> Option<Origin> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("null") {
        return Some(Origin::Null);
    }
    let uri = Uri::try_from(text).ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?;
    Some(Origin::Tuple {
        scheme,
        host: normalize_host(authority.host()),
        port: authority.port_u16(),
    })
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    }
}

fn origin_allowed(origin: &Origin, allowed: &[String]) -> bool {
    allowed.iter().any(|entry| {
        let entry = entry.trim();
        if entry == "*" {
            return true;
        }
        let (base, any_port) = match entry.strip_suffix(":*") {
            Some(base) => (base, true),
            None => (entry, false),
        };
        match (parse_origin(base), origin) {
            (Some(Origin::Null), Origin::Null) => !any_port,
            (
                Some(Origin::Tuple { scheme, host, port }),
                Origin::Tuple {
                    scheme: o_scheme,
                    host: o_host,
                    port: o_port,
                },
            ) => {
                let port_ok = match port {
                    _ if any_port => true,
                    None => true,
                    Some(p) => o_port.or_else(|| default_port(o_scheme)) == Some(p),
                };
                &scheme == o_scheme && &host == o_host && port_ok
            }
            _ => false,
        }
    })
}

/// Marks a request made by a page on the daemon's own origin that may be the dashboard's
/// (it carries the dashboard's cookie): the auth layer then accepts only a dashboard
/// session with its CSRF token for it (ADR 0096).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PageRequest;

/// Does `origin` name the daemon as the browser reached it (`Host`)?
fn same_origin(origin: &Origin, host: Option<&Authority>) -> bool {
    let (
        Origin::Tuple {
            scheme,
            host: oh,
            port: op,
        },
        Some(h),
    ) = (origin, host)
    else {
        return false;
    };
    let d = default_port(scheme);
    oh == &h.host && op.or(d) == h.port.or(d)
}

fn header_is(headers: &HeaderMap, name: &str, want: &str) -> bool {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case(want))
}

/// Why a request is refused, if it is; `Ok(true)` for a same-origin page's request that
/// goes to the dashboard's rules ([`PageRequest`]).
fn check(
    door: Door,
    path: &str,
    uri: &Uri,
    headers: &HeaderMap,
    policy: &McpOptions,
) -> Result<bool, ApiError> {
    let forbidden = |m: String| ApiError::new(ErrorCode::PermissionDenied, m);
    let host = match headers.get(header::HOST) {
        Some(v) => v.to_str().ok().and_then(parse_authority),
        // HTTP/2 carries the host in `:authority`.
        None => uri.authority().and_then(|a| parse_authority(a.as_str())),
    };
    if door != Door::Socket && path != "/healthz" {
        let Some(host) = host.as_ref() else {
            return Err(ApiError::invalid("missing or malformed Host header"));
        };
        if !host_allowed(host, &policy.allowed_hosts) {
            tracing::warn!(host = %host.host, port = ?host.port, %path,
                "refused a request for a Host that is not allowed (DNS rebinding?)");
            return Err(forbidden(format!(
                "Host {:?} is not allowed (the daemon accepts {}; add names with \
                 `threadbox serve --allowed-host`)",
                host.host,
                policy.allowed_hosts.join(", ")
            )));
        }
    }
    // The dashboard's page (or one that may be it: the auth layer tells): its own paths,
    // or the API with its cookie.
    let ui = crate::ui_routes::is_ui_path(path);
    let dashboard =
        ui || crate::ui_routes::cookie(headers, crate::ui_routes::SESSION_COOKIE).is_some();
    if let Some(v) = headers.get(header::ORIGIN) {
        let origin = v.to_str().ok().and_then(parse_origin);
        if dashboard
            && origin
                .as_ref()
                .is_some_and(|o| same_origin(o, host.as_ref()))
        {
            return Ok(true);
        }
        let allowed = origin
            .as_ref()
            .is_some_and(|o| origin_allowed(o, &policy.allowed_origins));
        if !allowed {
            let shown = String::from_utf8_lossy(v.as_bytes()).into_owned();
            tracing::warn!(origin = %shown.escape_debug(), %path,
                "refused a request from a browser Origin that is not allowed (cross-site?)");
            return Err(forbidden(format!(
                "Origin {shown:?} is not allowed (browser pages may call the daemon only \
                 from origins named with `threadbox serve --allowed-origin`)"
            )));
        }
    } else if !carries_nothing(path) && fetched_by_a_page(headers) {
        // A same-origin GET sends no Origin: the dashboard's reads, or a preview page's.
        if dashboard && header_is(headers, "sec-fetch-site", "same-origin") {
            return Ok(true);
        }
        // A link to the dashboard from anywhere opens its login page (the cookie is
        // SameSite=Strict: a cross-site navigation does not carry it).
        if ui && header_is(headers, "sec-fetch-mode", "navigate") {
            return Ok(true);
        }
        // No Origin, yet a browser says a page made the request: a same-origin GET (a
        // page of a path-form preview lives on the daemon's origin) or a no-cors load.
        // No page may call the API without an allowed Origin (ADR 0072); a link to the
        // health check or the API description still opens.
        tracing::warn!(%path, "refused a request a web page made without an Origin");
        return Err(forbidden(
            "a request made by a web page (Sec-Fetch-Site) without an allowed Origin is \
             refused: preview pages share the daemon's address but not its API"
                .into(),
        ));
    }
    Ok(false)
}

/// Routes with nothing of anyone's in them.
fn carries_nothing(path: &str) -> bool {
    path == threadbox_api::routes::HEALTHZ || path == threadbox_api::routes::OPENAPI
}

/// `Sec-Fetch-Site` other than `none` (the user's own navigation): a page initiated it.
fn fetched_by_a_page(headers: &HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("none"))
}

/// The middleware: refuses before authentication, so a refused page learns nothing else.
pub(crate) async fn check_host_and_origin(
    State(policy): State<Arc<McpOptions>>,
    mut req: Request,
    next: Next,
) -> Response {
    let door = req.extensions().get::<Door>().copied().unwrap_or(Door::Tcp);
    match check(door, req.uri().path(), req.uri(), req.headers(), &policy) {
        Err(e) => {
            let mut resp = e.into_response();
            resp.extensions_mut()
                .insert(crate::metrics::RejectReason("host_or_origin"));
            return resp;
        }
        Ok(true) => {
            req.extensions_mut().insert(PageRequest);
        }
        Ok(false) => {}
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(host: Option<&str>, origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(v) = host {
            h.insert(header::HOST, HeaderValue::from_str(v).unwrap());
        }
        if let Some(v) = origin {
            h.insert(header::ORIGIN, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn ok(
        door: Door,
        path: &str,
        host: Option<&str>,
        origin: Option<&str>,
        p: &McpOptions,
    ) -> bool {
        check(
            door,
            path,
            &Uri::from_static("/"),
            &headers(host, origin),
            p,
        )
        .is_ok()
    }

    #[test]
    fn loopback_hosts_pass_and_foreign_hosts_are_refused_on_tcp() {
        let p = McpOptions::default();
        for h in ["localhost", "127.0.0.1:7420", "[::1]:7420", "LOCALHOST:1"] {
            assert!(
                ok(Door::TcpInsecure, "/v1/sandboxes", Some(h), None, &p),
                "{h}"
            );
        }
        for h in [
            "rebind.evil.example:7420",
            "127.0.0.1.evil.example",
            "localhost.",
            "a@localhost",
        ] {
            assert!(
                !ok(Door::TcpInsecure, "/v1/sandboxes", Some(h), None, &p),
                "{h}"
            );
            assert!(!ok(Door::Tcp, "/v1/sandboxes", Some(h), None, &p), "{h}");
        }
        assert!(!ok(Door::Tcp, "/v1/sandboxes", None, None, &p));
        // Exempt: the socket (any Host), and /healthz.
        assert!(ok(
            Door::Socket,
            "/v1/sandboxes",
            Some("evil.example"),
            None,
            &p
        ));
        assert!(ok(Door::Socket, "/v1/sandboxes", None, None, &p));
        assert!(ok(Door::Tcp, "/healthz", Some("10.1.2.3:7420"), None, &p));
    }

    #[test]
    fn extra_hosts_with_and_without_port() {
        let p = McpOptions::default()
            .with_extra_hosts(["box.example".to_string(), "api.example:8443".to_string()]);
        assert!(ok(Door::Tcp, "/v1", Some("box.example:1234"), None, &p));
        assert!(ok(Door::Tcp, "/v1", Some("api.example:8443"), None, &p));
        assert!(!ok(Door::Tcp, "/v1", Some("api.example:8444"), None, &p));
        let any = McpOptions::default().with_extra_hosts(["*".to_string()]);
        assert!(ok(Door::Tcp, "/v1", Some("whatever.example"), None, &any));
    }

    #[test]
    fn any_origin_is_refused_by_default_on_every_door() {
        let p = McpOptions::default();
        for door in [Door::Socket, Door::Tcp, Door::TcpInsecure] {
            assert!(ok(door, "/v1/sandboxes", Some("localhost"), None, &p));
            for o in [
                "http://evil.example",
                "null",
                "http://127.0.0.1:7420",
                "garbage",
            ] {
                assert!(
                    !ok(door, "/v1/sandboxes", Some("localhost"), Some(o), &p),
                    "{o}"
                );
            }
        }
    }

    #[test]
    fn allowed_origins_match_scheme_host_and_port() {
        let p = McpOptions {
            allowed_origins: vec![
                "https://app.example:443".into(),
                "http://localhost:*".into(),
                "http://portless.example".into(),
            ],
            ..McpOptions::default()
        };
        let t = |o: &str| ok(Door::Tcp, "/v1", Some("localhost"), Some(o), &p);
        assert!(t("https://app.example"));
        assert!(t("https://APP.example:443"));
        assert!(!t("http://app.example"));
        assert!(!t("https://app.example:8443"));
        assert!(t("http://localhost:3000"));
        assert!(t("http://portless.example:81"));
        assert!(!t("http://evil.example"));
        assert!(!t("null"));
        let any = McpOptions {
            allowed_origins: vec!["*".into()],
            ..McpOptions::default()
        };
        assert!(ok(
            Door::Tcp,
            "/v1",
            Some("localhost"),
            Some("http://x"),
            &any
        ));
    }

    #[test]
    fn a_page_without_an_origin_is_refused_its_users_navigation_is_not() {
        let p = McpOptions::default();
        for (site, passes) in [
            (None, true),
            (Some("none"), true),
            (Some("same-origin"), false),
            (Some("same-site"), false),
            (Some("cross-site"), false),
        ] {
            let mut h = headers(Some("127.0.0.1:7420"), None);
            if let Some(s) = site {
                h.insert("sec-fetch-site", HeaderValue::from_static(s));
            }
            let uri: Uri = "/v1/sandboxes".parse().unwrap();
            let r = check(Door::Tcp, "/v1/sandboxes", &uri, &h, &p);
            assert_eq!(r.is_ok(), passes, "{site:?}");
            let uri: Uri = "/v1/openapi.json".parse().unwrap();
            assert!(check(Door::Tcp, "/v1/openapi.json", &uri, &h, &p).is_ok());
        }
    }
}
