//! The host's own addresses, for the egress floor (issue 13, ADR 0064): every address on
//! every interface of the daemon's network namespace. Read from procfs (no netlink dump,
//! no `unsafe`): IPv4 from the `/32 host LOCAL` leaves of `/proc/net/fib_trie` (the local
//! routing table holds exactly the interface addresses), IPv6 from `/proc/net/if_inet6`.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

/// Every address of the host's interfaces. An unreadable file is an error (the caller keeps
/// what it had); a line it cannot parse is skipped.
pub fn host_addresses() -> io::Result<HashSet<IpAddr>> {
    host_addresses_in(Path::new("/proc/net"))
}

/// [`host_addresses`] over another procfs `net` directory (tests).
pub fn host_addresses_in(proc_net: &Path) -> io::Result<HashSet<IpAddr>> {
    let mut out: HashSet<IpAddr> =
        parse_fib_trie(&std::fs::read_to_string(proc_net.join("fib_trie"))?)
            .into_iter()
            .map(IpAddr::V4)
            .collect();
    // A host without IPv6 has no if_inet6.
    match std::fs::read_to_string(proc_net.join("if_inet6")) {
        Ok(text) => out.extend(parse_if_inet6(&text).into_iter().map(IpAddr::V6)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    Ok(out)
}

/// The leaves of `fib_trie` followed by a `/32 host LOCAL` line.
pub fn parse_fib_trie(text: &str) -> Vec<Ipv4Addr> {
    let mut out = Vec::new();
    let mut leaf: Option<Ipv4Addr> = None;
    for line in text.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("|--") {
            leaf = rest.trim().parse().ok();
        } else if t.starts_with("+--") || t.ends_with(':') {
            leaf = None;
        } else if t.starts_with("/32 host LOCAL") {
            if let Some(ip) = leaf {
                if !out.contains(&ip) {
                    out.push(ip);
                }
            }
        }
    }
    out
}

/// The first column of `if_inet6`: 32 hex digits per address.
pub fn parse_if_inet6(text: &str) -> Vec<Ipv6Addr> {
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|hex| {
            u128::from_str_radix(hex, 16)
                .ok()
                .filter(|_| hex.len() == 32)
        })
        .map(Ipv6Addr::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIB: &str = "Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 0.0.0.0
        /0 universe UNICAST
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     +-- 192.0.2.0/24 2 0 2
           |-- 192.0.2.0
              /24 link UNICAST
           |-- 192.0.2.2
              /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
           |-- 203.0.113.9
              /32 host LOCAL
           |-- 192.0.2.2
              /32 host LOCAL
";

    #[test]
    fn fib_trie_local_leaves_are_the_addresses() {
        let got = parse_fib_trie(FIB);
        assert_eq!(
            got,
            vec![
                Ipv4Addr::new(127, 0, 0, 1),
                Ipv4Addr::new(192, 0, 2, 2),
                Ipv4Addr::new(203, 0, 113, 9)
            ],
            "the /8 route, broadcasts and unicast routes are not addresses"
        );
    }

    #[test]
    fn if_inet6_first_column() {
        let text = "fe8000000000000000fc00fffe000001 04 40 20 80     eth0\n\
                    00000000000000000000000000000001 01 80 10 80       lo\n\
                    zz 01 80 10 80 bad\n";
        assert_eq!(
            parse_if_inet6(text),
            vec![
                "fe80::fc:ff:fe00:1".parse::<Ipv6Addr>().unwrap(),
                Ipv6Addr::LOCALHOST
            ]
        );
    }

    #[test]
    fn this_hosts_addresses_include_loopback() {
        let got = host_addresses().expect("procfs");
        assert!(got.contains(&IpAddr::V4(Ipv4Addr::LOCALHOST)), "{got:?}");
    }
}
