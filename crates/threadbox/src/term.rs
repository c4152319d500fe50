//! Keeping a sandbox's bytes from driving the operator's terminal.
//!
//! File names, commands, labels and output are chosen by code inside a sandbox. Printed
//! raw, an escape sequence in them can set the terminal's title, write its clipboard
//! (OSC 52: a poisoned command waiting to be pasted), clear the screen or move the cursor
//! to fake a line. So:
//!
//! - [`escape`]: every human view (tables, `info`, `files stat`) shows C0 and C1 control
//!   characters, DEL and the bidirectional overrides as `\x1b`-style escapes.
//! - [`OscFilter`]: the raw output of `exec`, `logs` and `files read`, when it goes to a
//!   terminal, loses its title (OSC 0/1/2) and clipboard (OSC 52) sequences; everything
//!   else (colours, cursor movement) passes, as with `docker exec` or `ssh`. `--raw`
//!   turns it off; pipes and `--json` are never filtered.

/// `s` with every control character escaped: C0 (`\x00`–`\x1f`), DEL and C1 (U+0080–
/// U+009F) as `\xNN`, and the Unicode bidirectional overrides (which reorder what a line
/// appears to say) as `\u{NNNN}`.
pub fn escape(s: &str) -> String {
    if !s.chars().any(needs_escape) {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !needs_escape(c) {
            out.push(c);
        } else if (c as u32) < 0x100 {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push_str(&format!("\\u{{{:04x}}}", c as u32));
        }
    }
    out
}

/// [`escape`] for text of several lines: newlines are kept.
pub fn escape_lines(s: &str) -> String {
    s.split('\n').map(escape).collect::<Vec<_>>().join("\n")
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// OSC commands dropped from output bound for a terminal: window/icon titles and the
/// clipboard.
const DROPPED_OSC: &[&[u8]] = &[b"0", b"1", b"2", b"52"];
/// Longest OSC command number looked at; longer ones are passed through.
const MAX_OSC_PARAM: usize = 8;

const ESC: u8 = 0x1b;
const BEL: u8 = 0x07;
/// CAN and SUB abort an escape sequence in a terminal.
const CAN: u8 = 0x18;
const SUB: u8 = 0x1a;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Normal,
    /// Saw ESC.
    Esc,
    /// Saw 0xC2 (maybe the UTF-8 form of the C1 OSC, U+009D).
    C2,
    /// Inside an OSC introducer, collecting its command number in `pending`.
    Param,
    /// Inside a dropped OSC: discard until its terminator.
    Drop,
    /// Inside a dropped OSC, saw ESC (ESC `\` ends it).
    DropEsc,
    /// Inside a dropped OSC, saw 0xC2 (0xC2 0x9C, the UTF-8 C1 ST, ends it).
    DropC2,
}

/// A streaming filter for OSC title and clipboard sequences; sequences split across
/// chunks are handled. One per output stream.
#[derive(Debug)]
pub struct OscFilter {
    state: State,
    /// Bytes held back while it is not yet known whether they start a dropped sequence.
    pending: Vec<u8>,
}

impl Default for OscFilter {
    fn default() -> Self {
        OscFilter {
            state: State::Normal,
            pending: Vec::new(),
        }
    }
}

impl OscFilter {
    /// Filters one chunk; what it returns is safe to write now.
    pub fn push(&mut self, input: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(input.len());
        for &b in input {
            self.byte(b, &mut out);
        }
        out
    }

    /// The end of the stream: a lone held-back ESC or 0xC2 is written; an unfinished OSC
    /// introducer is dropped (a terminal would wait for its end and swallow what follows).
    pub fn finish(&mut self) -> Vec<u8> {
        let out = match self.state {
            State::Esc | State::C2 => std::mem::take(&mut self.pending),
            _ => Vec::new(),
        };
        self.pending.clear();
        self.state = State::Normal;
        out
    }

    fn byte(&mut self, b: u8, out: &mut Vec<u8>) {
        match self.state {
            State::Normal => self.normal(b, out),
            State::Esc => {
                if b == b']' {
                    self.pending.push(b);
                    self.state = State::Param;
                } else {
                    out.append(&mut self.pending);
                    self.state = State::Normal;
                    self.normal(b, out);
                }
            }
            State::C2 => {
                if b == 0x9d {
                    self.pending.push(b);
                    self.state = State::Param;
                } else {
                    out.append(&mut self.pending);
                    self.state = State::Normal;
                    self.normal(b, out);
                }
            }
            State::Param => {
                // The introducer is two bytes: ESC ] or 0xC2 0x9D.
                let start = 2;
                let param_len = self.pending.len() - start;
                if b.is_ascii_digit() && param_len < MAX_OSC_PARAM {
                    self.pending.push(b);
                } else if b == b';' || b == BEL {
                    let dropped = DROPPED_OSC.contains(&&self.pending[start..]);
                    if dropped {
                        self.pending.clear();
                        self.state = if b == BEL { State::Normal } else { State::Drop };
                    } else {
                        out.append(&mut self.pending);
                        self.state = State::Normal;
                        self.normal(b, out);
                    }
                } else {
                    out.append(&mut self.pending);
                    self.state = State::Normal;
                    self.normal(b, out);
                }
            }
            State::Drop => match b {
                BEL | CAN | SUB => self.state = State::Normal,
                ESC => self.state = State::DropEsc,
                0xc2 => self.state = State::DropC2,
                _ => {}
            },
            State::DropEsc => {
                if b == b'\\' {
                    self.state = State::Normal;
                } else {
                    // ESC aborts the OSC and starts a new sequence.
                    self.state = State::Esc;
                    self.pending.clear();
                    self.pending.push(ESC);
                    self.byte(b, out);
                }
            }
            State::DropC2 => {
                self.state = if b == 0x9c {
                    State::Normal
                } else {
                    State::Drop
                };
            }
        }
    }

    fn normal(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            ESC => {
                self.pending.clear();
                self.pending.push(b);
                self.state = State::Esc;
            }
            0xc2 => {
                self.pending.clear();
                self.pending.push(b);
                self.state = State::C2;
            }
            _ => out.push(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter_all(chunks: &[&[u8]]) -> Vec<u8> {
        let mut f = OscFilter::default();
        let mut out = Vec::new();
        for c in chunks {
            out.extend(f.push(c));
        }
        out.extend(f.finish());
        out
    }

    #[test]
    fn escapes_control_characters_only() {
        assert_eq!(escape("plain name é"), "plain name é");
        assert_eq!(
            escape("x\x1b]0;T\x07\x1b[31mred"),
            "x\\x1b]0;T\\x07\\x1b[31mred"
        );
        assert_eq!(escape("a\nb\tc\x7f\u{9b}"), "a\\x0ab\\x09c\\x7f\\x9b");
        assert_eq!(escape("abc\u{202e}gpj.exe"), "abc\\u{202e}gpj.exe");
        assert_eq!(escape_lines("a\x1b[2J\nb"), "a\\x1b[2J\nb");
    }

    #[test]
    fn drops_titles_and_clipboard_writes_and_keeps_the_rest() {
        let input = b"A\x1b]0;PWNED-TITLE\x07B\x1b]52;c;ZWNobyBwd25lZA==\x07C\x1b[2J\x1b[HD\n";
        assert_eq!(filter_all(&[input]), b"ABC\x1b[2J\x1b[HD\n");
        // ST-terminated, 8-bit and UTF-8 C1 forms.
        assert_eq!(filter_all(&[b"a\x1b]2;t\x1b\\b"]), b"ab");
        // A raw 0x9d is a UTF-8 continuation byte (U+045D), not an OSC: UTF-8
        // terminals do not read 8-bit C1 controls.
        assert_eq!(
            filter_all(&["\u{45d}1;t".as_bytes()]),
            "\u{45d}1;t".as_bytes()
        );
        assert_eq!(filter_all(&[b"a\xc2\x9d52;c;x\xc2\x9cb"]), b"ab");
        // Other OSCs (hyperlinks, colours) and other escapes pass.
        let link = b"\x1b]8;;http://x\x1b\\t\x1b]8;;\x1b\\";
        assert_eq!(filter_all(&[link]), link);
        assert_eq!(filter_all(&[b"\x1b]10;?\x07"]), b"\x1b]10;?\x07");
        assert_eq!(filter_all(&[b"\x1b]520;x\x07"]), b"\x1b]520;x\x07");
        assert_eq!(filter_all(&["é\u{a0}x".as_bytes()]), "é\u{a0}x".as_bytes());
    }

    #[test]
    fn sequences_split_across_chunks_are_still_dropped() {
        let input: &[u8] = b"A\x1b]52;c;ZWNobyBwd25lZA==\x07B\x1b]0;T\x1b\\C";
        for split in 0..input.len() {
            let (a, b) = input.split_at(split);
            assert_eq!(filter_all(&[a, b]), b"ABC", "split at {split}");
        }
        // Byte by byte.
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(filter_all(&bytes), b"ABC");
    }

    #[test]
    fn an_escape_inside_a_dropped_sequence_starts_a_new_one() {
        assert_eq!(filter_all(&[b"\x1b]0;t\x1b[31mred"]), b"\x1b[31mred");
        assert_eq!(filter_all(&[b"x\x1b"]), b"x\x1b");
        assert_eq!(filter_all(&[b"x\x1b]0"]), b"x");
    }
}
