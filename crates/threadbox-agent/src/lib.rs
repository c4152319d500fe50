//! The pure parts of the agent that tests and fuzzers exercise directly; the agent binary
//! (`main.rs`) uses them too.
#![forbid(unsafe_code)]

pub mod path;
