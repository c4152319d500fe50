//! `threadbox serve`: opens the manager and answers on a unix socket and on loopback TCP
//! until SIGTERM or SIGINT.

use crate::auth::Door;
use crate::error::ErrorChain;
use crate::mcp::McpOptions;
use crate::routes::{app, AppState, DEFAULT_MAX_UPLOAD_BYTES};
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;
use threadbox_core::driver::Drivers;
use threadbox_core::{Config, CoreError, Manager};
use tokio::net::{TcpListener, UnixListener};

/// Default TCP address of the daemon.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7420";
/// Name of the daemon's unix socket inside its root.
pub const SOCKET_NAME: &str = "threadbox.sock";
/// Name of the file holding the daemon's pid inside its root.
pub const PID_FILE_NAME: &str = "threadbox.pid";

/// Everything `serve` needs; the binary fills it from flags, environment and config file.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub root: PathBuf,
    pub listen: SocketAddr,
    pub max_upload_bytes: u64,
    /// How long in-flight requests may take to finish after a shutdown signal.
    pub shutdown_grace: Duration,
    /// Host/Origin allowlists of every route (`--allowed-host`, `--allowed-origin`).
    pub mcp: McpOptions,
    /// Serve TCP without API keys (loopback only): every TCP client is the operator.
    pub insecure_no_auth: bool,
    /// Pre-booted sandboxes kept ready for `create` (0 = none; ADR 0010).
    pub warm_pool: usize,
    /// Warm sandboxes of templates: (tenant, template name, how many).
    pub warm_pool_templates: Vec<(String, String, usize)>,
    /// Staged slots kept ready for forks (0 = none; ADR 0180).
    pub staged_pool: usize,
    /// Largest `limits.disk_bytes` one sandbox may ask for (`--max-disk-bytes`).
    pub max_disk_bytes: u64,
    /// Egress (issue 13): private ranges the operator opens, static names, upstream DNS.
    pub egress_allow_private: Vec<ipnet::IpNet>,
    pub egress_hosts: Vec<(String, Vec<std::net::Ipv4Addr>)>,
    pub egress_dns: Option<Vec<SocketAddr>>,
    /// Extra CAs for the upstreams of intercepted hosts (`--egress-upstream-ca`).
    pub egress_upstream_ca: Vec<std::path::PathBuf>,
    /// Domain of preview URLs (`--preview-domain`; ADR 0072).
    pub preview_domain: String,
    /// Where in-sandbox OTLP endpoints forward (the daemon's own exporter; ADR 0091).
    pub trace_relay: Option<threadbox_core::relay::TraceRelay>,
}

impl ServeOptions {
    pub fn new(root: PathBuf) -> Self {
        ServeOptions {
            root,
            listen: SocketAddr::from(([127, 0, 0, 1], 7420)),
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            shutdown_grace: Duration::from_secs(10),
            mcp: McpOptions::default(),
            insecure_no_auth: false,
            warm_pool: 0,
            warm_pool_templates: Vec::new(),
            staged_pool: 0,
            max_disk_bytes: threadbox_core::DEFAULT_MAX_DISK_BYTES,
            egress_allow_private: Vec::new(),
            egress_hosts: Vec::new(),
            egress_dns: None,
            egress_upstream_ca: Vec::new(),
            preview_domain: "localhost".to_string(),
            trace_relay: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "refusing to listen on {0} with --insecure-no-auth: without API keys only loopback \
         addresses are allowed (use 127.0.0.1 or [::1], or drop --insecure-no-auth)"
    )]
    NotLoopback(SocketAddr),
    #[error("cannot create the root directory {}", .path.display())]
    CreateRoot {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another daemon is already listening on {}", .0.display())]
    AlreadyRunning(PathBuf),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {}", .path.display())]
    WriteFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the sandbox manager")]
    Manager(#[source] CoreError),
    #[error("cannot install the signal handlers")]
    Signals(#[source] std::io::Error),
}

/// Runs the daemon until SIGTERM or SIGINT. Sandboxes keep running after it returns.
/// `tiers` builds the isolation tiers (the first is the default) once the options are
/// checked and the root and sockets exist, right before the manager opens.
pub async fn serve(
    opts: ServeOptions,
    tiers: impl FnOnce() -> Result<Drivers, CoreError>,
) -> Result<(), ServeError> {
    if opts.insecure_no_auth && !opts.listen.ip().is_loopback() {
        return Err(ServeError::NotLoopback(opts.listen));
    }
    std::fs::create_dir_all(&opts.root).map_err(|source| ServeError::CreateRoot {
        path: opts.root.clone(),
        source,
    })?;
    let socket_path = opts.root.join(SOCKET_NAME);
    let pid_path = opts.root.join(PID_FILE_NAME);

    // Signals first, so a SIGTERM during start-up still shuts down cleanly.
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ServeError::Signals)?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(ServeError::Signals)?;

    let tcp = TcpListener::bind(opts.listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: opts.listen.to_string(),
            source,
        })?;
    let tcp_addr = tcp.local_addr().unwrap_or(opts.listen);
    let unix = bind_unix_socket(&socket_path).await?;

    let mut config = Config::new(opts.root.clone());
    config.warm_pool = opts.warm_pool;
    config.warm_pool_templates = opts.warm_pool_templates.clone();
    config.staged_pool = opts.staged_pool;
    config.max_disk_bytes = opts.max_disk_bytes;
    config.egress_allow_private = opts.egress_allow_private.clone();
    config.egress_hosts = opts.egress_hosts.clone();
    config.egress_dns = opts.egress_dns.clone();
    config.egress_upstream_ca = opts.egress_upstream_ca.clone();
    config.trace_relay = opts.trace_relay.clone();
    // The floor keeps the daemon's own ports closed to sandboxes even where excepted.
    config.egress_daemon_ports = vec![tcp_addr.port()];
    config.preview_domain = opts.preview_domain.clone();
    config.preview_addr = Some(tcp_addr);
    let opened = match tiers() {
        Ok(drivers) => Manager::open(config, drivers).await,
        Err(e) => Err(e),
    };
    let manager = opened.map_err(|err| {
        let _ = std::fs::remove_file(&socket_path);
        ServeError::Manager(err)
    })?;

    if let Err(source) = std::fs::write(&pid_path, format!("{}\n", std::process::id())) {
        manager.shutdown().await;
        let _ = std::fs::remove_file(&socket_path);
        return Err(ServeError::WriteFile {
            path: pid_path,
            source,
        });
    }

    let mut state = AppState::new(manager.clone());
    state.max_upload_bytes = opts.max_upload_bytes;
    state.mcp = allow_listen_address(opts.mcp.clone(), tcp_addr);
    let router = app(state);
    let tcp_door = if opts.insecure_no_auth {
        tracing::warn!(
            "!!! --insecure-no-auth: TCP clients on {tcp_addr} need NO API key and act as the \
             operator (every scope, any tenant): every local process and user can drive it. \
             Use only on a trusted single-user host. Web pages are held off by the Host and \
             Origin checks only. !!!"
        );
        if host_or_origin_check_is_off(&opts.mcp) {
            tracing::warn!(
                "!!! --insecure-no-auth with `--allowed-host *` or `--allowed-origin *`: any \
                 web page the operator visits can drive this daemon (DNS rebinding, \
                 cross-site requests). !!!"
            );
        }
        Door::TcpInsecure
    } else {
        tracing::info!("TCP clients on {tcp_addr} need an API key (threadbox keys create)");
        Door::Tcp
    };

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let mut tcp_task = tokio::spawn(
        axum::serve(tcp, router.clone().layer(axum::Extension(tcp_door)))
            .with_graceful_shutdown(stopped(stop_rx.clone()))
            .into_future(),
    );
    let mut unix_task = tokio::spawn(
        axum::serve(unix, router.layer(axum::Extension(Door::Socket)))
            .with_graceful_shutdown(stopped(stop_rx))
            .into_future(),
    );
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        root = %opts.root.display(),
        "threadbox daemon listening on http://{tcp_addr} and unix://{}",
        socket_path.display()
    );

    tokio::select! {
        _ = sigterm.recv() => tracing::info!("SIGTERM received, shutting down"),
        _ = sigint.recv() => tracing::info!("SIGINT received, shutting down"),
        res = &mut tcp_task => tracing::error!(?res, "the TCP listener stopped unexpectedly"),
        res = &mut unix_task => tracing::error!(?res, "the unix socket listener stopped unexpectedly"),
    }
    let _ = stop_tx.send(true);
    // Stop accepting at once: the socket file goes first, so clients fail fast.
    let _ = std::fs::remove_file(&socket_path);
    let drain = async {
        if !tcp_task.is_finished() {
            let _ = (&mut tcp_task).await;
        }
        if !unix_task.is_finished() {
            let _ = (&mut unix_task).await;
        }
    };
    if tokio::time::timeout(opts.shutdown_grace, drain)
        .await
        .is_err()
    {
        tracing::warn!(
            "in-flight requests did not finish within {:?}; closing them",
            opts.shutdown_grace
        );
        tcp_task.abort();
        unix_task.abort();
    }
    manager.shutdown().await;
    let _ = std::fs::remove_file(&pid_path);
    tracing::info!("threadbox daemon stopped");
    Ok(())
}

/// Whether a wildcard switches a Host or Origin check off.
fn host_or_origin_check_is_off(policy: &McpOptions) -> bool {
    policy.allowed_hosts.iter().any(|h| h.trim() == "*")
        || policy.allowed_origins.iter().any(|o| o.trim() == "*")
}

/// Adds the address the daemon listens on to the allowed hosts when it is a specific
/// one (not `0.0.0.0`/`::`): clients that dial the literal address send it as `Host`, and
/// a DNS-rebinding page never can (its `Host` is its own name).
fn allow_listen_address(policy: McpOptions, addr: SocketAddr) -> McpOptions {
    let ip = addr.ip();
    if ip.is_unspecified() {
        return policy;
    }
    policy.with_extra_hosts([ip.to_string()])
}

/// Binds `<root>/threadbox.sock`, replacing a stale socket file but never a live daemon's.
async fn bind_unix_socket(path: &Path) -> Result<UnixListener, ServeError> {
    let listen_err = |source| ServeError::Listen {
        addr: format!("unix://{}", path.display()),
        source,
    };
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(ServeError::AlreadyRunning(path.to_path_buf()));
        }
        tracing::info!(path = %path.display(), "removing a stale socket file");
        std::fs::remove_file(path).map_err(listen_err)?;
    }
    // The socket answers with every scope and no key. Bound at its path and chmodded
    // after, it would be `0777 & !umask` for a moment, long enough for a local user to
    // connect and keep the connection. So it is bound inside a fresh 0700 directory,
    // made 0600 there, and only then renamed into place (rename keeps the inode, and a
    // listening socket keeps working under its new name). A umask would do the same but
    // is process-wide: another thread creating a file meanwhile would get it too.
    let parent = path.parent().unwrap_or(Path::new("."));
    // Short names: the staged path must fit a socket address whenever the final one does.
    let staging = parent.join(format!(".sk{}", std::process::id()));
    if staging.exists() {
        // Left by a daemon of the same pid that died mid-bind.
        std::fs::remove_dir_all(&staging).map_err(listen_err)?;
    }
    // `mode` is masked by the umask, which can only narrow 0700.
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging)
        .map_err(listen_err)?;
    let staged = staging.join("s");
    let bound = (|| -> std::io::Result<UnixListener> {
        let listener = UnixListener::bind(&staged)?;
        std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&staged, path)?;
        Ok(listener)
    })();
    // Empty after the rename; on an error, the staged socket goes with it.
    let _ = std::fs::remove_dir_all(&staging);
    bound.map_err(listen_err)
}

/// Logs an error with its whole chain (for the binary's convenience).
pub fn describe_error(err: &(dyn std::error::Error + 'static)) -> String {
    ErrorChain(err).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileTypeExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// The operator's socket answers with every scope and no key, so no other user may
    /// ever connect to it: from the moment a socket exists at its path its mode is 0600.
    /// A watcher stats the path in a tight loop while the daemon binds it again and again;
    /// a bind-then-chmod shows its `0777 & !umask` mode there now and then.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_operator_socket_is_never_visible_with_a_wider_mode() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("threadbox.sock");
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut seen = std::collections::BTreeSet::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(m) = std::fs::symlink_metadata(&path) {
                        if m.file_type().is_socket() {
                            seen.insert(m.permissions().mode() & 0o7777);
                        }
                    }
                }
                seen
            })
        };
        for _ in 0..400 {
            let listener = bind_unix_socket(&path).await.expect("bind");
            drop(listener);
            std::fs::remove_file(&path).expect("remove the socket");
        }
        stop.store(true, Ordering::Relaxed);
        let seen = watcher.join().expect("the watcher ran");
        assert!(
            seen.iter().all(|m| *m == 0o600),
            "modes seen at the socket's path: {:?}",
            seen.iter().map(|m| format!("{m:o}")).collect::<Vec<_>>()
        );
        // The staging directories are gone.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read the dir")
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}
