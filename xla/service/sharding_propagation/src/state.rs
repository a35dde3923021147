//! Propagation state: the module's graph, every node's current sharding and
//! a write clock, plus the accessors and the acceptance rule every
//! propagation rule shares (`maybe_improve`: a candidate replaces the
//! current sharding only if it is strictly better or a compatible
//! refinement, see `xla_hlo_utils::merge::return_improved`).
//!
//! Invariants: a stored sharding is always normalized for its node's shape
//! (one leaf per tuple leaf); every store through `store_normalized` ticks
//! `write_count` and records it in `last_written`, which is what the fix
//! point's memo relies on to know that nothing a rule reads has changed.

use crate::graph::{Graph, Node};
use xla_hlo_ir::Shape;
use xla_hlo_utils::merge::return_improved;
use xla_hlo_utils::sharding::leaf_count;
use xla_hlo_utils::{InstrSharding, Sharding};

/// The graph and each node's current sharding.
pub(crate) struct PropagationState<'m> {
    pub graph: Graph<'m>,
    pub shardings: Vec<Option<InstrSharding>>,
    /// Counts sharding stores.
    pub write_count: u64,
    /// `last_written[n]` is `write_count` at `n`'s last store (0: never).
    pub last_written: Vec<u64>,
    /// Propagation may change the entry root's sharding.
    pub allow_output: bool,
    /// Propagation may change entry parameter shardings.
    pub allow_params: bool,
    /// Some node is manual or converts to or from manual: without one, no
    /// rule can produce a manual sharding, and the manual rules are skipped.
    pub manual_possible: bool,
    /// XLA's `is_spmd`: shardings are for the SPMD partitioner (partial
    /// shardings merge, custom-calls and reverses take tiles, ...); when
    /// false, for XLA's older per-device placement (see
    /// `ShardingPropagationOptions::is_spmd`).
    pub is_spmd: bool,
    /// XLA's `execution_threads` (`None`: all): computations of other
    /// threads are not propagated.
    pub execution_threads: Option<Vec<String>>,
}

impl PropagationState<'_> {
    /// Whether `thread` is among the execution threads propagated.
    pub fn thread_included(&self, thread: &str) -> bool {
        self.execution_threads
            .as_ref()
            .is_none_or(|threads| threads.iter().any(|t| t == thread))
    }

    /// Whether computation `comp` (an index) runs on an included thread.
    pub fn comp_thread_included(&self, comp: usize) -> bool {
        self.execution_threads.is_none()
            || self.graph.module.computations.get(comp).is_some_and(|c| {
                self.thread_included(c.execution_thread.as_deref().unwrap_or("main"))
            })
    }

    /// Whether partial shardings may be combined at `level` (XLA's
    /// `is_spmd && aggressiveness > 0`).
    pub fn may_combine(&self, level: i64) -> bool {
        self.is_spmd && crate::level::may_combine_partial(level)
    }
}

/// The non-negative entries of `dims`, as indices.
pub(crate) fn non_negative_dims(dims: &[i64]) -> Vec<usize> {
    dims.iter()
        .filter(|&&d| d >= 0)
        .map(|&d| d as usize)
        .collect()
}

/// The sharding `sharding` shaped for `shape` (one leaf per tuple leaf).
pub(crate) fn normalize(shape: &Shape, sharding: InstrSharding) -> InstrSharding {
    match (shape, sharding) {
        (Shape::Tuple(_), InstrSharding::Single(leaf)) => InstrSharding::single_for(shape, leaf),
        (_, sharding) => sharding,
    }
}

impl<'m> PropagationState<'m> {
    pub fn has_sharding(&self, node: Node) -> bool {
        self.shardings[node as usize].is_some()
    }

    pub fn sharding(&self, node: Node) -> Option<&InstrSharding> {
        self.shardings[node as usize].as_ref()
    }

    /// The sharding of an array node (`None` for tuple shardings).
    pub fn array_sharding(&self, node: Node) -> Option<&Sharding> {
        self.sharding(node).and_then(InstrSharding::as_single)
    }

    /// Normalizes `sharding` for `node`'s shape and stores it.
    pub fn set_sharding(&mut self, node: Node, sharding: InstrSharding) {
        let sharding = normalize(self.graph.shape(node), sharding);
        self.store_normalized(node, sharding);
    }

    /// Stores an already normalized sharding and stamps the node as changed.
    pub fn store_normalized(&mut self, node: Node, sharding: InstrSharding) {
        self.write_count += 1;
        self.last_written[node as usize] = self.write_count;
        self.shardings[node as usize] = Some(sharding);
    }

    pub fn is_spatially_partitioned(&self, node: Node) -> bool {
        self.sharding(node)
            .is_some_and(InstrSharding::is_spatially_partitioned)
    }

    /// The node's sharding when it is spatially partitioned.
    pub fn partitioned_sharding(&self, node: Node) -> Option<&InstrSharding> {
        self.sharding(node)
            .filter(|sharding| sharding.is_spatially_partitioned())
    }

    /// The node's array sharding when the node is spatially partitioned.
    pub fn partitioned_array_sharding(&self, node: Node) -> Option<&Sharding> {
        self.partitioned_sharding(node)
            .and_then(InstrSharding::as_single)
    }

    pub fn is_manual(&self, node: Node) -> bool {
        self.sharding(node).is_some_and(InstrSharding::is_manual)
    }

    /// XLA resizes a sharding more aggressively for an instruction with one
    /// user (not counting the computation's root).
    pub fn has_single_non_root_user(&self, node: Node) -> bool {
        self.graph.non_root_users(node) == 1
    }

    /// `CanPropagateThroughAtAggressiveLevel`.
    pub fn can_propagate_through(&self, node: Node, level: i64) -> bool {
        level >= self.graph.min_level(node)
    }

    /// Applies `candidate` to `node` if it improves the current sharding
    /// (`MaybeImproveInstructionSharding`); returns whether it did.
    pub fn maybe_improve(
        &mut self,
        node: Node,
        candidate: InstrSharding,
        may_combine: bool,
        allow_aggressive_resharding: bool,
    ) -> bool {
        let shape = self.graph.shape(node);
        let candidate = normalize(shape, candidate);
        if self.sharding(node) == Some(&candidate) {
            return false;
        }
        let dims = (!shape.is_tuple()).then(|| shape.dims());
        match return_improved(
            &candidate,
            self.sharding(node),
            dims,
            may_combine,
            allow_aggressive_resharding,
        ) {
            Some(improved) => {
                self.store_normalized(node, improved);
                true
            }
            None => false,
        }
    }

    /// `maybe_improve` with an array sharding.
    pub fn maybe_improve_array(
        &mut self,
        node: Node,
        candidate: Sharding,
        may_combine: bool,
        allow_aggressive_resharding: bool,
    ) -> bool {
        self.maybe_improve(
            node,
            InstrSharding::Single(candidate),
            may_combine,
            allow_aggressive_resharding,
        )
    }

    /// Improves tuple element `index` of a tuple-shaped node (or, for an
    /// array node, the node itself).
    pub fn maybe_improve_element(
        &mut self,
        node: Node,
        candidate: Sharding,
        index: usize,
        may_combine: bool,
        allow_aggressive_resharding: bool,
    ) -> bool {
        let shape = self.graph.shape(node);
        if !shape.is_tuple() {
            return self.maybe_improve_array(
                node,
                candidate,
                may_combine,
                allow_aggressive_resharding,
            );
        }
        let Some(element_shape) = shape.tuple_elements().get(index) else {
            return false;
        };
        let current = self
            .sharding(node)
            .and_then(|current| current.sub_sharding(shape, index));
        let candidate = InstrSharding::single_for(element_shape, candidate);
        let dims = (!element_shape.is_tuple()).then(|| element_shape.dims());
        let Some(improved) = return_improved(
            &candidate,
            current.as_ref(),
            dims,
            may_combine,
            allow_aggressive_resharding,
        ) else {
            return false;
        };
        let mut leaves = match self.sharding(node) {
            Some(InstrSharding::Tuple(leaves)) => leaves.to_vec(),
            _ => vec![Sharding::Replicated; leaf_count(shape)],
        };
        let offset = InstrSharding::leaf_offset(shape, index);
        for (k, leaf) in improved.leaves().iter().enumerate() {
            if let Some(slot) = leaves.get_mut(offset + k) {
                *slot = leaf.clone();
            }
        }
        self.store_normalized(node, InstrSharding::tuple(leaves));
        true
    }

    /// `sharding` for every output of `node` (one per tuple element of a
    /// multi-output op, or the sharding itself for an array).
    pub fn same_for_every_output(&self, node: Node, sharding: Sharding) -> InstrSharding {
        match self.graph.shape(node) {
            Shape::Tuple(elements) => InstrSharding::tuple(vec![sharding; elements.len()]),
            _ => InstrSharding::Single(sharding),
        }
    }
}
