//! `Communicator` for `LoopbackCommunicator`: every collective goes
//! through the rendezvous (`rendezvous`), send/recv through per-(source,
//! target, tag) mailboxes in the same table.
//!
//! Invariants: messages on one (source, target, tag) channel arrive in send
//! order; a receive or `wait_sends` returns `PeerFailed` once the peer is
//! marked failed and `Timeout` past the world's timeout, never hangs.

use super::op::Op;
use super::sync::lock;
use super::world::LoopbackCommunicator;
use crate::buffer::DeviceBuffer;
use crate::communicator::Communicator;
use crate::error::{CallSite, CollectiveError, CollectiveKind, Result};
use crate::groups::DeviceId;
use crate::reduce::ReductionKind;
use std::time::Instant;
use xla_hlo_ir::PrimitiveType;

impl Communicator for LoopbackCommunicator {
    fn device(&self) -> DeviceId {
        self.device
    }

    fn num_devices(&self) -> usize {
        self.shared.num_devices
    }

    fn backend_name(&self) -> &'static str {
        "loopback"
    }

    fn abort(&mut self, reason: &str) {
        LoopbackCommunicator::abort(self, reason);
    }

    fn all_reduce(
        &mut self,
        group: &[DeviceId],
        kind: ReductionKind,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::AllReduce(kind), operands)
    }

    fn all_gather(
        &mut self,
        group: &[DeviceId],
        dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::AllGather(dimension), operands)
    }

    fn reduce_scatter(
        &mut self,
        group: &[DeviceId],
        kind: ReductionKind,
        dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::ReduceScatter(kind, dimension), operands)
    }

    fn all_to_all(
        &mut self,
        group: &[DeviceId],
        split_dimension: usize,
        concat_dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(
            group,
            Op::AllToAll(split_dimension, concat_dimension),
            operands,
        )
    }

    fn all_to_all_tuple(
        &mut self,
        group: &[DeviceId],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::AllToAllTuple, operands)
    }

    fn collective_permute(
        &mut self,
        group: &[DeviceId],
        pairs: &[(DeviceId, DeviceId)],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::Permute(pairs.to_vec()), operands)
    }

    fn collective_broadcast(
        &mut self,
        group: &[DeviceId],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::Broadcast, operands)
    }

    fn send(&mut self, peer: DeviceId, tag: u64, buffer: &DeviceBuffer) -> Result<()> {
        self.check_not_aborted()?;
        self.check_peer(peer)?;
        let mut st = lock(&self.shared.state);
        st.mailboxes
            .entry((self.device, peer, tag))
            .or_default()
            .push_back(buffer.clone());
        self.shared.cv.notify_all();
        Ok(())
    }

    fn recv(
        &mut self,
        peer: DeviceId,
        tag: u64,
        dtype: PrimitiveType,
        dims: &[i64],
    ) -> Result<DeviceBuffer> {
        self.check_not_aborted()?;
        self.check_peer(peer)?;
        let seq = {
            let s = self
                .p2p_sequences
                .entry((peer, self.device, tag))
                .or_insert(0);
            *s += 1;
            *s - 1
        };
        let call = CallSite {
            kind: CollectiveKind::Recv,
            group: vec![peer, self.device],
            sequence: seq,
        };
        let shared = &*self.shared;
        let deadline = Instant::now() + shared.timeout;
        let mut st = lock(&shared.state);
        loop {
            let key = (peer, self.device, tag);
            if let Some(b) = st.mailboxes.get_mut(&key).and_then(|q| q.pop_front()) {
                if st.mailboxes.get(&key).is_some_and(|q| q.is_empty()) {
                    st.mailboxes.remove(&key);
                }
                shared.cv.notify_all();
                if b.dtype() != dtype || b.dims() != dims {
                    return Err(CollectiveError::Mismatch {
                        call,
                        detail: format!(
                            "device {peer} sent {} on channel {tag}, device {} expects {}",
                            b.shape_string(),
                            self.device,
                            crate::buffer::shape_string(dtype, dims)
                        ),
                    });
                }
                return Ok(b);
            }
            if let Some(reason) = st.failed.get(&peer) {
                return Err(CollectiveError::PeerFailed {
                    call,
                    device: peer,
                    reason: reason.clone(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CollectiveError::Timeout {
                    call,
                    missing: vec![peer],
                    missing_ranks: vec![0],
                    stage: "send",
                    waited: shared.timeout,
                });
            }
            st = shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn wait_sends(&mut self) -> Result<()> {
        let shared = &*self.shared;
        let deadline = Instant::now() + shared.timeout;
        let mut st = lock(&shared.state);
        loop {
            let mut pending: Vec<(DeviceId, u64)> = st
                .mailboxes
                .iter()
                .filter(|((s, _, _), q)| *s == self.device && !q.is_empty())
                .map(|((_, t, tag), _)| (*t, *tag))
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            pending.sort_unstable();
            if let Some(&(peer, _)) = pending.iter().find(|(t, _)| st.failed.contains_key(t)) {
                return Err(CollectiveError::PeerFailed {
                    call: CallSite {
                        kind: CollectiveKind::Send,
                        group: vec![self.device, peer],
                        sequence: 0,
                    },
                    device: peer,
                    reason: st.failed[&peer].clone(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                let mut missing: Vec<DeviceId> = pending.iter().map(|(t, _)| *t).collect();
                missing.dedup();
                return Err(CollectiveError::Timeout {
                    call: CallSite {
                        kind: CollectiveKind::Send,
                        group: [vec![self.device], missing.clone()].concat(),
                        sequence: 0,
                    },
                    missing_ranks: (1..=missing.len()).collect(),
                    missing,
                    stage: "receive",
                    waited: shared.timeout,
                });
            }
            st = shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn barrier(&mut self, group: &[DeviceId]) -> Result<()> {
        self.collective(group, Op::Barrier, &[]).map(|_| ())
    }
}
