//! The CUDA backend's planner (pure CPU code, no cudarc): turns a module
//! into a plan of steps over device buffers, one step list per computation
//! the entry reaches:
//!
//! * kernels: trees of elementwise ops, broadcasts, reshapes, transposes,
//!   slices, gathers, converts, reductions, windows, dots and convolutions
//!   ([`Node`]) that one generated kernel evaluates per output element, and
//!   the sort, scatter and select-and-scatter kernels (see `codegen.rs`);
//! * dots of float types for cuBLAS, with operands transposed (by planned
//!   kernels) into `[batch, m, k]` x `[batch, k, n]` row-major;
//! * constants, device ids, host-driven while / conditional / call, and
//!   host steps for collectives and shard_map's boundary.
//!
//! Tuples and get-tuple-element are resolved here, at plan time.
//!
//! Submodules, each using only those listed before it: `types` (the plan:
//! buffers, steps, expression trees), `opcodes` (HLO opcodes as kernel ops,
//! which ones fuse), `support` (which opcodes and types the backend runs),
//! `planner` (from the module to the plan).

mod opcodes;
mod planner;
mod support;
mod types;

pub use planner::{c_ident, plan_module};
pub use support::{
    check_supported, is_sharding_annotation, supported_instruction, supported_opcode,
    supported_type,
};
pub use types::{
    BinOp, BufId, BufferInfo, CmpDir, CompPlan, DotStep, Expr, FftKind, HostKind, Kernel,
    KernelBody, Node, Plan, ScalarComp, Step, UnOp, ValRef,
};
