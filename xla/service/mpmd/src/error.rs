//! Errors of the MPMD pass: each names the instruction (and computation)
//! that makes the program impossible to pipeline, and what was expected.

use std::fmt;

#[derive(Debug, Clone, PartialEq)]
pub enum MpmdError {
    /// The program has no loop to pipeline, or the loop is not a counted
    /// loop over microbatches.
    Loop(String),
    /// Stage markers that do not cut the loop body into a chain of stages.
    Stages(String),
    /// Options that do not fit the program (stage count, schedule).
    Options(String),
    /// Something this pass does not support, with the instruction.
    Unsupported(String),
}

impl fmt::Display for MpmdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MpmdError::Loop(m) => write!(f, "pipeline: microbatch loop: {m}"),
            MpmdError::Stages(m) => write!(f, "pipeline: stages: {m}"),
            MpmdError::Options(m) => write!(f, "pipeline: options: {m}"),
            MpmdError::Unsupported(m) => write!(f, "pipeline: unsupported: {m}"),
        }
    }
}

impl std::error::Error for MpmdError {}
