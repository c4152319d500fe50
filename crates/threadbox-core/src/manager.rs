//! The manager: the one place that owns sandbox state transitions. Every door (REST, MCP,
//! CLI, ...) turns a user's request into one call here.
//!
//! Concurrency: each sandbox has a lifecycle lock. Transitions (create, pause, resume,
//! stop, start, delete) hold it for their whole duration, so they are serialized per
//! sandbox. Operations that run inside a sandbox (exec, files, ...) hold it only while
//! they check the state and take the agent connection, so a long exec never blocks a
//! pause, and a pause never waits for an exec.

mod governance;
mod pool;
pub mod state;

pub use governance::{parse_time, utc_day, MAX_AUDIT_PAGE};

use crate::agent::{AgentConn, CancelGuard};
use crate::caller::{Caller, Scope, POOL_TENANT};
use crate::driver::{Driver, Drivers, JailDriver, LaunchRequest};
use crate::error::{CoreError, Result};
use crate::images::{self, ImageSpec, HOST_IMAGE};
use crate::store::{now_ms, ImageRow, SandboxRow, State, Store};
use crate::{uid_range, Config};
use base64::Engine;
use bytes_stream::{ByteSink, ByteStream};
use futures::StreamExt;
use governance::{Admit, GovState};
use state::{Op, Step};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use threadbox_api::*;
use threadbox_proto as proto;
use tokio::sync::mpsc;

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
/// The states of a sandbox whose agent may be alive.
const LIVE: &[State] = &[State::Running, State::Paused];
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
    pool_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn rfc3339(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The API view of a sandbox as `caller` may see it: the agent's host PID only for the
/// operator and admin keys (a tenant has no use for it, and a host PID sequence tells of
/// other tenants' activity).
fn to_api(config: &Config, caller: &Caller, row: &SandboxRow) -> Sandbox {
    let mut sb = to_api_full(config, row);
    if !caller.has(Scope::Admin) {
        sb.agent_pid = None;
    }
    sb
}

fn to_api_full(config: &Config, row: &SandboxRow) -> Sandbox {
    Sandbox {
        id: row.id.clone(),
        name: row.name.clone(),
        state: match row.state {
            State::Creating | State::Deleting => SandboxState::Creating,
            State::Running => SandboxState::Running,
            State::Paused => SandboxState::Paused,
            State::Stopped => SandboxState::Stopped,
        },
        labels: row.labels.clone(),
        image: row.image.clone(),
        created_at: rfc3339(row.created_at),
        last_active_at: rfc3339(row.last_active_at),
        limits: Limits {
            memory_bytes: row.memory_bytes,
            cpus: row.cpus,
            pids: row.pids,
            disk_bytes: row.disk_bytes,
        },
        idle_pause_secs: row.idle_pause_secs,
        ttl_secs: row.ttl_secs,
        ttl_action: row.ttl_action,
        agent_pid: match row.state {
            State::Running | State::Paused => row.agent_pid,
            _ => None,
        },
        isolation_warnings: config.isolation_warnings(),
        tier: row.tier.clone(),
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CoreError::Internal(format!("blocking task failed: {e}")))?
}

fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.')
        && !name.starts_with("sb-");
    if ok {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "sandbox name {name:?} must be 1-128 characters of a-z, A-Z, 0-9, '-', '_', '.', \
             not start with '.' or 'sb-'"
        )))
    }
}

fn validate_labels(labels: &BTreeMap<String, String>) -> Result<()> {
    if labels.len() > 64 {
        return Err(CoreError::InvalidArgument("at most 64 labels".into()));
    }
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= 128
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        if !key_ok {
            return Err(CoreError::InvalidArgument(format!(
                "label key {k:?} must be 1-128 characters of a-z, A-Z, 0-9, '-', '_', '.', '/'"
            )));
        }
        if v.len() > 1024 || v.contains('\0') {
            return Err(CoreError::InvalidArgument(format!(
                "label value of {k:?} is too long or has a NUL"
            )));
        }
    }
    Ok(())
}

fn no_nul(what: &str, s: &str) -> Result<()> {
    if s.contains('\0') {
        return Err(CoreError::InvalidArgument(format!(
            "{what} must not contain NUL bytes"
        )));
    }
    Ok(())
}

fn validate_path(path: &str) -> Result<()> {
    if path.is_empty() {
        return Err(CoreError::InvalidArgument("path must not be empty".into()));
    }
    if path.len() > 4096 {
        return Err(CoreError::InvalidArgument(
            "path is longer than 4096 bytes".into(),
        ));
    }
    no_nul("path", path)
}

fn run_as(u: User) -> proto::RunAs {
    match u {
        User::User => proto::RunAs::User,
        User::Root => proto::RunAs::Root,
    }
}

fn command_of(command: Option<Vec<String>>, shell: Option<String>) -> Result<proto::Command> {
    match (command, shell) {
        (Some(argv), None) => {
            if argv.is_empty() || argv[0].is_empty() {
                return Err(CoreError::InvalidArgument(
                    "command must not be empty".into(),
                ));
            }
            for a in &argv {
                no_nul("command arguments", a)?;
            }
            Ok(proto::Command::Argv(argv))
        }
        (None, Some(sh)) => {
            no_nul("shell", &sh)?;
            Ok(proto::Command::Shell(sh))
        }
        (Some(_), Some(_)) => Err(CoreError::InvalidArgument(
            "give either command or shell, not both".into(),
        )),
        (None, None) => Err(CoreError::InvalidArgument(
            "one of command or shell is required".into(),
        )),
    }
}

fn validate_env(env: &BTreeMap<String, String>) -> Result<()> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(CoreError::InvalidArgument(format!(
                "environment variable {k:?} is invalid (empty, or contains '=' or NUL)"
            )));
        }
    }
    Ok(())
}

fn exec_spec(req: ExecRequest, stream: bool) -> Result<proto::ExecSpec> {
    let command = command_of(req.command, req.shell)?;
    validate_env(&req.env)?;
    if let Some(cwd) = &req.cwd {
        validate_path(cwd)?;
    }
    let stdin = match req.stdin {
        Some(s) => Some(decode_bytes(&s, req.stdin_encoding).map_err(CoreError::InvalidArgument)?),
        None => None,
    };
    if stdin.as_ref().map(|s| s.len()).unwrap_or(0) > 16 * 1024 * 1024 {
        return Err(CoreError::TooLarge("stdin is larger than 16 MiB".into()));
    }
    let timeout_ms = match req.timeout_secs {
        Some(t) if !(t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT_SECS) => {
            return Err(CoreError::InvalidArgument(format!(
                "timeout_secs must be a number > 0 and <= {MAX_TIMEOUT_SECS}"
            )))
        }
        Some(t) => Some(((t * 1000.0).ceil() as u64).max(1)),
        None => None,
    };
    let max_output = req.max_output_bytes.unwrap_or(proto::DEFAULT_MAX_OUTPUT);
    if max_output > proto::MAX_OUTPUT_LIMIT {
        return Err(CoreError::InvalidArgument(format!(
            "max_output_bytes must be <= {}",
            proto::MAX_OUTPUT_LIMIT
        )));
    }
    Ok(proto::ExecSpec {
        command,
        env: req.env,
        cwd: req.cwd,
        user: run_as(req.user),
        stdin,
        timeout_ms,
        max_output,
        stream,
    })
}

/// The memory limit when the call that ended this way was ended by the OOM killer:
/// the sandbox's `oom_kill` counter went up during the call and the process died of
/// SIGKILL (directly, or as a shell reports it, 137). The counter is per sandbox, so
/// another call of the same sandbox killed at that moment is named as well.
fn oom_verdict(
    driver: &dyn Driver,
    row: &SandboxRow,
    before: Option<u64>,
    exit_code: Option<i32>,
    signal: Option<i32>,
) -> Option<u64> {
    let killed = signal == Some(9) || (signal.is_none() && exit_code == Some(137));
    if !killed {
        return None;
    }
    let after = driver.oom_kills(&row.id).ok()?;
    (after > before?).then_some(row.memory_bytes)
}

fn exec_response(r: proto::ExecResult) -> ExecResponse {
    let both_utf8 =
        std::str::from_utf8(&r.stdout).is_ok() && std::str::from_utf8(&r.stderr).is_ok();
    // Positive control of the byte-exact output case (test builds only).
    #[cfg(feature = "insecure-test-hooks")]
    let both_utf8 = both_utf8
        || threadbox_sys::testhooks::Weaken::from_env().is_ok_and(|w| w.has("lossy-output"));
    let enc = |b: &[u8]| {
        if both_utf8 {
            String::from_utf8_lossy(b).into_owned()
        } else {
            base64::engine::general_purpose::STANDARD.encode(b)
        }
    };
    ExecResponse {
        exit_code: r.exit_code,
        signal: r.signal,
        stdout: enc(&r.stdout),
        stderr: enc(&r.stderr),
        encoding: if both_utf8 {
            Encoding::Utf8
        } else {
            Encoding::Base64
        },
        timed_out: r.timed_out,
        truncated: r.stdout_truncated || r.stderr_truncated,
        stdout_truncated: r.stdout_truncated,
        stderr_truncated: r.stderr_truncated,
        duration_ms: r.duration_ms,
        oom_killed: false,
        memory_limit_bytes: None,
    }
}

/// Maps an agent error to the API's error codes.
fn agent_error(kind: proto::ErrorKind, message: String) -> CoreError {
    use proto::ErrorKind as K;
    match kind {
        K::NotFound => CoreError::NotFoundOther(message),
        K::PermissionDenied => CoreError::PermissionDenied(message),
        K::InvalidArgument | K::NotADirectory | K::IsADirectory => {
            CoreError::InvalidArgument(message)
        }
        K::AlreadyExists => CoreError::Conflict(message),
        K::NoSpace => CoreError::TooLarge(message),
        K::Cancelled => CoreError::Unavailable(message),
        K::Internal => CoreError::Internal(message),
    }
}

fn unexpected(r: proto::Response) -> CoreError {
    match r {
        proto::Response::Error { kind, message } => agent_error(kind, message),
        other => CoreError::Internal(format!("unexpected agent response {other:?}")),
    }
}

fn file_entry(f: proto::FileInfo) -> FileEntry {
    FileEntry {
        name: f.name,
        path: f.path,
        kind: match f.kind {
            proto::FileKind::File => FileKind::File,
            proto::FileKind::Dir => FileKind::Dir,
            proto::FileKind::Symlink => FileKind::Symlink,
            proto::FileKind::Other => FileKind::Other,
        },
        size: f.size,
        mode: f.mode,
        uid: f.uid,
        gid: f.gid,
        modified_at: rfc3339(f.mtime.saturating_mul(1000)),
        symlink_target: f.symlink_target,
    }
}

fn command_vec(c: &proto::Command) -> Vec<String> {
    match c {
        proto::Command::Argv(a) => a.clone(),
        proto::Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
    }
}

impl Manager {
    /// Opens the store under `config.root`, reconciles it with what runs on the host and
    /// starts the background tasks (idle pause, TTL).
    pub async fn open(mut config: Config) -> Result<Arc<Manager>> {
        // The operator's maximum caps the default too (and so the warm pool's disks).
        config.default_disk_bytes = config.default_disk_bytes.min(config.max_disk_bytes);
        if !config.agent_path.is_file() {
            return Err(CoreError::InvalidArgument(format!(
                "agent binary {} not found (build it with `cargo build --workspace`)",
                config.agent_path.display()
            )));
        }
        std::fs::create_dir_all(&config.root)?;
        // Before the store exists: a root without a range and without a database is new.
        let (root, registry) = (config.root.clone(), config.uid_registry.clone());
        config.uid_range = blocking(move || uid_range::claim(&root, &registry)).await?;
        tracing::info!(
            range = config.uid_range.index,
            first_uid = config.uid_range.base(),
            "host uid range"
        );
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
        blocking(move || images::ensure_host_image(&root)).await?;
        let store = Store::open(&config.root.join("state.db")).await?;
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
        let drivers = Drivers::new(Arc::new(JailDriver::new(config.clone())?))?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mgr = Arc::new(Manager {
            config,
            store,
            drivers,
            live: Mutex::new(HashMap::new()),
            create_lock: tokio::sync::Mutex::new(()),
            stop_tx,
            gov: GovState::default(),
            pool_wake: Arc::new(tokio::sync::Notify::new()),
            pool_task: Mutex::new(None),
        });
        mgr.reconcile().await?;
        mgr.spawn_meter(mgr.stop_tx.subscribe());
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

    /// Brings the store in line with the host after a (re)start: agents that answer are
    /// re-adopted, dead ones are marked stopped with their disk kept, half-done creates
    /// and deletes are finished.
    async fn reconcile(&self) -> Result<()> {
        // Pooled sandboxes left by a crash are not trusted: destroyed, the pool refills.
        self.drain_pool().await?;
        for row in self.store.all_sandboxes().await? {
            let id = row.id.clone();
            let driver = self.driver_for(&row)?;
            match row.state {
                State::Deleting => {
                    let d = driver.clone();
                    let i = id.clone();
                    blocking(move || d.destroy(&i)).await?;
                    self.store.delete_sandbox(&id).await?;
                    tracing::info!(sandbox = %id, "finished an interrupted delete");
                }
                State::Creating => {
                    let d = driver.clone();
                    let i = id.clone();
                    blocking(move || d.stop(&i)).await?;
                    if driver.has_disk(&id) {
                        self.store
                            .transition(&id, &[State::Creating], State::Stopped, None)
                            .await?;
                    } else {
                        // Killed before its disk existed: whatever the create had made on
                        // the host (its directory, mount points) goes with the row.
                        let d = driver.clone();
                        let i = id.clone();
                        blocking(move || d.destroy(&i)).await?;
                        self.store.delete_sandbox(&id).await?;
                    }
                    tracing::info!(sandbox = %id, "cleaned up an interrupted create");
                }
                State::Running | State::Paused => {
                    let d = driver.clone();
                    let i = id.clone();
                    let frozen = blocking(move || d.is_frozen(&i)).await.unwrap_or(false);
                    if frozen {
                        self.store
                            .transition(&id, LIVE, State::Paused, row.agent_pid)
                            .await?;
                        tracing::info!(sandbox = %id, "re-adopted (paused)");
                        continue;
                    }
                    match AgentConn::connect(&driver.socket_path(&id), Duration::from_secs(3)).await
                    {
                        Ok(conn) => {
                            Self::set_conn(&self.live(&id), Some(conn));
                            self.store
                                .transition(&id, LIVE, State::Running, row.agent_pid)
                                .await?;
                            tracing::info!(sandbox = %id, "re-adopted (running)");
                        }
                        Err(e)
                            if row
                                .agent_pid
                                .is_some_and(|pid| driver.agent_alive(&id, pid)) =>
                        {
                            // Alive but slow to answer (a loaded host, a stopped agent):
                            // never kill the user's processes because the daemon is in a
                            // hurry (F6). The next call connects again.
                            self.store
                                .transition(&id, LIVE, State::Running, row.agent_pid)
                                .await?;
                            tracing::warn!(sandbox = %id, "re-adopted, but its agent does not answer yet ({e}); the next call retries");
                        }
                        Err(e) => {
                            let d = driver.clone();
                            let i = id.clone();
                            blocking(move || d.stop(&i)).await?;
                            self.store
                                .transition(&id, LIVE, State::Stopped, None)
                                .await?;
                            tracing::warn!(sandbox = %id, "agent gone ({e}); marked stopped, disk kept");
                        }
                    }
                }
                State::Stopped => {}
            }
        }
        Ok(())
    }

    async fn enforce_idle_and_ttl(&self) -> Result<()> {
        let now = now_ms();
        for row in self.store.all_sandboxes().await? {
            if row.tenant == POOL_TENANT {
                continue;
            }
            if let Some(ttl) = row.ttl_secs {
                if now - row.created_at >= (ttl as i64) * 1000 {
                    let system = Caller::system(&row.tenant);
                    let res = match row.ttl_action {
                        TtlAction::Delete => self.delete(&system, &row.id, true).await,
                        TtlAction::Stop if row.state != State::Stopped => {
                            self.stop(&system, &row.id).await.map(|_| ())
                        }
                        TtlAction::Stop => Ok(()),
                    };
                    match res {
                        Ok(()) => tracing::debug!(sandbox = %row.id, "TTL reached"),
                        Err(e) => tracing::warn!(sandbox = %row.id, "TTL action failed: {e}"),
                    }
                    continue;
                }
            }
            if let (State::Running, Some(idle)) = (row.state, row.idle_pause_secs) {
                let live = self.live(&row.id);
                let last = live
                    .last_active
                    .load(Ordering::SeqCst)
                    .max(row.last_active_at);
                // A cheap look first; `idle_pause` decides again under the lock.
                if live.inflight.load(Ordering::SeqCst) == 0 && now - last >= (idle as i64) * 1000 {
                    match self.idle_pause(&row, (idle as i64) * 1000).await {
                        Ok(true) => tracing::info!(sandbox = %row.id, "paused after {idle}s idle"),
                        Ok(false) => {}
                        Err(e) => tracing::warn!(sandbox = %row.id, "idle pause failed: {e}"),
                    }
                }
            }
        }
        Ok(())
    }

    /// A sandbox of the caller's tenant; another tenant's is `not_found`, like one that
    /// does not exist.
    async fn resolve(&self, caller: &Caller, id_or_name: &str) -> Result<SandboxRow> {
        self.store
            .get_sandbox(&caller.tenant, id_or_name)
            .await?
            .ok_or_else(|| CoreError::NotFound(id_or_name.to_string()))
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

    async fn image_spec(&self, name: &str) -> Result<ImageSpec> {
        let img =
            self.store.get_image(name).await?.ok_or_else(|| {
                CoreError::InvalidArgument(format!("image {name:?} does not exist"))
            })?;
        Ok(match img.kind.as_str() {
            "host" => images::host_image_spec(&self.config.root),
            _ => ImageSpec {
                lower: vec![img.path.clone().unwrap_or_default().into()],
                binds: vec![],
            },
        })
    }

    /// Starts the agent of `row` and connects to it. Caller holds the lifecycle lock.
    async fn boot(&self, row: &SandboxRow, live: &Live) -> Result<i32> {
        let image = self.image_spec(&row.image).await?;
        let driver = self.driver_for(row)?;
        let id = row.id.clone();
        let hostname = row.name.clone().unwrap_or_else(|| row.id.clone());
        let slot = row.slot;
        let limits = threadbox_sys::cgroup::Limits {
            memory_bytes: row.memory_bytes,
            cpus: row.cpus,
            pids: row.pids,
        };
        let pid = blocking(move || {
            driver.launch(&LaunchRequest {
                id: &id,
                hostname: &hostname,
                slot,
                image: &image,
                limits,
            })
        })
        .await?;
        match AgentConn::connect(
            &self.driver_for(row)?.socket_path(&row.id),
            AGENT_CONNECT_TIMEOUT,
        )
        .await
        {
            Ok(conn) => {
                Self::set_conn(live, Some(conn));
                Ok(pid)
            }
            Err(e) => {
                let d = self.driver_for(row)?;
                let i = row.id.clone();
                let _ = blocking(move || d.stop(&i)).await;
                Err(e)
            }
        }
    }

    /// Creates a sandbox, or returns the existing one of that name (`created == false`).
    pub async fn create(
        &self,
        caller: &Caller,
        req: CreateSandboxRequest,
    ) -> Result<(Sandbox, bool)> {
        let name = req.name.clone().unwrap_or_else(|| "-".to_string());
        // `None`: the sandbox of that name this create waited for was itself being
        // created and failed (and is gone): try again rather than answer `not_found` (F4).
        // Bounded: every round waits for one whole failed create of that name.
        let mut r = Ok(None);
        for _ in 0..8 {
            r = self.create_inner(caller, req.clone()).await;
            if !matches!(r, Ok(None)) {
                break;
            }
        }
        let r = r.and_then(|o| {
            o.ok_or_else(|| {
                CoreError::Unavailable(format!(
                    "sandbox {name} kept failing to be created by concurrent requests"
                ))
            })
        });
        let target = match &r {
            Ok((sb, _)) => sb.id.clone(),
            Err(_) => name,
        };
        self.audit(caller, "sandbox.create", &target, &r).await;
        r
    }

    async fn create_inner(
        &self,
        caller: &Caller,
        req: CreateSandboxRequest,
    ) -> Result<Option<(Sandbox, bool)>> {
        caller.require(Scope::SandboxesWrite)?;
        if let Some(name) = &req.name {
            validate_name(name)?;
        }
        validate_labels(&req.labels)?;
        let memory_bytes = req
            .limits
            .memory_bytes
            .unwrap_or(self.config.default_memory_bytes);
        if !(16 << 20..=1 << 40).contains(&memory_bytes) {
            return Err(CoreError::InvalidArgument(
                "memory_bytes must be between 16 MiB and 1 TiB".into(),
            ));
        }
        let cpus = req.limits.cpus.unwrap_or(self.config.default_cpus);
        if !(cpus.is_finite() && (0.01..=1024.0).contains(&cpus)) {
            return Err(CoreError::InvalidArgument(
                "cpus must be between 0.01 and 1024".into(),
            ));
        }
        let tier = req
            .tier
            .clone()
            .unwrap_or_else(|| crate::driver::DEFAULT_TIER.to_string());
        self.drivers.get(&tier)?;
        let pids = req.limits.pids.unwrap_or(self.config.default_pids);
        if !(8..=1 << 22).contains(&pids) {
            return Err(CoreError::InvalidArgument(
                "pids must be between 8 and 4194304".into(),
            ));
        }
        let max_disk = self
            .config
            .max_disk_bytes
            .clamp(crate::MIN_DISK_BYTES, crate::MAX_DISK_BYTES);
        let requested_disk = req.limits.disk_bytes;
        if let Some(d) = requested_disk {
            if !(crate::MIN_DISK_BYTES..=crate::MAX_DISK_BYTES).contains(&d) {
                return Err(CoreError::InvalidArgument(
                    "disk_bytes must be between 16 MiB and 16 TiB".into(),
                ));
            }
            if d > max_disk {
                return Err(CoreError::InvalidArgument(format!(
                    "disk_bytes {d} is more than this daemon allows for one sandbox \
                     ({max_disk} bytes, set by the operator with --max-disk-bytes)"
                )));
            }
        }
        let default_disk = self.config.default_disk_bytes.min(max_disk);
        // Final once the tenant's disk quota is known (admit_disk, below).
        let disk_bytes = requested_disk.unwrap_or(default_disk);
        for (what, v) in [
            ("idle_pause_secs", req.idle_pause_secs),
            ("ttl_secs", req.ttl_secs),
        ] {
            if let Some(v) = v {
                if v == 0 || v > 10 * 365 * 24 * 3600 {
                    return Err(CoreError::InvalidArgument(format!(
                        "{what} must be between 1 and 315360000"
                    )));
                }
            }
        }
        let image = req.image.clone().unwrap_or_else(|| HOST_IMAGE.to_string());
        if self.store.get_image(&image).await?.is_none() {
            return Err(CoreError::InvalidArgument(format!(
                "image {image:?} does not exist"
            )));
        }

        let created = now_ms();
        let id = format!("sb-{}", uuid::Uuid::new_v4().simple());
        let mut row = SandboxRow {
            id: id.clone(),
            tenant: caller.tenant.clone(),
            name: req.name.clone(),
            state: State::Creating,
            labels: req.labels,
            image,
            memory_bytes,
            cpus,
            pids,
            disk_bytes,
            idle_pause_secs: req.idle_pause_secs,
            ttl_secs: req.ttl_secs,
            ttl_action: req.ttl_action,
            slot: 0,
            agent_pid: None,
            created_at: created,
            last_active_at: created,
            tier: tier.to_string(),
        };
        let live = self.live(&id);
        // Held across the insert so two creates of one name cannot both insert; the new
        // sandbox's lifecycle lock is taken before the name is visible, so a concurrent
        // get-or-create of the same name waits until it is running.
        let guard = {
            let _c = self.create_lock.lock().await;
            if let Some(name) = &req.name {
                if let Some(existing) = self.store.get_sandbox(&caller.tenant, name).await? {
                    drop(_c);
                    self.forget(&id);
                    let l = self.live(&existing.id);
                    let _g = l.lifecycle.lock().await;
                    return match self.reload(&existing.id).await {
                        Ok(row) => Ok(Some((to_api(&self.config, caller, &row), false))),
                        Err(CoreError::NotFound(_)) => Ok(None),
                        Err(e) => Err(e),
                    };
                }
            }
            // Checked and inserted under the admission lock, so two creates cannot both
            // take the last place of a quota; refused before anything exists.
            let _adm = self.gov.admission.lock().await;
            let admitted = match self
                .admit(&caller.tenant, Admit::Create { memory_bytes, cpus })
                .await
            {
                Ok(()) => {
                    self.admit_disk(&caller.tenant, requested_disk, default_disk)
                        .await
                }
                Err(e) => Err(e),
            };
            match admitted {
                Ok(disk) => row.disk_bytes = disk,
                Err(e) => {
                    self.forget(&id);
                    return Err(e);
                }
            }
            // Fast path: a pre-booted sandbox of the warm pool, adopted in one UPDATE.
            match self.adopt_from_pool(&row).await {
                Ok(Some(adopted)) => {
                    self.forget(&id);
                    let row = self.reload(&adopted).await?;
                    tracing::info!(sandbox = %adopted, name = ?row.name, "created from the warm pool");
                    return Ok(Some((to_api(&self.config, caller, &row), true)));
                }
                Ok(None) => {}
                Err(e) => {
                    self.forget(&id);
                    return Err(e);
                }
            }
            let g = live.lifecycle.lock().await;
            row.slot = self.store.insert_sandbox(&row).await?;
            g
        };
        let result: Result<i32> = async {
            let d = self.driver_for(&row)?;
            let (i, slot, disk) = (id.clone(), row.slot, row.disk_bytes);
            blocking(move || d.prepare(&i, slot, disk)).await?;
            self.boot(&row, &live).await
        }
        .await;
        match result {
            Ok(pid) => {
                self.store
                    .transition(&id, &[State::Creating], State::Running, Some(pid))
                    .await?;
                drop(guard);
                let row = self.reload(&id).await?;
                tracing::info!(sandbox = %id, name = ?row.name, agent_pid = pid, "created");
                Ok(Some((to_api(&self.config, caller, &row), true)))
            }
            Err(e) => {
                // Nothing half-created: remove what exists, then the row.
                let d = self.driver_for(&row)?;
                let i = id.clone();
                let _ = blocking(move || d.destroy(&i)).await;
                let _ = self.store.delete_sandbox(&id).await;
                drop(guard);
                self.forget(&id);
                tracing::error!(sandbox = %id, "create failed: {e}");
                Err(e)
            }
        }
    }

    pub async fn get(&self, caller: &Caller, id_or_name: &str) -> Result<Sandbox> {
        caller.require(Scope::SandboxesRead)?;
        Ok(to_api(
            &self.config,
            caller,
            &self.resolve(caller, id_or_name).await?,
        ))
    }

    /// The caller's tenant's sandboxes.
    pub async fn list(
        &self,
        caller: &Caller,
        labels: &BTreeMap<String, String>,
        state: Option<SandboxState>,
    ) -> Result<Vec<Sandbox>> {
        caller.require(Scope::SandboxesRead)?;
        let rows = self.store.all_sandboxes().await?;
        Ok(rows
            .iter()
            .filter(|r| r.state != State::Deleting && r.tenant == caller.tenant)
            .map(|r| to_api(&self.config, caller, r))
            .filter(|s| state.is_none_or(|st| s.state == st))
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .collect())
    }

    /// Carries out `op` on `row` (read under its lifecycle lock, which the caller holds):
    /// the one place that plans a lifecycle step (`state::plan`), runs it on the driver and
    /// records it with a guarded transition.
    async fn apply(&self, row: &SandboxRow, live: &Live, op: Op) -> Result<Step> {
        let step = state::plan(&row.id, row.state, op)?;
        let (from, to) = step.transition();
        match step {
            Step::Keep => {}
            Step::Freeze => {
                self.meter(row, false).await;
                let d = self.driver_for(row)?;
                let i = row.id.clone();
                if let Err(e) = blocking(move || d.freeze(&i)).await {
                    // A freeze that timed out leaves cgroup.freeze set: the sandbox would
                    // end up frozen while recorded as running (F2). Undo it.
                    let d = self.driver_for(row)?;
                    let i = row.id.clone();
                    if let Err(t) = blocking(move || d.thaw(&i)).await {
                        tracing::error!(sandbox = %row.id, "could not undo a failed freeze: {t}");
                    }
                    return Err(e);
                }
                self.store
                    .transition(&row.id, from, State::Paused, row.agent_pid)
                    .await?;
            }
            Step::Thaw => {
                let _adm = self.gov.admission.lock().await;
                self.admit(&row.tenant, Admit::Run).await?;
                self.meter(row, false).await;
                let d = self.driver_for(row)?;
                let i = row.id.clone();
                blocking(move || d.thaw(&i)).await?;
                self.store
                    .transition(&row.id, from, State::Running, row.agent_pid)
                    .await?;
            }
            Step::Boot => {
                // The place is reserved under the admission lock (`creating` counts as
                // running for quotas) and the boot runs without it: one slow boot must
                // not hold every tenant's creates and starts (F7).
                {
                    let _adm = self.gov.admission.lock().await;
                    self.admit(&row.tenant, Admit::Run).await?;
                    self.store
                        .transition(&row.id, from, State::Creating, None)
                        .await?;
                }
                match self.boot(row, live).await {
                    Ok(pid) => {
                        self.store
                            .transition(&row.id, &[State::Creating], State::Running, Some(pid))
                            .await?;
                        tracing::info!(sandbox = %row.id, agent_pid = pid, "started");
                    }
                    Err(e) => {
                        self.store
                            .transition(&row.id, &[State::Creating], State::Stopped, None)
                            .await?;
                        return Err(e);
                    }
                }
            }
            Step::Halt => {
                self.meter(row, false).await;
                Self::take_conn(live);
                let d = self.driver_for(row)?;
                let i = row.id.clone();
                blocking(move || d.stop(&i)).await?;
                self.store
                    .transition(&row.id, from, State::Stopped, None)
                    .await?;
                // Restarts the CPU baseline (the next boot has a new cgroup) and samples the disk.
                self.meter(&self.reload(&row.id).await?, true).await;
                tracing::info!(sandbox = %row.id, "stopped");
            }
            Step::Destroy => {
                self.meter(row, false).await;
                // Recorded first, so a crash mid-delete is finished by the next start.
                self.store
                    .transition(&row.id, from, State::Deleting, None)
                    .await?;
                Self::take_conn(live);
                let d = self.driver_for(row)?;
                let i = row.id.clone();
                if let Err(e) = blocking(move || d.destroy(&i)).await {
                    // Its processes are gone (destroy stops first) but something of it is
                    // left: visible again as stopped, so the delete can be retried (F3).
                    if let Err(t) = self
                        .store
                        .transition(&row.id, &[State::Deleting], State::Stopped, None)
                        .await
                    {
                        tracing::error!(sandbox = %row.id, "after a failed delete: {t}");
                    }
                    return Err(e);
                }
                self.store.delete_sandbox(&row.id).await?;
                self.store.mark_usage_deleted(&row.id, now_ms()).await?;
                self.forget(&row.id);
                tracing::info!(sandbox = %row.id, "deleted");
            }
        }
        debug_assert!(step == Step::Keep || to.is_some());
        Ok(step)
    }

    /// Locks `id_or_name`'s lifecycle, reads it again, and applies `op`; the row after.
    async fn lifecycle(
        &self,
        caller: &Caller,
        id_or_name: &str,
        op: Op,
    ) -> Result<(SandboxRow, Arc<Live>)> {
        let row = self.resolve(caller, id_or_name).await?;
        let live = self.live(&row.id);
        let g = live.lifecycle.clone().lock_owned().await;
        let row = self.reload(&row.id).await?;
        self.apply(&row, &live, op).await?;
        drop(g);
        Ok((row, live))
    }

    pub async fn pause(&self, caller: &Caller, id_or_name: &str) -> Result<Sandbox> {
        self.pause_for(caller, id_or_name, Op::Pause).await
    }

    /// A pause for a reason (`Op::Pause`, `Op::CapPause`), audited as `sandbox.pause`.
    async fn pause_for(&self, caller: &Caller, id_or_name: &str, op: Op) -> Result<Sandbox> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;
            let (row, _) = self.lifecycle(caller, id_or_name, op).await?;
            Ok(to_api(&self.config, caller, &self.reload(&row.id).await?))
        }
        .await;
        self.audit(caller, "sandbox.pause", id_or_name, &r).await;
        r
    }

    /// The idle sweeper's pause: decided under the lifecycle lock, where calls register
    /// as in flight, so it never freezes a sandbox in the middle of a call (F1).
    async fn idle_pause(&self, row: &SandboxRow, idle_ms: i64) -> Result<bool> {
        let live = self.live(&row.id);
        let _g = live.lifecycle.lock().await;
        let row = self.reload(&row.id).await?;
        let last = live
            .last_active
            .load(Ordering::SeqCst)
            .max(row.last_active_at);
        let inflight = live.inflight.load(Ordering::SeqCst);
        if now_ms() - last < idle_ms {
            return Ok(false);
        }
        Ok(self.apply(&row, &live, Op::IdlePause { inflight }).await? == Step::Freeze)
    }

    pub async fn resume(&self, caller: &Caller, id_or_name: &str) -> Result<Sandbox> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;
            let (row, live) = self.lifecycle(caller, id_or_name, Op::Resume).await?;
            self.touch(&live, &row.id).await;
            Ok(to_api(&self.config, caller, &self.reload(&row.id).await?))
        }
        .await;
        self.audit(caller, "sandbox.resume", id_or_name, &r).await;
        r
    }

    pub async fn stop(&self, caller: &Caller, id_or_name: &str) -> Result<Sandbox> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;
            let (row, _) = self.lifecycle(caller, id_or_name, Op::Stop).await?;
            Ok(to_api(&self.config, caller, &self.reload(&row.id).await?))
        }
        .await;
        self.audit(caller, "sandbox.stop", id_or_name, &r).await;
        r
    }

    pub async fn start(&self, caller: &Caller, id_or_name: &str) -> Result<Sandbox> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;
            let (row, live) = self.lifecycle(caller, id_or_name, Op::Start).await?;
            self.touch(&live, &row.id).await;
            Ok(to_api(&self.config, caller, &self.reload(&row.id).await?))
        }
        .await;
        self.audit(caller, "sandbox.start", id_or_name, &r).await;
        r
    }

    /// Deletes a sandbox and everything it left on the host. Without `force`, a running
    /// or paused sandbox is refused with `conflict`.
    pub async fn delete(&self, caller: &Caller, id_or_name: &str, force: bool) -> Result<()> {
        let r = async {
            caller.require(Scope::SandboxesDelete)?;
            self.lifecycle(caller, id_or_name, Op::Delete { force })
                .await
                .map(|_| ())
        }
        .await;
        self.audit(caller, "sandbox.delete", id_or_name, &r).await;
        r
    }

    /// Checks the sandbox can run things (resuming it transparently when paused) and
    /// returns its agent connection.
    /// `work`: the call adds work (exec, writes), so the CPU and disk quotas apply even
    /// when the sandbox is already running.
    async fn running_conn(
        &self,
        caller: &Caller,
        id_or_name: &str,
        work: bool,
    ) -> Result<(Arc<AgentConn>, Inflight)> {
        let (conn, inflight, _row) = self.running_conn_row(caller, id_or_name, work).await?;
        Ok((conn, inflight))
    }

    /// [`Self::running_conn`], with the sandbox's row as it was when the call began.
    async fn running_conn_row(
        &self,
        caller: &Caller,
        id_or_name: &str,
        work: bool,
    ) -> Result<(Arc<AgentConn>, Inflight, SandboxRow)> {
        // Fast path: an id this daemon already tracks is locked first, then read once
        // under its lock (tenancy and current state in one query). Live entries are keyed
        // by id and names never start with "sb-", so the key names this very sandbox.
        let known = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id_or_name)
            .cloned();
        let fast = match known {
            Some(live) => {
                let g = live.lifecycle.clone().lock_owned().await;
                let row = self.resolve(caller, id_or_name).await?;
                (row.id == id_or_name).then_some((row, live, g))
            }
            None => None,
        };
        let (row, live, _g) = match fast {
            Some(locked) => locked,
            None => {
                let row = self.resolve(caller, id_or_name).await?;
                let live = self.live(&row.id);
                let g = live.lifecycle.clone().lock_owned().await;
                let row = self.reload(&row.id).await?;
                (row, live, g)
            }
        };
        match self.apply(&row, &live, Op::Call).await? {
            Step::Keep if work => self.admit(&row.tenant, Admit::Work).await?,
            Step::Thaw => tracing::info!(sandbox = %row.id, "resumed for a call"),
            _ => {}
        }
        let current = live.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let conn = match current {
            Some(c) if !c.is_closed() => c,
            _ => {
                let c = AgentConn::connect(
                    &self.driver_for(&row)?.socket_path(&row.id),
                    Duration::from_secs(3),
                )
                .await?;
                Self::set_conn(&live, Some(c.clone()));
                c
            }
        };
        live.inflight.fetch_add(1, Ordering::SeqCst);
        let inflight = Inflight(live.clone());
        self.touch(&live, &row.id).await;
        Ok((conn, inflight, row))
    }

    async fn call(
        &self,
        caller: &Caller,
        id_or_name: &str,
        work: bool,
        req: proto::Request,
    ) -> Result<proto::Response> {
        let (conn, _inflight) = self.running_conn(caller, id_or_name, work).await?;
        conn.call(req).await
    }

    /// [`Self::call`] for requests whose only success answer is `Done`.
    async fn call_done(
        &self,
        caller: &Caller,
        id_or_name: &str,
        work: bool,
        req: proto::Request,
    ) -> Result<()> {
        match self.call(caller, id_or_name, work, req).await? {
            proto::Response::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub async fn exec(
        &self,
        caller: &Caller,
        id_or_name: &str,
        req: ExecRequest,
    ) -> Result<ExecResponse> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;

            let spec = exec_spec(req, false)?;
            let (conn, _inflight, row) = self.running_conn_row(caller, id_or_name, true).await?;
            let oom_before = self.driver_for(&row)?.oom_kills(&row.id).ok();
            let (id, mut rx) = conn.send(proto::Request::Exec(spec))?;
            let mut guard = CancelGuard {
                conn: conn.clone(),
                id,
                armed: true,
            };
            loop {
                match rx.recv().await {
                    Some(proto::Response::Exited(r)) => {
                        guard.armed = false;
                        let mut resp = exec_response(r);
                        resp.memory_limit_bytes = oom_verdict(
                            self.driver_for(&row)?.as_ref(),
                            &row,
                            oom_before,
                            resp.exit_code,
                            resp.signal,
                        );
                        resp.oom_killed = resp.memory_limit_bytes.is_some();
                        return Ok(resp);
                    }
                    Some(proto::Response::Started { .. })
                    | Some(proto::Response::Output { .. }) => {}
                    Some(other) => {
                        guard.armed = false;
                        return Err(unexpected(other));
                    }
                    None => {
                        guard.armed = false;
                        return Err(CoreError::Unavailable(
                            "the sandbox's agent went away during the call".into(),
                        ));
                    }
                }
            }
        }
        .await;
        self.audit(caller, "sandbox.exec", id_or_name, &r).await;
        r
    }

    /// Runs a command and streams its events; the last event is `End` or `Error`.
    pub async fn exec_stream(
        &self,
        caller: &Caller,
        id_or_name: &str,
        req: ExecRequest,
    ) -> Result<mpsc::Receiver<ExecEvent>> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;

            let spec = exec_spec(req, true)?;
            let (conn, inflight, row) = self.running_conn_row(caller, id_or_name, true).await?;
            let oom_before = self.driver_for(&row)?.oom_kills(&row.id).ok();
            let (id, mut rx) = conn.send(proto::Request::Exec(spec))?;
            let (tx, out) = mpsc::channel(64);
            let conn_sandbox = id_or_name.to_string();
            let driver = self.driver_for(&row)?;
            tokio::spawn(async move {
                let _inflight = inflight;
                let mut guard = CancelGuard {
                    conn: conn.clone(),
                    id,
                    armed: true,
                };
                loop {
                    let ev = match rx.recv().await {
                        Some(proto::Response::Started { pid }) => ExecEvent::Start { pid },
                        Some(proto::Response::Output { stream, data }) => {
                            let (data, encoding) = encode_bytes(&data);
                            match stream {
                                proto::Stream::Stdout => ExecEvent::Stdout { data, encoding },
                                proto::Stream::Stderr => ExecEvent::Stderr { data, encoding },
                            }
                        }
                        Some(proto::Response::Exited(r)) => {
                            guard.armed = false;
                            let memory_limit_bytes = oom_verdict(
                                driver.as_ref(),
                                &row,
                                oom_before,
                                r.exit_code,
                                r.signal,
                            );
                            let _ = tx
                                .send(ExecEvent::End {
                                    exit_code: r.exit_code,
                                    signal: r.signal,
                                    timed_out: r.timed_out,
                                    truncated: r.stdout_truncated || r.stderr_truncated,
                                    duration_ms: r.duration_ms,
                                    oom_killed: memory_limit_bytes.is_some(),
                                    memory_limit_bytes,
                                })
                                .await;
                            return;
                        }
                        Some(other) => {
                            guard.armed = false;
                            let e = unexpected(other);
                            // The client sees only the public message: the cause goes
                            // to the log here, since no HTTP error carries it.
                            e.log(&format!("exec stream in sandbox {conn_sandbox:?}"));
                            let _ = tx
                                .send(ExecEvent::Error {
                                    code: e.code(),
                                    message: e.public_message(),
                                })
                                .await;
                            return;
                        }
                        None => {
                            guard.armed = false;
                            tracing::warn!(sandbox = %conn_sandbox,
                                "exec stream failed: the sandbox's agent went away during the call");
                            let _ = tx
                                .send(ExecEvent::Error {
                                    code: ErrorCode::Unavailable,
                                    message: "the sandbox's agent went away during the call".into(),
                                })
                                .await;
                            return;
                        }
                    };
                    // A closed receiver means the client left: the guard cancels the call.
                    if tx.send(ev).await.is_err() {
                        return;
                    }
                }
            });
            Ok(out)
        }
        .await;
        self.audit(caller, "sandbox.exec", id_or_name, &r).await;
        r
    }

    pub async fn start_process(
        &self,
        caller: &Caller,
        id_or_name: &str,
        req: StartProcessRequest,
    ) -> Result<ProcessInfo> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;

            let command = command_of(req.command, req.shell)?;
            validate_env(&req.env)?;
            if let Some(cwd) = &req.cwd {
                validate_path(cwd)?;
            }
            let cmd_vec = command_vec(&command);
            let spec = proto::BackgroundSpec {
                command,
                env: req.env,
                cwd: req.cwd,
                user: run_as(req.user),
                max_log: proto::DEFAULT_MAX_OUTPUT,
            };
            match self
                .call(
                    caller,
                    id_or_name,
                    true,
                    proto::Request::BackgroundStart(spec),
                )
                .await?
            {
                proto::Response::BackgroundStarted { bg_id, pid } => Ok(ProcessInfo {
                    id: bg_id,
                    pid,
                    command: cmd_vec,
                    running: true,
                    exit_code: None,
                    signal: None,
                    started_at: rfc3339(now_ms()),
                }),
                other => Err(unexpected(other)),
            }
        }
        .await;
        self.audit(caller, "process.start", id_or_name, &r).await;
        r
    }

    pub async fn list_processes(&self, caller: &Caller, id_or_name: &str) -> Result<ProcessList> {
        caller.require(Scope::SandboxesWrite)?;

        match self
            .call(caller, id_or_name, false, proto::Request::BackgroundList)
            .await?
        {
            proto::Response::BackgroundList { processes } => Ok(ProcessList {
                processes: processes
                    .into_iter()
                    .map(|p| ProcessInfo {
                        id: p.bg_id,
                        pid: p.pid,
                        command: command_vec(&p.command),
                        running: p.running,
                        exit_code: p.exit_code,
                        signal: p.signal,
                        started_at: rfc3339(p.started_at.saturating_mul(1000)),
                    })
                    .collect(),
            }),
            other => Err(unexpected(other)),
        }
    }

    pub async fn process_logs(
        &self,
        caller: &Caller,
        id_or_name: &str,
        process_id: u64,
    ) -> Result<ProcessLogs> {
        caller.require(Scope::SandboxesWrite)?;

        match self
            .call(
                caller,
                id_or_name,
                false,
                proto::Request::BackgroundLogs { bg_id: process_id },
            )
            .await?
        {
            proto::Response::BackgroundLogs(l) => {
                let both = std::str::from_utf8(&l.stdout).is_ok()
                    && std::str::from_utf8(&l.stderr).is_ok();
                let enc = |b: &[u8]| {
                    if both {
                        String::from_utf8_lossy(b).into_owned()
                    } else {
                        base64::engine::general_purpose::STANDARD.encode(b)
                    }
                };
                Ok(ProcessLogs {
                    stdout: enc(&l.stdout),
                    stderr: enc(&l.stderr),
                    encoding: if both {
                        Encoding::Utf8
                    } else {
                        Encoding::Base64
                    },
                    stdout_dropped: l.stdout_dropped,
                    stderr_dropped: l.stderr_dropped,
                })
            }
            other => Err(unexpected(other)),
        }
    }

    pub async fn kill_process(
        &self,
        caller: &Caller,
        id_or_name: &str,
        process_id: u64,
        signal: Option<i32>,
    ) -> Result<()> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;

            if let Some(s) = signal {
                if !(1..=64).contains(&s) {
                    return Err(CoreError::InvalidArgument(
                        "signal must be between 1 and 64".into(),
                    ));
                }
            }
            self.call_done(
                caller,
                id_or_name,
                false,
                proto::Request::BackgroundKill {
                    bg_id: process_id,
                    signal,
                },
            )
            .await
        }
        .await;
        self.audit(caller, "process.kill", id_or_name, &r).await;
        r
    }

    /// Reads a file; the stream yields chunks until the end of the file.
    pub async fn read_file(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
    ) -> Result<ByteStream> {
        caller.require(Scope::SandboxesWrite)?;

        validate_path(path)?;
        let (conn, inflight) = self.running_conn(caller, id_or_name, false).await?;
        let path = path.to_string();
        let user = run_as(user);
        let first = conn
            .call(proto::Request::FileRead {
                path: path.clone(),
                user,
                offset: 0,
                limit: Some(FILE_CHUNK),
            })
            .await?;
        let (data, eof) = match first {
            proto::Response::FileData { data, eof, .. } => (data, eof),
            other => return Err(unexpected(other)),
        };
        let state = (
            conn,
            inflight,
            path,
            user,
            data.len() as u64,
            eof,
            Some(data),
        );
        let stream = futures::stream::unfold(
            state,
            |(conn, inflight, path, user, offset, eof, first)| async move {
                if let Some(d) = first {
                    return Some((Ok(d), (conn, inflight, path, user, offset, eof, None)));
                }
                if eof {
                    return None;
                }
                let r = conn
                    .call(proto::Request::FileRead {
                        path: path.clone(),
                        user,
                        offset,
                        limit: Some(FILE_CHUNK),
                    })
                    .await;
                match r {
                    Ok(proto::Response::FileData { data, eof, .. }) => {
                        let off = offset + data.len() as u64;
                        let eof = eof || data.is_empty();
                        Some((Ok(data), (conn, inflight, path, user, off, eof, None)))
                    }
                    Ok(other) => Some((
                        Err(unexpected(other)),
                        (conn, inflight, path, user, offset, true, None),
                    )),
                    Err(e) => Some((Err(e), (conn, inflight, path, user, offset, true, None))),
                }
            },
        );
        Ok(stream.boxed())
    }

    /// Writes (replaces) a file from a stream of chunks; returns the bytes written. The
    /// data goes to a temporary name first and is renamed over the target at the end, so
    /// a failed upload never leaves a half-written file in place of the old one.
    pub async fn write_file(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
        mut body: ByteSink,
    ) -> Result<u64> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;

            validate_path(path)?;
            if path.ends_with('/') {
                return Err(CoreError::InvalidArgument("path names a directory".into()));
            }
            let (conn, _inflight) = self.running_conn(caller, id_or_name, true).await?;
            let user = run_as(user);
            let (dir, name) = match path.rfind('/') {
                Some(i) => (&path[..=i], &path[i + 1..]),
                None => ("", path),
            };
            let tmp = format!("{dir}.{name}.tb-upload-{}", uuid::Uuid::new_v4().simple());
            let mut written: u64 = 0;
            let mut first = true;
            let mut pending: Vec<u8> = Vec::new();
            let result: Result<()> = async {
                loop {
                    let next = body.next().await;
                    let done = next.is_none();
                    if let Some(chunk) = next {
                        let chunk = chunk.map_err(|e| {
                            CoreError::InvalidArgument(format!("upload interrupted: {e}"))
                        })?;
                        pending.extend_from_slice(&chunk);
                    }
                    while pending.len() as u64 >= FILE_CHUNK
                        || (done && (first || !pending.is_empty()))
                    {
                        let take = pending.len().min(FILE_CHUNK as usize);
                        let data: Vec<u8> = pending.drain(..take).collect();
                        let n = data.len() as u64;
                        let r = conn
                            .call(proto::Request::FileWrite {
                                path: tmp.clone(),
                                user,
                                data,
                                append: !first,
                                mode: None,
                                make_parents: first,
                            })
                            .await?;
                        match r {
                            proto::Response::Done => {}
                            other => return Err(unexpected(other)),
                        }
                        first = false;
                        written += n;
                    }
                    if done {
                        break;
                    }
                }
                match conn
                    .call(proto::Request::Rename {
                        from: tmp.clone(),
                        to: path.to_string(),
                        user,
                    })
                    .await?
                {
                    proto::Response::Done => Ok(()),
                    other => Err(unexpected(other)),
                }
            }
            .await;
            if let Err(e) = result {
                if !first {
                    let _ = conn
                        .call(proto::Request::Remove {
                            path: tmp,
                            user,
                            recursive: false,
                        })
                        .await;
                }
                return Err(e);
            }
            Ok(written)
        }
        .await;
        self.audit(caller, "file.write", id_or_name, &r).await;
        r
    }

    pub async fn list_files(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
    ) -> Result<FileList> {
        caller.require(Scope::SandboxesWrite)?;

        validate_path(path)?;
        match self
            .call(
                caller,
                id_or_name,
                false,
                proto::Request::FileList {
                    path: path.into(),
                    user: run_as(user),
                },
            )
            .await?
        {
            proto::Response::FileList { entries } => Ok(FileList {
                entries: entries.into_iter().map(file_entry).collect(),
            }),
            other => Err(unexpected(other)),
        }
    }

    pub async fn stat_file(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
    ) -> Result<FileEntry> {
        caller.require(Scope::SandboxesWrite)?;

        validate_path(path)?;
        match self
            .call(
                caller,
                id_or_name,
                false,
                proto::Request::FileStat {
                    path: path.into(),
                    user: run_as(user),
                },
            )
            .await?
        {
            proto::Response::FileStat(f) => Ok(file_entry(f)),
            other => Err(unexpected(other)),
        }
    }

    pub async fn mkdir(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
        parents: bool,
    ) -> Result<()> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;

            validate_path(path)?;
            self.call_done(
                caller,
                id_or_name,
                true,
                proto::Request::Mkdir {
                    path: path.into(),
                    user: run_as(user),
                    parents,
                },
            )
            .await
        }
        .await;
        self.audit(caller, "file.mkdir", id_or_name, &r).await;
        r
    }

    pub async fn remove_file(
        &self,
        caller: &Caller,
        id_or_name: &str,
        path: &str,
        user: User,
        recursive: bool,
    ) -> Result<()> {
        let r = async {
            caller.require(Scope::SandboxesWrite)?;

            validate_path(path)?;
            self.call_done(
                caller,
                id_or_name,
                false,
                proto::Request::Remove {
                    path: path.into(),
                    user: run_as(user),
                    recursive,
                },
            )
            .await
        }
        .await;
        self.audit(caller, "file.remove", id_or_name, &r).await;
        r
    }

    pub async fn selftest(&self, caller: &Caller, id_or_name: &str) -> Result<SelftestReport> {
        caller.require(Scope::SandboxesWrite)?;

        match self
            .call(caller, id_or_name, false, proto::Request::Selftest)
            .await?
        {
            proto::Response::Selftest { checks } => Ok(SelftestReport {
                ok: checks.iter().all(|c| c.ok),
                checks: checks
                    .into_iter()
                    .map(|c| PostureCheck {
                        name: c.name,
                        ok: c.ok,
                        detail: c.detail,
                    })
                    .collect(),
            }),
            other => Err(unexpected(other)),
        }
    }

    /// CPU time the sandbox has used so far, microseconds (from its cgroup).
    pub async fn cpu_usage_usec(&self, caller: &Caller, id_or_name: &str) -> Result<u64> {
        caller.require(Scope::SandboxesRead)?;

        let row = self.resolve(caller, id_or_name).await?;
        let d = self.driver_for(&row)?;
        blocking(move || d.cpu_usage_usec(&row.id)).await
    }

    pub async fn add_image(&self, caller: &Caller, req: AddImageRequest) -> Result<Image> {
        let target = req.name.clone();
        let r = async {
            caller.require(Scope::Admin)?;

            images::validate_image_name(&req.name)?;
            let path = images::validate_rootfs(&req.path)?;
            let row = ImageRow {
                name: req.name,
                kind: "rootfs".into(),
                path: Some(path.display().to_string()),
                created_at: now_ms(),
            };
            self.store.insert_image(&row).await?;
            Ok(Image {
                name: row.name,
                kind: row.kind,
                path: row.path,
                created_at: rfc3339(row.created_at),
            })
        }
        .await;
        self.audit(caller, "image.add", &target, &r).await;
        r
    }

    pub async fn list_images(&self, caller: &Caller) -> Result<ImageList> {
        caller.require(Scope::SandboxesRead)?;

        Ok(ImageList {
            images: self
                .store
                .list_images()
                .await?
                .into_iter()
                .map(|r| Image {
                    name: r.name,
                    kind: r.kind,
                    path: r.path,
                    created_at: rfc3339(r.created_at),
                })
                .collect(),
        })
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
