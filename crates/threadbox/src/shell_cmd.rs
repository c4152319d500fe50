//! `threadbox shell SB [-- CMD...]` (issue 17 scope 4, ADR 0093): an interactive terminal
//! session in a sandbox, like `docker exec -it`. The local terminal is put in raw mode
//! (restored on exit, on a panic's unwinding and on SIGINT/SIGTERM/SIGHUP/SIGQUIT sent to
//! this process), its size follows SIGWINCH, and the exit code of the program is this
//! command's. Output loses its title and clipboard sequences (`term::OscFilter`) unless
//! `--raw`. Standard input must be a terminal: for scripts there is `threadbox exec`.

use crate::parse::{parse_pairs, parse_user};
use crate::term::OscFilter;
use anyhow::{bail, Context, Result};
use futures::{SinkExt, StreamExt};
use std::io::Write;
use std::os::fd::AsFd;
use threadbox_api::pty::{PtyRequest, PtyServerControl};
use threadbox_client::Client;
use threadbox_sys::process::pty::{is_terminal, window_size, RawMode};
use tokio::io::AsyncReadExt;
use tokio::signal::unix::{signal, SignalKind};
use tokio_tungstenite::tungstenite::Message;

/// Exit status when the session ended without an exit code (the sandbox stopped).
const EXIT_LOST: u8 = 255;

#[derive(Debug, clap::Args)]
pub struct ShellArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// Environment variable for the program (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox [default: the user's home].
    #[arg(long)]
    pub cwd: Option<String>,
    /// `user` (uid 1000, default) or `root`.
    #[arg(long)]
    pub user: Option<String>,
    /// Let other keys of the tenant type too (they attach with `?write=1`).
    #[arg(long)]
    pub shared_write: bool,
    /// Pass every escape sequence through (titles, clipboard writes too).
    #[arg(long)]
    pub raw: bool,
    /// The program and its arguments [default: a login shell, bash where there is one].
    #[arg(last = true)]
    pub cmd: Vec<String>,
}

pub async fn shell(client: &Client, a: ShellArgs) -> Result<u8> {
    let stdin = std::io::stdin();
    if !is_terminal(stdin.as_fd()) {
        bail!(
            "threadbox shell needs a terminal on standard input; to run commands from a \
             script or a pipe use `threadbox exec SB -- CMD`"
        );
    }
    let (rows, cols) = window_size(stdin.as_fd()).unwrap_or((24, 80));
    let request = PtyRequest {
        cmd: (!a.cmd.is_empty()).then(|| a.cmd.clone()),
        cols: cols.max(1),
        rows: rows.max(1),
        env: parse_pairs("--env", &a.env)?,
        cwd: a.cwd.clone(),
        user: parse_user(a.user.as_deref())?,
        shared_write: a.shared_write,
    };
    let session = client.open_pty(&a.sandbox, request).await?;
    let socket = client
        .attach_pty(&a.sandbox, &session.session, None)
        .await?;
    let raw = RawMode::enter(stdin.as_fd()).context("cannot put the terminal in raw mode")?;
    let outcome = run(socket, a.raw).await;
    drop(raw);
    let (code, error) = outcome?;
    if let Some(message) = error {
        eprintln!("threadbox shell: {}", crate::term::escape_lines(&message));
    }
    Ok(code)
}

/// The session until it ends: (exit code, a message to print once the terminal is back).
async fn run(socket: threadbox_client::Socket, raw: bool) -> Result<(u8, Option<String>)> {
    let (mut tx, mut rx) = socket.split();
    let mut winch = signal(SignalKind::window_change())?;
    // Signals sent to this process end the session the way they would end a local
    // program (128 + the signal), with the terminal restored by the caller.
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut sigquit = signal(SignalKind::quit())?;
    let mut input = tokio::io::stdin();
    let mut buf = vec![0u8; 16 * 1024];
    let mut filter = OscFilter::default();
    let mut out = std::io::stdout();
    let mut error = None;
    let mut stdin_open = true;
    loop {
        tokio::select! {
            _ = sigint.recv() => return Ok((130, None)),
            _ = sigterm.recv() => return Ok((143, None)),
            _ = sighup.recv() => return Ok((129, None)),
            _ = sigquit.recv() => return Ok((131, None)),
            _ = winch.recv() => {
                if let Ok((rows, cols)) = window_size(std::io::stdin().as_fd()) {
                    let msg = format!(r#"{{"type":"resize","cols":{cols},"rows":{rows}}}"#);
                    let _ = tx.send(Message::Text(msg.into())).await;
                }
            }
            n = input.read(&mut buf), if stdin_open => match n {
                Ok(0) | Err(_) => stdin_open = false,
                Ok(n) => {
                    if tx.send(Message::Binary(buf[..n].to_vec().into())).await.is_err() {
                        break;
                    }
                }
            },
            msg = rx.next() => match msg {
                Some(Ok(Message::Binary(data))) => {
                    let shown = if raw { data.to_vec() } else { filter.push(&data) };
                    out.write_all(&shown)?;
                    out.flush()?;
                }
                Some(Ok(Message::Text(text))) => match serde_json::from_str::<PtyServerControl>(&text) {
                    Ok(PtyServerControl::Exit { code }) => {
                        out.write_all(&filter.finish())?;
                        out.flush()?;
                        return Ok((u8::try_from(code).unwrap_or(EXIT_LOST), None));
                    }
                    Ok(PtyServerControl::Error { message }) => error = Some(message),
                    Err(_) => {}
                },
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                Some(Ok(_)) => {}
            },
        }
    }
    Ok((
        EXIT_LOST,
        Some(error.unwrap_or_else(|| "the session ended without an exit code".into())),
    ))
}
