//! Memory model: which buffers each instruction defines and uses, and the
//! peak of live bytes of a computation in a given order.
//!
//! A buffer is defined by an allocating instruction and is live from its
//! definition to its last use (inclusive). Aliasing instructions define no
//! buffer: `get-tuple-element`, `tuple`, `bitcast`, `reshape` (assumed a
//! bitcast, as XLA's layout assignment makes row-major reshapes),
//! `opt-barrier`, `add-dependency`, `domain`, `while` (its result is its
//! operand's buffers, as XLA's alias analysis has it), and every `*-done`
//! (the result buffer is allocated by the start). Async starts allocate
//! their result (and context) elements; their operand elements alias the
//! operands, and the done uses the start's operands too, so a
//! collective's input stays live until the done. Parameters are live
//! throughout (they are counted in `param_bytes`, not as temporaries);
//! the root's buffers stay live to the end. A call, conditional or while
//! adds its callee's peak of temporaries at the instant it runs.
//!
//! Invariants: every buffer id indexes `Buffers::size`; `uses[i]` and
//! `defs[i]` are duplicate-free; the peak of an order is exact under this
//! model (a sweep over definitions and last uses), so the scheduler, the
//! validator and the report agree on it.

use crate::graph::Csr;
use xla_hlo_ir::{HloComputation, HloInstruction, InstrId, Opcode, Shape};

/// Buffers of one computation.
#[derive(Clone, Debug, Default)]
pub struct Buffers {
    /// Bytes of each buffer.
    pub size: Vec<u64>,
    /// Defining instruction of each buffer (`u32::MAX` for none).
    pub def: Vec<u32>,
    /// Parameter buffers (live throughout).
    pub is_param: Vec<bool>,
    /// Buffers each instruction reads (through its operands).
    pub uses: Csr,
    /// Buffers each instruction allocates.
    pub defs: Csr,
    /// Buffers the root returns (live to the end).
    pub root_uses: Vec<u32>,
    /// Sum of parameter buffer bytes.
    pub param_bytes: u64,
}

fn leaf_count(shape: &Shape) -> usize {
    match shape {
        Shape::Tuple(e) => e.iter().map(leaf_count).sum(),
        _ => 1,
    }
}

/// Leaf range `[lo, hi)` of tuple element `k` of `shape`.
fn element_range(shape: &Shape, k: usize) -> Option<(usize, usize)> {
    let e = shape.tuple_elements();
    if k >= e.len() {
        return None;
    }
    let lo: usize = e[..k].iter().map(leaf_count).sum();
    Some((lo, lo + leaf_count(&e[k])))
}

fn leaf_sizes(shape: &Shape, out: &mut Vec<u64>) {
    match shape {
        Shape::Tuple(e) => e.iter().for_each(|s| leaf_sizes(s, out)),
        s => out.push(s.byte_size()),
    }
}

enum Leaves {
    /// Each leaf's buffers (usually one).
    List(Vec<Vec<u32>>),
}

impl Leaves {
    fn all(&self) -> impl Iterator<Item = u32> + '_ {
        let Leaves::List(l) = self;
        l.iter().flatten().copied()
    }
    fn len(&self) -> usize {
        let Leaves::List(l) = self;
        l.len()
    }
    fn range(&self, lo: usize, hi: usize) -> Leaves {
        let Leaves::List(l) = self;
        Leaves::List(l.get(lo..hi).map(|s| s.to_vec()).unwrap_or_default())
    }
}

impl Buffers {
    /// Analyses `comp`. `transient` is not computed here (it needs the
    /// callees' peaks); see `Graph`.
    pub fn analyse(comp: &HloComputation) -> Buffers {
        let n = comp.instructions.len();
        let mut b = Buffers::default();
        let mut leaves: Vec<Leaves> = Vec::with_capacity(n);
        let mut defs: Vec<Vec<u32>> = vec![Vec::new(); n];
        let order =
            crate::graph::topological_order(comp).unwrap_or_else(|| (0..n as u32).collect());
        // Leaves must be computed in dependency order; keep a slot per id.
        let mut slots: Vec<Option<Leaves>> = (0..n).map(|_| None).collect();
        let mut new_buffers =
            |b: &mut Buffers, sizes: &[u64], def: u32, param: bool| -> Vec<Vec<u32>> {
                sizes
                    .iter()
                    .map(|&s| {
                        let id = b.size.len() as u32;
                        b.size.push(s);
                        b.def.push(def);
                        b.is_param.push(param);
                        if param {
                            b.param_bytes += s;
                        }
                        vec![id]
                    })
                    .collect()
            };
        let empty = Leaves::List(Vec::new());
        for &i in &order {
            let instr = &comp.instructions[i as usize];
            let op_leaves = |k: usize| -> &Leaves {
                instr
                    .operands
                    .get(k)
                    .and_then(|o| slots.get(o.index()))
                    .and_then(|s| s.as_ref())
                    .unwrap_or(&empty)
            };
            let mut sizes = Vec::new();
            let l: Leaves = match instr.opcode {
                Opcode::Parameter => {
                    leaf_sizes(&instr.shape, &mut sizes);
                    Leaves::List(new_buffers(&mut b, &sizes, u32::MAX, true))
                }
                Opcode::GetTupleElement => {
                    let src = op_leaves(0);
                    let k = instr
                        .int_attr(xla_hlo_ir::AttrKey::Index)
                        .unwrap_or(0)
                        .max(0) as usize;
                    let src_shape = instr
                        .operands
                        .first()
                        .and_then(|o| comp.instructions.get(o.index()))
                        .map(|o| &o.shape);
                    match src_shape.and_then(|s| element_range(s, k)) {
                        Some((lo, hi)) if hi <= src.len() => src.range(lo, hi),
                        _ => alloc(&mut b, &mut new_buffers, instr, i, &mut defs),
                    }
                }
                Opcode::Tuple => {
                    let mut v = Vec::new();
                    for k in 0..instr.operands.len() {
                        let Leaves::List(l) = op_leaves(k);
                        v.extend(l.iter().cloned());
                    }
                    Leaves::List(v)
                }
                Opcode::Bitcast
                | Opcode::Reshape
                | Opcode::OptimizationBarrier
                | Opcode::AddDependency
                | Opcode::Domain
                | Opcode::While => {
                    let src = op_leaves(0);
                    if src.len() == leaf_count(&instr.shape) {
                        src.range(0, src.len())
                    } else {
                        alloc(&mut b, &mut new_buffers, instr, i, &mut defs)
                    }
                }
                Opcode::AllReduceDone
                | Opcode::AllGatherDone
                | Opcode::CollectivePermuteDone
                | Opcode::AsyncDone
                | Opcode::AsyncUpdate
                | Opcode::CopyDone => {
                    let src = op_leaves(0);
                    let src_shape = instr
                        .operands
                        .first()
                        .and_then(|o| comp.instructions.get(o.index()))
                        .map(|o| &o.shape);
                    let elem = match instr.opcode {
                        Opcode::AllReduceDone | Opcode::AsyncUpdate => None,
                        Opcode::CopyDone => Some(0),
                        _ => Some(1),
                    };
                    let r = match (elem, src_shape) {
                        (None, _) => Some((0, src.len())),
                        (Some(k), Some(s)) => element_range(s, k),
                        _ => None,
                    };
                    match r {
                        Some((lo, hi))
                            if hi <= src.len() && hi - lo == leaf_count(&instr.shape) =>
                        {
                            src.range(lo, hi)
                        }
                        _ => alloc(&mut b, &mut new_buffers, instr, i, &mut defs),
                    }
                }
                Opcode::AsyncStart
                | Opcode::AllGatherStart
                | Opcode::CollectivePermuteStart
                | Opcode::CopyStart => {
                    // Element 0 aliases the operands; the rest is allocated.
                    let e = instr.shape.tuple_elements();
                    if e.len() >= 2 {
                        let mut v: Vec<Vec<u32>> = Vec::new();
                        let ops: Vec<Vec<u32>> = (0..instr.operands.len())
                            .flat_map(|k| {
                                let Leaves::List(l) = op_leaves(k);
                                l.clone()
                            })
                            .collect();
                        if ops.len() == leaf_count(&e[0]) {
                            v.extend(ops);
                        } else {
                            let mut s = Vec::new();
                            leaf_sizes(&e[0], &mut s);
                            let nb = new_buffers(&mut b, &s, i, false);
                            defs[i as usize].extend(nb.iter().flatten().copied());
                            v.extend(nb);
                        }
                        let mut s = Vec::new();
                        for x in &e[1..] {
                            leaf_sizes(x, &mut s);
                        }
                        let nb = new_buffers(&mut b, &s, i, false);
                        defs[i as usize].extend(nb.iter().flatten().copied());
                        v.extend(nb);
                        Leaves::List(v)
                    } else {
                        alloc(&mut b, &mut new_buffers, instr, i, &mut defs)
                    }
                }
                _ => alloc(&mut b, &mut new_buffers, instr, i, &mut defs),
            };
            leaves.push(Leaves::List(Vec::new()));
            slots[i as usize] = Some(l);
        }
        drop(leaves);
        // Uses: the buffers of every operand; a done also uses its start's operands.
        let mut uses: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut mark = vec![u32::MAX; b.size.len()];
        for (i, instr) in comp.instructions.iter().enumerate() {
            let mut add = |x: u32, out: &mut Vec<u32>| {
                if let Some(m) = mark.get_mut(x as usize) {
                    if *m != i as u32 {
                        *m = i as u32;
                        out.push(x);
                    }
                }
            };
            let mut out = Vec::new();
            for o in &instr.operands {
                if let Some(Some(l)) = slots.get(o.index()) {
                    for x in l.all() {
                        add(x, &mut out);
                    }
                }
            }
            if is_done(instr) {
                if let Some(s) = crate::kinds::pair_start(comp, InstrId(i as u32)) {
                    for o in &comp.instructions[s.index()].operands {
                        if let Some(Some(l)) = slots.get(o.index()) {
                            for x in l.all() {
                                add(x, &mut out);
                            }
                        }
                    }
                }
            }
            uses[i] = out;
        }
        b.root_uses = match slots.get(comp.root.index()) {
            Some(Some(l)) => {
                let mut v: Vec<u32> = l.all().collect();
                v.sort_unstable();
                v.dedup();
                v
            }
            _ => Vec::new(),
        };
        b.uses = Csr::from_lists(&uses);
        b.defs = Csr::from_lists(&defs);
        b
    }

    pub fn num_buffers(&self) -> usize {
        self.size.len()
    }
}

fn is_done(instr: &HloInstruction) -> bool {
    matches!(
        instr.opcode,
        Opcode::AllReduceDone
            | Opcode::AllGatherDone
            | Opcode::CollectivePermuteDone
            | Opcode::AsyncDone
            | Opcode::CopyDone
    )
}

fn alloc(
    b: &mut Buffers,
    new_buffers: &mut impl FnMut(&mut Buffers, &[u64], u32, bool) -> Vec<Vec<u32>>,
    instr: &HloInstruction,
    i: u32,
    defs: &mut [Vec<u32>],
) -> Leaves {
    let mut sizes = Vec::new();
    leaf_sizes(&instr.shape, &mut sizes);
    let nb = new_buffers(b, &sizes, i, false);
    defs[i as usize].extend(nb.iter().flatten().copied());
    Leaves::List(nb)
}

/// Peak live bytes of `order` (a permutation of the instruction indices):
/// parameters plus, at each step, every buffer defined at or before it and
/// used at or after it, plus the step's transient (callee peak). Returns
/// `(peak including parameters, peak of temporaries alone)`.
pub fn peak_of_order(buffers: &Buffers, order: &[u32], transient: &[u64]) -> (u64, u64) {
    let n = order.len();
    let nb = buffers.num_buffers();
    let mut pos = vec![0usize; transient.len().max(n)];
    for (p, &i) in order.iter().enumerate() {
        if let Some(slot) = pos.get_mut(i as usize) {
            *slot = p;
        }
    }
    let mut first = vec![usize::MAX; nb];
    let mut last = vec![0usize; nb];
    let mut seen = vec![false; nb];
    for (p, &i) in order.iter().enumerate() {
        for &d in buffers.defs.get(i as usize) {
            let d = d as usize;
            first[d] = first[d].min(p);
            last[d] = last[d].max(p);
            seen[d] = true;
        }
        for &u in buffers.uses.get(i as usize) {
            let u = u as usize;
            last[u] = last[u].max(p);
        }
    }
    for &r in &buffers.root_uses {
        if let Some(l) = last.get_mut(r as usize) {
            *l = n.saturating_sub(1);
        }
    }
    let mut delta = vec![0i128; n + 1];
    for bid in 0..nb {
        if buffers.is_param[bid] || !seen[bid] || first[bid] == usize::MAX {
            continue;
        }
        delta[first[bid]] += buffers.size[bid] as i128;
        delta[last[bid].max(first[bid]) + 1] -= buffers.size[bid] as i128;
    }
    let mut live: i128 = 0;
    let mut peak: u64 = 0;
    for (p, &i) in order.iter().enumerate() {
        live += delta[p];
        let t = transient.get(i as usize).copied().unwrap_or(0);
        peak = peak.max((live.max(0) as u64).saturating_add(t));
    }
    (peak.saturating_add(buffers.param_bytes), peak)
}

/// Live bytes of temporaries after each step of `order` (for traces).
pub fn live_profile(buffers: &Buffers, order: &[u32], transient: &[u64]) -> Vec<u64> {
    let n = order.len();
    let nb = buffers.num_buffers();
    let mut first = vec![usize::MAX; nb];
    let mut last = vec![0usize; nb];
    for (p, &i) in order.iter().enumerate() {
        for &d in buffers.defs.get(i as usize) {
            first[d as usize] = first[d as usize].min(p);
            last[d as usize] = last[d as usize].max(p);
        }
        for &u in buffers.uses.get(i as usize) {
            last[u as usize] = last[u as usize].max(p);
        }
    }
    for &r in &buffers.root_uses {
        if let Some(l) = last.get_mut(r as usize) {
            *l = n.saturating_sub(1);
        }
    }
    let mut delta = vec![0i128; n + 1];
    for bid in 0..nb {
        if buffers.is_param[bid] || first[bid] == usize::MAX {
            continue;
        }
        delta[first[bid]] += buffers.size[bid] as i128;
        delta[last[bid].max(first[bid]) + 1] -= buffers.size[bid] as i128;
    }
    let mut live: i128 = 0;
    order
        .iter()
        .enumerate()
        .map(|(p, &i)| {
            live += delta[p];
            (live.max(0) as u64)
                .saturating_add(transient.get(i as usize).copied().unwrap_or(0))
                .saturating_add(buffers.param_bytes)
        })
        .collect()
}
