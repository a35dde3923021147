//! Typed errors of the interpreter.
//!
//! Invariant: every error names what went wrong in terms a user can act on
//! (the instruction, the parameter, the opcode or the element type); the
//! interpreter returns these instead of panicking on any input.

use xla_hlo_ir::{Opcode, PrimitiveType};

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("unsupported opcode `{opcode}` (instruction %{instruction})")]
    UnsupportedOpcode { opcode: Opcode, instruction: String },
    #[error("unsupported element type {0}")]
    UnsupportedType(PrimitiveType),
    #[error("unsupported custom-call target \"{target}\" (instruction %{instruction})")]
    UnsupportedCustomCall { target: String, instruction: String },
    #[error("entry computation takes {expected} parameters but {got} arguments were given")]
    ArgumentCount { expected: usize, got: usize },
    #[error(
        "argument {index} (parameter %{name}) has shape {got} but the parameter is {expected}"
    )]
    ArgumentShape {
        index: usize,
        name: String,
        expected: String,
        got: String,
    },
    #[error("instruction %{instruction} ({opcode}): {message}")]
    Instruction {
        instruction: String,
        opcode: Opcode,
        message: String,
    },
    #[error("collective %{instruction}: {message}")]
    Collective {
        instruction: String,
        /// The failure is another device's (it failed or never arrived),
        /// reported here because this device waited for it.
        peer_failed: bool,
        message: String,
    },
    /// A result (or an argument) would not fit in the memory limit.
    #[error("{}", crate::memory::out_of_memory_message(what, shape, *needed, *limit))]
    OutOfMemory {
        /// `instruction %name` or `parameter 0 (%name)`.
        what: String,
        shape: String,
        /// `None` when the size overflows 64 bits.
        needed: Option<u64>,
        limit: u64,
    },
    #[error("{0}")]
    Invalid(String),
    #[error("internal error: {0}")]
    Internal(String),
    #[error("{0}")]
    Io(String),
}

impl EvalError {
    pub fn invalid(msg: impl Into<String>) -> EvalError {
        EvalError::Invalid(msg.into())
    }
}

/// Shorthand for a plain message error inside op implementations; the
/// interpreter wraps it with the instruction's name.
pub fn bad<T>(msg: impl Into<String>) -> Result<T, EvalError> {
    Err(EvalError::Invalid(msg.into()))
}
