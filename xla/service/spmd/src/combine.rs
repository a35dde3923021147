//! Collective combining on a partitioned module (XLA's AllReduceCombiner,
//! AllGatherCombiner and ReduceScatterCombiner): independent all-reduces,
//! all-gathers or reduce-scatters of one kind become one variadic
//! collective, whose tuple elements (`get-tuple-element`, named as the
//! collectives they replace) take over their uses. One collective of
//! many arrays pays one launch and one set of ring or tree latencies
//! instead of one per array: a data-parallel step's gradient all-reduces,
//! an FSDP layer's weight all-gathers.
//!
//! [`combinable_groups`] finds the groups as XLA's combiners do: walking
//! each computation in program order, collectives of the same kind (opcode,
//! element type, reduction, device groups, dimension, channel use) join
//! the open group of their kind while none depends on another and the
//! group stays within `CombineOptions` (bytes and count); a collective
//! that depends on the group (or would overflow it) starts the next one.
//! [`combine`] applies the groups the caller chooses (`xla-pipelines`
//! keeps those that shorten the simulated step).
//!
//! Invariants: each element of a combined collective is computed exactly
//! as the collective it replaces was (same devices, same reduction, same
//! order), so results are bitwise unchanged; only single-array collectives
//! without control edges, in computations that run as programs of their
//! own (the entry and what its loops, conditionals and calls reach), are
//! combined; the rewritten computation is in a topological order that
//! keeps every other instruction's relative order.

use crate::context::ModuleContext;
use crate::windowed_einsum::sequential_computations;
use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use xla_hlo_ir::attrs::{AttrValue, Attribute};
use xla_hlo_ir::{AttrKey, HloComputation, HloInstruction, HloModule, InstrId, Opcode, Shape};

/// Limits of one combined collective (XLA's combine thresholds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CombineOptions {
    /// Largest total size of a group's results, bytes.
    pub threshold_bytes: u64,
    /// Most collectives in a group.
    pub threshold_count: usize,
}

impl Default for CombineOptions {
    /// XLA's GPU defaults (`xla_gpu_all_reduce_combine_threshold_bytes`
    /// and its all-gather and reduce-scatter siblings: 30 MiB) and its
    /// count limit (256).
    fn default() -> CombineOptions {
        CombineOptions {
            threshold_bytes: 30 * 1024 * 1024,
            threshold_count: 256,
        }
    }
}

/// Collectives of one computation to combine into one, in program order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub computation: usize,
    pub members: Vec<InstrId>,
}

/// The groups of two or more collectives that can be combined, in program
/// order per computation.
pub fn combinable_groups(module: &HloModule, options: &CombineOptions) -> Vec<Group> {
    let sequential = sequential_computations(module);
    let mut groups = Vec::new();
    for (computation, comp) in module.computations.iter().enumerate() {
        if !sequential[computation] {
            continue;
        }
        let n = comp.instructions.len();
        let users = comp.users();
        let mut control = vec![false; n];
        for (index, instr) in comp.instructions.iter().enumerate() {
            if !instr.control_predecessors.is_empty() {
                control[index] = true;
                for p in &instr.control_predecessors {
                    if let Some(slot) = control.get_mut(p.index()) {
                        *slot = true;
                    }
                }
            }
        }
        // The open group of each kind, and what depends on its members.
        struct Open {
            members: Vec<InstrId>,
            bytes: u64,
            depends: Vec<bool>,
        }
        let mut open: FxHashMap<String, Open> = FxHashMap::default();
        let close = |group: Open, groups: &mut Vec<Group>| {
            if group.members.len() >= 2 {
                groups.push(Group {
                    computation,
                    members: group.members,
                });
            }
        };
        for (index, instr) in comp.instructions.iter().enumerate() {
            let id = InstrId(index as u32);
            if control[index] {
                continue;
            }
            let Some(key) = kind_key(module, instr) else {
                continue;
            };
            let bytes = instr.shape.byte_size();
            let joins = open.get(&key).is_some_and(|g| {
                !g.depends[index]
                    && g.members.len() < options.threshold_count
                    && g.bytes + bytes <= options.threshold_bytes
            });
            if !joins {
                if let Some(done) = open.remove(&key) {
                    close(done, &mut groups);
                }
                open.insert(
                    key.clone(),
                    Open {
                        members: Vec::new(),
                        bytes: 0,
                        depends: vec![false; n],
                    },
                );
            }
            let group = open.get_mut(&key).expect("opened above");
            group.members.push(id);
            group.bytes += bytes;
            mark_dependents(&users, id, &mut group.depends);
        }
        let mut rest: Vec<Open> = open.into_values().collect();
        rest.sort_by_key(|g| g.members[0]);
        for group in rest {
            close(group, &mut groups);
        }
    }
    groups.sort_by_key(|g| (g.computation, g.members[0]));
    groups
}

/// Marks everything that depends on `from` (not `from` itself).
fn mark_dependents(users: &[Vec<InstrId>], from: InstrId, depends: &mut [bool]) {
    let mut stack: Vec<InstrId> = users[from.index()].clone();
    while let Some(id) = stack.pop() {
        if std::mem::replace(&mut depends[id.index()], true) {
            continue;
        }
        stack.extend(users[id.index()].iter().copied());
    }
}

/// What collectives must share to be combined, as one string: the opcode,
/// the element type, the reduction's opcode (all-reduce, reduce-scatter),
/// and every attribute but the channel id (only whether there is one), the
/// reduction computation and the metadata; `None` for anything that is
/// not a single-array all-reduce, all-gather or reduce-scatter.
fn kind_key(module: &HloModule, instr: &HloInstruction) -> Option<String> {
    if !matches!(
        instr.opcode,
        Opcode::AllReduce | Opcode::AllGather | Opcode::ReduceScatter
    ) || instr.operands.len() != 1
        || !instr.shape.is_array()
    {
        return None;
    }
    let mut key = format!("{:?} {:?}", instr.opcode, instr.shape.element_type()?);
    if instr.opcode != Opcode::AllGather {
        key.push_str(&format!(" {:?}", reduction_opcode(module, instr)?));
    }
    let mut attrs: Vec<String> = instr
        .attrs
        .iter()
        .filter(|a| {
            !matches!(
                a.key,
                AttrKey::ChannelId
                    | AttrKey::ToApply
                    | AttrKey::Metadata
                    | AttrKey::FrontendAttributes
                    | AttrKey::BackendConfig
            )
        })
        .map(|a| format!("{:?}={:?}", a.key, a.value))
        .collect();
    attrs.sort();
    key.push_str(&format!(" channel={} ", instr.channel_id().is_some()));
    key.push_str(&attrs.join(" "));
    Some(key)
}

/// The binary op a reduction computation applies to its two parameters.
fn reduction_opcode(module: &HloModule, instr: &HloInstruction) -> Option<Opcode> {
    let comp = module.computations.get(instr.to_apply()?.index())?;
    let root = comp.instructions.get(comp.root.index())?;
    let params: Vec<InstrId> = comp.parameters.clone();
    let takes_both = params.len() == 2
        && root.operands.len() == 2
        && root.operands.contains(&params[0])
        && root.operands.contains(&params[1]);
    takes_both.then_some(root.opcode)
}

/// Combines each group of `groups` (from [`combinable_groups`] on this
/// module; a group naming anything else is skipped) into one collective;
/// returns how many groups were combined.
pub fn combine(module: &mut HloModule, groups: &[Group]) -> usize {
    let mut ctx = ModuleContext::new(module, module.num_partitions().max(1));
    let mut combined = 0;
    for computation in 0..module.computations.len() {
        let mut mine: Vec<&Group> = groups
            .iter()
            .filter(|g| g.computation == computation && g.members.len() >= 2)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let comp = &module.computations[computation];
        let users = comp.users();
        // A group whose members are not all distinct collectives of one
        // kind, or that shares a member with an earlier group, is skipped.
        let mut taken = vec![false; comp.instructions.len()];
        mine.retain(|g| {
            let Some(first) = comp.instructions.get(g.members[0].index()) else {
                return false;
            };
            let Some(key) = kind_key(module, first) else {
                return false;
            };
            let valid = g.members.iter().all(|m| {
                comp.instructions.get(m.index()).is_some_and(|i| {
                    !taken[m.index()] && kind_key(module, i).as_ref() == Some(&key)
                })
            });
            let mut distinct = g.members.clone();
            distinct.sort();
            distinct.dedup();
            if !valid || distinct.len() != g.members.len() || !independent(&users, &g.members) {
                return false;
            }
            for m in &g.members {
                taken[m.index()] = true;
            }
            true
        });
        if mine.is_empty() {
            continue;
        }
        let old = std::mem::replace(
            &mut module.computations[computation],
            HloComputation::new(""),
        );
        module.computations[computation] = rewrite(&mut ctx, old, &mine);
        combined += mine.len();
    }
    combined
}

/// No member of `members` depends on another (`users`: the
/// computation's users table).
fn independent(users: &[Vec<InstrId>], members: &[InstrId]) -> bool {
    let mut depends = vec![false; users.len()];
    for &m in members {
        mark_dependents(users, m, &mut depends);
    }
    members.iter().all(|m| !depends[m.index()])
}

/// `old` with each group's collectives replaced: the combined collective
/// where the group's last operand is ready, then one `get-tuple-element`
/// per member (with the member's name); every other instruction keeps its
/// place relative to the others.
fn rewrite(ctx: &mut ModuleContext, old: HloComputation, groups: &[&Group]) -> HloComputation {
    let n = old.instructions.len();
    // Each member's group; a group is emitted as one node, at the position
    // of its first member.
    let mut group_of: Vec<Option<usize>> = vec![None; n];
    for (g, group) in groups.iter().enumerate() {
        for m in &group.members {
            group_of[m.index()] = Some(g);
        }
    }
    let node_of = |id: usize| match group_of[id] {
        Some(g) => groups[g].members[0].index(),
        None => id,
    };
    // Kahn's algorithm over nodes (an instruction, or a group under its
    // first member's index), the earliest node first.
    let mut waiting = vec![0usize; n];
    let mut successors: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (index, instr) in old.instructions.iter().enumerate() {
        let node = node_of(index);
        for operand in instr.operands.iter().chain(&instr.control_predecessors) {
            let from = node_of(operand.index());
            if from != node {
                successors[from].push(node);
                waiting[node] += 1;
            }
        }
    }
    let is_node = |index: usize| node_of(index) == index;
    let mut ready: BinaryHeap<Reverse<usize>> = (0..n)
        .filter(|&i| is_node(i) && waiting[i] == 0)
        .map(Reverse)
        .collect();
    let mut map: Vec<InstrId> = vec![InstrId(u32::MAX); n];
    let mut new = HloComputation {
        name: old.name.clone(),
        instructions: Vec::with_capacity(n + groups.len()),
        root: old.root,
        parameters: Vec::new(),
        execution_thread: old.execution_thread.clone(),
    };
    let remap = |map: &[InstrId], ids: &[InstrId]| -> Vec<InstrId> {
        ids.iter().map(|o| map[o.index()]).collect()
    };
    while let Some(Reverse(node)) = ready.pop() {
        match group_of[node] {
            None => {
                let mut instr = old.instructions[node].clone();
                instr.operands = remap(&map, &instr.operands);
                instr.control_predecessors = remap(&map, &instr.control_predecessors);
                map[node] = new.add(instr);
            }
            Some(g) => {
                let members = &groups[g].members;
                let first = &old.instructions[members[0].index()];
                let operands: Vec<InstrId> = members
                    .iter()
                    .map(|m| map[old.instructions[m.index()].operands[0].index()])
                    .collect();
                let shape = Shape::tuple(
                    members
                        .iter()
                        .map(|m| old.instructions[m.index()].shape.clone())
                        .collect(),
                );
                let mut collective =
                    HloInstruction::new(ctx.fresh(&first.name), first.opcode, shape, operands);
                for Attribute { key, value } in &first.attrs {
                    let value = match key {
                        AttrKey::ChannelId => AttrValue::Int(ctx.channel()),
                        _ => value.clone(),
                    };
                    collective.set_attr(*key, value);
                }
                let tuple = new.add(collective);
                for (index, m) in members.iter().enumerate() {
                    let member = &old.instructions[m.index()];
                    let mut element = HloInstruction::new(
                        member.name.clone(),
                        Opcode::GetTupleElement,
                        member.shape.clone(),
                        vec![tuple],
                    );
                    element.set_attr(AttrKey::Index, AttrValue::Int(index as i64));
                    element.sharding = member.sharding.clone();
                    map[m.index()] = new.add(element);
                }
            }
        }
        for &next in &successors[node] {
            waiting[next] -= 1;
            if waiting[next] == 0 {
                ready.push(Reverse(next));
            }
        }
    }
    new.root = map[old.root.index()];
    new.parameters = remap(&map, &old.parameters);
    new
}
