//! Disk checkpoints, rewind, fork and templates on the gvisor tier (issue 16 scope 4,
//! ADR 0135): the jail's reflink clones of the same ext4 image (ADR 0100), with two
//! differences.
//!
//! - **Sync.** The sandbox's root is mounted in the launch helper's mount namespace, not
//!   the host's, and the sentry's host pid (the one the manager records) is chrooted into
//!   an empty directory: the file system to `syncfs` is reached through the *gofer*'s
//!   `/proc/<pid>/root` (runsc's state file names it; it must be alive in the sandbox's
//!   cgroup). The sentry writes through to the gofer's host files (`write(2)` and shared
//!   mappings alike, measured), so what it holds back is metadata it caches; before the
//!   freeze a `sync` inside the sentry (`runsc exec … agent --sync`) pushes that out too.
//! - **Ids on disk.** gVisor maps no ids: a file of the sandbox's `user` is uid 1000 on
//!   the image, whatever the slot. Forks and templates record host uid base 0, so no
//!   idmapped mount (ADR 0102) and no owner shift ever applies to a gvisor disk.

use super::{run_bounded, Gvisor, AGENT_INSIDE};
use std::path::Path;
use std::time::Duration;
use threadbox_core::driver::DiskClone;
use threadbox_core::error::{CoreError, Result};

/// The host uid base a gvisor disk's owners are stored relative to: none is mapped.
pub(super) const IDENTITY_BASE: u32 = 0;

/// Longest the in-sentry `sync` may take before the checkpoint goes on without it (it
/// runs inside the sandbox, which may be at its limits).
const SENTRY_SYNC_DEADLINE: Duration = Duration::from_secs(10);

impl Gvisor {
    /// The gofer's host pid (runsc's state file), if it is alive in the sandbox's cgroup:
    /// the one process whose root is the sandbox's overlay.
    fn gofer_pid(&self, id: &str) -> Option<i32> {
        let path = self.state_dir().join(format!("{id}_sandbox:{id}.state"));
        let state: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        let pid = i32::try_from(state["goferPid"].as_i64()?)
            .ok()
            .filter(|p| *p > 0)?;
        self.j().agent_alive(id, pid).then_some(pid)
    }

    /// `syncfs` of the sandbox's root as the gofer serves it (overlayfs syncs its upper,
    /// the ext4 of the image, which flushes the loop device into the image file). Nothing
    /// runs (stopped, hibernated): the file system is unmounted, hence synced.
    fn sync_host(&self, id: &str) -> Result<()> {
        let Some(pid) = self.gofer_pid(id) else {
            return Ok(());
        };
        threadbox_sys::clonefile::syncfs(Path::new(&format!("/proc/{pid}/root/")))
            .map_err(|e| CoreError::Internal(format!("sync the disk of {id}: {e}")))
    }

    /// Before the freeze: the sentry's own `sync` (best effort: a sandbox at its pids
    /// limit cannot start it, and what it would flush is cached metadata), then the host's.
    pub(super) fn sync_disk(&self, id: &str, agent_pid: Option<i32>) -> Result<()> {
        if agent_pid.is_none() {
            return Ok(());
        }
        if let Ok(info) = self.runsc() {
            let cmd = self.runsc_cmd(&info, &["exec", id, AGENT_INSIDE, "--sync"]);
            if let Err(e) = run_bounded(cmd, SENTRY_SYNC_DEADLINE) {
                tracing::warn!(sandbox = id, "sync inside the sentry failed: {e}");
            }
        }
        self.sync_host(id)
    }

    /// The clone, with the sandbox frozen (or not running).
    pub(super) fn checkpoint_disk(
        &self,
        id: &str,
        ckpt: &str,
        agent_pid: Option<i32>,
    ) -> Result<DiskClone> {
        if agent_pid.is_some() {
            self.sync_host(id)?;
        }
        self.j().clone_checkpoint(id, ckpt)
    }

    pub(super) fn fork_disk(&self, id: &str, from: &str, ckpt: &str) -> Result<()> {
        self.j().fork_disk_stored_at(id, from, ckpt, IDENTITY_BASE)
    }

    pub(super) fn save_template_disk(
        &self,
        from: &str,
        ckpt: &str,
        tpl: &str,
    ) -> Result<DiskClone> {
        self.j()
            .save_template_disk_stored_at(from, ckpt, tpl, IDENTITY_BASE)
    }

    pub(super) fn template_disk(&self, id: &str, tpl: &str) -> Result<()> {
        self.j().template_disk_to(id, IDENTITY_BASE, tpl)
    }
}
