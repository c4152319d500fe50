//! `threadbox image pull` and `image import` (issue 14): the pull's progress bar (bytes,
//! layers) drawn on stderr from the daemon's NDJSON events.

use crate::commands::{print_json, write_stdout};
use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use threadbox_api::images::{ImageEvent, ImportImageRequest, PullImageRequest};
use threadbox_api::{human_bytes, Image};
use threadbox_client::{Client, ClientError};

#[derive(Debug, Args)]
pub struct PullArgs {
    /// `[registry/]repository[:tag][@sha256:…]`.
    pub reference: String,
    /// Catalog name [default: the reference].
    #[arg(long)]
    pub name: Option<String>,
    /// `os/arch[/variant]` [default: the daemon host's].
    #[arg(long)]
    pub platform: Option<String>,
    /// Registry user name (the password is read from stdin with --password-stdin).
    #[arg(long)]
    pub username: Option<String>,
    /// Read the registry password (or token) from stdin.
    #[arg(long)]
    pub password_stdin: bool,
    /// Plain HTTP to a registry that is not on loopback.
    #[arg(long)]
    pub insecure: bool,
    /// Print the image as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// A `docker save` archive, an OCI layout directory, or a tar of one.
    pub file: PathBuf,
    /// Catalog name [default: the archive's tag].
    #[arg(long)]
    pub name: Option<String>,
    /// `os/arch[/variant]` [default: the daemon host's].
    #[arg(long)]
    pub platform: Option<String>,
    /// Print the image as JSON.
    #[arg(long)]
    pub json: bool,
}

fn show(image: &Image, json: bool) -> anyhow::Result<()> {
    if json {
        print_json(image)?;
    } else {
        write_stdout(format!("{}\n", image.name).as_bytes())?;
    }
    Ok(())
}

/// The progress bar's one line.
fn bar(done: u64, total: u64, layers_done: u32, layers: u32) -> String {
    const W: u64 = 30;
    let filled = (done.min(total) * W).checked_div(total).unwrap_or(W);
    format!(
        "\r[{}{}] {} / {}  layers {layers_done}/{layers} ",
        "=".repeat(filled as usize),
        " ".repeat((W - filled) as usize),
        human_bytes(done),
        human_bytes(total)
    )
}

pub async fn pull(client: &Client, a: PullArgs) -> anyhow::Result<u8> {
    let password = if a.password_stdin {
        let mut s = String::new();
        std::io::stdin()
            .read_line(&mut s)
            .context("cannot read the password from stdin")?;
        Some(s.trim_end_matches(['\n', '\r']).to_string())
    } else {
        None
    };
    if password.is_some() != a.username.is_some() {
        anyhow::bail!("--username and --password-stdin go together");
    }
    let req = PullImageRequest {
        reference: a.reference,
        name: a.name,
        platform: a.platform,
        username: a.username,
        password,
        insecure: a.insecure,
    };
    let tty = std::io::stderr().is_terminal();
    let mut err = std::io::stderr();
    let mut stream = client.pull_image_stream(&req).await?;
    let (mut done, mut total, mut layers, mut layers_done) = (0u64, 0u64, 0u32, 0u32);
    while let Some(ev) = stream.next().await {
        match ev? {
            ImageEvent::Resolved {
                digest,
                layers: n,
                bytes,
            } => {
                (total, layers) = (bytes, n);
                let _ = writeln!(err, "{digest}: {n} layers, {}", human_bytes(bytes));
            }
            ImageEvent::Progress { bytes, total: t } => (done, total) = (bytes, t),
            ImageEvent::Layer { .. } => layers_done += 1,
            ImageEvent::Done { image } => {
                if tty {
                    let _ = writeln!(err, "{}", bar(total, total, layers, layers));
                }
                show(&image, a.json)?;
                return Ok(0);
            }
            ImageEvent::Error { code, message } => {
                if tty {
                    let _ = writeln!(err);
                }
                return Err(ClientError::Api {
                    status: 200,
                    code,
                    message,
                }
                .into());
            }
        }
        if tty {
            let _ = write!(err, "{}", bar(done, total, layers_done, layers));
            let _ = err.flush();
        }
    }
    anyhow::bail!("the pull's stream ended without an answer")
}

pub async fn import(client: &Client, a: ImportArgs) -> anyhow::Result<u8> {
    // The daemon resolves the path on its host; a relative path is made absolute here,
    // where it was meant.
    let file = if a.file.is_absolute() {
        a.file
    } else {
        std::fs::canonicalize(&a.file)
            .with_context(|| format!("cannot resolve {}", a.file.display()))?
    };
    let path = file
        .to_str()
        .with_context(|| format!("{} is not valid UTF-8", file.display()))?
        .to_string();
    let image = client
        .import_image(&ImportImageRequest {
            path,
            name: a.name,
            platform: a.platform,
        })
        .await?;
    show(&image, a.json)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_bar_fills_with_the_bytes() {
        let b = super::bar(5 << 20, 10 << 20, 1, 3);
        assert!(b.contains("[===============               ]"), "{b}");
        assert!(b.contains("layers 1/3"), "{b}");
    }
}
