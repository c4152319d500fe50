//! The store's side of a sandbox's egress policy (issue 13, ADR 0061): the policy JSON and
//! its generation, swapped atomically.

use crate::error::Result;
use crate::store::Store;

/// A sandbox's stored policy: `None` when it never had one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredNetwork {
    pub policy_json: Option<String>,
    pub generation: u64,
}

impl Store {
    /// The stored policy of sandbox `id` (by id; `None` when there is no such row).
    pub async fn get_network(&self, id: &str) -> Result<Option<StoredNetwork>> {
        let row: Option<(Option<String>, i64)> =
            sqlx::query_as("SELECT network_policy, network_generation FROM sandboxes WHERE id = ?")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(policy_json, g)| StoredNetwork {
            policy_json,
            generation: g.max(0) as u64,
        }))
    }

    /// Replaces the policy of `id` only if its generation is still `expected` (compare and
    /// swap in one UPDATE, so two writers cannot both win); the new generation, or `None`
    /// when the row moved on (or is gone).
    pub async fn swap_network(
        &self,
        id: &str,
        expected: u64,
        policy_json: Option<&str>,
    ) -> Result<Option<u64>> {
        let next = expected + 1;
        let done = sqlx::query(
            "UPDATE sandboxes SET network_policy = ?, network_generation = ? \
             WHERE id = ? AND network_generation = ?",
        )
        .bind(policy_json)
        .bind(next as i64)
        .bind(id)
        .bind(expected as i64)
        .execute(&self.pool)
        .await?;
        Ok((done.rows_affected() == 1).then_some(next))
    }
}
