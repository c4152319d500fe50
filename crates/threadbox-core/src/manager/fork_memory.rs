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

/// Whether this fork takes memory, given the parent as it is under its lifecycle lock and
/// why its driver cannot fork it with memory (`refusal`): unset means "where the tier can,
/// the parent runs and nothing refuses".
pub(super) fn with_memory(
    req: &ForkRequest,
    parent: &SandboxRow,
    tier_can: bool,
    refusal: Option<String>,
) -> Result<bool> {
    let running = parent.state == State::Running;
    match (req.with_memory, refusal) {
        (Some(false), _) => Ok(false),
        (None, refusal) => Ok(tier_can && req.checkpoint.is_none() && running && refusal.is_none()),
        (Some(true), Some(why)) => Err(CoreError::InvalidArgument(format!(
            "sandbox {} cannot be forked with memory: {why}; pass with_memory=false",
            parent.id
        ))),
        (Some(true), None) if running => Ok(true),
        (Some(true), None) => Err(CoreError::Conflict(format!(
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
        let ckpt = ckpt.to_string();
        self.save_running_memory(parent, live, "fork with memory", move |d, spec| async move {
            d.fork_checkpoint(&spec, &ckpt).await.map(|pid| (pid, ()))
        })
        .await
    }

    /// The shared part of every save of a running sandbox's memory (fork with memory, ADR
    /// 0136; checkpoint with memory, ADR 0195): its agent prepared (`PrepareCheckpoint`),
    /// then `save` (the driver's checkpoint, which ends and restores it), then the new
    /// agent pid recorded. A failure that ended its processes is recorded as `stopped`
    /// (its disk kept), as a failed hibernate is; one before that leaves it running.
    /// Caller holds the lifecycle lock. `what` names the operation in errors and logs.
    pub(super) async fn save_running_memory<T, F, Fut>(
        &self,
        parent: &SandboxRow,
        live: &Live,
        what: &str,
        save: F,
    ) -> Result<T>
    where
        F: FnOnce(Arc<dyn Driver>, SandboxSpec) -> Fut,
        Fut: std::future::Future<Output = Result<(i32, T)>>,
    {
        let driver = self.driver_for(parent)?;
        let spec = self.spec_of(parent).await?;
        if let Err(e) = self.prepare_for_checkpoint(parent, live).await {
            // No image was made: the agent is told to bind again.
            if let Err(t) = driver.wake(&spec).await {
                tracing::error!(sandbox = %parent.id, "could not undo the prepare of a {what}: {t}");
            }
            return Err(e);
        }
        let started = std::time::Instant::now();
        match save(driver.clone(), spec.clone()).await {
            Ok((pid, out)) => {
                // Its agent restored as a new process: the old connection went with it.
                Self::take_conn(live);
                self.store
                    .transition(&parent.id, &[State::Running], State::Running, Some(pid))
                    .await?;
                tracing::info!(sandbox = %parent.id, ms = started.elapsed().as_millis() as u64, "memory and disk saved ({what}); the sandbox runs on");
                Ok(out)
            }
            Err(e) => {
                let alive = match parent.agent_pid {
                    Some(pid) => driver.agent_alive(&parent.id, pid).await,
                    None => false,
                };
                if alive {
                    // The checkpoint was refused before it stopped anything.
                    let _ = driver.wake(&spec).await;
                    return Err(e);
                }
                // A checkpoint or restore that failed ended the parent's processes: the
                // row says so (its disk is kept), as a failed hibernate does.
                tracing::error!(sandbox = %parent.id, "{what} failed and ended the sandbox: {e}");
                let _ = driver.stop(&parent.id).await;
                self.store
                    .transition(&parent.id, &[State::Running], State::Stopped, None)
                    .await?;
                if let Err(t) = self.store.mark_contexts_lost(&parent.id, "stopped").await {
                    tracing::warn!(sandbox = %parent.id, "marking its contexts lost: {t}");
                }
                Err(CoreError::Internal(format!(
                    "{what} failed and the sandbox's processes ended (it is stopped, its disk \
                     kept): {e}"
                )))
            }
        }
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
