//! Parsing of the CLI's small value syntaxes.

use anyhow::{bail, Context};
use std::collections::BTreeMap;
use threadbox_api::User;

/// Parses a size: `1048576`, `512M`, `1.5G`, `64MiB`, `10k`. Suffixes are binary
/// (K = 1024); `B`, `iB` and case are optional.
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let bad = || {
        anyhow::anyhow!(
            "invalid size {s:?}: expected a number of bytes with an optional K, M, G or T \
             suffix (e.g. 512M, 1.5G, 64MiB)"
        )
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(bad());
    }
    let unit = unit.trim().to_ascii_lowercase();
    let unit = unit
        .strip_suffix("ib")
        .or_else(|| unit.strip_suffix('b'))
        .unwrap_or(&unit);
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        _ => return Err(bad()),
    };
    let bytes = if num.contains('.') {
        let v: f64 = num.parse().map_err(|_| bad())?;
        let b = v * mult as f64;
        if !b.is_finite() || b >= u64::MAX as f64 {
            return Err(bad());
        }
        b.round() as u64
    } else {
        let v: u64 = num.parse().map_err(|_| bad())?;
        v.checked_mul(mult).ok_or_else(bad)?
    };
    if bytes == 0 {
        bail!("invalid size {s:?}: must be greater than zero");
    }
    Ok(bytes)
}

/// Parses repeated `K=V` flags into a map.
pub fn parse_pairs(flag: &str, pairs: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut map = BTreeMap::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .with_context(|| format!("invalid {flag} {p:?}: expected K=V"))?;
        if k.is_empty() {
            bail!("invalid {flag} {p:?}: the key is empty");
        }
        map.insert(k.to_string(), v.to_string());
    }
    Ok(map)
}

pub fn parse_user(user: Option<&str>) -> anyhow::Result<User> {
    match user {
        None => Ok(User::Default),
        Some(u) => User::parse(u)
            .with_context(|| format!("invalid user {u:?}: expected `user`, `root` or `default`")),
    }
}

/// Parses a signal number or name (`9`, `KILL`, `SIGTERM`).
pub fn parse_signal(s: &str) -> anyhow::Result<i32> {
    if let Ok(n) = s.parse::<i32>() {
        if (1..=64).contains(&n) {
            return Ok(n);
        }
        bail!("invalid signal {s:?}: expected 1 to 64");
    }
    let name = s.to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    Ok(match name {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "KILL" => 9,
        "USR1" => 10,
        "USR2" => 12,
        "TERM" => 15,
        "CONT" => 18,
        "STOP" => 19,
        _ => bail!("invalid signal {s:?}: expected a number or HUP, INT, QUIT, KILL, USR1, USR2, TERM, CONT, STOP"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1048576").unwrap(), 1 << 20);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("64mb").unwrap(), 64 << 20);
        assert_eq!(parse_size("10k").unwrap(), 10 << 10);
        for bad in [
            "",
            "M",
            "12X",
            "-1",
            "1..5G",
            "0",
            "99999999999999999999T",
            "1 2",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        let msg = parse_size("lots").unwrap_err().to_string();
        assert!(msg.contains("512M"), "{msg}");
    }

    #[test]
    fn pairs_and_signals() {
        let m = parse_pairs("--label", &["a=b".into(), "c=d=e".into()]).unwrap();
        assert_eq!(m["c"], "d=e");
        assert!(parse_pairs("--label", &["nokey".into()]).is_err());
        assert!(parse_pairs("--label", &["=v".into()]).is_err());
        assert_eq!(parse_signal("SIGTERM").unwrap(), 15);
        assert_eq!(parse_signal("kill").unwrap(), 9);
        assert_eq!(parse_signal("2").unwrap(), 2);
        assert!(parse_signal("0").is_err());
        assert!(parse_signal("BOGUS").is_err());
    }
}
