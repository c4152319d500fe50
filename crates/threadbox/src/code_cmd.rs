//! `threadbox run-code`: run code in a sandbox's persistent interpreter context
//! (issue 15, docs/interpreter.md).

use crate::commands::print_json;
use crate::parse::parse_pairs;
use anyhow::{bail, Context as _};
use base64::Engine;
use futures::StreamExt;
use std::io::Write;
use threadbox_api::interp::{
    CodeEvent, CodeExecution, CodeOutput, CodeStatus, ExecuteCode, ExecuteCodeRequest,
};
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
    let request = ExecuteCodeRequest {
        code,
        env: parse_pairs("--env", &args.env)?,
        timeout_secs: args.timeout,
        max_output_bytes: None,
    };
    if !args.json {
        // The human form streams: output shows as the cell makes it.
        return stream_code(client, &args.sandbox, &args.context, &request, args.images).await;
    }
    let op = ExecuteCode {
        sandbox: args.sandbox,
        context: args.context,
        request,
    };
    let ex: CodeExecution = client.call(&op).await?;
    // As `exec --json`: the call succeeded; the outcome is in `status`.
    print_json(&ex)?;
    Ok(0)
}

fn exit_status(status: CodeStatus) -> u8 {
    match status {
        CodeStatus::Ok => 0,
        CodeStatus::Exception => 1,
        CodeStatus::TimedOut => 124,
        CodeStatus::Interrupted => 130,
        CodeStatus::ContextDied => 137,
    }
}

/// Prints the events of a streamed cell as they come; the exit status is the cell's.
/// Ctrl-C ends the process, which closes the stream and so interrupts the cell.
async fn stream_code(
    client: &Client,
    sandbox: &str,
    context: &str,
    request: &ExecuteCodeRequest,
    images: Option<std::path::PathBuf>,
) -> anyhow::Result<u8> {
    let mut events = client
        .execute_code_stream(sandbox, context, request)
        .await?;
    let mut count = 0;
    let mut index = 0;
    while let Some(ev) = events.next().await {
        let mut out = std::io::stdout().lock();
        let mut err = std::io::stderr().lock();
        match ev? {
            CodeEvent::Start {
                context_id,
                execution_count,
                context_created,
                ..
            } => {
                count = execution_count;
                if context_created && execution_count == 1 {
                    writeln!(err, "threadbox: a new context {context_id} was started")?;
                }
            }
            CodeEvent::Stdout { text } => {
                out.write_all(text.as_bytes())?;
                out.flush()?;
            }
            CodeEvent::Stderr { text } => {
                err.write_all(text.as_bytes())?;
            }
            CodeEvent::Display { data, metadata } | CodeEvent::Result { data, metadata } => {
                let o = CodeOutput { data, metadata };
                print_output(&mut out, &o, count, index, images.as_deref())?;
                index += 1;
            }
            CodeEvent::Exception { traceback, .. } => err.write_all(traceback.as_bytes())?,
            CodeEvent::End {
                status,
                truncated,
                context_restarted,
                reason,
                ..
            } => {
                print_notes(
                    &mut err,
                    status,
                    context_restarted,
                    reason.as_deref(),
                    truncated,
                )?;
                return Ok(exit_status(status));
            }
            CodeEvent::Error { code, message } => {
                bail!("{message} ({})", code.as_str())
            }
            CodeEvent::Keepalive => {}
        }
    }
    bail!("the code stream ended before the cell did")
}

fn print_notes(
    err: &mut impl Write,
    status: CodeStatus,
    context_restarted: bool,
    reason: Option<&str>,
    truncated: bool,
) -> anyhow::Result<()> {
    if context_restarted {
        writeln!(
            err,
            "threadbox: the context was restarted: its variables are lost ({})",
            reason.unwrap_or("no reason given")
        )?;
    } else if status == CodeStatus::ContextDied {
        writeln!(
            err,
            "threadbox: the context's worker died ({}); its variables are lost",
            reason.unwrap_or("no reason given")
        )?;
    }
    if truncated {
        writeln!(err, "threadbox: some output was cut")?;
    }
    Ok(())
}

fn print_output(
    out: &mut impl Write,
    o: &CodeOutput,
    count: u64,
    i: usize,
    images: Option<&std::path::Path>,
) -> anyhow::Result<()> {
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
                let path = dir.join(format!("out-{count}-{i}.{ext}"));
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
    Ok(())
}
