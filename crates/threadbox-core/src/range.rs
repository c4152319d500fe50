//! Which bytes of a file a read returns (`GET /files?offset=&length=`).

use crate::error::{CoreError, Result};

/// Largest offset or end accepted: file offsets are `off_t` (signed 64-bit) in the kernel.
pub const MAX_FILE_OFFSET: u64 = i64::MAX as u64;

/// A byte range of a file: `offset` and at most `length` bytes (to the end when `None`).
/// A range that starts at or past the end of the file reads as empty, as `pread` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileRange {
    offset: u64,
    length: Option<u64>,
}

impl FileRange {
    /// The whole file.
    pub const ALL: FileRange = FileRange {
        offset: 0,
        length: None,
    };

    /// Checks a range: `length` at least 1, and `offset + length` within a file offset.
    pub fn new(offset: u64, length: Option<u64>) -> Result<FileRange> {
        if offset > MAX_FILE_OFFSET {
            return Err(CoreError::InvalidArgument(format!(
                "offset {offset} is beyond the largest file offset ({MAX_FILE_OFFSET})"
            )));
        }
        if let Some(len) = length {
            if len == 0 {
                return Err(CoreError::InvalidArgument(
                    "length must be at least 1 (leave it out to read to the end)".into(),
                ));
            }
            if offset
                .checked_add(len)
                .is_none_or(|end| end > MAX_FILE_OFFSET)
            {
                return Err(CoreError::InvalidArgument(format!(
                    "offset {offset} + length {len} is beyond the largest file offset ({MAX_FILE_OFFSET})"
                )));
            }
        }
        Ok(FileRange { offset, length })
    }

    /// The first byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The most bytes returned (`None`: to the end of the file).
    pub fn length(&self) -> Option<u64> {
        self.length
    }

    /// How many bytes to ask for next, after `done` bytes of the range, in chunks of at
    /// most `chunk`; `None` when the range is complete.
    pub fn next_chunk(&self, done: u64, chunk: u64) -> Option<u64> {
        match self.length {
            None => Some(chunk),
            Some(len) if done >= len => None,
            Some(len) => Some((len - done).min(chunk)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_ranges_are_refused() {
        assert!(FileRange::new(0, Some(0)).is_err());
        assert!(FileRange::new(MAX_FILE_OFFSET + 1, None).is_err());
        assert!(FileRange::new(MAX_FILE_OFFSET, Some(1)).is_err());
        assert!(FileRange::new(u64::MAX, Some(u64::MAX)).is_err());
        assert!(FileRange::new(MAX_FILE_OFFSET, None).is_ok());
        assert!(FileRange::new(10, Some(5)).is_ok());
    }

    #[test]
    fn chunks_stop_at_the_length() {
        let r = FileRange::new(3, Some(10)).unwrap();
        assert_eq!(r.next_chunk(0, 4), Some(4));
        assert_eq!(r.next_chunk(8, 4), Some(2));
        assert_eq!(r.next_chunk(10, 4), None);
        assert_eq!(FileRange::ALL.next_chunk(1 << 40, 4), Some(4));
    }
}
