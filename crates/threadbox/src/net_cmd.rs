//! Egress helpers of the binary (issue 13): the `serve --egress-hosts` file.

use anyhow::{bail, Context, Result};
use std::net::Ipv4Addr;
use std::path::Path;
use threadbox_api::network::{
    GetNetwork, NetAction, NetworkInfo, NetworkPolicySpec, NetworkRuleSpec, SetNetwork,
};
use threadbox_client::Client;

/// Reads a hosts(5)-style file: `IP NAME...` per line, `#` comments. IPv4 only (the sandbox
/// resolves A records only); a bad line is refused with its number, nothing is half-read.
pub fn read_hosts(path: &Path) -> Result<Vec<(String, Vec<Ipv4Addr>)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--egress-hosts {}", path.display()))?;
    let mut by_name: Vec<(String, Vec<Ipv4Addr>)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let ip = words.next().unwrap_or("");
        let Ok(ip) = ip.parse::<Ipv4Addr>() else {
            bail!(
                "--egress-hosts {} line {}: {ip:?} is not an IPv4 address",
                path.display(),
                n + 1
            );
        };
        let mut any = false;
        for name in words {
            any = true;
            let name = name.to_ascii_lowercase();
            match by_name.iter_mut().find(|(n, _)| *n == name) {
                Some((_, ips)) => ips.push(ip),
                None => by_name.push((name, vec![ip])),
            }
        }
        if !any {
            bail!(
                "--egress-hosts {} line {}: no name after {ip}",
                path.display(),
                n + 1
            );
        }
    }
    Ok(by_name)
}

/// `threadbox net`: a sandbox's egress policy.
#[derive(Debug, clap::Subcommand)]
pub enum NetCommand {
    /// Show a sandbox's egress policy and its generation.
    Get {
        /// Sandbox id or name.
        sandbox: String,
        /// Print {"generation", "policy"} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Replace a sandbox's egress policy at once; open connections it refuses are closed.
    Set {
        /// Sandbox id or name.
        sandbox: String,
        /// What to allow: HOST[:PORTS], *.SUFFIX[:PORTS], CIDR[:PORTS] or a preset name
        /// (python-packages, npm, github, rust-crates); PORTS is 443, 8000-8100 or a
        /// comma list. Repeatable; with none, everything is denied.
        #[arg(long = "allow", value_name = "RULE")]
        allow: Vec<String>,
        /// Change only if the policy is still this generation (else exit 1, nothing changes).
        #[arg(long, value_name = "N")]
        if_match: Option<u64>,
        /// Print {"generation", "policy"} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a sandbox's egress log: one row per connection (when it closed) and per DNS
    /// answer, oldest first.
    Log {
        /// Sandbox id or name.
        sandbox: String,
        /// Keep waiting for new rows (Ctrl-C to stop).
        #[arg(long, short = 'f')]
        follow: bool,
        /// Only rows after this sequence number.
        #[arg(long, value_name = "SEQ")]
        after: Option<u64>,
        /// Rows per request (at most 1000).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        /// One JSON object per row (NDJSON).
        #[arg(long)]
        json: bool,
    },
}

/// Turns `--allow` values into a policy (deny by default). A word with no dot, colon or
/// slash is a preset (`python-packages`); the daemon refuses unknown ones by name.
pub fn policy_from_allow(allow: &[String]) -> Result<NetworkPolicySpec> {
    let mut spec = NetworkPolicySpec::default();
    for a in allow {
        let a = a.trim();
        if a.is_empty() {
            bail!("--allow: empty rule");
        }
        if !a.contains(['.', ':', '/']) {
            spec.presets.push(a.to_string());
            continue;
        }
        // IPv6 has colons of its own: `[ADDR/LEN]:PORTS`, or a bare IPv6 CIDR without ports.
        let (target, ports) = if let Some(rest) = a.strip_prefix('[') {
            let (t, after) = rest
                .split_once(']')
                .with_context(|| format!("--allow {a}: no closing ]"))?;
            match after.strip_prefix(':') {
                Some(p) => (t, Some(p)),
                None if after.is_empty() => (t, None),
                None => bail!("--allow {a}: expected :PORTS after ]"),
            }
        } else if a.matches(':').count() > 1 {
            (a, None)
        } else {
            match a.split_once(':') {
                Some((t, p)) => (t, Some(p)),
                None => (a, None),
            }
        };
        let ports = match ports {
            Some(p) => {
                let list: Vec<String> = p.split(',').map(|s| s.trim().to_string()).collect();
                if list.iter().any(String::is_empty) {
                    bail!("--allow {a}: empty port in {p:?}");
                }
                Some(list)
            }
            None => None,
        };
        let is_cidr = target.contains('/') || target.parse::<std::net::IpAddr>().is_ok();
        spec.rules.push(NetworkRuleSpec {
            action: NetAction::Allow,
            host: (!is_cidr).then(|| target.to_string()),
            cidr: is_cidr.then(|| target.to_string()),
            ports,
            protocol: None,
        });
    }
    Ok(spec)
}

fn print_info(info: &NetworkInfo, json: bool) -> Result<()> {
    if json {
        return crate::commands::print_json(info);
    }
    let mut out = format!("generation {}\n", info.generation);
    match &info.policy {
        None => out.push_str("no policy: the sandbox reaches nothing outside itself\n"),
        Some(p) => {
            for r in &p.rules {
                let what = r.host.as_deref().or(r.cidr.as_deref()).unwrap_or("?");
                let action = match r.action {
                    NetAction::Allow => "allow",
                    NetAction::Deny => "deny",
                };
                let ports = r
                    .ports
                    .as_ref()
                    .map(|p| format!(":{}", p.join(",")))
                    .unwrap_or_default();
                out.push_str(&format!("{action} {what}{ports}\n"));
            }
            for preset in &p.presets {
                out.push_str(&format!("allow preset {preset}\n"));
            }
            let default = match p.default {
                NetAction::Allow => "allow",
                NetAction::Deny => "deny",
            };
            out.push_str(&format!("default {default}\n"));
        }
    }
    crate::commands::write_stdout(out.as_bytes())?;
    Ok(())
}

pub async fn net(client: &Client, cmd: NetCommand) -> Result<u8> {
    match cmd {
        NetCommand::Get { sandbox, json } => {
            let info = client.call(&GetNetwork { sandbox }).await?;
            print_info(&info, json)?;
        }
        NetCommand::Set {
            sandbox,
            allow,
            if_match,
            json,
        } => {
            let policy = policy_from_allow(&allow)?;
            let info = client
                .call(&SetNetwork {
                    sandbox,
                    policy,
                    if_match,
                })
                .await?;
            print_info(&info, json)?;
        }
        NetCommand::Log {
            sandbox,
            follow,
            after,
            limit,
            json,
        } => return crate::net_log_cmd::log(client, sandbox, after, limit, follow, json).await,
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_values_become_rules_and_presets() {
        let spec = policy_from_allow(&[
            "api.test:8080".into(),
            "*.example.com".into(),
            "10.0.0.0/8:5432,6000-6010".into(),
            "python-packages".into(),
            "[2001:db8::/32]:443".into(),
            "203.0.113.7".into(),
        ])
        .unwrap();
        assert_eq!(spec.presets, vec!["python-packages".to_string()]);
        assert_eq!(spec.default, NetAction::Deny);
        let r = &spec.rules;
        assert_eq!(r[0].host.as_deref(), Some("api.test"));
        assert_eq!(r[0].ports, Some(vec!["8080".to_string()]));
        assert_eq!(r[1].host.as_deref(), Some("*.example.com"));
        assert_eq!(r[1].ports, None);
        assert_eq!(r[2].cidr.as_deref(), Some("10.0.0.0/8"));
        assert_eq!(
            r[2].ports,
            Some(vec!["5432".to_string(), "6000-6010".to_string()])
        );
        assert_eq!(r[3].cidr.as_deref(), Some("2001:db8::/32"));
        assert_eq!(r[4].cidr.as_deref(), Some("203.0.113.7"));
        assert!(policy_from_allow(&["a.test:".into()]).is_err());
        assert!(policy_from_allow(&["".into()]).is_err());
    }
}
