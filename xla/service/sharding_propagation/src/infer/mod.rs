//! The per-opcode propagation rules and their dispatch: what an
//! instruction's sharding can be given its operands' (forward,
//! `infer_from_operands`), what one user asks of an operand
//! (`sharding_from_user`) and what all users together give it (backward,
//! `infer_from_users`), and what its shard group gives it
//! (`infer_from_group`). These follow XLA's `InferShardingFromOperands`,
//! `GetShardingFromUser`, `InferShardingFromUsers` and
//! `InferShardingFromShardGroup`, including the aggressiveness levels
//! (`crate::level`).
//!
//! The rules live in one module per op family, each with its forward and
//! backward rules; this module holds the exhaustive `match`es on `Opcode`
//! that pick them, and the manual-region handling that comes before them.
//! The families use only the propagation state, the dims bookkeeping,
//! `partitionable` and `pass_through`'s representative operand, never this
//! module: the dot rule's look-ahead through users, which needs the
//! backward dispatch, is handed to it as a function.
//!
//! Invariant: rules only read the graph and the current shardings, and
//! write only the instruction they infer (the look-ahead's temporary
//! shardings are removed before it returns).

mod data_movement;
mod dot;
mod gather_scatter;
mod partitionable;
mod pass_through;
mod reduction;
mod reshaping;
mod tuples_and_control;

use crate::dims;
use crate::graph::{CustomCallKind, Graph, Node};
use crate::level::{BROADCAST_FROM_USERS_LEVEL, MAX_LEVEL, PASS_THROUGH_LEVEL};
use crate::opcodes::{elementwise_opcodes, has_side_effect, opcodes_without_rules};
use crate::state::{normalize, PropagationState};
use partitionable::supports_spatial_partitioning;
use xla_hlo_ir::Opcode;
use xla_hlo_utils::{InstrSharding, Sharding};

/// Whether the forward rule of `opcode` reads shardings other than its
/// operands' and its own: the dot and convolution look-ahead reads users,
/// a parameter its caller's argument. The fix point never trusts its
/// "nothing changed since" memo for these.
pub(crate) fn forward_rule_reads_beyond_operands(opcode: Opcode) -> bool {
    matches!(
        opcode,
        Opcode::Dot | Opcode::Convolution | Opcode::Parameter
    )
}

impl PropagationState<'_> {
    /// `InferShardingFromOperands`: returns whether `node` changed.
    pub fn infer_from_operands(&mut self, node: Node, level: i64) -> bool {
        if !self.can_propagate_through(node, level) || self.is_manual(node) {
            return false;
        }
        if let Some(changed) = self.manual_from_operands(node, level) {
            return changed;
        }
        let may_combine = self.may_combine(level);
        if !supports_spatial_partitioning(&self.graph, node, self.allow_output, false, self.is_spmd)
        {
            return self.replicated_from_operands(node, may_combine);
        }
        self.forward_rule(node, level, may_combine)
    }

    /// An instruction fed by a manual operand becomes manual (the result
    /// when this decides; `None` when it does not apply). Tuples only for
    /// the variadic reduce, sort, reduce-window and custom-calls;
    /// `SPMDShardToFullShape` leaves the manual region, and at
    /// `PASS_THROUGH_LEVEL` concatenates and dynamic slices wait.
    fn manual_from_operands(&mut self, node: Node, level: i64) -> Option<bool> {
        if !self.manual_possible {
            return None;
        }
        let graph = &self.graph;
        let opcode = graph.opcode(node);
        let shape = graph.shape(node);
        let tile_maximal_or_none = self
            .sharding(node)
            .is_none_or(InstrSharding::is_tile_maximal);
        // An async op on a thread this run does not propagate becomes
        // manual whole, as its computation is not looked into.
        let async_elsewhere = matches!(
            opcode,
            Opcode::AsyncStart | Opcode::AsyncUpdate | Opcode::AsyncDone
        ) && !self
            .thread_included(graph.instr(node).async_execution_thread());
        let may_turn_manual = !shape.is_tuple()
            || async_elsewhere
            || matches!(
                opcode,
                Opcode::Reduce | Opcode::Sort | Opcode::ReduceWindow | Opcode::CustomCall
            );
        if !tile_maximal_or_none || !may_turn_manual {
            return None;
        }
        let has_manual_operand = (0..graph.operand_count(node)).any(|k| {
            graph
                .operand(node, k)
                .is_some_and(|operand| self.is_manual(operand))
        });
        if !has_manual_operand {
            return None;
        }
        if graph.custom_call_kind(node) == CustomCallKind::ShardToFull {
            return Some(false);
        }
        if level == PASS_THROUGH_LEVEL
            && matches!(opcode, Opcode::Concatenate | Opcode::DynamicSlice)
        {
            return Some(false);
        }
        self.set_sharding(node, InstrSharding::Single(Sharding::Manual));
        Some(true)
    }

    /// An array instruction that takes no tiled sharding takes its first
    /// operand sharding that is replicated (not on one device), unless it
    /// is a root, has a side effect or has no operands.
    fn replicated_from_operands(&mut self, node: Node, may_combine: bool) -> bool {
        let graph = &self.graph;
        if graph.shape(node).is_tuple()
            || graph.operand_count(node) == 0
            || graph.is_root(node)
            || has_side_effect(graph.instr(node))
        {
            return false;
        }
        for k in 0..graph.operand_count(node) {
            let Some(operand) = graph.operand(node, k) else {
                continue;
            };
            if let Some(sharding) = self.sharding(operand) {
                if sharding.is_tile_maximal()
                    && !sharding.leaves().iter().any(Sharding::is_maximal_device)
                {
                    let sharding = sharding.clone();
                    return self.maybe_improve(node, sharding, may_combine, false);
                }
            }
        }
        false
    }

    /// The forward rule of `node`'s opcode.
    fn forward_rule(&mut self, node: Node, level: i64, may_combine: bool) -> bool {
        match self.graph.custom_call_kind(node) {
            CustomCallKind::ShardBarrierFrom => return false,
            CustomCallKind::ShardBarrierTo => {
                let Some(operand) = self.graph.operand(node, 0) else {
                    return false;
                };
                let Some(sharding) = self.sharding(operand).cloned() else {
                    return false;
                };
                let single_user = self.has_single_non_root_user(node);
                return self.maybe_improve(node, sharding, may_combine, single_user);
            }
            _ => {}
        }
        match self.graph.opcode(node) {
            // A bitcast-convert between element widths adds or drops a
            // minor dimension: not elementwise, and no rule (as Shardy).
            Opcode::BitcastConvert if changes_rank(&self.graph, node) => false,
            elementwise_opcodes!() | Opcode::Map | Opcode::Rng => {
                pass_through::elementwise_from_operands(self, node, may_combine)
            }
            Opcode::AllGather
            | Opcode::AllReduce
            | Opcode::AllToAll
            | Opcode::Call
            | Opcode::CollectiveBroadcast
            | Opcode::CollectivePermute
            | Opcode::Conditional
            | Opcode::Constant
            | Opcode::CustomCall
            | Opcode::Infeed
            | Opcode::Iota
            | Opcode::OptimizationBarrier
            | Opcode::Outfeed
            | Opcode::Pad
            | Opcode::RaggedAllToAll
            | Opcode::ReduceScatter
            | Opcode::RngBitGenerator
            | Opcode::Slice
            | Opcode::TopK => pass_through::from_representative_operand(self, node, may_combine),
            Opcode::Broadcast => reshaping::broadcast_from_operand(self, node, level, may_combine),
            Opcode::Reshape => reshaping::reshape_from_operand(self, node, may_combine),
            Opcode::Reverse => reshaping::reverse_from_operand(self, node, may_combine),
            Opcode::Transpose => reshaping::transpose_from_operand(self, node, may_combine),
            Opcode::Concatenate => {
                data_movement::concatenate_from_operands(self, node, level, may_combine)
            }
            Opcode::DynamicSlice => {
                data_movement::dynamic_slice_from_sliced_array(self, node, may_combine)
            }
            Opcode::DynamicUpdateSlice => {
                data_movement::dynamic_update_slice_from_operands(self, node, may_combine)
            }
            Opcode::Dot => {
                let dot_dims = dims::dot_dims(&self.graph, node);
                dot::dot_from_operands(self, node, &dot_dims, may_combine, lookahead_user_sharding)
            }
            Opcode::Convolution => {
                dot::convolution_from_operands(self, node, may_combine, lookahead_user_sharding)
            }
            Opcode::Reduce => reduction::reduce_from_operands(self, node, may_combine),
            Opcode::ReduceWindow => reduction::reduce_window_from_operands(self, node, may_combine),
            Opcode::SelectAndScatter => {
                reduction::select_and_scatter_from_operand(self, node, may_combine)
            }
            Opcode::Sort => reduction::sort_from_operands(self, node, may_combine),
            Opcode::Gather => gather_scatter::gather_from_operands(self, node, may_combine),
            Opcode::Scatter => gather_scatter::scatter_from_operands(self, node, may_combine),
            Opcode::GetTupleElement => {
                tuples_and_control::get_tuple_element_from_operand(self, node, may_combine)
            }
            Opcode::Tuple => tuples_and_control::tuple_from_operands(self, node),
            Opcode::While => tuples_and_control::while_from_operand(self, node, may_combine),
            Opcode::Parameter => {
                tuples_and_control::parameter_from_argument(self, node, may_combine)
            }
            opcodes_without_rules!() => false,
        }
    }

    /// `GetShardingFromUser`: the sharding `user` asks of its operand
    /// `operand`.
    pub fn sharding_from_user(
        &self,
        operand: Node,
        user: Node,
        level: i64,
    ) -> Option<InstrSharding> {
        if !self.can_propagate_through(user, level) || !self.is_spatially_partitioned(user) {
            return None;
        }
        let may_combine = self.may_combine(level);
        let graph = &self.graph;
        let user_sharding = self.sharding(user)?;
        match graph.opcode(user) {
            Opcode::Broadcast => {
                reshaping::operand_sharding_from_broadcast(graph, user, user_sharding, self.is_spmd)
            }
            Opcode::Reshape => {
                reshaping::operand_sharding_from_reshape(graph, operand, user, user_sharding)
            }
            Opcode::Reverse => reshaping::operand_sharding_from_reverse(graph, user, user_sharding),
            Opcode::Transpose => {
                reshaping::operand_sharding_from_transpose(graph, user, user_sharding)
            }
            Opcode::Concatenate => data_movement::operand_sharding_from_concatenate(
                graph,
                operand,
                user,
                level,
                user_sharding,
                self.is_spmd,
            ),
            Opcode::DynamicSlice | Opcode::DynamicUpdateSlice => {
                data_movement::operand_sharding_from_dynamic_slice(
                    graph,
                    operand,
                    user,
                    level,
                    user_sharding,
                )
            }
            Opcode::Pad => {
                data_movement::operand_sharding_from_pad(graph, operand, user, user_sharding)
            }
            Opcode::Slice => Some(user_sharding.clone()),
            Opcode::Dot => dot::operand_sharding_from_dot(self, operand, user, may_combine),
            Opcode::Convolution => {
                dot::operand_sharding_from_convolution(self, operand, user, may_combine)
            }
            Opcode::Reduce => {
                reduction::operand_sharding_from_reduce(self, operand, user, user_sharding)
            }
            Opcode::ReduceWindow => {
                reduction::operand_sharding_from_reduce_window(graph, operand, user, user_sharding)
            }
            Opcode::Sort => {
                reduction::operand_sharding_from_sort(graph, operand, user, user_sharding)
            }
            Opcode::Gather => {
                gather_scatter::operand_sharding_from_gather(self, operand, user, user_sharding)
            }
            Opcode::Scatter => {
                gather_scatter::operand_sharding_from_scatter(self, operand, user, user_sharding)
            }
            Opcode::Tuple => {
                tuples_and_control::operand_sharding_from_tuple(self, operand, user, user_sharding)
            }
            Opcode::GetTupleElement => tuples_and_control::operand_sharding_from_get_tuple_element(
                self,
                operand,
                user,
                user_sharding,
            ),
            // The outfeed's sharding is its data's, or its operands' (data, token).
            Opcode::Outfeed if graph.operand(user, 0) == Some(operand) => {
                if crate::prepare::outfeed_sharding_covers_token(graph, user) {
                    user_sharding.sub_sharding(&crate::prepare::sharding_shape(graph, user), 0)
                } else {
                    Some(user_sharding.clone())
                }
            }
            Opcode::Outfeed => None,
            Opcode::BitcastConvert if changes_rank(graph, user) => None,
            elementwise_opcodes!()
            | Opcode::Map
            | Opcode::Rng
            | Opcode::AllGather
            | Opcode::AllReduce
            | Opcode::AllToAll
            | Opcode::Call
            | Opcode::CollectiveBroadcast
            | Opcode::CollectivePermute
            | Opcode::Conditional
            | Opcode::Constant
            | Opcode::CustomCall
            | Opcode::Infeed
            | Opcode::Iota
            | Opcode::OptimizationBarrier
            | Opcode::Parameter
            | Opcode::RaggedAllToAll
            | Opcode::ReduceScatter
            | Opcode::RngBitGenerator
            | Opcode::SelectAndScatter
            | Opcode::TopK
            | Opcode::While
            | opcodes_without_rules!() => {
                pass_through::same_shape_operand_sharding(graph, operand, user, user_sharding)
            }
        }
    }

    /// `InferShardingFromUsers`: returns whether `node` changed.
    pub fn infer_from_users(&mut self, node: Node, level: i64) -> bool {
        if level < BROADCAST_FROM_USERS_LEVEL && self.graph.opcode(node) == Opcode::Broadcast {
            return false;
        }
        if self.is_manual(node) {
            return false;
        }
        if let Some(changed) = self.manual_from_users(node, level) {
            return changed;
        }
        if !supports_spatial_partitioning(&self.graph, node, false, self.allow_params, self.is_spmd)
        {
            return false;
        }
        let may_combine = self.may_combine(level);
        let mut improved = false;
        for k in 0..self.graph.users(node).len() {
            let user = self.graph.users(node)[k];
            // XLA keeps an rng-bit-generator's state replicated.
            if self.graph.opcode(user) == Opcode::RngBitGenerator {
                let changed = self
                    .sharding(node)
                    .is_none_or(|sharding| !sharding.is_replicated());
                if changed {
                    self.set_sharding(node, InstrSharding::Single(Sharding::Replicated));
                }
                return changed;
            }
            if let Some(sharding) = self.sharding_from_user(node, user, level) {
                // A ShardBarrierTo lets nothing through backward: whatever
                // its users ask, it is replicated.
                let sharding =
                    if self.graph.custom_call_kind(node) == CustomCallKind::ShardBarrierTo {
                        replicated_like(&sharding)
                    } else {
                        sharding
                    };
                improved |= self.maybe_improve(node, sharding, may_combine, false);
            }
        }
        improved
    }

    /// A tile-maximal or unsharded instruction with a manual user (other
    /// than `SPMDFullToShardShape`, which enters the manual region) becomes
    /// manual (`Some(true)`); `None` when no user makes it so.
    fn manual_from_users(&mut self, node: Node, level: i64) -> Option<bool> {
        if !self.manual_possible {
            return None;
        }
        if !self
            .sharding(node)
            .is_none_or(InstrSharding::is_tile_maximal)
        {
            return None;
        }
        for k in 0..self.graph.users(node).len() {
            let user = self.graph.users(node)[k];
            if !self.has_sharding(user)
                || self.graph.custom_call_kind(user) == CustomCallKind::FullToShard
            {
                continue;
            }
            if !self.graph.shape(node).is_tuple() && self.is_manual(user) {
                self.set_sharding(node, InstrSharding::Single(Sharding::Manual));
                return Some(true);
            }
            if let Some(sharding) = self.sharding_from_user(node, user, level) {
                if sharding.is_manual() {
                    self.set_sharding(node, sharding);
                    return Some(true);
                }
            }
        }
        None
    }

    /// Applies a shard group's members to `node`
    /// (`InferShardingFromShardGroup`): a manual member wins outright,
    /// otherwise each member of the same kind (tuple or array) is offered.
    pub fn infer_from_group(&mut self, node: Node, level: i64, members: &[Node]) -> bool {
        if !self.can_propagate_through(node, level)
            || self.is_manual(node)
            || self.graph.custom_call_kind(node) == CustomCallKind::ShardBarrierTo
        {
            return false;
        }
        // Nothing flows out of a ShardBarrierFrom through its group.
        let from_barrier = |state: &Self, member: Node| {
            state.graph.custom_call_kind(member) == CustomCallKind::ShardBarrierFrom
        };
        if self
            .sharding(node)
            .is_none_or(InstrSharding::is_tile_maximal)
        {
            for &member in members {
                if member == node || from_barrier(self, member) {
                    continue;
                }
                if let Some(manual) = self.sharding(member).filter(|s| s.is_manual()).cloned() {
                    self.set_sharding(node, manual);
                    return true;
                }
            }
        }
        let may_combine = self.may_combine(level);
        let is_tuple = self.graph.shape(node).is_tuple();
        let mut changed = false;
        for &member in members {
            if member == node || from_barrier(self, member) {
                continue;
            }
            if let Some(sharding) = self.sharding(member).cloned() {
                if sharding.is_tuple() == is_tuple {
                    changed |= self.maybe_improve(node, sharding, may_combine, false);
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

/// Replicated, in the form (array or tuple) of `sharding`.
fn replicated_like(sharding: &InstrSharding) -> InstrSharding {
    match sharding {
        InstrSharding::Single(_) => InstrSharding::Single(Sharding::Replicated),
        InstrSharding::Tuple(leaves) => {
            InstrSharding::Tuple(vec![Sharding::Replicated; leaves.len()].into())
        }
    }
}

/// Whether `node`'s result has another rank than its first operand (a
/// bitcast-convert between element widths).
fn changes_rank(graph: &Graph, node: Node) -> bool {
    graph
        .operand(node, 0)
        .is_some_and(|operand| graph.shape(operand).rank() != graph.shape(node).rank())
}
