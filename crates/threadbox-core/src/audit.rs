//! The audit log's hash chain. Each entry stores `hash = SHA-256(prev_hash ‖ canonical)`
//! where `canonical` is the entry's fields (without the hashes) as a JSON array in a fixed
//! order. Editing, removing or reordering entries in the store breaks the chain at the
//! first position touched; [`verify`] names it.

use sha2::{Digest, Sha256};
use threadbox_api::{AuditEntry, AuditVerification};

/// `prev_hash` of the first entry.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The fields an entry is made of, before hashing.
#[derive(Debug, Clone)]
pub struct Record {
    pub seq: u64,
    pub ts_ms: i64,
    pub tenant: String,
    pub key_id: Option<String>,
    pub action: String,
    pub target: String,
    pub result: String,
}

/// The canonical form: a JSON array, fields in a fixed order. JSON escaping makes it
/// unambiguous whatever the strings contain.
pub fn canonical(r: &Record) -> String {
    serde_json::json!([r.seq, r.ts_ms, r.tenant, r.key_id, r.action, r.target, r.result])
        .to_string()
}

pub fn chain_hash(prev_hash: &str, r: &Record) -> String {
    let mut h = Sha256::new();
    h.update(prev_hash.as_bytes());
    h.update(b"\n");
    h.update(canonical(r).as_bytes());
    hex::encode(h.finalize())
}

/// A stored entry as read back, with its time still in milliseconds.
#[derive(Debug, Clone)]
pub struct Stored {
    pub record: Record,
    pub prev_hash: String,
    pub hash: String,
}

/// Checks the stored entries (in `seq` order, as read) and the chain's head.
pub fn verify(entries: &[Stored], head_count: u64, head_hash: &str) -> AuditVerification {
    let bad = |seq: u64, reason: String, n: u64| AuditVerification {
        ok: false,
        entries: n,
        first_bad_seq: Some(seq),
        reason: Some(reason),
    };
    let mut prev = GENESIS.to_string();
    for (i, e) in entries.iter().enumerate() {
        let expected_seq = i as u64 + 1;
        let n = i as u64;
        if e.record.seq != expected_seq {
            return bad(
                expected_seq,
                format!(
                    "entry {expected_seq} is missing (found entry {} in its place)",
                    e.record.seq
                ),
                n,
            );
        }
        if e.prev_hash != prev {
            return bad(
                expected_seq,
                format!(
                    "entry {expected_seq} does not follow entry {} (removed or reordered)",
                    expected_seq - 1
                ),
                n,
            );
        }
        if chain_hash(&prev, &e.record) != e.hash {
            return bad(
                expected_seq,
                format!("entry {expected_seq} was altered (its hash does not match)"),
                n,
            );
        }
        prev = e.hash.clone();
    }
    let n = entries.len() as u64;
    if head_count != n || (n > 0 && head_hash != prev) {
        let seq = n.min(head_count) + 1;
        return bad(
            seq,
            format!("the log should hold {head_count} entries but holds {n} (entries removed at the end, or the head was altered)"),
            n,
        );
    }
    AuditVerification {
        ok: true,
        entries: n,
        first_bad_seq: None,
        reason: None,
    }
}

pub fn to_api(e: &Stored, time: String) -> AuditEntry {
    AuditEntry {
        seq: e.record.seq,
        time,
        tenant: e.record.tenant.clone(),
        key_id: e.record.key_id.clone(),
        action: e.record.action.clone(),
        target: e.record.target.clone(),
        result: e.record.result.clone(),
        prev_hash: e.prev_hash.clone(),
        hash: e.hash.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(n: u64) -> Vec<Stored> {
        let mut prev = GENESIS.to_string();
        (1..=n)
            .map(|seq| {
                let record = Record {
                    seq,
                    ts_ms: 1000 + seq as i64,
                    tenant: "t".into(),
                    key_id: Some("k".into()),
                    action: "sandbox.create".into(),
                    target: format!("sb-{seq}"),
                    result: "ok".into(),
                };
                let hash = chain_hash(&prev, &record);
                let s = Stored {
                    record,
                    prev_hash: prev.clone(),
                    hash: hash.clone(),
                };
                prev = hash;
                s
            })
            .collect()
    }

    fn head(c: &[Stored]) -> (u64, String) {
        (
            c.len() as u64,
            c.last().map(|e| e.hash.clone()).unwrap_or_default(),
        )
    }

    #[test]
    fn an_intact_chain_verifies() {
        let c = chain(5);
        let (n, h) = head(&c);
        assert!(verify(&c, n, &h).ok);
        assert!(verify(&[], 0, "").ok);
    }

    #[test]
    fn edits_removals_and_swaps_are_found_at_their_position() {
        let c = chain(5);
        let (n, h) = head(&c);
        let mut edited = c.clone();
        edited[2].record.result = "ok-but-not".into();
        assert_eq!(verify(&edited, n, &h).first_bad_seq, Some(3));

        let mut removed = c.clone();
        removed.remove(1);
        assert_eq!(verify(&removed, n, &h).first_bad_seq, Some(2));

        // A swap of two entries' contents keeping the seq column in order.
        let mut swapped = c.clone();
        let (a, b) = (swapped[1].clone(), swapped[3].clone());
        swapped[1] = Stored {
            record: Record { seq: 2, ..b.record },
            ..b
        };
        swapped[3] = Stored {
            record: Record { seq: 4, ..a.record },
            ..a
        };
        assert_eq!(verify(&swapped, n, &h).first_bad_seq, Some(2));

        let mut truncated = c.clone();
        truncated.pop();
        assert_eq!(verify(&truncated, n, &h).first_bad_seq, Some(5));
    }
}
