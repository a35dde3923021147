//! XLA's collective group mode (`GetCollectiveOpGroupMode`,
//! xla/service/collective_ops_utils.cc): how the ids in a collective's
//! `replica_groups` are read, decided by whether it has a `channel_id` and
//! what its `use_global_device_ids` says.
//!
//! | `channel_id` | `use_global_device_ids` | mode |
//! |---|---|---|
//! | absent | absent/false | cross-replica |
//! | absent | true | error |
//! | present | absent (all-to-all, permute, broadcast) | cross-partition |
//! | present | false | cross-replica-and-partition |
//! | present | true | flattened id |
//!
//! This is the one implementation of the rule: shape inference and the
//! verifier use it for group sizes and replica-group checks, the
//! `collectives` crate to expand groups into device ids.
//!
//! Invariant: every pair of inputs gives a mode or [`GroupModeError`]; none
//! panics.

use crate::attrs::AttrKey;
use crate::module::HloInstruction;
use crate::opcode::Opcode;
use std::fmt;

/// How the ids in `replica_groups` are read (XLA's `CollectiveOpGroupMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupMode {
    CrossReplica,
    CrossPartition,
    CrossReplicaAndPartition,
    FlattenedId,
}

/// An attribute combination XLA rejects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupModeError {
    /// `use_global_device_ids=true` on an op without a `channel_id`.
    GlobalDeviceIdsWithoutChannel,
}

impl fmt::Display for GroupModeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupModeError::GlobalDeviceIdsWithoutChannel => {
                f.write_str("use_global_device_ids=true requires a channel_id")
            }
        }
    }
}

impl std::error::Error for GroupModeError {}

impl GroupMode {
    /// XLA's rule from whether the op has a `channel_id` and what its
    /// `use_global_device_ids` is (`None` when the op has no such attribute).
    pub fn from_attributes(
        has_channel_id: bool,
        use_global_device_ids: Option<bool>,
    ) -> Result<GroupMode, GroupModeError> {
        match (has_channel_id, use_global_device_ids) {
            (false, None | Some(false)) => Ok(GroupMode::CrossReplica),
            (false, Some(true)) => Err(GroupModeError::GlobalDeviceIdsWithoutChannel),
            (true, None) => Ok(GroupMode::CrossPartition),
            (true, Some(false)) => Ok(GroupMode::CrossReplicaAndPartition),
            (true, Some(true)) => Ok(GroupMode::FlattenedId),
        }
    }

    /// XLA's name (`kCrossReplica`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GroupMode::CrossReplica => "kCrossReplica",
            GroupMode::CrossPartition => "kCrossPartition",
            GroupMode::CrossReplicaAndPartition => "kCrossReplicaAndPartition",
            GroupMode::FlattenedId => "kFlattenedID",
        }
    }
}

/// Group mode of a collective instruction (`opcode` is the collective it
/// performs, e.g. the wrapped op of a sugared async start). Ops whose
/// `use_global_device_ids` is a bool in XLA (all-reduce, all-gather,
/// reduce-scatter and their native starts) read an absent one as false.
pub fn group_mode(instr: &HloInstruction, opcode: Opcode) -> Result<GroupMode, GroupModeError> {
    let carries_flag = matches!(
        opcode,
        Opcode::AllReduce
            | Opcode::AllReduceStart
            | Opcode::AllGather
            | Opcode::AllGatherStart
            | Opcode::ReduceScatter
    );
    let flag = instr.bool_attr(AttrKey::UseGlobalDeviceIds);
    let flag = if carries_flag {
        Some(flag.unwrap_or(false))
    } else {
        flag
    };
    GroupMode::from_attributes(instr.channel_id().is_some(), flag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attrs::AttrValue;
    use crate::shape::Shape;

    #[test]
    fn xla_rule() {
        use GroupMode as M;
        let cases = [
            (false, None, Ok(M::CrossReplica)),
            (false, Some(false), Ok(M::CrossReplica)),
            (
                false,
                Some(true),
                Err(GroupModeError::GlobalDeviceIdsWithoutChannel),
            ),
            (true, None, Ok(M::CrossPartition)),
            (true, Some(false), Ok(M::CrossReplicaAndPartition)),
            (true, Some(true), Ok(M::FlattenedId)),
        ];
        for (channel, flag, want) in cases {
            assert_eq!(GroupMode::from_attributes(channel, flag), want);
        }
    }

    #[test]
    fn absent_flag_is_false_where_xla_holds_a_bool() {
        let mut i = HloInstruction::new("x", Opcode::AllReduce, Shape::tuple(vec![]), vec![]);
        i.set_attr(AttrKey::ChannelId, AttrValue::Int(1));
        assert_eq!(
            group_mode(&i, Opcode::AllReduce),
            Ok(GroupMode::CrossReplicaAndPartition)
        );
        assert_eq!(
            group_mode(&i, Opcode::AllToAll),
            Ok(GroupMode::CrossPartition)
        );
    }
}
