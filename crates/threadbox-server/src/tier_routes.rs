//! REST handler of the daemon's tiers (issue 16, ADR 0121): thin over `ListTiers`.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::routes::{ApiJson, St};
use axum::extract::State;
use threadbox_api::tiers::{ListTiers, TierList};
use threadbox_api::*;

#[utoipa::path(get, path = routes::TIERS, tag = "sandboxes",
    responses(
        (status = 200, description = "The daemon's isolation tiers: available or why not, kernel, capabilities", body = TierList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn list_tiers(
    State(st): St,
    Auth(caller): Auth,
) -> Result<ApiJson<TierList>, ApiError> {
    Ok(ApiJson(st.run(&caller, ListTiers).await?))
}
