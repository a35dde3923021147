//! Loopback backend: N devices as threads of one process, pure Rust.
//!
//! All communicators of a [`LoopbackWorld`] share one rendezvous table
//! (`Mutex` + `Condvar`). A collective call is a *slot* keyed by (group,
//! sequence number of the call on that group): each member deposits its
//! operands (reference-counted, never copied), the last one to arrive builds
//! the work, then every member does its share of it in parallel:
//! * all-reduce: rank r folds the r-th 1/N of every operand into a shared
//!   output (the reduce-scatter half), and all members then hold the same
//!   immutable result (the all-gather half costs nothing);
//! * all-gather: rank r writes its operand into its slots of a shared output;
//! * reduce-scatter, all-to-all: rank r builds its own result, reading the
//!   others' operands in place;
//! * collective-permute, collective-broadcast, tuple all-to-all: results are
//!   the other ranks' operands themselves (zero copies); non-targets of a
//!   permute get zeros.
//!
//! Failure handling (no hang, no panic):
//! * a member missing at arrival or at the finish barrier past the timeout
//!   makes the slot fail with
//!   [`CollectiveError::Timeout`](crate::CollectiveError::Timeout) naming
//!   the missing devices; every waiting member returns that error, and a
//!   late member finds it too (failed slots stay as tombstones without
//!   data);
//! * members that disagree about kind, parameters or shapes get
//!   [`CollectiveError::Mismatch`](crate::CollectiveError::Mismatch);
//! * a member that panics while doing its share, calls
//!   [`LoopbackCommunicator::abort`], or drops its communicator marks every
//!   pending and future call involving it as failed
//!   ([`CollectiveError::PeerFailed`](crate::CollectiveError::PeerFailed)).
//!
//! Invariants: the table lock is never held while data is reduced or
//! copied; every shared output is written in disjoint ranges by distinct
//! ranks and read only after all of them passed the finish barrier.
//!
//! Modules, each using only those listed before it: `sync` (locking that
//! survives a panicking rank), `op` (what a call asks for), `work` (one
//! call's data and every rank's share of it), `table` (the rendezvous table
//! and failure marking), `world` (worlds, communicators, joining),
//! `rendezvous` (one collective call through the table: arrive, share,
//! finish), `communicator_impl` (the `Communicator` interface, send/recv
//! mailboxes), `run` (`run_world`).

mod communicator_impl;
mod op;
mod rendezvous;
mod run;
mod sync;
mod table;
mod work;
mod world;

pub use run::{run_world, DeviceOutcome};
pub use world::{
    InjectedFault, LoopbackCommunicator, LoopbackWorld, DEFAULT_POOL_BYTES, DEFAULT_TIMEOUT,
};
