//! `threadbox template create|ls|rm` (issue 14 scope 5, ADR 0110).

use crate::commands::{print_json, write_stdout};
use crate::parse::parse_size;
use anyhow::{bail, Result};
use threadbox_api::templates::*;
use threadbox_api::LimitsRequest;
use threadbox_client::Client;

#[derive(Debug, clap::Subcommand)]
pub enum TemplateCommand {
    /// Make a template: `--from SB[:CHECKPOINT]`, or `--image REF --run CMD [--run CMD]...`
    /// (steps run in a temporary sandbox; one that fails leaves nothing behind).
    Create(CreateTemplateArgs),
    /// List the tenant's templates (size, source, sandboxes made from it, time).
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Delete a template; sandboxes made from it keep running on their own disks.
    Rm {
        /// Template name or id.
        template: String,
    },
}

#[derive(Debug, clap::Args)]
pub struct CreateTemplateArgs {
    /// Template name (a-z, 0-9, '-', '_', '.'), unique in the tenant.
    pub name: String,
    /// A sandbox (id or name), optionally `:CHECKPOINT` (label or id) — without one a
    /// fresh checkpoint is taken.
    #[arg(long, value_name = "SB[:CHECKPOINT]", conflicts_with_all = ["image", "run"])]
    pub from: Option<String>,
    /// Build on this image [default: host].
    #[arg(long)]
    pub image: Option<String>,
    /// A build step (shell command line, repeatable, run in order).
    #[arg(long = "run", value_name = "CMD")]
    pub run: Vec<String>,
    /// Egress for the build and the template's sandboxes: HOST[:PORTS], *.SUFFIX, CIDR or
    /// a preset (python-packages, npm, github, rust-crates). Repeatable.
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// Label K=V the template's sandboxes get (repeatable).
    #[arg(long = "label", value_name = "K=V")]
    pub labels: Vec<String>,
    /// Memory limit of the build and default of its sandboxes: 512M, 1G...
    #[arg(long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// Size of the disk: 1G, 512M... [default: the daemon's]
    #[arg(long, value_name = "SIZE")]
    pub disk: Option<String>,
    /// Seconds each build step may run [default: 600].
    #[arg(long, value_name = "SECS")]
    pub step_timeout: Option<f64>,
    /// Print the template (and the steps) as JSON.
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

pub async fn run(client: &Client, cmd: TemplateCommand) -> Result<u8> {
    match cmd {
        TemplateCommand::Create(a) => create(client, a).await,
        TemplateCommand::Ls { json } => {
            let list = client.call(&ListTemplates).await?;
            if json {
                print_json(&list)?;
                return Ok(0);
            }
            let mut out = format!(
                "{:<20} {:>8} {:<8} {:>9} {:<44} {}\n",
                "NAME", "SIZE", "METHOD", "SANDBOXES", "SOURCE", "CREATED"
            );
            for t in &list.templates {
                out.push_str(&format!(
                    "{:<20} {:>8} {:<8} {:>9} {:<44} {}\n",
                    t.name,
                    size(t.size_bytes),
                    t.method,
                    t.sandboxes,
                    t.source,
                    t.created_at
                ));
            }
            write_stdout(out.as_bytes())?;
            Ok(0)
        }
        TemplateCommand::Rm { template } => {
            client.call(&DeleteTemplate { template }).await?;
            Ok(0)
        }
    }
}

async fn create(client: &Client, a: CreateTemplateArgs) -> Result<u8> {
    let (from, checkpoint) = match a.from.as_deref() {
        Some(f) => match f.split_once(':') {
            Some((sb, ck)) if !sb.is_empty() && !ck.is_empty() => {
                (Some(sb.to_string()), Some(ck.to_string()))
            }
            Some(_) => bail!("--from takes SB or SB:CHECKPOINT"),
            None => (Some(f.to_string()), None),
        },
        None => (None, None),
    };
    let request = CreateTemplateRequest {
        name: a.name,
        from,
        checkpoint,
        image: a.image,
        run: a.run,
        network: if a.allow.is_empty() {
            None
        } else {
            Some(crate::net_cmd::policy_from_allow(&a.allow)?)
        },
        limits: LimitsRequest {
            memory_bytes: a.memory.as_deref().map(parse_size).transpose()?,
            disk_bytes: a.disk.as_deref().map(parse_size).transpose()?,
            ..Default::default()
        },
        labels: crate::parse::parse_pairs("--label", &a.labels)?,
        step_timeout_secs: a.step_timeout,
    };
    let out = client.call(&CreateTemplate { request }).await?;
    if a.json {
        print_json(&out)?;
        return Ok(0);
    }
    // Each step's output, then the template's name: a script reads the last line.
    let mut s = String::new();
    for (i, st) in out.steps.iter().enumerate() {
        s.push_str(&format!("--- step {}: {}\n", i + 1, st.run));
        s.push_str(&st.stdout);
        s.push_str(&st.stderr);
    }
    s.push_str(&format!("{}\n", out.template.name));
    write_stdout(s.as_bytes())?;
    Ok(0)
}
