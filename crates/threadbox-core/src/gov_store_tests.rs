//! Unit tests of the governance tables over a temporary SQLite file: the audit chain and
//! its tamper detection (paged and whole agree), keys, quotas, counts.

use super::*;
use crate::store::tests::{row, temp_store};
use crate::store::State;

fn entry(i: u64) -> AuditNew {
    AuditNew {
        ts_ms: 1_000 + i as i64,
        tenant: format!("t{}", i % 3),
        key_id: i.is_multiple_of(2).then(|| format!("k{i}")),
        action: "sandbox.create".into(),
        target: format!("sb-{i}"),
        result: "ok".into(),
    }
}

async fn store_with(n: u64) -> (tempfile::TempDir, Store) {
    let (dir, store) = temp_store().await;
    for i in 0..n {
        assert_eq!(store.append_audit(&entry(i)).await.unwrap(), i + 1);
    }
    (dir, store)
}

async fn exec(store: &Store, sql: &str) {
    sqlx::query(sql).execute(&store.pool).await.unwrap();
}

/// The paged check with a small page (so page edges are crossed), the default one, and
/// the whole-log [`audit::verify`] all give the same verdict.
async fn verdict(store: &Store) -> AuditVerification {
    let paged = store.verify_audit_paged(4).await.unwrap();
    let default = store.verify_audit().await.unwrap();
    let (entries, count, head) = store.audit_chain().await.unwrap();
    let whole = audit::verify(&entries, count, &head);
    for other in [&default, &whole] {
        assert_eq!(paged.ok, other.ok);
        assert_eq!(paged.entries, other.entries);
        assert_eq!(paged.first_bad_seq, other.first_bad_seq);
        assert_eq!(paged.reason, other.reason);
    }
    paged
}

#[tokio::test]
async fn an_untouched_chain_verifies_across_pages() {
    for n in [0, 1, 4, 5, 8, 11] {
        let (_dir, store) = store_with(n).await;
        let v = verdict(&store).await;
        assert!(v.ok, "{n} entries: {v:?}");
        assert_eq!(v.entries, n);
    }
}

#[tokio::test]
async fn an_altered_entry_is_named() {
    let (_dir, store) = store_with(11).await;
    exec(
        &store,
        "UPDATE audit_log SET result = 'denied' WHERE seq = 6",
    )
    .await;
    let v = verdict(&store).await;
    assert!(!v.ok);
    assert_eq!(v.first_bad_seq, Some(6));
    assert_eq!(v.entries, 5);
    assert!(v.reason.unwrap().contains("altered"));
}

#[tokio::test]
async fn an_entry_removed_at_a_page_edge_is_named() {
    // Page size 4 in `verdict`: entry 5 opens the second page.
    for gone in [4, 5] {
        let (_dir, store) = store_with(11).await;
        exec(&store, &format!("DELETE FROM audit_log WHERE seq = {gone}")).await;
        let v = verdict(&store).await;
        assert_eq!(v.first_bad_seq, Some(gone), "{v:?}");
        assert!(v.reason.unwrap().contains("missing"));
    }
}

#[tokio::test]
async fn a_rehashed_forgery_is_caught_by_its_successor() {
    // Altering an entry and recomputing its own hash still breaks the next link.
    let (_dir, store) = store_with(6).await;
    let (entries, _, _) = store.audit_chain().await.unwrap();
    let mut forged = entries[2].record.clone();
    forged.result = "denied".into();
    let hash = audit::chain_hash(&entries[2].prev_hash, &forged);
    sqlx::query("UPDATE audit_log SET result = 'denied', hash = ? WHERE seq = 3")
        .bind(&hash)
        .execute(&store.pool)
        .await
        .unwrap();
    let v = verdict(&store).await;
    assert_eq!(v.first_bad_seq, Some(4));
    assert!(v.reason.unwrap().contains("does not follow"));
}

#[tokio::test]
async fn renumbered_entries_are_caught() {
    let (_dir, store) = store_with(6).await;
    exec(&store, "DELETE FROM audit_log WHERE seq = 3").await;
    exec(&store, "UPDATE audit_log SET seq = seq - 1 WHERE seq > 3").await;
    exec(&store, "UPDATE audit_head SET count = 5").await;
    let v = verdict(&store).await;
    assert_eq!(v.first_bad_seq, Some(3));
    assert!(v.reason.unwrap().contains("does not follow"));
}

#[tokio::test]
async fn entries_removed_at_the_end_or_a_forged_head_are_caught() {
    let (_dir, store) = store_with(9).await;
    exec(&store, "DELETE FROM audit_log WHERE seq > 7").await;
    let v = verdict(&store).await;
    assert!(!v.ok);
    assert_eq!(v.first_bad_seq, Some(8));
    assert_eq!(v.entries, 7);
    assert!(v.reason.unwrap().contains("should hold 9"));

    let (_dir, store) = store_with(3).await;
    exec(&store, "UPDATE audit_head SET last_hash = 'x'").await;
    assert_eq!(verdict(&store).await.first_bad_seq, Some(4));

    let (_dir, store) = store_with(3).await;
    exec(&store, "DELETE FROM audit_head").await;
    assert!(
        !verdict(&store).await.ok,
        "a missing head is not a valid chain"
    );
}

#[tokio::test]
async fn appends_continue_the_chain_after_a_reopen() {
    let (dir, store) = store_with(3).await;
    store.close().await;
    let store = Store::open(&dir.path().join("state.db")).await.unwrap();
    assert_eq!(store.append_audit(&entry(3)).await.unwrap(), 4);
    let v = verdict(&store).await;
    assert!(v.ok, "{v:?}");
    assert_eq!(v.entries, 4);
    let listed = store.list_audit(1, None, Some("t0"), 10).await.unwrap();
    let seqs: Vec<u64> = listed.iter().map(|e| e.record.seq).collect();
    assert_eq!(seqs, vec![4], "seq > 1, tenant t0 (entries 0 and 3)");
}

fn key(id: &str, tenant: &str) -> KeyRow {
    KeyRow {
        id: id.into(),
        tenant: tenant.into(),
        scopes: vec![Scope::SandboxesRead],
        key_hash: format!("hash-of-{id}"),
        created_at: 1,
        expires_at: None,
        revoked_at: None,
        last_used_at: None,
    }
}

#[tokio::test]
async fn a_refused_key_insert_writes_no_audit_entry() {
    let (_dir, store) = temp_store().await;
    store.insert_key(&key("k1", "t"), &entry(0)).await.unwrap();
    let dup = store.insert_key(&key("k1", "t"), &entry(1)).await;
    assert!(dup.is_err(), "a key id is unique");
    // The key and its audit entry are one transaction: the refused one left neither.
    let v = verdict(&store).await;
    assert!(v.ok);
    assert_eq!(v.entries, 1);
    assert_eq!(store.list_keys(Some("t")).await.unwrap().len(), 1);
    assert_eq!(store.list_keys(Some("other")).await.unwrap().len(), 0);
}

#[tokio::test]
async fn revoking_is_idempotent_and_audited_each_time() {
    let (_dir, store) = temp_store().await;
    store.insert_key(&key("k1", "t"), &entry(0)).await.unwrap();
    assert!(store.revoke_key("k1", 50, &entry(1)).await.unwrap());
    assert!(store.revoke_key("k1", 60, &entry(2)).await.unwrap());
    assert_eq!(
        store.get_key("k1").await.unwrap().unwrap().revoked_at,
        Some(50)
    );
    assert!(!store.revoke_key("nope", 70, &entry(3)).await.unwrap());
    assert_eq!(verdict(&store).await.entries, 4);
}

#[tokio::test]
async fn quotas_round_trip_and_replace_and_counts_follow_states() {
    let (_dir, store) = temp_store().await;
    assert!(store.get_quota("t").await.unwrap().is_none());
    let q = Quota {
        max_running: Some(2),
        max_sandboxes: Some(5),
        max_memory_bytes: None,
        max_cpus: Some(1.5),
        cpu_seconds_per_day: Some(3600),
        disk_bytes: Some(1 << 30),
    };
    store.set_quota("t", &q, 1, &entry(0)).await.unwrap();
    let got = store.get_quota("t").await.unwrap().unwrap();
    assert_eq!(got.max_running, Some(2));
    assert_eq!(got.max_cpus, Some(1.5));
    assert_eq!(got.max_memory_bytes, None);
    let q2 = Quota {
        max_running: None,
        ..q.clone()
    };
    store.set_quota("t", &q2, 2, &entry(1)).await.unwrap();
    assert_eq!(
        store.get_quota("t").await.unwrap().unwrap().max_running,
        None
    );
    assert_eq!(store.all_quotas().await.unwrap().len(), 1);

    for (id, to) in [
        ("a", None),
        ("b", Some(State::Running)),
        ("c", Some(State::Paused)),
        ("d", Some(State::Deleting)),
    ] {
        store
            .insert_sandbox(&row(&store, id, "t", None).await)
            .await
            .unwrap();
        if let Some(to) = to {
            store
                .transition(id, &[State::Creating], to, None)
                .await
                .unwrap();
        }
    }
    store
        .insert_sandbox(&row(&store, "e", "other", None).await)
        .await
        .unwrap();
    // Creating and running count as running; deleting counts as nothing.
    assert_eq!(store.count_sandboxes("t").await.unwrap(), (2, 3));
    assert_eq!(store.count_sandboxes("nobody").await.unwrap(), (0, 0));
}
