//! A minimal netlink encoder and ack reader: just what the fixed egress ruleset and its
//! route need (`rtnetlink` RTM_NEWROUTE, an `nf_tables` batch). Hand-rolled because the
//! Rust nf_tables crates are GPL (`rustables`) or shell out to the `nft` binary (`nftables`),
//! and the messages are few and never change (ADR 0065). Pure code over byte vectors, so
//! the encoding is unit-tested without root; the golden test against `nft -j list ruleset`
//! checks what the kernel made of it.

use std::io;

pub(crate) const NLMSG_ERROR: u16 = 2;
pub(crate) const NLM_F_REQUEST: u16 = 0x1;
pub(crate) const NLM_F_ACK: u16 = 0x4;
pub(crate) const NLM_F_EXCL: u16 = 0x200;
pub(crate) const NLM_F_CREATE: u16 = 0x400;
pub(crate) const NLM_F_APPEND: u16 = 0x800;
/// `NLA_F_NESTED`: marks an attribute whose payload is attributes.
const NLA_F_NESTED: u16 = 0x8000;
const NLMSG_HDRLEN: usize = 16;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// One netlink message being built: header, fixed payload, attributes.
#[derive(Debug)]
pub(crate) struct Msg {
    buf: Vec<u8>,
}

impl Msg {
    pub(crate) fn new(ty: u16, flags: u16, seq: u32) -> Msg {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set by `finish`
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills ours in
        Msg { buf }
    }

    /// The message's fixed header after `nlmsghdr` (`nfgenmsg`, `rtmsg`), padded.
    pub(crate) fn payload(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(bytes);
        self.pad();
        self
    }

    fn pad(&mut self) {
        self.buf.resize(align4(self.buf.len()), 0);
    }

    pub(crate) fn attr(&mut self, ty: u16, data: &[u8]) -> &mut Self {
        let len = u16::try_from(4 + data.len()).unwrap_or(u16::MAX);
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
        self
    }

    /// nf_tables integers are big-endian on the wire.
    pub(crate) fn be32(&mut self, ty: u16, v: u32) -> &mut Self {
        self.attr(ty, &v.to_be_bytes())
    }

    /// rtnetlink integers are host-endian.
    pub(crate) fn ne32(&mut self, ty: u16, v: u32) -> &mut Self {
        self.attr(ty, &v.to_ne_bytes())
    }

    /// A NUL-terminated string attribute.
    pub(crate) fn str(&mut self, ty: u16, s: &str) -> &mut Self {
        let mut v = Vec::with_capacity(s.len() + 1);
        v.extend_from_slice(s.as_bytes());
        v.push(0);
        self.attr(ty, &v)
    }

    /// A nested attribute: `f` writes its members.
    pub(crate) fn nest(&mut self, ty: u16, f: impl FnOnce(&mut Msg)) -> &mut Self {
        let start = self.buf.len();
        self.buf.extend_from_slice(&[0, 0]);
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        f(self);
        let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    pub(crate) fn finish(mut self) -> Vec<u8> {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

/// The answers in `buf` (what the socket had queued after a send: netlink processes a send
/// synchronously): every `NLMSG_ERROR` as (sequence number, error), error 0 being an ack
/// and a negative value an errno. Other message types are skipped.
pub(crate) fn parse_acks(buf: &[u8]) -> io::Result<Vec<(u32, i32)>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + NLMSG_HDRLEN <= buf.len() {
        let len = u32::from_ne_bytes(read4(buf, off)) as usize;
        if len < NLMSG_HDRLEN || off + len > buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "truncated netlink answer",
            ));
        }
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        let seq = u32::from_ne_bytes(read4(buf, off + 8));
        if ty == NLMSG_ERROR {
            if len < NLMSG_HDRLEN + 4 {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "short netlink error message",
                ));
            }
            let err = i32::from_ne_bytes(read4(buf, off + NLMSG_HDRLEN));
            out.push((seq, err));
        }
        off += align4(len);
    }
    Ok(out)
}

fn read4(buf: &[u8], off: usize) -> [u8; 4] {
    [buf[off], buf[off + 1], buf[off + 2], buf[off + 3]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_padded_and_nests_carry_their_length() {
        let mut m = Msg::new(0x0a00, NLM_F_REQUEST, 7);
        m.payload(&[1, 0, 0, 0]);
        m.str(1, "ab"); // 4 + 3 = 7, padded to 8
        m.nest(2, |m| {
            m.be32(1, 0x01020304);
        });
        let b = m.finish();
        assert_eq!(b.len(), 16 + 4 + 8 + 4 + 8);
        assert_eq!(u32::from_ne_bytes(read4(&b, 0)) as usize, b.len());
        assert_eq!(u32::from_ne_bytes(read4(&b, 8)), 7);
        assert_eq!(&b[20..27], &[7, 0, 1, 0, b'a', b'b', 0][..]);
        assert_eq!(b[27], 0, "padding");
        // nest header: length 12, type 2 | NLA_F_NESTED
        assert_eq!(u16::from_ne_bytes([b[28], b[29]]), 12);
        assert_eq!(u16::from_ne_bytes([b[30], b[31]]), 2 | NLA_F_NESTED);
        assert_eq!(&b[36..40], &[1, 2, 3, 4]);
    }

    #[test]
    fn acks_and_errors_are_read_and_truncation_refused() {
        let ack = |seq: u32, err: i32| {
            let mut m = Msg::new(NLMSG_ERROR, 0, seq);
            m.payload(&err.to_ne_bytes());
            m.payload(&[0u8; 16]);
            m.finish()
        };
        let mut buf = ack(1, 0);
        buf.extend(ack(2, -libc::EPERM));
        assert_eq!(parse_acks(&buf).unwrap(), vec![(1, 0), (2, -libc::EPERM)]);
        buf.truncate(buf.len() - 3);
        assert!(parse_acks(&buf).is_err());
    }
}
