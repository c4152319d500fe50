//! Content digests (`sha256:<64 hex>`, the only algorithm registries use in practice) and
//! a hasher that is fed while bytes stream by.

use crate::error::{OciError, Result};
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::io::{self, Read, Write};

/// A validated `sha256:` digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    pub fn parse(s: &str) -> Result<Digest> {
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| OciError::Invalid(format!("digest {s:?} is not sha256:<hex>")))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(OciError::Invalid(format!(
                "digest {s:?} is not sha256: and 64 lowercase hex digits"
            )));
        }
        Ok(Digest(s.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(format!("sha256:{}", hex::encode(Sha256::digest(bytes))))
    }

    /// The 64 hex digits: a safe file name (checked by `parse`).
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Digest, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A running SHA-256 with a byte count.
#[derive(Default, Clone)]
pub struct Hasher {
    h: Sha256,
    n: u64,
}

impl Hasher {
    pub fn new() -> Hasher {
        Hasher::default()
    }
    pub fn update(&mut self, b: &[u8]) {
        self.h.update(b);
        self.n += b.len() as u64;
    }
    pub fn len(&self) -> u64 {
        self.n
    }
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
    pub fn finish(self) -> Digest {
        Digest(format!("sha256:{}", hex::encode(self.h.finalize())))
    }
}

/// A reader that hashes everything read through it.
pub struct HashReader<R> {
    inner: R,
    hasher: Hasher,
}

impl<R: Read> HashReader<R> {
    pub fn new(inner: R) -> HashReader<R> {
        HashReader {
            inner,
            hasher: Hasher::new(),
        }
    }
    /// Reads what is left (so the digest covers the whole stream) and returns it.
    pub fn finish(mut self) -> io::Result<(Digest, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        let n = self.hasher.len();
        Ok((self.hasher.finish(), n))
    }
}

impl<R: Read> Read for HashReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// A writer that hashes everything written through it.
pub struct HashWriter<W> {
    pub inner: W,
    pub hasher: Hasher,
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_checked() {
        let d = Digest::of(b"");
        assert_eq!(
            d.as_str(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(d.as_str()).unwrap(), d);
        for bad in [
            "sha512:00",
            "sha256:../../etc/passwd",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }
}
