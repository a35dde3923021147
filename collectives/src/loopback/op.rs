//! What one collective call asks for (`Op`): the kind and its parameters,
//! which every member of the call must pass identically.
//!
//! Invariant: two members agree on a call's kind and parameters exactly
//! when their `Op`s are equal (operand shapes are compared separately);
//! `describe` prints an `Op` in HLO terms for mismatch errors.

use crate::error::CollectiveKind;
use crate::groups::DeviceId;
use crate::reduce::ReductionKind;

/// What a call asks for; members must agree on it.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Op {
    AllReduce(ReductionKind),
    AllGather(usize),
    ReduceScatter(ReductionKind, usize),
    AllToAll(usize, usize),
    AllToAllTuple,
    Permute(Vec<(DeviceId, DeviceId)>),
    Broadcast,
    Barrier,
}

impl Op {
    pub(super) fn kind(&self) -> CollectiveKind {
        match self {
            Op::AllReduce(_) => CollectiveKind::AllReduce,
            Op::AllGather(_) => CollectiveKind::AllGather,
            Op::ReduceScatter(..) => CollectiveKind::ReduceScatter,
            Op::AllToAll(..) | Op::AllToAllTuple => CollectiveKind::AllToAll,
            Op::Permute(_) => CollectiveKind::CollectivePermute,
            Op::Broadcast => CollectiveKind::CollectiveBroadcast,
            Op::Barrier => CollectiveKind::Barrier,
        }
    }

    /// Ops whose result is one shared output written by all members.
    pub(super) fn shared_output(&self) -> bool {
        matches!(self, Op::AllReduce(_) | Op::AllGather(_))
    }

    /// Ops whose operands must have the same shapes on every member.
    pub(super) fn same_shapes(&self) -> bool {
        !matches!(self, Op::AllToAllTuple | Op::Barrier)
    }

    pub(super) fn describe(&self) -> String {
        match self {
            Op::AllReduce(k) => format!("all-reduce to_apply={}", k.opcode()),
            Op::AllGather(d) => format!("all-gather dimensions={{{d}}}"),
            Op::ReduceScatter(k, d) => {
                format!("reduce-scatter to_apply={} dimensions={{{d}}}", k.opcode())
            }
            Op::AllToAll(s, c) => format!("all-to-all split={s} concat={c}"),
            Op::AllToAllTuple => "tuple all-to-all".into(),
            Op::Permute(p) => format!("collective-permute pairs={p:?}"),
            Op::Broadcast => "collective-broadcast".into(),
            Op::Barrier => "barrier".into(),
        }
    }
}
