//! The crate's errors: each says what was being done and to what.

/// What went wrong in a pull, an import or an unpack.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The caller's input (a reference, a platform, an archive) is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// The registry or archive does not have what was asked for.
    #[error("{0}")]
    NotFound(String),
    /// The registry refused the credentials (or asked for some and none were given).
    #[error("{0}")]
    Unauthorized(String),
    /// What arrived is not what was promised: a digest or size mismatch, a truncated
    /// stream. Nothing of it is kept.
    #[error("{0}")]
    Integrity(String),
    /// A layer holds something the unpacker refuses to write (a path out of the layer).
    #[error("layer {layer}: {what}")]
    Hostile { layer: String, what: String },
    /// The registry answered something this client does not understand, or failed.
    #[error("{0}")]
    Registry(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl OciError {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> OciError {
        OciError::Io {
            what: what.into(),
            source,
        }
    }
}

pub type Result<T, E = OciError> = std::result::Result<T, E>;
