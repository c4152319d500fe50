//! One sandbox's egress state: its live policy, the floor, its DNS pins, its limits and the
//! channel its log rows go to. The DNS server and the proxy both serve from one of these.

use crate::dns::Resolver;
use crate::policy::{Floor, NetworkPolicy};
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use threadbox_api::network::NetLogEntry;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::time::Instant;

/// Per-sandbox limits. The defaults follow research/network.md §8.4-§8.5.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Concurrent egress connections (E2B's limiter uses the same number).
    pub max_conns: usize,
    /// DNS questions: a bucket of `dns_burst` refilled at `dns_per_sec`.
    pub dns_burst: u32,
    pub dns_per_sec: f64,
    /// DNS over TCP: concurrent connections, and how long one may sit idle.
    pub dns_tcp_conns: usize,
    pub dns_tcp_idle: Duration,
    /// How much of a ClientHello or request head is read to find the name, and for how long.
    pub peek_bytes: usize,
    pub peek_timeout: Duration,
    /// Upstream connect timeout, per address tried.
    pub dial_timeout: Duration,
    /// Pins kept (IP → names), and the least time one lives whatever the TTL.
    pub max_pins: usize,
    pub pin_grace: Duration,
    /// Rows buffered for the caller before new ones are dropped (and counted).
    pub log_capacity: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_conns: 256,
            dns_burst: 200,
            dns_per_sec: 50.0,
            dns_tcp_conns: 16,
            dns_tcp_idle: Duration::from_secs(10),
            peek_bytes: 16 * 1024,
            peek_timeout: Duration::from_secs(5),
            dial_timeout: Duration::from_secs(10),
            max_pins: 4096,
            pin_grace: Duration::from_secs(300),
            log_capacity: 4096,
        }
    }
}

/// What a [`SandboxNet`] is made from.
pub struct SandboxNetConfig {
    pub sandbox: String,
    pub policy: NetworkPolicy,
    pub floor: Floor,
    pub resolver: Arc<dyn Resolver>,
    pub limits: Limits,
}

#[derive(Debug)]
struct Pin {
    name: String,
    expires: Instant,
}

/// A token bucket, driven by the caller's clock so it is testable without waiting.
#[derive(Debug)]
pub(crate) struct TokenBucket {
    tokens: f64,
    burst: f64,
    per_sec: f64,
    last: Instant,
}

impl TokenBucket {
    pub(crate) fn new(burst: u32, per_sec: f64, now: Instant) -> Self {
        TokenBucket {
            tokens: f64::from(burst),
            burst: f64::from(burst),
            per_sec: per_sec.max(0.0),
            last: now,
        }
    }
    pub(crate) fn take(&mut self, now: Instant) -> bool {
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + dt * self.per_sec).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// One sandbox's egress state. Cheap to share (`Arc`); the serve loops hold a clone each.
pub struct SandboxNet {
    pub(crate) sandbox: String,
    policy: watch::Sender<Arc<NetworkPolicy>>,
    floor: RwLock<Arc<Floor>>,
    pub(crate) resolver: Arc<dyn Resolver>,
    pins: Mutex<HashMap<Ipv4Addr, Vec<Pin>>>,
    events: mpsc::Sender<NetLogEntry>,
    dropped_events: AtomicU64,
    pub(crate) conns: Arc<Semaphore>,
    pub(crate) dns_tcp: Arc<Semaphore>,
    dns_bucket: Mutex<TokenBucket>,
    shutdown: watch::Sender<bool>,
    pub(crate) limits: Limits,
    /// Secrets (ADR 0068): the hosts whose TLS is intercepted, and with what.
    intercept: RwLock<Option<crate::mitm::Intercept>>,
}

impl SandboxNet {
    /// Builds the state and the receiving end of its log: the caller drains it (to SQLite,
    /// tracing, a follow stream). When the caller falls behind, rows are dropped and counted
    /// rather than slowing egress.
    pub fn new(cfg: SandboxNetConfig) -> (Arc<Self>, mpsc::Receiver<NetLogEntry>) {
        let (tx, rx) = mpsc::channel(cfg.limits.log_capacity.max(1));
        let (policy, _) = watch::channel(Arc::new(cfg.policy));
        let (shutdown, _) = watch::channel(false);
        let net = SandboxNet {
            sandbox: cfg.sandbox,
            policy,
            floor: RwLock::new(Arc::new(cfg.floor)),
            resolver: cfg.resolver,
            pins: Mutex::new(HashMap::new()),
            events: tx,
            dropped_events: AtomicU64::new(0),
            conns: Arc::new(Semaphore::new(cfg.limits.max_conns)),
            dns_tcp: Arc::new(Semaphore::new(cfg.limits.dns_tcp_conns)),
            dns_bucket: Mutex::new(TokenBucket::new(
                cfg.limits.dns_burst,
                cfg.limits.dns_per_sec,
                Instant::now(),
            )),
            shutdown,
            limits: cfg.limits,
            intercept: RwLock::new(None),
        };
        (Arc::new(net), rx)
    }

    pub fn sandbox(&self) -> &str {
        &self.sandbox
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<NetworkPolicy> {
        self.policy.borrow().clone()
    }

    /// Swaps the policy atomically. New connections and DNS questions see it at once; every
    /// open connection re-checks itself against it and closes if it is no longer allowed
    /// (logged as `policy_revoked`). Generation checks (`If-Match`) are the caller's.
    pub fn set_policy(&self, policy: NetworkPolicy) {
        self.policy.send_replace(Arc::new(policy));
    }

    pub(crate) fn watch_policy(&self) -> watch::Receiver<Arc<NetworkPolicy>> {
        self.policy.subscribe()
    }

    pub fn floor(&self) -> Arc<Floor> {
        match self.floor.read() {
            Ok(f) => f.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the floor (e.g. after the host's addresses changed).
    pub fn set_floor(&self, floor: Floor) {
        match self.floor.write() {
            Ok(mut f) => *f = Arc::new(floor),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(floor),
        }
    }

    /// Sets (or clears) the secrets whose hosts are intercepted; new connections see it.
    pub fn set_intercept(&self, i: Option<crate::mitm::Intercept>) {
        match self.intercept.write() {
            Ok(mut g) => *g = i,
            Err(poisoned) => *poisoned.into_inner() = i,
        }
    }

    /// The interception for `host`, if a secret of this sandbox names it.
    pub(crate) fn intercept_for(&self, host: &str) -> Option<crate::mitm::Intercept> {
        let g = match self.intercept.read() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        g.as_ref().filter(|i| i.covers(host)).cloned()
    }

    /// Stops the serve loops and closes every open connection.
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    pub(crate) fn watch_shutdown(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Rows dropped because the caller did not drain the log in time.
    pub fn dropped_events(&self) -> u64 {
        self.dropped_events.load(Ordering::Relaxed)
    }

    /// Open egress connections.
    pub fn open_connections(&self) -> usize {
        self.limits
            .max_conns
            .saturating_sub(self.conns.available_permits())
    }

    pub(crate) fn emit(&self, mut entry: NetLogEntry) {
        entry.sandbox.clone_from(&self.sandbox);
        entry.at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        if self.events.try_send(entry).is_err() {
            self.dropped_events.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn take_dns_token(&self) -> bool {
        match self.dns_bucket.lock() {
            Ok(mut b) => b.take(Instant::now()),
            Err(poisoned) => poisoned.into_inner().take(Instant::now()),
        }
    }

    /// Records that `name` resolved to `ip`, for `ttl` (at least the pin grace).
    pub(crate) fn pin(&self, ip: Ipv4Addr, name: &str, ttl: Duration) {
        let now = Instant::now();
        let expires = now + ttl.max(self.limits.pin_grace);
        let mut pins = match self.pins.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        let list = pins.entry(ip).or_default();
        list.retain(|p| p.expires > now && p.name != name);
        list.push(Pin {
            name: name.to_string(),
            expires,
        });
        let max = self.limits.max_pins.max(1);
        let mut total: usize = pins.values().map(Vec::len).sum();
        if total > max {
            for list in pins.values_mut() {
                list.retain(|p| p.expires > now);
            }
            pins.retain(|_, l| !l.is_empty());
            total = pins.values().map(Vec::len).sum();
        }
        while total > max {
            // Evict the pin that would expire first.
            let victim = pins
                .iter()
                .flat_map(|(ip, l)| l.iter().map(move |p| (*ip, p.expires)))
                .min_by_key(|&(_, e)| e)
                .map(|(ip, _)| ip);
            let Some(ip) = victim else { break };
            if let Some(list) = pins.get_mut(&ip) {
                if let Some(pos) = list
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, p)| p.expires)
                    .map(|(i, _)| i)
                {
                    list.remove(pos);
                }
                if list.is_empty() {
                    pins.remove(&ip);
                }
            }
            total -= 1;
        }
    }

    /// The names pinned to `ip` that have not expired.
    pub fn pins_for(&self, ip: Ipv4Addr) -> Vec<String> {
        let now = Instant::now();
        let pins = match self.pins.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        pins.get(&ip)
            .map(|l| {
                l.iter()
                    .filter(|p| p.expires > now)
                    .map(|p| p.name.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_refills_at_its_rate_and_caps_at_burst() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(2, 1.0, t0);
        assert!(b.take(t0));
        assert!(b.take(t0));
        assert!(!b.take(t0));
        assert!(!b.take(t0 + Duration::from_millis(500)));
        assert!(b.take(t0 + Duration::from_millis(1000)));
        assert!(b.take(t0 + Duration::from_secs(100)));
        assert!(b.take(t0 + Duration::from_secs(100)));
        assert!(
            !b.take(t0 + Duration::from_secs(100)),
            "burst caps the refill"
        );
    }

    #[tokio::test]
    async fn pins_are_capped_oldest_first() {
        let limits = Limits {
            max_pins: 3,
            ..Limits::default()
        };
        let (net, _rx) = SandboxNet::new(SandboxNetConfig {
            sandbox: "sb".into(),
            policy: NetworkPolicy::deny_all(1),
            floor: Floor::default(),
            resolver: Arc::new(crate::dns::StaticResolver::default()),
            limits,
        });
        let ip = |d| Ipv4Addr::new(93, 184, 216, d);
        net.pin(ip(1), "a.test", Duration::from_secs(400));
        net.pin(ip(2), "b.test", Duration::from_secs(900));
        net.pin(ip(2), "c.test", Duration::from_secs(800));
        net.pin(ip(3), "d.test", Duration::from_secs(1000));
        assert!(
            net.pins_for(ip(1)).is_empty(),
            "the soonest to expire went first"
        );
        assert_eq!(net.pins_for(ip(2)), vec!["b.test", "c.test"]);
        net.pin(ip(2), "b.test", Duration::from_secs(2000));
        assert_eq!(
            net.pins_for(ip(2)),
            vec!["c.test", "b.test"],
            "re-pinning refreshes"
        );
    }
}
