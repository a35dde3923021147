//! Ops that move, add or regroup dims without moving data between tiles:
//! broadcast, reshape, transpose and reverse. Forward, the operand's tiles
//! follow the dims to the result; backward, the result's tiles follow them
//! back to the operand.
//!
//! Invariants: a broadcast passes a sharding forward only from
//! `BROADCAST_FORWARD_LEVEL`, and never a replicated one (it would override
//! what its users want).

use crate::graph::{Graph, Node};
use crate::level::BROADCAST_FORWARD_LEVEL;
use crate::state::{non_negative_dims, PropagationState};
use xla_hlo_utils::ops::{
    broadcast_operand_sharding, broadcast_sharding, propagate_through_reshape, reverse_sharding,
    transpose_sharding,
};
use xla_hlo_utils::{InstrSharding, Sharding};

/// The node's operand's array sharding, if spatially partitioned.
fn partitioned_operand(state: &PropagationState, node: Node) -> Option<Sharding> {
    let operand = state.graph.operand(node, 0)?;
    state.partitioned_array_sharding(operand).cloned()
}

/// Offers `candidate` to `node`, resizing aggressively for a single user.
fn offer(state: &mut PropagationState, node: Node, candidate: Sharding, may_combine: bool) -> bool {
    let single_user = state.has_single_non_root_user(node);
    state.maybe_improve_array(node, candidate, may_combine, single_user)
}

pub(super) fn broadcast_from_operand(
    state: &mut PropagationState,
    node: Node,
    level: i64,
    may_combine: bool,
) -> bool {
    if level < BROADCAST_FORWARD_LEVEL {
        return false;
    }
    let Some(sharding) = partitioned_operand(state, node) else {
        return false;
    };
    if sharding.is_replicated() {
        return false;
    }
    let instr = state.graph.instr(node);
    let candidate = broadcast_sharding(
        &sharding,
        &non_negative_dims(instr.dimensions()),
        instr.shape.rank(),
    );
    offer(state, node, candidate, may_combine)
}

pub(super) fn transpose_from_operand(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let Some(sharding) = partitioned_operand(state, node) else {
        return false;
    };
    let permutation = non_negative_dims(state.graph.instr(node).dimensions());
    let candidate = transpose_sharding(&sharding, &permutation);
    offer(state, node, candidate, may_combine)
}

pub(super) fn reshape_from_operand(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let Some(operand) = state.graph.operand(node, 0) else {
        return false;
    };
    let Some(sharding) = state.partitioned_array_sharding(operand) else {
        return false;
    };
    let candidate = propagate_through_reshape(
        state.graph.shape(operand).dims(),
        state.graph.shape(node).dims(),
        sharding,
    );
    offer(state, node, candidate, may_combine)
}

pub(super) fn reverse_from_operand(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let Some(sharding) = partitioned_operand(state, node) else {
        return false;
    };
    let reversed_dims = non_negative_dims(state.graph.instr(node).dimensions());
    let candidate = reverse_sharding(&sharding, &reversed_dims);
    offer(state, node, candidate, may_combine)
}

/// A broadcast's operand keeps the tiles of the dims it maps to.
/// A broadcast's operand takes its user's tiles on the operand's dims;
/// outside SPMD, nothing when the user is tiled on a new dim.
pub(super) fn operand_sharding_from_broadcast(
    graph: &Graph,
    broadcast: Node,
    user_sharding: &InstrSharding,
    is_spmd: bool,
) -> Option<InstrSharding> {
    let instr = graph.instr(broadcast);
    let user = user_sharding.as_single()?;
    let operand_dims = non_negative_dims(instr.dimensions());
    if !is_spmd && user.is_tiled() {
        let tiled_new_dim =
            (0..instr.shape.rank()).any(|d| !operand_dims.contains(&d) && user.tile_dim(d) > 1);
        if tiled_new_dim {
            return None;
        }
    }
    Some(InstrSharding::Single(broadcast_operand_sharding(
        user,
        &operand_dims,
        instr.shape.rank(),
    )))
}

pub(super) fn operand_sharding_from_reshape(
    graph: &Graph,
    operand: Node,
    reshape: Node,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    Some(InstrSharding::Single(propagate_through_reshape(
        graph.shape(reshape).dims(),
        graph.shape(operand).dims(),
        user_sharding.as_single()?,
    )))
}

/// A transpose's operand takes its tiles through the inverse permutation.
pub(super) fn operand_sharding_from_transpose(
    graph: &Graph,
    transpose: Node,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    let permutation = graph.instr(transpose).dimensions();
    let mut inverse = vec![0usize; permutation.len()];
    for (result_dim, &operand_dim) in permutation.iter().enumerate() {
        if operand_dim >= 0 && (operand_dim as usize) < inverse.len() {
            inverse[operand_dim as usize] = result_dim;
        }
    }
    Some(InstrSharding::Single(transpose_sharding(
        user_sharding.as_single()?,
        &inverse,
    )))
}

pub(super) fn operand_sharding_from_reverse(
    graph: &Graph,
    reverse: Node,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    Some(InstrSharding::Single(reverse_sharding(
        user_sharding.as_single()?,
        &non_negative_dims(graph.instr(reverse).dimensions()),
    )))
}
