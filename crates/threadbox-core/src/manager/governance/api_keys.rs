//! API keys: authentication, creation, listing, revocation.

use super::*;

pub(super) fn key_info(k: &KeyRow, now: i64) -> ApiKeyInfo {
    let status = if k.revoked_at.is_some() {
        "revoked"
    } else if k.expires_at.is_some_and(|e| e <= now) {
        "expired"
    } else {
        "active"
    };
    ApiKeyInfo {
        id: k.id.clone(),
        tenant: k.tenant.clone(),
        scopes: k.scopes.clone(),
        created_at: crate::manager::rfc3339(k.created_at),
        expires_at: rfc3339_opt(k.expires_at),
        revoked_at: rfc3339_opt(k.revoked_at),
        last_used_at: rfc3339_opt(k.last_used_at),
        status: status.to_string(),
    }
}

impl Manager {
    /// Checks a presented API key; `unauthenticated` when it is unknown, wrong, revoked
    /// or expired.
    pub async fn authenticate(&self, key: &str) -> Result<Caller> {
        let invalid = || CoreError::Unauthenticated("invalid API key".into());
        let Some(id) = keys::key_id(key) else {
            return Err(invalid());
        };
        let Some(row) = self.store.get_key(id).await? else {
            // Same work as a known key, so timing does not tell known ids apart.
            let _ = keys::matches(key, &keys::hash(""));
            return Err(invalid());
        };
        if !keys::matches(key, &row.key_hash) {
            return Err(invalid());
        }
        let now = now_ms();
        if row.revoked_at.is_some() {
            return Err(CoreError::Unauthenticated("API key revoked".into()));
        }
        if row.expires_at.is_some_and(|e| e <= now) {
            return Err(CoreError::Unauthenticated("API key expired".into()));
        }
        if row.last_used_at.is_none_or(|t| now - t >= KEY_TOUCH_MS) {
            if let Err(e) = self.store.touch_key(&row.id, now).await {
                tracing::warn!(key_id = %row.id, "cannot record key use: {e}");
            }
        }
        Ok(Caller::key(&row.tenant, &row.id, row.scopes))
    }

    /// The tenant and key id a presented key names, for the audit of a refusal.
    pub fn presented_key_id(key: &str) -> Option<&str> {
        keys::key_id(key)
    }

    pub async fn create_key(&self, caller: &Caller, req: CreateKeyRequest) -> Result<CreatedKey> {
        let target = req.tenant.clone();
        let r = async {
            caller.require(Scope::Admin)?;
            validate_tenant(&req.tenant)?;
            if req.scopes.is_empty() {
                return Err(CoreError::InvalidArgument(
                    "a key needs at least one scope".into(),
                ));
            }
            let now = now_ms();
            let expires_at = match req.expires_in_secs {
                Some(s) if s == 0 || s > 10 * 365 * 24 * 3600 => {
                    return Err(CoreError::InvalidArgument(
                        "expires_in_secs must be between 1 and 315360000".into(),
                    ))
                }
                Some(s) => Some(now + s as i64 * 1000),
                None => None,
            };
            let mut scopes = req.scopes.clone();
            scopes.sort();
            scopes.dedup();
            let new = keys::generate()?;
            let row = KeyRow {
                id: new.id.clone(),
                tenant: req.tenant.clone(),
                scopes: scopes.clone(),
                key_hash: new.hash,
                created_at: now,
                expires_at,
                revoked_at: None,
                last_used_at: None,
            };
            let entry = self.audit_entry(
                caller,
                "key.create",
                &format!("{}/{}", row.tenant, row.id),
                "ok",
            );
            self.store.insert_key(&row, &entry).await?;
            tracing::info!(key_id = %row.id, tenant = %row.tenant, "API key created");
            Ok(CreatedKey {
                id: new.id,
                key: new.key,
                tenant: row.tenant,
                scopes,
                expires_at: rfc3339_opt(expires_at),
            })
        }
        .await;
        if r.is_err() {
            self.audit(caller, "key.create", &target, &r).await;
        }
        r
    }

    pub async fn list_keys(&self, caller: &Caller, tenant: Option<&str>) -> Result<ApiKeyList> {
        caller.require(Scope::Admin)?;
        let now = now_ms();
        Ok(ApiKeyList {
            keys: self
                .store
                .list_keys(tenant)
                .await?
                .iter()
                .map(|k| key_info(k, now))
                .collect(),
        })
    }

    /// Revokes a key (idempotent). `not_found` when there is no such key.
    pub async fn revoke_key(&self, caller: &Caller, key_id: &str) -> Result<()> {
        let r = async {
            caller.require(Scope::Admin)?;
            let entry = self.audit_entry(caller, "key.revoke", key_id, "ok");
            if self.store.get_key(key_id).await?.is_none() {
                return Err(CoreError::NotFoundOther(format!(
                    "API key {key_id} not found"
                )));
            }
            self.store.revoke_key(key_id, now_ms(), &entry).await?;
            tracing::info!(key_id, "API key revoked");
            Ok(())
        }
        .await;
        if r.is_err() {
            self.audit(caller, "key.revoke", key_id, &r).await;
        }
        r
    }

    // ---- quotas -----------------------------------------------------------------------
}
