//! Who is calling: the tenant a request acts for, the key it came with, what it may do.
//! Every door builds one (REST from the API key or the operator's socket, MCP likewise)
//! and passes it to each [`crate::Manager`] method, which checks the scope and confines
//! the call to the caller's tenant.

use crate::error::{CoreError, Result};
use std::collections::BTreeSet;
pub use threadbox_api::Scope;

/// Tenant of the operator (the unix socket) and of sandboxes made before tenants existed.
pub const DEFAULT_TENANT: &str = "default";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The tenant whose sandboxes this call sees.
    pub tenant: String,
    /// The API key's id; `None` for the operator and the daemon itself.
    pub key_id: Option<String>,
    pub scopes: BTreeSet<Scope>,
}

impl Caller {
    /// The operator on the local socket (or TCP with `--insecure-no-auth`): every scope,
    /// tenant `default`.
    pub fn operator() -> Caller {
        Caller {
            tenant: DEFAULT_TENANT.to_string(),
            key_id: None,
            scopes: Scope::ALL.into_iter().collect(),
        }
    }

    /// The daemon itself acting on a tenant's sandboxes (idle pause, TTL, CPU cap).
    /// Its audit entries carry the key id `daemon`.
    pub fn system(tenant: &str) -> Caller {
        Caller {
            tenant: tenant.to_string(),
            key_id: Some("daemon".to_string()),
            scopes: Scope::ALL.into_iter().collect(),
        }
    }

    /// A key's caller.
    pub fn key(tenant: &str, key_id: &str, scopes: impl IntoIterator<Item = Scope>) -> Caller {
        Caller {
            tenant: tenant.to_string(),
            key_id: Some(key_id.to_string()),
            scopes: scopes.into_iter().collect(),
        }
    }

    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(&Scope::Admin) || self.scopes.contains(&scope)
    }

    /// `permission_denied` unless the caller holds `scope` (or `admin`).
    pub fn require(&self, scope: Scope) -> Result<()> {
        if self.has(scope) {
            Ok(())
        } else {
            Err(CoreError::PermissionDenied(format!(
                "this API key lacks the `{}` scope",
                scope.as_str()
            )))
        }
    }

    /// The same caller acting for `tenant`: allowed for `admin` (and the operator) only.
    pub fn acting_for(&self, tenant: &str) -> Result<Caller> {
        if tenant == self.tenant {
            return Ok(self.clone());
        }
        if !self.has(Scope::Admin) {
            return Err(CoreError::PermissionDenied(
                "only an admin may act for another tenant".into(),
            ));
        }
        validate_tenant(tenant)?;
        Ok(Caller {
            tenant: tenant.to_string(),
            ..self.clone()
        })
    }
}

/// The reserved tenant that owns the warm pool's pre-booted sandboxes: no key, caller or
/// listing ever names it.
pub const POOL_TENANT: &str = "__pool";

/// Tenant names: 1-64 characters of a-z, A-Z, 0-9, '-', '_', '.' (not [`POOL_TENANT`]).
pub fn validate_tenant(tenant: &str) -> Result<()> {
    let ok = tenant != POOL_TENANT
        && !tenant.is_empty()
        && tenant.len() <= 64
        && tenant
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !tenant.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "tenant {tenant:?} must be 1-64 characters of a-z, A-Z, 0-9, '-', '_', '.'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_tenant_is_reserved() {
        assert!(validate_tenant("team-a").is_ok());
        assert!(validate_tenant("__pool2").is_ok());
        assert!(validate_tenant(POOL_TENANT).is_err());
    }

    #[test]
    fn admin_implies_every_scope_and_others_do_not() {
        let admin = Caller::key("t", "k", [Scope::Admin]);
        for s in Scope::ALL {
            assert!(admin.has(s));
        }
        let read = Caller::key("t", "k", [Scope::SandboxesRead]);
        assert!(read.require(Scope::SandboxesRead).is_ok());
        assert!(read.require(Scope::SandboxesWrite).is_err());
        assert!(read.require(Scope::SandboxesDelete).is_err());
        assert!(read.require(Scope::Admin).is_err());
    }

    #[test]
    fn only_admins_act_for_other_tenants() {
        let w = Caller::key("a", "k", [Scope::SandboxesWrite]);
        assert!(w.acting_for("a").is_ok());
        assert!(w.acting_for("b").is_err());
        assert_eq!(Caller::operator().acting_for("b").unwrap().tenant, "b");
        assert!(Caller::operator().acting_for("../x").is_err());
    }
}
