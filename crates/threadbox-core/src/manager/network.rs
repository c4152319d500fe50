//! Egress (issue 13, ADR 0061): a sandbox's policy in the store, and the `threadbox-net`
//! data plane the daemon attaches to the sandbox's netns while it runs with a policy.
//!
//! Every jail sandbox boots with the fixed table (ADR 0065): TCP goes to port 1 and DNS to
//! 127.0.0.53:53 inside its netns. Only while a policy is set does the daemon listen there;
//! otherwise (no policy, daemon down, sandbox stopped) the kernel refuses everything.

use super::*;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use threadbox_api::network::{GetNetwork, NetworkInfo, NetworkPolicySpec, SetNetwork};
use threadbox_net::{Floor, NetworkPolicy, SandboxNet, SandboxNetConfig};

/// The data plane attached to one running sandbox.
pub(super) struct Attached {
    net: Arc<SandboxNet>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.net.shutdown();
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Attached data planes by sandbox id.
#[derive(Default)]
pub(super) struct NetState {
    attached: Mutex<HashMap<String, Attached>>,
    /// Woken after each batch the log writers store (the log's long poll waits on it).
    pub(super) log_written: Arc<tokio::sync::Notify>,
    /// The host's own addresses, on every sandbox's floor (ADR 0064).
    pub(super) host_addrs: super::net_floor::HostAddrs,
}

fn parse_policy(json: &str, generation: u64) -> Result<(NetworkPolicySpec, NetworkPolicy)> {
    let spec: NetworkPolicySpec = serde_json::from_str(json)
        .map_err(|e| CoreError::Internal(format!("stored network policy: {e}")))?;
    let policy = NetworkPolicy::from_spec(&spec, generation)
        .map_err(|e| CoreError::Internal(format!("stored network policy: {e}")))?;
    Ok((spec, policy))
}

/// Checks a policy as the API took it; its JSON for the store, or `invalid_argument`
/// naming the bad rule.
pub(super) fn check_policy(spec: &NetworkPolicySpec) -> Result<String> {
    NetworkPolicy::from_spec(spec, 0).map_err(|e| CoreError::InvalidArgument(e.to_string()))?;
    serde_json::to_string(spec).map_err(|e| CoreError::Internal(e.to_string()))
}

impl Manager {
    /// A create with a policy took a warm-pool sandbox (already running, never had a
    /// policy): store the policy and attach the data plane now.
    pub(super) async fn network_on_adopt(&self, id: &str, json: &str) -> Result<()> {
        let current = self
            .store
            .get_network(id)
            .await?
            .ok_or_else(|| CoreError::NotFound(id.to_string()))?;
        self.store
            .swap_network(id, current.generation, Some(json))
            .await?
            .ok_or_else(|| {
                CoreError::Internal(format!("the network policy of {id} changed meanwhile"))
            })?;
        let row = self.reload(id).await?;
        if let Some(pid) = row.agent_pid {
            self.attach_network(&row, pid).await;
        }
        Ok(())
    }

    fn egress_floor(&self) -> Floor {
        #[allow(unused_mut)]
        let mut allow_private = self.config.egress_allow_private.clone();
        // Positive control of the rebinding cases (ADR 0009, 0069; test builds only).
        #[cfg(feature = "insecure-test-hooks")]
        if threadbox_sys::testhooks::Weaken::from_env().is_ok_and(|w| w.has("egress-no-floor")) {
            allow_private.extend(
                ["0.0.0.0/0", "::/0"]
                    .iter()
                    .filter_map(|n| n.parse::<ipnet::IpNet>().ok()),
            );
        }
        Floor {
            allow_private,
            host_addrs: (*self.net.host_addrs.get()).clone(),
            daemon_ports: self.config.egress_daemon_ports.iter().copied().collect(),
        }
    }

    fn egress_resolver(&self) -> Arc<dyn threadbox_net::Resolver> {
        let mut chain: Vec<Arc<dyn threadbox_net::Resolver>> = Vec::new();
        if !self.config.egress_hosts.is_empty() {
            let mut s = threadbox_net::StaticResolver::new(60);
            for (name, addrs) in &self.config.egress_hosts {
                // Checked when the flag was read; a bad line here is skipped, not fatal.
                if let Err(e) = s.insert(name, addrs.clone()) {
                    tracing::warn!(name, "egress hosts: {e}");
                }
            }
            chain.push(Arc::new(s));
        }
        let upstream = match &self.config.egress_dns {
            Some(servers) => threadbox_net::UpstreamResolver {
                servers: servers.clone(),
                timeout: Duration::from_secs(3),
            },
            None => threadbox_net::UpstreamResolver::from_resolv_conf(
                std::path::Path::new("/etc/resolv.conf"),
                Duration::from_secs(3),
            )
            .unwrap_or(threadbox_net::UpstreamResolver {
                servers: Vec::new(),
                timeout: Duration::from_secs(3),
            }),
        };
        chain.push(Arc::new(upstream));
        Arc::new(threadbox_net::dns::ChainResolver(chain))
    }

    /// Attaches the data plane to `row` if it has a policy and runs in a netns of its own
    /// (after boot, adoption, start). A failure leaves the sandbox closed, never open.
    pub(super) async fn attach_network(&self, row: &SandboxRow, pid: i32) {
        self.attach_relay(row, pid).await;
        if let Err(e) = self.attach_network_inner(row, pid).await {
            tracing::error!(sandbox = %row.id, "egress not attached (the sandbox stays closed): {}", e.chain());
        }
    }

    async fn attach_network_inner(&self, row: &SandboxRow, pid: i32) -> Result<()> {
        let Some(stored) = self.store.get_network(&row.id).await? else {
            return Ok(());
        };
        let Some(json) = stored.policy_json else {
            return Ok(());
        };
        let (_, policy) = parse_policy(&json, stored.generation)?;
        let intercept = self.intercept_of(&row.id, &row.tenant).await?;
        if let Some(a) = lock(&self.net.attached).get(&row.id) {
            a.net.set_policy(policy);
            a.net.set_intercept(intercept);
            return Ok(());
        }
        let Some(ns) = self.driver_for(row)?.egress_netns(&row.id, pid).await? else {
            return Ok(());
        };
        let dns_addr = SocketAddr::V4(threadbox_sys::net::DEFAULT_DNS_ADDR);
        let redirect = SocketAddr::V4(SocketAddrV4::new(
            Ipv4Addr::UNSPECIFIED,
            threadbox_sys::net::DEFAULT_REDIRECT_PORT,
        ));
        let (udp, dns_tcp, proxy) = blocking(move || {
            use std::os::fd::AsFd;
            let fd = ns.as_fd();
            Ok((
                threadbox_sys::net::udp_socket_in_netns(fd, dns_addr)?,
                threadbox_sys::net::tcp_listener_in_netns(fd, dns_addr)?,
                threadbox_sys::net::tcp_listener_in_netns(fd, redirect)?,
            ))
        })
        .await?;
        let (net, rx) = SandboxNet::new(SandboxNetConfig {
            sandbox: row.id.clone(),
            policy,
            floor: self.egress_floor(),
            resolver: self.egress_resolver(),
            limits: egress_limits(),
        });
        net.set_intercept(intercept);
        let udp = tokio::net::UdpSocket::from_std(udp)?;
        let dns_tcp = tokio::net::TcpListener::from_std(dns_tcp)?;
        let proxy = tokio::net::TcpListener::from_std(proxy)?;
        let od: threadbox_net::proxy::OriginalDst = Arc::new(|s: &tokio::net::TcpStream| {
            use std::os::fd::AsFd;
            threadbox_sys::net::original_dst(s.as_fd())
                .map_err(|e| std::io::Error::other(e.to_string()))
        });
        let tasks = vec![
            tokio::spawn(threadbox_net::dns::serve_udp(net.clone(), udp)),
            tokio::spawn(threadbox_net::dns::serve_tcp(net.clone(), dns_tcp)),
            tokio::spawn(threadbox_net::proxy::serve(net.clone(), proxy, od)),
        ];
        // Not in `tasks`: it is not aborted on detach but ends once the data plane is gone,
        // after storing the rows of the connections the detach closed (ADR 0063).
        tokio::spawn(self.log_writer(row).run(rx));
        lock(&self.net.attached).insert(row.id.clone(), Attached { net, tasks });
        tracing::info!(sandbox = %row.id, "egress attached");
        Ok(())
    }

    /// The data plane attached to `id`, if any.
    pub(super) fn attached_net(&self, id: &str) -> Option<Arc<SandboxNet>> {
        lock(&self.net.attached).get(id).map(|a| a.net.clone())
    }

    /// Detaches the data plane of `id` (stop, delete): its listeners close, so the kernel
    /// refuses the sandbox's connections again.
    pub(super) fn detach_network(&self, id: &str) {
        self.detach_relay(id);
        lock(&self.net.attached).remove(id);
    }

    /// Gives every attached data plane the current floor (the host's addresses changed).
    pub(super) fn refloor_all(&self) {
        let floor = self.egress_floor();
        for a in lock(&self.net.attached).values() {
            a.net.set_floor(floor.clone());
        }
    }

    /// Log rows the data plane of `id` dropped since it was attached (0 when detached).
    pub(super) fn net_log_dropped(&self, id: &str) -> u64 {
        lock(&self.net.attached)
            .get(id)
            .map_or(0, |a| a.net.dropped_events())
    }

    pub async fn get_network(&self, caller: &Caller, op: GetNetwork) -> Result<NetworkInfo> {
        caller.require(GetNetwork::SCOPE)?;
        let row = self.resolve(caller, &op.sandbox).await?;
        let stored = self
            .store
            .get_network(&row.id)
            .await?
            .ok_or_else(|| CoreError::NotFound(op.sandbox.clone()))?;
        let policy = match stored.policy_json {
            Some(j) => Some(parse_policy(&j, stored.generation)?.0),
            None => None,
        };
        Ok(NetworkInfo {
            generation: stored.generation,
            policy,
        })
    }

    pub async fn set_network(&self, caller: &Caller, op: SetNetwork) -> Result<NetworkInfo> {
        let r = self.set_network_inner(caller, &op).await;
        self.audit(caller, SetNetwork::NAME, &op.sandbox, &r).await;
        r
    }

    async fn set_network_inner(&self, caller: &Caller, op: &SetNetwork) -> Result<NetworkInfo> {
        caller.require(SetNetwork::SCOPE)?;
        let row = self.resolve(caller, &op.sandbox).await?;
        // Checked before anything changes: bad input is refused with the rule named.
        let json = check_policy(&op.policy)?;
        self.require_row_capability(&row, crate::driver::capability::EGRESS, "a network policy")?;
        let live = self.live(&row.id);
        // Under the lifecycle lock: a concurrent stop/start attaches or detaches after us.
        let _guard = live.lifecycle.lock().await;
        self.require_booted_netns(&row.id, "set one").await?;
        let current = self
            .store
            .get_network(&row.id)
            .await?
            .ok_or_else(|| CoreError::NotFound(op.sandbox.clone()))?;
        let expected = op.if_match.unwrap_or(current.generation);
        if expected != current.generation {
            return Err(CoreError::PreconditionFailed(format!(
                "the network policy of sandbox {} is generation {}, not {expected}",
                row.id, current.generation
            )));
        }
        let generation = self
            .store
            .swap_network(&row.id, expected, Some(&json))
            .await?
            .ok_or_else(|| {
                CoreError::PreconditionFailed(format!(
                    "the network policy of sandbox {} changed meanwhile",
                    row.id
                ))
            })?;
        let row = self.reload(&row.id).await?;
        if matches!(
            row.state,
            State::Running | State::Paused | State::Hibernated
        ) {
            if let Some(pid) = row.agent_pid {
                self.attach_network(&row, pid).await;
            }
        }
        Ok(NetworkInfo {
            generation,
            policy: Some(op.policy.clone()),
        })
    }
}

impl Manager {
    /// A sandbox that runs without a netns of ours (a gvisor sandbox created without a
    /// policy, ADR 0140: the sentry's own loopback) cannot take a policy or a preview
    /// until it boots again; refused before anything changes rather than stored and
    /// silently inert.
    pub(super) async fn require_booted_netns(&self, id: &str, what: &str) -> Result<()> {
        let row = self.reload(id).await?;
        let Some(pid) = row.agent_pid else {
            return Ok(());
        };
        if !matches!(row.state, State::Running | State::Paused) {
            return Ok(());
        }
        if self
            .driver_for(&row)?
            .egress_netns(&row.id, pid)
            .await?
            .is_none()
        {
            return Err(CoreError::Conflict(format!(
                "sandbox {} was booted on the {} tier without a network namespace (it was \
                 created without a network policy); to {what}, set a policy while it is \
                 stopped and start it, or create it with one (an empty one opens nothing)",
                row.id, row.tier
            )));
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl crate::ops::Run for GetNetwork {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<NetworkInfo> {
        m.get_network(caller, self).await
    }
}

impl crate::ops::Run for SetNetwork {
    async fn run(self, m: &Manager, caller: &Caller) -> Result<NetworkInfo> {
        m.set_network(caller, self).await
    }
}

/// The per-sandbox egress caps (threadbox-net's defaults).
fn egress_limits() -> threadbox_net::Limits {
    #[allow(unused_mut)]
    let mut limits = threadbox_net::Limits::default();
    // Positive control of the connection-exhaustion case (ADR 0009, 0069; test builds only).
    #[cfg(feature = "insecure-test-hooks")]
    if threadbox_sys::testhooks::Weaken::from_env().is_ok_and(|w| w.has("egress-no-conn-cap")) {
        limits.max_conns = 1 << 20;
    }
    // Positive control of the DNS flood case (N11).
    #[cfg(feature = "insecure-test-hooks")]
    if threadbox_sys::testhooks::Weaken::from_env().is_ok_and(|w| w.has("egress-no-dns-cap")) {
        limits.dns_burst = u32::MAX;
        limits.dns_per_sec = 1e9;
    }
    limits
}
