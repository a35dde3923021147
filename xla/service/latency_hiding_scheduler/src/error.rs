//! Typed errors of the scheduler crate.
//!
//! Invariant: every failure the library can report on bad input (a bad
//! cost-model spelling, an unreadable or malformed cost table, a memory
//! limit no schedule meets, a module the scheduler cannot order) is one of
//! these variants; nothing panics instead.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SchedulerError {
    #[error("unknown cost model '{0}' (expected approximate, analytical, analytical:h100, analytical:h200 or table:PATH)")]
    BadCostModel(String),
    #[error("cost table {path}{}: {message}", if *line > 0 { format!(":{line}") } else { String::new() })]
    CostTable {
        path: String,
        line: usize,
        message: String,
    },
    #[error("memory limit of {limit} bytes cannot be met: the best schedule found peaks at {peak} bytes")]
    MemoryLimit { limit: u64, peak: u64 },
    #[error("computation %{computation} has a dependency cycle through %{instruction}")]
    Cycle {
        computation: String,
        instruction: String,
    },
    #[error("computation %{computation}: {message}")]
    Malformed {
        computation: String,
        message: String,
    },
    #[error("cannot write {path}: {message}")]
    Io { path: String, message: String },
}
