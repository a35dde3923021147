//! The CUDA backend's planner (pure CPU code, no cudarc): turns the entry
//! computation into a list of steps over device buffers:
//!
//! * `Fused` kernels: trees of elementwise ops, broadcasts, reshapes,
//!   transposes, slices, iotas, converts and reductions ([`Node`]) that one
//!   generated CUDA kernel evaluates per output element (row-major linear
//!   index; see `codegen.rs`);
//! * `Dot`s for cuBLAS, with operands transposed (by planned fused kernels)
//!   into `[batch, m, k]` x `[batch, k, n]` row-major;
//! * parameters and non-scalar constants (uploads).
//!
//! Tuples and get-tuple-element are resolved here, at plan time.
//!
//! Invariant: [`Node::eval`] is the CPU meaning of the kernel `codegen.rs`
//! generates from the same tree (same index math, same per-node rounding), so
//! [`run_plan_on_cpu`] checks the plan's semantics against the interpreter
//! on any machine.
//!
//! Submodules, each using only those listed before it: `types` (the plan:
//! buffers, steps, expression trees), `support` (which opcodes and types
//! the backend runs), `opcodes` (HLO opcodes as kernel ops, which ones
//! fuse), `eval` (the CPU meaning of the plan), `planner` (from the entry
//! computation to the plan: what is materialized, fused trees, dots).

mod eval;
mod opcodes;
mod planner;
mod support;
mod types;

pub use eval::{apply_bin, coords, int_range, linear, round_to, run_plan_on_cpu};
pub use planner::{c_ident, plan_module};
pub use support::{
    check_supported, is_sharding_annotation, supported_instruction, supported_opcode,
    supported_type,
};
pub use types::{
    BinOp, BufId, BufferInfo, CmpDir, DotStep, Expr, FusedKernel, Node, Plan, Step, UnOp, ValRef,
};
