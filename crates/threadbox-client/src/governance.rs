//! Governance calls: API keys, quotas, usage, the audit log, metrics.

use crate::transport::{empty_body, json_body};
use crate::{Client, Result};
use hyper::Method;
use threadbox_api::routes::{self, fill};
use threadbox_api::*;

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if let Some(v) = v {
            q.append_pair(k, v);
        }
    }
    let q = q.finish();
    if q.is_empty() {
        q
    } else {
        format!("?{q}")
    }
}

impl Client {
    /// Creates an API key; the returned `key` is shown only this once.
    pub async fn create_key(&self, req: &CreateKeyRequest) -> Result<CreatedKey> {
        self.post_json(routes::KEYS, req).await
    }

    pub async fn list_keys(&self, tenant: Option<&str>) -> Result<ApiKeyList> {
        let q = query(&[("tenant", tenant.map(str::to_string))]);
        self.get_json(&format!("{}{q}", routes::KEYS)).await
    }

    pub async fn revoke_key(&self, key_id: &str) -> Result<()> {
        self.no_content(Method::DELETE, &fill(routes::KEY, &[key_id]))
            .await
    }

    pub async fn get_quota(&self, tenant: &str) -> Result<TenantQuota> {
        self.get_json(&fill(routes::QUOTA, &[tenant])).await
    }

    /// Replaces a tenant's quota (absent fields: unlimited).
    pub async fn set_quota(&self, tenant: &str, quota: &Quota) -> Result<TenantQuota> {
        let resp = self
            .send(
                Method::PUT,
                &fill(routes::QUOTA, &[tenant]),
                json_body(quota)?,
                Some("application/json"),
            )
            .await?;
        self.json(resp).await
    }

    /// `since`: RFC 3339.
    pub async fn usage(&self, tenant: Option<&str>, since: Option<&str>) -> Result<UsageReport> {
        let q = query(&[
            ("tenant", tenant.map(str::to_string)),
            ("since", since.map(str::to_string)),
        ]);
        self.get_json(&format!("{}{q}", routes::USAGE)).await
    }

    /// One page of the audit log: entries after position `after`, oldest first.
    pub async fn audit(
        &self,
        after: u64,
        since: Option<&str>,
        limit: Option<u32>,
    ) -> Result<AuditList> {
        let q = query(&[
            ("after", (after > 0).then(|| after.to_string())),
            ("since", since.map(str::to_string)),
            ("limit", limit.map(|l| l.to_string())),
        ]);
        self.get_json(&format!("{}{q}", routes::AUDIT)).await
    }

    pub async fn audit_verify(&self) -> Result<AuditVerification> {
        self.get_json(routes::AUDIT_VERIFY).await
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics(&self) -> Result<String> {
        let resp = self
            .send(Method::GET, routes::METRICS, empty_body(), None)
            .await?;
        let body = self.read_body(resp).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}
