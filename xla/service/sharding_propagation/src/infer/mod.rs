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
mod gather_scatter;
mod partitionable;
mod pass_through;
mod reduction;
mod reshaping;
mod tuples_and_control;

use crate::dims;
use crate::graph::CustomCallKind;
use crate::graph::Node;
use crate::level::{
    may_combine_partial, BROADCAST_FROM_USERS_LEVEL, MAX_LEVEL, PASS_THROUGH_LEVEL,
};
use crate::opcodes::{elementwise_opcodes, has_side_effect};
use crate::state::{normalize, PropagationState};
use partitionable::supports_spatial_partitioning;
use xla_hlo_ir::Opcode;
use xla_hlo_utils::{InstrSharding, Sharding};

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
            Opcode::Gather => gather_scatter::gather_from_operands(self, x, may_combine),
            Opcode::Scatter => gather_scatter::scatter_from_operands(self, x, may_combine),
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
            Opcode::Gather => gather_scatter::operand_sharding_from_gather(self, x, user, us),
            Opcode::Scatter => gather_scatter::operand_sharding_from_scatter(self, x, user, us),
            _ => pass_through::same_shape_operand_sharding(g, x, user, us),
        }
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
