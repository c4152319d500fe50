//! Hibernate on a tier whose memory goes into an image (`capability::HIBERNATE_IMAGE`,
//! gvisor, ADR 0130): the agent lets go of its host socket, the driver checkpoints the
//! processes and ends them; the wake restores them (`lifecycle.rs`, `Step::Thaw`).

use super::*;
use threadbox_proto::{Request, Response};

/// How long the agent has to sync and answer `PrepareCheckpoint`.
const PREPARE_TIMEOUT: Duration = Duration::from_secs(30);
/// The agent binds again by itself this long after a prepare the daemon never followed
/// up (a daemon killed in between); the checkpoint itself takes a fraction of a second.
const REBIND_AFTER_MS: u64 = 30_000;

impl Manager {
    /// Asks `row`'s agent to sync and let go of its host socket and connections before a
    /// memory checkpoint (hibernate, fork with memory); ours is dropped too, so the next
    /// call connects anew. On an error the caller undoes it (the agent binds again).
    pub(super) async fn prepare_for_checkpoint(&self, row: &SandboxRow, live: &Live) -> Result<()> {
        let driver = self.driver_for(row)?;
        let current = live.conn.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let conn = match current {
            Some(c) if !c.is_closed() => c,
            _ => AgentConn::connect(driver.as_ref(), &row.id, Duration::from_secs(3)).await?,
        };
        let prepared = tokio::time::timeout(
            PREPARE_TIMEOUT,
            conn.call(Request::PrepareCheckpoint {
                rebind_after_ms: REBIND_AFTER_MS,
            }),
        )
        .await;
        match prepared {
            Ok(Ok(Response::Prepared)) => {}
            Ok(Ok(Response::Error { message, .. })) => {
                return Err(CoreError::Unavailable(format!(
                    "the sandbox's agent cannot prepare for a checkpoint: {message}"
                )))
            }
            Ok(Ok(other)) => {
                return Err(CoreError::Internal(format!(
                    "unexpected answer to PrepareCheckpoint: {other:?}"
                )))
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(CoreError::Unavailable(
                    "the sandbox's agent did not prepare for a checkpoint in time".into(),
                ))
            }
        }
        // The agent closes its end; ours goes too, and the next call connects anew.
        Self::take_conn(live);
        drop(conn);
        Ok(())
    }

    /// `Step::Hibernate` on an image tier. The sandbox may be running or paused (frozen:
    /// thawed first, since the checkpoint needs the agent and the sentry awake). On any
    /// failure the sandbox is left as it was: running, or paused again.
    pub(super) async fn hibernate_to_image(
        &self,
        row: &SandboxRow,
        live: &Live,
        from: &[State],
    ) -> Result<()> {
        let driver = self.driver_for(row)?;
        self.meter(row, false).await;
        let spec = self.spec_of(row).await?;
        let paused = row.state == State::Paused;
        if paused {
            driver.thaw(&row.id).await?;
        }
        let undo = |e: CoreError| async {
            // No image: the agent is told to bind again; an image made before a later
            // failure is restored.
            match driver.wake(&spec).await {
                Ok(Some(pid)) => {
                    if let Err(t) = self
                        .store
                        .transition(&row.id, from, row.state, Some(pid))
                        .await
                    {
                        tracing::error!(sandbox = %row.id, "recording the restored agent: {t}");
                    }
                }
                Ok(None) => {}
                Err(t) => {
                    tracing::error!(sandbox = %row.id, "could not undo a failed hibernate: {t}")
                }
            }
            if paused {
                if let Err(t) = driver.freeze(&row.id).await {
                    tracing::error!(sandbox = %row.id, "could not pause again after a failed hibernate: {t}");
                }
            }
            e
        };
        if let Err(e) = self.prepare_for_checkpoint(row, live).await {
            return Err(undo(e).await);
        }
        let started = std::time::Instant::now();
        if let Err(e) = driver.hibernate(&row.id).await {
            let alive = match row.agent_pid {
                Some(pid) => driver.agent_alive(&row.id, pid).await,
                None => false,
            };
            if !alive {
                // runsc ends a container whose checkpoint failed (20240729): its
                // processes are gone, and the row must say so.
                tracing::error!(sandbox = %row.id, "the checkpoint failed and ended the sandbox: {e}");
                let _ = driver.stop(&row.id).await;
                self.store
                    .transition(&row.id, from, State::Stopped, None)
                    .await?;
                if let Err(t) = self.store.mark_contexts_lost(&row.id, "stopped").await {
                    tracing::warn!(sandbox = %row.id, "marking its contexts lost: {t}");
                }
                return Err(CoreError::Internal(format!(
                    "hibernate failed and the sandbox's processes ended (it is stopped, its disk kept): {e}"
                )));
            }
            return Err(undo(e).await);
        }
        tracing::info!(sandbox = %row.id, ms = started.elapsed().as_millis() as u64, "hibernated to a memory image");
        // Nothing of it runs: no agent pid until the wake restores one.
        self.store
            .transition(&row.id, from, State::Hibernated, None)
            .await
    }
}
