//! `threadbox checkpoint`, `checkpoints`, `rewind`, `fork` (issue 14, ADR 0100).

use crate::commands::{print_json, write_stdout};
use anyhow::{bail, Result};
use threadbox_api::checkpoints::*;
use threadbox_client::Client;

/// `threadbox checkpoint SB [--label L]` or `threadbox checkpoint rm SB CHECKPOINT`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CheckpointArgs {
    #[command(subcommand)]
    pub cmd: Option<CheckpointSub>,
    /// Sandbox id or name.
    pub sandbox: Option<String>,
    /// A label to rewind to later (unique per sandbox).
    #[arg(long)]
    pub label: Option<String>,
    /// Keep the memory and running processes too (a tier with `checkpoint_memory`:
    /// gvisor): a rewind to it brings them back. Refused on the jail.
    #[arg(long)]
    pub with_memory: bool,
    /// Print the checkpoint as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Subcommand)]
pub enum CheckpointSub {
    /// Delete a checkpoint (by label or id).
    Rm {
        /// Sandbox id or name.
        sandbox: String,
        /// Checkpoint label or id.
        checkpoint: String,
    },
}

#[derive(Debug, clap::Args)]
pub struct CheckpointsArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct RewindArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// The checkpoint's label or id.
    #[arg(long)]
    pub to: String,
    /// Also delete the checkpoints taken after it.
    #[arg(long)]
    pub drop_later: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ForkArgs {
    /// Sandbox id or name.
    pub sandbox: String,
    /// How many forks.
    #[arg(long, default_value_t = 1)]
    pub count: u32,
    /// Name the forks PREFIX-1 … PREFIX-N.
    #[arg(long)]
    pub name_prefix: Option<String>,
    /// Fork memory and running processes too (a tier with `fork_memory`: gvisor; the
    /// default there when the sandbox runs). Refused on the jail, which forks disks only.
    #[arg(long, conflicts_with = "disk_only")]
    pub with_memory: bool,
    /// Fork the disk only: the forks' processes start afresh.
    #[arg(long)]
    pub disk_only: bool,
    #[arg(long)]
    pub json: bool,
}

fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1}G", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1}M", b as f64 / (1u64 << 20) as f64),
        b => format!("{:.1}K", b as f64 / 1024.0),
    }
}

pub async fn checkpoint(client: &Client, a: CheckpointArgs) -> Result<u8> {
    match (a.cmd, a.sandbox) {
        (
            Some(CheckpointSub::Rm {
                sandbox,
                checkpoint,
            }),
            _,
        ) => {
            client
                .call(&DeleteCheckpoint {
                    sandbox,
                    checkpoint,
                })
                .await?;
        }
        (None, Some(sandbox)) => {
            let c = client
                .call(&CreateCheckpoint {
                    sandbox,
                    request: CreateCheckpointRequest {
                        label: a.label,
                        with_memory: a.with_memory,
                    },
                })
                .await?;
            if a.json {
                print_json(&c)?;
            } else {
                write_stdout(format!("{}\n", c.id).as_bytes())?;
            }
        }
        (None, None) => bail!("name the sandbox: threadbox checkpoint SB [--label L]"),
    }
    Ok(0)
}

pub async fn checkpoints(client: &Client, a: CheckpointsArgs) -> Result<u8> {
    let list = client.call(&ListCheckpoints { sandbox: a.sandbox }).await?;
    if a.json {
        print_json(&list)?;
        return Ok(0);
    }
    let mut out = format!(
        "{:<36} {:<20} {:>8} {:<8} {:<36} {:<24} {}\n",
        "ID", "LABEL", "SIZE", "METHOD", "PARENT", "CREATED", "MEMORY"
    );
    for c in &list.checkpoints {
        out.push_str(&format!(
            "{:<36} {:<20} {:>8} {:<8} {:<36} {:<24} {}\n",
            c.id,
            c.label.as_deref().unwrap_or("-"),
            size(c.size_bytes),
            c.method,
            c.parent.as_deref().unwrap_or("-"),
            c.created_at,
            c.memory_bytes.map_or_else(|| "-".to_string(), size)
        ));
    }
    write_stdout(out.as_bytes())?;
    Ok(0)
}

pub async fn rewind(client: &Client, a: RewindArgs) -> Result<u8> {
    let sb = client
        .call(&Rewind {
            sandbox: a.sandbox,
            request: RewindRequest {
                to: a.to,
                drop_later: a.drop_later,
            },
        })
        .await?;
    if a.json {
        print_json(&sb)?;
    } else {
        write_stdout(format!("{} {}\n", sb.id, sb.state.as_str()).as_bytes())?;
    }
    Ok(0)
}

pub async fn fork(client: &Client, a: ForkArgs) -> Result<u8> {
    let out = client
        .call(&Fork {
            sandbox: a.sandbox,
            request: ForkRequest {
                count: Some(a.count),
                name_prefix: a.name_prefix,
                with_memory: match (a.with_memory, a.disk_only) {
                    (true, _) => Some(true),
                    (_, true) => Some(false),
                    _ => None,
                },
                ..Default::default()
            },
        })
        .await?;
    if a.json {
        print_json(&out)?;
    } else {
        let mut s = String::new();
        for sb in &out.sandboxes {
            s.push_str(&format!("{}\n", sb.id));
        }

        write_stdout(s.as_bytes())?;
    }
    Ok(0)
}
