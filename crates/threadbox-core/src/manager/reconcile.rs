//! Start-up reconciliation of the store with what is on the host.

use super::state::Found;
use super::*;

impl Manager {
    /// Brings the store in line with the host after a (re)start: agents that answer are
    /// re-adopted, dead ones are marked stopped with their disk kept, half-done creates
    /// and deletes are finished. Each row is probed according to its recorded state, and
    /// what to do is the transition table's answer to `Op::Recover(found)`.
    pub(super) async fn reconcile(&self) -> Result<()> {
        // Pooled sandboxes left by a crash are not trusted: destroyed, the pool refills.
        self.drain_pool().await?;
        for row in self.store.all_sandboxes().await? {
            let live = self.live(&row.id);
            let _g = live.lifecycle.lock().await;
            let found = self.probe(&row, &live).await?;
            let row = self.refresh_agent_pid(row, found).await?;
            let step = self.apply(&row, &live, Op::Recover(found)).await?;
            if let (Step::Adopt { .. }, Some(pid)) = (step, row.agent_pid) {
                // The policy outlives the daemon: listeners come back in the same netns.
                self.attach_network(&row, pid).await;
            }
            match (step, found) {
                (Step::Keep, _) => {}
                (Step::Destroy, _) => {
                    tracing::info!(sandbox = %row.id, "finished an interrupted create or delete")
                }
                (Step::Adopt { .. }, Found::Silent) => tracing::warn!(
                    sandbox = %row.id,
                    "re-adopted, but its agent does not answer yet; the next call retries"
                ),
                (Step::Adopt { paused }, _) => {
                    tracing::info!(sandbox = %row.id, paused, "re-adopted")
                }
                (Step::Halt, Found::Gone) => {
                    tracing::warn!(sandbox = %row.id, "agent gone; marked stopped, disk kept")
                }
                (step, _) => tracing::info!(sandbox = %row.id, ?step, "reconciled"),
            }
        }
        self.reconcile_checkpoints().await?;
        self.reconcile_templates().await?;
        self.reconcile_images().await
    }

    /// A sandbox whose agent answers but under another pid than its row's (a tier that
    /// restores memory images starts a new process: a daemon killed between a restore and
    /// its record, ADR 0195) gets the pid it has now, so the adoption records the live one.
    async fn refresh_agent_pid(&self, row: SandboxRow, found: Found) -> Result<SandboxRow> {
        if found != Found::Answers {
            return Ok(row);
        }
        let Some(pid) = self.driver_for(&row)?.current_agent_pid(&row.id).await else {
            return Ok(row);
        };
        if row.agent_pid == Some(pid) {
            return Ok(row);
        }
        tracing::info!(sandbox = %row.id, old = ?row.agent_pid, pid, "agent found under a new pid (restored before the daemon stopped)");
        self.store
            .transition(&row.id, &[row.state], row.state, Some(pid))
            .await?;
        self.reload(&row.id).await
    }

    /// What is on the host for `row`. A live sandbox whose agent answers gets its
    /// connection set in `live`, ready for the adoption.
    async fn probe(&self, row: &SandboxRow, live: &Live) -> Result<Found> {
        let driver = self.driver_for(row)?;
        let id = row.id.clone();
        Ok(match row.state {
            State::Creating if !driver.has_disk(&id).await => Found::NoDisk,
            State::Creating | State::Deleting | State::Stopped => Found::Unprobed,
            State::Running | State::Paused | State::Hibernated => {
                if driver.recover_hibernated(&id).await {
                    return Ok(Found::Image);
                }
                if driver.is_frozen(&id).await.unwrap_or(false) {
                    return Ok(Found::Frozen);
                }
                let conn = AgentConn::connect(driver.as_ref(), &id, Duration::from_secs(3)).await;
                let outcome = if conn.is_ok() { "ok" } else { "failed" };
                self.metrics().agent_reconnects.inc(["adopt", outcome]);
                match conn {
                    Ok(conn) => {
                        Self::set_conn(live, Some(conn));
                        Found::Answers
                    }
                    // Alive but slow to answer (a loaded host, a stopped agent): never
                    // kill the user's processes because the daemon is in a hurry (F6).
                    Err(e) if alive(driver.as_ref(), &id, row.agent_pid).await => {
                        tracing::debug!(sandbox = %id, "agent alive but silent: {e}");
                        Found::Silent
                    }
                    Err(e) => {
                        tracing::debug!(sandbox = %id, "agent gone: {e}");
                        Found::Gone
                    }
                }
            }
        })
    }
}

/// Whether the agent recorded as `pid` still lives in sandbox `id`.
async fn alive(driver: &dyn Driver, id: &str, pid: Option<i32>) -> bool {
    match pid {
        Some(pid) => driver.agent_alive(id, pid).await,
        None => false,
    }
}
