//! `threadbox keys|quota|usage|audit`: governance commands.

use crate::commands::{print_json, table, write_stdout};
use crate::parse::parse_size;
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use threadbox_api::*;
use threadbox_client::Client;

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key; it is printed once and never again.
    Create {
        /// Tenant the key acts for.
        #[arg(long)]
        tenant: String,
        /// sandboxes:read, sandboxes:write, sandboxes:delete or admin (repeatable).
        #[arg(long = "scope", value_name = "SCOPE", required = true)]
        scopes: Vec<String>,
        /// Lifetime, e.g. 30d, 12h, 90m, 3600s.
        #[arg(long, value_name = "DURATION")]
        expires: Option<String>,
        /// Print {"id", "key", "tenant", "scopes"} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List keys (never the keys themselves).
    Ls {
        /// Only this tenant's keys.
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by its id.
    Revoke {
        /// Key id (from `keys ls`).
        key_id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Set limits of a tenant; flags not given keep their value, `none` removes a limit.
    Set(QuotaSetArgs),
    /// Show a tenant's limits and current use.
    Get {
        tenant: String,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct QuotaSetArgs {
    pub tenant: String,
    /// Sandboxes running at once.
    #[arg(long, value_name = "N|none")]
    pub max_running: Option<String>,
    /// Sandboxes in total.
    #[arg(long, value_name = "N|none")]
    pub max_sandboxes: Option<String>,
    /// Largest memory limit of one sandbox, e.g. 2G.
    #[arg(long, value_name = "SIZE|none")]
    pub max_memory: Option<String>,
    /// Largest CPU limit of one sandbox, cores.
    #[arg(long, value_name = "CPUS|none")]
    pub max_cpus: Option<String>,
    /// CPU-seconds per UTC day over the tenant's sandboxes; reaching it pauses them.
    #[arg(long, value_name = "N|none")]
    pub cpu_seconds_per_day: Option<String>,
    /// Disk bytes over the tenant's sandboxes, e.g. 10G.
    #[arg(long, value_name = "SIZE|none")]
    pub disk_bytes: Option<String>,
    /// Start from no limits instead of the current ones.
    #[arg(long)]
    pub clear: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Tenant (default: your key's tenant; every tenant for an admin).
    #[arg(long)]
    pub tenant: Option<String>,
    /// Count tenant totals from this time's UTC day: RFC 3339 or an age (7d, 24h).
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// List entries, oldest first.
    Ls {
        /// Only entries from this time on: RFC 3339 or an age (1h, 7d).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Print every entry as JSON Lines (one entry per line).
    Export {
        /// Only entries from this time on: RFC 3339 or an age (1h, 7d).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
    },
    /// Check the hash chain; exits 0 when it holds, 1 naming the first bad entry.
    Verify {
        #[arg(long)]
        json: bool,
    },
}

/// `30d`, `12h`, `90m`, `45s` or a number of seconds.
fn parse_duration_secs(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('d') => (&s[..s.len() - 1], 86_400),
        Some('h') => (&s[..s.len() - 1], 3600),
        Some('m') => (&s[..s.len() - 1], 60),
        Some('s') => (&s[..s.len() - 1], 1),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .with_context(|| format!("invalid duration {s:?}: expected e.g. 30d, 12h, 90m, 3600"))?;
    if n == 0 {
        bail!("invalid duration {s:?}: must be more than zero");
    }
    n.checked_mul(mult)
        .with_context(|| format!("duration {s:?} is too long"))
}

fn parse_scope(s: &str) -> anyhow::Result<Scope> {
    Scope::parse(s).with_context(|| {
        format!(
            "unknown scope {s:?}: expected sandboxes:read, sandboxes:write, sandboxes:delete or admin"
        )
    })
}

fn scopes_str(scopes: &[Scope]) -> String {
    scopes
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

pub async fn keys(client: &Client, cmd: KeysCommand) -> anyhow::Result<u8> {
    match cmd {
        KeysCommand::Create {
            tenant,
            scopes,
            expires,
            json,
        } => {
            let scopes = scopes
                .iter()
                .map(|s| parse_scope(s))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let expires_in_secs = expires.as_deref().map(parse_duration_secs).transpose()?;
            let key = client
                .create_key(&CreateKeyRequest {
                    tenant,
                    scopes,
                    expires_in_secs,
                })
                .await?;
            if json {
                print_json(&key)?;
            } else {
                write_stdout(format!("{}\n", key.key).as_bytes())?;
                eprintln!(
                    "key {} for tenant {} ({}); shown only once: store it now",
                    key.id,
                    key.tenant,
                    scopes_str(&key.scopes)
                );
            }
            Ok(0)
        }
        KeysCommand::Ls { tenant, json } => {
            let list = client.list_keys(tenant.as_deref()).await?;
            if json {
                print_json(&list)?;
            } else {
                let rows: Vec<Vec<String>> = list
                    .keys
                    .iter()
                    .map(|k| {
                        vec![
                            k.id.clone(),
                            k.tenant.clone(),
                            k.status.clone(),
                            k.expires_at.clone().unwrap_or_else(|| "-".into()),
                            scopes_str(&k.scopes),
                        ]
                    })
                    .collect();
                write_stdout(
                    table(&["ID", "TENANT", "STATUS", "EXPIRES", "SCOPES"], &rows).as_bytes(),
                )?;
            }
            Ok(0)
        }
        KeysCommand::Revoke { key_id } => {
            client.revoke_key(&key_id).await?;
            Ok(0)
        }
    }
}

/// `None` when the flag was not given; `Some(None)` for `none`/`unlimited`.
fn limit<T>(
    flag: &str,
    v: &Option<String>,
    parse: impl Fn(&str) -> anyhow::Result<T>,
) -> anyhow::Result<Option<Option<T>>> {
    match v.as_deref() {
        None => Ok(None),
        Some("none") | Some("unlimited") => Ok(Some(None)),
        Some(s) => Ok(Some(Some(
            parse(s).with_context(|| format!("invalid --{flag} {s:?}"))?,
        ))),
    }
}

fn parse_u64(s: &str) -> anyhow::Result<u64> {
    Ok(s.parse()?)
}

fn parse_cpus(s: &str) -> anyhow::Result<f64> {
    let v: f64 = s.parse()?;
    if !(v.is_finite() && v > 0.0) {
        bail!("must be a positive number");
    }
    Ok(v)
}

fn show(v: Option<impl ToString>) -> String {
    v.map(|v| v.to_string())
        .unwrap_or_else(|| "unlimited".into())
}

fn print_quota(q: &TenantQuota) -> anyhow::Result<()> {
    let u = &q.usage;
    let rows = vec![
        vec![
            "max_running".into(),
            show(q.quota.max_running),
            u.running.to_string(),
        ],
        vec![
            "max_sandboxes".into(),
            show(q.quota.max_sandboxes),
            u.sandboxes.to_string(),
        ],
        vec![
            "max_memory_bytes".into(),
            show(q.quota.max_memory_bytes),
            "-".into(),
        ],
        vec!["max_cpus".into(), show(q.quota.max_cpus), "-".into()],
        vec![
            "cpu_seconds_per_day".into(),
            show(q.quota.cpu_seconds_per_day),
            format!("{:.1}", u.cpu_seconds_today),
        ],
        vec![
            "disk_bytes".into(),
            show(q.quota.disk_bytes),
            u.disk_bytes.to_string(),
        ],
    ];
    write_stdout(format!("tenant {}\n", q.tenant).as_bytes())?;
    write_stdout(table(&["QUOTA", "LIMIT", "IN USE"], &rows).as_bytes())?;
    write_stdout(format!("disk in use: {}\n", disk_parts(&u.disk)).as_bytes())?;
    Ok(())
}

/// Where a tenant's disk is held (ADR 0165), as `threadbox quota get` and `usage` print it.
fn disk_parts(d: &threadbox_api::DiskUse) -> String {
    format!(
        "sandboxes {}, checkpoints {}, templates {}, layers {}",
        d.sandboxes, d.checkpoints, d.templates, d.layers
    )
}

pub async fn quota(client: &Client, cmd: QuotaCommand) -> anyhow::Result<u8> {
    match cmd {
        QuotaCommand::Get { tenant, json } => {
            let q = client.get_quota(&tenant).await?;
            if json {
                print_json(&q)?;
            } else {
                print_quota(&q)?;
            }
        }
        QuotaCommand::Set(a) => {
            // Parsed before anything is sent, so bad input changes nothing.
            let max_running = limit("max-running", &a.max_running, parse_u64)?;
            let max_sandboxes = limit("max-sandboxes", &a.max_sandboxes, parse_u64)?;
            let max_memory = limit("max-memory", &a.max_memory, parse_size)?;
            let max_cpus = limit("max-cpus", &a.max_cpus, parse_cpus)?;
            let cpu_day = limit("cpu-seconds-per-day", &a.cpu_seconds_per_day, parse_u64)?;
            let disk = limit("disk-bytes", &a.disk_bytes, parse_size)?;
            let mut q = if a.clear {
                Quota::default()
            } else {
                client.get_quota(&a.tenant).await?.quota
            };
            if let Some(v) = max_running {
                q.max_running = v;
            }
            if let Some(v) = max_sandboxes {
                q.max_sandboxes = v;
            }
            if let Some(v) = max_memory {
                q.max_memory_bytes = v;
            }
            if let Some(v) = max_cpus {
                q.max_cpus = v;
            }
            if let Some(v) = cpu_day {
                q.cpu_seconds_per_day = v;
            }
            if let Some(v) = disk {
                q.disk_bytes = v;
            }
            let q = client.set_quota(&a.tenant, &q).await?;
            if a.json {
                print_json(&q)?;
            } else {
                print_quota(&q)?;
            }
        }
    }
    Ok(0)
}

pub async fn usage(client: &Client, a: UsageArgs) -> anyhow::Result<u8> {
    let report = client
        .usage(a.tenant.as_deref(), a.since.as_deref())
        .await?;
    if a.json {
        print_json(&report)?;
        return Ok(0);
    }
    let mut rows = Vec::new();
    for t in &report.tenants {
        rows.push(vec![
            t.tenant.clone(),
            "(tenant)".into(),
            "-".into(),
            format!("{:.2}", t.cpu_seconds),
            format!("{:.2}", t.memory_gib_seconds),
            "-".into(),
            t.disk_bytes.to_string(),
            format!("{:.0}", t.running_seconds),
            format!("{:.0}", t.paused_seconds),
        ]);
        for s in &t.sandboxes {
            rows.push(vec![
                t.tenant.clone(),
                s.name.clone().unwrap_or_else(|| s.id.clone()),
                s.state.clone(),
                format!("{:.2}", s.cpu_seconds),
                format!("{:.2}", s.memory_gib_seconds),
                s.peak_memory_bytes.to_string(),
                s.disk_bytes.to_string(),
                format!("{:.0}", s.running_seconds),
                format!("{:.0}", s.paused_seconds),
            ]);
        }
    }
    write_stdout(
        table(
            &[
                "TENANT",
                "SANDBOX",
                "STATE",
                "CPU_S",
                "MEM_GIB_S",
                "PEAK_MEM",
                "DISK",
                "RUNNING_S",
                "PAUSED_S",
            ],
            &rows,
        )
        .as_bytes(),
    )?;
    for t in &report.tenants {
        write_stdout(format!("{} disk: {}\n", t.tenant, disk_parts(&t.disk)).as_bytes())?;
    }
    Ok(0)
}

/// Every entry from `since`, page by page.
async fn all_entries(client: &Client, since: Option<&str>) -> anyhow::Result<Vec<AuditEntry>> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = client.audit(after, since, Some(MAX_PAGE)).await?;
        let n = page.entries.len();
        if let Some(last) = page.entries.last() {
            after = last.seq;
        }
        out.extend(page.entries);
        if n < MAX_PAGE as usize {
            return Ok(out);
        }
    }
}

const MAX_PAGE: u32 = 10_000;

pub async fn audit(client: &Client, cmd: AuditCommand) -> anyhow::Result<u8> {
    match cmd {
        AuditCommand::Ls { since, json } => {
            let entries = all_entries(client, since.as_deref()).await?;
            if json {
                print_json(&AuditList { entries })?;
            } else {
                let rows: Vec<Vec<String>> = entries
                    .iter()
                    .map(|e| {
                        vec![
                            e.seq.to_string(),
                            e.time.clone(),
                            e.tenant.clone(),
                            e.key_id.clone().unwrap_or_else(|| "-".into()),
                            e.action.clone(),
                            e.target.clone(),
                            e.result.clone(),
                        ]
                    })
                    .collect();
                write_stdout(
                    table(
                        &["SEQ", "TIME", "TENANT", "KEY", "ACTION", "TARGET", "RESULT"],
                        &rows,
                    )
                    .as_bytes(),
                )?;
            }
            Ok(0)
        }
        AuditCommand::Export { since } => {
            let mut text = String::new();
            for e in all_entries(client, since.as_deref()).await? {
                text.push_str(&serde_json::to_string(&e)?);
                text.push('\n');
            }
            write_stdout(text.as_bytes())?;
            Ok(0)
        }
        AuditCommand::Verify { json } => {
            let v = client.audit_verify().await?;
            if json {
                print_json(&v)?;
            } else if v.ok {
                write_stdout(
                    format!("audit log OK: {} entries, chain intact\n", v.entries).as_bytes(),
                )?;
            } else {
                eprintln!(
                    "audit log BROKEN at entry {}: {}",
                    v.first_bad_seq
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| "?".into()),
                    v.reason.as_deref().unwrap_or("")
                );
            }
            Ok(if v.ok { 0 } else { 1 })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration_secs("30d").unwrap(), 30 * 86_400);
        assert_eq!(parse_duration_secs("90m").unwrap(), 5400);
        assert_eq!(parse_duration_secs("3600").unwrap(), 3600);
        assert!(parse_duration_secs("0s").is_err());
        assert!(parse_duration_secs("soon").is_err());
    }
}
