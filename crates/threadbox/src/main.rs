//! The `threadbox` binary: the CLI, `serve`, and the jail launch helper. Wiring only.
#![forbid(unsafe_code)]

mod ckpt_cmd;
mod cli;
mod code_cmd;
mod commands;
mod gov_cmd;
mod image_cmd;
mod mcp_cmd;
mod net_cmd;
mod net_log_cmd;
mod parse;
mod preview_cmd;
mod secret_cmd;
mod serve_cmd;
mod shell_cmd;
mod template_cmd;
mod term;

use clap::Parser;
use std::process::ExitCode;

/// Exit status of a command that failed (usage errors exit 2, via clap).
const EXIT_FAILURE: u8 = 1;
/// Exit status when stdout was closed under us (like a process killed by SIGPIPE).
const EXIT_BROKEN_PIPE: u8 = 141;

fn main() -> ExitCode {
    // The jail launch helper must run before any thread exists: it forks and unshares,
    // which is undefined behaviour in a multithreaded process. So no runtime, no logger,
    // no argument parser before this check.
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new("__jail-launch")) {
        let code = threadbox_sys::jail::helper_main();
        return ExitCode::from(u8::try_from(code).unwrap_or(EXIT_FAILURE));
    }
    // The gvisor tier's helper unshares its mount namespace: the same rule.
    if std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new("__gvisor-launch")) {
        let code = threadbox_sys::gvisor::helper_main();
        return ExitCode::from(u8::try_from(code).unwrap_or(EXIT_FAILURE));
    }

    let cli = cli::Cli::parse();
    let is_serve = matches!(cli.command, cli::Command::Serve(_));
    let runtime = if is_serve {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let result = runtime.block_on(commands::run(cli));
    // Do not wait for stray blocking tasks (a stdin reader) at exit.
    runtime.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(code),
        Err(err) if is_broken_pipe(&err) => ExitCode::from(EXIT_BROKEN_PIPE),
        Err(err) => {
            // Daemon messages may quote sandbox-made text (paths, agent errors).
            eprintln!("error: {}", term::escape_lines(&format!("{err:#}")));
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
