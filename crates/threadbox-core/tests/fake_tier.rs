//! The manager over the fake tier, without root: the lifecycle, reconcile after a daemon
//! restart, and the warm pool run the manager's own code with `FakeDriver` underneath.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use threadbox_api::{CreateSandboxRequest, LimitsRequest, SandboxState};
use threadbox_core::driver::Drivers;
use threadbox_core::fake::{agent_binary, FakeDriver, FakeFault};
use threadbox_core::images::HOST_IMAGE;
use threadbox_core::store::Store;
use threadbox_core::{Caller, Config, Manager};

struct Daemon {
    mgr: Arc<Manager>,
    fake: Arc<FakeDriver>,
}

fn config(root: &Path, warm_pool: usize) -> Config {
    let mut c = Config::new(root.to_path_buf());
    c.warm_pool = warm_pool;
    c.default_disk_bytes = 16 << 20;
    c
}

async fn open(root: &Path, warm_pool: usize) -> Daemon {
    let fake = Arc::new(FakeDriver::new(
        root.join("fake"),
        agent_binary().expect("agent binary"),
    ));
    let f: Arc<dyn threadbox_core::driver::Driver> = fake.clone();
    let mgr = Manager::open(config(root, warm_pool), Drivers::new(f))
        .await
        .expect("open the manager over the fake tier");
    Daemon { mgr, fake }
}

fn req(name: &str) -> CreateSandboxRequest {
    CreateSandboxRequest {
        name: Some(name.into()),
        ..Default::default()
    }
}

/// Waits for `cond` with a deadline (the pool refills in the background).
async fn wait_for(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_runs_through_the_manager_on_the_fake_tier() {
    let root = tempfile::tempdir().unwrap();
    let d = open(root.path(), 0).await;
    let op = Caller::operator();
    let (sb, created) = d.mgr.create(&op, req("one")).await.unwrap();
    assert!(created);
    assert_eq!(sb.state, SandboxState::Running);
    assert_eq!(sb.tier, "fake");
    let pid = sb.agent_pid.expect("the operator sees the agent's pid");
    assert_eq!(d.fake.agent_pid(&sb.id), Some(pid));

    // Get-or-create by name answers the same sandbox.
    let (again, created) = d.mgr.create(&op, req("one")).await.unwrap();
    assert!(!created);
    assert_eq!(again.id, sb.id);

    let paused = d.mgr.pause(&op, "one").await.unwrap();
    assert_eq!(paused.state, SandboxState::Paused);
    let resumed = d.mgr.resume(&op, "one").await.unwrap();
    assert_eq!(resumed.state, SandboxState::Running);

    let stopped = d.mgr.stop(&op, "one").await.unwrap();
    assert_eq!(stopped.state, SandboxState::Stopped);
    assert_eq!(d.fake.agent_pid(&sb.id), None, "stop ends the agent");
    let started = d.mgr.start(&op, "one").await.unwrap();
    assert_eq!(started.state, SandboxState::Running);
    assert_ne!(started.agent_pid, Some(pid), "a new boot");

    d.mgr.delete(&op, "one", true).await.unwrap();
    assert!(d.mgr.get(&op, "one").await.is_err());
    assert!(!root.path().join("fake").join(&sb.id).exists());
    d.mgr.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_boot_leaves_nothing_and_names_the_cause() {
    let root = tempfile::tempdir().unwrap();
    let d = open(root.path(), 0).await;
    let op = Caller::operator();
    d.fake.fail_next(FakeFault::Launch, 1);
    let err = d.mgr.create(&op, req("doomed")).await.unwrap_err();
    assert!(err.to_string().contains("injected Launch failure"), "{err}");
    assert!(d.mgr.get(&op, "doomed").await.is_err(), "no row is left");
    let left: Vec<_> = std::fs::read_dir(root.path().join("fake"))
        .map(|r| r.flatten().collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "nothing is left on the host: {left:?}");
    // An unknown tier is refused before anything exists.
    let err = d
        .mgr
        .create(
            &op,
            CreateSandboxRequest {
                tier: Some("jail".into()),
                ..req("elsewhere")
            },
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown tier"), "{err}");
    d.mgr.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconcile_readopts_running_and_paused_sandboxes_and_stops_dead_ones() {
    let root = tempfile::tempdir().unwrap();
    let op = Caller::operator();
    let (run, paused, dead) = {
        let d = open(root.path(), 0).await;
        let run = d.mgr.create(&op, req("run")).await.unwrap().0;
        let paused = d.mgr.create(&op, req("paused")).await.unwrap().0;
        d.mgr.pause(&op, "paused").await.unwrap();
        let dead = d.mgr.create(&op, req("dead")).await.unwrap().0;
        // Sandboxes outlive the daemon; one agent dies while it is down.
        d.mgr.shutdown().await;
        let pid = d.fake.agent_pid(&dead.id).unwrap();
        threadbox_sys::child::kill(pid, libc::SIGKILL).unwrap();
        (run, paused, dead)
    };
    let d = open(root.path(), 0).await;
    let state = async |id: &str| d.mgr.get(&op, id).await.unwrap().state;
    assert_eq!(state(&run.id).await, SandboxState::Running);
    assert_eq!(d.fake.agent_pid(&run.id), run.agent_pid, "the same agent");
    assert_eq!(state(&paused.id).await, SandboxState::Paused);
    assert_eq!(state(&dead.id).await, SandboxState::Stopped);
    // The re-adopted paused one resumes; the dead one boots again from its kept disk.
    d.mgr.resume(&op, "paused").await.unwrap();
    assert_eq!(
        d.mgr.start(&op, "dead").await.unwrap().state,
        SandboxState::Running
    );
    for name in ["run", "paused", "dead"] {
        d.mgr.delete(&op, name, true).await.unwrap();
    }
    d.mgr.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_hands_out_a_booted_sandbox_and_applies_the_requests_limits() {
    let root = tempfile::tempdir().unwrap();
    let d = open(root.path(), 1).await;
    let op = Caller::operator();
    // What the manager's adoption asks the store: a pooled sandbox that is running.
    let store = Store::open(&root.path().join("state.db")).await.unwrap();
    let candidate = async || store.pool_candidate(HOST_IMAGE, 16 << 20).await.unwrap();
    wait_for("the pool to fill", async || candidate().await.is_some()).await;
    let ready = vec![candidate().await.unwrap()];
    let want = LimitsRequest {
        memory_bytes: Some(256 << 20),
        cpus: Some(0.5),
        ..Default::default()
    };
    let (sb, _) = d
        .mgr
        .create(
            &op,
            CreateSandboxRequest {
                limits: want.clone(),
                ..req("pooled")
            },
        )
        .await
        .unwrap();
    assert_eq!(vec![sb.id.clone()], ready, "the pooled sandbox was adopted");
    let applied = d.fake.limits(&sb.id).expect("limits applied");
    assert_eq!(applied.memory_bytes, 256 << 20);
    assert_eq!(applied.cpus, 0.5);

    // The pool refills; when the limits cannot be applied, the pooled sandbox is
    // discarded and the create boots cold (F5: never reuse a half-rewritten one).
    wait_for("the pool to refill", async || candidate().await.is_some()).await;
    d.fake.fail_next(FakeFault::SetLimits, 1);
    let (cold, _) = d
        .mgr
        .create(
            &op,
            CreateSandboxRequest {
                limits: want,
                ..req("cold")
            },
        )
        .await
        .unwrap();
    assert_eq!(cold.state, SandboxState::Running);
    assert_eq!(d.fake.limits(&cold.id).unwrap().memory_bytes, 256 << 20);
    for name in ["pooled", "cold"] {
        d.mgr.delete(&op, name, true).await.unwrap();
    }
    d.mgr.shutdown().await;
}
