//! Fork with memory (issue 16 scope 4, ADR 0136): on a tier with
//! `capability::FORK_MEMORY` (gvisor), `fork` saves the running parent's memory and
//! processes once, with its disk at the same instant, and boots every fork from that image
//! on its own clone of the disk; each fork has its own id, name, hostname, slot and cgroup.
//! Elsewhere (the jail) a fork has the parent's disk only and says so
//! (`ForkResponse::with_memory`); asking the jail for memory is refused.

use super::*;
use threadbox_api::checkpoints::ForkRequest;

/// Refuses, before anything changes, a fork that asks for memory where it cannot be had:
/// a tier without `fork_memory`, or a source that is a disk checkpoint.
pub(super) fn check_request(req: &ForkRequest, tier: &str, tier_can: bool) -> Result<()> {
    if req.with_memory != Some(true) {
        return Ok(());
    }
    if !tier_can {
        return Err(CoreError::InvalidArgument(format!(
            "the {tier} tier forks disks only (it has no \"fork_memory\" capability; see GET \
             /v1/tiers): pass with_memory=false, or fork a sandbox of the gvisor tier"
        )));
    }
    if req.checkpoint.is_some() {
        return Err(CoreError::InvalidArgument(
            "a checkpoint holds a disk, not memory: a fork from one has with_memory=false".into(),
        ));
    }
    Ok(())
}

/// Whether this fork takes memory, given the parent as it is under its lifecycle lock:
/// unset means "where the tier can and the parent runs".
pub(super) fn with_memory(req: &ForkRequest, parent: &SandboxRow, tier_can: bool) -> Result<bool> {
    let running = parent.state == State::Running;
    match req.with_memory {
        Some(false) => Ok(false),
        None => Ok(tier_can && req.checkpoint.is_none() && running),
        Some(true) if running => Ok(true),
        Some(true) => Err(CoreError::Conflict(format!(
            "sandbox {} is {}: a fork with memory needs it running (resume or start it, or \
             pass with_memory=false)",
            parent.id,
            parent.state.as_str()
        ))),
    }
}

impl Manager {
    /// Saves the running `parent`'s memory and processes as fork image `ckpt` with its disk
    /// at the same instant (checkpoint `ckpt`, no row, as a disk fork's clone); the parent
    /// runs on, possibly as a new agent process, which is recorded. Caller holds the
    /// parent's lifecycle lock.
    pub(super) async fn fork_checkpoint_parent(
        &self,
        parent: &SandboxRow,
        live: &Live,
        ckpt: &str,
    ) -> Result<()> {
        let driver = self.driver_for(parent)?;
        let spec = self.spec_of(parent).await?;
        let pid = driver.fork_checkpoint(&spec, ckpt).await?;
        if Some(pid) != parent.agent_pid {
            // Its agent restored as a new process: the old connection is gone with it.
            Self::take_conn(live);
            self.store
                .transition(&parent.id, &[State::Running], State::Running, Some(pid))
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(with_memory: Option<bool>, checkpoint: Option<&str>) -> ForkRequest {
        ForkRequest {
            with_memory,
            checkpoint: checkpoint.map(str::to_owned),
            ..ForkRequest::default()
        }
    }

    #[test]
    fn memory_is_refused_where_it_cannot_be_had() {
        assert!(check_request(&req(None, None), "jail", false).is_ok());
        assert!(check_request(&req(Some(false), None), "jail", false).is_ok());
        let e = check_request(&req(Some(true), None), "jail", false).unwrap_err();
        assert!(e.to_string().contains("forks disks only"), "{e}");
        assert!(check_request(&req(Some(true), None), "gvisor", true).is_ok());
        assert!(check_request(&req(Some(true), Some("clean")), "gvisor", true).is_err());
        assert!(check_request(&req(None, Some("clean")), "gvisor", true).is_ok());
    }
}
