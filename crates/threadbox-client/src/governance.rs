//! Governance calls: API keys, quotas, usage, the audit log, metrics. Each JSON call is
//! its operation's type sent with [`Client::call`] (`threadbox_api::ops`, ADR 0057).

use crate::transport::empty_body;
use crate::{Client, Result};
use hyper::Method;
use threadbox_api::ops;
use threadbox_api::routes;
use threadbox_api::*;

impl Client {
    /// Creates an API key; the returned `key` is shown only this once.
    pub async fn create_key(&self, req: &CreateKeyRequest) -> Result<CreatedKey> {
        self.call(&ops::CreateKey(req.clone())).await
    }

    pub async fn list_keys(&self, tenant: Option<&str>) -> Result<ApiKeyList> {
        let tenant = tenant.map(str::to_string);
        self.call(&ops::ListKeys { tenant }).await
    }

    pub async fn revoke_key(&self, key_id: &str) -> Result<()> {
        let key_id = key_id.to_string();
        self.call(&ops::RevokeKey { key_id }).await
    }

    pub async fn get_quota(&self, tenant: &str) -> Result<TenantQuota> {
        let tenant = tenant.to_string();
        self.call(&ops::GetQuota { tenant }).await
    }

    /// Replaces a tenant's quota (absent fields: unlimited).
    pub async fn set_quota(&self, tenant: &str, quota: &Quota) -> Result<TenantQuota> {
        let op = ops::SetQuota {
            tenant: tenant.to_string(),
            quota: quota.clone(),
        };
        self.call(&op).await
    }

    /// `since`: RFC 3339.
    pub async fn usage(&self, tenant: Option<&str>, since: Option<&str>) -> Result<UsageReport> {
        let op = ops::GetUsage {
            tenant: tenant.map(str::to_string),
            since: since.map(str::to_string),
        };
        self.call(&op).await
    }

    /// One page of the audit log: entries after position `after`, oldest first.
    pub async fn audit(
        &self,
        after: u64,
        since: Option<&str>,
        limit: Option<u32>,
    ) -> Result<AuditList> {
        let since = since.map(str::to_string);
        self.call(&ops::ListAudit {
            after,
            since,
            limit,
        })
        .await
    }

    pub async fn audit_verify(&self) -> Result<AuditVerification> {
        self.call(&ops::VerifyAudit).await
    }

    /// The Prometheus text of `/metrics` (the `SandboxCounts` operation rendered with the
    /// daemon's counters: text, not JSON, so not [`Client::call`]).
    pub async fn metrics(&self) -> Result<String> {
        let resp = self
            .send(Method::GET, routes::METRICS, empty_body(), None)
            .await?;
        let body = self.read_body(resp).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}
