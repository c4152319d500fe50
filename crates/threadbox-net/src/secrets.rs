//! Secrets the sandbox never holds (issue 13 scope 4, ADR 0068): what one sandbox's
//! placeholders stand for, and the pure rewrite of one HTTP/1.1 request head.
//!
//! The sandbox sees a random placeholder in its environment. Only on a request the daemon
//! intercepted for a host a secret names (`mitm.rs`), and only in the header the secret
//! names (Basic auth decoded and re-encoded), is the placeholder replaced by the value. A
//! placeholder anywhere else (the request line, another header, the body, another host)
//! goes out unchanged: the rewrite never widens where a value can go.

use base64::Engine;
use std::fmt;

/// One secret as bound to one sandbox.
#[derive(Clone)]
pub struct SecretSwap {
    /// The secret's name (the env variable), for the log.
    pub name: String,
    /// The host it is for, normalised (lower case, no trailing dot).
    pub host: String,
    /// The header it goes in (compared case-insensitively), `Authorization` by default.
    pub header: String,
    /// How the value is written when the header holds the bare placeholder: `{}` is the
    /// value (`Bearer {}`). A placeholder inside other text is replaced by the value alone.
    pub format: String,
    /// What the sandbox holds instead of the value.
    pub placeholder: String,
    /// The value. Never printed (`Debug` hides it).
    pub value: String,
}

impl fmt::Debug for SecretSwap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretSwap")
            .field("name", &self.name)
            .field("host", &self.host)
            .field("header", &self.header)
            .finish_non_exhaustive()
    }
}

/// Why a request was not passed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not a parseable HTTP/1 request head.
    Malformed,
    /// No Host header (or authority), so the request's host cannot be checked.
    NoHost,
    /// The request names a host other than the one the session was intercepted for.
    HostSwitch(String),
}

/// How the body after a head is framed (requests only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    None,
    Length(u64),
    Chunked,
    /// An upgrade (WebSocket, CONNECT): the rest of the stream is passed through raw.
    Raw,
}

/// The rewritten head, its body framing and the secrets swapped into it (names).
#[derive(Debug)]
pub struct Rewritten {
    pub head: Vec<u8>,
    pub body: Body,
    pub swapped: Vec<String>,
}

/// The host part of a Host header or an authority (`name[:port]`, `[v6]:port`), normalised.
fn host_of(authority: &str) -> String {
    let a = authority.trim();
    let host = if let Some(rest) = a.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        a.rsplit_once(':')
            .filter(|(_, p)| p.chars().all(|c| c.is_ascii_digit()))
            .map_or(a, |(h, _)| h)
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Rewrites one request head (`head` ends with the blank line) sent inside a session
/// intercepted for `sni` (normalised). `swaps` are the secrets of the sandbox for `sni`.
pub fn rewrite_request(head: &[u8], sni: &str, swaps: &[SecretSwap]) -> Result<Rewritten, Refused> {
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        _ => return Err(Refused::Malformed),
    }
    let method = req.method.unwrap_or("");
    let path = req.path.unwrap_or("");
    // An absolute-form target names its own authority: it must be this host too.
    if let Some(rest) = path
        .strip_prefix("https://")
        .or_else(|| path.strip_prefix("http://"))
    {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let h = host_of(authority.rsplit('@').next().unwrap_or(""));
        if h != sni {
            return Err(Refused::HostSwitch(h));
        }
    }
    let mut host_seen = false;
    let mut chunked = false;
    let mut length: Option<u64> = None;
    let mut upgrade = method.eq_ignore_ascii_case("CONNECT");
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("host") {
            let v = std::str::from_utf8(h.value).map_err(|_| Refused::Malformed)?;
            let host = host_of(v);
            if host != sni || host_seen {
                return Err(Refused::HostSwitch(host));
            }
            host_seen = true;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            let v = String::from_utf8_lossy(h.value).to_ascii_lowercase();
            chunked |= v.split(',').any(|t| t.trim() == "chunked");
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or(Refused::Malformed)?;
            // Two different lengths is request smuggling material: refuse.
            if length.is_some_and(|l| l != v) {
                return Err(Refused::Malformed);
            }
            length = Some(v);
        } else if h.name.eq_ignore_ascii_case("upgrade") {
            upgrade = true;
        }
    }
    if !host_seen {
        return Err(Refused::NoHost);
    }
    let body = if upgrade {
        Body::Raw
    } else if chunked {
        Body::Chunked
    } else {
        match length {
            Some(0) | None => Body::None,
            Some(n) => Body::Length(n),
        }
    };
    let mut out = Vec::with_capacity(head.len() + 64);
    // The request line as it came.
    let line_end = head
        .windows(2)
        .position(|w| w == b"\r\n")
        .ok_or(Refused::Malformed)?;
    out.extend_from_slice(&head[..line_end + 2]);
    let mut swapped = Vec::new();
    for h in req.headers.iter() {
        let mut value = h.value.to_vec();
        for s in swaps.iter().filter(|s| s.host == sni) {
            if !h.name.eq_ignore_ascii_case(&s.header) {
                continue;
            }
            if let Some(v) = swap_value(&value, s) {
                value = v;
                swapped.push(s.name.clone());
            }
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(&value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Rewritten {
        head: out,
        body,
        swapped,
    })
}

fn replace(hay: &[u8], from: &[u8], to: &[u8]) -> Option<Vec<u8>> {
    if from.is_empty() || !hay.windows(from.len()).any(|w| w == from) {
        return None;
    }
    let mut out = Vec::with_capacity(hay.len() + to.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    Some(out)
}

/// The header value with the placeholder swapped, or `None` when it holds none.
fn swap_value(value: &[u8], s: &SecretSwap) -> Option<Vec<u8>> {
    let ph = s.placeholder.as_bytes();
    let trimmed = value.trim_ascii();
    if trimmed == ph {
        return Some(s.format.replace("{}", &s.value).into_bytes());
    }
    if let Some(v) = replace(value, ph, s.value.as_bytes()) {
        return Some(v);
    }
    // Basic auth: the placeholder is inside the base64 of `user:password`.
    let text = std::str::from_utf8(trimmed).ok()?;
    let (scheme, b64) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let engine = base64::engine::general_purpose::STANDARD;
    let plain = engine.decode(b64.trim()).ok()?;
    let swapped = replace(&plain, ph, s.value.as_bytes())?;
    Some(format!("{scheme} {}", engine.encode(swapped)).into_bytes())
}

/// The end of the request head in `buf` (just past the blank line), if it is there.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn swap() -> SecretSwap {
        SecretSwap {
            name: "API_KEY".into(),
            host: "api.test".into(),
            header: "Authorization".into(),
            format: "Bearer {}".into(),
            placeholder: "tb_secret_abc".into(),
            value: "REAL-VALUE".into(),
        }
    }

    fn rw(head: &str) -> Result<Rewritten, Refused> {
        rewrite_request(head.as_bytes(), "api.test", &[swap()])
    }

    fn text(r: &Rewritten) -> String {
        String::from_utf8_lossy(&r.head).into_owned()
    }

    #[test]
    fn bearer_and_bare_placeholders_are_swapped_in_the_named_header() {
        let r =
            rw("GET /x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer tb_secret_abc\r\n\r\n")
                .unwrap();
        assert!(
            text(&r).contains("Authorization: Bearer REAL-VALUE\r\n"),
            "{}",
            text(&r)
        );
        assert_eq!(r.swapped, ["API_KEY"]);
        let r = rw("GET /x HTTP/1.1\r\nHost: API.test:443\r\nauthorization: tb_secret_abc\r\n\r\n")
            .unwrap();
        assert!(
            text(&r).contains("authorization: Bearer REAL-VALUE\r\n"),
            "{}",
            text(&r)
        );
    }

    #[test]
    fn basic_auth_is_decoded_and_reencoded() {
        let b64 = base64::engine::general_purpose::STANDARD;
        let head = format!(
            "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: Basic {}\r\n\r\n",
            b64.encode("user:tb_secret_abc")
        );
        let r = rw(&head).unwrap();
        let want = format!("Basic {}", b64.encode("user:REAL-VALUE"));
        assert!(text(&r).contains(&want), "{}", text(&r));
    }

    #[test]
    fn other_headers_and_the_request_line_go_out_unchanged() {
        let r = rw(
            "GET /q?k=tb_secret_abc HTTP/1.1\r\nHost: api.test\r\nX-Other: tb_secret_abc\r\n\r\n",
        )
        .unwrap();
        assert!(!text(&r).contains("REAL-VALUE"), "{}", text(&r));
        assert!(r.swapped.is_empty());
    }

    #[test]
    fn a_secret_for_another_host_is_never_used() {
        let mut s = swap();
        s.host = "other.test".into();
        let r = rewrite_request(
            b"GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: tb_secret_abc\r\n\r\n",
            "api.test",
            &[s],
        )
        .unwrap();
        assert!(!text(&r).contains("REAL-VALUE"));
    }

    #[test]
    fn a_host_switch_is_refused() {
        assert_eq!(
            rw("GET / HTTP/1.1\r\nHost: other.test\r\nAuthorization: tb_secret_abc\r\n\r\n")
                .unwrap_err(),
            Refused::HostSwitch("other.test".into())
        );
        assert!(matches!(
            rw("GET https://other.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n"),
            Err(Refused::HostSwitch(_))
        ));
        assert!(matches!(
            rw("GET / HTTP/1.1\r\nHost: api.test\r\nHost: other.test\r\n\r\n"),
            Err(Refused::HostSwitch(_))
        ));
        assert_eq!(rw("GET / HTTP/1.1\r\n\r\n").unwrap_err(), Refused::NoHost);
    }

    #[test]
    fn body_framing() {
        let r = rw("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n\r\n").unwrap();
        assert_eq!(r.body, Body::Length(5));
        let r =
            rw("POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
        assert_eq!(r.body, Body::Chunked);
        let r = rw("GET / HTTP/1.1\r\nHost: api.test\r\nUpgrade: websocket\r\n\r\n").unwrap();
        assert_eq!(r.body, Body::Raw);
        assert_eq!(
            rw("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n")
                .unwrap_err(),
            Refused::Malformed
        );
    }

    #[test]
    fn debug_hides_the_value() {
        assert!(!format!("{:?}", swap()).contains("REAL"));
    }
}
