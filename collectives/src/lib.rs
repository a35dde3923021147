//! XLA's collective operations for a Rust re-implementation of OpenXLA.
//!
//! * [`communicator::Communicator`]: the interface an interpreter calls, one
//!   endpoint per device: all-reduce (add, multiply, min, max, and, or, on
//!   every integer, float and pred type), all-gather and reduce-scatter along
//!   any dimension, all-to-all (array and tuple forms), collective-permute,
//!   collective-broadcast, send/recv, barrier.
//! * [`groups`]: XLA's replica-group modes (cross-replica, cross-partition,
//!   cross-replica-and-partition, flattened ids) mapped to groups of global
//!   device ids.
//! * [`hlo`]: from a collective instruction's attributes to the call, for
//!   interpreters.
//! * [`loopback`]: N devices as threads of one process, pure Rust, with
//!   timeouts and failure propagation.
//! * [`staged`]: the same interface over any library offering NCCL's
//!   primitives (native world collectives, grouped send/recv), with call
//!   agreement and host-side fallbacks; tested on the CPU with threads.
//! * `nccl` (cargo feature `nccl`): the staged layer over NCCL through
//!   cudarc, one communicator per GPU, on a dedicated stream.
//! * [`store`] and [`bootstrap`]: key-value stores (in-memory, file, TCP)
//!   and the unique-id exchange NCCL needs; the loopback backend joins
//!   through the same code.
//! * [`tcp`]: the same primitives over TCP sockets between processes (the
//!   CPU fallback for multi-process runs), bitwise equal to loopback.
//! * [`reference`]: single-threaded element-by-element semantics, the
//!   specification the backends are tested against.
//!
//! Invariant of the whole crate: bad input, missing or failing ranks and
//! missing libraries are reported as [`CollectiveError`]s, never as panics
//! or hangs.

// Index loops mirror the per-rank formulas of XLA's collective semantics.
#![allow(clippy::needless_range_loop)]

pub mod bootstrap;
pub mod buffer;
pub mod communicator;
pub mod error;
pub mod groups;
pub mod hlo;
pub mod layout;
pub mod loopback;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod reduce;
pub mod reference;
pub mod staged;
pub mod store;
pub mod tcp;

pub use buffer::{DeviceBuffer, Element, HostBytes};
pub use communicator::Communicator;
pub use error::{CallSite, CollectiveError, CollectiveKind, Result, StoreError};
pub use groups::{DeviceId, GroupMode, ParticipantGroups, PermutePlan, Topology};
pub use loopback::{run_world, DeviceOutcome, InjectedFault, LoopbackCommunicator, LoopbackWorld};
pub use reduce::ReductionKind;
pub use staged::{StagedCommunicator, ThreadTransport, Transport};
pub use store::{FileStore, InMemoryStore, KeyValueStore, TcpStore, TcpStoreServer};
pub use tcp::{TcpConfig, TcpTransport};
