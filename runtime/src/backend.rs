//! The backend interface: compile once, execute per device, in the
//! runtime's own types ([`Literal`] values, [`RuntimeError`] failures,
//! `collectives` communicators); each backend converts to its own
//! representation behind it.
//!
//! Invariant: `Executable::execute` takes this device's (local) arguments
//! in entry-parameter order and returns the root's value with a tuple root
//! split into its elements.

use crate::error::RuntimeError;
use crate::literal::Literal;
use std::sync::Mutex;
use xla_hlo_ir::HloModule;

/// A device's endpoint for collectives (issued one at a time, in program
/// order).
pub type DeviceCommunicator = Mutex<dyn collectives::Communicator>;

/// Where one device runs: its ids and, on several devices, its endpoint
/// for collectives.
#[derive(Clone, Copy)]
pub struct DeviceContext<'a> {
    pub replica_id: i64,
    pub partition_id: i64,
    pub num_replicas: i64,
    pub num_partitions: i64,
    pub communicator: Option<&'a DeviceCommunicator>,
    /// Consistent mode: reductions in the order of
    /// `xla_hlo_utils::reduction_order` (see `EvalContext::consistent`); a
    /// backend that cannot honour it refuses to execute.
    pub consistent: bool,
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
            consistent: false,
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
        args: &[Literal],
    ) -> Result<Vec<Literal>, RuntimeError>;
}

/// A compiler from HLO modules to executables.
pub trait Backend: Send + Sync {
    /// `"cpu"`, `"cuda"`.
    fn name(&self) -> &'static str;

    /// Checks and prepares `module` for execution.
    fn compile(&self, module: &HloModule) -> Result<Box<dyn Executable>, RuntimeError>;
}
