//! The OTLP endpoint inside a sandbox (issue 17, ADR 0091): spans that code in the sandbox
//! exports reach the operator's collector through the daemon, because the sandbox itself
//! reaches nothing outside. Enabled per sandbox (`otlp_relay` on create) and only on a
//! daemon that exports traces itself; the daemon then listens on [`RELAY_ADDR`] inside the
//! sandbox's network namespace (as it does for egress, ADR 0065: the socket is the
//! daemon's, bound before any user code runs) and every exec's environment names it in
//! `OTEL_EXPORTER_OTLP_ENDPOINT`.
//!
//! The core owns when the listener exists (boot, adoption, stop, delete); what is served
//! on it is the server's ([`TraceSink`]): the core has no HTTP stack.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::pin::Pin;
use std::sync::Arc;

/// Where the relay listens inside a sandbox: the OTLP/HTTP default port on loopback.
pub const RELAY_ADDR: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4318);

/// The value of `OTEL_EXPORTER_OTLP_ENDPOINT` in a relayed sandbox.
pub const RELAY_ENDPOINT: &str = "http://127.0.0.1:4318";

/// A future that serves one sandbox's relay listener until it is dropped.
pub type ServeFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Serves the relay listener of one sandbox (the server forwards OTLP/HTTP to its
/// collector). Dropping the future closes the listener.
pub trait TraceSink: Send + Sync {
    fn serve(&self, sandbox: String, listener: tokio::net::TcpListener) -> ServeFuture;
}

/// The configured sink (`Config::trace_relay`), `None` when the daemon exports no traces.
#[derive(Clone)]
pub struct TraceRelay(pub Arc<dyn TraceSink>);

impl std::fmt::Debug for TraceRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TraceRelay")
    }
}
