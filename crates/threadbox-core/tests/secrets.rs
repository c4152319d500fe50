//! Secrets over the fake tier, without root (issue 13, ADR 0068): per tenant, never
//! answered, refused on create when unknown, a placeholder (not the value) in the env.

use std::path::Path;
use std::sync::Arc;
use threadbox_api::secrets::{DeleteSecret, ListSecrets, SetSecret, SetSecretRequest};
use threadbox_api::{CreateSandboxRequest, ExecRequest, Scope};
use threadbox_core::driver::Drivers;
use threadbox_core::fake::{agent_binary, FakeDriver};
use threadbox_core::{Caller, Config, Manager};

const VALUE: &str = "sk-live-7d1f0c2b9a";

async fn open(root: &Path) -> Arc<Manager> {
    let fake = Arc::new(FakeDriver::new(
        root.join("fake"),
        agent_binary().expect("agent binary"),
    ));
    let f: Arc<dyn threadbox_core::driver::Driver> = fake;
    let mut c = Config::new(root.to_path_buf());
    c.default_disk_bytes = 16 << 20;
    Manager::open(c, Drivers::new(f)).await.expect("open")
}

fn set(name: &str) -> SetSecret {
    SetSecret {
        name: name.into(),
        req: SetSecretRequest {
            host: "api.example.com".into(),
            header: None,
            format: Some("Bearer {}".into()),
            value: VALUE.into(),
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_per_tenant_never_answered_and_placeholders_only() {
    let root = tempfile::tempdir().unwrap();
    let mgr = open(root.path()).await;
    let scopes = [
        Scope::SandboxesRead,
        Scope::SandboxesWrite,
        Scope::SandboxesDelete,
    ];
    let a = Caller::key("tenant-a", "ka", scopes);
    let b = Caller::key("tenant-b", "kb", scopes);

    let info = mgr.run(&a, set("API_KEY")).await.expect("set");
    assert!(!format!("{info:?}").contains(VALUE));
    let listed = mgr.run(&a, ListSecrets).await.unwrap();
    assert_eq!(listed.secrets.len(), 1);
    assert!(!serde_json::to_string(&listed).unwrap().contains(VALUE));
    // Another tenant sees none of it and cannot use it.
    assert!(mgr.run(&b, ListSecrets).await.unwrap().secrets.is_empty());
    let req = CreateSandboxRequest {
        secrets: vec!["API_KEY".into()],
        ..Default::default()
    };
    assert!(
        mgr.create(&b, req.clone()).await.is_err(),
        "b used a's secret"
    );
    assert!(mgr
        .run(
            &b,
            DeleteSecret {
                name: "API_KEY".into()
            }
        )
        .await
        .is_err());

    // The owner's sandbox holds a placeholder in the env, never the value.
    let (sb, _) = mgr.create(&a, req).await.expect("create with the secret");
    let out = mgr
        .exec(
            &a,
            &sb.id,
            ExecRequest {
                shell: Some("printf '%s|%s' \"$API_KEY\" \"$SSL_CERT_FILE\"".into()),
                ..Default::default()
            },
        )
        .await
        .expect("exec");
    let stdout = out.stdout.clone();
    assert!(stdout.starts_with("tb_secret_"), "{stdout}");
    assert!(stdout.contains("/tmp/.threadbox/ca-bundle.pem"), "{stdout}");
    assert!(!stdout.contains(VALUE));

    // The database holds ciphertext only.
    let db = std::fs::read(root.path().join("state.db")).unwrap();
    let wal = std::fs::read(root.path().join("state.db-wal")).unwrap_or_default();
    for bytes in [&db, &wal] {
        assert!(!bytes.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()));
    }
    mgr.run(
        &a,
        DeleteSecret {
            name: "API_KEY".into(),
        },
    )
    .await
    .expect("rm");
    assert!(mgr.run(&a, ListSecrets).await.unwrap().secrets.is_empty());
}
