//! Templates (ADR 0110) through the manager over the fake tier, without root: tenancy
//! (another tenant's template is not found), the disk they count for the tenant, and
//! reconciliation of a disk without a row and of a row without a disk.

use std::sync::Arc;
use threadbox_api::templates::{
    CreateTemplate, CreateTemplateRequest, DeleteTemplate, GetTemplate,
};
use threadbox_api::CreateSandboxRequest;
use threadbox_core::driver::{Driver, Drivers};
use threadbox_core::fake::{agent_binary, FakeDriver};
use threadbox_core::store::Store;
use threadbox_core::{Caller, Config, CoreError, Manager, Scope};

async fn open(root: &std::path::Path) -> (Arc<Manager>, Arc<FakeDriver>) {
    let fake = Arc::new(FakeDriver::new(
        root.join("fake"),
        agent_binary().expect("agent binary"),
    ));
    let f: Arc<dyn Driver> = fake.clone();
    let mut c = Config::new(root.to_path_buf());
    c.default_disk_bytes = 16 << 20;
    let mgr = Manager::open(c, Drivers::new(f)).await.expect("manager");
    (mgr, fake)
}

fn tenant(t: &str) -> Caller {
    Caller::key(
        t,
        &format!("k-{t}"),
        [
            Scope::SandboxesRead,
            Scope::SandboxesWrite,
            Scope::SandboxesDelete,
        ],
    )
}

fn from(name: &str, sb: &str) -> CreateTemplate {
    CreateTemplate {
        request: CreateTemplateRequest {
            name: name.into(),
            from: Some(sb.into()),
            ..Default::default()
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templates_are_tenant_scoped_counted_and_reconciled() {
    let root = tempfile::tempdir().unwrap();
    let (mgr, fake) = open(root.path()).await;
    let (a, b) = (tenant("acme"), tenant("other"));
    let (sb, _) = mgr
        .create(
            &a,
            CreateSandboxRequest {
                name: Some("src".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let store = Store::open(&root.path().join("state.db")).await.unwrap();
    let before = store.allocated_disk_of("acme").await.unwrap();
    let t = mgr.run(&a, from("base", "src")).await.unwrap().template;
    assert_eq!(t.source, format!("sandbox {}", sb.id));
    let bytes = store.template_bytes_of("acme").await.unwrap();
    assert_eq!(bytes, t.size_bytes);
    assert_eq!(
        store.allocated_disk_of("acme").await.unwrap(),
        before + t.size_bytes as i64,
        "a template counts in the tenant's disk"
    );

    // Another tenant: not found by name or id, cannot create from it or delete it; its
    // own template of the same name is its own.
    for name in ["base", t.id.as_str()] {
        let e = mgr
            .run(
                &b,
                GetTemplate {
                    template: name.into(),
                },
            )
            .await
            .unwrap_err();
        assert!(matches!(e, CoreError::NotFound(_)), "{e}");
        let e = mgr
            .create(
                &b,
                CreateSandboxRequest {
                    template: Some(name.into()),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert!(matches!(e, CoreError::NotFound(_)), "{e}");
        let e = mgr
            .run(
                &b,
                DeleteTemplate {
                    template: name.into(),
                },
            )
            .await
            .unwrap_err();
        assert!(matches!(e, CoreError::NotFound(_)), "{e}");
    }
    let e = mgr.run(&b, from("base", "src")).await.unwrap_err();
    assert!(
        matches!(e, CoreError::NotFound(_)),
        "another tenant's sandbox: {e}"
    );
    assert_eq!(store.template_bytes_of("other").await.unwrap(), 0);

    // A sandbox of it, then the template deleted: the sandbox stays.
    let (kid, _) = mgr
        .create(
            &a,
            CreateSandboxRequest {
                template: Some("base".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        mgr.run(
            &a,
            GetTemplate {
                template: "base".into()
            }
        )
        .await
        .unwrap()
        .sandboxes,
        1
    );
    mgr.run(
        &a,
        DeleteTemplate {
            template: "base".into(),
        },
    )
    .await
    .unwrap();
    assert_eq!(store.template_bytes_of("acme").await.unwrap(), 0);
    assert!(mgr.get(&a, &kid.id).await.is_ok());

    // Reconcile: a row whose disk vanished is forgotten, a disk without a row removed.
    let t2 = mgr.run(&a, from("two", "src")).await.unwrap().template;
    fake.remove_template_disk(&t2.id).await.unwrap();
    std::fs::create_dir_all(root.path().join("fake/.templates/tp-orphan")).unwrap();
    mgr.shutdown().await;
    drop(mgr);
    let (mgr, fake) = open(root.path()).await;
    let e = mgr
        .run(
            &a,
            GetTemplate {
                template: "two".into(),
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(e, CoreError::NotFound(_)), "{e}");
    assert!(fake.template_disks().await.is_empty());

    // A template that does not fit the tenant's disk quota is refused and leaves no disk.
    std::fs::write(
        root.path().join("fake").join(&sb.id).join("disk/blob"),
        vec![7u8; 1 << 20],
    )
    .unwrap();
    let used = store.allocated_disk_of("acme").await.unwrap().max(0) as u64;
    let quota = threadbox_api::Quota {
        disk_bytes: Some(used + 4096),
        ..Default::default()
    };
    mgr.run(
        &Caller::operator(),
        threadbox_api::ops::SetQuota {
            tenant: "acme".into(),
            quota,
        },
    )
    .await
    .unwrap();
    let e = mgr.run(&a, from("big", "src")).await.unwrap_err();
    assert!(matches!(e, CoreError::QuotaExceeded { .. }), "{e}");
    assert!(
        fake.template_disks().await.is_empty(),
        "the refused template's disk is gone"
    );
    assert_eq!(store.template_bytes_of("acme").await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_build_leaves_nothing_even_without_the_delete_scope() {
    let root = tempfile::tempdir().unwrap();
    let (mgr, fake) = open(root.path()).await;
    let writer = Caller::key("acme", "k-w", [Scope::SandboxesRead, Scope::SandboxesWrite]);
    let build = |run: &str| CreateTemplate {
        request: CreateTemplateRequest {
            name: "b".into(),
            run: vec![run.into()],
            ..Default::default()
        },
    };
    let e = mgr.run(&writer, build("exit 3")).await.unwrap_err();
    assert!(matches!(e, CoreError::PreconditionFailed(_)), "{e}");
    assert!(e.to_string().contains("exited with 3"), "{e}");
    assert!(
        mgr.list(&writer, &Default::default(), None)
            .await
            .unwrap()
            .is_empty(),
        "the build sandbox is gone"
    );
    assert!(fake.template_disks().await.is_empty());
    let ok = mgr.run(&writer, build("true")).await.unwrap();
    assert_eq!(ok.steps.len(), 1);
    assert!(mgr
        .list(&writer, &Default::default(), None)
        .await
        .unwrap()
        .is_empty());
}
