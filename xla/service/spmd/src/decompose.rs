//! Collective decomposition (Concerto's, on a partitioned module): a
//! collective and the dot that produces or consumes it are split into `k`
//! chunks along a dimension the collective does not touch, so chunk
//! `i`'s collective can overlap chunk `i + 1`'s dot:
//!   - `all-reduce(dot(a, b))` and `reduce-scatter(dot(a, b))`: a free
//!     (non-contracting, non-batch) dimension of `a` or `b` is sliced into
//!     `k` pieces; each piece's dot is all-reduced (reduce-scattered) on
//!     its own and the results are concatenated along the matching output
//!     dimension (not the scattered one);
//!   - `dot(all-gather(x), b)`: a free dimension of `x` other than the
//!     gathered one is sliced; each piece is all-gathered and multiplied
//!     on its own, the products concatenated.
//!
//! Every output element is the same dot product, reduced (or gathered) over
//! the same devices in the same order as before, so results are bitwise
//! equal to the undecomposed program wherever a dot's sum does not depend
//! on its shape (the interpreter's consistent mode; a GEMM library may
//! round a smaller dot differently). How many chunks (or none) is the
//! caller's choice per pair ([`candidates`] lists them, [`decompose`]
//! applies a plan); `xla-pipelines` decides it with the scheduler's cost
//! model.
//!
//! Invariants: only computations that run as programs of their own (the
//! entry and what its loops, conditionals and calls reach) are changed; a
//! pair is split only when the collective and the dot have
//! no other user or operand relation (the collective is the dot's only
//! user, or its only operand's only user), carry no control edges, and
//! the chunked dimension divides evenly; new collectives keep the
//! original's attributes with fresh channel ids.

use crate::builder::Builder;
use crate::context::ModuleContext;
use crate::windowed_einsum::{
    operand_dim_of, output_dim_of, sequential_computations, single_dimension, Uses,
};
use xla_hlo_ir::attrs::{AttrValue, Attribute};
use xla_hlo_ir::{AttrKey, HloComputation, HloInstruction, HloModule, InstrId, Opcode};

/// Which side of the dot the collective is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PairKind {
    /// `all-reduce(dot)`.
    AllReduce,
    /// `reduce-scatter(dot)`.
    ReduceScatter,
    /// `dot(all-gather(x), ..)`.
    AllGather,
}

/// A collective and its dot that can be split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub computation: usize,
    pub kind: PairKind,
    pub collective: InstrId,
    pub dot: InstrId,
    /// The dot operand that is sliced (0: lhs, 1: rhs; for an all-gather,
    /// the gathered operand), the sliced dimension (of the all-gather's
    /// operand for an all-gather), and the dot output dimension the pieces
    /// are concatenated along.
    pub side: usize,
    pub operand_dim: usize,
    pub output_dim: usize,
    /// The sliced dimension's size: `k` must divide it.
    pub size: i64,
}

/// Every pair of the module that can be split, largest sliced dimension
/// first per pair.
pub fn candidates(module: &HloModule) -> Vec<Candidate> {
    let mut found = Vec::new();
    let sequential = sequential_computations(module);
    for (computation, comp) in module.computations.iter().enumerate() {
        if !sequential[computation] {
            continue;
        }
        let uses = Uses::of(comp);
        let only_user = |id: InstrId| uses.only_user(comp, id);
        for (index, collective) in comp.instructions.iter().enumerate() {
            let id = InstrId(index as u32);
            if uses.control[index] || collective.operands.len() != 1 || !collective.shape.is_array()
            {
                continue;
            }
            let pair = match collective.opcode {
                Opcode::AllReduce | Opcode::ReduceScatter => {
                    let dot = collective.operands[0];
                    (comp.instr(dot).opcode == Opcode::Dot && only_user(dot) == Some(id))
                        .then(|| reduction_candidate(comp, computation, id, dot))
                        .flatten()
                }
                Opcode::AllGather => only_user(id)
                    .filter(|&dot| comp.instr(dot).opcode == Opcode::Dot)
                    .and_then(|dot| gather_candidate(comp, computation, id, dot)),
                _ => None,
            };
            found.extend(pair);
        }
    }
    found
}

fn reduction_candidate(
    comp: &HloComputation,
    computation: usize,
    collective: InstrId,
    dot_id: InstrId,
) -> Option<Candidate> {
    let dot = comp.instr(dot_id);
    let instr = comp.instr(collective);
    let (kind, scattered) = match instr.opcode {
        Opcode::AllReduce => (PairKind::AllReduce, None),
        _ => (PairKind::ReduceScatter, Some(single_dimension(instr)?)),
    };
    (0..dot.shape.rank())
        .filter(|&od| Some(od) != scattered)
        .filter_map(|od| {
            let (side, operand_dim) = operand_dim_of(comp, dot, od)?;
            Some(Candidate {
                computation,
                kind,
                collective,
                dot: dot_id,
                side,
                operand_dim,
                output_dim: od,
                size: dot.shape.dims()[od],
            })
        })
        .max_by_key(|c| c.size)
}

fn gather_candidate(
    comp: &HloComputation,
    computation: usize,
    all_gather: InstrId,
    dot_id: InstrId,
) -> Option<Candidate> {
    let dot = comp.instr(dot_id);
    let ag = comp.instr(all_gather);
    let side = dot.operands.iter().position(|&o| o == all_gather)?;
    if dot.operands.iter().filter(|&&o| o == all_gather).count() != 1 {
        return None;
    }
    let gathered = single_dimension(ag)?;
    let x = comp.instr(ag.operands[0]);
    (0..x.shape.rank())
        .filter(|&d| d != gathered)
        .filter_map(|d| {
            let output_dim = output_dim_of(comp, dot, side, d)?;
            Some(Candidate {
                computation,
                kind: PairKind::AllGather,
                collective: all_gather,
                dot: dot_id,
                side,
                operand_dim: d,
                output_dim,
                size: x.shape.dims()[d],
            })
        })
        .max_by_key(|c| c.size)
}

/// Splits each planned pair into its `k` chunks (`k >= 2` dividing the
/// candidate's size; other entries, and pairs sharing an instruction with
/// an earlier one, are skipped); returns how many pairs were split.
pub fn decompose(module: &mut HloModule, plan: &[(Candidate, i64)]) -> usize {
    let num_partitions = module.num_partitions().max(1);
    let mut ctx = ModuleContext::new(module, num_partitions);
    let mut split = 0;
    for computation in 0..module.computations.len() {
        // A dot between two collectives belongs to the first planned pair.
        let mut taken = Vec::new();
        let pairs: Vec<(&Candidate, i64)> = plan
            .iter()
            .filter(|(c, k)| c.computation == computation && *k >= 2 && c.size % k == 0)
            .filter(|(c, _)| {
                let free = !taken.contains(&c.dot) && !taken.contains(&c.collective);
                if free {
                    taken.extend([c.dot, c.collective]);
                }
                free
            })
            .map(|(c, k)| (c, *k))
            .collect();
        if pairs.is_empty() {
            continue;
        }
        let old = std::mem::replace(
            &mut module.computations[computation],
            HloComputation::new(""),
        );
        module.computations[computation] = rewrite(&mut ctx, old, &pairs);
        split += pairs.len();
    }
    split
}

/// The instruction whose uses the concatenation takes over, and the one
/// dropped.
fn replaced_and_dropped(c: &Candidate) -> (InstrId, InstrId) {
    match c.kind {
        PairKind::AllReduce | PairKind::ReduceScatter => (c.collective, c.dot),
        PairKind::AllGather => (c.dot, c.collective),
    }
}

fn with_dim(shape: &xla_hlo_ir::Shape, dim: usize, size: i64) -> xla_hlo_ir::Shape {
    let mut dims = shape.dims().to_vec();
    dims[dim] = size;
    crate::shapes::with_dims(shape, &dims)
}

/// A copy of `original` (a dot or a collective) on new operands and
/// shape, with a fresh channel id for a collective.
fn chunk_of(
    b: &mut Builder<'_>,
    original: &HloInstruction,
    operands: Vec<InstrId>,
    shape: xla_hlo_ir::Shape,
) -> InstrId {
    let mut attrs: Vec<(AttrKey, AttrValue)> = original
        .attrs
        .iter()
        .map(|Attribute { key, value }| (*key, value.clone()))
        .collect();
    for (key, value) in &mut attrs {
        if *key == AttrKey::ChannelId {
            *value = AttrValue::Int(b.ctx.channel());
        }
    }
    b.add(&original.name, original.opcode, shape, operands, attrs)
}

fn rewrite(
    ctx: &mut ModuleContext,
    old: HloComputation,
    pairs: &[(&Candidate, i64)],
) -> HloComputation {
    let mut b = Builder::new(ctx, &old.name, old.instructions.len() + 16 * pairs.len());
    b.comp.execution_thread = old.execution_thread.clone();
    let mut map: Vec<InstrId> = Vec::with_capacity(old.instructions.len());
    for (index, mut instr) in old.instructions.clone().into_iter().enumerate() {
        let id = InstrId(index as u32);
        if pairs.iter().any(|(c, _)| replaced_and_dropped(c).1 == id) {
            map.push(InstrId(u32::MAX));
            continue;
        }
        let Some(&(candidate, k)) = pairs.iter().find(|(c, _)| replaced_and_dropped(c).0 == id)
        else {
            for operand in instr
                .operands
                .iter_mut()
                .chain(instr.control_predecessors.iter_mut())
            {
                *operand = map[operand.index()];
            }
            map.push(b.push(instr));
            continue;
        };
        let dot = old.instr(candidate.dot);
        let collective = old.instr(candidate.collective);
        let chunk = candidate.size / k;
        let mut pieces = Vec::with_capacity(k as usize);
        for i in 0..k {
            let piece = match candidate.kind {
                PairKind::AllReduce | PairKind::ReduceScatter => {
                    let sliced = map[dot.operands[candidate.side].index()];
                    let other = map[dot.operands[1 - candidate.side].index()];
                    let part = slice_along(&mut b, sliced, candidate.operand_dim, i * chunk, chunk);
                    let operands = if candidate.side == 0 {
                        vec![part, other]
                    } else {
                        vec![other, part]
                    };
                    let dot_shape = with_dim(&dot.shape, candidate.output_dim, chunk);
                    let product = chunk_of(&mut b, dot, operands, dot_shape);
                    let shape = with_dim(&collective.shape, candidate.output_dim, chunk);
                    chunk_of(&mut b, collective, vec![product], shape)
                }
                PairKind::AllGather => {
                    let x = map[collective.operands[0].index()];
                    let other = map[dot.operands[1 - candidate.side].index()];
                    let part = slice_along(&mut b, x, candidate.operand_dim, i * chunk, chunk);
                    let gathered_shape = with_dim(&collective.shape, candidate.operand_dim, chunk);
                    let gathered = chunk_of(&mut b, collective, vec![part], gathered_shape);
                    let operands = if candidate.side == 0 {
                        vec![gathered, other]
                    } else {
                        vec![other, gathered]
                    };
                    let shape = with_dim(&dot.shape, candidate.output_dim, chunk);
                    chunk_of(&mut b, dot, operands, shape)
                }
            };
            pieces.push(piece);
        }
        let result = b.concatenate(pieces, candidate.output_dim);
        b.comp.instr_mut(result).sharding = instr.sharding.take();
        map.push(result);
    }
    b.comp.root = map[old.root.index()];
    std::mem::replace(&mut b.comp, HloComputation::new(""))
}

fn slice_along(b: &mut Builder<'_>, x: InstrId, dim: usize, start: i64, size: i64) -> InstrId {
    let ranges: Vec<(i64, i64, i64)> = b
        .dims(x)
        .iter()
        .enumerate()
        .map(|(d, &n)| {
            if d == dim {
                (start, start + size, 1)
            } else {
                (0, n, 1)
            }
        })
        .collect();
    b.slice(x, &ranges)
}
