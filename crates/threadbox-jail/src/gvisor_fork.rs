//! Fork with memory on the gvisor tier (issue 16 scope 4, ADR 0136), on the memory
//! checkpoint primitive of `gvisor_ckpt.rs`:
//!
//! - **The parent, once**: its agent prepared by the manager (synced, host socket let go),
//!   `runsc checkpoint` into `sandboxes/<id>/forks/<ckpt>/` (the container exits), the
//!   processes ended and the disk unmounted, the disk cloned into checkpoint `ckpt` — the
//!   same instant as the memory, since nothing runs — then the parent restored from that
//!   image on its own disk and told to bind again: it runs on, as a new sentry process.
//! - **Each fork**: its disk is the checkpoint's clone (`fork_disk`), then `runsc restore`
//!   of the parent's image into the fork's own container (its id, bundle, overlay upper,
//!   socket directory and cgroup); its hostname set to its own (the image holds the
//!   parent's UTS name) with `runsc exec -cap CAP_SYS_ADMIN … agent --hostname`, and only
//!   then its agent told to bind again, so no call ever sees the parent's name.
//! - The image is removed once every fork has been made (the manager's
//!   `remove_fork_image`): the sentries read it after `restore -detach` returns, until
//!   their agent listens. What a crash leaves under `forks/` is removed at the next start.

use super::Gvisor;
use crate::gvisor::{run_bounded, AGENT_INSIDE, RUNSC_DEADLINE};
use std::path::PathBuf;
use threadbox_core::driver::SandboxSpec;
use threadbox_core::error::{CoreError, Result};

/// Under a sandbox's directory: the memory images of forks being made.
const FORKS_DIR: &str = "forks";

impl Gvisor {
    fn fork_image_dir(&self, id: &str, ckpt: &str) -> Result<PathBuf> {
        crate::checkpoint::check_ckpt(ckpt)?;
        Ok(self.j().paths(id).dir.join(FORKS_DIR).join(ckpt))
    }

    /// Why `id` cannot be forked with memory now.
    pub(super) fn fork_memory_refusal(&self, id: &str) -> Option<String> {
        // runsc cannot save a host network (a sandbox with egress runs on one, ADR 0140).
        self.j()
            .paths(id)
            .run
            .join(crate::NETNS_FILE)
            .exists()
            .then(|| {
                "a gvisor sandbox that uses the network cannot be forked with memory yet \
                 (runsc cannot checkpoint its host network)"
                    .to_string()
            })
    }

    /// The parent's memory and disk at one instant, then the parent restored; its new
    /// sentry pid. An error after the checkpoint stopped it leaves it restored if that
    /// still can be, else not running (the manager records which).
    pub(super) fn fork_checkpoint(&self, spec: &SandboxSpec, ckpt: &str) -> Result<i32> {
        let id = &spec.id;
        if let Some(why) = self.fork_memory_refusal(id) {
            return Err(CoreError::InvalidArgument(why));
        }
        let dir = self.fork_image_dir(id, ckpt)?;
        if let Some(parent) = dir.parent() {
            crate::mkdir(parent)?;
        }
        Self::remove_image_at(&dir);
        let image = self.checkpoint_memory(id, &dir).inspect_err(|_| {
            Self::remove_image_at(&dir);
        })?;
        // Nothing of it runs after this, and its disk is unmounted (synced) once its
        // cgroup is empty: the clone is of the same instant as the memory.
        self.halt(id)?;
        let cloned = self.j().clone_checkpoint(id, ckpt);
        let restored = self.restore_memory(spec, &dir);
        let pid = match (cloned, restored) {
            (Ok(_), Ok(pid)) => pid,
            (Err(e), Ok(_)) => {
                let _ = self.rebind(id);
                Self::remove_image_at(&dir);
                return Err(e);
            }
            (_, Err(e)) => {
                Self::remove_image_at(&dir);
                let _ = self.j().remove_checkpoint_disk(id, ckpt);
                return Err(e);
            }
        };
        self.rebind(id)?;
        // Its sentry reads the image until its agent listens.
        self.wait_listening(id)?;
        tracing::info!(sandbox = %id, bytes = image.bytes, checkpoint_ms = image.ms, "fork image written; the parent runs on");
        Ok(pid)
    }

    /// Boots fork `spec` from `from`'s image `ckpt`, under its own hostname.
    pub(super) fn launch_fork(&self, spec: &SandboxSpec, from: &str, ckpt: &str) -> Result<i32> {
        let dir = self.fork_image_dir(from, ckpt)?;
        let pid = self.restore_memory(spec, &dir)?;
        let named = self.runsc().and_then(|info| {
            let cmd = self.runsc_cmd(
                &info,
                &[
                    "exec",
                    "-cap",
                    "CAP_SYS_ADMIN",
                    &spec.id,
                    AGENT_INSIDE,
                    "--hostname",
                    &spec.hostname,
                ],
            );
            run_bounded(cmd, RUNSC_DEADLINE)
                .map(drop)
                .map_err(|e| CoreError::Internal(format!("set the fork's hostname: {e}")))
        });
        if let Err(e) = named.and_then(|()| self.rebind(&spec.id)) {
            let _ = self.halt(&spec.id);
            return Err(e);
        }
        Ok(pid)
    }

    pub(super) fn remove_fork_image(&self, id: &str, ckpt: &str) -> Result<()> {
        Self::remove_image_at(&self.fork_image_dir(id, ckpt)?);
        Ok(())
    }

    /// At a start: fork images a crash left (a fork removes its own when done).
    pub(super) fn remove_fork_leftovers(&self, id: &str) {
        let dir = self.j().paths(id).dir.join(FORKS_DIR);
        if dir.exists() {
            tracing::info!(sandbox = %id, "removed fork images left by an interrupted fork");
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
