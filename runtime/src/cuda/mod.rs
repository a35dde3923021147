//! The CUDA backend (issue 21), in layers:
//!
//! * [`plan`] (pure CPU, always built): which opcodes and element types the
//!   backend supports ([`plan::check_supported`] names every unsupported
//!   instruction at compile time) and the planner: fused kernels, cuBLAS
//!   dots, host-driven control flow, host steps for collectives.
//! * [`codegen`] (pure CPU, always built): CUDA C source of the kernels,
//!   which also builds with the host C++ compiler.
//! * [`exec`]: the one executor of a plan, generic over a `Machine` (where
//!   buffers live and kernels run).
//! * [`hostexec`]: the `cuda-host` backend: the generated kernels built by
//!   the host C++ compiler and run by the executor on host memory, so the
//!   whole backend (kernels, control flow, collectives through the
//!   launcher's loopback devices) is tested against XLA without a GPU.
//! * `device` (cargo feature `cuda`): [`CudaBackend`] through cudarc (dynamic
//!   loading: building needs no CUDA; missing libraries are a typed error,
//!   never a panic): NVRTC for the kernels, cuBLAS for dots, collectives
//!   through the device's communicator. Without the feature,
//!   [`CudaBackend::new`] returns an error saying so.
//!
//! Not supported (rejected at compile with the instruction names):
//! rng-bit-generator, cholesky / triangular-solve, sub-byte types and the f8
//! types other than e5m2 and e4m3fn, and custom-calls other than sharding
//! annotations, TopK and shard_map's boundary.

pub mod codegen;
pub mod exec;
pub mod hostexec;
pub mod plan;

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
pub use device::{probe, CudaBackend};

use crate::error::RuntimeError;
use xla_hlo_ir::HloModule;

/// The CPU half of compiling for CUDA: verifies the module, checks every
/// opcode and type, plans it and generates the kernels' CUDA source.
pub fn prepare(module: &HloModule) -> Result<(plan::Plan, String), RuntimeError> {
    xla_hlo_verifier::verify(module).map_err(|e| RuntimeError::Compile {
        backend: "cuda",
        message: format!("the module does not verify:\n{e}"),
    })?;
    let p = plan::plan_module(module)?;
    let src = codegen::module_source(&p);
    Ok((p, src))
}

#[cfg(not(feature = "cuda"))]
const NOT_BUILT: &str = "this build has no CUDA backend: rebuild with `--features cuda` \
     (cargo build --release -p run-hlo-module --features cuda)";

/// Without the `cuda` feature: a backend that cannot be created.
#[cfg(not(feature = "cuda"))]
#[derive(Debug)]
pub struct CudaBackend(());

#[cfg(not(feature = "cuda"))]
impl CudaBackend {
    pub fn new(_ordinal: usize) -> Result<CudaBackend, RuntimeError> {
        Err(RuntimeError::Devices(NOT_BUILT.into()))
    }

    pub fn all() -> Result<CudaBackend, RuntimeError> {
        Err(RuntimeError::Devices(NOT_BUILT.into()))
    }
}

/// Never reached: without the feature no `CudaBackend` can be created.
#[cfg(not(feature = "cuda"))]
impl crate::backend::Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn compile(
        &self,
        _module: &HloModule,
    ) -> Result<Box<dyn crate::backend::Executable>, RuntimeError> {
        Err(RuntimeError::Devices(NOT_BUILT.into()))
    }
}

#[cfg(test)]
mod tests;
