//! Dot and convolution (XLA's `InferDotShardingFromOperands`,
//! `InferConvolutionShardingFromOperands` and `InferDotOperandSharding`).
//! Both are seen through `DotDims` (batch, contracting, lhs/rhs
//! non-contracting and true spatial dims): forward, each operand's tiles
//! on batch and its own non-contracting dims move to the result (the
//! contracted and other side's dims replicated); backward, the result's
//! tiles move back to an operand, merged with what the other operand's
//! tiles imply. A convolution whose spatial dims are unsharded and
//! ungrouped is treated as a dot.
//!
//! Invariant: when both operands offer a sharding, the one the result's
//! single-user chain would ask for wins (the look-ahead), then the one of
//! the larger operand; the other is merged in when compatible.

use crate::dims::{self, DimCorrespondence, DotDims, NO_DIM};
use crate::graph::Node;
use crate::state::PropagationState;
use xla_hlo_ir::AttrKey;
use xla_hlo_utils::merge::{is_subtiling_or_equal, merge_sharding_leaf, return_improved};
use xla_hlo_utils::ops::{
    partially_replicate_all_except, partially_replicate_on_dims, transpose_sharding,
    transpose_with_collapsed_dims,
};
use xla_hlo_utils::{InstrSharding, Sharding};

/// The sharding the single-user chain below a node would ask of it (the
/// backward rules' look-ahead, handed in by the dispatch).
pub(super) type UserShardingLookahead =
    fn(&mut PropagationState<'_>, Node) -> Option<InstrSharding>;

/// The other operand of a binary op.
fn other(operand_index: usize) -> usize {
    1 - operand_index
}

/// Maps dims of one array to dims of another through `pairs` of
/// `(from, to)` dims, skipping pairs out of either rank: returns
/// `(from_to_to, to_to_from)`, `NO_DIM` where a dim is unmapped.
fn dim_maps(
    pairs: impl Iterator<Item = (i64, i64)>,
    from_rank: usize,
    to_rank: usize,
) -> (Vec<i64>, Vec<i64>) {
    let mut from_to_to = vec![NO_DIM; from_rank];
    let mut to_to_from = vec![NO_DIM; to_rank];
    for (from, to) in pairs {
        if from >= 0 && (from as usize) < from_rank && to >= 0 && (to as usize) < to_rank {
            from_to_to[from as usize] = to;
            to_to_from[to as usize] = from;
        }
    }
    (from_to_to, to_to_from)
}

/// The non-negative dims of operand `operand_index` in `correspondences`.
fn operand_dims(
    correspondences: &[DimCorrespondence],
    operand_index: usize,
) -> impl Iterator<Item = usize> + '_ {
    correspondences
        .iter()
        .map(move |d| d.operand_dim(operand_index))
        .filter(|&dim| dim >= 0)
        .map(|dim| dim as usize)
}

/// The result's sharding implied by operand `operand_index` alone.
fn result_from_operand(
    state: &PropagationState,
    node: Node,
    dot_dims: &DotDims,
    operand_index: usize,
) -> Option<Sharding> {
    let operand = state.graph.operand(node, operand_index)?;
    let sharding = state.array_sharding(operand)?;
    if sharding.is_tile_maximal() {
        return Some(sharding.clone());
    }
    let mut replicated_dims: Vec<usize> =
        operand_dims(&dot_dims.contracting, operand_index).collect();
    replicated_dims.extend(operand_dims(
        dot_dims.non_contracting(other(operand_index)),
        operand_index,
    ));
    let replicated = partially_replicate_on_dims(sharding, &replicated_dims);
    let (result_to_operand, operand_to_result) = dim_maps(
        dot_dims
            .batch
            .iter()
            .chain(dot_dims.non_contracting(operand_index))
            .map(|d| (d.output, d.operand_dim(operand_index))),
        state.graph.shape(node).rank(),
        state.graph.shape(operand).rank(),
    );
    Some(
        transpose_with_collapsed_dims(&replicated, &operand_to_result, &result_to_operand)
            .unwrap_or(Sharding::Replicated),
    )
}

/// `InferDotShardingFromOperands`.
pub(super) fn dot_from_operands(
    state: &mut PropagationState,
    node: Node,
    dot_dims: &DotDims,
    may_combine: bool,
    lookahead: UserShardingLookahead,
) -> bool {
    let shape = state.graph.shape(node);
    let current = state.sharding(node).cloned();
    let mut candidates: [Option<InstrSharding>; 2] = [None, None];
    for (operand_index, slot) in candidates.iter_mut().enumerate() {
        let Some(operand) = state.graph.operand(node, operand_index) else {
            continue;
        };
        if !state.is_spatially_partitioned(operand) {
            continue;
        }
        if let Some(candidate) = result_from_operand(state, node, dot_dims, operand_index) {
            *slot = return_improved(
                &InstrSharding::Single(candidate),
                current.as_ref(),
                Some(shape.dims()),
                may_combine,
                false,
            );
        }
    }
    let (first, second) = match candidates {
        [None, None] => return false,
        [Some(only), None] | [None, Some(only)] => {
            state.set_sharding(node, only);
            return true;
        }
        [Some(lhs), Some(rhs)] => preferred_order(state, node, lhs, rhs, lookahead),
    };
    state.set_sharding(node, first);
    state.maybe_improve(node, second, may_combine, false);
    true
}

/// Orders the lhs and rhs candidates: first the one the look-ahead's
/// sharding subtiles (when exactly one does), else the larger operand's.
fn preferred_order(
    state: &mut PropagationState,
    node: Node,
    lhs: InstrSharding,
    rhs: InstrSharding,
    lookahead: UserShardingLookahead,
) -> (InstrSharding, InstrSharding) {
    let dims = state.graph.shape(node).dims();
    if let Some(wanted) = lookahead(state, node) {
        if let (Some(wanted), Some(lhs_leaf), Some(rhs_leaf)) =
            (wanted.as_single(), lhs.as_single(), rhs.as_single())
        {
            let fits_lhs = is_subtiling_or_equal(dims, wanted, lhs_leaf);
            let fits_rhs = is_subtiling_or_equal(dims, wanted, rhs_leaf);
            if fits_lhs && !fits_rhs {
                return (lhs, rhs);
            }
            if !fits_lhs && fits_rhs {
                return (rhs, lhs);
            }
        }
    }
    let operand_bytes = |operand_index: usize| {
        state
            .graph
            .operand(node, operand_index)
            .map(|operand| state.graph.shape(operand).byte_size())
            .unwrap_or(0)
    };
    if operand_bytes(0) < operand_bytes(1) {
        (rhs, lhs)
    } else {
        (lhs, rhs)
    }
}

/// The product of an operand's tile counts over the convolution's true
/// spatial dims (1 when it is not tiled).
fn spatial_partitions(
    state: &PropagationState,
    node: Node,
    dot_dims: &DotDims,
    operand_index: usize,
) -> i64 {
    let Some(sharding) = state
        .graph
        .operand(node, operand_index)
        .and_then(|operand| state.array_sharding(operand))
    else {
        return 1;
    };
    if !sharding.is_tiled() {
        return 1;
    }
    dot_dims
        .conv_spatial
        .iter()
        .map(|d| sharding.tile_dim(d.operand_dim(operand_index).max(0) as usize))
        .product()
}

/// `InferConvolutionShardingFromOperands`.
pub(super) fn convolution_from_operands(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
    lookahead: UserShardingLookahead,
) -> bool {
    let Some(dot_dims) = dims::conv_dims(&state.graph, node) else {
        return false;
    };
    let instr = state.graph.instr(node);
    let ungrouped = instr.int_attr(AttrKey::BatchGroupCount).unwrap_or(1) == 1
        && instr.int_attr(AttrKey::FeatureGroupCount).unwrap_or(1) == 1;
    if dot_dims.conv_spatial.is_empty()
        || (spatial_partitions(state, node, &dot_dims, 0) == 1
            && spatial_partitions(state, node, &dot_dims, 1) == 1
            && ungrouped)
    {
        return dot_from_operands(state, node, &dot_dims, may_combine, lookahead);
    }
    let Some(lhs) = state.graph.operand(node, 0) else {
        return false;
    };
    let Some(lhs_sharding) = state.partitioned_array_sharding(lhs).cloned() else {
        return false;
    };
    if lhs_sharding.is_tile_maximal() {
        return state.maybe_improve_array(node, lhs_sharding, may_combine, false);
    }
    let Some(conv_dims) = instr.conv_dimension_numbers() else {
        return false;
    };
    if dims::conv_kernel_small(&state.graph, node) {
        // A small kernel: the result is tiled like the input, dim for dim.
        if lhs_sharding.tile_dim(conv_dims.input_feature.max(0) as usize) > 1 {
            return false;
        }
        let rank = instr.shape.rank();
        let mut result_to_lhs = vec![0usize; rank];
        let mut map = |result_dim: i64, lhs_dim: i64| {
            if result_dim >= 0 && (result_dim as usize) < rank {
                result_to_lhs[result_dim as usize] = lhs_dim.max(0) as usize;
            }
        };
        map(conv_dims.output_batch, conv_dims.input_batch);
        map(conv_dims.output_feature, conv_dims.input_feature);
        for (k, &result_dim) in conv_dims.output_spatial.iter().enumerate() {
            map(
                result_dim,
                conv_dims.input_spatial.get(k).copied().unwrap_or(0),
            );
        }
        let candidate = transpose_sharding(&lhs_sharding, &result_to_lhs);
        return state.maybe_improve_array(node, candidate, may_combine, false);
    }
    // A large kernel: only the batch dim's tiles carry over.
    let candidate =
        partially_replicate_all_except(&lhs_sharding, &[conv_dims.input_batch.max(0) as usize]);
    state.maybe_improve_array(node, candidate, may_combine, false)
}

/// `InferDotOperandSharding`: what `dot` asks of operand `operand_index`,
/// from its own sharding and the other operand's.
fn operand_sharding(
    state: &PropagationState,
    dot: Node,
    operand_index: usize,
    dot_dims: &DotDims,
    may_combine: bool,
) -> Sharding {
    let graph = &state.graph;
    let other_index = other(operand_index);
    let own_non_contracting = dot_dims.non_contracting(operand_index);
    let other_non_contracting = dot_dims.non_contracting(other_index);
    let result_dims_to_replicate: Vec<usize> = other_non_contracting
        .iter()
        .chain(&dot_dims.contracting)
        .filter(|d| d.output >= 0)
        .map(|d| d.output as usize)
        .collect();
    let mut other_dims_to_replicate: Vec<usize> =
        operand_dims(other_non_contracting, other_index).collect();
    other_dims_to_replicate.extend(operand_dims(own_non_contracting, other_index));
    let operand_rank = graph
        .operand(dot, operand_index)
        .map(|operand| graph.shape(operand).rank())
        .unwrap_or(0);
    let mut sharding = Sharding::Replicated;
    if let Some(dot_sharding) = state.array_sharding(dot) {
        let replicated = partially_replicate_on_dims(dot_sharding, &result_dims_to_replicate);
        let (result_to_operand, operand_to_result) = dim_maps(
            dot_dims
                .batch
                .iter()
                .chain(own_non_contracting)
                .map(|d| (d.output, d.operand_dim(operand_index))),
            graph.shape(dot).rank(),
            operand_rank,
        );
        sharding =
            transpose_with_collapsed_dims(&replicated, &result_to_operand, &operand_to_result)
                .unwrap_or(Sharding::Replicated);
    }
    let Some(other_operand) = graph.operand(dot, other_index) else {
        return sharding;
    };
    let Some(other_sharding) = state.partitioned_array_sharding(other_operand) else {
        return sharding;
    };
    let replicated = partially_replicate_on_dims(other_sharding, &other_dims_to_replicate);
    let (other_to_operand, operand_to_other) = dim_maps(
        dot_dims
            .batch
            .iter()
            .chain(&dot_dims.contracting)
            .map(|d| (d.operand_dim(other_index), d.operand_dim(operand_index))),
        graph.shape(other_operand).rank(),
        operand_rank,
    );
    if let Some(mut from_other) =
        transpose_with_collapsed_dims(&replicated, &other_to_operand, &operand_to_other)
    {
        if merge_sharding_leaf(&sharding, &mut from_other, may_combine) {
            sharding = from_other;
        }
    }
    sharding
}

/// What a dot asks of `operand`.
pub(super) fn operand_sharding_from_dot(
    state: &PropagationState,
    operand: Node,
    dot: Node,
    may_combine: bool,
) -> Option<InstrSharding> {
    let operand_index = state.graph.operand_index(dot, operand)?;
    let dot_dims = dims::dot_dims(&state.graph, dot);
    Some(InstrSharding::Single(operand_sharding(
        state,
        dot,
        operand_index,
        &dot_dims,
        may_combine,
    )))
}

/// What a convolution without true spatial dims asks of `operand` (as a
/// dot); nothing when it has some.
pub(super) fn operand_sharding_from_convolution(
    state: &PropagationState,
    operand: Node,
    convolution: Node,
    may_combine: bool,
) -> Option<InstrSharding> {
    let dot_dims = dims::conv_dims(&state.graph, convolution)?;
    if !dot_dims.conv_spatial.is_empty() {
        return None;
    }
    let operand_index = state.graph.operand_index(convolution, operand)?;
    Some(InstrSharding::Single(operand_sharding(
        state,
        convolution,
        operand_index,
        &dot_dims,
        may_combine,
    )))
}
