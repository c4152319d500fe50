//! Conversions between the store, the agent protocol and the API.

use super::*;

pub(super) fn rfc3339(ms: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The API view of a sandbox as `caller` may see it: the agent's host PID only for the
/// operator and admin keys (a tenant has no use for it, and a host PID sequence tells of
/// other tenants' activity).
pub(super) fn to_api(drivers: &Drivers, caller: &Caller, row: &SandboxRow) -> Sandbox {
    let mut sb = to_api_full(drivers, row);
    if !caller.has(Scope::Admin) {
        sb.agent_pid = None;
    }
    sb
}

pub(super) fn to_api_full(drivers: &Drivers, row: &SandboxRow) -> Sandbox {
    Sandbox {
        id: row.id.clone(),
        name: row.name.clone(),
        state: match row.state {
            State::Creating | State::Deleting => SandboxState::Creating,
            State::Running => SandboxState::Running,
            State::Paused => SandboxState::Paused,
            State::Hibernated => SandboxState::Hibernated,
            State::Stopped => SandboxState::Stopped,
        },
        labels: row.labels.clone(),
        image: row.image.clone(),
        created_at: rfc3339(row.created_at),
        last_active_at: rfc3339(row.last_active_at),
        limits: Limits {
            memory_bytes: row.memory_bytes,
            cpus: row.cpus,
            pids: row.pids,
            disk_bytes: row.disk_bytes,
        },
        idle_pause_secs: row.idle_pause_secs,
        idle_stop_secs: row.idle_stop_secs,
        idle_hibernate_secs: row.idle_hibernate_secs,
        ttl_secs: row.ttl_secs,
        ttl_action: row.ttl_action,
        agent_pid: match row.state {
            State::Running | State::Paused | State::Hibernated => row.agent_pid,
            _ => None,
        },
        isolation_warnings: drivers
            .get(&row.tier)
            .map(|d| d.isolation_warnings())
            .unwrap_or_default(),
        tier: row.tier.clone(),
        // A stored policy that no longer parses is shown as none (the data plane refuses to
        // attach it too, so the sandbox is closed, as shown).
        network: row
            .network_policy
            .as_deref()
            .and_then(|j| serde_json::from_str(j).ok()),
        network_generation: row.network_generation,
        otlp_relay: row.otlp_relay,
    }
}

/// The agent's user for `u` in a sandbox whose image names no user (the manager puts
/// the image's in for `Default`: [`Manager::image_run`]).
pub(super) fn run_as(u: User) -> proto::RunAs {
    match u {
        User::Default | User::User => proto::RunAs::User,
        User::Root => proto::RunAs::Root,
    }
}

/// The memory limit when the call that ended this way was ended by the OOM killer:
/// the sandbox's `oom_kill` counter went up during the call and the process died of
/// SIGKILL (directly, or as a shell reports it, 137). The counter is per sandbox, so
/// another call of the same sandbox killed at that moment is named as well.
pub(super) async fn oom_verdict(
    driver: &dyn Driver,
    row: &SandboxRow,
    before: Option<u64>,
    exit_code: Option<i32>,
    signal: Option<i32>,
) -> Option<u64> {
    let killed = signal == Some(9) || (signal.is_none() && exit_code == Some(137));
    if !killed {
        return None;
    }
    let after = driver.usage(&row.id, false).await.oom_kills?;
    (after > before?).then_some(row.memory_bytes)
}

pub(super) fn exec_response(r: proto::ExecResult) -> ExecResponse {
    let both_utf8 =
        std::str::from_utf8(&r.stdout).is_ok() && std::str::from_utf8(&r.stderr).is_ok();
    // Positive control of the byte-exact output case (test builds only).
    #[cfg(feature = "insecure-test-hooks")]
    let both_utf8 = both_utf8
        || threadbox_sys::testhooks::Weaken::from_env().is_ok_and(|w| w.has("lossy-output"));
    let enc = |b: &[u8]| {
        if both_utf8 {
            String::from_utf8_lossy(b).into_owned()
        } else {
            base64::engine::general_purpose::STANDARD.encode(b)
        }
    };
    ExecResponse {
        exit_code: r.exit_code,
        signal: r.signal,
        stdout: enc(&r.stdout),
        stderr: enc(&r.stderr),
        encoding: if both_utf8 {
            Encoding::Utf8
        } else {
            Encoding::Base64
        },
        timed_out: r.timed_out,
        truncated: r.stdout_truncated || r.stderr_truncated,
        stdout_truncated: r.stdout_truncated,
        stderr_truncated: r.stderr_truncated,
        duration_ms: r.duration_ms,
        oom_killed: false,
        memory_limit_bytes: None,
    }
}

/// Maps an agent error to the API's error codes.
pub(super) fn agent_error(kind: proto::ErrorKind, message: String) -> CoreError {
    use proto::ErrorKind as K;
    match kind {
        K::NotFound => CoreError::NotFoundOther(message),
        K::PermissionDenied => CoreError::PermissionDenied(message),
        K::InvalidArgument | K::NotADirectory | K::IsADirectory => {
            CoreError::InvalidArgument(message)
        }
        K::AlreadyExists => CoreError::Conflict(message),
        K::NoSpace => CoreError::TooLarge(message),
        K::Cancelled => CoreError::Unavailable(message),
        K::Internal => CoreError::Internal(message),
    }
}

pub(super) fn unexpected(r: proto::Response) -> CoreError {
    match r {
        proto::Response::Error { kind, message } => agent_error(kind, message),
        other => CoreError::Internal(format!("unexpected agent response {other:?}")),
    }
}

pub(super) fn file_entry(f: proto::FileInfo) -> FileEntry {
    // Bytes that are not UTF-8 go as base64 next to a display form (ADR 0026).
    let raw = |p: &proto::PathBytes| {
        p.to_str()
            .is_none()
            .then(|| base64::engine::general_purpose::STANDARD.encode(p.as_bytes()))
    };
    FileEntry {
        name_b64: raw(&f.name),
        path_b64: raw(&f.path),
        name: f.name.lossy(),
        path: f.path.lossy(),
        kind: match f.kind {
            proto::FileKind::File => FileKind::File,
            proto::FileKind::Dir => FileKind::Dir,
            proto::FileKind::Symlink => FileKind::Symlink,
            proto::FileKind::Other => FileKind::Other,
        },
        size: f.size,
        mode: f.mode,
        uid: f.uid,
        gid: f.gid,
        modified_at: rfc3339(f.mtime.saturating_mul(1000)),
        symlink_target: f.symlink_target,
    }
}

pub(super) fn command_vec(c: &proto::Command) -> Vec<String> {
    match c {
        proto::Command::Argv(a) => a.clone(),
        proto::Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s.clone()],
    }
}
