//! The manager: the one place that owns sandbox state transitions. Every door (REST, MCP,
//! CLI, ...) turns a user's request into one call here.
//!
//! Concurrency: each sandbox has a lifecycle lock. Transitions (create, pause, resume,
//! stop, start, delete) hold it for their whole duration, so they are serialized per
//! sandbox. Operations that run inside a sandbox (exec, files, ...) hold it only while
//! they check the state and take the agent connection, so a long exec never blocks a
//! pause, and a pause never waits for an exec. The lock order is written at the top of
//! [`state`].
//!
//! Where things are: [`state`] (the transition table every lifecycle path asks first),
//! `create` (create, get-or-create, boot, get, list), `lifecycle` (pause, resume, stop,
//! start, delete, and the implicit resume of work on a paused sandbox), `reconcile`
//! (start-up), `reaper` (idle pause, TTL), `exec`, `processes`, `files`, `images`,
//! `governance` (keys, quotas, audit), `pool` (warm pool); `validate` and `convert` hold
//! the pure functions (request checks; store/protocol/API mapping).

mod checkpoint_memory;
mod checkpoints;
mod contexts;
mod contexts_lost;
mod convert;
mod create;
mod exec;
mod files;
mod fork_memory;
mod governance;
mod hibernate_image;
mod image_run;
mod images;
mod lifecycle;
mod net_floor;
mod net_log;
mod network;
mod oci_images;
mod pool;
pub mod previews;
mod processes;
pub mod pty;
mod reaper;
mod reconcile;
mod relay;
mod secrets;
pub mod state;
mod templates;
mod tiers;
pub(crate) mod validate;

pub use contexts::{ExecuteCodeStream, GetExecution};
pub use governance::{parse_time, utc_day, MAX_AUDIT_PAGE};

use crate::agent::{AgentConn, CancelGuard};
use crate::caller::{Caller, Scope, POOL_TENANT};
use crate::driver::{blocking, Driver, Drivers, SandboxSpec};
use crate::error::{CoreError, Result};
use crate::images::HOST_IMAGE;
use crate::store::{now_ms, ImageRow, SandboxRow, State, Store};
use crate::Config;
use base64::Engine;
use bytes_stream::{ByteSink, ByteStream};
use convert::*;
use create::Launch;
use futures::StreamExt;
use governance::{Admit, GovState};
use state::{Op, Step};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use threadbox_api::ops::{self, Operation};
use threadbox_api::*;
use threadbox_proto as proto;
use tokio::sync::mpsc;
use validate::*;

/// Streams of bytes in and out of file operations.
pub mod bytes_stream {
    use futures::stream::BoxStream;
    /// Chunks of a file read from a sandbox.
    pub type ByteStream = BoxStream<'static, Result<Vec<u8>, crate::CoreError>>;
    /// Chunks of a request body written into a sandbox.
    pub type ByteSink = BoxStream<'static, Result<Vec<u8>, String>>;
}

/// Largest chunk moved per agent request for file transfers.
const FILE_CHUNK: u64 = 1024 * 1024;
/// How long to wait for a freshly started agent to answer.
const AGENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest per-call timeout a client may ask for.
const MAX_TIMEOUT_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// Runtime state of one sandbox that is not in the store.
#[derive(Default)]
struct Live {
    lifecycle: Arc<tokio::sync::Mutex<()>>,
    conn: Mutex<Option<Arc<AgentConn>>>,
    inflight: AtomicUsize,
    last_active: AtomicI64,
    last_persisted: AtomicI64,
}

/// Counts an operation in flight so idle pause leaves the sandbox alone meanwhile.
struct Inflight(Arc<Live>);
impl Drop for Inflight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
        self.0.last_active.store(now_ms(), Ordering::SeqCst);
    }
}

pub struct Manager {
    config: Config,
    store: Store,
    drivers: Drivers,
    live: Mutex<HashMap<String, Arc<Live>>>,
    create_lock: tokio::sync::Mutex<()>,
    stop_tx: tokio::sync::watch::Sender<bool>,
    gov: GovState,
    /// Wakes the warm pool's refill task (an adoption, a discarded pooled sandbox).
    pool_wake: Arc<tokio::sync::Notify>,
    /// Creates in flight, which the refill waits out (ADR 0213).
    creating: Arc<pool::Busy>,
    pool_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Egress data planes attached to running sandboxes (issue 13).
    net: network::NetState,
    /// The sealing key and the egress CA of secrets (issue 13, ADR 0068).
    secrets: secrets::SecretState,
    /// Latencies and failure counters for `/metrics` (issue 17).
    metrics: Arc<crate::metrics::CoreMetrics>,
    /// In-sandbox OTLP endpoints being served, by sandbox id (ADR 0091).
    relays: relay::Relays,
    /// Terminal sessions (ADR 0092).
    ptys: Arc<pty::PtySessions>,
}

impl Manager {
    /// The core's counters and latencies, rendered by `/metrics`.
    pub fn metrics(&self) -> &crate::metrics::CoreMetrics {
        &self.metrics
    }

    /// Opens the store under `config.root`, reconciles it with what runs on the host and
    /// starts the background tasks (idle pause, TTL). `drivers` holds the tiers (the
    /// caller builds them: the binary the jail, tests the fake); the first is the default.
    pub async fn open(mut config: Config, drivers: Drivers) -> Result<Arc<Manager>> {
        // The operator's maximum caps the default too (and so the warm pool's disks).
        config.default_disk_bytes = config.default_disk_bytes.min(config.max_disk_bytes);
        std::fs::create_dir_all(&config.root)?;
        std::fs::create_dir_all(config.root.join("sandboxes"))?;
        std::fs::create_dir_all(config.root.join("images"))?;
        {
            use std::os::unix::fs::PermissionsExt;
            // Traversable, not listable: sandbox users reach `images/` through it.
            std::fs::set_permissions(&config.root, std::fs::Permissions::from_mode(0o711))?;
            // Each sandbox's directory is 0700 already; the list of them (the sandbox ids)
            // is nobody else's business either.
            std::fs::set_permissions(
                config.root.join("sandboxes"),
                std::fs::Permissions::from_mode(0o700),
            )?;
        }
        let root = config.root.clone();
        blocking(move || crate::images::ensure_host_image(&root)).await?;
        let store = Store::open(&config.root.join("state.db")).await?;
        let secrets = {
            let (root, extra) = (config.root.clone(), config.egress_upstream_ca.clone());
            blocking(move || secrets::SecretState::open(&root, &extra)).await?
        };
        if store.get_image(HOST_IMAGE).await?.is_none() {
            store
                .insert_image(&ImageRow {
                    name: HOST_IMAGE.into(),
                    kind: "host".into(),
                    path: None,
                    created_at: now_ms(),
                })
                .await?;
        }
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let metrics = Arc::new(crate::metrics::CoreMetrics {
            store: store.timings.clone(),
            ..Default::default()
        });
        let mgr = Arc::new(Manager {
            config,
            store,
            metrics,
            drivers,
            live: Mutex::new(HashMap::new()),
            create_lock: tokio::sync::Mutex::new(()),
            stop_tx,
            gov: GovState::default(),
            pool_wake: Arc::new(tokio::sync::Notify::new()),
            creating: Arc::new(pool::Busy::default()),
            pool_task: Mutex::new(None),
            net: Default::default(),
            secrets,
            relays: Default::default(),
            ptys: Default::default(),
        });
        mgr.reconcile().await?;
        mgr.spawn_meter(mgr.stop_tx.subscribe());
        mgr.spawn_host_addrs(mgr.stop_tx.subscribe());
        mgr.spawn_pool(mgr.stop_tx.subscribe());
        let weak = Arc::downgrade(&mgr);
        let interval = mgr.config.reaper_interval;
        tokio::spawn(async move {
            let mut stop_rx = stop_rx;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = stop_rx.changed() => break,
                }
                let Some(mgr) = weak.upgrade() else { break };
                if let Err(e) = mgr.enforce_idle_and_ttl().await {
                    tracing::warn!("idle/TTL sweep failed: {e}");
                }
            }
        });
        Ok(mgr)
    }

    /// The driver of `row`'s tier.
    fn driver_for(&self, row: &SandboxRow) -> Result<Arc<dyn Driver>> {
        self.drivers.get(&row.tier)
    }

    fn live(&self, id: &str) -> Arc<Live> {
        let mut map = self.live.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(id.to_string()).or_default().clone()
    }

    fn forget(&self, id: &str) {
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    fn take_conn(live: &Live) -> Option<Arc<AgentConn>> {
        live.conn.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn set_conn(live: &Live, conn: Option<Arc<AgentConn>>) {
        *live.conn.lock().unwrap_or_else(|p| p.into_inner()) = conn;
    }

    /// A sandbox of the caller's tenant; another tenant's is `not_found`, like one that
    /// does not exist.
    async fn resolve(&self, caller: &Caller, id_or_name: &str) -> Result<SandboxRow> {
        let row = self
            .store
            .get_sandbox(&caller.tenant, id_or_name)
            .await?
            .ok_or_else(|| CoreError::NotFound(id_or_name.to_string()))?;
        crate::telemetry::record_sandbox(&row);
        Ok(row)
    }

    /// Reads a sandbox again by its id (already resolved for the caller).
    async fn reload(&self, id: &str) -> Result<SandboxRow> {
        match self.store.get_by_id_any(id).await? {
            Some(row) if row.state != State::Deleting => Ok(row),
            _ => Err(CoreError::NotFound(id.to_string())),
        }
    }

    /// Records API activity (for idle pause); persisted at most once a second.
    async fn touch(&self, live: &Live, id: &str) {
        let now = now_ms();
        live.last_active.store(now, Ordering::SeqCst);
        if now - live.last_persisted.load(Ordering::SeqCst) >= 1000 {
            live.last_persisted.store(now, Ordering::SeqCst);
            if let Err(e) = self.store.touch(id, now).await {
                tracing::warn!(sandbox = %id, "could not record activity: {e}");
            }
        }
    }

    /// Stops background tasks, destroys the warm pool and closes the store. Users'
    /// sandboxes keep running.
    pub async fn shutdown(&self) {
        let _ = self.stop_tx.send(true);
        let task = self
            .pool_task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
        // Pooled sandboxes belong to no one: they do not outlive the daemon.
        if let Err(e) = self.drain_pool().await {
            tracing::warn!("warm pool: cannot remove the pool at shutdown: {e}");
        }
        self.store.close().await;
    }

    /// Where the manager keeps its state.
    pub fn root(&self) -> &std::path::Path {
        &self.config.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        assert!(validate_name("thread-42").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a/b").is_err());
        assert!(validate_name("sb-123").is_err());
        assert!(validate_name(&"x".repeat(129)).is_err());
    }

    #[test]
    fn exec_requests_are_validated() {
        let base = ExecRequest {
            shell: Some("true".into()),
            ..Default::default()
        };
        assert!(exec_spec(base.clone(), false).is_ok());
        assert!(exec_spec(
            ExecRequest {
                command: Some(vec!["a".into()]),
                ..base.clone()
            },
            false
        )
        .is_err());
        assert!(exec_spec(
            ExecRequest {
                shell: None,
                ..base.clone()
            },
            false
        )
        .is_err());
        assert!(exec_spec(
            ExecRequest {
                timeout_secs: Some(f64::NAN),
                ..base.clone()
            },
            false
        )
        .is_err());
        assert!(exec_spec(
            ExecRequest {
                timeout_secs: Some(-1.0),
                ..base.clone()
            },
            false
        )
        .is_err());
        assert!(exec_spec(
            ExecRequest {
                max_output_bytes: Some(1 << 40),
                ..base.clone()
            },
            false
        )
        .is_err());
        let mut env = BTreeMap::new();
        env.insert("A=B".to_string(), "x".to_string());
        assert!(exec_spec(
            ExecRequest {
                env,
                ..base.clone()
            },
            false
        )
        .is_err());
        assert!(exec_spec(
            ExecRequest {
                stdin: Some("!!".into()),
                stdin_encoding: Encoding::Base64,
                ..base
            },
            false
        )
        .is_err());
    }

    #[test]
    fn non_utf8_output_is_base64_not_mangled() {
        let r = exec_response(proto::ExecResult {
            stdout: vec![0xff, 0x00],
            stderr: b"ok".to_vec(),
            ..Default::default()
        });
        assert_eq!(r.encoding, Encoding::Base64);
        assert_eq!(
            decode_bytes(&r.stdout, r.encoding).unwrap(),
            vec![0xff, 0x00]
        );
        assert_eq!(decode_bytes(&r.stderr, r.encoding).unwrap(), b"ok");
    }
}
