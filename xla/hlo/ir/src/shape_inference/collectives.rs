//! Collectives: the size of a collective's groups (XLA's `GetSubgroupSize`,
//! from the group mode of [`crate::collective_groups`]), and the shapes of
//! the synchronous collectives and their native starts.
//!
//! Invariant: a group size is known only from the written replica groups or,
//! for empty groups, from the module's replica and partition counts; without
//! either, shapes that depend on it are `NotInferable`, never guessed.

use super::{array_shape, dim_index, not_inferable, single_or_tuple, tuple_or_single, Cx, R};
use super::{checked_product, is_permutation, InferError};
use crate::attrs::AttrKey;
use crate::collective_groups::{group_mode, GroupMode};
use crate::module::{HloInstruction, HloModule};
use crate::opcode::Opcode;
use crate::replica_groups::CollectiveDeviceList;
use crate::shape::Shape;

/// Size of the first replica group as written, without expanding the list;
/// `None` when the groups are empty or absent. Errors on malformed lists.
pub fn written_group_size(groups: Option<&CollectiveDeviceList>) -> Result<Option<i64>, String> {
    match groups {
        None => Ok(None),
        Some(CollectiveDeviceList::Explicit(g)) => Ok(g.first().map(|g| g.len() as i64)),
        Some(CollectiveDeviceList::Iota {
            num_groups,
            group_size,
            reshape_dims,
            perm,
        }) => {
            if *num_groups <= 0 || *group_size <= 0 {
                return Err(format!(
                    "iota replica groups [{num_groups},{group_size}] must be positive"
                ));
            }
            let total = checked_product(reshape_dims)
                .ok_or_else(|| "iota replica groups: bad reshape dimensions".to_string())?;
            if (*num_groups as i128) * (*group_size as i128) != total as i128 {
                return Err(format!(
                    "iota replica groups [{num_groups},{group_size}] do not cover the {total} devices of the reshape"
                ));
            }
            if !perm.is_empty() && !is_permutation(perm, reshape_dims.len()) {
                return Err("iota replica groups: transpose is not a permutation".into());
            }
            Ok(Some(*group_size))
        }
        Some(CollectiveDeviceList::MeshAxes { mesh, axes }) => {
            let mut size: i64 = 1;
            for (name, s) in &mesh.axes {
                if *s <= 0 {
                    return Err(format!("mesh axis '{name}' has non-positive size {s}"));
                }
            }
            for a in axes {
                let Some(total) = mesh.axis_size(&a.name) else {
                    return Err(format!(
                        "replica groups name unknown mesh axis '{}'",
                        a.name
                    ));
                };
                let s = match a.sub_axis {
                    None => total,
                    Some((pre, sub)) => {
                        let ok = pre > 0
                            && sub > 0
                            && (pre as i128 * sub as i128) <= total as i128
                            && total % (pre * sub) == 0;
                        if !ok {
                            return Err(format!(
                                "sub-axis '{}':({pre}){sub} does not divide the axis of size {total}",
                                a.name
                            ));
                        }
                        sub
                    }
                };
                size = size
                    .checked_mul(s)
                    .ok_or_else(|| "replica group size overflows".to_string())?;
            }
            Ok(Some(size))
        }
    }
}

/// Number of participants in each group of a collective (XLA's
/// `GetSubgroupSize`). `Ok(None)` when the groups are empty and no module
/// supplies the replica and partition counts.
pub fn collective_group_size(
    module: Option<&HloModule>,
    instr: &HloInstruction,
    opcode: Opcode,
) -> Result<Option<i64>, String> {
    let mode = group_mode(instr, opcode).map_err(|e| e.to_string())?;
    let written = written_group_size(instr.replica_groups())?;
    let (replicas, partitions) = match module {
        Some(m) => (Some(m.replica_count()), Some(m.num_partitions())),
        None => (None, None),
    };
    let size = match mode {
        GroupMode::CrossReplica => written.or(replicas),
        GroupMode::CrossReplicaAndPartition => match (written.or(replicas), partitions) {
            (Some(r), Some(p)) => r.checked_mul(p),
            (Some(r), None) if module.is_none() => Some(r),
            _ => None,
        },
        GroupMode::FlattenedId => match written {
            Some(w) => Some(w),
            None => {
                return Err(
                    "empty replica groups are not allowed with use_global_device_ids=true".into(),
                )
            }
        },
        GroupMode::CrossPartition => written.or(partitions),
    };
    match size {
        Some(s) if s <= 0 => Err(format!("replica group size {s} must be positive")),
        s => Ok(s),
    }
}

pub(super) fn infer_gather_scatter_collective(opcode: Opcode, cx: &Cx) -> R<Shape> {
    if cx.ops.is_empty() {
        invalid!("{opcode} needs at least one operand");
    }
    let dims = cx.instr.dimensions();
    if dims.len() != 1 {
        invalid!("{opcode} needs exactly one dimension, got {dims:?}");
    }
    let size = match collective_group_size(cx.module, cx.instr, opcode) {
        Ok(Some(s)) => s,
        Ok(None) => return not_inferable("empty replica groups and no module configuration"),
        Err(e) => invalid!("{e}"),
    };
    let mut out = Vec::with_capacity(cx.ops.len());
    for i in 0..cx.ops.len() {
        let a = cx.array(i)?;
        let d = dim_index(dims[0], a.rank(), &format!("{opcode} dimension"))?;
        let mut new_dims = a.dims.clone();
        if opcode == Opcode::AllGather {
            new_dims[d] = match a.dims[d].checked_mul(size) {
                Some(v) => v,
                None => invalid!("all-gather size overflows"),
            };
        } else {
            if a.dims[d] % size != 0 {
                invalid!(
                    "reduce-scatter dimension size {} is not divisible by the group size {size}",
                    a.dims[d]
                );
            }
            new_dims[d] = a.dims[d] / size;
        }
        out.push(array_shape(a.element_type, new_dims));
    }
    Ok(single_or_tuple(out))
}

/// `all-reduce`, `all-reduce-start` and `collective-broadcast`: the operands' shapes.
pub(super) fn infer_all_reduce(opcode: Opcode, cx: &Cx) -> R<Shape> {
    if cx.ops.is_empty() {
        invalid!("{opcode} needs at least one operand");
    }
    for i in 0..cx.ops.len() {
        cx.array(i)?;
    }
    Ok(tuple_or_single(cx.ops))
}

pub(super) fn infer_all_to_all(opcode: Opcode, cx: &Cx) -> R<Shape> {
    if cx.ops.is_empty() {
        invalid!("all-to-all needs at least one operand");
    }
    let Some(split) = cx.instr.ints_attr(AttrKey::Dimensions) else {
        return Ok(Shape::Tuple(cx.ops.iter().map(|s| (*s).clone()).collect()));
    };
    if split.len() != 1 {
        invalid!("all-to-all needs exactly one split dimension, got {split:?}");
    }
    let size = collective_group_size(cx.module, cx.instr, opcode).map_err(InferError::Invalid)?;
    for i in 0..cx.ops.len() {
        let a = cx.array(i)?;
        let d = dim_index(split[0], a.rank(), "all-to-all split dimension")?;
        if let Some(n) = size {
            if a.dims[d] % n != 0 {
                invalid!(
                    "all-to-all split dimension size {} is not divisible by the group size {n}",
                    a.dims[d]
                );
            }
        }
    }
    Ok(tuple_or_single(cx.ops))
}

pub(super) fn infer_collective_permute(cx: &Cx) -> R<Shape> {
    if cx.ops.is_empty() {
        invalid!("collective-permute needs at least one operand");
    }
    if cx.instr.has_attr(AttrKey::SliceSizes) || cx.ops.len() == 4 {
        // In-place form: input, output buffer, input and output offsets.
        if cx.ops.len() != 4 {
            invalid!("in-place collective-permute needs 4 operands");
        }
        return Ok(cx.op(1)?.clone());
    }
    Ok(tuple_or_single(cx.ops))
}
