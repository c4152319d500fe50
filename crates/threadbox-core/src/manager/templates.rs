//! Templates (issue 14 scope 5, ADR 0110): a named, immutable clone of a sandbox's disk
//! (one of its checkpoints, or a fresh internal one) plus its image, limits, labels and
//! network policy as defaults; or the same built from an image by running steps in a
//! temporary sandbox. `create --template` clones the template's disk the way a fork clones
//! a checkpoint (owners shifted into the new slot), so a sandbox never depends on its
//! template: deleting the template leaves its sandboxes intact.
//!
//! Crash safety as for checkpoints: the disk is made (`.tmp`, then renamed) before the row
//! and removed after it; `reconcile_templates` removes disks without a row and forgets rows
//! without a disk. The internal checkpoint (`tk-…`) has no row and is removed by
//! `reconcile_checkpoints` if a crash leaves it.

use super::*;
use crate::store_templates::TemplateRow;
use threadbox_api::templates::*;

/// Seconds a build step may run unless the request says otherwise.
const DEFAULT_STEP_TIMEOUT_SECS: f64 = 600.0;
/// Most build steps one template may have.
const MAX_STEPS: usize = 64;
/// The label a build sandbox carries (a crash mid-build leaves it visible, so named).
pub const BUILD_LABEL: &str = "threadbox-template-build";

/// Where a new sandbox's disk comes from, instead of a fresh image.
pub(super) enum DiskFrom<'a> {
    Fork(&'a super::checkpoints::ForkSource),
    Template(&'a str),
}

fn validate_template_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'-' | b'_' | b'.')
        })
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && !name.starts_with("tp-");
    if ok {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "template name {name:?} must be 1-63 characters of a-z, 0-9, '-', '_', '.', start \
             with a letter or digit and not start with 'tp-'"
        )))
    }
}

/// The last `n` bytes of `s`, on a character boundary (for error messages).
fn tail(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut i = s.len() - n;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

impl Manager {
    async fn to_api_template(&self, t: &TemplateRow) -> Result<Template> {
        let network = match &t.network_policy {
            Some(json) => Some(serde_json::from_str(json).map_err(|e| {
                CoreError::Internal(format!("stored network policy of template {}: {e}", t.id))
            })?),
            None => None,
        };
        Ok(Template {
            id: t.id.clone(),
            name: t.name.clone(),
            source: t.source.clone(),
            image: t.image.clone(),
            tier: t.tier.clone(),
            memory_bytes: t.memory_bytes,
            cpus: t.cpus,
            pids: t.pids,
            disk_bytes: t.disk_bytes,
            labels: t.labels.clone(),
            network,
            size_bytes: t.size_bytes,
            method: t.method.clone(),
            sandboxes: self.store.template_users(&t.id).await?,
            created_at: rfc3339(t.created_at),
        })
    }

    /// The caller's template `name_or_id`; another tenant's is not found.
    pub(super) async fn resolve_template(
        &self,
        caller: &Caller,
        name_or_id: &str,
    ) -> Result<TemplateRow> {
        self.store
            .get_template(&caller.tenant, name_or_id)
            .await?
            .ok_or_else(|| CoreError::NotFound(format!("template {name_or_id:?}")))
    }

    /// `req` with the template's defaults in the fields it leaves empty; refused when it
    /// asks for what the template's disk cannot be (another image, tier or disk size).
    pub(super) fn apply_template(
        &self,
        t: &TemplateRow,
        mut req: CreateSandboxRequest,
    ) -> Result<CreateSandboxRequest> {
        let differs = |what: &str, given: &str, has: &str| {
            CoreError::InvalidArgument(format!(
                "{what} {given} differs from template {}'s ({has}): its disk is a clone made \
                 for that",
                t.name
            ))
        };
        if let Some(image) = req.image.as_deref().filter(|i| *i != t.image) {
            return Err(differs("image", image, &t.image));
        }
        if let Some(tier) = req.tier.as_deref().filter(|i| *i != t.tier) {
            return Err(differs("tier", tier, &t.tier));
        }
        if let Some(d) = req.limits.disk_bytes.filter(|d| *d != t.disk_bytes) {
            return Err(differs(
                "disk_bytes",
                &d.to_string(),
                &t.disk_bytes.to_string(),
            ));
        }
        req.image = Some(t.image.clone());
        req.tier = Some(t.tier.clone());
        req.limits.disk_bytes = Some(t.disk_bytes);
        req.limits.memory_bytes = req.limits.memory_bytes.or(Some(t.memory_bytes));
        req.limits.cpus = req.limits.cpus.or(Some(t.cpus));
        req.limits.pids = req.limits.pids.or(Some(t.pids));
        let mut labels = t.labels.clone();
        labels.append(&mut req.labels);
        req.labels = labels;
        if req.network.is_none() {
            req.network = match &t.network_policy {
                Some(json) => Some(serde_json::from_str(json).map_err(|e| {
                    CoreError::Internal(format!("stored network policy of template {}: {e}", t.id))
                })?),
                None => None,
            };
        }
        Ok(req)
    }

    pub async fn create_template(
        &self,
        caller: &Caller,
        op: CreateTemplate,
    ) -> Result<CreatedTemplate> {
        let r = self.create_template_inner(caller, &op.request).await;
        self.audit(caller, CreateTemplate::NAME, &op.request.name, &r)
            .await;
        r
    }

    async fn create_template_inner(
        &self,
        caller: &Caller,
        req: &CreateTemplateRequest,
    ) -> Result<CreatedTemplate> {
        caller.require(CreateTemplate::SCOPE)?;
        validate_template_name(&req.name)?;
        validate_labels(&req.labels)?;
        if let Some(n) = &req.network {
            super::network::check_policy(n)?;
        }
        if self
            .store
            .get_template(&caller.tenant, &req.name)
            .await?
            .is_some()
        {
            return Err(CoreError::Conflict(format!(
                "a template named {:?} exists already",
                req.name
            )));
        }
        match &req.from {
            Some(from) => {
                if req.image.is_some() || !req.run.is_empty() {
                    return Err(CoreError::InvalidArgument(
                        "a template is made either from a sandbox (from, checkpoint) or from \
                         an image with build steps (image, run), not both"
                            .into(),
                    ));
                }
                let t = self.template_from_sandbox(caller, req, from).await?;
                Ok(CreatedTemplate {
                    template: t,
                    steps: Vec::new(),
                })
            }
            None => {
                if req.checkpoint.is_some() {
                    return Err(CoreError::InvalidArgument(
                        "checkpoint names a checkpoint of the sandbox given by from".into(),
                    ));
                }
                self.template_from_build(caller, req).await
            }
        }
    }

    /// The template of `req` from sandbox `from`: its checkpoint `req.checkpoint`, or a
    /// fresh internal one. The sandbox's settings are the defaults; `req`'s win.
    async fn template_from_sandbox(
        &self,
        caller: &Caller,
        req: &CreateTemplateRequest,
        from: &str,
    ) -> Result<Template> {
        let row = self.resolve(caller, from).await?;
        if let Some(d) = req.limits.disk_bytes.filter(|d| *d != row.disk_bytes) {
            return Err(CoreError::InvalidArgument(format!(
                "disk_bytes {d} differs from sandbox {}'s ({}): the template's disk is a clone \
                 of it",
                row.id, row.disk_bytes
            )));
        }
        let live = self.live(&row.id);
        let _g = live.lifecycle.lock().await;
        let row = self.reload(&row.id).await?;
        let driver = self.driver_for(&row)?;
        let tpl = format!("tp-{}", uuid::Uuid::new_v4().simple());
        // Refused before any disk is made when its clone cannot fit (ADR 0165); checked
        // again, under the admission lock, with the clone's real size.
        let room = self.disk_room(&row.tenant).await?;
        let (ckpt, internal, source) = match &req.checkpoint {
            Some(name) => {
                let rows = self.store.checkpoints_of(&row.id).await?;
                let c = rows
                    .iter()
                    .find(|c| c.id == *name || c.label.as_deref() == Some(name))
                    .ok_or_else(|| {
                        CoreError::NotFound(format!("checkpoint {name:?} of sandbox {}", row.id))
                    })?;
                if let Some(left) = room.filter(|left| c.size_bytes > *left) {
                    return Err(CoreError::QuotaExceeded {
                        tenant: row.tenant.clone(),
                        quota: "disk_bytes",
                        used: format!(
                            "{} bytes for the template (checkpoint {name:?}'s size)",
                            c.size_bytes
                        ),
                        limit: format!("{left} bytes left"),
                        extra: "; delete templates, checkpoints or sandboxes".into(),
                    });
                }
                (c.id.clone(), false, format!("sandbox {}:{name}", row.id))
            }
            None => {
                self.refuse_clone_over_room(&row, room, "template").await?;
                let ck = format!("tk-{}", uuid::Uuid::new_v4().simple());
                self.clone_disk_frozen(&row, &ck).await?;
                (ck, true, format!("sandbox {}", row.id))
            }
        };
        let saved = driver
            .save_template_disk(&row.id, row.slot, &ckpt, &tpl)
            .await;
        if internal {
            let _ = driver.remove_checkpoint_disk(&row.id, &ckpt).await;
        }
        let clone = saved?;
        let mut labels = row.labels.clone();
        labels.extend(req.labels.clone());
        let network_policy = match &req.network {
            Some(n) => Some(super::network::check_policy(n)?),
            None => row.network_policy.clone(),
        };
        let t = TemplateRow {
            id: tpl.clone(),
            tenant: caller.tenant.clone(),
            name: req.name.clone(),
            source,
            image: row.image.clone(),
            tier: row.tier.clone(),
            memory_bytes: req.limits.memory_bytes.unwrap_or(row.memory_bytes),
            cpus: req.limits.cpus.unwrap_or(row.cpus),
            pids: req.limits.pids.unwrap_or(row.pids),
            disk_bytes: row.disk_bytes,
            labels,
            network_policy,
            size_bytes: clone.bytes,
            method: clone.method.to_string(),
            created_at: now_ms(),
        };
        self.insert_template_admitted(driver.as_ref(), &t).await
    }

    /// Inserts `t` (its disk made) if the tenant's disk quota has room for it; otherwise,
    /// or when the insert fails, its disk goes.
    async fn insert_template_admitted(
        &self,
        driver: &dyn Driver,
        t: &TemplateRow,
    ) -> Result<Template> {
        let inserted = async {
            let _adm = self.gov.admission.lock().await;
            let room = self.disk_room(&t.tenant).await?;
            if room.is_some_and(|left| t.size_bytes > left) {
                return Err(CoreError::QuotaExceeded {
                    tenant: t.tenant.clone(),
                    quota: "disk_bytes",
                    used: format!("{} bytes for the template", t.size_bytes),
                    limit: format!("{} bytes left", room.unwrap_or(0)),
                    extra: "; delete templates, checkpoints or sandboxes".into(),
                });
            }
            self.store.insert_template(t).await
        }
        .await;
        if let Err(e) = inserted {
            let _ = driver.remove_template_disk(&t.id).await;
            return Err(e);
        }
        tracing::info!(template = %t.id, name = %t.name, method = %t.method, bytes = t.size_bytes, "template");
        if self.pool_holds_template(t) {
            // The refill task sleeps until woken: it has sandboxes of this one to boot.
            self.pool_wake.notify_one();
        }
        self.to_api_template(t).await
    }

    /// A template built from `req.image` by running `req.run` in a temporary sandbox with
    /// `req`'s policy and limits; the sandbox is deleted whatever happens.
    async fn template_from_build(
        &self,
        caller: &Caller,
        req: &CreateTemplateRequest,
    ) -> Result<CreatedTemplate> {
        if req.run.len() > MAX_STEPS {
            return Err(CoreError::InvalidArgument(format!(
                "at most {MAX_STEPS} build steps"
            )));
        }
        if req.run.iter().any(|s| s.trim().is_empty()) {
            return Err(CoreError::InvalidArgument(
                "a build step must not be empty".into(),
            ));
        }
        let timeout = req.step_timeout_secs.unwrap_or(DEFAULT_STEP_TIMEOUT_SECS);
        if !(timeout.is_finite() && timeout > 0.0 && timeout <= 24.0 * 3600.0) {
            return Err(CoreError::InvalidArgument(
                "step_timeout_secs must be between 0 and 86400".into(),
            ));
        }
        let mut labels = BTreeMap::new();
        labels.insert(BUILD_LABEL.to_string(), req.name.clone());
        let build = CreateSandboxRequest {
            labels,
            image: req.image.clone(),
            limits: req.limits.clone(),
            network: req.network.clone(),
            ..Default::default()
        };
        let (sb, _) = self.create(caller, build).await?;
        let r = self.build_in(caller, req, &sb.id, timeout).await;
        // The daemon removes its own build sandbox: the caller may hold no delete scope.
        if let Err(e) = self
            .delete(&Caller::system(&caller.tenant), &sb.id, true)
            .await
        {
            tracing::warn!(sandbox = %sb.id, "template build: the build sandbox was not deleted: {e}");
        }
        r
    }

    async fn build_in(
        &self,
        caller: &Caller,
        req: &CreateTemplateRequest,
        sandbox: &str,
        timeout: f64,
    ) -> Result<CreatedTemplate> {
        let mut steps = Vec::new();
        for (i, run) in req.run.iter().enumerate() {
            let out = self
                .exec(
                    caller,
                    sandbox,
                    ExecRequest {
                        shell: Some(run.clone()),
                        timeout_secs: Some(timeout),
                        ..Default::default()
                    },
                )
                .await?;
            let text = |s: &str| match out.encoding {
                threadbox_api::Encoding::Base64 => base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default(),
                _ => s.to_string(),
            };
            let step = BuildStep {
                run: run.clone(),
                exit_code: out.exit_code,
                stdout: text(&out.stdout),
                stderr: text(&out.stderr),
            };
            tracing::info!(template = %req.name, step = i + 1, exit_code = ?step.exit_code, "template build step");
            if step.exit_code != Some(0) {
                let how = match step.exit_code {
                    Some(c) => format!("exited with {c}"),
                    None if out.timed_out => format!("timed out after {timeout} s"),
                    None => "was killed".to_string(),
                };
                return Err(CoreError::PreconditionFailed(format!(
                    "build step {} of template {:?} ({run:?}) {how}; nothing was kept. \
                     stderr: {}",
                    i + 1,
                    req.name,
                    tail(step.stderr.trim_end(), 2000)
                )));
            }
            steps.push(step);
        }
        let row = self.resolve(caller, sandbox).await?;
        let driver = self.driver_for(&row)?;
        let tpl = format!("tp-{}", uuid::Uuid::new_v4().simple());
        let ck = format!("tk-{}", uuid::Uuid::new_v4().simple());
        let clone = {
            let live = self.live(&row.id);
            let _g = live.lifecycle.lock().await;
            let row = self.reload(&row.id).await?;
            let room = self.disk_room(&row.tenant).await?;
            self.refuse_clone_over_room(&row, room, "template").await?;
            self.clone_disk_frozen(&row, &ck).await?;
            let saved = driver
                .save_template_disk(&row.id, row.slot, &ck, &tpl)
                .await;
            let _ = driver.remove_checkpoint_disk(&row.id, &ck).await;
            saved?
        };
        let mut labels = req.labels.clone();
        labels.remove(BUILD_LABEL);
        let t = TemplateRow {
            id: tpl,
            tenant: caller.tenant.clone(),
            name: req.name.clone(),
            source: format!("image {} + {} steps", row.image, req.run.len()),
            image: row.image.clone(),
            tier: row.tier.clone(),
            memory_bytes: row.memory_bytes,
            cpus: row.cpus,
            pids: row.pids,
            disk_bytes: row.disk_bytes,
            labels,
            network_policy: row.network_policy.clone(),
            size_bytes: clone.bytes,
            method: clone.method.to_string(),
            created_at: now_ms(),
        };
        let template = self.insert_template_admitted(driver.as_ref(), &t).await?;
        Ok(CreatedTemplate { template, steps })
    }

    pub async fn list_templates(&self, caller: &Caller) -> Result<TemplateList> {
        caller.require(ListTemplates::SCOPE)?;
        let mut templates = Vec::new();
        for t in self.store.templates_of(Some(&caller.tenant)).await? {
            templates.push(self.to_api_template(&t).await?);
        }
        Ok(TemplateList { templates })
    }

    pub async fn get_template(&self, caller: &Caller, op: GetTemplate) -> Result<Template> {
        caller.require(GetTemplate::SCOPE)?;
        let t = self.resolve_template(caller, &op.template).await?;
        self.to_api_template(&t).await
    }

    pub async fn delete_template(&self, caller: &Caller, op: DeleteTemplate) -> Result<()> {
        let r = async {
            caller.require(DeleteTemplate::SCOPE)?;
            let t = self.resolve_template(caller, &op.template).await?;
            if self.pool_holds_template(&t) {
                return Err(CoreError::Conflict(format!(
                    "template {:?} is kept warm by the daemon's pool (serve \
                     --warm-pool-template); the operator must drop it from the pool first",
                    t.name
                )));
            }
            // Row first: a crash leaves a disk without a row, removed at the next start.
            // Sandboxes made from it are untouched (their disks are clones); pooled ones
            // cannot exist (refused above).
            self.store.delete_template(&t.id).await?;
            self.drivers.get(&t.tier)?.remove_template_disk(&t.id).await
        }
        .await;
        self.audit(caller, DeleteTemplate::NAME, &op.template, &r)
            .await;
        r
    }

    /// After a crash: template rows without a disk go, disks without a row are removed.
    pub(super) async fn reconcile_templates(&self) -> Result<()> {
        self.store.sweep_template_uses().await?;
        let rows = self.store.templates_of(None).await?;
        for tier in self.drivers.tiers() {
            let driver = self.drivers.get(tier)?;
            let on_disk = driver.template_disks().await;
            for t in rows.iter().filter(|t| t.tier == tier) {
                if !on_disk.contains(&t.id) {
                    tracing::warn!(template = %t.id, "template without its disk: forgotten");
                    self.store.delete_template(&t.id).await?;
                }
            }
            for d in on_disk {
                if !rows.iter().any(|t| t.id == d) {
                    tracing::info!(template = %d, "removed a disk left by an interrupted template");
                    driver.remove_template_disk(&d).await?;
                }
            }
        }
        Ok(())
    }
}

impl crate::ops::Run for CreateTemplate {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<CreatedTemplate> {
        m.create_template(caller, self).await
    }
}

impl crate::ops::Run for ListTemplates {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<TemplateList> {
        m.list_templates(caller).await
    }
}

impl crate::ops::Run for GetTemplate {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<Template> {
        m.get_template(caller, self).await
    }
}

impl crate::ops::Run for DeleteTemplate {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<()> {
        m.delete_template(caller, self).await
    }
}
