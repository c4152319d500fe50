//! The router over a real [`Manager`] for this crate's tests: the manager runs over the
//! fake tier (ADR 0053) in a temporary root, so routing, rejections, limits and refusals
//! are the daemon's own, with the manager's validation and messages (ADR 0057).
//!
//! Nothing here boots a sandbox unless a test asks for one: the agent binary is looked up
//! (`fake::agent_binary`) and, when it has not been built, a path that fails at launch is
//! used instead, which the HTTP-layer tests never reach.

use crate::auth::Door;
use axum::Router;
use std::path::PathBuf;
use std::sync::Arc;
use threadbox_core::driver::{Driver, Drivers};
use threadbox_core::fake::{self, FakeDriver};
use threadbox_core::{Config, Manager};

/// A router and what it runs over; the root is removed when this is dropped.
pub(crate) struct TestApp {
    pub(crate) manager: Arc<Manager>,
    pub(crate) router: Router,
    _root: tempfile::TempDir,
}

impl TestApp {
    /// The daemon's application behind `door`, uploads bounded to `max_upload_bytes`.
    pub(crate) async fn open(max_upload_bytes: u64, door: Door) -> TestApp {
        let root = tempfile::tempdir().expect("a temporary root");
        let manager = open_manager(root.path().to_path_buf()).await;
        let router = crate::routes::app_for_tests(manager.clone(), max_upload_bytes, door);
        TestApp {
            manager,
            router,
            _root: root,
        }
    }

    /// As if through the operator's socket: tests about the HTTP layer, not keys.
    pub(crate) async fn socket(max_upload_bytes: u64) -> TestApp {
        TestApp::open(max_upload_bytes, Door::Socket).await
    }

    /// Through a TCP door that requires API keys.
    pub(crate) async fn tcp() -> TestApp {
        TestApp::open(1024, Door::Tcp).await
    }
}

/// A manager over the fake tier, registered under the name `jail` (the default tier's
/// name, which sandbox infos and the OpenAPI examples carry).
pub(crate) async fn open_manager(root: PathBuf) -> Arc<Manager> {
    let agent =
        fake::agent_binary().unwrap_or_else(|_| PathBuf::from("/threadbox-agent-not-built"));
    let driver: Arc<dyn Driver> =
        Arc::new(FakeDriver::new(root.join("fake"), agent).with_tier("jail"));
    let mut config = Config::new(root);
    config.default_disk_bytes = 16 << 20;
    Manager::open(config, Drivers::new(driver))
        .await
        .expect("open the manager over the fake tier")
}
