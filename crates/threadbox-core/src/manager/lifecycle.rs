//! Lifecycle transitions other than create: pause, resume, stop, start, delete, and
//! the implicit resume of work on a paused sandbox (`running_conn`). Each goes through
//! `state::plan`.

use super::*;

impl Manager {
    /// Carries out `op` on `row` (read under its lifecycle lock, which the caller holds):
    /// the one place that plans a lifecycle step (`state::plan`), runs it on the driver and
    /// records it with a guarded transition.
    pub(super) async fn apply(&self, row: &SandboxRow, live: &Live, op: Op) -> Result<Step> {
        let step = state::plan(&row.id, row.state, op)?;
        let (from, to) = step.transition();
        match step {
            Step::Keep => {}
            Step::Freeze => {
                self.meter(row, false).await;
                if let Err(e) = self.driver_for(row)?.freeze(&row.id).await {
                    self.metrics().freeze_timeouts.inc([]);
                    // A freeze that timed out leaves cgroup.freeze set: the sandbox would
                    // end up frozen while recorded as running (F2). Undo it.
                    if let Err(t) = self.driver_for(row)?.thaw(&row.id).await {
                        tracing::error!(sandbox = %row.id, "could not undo a failed freeze: {t}");
                    }
                    return Err(e);
                }
                self.store
                    .transition(&row.id, from, State::Paused, row.agent_pid)
                    .await?;
            }
            Step::Thaw => {
                let _adm = self.gov.admission.lock().await;
                self.admit(&row.tenant, Admit::Run).await?;
                self.meter(row, false).await;
                let driver = self.driver_for(row)?;
                let mut pid = row.agent_pid;
                if row.state == State::Hibernated {
                    let spec = self.spec_of(row).await?;
                    if let Some(new) = driver.wake(&spec).await? {
                        // A new agent process (a memory image restored, ADR 0130).
                        Self::take_conn(live);
                        pid = Some(new);
                    }
                }
                driver.thaw(&row.id).await?;
                self.store
                    .transition(&row.id, from, State::Running, pid)
                    .await?;
            }
            Step::Hibernate
                if self
                    .driver_for(row)?
                    .capabilities()
                    .contains(&crate::driver::capability::HIBERNATE_IMAGE) =>
            {
                self.hibernate_to_image(row, live, from).await?
            }
            Step::Hibernate => self.hibernate_step(row, from).await?,
            Step::Boot => {
                // The place is reserved under the admission lock (`creating` counts as
                // running for quotas) and the boot runs without it: one slow boot must
                // not hold every tenant's creates and starts (F7).
                {
                    let _adm = self.gov.admission.lock().await;
                    self.admit(&row.tenant, Admit::Run).await?;
                    self.store
                        .transition(&row.id, from, State::Creating, None)
                        .await?;
                }
                match self.boot(row, live).await {
                    Ok(pid) => {
                        self.store
                            .transition(&row.id, &[State::Creating], State::Running, Some(pid))
                            .await?;
                        tracing::info!(sandbox = %row.id, agent_pid = pid, "started");
                    }
                    Err(e) => {
                        self.store
                            .transition(&row.id, &[State::Creating], State::Stopped, None)
                            .await?;
                        return Err(e);
                    }
                }
            }
            Step::Halt => {
                self.meter(row, false).await;
                Self::take_conn(live);
                self.detach_network(&row.id);
                self.driver_for(row)?.stop(&row.id).await?;
                self.store
                    .transition(&row.id, from, State::Stopped, None)
                    .await?;
                // Its contexts ended with its processes (issue 15, ADR 0084).
                if let Err(e) = self.store.mark_contexts_lost(&row.id, "stopped").await {
                    tracing::warn!(sandbox = %row.id, "marking its contexts lost: {e}");
                }
                // Restarts the CPU baseline (the next boot has a new cgroup) and samples the disk.
                self.meter(&self.reload(&row.id).await?, true).await;
                tracing::info!(sandbox = %row.id, "stopped");
            }
            Step::Destroy => {
                self.meter(row, false).await;
                // Recorded first, so a crash mid-delete is finished by the next start.
                self.store
                    .transition(&row.id, from, State::Deleting, None)
                    .await?;
                Self::take_conn(live);
                self.detach_network(&row.id);
                if let Err(e) = self.driver_for(row)?.destroy(&row.id).await {
                    // Its processes are gone (destroy stops first) but something of it is
                    // left: visible again as stopped, so the delete can be retried (F3).
                    if let Err(t) = self
                        .store
                        .transition(&row.id, &[State::Deleting], State::Stopped, None)
                        .await
                    {
                        tracing::error!(sandbox = %row.id, "after a failed delete: {t}");
                    }
                    return Err(e);
                }
                self.store.delete_sandbox(&row.id).await?;
                // Their clones went with the sandbox's directory (ADR 0100).
                self.store.delete_checkpoints_of(&row.id).await?;
                self.store.mark_usage_deleted(&row.id, now_ms()).await?;
                self.forget(&row.id);
                tracing::info!(sandbox = %row.id, "deleted");
            }
            Step::Adopt { .. } | Step::AdoptHibernated => {
                if let Some(to) = to {
                    self.store
                        .transition(&row.id, from, to, row.agent_pid)
                        .await?;
                }
            }
        }
        debug_assert!(step == Step::Keep || to.is_some());
        Ok(step)
    }

    /// Locks `id_or_name`'s lifecycle, reads it again, and applies `op`; the row after.
    pub(super) async fn lifecycle(
        &self,
        caller: &Caller,
        id_or_name: &str,
        op: Op,
    ) -> Result<(SandboxRow, Arc<Live>)> {
        let row = self.resolve(caller, id_or_name).await?;
        let live = self.live(&row.id);
        let g = live.lifecycle.clone().lock_owned().await;
        let row = self.reload(&row.id).await?;
        self.apply(&row, &live, op).await?;
        drop(g);
        Ok((row, live))
    }

    pub async fn pause(&self, caller: &Caller, id_or_name: &str) -> Result<Sandbox> {
        self.pause_for(caller, id_or_name, Op::Pause).await
    }

    /// A pause for a reason (`Op::Pause`, `Op::CapPause`), audited as `sandbox.pause`.
    pub(super) async fn pause_for(
        &self,
        caller: &Caller,
        id_or_name: &str,
        op: Op,
    ) -> Result<Sandbox> {
        let r = async {
            caller.require(ops::PauseSandbox::SCOPE)?;
            let (row, _) = self.lifecycle(caller, id_or_name, op).await?;
            Ok(to_api(&self.drivers, caller, &self.reload(&row.id).await?))
        }
        .await;
        self.audit(caller, ops::PauseSandbox::NAME, id_or_name, &r)
            .await;
        r
    }

    /// Hibernate (issue 16, ADR 0129): freeze, then push the memory out of RAM.
    pub async fn hibernate(&self, caller: &Caller, id_or_name: &str) -> Result<Sandbox> {
        self.hibernate_for(caller, id_or_name, Op::Hibernate).await
    }

    /// A hibernate for a reason (`Op::Hibernate`, `Op::IdleHibernate`), audited as
    /// `sandbox.hibernate`.
    pub(super) async fn hibernate_for(
        &self,
        caller: &Caller,
        id_or_name: &str,
        op: Op,
    ) -> Result<Sandbox> {
        let r = async {
            caller.require(ops::HibernateSandbox::SCOPE)?;
            let (row, _) = self.lifecycle(caller, id_or_name, op).await?;
            Ok(to_api(&self.drivers, caller, &self.reload(&row.id).await?))
        }
        .await;
        self.audit(caller, ops::HibernateSandbox::NAME, id_or_name, &r)
            .await;
        r
    }

    /// `Step::Hibernate`: a running sandbox is frozen first; then the driver pushes its
    /// memory out. If that fails (no swap), a sandbox that was running is thawed again
    /// and one that was paused stays paused: the state recorded is always what it is.
    async fn hibernate_step(&self, row: &SandboxRow, from: &[State]) -> Result<()> {
        let driver = self.driver_for(row)?;
        self.meter(row, false).await;
        if row.state == State::Running {
            if let Err(e) = driver.freeze(&row.id).await {
                self.metrics().freeze_timeouts.inc([]);
                if let Err(t) = driver.thaw(&row.id).await {
                    tracing::error!(sandbox = %row.id, "could not undo a failed freeze: {t}");
                }
                return Err(e);
            }
        }
        let started = std::time::Instant::now();
        match driver.hibernate(&row.id).await {
            Ok(left) => {
                tracing::info!(sandbox = %row.id, bytes_left = left, ms = started.elapsed().as_millis() as u64, "hibernated");
            }
            Err(e) => {
                // Undo what this step changed, so the row still tells the truth.
                if let Ok(spec) = self.spec_of(row).await {
                    let _ = driver.wake(&spec).await;
                }
                if row.state == State::Running {
                    if let Err(t) = driver.thaw(&row.id).await {
                        tracing::error!(sandbox = %row.id, "could not thaw after a failed hibernate: {t}");
                    }
                }
                return Err(e);
            }
        }
        self.store
            .transition(&row.id, from, State::Hibernated, row.agent_pid)
            .await?;
        Ok(())
    }

    pub async fn resume(&self, caller: &Caller, id_or_name: &str) -> Result<Sandbox> {
        let r = async {
            caller.require(ops::ResumeSandbox::SCOPE)?;
            let (row, live) = self.lifecycle(caller, id_or_name, Op::Resume).await?;
            self.touch(&live, &row.id).await;
            Ok(to_api(&self.drivers, caller, &self.reload(&row.id).await?))
        }
        .await;
        self.audit(caller, ops::ResumeSandbox::NAME, id_or_name, &r)
            .await;
        r
    }

    pub async fn stop(&self, caller: &Caller, id_or_name: &str) -> Result<Sandbox> {
        let r = async {
            caller.require(ops::StopSandbox::SCOPE)?;
            let (row, _) = self.lifecycle(caller, id_or_name, Op::Stop).await?;
            Ok(to_api(&self.drivers, caller, &self.reload(&row.id).await?))
        }
        .await;
        self.audit(caller, ops::StopSandbox::NAME, id_or_name, &r)
            .await;
        r
    }

    pub async fn start(&self, caller: &Caller, id_or_name: &str) -> Result<Sandbox> {
        let r = async {
            caller.require(ops::StartSandbox::SCOPE)?;
            let (row, live) = self.lifecycle(caller, id_or_name, Op::Start).await?;
            self.touch(&live, &row.id).await;
            Ok(to_api(&self.drivers, caller, &self.reload(&row.id).await?))
        }
        .await;
        self.audit(caller, ops::StartSandbox::NAME, id_or_name, &r)
            .await;
        r
    }

    /// Deletes a sandbox and everything it left on the host. Without `force`, a running
    /// or paused sandbox is refused with `conflict`.
    pub async fn delete(&self, caller: &Caller, id_or_name: &str, force: bool) -> Result<()> {
        let r = async {
            caller.require(ops::DeleteSandbox::SCOPE)?;
            self.lifecycle(caller, id_or_name, Op::Delete { force })
                .await
                .map(|_| ())
        }
        .await;
        self.audit(caller, ops::DeleteSandbox::NAME, id_or_name, &r)
            .await;
        r
    }

    /// Checks the sandbox can run things (resuming it transparently when paused) and
    /// returns its agent connection.
    /// `work`: the call adds work (exec, writes), so the CPU and disk quotas apply even
    /// when the sandbox is already running.
    pub(super) async fn running_conn(
        &self,
        caller: &Caller,
        id_or_name: &str,
        work: bool,
    ) -> Result<(Arc<AgentConn>, Inflight)> {
        let (conn, inflight, _row) = self.running_conn_row(caller, id_or_name, work).await?;
        Ok((conn, inflight))
    }

    /// [`Self::running_conn`], with the sandbox's row as it was when the call began.
    pub(super) async fn running_conn_row(
        &self,
        caller: &Caller,
        id_or_name: &str,
        work: bool,
    ) -> Result<(Arc<AgentConn>, Inflight, SandboxRow)> {
        // Fast path: an id this daemon already tracks is locked first, then read once
        // under its lock (tenancy and current state in one query). Live entries are keyed
        // by id and names never start with "sb-", so the key names this very sandbox.
        let known = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id_or_name)
            .cloned();
        let fast = match known {
            Some(live) => {
                let g = live.lifecycle.clone().lock_owned().await;
                let row = self.resolve(caller, id_or_name).await?;
                (row.id == id_or_name).then_some((row, live, g))
            }
            None => None,
        };
        let (row, live, _g) = match fast {
            Some(locked) => locked,
            None => {
                let row = self.resolve(caller, id_or_name).await?;
                let live = self.live(&row.id);
                let g = live.lifecycle.clone().lock_owned().await;
                let row = self.reload(&row.id).await?;
                (row, live, g)
            }
        };
        match self.apply(&row, &live, Op::Call).await? {
            Step::Keep if work => self.admit(&row.tenant, Admit::Work).await?,
            Step::Thaw => tracing::info!(sandbox = %row.id, "resumed for a call"),
            _ => {}
        }
        let current = live.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let conn = match current {
            Some(c) if !c.is_closed() => c,
            _ => {
                let c = AgentConn::connect(
                    self.driver_for(&row)?.as_ref(),
                    &row.id,
                    Duration::from_secs(3),
                )
                .await;
                let outcome = if c.is_ok() { "ok" } else { "failed" };
                self.metrics().agent_reconnects.inc(["lost", outcome]);
                let c = c?;
                Self::set_conn(&live, Some(c.clone()));
                c
            }
        };
        live.inflight.fetch_add(1, Ordering::SeqCst);
        let inflight = Inflight(live.clone());
        self.touch(&live, &row.id).await;
        Ok((conn, inflight, row))
    }
}
