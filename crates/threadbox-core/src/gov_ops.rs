//! The governance operations of [`threadbox_api::ops`] (keys, quotas, usage, the audit
//! log, sandbox counts), run by the manager as [`crate::ops`] runs the sandbox ones: each
//! is its manager method (`manager/governance/`), which checks the scope, validates and
//! audits.

use crate::error::Result;
use crate::ops::Run;
use crate::{Caller, Manager};
use threadbox_api::ops::*;
use threadbox_api::{
    ApiKeyList, AuditList, AuditVerification, CreatedKey, TenantQuota, UsageReport,
};

impl Run for CreateKey {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<CreatedKey> {
        m.create_key(caller, self.0).await
    }
}

impl Run for ListKeys {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<ApiKeyList> {
        m.list_keys(caller, self.tenant.as_deref()).await
    }
}

impl Run for RevokeKey {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<()> {
        m.revoke_key(caller, &self.key_id).await
    }
}

impl Run for GetQuota {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<TenantQuota> {
        m.get_quota(caller, &self.tenant).await
    }
}

impl Run for SetQuota {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<TenantQuota> {
        m.set_quota(caller, &self.tenant, self.quota).await
    }
}

impl Run for GetUsage {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<UsageReport> {
        m.usage(caller, self.tenant.as_deref(), self.since.as_deref())
            .await
    }
}

impl Run for ListAudit {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<AuditList> {
        m.audit_list(caller, self.after, self.since.as_deref(), self.limit)
            .await
    }
}

impl Run for VerifyAudit {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<AuditVerification> {
        m.audit_verify(caller).await
    }
}

impl Run for SandboxCounts {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<MetricsSnapshot> {
        m.metrics_snapshot(caller).await
    }
}
