//! Input validation: pure functions, the one place requests are checked.

use super::*;

pub(crate) fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !name.starts_with('.')
        && !name.starts_with("sb-");
    if ok {
        Ok(())
    } else {
        Err(CoreError::InvalidArgument(format!(
            "sandbox name {name:?} must be 1-128 characters of a-z, A-Z, 0-9, '-', '_', '.', \
             not start with '.' or 'sb-'"
        )))
    }
}

pub(crate) fn validate_labels(labels: &BTreeMap<String, String>) -> Result<()> {
    if labels.len() > 64 {
        return Err(CoreError::InvalidArgument("at most 64 labels".into()));
    }
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= 128
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        if !key_ok {
            return Err(CoreError::InvalidArgument(format!(
                "label key {k:?} must be 1-128 characters of a-z, A-Z, 0-9, '-', '_', '.', '/'"
            )));
        }
        if v.len() > 1024 || v.contains('\0') {
            return Err(CoreError::InvalidArgument(format!(
                "label value of {k:?} is too long or has a NUL"
            )));
        }
    }
    Ok(())
}

pub(crate) fn no_nul(what: &str, s: &str) -> Result<()> {
    if s.contains('\0') {
        return Err(CoreError::InvalidArgument(format!(
            "{what} must not contain NUL bytes"
        )));
    }
    Ok(())
}

/// A path is bytes (names need not be UTF-8).
pub(crate) fn validate_path<P: AsRef<[u8]> + ?Sized>(path: &P) -> Result<()> {
    let path = path.as_ref();
    if path.is_empty() {
        return Err(CoreError::InvalidArgument("path must not be empty".into()));
    }
    if path.len() > 4096 {
        return Err(CoreError::InvalidArgument(
            "path is longer than 4096 bytes".into(),
        ));
    }
    if path.contains(&0) {
        return Err(CoreError::InvalidArgument(
            "path must not contain NUL bytes".into(),
        ));
    }
    Ok(())
}

pub(crate) fn command_of(
    command: Option<Vec<String>>,
    shell: Option<String>,
) -> Result<proto::Command> {
    match (command, shell) {
        (Some(argv), None) => {
            if argv.is_empty() || argv[0].is_empty() {
                return Err(CoreError::InvalidArgument(
                    "command must not be empty".into(),
                ));
            }
            for a in &argv {
                no_nul("command arguments", a)?;
            }
            Ok(proto::Command::Argv(argv))
        }
        (None, Some(sh)) => {
            no_nul("shell", &sh)?;
            Ok(proto::Command::Shell(sh))
        }
        (Some(_), Some(_)) => Err(CoreError::InvalidArgument(
            "give either command or shell, not both".into(),
        )),
        (None, None) => Err(CoreError::InvalidArgument(
            "one of command or shell is required".into(),
        )),
    }
}

pub(crate) fn validate_env(env: &BTreeMap<String, String>) -> Result<()> {
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(CoreError::InvalidArgument(format!(
                "environment variable {k:?} is invalid (empty, or contains '=' or NUL)"
            )));
        }
    }
    Ok(())
}

pub(crate) fn exec_spec(req: ExecRequest, stream: bool) -> Result<proto::ExecSpec> {
    let command = command_of(req.command, req.shell)?;
    validate_env(&req.env)?;
    if let Some(cwd) = &req.cwd {
        validate_path(cwd)?;
    }
    let stdin = match req.stdin {
        Some(s) => Some(decode_bytes(&s, req.stdin_encoding).map_err(CoreError::InvalidArgument)?),
        None => None,
    };
    if stdin.as_ref().map(|s| s.len()).unwrap_or(0) > 16 * 1024 * 1024 {
        return Err(CoreError::TooLarge("stdin is larger than 16 MiB".into()));
    }
    let timeout_ms = match req.timeout_secs {
        Some(t) if !(t.is_finite() && t > 0.0 && t <= MAX_TIMEOUT_SECS) => {
            return Err(CoreError::InvalidArgument(format!(
                "timeout_secs must be a number > 0 and <= {MAX_TIMEOUT_SECS}"
            )))
        }
        Some(t) => Some(((t * 1000.0).ceil() as u64).max(1)),
        None => None,
    };
    let max_output = req.max_output_bytes.unwrap_or(proto::DEFAULT_MAX_OUTPUT);
    if max_output > proto::MAX_OUTPUT_LIMIT {
        return Err(CoreError::InvalidArgument(format!(
            "max_output_bytes must be <= {}",
            proto::MAX_OUTPUT_LIMIT
        )));
    }
    Ok(proto::ExecSpec {
        command,
        env: req.env,
        cwd: req.cwd,
        user: run_as(req.user),
        stdin,
        timeout_ms,
        max_output,
        stream,
    })
}

/// A signal for a background process: 1 to 64 (none: the agent's default, 9).
pub(crate) fn validate_signal(signal: Option<i32>) -> Result<()> {
    match signal {
        Some(s) if !(1..=64).contains(&s) => Err(CoreError::InvalidArgument(
            "signal must be between 1 and 64".into(),
        )),
        _ => Ok(()),
    }
}
