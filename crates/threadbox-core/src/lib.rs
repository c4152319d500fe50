//! threadbox core: the sandbox model, the manager, the store, the driver seam (the jail
//! tier is `threadbox-jail`; the fake test tier is [`fake`]).
#![forbid(unsafe_code)]

pub mod agent;
pub mod audit;
pub mod caller;
pub mod driver;
pub mod error;
pub mod fake;
mod gov_ops;
pub mod gov_store;
pub mod images;
pub mod keys;
pub mod layers;
pub mod manager;
pub mod metrics;
pub mod oci;
pub mod oci_user;
pub mod ops;
pub mod range;
pub mod relay;
pub mod store;
pub mod store_checkpoints;
pub mod store_contexts;
pub mod store_images;
pub mod store_layers;
pub mod store_net_log;
pub mod store_network;
pub mod store_previews;
pub mod store_secrets;
pub mod store_templates;
pub mod telemetry;

pub use caller::{Caller, Scope, DEFAULT_TENANT};
pub use error::{CoreError, Result};
pub use manager::Manager;
pub use range::FileRange;

use std::path::PathBuf;

/// Smallest disk a sandbox may have.
pub const MIN_DISK_BYTES: u64 = 16 << 20;
/// Largest disk any sandbox may have, whatever the operator allows.
pub const MAX_DISK_BYTES: u64 = 1 << 44;
/// Default of [`Config::max_disk_bytes`] (`serve --max-disk-bytes`).
pub const DEFAULT_MAX_DISK_BYTES: u64 = 100 << 30;

/// Daemon-wide configuration of the core. Everything a test needs to vary is here, so tests
/// inject a temp root instead of touching globals. What a tier needs (the jail's helper,
/// cgroups, uid ranges) is that tier's own configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Root of all state (`state.db`, `images/`, `sandboxes/`).
    pub root: PathBuf,
    pub default_memory_bytes: u64,
    pub default_cpus: f64,
    pub default_pids: u32,
    /// Disk quota of a sandbox unless its create request names one (ADR 0011); capped
    /// by `max_disk_bytes` and by what is left of the tenant's `disk_bytes` quota.
    pub default_disk_bytes: u64,
    /// The operator's maximum for one sandbox's disk (`serve --max-disk-bytes`).
    pub max_disk_bytes: u64,
    /// How often idle pause and TTL are checked.
    pub reaper_interval: std::time::Duration,
    /// How often usage is sampled (CPU, memory, disk) and the daily CPU cap enforced.
    pub meter_interval: std::time::Duration,
    /// Pre-booted sandboxes (default image, default limits) kept ready for `create`;
    /// 0 = no warm pool (ADR 0010).
    pub warm_pool: usize,
    /// Pre-booted sandboxes of templates: (tenant, template name, how many); ADR 0110.
    pub warm_pool_templates: Vec<(String, String, usize)>,
    /// Staged slots (ADR 0180): sandboxes of the host image booted up to the point where
    /// their disk is needed, kept ready for forks; 0 = none.
    pub staged_pool: usize,
    /// Private ranges the operator opens to egress (`serve --egress-allow-private`); the
    /// floor refuses them otherwise, whatever a tenant's policy says.
    pub egress_allow_private: Vec<ipnet::IpNet>,
    /// Static names (`serve --egress-hosts FILE`), answered before any upstream resolver.
    pub egress_hosts: Vec<(String, Vec<std::net::Ipv4Addr>)>,
    /// The resolvers the daemon asks for allowed names (default: the host's resolv.conf).
    pub egress_dns: Option<Vec<std::net::SocketAddr>>,
    /// The daemon's own ports, refused on any loopback or host address whatever is excepted.
    pub egress_daemon_ports: Vec<u16>,
    /// Extra CAs (PEM files) upstreams of intercepted hosts may be signed by, besides the
    /// host's roots (`serve --egress-upstream-ca`; the tests' own upstream CA).
    pub egress_upstream_ca: Vec<PathBuf>,
    /// Host form of preview URLs, `{port}-{id}.<preview_domain>` (`serve --preview-domain`;
    /// default `localhost`, which browsers resolve to loopback without DNS).
    pub preview_domain: String,
    /// The daemon's TCP address, for the URLs previews answer with.
    pub preview_addr: Option<std::net::SocketAddr>,
    /// Where the in-sandbox OTLP endpoint forwards spans (ADR 0091); `None` when the
    /// daemon exports no traces, and then no sandbox can ask for the relay.
    pub trace_relay: Option<relay::TraceRelay>,
}

impl Config {
    pub fn new(root: PathBuf) -> Self {
        Config {
            root,
            default_memory_bytes: 1 << 30,
            default_cpus: 1.0,
            default_pids: 512,
            default_disk_bytes: 10 << 30,
            max_disk_bytes: DEFAULT_MAX_DISK_BYTES,
            reaper_interval: std::time::Duration::from_secs(1),
            meter_interval: std::time::Duration::from_secs(2),
            warm_pool: 0,
            warm_pool_templates: Vec::new(),
            staged_pool: 0,
            egress_allow_private: Vec::new(),
            egress_hosts: Vec::new(),
            egress_dns: None,
            egress_daemon_ports: Vec::new(),
            egress_upstream_ca: Vec::new(),
            preview_domain: "localhost".to_string(),
            preview_addr: None,
            trace_relay: None,
        }
    }
}
