//! Background sweeps: idle pause and TTL.

use super::*;

impl Manager {
    pub(super) async fn enforce_idle_and_ttl(&self) -> Result<()> {
        let now = now_ms();
        for row in self.store.all_sandboxes().await? {
            if row.tenant == POOL_TENANT {
                continue;
            }
            if let Some(ttl) = row.ttl_secs {
                if now - row.created_at >= (ttl as i64) * 1000 {
                    let system = Caller::system(&row.tenant);
                    let res = match row.ttl_action {
                        TtlAction::Delete => self.delete(&system, &row.id, true).await,
                        TtlAction::Stop if row.state != State::Stopped => {
                            self.stop(&system, &row.id).await.map(|_| ())
                        }
                        TtlAction::Stop => Ok(()),
                    };
                    match res {
                        Ok(()) => tracing::debug!(sandbox = %row.id, "TTL reached"),
                        Err(e) => tracing::warn!(sandbox = %row.id, "TTL action failed: {e}"),
                    }
                    continue;
                }
            }
            if let (State::Running, Some(idle)) = (row.state, row.idle_pause_secs) {
                let live = self.live(&row.id);
                let last = live
                    .last_active
                    .load(Ordering::SeqCst)
                    .max(row.last_active_at);
                // A cheap look first; `idle_pause` decides again under the lock.
                if live.inflight.load(Ordering::SeqCst) == 0 && now - last >= (idle as i64) * 1000 {
                    match self.idle_pause(&row, (idle as i64) * 1000).await {
                        Ok(true) => tracing::info!(sandbox = %row.id, "paused after {idle}s idle"),
                        Ok(false) => {}
                        Err(e) => tracing::warn!(sandbox = %row.id, "idle pause failed: {e}"),
                    }
                }
            }
        }
        Ok(())
    }

    /// The idle sweeper's pause: decided under the lifecycle lock, where calls register
    /// as in flight, so it never freezes a sandbox in the middle of a call (F1).
    pub(super) async fn idle_pause(&self, row: &SandboxRow, idle_ms: i64) -> Result<bool> {
        let live = self.live(&row.id);
        let _g = live.lifecycle.lock().await;
        let row = self.reload(&row.id).await?;
        let last = live
            .last_active
            .load(Ordering::SeqCst)
            .max(row.last_active_at);
        let inflight = live.inflight.load(Ordering::SeqCst);
        if now_ms() - last < idle_ms {
            return Ok(false);
        }
        Ok(self.apply(&row, &live, Op::IdlePause { inflight }).await? == Step::Freeze)
    }
}
