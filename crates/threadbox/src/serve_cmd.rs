//! `threadbox serve`: flags, environment and config file turned into `ServeOptions`.

use crate::cli::ServeArgs;
use crate::parse::parse_size;
use anyhow::{bail, Context};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use threadbox_core::driver::Drivers;
use threadbox_server::{ServeOptions, DEFAULT_LISTEN};

const DEFAULT_ROOT: &str = "/var/lib/threadbox";

/// The `--config` file (JSON). Flags and environment variables win over it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    root: Option<PathBuf>,
    listen: Option<String>,
    agent: Option<PathBuf>,
    /// e.g. "1G".
    max_upload: Option<String>,
    /// Pre-booted sandboxes kept ready for create (0 = none).
    warm_pool: Option<usize>,
    /// Staged slots kept ready for forks (0 = none).
    staged_pool: Option<usize>,
    /// Largest disk one sandbox may ask for, e.g. "100G".
    max_disk_bytes: Option<String>,
    /// "auto" or "off" (`--store-image`).
    store_image: Option<String>,
    /// e.g. "200G" (`--store-size`).
    store_size: Option<String>,
    /// Extra hosts accepted in `Host` on TCP (added to the loopback names).
    #[serde(default)]
    allowed_hosts: Vec<String>,
    /// Browser origins accepted in `Origin`.
    #[serde(default)]
    allowed_origins: Vec<String>,
    /// Old names of `allowed_hosts` and `allowed_origins` (when only `/mcp` checked them).
    #[serde(default)]
    mcp_allowed_hosts: Vec<String>,
    #[serde(default)]
    mcp_allowed_origins: Vec<String>,
}

fn read_config(path: &Path) -> anyhow::Result<ConfigFile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the config file {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("invalid config file {} (expected JSON)", path.display()))
}

/// `--agent`, else `THREADBOX_AGENT` (both via clap), else the config file, else
/// `threadbox-agent` next to this binary.
fn resolve_agent(explicit: Option<PathBuf>, exe: &Path) -> anyhow::Result<PathBuf> {
    let agent = match explicit {
        Some(p) => p,
        None => exe
            .parent()
            .map(|dir| dir.join("threadbox-agent"))
            .context("cannot locate the directory of the threadbox binary")?,
    };
    if !agent.is_file() {
        bail!(
            "the sandbox agent binary {} does not exist (build it with `cargo build -p \
             threadbox-agent`, or pass --agent PATH / set THREADBOX_AGENT)",
            agent.display()
        );
    }
    Ok(agent)
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let telemetry =
        threadbox_server::telemetry::Telemetry::from_config(args.otlp_endpoint.as_deref())?;
    init_logging(telemetry.as_ref());
    let r = serve_inner(args, telemetry.as_ref().map(|t| t.relay())).await;
    if let Some(t) = telemetry {
        // Flushes the last spans; it blocks, so off the runtime's workers.
        let _ = tokio::task::spawn_blocking(move || t.shutdown()).await;
    }
    r
}

async fn serve_inner(
    args: ServeArgs,
    trace_relay: Option<threadbox_core::relay::TraceRelay>,
) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(path) => read_config(path)?,
        None => ConfigFile::default(),
    };
    let root = args
        .root
        .or(config.root)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT));
    let listen = args
        .listen
        .or(config.listen)
        .unwrap_or_else(|| DEFAULT_LISTEN.to_string());
    let listen: SocketAddr = listen.parse().with_context(|| {
        format!("invalid --listen address {listen:?}: expected IP:PORT, e.g. 127.0.0.1:7420")
    })?;
    let store_mode = match (args.store_image, config.store_image) {
        (Some(m), _) => m,
        (None, Some(s)) => s.parse().map_err(|e: String| anyhow::anyhow!(e))?,
        (None, None) => threadbox_jail::store::StoreMode::Auto,
    };
    let store_size = match args.store_size.or(config.store_size) {
        Some(s) => Some(parse_size(&s)?),
        None => None,
    };
    let store = prepare_store(&root, store_mode, store_size)?;
    let exe = std::env::current_exe().context("cannot locate the threadbox binary")?;
    let agent = resolve_agent(args.agent.or(config.agent), &exe)?;
    let mut jail = threadbox_jail::JailConfig::new(root.clone(), agent, exe);
    let mut opts = ServeOptions::new(root);
    opts.trace_relay = trace_relay;
    opts.listen = listen;
    if let Some(size) = args.max_upload.or(config.max_upload) {
        opts.max_upload_bytes = parse_size(&size)?;
    }
    // Flags add to the config file's lists.
    let mut hosts = config.allowed_hosts;
    hosts.extend(config.mcp_allowed_hosts);
    hosts.extend(args.allowed_hosts);
    let mut origins = config.allowed_origins;
    origins.extend(config.mcp_allowed_origins);
    origins.extend(args.allowed_origins);
    opts.mcp = threadbox_server::McpOptions::default().with_extra_hosts(hosts);
    opts.mcp.allowed_origins = origins;
    if let Some(size) = args.max_disk_bytes.or(config.max_disk_bytes) {
        let max = parse_size(&size)?;
        if !(threadbox_core::MIN_DISK_BYTES..=threadbox_core::MAX_DISK_BYTES).contains(&max) {
            bail!("--max-disk-bytes must be between 16M and 16T");
        }
        opts.max_disk_bytes = max;
    }
    opts.insecure_no_auth = args.insecure_no_auth;
    jail.allow_no_landlock = args.insecure_allow_no_landlock;
    if jail.allow_no_landlock {
        tracing::warn!(
            "--insecure-allow-no-landlock: sandboxes start without Landlock where the kernel \
             cannot enforce it"
        );
    }
    opts.warm_pool = args.warm_pool.or(config.warm_pool).unwrap_or(0);
    opts.staged_pool = args.staged_pool.or(config.staged_pool).unwrap_or(0);
    for c in &args.egress_allow_private {
        let net: ipnet::IpNet = c
            .parse()
            .or_else(|_| c.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
            .map_err(|_| anyhow::anyhow!("--egress-allow-private {c:?}: not a CIDR"))?;
        opts.egress_allow_private.push(net);
    }
    if let Some(path) = &args.egress_hosts {
        opts.egress_hosts = crate::net_cmd::read_hosts(path)?;
    }
    if !args.egress_dns.is_empty() {
        let mut servers = Vec::new();
        for a in &args.egress_dns {
            servers.push(
                a.parse()
                    .map_err(|_| anyhow::anyhow!("--egress-dns {a:?}: expected IP:PORT"))?,
            );
        }
        opts.egress_dns = Some(servers);
    }
    opts.egress_upstream_ca = args.egress_upstream_ca.clone();
    if let Some(d) = &args.preview_domain {
        opts.preview_domain = crate::preview_cmd::check_domain(d)?;
    }
    if opts.warm_pool > 1024 {
        bail!("--warm-pool must be at most 1024");
    }
    if opts.staged_pool > 1024 {
        bail!("--staged-pool must be at most 1024");
    }
    for w in &args.warm_pool_template {
        opts.warm_pool_templates.push(parse_pool_template(w)?);
    }
    let store_root = root_for_release(&store, &jail.root);
    let runsc = args.runsc.clone();
    let served = threadbox_server::serve(opts, move || tiers(jail, runsc)).await;
    if let Some(root) = store_root {
        release_store(&root);
    }
    served?;
    Ok(())
}

/// The reflink store under `root` (ADR 0101), before anything uses `sandboxes/`.
fn prepare_store(
    root: &Path,
    mode: threadbox_jail::store::StoreMode,
    bytes: Option<u64>,
) -> anyhow::Result<threadbox_jail::store::Store> {
    use threadbox_jail::store::{Store, MIN_STORE_BYTES};
    if bytes.is_some_and(|b| b < MIN_STORE_BYTES) {
        bail!("--store-size must be at least 1G");
    }
    let store =
        threadbox_jail::store::prepare(root, mode, bytes).map_err(|e| anyhow::anyhow!("{e}"))?;
    match &store {
        Store::Native => tracing::info!("sandbox disks: the root's file system reflinks"),
        Store::Mounted { bytes, reused } => tracing::info!(
            bytes,
            reused,
            "sandbox disks: on the reflink store image {}",
            root.join(threadbox_jail::store::STORE_IMAGE).display()
        ),
        Store::Unused(why) => {
            tracing::warn!("sandbox disks: checkpoints and forks copy (no reflink store: {why})")
        }
    }
    Ok(store)
}

fn root_for_release(store: &threadbox_jail::store::Store, root: &Path) -> Option<PathBuf> {
    matches!(store, threadbox_jail::store::Store::Mounted { .. }).then(|| root.to_path_buf())
}

/// Unmounts the store at a clean shutdown when nothing uses it (else the next start
/// reuses it).
fn release_store(root: &Path) {
    match threadbox_jail::store::release(root) {
        Ok(true) => tracing::info!("reflink store unmounted"),
        Ok(false) => tracing::info!("reflink store left mounted (in use); reused at next start"),
        Err(e) => tracing::warn!("reflink store: {e}"),
    }
}

/// `[TENANT/]NAME=N` of `--warm-pool-template` (ADR 0110).
fn parse_pool_template(s: &str) -> anyhow::Result<(String, String, usize)> {
    let bad = || {
        anyhow::anyhow!("--warm-pool-template {s:?}: expected [TENANT/]NAME=N, N from 1 to 1024")
    };
    let (who, n) = s.rsplit_once('=').ok_or_else(bad)?;
    let n: usize = n.parse().map_err(|_| bad())?;
    let (tenant, name) = match who.split_once('/') {
        Some((t, n)) => (t, n),
        None => (threadbox_core::caller::DEFAULT_TENANT, who),
    };
    if tenant.is_empty() || name.is_empty() || !(1..=1024).contains(&n) {
        return Err(bad());
    }
    Ok((tenant.to_string(), name.to_string(), n))
}

/// The daemon's isolation tiers: the jail, the default and only real one.
fn tiers(
    jail: threadbox_jail::JailConfig,
    runsc: Option<PathBuf>,
) -> threadbox_core::Result<Drivers> {
    let jail = threadbox_jail::JailDriver::new(jail)?;
    let mut d = Drivers::new(Arc::new(jail.clone()));
    // Always registered: without runsc it refuses creates with the reason (issue 16).
    d.register(Arc::new(threadbox_jail::gvisor::GvisorDriver::new(
        jail, runsc,
    )))?;
    Ok(d)
}

fn init_logging(telemetry: Option<&threadbox_server::telemetry::Telemetry>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // The log filter is the fmt layer's alone, so RUST_LOG does not decide which spans
    // are exported (the trace layer has its own filter).
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let _ = tracing_subscriber::registry()
        .with(fmt)
        .with(telemetry.map(|t| t.layer()))
        .try_init();
}
