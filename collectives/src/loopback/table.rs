//! The rendezvous table all communicators of a world share (`Shared`): one
//! slot per collective call, keyed by (group, sequence number of the call on
//! that group), the failed devices and the point-to-point mailboxes; and
//! marking a device failed.
//!
//! Invariants: a failed slot keeps its first error and drops its data (a
//! tombstone), so late members find the error; a slot is removed once every
//! member took its result, unless it failed; once a device is marked failed,
//! every call still waiting for it fails with `CollectiveError::PeerFailed`
//! (later calls of its groups fail at arrival, in `rendezvous`).

use super::op::Op;
use super::sync::lock;
use super::work::Work;
use crate::bootstrap::UniqueId;
use crate::buffer::{DeviceBuffer, Recycler};
use crate::error::{CallSite, CollectiveError};
use crate::groups::DeviceId;
use crate::layout;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

pub(super) struct Shared {
    pub(super) id: UniqueId,
    pub(super) num_devices: usize,
    pub(super) timeout: Duration,
    pub(super) recycler: Arc<Recycler>,
    pub(super) state: Mutex<State>,
    pub(super) cv: Condvar,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) slots: HashMap<(Vec<DeviceId>, u64), Slot>,
    /// Devices that failed or left, with the reason.
    pub(super) failed: HashMap<DeviceId, String>,
    /// (source, target, tag) -> messages in order.
    pub(super) mailboxes: HashMap<(DeviceId, DeviceId, u64), VecDeque<DeviceBuffer>>,
    pub(super) claimed: Vec<bool>,
}

pub(super) struct Slot {
    pub(super) call: CallSite,
    pub(super) op: Op,
    pub(super) first_rank: usize,
    pub(super) inputs: Vec<Option<Vec<DeviceBuffer>>>,
    pub(super) arrived: usize,
    pub(super) work: Option<Arc<Work>>,
    pub(super) finished: Vec<bool>,
    pub(super) results: Option<Arc<Vec<DeviceBuffer>>>,
    pub(super) left: usize,
    pub(super) error: Option<CollectiveError>,
}

impl Slot {
    pub(super) fn fail(&mut self, err: CollectiveError) {
        if self.error.is_none() {
            self.error = Some(err);
        }
        // A tombstone keeps the error, not the data.
        self.inputs.iter_mut().for_each(|i| *i = None);
        self.work = None;
        self.results = None;
    }
}

/// Records that `rank` took its result; removes the slot when all did.
pub(super) fn leave(st: &mut State, key: &(Vec<DeviceId>, u64), n: usize) {
    if let Some(slot) = st.slots.get_mut(key) {
        slot.left += 1;
        if slot.left == n && slot.error.is_none() {
            st.slots.remove(key);
        }
    }
}

/// Compares a member's call with the first member's.
pub(super) fn mismatch(
    slot: &Slot,
    op: &Op,
    rank: usize,
    operands: &[DeviceBuffer],
) -> Option<String> {
    if slot.op != *op {
        return Some(format!(
            "rank {rank} called {} but rank {} called {}",
            op.describe(),
            slot.first_rank,
            slot.op.describe()
        ));
    }
    if !op.same_shapes() {
        return None;
    }
    // Compare against any member that already deposited operands.
    let (other_rank, theirs) = slot
        .inputs
        .iter()
        .enumerate()
        .find_map(|(r, i)| i.as_ref().map(|i| (r, i)))?;
    layout::describe_shape_mismatch(operands, rank, theirs, other_rank)
}

pub(super) fn mark_failed(shared: &Shared, device: DeviceId, reason: &str) {
    let mut st = lock(&shared.state);
    st.failed
        .entry(device)
        .or_insert_with(|| reason.to_string());
    for slot in st.slots.values_mut() {
        if slot.error.is_some() {
            continue;
        }
        let Some(rank) = slot.call.group.iter().position(|&d| d == device) else {
            continue;
        };
        let pending = if slot.work.is_none() {
            slot.inputs[rank].is_none()
        } else {
            slot.op.shared_output() && !slot.finished[rank]
        };
        if pending {
            let call = slot.call.clone();
            slot.fail(CollectiveError::PeerFailed {
                call,
                device,
                reason: reason.to_string(),
            });
        }
    }
    shared.cv.notify_all();
}
