//! A small daemon inside the test process: the real manager and router over a registry
//! the test builds (the jail as default tier, the fake tier beside it), served on a unix
//! socket the CLI binary talks to. It shows a tier plugs in without touching the manager:
//! the daemon binary never registers the fake.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use threadbox_core::driver::{Driver, Drivers};
use threadbox_core::fake::FakeDriver;
use threadbox_core::{Config, Manager};
use threadbox_jail::{JailConfig, JailDriver};
use threadbox_server::auth::Door;
use threadbox_server::{app, AppState};

pub struct InProcDaemon {
    pub root: tempfile::TempDir,
    pub url: String,
    pub fake: Arc<FakeDriver>,
    rt: Option<tokio::runtime::Runtime>,
    manager: Option<Arc<Manager>>,
}

impl InProcDaemon {
    pub fn start() -> InProcDaemon {
        let root = tempfile::Builder::new()
            .prefix("tb-inproc-")
            .tempdir()
            .expect("tempdir");
        let url = format!("unix://{}/threadbox.sock", root.path().display());
        let fake = Arc::new(FakeDriver::new(
            root.path().join("fake"),
            super::agent_bin(),
        ));
        let mut d = InProcDaemon {
            root,
            url,
            fake,
            rt: None,
            manager: None,
        };
        d.open();
        d
    }

    fn open(&mut self) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let root = self.root.path().to_path_buf();
        let fake: Arc<dyn Driver> = self.fake.clone();
        let manager = rt.block_on(async {
            let jail = JailDriver::new(JailConfig::new(
                root.clone(),
                super::agent_bin(),
                super::threadbox_bin(),
            ))
            .expect("the jail tier");
            let mut drivers = Drivers::new(Arc::new(jail));
            drivers.register(fake).expect("the fake tier");
            Manager::open(Config::new(root.clone()), drivers)
                .await
                .expect("open the manager")
        });
        let sock = root.join("threadbox.sock");
        let _ = std::fs::remove_file(&sock);
        let listener = rt.block_on(async { tokio::net::UnixListener::bind(&sock) });
        let router = app(AppState::new(manager.clone())).layer(axum::Extension(Door::Socket));
        rt.spawn(async move {
            let _ = axum::serve(listener.expect("bind the socket"), router).await;
        });
        self.rt = Some(rt);
        self.manager = Some(manager);
    }

    /// The manager shut down (sandboxes keep running) and a new one opened on the same
    /// root, with a new registry: its reconcile finds what the first left.
    pub fn restart(&mut self) {
        self.close();
        self.open();
    }

    fn close(&mut self) {
        if let (Some(rt), Some(m)) = (self.rt.take(), self.manager.take()) {
            rt.block_on(m.shutdown());
            rt.shutdown_background();
        }
    }

    pub fn tb(&self, args: &[&str]) -> Output {
        Command::new(super::threadbox_bin())
            .args(args)
            .env("THREADBOX_URL", &self.url)
            .output()
            .expect("run cli")
    }

    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.tb(args);
        assert!(
            out.status.success(),
            "threadbox {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }
}

impl Drop for InProcDaemon {
    fn drop(&mut self) {
        if let Ok(v) =
            serde_json::from_slice::<serde_json::Value>(&self.tb(&["ls", "--json"]).stdout)
        {
            for sb in v["sandboxes"].as_array().cloned().unwrap_or_default() {
                if let Some(id) = sb["id"].as_str() {
                    let _ = self.tb(&["rm", "--force", id]);
                }
            }
        }
        self.close();
    }
}
