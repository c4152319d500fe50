//! Wire types and operations of a tenant's secrets (issue 13 scope 4, ADR 0068). A secret's
//! value goes in once (`PUT /v1/secrets/{name}`) and never comes back out: no operation
//! answers it, listings show names, hosts and headers only.

use crate::ops::{HttpMethod, Operation};
use crate::{routes, Scope};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A secret as listed: everything but its value.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct SecretInfo {
    /// Its name, also the environment variable that holds its placeholder in a sandbox.
    pub name: String,
    /// The one host it is sent to (exact name; TLS to it is intercepted).
    pub host: String,
    /// The request header the value goes in.
    pub header: String,
    /// How the value is written when the header holds the bare placeholder (`{}` = value).
    pub format: String,
    /// RFC 3339.
    pub updated_at: String,
}

/// The body of `PUT /v1/secrets/{name}`.
#[derive(Clone, Default, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SetSecretRequest {
    /// The host the value may be sent to (an exact DNS name, no wildcard, no IP).
    pub host: String,
    /// Default `Authorization`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// Default `{}` (the value as it is); e.g. `Bearer {}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// The value. Stored encrypted; never returned.
    pub value: String,
}

impl std::fmt::Debug for SetSecretRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value, in traces, panics or test failures.
        f.debug_struct("SetSecretRequest")
            .field("host", &self.host)
            .field("header", &self.header)
            .field("format", &self.format)
            .finish_non_exhaustive()
    }
}

/// The secrets of the caller's tenant.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, ToSchema, JsonSchema)]
pub struct SecretList {
    pub secrets: Vec<SecretInfo>,
}

/// Creates or replaces a secret of the caller's tenant (`PUT /v1/secrets/{name}`).
/// Sandboxes already created with it keep their placeholder and get the new value.
#[derive(Clone, PartialEq, Eq)]
pub struct SetSecret {
    pub name: String,
    pub req: SetSecretRequest,
}

impl std::fmt::Debug for SetSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the value, in traces or panics.
        f.debug_struct("SetSecret")
            .field("name", &self.name)
            .field("host", &self.req.host)
            .finish_non_exhaustive()
    }
}

impl Operation for SetSecret {
    type Output = SecretInfo;
    const NAME: &'static str = "secret.set";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Put;
    const PATH: &'static str = routes::SECRET;
    fn path_values(&self) -> Vec<String> {
        vec![self.name.clone()]
    }
    fn body(&self) -> Option<serde_json::Value> {
        serde_json::to_value(&self.req).ok()
    }
}

/// Lists the caller's tenant's secrets, without values (`GET /v1/secrets`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListSecrets;

impl Operation for ListSecrets {
    type Output = SecretList;
    const NAME: &'static str = "secret.list";
    const SCOPE: Scope = Scope::SandboxesRead;
    const METHOD: HttpMethod = HttpMethod::Get;
    const PATH: &'static str = routes::SECRETS;
}

/// Removes a secret (`DELETE /v1/secrets/{name}`): sandboxes created with it stop getting
/// its value (their placeholder then goes out unchanged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteSecret {
    pub name: String,
}

impl Operation for DeleteSecret {
    type Output = ();
    const NAME: &'static str = "secret.delete";
    const SCOPE: Scope = Scope::SandboxesWrite;
    const METHOD: HttpMethod = HttpMethod::Delete;
    const PATH: &'static str = routes::SECRET;
    fn path_values(&self) -> Vec<String> {
        vec![self.name.clone()]
    }
}
