//! Gather and scatter. Three kinds of dims carry tiles between the
//! operand, the indices and the result (or updates): parallel dims
//! (explicit batching dims, and index dims that count with an iota along an
//! operand dim of slice size 1), index dims (from the indices to the
//! result's batch dims) and passthrough dims (operand dims taken whole by
//! the slices, to the result's offset dims). Forward, each sharded input
//! offers what its dims imply; backward, each input is asked what the
//! result's sharding implies for it.
//!
//! Invariant: a candidate that leaves every dim whole (tile-maximal) from a
//! passthrough mapping is never offered.

use crate::dims::{self, GatherScatterDims};
use crate::graph::Node;
use crate::state::{non_negative_dims, PropagationState};
use xla_hlo_ir::attrs::{GatherDimensionNumbers, ScatterDimensionNumbers};
use xla_hlo_ir::AttrKey;
use xla_hlo_utils::merge::{
    find_common_sharding, merge_sharding_if_compatible, merge_sharding_leaf,
};
use xla_hlo_utils::ops::{partially_replicate_on_dims, propagate_along_dims};
use xla_hlo_utils::{InstrSharding, Sharding};

/// A gather's dimension numbers and slice sizes.
fn gather_dims(
    state: &PropagationState,
    gather: Node,
) -> Option<(GatherDimensionNumbers, Vec<i64>)> {
    let instr = state.graph.instr(gather);
    let dim_numbers = instr.gather_dimension_numbers();
    let slice_sizes = instr.ints_attr(AttrKey::SliceSizes)?.to_vec();
    Some((dim_numbers, slice_sizes))
}

/// A gather's explicit batching dims, if it has any.
fn explicit_gather_batch_dims(dim_numbers: &GatherDimensionNumbers) -> Option<GatherScatterDims> {
    if dim_numbers.operand_batching_dims.is_empty() {
        return None;
    }
    let mut batch_dims = GatherScatterDims {
        operand: non_negative_dims(&dim_numbers.operand_batching_dims),
        indices: non_negative_dims(&dim_numbers.start_indices_batching_dims),
        output: vec![],
    };
    dims::fill_output_dims(
        &mut batch_dims,
        dim_numbers.index_vector_dim,
        &dim_numbers.offset_dims,
    );
    Some(batch_dims)
}

/// A gather's iota-detected parallel dims.
fn iota_gather_parallel_dims(state: &PropagationState, gather: Node) -> Option<GatherScatterDims> {
    let (dim_numbers, slice_sizes) = gather_dims(state, gather)?;
    dims::batch_parallel_dims(
        &state.graph,
        state.graph.operand(gather, 0)?,
        state.graph.operand(gather, 1)?,
        &slice_sizes,
        dim_numbers.index_vector_dim,
        &dim_numbers.start_index_map,
        &dim_numbers.start_indices_batching_dims,
        &dim_numbers.offset_dims,
    )
}

/// The operand's and the indices' tiles on parallel dims move to the
/// result's parallel dims.
fn gather_from_parallel_dims(
    state: &mut PropagationState,
    gather: Node,
    parallel_dims: &GatherScatterDims,
    may_combine: bool,
) -> bool {
    let rank = state.graph.shape(gather).rank();
    let mut changed = false;
    for (operand_index, source_dims) in [
        (0usize, &parallel_dims.operand),
        (1, &parallel_dims.indices),
    ] {
        let Some(operand) = state.graph.operand(gather, operand_index) else {
            continue;
        };
        let Some(sharding) = state.partitioned_array_sharding(operand) else {
            continue;
        };
        let candidate = propagate_along_dims(sharding, source_dims, &parallel_dims.output, rank);
        changed |= state.maybe_improve_array(gather, candidate, may_combine, false);
    }
    changed
}

pub(super) fn gather_from_operands(
    state: &mut PropagationState,
    gather: Node,
    may_combine: bool,
) -> bool {
    let Some((dim_numbers, slice_sizes)) = gather_dims(state, gather) else {
        return false;
    };
    let rank = state.graph.shape(gather).rank();
    let mut changed = false;
    if let Some(batch_dims) = explicit_gather_batch_dims(&dim_numbers) {
        changed |= gather_from_parallel_dims(state, gather, &batch_dims, may_combine);
    }
    // The indices' tiles move to the result's batch dims.
    if let Some(indices) = state.graph.operand(gather, 1) {
        if let Some(sharding) = state.partitioned_array_sharding(indices) {
            let candidate = if sharding.is_tiled() {
                let (index_dims, output_dims) = dims::connected_index_dims(
                    state.graph.shape(indices).rank(),
                    dim_numbers.index_vector_dim,
                    rank,
                    &dim_numbers.offset_dims,
                );
                propagate_along_dims(sharding, &index_dims, &output_dims, rank)
            } else {
                sharding.clone()
            };
            changed |= state.maybe_improve_array(gather, candidate, may_combine, false);
        }
    }
    // The parallel and passthrough dims are for the SPMD partitioner.
    if !state.is_spmd {
        return changed;
    }
    let parallel_dims = iota_gather_parallel_dims(state, gather);
    if let Some(parallel_dims) = &parallel_dims {
        changed |= gather_from_parallel_dims(state, gather, parallel_dims, may_combine);
    }
    // The operand's tiles on passthrough dims (not its parallel ones) move
    // to the result's offset dims.
    if let Some(operand) = state.graph.operand(gather, 0) {
        if let Some(sharding) = state.partitioned_array_sharding(operand).cloned() {
            let parallel_operand_dims = parallel_dims
                .as_ref()
                .map(|parallel_dims| parallel_dims.operand.clone())
                .unwrap_or_default();
            let filtered = partially_replicate_on_dims(&sharding, &parallel_operand_dims);
            if filtered.is_tiled() {
                let (operand_dims, output_dims) = dims::passthrough_dims(
                    state.graph.shape(operand).dims(),
                    &dim_numbers.collapsed_slice_dims,
                    &dim_numbers.operand_batching_dims,
                    &dim_numbers.offset_dims,
                    &slice_sizes,
                );
                let candidate = propagate_along_dims(&filtered, &operand_dims, &output_dims, rank);
                if !candidate.is_tile_maximal() {
                    changed |= state.maybe_improve_array(gather, candidate, may_combine, false);
                }
            }
        }
    }
    changed
}

/// What a gather asks of its operand or its indices.
pub(super) fn operand_sharding_from_gather(
    state: &PropagationState,
    operand: Node,
    gather: Node,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    let graph = &state.graph;
    let gather_sharding = user_sharding.as_single()?;
    let (dim_numbers, slice_sizes) = gather_dims(state, gather)?;
    let rank = graph.shape(gather).rank();
    let operand_rank = graph.shape(operand).rank();
    if graph.operand(gather, 1) == Some(operand) {
        if !gather_sharding.is_tiled() {
            return Some(InstrSharding::Single(gather_sharding.clone()));
        }
        let (index_dims, output_dims) = dims::connected_index_dims(
            operand_rank,
            dim_numbers.index_vector_dim,
            rank,
            &dim_numbers.offset_dims,
        );
        return Some(InstrSharding::Single(propagate_along_dims(
            gather_sharding,
            &output_dims,
            &index_dims,
            operand_rank,
        )));
    }
    if graph.operand(gather, 0) != Some(operand) || !state.is_spmd {
        return None;
    }
    if !gather_sharding.is_tiled() {
        return Some(InstrSharding::Single(gather_sharding.clone()));
    }
    let mut parallel_dims = explicit_gather_batch_dims(&dim_numbers).unwrap_or_default();
    if let Some(iota_dims) = iota_gather_parallel_dims(state, gather) {
        parallel_dims.operand.extend(iota_dims.operand);
        parallel_dims.indices.extend(iota_dims.indices);
        parallel_dims.output.extend(iota_dims.output);
    }
    let from_parallel = (!parallel_dims.operand.is_empty()).then(|| {
        propagate_along_dims(
            gather_sharding,
            &parallel_dims.output,
            &parallel_dims.operand,
            operand_rank,
        )
    });
    let (operand_dims, output_dims) = dims::passthrough_dims(
        graph.shape(operand).dims(),
        &dim_numbers.collapsed_slice_dims,
        &dim_numbers.operand_batching_dims,
        &dim_numbers.offset_dims,
        &slice_sizes,
    );
    let from_passthrough = {
        let candidate =
            propagate_along_dims(gather_sharding, &output_dims, &operand_dims, operand_rank);
        (!candidate.is_tile_maximal()).then_some(candidate)
    };
    merge_either_way(from_parallel, from_passthrough).map(InstrSharding::Single)
}

/// Either sharding when only one exists; both merged (the passthrough one
/// into the parallel one, or else the other way) when compatible; else the
/// parallel one.
fn merge_either_way(parallel: Option<Sharding>, passthrough: Option<Sharding>) -> Option<Sharding> {
    match (parallel, passthrough) {
        (parallel, None) => parallel,
        (None, passthrough) => passthrough,
        (Some(parallel), Some(mut passthrough)) => {
            if merge_sharding_leaf(&parallel, &mut passthrough, true) {
                Some(passthrough)
            } else {
                let mut merged = parallel.clone();
                if merge_sharding_leaf(&passthrough, &mut merged, true) {
                    Some(merged)
                } else {
                    Some(parallel)
                }
            }
        }
    }
}

/// A scatter's operands split into its inputs, indices and updates.
struct ScatterOperands {
    inputs: Vec<Node>,
    indices: Node,
    updates: Vec<Node>,
}

fn scatter_operands(state: &PropagationState, scatter: Node) -> Option<ScatterOperands> {
    let operands: Vec<Node> = state.graph.operands(scatter).collect();
    if operands.len() < 3 {
        return None;
    }
    let input_count = (operands.len() - 1) / 2;
    Some(ScatterOperands {
        inputs: operands[..input_count].to_vec(),
        indices: operands[input_count],
        updates: operands[input_count + 1..].to_vec(),
    })
}

/// A scatter's slice sizes: the update window's size along each operand
/// dim (1 on inserted and batching dims).
fn scatter_slice_sizes(state: &PropagationState, scatter: Node) -> Option<Vec<i64>> {
    let parts = scatter_operands(state, scatter)?;
    let dim_numbers = state.graph.instr(scatter).scatter_dimension_numbers();
    let input_dims = state.graph.shape(*parts.inputs.first()?).dims();
    let update_dims = state.graph.shape(*parts.updates.first()?).dims();
    let mut slice_sizes = vec![1i64; input_dims.len()];
    let mut window_dim = 0;
    for (dim, size) in slice_sizes.iter_mut().enumerate() {
        if dim_numbers.inserted_window_dims.contains(&(dim as i64))
            || dim_numbers.input_batching_dims.contains(&(dim as i64))
        {
            continue;
        }
        let update_dim = *dim_numbers.update_window_dims.get(window_dim)?;
        *size = *update_dims.get(update_dim as usize)?;
        window_dim += 1;
    }
    Some(slice_sizes)
}

/// A scatter's explicit batching dims, if it has any.
fn explicit_scatter_batch_dims(dim_numbers: &ScatterDimensionNumbers) -> Option<GatherScatterDims> {
    if dim_numbers.input_batching_dims.is_empty() {
        return None;
    }
    let mut batch_dims = GatherScatterDims {
        operand: non_negative_dims(&dim_numbers.input_batching_dims),
        indices: non_negative_dims(&dim_numbers.scatter_indices_batching_dims),
        output: vec![],
    };
    dims::fill_output_dims(
        &mut batch_dims,
        dim_numbers.index_vector_dim,
        &dim_numbers.update_window_dims,
    );
    Some(batch_dims)
}

/// A scatter's iota-detected parallel dims.
fn iota_scatter_parallel_dims(
    state: &PropagationState,
    scatter: Node,
    parts: &ScatterOperands,
) -> Option<GatherScatterDims> {
    let dim_numbers = state.graph.instr(scatter).scatter_dimension_numbers();
    let slice_sizes = scatter_slice_sizes(state, scatter)?;
    dims::batch_parallel_dims(
        &state.graph,
        *parts.inputs.first()?,
        parts.indices,
        &slice_sizes,
        dim_numbers.index_vector_dim,
        &dim_numbers.scatter_dims_to_operand_dims,
        &dim_numbers.scatter_indices_batching_dims,
        &dim_numbers.update_window_dims,
    )
}

/// `InferScatterParallelShardingFromOperands`: the inputs', the indices'
/// and the updates' tiles on parallel dims move to every output's.
fn scatter_from_parallel_dims(
    state: &mut PropagationState,
    scatter: Node,
    parts: &ScatterOperands,
    parallel_dims: &GatherScatterDims,
    may_combine: bool,
) -> bool {
    let shape = state.graph.shape(scatter);
    let rank = if shape.is_tuple() {
        shape
            .tuple_elements()
            .first()
            .map(|element| element.rank())
            .unwrap_or(0)
    } else {
        shape.rank()
    };
    let mut changed = false;
    for (index, &input) in parts.inputs.iter().enumerate() {
        if let Some(sharding) = state.partitioned_array_sharding(input) {
            let candidate = propagate_along_dims(
                sharding,
                &parallel_dims.operand,
                &parallel_dims.operand,
                rank,
            );
            changed |= state.maybe_improve_element(scatter, candidate, index, may_combine, false);
        }
    }
    if let Some(sharding) = state.partitioned_array_sharding(parts.indices) {
        let candidate = propagate_along_dims(
            sharding,
            &parallel_dims.indices,
            &parallel_dims.operand,
            rank,
        );
        for index in 0..parts.inputs.len() {
            changed |=
                state.maybe_improve_element(scatter, candidate.clone(), index, may_combine, false);
        }
    }
    for (index, &update) in parts.updates.iter().enumerate() {
        if let Some(sharding) = state.partitioned_array_sharding(update) {
            let candidate = propagate_along_dims(
                sharding,
                &parallel_dims.output,
                &parallel_dims.operand,
                rank,
            );
            changed |= state.maybe_improve_element(scatter, candidate, index, may_combine, false);
        }
    }
    changed
}

pub(super) fn scatter_from_operands(
    state: &mut PropagationState,
    scatter: Node,
    may_combine: bool,
) -> bool {
    let Some(parts) = scatter_operands(state, scatter) else {
        return false;
    };
    let dim_numbers = state.graph.instr(scatter).scatter_dimension_numbers();
    let mut changed = false;
    if let Some(batch_dims) = explicit_scatter_batch_dims(&dim_numbers) {
        changed |= scatter_from_parallel_dims(state, scatter, &parts, &batch_dims, may_combine);
    }
    if !state.is_spmd {
        // Outside SPMD a scatter's outputs are replicated.
        for index in 0..parts.inputs.len() {
            changed |= state.maybe_improve_element(
                scatter,
                Sharding::Replicated,
                index,
                may_combine,
                false,
            );
        }
        return changed;
    }
    for (index, &input) in parts.inputs.iter().enumerate() {
        if let Some(sharding) = state.partitioned_array_sharding(input).cloned() {
            changed |= state.maybe_improve_element(scatter, sharding, index, may_combine, false);
        }
    }
    if !state.is_spatially_partitioned(parts.indices)
        && !parts
            .updates
            .iter()
            .any(|&update| state.is_spatially_partitioned(update))
    {
        return changed;
    }
    if let Some(parallel_dims) = iota_scatter_parallel_dims(state, scatter, &parts) {
        changed |= scatter_from_parallel_dims(state, scatter, &parts, &parallel_dims, may_combine);
    }
    let Some(slice_sizes) = scatter_slice_sizes(state, scatter) else {
        return changed;
    };
    let input_dims = state.graph.shape(parts.inputs[0]).dims().to_vec();
    for (index, &update) in parts.updates.iter().enumerate() {
        let Some(sharding) = state.partitioned_array_sharding(update).cloned() else {
            continue;
        };
        // A replicated or manual update gives the output its sharding as is.
        let candidate = if sharding.is_tiled() {
            let (operand_dims, update_dims) = dims::passthrough_dims(
                &input_dims,
                &dim_numbers.inserted_window_dims,
                &dim_numbers.input_batching_dims,
                &dim_numbers.update_window_dims,
                &slice_sizes,
            );
            let candidate =
                propagate_along_dims(&sharding, &update_dims, &operand_dims, input_dims.len());
            if candidate.is_tile_maximal() {
                continue;
            }
            candidate
        } else {
            sharding
        };
        changed |= state.maybe_improve_element(scatter, candidate, index, may_combine, false);
    }
    changed
}

/// What a scatter asks of an input (its output's sharding), of its
/// indices (what the updates have in common on the index dims) or of an
/// update (the output's passthrough tiles, merged with the indices').
pub(super) fn operand_sharding_from_scatter(
    state: &PropagationState,
    operand: Node,
    scatter: Node,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    let graph = &state.graph;
    let parts = scatter_operands(state, scatter)?;
    let scatter_shape = graph.shape(scatter);
    if let Some(index) = parts.inputs.iter().position(|&input| input == operand) {
        return if user_sharding.is_tuple() {
            user_sharding.sub_sharding(scatter_shape, index)
        } else {
            Some(user_sharding.clone())
        };
    }
    let dim_numbers = graph.instr(scatter).scatter_dimension_numbers();
    let update_rank = graph.shape(*parts.updates.first()?).rank();
    let indices_rank = graph.shape(parts.indices).rank();
    let (index_dims, update_dims) = dims::connected_index_dims(
        indices_rank,
        dim_numbers.index_vector_dim,
        update_rank,
        &dim_numbers.update_window_dims,
    );
    if operand == parts.indices {
        let mut shardings = Vec::new();
        for &update in &parts.updates {
            if let Some(sharding) = state.partitioned_array_sharding(update) {
                shardings.push(if sharding.is_tiled() {
                    propagate_along_dims(sharding, &update_dims, &index_dims, indices_rank)
                } else {
                    sharding.clone()
                });
            }
        }
        return find_common_sharding(&shardings, None).map(InstrSharding::Single);
    }
    let update_index = parts.updates.iter().position(|&update| update == operand)?;
    let from_indices = match state.array_sharding(parts.indices) {
        Some(sharding) if sharding.is_tiled() => {
            propagate_along_dims(sharding, &index_dims, &update_dims, update_rank)
        }
        Some(sharding) if sharding.is_spatially_partitioned() => sharding.clone(),
        _ => Sharding::Replicated,
    };
    let output_sharding = if user_sharding.is_tuple() {
        user_sharding.sub_sharding(scatter_shape, update_index)?
    } else {
        user_sharding.clone()
    };
    if let Some(output_leaf) = output_sharding.as_single().filter(|_| state.is_spmd) {
        if let Some(mut from_output) =
            update_sharding_from_output(state, scatter, &parts, output_leaf, update_rank)
        {
            if from_indices.is_tiled() {
                let min_tiles = from_output.num_tiles() + 1;
                merge_sharding_if_compatible(&from_indices, min_tiles, &mut from_output);
            }
            if !from_output.is_tile_maximal() {
                return Some(InstrSharding::Single(from_output));
            }
        }
    }
    (!from_indices.is_tile_maximal()).then_some(InstrSharding::Single(from_indices))
}

/// `ScatterUpdateShardingFromOutput`: what an update takes from the
/// scatter's output sharding, the parallel dims first (explicit batching
/// dims and iota-detected ones, as the partitioner prefers them), merged
/// with the passthrough dims where compatible.
fn update_sharding_from_output(
    state: &PropagationState,
    scatter: Node,
    parts: &ScatterOperands,
    output: &Sharding,
    update_rank: usize,
) -> Option<Sharding> {
    let graph = &state.graph;
    let dim_numbers = graph.instr(scatter).scatter_dimension_numbers();
    let from_parallel = if output.is_tiled() {
        let mut parallel_dims = explicit_scatter_batch_dims(&dim_numbers).unwrap_or_default();
        if let Some(iota_dims) = iota_scatter_parallel_dims(state, scatter, parts) {
            parallel_dims.operand.extend(iota_dims.operand);
            parallel_dims.indices.extend(iota_dims.indices);
            parallel_dims.output.extend(iota_dims.output);
        }
        (!parallel_dims.operand.is_empty()).then(|| {
            propagate_along_dims(
                output,
                &parallel_dims.operand,
                &parallel_dims.output,
                update_rank,
            )
        })
    } else {
        // A tile-maximal or manual output is what the parallel dims give.
        Some(output.clone())
    };
    let from_passthrough = match (output.is_tiled(), scatter_slice_sizes(state, scatter)) {
        (true, Some(slice_sizes)) => {
            let (operand_dims, update_dims) = dims::passthrough_dims(
                graph.shape(parts.inputs[0]).dims(),
                &dim_numbers.inserted_window_dims,
                &dim_numbers.input_batching_dims,
                &dim_numbers.update_window_dims,
                &slice_sizes,
            );
            let candidate = propagate_along_dims(output, &operand_dims, &update_dims, update_rank);
            (!candidate.is_tile_maximal()).then_some(candidate)
        }
        _ => None,
    };
    merge_either_way(from_parallel, from_passthrough)
}
