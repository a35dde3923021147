//! Ops that copy windows of data: concatenate, dynamic-slice,
//! dynamic-update-slice, slice and pad. Their operands and results have
//! the same rank and dims correspond one to one; dims that are sliced
//! (sizes differ) lose their tiles, the others keep them.
//!
//! Invariants: at `PASS_THROUGH_LEVEL` a concatenate passes a sharding
//! forward only when every operand is a tiled reshape of a parameter or
//! GTE that is not tiled along the concatenated dim, and dynamic slices
//! take nothing from their users.

use super::pass_through::representative_operand;
use crate::graph::{Graph, Node};
use crate::level::PASS_THROUGH_LEVEL;
use crate::state::PropagationState;
use xla_hlo_ir::Opcode;
use xla_hlo_utils::ops::partially_replicate_on_dims;
use xla_hlo_utils::{InstrSharding, Sharding, TileArray};

/// The dims whose sizes differ between a slice-like op's result and the
/// operand it slices.
fn sliced_dims(result_dims: &[i64], operand_dims: &[i64]) -> Vec<usize> {
    (0..result_dims.len())
        .filter(|&i| operand_dims.get(i) != Some(&result_dims[i]))
        .collect()
}

pub(super) fn concatenate_from_operands(
    state: &mut PropagationState,
    node: Node,
    level: i64,
    may_combine: bool,
) -> bool {
    let Some(representative) = representative_operand(state, node) else {
        return false;
    };
    if !state.is_spatially_partitioned(representative) {
        return false;
    }
    if level == PASS_THROUGH_LEVEL {
        let concatenated_dims = state.graph.instr(node).dimensions();
        for operand in state.graph.operands(node) {
            if !can_pass_through_concatenate(state, operand) {
                return false;
            }
            let sharding = state.array_sharding(operand);
            for &dim in concatenated_dims {
                if sharding.is_some_and(|sharding| sharding.tile_dim(dim as usize) > 1) {
                    return false;
                }
            }
        }
    }
    let Some(sharding) = state.sharding(representative).cloned() else {
        return false;
    };
    let single_user = state.has_single_non_root_user(node);
    state.maybe_improve(node, sharding, may_combine, single_user)
}

/// At `PASS_THROUGH_LEVEL`, a concatenate operand must be a tiled reshape
/// of a parameter or GTE.
fn can_pass_through_concatenate(state: &PropagationState, operand: Node) -> bool {
    let graph = &state.graph;
    state.is_spatially_partitioned(operand)
        && state
            .array_sharding(operand)
            .is_some_and(|sharding| sharding.num_tiles() > 1)
        && graph.opcode(operand) == Opcode::Reshape
        && graph.operand(operand, 0).is_some_and(|source| {
            matches!(
                graph.opcode(source),
                Opcode::Parameter | Opcode::GetTupleElement
            )
        })
}

/// A dynamic-slice (from its operand) or dynamic-update-slice (from its
/// update) takes the sliced array's sharding with the sliced dims
/// replicated.
pub(super) fn dynamic_slice_from_sliced_array(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let sliced_index = if state.graph.opcode(node) == Opcode::DynamicSlice {
        0
    } else {
        1
    };
    let Some(sliced) = state.graph.operand(node, sliced_index) else {
        return false;
    };
    let Some(sharding) = state.partitioned_array_sharding(sliced).cloned() else {
        return false;
    };
    if sharding.is_manual() {
        return false;
    }
    let dims = sliced_dims(
        state.graph.shape(node).dims(),
        state.graph.shape(sliced).dims(),
    );
    let candidate = partially_replicate_on_dims(&sharding, &dims);
    let single_user = state.has_single_non_root_user(node);
    state.maybe_improve_array(node, candidate, may_combine, single_user)
}

/// A dynamic-update-slice takes its update's sharding (as a dynamic slice
/// does) and then its base operand's.
pub(super) fn dynamic_update_slice_from_operands(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let mut changed = dynamic_slice_from_sliced_array(state, node, may_combine);
    if let Some(base) = state.graph.operand(node, 0) {
        if let Some(sharding) = state.partitioned_sharding(base).cloned() {
            changed |= state.maybe_improve(node, sharding, may_combine, false);
        }
    }
    changed
}

pub(super) fn operand_sharding_from_concatenate(
    graph: &Graph,
    operand: Node,
    concatenate: Node,
    level: i64,
    user_sharding: &InstrSharding,
    is_spmd: bool,
) -> Option<InstrSharding> {
    if level == PASS_THROUGH_LEVEL {
        return None;
    }
    // SPMD tiles every operand on all devices, like the result; outside
    // SPMD an operand concatenated along a tiled dim is tiled on the
    // devices its rows land on.
    let (false, Some(leaf)) = (is_spmd, user_sharding.as_single()) else {
        return Some(user_sharding.clone());
    };
    let instr = graph.instr(concatenate);
    let cdim = instr
        .dimensions()
        .first()
        .and_then(|&d| usize::try_from(d).ok())?;
    let Some(tiled) = leaf.as_tiled() else {
        return Some(user_sharding.clone());
    };
    if leaf.tile_dim(cdim) == 1 || !tiled.subgroups().is_empty() {
        return Some(user_sharding.clone());
    }
    let mut start_offset = 0;
    for other in graph.operands(concatenate) {
        if other == operand {
            break;
        }
        start_offset += graph.shape(other).dims().get(cdim).copied().unwrap_or(0);
    }
    let tiles = tiled.tiles();
    let tile_size = ceil_div(instr.shape.dims().get(cdim).copied()?, tiles.dim(cdim));
    let length = graph.shape(operand).dims().get(cdim).copied()?;
    let first = start_offset / tile_size;
    let end = ceil_div(start_offset + length, tile_size).min(tiles.dim(cdim));
    let mut dims = tiles.dims().to_vec();
    dims[cdim] = (end - first).max(1);
    let mut devices = Vec::new();
    let count: i64 = dims.iter().product();
    let mut index = vec![0i64; dims.len()];
    for _ in 0..count {
        let mut at = index.clone();
        at[cdim] += first;
        devices.push(tiles.get(&at));
        for d in (0..dims.len()).rev() {
            index[d] += 1;
            if index[d] < dims[d] {
                break;
            }
            index[d] = 0;
        }
    }
    if devices.len() == 1 {
        return Some(InstrSharding::Single(Sharding::Maximal(devices[0])));
    }
    let tiles = TileArray::new(dims, devices).ok()?;
    Some(InstrSharding::Single(Sharding::tile(tiles)))
}

fn ceil_div(a: i64, b: i64) -> i64 {
    if b <= 0 {
        return a;
    }
    (a + b - 1) / b
}

/// What a dynamic-slice asks of its operand, or a dynamic-update-slice of
/// its base and update: the base its own sharding, the sliced array the
/// user's with the sliced dims replicated. Nothing at
/// `PASS_THROUGH_LEVEL`, nor for the offsets.
pub(super) fn operand_sharding_from_dynamic_slice(
    graph: &Graph,
    operand: Node,
    user: Node,
    level: i64,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    if level == PASS_THROUGH_LEVEL {
        return None;
    }
    if user_sharding.is_replicated() {
        return Some(user_sharding.clone());
    }
    let user_opcode = graph.opcode(user);
    if user_opcode == Opcode::DynamicUpdateSlice && graph.operand(user, 0) == Some(operand) {
        return Some(user_sharding.clone());
    }
    let sliced_index = if user_opcode == Opcode::DynamicSlice {
        0
    } else {
        1
    };
    let sliced = graph.operand(user, sliced_index)?;
    if sliced != operand {
        return None;
    }
    let dims = sliced_dims(graph.shape(user).dims(), graph.shape(sliced).dims());
    Some(InstrSharding::Single(partially_replicate_on_dims(
        user_sharding.as_single()?,
        &dims,
    )))
}

/// A pad's operand (not its padding value) takes the pad's sharding.
pub(super) fn operand_sharding_from_pad(
    graph: &Graph,
    operand: Node,
    pad: Node,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    (graph.operand(pad, 0) == Some(operand)).then(|| user_sharding.clone())
}
