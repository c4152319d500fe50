//! Quotas: admission of new work (running sandboxes, memory, CPU, disk) and the tenant quota settings.

use super::*;

impl Manager {
    pub(super) async fn quota_use(&self, tenant: &str) -> Result<QuotaUse> {
        let (running, sandboxes) = self.store.count_sandboxes(tenant).await?;
        let cpu = self.store.cpu_usec_on(tenant, &utc_day(now_ms())).await?;
        let disk = self.store.disk_split_of(tenant, false).await?;
        Ok(QuotaUse {
            running,
            sandboxes,
            cpu_seconds_today: cpu as f64 / 1e6,
            disk_bytes: disk.total(),
            disk: disk.into(),
        })
    }

    pub async fn get_quota(&self, caller: &Caller, tenant: &str) -> Result<TenantQuota> {
        if tenant != caller.tenant {
            caller.require(Scope::Admin)?;
        }
        caller.require(Scope::SandboxesRead)?;
        validate_tenant(tenant)?;
        Ok(TenantQuota {
            tenant: tenant.to_string(),
            quota: self.store.get_quota(tenant).await?.unwrap_or_default(),
            usage: self.quota_use(tenant).await?,
        })
    }

    /// Replaces a tenant's quota (absent fields: unlimited).
    pub async fn set_quota(&self, caller: &Caller, tenant: &str, q: Quota) -> Result<TenantQuota> {
        let r = async {
            caller.require(Scope::Admin)?;
            validate_tenant(tenant)?;
            if let Some(c) = q.max_cpus {
                if !(c.is_finite() && c > 0.0) {
                    return Err(CoreError::InvalidArgument(
                        "max_cpus must be a positive number".into(),
                    ));
                }
            }
            let entry = self.audit_entry(caller, "quota.set", tenant, "ok");
            let written = self.store.set_quota(tenant, &q, now_ms(), &entry).await;
            {
                let mut cache = self.gov.quotas.lock().unwrap_or_else(|p| p.into_inner());
                cache.generation += 1;
                cache.by_tenant.remove(tenant);
            }
            written?;
            tracing::info!(tenant, quota = ?q, "quota set");
            Ok(())
        }
        .await;
        if r.is_err() {
            self.audit(caller, "quota.set", tenant, &r).await;
        }
        r?;
        self.get_quota(caller, tenant).await
    }

    /// The quota of `tenant` (None: none), from the cache when it holds it.
    pub(crate) async fn cached_quota(&self, tenant: &str) -> Result<Option<Quota>> {
        let generation = {
            let cache = self.gov.quotas.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(q) = cache.by_tenant.get(tenant) {
                return Ok(q.clone());
            }
            cache.generation
        };
        let q = self.store.get_quota(tenant).await?;
        let mut cache = self.gov.quotas.lock().unwrap_or_else(|p| p.into_inner());
        if cache.generation == generation {
            cache.by_tenant.insert(tenant.to_string(), q.clone());
        }
        Ok(q)
    }

    /// Refuses with `quota_exceeded` when `what` would exceed a quota of `tenant`.
    pub(crate) async fn admit(&self, tenant: &str, what: Admit) -> Result<()> {
        let Some(q) = self.cached_quota(tenant).await? else {
            return Ok(());
        };
        let exceeded = |quota: &'static str, used: String, limit: String, extra: &str| {
            CoreError::QuotaExceeded {
                tenant: tenant.to_string(),
                quota,
                used,
                limit,
                extra: extra.to_string(),
            }
        };
        let (running, total) = self.store.count_sandboxes(tenant).await?;
        if let Admit::Create { memory_bytes, cpus } = what {
            if let Some(max) = q.max_memory_bytes {
                if memory_bytes > max {
                    return Err(exceeded(
                        "max_memory_bytes",
                        format!("{memory_bytes} requested"),
                        max.to_string(),
                        " per sandbox",
                    ));
                }
            }
            if let Some(max) = q.max_cpus {
                if cpus > max + 1e-9 {
                    return Err(exceeded(
                        "max_cpus",
                        format!("{cpus} requested"),
                        max.to_string(),
                        " per sandbox",
                    ));
                }
            }
            if let Some(max) = q.max_sandboxes {
                if total >= max {
                    return Err(exceeded(
                        "max_sandboxes",
                        format!("{total} in use"),
                        max.to_string(),
                        "",
                    ));
                }
            }
        }
        if matches!(what, Admit::Create { .. } | Admit::Run) {
            if let Some(max) = q.max_running {
                if running >= max {
                    return Err(exceeded(
                        "max_running",
                        format!("{running} in use"),
                        max.to_string(),
                        "",
                    ));
                }
            }
        }
        if let Some(cap) = q.cpu_seconds_per_day {
            let used = self.store.cpu_usec_on(tenant, &utc_day(now_ms())).await?;
            if used as f64 >= cap as f64 * 1e6 {
                return Err(exceeded(
                    "cpu_seconds_per_day",
                    format!("{:.1} used today", used as f64 / 1e6),
                    cap.to_string(),
                    "; it resets at 00:00 UTC",
                ));
            }
        }
        if let Some(max) = q.disk_bytes {
            let used = self.store.disk_bytes_of(tenant).await?.max(0) as u64;
            if used >= max {
                return Err(exceeded(
                    "disk_bytes",
                    format!("{used} in use"),
                    max.to_string(),
                    "",
                ));
            }
        }
        Ok(())
    }

    /// The disk size a new sandbox of `tenant` on `image` gets, or `quota_exceeded`: it
    /// must fit in what the tenant's `disk_bytes` quota leaves beside what the tenant
    /// holds *allocated* (its sandboxes' disks, ADR 0031, checkpoints, templates and image
    /// layers), together with the layers of `image` the tenant does not use yet (ADR
    /// 0165). A size the request named is refused when it does not fit; the default
    /// (`requested` None) shrinks to the largest power of two that fits, so a small quota
    /// still gets a sandbox from a request that names no size. Call with the admission
    /// lock held.
    pub(crate) async fn admit_disk(
        &self,
        tenant: &str,
        image: &str,
        requested: Option<u64>,
        default: u64,
    ) -> Result<u64> {
        let wanted = requested.unwrap_or(default);
        let Some(limit) = self.cached_quota(tenant).await?.and_then(|q| q.disk_bytes) else {
            return Ok(wanted);
        };
        let held = self.store.disk_split_of(tenant, true).await?;
        let allocated = held.total();
        let new_layers = self.store.new_layer_bytes(tenant, image).await?;
        let left = limit.saturating_sub(allocated);
        if new_layers > 0 && new_layers >= left {
            // The layers alone leave no room for a disk: say so, not "ask for less".
            return Err(CoreError::QuotaExceeded {
                tenant: tenant.to_string(),
                quota: "disk_bytes",
                used: format!(
                    "{new_layers} bytes of image {image:?}'s layers the tenant does not use \
                     yet, {allocated} held ({})",
                    held.parts()
                ),
                limit: limit.to_string(),
                extra: format!(
                    "; {left} bytes are left, less than the image's layers and a disk: use an \
                     image the tenant's sandboxes already use, or delete sandboxes, templates \
                     or checkpoints"
                ),
            });
        }
        let left = left - new_layers;
        if wanted <= left {
            return Ok(wanted);
        }
        if requested.is_none() && left >= crate::MIN_DISK_BYTES {
            // 2^floor(log2(left)): few distinct sizes, so few disk templates (ADR 0011).
            let fitted = 1u64 << (63 - left.leading_zeros());
            return Ok(fitted.min(default));
        }
        Err(CoreError::QuotaExceeded {
            tenant: tenant.to_string(),
            quota: "disk_bytes",
            used: format!(
                "{wanted} requested for the new sandbox's disk, {new_layers} for image \
                 {image:?}'s layers the tenant does not use yet, {allocated} held ({})",
                held.parts()
            ),
            limit: limit.to_string(),
            extra: format!(
                "; {left} bytes are left: ask for at most that in limits.disk_bytes (the \
                 smallest disk is {} bytes) or delete sandboxes",
                crate::MIN_DISK_BYTES
            ),
        })
    }

    // ---- metering ---------------------------------------------------------------------
}
