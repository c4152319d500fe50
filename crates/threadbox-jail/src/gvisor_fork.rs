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
use crate::gvisor_ckpt::MemoryImage;
use std::path::{Component, Path, PathBuf};
use std::time::Instant;
use threadbox_core::driver::{DiskClone, SandboxSpec};
use threadbox_core::error::{CoreError, Result};

/// Under a sandbox's directory: the memory images of forks being made.
const FORKS_DIR: &str = "forks";
/// Under a sandbox's directory, while a save with memory runs: the image's directory.
const SAVING_MARKER: &str = "saving-memory";

impl Gvisor {
    fn fork_image_dir(&self, id: &str, ckpt: &str) -> Result<PathBuf> {
        crate::checkpoint::check_ckpt(ckpt)?;
        Ok(self.j().paths(id).dir.join(FORKS_DIR).join(ckpt))
    }

    /// Why `id`'s memory cannot be saved now (fork or checkpoint with memory).
    pub(super) fn fork_memory_refusal(&self, id: &str) -> Option<String> {
        // runsc cannot save a host network (a sandbox with egress runs on one, ADR 0140).
        self.j()
            .paths(id)
            .run
            .join(crate::NETNS_FILE)
            .exists()
            .then(|| {
                "a gvisor sandbox that uses the network cannot have its memory saved yet \
                 (runsc cannot checkpoint its host network)"
                    .to_string()
            })
    }

    /// The parent's memory and disk at one instant, then the parent restored; its new
    /// sentry pid. An error after the checkpoint stopped it leaves it restored if that
    /// still can be, else not running (the manager records which).
    pub(super) fn fork_checkpoint(&self, spec: &SandboxSpec, ckpt: &str) -> Result<i32> {
        let dir = self.fork_image_dir(&spec.id, ckpt)?;
        self.save_with_memory(spec, ckpt, &dir)
            .map(|(pid, _, _)| pid)
    }

    /// Memory into image `dir`, then the disk cloned into checkpoint `ckpt` (nothing runs
    /// between: the same instant), then the sandbox restored from `dir` on its own disk and
    /// listening again: its new sentry pid, the clone and the image. For fork with memory
    /// (`dir` under `forks/`, ADR 0136) and checkpoints with memory (under `memory/`, ADR
    /// 0195). While it runs, `sandboxes/<id>/saving-memory` names `dir`: a daemon killed
    /// in between finds the sandbox not running with its processes whole in `dir`, and the
    /// next start makes it hibernated from that image ([`Gvisor::recover_interrupted_save`]).
    pub(crate) fn save_with_memory(
        &self,
        spec: &SandboxSpec,
        ckpt: &str,
        dir: &Path,
    ) -> Result<(i32, DiskClone, MemoryImage)> {
        let id = &spec.id;
        if let Some(why) = self.fork_memory_refusal(id) {
            return Err(CoreError::InvalidArgument(why));
        }
        if let Some(parent) = dir.parent() {
            crate::mkdir(parent)?;
        }
        Self::remove_image_at(dir);
        self.mark_saving(id, dir)?;
        tracing::info!(sandbox = %id, image = %dir.display(), "saving memory and disk");
        let out = self.save_marked(spec, ckpt, dir);
        // Whatever happened, it is over: the sandbox runs on, or the manager records that
        // it does not.
        self.unmark_saving(id);
        out
    }

    fn save_marked(
        &self,
        spec: &SandboxSpec,
        ckpt: &str,
        dir: &Path,
    ) -> Result<(i32, DiskClone, MemoryImage)> {
        let id = &spec.id;
        let t0 = Instant::now();
        let image = self.checkpoint_memory(id, dir).inspect_err(|_| {
            Self::remove_image_at(dir);
        })?;
        let t1 = Instant::now();
        // Nothing of it runs after this, and its disk is unmounted (synced) once its
        // cgroup is empty: the clone is of the same instant as the memory.
        self.halt(id)?;
        let t2 = Instant::now();
        let cloned = self.j().clone_checkpoint(id, ckpt);
        let t3 = Instant::now();
        let restored = self.restore_memory(spec, dir);
        let (pid, clone) = match (cloned, restored) {
            (Ok(clone), Ok(pid)) => (pid, clone),
            (Err(e), Ok(_)) => {
                let _ = self.rebind(id);
                Self::remove_image_at(dir);
                return Err(e);
            }
            (_, Err(e)) => {
                Self::remove_image_at(dir);
                let _ = self.j().remove_checkpoint_disk(id, ckpt);
                return Err(e);
            }
        };
        let t4 = Instant::now();
        self.rebind(id)?;
        // Its sentry reads the image until its agent listens.
        self.wait_listening(id)?;
        let ms = |a: Instant, b: Instant| (b - a).as_millis() as u64;
        tracing::info!(sandbox = %id, bytes = image.bytes, checkpoint_ms = ms(t0, t1),
            halt_ms = ms(t1, t2), clone_ms = ms(t2, t3), restore_ms = ms(t3, t4),
            listen_ms = ms(t4, Instant::now()), "memory image written; the sandbox runs on");
        Ok((pid, clone, image))
    }

    fn saving_marker(&self, id: &str) -> PathBuf {
        self.j().paths(id).dir.join(SAVING_MARKER)
    }

    /// Records, durably, that a save into `dir` is under way.
    fn mark_saving(&self, id: &str, dir: &Path) -> Result<()> {
        let marker = self.saving_marker(id);
        let tmp = marker.with_extension("tmp");
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(dir.as_os_str().as_encoded_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &marker)?;
        if let Some(parent) = marker.parent() {
            std::fs::File::open(parent)?.sync_all()?;
        }
        Ok(())
    }

    fn unmark_saving(&self, id: &str) {
        let _ = std::fs::remove_file(self.saving_marker(id));
    }

    /// Whether the sentry of `id` runs now (the one runsc's state names, in its cgroup).
    pub(crate) fn sentry_alive(&self, id: &str) -> bool {
        self.current_sentry(id).is_some()
    }

    /// The live sentry's host pid of `id`, if one runs.
    pub(crate) fn current_sentry(&self, id: &str) -> Option<i32> {
        let info = self.runsc().ok()?;
        let known = std::fs::read_dir(self.state_dir()).is_ok_and(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().contains(id))
        });
        if !known {
            return None;
        }
        let pid = self.sentry_pid(&info, id).ok()?;
        self.j().agent_alive(id, pid).then_some(pid)
    }

    /// At a start, before anything else looks at `id`: a save with memory a killed daemon
    /// left (its marker). Once the checkpoint or restore it started has run to its end (the
    /// image's lock): a sandbox running again is left to run (told to bind again, as its
    /// daemon may not have); one that is not, with its processes whole in the image (its
    /// disk untouched since: nothing ran), gets that image as its hibernate image, so it is
    /// recorded hibernated and the next call wakes it. True when it became so.
    pub(crate) fn recover_interrupted_save(&self, id: &str) -> bool {
        let marker = self.saving_marker(id);
        let Ok(bytes) = std::fs::read(&marker) else {
            let _ = std::fs::remove_file(marker.with_extension("tmp"));
            return false;
        };
        let dir = PathBuf::from(String::from_utf8_lossy(&bytes).into_owned());
        // Only a directory of this sandbox's, as this daemon writes them.
        let ours = dir.starts_with(self.j().paths(id).dir)
            && dir
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
        if ours && crate::gvisor_ckpt::lock_of(&dir).exists() {
            crate::gvisor_ckpt::wait_unlocked(&dir);
        }
        let hibernated = if !ours {
            false
        } else if self.sentry_alive(id) {
            if let Err(e) = self.rebind(id) {
                tracing::warn!(sandbox = %id, "after an interrupted save: {e}");
            }
            tracing::info!(sandbox = %id, "an interrupted save with memory: the sandbox runs again");
            false
        } else if Self::is_memory_image(&dir) {
            // Nothing half-running is left, then the image becomes the hibernate image.
            let _ = self.halt(id);
            let hib = self.memory_image_dir(id);
            Self::remove_image_at(&hib);
            match std::fs::rename(&dir, &hib) {
                Ok(()) => {
                    // Its lock (and any temp) stay behind under the old name.
                    Self::remove_image_at(&dir);
                    tracing::warn!(sandbox = %id, "an interrupted save with memory left the sandbox not running: hibernated from its image");
                    true
                }
                Err(e) => {
                    tracing::error!(sandbox = %id, "keeping the image of an interrupted save: {e}");
                    false
                }
            }
        } else {
            false
        };
        let _ = std::fs::remove_file(&marker);
        hibernated
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
