//! The OpenAPI document, generated from the handlers and the `threadbox-api` types.

use crate::{context_routes, gov_routes, image_routes, routes};
use std::sync::OnceLock;
use threadbox_api::interp::*;
use threadbox_api::*;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "threadbox",
        description = "Self-hosted sandboxes for AI agents. Errors are \
            `{\"error\": {\"code\": \"...\", \"message\": \"...\"}}` with a stable code.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    paths(
        routes::healthz,
        routes::openapi_document,
        routes::create_sandbox,
        routes::list_sandboxes,
        routes::get_sandbox,
        routes::delete_sandbox,
        routes::pause_sandbox,
        routes::hibernate_sandbox,
        routes::resume_sandbox,
        routes::stop_sandbox,
        routes::start_sandbox,
        routes::exec,
        routes::exec_stream,
        routes::start_process,
        routes::list_processes,
        routes::process_logs,
        routes::kill_process,
        routes::read_file,
        routes::write_file,
        routes::remove_file,
        routes::list_files,
        routes::stat_file,
        routes::mkdir,
        routes::selftest,
        crate::tier_routes::list_tiers,
        routes::list_images,
        routes::add_image,
        image_routes::pull_image,
        image_routes::import_image,
        image_routes::remove_image,
        context_routes::create_context,
        context_routes::list_contexts,
        context_routes::get_context,
        context_routes::delete_context,
        context_routes::restart_context,
        context_routes::interrupt_context,
        context_routes::execute_code,
        context_routes::execute_code_stream,
        context_routes::get_execution,
        crate::net_routes::get_network,
        crate::net_routes::set_network,
        crate::secret_routes::set_secret,
        crate::secret_routes::list_secrets,
        crate::secret_routes::delete_secret,
        crate::preview_routes::create_preview,
        crate::preview_routes::list_previews,
        crate::preview_routes::delete_preview,
        crate::pty_routes::open_pty,
        crate::pty_routes::pty_ws,
        crate::pty_routes::exec_ws,
        crate::ckpt_routes::create_checkpoint,
        crate::ckpt_routes::list_checkpoints,
        crate::ckpt_routes::delete_checkpoint,
        crate::ckpt_routes::rewind,
        crate::ckpt_routes::fork,
        crate::template_routes::create_template,
        crate::template_routes::list_templates,
        crate::template_routes::get_template,
        crate::template_routes::delete_template,
        crate::net_log_routes::network_log,
        gov_routes::create_key,
        gov_routes::list_keys,
        gov_routes::revoke_key,
        gov_routes::get_quota,
        gov_routes::set_quota,
        gov_routes::usage,
        gov_routes::audit_list,
        gov_routes::audit_verify,
        gov_routes::metrics,
    ),
    components(schemas(
        ErrorCode, ErrorBody, ErrorResponse, SandboxState, TtlAction, LimitsRequest, Limits,
        CreateSandboxRequest, Sandbox, CreatedSandbox, SandboxList, User, Encoding, ExecRequest, ExecResponse,
        ExecEvent, StartProcessRequest, ProcessInfo, ProcessList, ProcessLogs,
        KillProcessRequest, FileKind, FileEntry, FileList, PostureCheck, SelftestReport,
        Health, AddImageRequest, Image, ImageList,
        threadbox_api::images::PullImageRequest, threadbox_api::images::ImportImageRequest,
        threadbox_api::images::ImageEvent,
        threadbox_api::network::NetworkInfo, threadbox_api::network::NetworkPolicySpec,
        threadbox_api::network::NetworkRuleSpec, threadbox_api::network::NetAction,
        threadbox_api::network::NetProtocol,
        threadbox_api::secrets::SecretInfo, threadbox_api::secrets::SetSecretRequest,
        threadbox_api::secrets::SecretList,
        threadbox_api::previews::PreviewRequest, threadbox_api::previews::Preview,
        threadbox_api::previews::PreviewList,
        threadbox_api::pty::PtyRequest, threadbox_api::pty::PtySession,
        threadbox_api::checkpoints::Checkpoint, threadbox_api::checkpoints::CheckpointList,
        threadbox_api::checkpoints::CreateCheckpointRequest,
        threadbox_api::checkpoints::RewindRequest, threadbox_api::checkpoints::ForkRequest,
        threadbox_api::checkpoints::ForkResponse,
        threadbox_api::templates::Template, threadbox_api::templates::TemplateList,
        threadbox_api::templates::CreateTemplateRequest, threadbox_api::templates::BuildStep,
        threadbox_api::templates::CreatedTemplate,
        threadbox_api::net_log::NetLogPage, threadbox_api::net_log::NetLogRecord,
        threadbox_api::tiers::Tier, threadbox_api::tiers::TierList,
        threadbox_api::network::NetLogEntry, threadbox_api::network::NetLogKind,
        threadbox_api::network::NetReason,
        Scope, CreateKeyRequest, CreatedKey, ApiKeyInfo, ApiKeyList, Quota, QuotaUse, DiskUse,
        TenantQuota, SandboxUsage, TenantUsage, UsageReport, AuditEntry, AuditList,
        AuditVerification,
        CreateContextRequest, Context, ContextState, ContextList, InterruptResult,
        ExecuteCodeRequest, CodeStatus, CodeException, CodeOutput, CodeExecution, CodeEvent,
    )),
    tags(
        (name = "meta", description = "Health and this document"),
        (name = "sandboxes", description = "Sandbox lifecycle"),
        (name = "exec", description = "Run commands to completion"),
        (name = "processes", description = "Background processes"),
        (name = "files", description = "Files inside a sandbox"),
        (name = "contexts", description = "Persistent code interpreter contexts"),
        (name = "images", description = "Images: the host, root filesystem directories, OCI images"),
        (name = "previews", description = "Ports of a sandbox published through the daemon"),
        (name = "terminal", description = "Terminal sessions and exec output over WebSocket"),
        (name = "checkpoints", description = "Checkpoints, rewind and fork of a sandbox's disk"),
        (name = "templates", description = "Templates: named disks and defaults new sandboxes start from"),
        (name = "governance", description = "API keys, quotas, usage, the audit log"),
        (name = "secrets", description = "Secrets the sandbox never holds (placeholders swapped on the host)"),
    )
)]
pub struct ApiDoc;

/// The OpenAPI document as pretty JSON with a final newline: exactly the committed
/// `api/openapi.json`.
pub fn openapi_json() -> String {
    let mut json = ApiDoc::openapi().to_pretty_json().unwrap_or_else(|err| {
        format!("{{\"error\": \"cannot render the OpenAPI document: {err}\"}}")
    });
    json.push('\n');
    json
}

pub(crate) fn openapi_json_cached() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(openapi_json)
}
