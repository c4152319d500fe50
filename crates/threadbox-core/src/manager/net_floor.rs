//! The host's own addresses on the egress floor (issue 13, ADR 0064): read when the first
//! floor is built, re-read every few seconds by a task, and pushed to every attached data
//! plane when they change (a new interface, a DHCP lease), so no sandbox can reach the host
//! through an address it gained after the sandbox was attached.

use super::*;
use std::collections::HashSet;
use std::net::IpAddr;

/// How often the host's addresses are read again.
pub(crate) const HOST_ADDR_REFRESH: Duration = Duration::from_secs(5);

/// The last reading of the host's addresses.
#[derive(Default)]
pub(super) struct HostAddrs {
    last: Mutex<Option<Arc<HashSet<IpAddr>>>>,
}

fn read() -> Option<HashSet<IpAddr>> {
    match threadbox_sys::net::host_addresses() {
        Ok(a) => Some(a),
        Err(e) => {
            tracing::warn!("egress floor: cannot read the host's addresses: {e}");
            None
        }
    }
}

impl HostAddrs {
    /// The addresses, read now if never read.
    pub(super) fn get(&self) -> Arc<HashSet<IpAddr>> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = &*last {
            return a.clone();
        }
        let a = Arc::new(read().unwrap_or_default());
        *last = Some(a.clone());
        a
    }

    /// Reads again; whether they changed.
    fn refresh(&self) -> bool {
        let Some(now) = read() else { return false };
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.as_deref() == Some(&now) {
            return false;
        }
        *last = Some(Arc::new(now));
        true
    }
}

impl Manager {
    /// Starts the task that keeps the floor's host addresses current.
    pub(crate) fn spawn_host_addrs(
        self: &Arc<Self>,
        mut stop_rx: tokio::sync::watch::Receiver<bool>,
    ) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(HOST_ADDR_REFRESH) => {}
                    _ = stop_rx.changed() => break,
                }
                let Some(mgr) = weak.upgrade() else { break };
                let changed = {
                    let m = mgr.clone();
                    blocking(move || Ok(m.net.host_addrs.refresh())).await
                };
                if matches!(changed, Ok(true)) {
                    tracing::info!("egress floor: the host's addresses changed");
                    mgr.refloor_all();
                }
            }
        });
    }
}
