//! Create (and get-or-create), boot, get and list.

use super::*;

/// How a boot starts the sandbox's processes.
#[derive(Clone, Copy)]
pub(super) enum Launch<'a> {
    /// Afresh on its disk.
    Fresh,
    /// A fork: from the parent's fork image when `memory`, else afresh.
    Fork(&'a super::checkpoints::ForkSource),
    /// From the memory image of this checkpoint (its disk restored from it), ADR 0195.
    Memory(&'a str),
}

impl Manager {
    /// The image row `name`; `invalid_argument` when it does not exist.
    pub(super) async fn image_row(&self, name: &str) -> Result<ImageRow> {
        self.store
            .get_image(name)
            .await?
            .ok_or_else(|| CoreError::InvalidArgument(format!("image {name:?} does not exist")))
    }

    /// What the driver is to run for `row`.
    pub(super) async fn spec_of(&self, row: &SandboxRow) -> Result<SandboxSpec> {
        let trust_ca = self.secret_ca_of(&row.id).await?;
        Ok(SandboxSpec {
            network: row.network_policy.is_some() || row.otlp_relay || trust_ca.is_some(),
            id: row.id.clone(),
            hostname: row.name.clone().unwrap_or_else(|| row.id.clone()),
            index: row.slot,
            image: self.image_row(&row.image).await?,
            limits: crate::driver::Limits {
                memory_bytes: row.memory_bytes,
                cpus: row.cpus,
                pids: row.pids,
            },
            disk_bytes: row.disk_bytes,
            trust_ca,
        })
    }

    /// Starts the agent of `row` and connects to it. Caller holds the lifecycle lock.
    pub(super) async fn boot(&self, row: &SandboxRow, live: &Live) -> Result<i32> {
        self.boot_from(row, live, Launch::Fresh).await
    }

    /// [`Manager::boot`], or from a memory image: a parent's fork image (ADR 0136) or a
    /// checkpoint's (ADR 0195).
    pub(super) async fn boot_from(
        &self,
        row: &SandboxRow,
        live: &Live,
        how: Launch<'_>,
    ) -> Result<i32> {
        let start = std::time::Instant::now();
        let spec = self.spec_of(row).await?;
        let driver = self.driver_for(row)?;
        let t0 = std::time::Instant::now();
        let launched = match how {
            Launch::Fork(f) if f.memory => driver.launch_fork(&spec, &f.from, &f.ckpt).await,
            Launch::Memory(ckpt) => driver.boot_memory_checkpoint(&spec, ckpt).await,
            Launch::Fresh | Launch::Fork(_) => driver.launch(&spec).await,
        };
        let pid = launched.inspect_err(|_| {
            self.metrics().boot_failures.inc(["launch"]);
        })?;
        let t1 = std::time::Instant::now();
        match AgentConn::connect(driver.as_ref(), &row.id, AGENT_CONNECT_TIMEOUT).await {
            Ok(conn) => {
                let t2 = std::time::Instant::now();
                // Secrets: the sandbox trusts the egress CA before anything runs in it.
                if let Err(e) = self.install_secret_ca(&row.id, &conn).await {
                    tracing::error!(sandbox = %row.id, "secrets: the egress CA was not installed: {e}");
                }
                Self::set_conn(live, Some(conn));
                let t3 = std::time::Instant::now();
                self.attach_network(row, pid).await;
                tracing::debug!(
                    sandbox = %row.id,
                    spec_us = (t0 - start).as_micros() as u64,
                    launch_us = (t1 - t0).as_micros() as u64,
                    handshake_us = (t2 - t1).as_micros() as u64,
                    ca_us = (t3 - t2).as_micros() as u64,
                    network_us = t3.elapsed().as_micros() as u64,
                    "boot phases"
                );
                Ok(pid)
            }
            Err(e) => {
                self.metrics().boot_failures.inc(["agent"]);
                let _ = driver.stop(&row.id).await;
                Err(e)
            }
        }
    }

    /// Creates a sandbox, or returns the existing one of that name (`created == false`).
    pub async fn create(
        &self,
        caller: &Caller,
        req: CreateSandboxRequest,
    ) -> Result<(Sandbox, bool)> {
        let name = req.name.clone().unwrap_or_else(|| "-".to_string());
        // `None`: the sandbox of that name this create waited for was itself being
        // created and failed (and is gone): try again rather than answer `not_found` (F4).
        // Bounded: every round waits for one whole failed create of that name.
        let mut r = Ok(None);
        // A template's defaults fill the fields the request leaves empty (ADR 0110).
        let template = match req.template.as_deref() {
            Some(t) => match self.resolve_template(caller, t).await {
                Ok(row) => Some(row),
                Err(e) => {
                    let r = Err(e);
                    self.audit(caller, ops::CreateSandbox::NAME, &name, &r)
                        .await;
                    return r;
                }
            },
            None => None,
        };
        let (req, from) = match &template {
            Some(t) => match self.apply_template(t, req) {
                Ok(req) => (
                    req,
                    Some(super::templates::DiskFrom::Template(t.id.as_str())),
                ),
                Err(e) => {
                    let r = Err(e);
                    self.audit(caller, ops::CreateSandbox::NAME, &name, &r)
                        .await;
                    return r;
                }
            },
            None => (req, None),
        };
        for _ in 0..8 {
            r = self.create_inner(caller, req.clone(), from.as_ref()).await;
            if !matches!(r, Ok(None)) {
                break;
            }
        }
        let r = r.and_then(|o| {
            o.ok_or_else(|| {
                CoreError::Unavailable(format!(
                    "sandbox {name} kept failing to be created by concurrent requests"
                ))
            })
        });
        let target = match &r {
            Ok((sb, _)) => sb.id.clone(),
            Err(_) => name,
        };
        self.audit(caller, ops::CreateSandbox::NAME, &target, &r)
            .await;
        r
    }

    pub(super) async fn create_inner(
        &self,
        caller: &Caller,
        req: CreateSandboxRequest,
        from: Option<&super::templates::DiskFrom<'_>>,
    ) -> Result<Option<(Sandbox, bool)>> {
        caller.require(ops::CreateSandbox::SCOPE)?;
        // The pool's refill boots nothing while this runs (ADR 0213).
        let _busy = self.creating.enter();
        if let Some(name) = &req.name {
            validate_name(name)?;
        }
        validate_labels(&req.labels)?;
        // Refused before anything exists, with the bad rule named.
        let network_json = req
            .network
            .as_ref()
            .map(super::network::check_policy)
            .transpose()?;
        self.check_create_secrets(caller, &req.secrets).await?;
        if req.otlp_relay && self.config.trace_relay.is_none() {
            return Err(CoreError::InvalidArgument(
                "otlp_relay needs a daemon that exports traces (serve --otlp-endpoint)".into(),
            ));
        }
        let memory_bytes = req
            .limits
            .memory_bytes
            .unwrap_or(self.config.default_memory_bytes);
        if !(16 << 20..=1 << 40).contains(&memory_bytes) {
            return Err(CoreError::InvalidArgument(
                "memory_bytes must be between 16 MiB and 1 TiB".into(),
            ));
        }
        let cpus = req.limits.cpus.unwrap_or(self.config.default_cpus);
        if !(cpus.is_finite() && (0.01..=1024.0).contains(&cpus)) {
            return Err(CoreError::InvalidArgument(
                "cpus must be between 0.01 and 1024".into(),
            ));
        }
        let tier = req
            .tier
            .clone()
            .unwrap_or_else(|| self.drivers.default_tier().to_string());
        let driver = self.drivers.get(&tier)?;
        {
            use crate::driver::capability::EGRESS;
            if network_json.is_some() {
                self.require_capability(&tier, EGRESS, "a network policy")?;
            }
            if !req.secrets.is_empty() {
                self.require_capability(&tier, EGRESS, "secrets (swapped in egress)")?;
            }
            if req.otlp_relay {
                self.require_capability(&tier, EGRESS, "otlp_relay")?;
            }
        }
        let pids = req.limits.pids.unwrap_or(self.config.default_pids);
        if !(8..=1 << 22).contains(&pids) {
            return Err(CoreError::InvalidArgument(
                "pids must be between 8 and 4194304".into(),
            ));
        }
        let max_disk = self
            .config
            .max_disk_bytes
            .clamp(crate::MIN_DISK_BYTES, crate::MAX_DISK_BYTES);
        let requested_disk = req.limits.disk_bytes;
        if let Some(d) = requested_disk {
            if !(crate::MIN_DISK_BYTES..=crate::MAX_DISK_BYTES).contains(&d) {
                return Err(CoreError::InvalidArgument(
                    "disk_bytes must be between 16 MiB and 16 TiB".into(),
                ));
            }
            if d > max_disk {
                return Err(CoreError::InvalidArgument(format!(
                    "disk_bytes {d} is more than this daemon allows for one sandbox \
                     ({max_disk} bytes, set by the operator with --max-disk-bytes)"
                )));
            }
        }
        let default_disk = self.config.default_disk_bytes.min(max_disk);
        // Final once the tenant's disk quota is known (admit_disk, below).
        let disk_bytes = requested_disk.unwrap_or(default_disk);
        for (what, v) in [
            ("idle_pause_secs", req.idle_pause_secs),
            ("idle_stop_secs", req.idle_stop_secs),
            ("idle_hibernate_secs", req.idle_hibernate_secs),
            ("ttl_secs", req.ttl_secs),
        ] {
            if let Some(v) = v {
                if v == 0 || v > 10 * 365 * 24 * 3600 {
                    return Err(CoreError::InvalidArgument(format!(
                        "{what} must be between 1 and 315360000"
                    )));
                }
            }
        }
        let image = req.image.clone().unwrap_or_else(|| HOST_IMAGE.to_string());
        // Refused before anything exists: an image this tier cannot boot.
        driver.resolve_image(&self.image_row(&image).await?).await?;
        // And one whose config names a user it does not have (ADR 0160).
        self.image_run(&image).await?;

        let created = now_ms();
        let mut id = format!("sb-{}", uuid::Uuid::new_v4().simple());
        let mut row = SandboxRow {
            id: id.clone(),
            tenant: caller.tenant.clone(),
            name: req.name.clone(),
            state: State::Creating,
            labels: req.labels,
            image,
            memory_bytes,
            cpus,
            pids,
            disk_bytes,
            idle_pause_secs: req.idle_pause_secs,
            idle_stop_secs: req.idle_stop_secs,
            idle_hibernate_secs: req.idle_hibernate_secs,
            ttl_secs: req.ttl_secs,
            ttl_action: req.ttl_action,
            slot: 0,
            agent_pid: None,
            created_at: created,
            last_active_at: created,
            tier: tier.to_string(),
            network_policy: None,
            network_generation: 0,
            otlp_relay: req.otlp_relay,
        };
        let mut live = self.live(&id);
        // Whether a staged slot serves this create (ADR 0180).
        let mut staged = false;
        // Held across the insert so two creates of one name cannot both insert; the new
        // sandbox's lifecycle lock is taken before the name is visible, so a concurrent
        // get-or-create of the same name waits until it is running.
        let guard = {
            let _c = self.create_lock.lock().await;
            if let Some(name) = &req.name {
                if let Some(existing) = self.store.get_sandbox(&caller.tenant, name).await? {
                    drop(_c);
                    self.forget(&id);
                    let l = self.live(&existing.id);
                    let _g = l.lifecycle.lock().await;
                    return match self.reload(&existing.id).await {
                        Ok(row) => Ok(Some((to_api(&self.drivers, caller, &row), false))),
                        Err(CoreError::NotFound(_)) => Ok(None),
                        Err(e) => Err(e),
                    };
                }
            }
            // Checked and inserted under the admission lock, so two creates cannot both
            // take the last place of a quota; refused before anything exists.
            let _adm = self.gov.admission.lock().await;
            let admitted = match self
                .admit(&caller.tenant, Admit::Create { memory_bytes, cpus })
                .await
            {
                Ok(()) => {
                    self.admit_disk(&caller.tenant, &row.image, requested_disk, default_disk)
                        .await
                }
                Err(e) => Err(e),
            };
            match admitted {
                Ok(disk) => row.disk_bytes = disk,
                Err(e) => {
                    self.forget(&id);
                    return Err(e);
                }
            }
            // Fast path: a pre-booted sandbox of the warm pool, adopted in one UPDATE (not
            // for a fork: its disk is the parent's).
            // Nor with secrets: their CA is bound into the image's bundle at boot.
            let pooled = match from {
                _ if !req.secrets.is_empty() => Ok(None),
                Some(super::templates::DiskFrom::Fork(_)) => Ok(None),
                Some(super::templates::DiskFrom::Template(t)) => {
                    self.adopt_from_pool(&row, Some(t)).await
                }
                None => self.adopt_from_pool(&row, None).await,
            };
            match pooled {
                Ok(Some(adopted)) => {
                    self.forget(&id);
                    if !req.secrets.is_empty() {
                        self.bind_secrets(&adopted, &req.secrets).await?;
                        if let Some(conn) = self.conn_of(&adopted) {
                            self.install_secret_ca(&adopted, &conn).await?;
                        }
                    }
                    if let Some(json) = &network_json {
                        self.network_on_adopt(&adopted, json).await?;
                    }
                    let row = self.reload(&adopted).await?;
                    tracing::info!(sandbox = %adopted, name = ?row.name, "created from the warm pool");
                    return Ok(Some((to_api(&self.drivers, caller, &row), true)));
                }
                Ok(None) => {}
                Err(e) => {
                    self.forget(&id);
                    return Err(e);
                }
            }
            // A fork may take a staged slot instead of a new row (ADR 0180): the slot's
            // row becomes this sandbox's, and every step below is the cold path's, its
            // disk made into the slot's directory and attached at boot.
            let adopted = match from {
                Some(super::templates::DiskFrom::Fork(_)) if req.secrets.is_empty() => {
                    self.adopt_staged(&row).await
                }
                _ => Ok(None),
            };
            let g = match adopted {
                Ok(Some((sid, slot, g))) => {
                    self.forget(&id);
                    id = sid;
                    row.id = id.clone();
                    row.slot = slot;
                    live = self.live(&id);
                    staged = true;
                    g
                }
                Ok(None) => {
                    let g = live.lifecycle.clone().lock_owned().await;
                    row.slot = self.store.insert_sandbox(&row).await?;
                    g
                }
                Err(e) => {
                    self.forget(&id);
                    return Err(e);
                }
            };
            if let Some(super::templates::DiskFrom::Template(t)) = from {
                if let Err(e) = self.store.set_template_use(&id, t).await {
                    let _ = self.store.delete_sandbox(&id).await;
                    self.forget(&id);
                    return Err(e);
                }
            }
            // Bound before boot, so `boot` installs the CA and attaches the interception.
            if let Err(e) = self.bind_secrets(&id, &req.secrets).await {
                let _ = self.store.delete_sandbox(&id).await;
                self.forget(&id);
                return Err(e);
            }
            if row.otlp_relay {
                // Before boot, so `boot` opens the endpoint; a crash in between leaves a
                // `creating` row, which the next start destroys.
                if let Err(e) = self.store.set_otlp_relay(&id, true).await {
                    let _ = self.store.delete_sandbox(&id).await;
                    self.forget(&id);
                    return Err(e);
                }
            }
            if let Some(json) = &network_json {
                // Stored before boot, so `boot` attaches it; generation 1.
                match self.store.swap_network(&id, 0, Some(json)).await {
                    Ok(Some(g)) => {
                        row.network_policy = Some(json.clone());
                        row.network_generation = g;
                    }
                    Ok(None) => {
                        let _ = self.store.delete_sandbox(&id).await;
                        self.forget(&id);
                        return Err(CoreError::Internal(
                            "the new sandbox's network policy could not be stored".into(),
                        ));
                    }
                    Err(e) => {
                        let _ = self.store.delete_sandbox(&id).await;
                        self.forget(&id);
                        return Err(e);
                    }
                }
            }
            g
        };
        let result: Result<i32> = async {
            let spec = self.spec_of(&row).await?;
            let t0 = std::time::Instant::now();
            match from {
                Some(super::templates::DiskFrom::Fork(f)) => {
                    self.driver_for(&row)?
                        .fork_disk(&spec, &f.from, f.from_index, &f.ckpt)
                        .await?
                }
                Some(super::templates::DiskFrom::Template(t)) => {
                    self.driver_for(&row)?.template_disk(&spec, t).await?
                }
                None => self.driver_for(&row)?.prepare(&spec).await?,
            }
            let t1 = std::time::Instant::now();
            let how = match from {
                Some(super::templates::DiskFrom::Fork(f)) => Launch::Fork(f),
                _ => Launch::Fresh,
            };
            let pid = self.boot_from(&row, &live, how).await;
            // Where a create's time goes (issue 14's fork target): its disk, then the boot.
            tracing::debug!(
                sandbox = %id,
                from_clone = from.is_some(),
                staged,
                disk_us = (t1 - t0).as_micros() as u64,
                boot_us = t1.elapsed().as_micros() as u64,
                "disk ready and booted"
            );
            pid
        }
        .await;
        match result {
            Ok(pid) => {
                self.store
                    .transition(&id, &[State::Creating], State::Running, Some(pid))
                    .await?;
                drop(guard);
                let row = self.reload(&id).await?;
                if staged {
                    tracing::info!(sandbox = %id, name = ?row.name, agent_pid = pid, "created in a staged slot");
                } else {
                    tracing::info!(sandbox = %id, name = ?row.name, agent_pid = pid, "created");
                }
                Ok(Some((to_api(&self.drivers, caller, &row), true)))
            }
            Err(e) => {
                // Why the agent did not answer is in its log, which goes with the sandbox.
                if let Some(tail) = self.driver_for(&row)?.agent_log_tail(&id).await {
                    tracing::warn!(sandbox = %id, "the agent's log, before its removal:\n{tail}");
                }
                // Nothing half-created: remove what exists, then the row.
                let _ = self.driver_for(&row)?.destroy(&id).await;
                let _ = self.store.delete_sandbox(&id).await;
                drop(guard);
                self.forget(&id);
                tracing::error!(sandbox = %id, "create failed: {e}");
                Err(e)
            }
        }
    }

    pub async fn get(&self, caller: &Caller, id_or_name: &str) -> Result<Sandbox> {
        caller.require(ops::GetSandbox::SCOPE)?;
        Ok(to_api(
            &self.drivers,
            caller,
            &self.resolve(caller, id_or_name).await?,
        ))
    }

    /// The caller's tenant's sandboxes.
    pub async fn list(
        &self,
        caller: &Caller,
        labels: &BTreeMap<String, String>,
        state: Option<SandboxState>,
    ) -> Result<Vec<Sandbox>> {
        caller.require(ops::ListSandboxes::SCOPE)?;
        let rows = self.store.all_sandboxes().await?;
        Ok(rows
            .iter()
            .filter(|r| r.state != State::Deleting && r.tenant == caller.tenant)
            .map(|r| to_api(&self.drivers, caller, r))
            .filter(|s| state.is_none_or(|st| s.state == st))
            .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .collect())
    }
}
