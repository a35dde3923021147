//! The backend interface: compile once, execute per device, in the
//! runtime's own types ([`Literal`] values, [`RuntimeError`] failures,
//! `collectives` communicators); each backend converts to its own
//! representation behind it.
//!
//! Invariant: `Executable::execute` takes this device's (local) arguments
//! in entry-parameter order and returns the root's value with a tuple root
//! split into its elements.

use crate::literal::Literal;
use std::sync::Mutex;
use xla_hlo_ir::HloModule;

/// A device's endpoint for collectives (issued one at a time, in program
/// order).
pub type DeviceCommunicator = Mutex<dyn collectives::Communicator>;

/// What can go wrong compiling or running a module.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("module does not compile for the {backend} backend: {message}")]
    Compile {
        backend: &'static str,
        message: String,
    },
    /// The program failed on a device (the backend's message as it stands).
    /// `peer_failed`: the failure only echoes another device's (a peer
    /// that failed or was lost at a collective).
    #[error("{message}")]
    Execute {
        backend: &'static str,
        message: String,
        peer_failed: bool,
    },
    #[error("{backend} device: {message}")]
    Device {
        backend: &'static str,
        message: String,
    },
    #[error("arguments: {0}")]
    Arguments(String),
    #[error("sharding: {0}")]
    Sharding(String),
    #[error("devices: {0}")]
    Devices(String),
    #[error("multi-process run: {0}")]
    Distributed(String),
}

impl RuntimeError {
    /// Whether this failure only echoes another device's.
    pub fn is_peer_echo(&self) -> bool {
        matches!(
            self,
            RuntimeError::Execute {
                peer_failed: true,
                ..
            }
        )
    }
}

/// The root cause among devices' outcomes: every device's value when all
/// succeeded, else the first failure that is not an echo of another
/// device's (or the first failure when all are echoes).
pub fn first_failure<T>(
    outcomes: Vec<collectives::DeviceOutcome<T, RuntimeError>>,
) -> Result<Vec<T>, RuntimeError> {
    let mut out = Vec::with_capacity(outcomes.len());
    let mut first_err: Option<RuntimeError> = None;
    for (device, outcome) in outcomes.into_iter().enumerate() {
        let e = match outcome {
            collectives::DeviceOutcome::Done(v) => {
                out.push(v);
                continue;
            }
            collectives::DeviceOutcome::Failed(e) => e,
            collectives::DeviceOutcome::Panicked(m) => {
                RuntimeError::Devices(format!("device {device} panicked: {m}"))
            }
        };
        if first_err
            .as_ref()
            .is_none_or(|f| f.is_peer_echo() && !e.is_peer_echo())
        {
            first_err = Some(e);
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
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
