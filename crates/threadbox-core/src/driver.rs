//! The driver seam: what the manager needs from an isolation tier, whatever isolates it.
//! The `jail` tier (namespaces + seccomp + Landlock + cgroups, see [`crate::jail`]) is the
//! default; the fake tier ([`crate::fake`]) runs the same agent without isolation for
//! tests; stronger tiers (gVisor, microVM) implement the same [`Driver`].
//!
//! Nothing here names a uid, a cgroup or a socket path: a driver keeps those to itself.
//! The manager hands it a [`SandboxSpec`] (what to run) and gets back an agent stream
//! ([`Driver::connect`]) it speaks the agent protocol over.

use crate::error::{CoreError, Result};
use crate::store::ImageRow;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

/// The tier every sandbox has unless its create names another.
pub const DEFAULT_TIER: &str = "jail";

/// Resource limits of one sandbox, as the API states them; each driver enforces them in
/// its own terms (the jail with a cgroup, a microVM with its machine size).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub cpus: f64,
    pub pids: u32,
}

/// What to run: everything a driver needs to prepare and boot one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub id: String,
    pub hostname: String,
    /// A small number unique among this daemon's sandboxes (the store hands out the
    /// lowest free one, below [`crate::store::MAX_SANDBOXES`]). A driver may map it to
    /// what must be unique per sandbox on the host: the jail takes its uid range from it,
    /// a microVM would take its vsock CID.
    pub index: u32,
    /// The sandbox's image as the store records it; the driver turns it into its own
    /// terms (overlay layers, a block device) at launch.
    pub image: ImageRow,
    pub limits: Limits,
    /// The persistent disk's size (0 = no quota: a plain directory where the tier allows
    /// it).
    pub disk_bytes: u64,
    /// A CA (PEM) the sandbox trusts through its image's own bundle: the daemon's egress
    /// CA when the sandbox has secrets (ADR 0075). `None` leaves the image's bundle alone.
    pub trust_ca: Option<String>,
    /// The sandbox uses the network (a policy, secrets or the OTLP endpoint): a tier
    /// that boots a netns of ours only on demand (gvisor, ADR 0140) boots it now. The
    /// jail has one at every boot and ignores this.
    pub network: bool,
}

/// What a sandbox uses now. `None`: the driver could not read it (nothing runs, or the
/// tier cannot tell).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub memory_bytes: Option<u64>,
    /// CPU time used by the sandbox's current boot, microseconds.
    pub cpu_usec: Option<u64>,
    /// How many of its processes the OOM killer has ended so far (this boot).
    pub oom_kills: Option<u64>,
    /// Bytes its disk occupies on the host; only read when asked for (a walk can cost).
    pub disk_bytes: Option<u64>,
}

/// What a tier can do beyond running processes and serving files ([`Driver::capabilities`];
/// `GET /v1/tiers` lists them, the test suites skip by them).
pub mod capability {
    /// Disk checkpoints, rewind and fork (ADR 0100).
    pub const CHECKPOINTS: &str = "checkpoints";
    /// Egress policies in the sandbox's own network namespace (ADR 0061/0065), previews
    /// and the in-sandbox OTLP endpoint, which are served there too.
    pub const EGRESS: &str = "egress";
    /// Landlock on every sandbox process.
    pub const LANDLOCK: &str = "landlock";
    /// Every call in a cgroup of its own (ADR 0014): a timeout or kill reaches its
    /// double-forked and `setsid` descendants too.
    pub const CALL_CGROUPS: &str = "call_cgroups";
    /// The sandbox's ids map to a host uid range of its own (ADR 0016).
    pub const UID_RANGES: &str = "uid_ranges";
    /// Fork with memory: copies that go on with the parent's memory and running processes
    /// (gvisor, ADR 0136). Without it a fork has the parent's disk only.
    pub const FORK_MEMORY: &str = "fork_memory";
    /// Checkpoints with memory: `checkpoint --with-memory` also saves the memory and
    /// running processes beside the disk, and a rewind to it brings them back (gvisor,
    /// ADR 0195). Without it a checkpoint holds the disk only.
    pub const CHECKPOINT_MEMORY: &str = "checkpoint_memory";
    /// `hibernate`: a sandbox's memory leaves RAM, its processes continue on wake
    /// (ADR 0129, 0130). Each tier also names its flavour, below.
    pub const HIBERNATE: &str = "hibernate";
    /// Hibernate pushes the frozen cgroup's memory to the host's swap (the jail, ADR
    /// 0129): needs swap or zram, does not survive a host reboot.
    pub const HIBERNATE_SWAP: &str = "hibernate_swap";
    /// Hibernate checkpoints memory and processes into an image on the sandbox's disk
    /// (gvisor, ADR 0130): nothing of it stays in RAM or runs, it survives a daemon
    /// restart and a host reboot. The agent is asked to let go of its host socket first
    /// (`PrepareCheckpoint`) and the wake boots a new agent process tree from the image.
    pub const HIBERNATE_IMAGE: &str = "hibernate_image";
}

/// What a tier says of itself for `GET /v1/tiers`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierStatus {
    /// Why the tier cannot boot sandboxes on this host (`None`: it can).
    pub unavailable: Option<String>,
    /// The kernel its sandboxes see.
    pub kernel: Option<String>,
    /// Its runtime's version, when it has one of its own.
    pub version: Option<String>,
}

/// The host's kernel release (what the jail's sandboxes see).
pub fn host_kernel() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .ok()
        .map(|s| s.trim().to_string())
}

/// A byte stream to a sandbox's agent, before the protocol handshake.
pub trait AgentIo: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> AgentIo for T {}
pub type AgentStream = Box<dyn AgentIo>;

/// One posture check a driver makes from the host ([`Driver::host_posture`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostCheck {
    pub name: String,
    pub ok: bool,
    pub detail: String,
}

/// What one sandbox needs from a driver. The manager holds drivers as trait objects, one
/// per isolation tier ([`Drivers`]), and asks a sandbox's own. Blocking work (helpers,
/// mounts, walks) is the driver's to move off the async threads.
#[async_trait::async_trait]
pub trait Driver: Send + Sync {
    /// The tier's name, as stored with each sandbox and shown in the API.
    fn tier(&self) -> &'static str;
    /// The isolation layers this tier runs without, for sandbox info (empty when the
    /// tier is whole).
    fn isolation_warnings(&self) -> Vec<String> {
        Vec::new()
    }
    /// What the tier supports, of [`capability`].
    fn capabilities(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// Posture checks made from the host for `selftest` (after the agent's own): what
    /// cannot be seen from inside, such as the confinement of gVisor's sentry (ADR 0145).
    async fn host_posture(&self, _id: &str, _agent_pid: Option<i32>) -> Vec<HostCheck> {
        Vec::new()
    }
    /// Whether the tier can run here, and its kernel (may probe the host once).
    async fn status(&self) -> TierStatus {
        TierStatus {
            kernel: host_kernel(),
            ..TierStatus::default()
        }
    }
    /// Checks that this tier can boot `image` (before anything of a sandbox exists).
    async fn resolve_image(&self, image: &ImageRow) -> Result<()>;
    /// Whether the sandbox's persistent disk exists on the host.
    async fn has_disk(&self, id: &str) -> bool;
    /// Creates the sandbox's persistent disk.
    async fn prepare(&self, spec: &SandboxSpec) -> Result<()>;
    /// Starts the sandbox's agent; returns its host pid. The agent may not answer yet:
    /// the caller connects with its own deadline.
    async fn launch(&self, spec: &SandboxSpec) -> Result<i32>;
    /// Stages slot `spec` (ADR 0180): booted up to the point where its disk is needed, so
    /// that a later [`Driver::launch`] of it, once its disk is made (a fork's clone), only
    /// attaches the disk and finishes the boot. Tiers without staged slots refuse.
    async fn stage(&self, _spec: &SandboxSpec) -> Result<()> {
        Err(CoreError::Unavailable(format!(
            "the {} tier has no staged slots",
            self.tier()
        )))
    }
    /// Whether `id` is a staged slot waiting for its disk.
    async fn is_staged(&self, _id: &str) -> bool {
        false
    }
    /// A stream to the sandbox's agent (whatever handshake the transport needs is done;
    /// the agent protocol's own is the caller's). Waits, within the caller's deadline,
    /// for an agent that is still starting.
    async fn connect(&self, id: &str) -> Result<AgentStream>;
    async fn freeze(&self, id: &str) -> Result<()>;
    async fn thaw(&self, id: &str) -> Result<()>;
    async fn is_frozen(&self, id: &str) -> Result<bool>;
    /// Ends every process; the disk stays.
    async fn stop(&self, id: &str) -> Result<()>;
    /// Removes everything the sandbox left on the host.
    async fn destroy(&self, id: &str) -> Result<()>;
    /// Applies new resource limits to a running sandbox.
    async fn set_limits(&self, id: &str, limits: &Limits) -> Result<()>;
    /// Memory, CPU and OOM kills of the running sandbox; its disk too when `disk`.
    async fn usage(&self, id: &str, disk: bool) -> Usage;
    /// Whether the sandbox's agent, host pid `pid`, is still alive in the sandbox (it may
    /// be alive and not answering yet).
    async fn agent_alive(&self, id: &str, pid: i32) -> bool;
    /// The end of the agent's own log (its stderr), for a create that failed after the
    /// launch: logged before the sandbox and its files are removed. `None` where the tier
    /// keeps none.
    async fn agent_log_tail(&self, _id: &str) -> Option<String> {
        None
    }
    /// The sandbox's own network namespace, where the daemon makes its egress listeners
    /// (issue 13, ADR 0061), or `None` for a tier without one (the fake runs in the host's:
    /// listeners there would be the host's). Checked against what was recorded at boot, so a
    /// reused pid is never entered.
    async fn egress_netns(
        &self,
        _id: &str,
        _agent_pid: i32,
    ) -> Result<Option<threadbox_sys::net::NetNs>> {
        Ok(None)
    }

    // ---- hibernate (issue 16, ADR 0129) ----

    /// Pushes the memory of the (frozen) sandbox out of RAM; the bytes still charged to it
    /// afterwards. `Unavailable`, with the reason, where the tier or the host cannot
    /// (no swap): never a silent pause instead.
    async fn hibernate(&self, _id: &str) -> Result<u64> {
        Err(CoreError::Unavailable(format!(
            "the {} tier cannot hibernate",
            self.tier()
        )))
    }
    /// Undoes what [`Driver::hibernate`] changed besides the freeze, before the thaw (also
    /// after a hibernate that failed). `Some(pid)`: the wake booted the sandbox's agent
    /// anew (a memory image restored), and this is its host pid.
    async fn wake(&self, _spec: &SandboxSpec) -> Result<Option<i32>> {
        Ok(None)
    }
    /// After a daemon restart: whether the sandbox is hibernated in a complete memory
    /// image with nothing of it running (a [`capability::HIBERNATE_IMAGE`] tier; what an
    /// interrupted wake left running is ended, the image being the truth).
    async fn recover_hibernated(&self, _id: &str) -> bool {
        false
    }

    // ---- checkpoints (issue 14, ADR 0100): clones of the whole disk ----

    /// Writes back what the sandbox's processes wrote (agent `agent_pid`), so a freeze that
    /// follows only waits for what is written meanwhile.
    async fn sync_disk(&self, _id: &str, _agent_pid: Option<i32>) -> Result<()> {
        Ok(())
    }
    /// Clones the sandbox's disk into checkpoint `ckpt` (the sandbox is frozen or stopped;
    /// `agent_pid` is its agent when it runs, whose file system is synced first).
    async fn checkpoint_disk(
        &self,
        _id: &str,
        _ckpt: &str,
        _agent_pid: Option<i32>,
    ) -> Result<DiskClone> {
        Err(no_checkpoints(self.tier()))
    }
    /// Replaces the (stopped) sandbox's disk by a clone of its checkpoint `ckpt`, atomically.
    async fn restore_disk(&self, _id: &str, _ckpt: &str) -> Result<()> {
        Err(no_checkpoints(self.tier()))
    }
    /// Creates `spec`'s disk as a clone of checkpoint `ckpt` of sandbox `from` (index
    /// `from_index`), instead of [`Driver::prepare`]: a fork's disk.
    async fn fork_disk(
        &self,
        _spec: &SandboxSpec,
        _from: &str,
        _from_index: u32,
        _ckpt: &str,
    ) -> Result<()> {
        Err(no_checkpoints(self.tier()))
    }
    /// Removes checkpoint `ckpt`'s disk (absent: Ok).
    async fn remove_checkpoint_disk(&self, _id: &str, _ckpt: &str) -> Result<()> {
        Ok(())
    }
    /// The checkpoints whose disks exist for sandbox `id` (for reconciliation).
    async fn checkpoint_disks(&self, _id: &str) -> Vec<String> {
        Vec::new()
    }

    // ---- fork with memory (issue 16 scope 4, ADR 0136; `capability::FORK_MEMORY`) ----

    /// Saves the running sandbox's memory and processes as fork image `ckpt`, with its disk
    /// cloned into checkpoint `ckpt` at the same instant, then lets it run on. The manager
    /// has told its agent to let go of host sockets (`PrepareCheckpoint`). The sandbox's
    /// agent pid afterwards (a tier may restore it as a new process).
    /// Why sandbox `id` cannot be forked with memory now (`None`: it can), e.g. a gvisor
    /// sandbox on a host network runsc cannot save.
    async fn fork_memory_refusal(&self, _id: &str) -> Option<String> {
        Some(format!("the {} tier forks disks only", self.tier()))
    }
    async fn fork_checkpoint(&self, _spec: &SandboxSpec, _ckpt: &str) -> Result<i32> {
        Err(no_fork_memory(self.tier()))
    }
    /// Boots `spec` (its disk made by [`Driver::fork_disk`] from the same `ckpt`) from fork
    /// image `ckpt` of sandbox `from`: the parent's processes go on in it, under `spec`'s
    /// hostname. Instead of [`Driver::launch`]; returns the agent's host pid.
    async fn launch_fork(&self, _spec: &SandboxSpec, _from: &str, _ckpt: &str) -> Result<i32> {
        Err(no_fork_memory(self.tier()))
    }
    /// Removes fork image `ckpt` of sandbox `id` (absent: Ok).
    async fn remove_fork_image(&self, _id: &str, _ckpt: &str) -> Result<()> {
        Ok(())
    }

    // ---- checkpoints with memory (issue 16 scope 4, ADR 0195; `capability::CHECKPOINT_MEMORY`) ----

    /// Saves the running sandbox's memory and processes as the memory image of checkpoint
    /// `ckpt`, with its disk cloned into `ckpt` at the same instant, then lets it run on (the
    /// manager has sent `PrepareCheckpoint`). The image is whole or absent, and made before
    /// the clone; [`Driver::remove_checkpoint_disk`] removes both.
    async fn checkpoint_with_memory(
        &self,
        _spec: &SandboxSpec,
        _ckpt: &str,
    ) -> Result<MemorySaved> {
        Err(no_checkpoint_memory(self.tier()))
    }
    /// Boots `spec` (stopped, its disk just restored from `ckpt`) from checkpoint `ckpt`'s
    /// memory image instead of [`Driver::launch`]: its processes go on from that instant.
    /// The image is kept (a checkpoint can be rewound to again). The agent's host pid.
    async fn boot_memory_checkpoint(&self, _spec: &SandboxSpec, _ckpt: &str) -> Result<i32> {
        Err(no_checkpoint_memory(self.tier()))
    }
    /// The checkpoints of sandbox `id` whose memory image is whole (for reconciliation;
    /// half-written ones are removed).
    async fn memory_checkpoints(&self, _id: &str) -> Vec<String> {
        Vec::new()
    }
    /// The host pid of sandbox `id`'s agent as the tier sees it now, where a tier can
    /// restore it as a new process (a memory image): reconciliation records it when it
    /// differs from the row's (a daemon killed between a restore and its record).
    async fn current_agent_pid(&self, _id: &str) -> Option<i32> {
        None
    }

    // ---- templates (issue 14 scope 5, ADR 0110): named clones new sandboxes start from ----

    /// Clones checkpoint `ckpt` of sandbox `from` (index `from_index`) into template `tpl`'s
    /// disk, whole or not at all; the disk records whose uid range its owners are in.
    async fn save_template_disk(
        &self,
        _from: &str,
        _from_index: u32,
        _ckpt: &str,
        _tpl: &str,
    ) -> Result<DiskClone> {
        Err(no_checkpoints(self.tier()))
    }
    /// Creates `spec`'s disk as a clone of template `tpl`'s, instead of [`Driver::prepare`].
    async fn template_disk(&self, _spec: &SandboxSpec, _tpl: &str) -> Result<()> {
        Err(no_checkpoints(self.tier()))
    }
    /// Removes template `tpl`'s disk (absent: Ok).
    async fn remove_template_disk(&self, _tpl: &str) -> Result<()> {
        Ok(())
    }
    /// The templates whose disks exist (for reconciliation); half-made ones are removed.
    async fn template_disks(&self) -> Vec<String> {
        Vec::new()
    }
}

/// What [`Driver::checkpoint_with_memory`] made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemorySaved {
    /// The sandbox's agent pid afterwards (restored as a new process).
    pub pid: i32,
    /// The disk's clone.
    pub disk: DiskClone,
    /// Bytes of the memory image.
    pub image_bytes: u64,
}

/// A clone of a sandbox's disk (ADR 0100).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskClone {
    /// Bytes the clone occupies (allocated; shared with the source under reflink).
    pub bytes: u64,
    /// `reflink` (nothing copied) or `copy`.
    pub method: &'static str,
}

fn no_fork_memory(tier: &str) -> CoreError {
    CoreError::InvalidArgument(format!(
        "the {tier} tier forks disks only (no \"fork_memory\" capability; see GET /v1/tiers): \
         pass with_memory=false"
    ))
}

fn no_checkpoint_memory(tier: &str) -> CoreError {
    CoreError::InvalidArgument(format!(
        "the {tier} tier checkpoints disks only (no \"checkpoint_memory\" capability; see GET \
         /v1/tiers): pass with_memory=false"
    ))
}

fn no_checkpoints(tier: &str) -> CoreError {
    CoreError::InvalidArgument(format!("the {tier} tier has no checkpoints"))
}

/// Runs blocking driver work on tokio's blocking pool.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| CoreError::Internal(format!("blocking task failed: {e}")))?
}

/// The drivers of a daemon, one per tier; the first one given is the default tier.
#[derive(Clone)]
pub struct Drivers {
    default: &'static str,
    by_tier: std::collections::BTreeMap<&'static str, Arc<dyn Driver>>,
}

impl Drivers {
    /// A registry holding `default`, the tier of sandboxes whose create names none.
    pub fn new(default: Arc<dyn Driver>) -> Drivers {
        let mut by_tier = std::collections::BTreeMap::new();
        let tier = default.tier();
        by_tier.insert(tier, default);
        Drivers {
            default: tier,
            by_tier,
        }
    }

    /// Adds another tier (refused if that tier exists).
    pub fn register(&mut self, driver: Arc<dyn Driver>) -> Result<()> {
        let tier = driver.tier();
        if self.by_tier.contains_key(tier) {
            return Err(CoreError::Internal(format!("tier {tier} registered twice")));
        }
        self.by_tier.insert(tier, driver);
        Ok(())
    }

    /// The tier of sandboxes whose create names none.
    pub fn default_tier(&self) -> &'static str {
        self.default
    }

    /// The driver of `tier`; `invalid_argument` naming the known tiers otherwise.
    pub fn get(&self, tier: &str) -> Result<Arc<dyn Driver>> {
        self.by_tier.get(tier).cloned().ok_or_else(|| {
            CoreError::InvalidArgument(format!(
                "unknown tier {tier:?}; this daemon has: {}",
                self.tiers().join(", ")
            ))
        })
    }

    /// Every driver, by tier name.
    pub fn all(&self) -> Vec<Arc<dyn Driver>> {
        self.by_tier.values().cloned().collect()
    }

    pub fn tiers(&self) -> Vec<&'static str> {
        self.by_tier.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeDriver;

    fn fake(tier: &'static str) -> Arc<dyn Driver> {
        Arc::new(FakeDriver::new("/nonexistent", "/nonexistent").with_tier(tier))
    }

    #[test]
    fn the_first_tier_is_the_default_and_tiers_are_unique() {
        let mut d = Drivers::new(fake("jail"));
        assert_eq!(d.default_tier(), "jail");
        d.register(fake("fake")).unwrap();
        assert_eq!(d.default_tier(), "jail", "registering keeps the default");
        assert_eq!(d.tiers(), vec!["fake", "jail"]);
        assert_eq!(d.get("fake").unwrap().tier(), "fake");
        assert!(d.register(fake("fake")).is_err(), "a tier registered twice");
        let err = d.get("vm").err().expect("unknown tier");
        assert!(
            matches!(&err, CoreError::InvalidArgument(m) if m.contains("fake, jail")),
            "{err}"
        );
        assert_eq!(Drivers::new(fake("fake")).default_tier(), "fake");
    }
}
