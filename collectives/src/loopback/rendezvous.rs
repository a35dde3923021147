//! One collective call through the rendezvous table, in three phases:
//! arrive (deposit the operands; the last member builds the `Work`), do
//! this rank's share outside the lock, then, for shared-output ops, the
//! finish barrier before the shared results are taken.
//!
//! Invariants: the table lock is never held while data is reduced or
//! copied; every wait ends by the world's timeout (`CollectiveError::Timeout`
//! naming the missing devices); a member whose call disagrees with the
//! others' fails the slot (`Mismatch`), and so does a rank whose share
//! fails or panics (`PeerFailed`, through `RunGuard`), for every member.

use super::op::Op;
use super::sync::lock;
use super::table::{leave, mismatch, Shared, Slot};
use super::work::Work;
use super::world::{InjectedFault, LoopbackCommunicator};
use crate::buffer::DeviceBuffer;
use crate::communicator::rank_in_group;
use crate::error::{CallSite, CollectiveError, Result};
use crate::groups::DeviceId;
use std::sync::Arc;
use std::time::Instant;

/// Marks the slot failed if the rank's share did not complete (panic).
struct RunGuard<'a> {
    shared: &'a Shared,
    key: &'a (Vec<DeviceId>, u64),
    device: DeviceId,
    armed: bool,
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut st = lock(&self.shared.state);
        if let Some(slot) = st.slots.get_mut(self.key) {
            let call = slot.call.clone();
            slot.fail(CollectiveError::PeerFailed {
                call,
                device: self.device,
                reason: "panicked while executing its part".into(),
            });
        }
        st.failed
            .insert(self.device, "panicked during a collective".into());
        self.shared.cv.notify_all();
    }
}

impl LoopbackCommunicator {
    /// Runs one collective call through the rendezvous table.
    pub(super) fn collective(
        &mut self,
        group: &[DeviceId],
        op: Op,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.check_not_aborted()?;
        let rank = rank_in_group(group, self.device, self.shared.num_devices)?;
        let sequence = self.next_sequence(group);
        let call = CallSite {
            kind: op.kind(),
            group: group.to_vec(),
            sequence,
        };
        let n = group.len();
        let key = (group.to_vec(), sequence);
        let shared = &*self.shared;
        let timeout = shared.timeout;
        let arrived_at = Instant::now();

        // Phase 1: arrive and wait for the work.
        let work = {
            let mut st = lock(&shared.state);
            let failed_member = group
                .iter()
                .find_map(|d| st.failed.get(d).map(|r| (*d, r.clone())));
            let slot = st.slots.entry(key.clone()).or_insert_with(|| Slot {
                call: call.clone(),
                op: op.clone(),
                first_rank: rank,
                inputs: vec![None; n],
                arrived: 0,
                work: None,
                finished: vec![false; n],
                results: None,
                left: 0,
                error: None,
            });
            if let Some(e) = &slot.error {
                return Err(e.clone());
            }
            if let Some((device, reason)) = failed_member {
                let err = CollectiveError::PeerFailed {
                    call: call.clone(),
                    device,
                    reason,
                };
                slot.fail(err.clone());
                shared.cv.notify_all();
                return Err(err);
            }
            if let Some(detail) = mismatch(slot, &op, rank, operands) {
                let err = CollectiveError::Mismatch {
                    call: call.clone(),
                    detail,
                };
                slot.fail(err.clone());
                shared.cv.notify_all();
                return Err(err);
            }
            if slot.inputs[rank].is_some() {
                return Err(CollectiveError::InvalidArgument(format!(
                    "{call}: device {} arrived twice",
                    self.device
                )));
            }
            slot.inputs[rank] = Some(operands.to_vec());
            slot.arrived += 1;
            if slot.arrived == n {
                let inputs: Vec<Vec<DeviceBuffer>> = slot
                    .inputs
                    .iter_mut()
                    .map(|i| i.take().unwrap_or_default())
                    .collect();
                match Work::build(op.clone(), inputs, group, &call, &shared.recycler) {
                    Ok(w) => slot.work = Some(Arc::new(w)),
                    Err(e) => slot.fail(e),
                }
                shared.cv.notify_all();
            }
            let deadline = arrived_at + timeout;
            loop {
                let slot = st.slots.get_mut(&key).ok_or_else(|| {
                    CollectiveError::InvalidArgument(format!("{call}: slot vanished"))
                })?;
                if let Some(e) = &slot.error {
                    return Err(e.clone());
                }
                if let Some(w) = &slot.work {
                    break w.clone();
                }
                let now = Instant::now();
                if now >= deadline {
                    let missing_ranks: Vec<usize> =
                        (0..n).filter(|&r| slot.inputs[r].is_none()).collect();
                    let err = CollectiveError::Timeout {
                        call: call.clone(),
                        missing: missing_ranks.iter().map(|&r| group[r]).collect(),
                        missing_ranks,
                        stage: "arrive",
                        waited: timeout,
                    };
                    slot.fail(err.clone());
                    shared.cv.notify_all();
                    return Err(err);
                }
                st = shared
                    .cv
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };

        // Phase 2: this rank's share, outside the lock.
        let mut guard = RunGuard {
            shared,
            key: &key,
            device: self.device,
            armed: true,
        };
        match self.fault.take() {
            Some(InjectedFault::PanicMidway) => {
                panic!(
                    "injected fault: device {} panics during {call}",
                    self.device
                )
            }
            Some(InjectedFault::StallMidway(d)) => std::thread::sleep(d),
            None => {}
        }
        let private = work.run(rank, group);
        guard.armed = false;
        drop(guard);
        let private = match private {
            Ok(p) => p,
            Err(e) => {
                let mut st = lock(&shared.state);
                if let Some(slot) = st.slots.get_mut(&key) {
                    slot.fail(CollectiveError::PeerFailed {
                        call: call.clone(),
                        device: self.device,
                        reason: e.to_string(),
                    });
                }
                shared.cv.notify_all();
                return Err(e);
            }
        };
        if !work.shared() {
            // Private results: the work keeps every operand alive for the
            // others, so this rank can leave now.
            let mut st = lock(&shared.state);
            leave(&mut st, &key, n);
            drop(work);
            return Ok(private.unwrap_or_default());
        }

        // Phase 3: finish barrier, then take the shared results.
        let mut st = lock(&shared.state);
        let finished_at = Instant::now();
        let deadline = finished_at + timeout;
        {
            let slot = st.slots.get_mut(&key).ok_or_else(|| {
                CollectiveError::InvalidArgument(format!("{call}: slot vanished"))
            })?;
            if let Some(e) = &slot.error {
                return Err(e.clone());
            }
            slot.finished[rank] = true;
            if slot.finished.iter().all(|&f| f) {
                match work.finish() {
                    Ok(r) => slot.results = Some(Arc::new(r)),
                    Err(e) => slot.fail(e),
                }
                shared.cv.notify_all();
            }
        }
        drop(work);
        loop {
            let slot = st.slots.get_mut(&key).ok_or_else(|| {
                CollectiveError::InvalidArgument(format!("{call}: slot vanished"))
            })?;
            if let Some(e) = &slot.error {
                return Err(e.clone());
            }
            if let Some(r) = &slot.results {
                let out = r.as_ref().clone();
                leave(&mut st, &key, n);
                return Ok(out);
            }
            let now = Instant::now();
            if now >= deadline {
                let missing_ranks: Vec<usize> = (0..n).filter(|&r| !slot.finished[r]).collect();
                let err = CollectiveError::Timeout {
                    call: call.clone(),
                    missing: missing_ranks.iter().map(|&r| group[r]).collect(),
                    missing_ranks,
                    stage: "finish",
                    waited: timeout,
                };
                slot.fail(err.clone());
                shared.cv.notify_all();
                return Err(err);
            }
            st = shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}
