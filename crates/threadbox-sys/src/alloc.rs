//! The agent's global allocator (ADR 0199): the system allocator, except that freed
//! blocks aligned to 128 bytes or more (tokio's event-loop registrations) stay allocated
//! until 4096 later ones have been freed, so an epoll event that gVisor delivers for a
//! registration removed before a checkpoint lands on memory that is still tokio's.
//! Use as `#[global_allocator] static A: Quarantine = Quarantine::new();`.

pub use crate::raw::alloc::QuarantineAlloc as Quarantine;
