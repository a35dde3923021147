//! Reductions and windows: reduce, reduce-window, select-and-scatter and
//! sort. A reduce drops the tiles of its reduced dims (keeping them as
//! replication); a reduce-window, a select-and-scatter and a sort keep
//! their operand's sharding (a sort only when the tiles of its sort dim
//! can move elsewhere); variadic forms give every output the sharding.
//!
//! Invariant: windows with dilation pass nothing forward (the partitioner
//! could not keep their halos local).

use super::pass_through::representative_operand;
use crate::graph::{Graph, Node};
use crate::state::{non_negative_dims, PropagationState};
use xla_hlo_utils::merge::merge_sharding_if_compatible;
use xla_hlo_utils::ops::{partially_replicate_on_dims, reduce_sharding, replicate_all_data_dims};
use xla_hlo_utils::{InstrSharding, Sharding};

/// The inputs of a variadic reduce or reduce-window (the first half of its
/// operands; the second half are the init values).
fn input_count(graph: &Graph, node: Node) -> usize {
    graph.operand_count(node) / 2
}

/// Each sharded input offers its sharding with the reduced dims removed
/// (to every output of a variadic reduce); a manual input offers itself to
/// its own output.
pub(super) fn reduce_from_operands(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let reduced_dims = non_negative_dims(state.graph.instr(node).dimensions());
    let single_user = state.has_single_non_root_user(node);
    let mut changed = false;
    for k in 0..input_count(&state.graph, node) {
        let Some(input) = state.graph.operand(node, k) else {
            continue;
        };
        let Some(sharding) = state.partitioned_array_sharding(input).cloned() else {
            continue;
        };
        if sharding.is_manual() {
            changed |= state.maybe_improve_element(node, sharding, k, may_combine, single_user);
            continue;
        }
        // Outside SPMD, reducing over a sharded dim replicates the result.
        let reduces_sharded_dim = !state.is_spmd
            && sharding.is_tiled()
            && reduced_dims.iter().any(|&d| sharding.tile_dim(d) > 1);
        let candidate = if sharding.is_replicated() || reduces_sharded_dim {
            replicate_all_data_dims(&sharding, None)
        } else {
            let replicated = partially_replicate_on_dims(&sharding, &reduced_dims);
            if replicated.is_replicated() {
                replicated
            } else {
                reduce_sharding(&sharding, &reduced_dims)
            }
        };
        let candidate = state.same_for_every_output(node, candidate);
        changed |= state.maybe_improve(node, candidate, may_combine, single_user);
    }
    changed
}

/// Each sharded input offers its sharding to every output, unless the
/// window is dilated.
pub(super) fn reduce_window_from_operands(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    if let Some(window) = state.graph.instr(node).window() {
        if window
            .dims
            .iter()
            .any(|d| d.lhs_dilation > 1 || d.rhs_dilation > 1)
        {
            return false;
        }
    }
    let single_user = state.has_single_non_root_user(node);
    let mut changed = false;
    for k in 0..input_count(&state.graph, node) {
        let Some(input) = state.graph.operand(node, k) else {
            continue;
        };
        let Some(sharding) = state.partitioned_array_sharding(input).cloned() else {
            continue;
        };
        let candidate = state.same_for_every_output(node, sharding);
        changed |= state.maybe_improve(node, candidate, may_combine, single_user);
    }
    changed
}

/// The result takes the operand's sharding unless the window has base
/// dilation.
pub(super) fn select_and_scatter_from_operand(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let Some(operand) = state.graph.operand(node, 0) else {
        return false;
    };
    if !state.is_spatially_partitioned(operand) {
        return false;
    }
    if state
        .graph
        .instr(node)
        .window()
        .is_some_and(|window| window.dims.iter().any(|d| d.lhs_dilation > 1))
    {
        return false;
    }
    let Some(sharding) = state.sharding(operand).cloned() else {
        return false;
    };
    let single_user = state.has_single_non_root_user(node);
    state.maybe_improve(node, sharding, may_combine, single_user)
}

/// The sort dimension of a sort.
fn sort_dim(graph: &Graph, sort: Node) -> usize {
    graph
        .instr(sort)
        .dimensions()
        .first()
        .copied()
        .unwrap_or(0)
        .max(0) as usize
}

/// The result (every output of a variadic sort) takes the representative
/// operand's sharding, unless the sort dim is tiled and its tiles cannot
/// move to another dim.
pub(super) fn sort_from_operands(
    state: &mut PropagationState,
    node: Node,
    may_combine: bool,
) -> bool {
    let Some(operand) = representative_operand(state, node) else {
        return false;
    };
    let Some(sharding) = state.partitioned_array_sharding(operand).cloned() else {
        return false;
    };
    let dim = sort_dim(&state.graph, node);
    if sharding.is_tiled()
        && sharding.tile_dim(dim) != 1
        && first_target_dim_to_move(state.graph.shape(operand).dims(), &sharding, dim).is_none()
    {
        return false;
    }
    let candidate = InstrSharding::single_for(state.graph.shape(node), sharding);
    let single_user = state.has_single_non_root_user(node);
    state.maybe_improve(node, candidate, may_combine, single_user)
}

/// `GetFirstTargetDimToMoveShardingTiles`: the first other dim that can
/// take the tiles of dim `source` as well as its own.
fn first_target_dim_to_move(dims: &[i64], sharding: &Sharding, source: usize) -> Option<usize> {
    if dims.len() < 2
        || dims.get(source) == Some(&1)
        || !sharding.is_tiled()
        || sharding.tile_dim(source) == 1
    {
        return None;
    }
    (0..dims.len())
        .find(|&d| d != source && dims[d] % (sharding.tile_dim(source) * sharding.tile_dim(d)) == 0)
}

/// What a reduce asks of an input: the reduce's tiles on the kept dims
/// (the reduced dims whole), merged with the other inputs' shardings when
/// compatible.
pub(super) fn operand_sharding_from_reduce(
    state: &PropagationState,
    operand: Node,
    reduce: Node,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    let graph = &state.graph;
    let operand_shape = graph.shape(operand);
    if operand_shape.rank() == 0 {
        return None;
    }
    let reduce_instr = graph.instr(reduce);
    let index = graph.operand_index(reduce, operand)?;
    let mut sharding = if reduce_instr.shape.is_tuple() {
        user_sharding
            .sub_sharding(&reduce_instr.shape, index)?
            .as_single()?
            .clone()
    } else {
        user_sharding.as_single()?.clone()
    };
    if let Sharding::Tiled(tiled) = &sharding {
        let reduced_dims = reduce_instr.dimensions();
        // The result's tile dims spread back over the kept operand dims,
        // with 1 on the reduced ones (subgroup dims stay last).
        let total = operand_shape.rank() + tiled.subgroups().len();
        let mut tile_dims = vec![1i64; total];
        let mut next = 0usize;
        for (dim, slot) in tile_dims.iter_mut().enumerate() {
            if !reduced_dims.contains(&(dim as i64)) {
                *slot = tiled.tiles().dims().get(next).copied().unwrap_or(1);
                next += 1;
            }
        }
        if tile_dims.iter().product::<i64>() == tiled.tiles().num_elements() {
            let tiles = tiled.tiles().reshape(tile_dims);
            sharding = if sharding.replicate_on_last_tile_dim() {
                Sharding::partial_tile(tiles)
            } else {
                Sharding::subgroup(tiles, sharding.xla_subgroup_types())
            };
        }
    }
    for k in 0..input_count(graph, reduce) {
        let Some(other) = graph.operand(reduce, k) else {
            continue;
        };
        if other == operand {
            continue;
        }
        if let Some(other_sharding) = state.array_sharding(other) {
            if other_sharding.is_tiled() && !sharding.is_manual() {
                let min_tiles = sharding.num_tiles() + 1;
                merge_sharding_if_compatible(other_sharding, min_tiles, &mut sharding);
            }
        }
    }
    Some(InstrSharding::Single(sharding))
}

/// A reduce-window asks of an input its own sharding (its element of a
/// variadic one's), and nothing of the init values.
pub(super) fn operand_sharding_from_reduce_window(
    graph: &Graph,
    operand: Node,
    reduce_window: Node,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    let index = graph.operand_index(reduce_window, operand)?;
    if index >= input_count(graph, reduce_window) {
        return None;
    }
    let shape = graph.shape(reduce_window);
    if shape.is_tuple() {
        user_sharding.sub_sharding(shape, index)
    } else {
        Some(user_sharding.clone())
    }
}

/// A sort asks of an operand its own sharding (its element of a variadic
/// one's).
pub(super) fn operand_sharding_from_sort(
    graph: &Graph,
    operand: Node,
    sort: Node,
    user_sharding: &InstrSharding,
) -> Option<InstrSharding> {
    if user_sharding.is_tuple() {
        user_sharding.sub_sharding(graph.shape(sort), graph.operand_index(sort, operand)?)
    } else {
        Some(user_sharding.clone())
    }
}
