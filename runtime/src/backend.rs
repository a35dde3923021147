//! The backend interface: compile once, execute per device.
//!
//! Invariant: `Executable::execute` takes this device's (local) arguments
//! in entry-parameter order and returns the root's value with a tuple root
//! split into its elements.

use xla_hlo_evaluator::{DeviceCommunicator, EvalError, Value};
use xla_hlo_ir::HloModule;

/// What can go wrong compiling or running a module.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("module does not compile for the {backend} backend: {message}")]
    Compile {
        backend: &'static str,
        message: String,
    },
    #[error(transparent)]
    Execute(#[from] EvalError),
    #[error("{backend} device: {message}")]
    Device {
        backend: &'static str,
        message: String,
    },
    #[error("sharding: {0}")]
    Sharding(String),
    #[error("devices: {0}")]
    Devices(String),
    #[error("multi-process run: {0}")]
    Distributed(String),
}

/// Where one device runs: its ids and, on several devices, its endpoint
/// for collectives.
#[derive(Clone, Copy)]
pub struct DeviceContext<'a> {
    pub replica_id: i64,
    pub partition_id: i64,
    pub num_replicas: i64,
    pub num_partitions: i64,
    pub communicator: Option<&'a DeviceCommunicator>,
}

impl DeviceContext<'_> {
    /// A single device: replica 0, partition 0 of 1 x 1, no communicator.
    pub fn single() -> DeviceContext<'static> {
        DeviceContext {
            replica_id: 0,
            partition_id: 0,
            num_replicas: 1,
            num_partitions: 1,
            communicator: None,
        }
    }
}

/// A compiled module, runnable on any device of its program.
pub trait Executable: Send + Sync {
    /// The module it was compiled from.
    fn module(&self) -> &HloModule;

    /// Runs the module on one device with that device's arguments.
    fn execute(
        &self,
        device: &DeviceContext<'_>,
        args: &[Value],
    ) -> Result<Vec<Value>, RuntimeError>;
}

/// A compiler from HLO modules to executables.
pub trait Backend: Send + Sync {
    /// `"cpu"`, `"cuda"`.
    fn name(&self) -> &'static str;

    /// Checks and prepares `module` for execution.
    fn compile(&self, module: &HloModule) -> Result<Box<dyn Executable>, RuntimeError>;
}
