//! Start-up reconciliation of the store with what is on the host.

use super::*;

impl Manager {
    /// Brings the store in line with the host after a (re)start: agents that answer are
    /// re-adopted, dead ones are marked stopped with their disk kept, half-done creates
    /// and deletes are finished.
    pub(super) async fn reconcile(&self) -> Result<()> {
        // Pooled sandboxes left by a crash are not trusted: destroyed, the pool refills.
        self.drain_pool().await?;
        for row in self.store.all_sandboxes().await? {
            let id = row.id.clone();
            let driver = self.driver_for(&row)?;
            match row.state {
                State::Deleting => {
                    let d = driver.clone();
                    let i = id.clone();
                    blocking(move || d.destroy(&i)).await?;
                    self.store.delete_sandbox(&id).await?;
                    tracing::info!(sandbox = %id, "finished an interrupted delete");
                }
                State::Creating => {
                    let d = driver.clone();
                    let i = id.clone();
                    blocking(move || d.stop(&i)).await?;
                    if driver.has_disk(&id) {
                        self.store
                            .transition(&id, &[State::Creating], State::Stopped, None)
                            .await?;
                    } else {
                        // Killed before its disk existed: whatever the create had made on
                        // the host (its directory, mount points) goes with the row.
                        let d = driver.clone();
                        let i = id.clone();
                        blocking(move || d.destroy(&i)).await?;
                        self.store.delete_sandbox(&id).await?;
                    }
                    tracing::info!(sandbox = %id, "cleaned up an interrupted create");
                }
                State::Running | State::Paused => {
                    let d = driver.clone();
                    let i = id.clone();
                    let frozen = blocking(move || d.is_frozen(&i)).await.unwrap_or(false);
                    if frozen {
                        self.store
                            .transition(&id, LIVE, State::Paused, row.agent_pid)
                            .await?;
                        tracing::info!(sandbox = %id, "re-adopted (paused)");
                        continue;
                    }
                    match AgentConn::connect(&driver.socket_path(&id), Duration::from_secs(3)).await
                    {
                        Ok(conn) => {
                            Self::set_conn(&self.live(&id), Some(conn));
                            self.store
                                .transition(&id, LIVE, State::Running, row.agent_pid)
                                .await?;
                            tracing::info!(sandbox = %id, "re-adopted (running)");
                        }
                        Err(e)
                            if row
                                .agent_pid
                                .is_some_and(|pid| driver.agent_alive(&id, pid)) =>
                        {
                            // Alive but slow to answer (a loaded host, a stopped agent):
                            // never kill the user's processes because the daemon is in a
                            // hurry (F6). The next call connects again.
                            self.store
                                .transition(&id, LIVE, State::Running, row.agent_pid)
                                .await?;
                            tracing::warn!(sandbox = %id, "re-adopted, but its agent does not answer yet ({e}); the next call retries");
                        }
                        Err(e) => {
                            let d = driver.clone();
                            let i = id.clone();
                            blocking(move || d.stop(&i)).await?;
                            self.store
                                .transition(&id, LIVE, State::Stopped, None)
                                .await?;
                            tracing::warn!(sandbox = %id, "agent gone ({e}); marked stopped, disk kept");
                        }
                    }
                }
                State::Stopped => {}
            }
        }
        Ok(())
    }
}
