//! Ops whose result is sharded like one of their operands: elementwise ops
//! (and `map`, `rng`), collectives, pass-through custom-calls, slices, pads,
//! optimization barriers and the like. Forward, the result takes the
//! sharding of its representative operand (`PickRepresentativeOperand`), or
//! for elementwise ops past the first level, each sharded operand's in
//! turn; backward, an operand of the same shape takes its user's sharding.
//!
//! Invariant: the forward rules write only the node they infer.

use super::partitionable::is_pass_through_custom_call;
use crate::graph::{Graph, Node};
use crate::opcodes::{elementwise_opcodes, opcodes_without_rules};
use crate::state::PropagationState;
use xla_hlo_ir::Opcode;
use xla_hlo_utils::merge::is_more_specific;
use xla_hlo_utils::ops::replicate_all_data_dims;
use xla_hlo_utils::InstrSharding;

/// `PickRepresentativeOperand`: the operand whose sharding `node`'s result
/// takes, if any.
pub(super) fn representative_operand(state: &PropagationState, node: Node) -> Option<Node> {
    let graph = &state.graph;
    match graph.opcode(node) {
        elementwise_opcodes!() => match graph.opcode(node) {
            Opcode::Power
            | Opcode::ShiftLeft
            | Opcode::ShiftRightArithmetic
            | Opcode::ShiftRightLogical => first_operand_if_sharded(state, node),
            _ => most_specific_operand(state, node),
        },
        Opcode::Map
        | Opcode::OptimizationBarrier
        | Opcode::Pad
        | Opcode::RaggedAllToAll
        | Opcode::Reverse
        | Opcode::Slice => first_operand_if_sharded(state, node),
        // The first operand even when it has no sharding yet.
        Opcode::CustomCall => {
            if is_pass_through_custom_call(graph, node) {
                graph.operand(node, 0)
            } else {
                None
            }
        }
        Opcode::AllGather
        | Opcode::AllReduce
        | Opcode::AllToAll
        | Opcode::CollectiveBroadcast
        | Opcode::CollectivePermute
        | Opcode::Concatenate
        | Opcode::ReduceScatter
        | Opcode::Sort
        | Opcode::TopK
        | Opcode::While => most_specific_operand(state, node),
        Opcode::Broadcast
        | Opcode::Call
        | Opcode::Conditional
        | Opcode::Constant
        | Opcode::Convolution
        | Opcode::Dot
        | Opcode::DynamicSlice
        | Opcode::DynamicUpdateSlice
        | Opcode::Gather
        | Opcode::GetTupleElement
        | Opcode::Infeed
        | Opcode::Iota
        | Opcode::Outfeed
        | Opcode::Parameter
        | Opcode::Reduce
        | Opcode::ReduceWindow
        | Opcode::Reshape
        | Opcode::Rng
        | Opcode::RngBitGenerator
        | Opcode::Scatter
        | Opcode::SelectAndScatter
        | Opcode::Transpose
        | Opcode::Tuple => None,
        opcodes_without_rules!() => None,
    }
}

fn first_operand_if_sharded(state: &PropagationState, node: Node) -> Option<Node> {
    let operand = state.graph.operand(node, 0)?;
    state.has_sharding(operand).then_some(operand)
}

/// The sharded operand with the most specific sharding; the earliest one
/// among equals, and only shardings of the same kind (tuple or array) as
/// the best so far compete.
fn most_specific_operand(state: &PropagationState, node: Node) -> Option<Node> {
    let mut best: Option<(Node, &InstrSharding)> = None;
    for operand in state.graph.operands(node) {
        let Some(sharding) = state.sharding(operand) else {
            continue;
        };
        let better = match best {
            None => true,
            Some((_, best_sharding)) => {
                best_sharding.is_tuple() == sharding.is_tuple()
                    && is_more_specific(sharding, best_sharding)
            }
        };
        if better {
            best = Some((operand, sharding));
        }
    }
    best.map(|(operand, _)| operand)
}

/// The result takes its representative operand's sharding.
pub(super) fn from_representative_operand(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let Some(operand) = representative_operand(state, node) else {
        return false;
    };
    let Some(sharding) = state.partitioned_sharding(operand).cloned() else {
        return false;
    };
    let single_user = state.has_single_non_root_user(node);
    state.maybe_improve(node, sharding, may_combine, single_user)
}

/// Elementwise ops (with `map` and `rng`): once partial shardings may be
/// merged, every sharded operand is offered in turn (an `rng` takes only
/// its operands' replication); before that, the representative operand's.
pub(super) fn elementwise_from_operands(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    if !may_combine {
        return from_representative_operand(state, node, may_combine);
    }
    let is_rng = state.graph.opcode(node) == Opcode::Rng;
    let rank = state.graph.shape(node).rank();
    let single_user = state.has_single_non_root_user(node);
    let operand_count = state.graph.operand_count(node);
    let mut changed = false;
    for k in 0..operand_count {
        let Some(operand) = state.graph.operand(node, k) else {
            continue;
        };
        let Some(sharding) = state.partitioned_sharding(operand).cloned() else {
            continue;
        };
        if is_rng {
            if let Some(leaf) = sharding.as_single() {
                let replicated = replicate_all_data_dims(leaf, Some(rank));
                changed |= state.maybe_improve_array(node, replicated, may_combine, single_user);
            }
            continue;
        }
        changed |= state.maybe_improve(
            node,
            sharding,
            may_combine,
            operand_count == 1 && single_user,
        );
    }
    changed
}

/// The default backward rule: an operand of the same shape (element types
/// aside) takes its user's sharding.
pub(super) fn same_shape_operand_sharding(
    graph: &Graph,
    operand: Node,
    user: Node,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    graph
        .compatible_shapes(operand, user)
        .then(|| user_sharding.clone())
}
