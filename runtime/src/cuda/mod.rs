//! The CUDA backend (issue 8), in layers:
//!
//! * [`plan`] (pure CPU, always built): which opcodes and element types the
//!   backend supports ([`plan::check_supported`] names every unsupported
//!   instruction at compile time), and the planner that groups elementwise
//!   chains, broadcasts, reshapes, transposes, slices, iotas, concatenates,
//!   pads, reverses, dynamic slices/updates and reductions
//!   into fused kernels, and dots into cuBLAS calls. [`plan::run_plan_on_cpu`]
//!   runs a plan with the kernels' semantics, so plans are checked against
//!   the interpreter without a GPU.
//! * [`codegen`] (pure CPU, always built): CUDA C source of the fused kernels.
//! * `device` (cargo feature `cuda`): [`CudaBackend`] through cudarc (dynamic
//!   loading: building needs no CUDA; missing libraries are a typed error,
//!   never a panic): NVRTC for the kernels, cuBLAS for dots, device buffers
//!   and host transfers. Without the feature, [`CudaBackend::new`] returns
//!   an error saying so.
//!
//! Not supported yet (rejected at compile with the instruction names):
//! while/conditional/call, collectives, gather/scatter, reduce-window,
//! convolution, sort/topk, erf/atan2/round/shifts, f16/f8/complex types,
//! variadic reduce, integer dots.

pub mod codegen;
pub mod host;
pub mod hostcheck;
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
