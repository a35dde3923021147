//! The fix point of one aggressiveness level (XLA's `RunToFixPoint`): each
//! computation is swept in post order (shard groups, then the forward
//! rules) and in reverse post order (the backward rules) until a whole
//! pass changes nothing. A change is pushed across computation boundaries
//! at once (`MaybeComputationPropagation`).
//!
//! Two mechanisms keep a level at O(instructions + changes):
//! - a worklist of per-rule "done" flags (XLA's caches), cleared for the
//!   neighbours of every change, with per-computation counts of pending
//!   flags so that clean computations are skipped;
//! - per-rule memos: when a rule reported "no change", it is not run again
//!   while nothing it reads has been written since and the level behaves
//!   the same for it (same level class).
//!
//! Invariants: provided (user) shardings are never inferred, only their
//! unspecified dims refined; the memo is only trusted for rules that read
//! nothing but the shardings of the node and its direct neighbours
//! (`infer::forward_rule_reads_beyond_operands`).

use crate::boundary::shared_across_boundary;
use crate::graph::Node;
use crate::infer::forward_rule_reads_beyond_operands;
use crate::level::{
    may_combine_partial, ALL_OPS_LEVEL, BROADCAST_FORWARD_LEVEL, BROADCAST_FROM_USERS_LEVEL,
    PASS_THROUGH_LEVEL,
};
use crate::shard_groups::ShardGroups;
use crate::state::{normalize, PropagationState};
use rustc_hash::FxHashMap;
use xla_hlo_ir::Opcode;
use xla_hlo_utils::merge::merge_sharding_if_compatible;
use xla_hlo_utils::ops::partially_replicate_all_except;
use xla_hlo_utils::{InstrSharding, Sharding};

/// A rule's last "no change" answer.
#[derive(Clone, Copy, Default)]
struct Memo {
    /// `write_count + 1` when the answer was given (0: no answer yet): a
    /// store stamped with this or a later count may change the answer.
    first_invalidating_write: u64,
    /// The level class the answer was given at.
    level_class: i64,
}

/// The rules a node is visited for.
#[derive(Clone, Copy)]
enum Rule {
    Forward = 0,
    Backward = 1,
    Group = 2,
}

/// Per-level "already inferred" flags (XLA's caches), plus per-computation
/// counts of flags still pending so clean computations are skipped.
struct Worklist {
    /// Per rule, per node: nothing to do until a neighbour changes.
    done: [Vec<bool>; 3],
    /// Pending flags of each computation (all three rules).
    open: Vec<usize>,
    /// Each node's computation.
    comp_of: Vec<u32>,
}

impl Worklist {
    /// Every flag pending.
    fn new(state: &PropagationState) -> Worklist {
        let node_count = state.shardings.len();
        let comp_of: Vec<u32> = (0..node_count as Node)
            .map(|node| state.graph.comp_index(node))
            .collect();
        let mut open = vec![0usize; state.graph.post_orders.len()];
        for &comp in &comp_of {
            open[comp as usize] += 3;
        }
        Worklist {
            done: [
                vec![false; node_count],
                vec![false; node_count],
                vec![false; node_count],
            ],
            open,
            comp_of,
        }
    }

    fn is_done(&self, rule: Rule, node: Node) -> bool {
        self.done[rule as usize][node as usize]
    }

    fn mark_done(&mut self, rule: Rule, node: Node) {
        self.set(rule, node, true);
    }

    fn mark_pending(&mut self, rule: Rule, node: Node) {
        self.set(rule, node, false);
    }

    fn set(&mut self, rule: Rule, node: Node, done: bool) {
        let flag = &mut self.done[rule as usize][node as usize];
        if *flag != done {
            *flag = done;
            let comp = self.comp_of[node as usize] as usize;
            if done {
                self.open[comp] -= 1;
            } else {
                self.open[comp] += 1;
            }
        }
    }
}

/// The lowest level at which `node`'s forward rule behaves as at `level`
/// (a memo holds across levels of one class); `None` when the rule does
/// nothing at `level`.
fn forward_level_class(state: &PropagationState, node: Node, level: i64) -> Option<i64> {
    if !state.can_propagate_through(node, level) {
        return None;
    }
    if state.graph.opcode(node) == Opcode::Broadcast {
        return (level >= BROADCAST_FORWARD_LEVEL).then_some(BROADCAST_FORWARD_LEVEL);
    }
    Some(if may_combine_partial(level) {
        ALL_OPS_LEVEL
    } else {
        PASS_THROUGH_LEVEL
    })
}

/// The lowest level at which `node`'s backward rule behaves as at `level`;
/// `None` when the rule does nothing at `level`.
fn backward_level_class(state: &PropagationState, node: Node, level: i64) -> Option<i64> {
    let is_broadcast = state.graph.opcode(node) == Opcode::Broadcast;
    if level < BROADCAST_FROM_USERS_LEVEL && is_broadcast {
        return None;
    }
    Some(match level {
        PASS_THROUGH_LEVEL => PASS_THROUGH_LEVEL,
        ALL_OPS_LEVEL => ALL_OPS_LEVEL,
        _ if is_broadcast || state.graph.has_broadcast_user(node) => BROADCAST_FROM_USERS_LEVEL,
        _ => ALL_OPS_LEVEL,
    })
}

/// Nothing the forward rule of `node` reads (its own and its operands'
/// shardings) was written since `memo`.
fn forward_inputs_unchanged(state: &PropagationState, node: Node, memo: u64) -> bool {
    memo != 0
        && !forward_rule_reads_beyond_operands(state.graph.opcode(node))
        && state.last_written[node as usize] < memo
        && state
            .graph
            .operands(node)
            .all(|operand| state.last_written[operand as usize] < memo)
}

/// Nothing the backward rule of `node` reads (its own, its users' and
/// their operands' shardings) was written since `memo`.
fn backward_inputs_unchanged(state: &PropagationState, node: Node, memo: u64) -> bool {
    memo != 0
        && state.last_written[node as usize] < memo
        && state.graph.users(node).iter().all(|&user| {
            state.last_written[user as usize] < memo
                && state
                    .graph
                    .operands(user)
                    .all(|operand| state.last_written[operand as usize] < memo)
        })
}

/// Is `node` the only operand of a manual conversion op (not supported for
/// unspecified-dims refinement)?
fn feeds_manual_conversion(state: &PropagationState, node: Node) -> bool {
    let users = state.graph.users(node);
    users.len() == 1 && state.graph.is_manual_conversion(users[0])
}

/// Runs the levels' fix points; keeps the memos and counts across levels.
pub(crate) struct FixPoint<'a> {
    /// User shardings: never inferred.
    provided: &'a [bool],
    /// Provided shardings' dims left open to propagation.
    unspecified: &'a FxHashMap<Node, Vec<usize>>,
    groups: &'a ShardGroups,
    /// Sweeps over a computation, all levels.
    pub iterations: usize,
    /// Calls of the forward and backward rules, all levels.
    pub rule_calls: usize,
    forward_memo: Vec<Memo>,
    backward_memo: Vec<Memo>,
}

impl<'a> FixPoint<'a> {
    pub fn new(
        provided: &'a [bool],
        unspecified: &'a FxHashMap<Node, Vec<usize>>,
        groups: &'a ShardGroups,
    ) -> FixPoint<'a> {
        FixPoint {
            provided,
            unspecified,
            groups,
            iterations: 0,
            rule_calls: 0,
            forward_memo: vec![Memo::default(); provided.len()],
            backward_memo: vec![Memo::default(); provided.len()],
        }
    }

    /// `RunToFixPoint` for one aggressiveness level.
    pub fn run(&mut self, state: &mut PropagationState, level: i64) {
        let mut worklist = Worklist::new(state);
        for node in 0..state.shardings.len() as Node {
            if !self.groups.contains(node) {
                worklist.mark_done(Rule::Group, node);
            }
        }
        loop {
            let mut changed = false;
            for comp in 0..state.graph.post_orders.len() {
                if worklist.open[comp] == 0 || !state.comp_thread_included(comp) {
                    continue;
                }
                self.iterations += 1;
                let len = state.graph.post_orders[comp].len();
                if !self.groups.is_empty() {
                    for k in 0..len {
                        let node = state.graph.post_orders[comp][k];
                        changed |= self.group_step(state, &mut worklist, node, level);
                    }
                }
                for k in 0..len {
                    let node = state.graph.post_orders[comp][k];
                    changed |= self.forward_step(state, &mut worklist, node, level);
                }
                for k in (0..len).rev() {
                    let node = state.graph.post_orders[comp][k];
                    changed |= self.backward_step(state, &mut worklist, node, level);
                }
            }
            if !changed {
                break;
            }
        }
    }

    /// Applies `node`'s shard group to it; returns whether it changed.
    fn group_step(
        &mut self,
        state: &mut PropagationState,
        worklist: &mut Worklist,
        node: Node,
        level: i64,
    ) -> bool {
        if worklist.is_done(Rule::Group, node) || !self.groups.contains(node) {
            return false;
        }
        let members = self.groups.members(node).unwrap_or(&[]).to_vec();
        if self.provided[node as usize] {
            if !state.may_combine(level) || !self.unspecified.contains_key(&node) {
                return false;
            }
            let mut refined = false;
            for &member in &members {
                if member == node {
                    continue;
                }
                if let Some(InstrSharding::Single(sharding)) =
                    state.shardings[member as usize].clone()
                {
                    refined |= self.refine_unspecified(state, node, &sharding);
                }
            }
            if refined {
                self.mark_neighbours_pending(state, worklist, node);
                worklist.mark_done(Rule::Group, node);
            }
            return refined;
        }
        worklist.mark_done(Rule::Group, node);
        if state.infer_from_group(node, level, &members) {
            self.after_change(state, worklist, node);
            return true;
        }
        false
    }

    /// Runs `node`'s forward rule unless its memo holds; returns whether
    /// `node` changed.
    fn forward_step(
        &mut self,
        state: &mut PropagationState,
        worklist: &mut Worklist,
        node: Node,
        level: i64,
    ) -> bool {
        if worklist.is_done(Rule::Forward, node) {
            return false;
        }
        if self.provided[node as usize] {
            return self.refine_from_operand(state, worklist, node, level);
        }
        worklist.mark_done(Rule::Forward, node);
        let Some(class) = forward_level_class(state, node, level) else {
            return false;
        };
        let memo = self.forward_memo[node as usize];
        if memo.level_class == class
            && forward_inputs_unchanged(state, node, memo.first_invalidating_write)
        {
            return false;
        }
        self.rule_calls += 1;
        let changed = state.infer_from_operands(node, level);
        if changed {
            self.after_change(state, worklist, node);
        } else {
            self.forward_memo[node as usize] = Memo {
                first_invalidating_write: state.write_count + 1,
                level_class: class,
            };
        }
        changed
    }

    /// Refines a provided sharding's unspecified dims from its operand.
    fn refine_from_operand(
        &mut self,
        state: &mut PropagationState,
        worklist: &mut Worklist,
        node: Node,
        level: i64,
    ) -> bool {
        if !state.may_combine(level)
            || !self.unspecified.contains_key(&node)
            || feeds_manual_conversion(state, node)
        {
            return false;
        }
        let Some(operand) = state.graph.operand(node, 0) else {
            return false;
        };
        let Some(InstrSharding::Single(operand_sharding)) =
            state.shardings[operand as usize].clone()
        else {
            return false;
        };
        if self.refine_unspecified(state, node, &operand_sharding) {
            self.mark_neighbours_pending(state, worklist, node);
            worklist.mark_done(Rule::Forward, node);
            return true;
        }
        false
    }

    /// Runs `node`'s backward rule unless its memo holds; returns whether
    /// `node` changed.
    fn backward_step(
        &mut self,
        state: &mut PropagationState,
        worklist: &mut Worklist,
        node: Node,
        level: i64,
    ) -> bool {
        // A manual conversion's operand is asked again whenever the
        // conversion is.
        if state.graph.is_manual_conversion(node) && !worklist.is_done(Rule::Backward, node) {
            if let Some(operand) = state.graph.operand(node, 0) {
                worklist.mark_pending(Rule::Backward, operand);
            }
        }
        if worklist.is_done(Rule::Backward, node) {
            return false;
        }
        if self.provided[node as usize] {
            return self.refine_from_users(state, worklist, node, level);
        }
        worklist.mark_done(Rule::Backward, node);
        let Some(class) = backward_level_class(state, node, level) else {
            return false;
        };
        let memo = self.backward_memo[node as usize];
        if memo.level_class == class
            && backward_inputs_unchanged(state, node, memo.first_invalidating_write)
        {
            return false;
        }
        self.rule_calls += 1;
        let changed = state.infer_from_users(node, level);
        if changed {
            self.after_change(state, worklist, node);
        } else {
            self.backward_memo[node as usize] = Memo {
                first_invalidating_write: state.write_count + 1,
                level_class: class,
            };
        }
        changed
    }

    /// Refines a provided sharding's unspecified dims from what its tiled
    /// users ask.
    fn refine_from_users(
        &mut self,
        state: &mut PropagationState,
        worklist: &mut Worklist,
        node: Node,
        level: i64,
    ) -> bool {
        if !state.may_combine(level)
            || !self.unspecified.contains_key(&node)
            || feeds_manual_conversion(state, node)
        {
            return false;
        }
        let users: Vec<Node> = state.graph.users(node).to_vec();
        let mut refined = false;
        for user in users {
            if !state.shardings[user as usize]
                .as_ref()
                .and_then(|sharding| sharding.as_single())
                .is_some_and(Sharding::is_tiled)
            {
                continue;
            }
            if let Some(InstrSharding::Single(asked)) = state.sharding_from_user(node, user, level)
            {
                refined |= self.refine_unspecified(state, node, &asked);
            }
        }
        if refined {
            self.mark_neighbours_pending(state, worklist, node);
            worklist.mark_done(Rule::Backward, node);
        }
        refined
    }

    /// Refines a provided sharding's unspecified dims from `from`.
    fn refine_unspecified(
        &self,
        state: &mut PropagationState,
        node: Node,
        from: &Sharding,
    ) -> bool {
        let Some(spec) = self.unspecified.get(&node) else {
            return false;
        };
        if !from.is_tiled() {
            return false;
        }
        let Some(InstrSharding::Single(current)) = state.shardings[node as usize].clone() else {
            return false;
        };
        let partial = partially_replicate_all_except(from, spec);
        let mut refined = current;
        let min_tiles = refined.num_tiles() + 1;
        if merge_sharding_if_compatible(&partial, min_tiles, &mut refined) {
            state.store_normalized(node, InstrSharding::Single(refined));
            return true;
        }
        false
    }

    /// After `node` changed: pushes the change across computation
    /// boundaries and puts the neighbours of every changed node back on
    /// the worklist.
    fn after_change(&self, state: &mut PropagationState, worklist: &mut Worklist, node: Node) {
        let mut changed = Vec::new();
        self.propagate_across_boundaries(state, node, &mut changed);
        self.mark_neighbours_pending(state, worklist, node);
        for other in changed {
            self.mark_neighbours_pending(state, worklist, other);
        }
    }

    /// The rules that read `node`'s sharding: its operands' backward
    /// rules, its users' (and their callees' parameters') forward rules
    /// and its shard group's other members.
    fn mark_neighbours_pending(
        &self,
        state: &PropagationState,
        worklist: &mut Worklist,
        node: Node,
    ) {
        for operand in state.graph.operands(node) {
            worklist.mark_pending(Rule::Backward, operand);
        }
        for &user in state.graph.users(node) {
            worklist.mark_pending(Rule::Forward, user);
            for &parameter in state.graph.callee_params(user) {
                worklist.mark_pending(Rule::Forward, parameter);
            }
        }
        if let Some(members) = self.groups.members(node) {
            for &member in members {
                if member != node {
                    worklist.mark_pending(Rule::Group, member);
                }
            }
        }
    }

    /// `MaybeComputationPropagation`: pushes `node`'s sharding to the
    /// instructions sharing it across a computation boundary; records every
    /// node changed.
    fn propagate_across_boundaries(
        &self,
        state: &mut PropagationState,
        node: Node,
        changed: &mut Vec<Node>,
    ) {
        let opcode = state.graph.opcode(node);
        if matches!(
            opcode,
            Opcode::Conditional | Opcode::While | Opcode::CustomCall | Opcode::Call
        ) {
            self.share_with_boundary(state, node, node, changed);
        }
        if opcode == Opcode::Parameter || state.graph.is_root(node) {
            if let Some(&caller) = state.graph.caller.get(&state.graph.comp_of(node)) {
                self.share_with_boundary(state, caller, node, changed);
                if opcode == Opcode::Parameter
                    && matches!(
                        state.graph.opcode(caller),
                        Opcode::Conditional | Opcode::Call
                    )
                {
                    self.share_with_boundary(state, node, node, changed);
                }
            }
        }
    }

    /// Gives `node`'s sharding to the other instructions in `boundary`'s
    /// shared set (when `node` is in it), except provided ones.
    fn share_with_boundary(
        &self,
        state: &mut PropagationState,
        boundary: Node,
        node: Node,
        changed: &mut Vec<Node>,
    ) {
        let shared = shared_across_boundary(&state.graph, boundary);
        if !shared.contains(&node) {
            return;
        }
        let Some(sharding) = state.shardings[node as usize].clone() else {
            return;
        };
        for other in shared {
            if self.provided[other as usize] {
                continue;
            }
            let new = normalize(state.graph.shape(other), sharding.clone());
            if state.shardings[other as usize].as_ref() != Some(&new) {
                state.store_normalized(other, new);
                changed.push(other);
                self.propagate_across_boundaries(state, other, changed);
            }
        }
    }
}
