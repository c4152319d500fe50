//! Unit tests of the store over a temporary SQLite file (no root, no daemon).

use super::*;
use crate::caller::POOL_TENANT;

pub(crate) async fn temp_store() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&dir.path().join("state.db"))
        .await
        .expect("open the store");
    (dir, store)
}

/// A sandbox row to insert (state `creating`). It is read back from a raw insert rather
/// than written as a struct literal, so fields added to [`SandboxRow`] by later
/// migrations (with their defaults) do not break these tests.
pub(crate) async fn row(store: &Store, id: &str, tenant: &str, name: Option<&str>) -> SandboxRow {
    let mut tx = store.pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO sandboxes (id, tenant, name, state, labels, image, memory_bytes, cpus, \
         pids, idle_pause_secs, ttl_secs, ttl_action, slot, created_at, last_active_at, \
         disk_bytes, tier) VALUES ('template', 'template', NULL, 'creating', '{\"k\":\"v\"}', \
         'host', 268435456, 1.0, 256, 60, NULL, 'stop', -1, 1, 1, 1073741824, 'jail')",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let r = sqlx::query("SELECT * FROM sandboxes WHERE id = 'template'")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let template = row_to_sandbox(&r).unwrap();
    // Rolled back: the template never takes a slot or an id.
    tx.rollback().await.unwrap();
    SandboxRow {
        id: id.into(),
        tenant: tenant.into(),
        name: name.map(Into::into),
        ..template
    }
}

async fn state_of(store: &Store, id: &str) -> State {
    store
        .get_by_id_any(id)
        .await
        .unwrap()
        .expect("the row exists")
        .state
}

#[tokio::test]
async fn a_row_reads_back_as_written_and_the_database_is_private() {
    let (dir, store) = temp_store().await;
    let slot = store
        .insert_sandbox(&row(&store, "a", "t1", Some("one")).await)
        .await
        .unwrap();
    assert_eq!(slot, 0);
    let got = store.get_sandbox("t1", "one").await.unwrap().unwrap();
    assert_eq!(got.id, "a");
    assert_eq!(got.state, State::Creating);
    assert_eq!(got.labels.get("k").map(String::as_str), Some("v"));
    assert_eq!(got.memory_bytes, 256 << 20);
    assert_eq!(got.idle_pause_secs, Some(60));
    assert_eq!(got.ttl_action, TtlAction::Stop);
    assert_eq!(got.disk_bytes, 1 << 30);
    assert_eq!(got.tier, "jail");
    assert_eq!(got.agent_pid, None);
    // By id too; never another tenant's.
    assert!(store.get_sandbox("t1", "a").await.unwrap().is_some());
    assert!(store.get_sandbox("t2", "a").await.unwrap().is_none());
    assert!(store.get_sandbox("t2", "one").await.unwrap().is_none());
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join("state.db"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "the database is owner-only: {mode:o}");
}

#[tokio::test]
async fn slots_are_the_lowest_free_and_reused_after_delete() {
    let (_dir, store) = temp_store().await;
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        assert_eq!(
            store
                .insert_sandbox(&row(&store, id, "t", None).await)
                .await
                .unwrap(),
            i as u32
        );
    }
    store.delete_sandbox("b").await.unwrap();
    assert_eq!(
        store
            .insert_sandbox(&row(&store, "d", "t", None).await)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .insert_sandbox(&row(&store, "e", "t", None).await)
            .await
            .unwrap(),
        3
    );
}

#[tokio::test]
async fn past_the_last_slot_a_create_is_refused_and_nothing_is_written() {
    let (_dir, store) = temp_store().await;
    // Fill every slot in one statement (inserting 2,048 rows one by one is slow).
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?) \
         INSERT INTO sandboxes (id, tenant, name, state, labels, image, memory_bytes, cpus, \
         pids, ttl_action, slot, created_at, last_active_at) \
         SELECT 'fill-' || i, 't', NULL, 'running', '{}', 'host', 1, 1.0, 1, 'stop', i, 1, 1 \
         FROM n",
    )
    .bind(crate::store::MAX_SANDBOXES as i64)
    .execute(&store.pool)
    .await
    .unwrap();
    let err = store
        .insert_sandbox(&row(&store, "late", "t", Some("late")).await)
        .await;
    assert!(matches!(err, Err(CoreError::Conflict(_))), "{err:?}");
    assert!(store.get_by_id_any("late").await.unwrap().is_none());
    // A freed slot is usable again.
    store.delete_sandbox("fill-7").await.unwrap();
    assert_eq!(
        store
            .insert_sandbox(&row(&store, "late", "t", None).await)
            .await
            .unwrap(),
        7
    );
}

#[tokio::test]
async fn names_are_unique_per_tenant_and_a_refused_insert_changes_nothing() {
    let (_dir, store) = temp_store().await;
    store
        .insert_sandbox(&row(&store, "a", "t1", Some("n")).await)
        .await
        .unwrap();
    let dup = store
        .insert_sandbox(&row(&store, "b", "t1", Some("n")).await)
        .await;
    assert!(
        matches!(dup, Err(CoreError::Conflict(ref m)) if m.contains("\"n\"")),
        "{dup:?}"
    );
    assert!(store.get_by_id_any("b").await.unwrap().is_none());
    // Its slot was not consumed.
    assert_eq!(
        store
            .insert_sandbox(&row(&store, "c", "t2", Some("n")).await)
            .await
            .unwrap(),
        1
    );
    // Unnamed sandboxes never collide.
    store
        .insert_sandbox(&row(&store, "d", "t1", None).await)
        .await
        .unwrap();
    store
        .insert_sandbox(&row(&store, "e", "t1", None).await)
        .await
        .unwrap();
    // Ids are unique whatever the tenant.
    let same_id = store
        .insert_sandbox(&row(&store, "a", "t3", None).await)
        .await;
    assert!(
        matches!(same_id, Err(CoreError::Conflict(_))),
        "{same_id:?}"
    );
}

#[tokio::test]
async fn a_transition_is_guarded_by_the_expected_state() {
    let (_dir, store) = temp_store().await;
    store
        .insert_sandbox(&row(&store, "a", "t", None).await)
        .await
        .unwrap();
    store
        .transition("a", &[State::Creating], State::Running, Some(42))
        .await
        .unwrap();
    let r = store.get_by_id_any("a").await.unwrap().unwrap();
    assert_eq!((r.state, r.agent_pid), (State::Running, Some(42)));

    // A stale caller that still believes the sandbox is creating cannot overwrite it.
    let stale = store
        .transition("a", &[State::Creating], State::Stopped, None)
        .await;
    match stale {
        Err(CoreError::Conflict(m)) => assert!(m.contains("is running, no longer creating"), "{m}"),
        other => panic!("{other:?}"),
    }
    let r = store.get_by_id_any("a").await.unwrap().unwrap();
    assert_eq!((r.state, r.agent_pid), (State::Running, Some(42)));

    // Any of several expected states.
    store
        .transition(
            "a",
            &[State::Paused, State::Running],
            State::Paused,
            Some(42),
        )
        .await
        .unwrap();
    assert_eq!(state_of(&store, "a").await, State::Paused);

    let gone = store
        .transition("nope", &[State::Running], State::Stopped, None)
        .await;
    assert!(matches!(gone, Err(CoreError::Conflict(ref m)) if m.contains("no longer exists")));
    let empty = store.transition("a", &[], State::Stopped, None).await;
    assert!(matches!(empty, Err(CoreError::Internal(_))), "{empty:?}");
    assert_eq!(state_of(&store, "a").await, State::Paused);
}

#[tokio::test]
async fn of_two_racing_transitions_from_the_same_state_exactly_one_wins() {
    let (_dir, store) = temp_store().await;
    store
        .insert_sandbox(&row(&store, "a", "t", None).await)
        .await
        .unwrap();
    store
        .transition("a", &[State::Creating], State::Running, None)
        .await
        .unwrap();
    let (s1, s2) = (store.clone(), store.clone());
    let (r1, r2) = tokio::join!(
        s1.transition("a", &[State::Running], State::Paused, None),
        s2.transition("a", &[State::Running], State::Deleting, None),
    );
    assert!(r1.is_ok() != r2.is_ok(), "{r1:?} {r2:?}");
    let want = if r1.is_ok() {
        State::Paused
    } else {
        State::Deleting
    };
    assert_eq!(state_of(&store, "a").await, want);
}

#[tokio::test]
async fn deleting_rows_are_hidden_from_users_but_not_from_reconcile() {
    let (_dir, store) = temp_store().await;
    store
        .insert_sandbox(&row(&store, "a", "t", Some("n")).await)
        .await
        .unwrap();
    store
        .transition("a", &[State::Creating], State::Deleting, None)
        .await
        .unwrap();
    assert!(store.get_sandbox("t", "n").await.unwrap().is_none());
    assert!(store.get_sandbox("t", "a").await.unwrap().is_none());
    let all = store.all_sandboxes().await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].state, State::Deleting);
}

#[tokio::test]
async fn a_pooled_sandbox_is_adopted_once_and_only_while_running() {
    let (_dir, store) = temp_store().await;
    store
        .insert_sandbox(&row(&store, "p1", POOL_TENANT, None).await)
        .await
        .unwrap();
    assert_eq!(
        store.pool_candidate("host", 1 << 30).await.unwrap(),
        None,
        "not running yet"
    );
    store
        .transition("p1", &[State::Creating], State::Running, Some(7))
        .await
        .unwrap();
    assert_eq!(
        store
            .pool_candidate("host", 1 << 30)
            .await
            .unwrap()
            .as_deref(),
        Some("p1")
    );
    assert_eq!(
        store.pool_candidate("host", 2 << 30).await.unwrap(),
        None,
        "other disk size"
    );
    assert_eq!(
        store.pool_candidate("other", 1 << 30).await.unwrap(),
        None,
        "other image"
    );

    let mut wanted = row(&store, "ignored", "t", Some("mine")).await;
    wanted.memory_bytes = 512 << 20;
    wanted.created_at = 99;
    assert!(store.adopt_pooled("p1", &wanted).await.unwrap());
    let r = store.get_sandbox("t", "mine").await.unwrap().unwrap();
    assert_eq!(r.id, "p1");
    assert_eq!(r.memory_bytes, 512 << 20);
    assert_eq!(r.created_at, 99);
    assert_eq!(r.agent_pid, Some(7), "the agent is kept");
    // A second adoption of the same sandbox (a racing create) finds nothing to take.
    let mut other = row(&store, "ignored", "t2", Some("theirs")).await;
    other.created_at = 100;
    assert!(!store.adopt_pooled("p1", &other).await.unwrap());
    assert!(store.get_sandbox("t2", "theirs").await.unwrap().is_none());
    assert_eq!(store.pool_candidate("host", 1 << 30).await.unwrap(), None);
}

#[tokio::test]
async fn adopting_into_a_taken_name_is_a_conflict_and_the_pool_keeps_it() {
    let (_dir, store) = temp_store().await;
    store
        .insert_sandbox(&row(&store, "a", "t", Some("n")).await)
        .await
        .unwrap();
    store
        .insert_sandbox(&row(&store, "p1", POOL_TENANT, None).await)
        .await
        .unwrap();
    store
        .transition("p1", &[State::Creating], State::Running, None)
        .await
        .unwrap();
    let err = store
        .adopt_pooled("p1", &row(&store, "x", "t", Some("n")).await)
        .await;
    assert!(matches!(err, Err(CoreError::Conflict(_))), "{err:?}");
    let p = store.get_by_id_any("p1").await.unwrap().unwrap();
    assert_eq!(p.tenant, POOL_TENANT);
    assert_eq!(p.name, None);
}

#[tokio::test]
async fn image_names_are_unique() {
    let (_dir, store) = temp_store().await;
    let img = ImageRow {
        name: "py".into(),
        kind: "rootfs".into(),
        path: Some("/x".into()),
        created_at: 5,
    };
    store.insert_image(&img).await.unwrap();
    let dup = store
        .insert_image(&ImageRow {
            path: None,
            ..img.clone()
        })
        .await;
    assert!(matches!(dup, Err(CoreError::Conflict(_))), "{dup:?}");
    let got = store.get_image("py").await.unwrap().unwrap();
    assert_eq!(got.path.as_deref(), Some("/x"));
    assert_eq!(store.list_images().await.unwrap().len(), 1);
    assert!(store.get_image("nope").await.unwrap().is_none());
}

#[tokio::test]
async fn a_state_the_store_does_not_know_is_an_error_not_a_guess() {
    let (_dir, store) = temp_store().await;
    store
        .insert_sandbox(&row(&store, "a", "t", None).await)
        .await
        .unwrap();
    sqlx::query("UPDATE sandboxes SET state = 'exploded' WHERE id = 'a'")
        .execute(&store.pool)
        .await
        .unwrap();
    let r = store.get_by_id_any("a").await;
    assert!(
        matches!(r, Err(CoreError::Internal(ref m)) if m.contains("exploded")),
        "{r:?}"
    );
}

/// A database made by the first schema (no tenants, globally unique names, no disk
/// quota, no tier) opens with its rows carried over and the later columns defaulted.
#[tokio::test]
async fn an_old_database_is_migrated_with_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let opts = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
            .unwrap()
            .create_if_missing(true);
        let pool = SqlitePoolOptions::new().connect_with(opts).await.unwrap();
        let mut old = sqlx::migrate!("./migrations");
        old.migrations = std::borrow::Cow::Owned(old.migrations[..1].to_vec());
        old.run(&pool).await.unwrap();
        sqlx::query(
            "INSERT INTO sandboxes (id, name, state, labels, image, memory_bytes, cpus, pids, \
             idle_pause_secs, ttl_secs, ttl_action, slot, agent_pid, created_at, last_active_at) \
             VALUES ('old', 'legacy', 'stopped', '{\"a\":\"b\"}', 'host', 1024, 0.5, 64, NULL, \
             3600, 'delete', 3, NULL, 10, 20)",
        )
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }
    let store = Store::open(&path).await.unwrap();
    let r = store
        .get_sandbox(crate::DEFAULT_TENANT, "legacy")
        .await
        .unwrap()
        .expect("the old row is in the default tenant");
    assert_eq!(r.id, "old");
    assert_eq!(r.state, State::Stopped);
    assert_eq!(r.slot, 3);
    assert_eq!(r.ttl_secs, Some(3600));
    assert_eq!(r.ttl_action, TtlAction::Delete);
    assert_eq!(r.disk_bytes, 0, "created before quotas");
    assert_eq!(r.tier, "jail", "created before tiers");
    // Names are now unique per tenant, not globally.
    store
        .insert_sandbox(&row(&store, "new", "t2", Some("legacy")).await)
        .await
        .unwrap();
    // The audit chain starts empty and valid.
    assert!(store.verify_audit().await.unwrap().ok);
    // Opening again applies nothing twice.
    store.close().await;
    let again = Store::open(&path).await.unwrap();
    assert_eq!(again.all_sandboxes().await.unwrap().len(), 2);
}

/// What is committed survives the process going away without closing the store (the WAL
/// is replayed at the next open); what was not committed leaves no trace.
#[tokio::test]
async fn committed_rows_survive_an_unclean_end_and_uncommitted_ones_leave_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    {
        let store = Store::open(&path).await.unwrap();
        store
            .insert_sandbox(&row(&store, "kept", "t", Some("k")).await)
            .await
            .unwrap();
        // A transaction cut off before its commit (the daemon killed mid-create).
        let mut tx = store.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        sqlx::query(
            "INSERT INTO sandboxes (id, tenant, state, labels, image, memory_bytes, cpus, pids, \
             ttl_action, slot, created_at, last_active_at) \
             VALUES ('lost', 't', 'creating', '{}', 'host', 1, 1.0, 1, 'stop', 1, 1, 1)",
        )
        .execute(&mut *tx)
        .await
        .unwrap();
        // Leak the WAL state as a killed process would: no close, no checkpoint.
        std::mem::forget(tx);
        std::mem::forget(store);
    }
    let store = Store::open(&path).await.unwrap();
    let ids: Vec<String> = store
        .all_sandboxes()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, vec!["kept".to_string()]);
}
