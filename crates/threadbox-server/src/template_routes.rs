//! Templates (issue 14 scope 5, ADR 0110): thin handlers over the operations of
//! `threadbox_api::templates`.

use crate::auth::Auth;
use crate::error::ApiError;
use crate::routes::{ApiJson, ApiPath, St};
use axum::extract::State;
use axum::http::StatusCode;
use threadbox_api::templates::*;
use threadbox_api::{routes, ErrorResponse};

#[utoipa::path(post, path = routes::TEMPLATES, tag = "templates",
    request_body = CreateTemplateRequest,
    responses(
        (status = 201, description = "Made (a build's steps all exited 0; its sandbox is gone)", body = CreatedTemplate),
        (status = "default", description = "Error (a failed build step: precondition_failed, nothing kept)", body = ErrorResponse)))]
pub(crate) async fn create_template(
    State(st): St,
    Auth(caller): Auth,
    ApiJson(request): ApiJson<CreateTemplateRequest>,
) -> Result<(StatusCode, ApiJson<CreatedTemplate>), ApiError> {
    let out = st.run(&caller, CreateTemplate { request }).await?;
    Ok((StatusCode::CREATED, ApiJson(out)))
}

#[utoipa::path(get, path = routes::TEMPLATES, tag = "templates",
    responses(
        (status = 200, description = "The tenant's templates, oldest first", body = TemplateList),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn list_templates(
    State(st): St,
    Auth(caller): Auth,
) -> Result<ApiJson<TemplateList>, ApiError> {
    Ok(ApiJson(st.run(&caller, ListTemplates).await?))
}

#[utoipa::path(get, path = routes::TEMPLATE, tag = "templates",
    params(("template" = String, Path, description = "Template name or id")),
    responses(
        (status = 200, description = "The template", body = Template),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn get_template(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(template): ApiPath<String>,
) -> Result<ApiJson<Template>, ApiError> {
    Ok(ApiJson(st.run(&caller, GetTemplate { template }).await?))
}

#[utoipa::path(delete, path = routes::TEMPLATE, tag = "templates",
    params(("template" = String, Path, description = "Template name or id")),
    responses(
        (status = 204, description = "Deleted (sandboxes made from it are untouched)"),
        (status = "default", description = "Error", body = ErrorResponse)))]
pub(crate) async fn delete_template(
    State(st): St,
    Auth(caller): Auth,
    ApiPath(template): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    st.run(&caller, DeleteTemplate { template }).await?;
    Ok(StatusCode::NO_CONTENT)
}
