//! `threadbox secret` (issue 13, ADR 0068): a tenant's secrets. The value is read from
//! stdin or `--value-file`, never from argv (argv is visible to every process on the host).

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::PathBuf;
use threadbox_api::secrets::{DeleteSecret, ListSecrets, SetSecret, SetSecretRequest};
use threadbox_client::Client;

#[derive(Debug, clap::Subcommand)]
pub enum SecretCommand {
    /// Store a secret (value from stdin, or --value-file); replaces one of that name.
    Set {
        /// Its name: also the env variable that holds its placeholder in a sandbox.
        name: String,
        /// The one host the value is sent to (TLS to it is intercepted).
        #[arg(long)]
        host: String,
        /// The request header it goes in [default: Authorization].
        #[arg(long)]
        header: Option<String>,
        /// How the value is written when the header holds the bare placeholder, `{}`
        /// being the value, e.g. 'Bearer {}' [default: {}].
        #[arg(long)]
        format: Option<String>,
        /// Read the value from this file instead of stdin.
        #[arg(long, value_name = "FILE")]
        value_file: Option<PathBuf>,
    },
    /// List the tenant's secrets: names, hosts, headers (never values).
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Remove a secret.
    Rm { name: String },
}

/// The value as read: one trailing newline (from `echo` or an editor) is dropped.
fn read_value(file: Option<PathBuf>) -> Result<String> {
    let mut raw = Vec::new();
    match file {
        Some(p) => {
            raw = std::fs::read(&p).with_context(|| format!("--value-file {}", p.display()))?
        }
        None => {
            std::io::stdin()
                .read_to_end(&mut raw)
                .context("reading the value from stdin")?;
        }
    }
    let mut v = String::from_utf8(raw).context("the value must be UTF-8")?;
    if v.ends_with('\n') {
        v.pop();
        if v.ends_with('\r') {
            v.pop();
        }
    }
    if v.is_empty() {
        bail!("no value: pipe it on stdin or give --value-file");
    }
    Ok(v)
}

pub async fn secret(client: &Client, cmd: SecretCommand) -> Result<u8> {
    match cmd {
        SecretCommand::Set {
            name,
            host,
            header,
            format,
            value_file,
        } => {
            let value = read_value(value_file)?;
            let info = client
                .call(&SetSecret {
                    name,
                    req: SetSecretRequest {
                        host,
                        header,
                        format,
                        value,
                    },
                })
                .await?;
            crate::commands::write_stdout(
                format!(
                    "{} for {} in {} ({})\n",
                    info.name, info.host, info.header, info.format
                )
                .as_bytes(),
            )?;
        }
        SecretCommand::Ls { json } => {
            let list = client.call(&ListSecrets).await?;
            if json {
                crate::commands::print_json(&list)?;
            } else {
                let mut out = String::new();
                for s in &list.secrets {
                    out.push_str(&format!(
                        "{}\t{}\t{}\t{}\n",
                        s.name, s.host, s.header, s.format
                    ));
                }
                crate::commands::write_stdout(out.as_bytes())?;
            }
        }
        SecretCommand::Rm { name } => {
            client.call(&DeleteSecret { name }).await?;
        }
    }
    Ok(0)
}
