//! The pass from start to end, as XLA's `ShardingPropagation::Run`: reads
//! and prepares the module's shardings (`prepare`), runs the fix point of
//! every aggressiveness level (`fixpoint`), aligns `shard_as` groups and
//! runs the last level again, applies the output and parameter
//! permissions, then writes the changed shardings back (untouched ones
//! keep their original text), turns `Sharding` custom-calls into copies
//! and removes shard barriers (their users read the barrier's operand).
//!
//! Invariants: user-provided shardings never change (only their
//! unspecified dims are refined); the IR is edited only after propagation
//! finished (except the copy above a while root, added first); the result
//! does not depend on hash iteration order.

use crate::fixpoint::FixPoint;
use crate::graph::{CustomCallKind, Graph, Node};
use crate::level::{BROADCAST_FORWARD_LEVEL, PASS_THROUGH_LEVEL};
use crate::options::ShardingPropagationOptions;
use crate::prepare::{
    check_structure, copy_while_root, entry_parameter_shardings, process_sharding_calls,
    provided_shardings, read_sharding, replace_unknown_with_replicated, share_boundary_shardings,
    CopyNames,
};
use crate::state::PropagationState;
use rustc_hash::FxHashMap;
use std::sync::Arc;
use xla_hlo_ir::sharding::SingleSharding;
use xla_hlo_ir::{CompId, HloModule, HloSharding, InstrId, Opcode, Shape};
use xla_hlo_utils::{InstrSharding, Sharding, Tiled};

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PropagationStats {
    pub changed: bool,
    /// Sweeps over a computation (forward + backward), all levels.
    pub iterations: usize,
    /// Instructions whose sharding was inferred or changed.
    pub inferred: usize,
    /// Calls of the forward and backward rules (all levels).
    pub rule_calls: usize,
    /// `Sharding` custom-calls turned into copies.
    pub copies: usize,
    /// Instructions still without a sharding.
    pub unsharded: usize,
}

/// Per-output (or per-parameter) permissions to change a sharding, and
/// whether any is granted.
struct Permissions {
    any: bool,
    each: Vec<bool>,
}

impl Permissions {
    fn new(flags: Option<Vec<bool>>) -> Permissions {
        match flags {
            Some(each) => Permissions {
                any: each.iter().any(|&allowed| allowed),
                each,
            },
            None => Permissions {
                any: false,
                each: vec![],
            },
        }
    }
}

/// Where propagation may change the entry root's sharding: outputs it may
/// not change get their saved (known) sharding back, and the others lose
/// tilings that do not divide their shape.
fn apply_output_permissions(
    state: &mut PropagationState,
    saved_root: &Option<InstrSharding>,
    outputs: &Permissions,
) {
    let entry_root = state.graph.entry_root();
    if let (Some(InstrSharding::Tuple(saved)), Some(InstrSharding::Tuple(current))) =
        (saved_root, state.shardings[entry_root as usize].clone())
    {
        if saved.len() == outputs.each.len() {
            state.shardings[entry_root as usize] =
                Some(restore_disallowed(&current, saved, &outputs.each));
        }
    }
    let shape = state.graph.shape(entry_root).clone();
    if let Some(sharding) = state.shardings[entry_root as usize].clone() {
        state.shardings[entry_root as usize] = Some(replicate_uneven(&shape, sharding, |i| {
            outputs.each.get(i).copied().unwrap_or(true)
        }));
    }
}

/// Where propagation may change entry parameter shardings: parameters it
/// may not change get their saved (known) sharding back, and the others
/// lose tilings that do not divide their shape.
fn apply_parameter_permissions(
    state: &mut PropagationState,
    saved_params: &[Option<InstrSharding>],
    params: &Permissions,
) {
    let entry = state.graph.module.entry;
    let count = state.graph.module.comp(entry).parameters.len();
    if params.each.len() != count {
        // One tuple parameter: the permissions are per tuple element.
        if count == 1 && saved_params.len() == 1 {
            apply_tuple_parameter_permissions(state, &saved_params[0], params);
        }
        return;
    }
    for (k, saved) in saved_params.iter().enumerate() {
        let Some(parameter) = state.graph.parameter(entry, k) else {
            continue;
        };
        if !params.each[k] {
            state.shardings[parameter as usize] =
                saved.clone().filter(|sharding| !sharding.is_unknown());
        } else if let Some(sharding) = state.shardings[parameter as usize].clone() {
            let shape = state.graph.shape(parameter).clone();
            state.shardings[parameter as usize] =
                Some(replicate_uneven(&shape, sharding, |_| true));
        }
    }
}

/// The permissions of a single tuple parameter, one per element: elements
/// it may not change get their saved (known) sharding back, and the others
/// lose tilings that do not divide their shape.
fn apply_tuple_parameter_permissions(
    state: &mut PropagationState,
    saved: &Option<InstrSharding>,
    params: &Permissions,
) {
    let entry = state.graph.module.entry;
    let Some(parameter) = state.graph.parameter(entry, 0) else {
        return;
    };
    let shape = state.graph.shape(parameter).clone();
    let Shape::Tuple(elements) = &shape else {
        return;
    };
    if elements.len() != params.each.len() {
        return;
    }
    let Some(InstrSharding::Tuple(current)) = state.shardings[parameter as usize].clone() else {
        return;
    };
    let restored = match saved {
        Some(InstrSharding::Tuple(saved)) => restore_disallowed(&current, saved, &params.each),
        _ => InstrSharding::Tuple(current),
    };
    state.shardings[parameter as usize] = Some(replicate_uneven(&shape, restored, |i| {
        params.each.get(i).copied().unwrap_or(true)
    }));
}

/// `current`'s leaves, but the saved (known) one where `allowed` says the
/// leaf may not change.
fn restore_disallowed(current: &[Sharding], saved: &[Sharding], allowed: &[bool]) -> InstrSharding {
    let mut leaves = current.to_vec();
    for (i, saved_leaf) in saved.iter().enumerate() {
        if !allowed.get(i).copied().unwrap_or(true) && !saved_leaf.is_unknown() {
            if let Some(leaf) = leaves.get_mut(i) {
                *leaf = saved_leaf.clone();
            }
        }
    }
    InstrSharding::tuple(leaves)
}

/// Runs the whole pass.
pub(crate) fn propagate(
    module: &mut HloModule,
    options: &ShardingPropagationOptions,
) -> Result<PropagationStats, String> {
    check_structure(module)?;
    let mut stats = PropagationStats::default();
    let cleared = clear_cse_prevention_shardings(module);
    let outputs = Permissions::new(options.allow_propagation_to_output.clone().or_else(|| {
        module
            .config
            .allow_spmd_sharding_propagation_to_output
            .clone()
    }));
    let params = Permissions::new(options.allow_propagation_to_parameters.clone().or_else(|| {
        module
            .config
            .allow_spmd_sharding_propagation_to_parameters
            .clone()
    }));
    let mut names = CopyNames::new(module);
    let root_copy = if outputs.any {
        None
    } else {
        copy_while_root(module)
    };

    let graph = Graph::new(module);
    let node_count = graph.num_nodes();
    let original = (0..node_count as Node)
        .map(|node| read_sharding(&graph, node))
        .collect::<Result<Vec<_>, String>>()?;
    let mut state = PropagationState {
        graph,
        shardings: original.clone(),
        write_count: 0,
        last_written: vec![0; node_count],
        allow_output: outputs.any,
        allow_params: params.any,
        manual_possible: true,
        is_spmd: options.is_spmd,
        execution_threads: options.execution_threads.clone(),
    };
    let sharding_calls = process_sharding_calls(&mut state, options, &mut names)?;
    stats.copies = sharding_calls.copies.len();
    // The root copy is named after the Sharding custom-calls (XLA order).
    let root_copy = root_copy.map(|id| (id, names.next()));
    share_boundary_shardings(&mut state);
    let provided = provided_shardings(&state, outputs.any, params.any);
    let saved_root = state.shardings[state.graph.entry_root() as usize].clone();
    let saved_params = entry_parameter_shardings(&state);
    replace_unknown_with_replicated(&mut state);

    state.manual_possible = manual_possible(&state);
    let mut fix_point = FixPoint::new(
        &provided,
        &sharding_calls.unspecified,
        &sharding_calls.groups,
    );
    for level in PASS_THROUGH_LEVEL..=BROADCAST_FORWARD_LEVEL {
        fix_point.run(&mut state, level);
    }
    sharding_calls
        .groups
        .align_shard_as_groups(&mut state, &provided, &sharding_calls.unspecified);
    fix_point.run(&mut state, BROADCAST_FORWARD_LEVEL);
    stats.iterations = fix_point.iterations;
    stats.rule_calls = fix_point.rule_calls;

    if outputs.any {
        apply_output_permissions(&mut state, &saved_root, &outputs);
    }
    if params.any {
        apply_parameter_permissions(&mut state, &saved_params, &params);
    }
    stats.unsharded = state.shardings.iter().filter(|s| s.is_none()).count();
    let barriers: Vec<(CompId, InstrId)> = (0..node_count as Node)
        .filter(|&node| {
            matches!(
                state.graph.custom_call_kind(node),
                CustomCallKind::ShardBarrierFrom | CustomCallKind::ShardBarrierTo
            )
        })
        .map(|node| (state.graph.comp_of(node), state.graph.local(node)))
        .collect();
    let updates = changed_shardings(state, &original);
    stats.inferred = updates.changed.len();
    write_back(module, updates, &sharding_calls.copies, &root_copy);
    remove_shard_barriers(module, &barriers);
    stats.changed = stats.inferred > 0
        || !sharding_calls.copies.is_empty()
        || root_copy.is_some()
        || !barriers.is_empty()
        || cleared > 0;
    Ok(stats)
}

/// The metadata XLA's pass gives the shardings it adds only to keep CSE
/// from merging scalar broadcasts (`cse_prevention_only` runs).
const CSE_PREVENTION_METADATA: &str = "{op_name=\"_sharding_propagation_cse_prevention\"}";

/// Removes the shardings an earlier CSE-prevention run added (their only
/// metadata is [`CSE_PREVENTION_METADATA`]), so that propagation decides
/// them again, as XLA does; returns how many.
fn clear_cse_prevention_shardings(module: &mut HloModule) -> usize {
    let mut cleared = 0;
    for comp in &mut module.computations {
        for instr in &mut comp.instructions {
            let is_cse_prevention = matches!(
                instr.sharding.as_deref(),
                Some(HloSharding::Single(SingleSharding { metadata: Some(m), .. }))
                    if m.split_whitespace().collect::<String>() == CSE_PREVENTION_METADATA
            );
            if is_cse_prevention {
                instr.sharding = None;
                cleared += 1;
            }
        }
    }
    cleared
}

/// Replaces each `ShardBarrierFrom`/`ShardBarrierTo` by its operand (which
/// keeps its own sharding) and removes it, as XLA does after propagation.
fn remove_shard_barriers(module: &mut HloModule, barriers: &[(CompId, InstrId)]) {
    let mut by_comp: FxHashMap<CompId, Vec<InstrId>> = FxHashMap::default();
    for &(comp, id) in barriers {
        by_comp.entry(comp).or_default().push(id);
    }
    for (comp_id, ids) in by_comp {
        let comp = module.comp_mut(comp_id);
        let mut keep = vec![true; comp.instructions.len()];
        for id in ids {
            let Some(&operand) = comp.instr(id).operands.first() else {
                continue;
            };
            comp.replace_uses(id, operand);
            keep[id.index()] = false;
        }
        comp.retain_instructions(&keep);
    }
}

/// Whether a node has a manual sharding leaf or is a manual conversion.
fn manual_possible(state: &PropagationState) -> bool {
    let has_manual_leaf = state
        .shardings
        .iter()
        .flatten()
        .any(|sharding| sharding.leaves().iter().any(Sharding::is_manual));
    has_manual_leaf
        || (0..state.shardings.len() as Node).any(|node| {
            matches!(
                state.graph.custom_call_kind(node),
                CustomCallKind::FullToShard | CustomCallKind::ShardToFull
            )
        })
}

/// The nodes whose sharding differs from the module's, in node order, with
/// where their instruction is; and every node's final sharding.
struct ShardingUpdates {
    changed: Vec<(CompId, InstrId, Node)>,
    shardings: Vec<Option<InstrSharding>>,
}

fn changed_shardings(
    mut state: PropagationState,
    original: &[Option<InstrSharding>],
) -> ShardingUpdates {
    let changed = (0..state.shardings.len() as Node)
        .filter(|&node| state.shardings[node as usize] != original[node as usize])
        .map(|node| (state.graph.comp_of(node), state.graph.local(node), node))
        .collect();
    ShardingUpdates {
        changed,
        shardings: std::mem::take(&mut state.shardings),
    }
}

/// Writes the changed shardings into the module, turns the `Sharding`
/// custom-calls into copies and names the root copy.
fn write_back(
    module: &mut HloModule,
    updates: ShardingUpdates,
    copies: &[(CompId, InstrId, String)],
    root_copy: &Option<(InstrId, String)>,
) {
    let mut shared = SharedIrShardings::default();
    for (comp, id, node) in updates.changed {
        let instr = module.comp_mut(comp).instr_mut(id);
        instr.sharding = updates.shardings[node as usize]
            .as_ref()
            .map(|sharding| shared.ir_form(sharding));
    }
    for (comp, id, name) in copies {
        let instr = module.comp_mut(*comp).instr_mut(*id);
        instr.opcode = Opcode::Copy;
        instr.name = name.clone();
        instr.attrs.clear();
        instr.operands.truncate(1);
    }
    if let Some((id, name)) = root_copy {
        let entry = module.entry;
        module.comp_mut(entry).instr_mut(*id).name = name.clone();
    }
}

/// IR forms of the propagated shardings, shared between instructions: a
/// single sharding is converted and stored once per value, a tuple once per
/// set of leaf `Arc`s. Shard groups are consumed by propagation, so a single
/// sharding is written without its group.
#[derive(Default)]
struct SharedIrShardings {
    leaves: FxHashMap<*const Tiled, SingleSharding>,
    singles: FxHashMap<*const Tiled, Arc<HloSharding>>,
    /// Single shardings by value: propagation makes equal shardings in
    /// separate `Arc`s, converted and stored once here.
    single_values: FxHashMap<Tiled, Arc<HloSharding>>,
    /// Tuples by their leaves' identities (see [`leaf_identity`]).
    tuples: FxHashMap<Vec<usize>, Arc<HloSharding>>,
    replicated: Option<Arc<HloSharding>>,
}

/// A leaf's identity for sharing a tuple's IR form: the address of a tiled
/// leaf's `Arc`, 0 for replicated; `None` for other kinds.
fn leaf_identity(leaf: &Sharding) -> Option<usize> {
    match leaf {
        Sharding::Tiled(tiled) => Some(Arc::as_ptr(tiled) as usize),
        Sharding::Replicated => Some(0),
        _ => None,
    }
}

impl SharedIrShardings {
    fn ir_form(&mut self, sharding: &InstrSharding) -> Arc<HloSharding> {
        match sharding {
            InstrSharding::Single(Sharding::Tiled(tiled)) => {
                if let Some(hit) = self.singles.get(&Arc::as_ptr(tiled)) {
                    return hit.clone();
                }
                let ir = match self.single_values.get(tiled.as_ref()) {
                    Some(hit) => hit.clone(),
                    None => {
                        let mut leaf = self.leaf(&Sharding::Tiled(tiled.clone()));
                        leaf.shard_group = None;
                        let ir = Arc::new(HloSharding::Single(leaf));
                        self.single_values
                            .insert(tiled.as_ref().clone(), ir.clone());
                        ir
                    }
                };
                self.singles.insert(Arc::as_ptr(tiled), ir.clone());
                ir
            }
            InstrSharding::Single(Sharding::Replicated) => self
                .replicated
                .get_or_insert_with(|| Arc::new(HloSharding::Single(Sharding::Replicated.to_ir())))
                .clone(),
            InstrSharding::Single(leaf) => {
                let mut leaf = leaf.to_ir();
                leaf.shard_group = None;
                Arc::new(HloSharding::Single(leaf))
            }
            InstrSharding::Tuple(leaves) => {
                let key: Option<Vec<usize>> = leaves.iter().map(leaf_identity).collect();
                if let Some(hit) = key.as_ref().and_then(|key| self.tuples.get(key)) {
                    return hit.clone();
                }
                let ir = Arc::new(HloSharding::Tuple(
                    leaves.iter().map(|leaf| self.leaf(leaf)).collect(),
                ));
                if let Some(key) = key {
                    self.tuples.insert(key, ir.clone());
                }
                ir
            }
        }
    }

    /// The IR form of one leaf, tiled ones converted once.
    fn leaf(&mut self, leaf: &Sharding) -> SingleSharding {
        match leaf {
            Sharding::Tiled(tiled) => self
                .leaves
                .entry(Arc::as_ptr(tiled))
                .or_insert_with(|| leaf.to_ir())
                .clone(),
            _ => leaf.to_ir(),
        }
    }
}

/// Replicates the leaves (those `allowed`, for a tuple) whose tiling does
/// not divide their shape evenly.
fn replicate_uneven(
    shape: &Shape,
    sharding: InstrSharding,
    allowed: impl Fn(usize) -> bool,
) -> InstrSharding {
    let leaf_shapes = shape.leaves();
    let even_or_replicated = |leaf: &Sharding, leaf_shape: &Shape| -> Sharding {
        match leaf {
            Sharding::Tiled(tiled)
                if leaf_shape
                    .dims()
                    .iter()
                    .enumerate()
                    .any(|(i, &size)| size % tiled.tiles().dim(i) != 0) =>
            {
                Sharding::Replicated
            }
            _ => leaf.clone(),
        }
    };
    match sharding {
        InstrSharding::Single(leaf) => InstrSharding::Single(even_or_replicated(&leaf, shape)),
        InstrSharding::Tuple(leaves) => InstrSharding::tuple(
            leaves
                .iter()
                .enumerate()
                .map(|(i, leaf)| {
                    if allowed(i) {
                        leaf_shapes
                            .get(i)
                            .map(|leaf_shape| even_or_replicated(leaf, leaf_shape))
                            .unwrap_or_else(|| leaf.clone())
                    } else {
                        leaf.clone()
                    }
                })
                .collect(),
        ),
    }
}
