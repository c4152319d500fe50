//! The REST paths, written once. The daemon's router registers these templates (axum's
//! `{name}` syntax, which is also OpenAPI's), and the Rust client fills them with
//! [`fill`]; a path renamed here moves on both sides, and a test of the router checks
//! that every template below is routed.

pub const HEALTHZ: &str = "/healthz";
pub const MCP: &str = "/mcp";
pub const METRICS: &str = "/metrics";
pub const OPENAPI: &str = "/v1/openapi.json";

pub const SANDBOXES: &str = "/v1/sandboxes";
pub const SANDBOX: &str = "/v1/sandboxes/{sandbox}";
pub const SANDBOX_PAUSE: &str = "/v1/sandboxes/{sandbox}/pause";
pub const SANDBOX_HIBERNATE: &str = "/v1/sandboxes/{sandbox}/hibernate";
pub const SANDBOX_RESUME: &str = "/v1/sandboxes/{sandbox}/resume";
pub const SANDBOX_STOP: &str = "/v1/sandboxes/{sandbox}/stop";
pub const SANDBOX_START: &str = "/v1/sandboxes/{sandbox}/start";
pub const SANDBOX_SELFTEST: &str = "/v1/sandboxes/{sandbox}/selftest";
pub const EXEC: &str = "/v1/sandboxes/{sandbox}/exec";
pub const EXEC_STREAM: &str = "/v1/sandboxes/{sandbox}/exec/stream";
pub const PROCESSES: &str = "/v1/sandboxes/{sandbox}/processes";
pub const PROCESS_LOGS: &str = "/v1/sandboxes/{sandbox}/processes/{process_id}/logs";
pub const PROCESS_KILL: &str = "/v1/sandboxes/{sandbox}/processes/{process_id}/kill";
pub const FILES: &str = "/v1/sandboxes/{sandbox}/files";
pub const FILES_LIST: &str = "/v1/sandboxes/{sandbox}/files/list";
pub const FILES_STAT: &str = "/v1/sandboxes/{sandbox}/files/stat";
pub const FILES_MKDIR: &str = "/v1/sandboxes/{sandbox}/files/mkdir";
pub const CONTEXTS: &str = "/v1/sandboxes/{sandbox}/contexts";
pub const CONTEXT: &str = "/v1/sandboxes/{sandbox}/contexts/{context}";
pub const CONTEXT_RESTART: &str = "/v1/sandboxes/{sandbox}/contexts/{context}/restart";
pub const CONTEXT_INTERRUPT: &str = "/v1/sandboxes/{sandbox}/contexts/{context}/interrupt";
pub const CONTEXT_EXECUTE: &str = "/v1/sandboxes/{sandbox}/contexts/{context}/execute";
pub const CONTEXT_EXECUTE_STREAM: &str =
    "/v1/sandboxes/{sandbox}/contexts/{context}/execute/stream";
pub const CONTEXT_EXECUTION: &str =
    "/v1/sandboxes/{sandbox}/contexts/{context}/executions/{execution}";
pub const SANDBOX_NETWORK: &str = "/v1/sandboxes/{sandbox}/network";
pub const SECRETS: &str = "/v1/secrets";
pub const SECRET: &str = "/v1/secrets/{name}";
pub const SANDBOX_PREVIEWS: &str = "/v1/sandboxes/{sandbox}/previews";
pub const SANDBOX_PREVIEW: &str = "/v1/sandboxes/{sandbox}/previews/{port}";
pub const CHECKPOINTS: &str = "/v1/sandboxes/{sandbox}/checkpoints";
pub const CHECKPOINT: &str = "/v1/sandboxes/{sandbox}/checkpoints/{checkpoint}";
pub const SANDBOX_REWIND: &str = "/v1/sandboxes/{sandbox}/rewind";
pub const SANDBOX_FORK: &str = "/v1/sandboxes/{sandbox}/fork";
pub const SANDBOX_NETWORK_LOG: &str = "/v1/sandboxes/{sandbox}/network/log";
pub const SANDBOX_PTY: &str = "/v1/sandboxes/{sandbox}/pty";
pub const SANDBOX_PTY_WS: &str = "/v1/sandboxes/{sandbox}/pty/{session}/ws";
pub const EXEC_WS: &str = "/v1/sandboxes/{sandbox}/exec/ws";

pub const TIERS: &str = "/v1/tiers";
pub const IMAGES: &str = "/v1/images";
pub const IMAGES_PULL: &str = "/v1/images/pull";
pub const IMAGES_IMPORT: &str = "/v1/images/import";
pub const IMAGE: &str = "/v1/images/{image}";
pub const TEMPLATES: &str = "/v1/templates";
pub const TEMPLATE: &str = "/v1/templates/{template}";
pub const KEYS: &str = "/v1/keys";
pub const KEY: &str = "/v1/keys/{key_id}";
pub const QUOTA: &str = "/v1/quotas/{tenant}";
pub const USAGE: &str = "/v1/usage";
pub const AUDIT: &str = "/v1/audit";
pub const AUDIT_VERIFY: &str = "/v1/audit/verify";

/// Every template above, for the tests that hold the router and this list together.
pub const ALL: &[&str] = &[
    HEALTHZ,
    MCP,
    METRICS,
    OPENAPI,
    SANDBOXES,
    SANDBOX,
    SANDBOX_PAUSE,
    SANDBOX_HIBERNATE,
    SANDBOX_RESUME,
    SANDBOX_STOP,
    SANDBOX_START,
    SANDBOX_SELFTEST,
    EXEC,
    EXEC_STREAM,
    PROCESSES,
    PROCESS_LOGS,
    PROCESS_KILL,
    FILES,
    FILES_LIST,
    FILES_STAT,
    FILES_MKDIR,
    CONTEXTS,
    CONTEXT,
    CONTEXT_RESTART,
    CONTEXT_INTERRUPT,
    CONTEXT_EXECUTE,
    CONTEXT_EXECUTE_STREAM,
    CONTEXT_EXECUTION,
    SANDBOX_NETWORK,
    SECRETS,
    SECRET,
    SANDBOX_PREVIEWS,
    SANDBOX_PREVIEW,
    CHECKPOINTS,
    CHECKPOINT,
    SANDBOX_REWIND,
    SANDBOX_FORK,
    SANDBOX_NETWORK_LOG,
    TIERS,
    SANDBOX_PTY,
    SANDBOX_PTY_WS,
    EXEC_WS,
    IMAGES,
    IMAGES_PULL,
    IMAGES_IMPORT,
    IMAGE,
    TEMPLATES,
    TEMPLATE,
    KEYS,
    KEY,
    QUOTA,
    USAGE,
    AUDIT,
    AUDIT_VERIFY,
];

/// `template` with its `{name}` placeholders replaced, in order, by `values`, each
/// percent-encoded as one path segment (so a name with `/` or `?` cannot reach another
/// route). Placeholders left without a value stay as written, which no route matches.
pub fn fill(template: &str, values: &[&str]) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut values = values.iter();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}').map(|c| open + c) else {
            break;
        };
        out.push_str(&rest[..open]);
        match values.next() {
            Some(v) => out.push_str(&segment(v)),
            None => out.push_str(&rest[open..=close]),
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Percent-encodes one path segment: everything but RFC 3986's unreserved characters.
pub fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The placeholder names of `template`, in order.
pub fn placeholders(template: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}').map(|c| open + c) else {
            break;
        };
        names.push(&rest[open + 1..close]);
        rest = &rest[close + 1..];
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_encodes_each_value_as_one_segment() {
        assert_eq!(
            fill(PROCESS_LOGS, &["my box/1", "7"]),
            "/v1/sandboxes/my%20box%2F1/processes/7/logs"
        );
        assert_eq!(fill(SANDBOX, &["a?b#c"]), "/v1/sandboxes/a%3Fb%23c");
        assert_eq!(fill(SANDBOXES, &[]), SANDBOXES);
        assert_eq!(fill(SANDBOX, &[]), SANDBOX, "a missing value stays visible");
        assert_eq!(segment("sb-1_a.b~"), "sb-1_a.b~");
    }

    #[test]
    fn templates_are_absolute_distinct_and_name_their_placeholders() {
        let mut seen = std::collections::BTreeSet::new();
        for t in ALL {
            assert!(t.starts_with('/'), "{t}");
            assert!(seen.insert(*t), "{t} is listed twice");
            for name in placeholders(t) {
                assert!(
                    matches!(
                        name,
                        "sandbox"
                            | "process_id"
                            | "key_id"
                            | "tenant"
                            | "context"
                            | "port"
                            | "checkpoint"
                            | "execution"
                            | "name"
                            | "image"
                            | "session"
                            | "template"
                    ),
                    "{t}: unexpected placeholder {name}"
                );
            }
        }
        assert_eq!(placeholders(PROCESS_KILL), ["sandbox", "process_id"]);
    }
}
