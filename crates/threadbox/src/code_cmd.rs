//! `threadbox run-code`: run code in a sandbox's persistent interpreter context
//! (issue 15, docs/interpreter.md).

use crate::commands::print_json;
use crate::parse::parse_pairs;
use anyhow::{bail, Context as _};
use base64::Engine;
use std::io::Write;
use threadbox_api::interp::{CodeExecution, CodeStatus, ExecuteCode, ExecuteCodeRequest};
use threadbox_client::Client;

#[derive(Debug, clap::Args)]
pub struct RunCodeArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// The context (id or name); `python` is created on first use.
    #[arg(long, default_value = "python", value_name = "NAME")]
    pub context: String,
    /// Interrupt the cell after this many seconds of running time [default: 300].
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Environment variable K=V for this cell only (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Write image outputs (PNG, JPEG) into this directory as `out-<n>-<i>.<ext>`.
    #[arg(long, value_name = "DIR")]
    pub images: Option<std::path::PathBuf>,
    /// Print the whole execution as one JSON document.
    #[arg(long)]
    pub json: bool,
    /// The code; `-` reads it from stdin.
    pub code: String,
}

/// Exit status (without `--json`): 0 when the cell ran to its end, 1 when it raised,
/// 124 on a timeout, 130 when interrupted, 137 when the context died.
pub async fn run_code(client: &Client, args: RunCodeArgs) -> anyhow::Result<u8> {
    let code = if args.code == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading stdin")?;
        s
    } else {
        args.code
    };
    if matches!(args.timeout, Some(0)) {
        bail!("invalid --timeout 0: expected a positive number of seconds");
    }
    let op = ExecuteCode {
        sandbox: args.sandbox,
        context: args.context,
        request: ExecuteCodeRequest {
            code,
            env: parse_pairs("--env", &args.env)?,
            timeout_secs: args.timeout,
            max_output_bytes: None,
        },
    };
    let ex: CodeExecution = client.call(&op).await?;
    if args.json {
        // As `exec --json`: the call succeeded; the outcome is in `status`.
        print_json(&ex)?;
        return Ok(0);
    } else {
        print_execution(&ex, args.images.as_deref())?;
    }
    Ok(match ex.status {
        CodeStatus::Ok => 0,
        CodeStatus::Exception => 1,
        CodeStatus::TimedOut => 124,
        CodeStatus::Interrupted => 130,
        CodeStatus::ContextDied => 137,
    })
}

fn print_execution(ex: &CodeExecution, images: Option<&std::path::Path>) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr().lock();
    if ex.context_created && ex.execution_count == 1 {
        writeln!(
            err,
            "threadbox: a new context {} was started",
            ex.context_id
        )?;
    }
    out.write_all(ex.stdout.as_bytes())?;
    err.write_all(ex.stderr.as_bytes())?;
    let all = ex.outputs.iter().chain(ex.result.iter());
    for (i, o) in all.enumerate() {
        let mut shown = false;
        for (mime, ext) in [("image/png", "png"), ("image/jpeg", "jpg")] {
            let Some(b64) = o.data.get(mime).and_then(|v| v.as_str()) else {
                continue;
            };
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .context("an image output is not base64")?;
            match images {
                Some(dir) => {
                    let path = dir.join(format!("out-{}-{i}.{ext}", ex.execution_count));
                    std::fs::write(&path, &bytes)
                        .with_context(|| format!("writing {}", path.display()))?;
                    writeln!(out, "[{mime}, {} bytes: {}]", bytes.len(), path.display())?;
                }
                None => writeln!(
                    out,
                    "[{mime}, {} bytes; --images DIR writes it]",
                    bytes.len()
                )?,
            }
            shown = true;
        }
        if !shown {
            if let Some(t) = o.data.get("text/plain").and_then(|v| v.as_str()) {
                writeln!(out, "{t}")?;
            }
        }
    }
    if let Some(e) = &ex.exception {
        err.write_all(e.traceback.as_bytes())?;
    }
    if ex.context_restarted {
        writeln!(
            err,
            "threadbox: the context was restarted: its variables are lost ({})",
            ex.reason.as_deref().unwrap_or("no reason given")
        )?;
    } else if ex.status == CodeStatus::ContextDied {
        writeln!(
            err,
            "threadbox: the context's worker died ({}); its variables are lost",
            ex.reason.as_deref().unwrap_or("no reason given")
        )?;
    }
    if ex.truncated {
        writeln!(err, "threadbox: some output was cut")?;
    }
    Ok(())
}
