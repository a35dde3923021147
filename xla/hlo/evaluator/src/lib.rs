//! Reference HLO interpreter: evaluates every opcode of an `HloModule` on
//! the CPU with XLA's semantics. It is the oracle that checks partitioning
//! and scheduling passes (run a module before and after, compare), and the
//! per-device runtime of the loopback multi-device runtime (collectives go
//! through a `collectives::Communicator`).
//!
//! Invariants: evaluation never panics on malformed modules or inputs; every
//! failure is an `EvalError` naming the instruction, parameter, opcode or
//! type involved. Values are typed dense arrays (`Value`, `Array`, `Data`).

pub mod collective;
pub mod compare;
pub mod complex;
pub mod data;
pub mod dot;
pub mod elementwise;
pub mod error;
pub mod fastmath;
pub mod fused;
pub mod index;
pub mod interp;
pub mod linalg;
pub mod memory;
pub mod npy;
pub mod reduce;
pub mod rng;
pub mod value;

pub use collective::{
    evaluate_on_devices, evaluate_spmd, first_failure, needs_spmd, DeviceCommunicator,
    LOOPBACK_TIMEOUT,
};
pub use error::EvalError;
pub use interp::{evaluate, evaluate_value, EvalContext, Evaluator};
pub use value::{Array, Data, Value};
