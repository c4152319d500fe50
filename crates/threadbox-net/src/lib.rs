//! The egress data plane of threadbox (issue 13, research/network.md §8): the network policy
//! and its operator floor, a per-sandbox DNS server and the transparent proxy for one
//! sandbox's redirect listener.
//!
//! Nothing here makes a socket in a namespace or reads `SO_ORIGINAL_DST`: the caller (the
//! manager, with `threadbox-sys::net`) hands over listeners and a function for the original
//! destination, so every piece runs on loopback in tests without root.
#![forbid(unsafe_code)]

pub mod dns;
pub mod mitm;
pub mod peek;
pub mod policy;
pub mod proxy;
mod sandbox;
pub mod secrets;

pub use dns::{ResolveError, Resolver, StaticResolver, SystemResolver, UpstreamResolver};
pub use policy::{Floor, FloorHit, NetworkPolicy, PolicyError};
pub use sandbox::{Limits, SandboxNet, SandboxNetConfig};
