//! Finding the name a connection is for, from the bytes the client sends first: the SNI of a
//! TLS ClientHello (reassembled across records, since post-quantum ClientHellos span several
//! and splitting them is a known evasion) or the Host header of an HTTP/1 request. The bytes
//! read are kept and replayed to the upstream unchanged.

use crate::policy::normalize_name;
use std::net::IpAddr;

/// What the bytes so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peeked {
    /// A name, normalised.
    Name(String),
    /// The protocol was recognised but carries no usable name (no SNI, an IP literal…).
    NoName,
    /// Not enough bytes yet.
    NeedMore,
    /// Not this protocol at all.
    NotThis,
}

/// Largest handshake message accepted (a ClientHello is far smaller in practice).
const MAX_HANDSHAKE: usize = 64 * 1024;

/// Reads the SNI from the start of a TLS stream.
pub fn client_hello_sni(buf: &[u8]) -> Peeked {
    // Gather the handshake bytes carried by the leading handshake records.
    let mut hs = Vec::new();
    let mut rest = buf;
    loop {
        if hs.len() >= 4 {
            let len = u32::from_be_bytes([0, hs[1], hs[2], hs[3]]) as usize;
            if hs[0] != 1 || len > MAX_HANDSHAKE {
                return Peeked::NotThis;
            }
            if hs.len() >= 4 + len {
                return parse_client_hello(&hs[4..4 + len]);
            }
        }
        if rest.len() < 5 {
            return Peeked::NeedMore;
        }
        // Content type 22 (handshake), legacy version 3.x, length ≤ 2^14.
        if rest[0] != 22 || rest[1] != 3 {
            return Peeked::NotThis;
        }
        let rec_len = usize::from(u16::from_be_bytes([rest[3], rest[4]]));
        if rec_len == 0 || rec_len > 16384 {
            return Peeked::NotThis;
        }
        if rest.len() < 5 + rec_len {
            return Peeked::NeedMore;
        }
        hs.extend_from_slice(&rest[5..5 + rec_len]);
        rest = &rest[5 + rec_len..];
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
}

fn parse_client_hello(body: &[u8]) -> Peeked {
    let mut r = Reader(body);
    let parsed = (|| {
        r.take(2)?; // legacy_version
        r.take(32)?; // random
        r.vec8()?; // legacy_session_id
        r.vec16()?; // cipher_suites
        r.vec8()?; // legacy_compression_methods
        if r.0.is_empty() {
            return Some(None); // no extensions at all
        }
        let mut exts = Reader(r.vec16()?);
        let mut found = None;
        while !exts.0.is_empty() {
            let ty = exts.u16()?;
            let data = exts.vec16()?;
            if ty == 0 {
                if found.is_some() {
                    return None; // two server_name extensions: malformed
                }
                let mut sn = Reader(data);
                let mut list = Reader(sn.vec16()?);
                while !list.0.is_empty() {
                    let kind = list.u8()?;
                    let name = list.vec16()?;
                    if kind == 0 {
                        found = Some(name);
                        break;
                    }
                }
            }
        }
        Some(found)
    })();
    match parsed {
        None => Peeked::NotThis,
        Some(None) => Peeked::NoName,
        Some(Some(raw)) => name_of(raw),
    }
}

fn name_of(raw: &[u8]) -> Peeked {
    let Ok(s) = std::str::from_utf8(raw) else {
        return Peeked::NoName;
    };
    if s.parse::<IpAddr>().is_ok() {
        return Peeked::NoName;
    }
    match normalize_name(s) {
        Ok(n) => Peeked::Name(n),
        Err(_) => Peeked::NoName,
    }
}

/// Reads the Host header of the first HTTP/1 request.
pub fn http_host(buf: &[u8]) -> Peeked {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Partial) => Peeked::NeedMore,
        Err(_) => Peeked::NotThis,
        Ok(httparse::Status::Complete(_)) => {
            let mut hosts = req
                .headers
                .iter()
                .filter(|h| h.name.eq_ignore_ascii_case("host"));
            let (Some(h), None) = (hosts.next(), hosts.next()) else {
                // None, or more than one Host header (ambiguous: refuse to pick).
                return Peeked::NoName;
            };
            let Ok(v) = std::str::from_utf8(h.value) else {
                return Peeked::NoName;
            };
            let v = v.trim();
            if v.starts_with('[') {
                return Peeked::NoName; // an IPv6 literal
            }
            let host = match v.rsplit_once(':') {
                Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
                Some(_) => return Peeked::NoName,
                None => v,
            };
            name_of(host.as_bytes())
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A ClientHello carrying `sni` (if any) and `pad` bytes of an extra extension, as
    /// post-quantum key shares make them large.
    pub(crate) fn client_hello(sni: Option<&str>, pad: usize) -> Vec<u8> {
        let mut exts = Vec::new();
        if let Some(name) = sni {
            let n = name.as_bytes();
            let mut list = vec![0u8];
            list.extend_from_slice(&(n.len() as u16).to_be_bytes());
            list.extend_from_slice(n);
            let mut data = (list.len() as u16).to_be_bytes().to_vec();
            data.extend_from_slice(&list);
            exts.extend_from_slice(&0u16.to_be_bytes());
            exts.extend_from_slice(&(data.len() as u16).to_be_bytes());
            exts.extend_from_slice(&data);
        }
        if pad > 0 {
            exts.extend_from_slice(&21u16.to_be_bytes()); // padding
            exts.extend_from_slice(&(pad as u16).to_be_bytes());
            exts.extend(std::iter::repeat_n(0u8, pad));
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![1u8];
        hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend_from_slice(&body);
        hs
    }

    /// Wraps handshake bytes in TLS records of at most `chunk` bytes each.
    pub(crate) fn records(hs: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for c in hs.chunks(chunk) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(c.len() as u16).to_be_bytes());
            out.extend_from_slice(c);
        }
        out
    }

    #[test]
    fn sni_in_one_record() {
        let b = records(&client_hello(Some("Example.COM"), 0), 16384);
        assert_eq!(client_hello_sni(&b), Peeked::Name("example.com".into()));
        for cut in 0..b.len() {
            assert_eq!(
                client_hello_sni(&b[..cut]),
                Peeked::NeedMore,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn sni_split_across_records_and_large_hellos() {
        let hs = client_hello(Some("pypi.org"), 3000);
        for chunk in [1, 7, 100, 1500] {
            assert_eq!(
                client_hello_sni(&records(&hs, chunk)),
                Peeked::Name("pypi.org".into()),
                "{chunk}"
            );
        }
    }

    #[test]
    fn no_sni_ip_sni_and_garbage() {
        assert_eq!(
            client_hello_sni(&records(&client_hello(None, 10), 16384)),
            Peeked::NoName
        );
        assert_eq!(
            client_hello_sni(&records(&client_hello(Some("1.2.3.4"), 0), 16384)),
            Peeked::NoName
        );
        assert_eq!(client_hello_sni(b"GET / HTTP/1.1\r\n"), Peeked::NotThis);
        assert_eq!(client_hello_sni(b"SSH-2.0-OpenSSH"), Peeked::NotThis);
        let mut not_hello = client_hello(Some("a.test"), 0);
        not_hello[0] = 2;
        assert_eq!(
            client_hello_sni(&records(&not_hello, 16384)),
            Peeked::NotThis
        );
        let mut trunc = client_hello(Some("a.test"), 0);
        trunc.truncate(trunc.len() - 3);
        let l = (trunc.len() - 4) as u32;
        trunc[1..4].copy_from_slice(&l.to_be_bytes()[1..]);
        assert_eq!(client_hello_sni(&records(&trunc, 16384)), Peeked::NotThis);
    }

    #[test]
    fn http_host_header() {
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: A.test:8080\r\n\r\n"),
            Peeked::Name("a.test".into())
        );
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nhost: a.test\r\n\r\n"),
            Peeked::Name("a.test".into())
        );
        assert_eq!(http_host(b"GET / HTTP/1.1\r\nHost: a.te"), Peeked::NeedMore);
        assert_eq!(http_host(b"GET / HTTP/1.1\r\n\r\n"), Peeked::NoName);
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n"),
            Peeked::NoName
        );
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n"),
            Peeked::NoName
        );
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"),
            Peeked::NoName
        );
        assert_eq!(http_host(b"\x16\x03\x01\x00"), Peeked::NotThis);
    }
}
