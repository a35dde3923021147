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
use xla_hlo_utils::InstrSharding;

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
    level: i64,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    if level == PASS_THROUGH_LEVEL {
        return None;
    }
    Some(user_sharding.clone())
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
