//! HLO text parser. Reads the modules XLA prints (`--xla_dump_to`, hlo-opt,
//! HLO tests): header attributes, stack-frame index, computations with or
//! without signatures, instructions with or without shapes, every attribute,
//! sharding and replica-group syntax, and async sugar (`reduce-scatter-start`).
//!
//! Invariants: `parse_module` never panics and always terminates, whatever
//! the bytes; every error has a 1-based line:column, the offending source line
//! and what was expected.

mod cursor;
mod error;
pub mod locate;
mod parser;

pub use error::ParseError;
pub use parser::{parse_module, parse_replica_groups, parse_shape, parse_sharding};
