//! Call inlining: replaces `call` instructions by copies of their callees'
//! instructions (as XLA's call inliner does before sharding propagation),
//! so each call site gets values, and shardings, of its own (the last
//! reference to a callee takes its instructions instead of a copy); and
//! removal of computations nothing calls any more.
//!
//! Invariants: callees are inlined after their own calls are (a nested call
//! is flattened all the way); inlined copies are named by their original's
//! name root with the next free `.N` suffix, so names stay module-wide
//! unique; definition-before-use order is kept; computations
//! that are still referenced are never removed.

use rustc_hash::{FxHashMap, FxHashSet};
use xla_hlo_ir::attrs::{AttrValue, Attribute};
use xla_hlo_ir::{CompId, HloComputation, HloInstruction, HloModule, InstrId, Opcode};

/// Inlines every `call` for which `should_inline(module, call)` holds;
/// returns how many call sites were inlined. Computations left without a
/// caller are removed.
pub fn inline_calls(
    module: &mut HloModule,
    should_inline: impl Fn(&HloModule, &HloInstruction) -> bool,
) -> usize {
    if !module.computations.iter().any(|comp| {
        comp.instructions
            .iter()
            .any(|i| i.opcode == Opcode::Call && i.to_apply().is_some())
    }) {
        return 0;
    }
    let instruction_count = module
        .computations
        .iter()
        .map(|c| c.instructions.len())
        .sum();
    let mut used = FxHashSet::with_capacity_and_hasher(instruction_count, Default::default());
    for comp in &module.computations {
        used.extend(comp.instructions.iter().map(|i| name_hash(&i.name)));
    }
    let mut names = Names {
        used,
        next_suffix: FxHashMap::default(),
    };
    // How many instructions refer to each computation; a callee whose last
    // reference is being inlined can give its instructions up.
    let mut references = vec![0u32; module.computations.len()];
    for comp in &module.computations {
        for instr in &comp.instructions {
            for c in instr.called_computation_ids() {
                if let Some(r) = references.get_mut(c.index()) {
                    *r += 1;
                }
            }
        }
    }
    let mut inlined = 0;
    for ci in callees_first(module) {
        let comp = module.comp(ci);
        let wanted: Vec<bool> = comp
            .instructions
            .iter()
            .map(|i| i.opcode == Opcode::Call && i.to_apply().is_some() && should_inline(module, i))
            .collect();
        if !wanted.contains(&true) {
            continue;
        }
        let comp = std::mem::replace(
            &mut module.computations[ci.index()],
            HloComputation::new(""),
        );
        let inlined_sizes: usize = comp
            .instructions
            .iter()
            .zip(&wanted)
            .filter(|(_, w)| **w)
            .filter_map(|(i, _)| i.to_apply())
            .map(|c| module.comp(c).instructions.len())
            .sum();
        let mut out = HloComputation::new(comp.name);
        out.instructions
            .reserve(comp.instructions.len() + inlined_sizes);
        out.execution_thread = comp.execution_thread;
        let mut map: Vec<InstrId> = Vec::with_capacity(comp.instructions.len());
        for (i, mut instr) in comp.instructions.into_iter().enumerate() {
            for o in &mut instr.operands {
                *o = map[o.index()];
            }
            if wanted[i] {
                let callee = instr.to_apply().expect("checked");
                references[callee.index()] -= 1;
                let root = if references[callee.index()] == 0 {
                    // The last reference: the body moves instead of being copied.
                    let body = std::mem::replace(
                        &mut module.computations[callee.index()],
                        HloComputation::new(""),
                    );
                    let root = body.root;
                    place_body(
                        body.instructions,
                        root,
                        &instr.operands,
                        &mut out,
                        &mut names,
                    )
                } else {
                    let body = module.comp(callee);
                    let copies = body.instructions.iter().cloned();
                    place_body(copies, body.root, &instr.operands, &mut out, &mut names)
                };
                map.push(root);
                inlined += 1;
                continue;
            }
            for p in &mut instr.control_predecessors {
                *p = map[p.index()];
            }
            map.push(out.add(instr));
        }
        out.root = map[comp.root.index()];
        module.computations[ci.index()] = out;
    }
    if inlined > 0 {
        remove_uncalled_computations(module);
    }
    inlined
}

/// Computation ids ordered so that every callee comes before its callers.
fn callees_first(module: &HloModule) -> Vec<CompId> {
    let n = module.computations.len();
    let mut state = vec![0u8; n]; // 0 new, 1 on the stack, 2 done
    let mut order = Vec::with_capacity(n);
    for start in 0..n {
        if state[start] != 0 {
            continue;
        }
        let mut stack: Vec<(usize, Vec<CompId>)> = vec![(start, callees(module, start))];
        state[start] = 1;
        while let Some((c, rest)) = stack.last_mut() {
            match rest.pop() {
                Some(next) if state[next.index()] == 0 => {
                    state[next.index()] = 1;
                    let callees = callees(module, next.index());
                    stack.push((next.index(), callees));
                }
                Some(_) => {}
                None => {
                    state[*c] = 2;
                    order.push(CompId(*c as u32));
                    stack.pop();
                }
            }
        }
    }
    order
}

fn callees(module: &HloModule, ci: usize) -> Vec<CompId> {
    module.computations[ci]
        .instructions
        .iter()
        .flat_map(|i| i.called_computation_ids())
        .filter(|c| c.index() < module.computations.len())
        .collect()
}

/// Adds a callee's instructions (`body`, in its order, with the callee's
/// `root`) to `out`, its parameters replaced by `arguments`; returns the id
/// of its root there.
fn place_body(
    body: impl IntoIterator<Item = HloInstruction>,
    root: InstrId,
    arguments: &[InstrId],
    out: &mut HloComputation,
    names: &mut Names,
) -> InstrId {
    let mut map: Vec<InstrId> = Vec::new();
    for mut instr in body {
        if instr.opcode == Opcode::Parameter {
            let n = instr.parameter_number.unwrap_or(0) as usize;
            map.push(arguments[n.min(arguments.len().saturating_sub(1))]);
            continue;
        }
        for o in &mut instr.operands {
            *o = map[o.index()];
        }
        for p in &mut instr.control_predecessors {
            *p = map[p.index()];
        }
        instr.name = names.unique(&instr.name);
        map.push(out.add(instr));
    }
    map[root.index()]
}

/// The hashes of the module's instruction names, and per name root the
/// smallest suffix that may still be free (names are only added, so every
/// smaller one is taken). Two names with one hash only make a free name
/// look taken, so a hash collision can skip a name but never repeat one.
struct Names {
    used: FxHashSet<u64>,
    next_suffix: FxHashMap<String, u64>,
}

/// A name's hash, for sets of taken names that need not hold the names
/// (a collision only makes a free name look taken).
pub fn name_hash(name: &str) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<rustc_hash::FxHasher>::default().hash_one(name)
}

impl Names {
    /// `root.N` (the name's root, without its `.N` suffix) with the
    /// smallest N no instruction of the module has (or, after a hash
    /// collision, a larger free one); it is taken.
    fn unique(&mut self, name: &str) -> String {
        let root = match name.rfind('.') {
            Some(dot)
                if name[dot + 1..].bytes().all(|b| b.is_ascii_digit()) && dot + 1 < name.len() =>
            {
                &name[..dot]
            }
            _ => name,
        };
        let next = match self.next_suffix.get_mut(root) {
            Some(next) => next,
            None => self.next_suffix.entry(root.to_string()).or_insert(1),
        };
        let mut candidate = String::with_capacity(root.len() + 6);
        loop {
            set_suffixed_name(&mut candidate, root, *next);
            *next += 1;
            if self.used.insert(name_hash(&candidate)) {
                return candidate;
            }
        }
    }
}

/// Sets `out` to `root.suffix` (what `format!` would give, without the
/// formatter: names are made by the thousand).
pub fn set_suffixed_name(out: &mut String, root: &str, suffix: u64) {
    out.clear();
    out.push_str(root);
    out.push('.');
    let mut value = suffix;
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    for &digit in &digits[start..] {
        out.push(digit as char);
    }
}

/// Removes every computation neither the entry nor anything reachable from
/// it references, renumbering the references.
pub fn remove_uncalled_computations(module: &mut HloModule) {
    let n = module.computations.len();
    let mut reached = vec![false; n];
    let mut stack = vec![module.entry.index()];
    while let Some(c) = stack.pop() {
        if c >= n || reached[c] {
            continue;
        }
        reached[c] = true;
        stack.extend(callees(module, c).into_iter().map(|c| c.index()));
    }
    let removed: Vec<CompId> = (0..n)
        .filter(|&c| !reached[c])
        .map(|c| CompId(c as u32))
        .collect();
    remove_computations(module, &removed);
}

/// Removes the computations `removed` (which nothing may still reference)
/// and renumbers the references to the others.
pub fn remove_computations(module: &mut HloModule, removed: &[CompId]) {
    if removed.is_empty() {
        return;
    }
    let mut is_removed = vec![false; module.computations.len()];
    for c in removed {
        if let Some(r) = is_removed.get_mut(c.index()) {
            *r = true;
        }
    }
    let mut new_index: Vec<Option<u32>> = Vec::with_capacity(module.computations.len());
    let mut next = 0u32;
    for &gone in &is_removed {
        if gone {
            new_index.push(None);
        } else {
            new_index.push(Some(next));
            next += 1;
        }
    }
    let remap = |c: &mut CompId| {
        if let Some(Some(n)) = new_index.get(c.index()) {
            *c = CompId(*n);
        }
    };
    let mut ci = 0;
    module.computations.retain(|_| {
        let keep = new_index[ci].is_some();
        ci += 1;
        keep
    });
    remap(&mut module.entry);
    for comp in &mut module.computations {
        for instr in &mut comp.instructions {
            for Attribute { value, .. } in &mut instr.attrs {
                match value {
                    AttrValue::Computation(c) => remap(c),
                    AttrValue::Computations(cs) => cs.iter_mut().for_each(&remap),
                    _ => {}
                }
            }
        }
    }
}

/// Reorders computations so that every computation comes after the ones it
/// calls (XLA's parser reads callees first), keeping the order otherwise.
pub fn order_callees_first(module: &mut HloModule) -> bool {
    use xla_hlo_ir::{AttrValue, CompId};
    let n = module.computations.len();
    let graph = xla_hlo_ir::call_graph::CallGraph::new(module);
    let order: Vec<usize> = graph
        .post_order(graph.all())
        .iter()
        .map(|c| c.index())
        .collect();
    if order.iter().enumerate().all(|(i, &c)| i == c) {
        return false;
    }
    let mut new_id = vec![0u32; n];
    for (i, &c) in order.iter().enumerate() {
        new_id[c] = i as u32;
    }
    let mut old: Vec<Option<xla_hlo_ir::HloComputation>> = std::mem::take(&mut module.computations)
        .into_iter()
        .map(Some)
        .collect();
    module.computations = order.iter().filter_map(|&c| old[c].take()).collect();
    let remap = |c: &mut CompId| *c = CompId(new_id[c.index().min(n - 1)]);
    for comp in module.computations.iter_mut() {
        for instr in comp.instructions.iter_mut() {
            for a in instr.attrs.iter_mut() {
                match &mut a.value {
                    AttrValue::Computation(c) => remap(c),
                    AttrValue::Computations(cs) => cs.iter_mut().for_each(remap),
                    _ => {}
                }
            }
        }
    }
    remap(&mut module.entry);
    true
}
