//! The runtime: compile an HLO module for a backend, then execute it on one
//! device or on N devices at once.
//!
//! * [`Backend`] / [`Executable`]: `compile(module)` checks the module once
//!   (the verifier, backend support) and returns an executable; `execute`
//!   runs it for one device given that device's arguments and, for
//!   multi-device programs, its communicator.
//! * [`cpu::CpuBackend`]: the reference interpreter as a backend.
//! * [`cuda`]: the CUDA backend: planner and kernel generator (CPU code,
//!   always built) and, with the `cuda` feature, `cuda::CudaBackend`.
//! * [`launcher`]: runs one SPMD executable on N loopback devices (one thread
//!   each, collectives through `collectives::LoopbackWorld`), splitting
//!   global arguments by the entry parameters' shardings (uneven tiles padded
//!   with zeros, as XLA pads them) and assembling global results by the
//!   result sharding.
//!
//! Invariants: the runtime never panics on bad modules, arguments or
//! shardings (every failure is a [`RuntimeError`] naming what is wrong); a
//! device that fails makes the others fail promptly instead of waiting for
//! the collective timeout; device ids are `replica * num_partitions +
//! partition`.

pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod launcher;

pub use backend::{Backend, DeviceContext, Executable, RuntimeError};
pub use cpu::CpuBackend;
pub use launcher::{run_spmd, LaunchPlan};
