//! Errors of the collectives crate.
//!
//! Invariants: every error is `Clone` (a rendezvous hands the same error to
//! every waiting rank), and every error that concerns a collective call names
//! the call ([`CallSite`]: kind, group, sequence number) so a message read on
//! any rank says which collective failed and which devices were at fault.

use crate::groups::DeviceId;
use std::fmt;
use std::time::Duration;

/// Result alias of this crate.
pub type Result<T, E = CollectiveError> = std::result::Result<T, E>;

/// The collective operations, as XLA names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveKind {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    CollectivePermute,
    CollectiveBroadcast,
    Send,
    Recv,
    Barrier,
}

impl CollectiveKind {
    /// The HLO opcode spelling (`all-reduce`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all-reduce",
            CollectiveKind::AllGather => "all-gather",
            CollectiveKind::ReduceScatter => "reduce-scatter",
            CollectiveKind::AllToAll => "all-to-all",
            CollectiveKind::CollectivePermute => "collective-permute",
            CollectiveKind::CollectiveBroadcast => "collective-broadcast",
            CollectiveKind::Send => "send",
            CollectiveKind::Recv => "recv",
            CollectiveKind::Barrier => "barrier",
        }
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which collective call an error is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallSite {
    pub kind: CollectiveKind,
    /// The participating devices in rank order (for send/recv: the two peers).
    pub group: Vec<DeviceId>,
    /// How many calls on this group came before this one (0-based).
    pub sequence: u64,
}

impl fmt::Display for CallSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} #{} over devices {:?}",
            self.kind, self.sequence, self.group
        )
    }
}

/// Errors of the key-value stores.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("key-value store: timed out after {waited:?} waiting for key {key:?}")]
    Timeout { key: String, waited: Duration },
    #[error("key-value store I/O error: {0}")]
    Io(String),
    #[error("key-value store protocol error: {0}")]
    Protocol(String),
    #[error("key-value store: invalid argument: {0}")]
    InvalidArgument(String),
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        StoreError::Io(e.to_string())
    }
}

/// Errors of collective operations and of bootstrap.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CollectiveError {
    /// Some ranks did not arrive (or did not finish) within the timeout.
    #[error("{call}: timed out after {waited:?} waiting for devices {missing:?} (ranks {missing_ranks:?} of the group) to {stage}")]
    Timeout {
        call: CallSite,
        missing: Vec<DeviceId>,
        missing_ranks: Vec<usize>,
        stage: &'static str,
        waited: Duration,
    },
    /// The ranks disagree about the call (shapes, types, parameters, kind).
    #[error("{call}: ranks disagree: {detail}")]
    Mismatch { call: CallSite, detail: String },
    /// A participant failed (aborted, panicked, dropped its communicator).
    #[error("{call}: device {device} failed: {reason}")]
    PeerFailed {
        call: CallSite,
        device: DeviceId,
        reason: String,
    },
    /// A peer's connection broke or went silent (its process died or hung);
    /// `device` is the lost device, `reason` what the transport saw.
    #[error("device {device} is unreachable: {reason}")]
    PeerLost { device: DeviceId, reason: String },
    /// A bad argument from this rank's caller (no other rank was involved).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Replica groups, group mode or source-target pairs that XLA rejects.
    #[error("invalid replica groups: {0}")]
    InvalidGroups(String),
    /// A reduction or element type this operation does not support.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Bootstrap through the key-value store failed.
    #[error("bootstrap: {0}")]
    Store(#[from] StoreError),
    /// A bootstrap step other than a store access failed.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// The backend cannot run here (e.g. libnccl or libcuda not found).
    #[error("backend unavailable: {0}")]
    BackendUnavailable(String),
    /// The backend (NCCL, CUDA) reported an error.
    #[error("backend error: {0}")]
    Backend(String),
}
