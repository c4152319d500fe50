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
    let mut check = ChainCheck::new();
    for e in entries {
        if !check.push(e) {
            break;
        }
    }
    check.finish(head_count, head_hash)
}

/// [`verify`] one entry at a time, so the log can be checked as it is read (in pages)
/// instead of loaded whole. Holds the previous hash and the count, nothing else.
#[derive(Debug, Clone)]
pub struct ChainCheck {
    prev: String,
    n: u64,
    bad: Option<AuditVerification>,
}

impl Default for ChainCheck {
    fn default() -> Self {
        ChainCheck::new()
    }
}

impl ChainCheck {
    pub fn new() -> ChainCheck {
        ChainCheck {
            prev: GENESIS.to_string(),
            n: 0,
            bad: None,
        }
    }

    /// Entries checked and found good so far.
    pub fn checked(&self) -> u64 {
        self.n
    }

    /// Checks the next entry; `false` once the chain is broken (later entries change
    /// nothing: the first bad one is the answer).
    pub fn push(&mut self, e: &Stored) -> bool {
        if self.bad.is_some() {
            return false;
        }
        let expected_seq = self.n + 1;
        let reason = if e.record.seq != expected_seq {
            Some(format!(
                "entry {expected_seq} is missing (found entry {} in its place)",
                e.record.seq
            ))
        } else if e.prev_hash != self.prev {
            Some(format!(
                "entry {expected_seq} does not follow entry {} (removed or reordered)",
                expected_seq - 1
            ))
        } else if chain_hash(&self.prev, &e.record) != e.hash {
            Some(format!(
                "entry {expected_seq} was altered (its hash does not match)"
            ))
        } else {
            None
        };
        if let Some(reason) = reason {
            self.bad = Some(bad(expected_seq, reason, self.n));
            return false;
        }
        self.prev.clone_from(&e.hash);
        self.n += 1;
        true
    }

    /// The verdict, given the head (entry count and last hash) read with the entries.
    pub fn finish(self, head_count: u64, head_hash: &str) -> AuditVerification {
        if let Some(b) = self.bad {
            return b;
        }
        let n = self.n;
        if head_count != n || (n > 0 && head_hash != self.prev) {
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
}

fn bad(seq: u64, reason: String, n: u64) -> AuditVerification {
    AuditVerification {
        ok: false,
        entries: n,
        first_bad_seq: Some(seq),
        reason: Some(reason),
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

/// Refused authentications recorded one by one per [`RefusalBudget::WINDOW`].
pub const REFUSALS_PER_WINDOW: u32 = 10;

/// What to write for one refused authentication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalAudit {
    /// Write its row; first a summary row for `suppressed_before` refusals of the
    /// previous window that were not written one by one, when there were any.
    Record { suppressed_before: u64 },
    /// Write nothing: this window's budget is spent. It is counted for the summary.
    Suppress,
}

/// Bounds the audit rows that refused authentications write (F9). Anyone who can reach
/// the TCP port can be refused, and each row is an fsynced transaction contending with
/// every state transition for the store's one writer; so each window records its first
/// [`REFUSALS_PER_WINDOW`] refusals, counts the rest, and the next window opens with one
/// row saying how many were not written. The first refusal of a flood is always recorded.
/// A window's count still pending when the daemon stops is in the log (`warn`), not here.
#[derive(Debug)]
pub struct RefusalBudget {
    per_window: u32,
    state: std::sync::Mutex<BudgetState>,
}

#[derive(Debug)]
struct BudgetState {
    window_start: Option<std::time::Instant>,
    recorded: u32,
    suppressed: u64,
}

impl Default for RefusalBudget {
    fn default() -> Self {
        Self::new(REFUSALS_PER_WINDOW)
    }
}

impl RefusalBudget {
    pub const WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

    pub fn new(per_window: u32) -> Self {
        RefusalBudget {
            per_window,
            state: std::sync::Mutex::new(BudgetState {
                window_start: None,
                recorded: 0,
                suppressed: 0,
            }),
        }
    }

    /// Decides for one refusal at `now`.
    pub fn admit(&self, now: std::time::Instant) -> RefusalAudit {
        // A poisoned lock only means a panic elsewhere mid-update of plain counters.
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let expired = st
            .window_start
            .is_none_or(|start| now.saturating_duration_since(start) >= Self::WINDOW);
        if expired {
            let suppressed_before = std::mem::take(&mut st.suppressed);
            st.window_start = Some(now);
            st.recorded = 1;
            return RefusalAudit::Record { suppressed_before };
        }
        if st.recorded < self.per_window {
            st.recorded += 1;
            return RefusalAudit::Record {
                suppressed_before: 0,
            };
        }
        st.suppressed += 1;
        if st.suppressed == 1 {
            tracing::warn!(
                per_window = self.per_window,
                "refused authentications beyond the audit budget are counted, not recorded \
                 one by one, until the window ends"
            );
        }
        RefusalAudit::Suppress
    }

    /// Refusals counted in the current window and not yet written.
    pub fn pending(&self) -> u64 {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_beyond_the_budget_are_counted_and_summed_up_in_the_next_window() {
        let budget = RefusalBudget::new(3);
        let t0 = std::time::Instant::now();
        let record = |n| RefusalAudit::Record {
            suppressed_before: n,
        };
        assert_eq!(budget.admit(t0), record(0), "the first is always recorded");
        assert_eq!(budget.admit(t0), record(0));
        assert_eq!(budget.admit(t0), record(0));
        for _ in 0..100 {
            assert_eq!(budget.admit(t0), RefusalAudit::Suppress);
        }
        assert_eq!(budget.pending(), 100);
        let later = t0 + RefusalBudget::WINDOW;
        assert_eq!(budget.admit(later), record(100), "the next window sums up");
        assert_eq!(budget.pending(), 0);
        assert_eq!(budget.admit(later), record(0));
        assert_eq!(budget.admit(later), record(0));
        assert_eq!(budget.admit(later), RefusalAudit::Suppress);
        // A window with nothing suppressed opens without a summary.
        let quiet = RefusalBudget::new(3);
        assert_eq!(quiet.admit(t0), record(0));
        assert_eq!(quiet.admit(later), record(0));
    }

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
