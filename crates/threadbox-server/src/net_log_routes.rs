//! REST handler of a sandbox's egress log (issue 13, ADR 0063): thin over `GetNetworkLog`
//! (ADR 0057). Following is a long poll (`wait_ms`), not a stream.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::routes::{ApiJson, ApiPath, ApiQuery, St};
use axum::extract::State;
use serde::Deserialize;
use threadbox_api::net_log::{GetNetworkLog, NetLogPage};
use threadbox_api::*;
use utoipa::IntoParams;

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct NetLogQuery {
    /// Only rows after this `seq` (the previous page's `next_after`).
    after: Option<u64>,
    /// At most this many rows (default 100, at most 1000).
    limit: Option<u32>,
    /// With no row after `after`: hold the request up to this many milliseconds for one
    /// (at most 60000). Following the log is asking again from `next_after`.
    wait_ms: Option<u64>,
}

#[utoipa::path(get, path = routes::SANDBOX_NETWORK_LOG, tag = "network",
    params(("sandbox" = String, Path, description = "Sandbox id or name"), NetLogQuery),
    responses(
        (status = 200, description = "Egress log rows (connections when they closed, DNS answers), oldest first", body = NetLogPage),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn network_log(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(sandbox): ApiPath<String>,
    ApiQuery(q): ApiQuery<NetLogQuery>,
) -> Result<ApiJson<NetLogPage>, ApiError> {
    let op = GetNetworkLog {
        sandbox,
        after: q.after,
        limit: q.limit,
        wait_ms: q.wait_ms,
    };
    Ok(ApiJson(st.run(&caller, op).await?))
}
