//! `GET /v1/tiers` (issue 16, ADR 0121): each tier of the daemon, whether the host can run
//! it and why not, its kernel and capabilities; and the capability checks of operations a
//! tier cannot do (refused before anything changes, naming the tier).

use super::Manager;
use crate::caller::Caller;
use crate::error::{CoreError, Result};
use crate::store::SandboxRow;
use threadbox_api::ops::Operation;
use threadbox_api::tiers::{ListTiers, Tier, TierList};

impl Manager {
    pub async fn list_tiers(&self, caller: &Caller) -> Result<TierList> {
        caller.require(ListTiers::SCOPE)?;
        let default = self.drivers.default_tier();
        let mut tiers = Vec::new();
        for d in self.drivers.all() {
            let status = d.status().await;
            tiers.push(Tier {
                name: d.tier().to_string(),
                default: d.tier() == default,
                available: status.unavailable.is_none(),
                reason: status.unavailable,
                kernel: status.kernel,
                version: status.version,
                capabilities: d.capabilities().iter().map(|c| c.to_string()).collect(),
            });
        }
        Ok(TierList { tiers })
    }

    /// The selftest's `tier` check: the sandbox's tier and the kernel it sees.
    pub(crate) async fn tier_check(&self, row: &SandboxRow) -> Result<threadbox_api::PostureCheck> {
        let status = self.drivers.get(&row.tier)?.status().await;
        let mut detail = format!("tier {}", row.tier);
        if let Some(k) = &status.kernel {
            detail.push_str(&format!(", kernel {k}"));
        }
        if let Some(v) = &status.version {
            detail.push_str(&format!(" ({v})"));
        }
        Ok(threadbox_api::PostureCheck {
            name: "tier".into(),
            ok: status.unavailable.is_none(),
            detail,
            applies: true,
        })
    }

    /// `invalid_argument` unless `tier` has `capability` (what `what` needs).
    pub(crate) fn require_capability(
        &self,
        tier: &str,
        capability: &str,
        what: &str,
    ) -> Result<()> {
        if self.drivers.get(tier)?.capabilities().contains(&capability) {
            return Ok(());
        }
        Err(CoreError::InvalidArgument(format!(
            "{what} is not supported on the {tier} tier yet (it has no {capability:?} capability; see GET /v1/tiers)"
        )))
    }

    /// [`Manager::require_capability`] for an existing sandbox's tier.
    pub(crate) fn require_row_capability(
        &self,
        row: &SandboxRow,
        capability: &str,
        what: &str,
    ) -> Result<()> {
        self.require_capability(&row.tier, capability, what)
    }
}

impl crate::ops::Run for ListTiers {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<TierList> {
        m.list_tiers(caller).await
    }
}
