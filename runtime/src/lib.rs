//! The runtime: compile an HLO module for a backend, then execute it on one
//! device or on N devices at once.
//!
//! * [`Backend`] / [`Executable`]: `compile(module)` checks the module once
//!   (the verifier, backend support) and returns an executable; `execute`
//!   runs it for one device given that device's arguments and, for
//!   multi-device programs, its communicator. The interface is the
//!   runtime's own: [`Literal`] values (host bytes), [`RuntimeError`].
//! * [`error`]: [`RuntimeError`] and picking the root cause among
//!   devices' failures.
//! * [`literal`]: host literals, and splitting/assembling them by a
//!   sharding.
//! * [`cpu::CpuBackend`]: the reference interpreter as a backend.
//! * [`cuda`]: the CUDA backend: planner and kernel generator (CPU code,
//!   always built) and, with the `cuda` feature, `cuda::CudaBackend`.
//! * [`launcher`]: runs one SPMD executable on N loopback devices (one thread
//!   each, collectives through `collectives::LoopbackWorld`), splitting
//!   global arguments by the entry parameters' shardings (uneven tiles padded
//!   with zeros, as XLA pads them) and assembling global results by the
//!   result sharding.
//! * [`pipeline`]: a pipelined program (`xla_mpmd`) run by a task table
//!   (GPipe, 1F1B, interleaved) on loopback devices, one stage per device
//!   (or `v` interleaved), values sent between them.
//! * [`distributed`]: the same across processes (each owning N/P devices),
//!   bootstrapped through a TCP key-value store, collectives over TCP.
//!
//! Invariants: the runtime never panics on bad modules, arguments or
//! shardings (every failure is a [`RuntimeError`] naming what is wrong); a
//! device that fails makes the others fail promptly instead of waiting for
//! the collective timeout; device ids are `replica * num_partitions +
//! partition`.

pub mod backend;
pub mod cpu;
pub mod cuda;
pub mod distributed;
pub mod error;
pub mod launcher;
pub mod literal;
pub mod pipeline;

pub use backend::{Backend, DeviceCommunicator, DeviceContext, Executable};
pub use cpu::CpuBackend;
pub use distributed::{run_spmd_processes, CollectivesTransport, ProcessGroup};
pub use error::{first_failure, RuntimeError};
pub use launcher::{run_spmd, LaunchPlan};
pub use literal::Literal;

/// The backend named `name` (`cpu`, `cuda` or `cuda-host`, as
/// `run_hlo_module --backend` takes it). `cuda` drives every visible GPU
/// (launcher device `d` on GPU `d % count`) and fails with what is missing
/// when this build has no CUDA backend or no GPU and driver libraries are
/// present; `cuda-host` runs the CUDA backend's plans and generated kernels
/// on the host (built by the host C++ compiler).
pub fn backend(name: &str) -> Result<Box<dyn Backend>, RuntimeError> {
    match name {
        "cpu" => Ok(Box::new(CpuBackend)),
        "cuda" => Ok(Box::new(cuda::CudaBackend::all()?)),
        "cuda-host" => Ok(Box::new(cuda::hostexec::CudaHostBackend)),
        other => Err(RuntimeError::Devices(format!(
            "unknown backend {other:?}: expected `cpu`, `cuda` or `cuda-host`"
        ))),
    }
}
