//! Metering: CPU, memory and disk samples, the daily CPU cap, usage reports.

use super::*;

pub(super) fn sandbox_usage(u: &UsageRow, state: &str) -> SandboxUsage {
    SandboxUsage {
        id: u.sandbox_id.clone(),
        name: u.name.clone(),
        state: state.to_string(),
        cpu_seconds: u.cpu_usec as f64 / 1e6,
        memory_gib_seconds: u.mem_byte_ms / 1000.0 / (1u64 << 30) as f64,
        peak_memory_bytes: u.peak_mem_bytes.max(0) as u64,
        disk_bytes: u.disk_bytes.max(0) as u64,
        running_seconds: u.running_ms as f64 / 1000.0,
        paused_seconds: u.paused_ms as f64 / 1000.0,
        // Filled from the egress meter by the caller (store_net_log).
        egress_bytes_up: 0,
        egress_bytes_down: 0,
    }
}

impl Manager {
    /// Adds what `row` used since its last sample to its totals and its tenant's day.
    /// Errors are logged: metering never fails a user's call.
    pub(crate) async fn meter(&self, row: &SandboxRow, with_disk: bool) {
        let _g = self.gov.meter_lock.lock().await;
        if let Err(e) = self.meter_locked(row, with_disk).await {
            tracing::warn!(sandbox = %row.id, "metering failed: {e}");
        }
    }

    pub(super) async fn meter_locked(&self, row: &SandboxRow, with_disk: bool) -> Result<()> {
        let prev = self.store.get_usage(&row.id).await?;
        let now = now_ms();
        let since = prev
            .as_ref()
            .map(|p| p.sampled_at)
            .unwrap_or(row.created_at);
        let elapsed = (now - since).max(0);
        let last_usec = prev.as_ref().map(|p| p.last_cgroup_usec).unwrap_or(0);
        let live = matches!(
            row.state,
            State::Running | State::Paused | State::Hibernated
        );
        let driver = self.driver_for(row)?;
        let id = row.id.clone();
        let usage = if live || with_disk {
            driver.usage(&id, with_disk).await
        } else {
            crate::driver::Usage::default()
        };
        let cpu = if live { usage.cpu_usec } else { None };
        let mem = if live { usage.memory_bytes } else { None };
        let disk = usage.disk_bytes;
        let (cpu_delta, cgroup_usec) = match cpu {
            // A counter below the last reading is a new cgroup (the sandbox was restarted).
            Some(c) => {
                let c = c as i64;
                (if c >= last_usec { c - last_usec } else { c }, c)
            }
            None => (0, 0),
        };
        let mem = mem.unwrap_or(0) as i64;
        let (running_ms, paused_ms) = match row.state {
            State::Running | State::Creating => (elapsed, 0),
            State::Paused | State::Hibernated => (0, elapsed),
            _ => (0, 0),
        };
        let delta = UsageDelta {
            sandbox_id: row.id.clone(),
            tenant: row.tenant.clone(),
            name: row.name.clone(),
            day: utc_day(now),
            at: now,
            cpu_usec: cpu_delta,
            cgroup_usec,
            mem_byte_ms: if live {
                mem as f64 * elapsed as f64
            } else {
                0.0
            },
            mem_bytes: mem,
            disk_bytes: disk.map(|d| d.min(i64::MAX as u64) as i64),
            running_ms,
            paused_ms,
        };
        self.store.apply_usage(&delta).await
    }

    /// Samples every running or paused sandbox, then enforces the daily CPU caps.
    pub(crate) async fn meter_all(&self) -> Result<()> {
        for row in self.store.all_sandboxes().await? {
            if row.tenant == crate::caller::POOL_TENANT {
                continue;
            }
            if matches!(
                row.state,
                State::Running | State::Paused | State::Hibernated
            ) {
                self.meter(&row, true).await;
            }
        }
        self.enforce_cpu_caps().await
    }

    /// Pauses the running sandboxes of every tenant whose CPU-seconds of today reached
    /// its `cpu_seconds_per_day`.
    pub(super) async fn enforce_cpu_caps(&self) -> Result<()> {
        let day = utc_day(now_ms());
        let mut over = Vec::new();
        for (tenant, q) in self.store.all_quotas().await? {
            let Some(cap) = q.cpu_seconds_per_day else {
                continue;
            };
            let used = self.store.cpu_usec_on(&tenant, &day).await?;
            if used as f64 >= cap as f64 * 1e6 {
                over.push(tenant);
            }
        }
        if over.is_empty() {
            return Ok(());
        }
        for row in self.store.all_sandboxes().await? {
            if row.state == State::Running && over.contains(&row.tenant) {
                let caller = Caller::system(&row.tenant);
                match self
                    .pause_for(&caller, &row.id, crate::manager::state::Op::CapPause)
                    .await
                {
                    Ok(_) => tracing::info!(
                        sandbox = %row.id, tenant = %row.tenant,
                        "paused: the tenant reached its daily CPU cap"
                    ),
                    Err(e) => tracing::warn!(sandbox = %row.id, "CPU cap pause failed: {e}"),
                }
            }
        }
        Ok(())
    }

    /// Starts the metering task; it ends when the manager shuts down or is dropped.
    pub(crate) fn spawn_meter(self: &Arc<Self>, mut stop_rx: tokio::sync::watch::Receiver<bool>) {
        let weak = Arc::downgrade(self);
        let interval = self.config.meter_interval;
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = stop_rx.changed() => break,
                }
                let Some(mgr) = weak.upgrade() else { break };
                if let Err(e) = mgr.meter_all().await {
                    tracing::warn!("metering sweep failed: {e}");
                }
            }
        });
    }

    /// `GET /v1/usage`: one tenant (the caller's, or `tenant` for an admin), or every
    /// tenant for an admin who names none. Live sandboxes are sampled first.
    pub async fn usage(
        &self,
        caller: &Caller,
        tenant: Option<&str>,
        since: Option<&str>,
    ) -> Result<UsageReport> {
        caller.require(Scope::SandboxesRead)?;
        let tenants: Vec<String> = match tenant {
            Some(t) => {
                validate_tenant(t)?;
                if t != caller.tenant {
                    caller.require(Scope::Admin)?;
                }
                vec![t.to_string()]
            }
            None if caller.has(Scope::Admin) => self.store.metered_tenants().await?,
            None => vec![caller.tenant.clone()],
        };
        let since_day = since.map(parse_time).transpose()?.map(utc_day);
        let rows = self.store.all_sandboxes().await?;
        for row in rows.iter().filter(|r| tenants.contains(&r.tenant)) {
            if matches!(
                row.state,
                State::Running | State::Paused | State::Hibernated
            ) {
                self.meter(row, false).await;
            }
        }
        let today = utc_day(now_ms());
        let mut report = UsageReport::default();
        for t in tenants {
            let totals = self.store.daily_totals(&t, since_day.as_deref()).await?;
            let net_total = self
                .store
                .net_bytes_of_tenant(&t, since_day.as_deref())
                .await?;
            let net_by_sandbox = self.store.net_bytes_by_sandbox(&t).await?;
            let states: BTreeMap<&str, &str> = rows
                .iter()
                .filter(|r| r.tenant == t)
                .map(|r| (r.id.as_str(), r.state.as_str()))
                .collect();
            let sandboxes: Vec<SandboxUsage> = self
                .store
                .tenant_usage_rows(&t)
                .await?
                .iter()
                .map(|u| {
                    let mut s = sandbox_usage(
                        u,
                        states
                            .get(u.sandbox_id.as_str())
                            .copied()
                            .unwrap_or("deleted"),
                    );
                    if let Some(b) = net_by_sandbox.get(&u.sandbox_id) {
                        s.egress_bytes_up = b.up;
                        s.egress_bytes_down = b.down;
                    }
                    s
                })
                .filter(|s| s.state != "deleted")
                .collect();
            // What the quota counts, part by part (ADR 0165), not only the sandboxes'.
            let disk = self.store.disk_split_of(&t, false).await?;
            report.tenants.push(TenantUsage {
                tenant: t.clone(),
                since_day: since_day.clone(),
                cpu_seconds: totals.cpu_usec as f64 / 1e6,
                memory_gib_seconds: totals.mem_byte_ms / 1000.0 / (1u64 << 30) as f64,
                running_seconds: totals.running_ms as f64 / 1000.0,
                paused_seconds: totals.paused_ms as f64 / 1000.0,
                cpu_seconds_today: self.store.cpu_usec_on(&t, &today).await? as f64 / 1e6,
                disk_bytes: disk.total(),
                disk: disk.into(),
                egress_bytes_up: net_total.up,
                egress_bytes_down: net_total.down,
                sandboxes,
            });
        }
        Ok(report)
    }

    // ---- audit log --------------------------------------------------------------------

    /// Sandboxes per state over every tenant, and each tenant's use (for `/metrics`).
    /// Memory is read from the tier now (one cgroup read per live sandbox); CPU and disk
    /// are the meter's last samples, so a scrape never walks a disk.
    pub async fn metrics_snapshot(
        &self,
        caller: &Caller,
    ) -> Result<threadbox_api::ops::MetricsSnapshot> {
        caller.require(Scope::Admin)?;
        let mut snap = threadbox_api::ops::MetricsSnapshot {
            sandboxes: ["creating", "running", "paused", "hibernated", "stopped"]
                .into_iter()
                .map(|s| (s.to_string(), 0))
                .collect(),
            tenants: BTreeMap::new(),
        };
        for row in self.store.all_sandboxes().await? {
            if row.state == State::Deleting || row.tenant == crate::caller::POOL_TENANT {
                continue;
            }
            *snap
                .sandboxes
                .entry(row.state.as_str().to_string())
                .or_default() += 1;
            let g = snap.tenants.entry(row.tenant.clone()).or_default();
            if matches!(
                row.state,
                State::Running | State::Paused | State::Hibernated
            ) {
                if let Ok(driver) = self.driver_for(&row) {
                    g.memory_bytes += driver.usage(&row.id, false).await.memory_bytes.unwrap_or(0);
                }
            }
        }
        for t in self.store.metered_tenants().await? {
            let g = snap.tenants.entry(t.clone()).or_default();
            for u in self.store.tenant_usage_rows(&t).await? {
                g.cpu_seconds += u.cpu_usec.max(0) as f64 / 1e6;
                g.disk_bytes += u.disk_bytes.max(0) as u64;
            }
        }
        Ok(snap)
    }
}
