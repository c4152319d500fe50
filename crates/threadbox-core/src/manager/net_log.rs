//! The egress log (issue 13, ADR 0063): a writer task per attached sandbox drains the data
//! plane's bounded channel into SQLite in batches, meters the bytes, trims to the newest
//! rows; `GET …/network/log` pages it and long-polls for new rows.
//!
//! Off the hot path: the proxy and DNS server only `try_send` into the channel
//! (`SandboxNet::emit`); a full channel drops the row and counts it, it never waits.

use super::*;
use crate::store_net_log::NetBytes;
use threadbox_api::net_log::{
    GetNetworkLog, NetLogPage, NET_LOG_DEFAULT_LIMIT, NET_LOG_MAX_LIMIT, NET_LOG_MAX_WAIT_MS,
};
use threadbox_api::network::{NetLogEntry, NetLogKind};
use tokio::sync::Notify;

/// Rows kept per sandbox; older ones are deleted as new ones arrive.
pub(crate) const NET_LOG_ROWS_PER_SANDBOX: u64 = 10_000;
/// Rows written per transaction at most.
const BATCH: usize = 256;

/// What the writer of one sandbox needs; it owns no reference to the data plane, so it
/// ends when the data plane's last sender is gone, after writing what was still queued.
pub(super) struct LogWriter {
    pub store: Store,
    pub sandbox: String,
    pub tenant: String,
    pub created_at: i64,
    pub written: Arc<Notify>,
    pub keep: u64,
}

impl LogWriter {
    pub(super) async fn run(self, mut rx: mpsc::Receiver<NetLogEntry>) {
        let mut buf = Vec::with_capacity(BATCH);
        while rx.recv_many(&mut buf, BATCH).await > 0 {
            if let Err(e) = self.write(&buf).await {
                // The sandbox may have been deleted meanwhile (its rows go with it).
                tracing::debug!(sandbox = %self.sandbox, "egress log batch dropped: {e}");
            }
            self.written.notify_waiters();
            buf.clear();
        }
    }

    async fn write(&self, batch: &[NetLogEntry]) -> Result<()> {
        for e in batch {
            egress_span(&self.tenant, e);
        }
        self.store
            .append_net_log(&self.sandbox, batch, self.keep)
            .await?;
        let bytes = batch.iter().filter(|e| e.kind == NetLogKind::Tcp).fold(
            NetBytes::default(),
            |acc, e| NetBytes {
                up: acc.up.saturating_add(e.bytes_up),
                down: acc.down.saturating_add(e.bytes_down),
            },
        );
        if bytes != NetBytes::default() {
            let now = now_ms();
            self.store
                .add_net_bytes(
                    &self.sandbox,
                    &self.tenant,
                    self.created_at,
                    &utc_day(now),
                    bytes,
                )
                .await?;
        }
        Ok(())
    }
}

/// The snake_case name serde gives an API enum (`allow`, `rule_deny`, `tcp`).
fn wire_name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// One span per egress decision (issue 17 scope 1, ADR 0090), exported like the
/// operations' spans when the daemon traces and nothing otherwise: `egress.connection`
/// or `egress.dns`, a root span (a sandbox's socket carries no trace context), with what
/// the log row says: name, address, port, bytes, decision and reason. Never payloads or
/// headers: a secret swapped into a request is not on any span.
fn egress_span(tenant: &str, e: &NetLogEntry) {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let name = match e.kind {
        NetLogKind::Dns => "egress.dns",
        _ => "egress.connection",
    };
    let span = tracing::debug_span!(
        parent: None,
        "egress",
        otel.name = name,
        otel.kind = "internal",
    );
    if span.is_disabled() {
        return;
    }
    span.set_attribute("threadbox.sandbox.id", e.sandbox.clone());
    span.set_attribute("threadbox.tenant", tenant.to_string());
    span.set_attribute("threadbox.egress.decision", wire_name(&e.decision));
    span.set_attribute("threadbox.egress.reason", wire_name(&e.reason));
    span.set_attribute("server.port", i64::from(e.port));
    span.set_attribute(
        "threadbox.egress.bytes_up",
        e.bytes_up.min(i64::MAX as u64) as i64,
    );
    span.set_attribute(
        "threadbox.egress.bytes_down",
        e.bytes_down.min(i64::MAX as u64) as i64,
    );
    if let Some(n) = &e.name {
        span.set_attribute("server.address", n.clone());
    }
    if let Some(ip) = &e.ip {
        span.set_attribute("network.peer.address", ip.clone());
    }
    if let Some(q) = &e.qtype {
        span.set_attribute("dns.question.type", q.clone());
    }
    if e.name_ip_mismatch {
        span.set_attribute("threadbox.egress.name_ip_mismatch", true);
    }
}

impl Manager {
    /// The writer for `row`'s log, to spawn next to its data plane.
    pub(super) fn log_writer(&self, row: &SandboxRow) -> LogWriter {
        LogWriter {
            store: self.store.clone(),
            sandbox: row.id.clone(),
            tenant: row.tenant.clone(),
            created_at: row.created_at,
            written: self.net.log_written.clone(),
            keep: NET_LOG_ROWS_PER_SANDBOX,
        }
    }

    /// `GET /v1/sandboxes/{sandbox}/network/log`.
    pub async fn network_log(&self, caller: &Caller, op: GetNetworkLog) -> Result<NetLogPage> {
        caller.require(GetNetworkLog::SCOPE)?;
        let limit = match op.limit {
            None => NET_LOG_DEFAULT_LIMIT,
            Some(0) => {
                return Err(CoreError::InvalidArgument(
                    "limit must be at least 1".into(),
                ))
            }
            Some(l) => l.min(NET_LOG_MAX_LIMIT),
        };
        let wait = Duration::from_millis(op.wait_ms.unwrap_or(0).min(NET_LOG_MAX_WAIT_MS));
        let after = op.after.unwrap_or(0);
        let row = self.resolve(caller, &op.sandbox).await?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Armed before the read, so a batch written between the read and the wait
            // still wakes us.
            let woken = self.net.log_written.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            let entries = self.store.net_log_page(&row.id, after, limit).await?;
            if !entries.is_empty() || tokio::time::Instant::now() >= deadline {
                let next_after = entries.last().map_or(after, |r| r.seq);
                return Ok(NetLogPage {
                    entries,
                    next_after,
                    dropped: self.net_log_dropped(&row.id),
                });
            }
            if tokio::time::timeout_at(deadline, woken).await.is_err() {
                // One last read at the deadline happens on the next turn.
                continue;
            }
            // A deleted sandbox answers not_found rather than an empty page for ever.
            self.reload(&row.id).await?;
        }
    }
}

impl crate::ops::Run for GetNetworkLog {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<NetLogPage> {
        m.network_log(caller, self).await
    }
}
