//! Comparing the shardings of two versions of a module instruction by
//! instruction (matched by name), equal modulo representation (iota vs
//! explicit device lists, device order inside replication groups,
//! `last_tile_dims` spelling, tuple vs single shardings on tuples).
//!
//! Counting rule (also in `hlo-opt --help`): an instruction name counts when
//! at least one of the two modules gives it a sharding; it matches when both
//! do and the shardings are equivalent. Names that neither module shards
//! (reducer bodies, scalar init values) are not counted; a name present in
//! only one module, or sharded in only one, is a mismatch.

use crate::sharding::InstrSharding;
use rustc_hash::FxHashMap;
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

struct Entry<'a> {
    comp: &'a str,
    instr: &'a HloInstruction,
}

fn index(m: &HloModule) -> (Vec<&str>, FxHashMap<&str, Entry<'_>>) {
    let mut order = Vec::new();
    let mut map = FxHashMap::default();
    for c in &m.computations {
        for i in &c.instructions {
            order.push(i.name.as_str());
            map.insert(
                i.name.as_str(),
                Entry {
                    comp: &c.name,
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
        let sa = a.and_then(|e| e.instr.sharding.as_ref());
        let sb = b.and_then(|e| e.instr.sharding.as_ref());
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
    for name in &our_order {
        visit(name, our_map.get(name), other_map.get(name));
    }
    for name in &other_order {
        if !our_map.contains_key(name) {
            visit(name, None, other_map.get(name));
        }
    }
    out
}
