//! API keys: `tbk_<id>_<secret>`, the secret 32 random bytes (256 bits) from the kernel's
//! CSPRNG. Only SHA-256 of the whole key is stored (a fast hash is enough for a random
//! 256-bit secret: there is nothing to brute-force; see ADR 0008), and the comparison is
//! constant-time. The id in the key finds its row without searching by hash.

use crate::error::{CoreError, Result};
use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

const PREFIX: &str = "tbk_";
const ID_BYTES: usize = 8;
const SECRET_BYTES: usize = 32;

/// A freshly made key: the id, the key (shown once) and its stored hash.
pub struct NewKey {
    pub id: String,
    pub key: String,
    pub hash: String,
}

fn random(n: usize) -> Result<Vec<u8>> {
    let mut buf = vec![0u8; n];
    getrandom::getrandom(&mut buf)
        .map_err(|e| CoreError::Internal(format!("the system's random source failed: {e}")))?;
    Ok(buf)
}

pub fn generate() -> Result<NewKey> {
    let id = hex::encode(random(ID_BYTES)?);
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random(SECRET_BYTES)?);
    let key = format!("{PREFIX}{id}_{secret}");
    let hash = hash(&key);
    Ok(NewKey { id, key, hash })
}

/// Hex SHA-256 of a key.
pub fn hash(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

/// The key id inside a presented key, when it has the right shape.
pub fn key_id(key: &str) -> Option<&str> {
    let rest = key.strip_prefix(PREFIX)?;
    let (id, secret) = rest.split_once('_')?;
    let id_ok = id.len() == ID_BYTES * 2 && id.bytes().all(|b| b.is_ascii_hexdigit());
    if id_ok && !secret.is_empty() && secret.len() <= 128 {
        Some(id)
    } else {
        None
    }
}

/// Constant-time check of a presented key against a stored hash.
pub fn matches(key: &str, stored_hash: &str) -> bool {
    let presented = hash(key);
    presented.as_bytes().ct_eq(stored_hash.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_random_and_verify_only_themselves() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        assert_ne!(a.key, b.key);
        assert!(a.key.len() >= PREFIX.len() + 16 + 1 + 43);
        assert_eq!(key_id(&a.key), Some(a.id.as_str()));
        assert!(matches(&a.key, &a.hash));
        assert!(!matches(&b.key, &a.hash));
        assert!(!matches(&format!("{}x", a.key), &a.hash));
        assert!(!a.hash.contains(&a.key));
    }

    #[test]
    fn malformed_keys_have_no_id() {
        for k in [
            "",
            "tbk_",
            "tbk_zz_x",
            "abc",
            "tbk_0123456789abcdef_",
            "Bearer x",
        ] {
            assert_eq!(key_id(k), None, "{k}");
        }
    }
}
