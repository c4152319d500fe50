//! Checkpoints with memory and the rewind to them (issue 16 scope 4, ADR 0195): on a tier
//! with `capability::CHECKPOINT_MEMORY` (gvisor), `checkpoint --with-memory` keeps the
//! sandbox's memory and processes in an image beside the disk's clone, both of the same
//! instant (the sandbox's processes stand still between them), and a rewind to such a
//! checkpoint boots the sandbox from that image on the restored disk: its processes go on
//! from where they were. Elsewhere (the jail) `with_memory` is refused before anything
//! changes; a disk-only checkpoint rewinds as always (a fresh boot).

use super::*;
use crate::driver::{capability, DiskClone, MemorySaved};

/// Refuses, before anything changes, a checkpoint with memory on a tier without it.
pub(super) fn check_request(with_memory: bool, tier: &str, tier_can: bool) -> Result<()> {
    if with_memory && !tier_can {
        return Err(CoreError::InvalidArgument(format!(
            "the {tier} tier checkpoints disks only (it has no \"checkpoint_memory\" capability; \
             see GET /v1/tiers): pass with_memory=false, or use a sandbox of the gvisor tier"
        )));
    }
    Ok(())
}

/// Whether `row` (under its lifecycle lock) can have its memory saved now; `refusal` is
/// its driver's reason why not (a gvisor sandbox on a host network).
pub(super) fn check_state(row: &SandboxRow, refusal: Option<String>) -> Result<()> {
    if let Some(why) = refusal {
        return Err(CoreError::InvalidArgument(format!(
            "sandbox {} cannot be checkpointed with memory: {why}; pass with_memory=false",
            row.id
        )));
    }
    if row.state != State::Running {
        return Err(CoreError::Conflict(format!(
            "sandbox {} is {}: a checkpoint with memory needs it running (resume or start it, \
             or pass with_memory=false)",
            row.id,
            row.state.as_str()
        )));
    }
    Ok(())
}

impl Manager {
    /// Whether `row`'s tier can checkpoint memory.
    pub(super) fn tier_checkpoints_memory(&self, row: &SandboxRow) -> Result<bool> {
        Ok(self
            .driver_for(row)?
            .capabilities()
            .contains(&capability::CHECKPOINT_MEMORY))
    }

    /// Saves running `row`'s memory and disk as checkpoint `ckpt` (no row yet: the caller
    /// inserts it after): the clone, with the image's bytes added, and the image's bytes.
    /// Caller holds the lifecycle lock.
    pub(super) async fn checkpoint_memory_of(
        &self,
        row: &SandboxRow,
        live: &Live,
        ckpt: &str,
    ) -> Result<(DiskClone, u64)> {
        let refusal = self.driver_for(row)?.fork_memory_refusal(&row.id).await;
        check_state(row, refusal)?;
        let ckpt = ckpt.to_string();
        let saved: MemorySaved = self
            .save_running_memory(
                row,
                live,
                "checkpoint with memory",
                move |d, spec| async move {
                    d.checkpoint_with_memory(&spec, &ckpt)
                        .await
                        .map(|s| (s.pid, s))
                },
            )
            .await?;
        Ok((
            DiskClone {
                bytes: saved.disk.bytes.saturating_add(saved.image_bytes),
                method: saved.disk.method,
            },
            saved.image_bytes,
        ))
    }

    /// A rewind's start from checkpoint `ckpt`'s memory image: `row` is stopped on the
    /// disk restored from `ckpt`; it boots (as `Op::Start` does: admission, `creating`,
    /// then `running` or back to `stopped`) from the image instead of afresh.
    pub(super) async fn start_from_memory(
        &self,
        row: &SandboxRow,
        live: &Live,
        ckpt: &str,
    ) -> Result<()> {
        let step = state::plan(&row.id, row.state, Op::Start)?;
        if step != Step::Boot {
            return Err(CoreError::Internal(format!(
                "sandbox {} is {} after its rewind's stop",
                row.id,
                row.state.as_str()
            )));
        }
        let (from, _) = step.transition();
        {
            let _adm = self.gov.admission.lock().await;
            self.admit(&row.tenant, Admit::Run).await?;
            self.store
                .transition(&row.id, from, State::Creating, None)
                .await?;
        }
        match self.boot_from(row, live, Launch::Memory(ckpt)).await {
            Ok(pid) => {
                self.store
                    .transition(&row.id, &[State::Creating], State::Running, Some(pid))
                    .await?;
                tracing::info!(sandbox = %row.id, agent_pid = pid, checkpoint = %ckpt, "started from the checkpoint's memory");
                Ok(())
            }
            Err(e) => {
                self.store
                    .transition(&row.id, &[State::Creating], State::Stopped, None)
                    .await?;
                Err(e)
            }
        }
    }

    /// After a crash: a checkpoint row that claims memory without a whole image is made
    /// disk-only (a rewind to it boots afresh). Images without a row go with their clone
    /// (`reconcile_checkpoints` removes the clone, the driver the image with it).
    pub(super) async fn reconcile_checkpoint_memory(
        &self,
        sb: &SandboxRow,
        rows: &[crate::store_checkpoints::CheckpointRow],
    ) -> Result<()> {
        if !rows
            .iter()
            .any(|c| c.sandbox == sb.id && c.memory_bytes.is_some())
        {
            return Ok(());
        }
        let images = self.driver_for(sb)?.memory_checkpoints(&sb.id).await;
        for c in rows
            .iter()
            .filter(|c| c.sandbox == sb.id && c.memory_bytes.is_some())
        {
            if !images.contains(&c.id) {
                tracing::warn!(sandbox = %sb.id, checkpoint = %c.id, "checkpoint without its memory image: now disk-only");
                self.store.forget_checkpoint_memory(&c.id).await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_refused_on_a_tier_without_it() {
        assert!(check_request(false, "jail", false).is_ok());
        assert!(check_request(true, "gvisor", true).is_ok());
        let e = check_request(true, "jail", false).unwrap_err();
        assert!(matches!(e, CoreError::InvalidArgument(_)), "{e:?}");
        assert!(e.to_string().contains("checkpoints disks only"), "{e}");
    }
}
