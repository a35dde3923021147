//! The CPU backend: the reference interpreter. Compiling verifies the module
//! (so structural errors surface before any device starts); executing
//! interprets it with the device's ids and communicator.
//!
//! Invariant: a compiled module has passed `xla_hlo_verifier::verify`.

use crate::backend::{Backend, DeviceContext, Executable, RuntimeError};
use xla_hlo_evaluator::{evaluate, EvalContext, Value};
use xla_hlo_ir::HloModule;

/// The interpreter as a backend.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend;

struct CpuExecutable {
    module: HloModule,
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn compile(&self, module: &HloModule) -> Result<Box<dyn Executable>, RuntimeError> {
        xla_hlo_verifier::verify(module).map_err(|e| RuntimeError::Compile {
            backend: "cpu",
            message: format!("the module does not verify:\n{e}"),
        })?;
        Ok(Box::new(CpuExecutable {
            module: module.clone(),
        }))
    }
}

impl Executable for CpuExecutable {
    fn module(&self) -> &HloModule {
        &self.module
    }

    fn execute(
        &self,
        device: &DeviceContext<'_>,
        args: &[Value],
    ) -> Result<Vec<Value>, RuntimeError> {
        let ctx = EvalContext {
            partition_id: device.partition_id,
            replica_id: device.replica_id,
            num_partitions: Some(device.num_partitions),
            num_replicas: Some(device.num_replicas),
            collectives: device.communicator,
            memory_limit: None,
        };
        Ok(evaluate(&self.module, args, &ctx)?)
    }
}
