//! The runtime's failures: [`RuntimeError`], and [`first_failure`], which
//! picks the root cause among N devices' outcomes.
//!
//! Invariant: a failure that only echoes another device's (a peer that
//! failed or was lost at a collective) says so (`is_peer_echo`), so the
//! root cause is reported rather than its echo.

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
