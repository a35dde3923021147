//! Preparing the shardings for the fix point, as the start of XLA's
//! `ShardingPropagation::Run`: structural checks, reading and checking the
//! module's shardings, the copy above a while root, `Sharding` custom-calls
//! (`ProcessShardingInstruction`: they constrain their operand and become
//! copies named by XLA's uniquer), shard groups, boundary sharing across
//! while/conditional/call, the set of provided shardings and unknown leaves
//! made replicated.
//!
//! Invariant: apart from the while-root copy, nothing here edits the IR;
//! shardings set here are not stamped as writes (they are the fix point's
//! starting point).

use crate::boundary::shared_across_boundary;
use crate::graph::{Graph, Node};
use crate::options::ShardingPropagationOptions;
use crate::shard_groups::ShardGroups;
use crate::state::{normalize, PropagationState};
use rustc_hash::FxHashMap;
use std::borrow::Cow;
use xla_hlo_ir::{AttrKey, AttrValue, CompId, HloInstruction, HloModule, InstrId, Opcode, Shape};
use xla_hlo_utils::{InstrSharding, Sharding};

fn instruction_error(instr: &HloInstruction, error: impl std::fmt::Display) -> String {
    format!("instruction %{}: {error}", instr.name)
}

/// The key in a Sharding custom-call's backend config that lists the dims
/// propagation may still refine.
const UNSPECIFIED_DIMS_KEY: &str = "unspecified_dims=[";

/// Parses `unspecified_dims=[1,2]` from a Sharding custom-call's backend
/// config (sorted).
fn unspecified_dims(instr: &HloInstruction) -> Vec<usize> {
    let text = match instr.attr(AttrKey::BackendConfig) {
        Some(AttrValue::Raw(text)) => &**text,
        Some(AttrValue::Str(text)) => text.as_str(),
        _ => return vec![],
    };
    let Some(position) = text.find(UNSPECIFIED_DIMS_KEY) else {
        return vec![];
    };
    let rest = &text[position + UNSPECIFIED_DIMS_KEY.len()..];
    let end = rest.find(']').unwrap_or(rest.len());
    let mut dims: Vec<usize> = rest[..end]
        .split(',')
        .filter_map(|dim| dim.trim().parse().ok())
        .collect();
    dims.sort_unstable();
    dims
}

/// XLA's name uniquer for the prefix `copy`: `copy`, then `copy.1`,
/// `copy.2`, ... skipping names the module already uses.
pub(crate) struct CopyNames {
    used: std::collections::BTreeSet<i64>,
    next: i64,
}

impl CopyNames {
    pub fn new(module: &HloModule) -> CopyNames {
        let mut used = std::collections::BTreeSet::new();
        for comp in &module.computations {
            for instr in &comp.instructions {
                if instr.name == "copy" {
                    used.insert(0);
                } else if let Some(suffix) = instr
                    .name
                    .strip_prefix("copy.")
                    .and_then(|suffix| suffix.parse::<i64>().ok())
                {
                    used.insert(suffix);
                }
            }
        }
        CopyNames { used, next: 0 }
    }

    pub fn next(&mut self) -> String {
        let id = if self.used.insert(0) {
            0
        } else {
            while !self.used.insert(self.next) {
                self.next += 1;
            }
            let id = self.next;
            self.next += 1;
            id
        };
        if id == 0 {
            "copy".into()
        } else {
            format!("copy.{id}")
        }
    }
}

/// Inserts a copy above a `while` entry root so that the while itself can
/// still be resharded (XLA does this when the output sharding is fixed);
/// the copy is named later, in XLA's naming order.
pub(crate) fn copy_while_root(module: &mut HloModule) -> Option<InstrId> {
    let entry = module.entry;
    let comp = module.comp(entry);
    let root = comp.root;
    let root_instr = comp.instr(root);
    if root_instr.opcode != Opcode::While
        || root_instr.sharding.as_deref().is_some_and(|sharding| {
            sharding
                .leaves()
                .iter()
                .all(|leaf| leaf.kind == xla_hlo_ir::ShardingKind::Unknown)
        })
    {
        return None;
    }
    let mut copy = HloInstruction::new("copy", Opcode::Copy, root_instr.shape.clone(), vec![root]);
    copy.sharding = root_instr.sharding.clone();
    let comp = module.comp_mut(entry);
    let id = comp.add(copy);
    comp.root = id;
    Some(id)
}

/// The ids the graph relies on are in range (the verifier checks this and
/// more; the pass may run without it).
pub(crate) fn check_structure(module: &HloModule) -> Result<(), String> {
    let comp_count = module.computations.len();
    if module.entry.index() >= comp_count {
        return Err("the entry computation id is out of range".into());
    }
    for comp in &module.computations {
        let instr_count = comp.instructions.len();
        if comp.root.index() >= instr_count {
            return Err(format!("computation {}: root out of range", comp.name));
        }
        if comp.parameters.iter().any(|p| p.index() >= instr_count) {
            return Err(format!(
                "computation {}: parameter id out of range",
                comp.name
            ));
        }
        for instr in &comp.instructions {
            if instr
                .operands
                .iter()
                .chain(&instr.control_predecessors)
                .any(|operand| operand.index() >= instr_count)
                || instr
                    .called_computations()
                    .iter()
                    .any(|callee| callee.index() >= comp_count)
            {
                return Err(format!(
                    "instruction %{}: operand or callee id out of range",
                    instr.name
                ));
            }
        }
    }
    Ok(())
}

/// The shape a node's sharding describes: its own, but for an `outfeed`
/// that of its operands: the tuple (data, token) when the sharding has a
/// leaf for the token too, else the data alone (both forms occur in XLA).
pub(crate) fn sharding_shape<'m>(graph: &Graph<'m>, node: Node) -> Cow<'m, Shape> {
    if graph.opcode(node) == Opcode::Outfeed {
        if outfeed_sharding_covers_token(graph, node) {
            let operands = graph
                .operands(node)
                .map(|o| graph.shape(o).clone())
                .collect();
            return Cow::Owned(Shape::Tuple(operands));
        }
        if let Some(data) = graph.operand(node, 0) {
            return Cow::Borrowed(graph.shape(data));
        }
    }
    Cow::Borrowed(graph.shape(node))
}

/// Whether an outfeed's sharding is over (data, token) rather than the
/// data alone: it has one leaf more than the data has.
pub(crate) fn outfeed_sharding_covers_token(graph: &Graph, node: Node) -> bool {
    let Some(sharding) = graph.instr(node).sharding.as_deref() else {
        return false;
    };
    let data_leaves = graph
        .operand(node, 0)
        .map_or(0, |d| graph.shape(d).leaves().len());
    sharding.leaves().len() == data_leaves + 1
}

/// A node's sharding as the rules see it, checked: every leaf fits its
/// shape's rank (see [`sharding_shape`]) and names no negative device.
pub(crate) fn read_sharding(graph: &Graph, node: Node) -> Result<Option<InstrSharding>, String> {
    let instr = graph.instr(node);
    let Some(ir_sharding) = &instr.sharding else {
        return Ok(None);
    };
    let shape = sharding_shape(graph, node);
    let sharding =
        InstrSharding::from_ir(ir_sharding, &shape).map_err(|e| instruction_error(instr, e))?;
    let leaf_shapes = shape.leaves();
    for (k, leaf) in sharding.leaves().iter().enumerate() {
        let rank = leaf_shapes.get(k).map(|shape| shape.rank()).unwrap_or(0);
        xla_hlo_utils::sharding::check_rank(leaf, rank).map_err(|e| instruction_error(instr, e))?;
        if let Some(tiles) = leaf.tiles() {
            if let Some(&device) = tiles.devices().iter().find(|&&device| device < 0) {
                return Err(instruction_error(
                    instr,
                    format!("negative device id {device}"),
                ));
            }
        }
    }
    Ok(Some(sharding))
}

/// What `ProcessShardingInstruction` found.
pub(crate) struct ShardingCalls {
    /// `Sharding` custom-calls to turn into copies (where they are, and
    /// their new names).
    pub copies: Vec<(CompId, InstrId, String)>,
    /// Provided shardings' dims left to propagation.
    pub unspecified: FxHashMap<Node, Vec<usize>>,
    pub groups: ShardGroups,
}

/// `ProcessShardingInstruction`: a `Sharding` custom-call's sharding goes
/// to its unsharded operand too (unless some dims are left unspecified);
/// shard groups are collected.
pub(crate) fn process_sharding_calls(
    state: &mut PropagationState,
    options: &ShardingPropagationOptions,
    names: &mut CopyNames,
) -> Result<ShardingCalls, String> {
    let mut found = ShardingCalls {
        copies: Vec::new(),
        unspecified: FxHashMap::default(),
        groups: ShardGroups::default(),
    };
    for comp in 0..state.graph.post_orders.len() {
        let order = state.graph.post_orders[comp].clone();
        for &node in order.iter().rev() {
            let instr = state.graph.instr(node);
            if state.graph.is_custom_call(node, "Sharding") {
                let Some(sharding) = state.shardings[node as usize].clone() else {
                    return Err(instruction_error(
                        instr,
                        "a Sharding custom-call needs a sharding",
                    ));
                };
                let operand = state.graph.operand(node, 0).ok_or_else(|| {
                    instruction_error(instr, "a Sharding custom-call needs an operand")
                })?;
                // XLA keeps `{unknown}` constraints as custom-calls (they only
                // mark shard groups); they are replaced too so that a second
                // run sees the same instructions (idempotence).
                if options.replace_sharding_custom_calls {
                    found.copies.push((
                        state.graph.comp_of(node),
                        state.graph.local(node),
                        names.next(),
                    ));
                }
                let spec = unspecified_dims(instr);
                if !spec.is_empty() {
                    found.unspecified.insert(node, spec);
                } else if state.shardings[operand as usize].is_none() {
                    let sharding = normalize(state.graph.shape(operand), sharding);
                    state.shardings[operand as usize] = Some(sharding);
                }
            }
            let group = instr
                .sharding
                .as_deref()
                .and_then(|s| s.leaves().first().and_then(|leaf| leaf.shard_group));
            if let Some(group) = group {
                found.groups.add(node, group);
            }
        }
    }
    Ok(found)
}

/// Gives every while, conditional and call, and the instructions sharing
/// its sharding across the boundary, the first sharding among them.
pub(crate) fn share_boundary_shardings(state: &mut PropagationState) {
    for node in 0..state.shardings.len() as Node {
        if matches!(
            state.graph.opcode(node),
            Opcode::While | Opcode::Conditional | Opcode::Call
        ) {
            let shared = shared_across_boundary(&state.graph, node);
            if let Some(first) = shared
                .iter()
                .find_map(|&other| state.shardings[other as usize].clone())
            {
                for &other in &shared {
                    let sharding = normalize(state.graph.shape(other), first.clone());
                    state.shardings[other as usize] = Some(sharding);
                }
            }
        }
    }
}

/// The user-provided shardings propagation must keep: every known one but
/// the entry root's and parameters', which count only where propagation
/// may not change them.
pub(crate) fn provided_shardings(
    state: &PropagationState,
    allow_output: bool,
    allow_params: bool,
) -> Vec<bool> {
    let graph = &state.graph;
    let entry_root = graph.entry_root();
    let mut provided = vec![false; state.shardings.len()];
    for node in 0..state.shardings.len() as Node {
        if let Some(sharding) = &state.shardings[node as usize] {
            if node != entry_root
                && graph.opcode(node) != Opcode::Parameter
                && !sharding.is_unknown()
            {
                provided[node as usize] = true;
            }
        }
    }
    if !allow_output
        && state.shardings[entry_root as usize]
            .as_ref()
            .is_none_or(|sharding| !sharding.is_unknown())
    {
        provided[entry_root as usize] = true;
    }
    if !allow_params {
        let entry = graph.module.entry;
        for k in 0..graph.module.comp(entry).parameters.len() {
            if let Some(parameter) = graph.parameter(entry, k) {
                if state.shardings[parameter as usize]
                    .as_ref()
                    .is_some_and(|sharding| !sharding.is_unknown())
                {
                    provided[parameter as usize] = true;
                }
            }
        }
    }
    provided
}

/// The entry parameters' shardings, in parameter order.
pub(crate) fn entry_parameter_shardings(state: &PropagationState) -> Vec<Option<InstrSharding>> {
    let entry = state.graph.module.entry;
    (0..state.graph.module.comp(entry).parameters.len())
        .map(|k| {
            state
                .graph
                .parameter(entry, k)
                .and_then(|parameter| state.shardings[parameter as usize].clone())
        })
        .collect()
}

/// Replaces `{unknown}` leaves by replicated ones.
pub(crate) fn replace_unknown_with_replicated(state: &mut PropagationState) {
    for slot in state.shardings.iter_mut() {
        let Some(sharding) = slot else {
            continue;
        };
        if !sharding.leaves().iter().any(Sharding::is_unknown) {
            continue;
        }
        let leaves: Vec<Sharding> = sharding
            .leaves()
            .iter()
            .map(|leaf| {
                if leaf.is_unknown() {
                    Sharding::Replicated
                } else {
                    leaf.clone()
                }
            })
            .collect();
        *slot = Some(match sharding {
            InstrSharding::Single(_) => InstrSharding::Single(leaves[0].clone()),
            InstrSharding::Tuple(_) => InstrSharding::tuple(leaves),
        });
    }
}
