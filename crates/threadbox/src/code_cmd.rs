//! `threadbox run` (alias `run-code`): run code in a sandbox's persistent interpreter context
//! (issue 15, docs/interpreter.md).

use crate::commands::print_json;
use crate::parse::parse_pairs;
use anyhow::{bail, Context as _};
use base64::Engine;
use futures::StreamExt;
use std::io::Write;
use threadbox_api::interp::{
    canonical_language, CodeEvent, CodeExecution, CodeOutput, CodeStatus, Context, CreateContext,
    CreateContextRequest, ExecuteCode, ExecuteCodeRequest, LANGUAGES,
};
use threadbox_client::Client;

#[derive(Debug, clap::Args)]
pub struct RunCodeArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// The code; `-` reads it from stdin.
    #[arg(short = 'c', long = "code", value_name = "CODE")]
    pub code_opt: Option<String>,
    /// The context (id or name) [default: the language's name]. A context of that name
    /// is created (in `--language`) when there is none.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
    /// `python` (default), `javascript` (node) or `bash`: the language of a context this
    /// call creates; an existing context must be of it.
    #[arg(long, short = 'l', value_name = "LANG")]
    pub language: Option<String>,
    /// Interrupt the cell after this many seconds of running time [default: 300].
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<u64>,
    /// Environment variable K=V for this cell only (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Write image outputs (PNG, JPEG) into this directory as `out-<n>-<i>.<ext>`
    /// [default: a new directory under the system's temporary directory]; their paths
    /// are printed.
    #[arg(long, value_name = "DIR")]
    pub images: Option<std::path::PathBuf>,
    /// Print the whole execution as one JSON document (images stay base64 in it).
    #[arg(long)]
    pub json: bool,
    /// The code, as `-c` (the form of `run-code`).
    #[arg(value_name = "CODE", conflicts_with = "code_opt")]
    pub code: Option<String>,
}

/// The context to run in: a language's own name is made by the execute itself; another
/// name is get-or-create here, in `--language`. An explicit `--language` that does not
/// match an existing context's is an error rather than a surprise.
async fn resolve_context(client: &Client, args: &RunCodeArgs) -> anyhow::Result<String> {
    let language = match &args.language {
        Some(l) => Some(
            canonical_language(l)
                .with_context(|| {
                    format!("unknown --language {l:?} (one of {})", LANGUAGES.join(", "))
                })?
                .to_string(),
        ),
        None => None,
    };
    let name = match (&args.context, &language) {
        (Some(c), _) => c.clone(),
        (None, Some(l)) => l.clone(),
        (None, None) => "python".to_string(),
    };
    let language =
        language.unwrap_or_else(|| canonical_language(&name).unwrap_or("python").to_string());
    if canonical_language(&name).is_some_and(|l| l == name && l == language) {
        return Ok(name);
    }
    let ctx: Context = client
        .call(&CreateContext {
            sandbox: args.sandbox.clone(),
            request: CreateContextRequest {
                name: Some(name.clone()),
                language: language.clone(),
                cwd: None,
                env: Default::default(),
                user: Default::default(),
            },
        })
        .await?;
    if ctx.language != language {
        bail!(
            "context {name:?} is a {} context, not {language}",
            ctx.language
        );
    }
    Ok(ctx.id)
}

/// Exit status (without `--json`): 0 when the cell ran to its end, 1 when it raised,
/// 124 on a timeout, 130 when interrupted, 137 when the context died.
pub async fn run_code(client: &Client, args: RunCodeArgs) -> anyhow::Result<u8> {
    let Some(code) = args.code_opt.clone().or_else(|| args.code.clone()) else {
        bail!("no code: give it with -c CODE (`-c -` reads it from stdin)");
    };
    let code = if code == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading stdin")?;
        s
    } else {
        code
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
    let context = resolve_context(client, &args).await?;
    if !args.json {
        // The human form streams: output shows as the cell makes it.
        return stream_code(client, &args.sandbox, &context, &request, args.images).await;
    }
    let op = ExecuteCode {
        sandbox: args.sandbox,
        context,
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
    let mut images = images;
    let mut execution = String::new();
    while let Some(ev) = events.next().await {
        let mut out = std::io::stdout().lock();
        let mut err = std::io::stderr().lock();
        match ev? {
            CodeEvent::Start {
                execution_id,
                context_id,
                execution_count,
                context_created,
                ..
            } => {
                count = execution_count;
                execution = execution_id;
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
                if images.is_none() && has_image(&o) {
                    let dir = std::env::temp_dir().join(format!("threadbox-run-{execution}"));
                    std::fs::create_dir_all(&dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                    images = Some(dir);
                }
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

const IMAGE_TYPES: [(&str, &str); 2] = [("image/png", "png"), ("image/jpeg", "jpg")];

fn has_image(o: &CodeOutput) -> bool {
    IMAGE_TYPES.iter().any(|(m, _)| o.data.contains_key(*m))
}

fn print_output(
    out: &mut impl Write,
    o: &CodeOutput,
    count: u64,
    i: usize,
    images: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let mut shown = false;
    for (mime, ext) in IMAGE_TYPES {
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
