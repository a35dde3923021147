//! Tuples and control flow: `tuple` and `get-tuple-element` move element
//! shardings in and out of tuple shardings; a `while` merges its init's
//! sharding into its own; a parameter of a conditional branch or of a
//! called computation takes the sharding of the argument it receives. (The
//! driver keeps a while's body and condition, and the branches' roots, in
//! step with the caller.)
//!
//! Invariant: a tuple's element shardings are only ever replaced by more
//! specific ones once the tuple has a sharding.

use crate::graph::Node;
use crate::state::PropagationState;
use xla_hlo_ir::AttrKey;
use xla_hlo_utils::merge::{is_leaf_more_specific, is_more_specific, merge_sharding};
use xla_hlo_utils::ops::replicate_all_data_dims;
use xla_hlo_utils::sharding::leaf_count;
use xla_hlo_utils::{InstrSharding, Sharding};

/// The `index` attribute of a get-tuple-element.
fn tuple_index(state: &PropagationState, gte: Node) -> usize {
    state
        .graph
        .instr(gte)
        .int_attr(AttrKey::Index)
        .unwrap_or(0)
        .max(0) as usize
}

/// A get-tuple-element takes its element of the operand's sharding; a
/// manual element replaces whatever it had.
pub(super) fn get_tuple_element_from_operand(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let Some(operand) = state.graph.operand(node, 0) else {
        return false;
    };
    let Some(tuple_sharding) = state.partitioned_sharding(operand) else {
        return false;
    };
    let index = tuple_index(state, node);
    let Some(element) = tuple_sharding.sub_sharding(state.graph.shape(operand), index) else {
        return false;
    };
    if element.is_manual() {
        let changed = state.sharding(node) != Some(&element);
        if changed {
            state.set_sharding(node, element);
        }
        return changed;
    }
    let single_user = state.has_single_non_root_user(node);
    state.maybe_improve(node, element, may_combine, single_user)
}

/// A tuple gathers its operands' shardings: each element takes its
/// operand's leaves when the tuple had no sharding, afterwards only more
/// specific ones.
pub(super) fn tuple_from_operands(state: &mut PropagationState, node: Node) -> bool {
    let operands: Vec<Node> = state.graph.operands(node).collect();
    if !operands
        .iter()
        .any(|&operand| state.is_spatially_partitioned(operand))
    {
        return false;
    }
    let shape = state.graph.shape(node);
    let had_sharding = state.has_sharding(node);
    let mut leaves: Vec<Sharding> = match state.sharding(node) {
        Some(InstrSharding::Tuple(leaves)) => leaves.to_vec(),
        Some(InstrSharding::Single(leaf)) => vec![leaf.clone(); leaf_count(shape)],
        None => vec![Sharding::Replicated; leaf_count(shape)],
    };
    let mut offset = 0usize;
    for &operand in &operands {
        if let Some(sharding) = state.sharding(operand) {
            for (k, leaf) in sharding.leaves().iter().enumerate() {
                if let Some(slot) = leaves.get_mut(offset + k) {
                    if !had_sharding || is_leaf_more_specific(leaf, slot) {
                        *slot = leaf.clone();
                    }
                }
            }
        }
        offset += leaf_count(state.graph.shape(operand));
    }
    let new = InstrSharding::tuple(leaves);
    if state.sharding(node) != Some(&new) {
        state.store_normalized(node, new);
        return true;
    }
    false
}

/// A while takes its init's sharding, merged with its own.
pub(super) fn while_from_operand(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let Some(init) = state.graph.operand(node, 0) else {
        return false;
    };
    let Some(mut sharding) = state.sharding(init).cloned() else {
        return false;
    };
    if let Some(current) = state.sharding(node) {
        merge_sharding(current, &mut sharding, may_combine);
    }
    state.maybe_improve(node, sharding, may_combine, false)
}

/// A parameter of a conditional branch or called computation takes its
/// argument's sharding.
pub(super) fn parameter_from_argument(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let Some(argument) = state.graph.caller_argument(node) else {
        return false;
    };
    let Some(sharding) = state.sharding(argument).cloned() else {
        return false;
    };
    state.maybe_improve(node, sharding, may_combine, false)
}

/// What a tuple user asks of its operand: the operand's element, or the
/// most specific of its elements when the operand appears more than once.
pub(super) fn operand_sharding_from_tuple(
    state: &PropagationState,
    operand: Node,
    tuple: Node,
    tuple_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    let graph = &state.graph;
    let tuple_shape = graph.shape(tuple);
    let first_index = graph.operand_index(tuple, operand)?;
    let mut element = tuple_sharding.sub_sharding(tuple_shape, first_index)?;
    for (index, other) in graph.operands(tuple).enumerate() {
        if other == operand && index != first_index {
            if let Some(alternative) = tuple_sharding.sub_sharding(tuple_shape, index) {
                if alternative.is_tuple() == element.is_tuple()
                    && is_more_specific(&alternative, &element)
                {
                    element = alternative;
                }
            }
        }
    }
    Some(element)
}

/// What a get-tuple-element asks of its tuple operand: the operand's
/// current sharding (or a replicated one) with the GTE's element replaced
/// by the GTE's sharding.
pub(super) fn operand_sharding_from_get_tuple_element(
    state: &PropagationState,
    operand: Node,
    gte: Node,
    gte_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    let operand_shape = state.graph.shape(operand);
    let offset = InstrSharding::leaf_offset(operand_shape, tuple_index(state, gte));
    // The operand's sharding as a tuple; without one, every element
    // replicated (keeping `template`'s manual or replicated subgroups).
    let current_leaves = |template: &Sharding| -> InstrSharding {
        match state.sharding(operand) {
            Some(InstrSharding::Tuple(leaves)) => InstrSharding::Tuple(leaves.clone()),
            Some(InstrSharding::Single(leaf)) => {
                InstrSharding::single_for(operand_shape, leaf.clone())
            }
            None => InstrSharding::tuple(
                operand_shape
                    .leaves()
                    .iter()
                    .map(|leaf_shape| replicate_all_data_dims(template, Some(leaf_shape.rank())))
                    .collect(),
            ),
        }
    };
    match gte_sharding {
        InstrSharding::Single(element) => {
            let InstrSharding::Tuple(leaves) = current_leaves(element) else {
                return None;
            };
            if leaves.get(offset) == Some(element) {
                return Some(InstrSharding::Tuple(leaves));
            }
            let mut leaves = leaves.to_vec();
            *leaves.get_mut(offset)? = element.clone();
            Some(InstrSharding::tuple(leaves))
        }
        InstrSharding::Tuple(elements) => {
            let first = elements.first()?;
            let InstrSharding::Tuple(leaves) = current_leaves(first) else {
                return None;
            };
            let mut leaves = leaves.to_vec();
            for (k, leaf) in elements.iter().enumerate() {
                *leaves.get_mut(offset + k)? = leaf.clone();
            }
            Some(InstrSharding::tuple(leaves))
        }
    }
}
