//! Background sweeps: idle stop, idle pause and TTL.

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
            let live_state = matches!(
                row.state,
                State::Running | State::Paused | State::Hibernated
            );
            let any_idle = row.idle_stop_secs.is_some()
                || row.idle_pause_secs.is_some()
                || row.idle_hibernate_secs.is_some();
            if !(live_state && any_idle) {
                continue;
            }
            // A cheap look first; `idle_step` decides again under the lock.
            let idle_ms = self.idle_ms(&row, now);
            if let (State::Running | State::Paused | State::Hibernated, Some(idle)) =
                (row.state, row.idle_stop_secs)
            {
                if idle_ms >= (idle as i64) * 1000 {
                    match self.idle_step(&row, (idle as i64) * 1000, Idle::Stop).await {
                        Ok(true) => {
                            tracing::info!(sandbox = %row.id, "stopped after {idle}s idle");
                            continue;
                        }
                        Ok(false) => {}
                        Err(e) => tracing::warn!(sandbox = %row.id, "idle stop failed: {e}"),
                    }
                }
            }
            if let (State::Running | State::Paused, Some(idle)) =
                (row.state, row.idle_hibernate_secs)
            {
                if idle_ms >= (idle as i64) * 1000 {
                    match self
                        .idle_step(&row, (idle as i64) * 1000, Idle::Hibernate)
                        .await
                    {
                        Ok(true) => {
                            tracing::info!(sandbox = %row.id, "hibernated after {idle}s idle");
                            continue;
                        }
                        Ok(false) => {}
                        // No swap on this host: said once per sweep at debug level, the
                        // sandbox goes on to its idle pause as if it had no hibernate.
                        Err(CoreError::Unavailable(why)) => {
                            tracing::debug!(sandbox = %row.id, "idle hibernate unavailable: {why}")
                        }
                        Err(e) => tracing::warn!(sandbox = %row.id, "idle hibernate failed: {e}"),
                    }
                }
            }
            if let (State::Running, Some(idle)) = (row.state, row.idle_pause_secs) {
                if idle_ms >= (idle as i64) * 1000 {
                    match self
                        .idle_step(&row, (idle as i64) * 1000, Idle::Pause)
                        .await
                    {
                        Ok(true) => tracing::info!(sandbox = %row.id, "paused after {idle}s idle"),
                        Ok(false) => {}
                        Err(e) => tracing::warn!(sandbox = %row.id, "idle pause failed: {e}"),
                    }
                }
            }
        }
        Ok(())
    }

    /// How long `row` has had no call, in ms; 0 while a call is in flight.
    fn idle_ms(&self, row: &SandboxRow, now: i64) -> i64 {
        let live = self.live(&row.id);
        if live.inflight.load(Ordering::SeqCst) > 0 {
            return 0;
        }
        now - live
            .last_active
            .load(Ordering::SeqCst)
            .max(row.last_active_at)
    }

    /// The idle sweeper's pause, hibernate or stop: decided under the lifecycle lock,
    /// where calls register as in flight, so it never freezes, hibernates or stops a
    /// sandbox in the middle of a call (F1). True when it acted.
    pub(super) async fn idle_step(
        &self,
        row: &SandboxRow,
        idle_ms: i64,
        what: Idle,
    ) -> Result<bool> {
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
        Ok(match what {
            Idle::Stop => self.apply(&row, &live, Op::IdleStop { inflight }).await? == Step::Halt,
            Idle::Hibernate => {
                let op = Op::IdleHibernate { inflight };
                self.apply(&row, &live, op).await? == Step::Hibernate
            }
            Idle::Pause => {
                self.apply(&row, &live, Op::IdlePause { inflight }).await? == Step::Freeze
            }
        })
    }
}

/// What the idle sweeper does to a sandbox that has had no call for long enough.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Idle {
    Pause,
    Hibernate,
    Stop,
}
