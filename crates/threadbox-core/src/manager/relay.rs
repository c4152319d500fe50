//! When a sandbox's in-sandbox OTLP endpoint exists (ADR 0091): opened with its egress
//! listeners (after boot, adoption, start), closed with them (stop, delete).

use super::*;
use crate::relay::RELAY_ADDR;
use std::net::SocketAddr;

/// Relay tasks by sandbox id; dropping one closes its listener.
#[derive(Default)]
pub(super) struct Relays {
    tasks: Mutex<HashMap<String, tokio::task::JoinHandle<()>>>,
}

impl Drop for Relays {
    fn drop(&mut self) {
        for (_, t) in self
            .tasks
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
        {
            t.abort();
        }
    }
}

impl Manager {
    /// Opens the endpoint of `row` if it asked for one. A failure is logged and leaves the
    /// sandbox without it (spans are then refused inside, nothing else changes).
    pub(super) async fn attach_relay(&self, row: &SandboxRow, pid: i32) {
        let Some(sink) = self.config.trace_relay.clone() else {
            return;
        };
        if !row.otlp_relay {
            return;
        }
        if self
            .relays
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&row.id)
            .is_some_and(|t| !t.is_finished())
        {
            return;
        }
        let r = async {
            let ns = self
                .driver_for(row)?
                .egress_netns(&row.id, pid)
                .await?
                .ok_or_else(|| {
                    CoreError::Unavailable(format!(
                        "tier {} has no network namespace to serve the OTLP endpoint in",
                        row.tier
                    ))
                })?;
            let listener = blocking(move || {
                use std::os::fd::AsFd;
                Ok(threadbox_sys::net::tcp_listener_in_netns(
                    ns.as_fd(),
                    SocketAddr::V4(RELAY_ADDR),
                )?)
            })
            .await?;
            Ok::<_, CoreError>(tokio::net::TcpListener::from_std(listener)?)
        }
        .await;
        match r {
            Ok(listener) => {
                let task = tokio::spawn(sink.0.serve(row.id.clone(), listener));
                self.relays
                    .tasks
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(row.id.clone(), task);
                tracing::info!(sandbox = %row.id, "OTLP endpoint open inside");
            }
            Err(e) => {
                tracing::error!(sandbox = %row.id, "OTLP endpoint not opened: {}", e.chain());
            }
        }
    }

    /// Closes the endpoint of `id`, if open.
    pub(super) fn detach_relay(&self, id: &str) {
        if let Some(t) = self
            .relays
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
        {
            t.abort();
        }
    }

    /// Names the endpoint in an exec's environment when `row` has one (a value the caller
    /// set wins, as for the trace context).
    pub(super) fn relay_env(&self, row: &SandboxRow, env: &mut BTreeMap<String, String>) {
        if row.otlp_relay && self.config.trace_relay.is_some() {
            env.entry("OTEL_EXPORTER_OTLP_ENDPOINT".into())
                .or_insert_with(|| crate::relay::RELAY_ENDPOINT.into());
        }
    }
}
