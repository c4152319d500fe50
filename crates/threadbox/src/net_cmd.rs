//! Egress helpers of the binary (issue 13): the `serve --egress-hosts` file.

use anyhow::{bail, Context, Result};
use std::net::Ipv4Addr;
use std::path::Path;

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
