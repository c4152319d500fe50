//! The store's side of the egress log (issue 13, ADR 0063): rows appended in batches by the
//! log writer, trimmed to the newest N per sandbox, paged by `seq`; and the egress bytes of
//! the meter.

use crate::error::{CoreError, Result};
use crate::store::Store;
use sqlx::Row;
use std::collections::HashMap;
use threadbox_api::net_log::NetLogRecord;
use threadbox_api::network::NetLogEntry;

fn clamp_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn as_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// A serde unit enum as its wire string (`allow`, `rule_deny`…).
fn enum_str<T: serde::Serialize>(v: &T) -> Result<String> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => Ok(s),
        Ok(other) => Err(CoreError::Internal(format!("not a unit enum: {other}"))),
        Err(e) => Err(CoreError::Internal(e.to_string())),
    }
}

fn enum_of<T: serde::de::DeserializeOwned>(s: String) -> Result<T> {
    serde_json::from_value(serde_json::Value::String(s))
        .map_err(|e| CoreError::Internal(format!("net_log: {e}")))
}

/// Egress bytes metered for one batch of rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetBytes {
    pub up: u64,
    pub down: u64,
}

impl Store {
    /// Appends `entries` to the log of `sandbox_id` in one transaction, then deletes all but
    /// its newest `keep` rows. A sandbox deleted meanwhile fails the insert (foreign key);
    /// the caller drops the batch.
    pub async fn append_net_log(
        &self,
        sandbox_id: &str,
        entries: &[NetLogEntry],
        keep: u64,
    ) -> Result<()> {
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        for e in entries {
            sqlx::query(
                "INSERT INTO net_log (sandbox_id, at_ms, kind, name, ip, port, bytes_up, \
                 bytes_down, decision, reason, rule, name_ip_mismatch, qtype, answers) \
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(sandbox_id)
            .bind(clamp_i64(e.at_ms))
            .bind(enum_str(&e.kind)?)
            .bind(&e.name)
            .bind(&e.ip)
            .bind(i64::from(e.port))
            .bind(clamp_i64(e.bytes_up))
            .bind(clamp_i64(e.bytes_down))
            .bind(enum_str(&e.decision)?)
            .bind(enum_str(&e.reason)?)
            .bind(e.rule.map(|r| clamp_i64(r as u64)))
            .bind(e.name_ip_mismatch)
            .bind(&e.qtype)
            .bind(e.answers.map(i64::from))
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(
            "DELETE FROM net_log WHERE sandbox_id = ?1 AND seq <= \
             (SELECT seq FROM net_log WHERE sandbox_id = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)",
        )
        .bind(sandbox_id)
        .bind(clamp_i64(keep))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Up to `limit` rows of `sandbox_id` with `seq > after`, oldest first.
    pub async fn net_log_page(
        &self,
        sandbox_id: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<NetLogRecord>> {
        let rows = sqlx::query(
            "SELECT * FROM net_log WHERE sandbox_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        )
        .bind(sandbox_id)
        .bind(clamp_i64(after))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let rule: Option<i64> = r.try_get("rule")?;
                let answers: Option<i64> = r.try_get("answers")?;
                let port: i64 = r.try_get("port")?;
                Ok(NetLogRecord {
                    seq: as_u64(r.try_get("seq")?),
                    entry: NetLogEntry {
                        at_ms: as_u64(r.try_get("at_ms")?),
                        sandbox: r.try_get("sandbox_id")?,
                        kind: enum_of(r.try_get("kind")?)?,
                        name: r.try_get("name")?,
                        ip: r.try_get("ip")?,
                        port: u16::try_from(port).unwrap_or(0),
                        bytes_up: as_u64(r.try_get("bytes_up")?),
                        bytes_down: as_u64(r.try_get("bytes_down")?),
                        decision: enum_of(r.try_get("decision")?)?,
                        reason: enum_of(r.try_get("reason")?)?,
                        rule: rule.and_then(|v| usize::try_from(v).ok()),
                        name_ip_mismatch: r.try_get("name_ip_mismatch")?,
                        qtype: r.try_get("qtype")?,
                        answers: answers.and_then(|v| u32::try_from(v).ok()),
                    },
                })
            })
            .collect()
    }

    /// Adds egress bytes to the sandbox's lifetime usage and its tenant's UTC `day`. The
    /// usage row is made if metering has not sampled the sandbox yet (`sampled_at` is then
    /// its creation, so the first sample still counts from there).
    pub async fn add_net_bytes(
        &self,
        sandbox_id: &str,
        tenant: &str,
        created_at: i64,
        day: &str,
        bytes: NetBytes,
    ) -> Result<()> {
        let (up, down) = (clamp_i64(bytes.up), clamp_i64(bytes.down));
        let mut tx = self.pool.begin_with("BEGIN IMMEDIATE").await?;
        sqlx::query(
            "INSERT INTO sandbox_usage (sandbox_id, tenant, sampled_at, net_bytes_up, \
             net_bytes_down) VALUES (?, ?, ?, ?, ?) ON CONFLICT(sandbox_id) DO UPDATE SET \
             net_bytes_up = net_bytes_up + excluded.net_bytes_up, \
             net_bytes_down = net_bytes_down + excluded.net_bytes_down",
        )
        .bind(sandbox_id)
        .bind(tenant)
        .bind(created_at)
        .bind(up)
        .bind(down)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO usage_daily (tenant, day, net_bytes_up, net_bytes_down) \
             VALUES (?, ?, ?, ?) ON CONFLICT(tenant, day) DO UPDATE SET \
             net_bytes_up = net_bytes_up + excluded.net_bytes_up, \
             net_bytes_down = net_bytes_down + excluded.net_bytes_down",
        )
        .bind(tenant)
        .bind(day)
        .bind(up)
        .bind(down)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Egress bytes of each sandbox of `tenant` over its life.
    pub async fn net_bytes_by_sandbox(&self, tenant: &str) -> Result<HashMap<String, NetBytes>> {
        let rows = sqlx::query(
            "SELECT sandbox_id, net_bytes_up, net_bytes_down FROM sandbox_usage WHERE tenant = ?",
        )
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("sandbox_id")?,
                    NetBytes {
                        up: as_u64(r.try_get("net_bytes_up")?),
                        down: as_u64(r.try_get("net_bytes_down")?),
                    },
                ))
            })
            .collect()
    }

    /// Egress bytes of `tenant` over the UTC days `>= since_day` (every day when `None`).
    pub async fn net_bytes_of_tenant(
        &self,
        tenant: &str,
        since_day: Option<&str>,
    ) -> Result<NetBytes> {
        let r = sqlx::query(
            "SELECT COALESCE(SUM(net_bytes_up), 0) AS up, COALESCE(SUM(net_bytes_down), 0) AS down \
             FROM usage_daily WHERE tenant = ? AND (? IS NULL OR day >= ?)",
        )
        .bind(tenant)
        .bind(since_day)
        .bind(since_day)
        .fetch_one(&self.pool)
        .await?;
        Ok(NetBytes {
            up: as_u64(r.try_get("up")?),
            down: as_u64(r.try_get("down")?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::{row, temp_store};
    use threadbox_api::network::{NetAction, NetLogKind, NetReason};

    fn entry(n: u64) -> NetLogEntry {
        NetLogEntry {
            at_ms: 1000 + n,
            sandbox: String::new(),
            kind: NetLogKind::Tcp,
            name: Some(format!("h{n}.test")),
            ip: Some("93.184.216.34".into()),
            port: 443,
            bytes_up: n,
            bytes_down: 2 * n,
            decision: NetAction::Allow,
            reason: NetReason::RuleAllow,
            rule: Some(1),
            name_ip_mismatch: n % 2 == 1,
            qtype: None,
            answers: None,
        }
    }

    #[tokio::test]
    async fn rows_page_by_seq_are_trimmed_and_go_with_their_sandbox() {
        let (_dir, store) = temp_store().await;
        store
            .insert_sandbox(&row(&store, "a", "t", None).await)
            .await
            .unwrap();
        store
            .insert_sandbox(&row(&store, "b", "t", None).await)
            .await
            .unwrap();
        let batch: Vec<_> = (1..=5).map(entry).collect();
        store.append_net_log("a", &batch, 3).await.unwrap();
        store.append_net_log("b", &batch[..1], 3).await.unwrap();
        let page = store.net_log_page("a", 0, 100).await.unwrap();
        assert_eq!(page.len(), 3, "only the newest 3 are kept: {page:?}");
        assert_eq!(page[0].entry.name.as_deref(), Some("h3.test"));
        assert_eq!(page[0].entry.sandbox, "a");
        assert_eq!(
            page[2].entry,
            NetLogEntry {
                sandbox: "a".into(),
                ..entry(5)
            }
        );
        let next = store.net_log_page("a", page[0].seq, 1).await.unwrap();
        assert_eq!(next.len(), 1);
        assert_eq!(next[0].seq, page[1].seq);
        assert_eq!(store.net_log_page("b", 0, 100).await.unwrap().len(), 1);

        store.delete_sandbox("a").await.unwrap();
        assert!(store.net_log_page("a", 0, 100).await.unwrap().is_empty());
        assert!(
            store.append_net_log("a", &batch, 3).await.is_err(),
            "a deleted sandbox takes no rows"
        );
        assert_eq!(store.net_log_page("b", 0, 100).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn egress_bytes_add_up_per_sandbox_and_per_day() {
        let (_dir, store) = temp_store().await;
        let b = |up, down| NetBytes { up, down };
        store
            .add_net_bytes("a", "t", 1, "2026-12-01", b(10, 20))
            .await
            .unwrap();
        store
            .add_net_bytes("a", "t", 1, "2026-12-02", b(1, 2))
            .await
            .unwrap();
        store
            .add_net_bytes("c", "t", 1, "2026-12-02", b(100, 0))
            .await
            .unwrap();
        let by = store.net_bytes_by_sandbox("t").await.unwrap();
        assert_eq!(by["a"], b(11, 22));
        assert_eq!(by["c"], b(100, 0));
        assert_eq!(
            store.net_bytes_of_tenant("t", None).await.unwrap(),
            b(111, 22)
        );
        assert_eq!(
            store
                .net_bytes_of_tenant("t", Some("2026-12-02"))
                .await
                .unwrap(),
            b(101, 2)
        );
        assert_eq!(store.net_bytes_of_tenant("u", None).await.unwrap(), b(0, 0));
    }
}
