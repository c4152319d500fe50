//! Checkpoints, rewind and fork of a sandbox's disk (issue 14, ADR 0100). The disk is
//! cloned by the driver (a reflink of the jail's ext4 image); the sandbox is frozen for
//! the instant of the clone. The file is made before the row and removed after it, so a
//! row always has its clone; `reconcile_checkpoints` removes what a crash left between.

use super::*;
use crate::store_checkpoints::CheckpointRow;
use threadbox_api::checkpoints::*;

/// Most forks one call makes.
pub const MAX_FORKS: u32 = 16;

/// Where a new sandbox's disk comes from when it is a fork: checkpoint `ckpt` of `from`.
pub(super) struct ForkSource {
    pub from: String,
    pub from_index: u32,
    pub ckpt: String,
    /// Boot each fork from the parent's fork image `ckpt` (memory and processes, ADR
    /// 0136) rather than afresh on the cloned disk.
    pub memory: bool,
}

fn validate_label(label: &str) -> Result<()> {
    let ok = !label.is_empty()
        && label.len() <= 128
        && label
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !label.starts_with("ck-");
    if ok {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "checkpoint label {label:?} must be 1-128 characters of a-z, A-Z, 0-9, '-', '_', \
             '.' and not start with 'ck-'"
        )))
    }
}

/// The forks' names: exact ones, `<prefix>-1` … `<prefix>-N`, or none.
fn fork_names(req: &ForkRequest) -> Result<Vec<Option<String>>> {
    let names: Vec<Option<String>> = match (&req.names, &req.name_prefix) {
        (Some(_), Some(_)) => {
            return Err(CoreError::InvalidArgument(
                "give names or name_prefix, not both".into(),
            ))
        }
        (Some(names), None) => {
            if req.count.is_some_and(|c| c as usize != names.len()) {
                return Err(CoreError::InvalidArgument(format!(
                    "count is {} but {} names were given",
                    req.count.unwrap_or_default(),
                    names.len()
                )));
            }
            names.iter().cloned().map(Some).collect()
        }
        (None, prefix) => {
            let count = req.count.unwrap_or(1);
            (1..=count)
                .map(|i| prefix.as_ref().map(|p| format!("{p}-{i}")))
                .collect()
        }
    };
    if !(1..=MAX_FORKS as usize).contains(&names.len()) {
        return Err(CoreError::InvalidArgument(format!(
            "count must be between 1 and {MAX_FORKS}"
        )));
    }
    for (i, n) in names.iter().enumerate() {
        if let Some(n) = n {
            validate_name(n)?;
            if names[..i].iter().flatten().any(|m| m == n) {
                return Err(CoreError::InvalidArgument(format!(
                    "fork name {n:?} is given twice"
                )));
            }
        }
    }
    Ok(names)
}

fn to_api_ckpt(c: &CheckpointRow) -> Checkpoint {
    Checkpoint {
        id: c.id.clone(),
        sandbox: c.sandbox.clone(),
        label: c.label.clone(),
        parent: c.parent.clone(),
        size_bytes: c.size_bytes,
        method: c.method.clone(),
        created_at: rfc3339(c.created_at),
        with_memory: c.memory_bytes.is_some(),
        memory_bytes: c.memory_bytes,
    }
}

/// The checkpoint of `rows` named `name` (label or id).
fn find<'a>(rows: &'a [CheckpointRow], sandbox: &str, name: &str) -> Result<&'a CheckpointRow> {
    rows.iter()
        .find(|c| c.id == name || c.label.as_deref() == Some(name))
        .ok_or_else(|| CoreError::NotFound(format!("checkpoint {name:?} of sandbox {sandbox}")))
}

impl Manager {
    /// Clones `row`'s disk into `ckpt` with its processes frozen for the instant (a paused
    /// sandbox is frozen already, a stopped one has none). Caller holds the lifecycle lock.
    pub(super) async fn clone_disk_frozen(
        &self,
        row: &SandboxRow,
        ckpt: &str,
    ) -> Result<crate::driver::DiskClone> {
        let driver = self.driver_for(row)?;
        match row.state {
            State::Running => {
                // What was written before the freeze goes to disk while it still runs.
                driver.sync_disk(&row.id, row.agent_pid).await?;
                driver.freeze(&row.id).await.inspect_err(|_| {
                    let (d, id) = (driver.clone(), row.id.clone());
                    // A freeze that timed out leaves cgroup.freeze set: undo it (F2).
                    tokio::spawn(async move { d.thaw(&id).await });
                })?;
                let frozen = std::time::Instant::now();
                let out = driver.checkpoint_disk(&row.id, ckpt, row.agent_pid).await;
                let thawed = driver.thaw(&row.id).await;
                // How long the sandbox's processes stood still (the bench reads it).
                tracing::info!(sandbox = %row.id, checkpoint = %ckpt, frozen_us = frozen.elapsed().as_micros() as u64, "disk cloned while frozen");
                let out = out?;
                thawed?;
                Ok(out)
            }
            State::Paused | State::Hibernated => {
                driver.checkpoint_disk(&row.id, ckpt, row.agent_pid).await
            }
            State::Stopped => driver.checkpoint_disk(&row.id, ckpt, None).await,
            State::Creating | State::Deleting => Err(CoreError::Conflict(format!(
                "sandbox {} is {}; try again when it is running or stopped",
                row.id,
                row.state.as_str()
            ))),
        }
    }

    /// The bytes the tenant's disk quota still has room for, `None` without a quota.
    pub(super) async fn disk_room(&self, tenant: &str) -> Result<Option<u64>> {
        let Some(limit) = self.cached_quota(tenant).await?.and_then(|q| q.disk_bytes) else {
            return Ok(None);
        };
        let allocated = self.store.allocated_disk_of(tenant).await?.max(0) as u64;
        Ok(Some(limit.saturating_sub(allocated)))
    }

    /// Refuses, before anything is made, a clone of `row`'s disk (`what`: a checkpoint or
    /// a template) that cannot fit in `room` (ADR 0165): a clone's allocated size is the
    /// disk's at that instant, which the driver reads now (a stat). Writes between this
    /// and the clone can still make it larger: the caller checks the clone's size again.
    pub(super) async fn refuse_clone_over_room(
        &self,
        row: &SandboxRow,
        room: Option<u64>,
        what: &str,
    ) -> Result<()> {
        let Some(left) = room else { return Ok(()) };
        let now = self
            .driver_for(row)?
            .usage(&row.id, true)
            .await
            .disk_bytes
            .unwrap_or(0);
        if now > left || left == 0 {
            let held = self.store.disk_split_of(&row.tenant, true).await?;
            return Err(CoreError::QuotaExceeded {
                tenant: row.tenant.clone(),
                quota: "disk_bytes",
                used: format!(
                    "{now} bytes for the {what} (the disk of sandbox {} now), {} held ({})",
                    row.id,
                    held.total(),
                    held.parts()
                ),
                limit: format!("{left} bytes left"),
                extra: "; delete templates, checkpoints or sandboxes".into(),
            });
        }
        Ok(())
    }

    pub async fn create_checkpoint(
        &self,
        caller: &Caller,
        op: CreateCheckpoint,
    ) -> Result<Checkpoint> {
        let r = self.create_checkpoint_inner(caller, &op).await;
        self.audit(caller, CreateCheckpoint::NAME, &op.sandbox, &r)
            .await;
        r
    }

    async fn create_checkpoint_inner(
        &self,
        caller: &Caller,
        op: &CreateCheckpoint,
    ) -> Result<Checkpoint> {
        caller.require(CreateCheckpoint::SCOPE)?;
        if let Some(l) = &op.request.label {
            validate_label(l)?;
        }
        let row = self.resolve(caller, &op.sandbox).await?;
        // Refused before anything changes: memory asked of a tier without it.
        let with_memory = op.request.with_memory;
        super::checkpoint_memory::check_request(
            with_memory,
            &row.tier,
            self.tier_checkpoints_memory(&row)?,
        )?;
        let live = self.live(&row.id);
        let _g = live.lifecycle.lock().await;
        let row = self.reload(&row.id).await?;
        let existing = self.store.checkpoints_of(&row.id).await?;
        if let Some(l) = &op.request.label {
            if existing.iter().any(|c| c.label.as_deref() == Some(l)) {
                return Err(CoreError::Conflict(format!(
                    "sandbox {} already has a checkpoint labelled {l:?}",
                    row.id
                )));
            }
        }
        let _adm = self.gov.admission.lock().await;
        let room = self.disk_room(&row.tenant).await?;
        self.refuse_clone_over_room(&row, room, "checkpoint")
            .await?;
        let id = format!("ck-{}", uuid::Uuid::new_v4().simple());
        let (clone, memory_bytes) = if with_memory {
            let (clone, image) = self.checkpoint_memory_of(&row, &live, &id).await?;
            (clone, Some(image))
        } else {
            (self.clone_disk_frozen(&row, &id).await?, None)
        };
        let driver = self.driver_for(&row)?;
        if room.is_some_and(|left| clone.bytes > left) {
            let _ = driver.remove_checkpoint_disk(&row.id, &id).await;
            return Err(CoreError::QuotaExceeded {
                tenant: row.tenant.clone(),
                quota: "disk_bytes",
                used: format!("{} bytes for the checkpoint", clone.bytes),
                limit: format!("{} bytes left", room.unwrap_or(0)),
                extra: "; delete checkpoints or sandboxes".into(),
            });
        }
        let new = CheckpointRow {
            id: id.clone(),
            sandbox: row.id.clone(),
            tenant: row.tenant.clone(),
            label: op.request.label.clone(),
            parent: self.store.checkpoint_head(&row.id).await?,
            size_bytes: clone.bytes,
            method: clone.method.to_string(),
            created_at: now_ms(),
            seq: 0,
            memory_bytes,
        };
        match self.store.insert_checkpoint(&new).await {
            Ok(c) => {
                tracing::info!(sandbox = %row.id, checkpoint = %id, method = clone.method, bytes = clone.bytes, memory_bytes = ?memory_bytes, "checkpoint");
                Ok(to_api_ckpt(&c))
            }
            Err(e) => {
                let _ = driver.remove_checkpoint_disk(&row.id, &id).await;
                Err(e)
            }
        }
    }

    pub async fn list_checkpoints(
        &self,
        caller: &Caller,
        op: ListCheckpoints,
    ) -> Result<CheckpointList> {
        caller.require(ListCheckpoints::SCOPE)?;
        let row = self.resolve(caller, &op.sandbox).await?;
        let rows = self.store.checkpoints_of(&row.id).await?;
        Ok(CheckpointList {
            checkpoints: rows.iter().map(to_api_ckpt).collect(),
        })
    }

    pub async fn delete_checkpoint(&self, caller: &Caller, op: DeleteCheckpoint) -> Result<()> {
        let r = async {
            caller.require(DeleteCheckpoint::SCOPE)?;
            let row = self.resolve(caller, &op.sandbox).await?;
            let live = self.live(&row.id);
            let _g = live.lifecycle.lock().await;
            let rows = self.store.checkpoints_of(&row.id).await?;
            let c = find(&rows, &row.id, &op.checkpoint)?;
            // Row first: a crash leaves a clone without a row, removed at the next start.
            self.store.delete_checkpoint(&c.id).await?;
            self.driver_for(&row)?
                .remove_checkpoint_disk(&row.id, &c.id)
                .await
        }
        .await;
        self.audit(caller, DeleteCheckpoint::NAME, &op.sandbox, &r)
            .await;
        r
    }

    pub async fn rewind(&self, caller: &Caller, op: Rewind) -> Result<Sandbox> {
        let r = self.rewind_inner(caller, &op).await;
        self.audit(caller, Rewind::NAME, &op.sandbox, &r).await;
        r
    }

    async fn rewind_inner(&self, caller: &Caller, op: &Rewind) -> Result<Sandbox> {
        caller.require(Rewind::SCOPE)?;
        let row = self.resolve(caller, &op.sandbox).await?;
        let live = self.live(&row.id);
        let _g = live.lifecycle.clone().lock_owned().await;
        let row = self.reload(&row.id).await?;
        let rows = self.store.checkpoints_of(&row.id).await?;
        let target = find(&rows, &row.id, &op.request.to)?.clone();
        // The processes go (the disk cannot change under them), the disk is swapped in one
        // rename, then the sandbox boots on it: a crash in between leaves it stopped on
        // one whole disk or the other.
        self.apply(&row, &live, Op::Stop).await?;
        let driver = self.driver_for(&row)?;
        driver.restore_disk(&row.id, &target.id).await?;
        self.store.set_checkpoint_head(&row.id, &target.id).await?;
        if op.request.drop_later {
            for c in rows.iter().filter(|c| c.seq > target.seq) {
                self.store.delete_checkpoint(&c.id).await?;
                driver.remove_checkpoint_disk(&row.id, &c.id).await?;
            }
        }
        let row = self.reload(&row.id).await?;
        if target.memory_bytes.is_some() {
            // Its processes come back from the image of the same instant as the disk.
            self.start_from_memory(&row, &live, &target.id).await?;
        } else {
            self.apply(&row, &live, Op::Start).await?;
        }
        self.touch(&live, &row.id).await;
        tracing::info!(sandbox = %row.id, checkpoint = %target.id, with_memory = target.memory_bytes.is_some(), "rewound");
        Ok(to_api(&self.drivers, caller, &self.reload(&row.id).await?))
    }

    pub async fn fork(&self, caller: &Caller, op: Fork) -> Result<ForkResponse> {
        let r = self.fork_inner(caller, &op).await;
        self.audit(caller, Fork::NAME, &op.sandbox, &r).await;
        r
    }

    async fn fork_inner(&self, caller: &Caller, op: &Fork) -> Result<ForkResponse> {
        caller.require(Fork::SCOPE)?;
        let names = fork_names(&op.request)?;
        let t0 = std::time::Instant::now();
        let parent = self.resolve(caller, &op.sandbox).await?;
        // Refused before anything changes: memory asked of a tier or source without it.
        let tier_can = self
            .driver_for(&parent)?
            .capabilities()
            .contains(&crate::driver::capability::FORK_MEMORY);
        super::fork_memory::check_request(&op.request, &parent.tier, tier_can)?;
        // Refused before the parent is frozen or anything cloned when the forks' disks
        // cannot all fit in the tenant's disk quota (ADR 0165); each fork's create is
        // admitted again under the admission lock. Its image is the parent's: no layer is
        // new to the tenant.
        if parent.disk_bytes > 0 {
            if let Some(left) = self.disk_room(&parent.tenant).await? {
                let wanted = parent.disk_bytes.saturating_mul(names.len() as u64);
                if wanted > left {
                    let held = self.store.disk_split_of(&parent.tenant, true).await?;
                    return Err(CoreError::QuotaExceeded {
                        tenant: parent.tenant.clone(),
                        quota: "disk_bytes",
                        used: format!(
                            "{wanted} bytes for {} fork disk(s) of {} bytes, {} held ({})",
                            names.len(),
                            parent.disk_bytes,
                            held.total(),
                            held.parts()
                        ),
                        limit: format!("{left} bytes left"),
                        extra: "; fork fewer, or delete templates, checkpoints or sandboxes".into(),
                    });
                }
            }
        }
        let live = self.live(&parent.id);
        // Forking from a checkpoint: its clone is the source, kept, and the parent's
        // lifecycle lock is held until the forks are made so it cannot be deleted under
        // them. Else one internal clone of the parent (no row: a crash leaves a file the
        // next start removes); each fork's disk is a clone of it.
        let (parent, ckpt, _kept, memory) = match &op.request.checkpoint {
            Some(name) => {
                let g = live.lifecycle.clone().lock_owned().await;
                let parent = self.reload(&parent.id).await?;
                let rows = self.store.checkpoints_of(&parent.id).await?;
                let ckpt = find(&rows, &parent.id, name)?.id.clone();
                (parent, ckpt, Some(g), false)
            }
            None => {
                let ckpt = format!("fk-{}", uuid::Uuid::new_v4().simple());
                let _g = live.lifecycle.lock().await;
                let parent = self.reload(&parent.id).await?;
                let refusal = self
                    .driver_for(&parent)?
                    .fork_memory_refusal(&parent.id)
                    .await;
                let memory =
                    super::fork_memory::with_memory(&op.request, &parent, tier_can, refusal)?;
                if memory {
                    self.fork_checkpoint_parent(&parent, &live, &ckpt).await?;
                } else {
                    self.clone_disk_frozen(&parent, &ckpt).await?;
                }
                (self.reload(&parent.id).await?, ckpt, None, memory)
            }
        };
        let network = match &parent.network_policy {
            Some(json) => Some(serde_json::from_str(json).map_err(|e| {
                CoreError::Internal(format!("stored network policy of {}: {e}", parent.id))
            })?),
            None => None,
        };
        // The same secrets by name; each fork gets placeholders of its own (one the parent's
        // files may hold is the parent's, and is not swapped for a fork).
        let secrets: Vec<String> = self
            .store
            .sandbox_secrets(&parent.id)
            .await?
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        let source = ForkSource {
            from: parent.id.clone(),
            from_index: parent.slot,
            ckpt: ckpt.clone(),
            memory,
        };
        let t1 = std::time::Instant::now();
        // Booted side by side: each create takes the create lock only for its insert.
        let creates = names.into_iter().map(|name| {
            let mut labels = parent.labels.clone();
            labels.extend(op.request.labels.clone().unwrap_or_default());
            let req = CreateSandboxRequest {
                name: name.clone(),
                labels,
                image: Some(parent.image.clone()),
                limits: LimitsRequest {
                    memory_bytes: Some(parent.memory_bytes),
                    cpus: Some(parent.cpus),
                    pids: Some(parent.pids),
                    disk_bytes: (parent.disk_bytes > 0).then_some(parent.disk_bytes),
                },
                idle_pause_secs: parent.idle_pause_secs,
                idle_stop_secs: parent.idle_stop_secs,
                idle_hibernate_secs: parent.idle_hibernate_secs,
                ttl_secs: parent.ttl_secs,
                ttl_action: parent.ttl_action,
                tier: Some(parent.tier.clone()),
                network: network.clone(),
                otlp_relay: parent.otlp_relay,
                secrets: secrets.clone(),
                template: None,
            };
            let source = super::templates::DiskFrom::Fork(&source);
            async move {
                match self.create_inner(caller, req, Some(&source)).await {
                    Ok(Some((sb, true))) => Ok(sb),
                    Ok(Some((sb, false))) => Err(CoreError::Conflict(format!(
                        "a sandbox named {:?} exists already ({})",
                        name.unwrap_or_default(),
                        sb.id
                    ))),
                    Ok(None) => Err(CoreError::Unavailable(
                        "a fork's name was being created by another request".into(),
                    )),
                    Err(e) => Err(e),
                }
            }
        });
        let results = futures::future::join_all(creates).await;
        let t2 = std::time::Instant::now();
        let mut made: Vec<Sandbox> = Vec::new();
        let mut failed = None;
        for r in results {
            match r {
                Ok(sb) => made.push(sb),
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if _kept.is_none() {
            let driver = self.driver_for(&parent)?;
            let _ = driver.remove_checkpoint_disk(&parent.id, &ckpt).await;
            if memory {
                let _ = driver.remove_fork_image(&parent.id, &ckpt).await;
            }
        }
        if let Some(e) = failed {
            // All or nothing: the forks made so far go.
            for sb in &made {
                let _ = self.delete(caller, &sb.id, true).await;
            }
            return Err(e);
        }
        tracing::info!(
            sandbox = %parent.id,
            forks = made.len(),
            with_memory = memory,
            source_us = (t1 - t0).as_micros() as u64,
            creates_us = (t2 - t1).as_micros() as u64,
            cleanup_us = t2.elapsed().as_micros() as u64,
            "forked"
        );
        Ok(ForkResponse {
            sandboxes: made,
            with_memory: memory,
        })
    }

    /// After a crash: checkpoint rows without a clone (or without their sandbox) go, and
    /// clones without a row (a checkpoint or fork cut short) are removed.
    pub(super) async fn reconcile_checkpoints(&self) -> Result<()> {
        let sandboxes = self.store.all_sandboxes().await?;
        let rows = self.store.all_checkpoints().await?;
        for c in &rows {
            if !sandboxes.iter().any(|s| s.id == c.sandbox) {
                self.store.delete_checkpoints_of(&c.sandbox).await?;
            }
        }
        for sb in &sandboxes {
            let driver = self.driver_for(sb)?;
            let on_disk = driver.checkpoint_disks(&sb.id).await;
            for c in rows.iter().filter(|c| c.sandbox == sb.id) {
                if !on_disk.contains(&c.id) {
                    tracing::warn!(sandbox = %sb.id, checkpoint = %c.id, "checkpoint without its clone: forgotten");
                    self.store.delete_checkpoint(&c.id).await?;
                }
            }
            for ck in on_disk {
                if !rows.iter().any(|c| c.id == ck) {
                    tracing::info!(sandbox = %sb.id, checkpoint = %ck, "removed a clone left by an interrupted checkpoint or fork");
                    driver.remove_checkpoint_disk(&sb.id, &ck).await?;
                }
            }
            self.reconcile_checkpoint_memory(sb, &rows).await?;
        }
        Ok(())
    }
}

impl crate::ops::Run for CreateCheckpoint {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Checkpoint> {
        m.create_checkpoint(caller, self).await
    }
}

impl crate::ops::Run for ListCheckpoints {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<CheckpointList> {
        m.list_checkpoints(caller, self).await
    }
}

impl crate::ops::Run for DeleteCheckpoint {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<()> {
        m.delete_checkpoint(caller, self).await
    }
}

impl crate::ops::Run for Rewind {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Sandbox> {
        m.rewind(caller, self).await
    }
}

impl crate::ops::Run for Fork {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<ForkResponse> {
        m.fork(caller, self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(count: Option<u32>, prefix: Option<&str>, names: Option<&[&str]>) -> ForkRequest {
        ForkRequest {
            count,
            name_prefix: prefix.map(str::to_owned),
            names: names.map(|n| n.iter().map(|s| s.to_string()).collect()),
            checkpoint: None,
            labels: None,
            with_memory: None,
        }
    }

    #[test]
    fn fork_names_exact_prefixed_or_none() {
        let some = |v: &[&str]| v.iter().map(|s| Some(s.to_string())).collect::<Vec<_>>();
        assert_eq!(
            fork_names(&req(None, None, Some(&["thread-b"]))).unwrap(),
            some(&["thread-b"])
        );
        assert_eq!(
            fork_names(&req(Some(2), Some("p"), None)).unwrap(),
            some(&["p-1", "p-2"])
        );
        assert_eq!(fork_names(&req(None, None, None)).unwrap(), vec![None]);
        // Refused: both ways of naming, a count that disagrees, a name twice, none, too
        // many, a name that is not a valid sandbox name.
        assert!(fork_names(&req(None, Some("p"), Some(&["a"]))).is_err());
        assert!(fork_names(&req(Some(2), None, Some(&["a"]))).is_err());
        assert!(fork_names(&req(None, None, Some(&["a", "a"]))).is_err());
        assert!(fork_names(&req(None, None, Some(&[]))).is_err());
        assert!(fork_names(&req(Some(MAX_FORKS + 1), None, None)).is_err());
        assert!(fork_names(&req(None, None, Some(&["no spaces"]))).is_err());
    }
}
