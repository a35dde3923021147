//! The per-opcode propagation rules: what an instruction's sharding can be
//! given its operands' (forward) or one user's (backward), and the rule for
//! accepting a candidate (`maybe_improve`: only strictly better or
//! compatible refinements, see `xla_hlo_utils::merge::return_improved`).
//!
//! These follow XLA's `InferShardingFromOperands`, `GetShardingFromUser`
//! and `InferShardingFromUsers`, including the aggressiveness levels:
//! level 0 only passes through elementwise ops, copies, reshapes,
//! transposes, tuples, GTEs, whiles, calls, dynamic slices and
//! concatenates; level 1 adds every other op; level 2 lets broadcasts take
//! shardings from their users; level 3 lets them push forward.
//!
//! Invariant: rules only read the graph and the current shardings, and
//! write only the instruction they infer (`self.shardings[x]`).

mod data_movement;
mod dot;
mod partitionable;
mod pass_through;
mod reduction;
mod reshaping;
mod tuples_and_control;

use crate::dims::{self, GatherScatterDims};
use crate::graph::CustomCallKind;
use crate::graph::Node;
use crate::level::{
    may_combine_partial, BROADCAST_FROM_USERS_LEVEL, MAX_LEVEL, PASS_THROUGH_LEVEL,
};
use crate::opcodes::{elementwise_opcodes, has_side_effect};
use crate::state::{non_negative_dims, normalize, PropagationState};
use partitionable::supports_spatial_partitioning;
use xla_hlo_ir::{AttrKey, Opcode};
use xla_hlo_utils::merge::{merge_sharding_if_compatible, merge_sharding_leaf};
use xla_hlo_utils::ops::{partially_replicate_on_dims, propagate_along_dims};
use xla_hlo_utils::{InstrSharding, Sharding};

fn single(s: &InstrSharding) -> Option<&Sharding> {
    s.as_single()
}

impl<'m> PropagationState<'m> {
    // ----- predicates -----

    // ----- forward -----

    /// `InferShardingFromOperands`: returns whether `x` changed.
    pub fn infer_from_operands(&mut self, x: Node, level: i64) -> bool {
        if !self.can_propagate_through(x, level) {
            return false;
        }
        if self.is_manual(x) {
            return false;
        }
        let g = &self.graph;
        let opcode = g.opcode(x);
        let shape = g.shape(x);
        let tile_maximal_or_none = self.sharding(x).is_none_or(InstrSharding::is_tile_maximal);
        if tile_maximal_or_none
            && (!shape.is_tuple()
                || matches!(opcode, Opcode::Reduce | Opcode::Sort | Opcode::ReduceWindow)
                || (opcode == Opcode::CustomCall && shape.is_tuple()))
        {
            for k in 0..g.operand_count(x) {
                let Some(op) = g.operand(x, k) else { continue };
                if !self.is_manual(op) {
                    continue;
                }
                if self.graph.custom_call_kind(x) == CustomCallKind::ShardToFull {
                    return false;
                }
                if level == PASS_THROUGH_LEVEL
                    && matches!(opcode, Opcode::Concatenate | Opcode::DynamicSlice)
                {
                    return false;
                }
                self.set_sharding(x, InstrSharding::Single(Sharding::Manual));
                return true;
            }
        }
        let may_combine = may_combine_partial(level);
        if !supports_spatial_partitioning(&self.graph, x, self.allow_output, false) {
            let g = &self.graph;
            if shape.is_tuple()
                || g.operand_count(x) == 0
                || g.is_root(x)
                || has_side_effect(g.instr(x))
            {
                return false;
            }
            for k in 0..g.operand_count(x) {
                let Some(op) = g.operand(x, k) else { continue };
                if let Some(s) = self.sharding(op) {
                    if s.is_tile_maximal() && !s.leaves().iter().any(Sharding::is_maximal_device) {
                        let s = s.clone();
                        return self.maybe_improve(x, s, may_combine, false);
                    }
                }
            }
            return false;
        }
        match opcode {
            Opcode::GetTupleElement => {
                tuples_and_control::get_tuple_element_from_operand(self, x, may_combine)
            }
            Opcode::Tuple => tuples_and_control::tuple_from_operands(self, x),
            Opcode::Reduce => reduction::reduce_from_operands(self, x, may_combine),
            Opcode::Broadcast => reshaping::broadcast_from_operand(self, x, level, may_combine),
            Opcode::Concatenate => {
                data_movement::concatenate_from_operands(self, x, level, may_combine)
            }
            Opcode::Convolution => {
                dot::convolution_from_operands(self, x, may_combine, lookahead_user_sharding)
            }
            Opcode::Transpose => reshaping::transpose_from_operand(self, x, may_combine),
            Opcode::ReduceWindow => reduction::reduce_window_from_operands(self, x, may_combine),
            Opcode::SelectAndScatter => {
                reduction::select_and_scatter_from_operand(self, x, may_combine)
            }
            Opcode::Reshape => reshaping::reshape_from_operand(self, x, may_combine),
            Opcode::Reverse => reshaping::reverse_from_operand(self, x, may_combine),
            Opcode::Dot => {
                let dot_dims = dims::dot_dims(&self.graph, x);
                dot::dot_from_operands(self, x, &dot_dims, may_combine, lookahead_user_sharding)
            }
            Opcode::Parameter => tuples_and_control::parameter_from_argument(self, x, may_combine),
            Opcode::Sort => reduction::sort_from_operands(self, x, may_combine),
            Opcode::DynamicSlice => {
                data_movement::dynamic_slice_from_sliced_array(self, x, may_combine)
            }
            Opcode::DynamicUpdateSlice => {
                data_movement::dynamic_update_slice_from_operands(self, x, may_combine)
            }
            Opcode::Gather => self.infer_gather(x, may_combine),
            Opcode::Scatter => self.infer_scatter(x, may_combine),
            Opcode::While => tuples_and_control::while_from_operand(self, x, may_combine),
            Opcode::CustomCall => pass_through::from_representative_operand(self, x, may_combine),
            _ => {
                if matches!(opcode, elementwise_opcodes!() | Opcode::Map | Opcode::Rng) {
                    pass_through::elementwise_from_operands(self, x, may_combine)
                } else {
                    pass_through::from_representative_operand(self, x, may_combine)
                }
            }
        }
    }

    fn gather_dims(
        &self,
        x: Node,
    ) -> Option<(xla_hlo_ir::attrs::GatherDimensionNumbers, Vec<i64>)> {
        let i = self.graph.instr(x);
        let dn = i.gather_dimension_numbers();
        let sizes = i.ints_attr(AttrKey::SliceSizes)?.to_vec();
        Some((dn, sizes))
    }

    fn infer_gather_parallel(
        &mut self,
        x: Node,
        pd: &GatherScatterDims,
        may_combine: bool,
    ) -> bool {
        let rank = self.graph.shape(x).rank();
        let mut changed = false;
        for (k, src) in [(0usize, &pd.operand), (1usize, &pd.indices)] {
            let Some(op) = self.graph.operand(x, k) else {
                continue;
            };
            if !self.is_spatially_partitioned(op) {
                continue;
            }
            let Some(s) = self.array_sharding(op) else {
                continue;
            };
            let new = propagate_along_dims(s, src, &pd.output, rank);
            changed |= self.maybe_improve_array(x, new, may_combine, false);
        }
        changed
    }

    fn gather_parallel(&self, x: Node) -> Option<GatherScatterDims> {
        let (dn, sizes) = self.gather_dims(x)?;
        dims::batch_parallel_dims(
            &self.graph,
            self.graph.operand(x, 0)?,
            self.graph.operand(x, 1)?,
            &sizes,
            dn.index_vector_dim,
            &dn.start_index_map,
            &dn.start_indices_batching_dims,
            &dn.offset_dims,
        )
    }

    fn infer_gather(&mut self, x: Node, may_combine: bool) -> bool {
        let Some((dn, sizes)) = self.gather_dims(x) else {
            return false;
        };
        let rank = self.graph.shape(x).rank();
        let mut changed = false;
        if !dn.operand_batching_dims.is_empty() {
            let mut pd = GatherScatterDims {
                operand: non_negative_dims(&dn.operand_batching_dims),
                indices: non_negative_dims(&dn.start_indices_batching_dims),
                output: vec![],
            };
            dims::fill_output_dims(&mut pd, dn.index_vector_dim, &dn.offset_dims);
            changed |= self.infer_gather_parallel(x, &pd, may_combine);
        }
        if let Some(ind) = self.graph.operand(x, 1) {
            if self.is_spatially_partitioned(ind) {
                if let Some(s) = self.array_sharding(ind) {
                    let new = if s.is_tiled() {
                        let (idims, odims) = dims::connected_index_dims(
                            self.graph.shape(ind).rank(),
                            dn.index_vector_dim,
                            rank,
                            &dn.offset_dims,
                        );
                        propagate_along_dims(s, &idims, &odims, rank)
                    } else {
                        s.clone()
                    };
                    changed |= self.maybe_improve_array(x, new, may_combine, false);
                }
            }
        }
        let parallel = self.gather_parallel(x);
        if let Some(pd) = &parallel {
            changed |= self.infer_gather_parallel(x, pd, may_combine);
        }
        if let Some(op) = self.graph.operand(x, 0) {
            if self.is_spatially_partitioned(op) {
                let s = self.array_sharding(op).cloned();
                if let Some(s) = s {
                    let pdims = parallel
                        .as_ref()
                        .map(|p| p.operand.clone())
                        .unwrap_or_default();
                    let filtered = partially_replicate_on_dims(&s, &pdims);
                    if filtered.is_tiled() {
                        let (od, outd) = dims::passthrough_dims(
                            self.graph.shape(op).dims(),
                            &dn.collapsed_slice_dims,
                            &dn.operand_batching_dims,
                            &dn.offset_dims,
                            &sizes,
                        );
                        let r = propagate_along_dims(&filtered, &od, &outd, rank);
                        if !r.is_tile_maximal() {
                            changed |= self.maybe_improve_array(x, r, may_combine, false);
                        }
                    }
                }
            }
        }
        changed
    }

    /// Operands, indices and updates of a scatter.
    fn scatter_parts(&self, x: Node) -> (Vec<Node>, Option<Node>, Vec<Node>) {
        let ops: Vec<Node> = self.graph.operands(x).collect();
        let n = ops.len().saturating_sub(1) / 2;
        if ops.len() < 3 {
            return (vec![], None, vec![]);
        }
        (ops[..n].to_vec(), Some(ops[n]), ops[n + 1..].to_vec())
    }

    fn scatter_slice_sizes(&self, x: Node) -> Option<Vec<i64>> {
        let (ops, _, upd) = self.scatter_parts(x);
        let dn = self.graph.instr(x).scatter_dimension_numbers();
        let od = self.graph.shape(*ops.first()?).dims();
        let ud = self.graph.shape(*upd.first()?).dims();
        let mut sizes = vec![1i64; od.len()];
        let mut k = 0;
        for (i, s) in sizes.iter_mut().enumerate() {
            if dn.inserted_window_dims.contains(&(i as i64))
                || dn.input_batching_dims.contains(&(i as i64))
            {
                continue;
            }
            let w = *dn.update_window_dims.get(k)?;
            *s = *ud.get(w as usize)?;
            k += 1;
        }
        Some(sizes)
    }

    /// Scatter parallel dims (explicit batching dims, or iota-detected).
    fn scatter_parallel(&self, x: Node, explicit: bool) -> Option<GatherScatterDims> {
        let (ops, ind, upd) = self.scatter_parts(x);
        let ind = ind?;
        let dn = self.graph.instr(x).scatter_dimension_numbers();
        if explicit {
            if dn.input_batching_dims.is_empty() {
                return None;
            }
            let mut pd = GatherScatterDims {
                operand: non_negative_dims(&dn.input_batching_dims),
                indices: non_negative_dims(&dn.scatter_indices_batching_dims),
                output: vec![],
            };
            dims::fill_output_dims(&mut pd, dn.index_vector_dim, &dn.update_window_dims);
            return Some(pd);
        }
        let sizes = self.scatter_slice_sizes(x)?;
        let _ = upd;
        dims::batch_parallel_dims(
            &self.graph,
            *ops.first()?,
            ind,
            &sizes,
            dn.index_vector_dim,
            &dn.scatter_dims_to_operand_dims,
            &dn.scatter_indices_batching_dims,
            &dn.update_window_dims,
        )
    }

    /// `InferScatterParallelShardingFromOperands`.
    fn infer_scatter_parallel(
        &mut self,
        x: Node,
        pd: &GatherScatterDims,
        may_combine: bool,
    ) -> bool {
        let (ops, ind, upd) = self.scatter_parts(x);
        let Some(ind) = ind else { return false };
        let shape = self.graph.shape(x);
        let rank = if shape.is_tuple() {
            shape
                .tuple_elements()
                .first()
                .map(|e| e.rank())
                .unwrap_or(0)
        } else {
            shape.rank()
        };
        let mut changed = false;
        for (i, &op) in ops.iter().enumerate() {
            if let Some(s) = self
                .array_sharding(op)
                .filter(|s| s.is_spatially_partitioned())
            {
                let new = propagate_along_dims(s, &pd.operand, &pd.operand, rank);
                changed |= self.maybe_improve_element(x, new, i, may_combine, false);
            }
        }
        if let Some(s) = self
            .array_sharding(ind)
            .filter(|s| s.is_spatially_partitioned())
        {
            let new = propagate_along_dims(s, &pd.indices, &pd.operand, rank);
            for i in 0..ops.len() {
                changed |= self.maybe_improve_element(x, new.clone(), i, may_combine, false);
            }
        }
        for (i, &u) in upd.iter().enumerate() {
            if let Some(s) = self
                .array_sharding(u)
                .filter(|s| s.is_spatially_partitioned())
            {
                let new = propagate_along_dims(s, &pd.output, &pd.operand, rank);
                changed |= self.maybe_improve_element(x, new, i, may_combine, false);
            }
        }
        changed
    }

    fn infer_scatter(&mut self, x: Node, may_combine: bool) -> bool {
        let (ops, ind, upd) = self.scatter_parts(x);
        let Some(ind) = ind else { return false };
        let dn = self.graph.instr(x).scatter_dimension_numbers();
        let mut changed = false;
        if let Some(pd) = self.scatter_parallel(x, true) {
            changed |= self.infer_scatter_parallel(x, &pd, may_combine);
        }
        for (i, &op) in ops.iter().enumerate() {
            if self.is_spatially_partitioned(op) {
                if let Some(s) = self.array_sharding(op).cloned() {
                    changed |= self.maybe_improve_element(x, s, i, may_combine, false);
                }
            }
        }
        if !self.is_spatially_partitioned(ind)
            && !upd.iter().any(|&u| self.is_spatially_partitioned(u))
        {
            return changed;
        }
        if let Some(pd) = self.scatter_parallel(x, false) {
            changed |= self.infer_scatter_parallel(x, &pd, may_combine);
        }
        let Some(sizes) = self.scatter_slice_sizes(x) else {
            return changed;
        };
        let op_dims = self.graph.shape(ops[0]).dims().to_vec();
        for (i, &u) in upd.iter().enumerate() {
            if !self.is_spatially_partitioned(u) {
                continue;
            }
            let Some(s) = self.array_sharding(u).cloned() else {
                continue;
            };
            // A replicated or manual update gives the output its sharding as is.
            let r = if s.is_tiled() {
                let (od, ud) = dims::passthrough_dims(
                    &op_dims,
                    &dn.inserted_window_dims,
                    &dn.input_batching_dims,
                    &dn.update_window_dims,
                    &sizes,
                );
                let r = propagate_along_dims(&s, &ud, &od, op_dims.len());
                if r.is_tile_maximal() {
                    continue;
                }
                r
            } else {
                s
            };
            changed |= self.maybe_improve_element(x, r, i, may_combine, false);
        }
        changed
    }

    // ----- backward -----

    /// `GetShardingFromUser`: the sharding `user` asks of its operand `x`.
    pub fn sharding_from_user(&self, x: Node, user: Node, level: i64) -> Option<InstrSharding> {
        if !self.can_propagate_through(user, level) || !self.is_spatially_partitioned(user) {
            return None;
        }
        let may_combine = may_combine_partial(level);
        let g = &self.graph;
        let us = self.sharding(user)?;
        let ui = g.instr(user);
        match ui.opcode {
            Opcode::Broadcast => reshaping::operand_sharding_from_broadcast(g, user, us),
            Opcode::Concatenate => data_movement::operand_sharding_from_concatenate(level, us),
            Opcode::Convolution => {
                dot::operand_sharding_from_convolution(self, x, user, may_combine)
            }
            Opcode::DynamicSlice | Opcode::DynamicUpdateSlice => {
                data_movement::operand_sharding_from_dynamic_slice(g, x, user, level, us)
            }
            Opcode::ReduceWindow => reduction::operand_sharding_from_reduce_window(g, x, user, us),
            Opcode::Reshape => reshaping::operand_sharding_from_reshape(g, x, user, us),
            Opcode::Pad => data_movement::operand_sharding_from_pad(g, x, user, us),
            Opcode::Slice => Some(us.clone()),
            Opcode::Transpose => reshaping::operand_sharding_from_transpose(g, user, us),
            Opcode::Tuple => tuples_and_control::operand_sharding_from_tuple(self, x, user, us),
            Opcode::GetTupleElement => {
                tuples_and_control::operand_sharding_from_get_tuple_element(self, x, user, us)
            }
            Opcode::Dot => dot::operand_sharding_from_dot(self, x, user, may_combine),
            Opcode::Reduce => reduction::operand_sharding_from_reduce(self, x, user, us),
            Opcode::Sort => reduction::operand_sharding_from_sort(g, x, user, us),
            Opcode::Reverse => reshaping::operand_sharding_from_reverse(g, user, us),
            Opcode::Outfeed => None,
            Opcode::Gather => self.gather_operand_from_user(x, user),
            Opcode::Scatter => self.scatter_operand_from_user(x, user),
            _ => pass_through::same_shape_operand_sharding(g, x, user, us),
        }
    }

    fn gather_operand_from_user(&self, x: Node, user: Node) -> Option<InstrSharding> {
        let g = &self.graph;
        let us = self.array_sharding(user)?;
        let (dn, sizes) = self.gather_dims(user)?;
        let rank = g.shape(user).rank();
        if g.operand(user, 1) == Some(x) {
            if !us.is_tiled() {
                return Some(InstrSharding::Single(us.clone()));
            }
            let (idims, odims) = dims::connected_index_dims(
                g.shape(x).rank(),
                dn.index_vector_dim,
                rank,
                &dn.offset_dims,
            );
            return Some(InstrSharding::Single(propagate_along_dims(
                us,
                &odims,
                &idims,
                g.shape(x).rank(),
            )));
        }
        if g.operand(user, 0) != Some(x) {
            return None;
        }
        if !us.is_tiled() {
            return Some(InstrSharding::Single(us.clone()));
        }
        let op_rank = g.shape(x).rank();
        // Parallel dims (explicit batching and iota-detected).
        let mut pd = GatherScatterDims::default();
        if !dn.operand_batching_dims.is_empty() {
            pd.operand = non_negative_dims(&dn.operand_batching_dims);
            pd.indices = non_negative_dims(&dn.start_indices_batching_dims);
            dims::fill_output_dims(&mut pd, dn.index_vector_dim, &dn.offset_dims);
        }
        if let Some(p) = self.gather_parallel(user) {
            pd.operand.extend(p.operand);
            pd.indices.extend(p.indices);
            pd.output.extend(p.output);
        }
        let parallel = (!pd.operand.is_empty())
            .then(|| propagate_along_dims(us, &pd.output, &pd.operand, op_rank));
        let (od, outd) = dims::passthrough_dims(
            g.shape(x).dims(),
            &dn.collapsed_slice_dims,
            &dn.operand_batching_dims,
            &dn.offset_dims,
            &sizes,
        );
        let passthrough = {
            let r = propagate_along_dims(us, &outd, &od, op_rank);
            (!r.is_tile_maximal()).then_some(r)
        };
        let out = match (parallel, passthrough) {
            (p, None) => p,
            (None, q) => q,
            (Some(p), Some(mut q)) => {
                if merge_sharding_leaf(&p, &mut q, true) {
                    Some(q)
                } else {
                    let mut p2 = p.clone();
                    if merge_sharding_leaf(&q, &mut p2, true) {
                        Some(p2)
                    } else {
                        Some(p)
                    }
                }
            }
        };
        out.map(InstrSharding::Single)
    }

    fn scatter_operand_from_user(&self, x: Node, user: Node) -> Option<InstrSharding> {
        let g = &self.graph;
        let (ops, ind, upd) = self.scatter_parts(user);
        let us = self.sharding(user)?;
        let ui = g.instr(user);
        if let Some(i) = ops.iter().position(|&o| o == x) {
            return if us.is_tuple() {
                us.sub_sharding(&ui.shape, i)
            } else {
                Some(us.clone())
            };
        }
        let dn = ui.scatter_dimension_numbers();
        let ind = ind?;
        let upd_rank = g.shape(*upd.first()?).rank();
        let ind_rank = g.shape(ind).rank();
        let (idims, udims) = dims::connected_index_dims(
            ind_rank,
            dn.index_vector_dim,
            upd_rank,
            &dn.update_window_dims,
        );
        if x == ind {
            let mut shardings = Vec::new();
            for &u in &upd {
                if let Some(s) = self.array_sharding(u) {
                    if s.is_spatially_partitioned() {
                        shardings.push(if s.is_tiled() {
                            propagate_along_dims(s, &udims, &idims, ind_rank)
                        } else {
                            s.clone()
                        });
                    }
                }
            }
            return xla_hlo_utils::merge::find_common_sharding(&shardings, None)
                .map(InstrSharding::Single);
        }
        let ui_idx = upd.iter().position(|&u| u == x)?;
        let from_indices = match self.array_sharding(ind) {
            Some(s) if s.is_tiled() => propagate_along_dims(s, &idims, &udims, upd_rank),
            Some(s) if s.is_spatially_partitioned() => s.clone(),
            _ => Sharding::Replicated,
        };
        let out_s = if us.is_tuple() {
            us.sub_sharding(&ui.shape, ui_idx)?
        } else {
            us.clone()
        };
        if let (Some(os), Some(sizes)) = (single(&out_s), self.scatter_slice_sizes(user)) {
            if os.is_tiled() {
                let (od, ud) = dims::passthrough_dims(
                    g.shape(ops[0]).dims(),
                    &dn.inserted_window_dims,
                    &dn.input_batching_dims,
                    &dn.update_window_dims,
                    &sizes,
                );
                let mut from_output = propagate_along_dims(os, &od, &ud, upd_rank);
                if !from_output.is_tile_maximal() {
                    if from_indices.is_tiled() {
                        let min = from_output.num_tiles() + 1;
                        merge_sharding_if_compatible(&from_indices, min, &mut from_output);
                    }
                    return Some(InstrSharding::Single(from_output));
                }
            }
        }
        (!from_indices.is_tile_maximal()).then_some(InstrSharding::Single(from_indices))
    }

    /// `InferShardingFromUsers`: returns whether `x` changed.
    pub fn infer_from_users(&mut self, x: Node, level: i64) -> bool {
        let opcode = self.graph.opcode(x);
        if level < BROADCAST_FROM_USERS_LEVEL && opcode == Opcode::Broadcast {
            return false;
        }
        if self.is_manual(x) {
            return false;
        }
        if self.sharding(x).is_none_or(InstrSharding::is_tile_maximal) {
            for k in 0..self.graph.users(x).len() {
                let u = self.graph.users(x)[k];
                if !self.has_sharding(u)
                    || self.graph.custom_call_kind(u) == CustomCallKind::FullToShard
                {
                    continue;
                }
                if !self.graph.shape(x).is_tuple() && self.is_manual(u) {
                    self.set_sharding(x, InstrSharding::Single(Sharding::Manual));
                    return true;
                }
                if let Some(s) = self.sharding_from_user(x, u, level) {
                    if s.is_manual() {
                        self.set_sharding(x, s);
                        return true;
                    }
                }
            }
        }
        if !supports_spatial_partitioning(&self.graph, x, false, self.allow_params) {
            return false;
        }
        let may_combine = may_combine_partial(level);
        let mut improved = false;
        for k in 0..self.graph.users(x).len() {
            let u = self.graph.users(x)[k];
            if self.graph.opcode(u) == Opcode::RngBitGenerator {
                let changed = self.sharding(x).is_none_or(|s| !s.is_replicated());
                if changed {
                    self.set_sharding(x, InstrSharding::Single(Sharding::Replicated));
                }
                return changed;
            }
            if let Some(s) = self.sharding_from_user(x, u, level) {
                improved |= self.maybe_improve(x, s, may_combine, false);
            }
        }
        improved
    }

    /// Applies a shard group's members to `x` (`InferShardingFromShardGroup`).
    pub fn infer_from_group(&mut self, x: Node, level: i64, members: &[Node]) -> bool {
        if !self.can_propagate_through(x, level) || self.is_manual(x) {
            return false;
        }
        if self.sharding(x).is_none_or(InstrSharding::is_tile_maximal) {
            for &m in members {
                if m != x && self.is_manual(m) {
                    let s = self.sharding(m).cloned().expect("manual");
                    self.set_sharding(x, s);
                    return true;
                }
            }
        }
        let may_combine = may_combine_partial(level);
        let mut changed = false;
        for &m in members {
            if m == x {
                continue;
            }
            if let Some(s) = self.sharding(m).cloned() {
                if s.is_tuple() == self.graph.shape(x).is_tuple() {
                    changed |= self.maybe_improve(x, s, may_combine, false);
                }
            }
        }
        changed
    }
}

/// `LookaheadUserSharding`: the sharding the single-user chain below `node`
/// would ask of it. Walks down single users to the first one with a
/// sharding, then asks back up the chain, giving each unsharded link its
/// user's answer for the time of the walk.
fn lookahead_user_sharding(state: &mut PropagationState<'_>, node: Node) -> Option<InstrSharding> {
    let users = state.graph.users(node);
    if users.len() != 1 {
        return None;
    }
    let mut chain = vec![node, users[0]];
    let mut current = users[0];
    while !state.has_sharding(current) {
        let users = state.graph.users(current);
        if users.len() != 1 {
            return None;
        }
        current = users[0];
        chain.push(current);
    }
    let mut sharding = None;
    let mut temporary: Vec<Node> = Vec::new();
    for link in (1..chain.len()).rev() {
        let (user, current) = (chain[link], chain[link - 1]);
        sharding = state.sharding_from_user(current, user, MAX_LEVEL);
        match &sharding {
            Some(asked) if link != 1 => {
                state.shardings[current as usize] =
                    Some(normalize(state.graph.shape(current), asked.clone()));
                temporary.push(current);
            }
            _ => break,
        }
    }
    for link in temporary {
        state.shardings[link as usize] = None;
    }
    sharding
}
