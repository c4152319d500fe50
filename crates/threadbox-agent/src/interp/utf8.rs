//! Decoding pipe output into text without splitting a character across two chunks: the
//! tail of a chunk that starts a multi-byte sequence waits for the next chunk.

/// Carries an incomplete UTF-8 sequence from one chunk to the next.
#[derive(Default)]
pub(crate) struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    /// The text of `pending + bytes` up to the last complete character; invalid bytes
    /// become U+FFFD; an incomplete sequence at the end is kept for the next call.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let data = std::mem::take(&mut self.pending);
        let mut out = String::with_capacity(data.len());
        let mut rest = &data[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    out.push_str(&String::from_utf8_lossy(good));
                    match e.error_len() {
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &bad[n..];
                        }
                        None => {
                            // At most 3 bytes: the start of a character still arriving.
                            self.pending.extend_from_slice(bad);
                            break;
                        }
                    }
                }
            }
        }
        out
    }

    /// What is left at the end of the output (an incomplete character is replaced).
    pub(crate) fn finish(&mut self) -> String {
        let p = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&p).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::Utf8Carry;

    #[test]
    fn a_character_split_across_chunks_is_whole() {
        let s = "é€😀".as_bytes();
        for cut in 0..=s.len() {
            let mut c = Utf8Carry::default();
            let mut got = c.push(&s[..cut]);
            got.push_str(&c.push(&s[cut..]));
            got.push_str(&c.finish());
            assert_eq!(got, "é€😀", "cut at {cut}");
        }
        // Byte by byte, every chunk is valid text on its own.
        let mut c = Utf8Carry::default();
        let parts: Vec<String> = s.iter().map(|b| c.push(&[*b])).collect();
        assert_eq!(parts.concat(), "é€😀");
    }

    #[test]
    fn invalid_bytes_are_replaced_and_a_cut_tail_is_flushed() {
        let mut c = Utf8Carry::default();
        assert_eq!(c.push(b"a\xffb"), "a\u{FFFD}b");
        assert_eq!(c.push(b"x\xe2\x82"), "x");
        assert_eq!(c.finish(), "\u{FFFD}");
    }
}
