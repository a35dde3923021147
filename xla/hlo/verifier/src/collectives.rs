//! Collective attributes (XLA's `CheckReplicaGroups` and the
//! collective-permute pair checks).
//!
//! - The group mode must be valid (`use_global_device_ids=true` needs a
//!   `channel_id`); iota and mesh-axis lists must be well formed.
//! - Explicit groups: none empty; no id repeated; together they name exactly
//!   `0..n`; for `all-gather`, `reduce-scatter` and `all-to-all` every group
//!   has the same size; in cross-replica mode (no `channel_id`) with
//!   `replica_count` > 1, `n` equals the replica count.
//! - No group list names more devices than the group mode's participants
//!   (`num_partitions`, `replica_count` or their product, when the header
//!   sets it above 1) or `MAX_DEVICES`; mesh-axis lists have a well-formed
//!   mesh and name no axis twice.
//! - `source_target_pairs`: pairs of two non-negative ids, no source and no
//!   target used twice.
//!
//! Applies to the synchronous collectives, their native `-start` forms and
//! sugared async starts; independent of the instruction's operands.

use crate::header::MAX_DEVICES;
use crate::sharding::{check_axis_ref, check_mesh};
use crate::{At, Report};
use std::collections::{HashMap, HashSet};
use xla_hlo_ir::collective_groups::{group_mode, GroupMode};
use xla_hlo_ir::shape_inference::{checked_product, written_group_size};
use xla_hlo_ir::{AttrKey, AttrValue, CollectiveDeviceList, Opcode, Shape};

/// Checks the collective attributes; true when nothing was reported.
pub(crate) fn check(at: &At, r: &mut Report) -> bool {
    let before = r.errors.len();
    check_inner(at, r);
    r.errors.len() == before
}

fn check_inner(at: &At, r: &mut Report) {
    let instr = at.instr();
    let op = match (instr.opcode, instr.async_wrapped) {
        (Opcode::AsyncStart, Some(w)) => w,
        (Opcode::AsyncUpdate | Opcode::AsyncDone, Some(_)) => return,
        (op, _) => op.sync_collective().unwrap_or(op),
    };
    if matches!(
        instr.opcode,
        Opcode::AllGatherDone | Opcode::AllReduceDone | Opcode::CollectivePermuteDone
    ) {
        return;
    }
    let uniform = match op {
        Opcode::AllGather | Opcode::ReduceScatter | Opcode::AllToAll => true,
        Opcode::AllReduce
        | Opcode::CollectiveBroadcast
        | Opcode::RaggedAllToAll
        | Opcode::CollectiveReduce => false,
        Opcode::CollectivePermute => {
            source_target_pairs(at, r);
            return;
        }
        // Native starts are read as their collective and dones are skipped, above.
        Opcode::AllGatherDone
        | Opcode::AllGatherStart
        | Opcode::AllReduceDone
        | Opcode::AllReduceStart
        | Opcode::CollectivePermuteDone
        | Opcode::CollectivePermuteStart => return,
        // Not collectives: no replica groups.
        Opcode::Abs
        | Opcode::Acos
        | Opcode::Acosh
        | Opcode::Add
        | Opcode::AddDependency
        | Opcode::AfterAll
        | Opcode::And
        | Opcode::Asin
        | Opcode::Asinh
        | Opcode::AsyncDone
        | Opcode::AsyncStart
        | Opcode::AsyncUpdate
        | Opcode::Atan
        | Opcode::Atan2
        | Opcode::Atanh
        | Opcode::BatchNormGrad
        | Opcode::BatchNormInference
        | Opcode::BatchNormTraining
        | Opcode::Bitcast
        | Opcode::BitcastConvert
        | Opcode::Broadcast
        | Opcode::Call
        | Opcode::Cbrt
        | Opcode::Ceil
        | Opcode::Cholesky
        | Opcode::Clamp
        | Opcode::Compare
        | Opcode::Complex
        | Opcode::Concatenate
        | Opcode::Conditional
        | Opcode::Constant
        | Opcode::Convert
        | Opcode::Convolution
        | Opcode::Copy
        | Opcode::CopyDone
        | Opcode::CopyStart
        | Opcode::Cos
        | Opcode::Cosh
        | Opcode::Clz
        | Opcode::CustomCall
        | Opcode::Divide
        | Opcode::Domain
        | Opcode::Dot
        | Opcode::DynamicReshape
        | Opcode::DynamicSlice
        | Opcode::DynamicUpdateSlice
        | Opcode::Erf
        | Opcode::Exp
        | Opcode::Expm1
        | Opcode::Fft
        | Opcode::Floor
        | Opcode::Fusion
        | Opcode::Gather
        | Opcode::GetDimensionSize
        | Opcode::GetTupleElement
        | Opcode::Imag
        | Opcode::Infeed
        | Opcode::Iota
        | Opcode::IsFinite
        | Opcode::Log
        | Opcode::Log1p
        | Opcode::Logistic
        | Opcode::Map
        | Opcode::Maximum
        | Opcode::Minimum
        | Opcode::Mulhi
        | Opcode::Multiply
        | Opcode::Negate
        | Opcode::Not
        | Opcode::OptimizationBarrier
        | Opcode::Or
        | Opcode::Outfeed
        | Opcode::Pad
        | Opcode::Parameter
        | Opcode::PartitionId
        | Opcode::PopulationCount
        | Opcode::Power
        | Opcode::RaggedDot
        | Opcode::Real
        | Opcode::Recv
        | Opcode::RecvDone
        | Opcode::Reduce
        | Opcode::ReducePrecision
        | Opcode::ReduceWindow
        | Opcode::Remainder
        | Opcode::ReplicaId
        | Opcode::Reshape
        | Opcode::Reverse
        | Opcode::Rng
        | Opcode::RngBitGenerator
        | Opcode::RngGetAndUpdateState
        | Opcode::RoundNearestAfz
        | Opcode::RoundNearestEven
        | Opcode::Rsqrt
        | Opcode::Scan
        | Opcode::ScaledDot
        | Opcode::Scatter
        | Opcode::Select
        | Opcode::SelectAndScatter
        | Opcode::Send
        | Opcode::SendDone
        | Opcode::SetDimensionSize
        | Opcode::ShiftLeft
        | Opcode::ShiftRightArithmetic
        | Opcode::ShiftRightLogical
        | Opcode::Shuffle
        | Opcode::Sign
        | Opcode::Sin
        | Opcode::Sinh
        | Opcode::Slice
        | Opcode::Sort
        | Opcode::Sqrt
        | Opcode::StochasticConvert
        | Opcode::Subtract
        | Opcode::Tan
        | Opcode::Tanh
        | Opcode::TopK
        | Opcode::Transpose
        | Opcode::TriangularSolve
        | Opcode::Tuple
        | Opcode::While
        | Opcode::Xor => return,
    };
    let mode = match group_mode(instr, op) {
        Ok(m) => m,
        Err(e) => {
            at.err(r, e.to_string());
            return;
        }
    };
    if let Err(e) = written_group_size(instr.replica_groups()) {
        at.err(r, format!("replica_groups: {e}"));
        return;
    }
    let participants = participants(at, mode);
    if let Err(e) = check_group_devices(instr.replica_groups(), participants) {
        at.err(r, format!("replica_groups: {e}"));
        return;
    }
    let Some(CollectiveDeviceList::Explicit(groups)) = instr.replica_groups() else {
        return;
    };
    if groups.is_empty() {
        if mode == GroupMode::FlattenedId {
            at.err(
                r,
                "replica_groups must be listed when use_global_device_ids=true",
            );
        }
        return;
    }
    let mut seen = HashSet::new();
    for g in groups {
        if g.is_empty() {
            at.err(r, "replica_groups contains an empty group");
            return;
        }
        for &id in g {
            if id < 0 {
                at.err(r, format!("replica_groups contains negative id {id}"));
                return;
            }
            if !seen.insert(id) {
                at.err(r, format!("replica_groups repeats id {id}"));
                return;
            }
        }
    }
    let n = seen.len() as i64;
    if n > participants.unwrap_or(MAX_DEVICES) {
        at.err(
            r,
            format!(
                "replica_groups name {n} ids, more than the {} devices they can name",
                participants.unwrap_or(MAX_DEVICES)
            ),
        );
        return;
    }
    if let Some(missing) = (0..n).find(|i| !seen.contains(i)) {
        at.err(
            r,
            format!("replica_groups name {n} ids but not id {missing} (they must be 0..{n})"),
        );
        return;
    }
    if uniform {
        let size = groups[0].len();
        if groups.iter().any(|g| g.len() != size) {
            at.err(
                r,
                format!(
                    "{op} requires replica groups of one size, got sizes {:?}",
                    groups.iter().map(|g| g.len()).collect::<Vec<_>>()
                ),
            );
        }
    }
    let replicas = at.module.replica_count();
    if mode == GroupMode::CrossReplica && replicas != 1 && n != replicas {
        at.err(
            r,
            format!("replica_groups name {n} replicas but the module has replica_count={replicas}"),
        );
    }
}

/// How many ids the groups of a collective in `mode` range over, from the
/// module header: `None` when the header leaves that count at 1 (modules
/// written for `--devices N` without a header), so only `MAX_DEVICES` bounds
/// them.
fn participants(at: &At, mode: GroupMode) -> Option<i64> {
    let (partitions, replicas) = (at.module.num_partitions(), at.module.replica_count());
    let count = match mode {
        GroupMode::CrossReplica | GroupMode::CrossReplicaAndPartition => replicas,
        GroupMode::CrossPartition => partitions,
        GroupMode::FlattenedId => partitions.saturating_mul(replicas),
    };
    (count > 1).then_some(count.min(MAX_DEVICES))
}

/// Iota and mesh-axis group lists: no more devices than `participants` (or
/// `MAX_DEVICES`), meshes well formed, no mesh axis listed twice.
fn check_group_devices(
    groups: Option<&CollectiveDeviceList>,
    participants: Option<i64>,
) -> Result<(), String> {
    let limit = participants.unwrap_or(MAX_DEVICES);
    match groups {
        Some(CollectiveDeviceList::Iota { reshape_dims, .. }) => {
            let total = checked_product(reshape_dims)
                .ok_or_else(|| format!("iota dimensions {reshape_dims:?} must be positive"))?;
            if total > limit {
                return Err(format!(
                    "iota groups over {total} devices, more than the {limit} they can name"
                ));
            }
            Ok(())
        }
        Some(CollectiveDeviceList::MeshAxes { mesh, axes }) => {
            let size = check_mesh(mesh, participants.unwrap_or(0))?;
            if size > limit {
                return Err(format!(
                    "a mesh of {size} devices, more than the {limit} they can name"
                ));
            }
            let mut used = HashSet::new();
            for axis in axes {
                check_axis_ref(mesh, axis, &mut used)?;
            }
            Ok(())
        }
        Some(CollectiveDeviceList::Explicit(_)) | None => Ok(()),
    }
}

fn source_target_pairs(at: &At, r: &mut Report) {
    let Some(AttrValue::IntLists(pairs)) = at.instr().attr(AttrKey::SourceTargetPairs) else {
        return;
    };
    // An in-place collective-permute (4 operands) moves one slice per
    // offset, so a source or target may appear once per slice.
    let allowed = if at.instr().operands.len() == 4 {
        match at.operand_shape(2) {
            Some(Shape::Tuple(offsets)) => match (at.operand_shape(0), offsets.first()) {
                (Some(Shape::Tuple(_)), Some(Shape::Tuple(per_buffer))) => per_buffer.len(),
                _ => offsets.len(),
            },
            _ => 1,
        }
        .max(1)
    } else {
        1
    };
    let mut sources: HashMap<i64, usize> = HashMap::new();
    let mut targets: HashMap<i64, usize> = HashMap::new();
    let times = |n: usize| {
        if n == 1 {
            "once".to_string()
        } else {
            format!("{n} times")
        }
    };
    for p in pairs {
        let [s, t] = p.as_slice() else {
            at.err(
                r,
                format!("source_target_pairs entry {p:?} is not a (source, target) pair"),
            );
            return;
        };
        if *s < 0 || *t < 0 {
            at.err(
                r,
                format!("source_target_pairs entry {p:?} has a negative id"),
            );
            return;
        }
        let seen = sources.entry(*s).or_default();
        *seen += 1;
        if *seen > allowed {
            at.err(
                r,
                format!(
                    "source_target_pairs uses source {s} more than {}",
                    times(allowed)
                ),
            );
            return;
        }
        let seen = targets.entry(*t).or_default();
        *seen += 1;
        if *seen > allowed {
            at.err(
                r,
                format!(
                    "source_target_pairs uses target {t} more than {}",
                    times(allowed)
                ),
            );
            return;
        }
    }
}
