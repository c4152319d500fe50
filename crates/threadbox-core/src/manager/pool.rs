//! The warm pool (ADR 0010): `Config::warm_pool` sandboxes of the default image with the
//! default limits, booted ahead of time under the reserved tenant [`POOL_TENANT`] and
//! handed to a `create` that they satisfy in one UPDATE of the store. The pool is refilled
//! in the background after every adoption; its sandboxes never show in lists, usage or
//! quotas, and are destroyed on shutdown and on the next start after a crash.

use super::{Live, Manager};
use crate::caller::POOL_TENANT;
use crate::error::Result;
use crate::images::HOST_IMAGE;
use crate::store::{now_ms, SandboxRow, State};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use threadbox_api::TtlAction;

/// Wait after a failed refill before trying again.
const REFILL_BACKOFF: Duration = Duration::from_secs(1);
/// Wait after a wake-up (an adoption) before booting a replacement, so the boot (disk
/// image, helper, mounts) does not compete for the CPU with the adopter's first commands.
const REFILL_DELAY: Duration = Duration::from_millis(50);
/// The longest the refill waits for the creates in flight to end (ADR 0213): a steady
/// stream of creates must not keep the pool empty.
const REFILL_QUIET_MAX: Duration = Duration::from_secs(5);

/// Creates in flight (ADR 0213). The refill boots a replacement only once none runs, so
/// the boot does not take the CPU from the creates that emptied the pool: a fork of three
/// adopts three slots, and the first adoption's refill would otherwise run beside the
/// other two attaches.
#[derive(Default)]
pub(super) struct Busy {
    n: AtomicUsize,
    quiet: tokio::sync::Notify,
}

/// One create in flight; ends on drop.
pub(super) struct BusyGuard(Arc<Busy>);

impl Busy {
    pub(super) fn enter(self: &Arc<Self>) -> BusyGuard {
        self.n.fetch_add(1, Ordering::SeqCst);
        BusyGuard(self.clone())
    }

    /// Returns once no create is in flight, or after `max`.
    async fn wait_quiet(&self, max: Duration) {
        let deadline = tokio::time::Instant::now() + max;
        loop {
            let notified = self.quiet.notified();
            tokio::pin!(notified);
            // Registered before the count is read, so a guard dropped in between wakes it.
            notified.as_mut().enable();
            if self.n.load(Ordering::SeqCst) == 0 {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                tracing::debug!("warm pool: creates still in flight, refilling anyway");
                return;
            }
        }
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        if self.0.n.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.quiet.notify_waiters();
        }
    }
}

impl Manager {
    /// Starts the refill task when the pool is enabled.
    pub(super) fn spawn_pool(self: &Arc<Self>, mut stop_rx: tokio::sync::watch::Receiver<bool>) {
        if self.config.warm_pool == 0
            && self.config.warm_pool_templates.is_empty()
            && self.config.staged_pool == 0
        {
            return;
        }
        let weak = Arc::downgrade(self);
        let wake = self.pool_wake.clone();
        let busy = self.creating.clone();
        let handle = tokio::spawn(async move {
            loop {
                if *stop_rx.borrow() {
                    break;
                }
                tokio::select! {
                    _ = busy.wait_quiet(REFILL_QUIET_MAX) => {}
                    _ = stop_rx.changed() => break,
                }
                let Some(mgr) = weak.upgrade() else { break };
                let res = mgr.fill_pool_once().await;
                drop(mgr);
                match res {
                    Ok(true) => continue,
                    Ok(false) => {
                        tokio::select! {
                            _ = wake.notified() => {}
                            _ = stop_rx.changed() => break,
                        }
                        tokio::select! {
                            _ = tokio::time::sleep(REFILL_DELAY) => {}
                            _ = stop_rx.changed() => break,
                        }
                    }
                    Err(e) => {
                        tracing::warn!("warm pool: refill failed: {e}");
                        tokio::select! {
                            _ = tokio::time::sleep(REFILL_BACKOFF) => {}
                            _ = stop_rx.changed() => break,
                        }
                    }
                }
            }
        });
        *self.pool_task.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    /// Boots one pooled sandbox if the pool is short; false when it is full.
    async fn fill_pool_once(&self) -> Result<bool> {
        if (self.store.count_pooled(None).await? as usize) < self.config.warm_pool {
            self.boot_pooled(None).await?;
            return Ok(true);
        }
        // Sandboxes of templates (ADR 0110), looked up each round: a template named in the
        // configuration may be made after the daemon starts.
        for (tenant, name, n) in &self.config.warm_pool_templates {
            let Some(t) = self.store.get_template(tenant, name).await? else {
                tracing::debug!(tenant, template = name, "warm pool: no such template (yet)");
                continue;
            };
            if t.tier != self.drivers.default_tier() {
                continue;
            }
            if (self.store.count_pooled(Some(&t.id)).await? as usize) < *n {
                self.boot_pooled(Some(&t)).await?;
                return Ok(true);
            }
        }
        // Staged slots last: a create waits for a warm sandbox, a fork boots cold.
        if self.staged_pool_on()
            && (self.store.count_staged().await? as usize) < self.config.staged_pool
        {
            self.boot_staged().await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether staged slots are kept: configured, and the default tier is the jail (the
    /// one tier that stages, ADR 0180).
    fn staged_pool_on(&self) -> bool {
        self.config.staged_pool > 0 && self.drivers.default_tier() == crate::driver::DEFAULT_TIER
    }

    /// Stages one slot (ADR 0180): a pooled row, `stopped` (no agent, no disk), whose
    /// launch helper has made everything of a boot but the disk.
    async fn boot_staged(&self) -> Result<()> {
        let created = now_ms();
        let id = format!("sb-{}", uuid::Uuid::new_v4().simple());
        let mut row = SandboxRow {
            id: id.clone(),
            tenant: POOL_TENANT.to_string(),
            name: None,
            state: State::Stopped,
            labels: BTreeMap::new(),
            image: HOST_IMAGE.to_string(),
            memory_bytes: self.config.default_memory_bytes,
            cpus: self.config.default_cpus,
            pids: self.config.default_pids,
            disk_bytes: self.config.default_disk_bytes,
            idle_pause_secs: None,
            idle_stop_secs: None,
            idle_hibernate_secs: None,
            ttl_secs: None,
            ttl_action: TtlAction::Stop,
            slot: 0,
            agent_pid: None,
            created_at: created,
            last_active_at: created,
            tier: self.drivers.default_tier().to_string(),
            network_policy: None,
            network_generation: 0,
            otlp_relay: false,
        };
        let live = self.live(&id);
        let _g = live.lifecycle.lock().await;
        row.slot = match self.store.insert_sandbox(&row).await {
            Ok(slot) => slot,
            Err(e) => {
                self.forget(&id);
                return Err(e);
            }
        };
        let result: Result<()> = async {
            let spec = self.spec_of(&row).await?;
            self.drivers.get(&row.tier)?.stage(&spec).await
        }
        .await;
        match result {
            Ok(()) => {
                tracing::info!(sandbox = %id, "staged pool: slot ready");
                Ok(())
            }
            Err(e) => {
                self.discard_pooled(&id, &live).await;
                Err(e)
            }
        }
    }

    /// Takes a staged slot for the fork `row` when one fits (ADR 0180): jail tier, host
    /// image, a disk image, no OTLP endpoint (the caller leaves out secrets). The slot's
    /// row becomes `row`'s in one UPDATE (`creating`); returns its id, slot and lifecycle
    /// lock, which the caller holds until the boot ends. Its disk is made and attached by
    /// the caller's ordinary create steps. Caller holds the create and admission locks.
    pub(super) async fn adopt_staged(
        &self,
        row: &SandboxRow,
    ) -> Result<Option<(String, u32, tokio::sync::OwnedMutexGuard<()>)>> {
        if !self.staged_pool_on()
            || row.tier != self.drivers.default_tier()
            || row.image != HOST_IMAGE
            || row.disk_bytes == 0
            || row.otlp_relay
        {
            return Ok(None);
        }
        let d = self.drivers.get(self.drivers.default_tier())?;
        // Bounded: each round takes or discards one slot.
        for _ in 0..4 {
            let Some(id) = self.store.staged_candidate(HOST_IMAGE).await? else {
                tracing::debug!("staged pool: empty, cold boot");
                return Ok(None);
            };
            let live = self.live(&id);
            let g = live.lifecycle.clone().lock_owned().await;
            let Some(staged) = self.store.get_by_id_any(&id).await? else {
                continue;
            };
            if staged.tenant != POOL_TENANT || staged.state != State::Stopped {
                continue;
            }
            if !d.is_staged(&id).await {
                tracing::warn!(sandbox = %id, "staged pool: slot gone, discarding");
                self.discard_pooled(&id, &live).await;
                self.pool_wake.notify_one();
                continue;
            }
            if self.store.adopt_staged(&id, row).await? {
                self.pool_wake.notify_one();
                tracing::info!(sandbox = %id, "staged pool: slot taken by a fork");
                return Ok(Some((id, staged.slot, g)));
            }
        }
        Ok(None)
    }

    /// Whether the configuration keeps sandboxes of `t` warm.
    pub(super) fn pool_holds_template(&self, t: &crate::store_templates::TemplateRow) -> bool {
        self.config
            .warm_pool_templates
            .iter()
            .any(|(tenant, name, _)| *tenant == t.tenant && *name == t.name)
    }

    async fn boot_pooled(
        &self,
        template: Option<&crate::store_templates::TemplateRow>,
    ) -> Result<()> {
        let created = now_ms();
        let id = format!("sb-{}", uuid::Uuid::new_v4().simple());
        let mut row = SandboxRow {
            id: id.clone(),
            tenant: POOL_TENANT.to_string(),
            name: None,
            state: State::Creating,
            labels: BTreeMap::new(),
            image: template
                .map_or(HOST_IMAGE, |t| t.image.as_str())
                .to_string(),
            memory_bytes: template.map_or(self.config.default_memory_bytes, |t| t.memory_bytes),
            cpus: template.map_or(self.config.default_cpus, |t| t.cpus),
            pids: template.map_or(self.config.default_pids, |t| t.pids),
            disk_bytes: template.map_or(self.config.default_disk_bytes, |t| t.disk_bytes),
            idle_pause_secs: None,
            idle_stop_secs: None,
            idle_hibernate_secs: None,
            ttl_secs: None,
            ttl_action: TtlAction::Stop,
            slot: 0,
            agent_pid: None,
            created_at: created,
            last_active_at: created,
            tier: self.drivers.default_tier().to_string(),
            network_policy: None,
            network_generation: 0,
            otlp_relay: false,
        };
        let live = self.live(&id);
        let _g = live.lifecycle.lock().await;
        row.slot = match self.store.insert_sandbox(&row).await {
            Ok(slot) => slot,
            Err(e) => {
                self.forget(&id);
                return Err(e);
            }
        };
        let result: Result<i32> = async {
            let spec = self.spec_of(&row).await?;
            let driver = self.drivers.get(&row.tier)?;
            match template {
                Some(t) => {
                    self.store.set_template_use(&id, &t.id).await?;
                    driver.template_disk(&spec, &t.id).await?
                }
                None => driver.prepare(&spec).await?,
            }
            self.boot(&row, &live).await
        }
        .await;
        match result {
            Ok(pid) => {
                self.store
                    .transition(&id, &[State::Creating], State::Running, Some(pid))
                    .await?;
                tracing::info!(sandbox = %id, agent_pid = pid, template = ?template.map(|t| &t.name), "warm pool: sandbox ready");
                Ok(())
            }
            Err(e) => {
                self.discard_pooled(&id, &live).await;
                Err(e)
            }
        }
    }

    /// Destroys a pooled sandbox and its row. Caller holds its lifecycle lock.
    pub(super) async fn discard_pooled(&self, id: &str, live: &Live) {
        let _ = self
            .store
            .transition(
                id,
                &[
                    State::Creating,
                    State::Running,
                    State::Paused,
                    State::Hibernated,
                    State::Stopped,
                ],
                State::Deleting,
                None,
            )
            .await;
        Self::take_conn(live);
        let d = match self.drivers.get(self.drivers.default_tier()) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(sandbox = %id, "warm pool: {e}");
                return;
            }
        };
        if let Err(e) = d.destroy(id).await {
            tracing::warn!(sandbox = %id, "warm pool: cannot destroy a pooled sandbox: {e}");
            return;
        }
        if let Err(e) = self.store.delete_sandbox(id).await {
            tracing::warn!(sandbox = %id, "warm pool: cannot delete a pooled sandbox's row: {e}");
        }
        self.forget(id);
    }

    /// Destroys every pooled sandbox (shutdown; start after a crash).
    pub(super) async fn drain_pool(&self) -> Result<()> {
        for row in self.store.all_sandboxes().await? {
            if row.tenant != POOL_TENANT {
                continue;
            }
            let live = self.live(&row.id);
            let _g = live.lifecycle.lock().await;
            self.discard_pooled(&row.id, &live).await;
            tracing::info!(sandbox = %row.id, "warm pool: removed a pooled sandbox");
        }
        Ok(())
    }

    /// Hands a pooled sandbox to the create request `row` when one satisfies it: default
    /// image and the pool's disk size; memory, CPU and pids limits other than the defaults
    /// are applied to its cgroup first. Returns the adopted sandbox's id. Caller holds the
    /// create and admission locks and has admitted the request.
    pub(super) async fn adopt_from_pool(
        &self,
        row: &SandboxRow,
        template: Option<&str>,
    ) -> Result<Option<String>> {
        let kept = match template {
            None => {
                self.config.warm_pool > 0
                    && row.image == HOST_IMAGE
                    && row.disk_bytes == self.config.default_disk_bytes
            }
            // The candidate must be of that template, its image and disk size (below).
            Some(_) => !self.config.warm_pool_templates.is_empty(),
        };
        // Pooled sandboxes booted without the OTLP endpoint (ADR 0091).
        if !kept || row.tier != self.drivers.default_tier() || row.otlp_relay {
            return Ok(None);
        }
        let Some(id) = self
            .store
            .pool_candidate_of(template, &row.image, row.disk_bytes)
            .await?
        else {
            tracing::debug!("warm pool: empty, cold boot");
            return Ok(None);
        };
        let live = self.live(&id);
        let _g = live.lifecycle.lock().await;
        let answering = live
            .conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|c| !c.is_closed());
        if !answering {
            tracing::warn!(sandbox = %id, "warm pool: agent gone, discarding");
            self.discard_pooled(&id, &live).await;
            self.pool_wake.notify_one();
            return Ok(None);
        }
        // What it was booted with: the defaults, or its template's limits.
        let booted = self.reload(&id).await?;
        let defaults = (booted.memory_bytes, booted.cpus, booted.pids);
        let rewritten = (row.memory_bytes, row.cpus, row.pids) != defaults;
        if rewritten {
            let limits = crate::driver::Limits {
                memory_bytes: row.memory_bytes,
                cpus: row.cpus,
                pids: row.pids,
            };
            let d = self.drivers.get(self.drivers.default_tier())?;
            let set = d.set_limits(&id, &limits).await;
            if let Err(e) = set {
                tracing::warn!(sandbox = %id, "warm pool: cannot apply limits ({e}), discarding");
                self.discard_pooled(&id, &live).await;
                self.pool_wake.notify_one();
                return Ok(None);
            }
        }
        match self.store.adopt_pooled(&id, row).await {
            Ok(true) => {
                self.pool_wake.notify_one();
                Ok(Some(id))
            }
            Ok(false) => {
                tracing::warn!(sandbox = %id, "warm pool: sandbox changed during adoption");
                if rewritten {
                    // It kept this request's limits: a later adoption would hand them to
                    // someone who asked for the defaults (F5). Never reuse it.
                    self.discard_pooled(&id, &live).await;
                    self.pool_wake.notify_one();
                }
                Ok(None)
            }
            Err(e) => {
                // Its cgroup may carry the request's limits now: never reuse it.
                self.discard_pooled(&id, &live).await;
                self.pool_wake.notify_one();
                Err(e)
            }
        }
    }
}
