//! Errors of the SPMD partitioner.
//!
//! Invariant: every fallible function of this crate returns `SpmdError`;
//! nothing panics on malformed input (bad shardings, unsupported ops).

use thiserror::Error;

/// Why partitioning (or running a partitioned module) failed.
#[derive(Debug, Error)]
pub enum SpmdError {
    /// A sharding is malformed or does not fit its shape / device count.
    #[error("bad sharding on %{instruction}: {message}")]
    Sharding {
        instruction: String,
        message: String,
    },
    /// The module is malformed in a way the verifier would reject.
    #[error("invalid module: {0}")]
    Invalid(String),
    /// A case this partitioner does not handle.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl From<xla_hlo_utils::ShardingError> for SpmdError {
    fn from(e: xla_hlo_utils::ShardingError) -> SpmdError {
        SpmdError::Sharding {
            instruction: String::new(),
            message: e.to_string(),
        }
    }
}

pub(crate) fn unsupported<T>(msg: impl Into<String>) -> Result<T, SpmdError> {
    Err(SpmdError::Unsupported(msg.into()))
}

pub(crate) fn invalid<T>(msg: impl Into<String>) -> Result<T, SpmdError> {
    Err(SpmdError::Invalid(msg.into()))
}
