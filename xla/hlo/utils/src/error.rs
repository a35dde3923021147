//! Errors of the sharding algebra: malformed shardings read from the IR and
//! requests that do not fit a shape or a mesh.
//!
//! Invariant: every fallible public function of this crate returns
//! `ShardingError`; nothing panics on malformed input.

use thiserror::Error;

/// A sharding, mesh or request that the algebra cannot handle.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ShardingError {
    /// The sharding is malformed (device counts, permutations, ranks).
    #[error("invalid sharding: {0}")]
    Invalid(String),
    /// The sharding does not fit the shape it is applied to.
    #[error("sharding does not fit shape: {0}")]
    ShapeMismatch(String),
    /// A named mesh or partition spec is malformed.
    #[error("invalid mesh or partition spec: {0}")]
    Mesh(String),
    /// Devices that should hold the same data do not.
    #[error("{0}")]
    Disagreement(String),
    /// The operation is not defined for this kind of sharding.
    #[error("unsupported: {0}")]
    Unsupported(String),
}
