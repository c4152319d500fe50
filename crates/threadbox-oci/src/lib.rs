//! OCI images for threadbox (issue 14, ADRs 0105–0109): a client of the OCI distribution
//! protocol ([`registry`]), a store of digest-verified blobs and unpacked layers
//! ([`store`]), the safe layer unpacker ([`unpack`]), the manifest and config types
//! ([`manifest`]), image references ([`reference`]) and imports of `docker save` archives
//! and OCI layouts ([`archive`]). No unsafe code: system calls go through threadbox-sys.
#![forbid(unsafe_code)]

pub mod archive;
pub mod digest;
pub mod error;
pub mod layout;
pub mod manifest;
pub mod pull;
pub mod reference;
pub mod registry;
pub mod store;
pub mod unpack;

pub use digest::Digest;
pub use error::{OciError, Result};
