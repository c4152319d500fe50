//! The checked network policy: rules by host name, CIDR and ports, first match wins, and the
//! operator floor that no tenant rule can widen (research/network.md §8.3).
//!
//! (Over 600 lines: roughly half is the unit tests of the matcher and the floor, which belong
//! next to the tables they prove.)

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use threadbox_api::network::{NetAction, NetProtocol, NetworkPolicySpec, NetworkRuleSpec};

/// Why a policy was refused. Each reads as a sentence the API can return as is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("rule {0}: set exactly one of `host` and `cidr`")]
    HostOrCidr(usize),
    #[error("rule {index}: `{host}` is not a host name ({why})")]
    BadHost {
        index: usize,
        host: String,
        why: &'static str,
    },
    #[error("rule {index}: `{host}` is an IP address; use `cidr` for addresses")]
    HostIsAddress { index: usize, host: String },
    #[error("rule {index}: `{cidr}` is not a CIDR block or address")]
    BadCidr { index: usize, cidr: String },
    #[error(
        "rule {index}: `{cidr}` has bits set below its prefix length; did you mean `{fixed}`?"
    )]
    CidrHostBits {
        index: usize,
        cidr: String,
        fixed: String,
    },
    #[error("rule {index}: `{port}` is not a port, a range `lo-hi` of ports 1-65535, or `any`")]
    BadPort { index: usize, port: String },
    #[error("rule {0}: `ports` is empty; leave it out for the defaults or say `any`")]
    EmptyPorts(usize),
    #[error("unknown preset `{0}` (known: {known})", known = PRESETS.iter().map(|p| p.name).collect::<Vec<_>>().join(", "))]
    UnknownPreset(String),
    #[error("a policy has at most {MAX_RULES} rules (presets included)")]
    TooManyRules,
}

/// Enough for any hand-written policy; bounds the per-connection matching cost.
pub const MAX_RULES: usize = 512;

/// A host pattern, normalised: lower case, no trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This name only.
    Exact(String),
    /// Strict subdomains of this name (`*.a.test` matches `x.a.test`, not `a.test`).
    Suffix(String),
}

impl HostPattern {
    pub fn matches(&self, name: &str) -> bool {
        match self {
            HostPattern::Exact(n) => n == name,
            HostPattern::Suffix(s) => {
                name.len() > s.len() + 1
                    && name.ends_with(s.as_str())
                    && name.as_bytes()[name.len() - s.len() - 1] == b'.'
            }
        }
    }
}

/// Lower-cases a name and strips one trailing dot; refuses what cannot be a DNS host name.
/// Underscores are accepted (they occur in real names, e.g. `_acme`); everything else must be
/// letters, digits, `-` and dots, with labels of 1-63 bytes and at most 253 bytes in all.
pub fn normalize_name(raw: &str) -> Result<String, &'static str> {
    let name = raw.strip_suffix('.').unwrap_or(raw).to_ascii_lowercase();
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > 253 {
        return Err("longer than 253 bytes");
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err("empty label");
        }
        if label.len() > 63 {
            return Err("label longer than 63 bytes");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, `-`, `_` and dots are allowed");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with `-`");
        }
    }
    Ok(name)
}

/// A set of ports as inclusive ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSet(Vec<(u16, u16)>);

impl PortSet {
    pub fn any() -> Self {
        PortSet(vec![(1, u16::MAX)])
    }
    pub fn web() -> Self {
        PortSet(vec![(80, 80), (443, 443)])
    }
    pub fn contains(&self, port: u16) -> bool {
        self.0.iter().any(|&(lo, hi)| lo <= port && port <= hi)
    }
    fn parse(index: usize, items: &[String]) -> Result<Self, PolicyError> {
        if items.is_empty() {
            return Err(PolicyError::EmptyPorts(index));
        }
        let bad = |p: &str| PolicyError::BadPort {
            index,
            port: p.to_string(),
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let item_t = item.trim();
            if item_t.eq_ignore_ascii_case("any") || item_t == "*" {
                return Ok(PortSet::any());
            }
            let (lo, hi) = match item_t.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (item_t, item_t),
            };
            let lo: u16 = lo.parse().map_err(|_| bad(item))?;
            let hi: u16 = hi.parse().map_err(|_| bad(item))?;
            if lo == 0 || lo > hi {
                return Err(bad(item));
            }
            out.push((lo, hi));
        }
        Ok(PortSet(out))
    }
    fn edges(&self, into: &mut Vec<u32>) {
        for &(lo, hi) in &self.0 {
            into.push(u32::from(lo));
            into.push(u32::from(hi) + 1);
        }
    }
}

/// What a rule matches besides the port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    Host(HostPattern),
    Cidr(IpNet),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub action: NetAction,
    pub matcher: Matcher,
    pub ports: PortSet,
    pub protocol: Option<NetProtocol>,
}

/// The outcome of looking a destination up in the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleMatch {
    pub action: NetAction,
    /// Index of the deciding rule; `None` when the default decided.
    pub rule: Option<usize>,
}

/// A checked policy. Built only by [`NetworkPolicy::from_spec`] (or [`NetworkPolicy::deny_all`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPolicy {
    pub rules: Vec<Rule>,
    pub default: NetAction,
    pub generation: u64,
}

impl NetworkPolicy {
    pub fn deny_all(generation: u64) -> Self {
        NetworkPolicy {
            rules: Vec::new(),
            default: NetAction::Deny,
            generation,
        }
    }

    /// Checks a spec; explicit rules first, then each preset's rules in the order named.
    pub fn from_spec(spec: &NetworkPolicySpec, generation: u64) -> Result<Self, PolicyError> {
        let mut rules = Vec::new();
        for (index, r) in spec.rules.iter().enumerate() {
            rules.push(check_rule(index, r)?);
        }
        for name in &spec.presets {
            let preset = preset(name).ok_or_else(|| PolicyError::UnknownPreset(name.clone()))?;
            for host in preset.hosts {
                let index = rules.len();
                rules.push(check_rule(
                    index,
                    &NetworkRuleSpec {
                        action: NetAction::Allow,
                        host: Some((*host).to_string()),
                        cidr: None,
                        ports: None,
                        protocol: None,
                    },
                )?);
            }
        }
        if rules.len() > MAX_RULES {
            return Err(PolicyError::TooManyRules);
        }
        Ok(NetworkPolicy {
            rules,
            default: spec.default,
            generation,
        })
    }

    /// First host rule matching `name` on `port` (name already normalised), else the default.
    /// CIDR rules are not consulted: a name and an address are decided separately (§8.5).
    pub fn match_name(&self, name: &str, port: u16) -> RuleMatch {
        self.first(port, |m| matches!(m, Matcher::Host(h) if h.matches(name)))
    }

    /// First CIDR rule matching `ip` on `port`, else the default.
    pub fn match_ip(&self, ip: IpAddr, port: u16) -> RuleMatch {
        let ip = canonical(ip);
        self.first(port, |m| matches!(m, Matcher::Cidr(n) if n.contains(&ip)))
    }

    /// Whether a CIDR rule (not the default) allows `ip` on `port`.
    pub fn cidr_allows(&self, ip: IpAddr, port: u16) -> Option<RuleMatch> {
        let m = self.match_ip(ip, port);
        (m.rule.is_some() && m.action == NetAction::Allow).then_some(m)
    }

    fn first(&self, port: u16, pred: impl Fn(&Matcher) -> bool) -> RuleMatch {
        self.rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.ports.contains(port) && pred(&r.matcher))
            .map(|(i, r)| RuleMatch {
                action: r.action,
                rule: Some(i),
            })
            .unwrap_or(RuleMatch {
                action: self.default,
                rule: None,
            })
    }

    /// Whether DNS should resolve `name`: some port exists on which [`Self::match_name`] allows
    /// it. Checked exactly by trying one port per segment between the rules' port edges.
    pub fn name_resolvable(&self, name: &str) -> Option<RuleMatch> {
        let mut edges = vec![1u32, 65536];
        for r in &self.rules {
            if matches!(&r.matcher, Matcher::Host(h) if h.matches(name)) {
                r.ports.edges(&mut edges);
            }
        }
        edges.sort_unstable();
        edges.dedup();
        edges
            .iter()
            .filter(|&&e| (1..=65535).contains(&e))
            .filter_map(|&e| u16::try_from(e).ok())
            .map(|p| self.match_name(name, p))
            .find(|m| m.action == NetAction::Allow)
    }

    /// How to learn the name of a connection to `port`: 443 → TLS, 80 → HTTP, else the hint of
    /// the first rule that covers the port and has one, else none (no peek: server-first
    /// protocols such as SSH would stall).
    pub fn peek_for_port(&self, port: u16) -> NetProtocol {
        match port {
            443 => NetProtocol::Tls,
            80 => NetProtocol::Http,
            _ => self
                .rules
                .iter()
                .filter(|r| r.ports.contains(port))
                .find_map(|r| r.protocol)
                .unwrap_or(NetProtocol::Tcp),
        }
    }
}

fn check_rule(index: usize, r: &NetworkRuleSpec) -> Result<Rule, PolicyError> {
    let (matcher, default_ports) = match (&r.host, &r.cidr) {
        (Some(host), None) => (Matcher::Host(check_host(index, host)?), PortSet::web()),
        (None, Some(cidr)) => (Matcher::Cidr(check_cidr(index, cidr)?), PortSet::any()),
        _ => return Err(PolicyError::HostOrCidr(index)),
    };
    let ports = match &r.ports {
        Some(p) => PortSet::parse(index, p)?,
        None => default_ports,
    };
    Ok(Rule {
        action: r.action,
        matcher,
        ports,
        protocol: r.protocol,
    })
}

fn check_host(index: usize, host: &str) -> Result<HostPattern, PolicyError> {
    let bad = |why| PolicyError::BadHost {
        index,
        host: host.to_string(),
        why,
    };
    let trimmed = host.trim();
    if trimmed
        .trim_matches(|c| c == '[' || c == ']')
        .parse::<IpAddr>()
        .is_ok()
    {
        return Err(PolicyError::HostIsAddress {
            index,
            host: host.to_string(),
        });
    }
    if let Some(rest) = trimmed.strip_prefix("*.") {
        let n = normalize_name(rest).map_err(bad)?;
        return Ok(HostPattern::Suffix(n));
    }
    if trimmed.contains('*') {
        return Err(bad("`*` is allowed only as a leading `*.`"));
    }
    Ok(HostPattern::Exact(normalize_name(trimmed).map_err(bad)?))
}

fn check_cidr(index: usize, cidr: &str) -> Result<IpNet, PolicyError> {
    let t = cidr.trim();
    let net = match t.parse::<IpNet>() {
        Ok(n) => n,
        Err(_) => match t.parse::<IpAddr>() {
            Ok(ip) => IpNet::from(ip),
            Err(_) => {
                return Err(PolicyError::BadCidr {
                    index,
                    cidr: cidr.to_string(),
                })
            }
        },
    };
    if net.trunc() != net {
        return Err(PolicyError::CidrHostBits {
            index,
            cidr: cidr.to_string(),
            fixed: net.trunc().to_string(),
        });
    }
    Ok(canonical_net(net))
}

/// A named bundle of allow rules (hosts on 80/443).
pub struct Preset {
    pub name: &'static str,
    pub hosts: &'static [&'static str],
}

/// Named presets for the common cases. Hosts only: their addresses change.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "python-packages",
        hosts: &["pypi.org", "files.pythonhosted.org", "pypi.python.org"],
    },
    Preset {
        name: "npm",
        hosts: &["registry.npmjs.org", "registry.yarnpkg.com"],
    },
    Preset {
        name: "github",
        hosts: &[
            "github.com",
            "api.github.com",
            "codeload.github.com",
            "objects.githubusercontent.com",
            "raw.githubusercontent.com",
            "release-assets.githubusercontent.com",
        ],
    },
    Preset {
        name: "rust-crates",
        hosts: &["crates.io", "index.crates.io", "static.crates.io"],
    },
];

pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// IPv4-mapped (`::ffff:a.b.c.d`) addresses become the IPv4 address they carry, so no rule or
/// floor check can be dodged by spelling an address the other way.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(n) if n.prefix_len() >= 96 => match n.network().to_ipv4_mapped() {
            Some(v4) => Ipv4Net::new(v4, n.prefix_len() - 96)
                .map(IpNet::V4)
                .unwrap_or(net),
            None => net,
        },
        other => other,
    }
}

/// Why the floor refused an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FloorHit {
    Unspecified,
    Loopback,
    Private,
    SharedCgnat,
    LinkLocal,
    Multicast,
    Broadcast,
    Reserved,
    Documentation,
    /// An address on one of the host's own interfaces.
    HostAddress,
    /// One of the daemon's own listen ports, on any address the floor would otherwise let
    /// through by exception.
    DaemonPort,
}

/// The operator floor: address ranges no tenant rule can open (research/network.md §8.3).
#[derive(Debug, Clone, Default)]
pub struct Floor {
    /// Operator exceptions (`serve --egress-allow-private CIDR`).
    pub allow_private: Vec<IpNet>,
    /// Every address on the host's own interfaces (refreshed by the caller).
    pub host_addrs: HashSet<IpAddr>,
    /// The daemon's listen ports; never reachable on a host, loopback or excepted address.
    pub daemon_ports: HashSet<u16>,
}

fn v4(a: u8, b: u8, c: u8, d: u8, len: u8) -> Ipv4Net {
    // Literal, valid prefixes only (len ≤ 32); a bad one is a bug caught by the unit tests.
    Ipv4Net::new(Ipv4Addr::new(a, b, c, d), len).unwrap_or_default()
}

fn v4_floor(ip: Ipv4Addr) -> Option<FloorHit> {
    let table: [(Ipv4Net, FloorHit); 16] = [
        (v4(0, 0, 0, 0, 8), FloorHit::Unspecified),
        (v4(10, 0, 0, 0, 8), FloorHit::Private),
        (v4(100, 64, 0, 0, 10), FloorHit::SharedCgnat),
        (v4(127, 0, 0, 0, 8), FloorHit::Loopback),
        (v4(169, 254, 0, 0, 16), FloorHit::LinkLocal),
        (v4(172, 16, 0, 0, 12), FloorHit::Private),
        (v4(192, 0, 0, 0, 24), FloorHit::Reserved),
        (v4(192, 0, 2, 0, 24), FloorHit::Documentation),
        (v4(192, 88, 99, 0, 24), FloorHit::Reserved),
        (v4(192, 168, 0, 0, 16), FloorHit::Private),
        (v4(198, 18, 0, 0, 15), FloorHit::Reserved),
        (v4(198, 51, 100, 0, 24), FloorHit::Documentation),
        (v4(203, 0, 113, 0, 24), FloorHit::Documentation),
        (v4(224, 0, 0, 0, 4), FloorHit::Multicast),
        (v4(255, 255, 255, 255, 32), FloorHit::Broadcast),
        (v4(240, 0, 0, 0, 4), FloorHit::Reserved),
    ];
    // Clouds' other metadata addresses fall in these ranges too: Alibaba's 100.100.100.200 in
    // 100.64/10, AWS's IPv6 fd00:ec2::254 in fc00::/7.
    table
        .iter()
        .find(|(net, _)| net.contains(&ip))
        .map(|&(_, hit)| hit)
}

fn v6_net(s: &str) -> Ipv6Net {
    s.parse().unwrap_or_else(|_| Ipv6Net::default())
}

fn v6_floor(ip: Ipv6Addr) -> Option<FloorHit> {
    if ip.is_unspecified() {
        return Some(FloorHit::Unspecified);
    }
    if ip.is_loopback() {
        return Some(FloorHit::Loopback);
    }
    let seg = ip.segments();
    // Forms that carry an IPv4 address: IPv4-compatible (::a.b.c.d, deprecated), NAT64
    // (64:ff9b::/96) and 6to4 (2002:AABB:CCDD::/48). They are judged by the address they carry.
    let v4_of = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    let embedded = if seg[..6] == [0; 6] || seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        Some(v4_of(seg[6], seg[7]))
    } else if seg[0] == 0x2002 {
        Some(v4_of(seg[1], seg[2]))
    } else {
        None
    };
    if let Some(hit) = embedded.and_then(v4_floor) {
        return Some(hit);
    }
    let table: [(&str, FloorHit); 9] = [
        ("64:ff9b:1::/48", FloorHit::Private),
        ("100::/64", FloorHit::Reserved),
        ("2001::/23", FloorHit::Reserved),
        ("2001:db8::/32", FloorHit::Documentation),
        ("3fff::/20", FloorHit::Documentation),
        ("fc00::/7", FloorHit::Private),
        ("fe80::/10", FloorHit::LinkLocal),
        ("fec0::/10", FloorHit::LinkLocal),
        ("ff00::/8", FloorHit::Multicast),
    ];
    table
        .iter()
        .find(|(net, _)| v6_net(net).contains(&ip))
        .map(|&(_, hit)| hit)
}

impl Floor {
    /// Whether the daemon may dial `ip` (on `port`, when known). This is checked on every
    /// address actually dialled, after resolution, whatever the policy says.
    pub fn check(&self, ip: IpAddr, port: Option<u16>) -> Result<(), FloorHit> {
        let ip = canonical(ip);
        let excepted = self.allow_private.iter().any(|n| n.contains(&ip));
        let own = self.host_addrs.contains(&ip)
            || self.host_addrs.iter().any(|h| canonical(*h) == ip)
            || ip.is_loopback()
            || ip.is_unspecified();
        if let Some(p) = port {
            if self.daemon_ports.contains(&p) && (own || excepted) {
                return Err(FloorHit::DaemonPort);
            }
        }
        if excepted {
            return Ok(());
        }
        if self.host_addrs.contains(&ip) || self.host_addrs.iter().any(|h| canonical(*h) == ip) {
            return Err(FloorHit::HostAddress);
        }
        match ip {
            IpAddr::V4(a) => v4_floor(a).map_or(Ok(()), Err),
            IpAddr::V6(a) => v6_floor(a).map_or(Ok(()), Err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(action: NetAction, host: &str, ports: Option<&[&str]>) -> NetworkRuleSpec {
        NetworkRuleSpec {
            action,
            host: Some(host.into()),
            cidr: None,
            ports: ports.map(|p| p.iter().map(|s| s.to_string()).collect()),
            protocol: None,
        }
    }
    fn cidr(action: NetAction, c: &str, ports: Option<&[&str]>) -> NetworkRuleSpec {
        NetworkRuleSpec {
            action,
            host: None,
            cidr: Some(c.into()),
            ports: ports.map(|p| p.iter().map(|s| s.to_string()).collect()),
            protocol: None,
        }
    }
    fn policy(rules: Vec<NetworkRuleSpec>) -> NetworkPolicy {
        NetworkPolicy::from_spec(
            &NetworkPolicySpec {
                rules,
                presets: vec![],
                default: NetAction::Deny,
            },
            1,
        )
        .expect("valid policy")
    }
    fn ip(s: &str) -> IpAddr {
        s.parse().expect("test address")
    }
    use NetAction::{Allow, Deny};

    #[test]
    fn exact_and_wildcard_hosts() {
        let p = policy(vec![
            rule(Allow, "A.Test.", None),
            rule(Allow, "*.b.test", None),
        ]);
        assert_eq!(p.match_name("a.test", 443).action, Allow);
        assert_eq!(p.match_name("x.a.test", 443).action, Deny);
        assert_eq!(p.match_name("x.b.test", 443).action, Allow);
        assert_eq!(p.match_name("y.x.b.test", 80).action, Allow);
        assert_eq!(p.match_name("b.test", 443).action, Deny, "subdomains only");
        assert_eq!(p.match_name("xb.test", 443).action, Deny, "label boundary");
        assert_eq!(
            p.match_name("a.test", 22).action,
            Deny,
            "host rules: 80/443"
        );
        assert_eq!(p.match_name("a.test", 80).rule, Some(0));
    }

    #[test]
    fn normalisation() {
        assert_eq!(normalize_name("PyPI.Org.").as_deref(), Ok("pypi.org"));
        assert!(normalize_name("a..b").is_err());
        assert!(normalize_name("").is_err());
        assert!(normalize_name(".").is_err());
        assert!(normalize_name("a b.test").is_err());
        assert!(normalize_name("-a.test").is_err());
        assert!(normalize_name(&"a".repeat(64)).is_err());
        assert!(normalize_name(&format!("{}.test", "a.".repeat(130))).is_err());
        assert_eq!(
            normalize_name("_acme.x.test").as_deref(),
            Ok("_acme.x.test")
        );
    }

    #[test]
    fn first_match_wins() {
        let p = policy(vec![
            rule(Deny, "bad.a.test", None),
            rule(Allow, "*.a.test", None),
            rule(Deny, "*.a.test", None),
        ]);
        assert_eq!(p.match_name("bad.a.test", 443).action, Deny);
        assert_eq!(p.match_name("good.a.test", 443).action, Allow);
        assert_eq!(p.match_name("good.a.test", 443).rule, Some(1));
    }

    #[test]
    fn ports_and_ranges() {
        let p = policy(vec![
            rule(Allow, "a.test", Some(&["8000-8100", "22"])),
            cidr(Allow, "127.0.0.2/32", Some(&["8080"])),
            rule(Allow, "any.test", Some(&["any"])),
        ]);
        assert_eq!(p.match_name("a.test", 8050).action, Allow);
        assert_eq!(p.match_name("a.test", 22).action, Allow);
        assert_eq!(p.match_name("a.test", 443).action, Deny);
        assert_eq!(p.match_name("any.test", 5).action, Allow);
        assert_eq!(p.match_ip(ip("127.0.0.2"), 8080).action, Allow);
        assert_eq!(p.match_ip(ip("127.0.0.2"), 8081).action, Deny);
        assert_eq!(p.match_ip(ip("::ffff:127.0.0.2"), 8080).action, Allow);
    }

    #[test]
    fn cidr_without_ports_is_any_port_and_mapped_rules_canonicalise() {
        let p = policy(vec![
            cidr(Allow, "203.0.113.0/24", None),
            cidr(Allow, "::ffff:198.51.100.0/120", None),
        ]);
        assert_eq!(p.match_ip(ip("203.0.113.9"), 1).action, Allow);
        assert_eq!(p.match_ip(ip("198.51.100.7"), 65535).action, Allow);
        assert!(p.cidr_allows(ip("198.51.100.7"), 5).is_some());
        assert!(p.cidr_allows(ip("198.51.101.7"), 5).is_none());
    }

    #[test]
    fn default_allow_is_used_when_nothing_matches() {
        let mut spec = NetworkPolicySpec {
            rules: vec![rule(Deny, "x.test", None)],
            ..Default::default()
        };
        spec.default = Allow;
        let p = NetworkPolicy::from_spec(&spec, 3).expect("valid");
        assert_eq!(
            p.match_name("y.test", 443),
            RuleMatch {
                action: Allow,
                rule: None
            }
        );
        assert_eq!(p.match_name("x.test", 443).action, Deny);
        assert_eq!(p.generation, 3);
        // Denied on 80/443 but allowed by default elsewhere: it resolves.
        assert!(p.name_resolvable("x.test").is_some());
        assert!(
            p.cidr_allows(ip("8.8.8.8"), 53).is_none(),
            "default is not a CIDR rule"
        );
    }

    #[test]
    fn resolvable_considers_every_port() {
        let p = policy(vec![
            rule(Deny, "a.test", Some(&["22"])),
            rule(Allow, "a.test", Some(&["22", "9000"])),
        ]);
        assert!(p.name_resolvable("a.test").is_some());
        let p = policy(vec![
            rule(Deny, "a.test", Some(&["any"])),
            rule(Allow, "a.test", None),
        ]);
        assert!(p.name_resolvable("a.test").is_none());
        let p = policy(vec![
            rule(Deny, "*.a.test", None),
            rule(Allow, "x.a.test", Some(&["1-65535"])),
        ]);
        assert!(
            p.name_resolvable("x.a.test").is_some(),
            "allowed on ports other than 80/443"
        );
        assert!(policy(vec![]).name_resolvable("a.test").is_none());
    }

    #[test]
    fn peek_modes() {
        let mut r = rule(Allow, "a.test", Some(&["8443"]));
        r.protocol = Some(NetProtocol::Tls);
        let mut h = rule(Allow, "a.test", Some(&["8080"]));
        h.protocol = Some(NetProtocol::Http);
        let p = policy(vec![r, h]);
        assert_eq!(p.peek_for_port(443), NetProtocol::Tls);
        assert_eq!(p.peek_for_port(80), NetProtocol::Http);
        assert_eq!(p.peek_for_port(8443), NetProtocol::Tls);
        assert_eq!(p.peek_for_port(8080), NetProtocol::Http);
        assert_eq!(p.peek_for_port(22), NetProtocol::Tcp);
    }

    #[test]
    fn validation_errors_are_clear() {
        let spec = |r: NetworkRuleSpec| NetworkPolicySpec {
            rules: vec![r],
            ..Default::default()
        };
        let err = |r| NetworkPolicy::from_spec(&spec(r), 1).expect_err("must be refused");
        assert!(matches!(
            err(rule(Allow, "1.2.3.4", None)),
            PolicyError::HostIsAddress { .. }
        ));
        assert!(matches!(
            err(rule(Allow, "[::1]", None)),
            PolicyError::HostIsAddress { .. }
        ));
        assert!(matches!(
            err(rule(Allow, "a.*.test", None)),
            PolicyError::BadHost { .. }
        ));
        assert!(matches!(
            err(rule(Allow, "*", None)),
            PolicyError::BadHost { .. }
        ));
        assert!(matches!(
            err(rule(Allow, "a_b c", None)),
            PolicyError::BadHost { .. }
        ));
        assert!(matches!(
            err(rule(Allow, "a.test", Some(&["0"]))),
            PolicyError::BadPort { .. }
        ));
        assert!(matches!(
            err(rule(Allow, "a.test", Some(&["70000"]))),
            PolicyError::BadPort { .. }
        ));
        assert!(matches!(
            err(rule(Allow, "a.test", Some(&["9-3"]))),
            PolicyError::BadPort { .. }
        ));
        assert!(matches!(
            err(rule(Allow, "a.test", Some(&["http"]))),
            PolicyError::BadPort { .. }
        ));
        assert_eq!(
            err(rule(Allow, "a.test", Some(&[]))),
            PolicyError::EmptyPorts(0)
        );
        assert!(matches!(
            err(cidr(Allow, "10.0.0.0/33", None)),
            PolicyError::BadCidr { .. }
        ));
        assert!(matches!(
            err(cidr(Allow, "nonsense", None)),
            PolicyError::BadCidr { .. }
        ));
        let e = err(cidr(Allow, "10.0.0.1/8", None));
        assert_eq!(
            e.to_string(),
            "rule 0: `10.0.0.1/8` has bits set below its prefix length; did you mean `10.0.0.0/8`?"
        );
        let both = NetworkRuleSpec {
            cidr: Some("1.2.3.4".into()),
            ..rule(Allow, "a.test", None)
        };
        assert_eq!(err(both), PolicyError::HostOrCidr(0));
        let neither = NetworkRuleSpec {
            host: None,
            ..rule(Allow, "a.test", None)
        };
        assert_eq!(err(neither), PolicyError::HostOrCidr(0));
        let unknown = NetworkPolicySpec {
            presets: vec!["nope".into()],
            ..Default::default()
        };
        let e = NetworkPolicy::from_spec(&unknown, 1).expect_err("unknown preset");
        assert!(e.to_string().contains("python-packages"), "{e}");
        let many = NetworkPolicySpec {
            rules: (0..=MAX_RULES)
                .map(|_| rule(Allow, "a.test", None))
                .collect(),
            ..Default::default()
        };
        assert_eq!(
            NetworkPolicy::from_spec(&many, 1),
            Err(PolicyError::TooManyRules)
        );
    }

    #[test]
    fn presets_come_after_explicit_rules() {
        let spec = NetworkPolicySpec {
            rules: vec![rule(Deny, "files.pythonhosted.org", None)],
            presets: vec!["python-packages".into(), "npm".into(), "github".into()],
            default: Deny,
        };
        let p = NetworkPolicy::from_spec(&spec, 1).expect("valid");
        assert_eq!(p.match_name("pypi.org", 443).action, Allow);
        assert_eq!(p.match_name("files.pythonhosted.org", 443).action, Deny);
        assert_eq!(p.match_name("registry.npmjs.org", 443).action, Allow);
        assert_eq!(p.match_name("github.com", 443).action, Allow);
        assert_eq!(p.match_name("evil.com", 443).action, Deny);
        for preset in PRESETS {
            for h in preset.hosts {
                assert!(check_host(0, h).is_ok(), "{h}");
            }
        }
    }

    #[test]
    fn wire_round_trip() {
        let json = r#"{"rules":[{"action":"allow","host":"*.a.test","ports":["443","8000-8001"],"protocol":"tls"}],"presets":["npm"],"default":"deny"}"#;
        let spec: NetworkPolicySpec = serde_json::from_str(json).expect("parses");
        let p = NetworkPolicy::from_spec(&spec, 1).expect("valid");
        assert_eq!(p.match_name("x.a.test", 8001).action, Allow);
        assert!(serde_json::from_str::<NetworkPolicySpec>(r#"{"rules":[],"nope":1}"#).is_err());
        assert_eq!(serde_json::to_string(&spec).expect("serialises"), json);
    }

    fn floor() -> Floor {
        Floor {
            allow_private: vec![],
            host_addrs: [ip("192.0.2.10"), ip("8.8.4.4"), ip("2001:4860::1")]
                .into_iter()
                .collect(),
            daemon_ports: [7420].into_iter().collect(),
        }
    }

    #[test]
    fn floor_refuses_every_special_range() {
        let f = floor();
        let cases: &[(&str, FloorHit)] = &[
            ("0.0.0.0", FloorHit::Unspecified),
            ("0.1.2.3", FloorHit::Unspecified),
            ("10.0.0.1", FloorHit::Private),
            ("10.255.255.255", FloorHit::Private),
            ("100.64.0.1", FloorHit::SharedCgnat),
            ("100.127.255.254", FloorHit::SharedCgnat),
            ("127.0.0.1", FloorHit::Loopback),
            ("127.9.9.9", FloorHit::Loopback),
            ("169.254.169.254", FloorHit::LinkLocal),
            ("100.100.100.200", FloorHit::SharedCgnat),
            ("172.16.0.1", FloorHit::Private),
            ("172.31.255.255", FloorHit::Private),
            ("192.0.0.8", FloorHit::Reserved),
            ("192.0.2.1", FloorHit::Documentation),
            ("192.88.99.1", FloorHit::Reserved),
            ("192.168.1.1", FloorHit::Private),
            ("198.18.0.1", FloorHit::Reserved),
            ("198.19.255.255", FloorHit::Reserved),
            ("198.51.100.1", FloorHit::Documentation),
            ("203.0.113.1", FloorHit::Documentation),
            ("224.0.0.1", FloorHit::Multicast),
            ("239.255.255.250", FloorHit::Multicast),
            ("240.0.0.1", FloorHit::Reserved),
            ("255.255.255.255", FloorHit::Broadcast),
            ("::", FloorHit::Unspecified),
            ("::1", FloorHit::Loopback),
            ("::ffff:127.0.0.1", FloorHit::Loopback),
            ("::ffff:169.254.169.254", FloorHit::LinkLocal),
            ("::ffff:10.1.2.3", FloorHit::Private),
            ("::127.0.0.1", FloorHit::Loopback),
            ("::10.0.0.1", FloorHit::Private),
            ("64:ff9b::a9fe:a9fe", FloorHit::LinkLocal),
            ("64:ff9b::7f00:1", FloorHit::Loopback),
            ("64:ff9b:1::1", FloorHit::Private),
            ("2002:7f00:1::1", FloorHit::Loopback),
            ("2002:a00:1::1", FloorHit::Private),
            ("100::1", FloorHit::Reserved),
            ("2001::1", FloorHit::Reserved),
            ("2001:db8::1", FloorHit::Documentation),
            ("fc00::1", FloorHit::Private),
            ("fd00:ec2::254", FloorHit::Private),
            ("fe80::1", FloorHit::LinkLocal),
            ("fec0::1", FloorHit::LinkLocal),
            ("ff02::1", FloorHit::Multicast),
            ("8.8.4.4", FloorHit::HostAddress),
            ("::ffff:8.8.4.4", FloorHit::HostAddress),
            ("2001:4860::1", FloorHit::HostAddress),
        ];
        for (a, want) in cases {
            assert_eq!(f.check(ip(a), Some(443)), Err(*want), "{a}");
            assert_eq!(f.check(ip(a), None), Err(*want), "{a} without a port");
        }
        for ok in [
            "1.1.1.1",
            "93.184.216.34",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:1.1.1.1",
            "2002:101:101::1",
            "64:ff9b::101:101",
        ] {
            assert_eq!(f.check(ip(ok), Some(443)), Ok(()), "{ok}");
        }
    }

    #[test]
    fn floor_exceptions_are_operator_only_and_never_the_daemon_port() {
        let mut f = floor();
        f.allow_private = vec![
            "127.0.0.0/8".parse().expect("net"),
            "10.1.0.0/16".parse().expect("net"),
        ];
        assert_eq!(f.check(ip("127.0.0.2"), Some(8080)), Ok(()));
        assert_eq!(f.check(ip("::ffff:127.0.0.2"), Some(8080)), Ok(()));
        assert_eq!(f.check(ip("10.1.2.3"), Some(22)), Ok(()));
        assert_eq!(f.check(ip("10.2.0.1"), Some(22)), Err(FloorHit::Private));
        assert_eq!(
            f.check(ip("169.254.169.254"), Some(80)),
            Err(FloorHit::LinkLocal)
        );
        assert_eq!(
            f.check(ip("127.0.0.1"), Some(7420)),
            Err(FloorHit::DaemonPort)
        );
        assert_eq!(
            f.check(ip("10.1.2.3"), Some(7420)),
            Err(FloorHit::DaemonPort)
        );
        assert_eq!(
            f.check(ip("8.8.4.4"), Some(7420)),
            Err(FloorHit::DaemonPort)
        );
        assert_eq!(f.check(ip("8.8.4.4"), Some(80)), Err(FloorHit::HostAddress));
        // A public address that is not the host's may use the same port number.
        assert_eq!(f.check(ip("1.1.1.1"), Some(7420)), Ok(()));
    }
}
