//! One function per CLI command: build a request, call the client, print the result.
//!
//! (Over 600 lines on purpose: a flat list of short, independent functions, one per
//! subcommand in `cli.rs` order; splitting them would only scatter the CLI.)

use crate::cli::*;
use crate::parse::{parse_pairs, parse_signal, parse_size, parse_user};
use anyhow::{bail, Context};
use futures::StreamExt;
use serde::Serialize;
use std::io::Write;
use threadbox_api::*;
use threadbox_client::Client;

/// Exit status of `exec` when the timeout killed the command.
const EXIT_TIMEOUT: u8 = 124;

pub async fn run(cli: Cli) -> anyhow::Result<u8> {
    let url = cli.url.as_deref();
    match cli.command {
        Command::Serve(args) => crate::serve_cmd::serve(args).await.map(|()| 0),
        Command::Openapi => {
            write_stdout(threadbox_server::openapi_json().as_bytes())?;
            Ok(0)
        }
        Command::JailLaunch => bail!("__jail-launch must be the first argument"),
        Command::Mcp => crate::mcp_cmd::run(url).await.map(|()| 0),
        Command::Keys(cmd) => crate::gov_cmd::keys(&client(url)?, cmd).await,
        Command::Quota(cmd) => crate::gov_cmd::quota(&client(url)?, cmd).await,
        Command::Usage(args) => crate::gov_cmd::usage(&client(url)?, args).await,
        Command::Audit(cmd) => crate::gov_cmd::audit(&client(url)?, cmd).await,
        Command::Create(args) => create(&client(url)?, args).await,
        Command::Net(cmd) => crate::net_cmd::net(&client(url)?, cmd).await,
        Command::Secret(cmd) => crate::secret_cmd::secret(&client(url)?, cmd).await,
        Command::Preview(a) => crate::preview_cmd::preview(&client(url)?, a).await,
        Command::Checkpoint(a) => crate::ckpt_cmd::checkpoint(&client(url)?, a).await,
        Command::Checkpoints(a) => crate::ckpt_cmd::checkpoints(&client(url)?, a).await,
        Command::Rewind(a) => crate::ckpt_cmd::rewind(&client(url)?, a).await,
        Command::Fork(a) => crate::ckpt_cmd::fork(&client(url)?, a).await,
        Command::Template(c) => crate::template_cmd::run(&client(url)?, c).await,
        Command::Ls(args) => ls(&client(url)?, args).await,
        Command::Info(a) => {
            let sb = client(url)?.get(&a.sandbox).await?;
            if a.json {
                print_json(&sb)?;
            } else {
                print_sandbox(&sb)?;
            }
            Ok(0)
        }
        Command::Exec(args) => exec(&client(url)?, args).await,
        Command::Shell(a) => crate::shell_cmd::shell(&client(url)?, a).await,
        Command::Run(args) => crate::code_cmd::run_code(&client(url)?, args).await,
        Command::Pause(a) => {
            let c = client(url)?;
            transition(c.pause(&a.sandbox).await?, a.json)
        }
        Command::Hibernate(a) => {
            let c = client(url)?;
            transition(c.hibernate(&a.sandbox).await?, a.json)
        }
        Command::Resume(a) => {
            let c = client(url)?;
            transition(c.resume(&a.sandbox).await?, a.json)
        }
        Command::Stop(a) => {
            let c = client(url)?;
            transition(c.stop(&a.sandbox).await?, a.json)
        }
        Command::Start(a) => {
            let c = client(url)?;
            transition(c.start(&a.sandbox).await?, a.json)
        }
        Command::Rm(a) => {
            client(url)?.delete(&a.sandbox, a.force).await?;
            Ok(0)
        }
        Command::Files(cmd) => files(&client(url)?, cmd).await,
        Command::Ps(a) => {
            let list = client(url)?.list_processes(&a.sandbox).await?;
            if a.json {
                print_json(&list)?;
            } else {
                print_processes(&list)?;
            }
            Ok(0)
        }
        Command::Spawn(args) => spawn(&client(url)?, args).await,
        Command::Logs(a) => {
            let logs = client(url)?.process_logs(&a.sandbox, a.process_id).await?;
            if a.json {
                print_json(&logs)?;
            } else {
                let out = decode_bytes(&logs.stdout, logs.encoding).map_err(anyhow::Error::msg)?;
                let err = decode_bytes(&logs.stderr, logs.encoding).map_err(anyhow::Error::msg)?;
                let mut output = Output::new(a.raw);
                output.stdout(&out)?;
                output.stderr(&err)?;
                output.finish()?;
            }
            Ok(0)
        }
        Command::Kill(a) => {
            let signal = a.signal.as_deref().map(parse_signal).transpose()?;
            client(url)?
                .kill_process(&a.sandbox, a.process_id, signal)
                .await?;
            Ok(0)
        }
        Command::Tiers(a) => {
            let list = client(url)?.call(&threadbox_api::tiers::ListTiers).await?;
            if a.json {
                print_json(&list)?;
            } else {
                let mut text = String::new();
                for t in &list.tiers {
                    let state = match &t.reason {
                        None => "available".to_string(),
                        Some(r) => format!("unavailable: {r}"),
                    };
                    text.push_str(&format!(
                        "{}{} {state}; kernel {}; capabilities: {}\n",
                        crate::term::escape(&t.name),
                        if t.default { " (default)" } else { "" },
                        crate::term::escape(t.kernel.as_deref().unwrap_or("?")),
                        t.capabilities.join(", ")
                    ));
                }
                write_stdout(text.as_bytes())?;
            }
            Ok(0)
        }
        Command::Selftest(a) => {
            let report = client(url)?.selftest(&a.sandbox).await?;
            if a.json {
                print_json(&report)?;
            } else {
                let mut text = String::new();
                for c in &report.checks {
                    let mark = match (c.applies, c.ok) {
                        (false, _) => "n/a ",
                        (true, true) => "ok  ",
                        (true, false) => "FAIL",
                    };
                    text.push_str(&format!(
                        "{mark} {}: {}\n",
                        crate::term::escape(&c.name),
                        crate::term::escape(&c.detail)
                    ));
                }
                text.push_str(if report.ok {
                    "all checks passed\n"
                } else {
                    "some checks FAILED\n"
                });
                write_stdout(text.as_bytes())?;
            }
            Ok(if report.ok { 0 } else { 1 })
        }
        Command::Image(cmd) => image(&client(url)?, cmd).await,
    }
}

fn client(url: Option<&str>) -> anyhow::Result<Client> {
    Ok(Client::from_env(url)?)
}

// ---- output helpers -------------------------------------------------------------------

pub(crate) fn write_stdout(bytes: &[u8]) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(bytes)?;
    out.flush()
}

fn write_stderr(bytes: &[u8]) -> std::io::Result<()> {
    let mut err = std::io::stderr().lock();
    err.write_all(bytes)?;
    err.flush()
}

/// Where a sandbox's raw output goes: stdout and stderr, each through an
/// [`OscFilter`](crate::term::OscFilter) when it is a terminal (unless `--raw`).
struct Output {
    stdout: Option<crate::term::OscFilter>,
    stderr: Option<crate::term::OscFilter>,
}

impl Output {
    fn new(raw: bool) -> Self {
        use std::io::IsTerminal;
        let filter = |tty: bool| (tty && !raw).then(crate::term::OscFilter::default);
        Output {
            stdout: filter(std::io::stdout().is_terminal()),
            stderr: filter(std::io::stderr().is_terminal()),
        }
    }

    fn stdout(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match &mut self.stdout {
            Some(f) => write_stdout(&f.push(bytes)),
            None => write_stdout(bytes),
        }
    }

    fn stderr(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match &mut self.stderr {
            Some(f) => write_stderr(&f.push(bytes)),
            None => write_stderr(bytes),
        }
    }

    /// Writes what the filters held back at the end of the output.
    fn finish(&mut self) -> std::io::Result<()> {
        if let Some(f) = &mut self.stdout {
            write_stdout(&f.finish())?;
        }
        if let Some(f) = &mut self.stderr {
            write_stderr(&f.finish())?;
        }
        Ok(())
    }
}

/// Prints exactly one JSON document.
pub(crate) fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    write_stdout(text.as_bytes())?;
    Ok(())
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
/// Every cell goes through [`escape`](crate::term::escape): names, commands and labels
/// come from sandboxes and tenants and must not reach the terminal as control bytes.
/// A name or path as the CLI shows it: bytes that are not UTF-8 (given in the entry's
/// `*_b64` field) as `\xNN`, the rest as text.
fn shown_name(text: &str, b64: Option<&str>) -> String {
    use base64::Engine;
    let Some(bytes) = b64.and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
    else {
        return text.to_string();
    };
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| crate::term::escape(c)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            if i == last {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in &rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

fn print_sandbox(sb: &Sandbox) -> anyhow::Result<()> {
    let labels = sb
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |s| format!("{s}s"));
    let esc = crate::term::escape;
    let text = format!(
        "id:             {}\nname:           {}\nstate:          {}\nimage:          {}\n\
         labels:         {}\ncreated_at:     {}\nlast_active_at: {}\nmemory:         {} bytes\n\
         cpus:           {}\npids:           {}\nidle_pause:     {}\nidle_hibernate: {}\nidle_stop:      {}\n\
         ttl:            {}{}\n\
         agent_pid:      {}\n",
        esc(&sb.id),
        esc(sb.name.as_deref().unwrap_or("-")),
        sb.state.as_str(),
        esc(&sb.image),
        if labels.is_empty() {
            "-".to_string()
        } else {
            esc(&labels)
        },
        sb.created_at,
        sb.last_active_at,
        sb.limits.memory_bytes,
        sb.limits.cpus,
        sb.limits.pids,
        opt(sb.idle_pause_secs),
        opt(sb.idle_hibernate_secs),
        opt(sb.idle_stop_secs),
        opt(sb.ttl_secs),
        match (sb.ttl_secs, sb.ttl_action) {
            (None, _) => "",
            (Some(_), TtlAction::Stop) => " (then stop)",
            (Some(_), TtlAction::Delete) => " (then delete)",
        },
        sb.agent_pid.map_or("-".to_string(), |p| p.to_string()),
    );
    write_stdout(text.as_bytes())?;
    Ok(())
}

fn transition(sb: Sandbox, json: bool) -> anyhow::Result<u8> {
    if json {
        print_json(&sb)?;
    } else {
        write_stdout(format!("{}\n", sb.state.as_str()).as_bytes())?;
    }
    Ok(0)
}

fn print_processes(list: &ProcessList) -> anyhow::Result<()> {
    let rows: Vec<Vec<String>> = list
        .processes
        .iter()
        .map(|p| {
            let status = if p.running {
                "running".to_string()
            } else if let Some(code) = p.exit_code {
                format!("exited {code}")
            } else if let Some(sig) = p.signal {
                format!("killed by signal {sig}")
            } else {
                "exited".to_string()
            };
            vec![
                p.id.to_string(),
                p.pid.to_string(),
                status,
                p.started_at.clone(),
                p.command.join(" "),
            ]
        })
        .collect();
    write_stdout(table(&["ID", "PID", "STATUS", "STARTED", "COMMAND"], &rows).as_bytes())?;
    Ok(())
}

// ---- sandboxes ------------------------------------------------------------------------

async fn create(client: &Client, args: CreateArgs) -> anyhow::Result<u8> {
    let memory_bytes = args.memory.as_deref().map(parse_size).transpose()?;
    if let Some(cpus) = args.cpus {
        if !cpus.is_finite() || cpus <= 0.0 {
            bail!("invalid --cpus {cpus}: expected a positive number of cores");
        }
    }
    let req = CreateSandboxRequest {
        name: args.name,
        labels: parse_pairs("--label", &args.labels)?,
        image: args.image,
        limits: LimitsRequest {
            memory_bytes,
            cpus: args.cpus,
            pids: args.pids,
            disk_bytes: args.disk.as_deref().map(parse_size).transpose()?,
        },
        idle_pause_secs: args.idle_pause,
        idle_stop_secs: args.idle_stop,
        idle_hibernate_secs: args.idle_hibernate,
        ttl_secs: args.ttl,
        ttl_action: match args.ttl_action {
            Some(TtlActionArg::Delete) => TtlAction::Delete,
            Some(TtlActionArg::Stop) | None => TtlAction::Stop,
        },
        tier: args.tier,
        network: if args.allow.is_empty() {
            None
        } else {
            Some(crate::net_cmd::policy_from_allow(&args.allow)?)
        },
        secrets: args.secrets,
        otlp_relay: args.otlp_relay,
        template: args.template,
    };
    let (sandbox, _created) = client.create(&req).await?;
    if args.json {
        print_json(&sandbox)?;
    } else {
        write_stdout(format!("{}\n", sandbox.id).as_bytes())?;
    }
    Ok(0)
}

async fn ls(client: &Client, args: LsArgs) -> anyhow::Result<u8> {
    let labels = parse_pairs("--label", &args.labels)?;
    let state = args.state.map(|s| match s {
        StateArg::Creating => SandboxState::Creating,
        StateArg::Running => SandboxState::Running,
        StateArg::Paused => SandboxState::Paused,
        StateArg::Hibernated => SandboxState::Hibernated,
        StateArg::Stopped => SandboxState::Stopped,
    });
    let list = client.list(&labels, state).await?;
    if args.json {
        print_json(&list)?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .sandboxes
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.name.clone().unwrap_or_else(|| "-".to_string()),
                s.state.as_str().to_string(),
                s.image.clone(),
                s.created_at.clone(),
            ]
        })
        .collect();
    write_stdout(table(&["ID", "NAME", "STATE", "IMAGE", "CREATED"], &rows).as_bytes())?;
    Ok(0)
}

// ---- exec -------------------------------------------------------------------------------

async fn read_all_stdin() -> anyhow::Result<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut data = Vec::new();
    tokio::io::stdin()
        .read_to_end(&mut data)
        .await
        .context("cannot read stdin")?;
    Ok(data)
}

async fn exec(client: &Client, args: ExecArgs) -> anyhow::Result<u8> {
    if let Some(t) = args.timeout {
        if !t.is_finite() || t <= 0.0 {
            bail!("invalid --timeout {t}: expected a positive number of seconds");
        }
    }
    let (stdin, stdin_encoding) = if args.stdin {
        let (s, e) = encode_bytes(&read_all_stdin().await?);
        (Some(s), e)
    } else {
        (None, Encoding::Utf8)
    };
    let req = ExecRequest {
        command: Some(args.command),
        shell: None,
        env: parse_pairs("--env", &args.env)?,
        cwd: args.cwd,
        user: parse_user(args.user.as_deref())?,
        stdin,
        stdin_encoding,
        timeout_secs: args.timeout,
        max_output_bytes: args.max_output.as_deref().map(parse_size).transpose()?,
    };
    if args.json {
        let resp = client.exec(&args.sandbox, &req).await?;
        print_json(&resp)?;
        return Ok(0);
    }
    let mut events = client.exec_stream(&args.sandbox, &req).await?;
    let mut output = Output::new(args.raw);
    while let Some(event) = events.next().await {
        match event? {
            ExecEvent::Start { .. } => {}
            ExecEvent::Stdout { data, encoding } => {
                output.stdout(&decode_bytes(&data, encoding).map_err(anyhow::Error::msg)?)?;
            }
            ExecEvent::Stderr { data, encoding } => {
                output.stderr(&decode_bytes(&data, encoding).map_err(anyhow::Error::msg)?)?;
            }
            ExecEvent::End {
                exit_code,
                signal,
                timed_out,
                oom_killed,
                memory_limit_bytes,
                ..
            } => {
                output.finish()?;
                if oom_killed {
                    // A bare 137 does not say why; the kernel's verdict does.
                    eprintln!("{}", oom_message(memory_limit_bytes));
                }
                if timed_out {
                    return Ok(EXIT_TIMEOUT);
                }
                return Ok(match (exit_code, signal) {
                    (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
                    (None, Some(sig)) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(1),
                    (None, None) => 1,
                });
            }
            ExecEvent::Error { code, message } => {
                output.finish()?;
                bail!("{} ({})", crate::term::escape(&message), code.as_str());
            }
        }
    }
    bail!("the exec stream ended before the process did")
}

async fn spawn(client: &Client, args: SpawnArgs) -> anyhow::Result<u8> {
    let req = StartProcessRequest {
        command: Some(args.command),
        shell: None,
        env: parse_pairs("--env", &args.env)?,
        cwd: args.cwd,
        user: parse_user(args.user.as_deref())?,
    };
    let info = client.start_process(&args.sandbox, &req).await?;
    if args.json {
        print_json(&info)?;
    } else {
        write_stdout(format!("{}\n", info.id).as_bytes())?;
    }
    Ok(0)
}

// ---- files ------------------------------------------------------------------------------

async fn files(client: &Client, cmd: FilesCommand) -> anyhow::Result<u8> {
    match cmd {
        FilesCommand::Ls(a) => {
            let user = parse_user(a.file.user.as_deref())?;
            let list = client
                .list_files(&a.file.sandbox, &a.file.path, user)
                .await?;
            if a.json {
                print_json(&list)?;
            } else {
                let rows: Vec<Vec<String>> = list
                    .entries
                    .iter()
                    .map(|e| {
                        let shown = shown_name(&e.name, e.name_b64.as_deref());
                        let name = match (&e.kind, &e.symlink_target) {
                            (FileKind::Symlink, Some(t)) => format!("{shown} -> {t}"),
                            (FileKind::Dir, _) => format!("{shown}/"),
                            _ => shown,
                        };
                        vec![
                            kind_str(e.kind).to_string(),
                            format!("{:o}", e.mode & 0o7777),
                            e.size.to_string(),
                            e.modified_at.clone(),
                            name,
                        ]
                    })
                    .collect();
                write_stdout(
                    table(&["TYPE", "MODE", "SIZE", "MODIFIED", "NAME"], &rows).as_bytes(),
                )?;
            }
        }
        FilesCommand::Stat(a) => {
            let user = parse_user(a.file.user.as_deref())?;
            let e = client
                .stat_file(&a.file.sandbox, &a.file.path, user)
                .await?;
            if a.json {
                print_json(&e)?;
            } else {
                let text = format!(
                    "path:     {}\ntype:     {}\nsize:     {}\nmode:     {:o}\nowner:    {}:{}\nmodified: {}\n{}",
                    crate::term::escape(&shown_name(&e.path, e.path_b64.as_deref())),
                    kind_str(e.kind),
                    e.size,
                    e.mode & 0o7777,
                    e.uid,
                    e.gid,
                    e.modified_at,
                    e.symlink_target
                        .as_deref()
                        .map(|t| format!("target:   {}\n", crate::term::escape(t)))
                        .unwrap_or_default(),
                );
                write_stdout(text.as_bytes())?;
            }
        }
        FilesCommand::Read(a) => {
            let user = parse_user(a.file.user.as_deref())?;
            let mut chunks = client
                .read_file_range(
                    &a.file.sandbox,
                    &a.file.path,
                    user,
                    a.offset.unwrap_or(0),
                    a.length,
                )
                .await?;
            let mut output = Output::new(a.raw);
            while let Some(chunk) = chunks.next().await {
                output.stdout(&chunk?)?;
            }
            output.finish()?;
        }
        FilesCommand::Write(a) => {
            let user = parse_user(a.user.as_deref())?;
            client
                .write_file_from(&a.sandbox, &a.path, user, tokio::io::stdin())
                .await?;
        }
        FilesCommand::Mkdir(a) => {
            let user = parse_user(a.file.user.as_deref())?;
            client
                .mkdir(&a.file.sandbox, &a.file.path, user, a.parents)
                .await?;
        }
        FilesCommand::Rm(a) => {
            let user = parse_user(a.file.user.as_deref())?;
            client
                .remove_file(&a.file.sandbox, &a.file.path, user, a.recursive)
                .await?;
        }
    }
    Ok(0)
}

fn kind_str(kind: FileKind) -> &'static str {
    match kind {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Other => "other",
    }
}

// ---- images -----------------------------------------------------------------------------

async fn image(client: &Client, cmd: ImageCommand) -> anyhow::Result<u8> {
    match cmd {
        ImageCommand::Add { name, dir, json } => {
            // The daemon resolves the path on its host; make a relative path absolute
            // here, where it was meant.
            let dir = if dir.is_absolute() {
                dir
            } else {
                std::fs::canonicalize(&dir)
                    .with_context(|| format!("cannot resolve {}", dir.display()))?
            };
            let path = dir
                .to_str()
                .with_context(|| format!("{} is not valid UTF-8", dir.display()))?
                .to_string();
            let image = client.add_image(&AddImageRequest { name, path }).await?;
            if json {
                print_json(&image)?;
            } else {
                write_stdout(format!("{}\n", image.name).as_bytes())?;
            }
        }
        ImageCommand::Pull(args) => return crate::image_cmd::pull(client, args).await,
        ImageCommand::Import(args) => return crate::image_cmd::import(client, args).await,
        ImageCommand::Rm { name } => client.remove_image(&name).await?,
        ImageCommand::Ls { json } => {
            let list = client.list_images().await?;
            if json {
                print_json(&list)?;
            } else {
                let rows: Vec<Vec<String>> = list
                    .images
                    .iter()
                    .map(|i| {
                        vec![
                            i.name.clone(),
                            i.kind.clone(),
                            i.sandboxes.to_string(),
                            i.created_at.clone(),
                            i.reference
                                .clone()
                                .or_else(|| i.path.clone())
                                .unwrap_or_else(|| "-".to_string()),
                        ]
                    })
                    .collect();
                write_stdout(
                    table(&["NAME", "KIND", "SANDBOXES", "CREATED", "SOURCE"], &rows).as_bytes(),
                )?;
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::{shown_name, table};

    #[test]
    fn names_that_are_not_utf8_are_shown_escaped() {
        assert_eq!(
            shown_name("caf\u{fffd}", Some("Y2Fm6S3/")),
            "caf\\xe9-\\xff"
        );
        assert_eq!(shown_name("plain", None), "plain");
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(
            &["ID", "NAME"],
            &[
                vec!["abc".into(), "x".into()],
                vec!["a".into(), "longer".into()],
            ],
        );
        assert_eq!(t, "ID   NAME\nabc  x\na    longer\n");
    }
}
