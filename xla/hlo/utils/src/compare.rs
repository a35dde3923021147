//! Comparing the shardings of two versions of a module instruction by
//! instruction, equal modulo representation (iota vs explicit device lists,
//! device order inside replication groups, `last_tile_dims` spelling, tuple
//! vs single shardings on tuples).
//!
//! Pairing: by name first, when both have the same expression tree three
//! levels deep (opcodes, shapes, tuple indices) and their computations the
//! same name root (`main.4`, `main.0`). The rest is paired by structure,
//! because XLA renames between dumps (`x.1` becomes `x.0`, and `x.1` may
//! then name something else): the k-th instruction with a given key in one
//! module pairs with the k-th with that key in the other, in passes from
//! the strictest key to the loosest (computation and name roots with the
//! expression tree; name root with the expression tree; name root, tuple
//! index, opcode and shape). What still has no partner is counted apart
//! (`unpaired`), not as a mismatch.
//!
//! Counting rule (also in `hlo-opt --help`): a pair counts when at least one
//! of the two gives it a sharding; it matches when both do and the shardings
//! are equivalent. Pairs that neither module shards (reducer bodies, scalar
//! init values) are not counted; a pair sharded in only one module is a
//! mismatch.

use crate::sharding::InstrSharding;
use rustc_hash::FxHashMap;
use std::hash::{Hash, Hasher};
use xla_hlo_ir::{HloInstruction, HloModule, HloSharding, Shape};

/// One instruction whose shardings differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub instruction: String,
    pub computation: String,
    pub opcode: String,
    /// Our sharding (printed), if any.
    pub ours: Option<String>,
    /// The other module's sharding (printed), if any.
    pub other: Option<String>,
}

/// The result of a comparison.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ShardingComparison {
    pub matched: usize,
    pub total: usize,
    pub mismatches: Vec<Mismatch>,
    /// Pairs found by structure rather than by name.
    pub paired_by_structure: usize,
    /// Sharded instructions of ours, and of the other module, left without
    /// a partner.
    pub unpaired_ours: usize,
    pub unpaired_other: usize,
}

/// Whether two IR shardings of instructions of `shape` mean the same.
pub fn equivalent(a: &HloSharding, b: &HloSharding, shape: &Shape) -> bool {
    if a == b {
        return true;
    }
    match (
        InstrSharding::from_ir(a, shape),
        InstrSharding::from_ir(b, shape),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// A structural pairing key of an instruction of a module.
type PairKey = dyn Fn(&HloModule, &Entry) -> String;

struct Entry<'a> {
    comp: &'a str,
    comp_id: usize,
    instr: &'a HloInstruction,
}

/// A hash of the expression tree under an instruction, three levels deep:
/// opcodes, shapes and tuple indices of its operands and theirs.
fn operand_signature(m: &HloModule, e: &Entry) -> u64 {
    fn walk(
        comp: &xla_hlo_ir::HloComputation,
        i: &HloInstruction,
        depth: u32,
        h: &mut impl Hasher,
    ) {
        i.opcode.hash(h);
        i.shape.to_string().hash(h);
        i.int_attr(xla_hlo_ir::AttrKey::Index).hash(h);
        if depth > 0 {
            i.operands.len().hash(h);
            for o in &i.operands {
                walk(comp, comp.instr(*o), depth - 1, h);
            }
        }
    }
    let comp = &m.computations[e.comp_id];
    let mut h = rustc_hash::FxHasher::default();
    walk(comp, e.instr, 3, &mut h);
    h.finish()
}

fn index(m: &HloModule) -> (Vec<&str>, FxHashMap<&str, Entry<'_>>) {
    let mut order = Vec::new();
    let mut map = FxHashMap::default();
    for (comp_id, c) in m.computations.iter().enumerate() {
        for i in &c.instructions {
            order.push(i.name.as_str());
            map.insert(
                i.name.as_str(),
                Entry {
                    comp: &c.name,
                    comp_id,
                    instr: i,
                },
            );
        }
    }
    (order, map)
}

/// Compares `ours` with `other` (see the module doc for the counting rule).
pub fn compare_module_shardings(ours: &HloModule, other: &HloModule) -> ShardingComparison {
    let (our_order, our_map) = index(ours);
    let (other_order, other_map) = index(other);
    let mut out = ShardingComparison::default();
    let mut visit = |name: &str, a: Option<&Entry>, b: Option<&Entry>| {
        let sa = a.and_then(|e| e.instr.sharding.as_deref());
        let sb = b.and_then(|e| e.instr.sharding.as_deref());
        if sa.is_none() && sb.is_none() {
            return;
        }
        out.total += 1;
        if let (Some(x), Some(y), Some(ea)) = (sa, sb, a) {
            if equivalent(x, y, &ea.instr.shape) {
                out.matched += 1;
                return;
            }
        }
        let any = a.or(b).map(|e| (e.comp, e.instr));
        let (comp, instr) = any
            .map(|(c, i)| (c.to_string(), i.opcode.name().to_string()))
            .unwrap_or_default();
        out.mismatches.push(Mismatch {
            instruction: name.to_string(),
            computation: comp,
            opcode: instr,
            ours: sa.map(|s| s.to_string()),
            other: sb.map(|s| s.to_string()),
        });
    };
    // Same name, and the same kind of instruction in a computation of the
    // same name root: a name reused for something else is not a pair.
    let same_kind = |a: &Entry, b: &Entry| {
        a.instr.opcode == b.instr.opcode
            && a.instr.shape == b.instr.shape
            && name_root(a.comp) == name_root(b.comp)
            && operand_signature(ours, a) == operand_signature(other, b)
    };
    let mut our_rest: Vec<&str> = Vec::new();
    for name in &our_order {
        match other_map.get(name) {
            Some(b) if same_kind(&our_map[name], b) => visit(name, our_map.get(name), Some(b)),
            _ => our_rest.push(name),
        }
    }
    let other_rest: Vec<&str> = other_order
        .iter()
        .copied()
        .filter(|n| !our_map.get(n).is_some_and(|a| same_kind(a, &other_map[n])))
        .collect();
    // Pair the rest by structure, in order of appearance, from the
    // strictest key to the loosest: (computation name root, name root,
    // expression tree), then (name root, expression tree), then (name root,
    // tuple index, opcode, shape). Each pass takes what the earlier left.
    let keys: [&PairKey; 3] = [
        &|m, e| {
            format!(
                "{}/{}/{}",
                name_root(e.comp),
                name_root(&e.instr.name),
                operand_signature(m, e)
            )
        },
        &|m, e| format!("{}/{}", name_root(&e.instr.name), operand_signature(m, e)),
        &|_, e| {
            format!(
                "{}#{:?}/{}/{}",
                name_root(&e.instr.name),
                e.instr.int_attr(xla_hlo_ir::AttrKey::Index),
                e.instr.opcode.name(),
                e.instr.shape
            )
        },
    ];
    let mut paired_other: rustc_hash::FxHashSet<&str> = Default::default();
    let mut paired_ours: rustc_hash::FxHashSet<&str> = Default::default();
    let mut paired = 0usize;
    for key in keys {
        let mut waiting: FxHashMap<String, std::collections::VecDeque<&str>> = FxHashMap::default();
        for name in other_rest.iter().filter(|n| !paired_other.contains(*n)) {
            waiting
                .entry(key(other, &other_map[name]))
                .or_default()
                .push_back(name);
        }
        let candidates: Vec<&str> = our_rest
            .iter()
            .copied()
            .filter(|n| !paired_ours.contains(n))
            .collect();
        for name in candidates {
            let a = &our_map[name];
            if let Some(other_name) = waiting.get_mut(&key(ours, a)).and_then(|q| q.pop_front()) {
                paired += 1;
                paired_ours.insert(name);
                paired_other.insert(other_name);
                visit(name, Some(a), other_map.get(other_name));
            }
        }
    }
    let unpaired_ours = our_rest
        .iter()
        .filter(|n| !paired_ours.contains(*n) && our_map[*n].instr.sharding.is_some())
        .count();
    let unpaired_other = other_rest
        .iter()
        .filter(|n| !paired_other.contains(*n) && other_map[*n].instr.sharding.is_some())
        .count();
    out.paired_by_structure = paired;
    out.unpaired_ours = unpaired_ours;
    out.unpaired_other = unpaired_other;
    out
}

/// A name without its numeric `.N` suffix (`add.12` -> `add`).
pub fn name_root(name: &str) -> &str {
    match name.rfind('.') {
        Some(dot)
            if dot > 0
                && name[dot + 1..].bytes().all(|b| b.is_ascii_digit())
                && dot + 1 < name.len() =>
        {
            &name[..dot]
        }
        _ => name,
    }
}
