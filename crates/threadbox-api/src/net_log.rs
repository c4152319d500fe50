//! Wire types of a sandbox's egress log (issue 13, ADR 0063): `GET
//! /v1/sandboxes/{sandbox}/network/log?after=&limit=&wait_ms=`, a page of rows in the order
//! the daemon stored them. Following is a long poll: with `wait_ms` and nothing after
//! `after`, the daemon holds the request until a row arrives or the wait is over, and the
//! client asks again from `next_after`.

use crate::network::NetLogEntry;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Rows answered when `limit` is absent, and the most one page holds.
pub const NET_LOG_DEFAULT_LIMIT: u32 = 100;
pub const NET_LOG_MAX_LIMIT: u32 = 1000;
/// The longest a follow request is held (a longer `wait_ms` is cut to this).
pub const NET_LOG_MAX_WAIT_MS: u64 = 60_000;

/// One stored row: its sequence number (what `after` names) and the entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct NetLogRecord {
    /// Grows with every row the daemon stores (over all sandboxes); pass the last one seen
    /// as `after` to read on.
    pub seq: u64,
    #[serde(flatten)]
    pub entry: NetLogEntry,
}

/// A page of a sandbox's egress log, oldest first.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct NetLogPage {
    pub entries: Vec<NetLogRecord>,
    /// The `after` of the next request: the last row's `seq`, or the request's `after`
    /// when the page is empty.
    pub next_after: u64,
    /// Rows the daemon could not keep up with and dropped (since the sandbox's egress was
    /// last attached); egress itself is never slowed by the log.
    pub dropped: u64,
}

/// Reads a sandbox's egress log (`GET /v1/sandboxes/{sandbox}/network/log`). Only the
/// newest rows are kept (ADR 0063); rows go with the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GetNetworkLog {
    /// Id or name of the sandbox.
    pub sandbox: String,
    /// Only rows with a `seq` above this.
    pub after: Option<u64>,
    /// At most this many rows (default 100, at most 1000).
    pub limit: Option<u32>,
    /// When there is no row yet: wait up to this long for one (at most 60 000).
    pub wait_ms: Option<u64>,
}

impl crate::ops::Operation for GetNetworkLog {
    type Output = NetLogPage;
    const NAME: &'static str = "network.log";
    const SCOPE: crate::Scope = crate::Scope::SandboxesRead;
    const METHOD: crate::ops::HttpMethod = crate::ops::HttpMethod::Get;
    const PATH: &'static str = crate::routes::SANDBOX_NETWORK_LOG;
    fn path_values(&self) -> Vec<String> {
        vec![self.sandbox.clone()]
    }
    fn query(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if let Some(a) = self.after {
            q.push(("after", a.to_string()));
        }
        if let Some(l) = self.limit {
            q.push(("limit", l.to_string()));
        }
        if let Some(w) = self.wait_ms {
            q.push(("wait_ms", w.to_string()));
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::{NetAction, NetLogKind, NetReason};

    #[test]
    fn a_record_is_the_entry_with_its_seq() {
        let r = NetLogRecord {
            seq: 7,
            entry: NetLogEntry {
                at_ms: 1,
                sandbox: "sb".into(),
                kind: NetLogKind::Tcp,
                name: Some("a.test".into()),
                ip: None,
                port: 443,
                bytes_up: 3,
                bytes_down: 4,
                decision: NetAction::Allow,
                reason: NetReason::RuleAllow,
                rule: Some(0),
                name_ip_mismatch: false,
                qtype: None,
                answers: None,
            },
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["seq"], 7);
        assert_eq!(v["name"], "a.test");
        assert_eq!(v["bytes_up"], 3);
        let back: NetLogRecord = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
    }
}
