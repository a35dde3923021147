//! The [`Communicator`] interface: XLA's collectives as seen by one device.
//!
//! An interpreter runs one communicator per device (one thread per device for
//! the loopback backend, one process per GPU for NCCL). For each collective
//! HLO it computes the caller's group with [`crate::groups`] (or
//! [`crate::groups::permute_plan`] for collective-permute) and calls the
//! method with that group, in the same program order on every device.
//!
//! Contract shared by all backends:
//! * `group` lists global device ids in rank order and contains the caller
//!   exactly once; every member passes the same group;
//! * calls on the same group are matched by their order (the n-th call on a
//!   group on one device meets the n-th call on that group on the others);
//!   their kind and parameters must agree, or every member gets
//!   [`CollectiveError::Mismatch`];
//! * operands are variadic (XLA's tuple-shaped collectives): operand i of
//!   each rank is combined with operand i of the others;
//! * a member that does not arrive within the backend's timeout, or that
//!   fails, makes every waiting member return an error naming it; nothing
//!   hangs or panics.
//!
//! Results may share storage with operands or with other ranks' results
//! (see [`DeviceBuffer`]); they are immutable until `make_mut`.

use crate::buffer::DeviceBuffer;
use crate::error::{CollectiveError, Result};
use crate::groups::DeviceId;
use crate::reduce::ReductionKind;
use xla_hlo_ir::PrimitiveType;

/// One device's endpoint for collective operations.
pub trait Communicator: Send {
    /// This device's global id.
    fn device(&self) -> DeviceId;

    /// Number of devices this communicator can reach (ids `0..num_devices`).
    fn num_devices(&self) -> usize;

    /// `"loopback"`, `"nccl"`.
    fn backend_name(&self) -> &'static str;

    /// Declares this device failed (its program hit an error): members
    /// waiting for it, now or later, get an error naming it instead of
    /// waiting for the timeout. Backends without failure propagation ignore
    /// it.
    fn abort(&mut self, _reason: &str) {}

    /// All-reduce: every member gets the elementwise fold (in rank order) of
    /// every member's operand i.
    fn all_reduce(
        &mut self,
        group: &[DeviceId],
        kind: ReductionKind,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>>;

    /// All-gather along `dimension`: every member gets the concatenation of
    /// all members' operand i in rank order.
    fn all_gather(
        &mut self,
        group: &[DeviceId],
        dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>>;

    /// Reduce-scatter along `dimension`: rank r gets block r of the
    /// all-reduce of operand i (`dims[dimension]` divisible by the group
    /// size).
    fn reduce_scatter(
        &mut self,
        group: &[DeviceId],
        kind: ReductionKind,
        dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>>;

    /// Array all-to-all: operand i is split into group-size blocks along
    /// `split_dimension`; rank r gets block r of every member, concatenated in
    /// rank order along `concat_dimension` (HLO's `dimensions={d}` is
    /// split = concat = d).
    fn all_to_all(
        &mut self,
        group: &[DeviceId],
        split_dimension: usize,
        concat_dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>>;

    /// Tuple all-to-all (no `dimensions`): one operand per member; rank r's
    /// result j is member j's operand r.
    fn all_to_all_tuple(
        &mut self,
        group: &[DeviceId],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>>;

    /// Collective-permute among `group`: for each (source, target) pair of
    /// global ids, target's result i is source's operand i; members that are
    /// no target get zeros of their operand's shape.
    fn collective_permute(
        &mut self,
        group: &[DeviceId],
        pairs: &[(DeviceId, DeviceId)],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>>;

    /// Collective-broadcast: every member gets the first member's operands.
    fn collective_broadcast(
        &mut self,
        group: &[DeviceId],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>>;

    /// Sends `buffer` to `peer` on channel `tag`. Messages between two
    /// devices on one tag arrive in order.
    fn send(&mut self, peer: DeviceId, tag: u64, buffer: &DeviceBuffer) -> Result<()>;

    /// Receives the next message from `peer` on channel `tag`, which must
    /// have the given type and dims.
    fn recv(
        &mut self,
        peer: DeviceId,
        tag: u64,
        dtype: PrimitiveType,
        dims: &[i64],
    ) -> Result<DeviceBuffer>;

    /// Waits until every message this device sent has been received (XLA's
    /// send-done).
    fn wait_sends(&mut self) -> Result<()>;

    /// Returns once every member of `group` has called it.
    fn barrier(&mut self, group: &[DeviceId]) -> Result<()>;
}

/// Checks a group as the [`Communicator`] contract states and returns the
/// caller's rank in it.
pub fn rank_in_group(group: &[DeviceId], device: DeviceId, num_devices: usize) -> Result<usize> {
    let mut rank = None;
    let mut seen = std::collections::HashSet::with_capacity(group.len());
    for (r, &d) in group.iter().enumerate() {
        if d >= num_devices {
            return Err(CollectiveError::InvalidGroups(format!(
                "device {d} in group {group:?} is out of range (devices 0..{num_devices})"
            )));
        }
        if !seen.insert(d) {
            return Err(CollectiveError::InvalidGroups(format!(
                "device {d} appears twice in group {group:?}"
            )));
        }
        if d == device {
            rank = Some(r);
        }
    }
    rank.ok_or_else(|| {
        CollectiveError::InvalidGroups(format!(
            "device {device} is not a member of group {group:?}"
        ))
    })
}

/// Checks that the operands of one rank are well-formed for a reduction.
pub fn check_reduction_operands(kind: ReductionKind, operands: &[DeviceBuffer]) -> Result<()> {
    for op in operands {
        kind.check(op.dtype())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interpreter holds communicators as trait objects.
    #[test]
    fn object_safe_and_group_checks() {
        fn _takes(_: &mut dyn Communicator) {}
        assert_eq!(rank_in_group(&[3, 1, 2], 1, 4).unwrap(), 1);
        assert!(rank_in_group(&[3, 1], 2, 4).is_err());
        assert!(rank_in_group(&[1, 1], 1, 4).is_err());
        assert!(rank_in_group(&[1, 9], 1, 4).is_err());
    }
}
