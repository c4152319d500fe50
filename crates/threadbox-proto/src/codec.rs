//! Length-prefixed JSON frames. Pure functions over bytes: the callers own the I/O.

use crate::{Frame, ProtoError, MAX_FRAME};

/// Serializes one frame with its 4-byte big-endian length header.
pub fn encode_frame(frame: &Frame) -> Result<Vec<u8>, ProtoError> {
    let body = serde_json::to_vec(frame).map_err(|e| ProtoError::Malformed(e.to_string()))?;
    if body.len() > MAX_FRAME {
        return Err(ProtoError::FrameTooLarge(body.len()));
    }
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

/// Parses a frame body (without its header).
pub fn decode_frame(body: &[u8]) -> Result<Frame, ProtoError> {
    if body.len() > MAX_FRAME {
        return Err(ProtoError::FrameTooLarge(body.len()));
    }
    serde_json::from_slice(body).map_err(|e| ProtoError::Malformed(e.to_string()))
}

/// Incremental decoder: feed it bytes as they arrive, take frames out as they complete.
/// Never panics and never buffers more than one maximal frame plus what was fed.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
}

impl FrameDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Returns the next complete frame, `Ok(None)` when more bytes are needed. After an
    /// error the stream is unusable (framing is lost) and the connection must be closed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtoError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize;
        if len > MAX_FRAME {
            return Err(ProtoError::FrameTooLarge(len));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let frame = decode_frame(&self.buf[4..4 + len]);
        self.buf.drain(..4 + len);
        frame.map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;

    #[test]
    fn round_trip_in_pieces() {
        let frames = vec![
            Frame::Hello(Hello::ours("test", &["exec"])),
            Frame::Request {
                id: 7,
                req: Request::FileWrite {
                    path: "/home/user/a".into(),
                    user: RunAs::User,
                    data: vec![0, 159, 146, 150, 255],
                    append: false,
                    mode: Some(0o644),
                    make_parents: true,
                },
            },
            Frame::Response {
                id: 7,
                resp: Response::Output {
                    stream: Stream::Stderr,
                    data: b"\xff\xfe".to_vec(),
                },
            },
        ];
        let mut wire = Vec::new();
        for f in &frames {
            wire.extend(encode_frame(f).unwrap());
        }
        let mut dec = FrameDecoder::new();
        let mut got = Vec::new();
        for byte in wire {
            dec.feed(&[byte]);
            while let Some(f) = dec.next_frame().unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);
    }

    #[test]
    fn oversized_header_is_refused_without_allocating() {
        let mut dec = FrameDecoder::new();
        dec.feed(&u32::MAX.to_be_bytes());
        assert_eq!(
            dec.next_frame(),
            Err(ProtoError::FrameTooLarge(u32::MAX as usize))
        );
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let mut dec = FrameDecoder::new();
        dec.feed(&[0, 0, 0, 3, b'{', b'x', 0xff]);
        assert!(matches!(dec.next_frame(), Err(ProtoError::Malformed(_))));
    }

    #[test]
    fn version_mismatch_is_detected() {
        let mut h = Hello::ours("x", &[]);
        assert!(h.check().is_ok());
        h.version = 99;
        assert_eq!(h.check(), Err(ProtoError::VersionMismatch(99)));
    }

    #[test]
    fn final_frames() {
        assert!(!Response::Started { pid: 1 }.is_final());
        assert!(Response::Exited(ExecResult::default()).is_final());
    }
}
