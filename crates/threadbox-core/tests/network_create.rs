//! A sandbox's egress policy given on create (issue 13), over the fake tier without root:
//! checked before anything exists, stored with generation 1, shown in the sandbox's info
//! and kept across stop/start and a daemon restart, also when the create adopts a pooled
//! sandbox.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use threadbox_api::network::{GetNetwork, NetAction, NetworkPolicySpec, NetworkRuleSpec};
use threadbox_api::CreateSandboxRequest;
use threadbox_core::driver::Drivers;
use threadbox_core::fake::{agent_binary, FakeDriver};
use threadbox_core::images::HOST_IMAGE;
use threadbox_core::store::Store;
use threadbox_core::{Caller, Config, Manager};

async fn open(root: &Path, warm_pool: usize) -> Arc<Manager> {
    let fake = Arc::new(FakeDriver::new(
        root.join("fake"),
        agent_binary().expect("agent binary"),
    ));
    let f: Arc<dyn threadbox_core::driver::Driver> = fake;
    let mut c = Config::new(root.to_path_buf());
    c.warm_pool = warm_pool;
    c.default_disk_bytes = 16 << 20;
    Manager::open(c, Drivers::new(f))
        .await
        .expect("open the manager over the fake tier")
}

fn policy(host: &str) -> NetworkPolicySpec {
    NetworkPolicySpec {
        rules: vec![NetworkRuleSpec {
            action: NetAction::Allow,
            host: Some(host.into()),
            cidr: None,
            ports: Some(vec!["8080".into()]),
            protocol: None,
        }],
        presets: vec!["python-packages".into()],
        default: NetAction::Deny,
    }
}

fn req(name: &str, network: Option<NetworkPolicySpec>) -> CreateSandboxRequest {
    CreateSandboxRequest {
        name: Some(name.into()),
        network,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_on_create_is_checked_stored_shown_and_kept() {
    let root = tempfile::tempdir().unwrap();
    let mgr = open(root.path(), 0).await;
    let op = Caller::operator();

    // Bad input: refused with the rule named, and nothing is created.
    let err = mgr
        .create(&op, req("bad", Some(policy("10.0.0.1"))))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cidr"), "{err}");
    let mut unknown = policy("api.test");
    unknown.presets = vec!["no-such-preset".into()];
    let err = mgr
        .create(&op, req("bad", Some(unknown)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no-such-preset"), "{err}");
    assert!(mgr.get(&op, "bad").await.is_err(), "no sandbox was made");
    assert!(mgr
        .list(&op, &Default::default(), None)
        .await
        .unwrap()
        .is_empty());

    let (sb, created) = mgr
        .create(&op, req("one", Some(policy("api.test"))))
        .await
        .unwrap();
    assert!(created);
    assert_eq!(sb.network, Some(policy("api.test")));
    assert_eq!(sb.network_generation, 1);
    let info = mgr
        .get_network(
            &op,
            GetNetwork {
                sandbox: "one".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (info.generation, info.policy),
        (1, Some(policy("api.test")))
    );

    // A sandbox created without one shows none.
    let (plain, _) = mgr.create(&op, req("plain", None)).await.unwrap();
    assert_eq!((plain.network, plain.network_generation), (None, 0));

    mgr.stop(&op, "one").await.unwrap();
    let started = mgr.start(&op, "one").await.unwrap();
    assert_eq!(started.network, Some(policy("api.test")));
    mgr.shutdown().await;
    drop(mgr);

    let mgr = open(root.path(), 0).await;
    let again = mgr.get(&op, "one").await.unwrap();
    assert_eq!(
        again.network,
        Some(policy("api.test")),
        "kept across a restart"
    );
    assert_eq!(again.network_generation, 1);
    let listed = mgr.list(&op, &Default::default(), None).await.unwrap();
    let one = listed.iter().find(|s| s.id == sb.id).expect("listed");
    assert_eq!(one.network, Some(policy("api.test")));
    mgr.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_adopts_a_pooled_sandbox_gets_its_policy() {
    let root = tempfile::tempdir().unwrap();
    let mgr = open(root.path(), 1).await;
    let op = Caller::operator();
    // What the manager's adoption asks the store: a pooled sandbox that is running.
    let store = Store::open(&root.path().join("state.db")).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let pooled = loop {
        if let Some(id) = store.pool_candidate(HOST_IMAGE, 16 << 20).await.unwrap() {
            break id;
        }
        assert!(Instant::now() < deadline, "the pool never filled");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let (sb, _) = mgr
        .create(&op, req("adopted", Some(policy("api.test"))))
        .await
        .unwrap();
    assert_eq!(pooled, sb.id, "the pooled sandbox was adopted");
    assert_eq!(sb.network, Some(policy("api.test")));
    assert_eq!(sb.network_generation, 1);
    mgr.shutdown().await;
}
