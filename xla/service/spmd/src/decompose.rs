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
//!     on its own, the products concatenated;
//!   - a collective with no such dot (`Alone`, as the all-reduce of an
//!     embedding lookup): its operand is sliced along a dimension the
//!     collective does not gather or scatter, when a chain follows.
//!
//! The work that follows the split value (the all-reduce's or
//! reduce-scatter's result, or the all-gather's dot) is split with it
//! where it can be (Concerto's dependent compute, the candidate's
//! `chain`): elementwise ops, broadcasts, transposes, reshapes and
//! reductions that keep the chunked dimension, dots that take it as a free
//! dimension or as a batch dimension (the other side sliced alike: the
//! attention of a chunk of a batch), and further collectives (a
//! transformer layer's next all-reduce and the work after it, until an op
//! needs the whole of a chained value, as attention over a chunk of
//! tokens needs every key). Chunk `i`'s chain can then run while chunk
//! `i + 1`'s collective is in flight, which hides a
//! collective whose own dot is too small to. Operands from outside the
//! chain are sliced (a broadcast is broadcast again per chunk; an operand
//! that depends on the split value without being in the chain ends the
//! chain there), another pair's pieces chunked alike are taken piece by
//! piece, and every chain value used elsewhere is concatenated back, so
//! any prefix of a chain (in program order) is a chain as well.
//!
//! The work that produces the sliced value and is used by nothing else is
//! split too (Concerto's producing compute, the candidate's `prologue`),
//! walking back from the split value: elementwise ops, broadcasts,
//! transposes, reshapes, reductions over other dimensions, dots where the
//! chunked dimension is a free one of one side (the other side whole) or
//! a batch one (both sides chunked) and collectives, as long as every
//! user of the op is in the prologue. For a row-parallel projection after
//! attention the prologue reaches back
//! through the softmax to the query projection, so chunk `i`'s collective
//! overlaps chunk `i + 1`'s attention, which hides the first chunk's
//! collective as well. The prologue's boundary values (a key, a
//! parameter) are sliced or taken whole, so any suffix of a prologue (in
//! program order) is a prologue as well.
//!
//! The split computation is emitted chunk-major: among the instructions
//! ready at each point, chunk 0's go first, so each chunk's work runs as
//! far as it can (through chained collectives, until a concatenation needs
//! every chunk) before the next chunk's. The scheduler starts from that
//! order, which lets chunk `i`'s collective run under chunk `i + 1`'s work
//! instead of every chunk advancing op by op together; it holds more
//! values live at once (each chunk's intermediates while the next runs).
//!
//! Every output element is the same dot product, reduced (or gathered) over
//! the same devices in the same order as before, and every chain element
//! and prologue element is computed from the same elements by the same
//! ops, so results are bitwise
//! equal to the undecomposed program wherever a dot's sum does not depend
//! on its shape (the interpreter's consistent mode; a GEMM library may
//! round a smaller dot differently). How many chunks (or none) is the
//! caller's choice per pair ([`candidates`] lists them along their
//! preferred dimension, [`candidate_ways`] along every dimension,
//! [`decompose`] applies a plan);
//! `xla-pipelines` decides it with the scheduler and its cost model.
//!
//! Invariants: only computations that run as programs of their own (the
//! entry and what its loops, conditionals and calls reach) are changed; a
//! dot is paired only when it and the collective have no other user or
//! operand relation (the collective is the dot's only user, or its only
//! operand's only user); nothing split carries control edges; the chunked
//! dimension divides evenly; an instruction belongs to one pair of a plan
//! (a later pair whose dot or collective is taken is skipped, one whose
//! chain or prologue meets taken ops has them found again without those);
//! a prologue op's users are all in its prologue (or are the pair's dot or
//! collective), so it never exists whole; new collectives keep the
//! original's attributes with fresh channel ids.

use crate::builder::Builder;
use crate::context::ModuleContext;
use crate::windowed_einsum::{
    operand_dim_of, output_dim_of, sequential_computations, single_dimension, Uses,
};
use rustc_hash::{FxHashMap, FxHashSet};
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
    /// A collective with no dot beside it (its operand is sliced), split
    /// for the sake of its chain.
    Alone,
}

/// A collective and its dot that can be split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub computation: usize,
    pub kind: PairKind,
    pub collective: InstrId,
    /// The dot (the collective itself for `Alone`).
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
    /// The ops after the split value that are split with it, in program
    /// order, each with the dimension of its result that is chunked.
    pub chain: Vec<(InstrId, usize)>,
    /// The ops before the pair that are split with it (the work producing
    /// the sliced operand and used by nothing else), in program order.
    pub prologue: Vec<PrologueOp>,
}

/// An op of a pair's prologue: its result is computed chunk by chunk along
/// `dim`, each operand sliced along its `operand_dims` entry (or taken
/// whole where that is `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrologueOp {
    pub op: InstrId,
    pub dim: usize,
    pub operand_dims: Vec<Option<usize>>,
}

impl Candidate {
    /// The value the pair's pieces are concatenated into: the collective
    /// for a reduction, the dot for an all-gather.
    pub fn head(&self) -> InstrId {
        replaced_and_dropped(self).0
    }

    /// The value whose chunks the pair's pieces take: the dot operand
    /// sliced for a reduction, the collective's operand otherwise.
    pub fn split_value(&self, comp: &HloComputation) -> InstrId {
        match self.kind {
            PairKind::AllReduce | PairKind::ReduceScatter => {
                comp.instr(self.dot).operands[self.side]
            }
            PairKind::AllGather | PairKind::Alone => comp.instr(self.collective).operands[0],
        }
    }

    /// Every instruction the split replaces.
    fn members(&self) -> impl Iterator<Item = InstrId> + '_ {
        [self.dot, self.collective]
            .into_iter()
            .chain(self.chain.iter().map(|(op, _)| *op))
            .chain(self.prologue.iter().map(|p| p.op))
    }
}

/// The rewrite's new id for a value that exists only in pieces (or is
/// dropped), and the dropped instruction of a pair that drops none.
const NO_WHOLE: InstrId = InstrId(u32::MAX);

/// Largest number of ops a chain takes.
const MAX_CHAIN: usize = 512;

/// Every pair of the module that can be split, once each, along its
/// preferred dimension: the first of its [`candidate_ways`].
pub fn candidates(module: &HloModule) -> Vec<Candidate> {
    candidate_ways(module)
        .into_iter()
        .filter_map(|ways| ways.into_iter().next())
        .collect()
}

/// For every collective that can be split, its pairs along each dimension
/// that can be chunked, preferred first: a dimension of even size (chunk
/// counts are usually powers of two; a dimension of size 1 is never
/// taken), then the one whose chain and prologue hold the most dots, then
/// the most ops, then the largest. The other dimensions matter where the
/// preferred one rereads operands: chunking a small batch of tokens
/// rereads every weight of its chain, while chunking a row-parallel
/// projection along its output features reads each weight once.
pub fn candidate_ways(module: &HloModule) -> Vec<Vec<Candidate>> {
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
            let pair = pair
                .filter(|ways| !ways.is_empty())
                .or_else(|| alone_candidate(comp, computation, id));
            let mut ways: Vec<((bool, usize, usize, i64), Candidate)> = pair
                .into_iter()
                .flatten()
                .map(|mut c| {
                    let none = FxHashSet::default();
                    c.chain = chain_of(comp, &uses, c.head(), c.output_dim, &none);
                    c.prologue = prologue_of(comp, &uses, &c, &none);
                    c
                })
                .filter(|c| c.size >= 2 && (c.kind != PairKind::Alone || !c.chain.is_empty()))
                .map(|c| {
                    let split_ops = c.chain.iter().map(|(op, _)| *op);
                    let split_ops = split_ops.chain(c.prologue.iter().map(|p| p.op));
                    let dots = split_ops
                        .filter(|op| comp.instr(*op).opcode == Opcode::Dot)
                        .count();
                    let halves = c.size % 2 == 0;
                    ((halves, dots, c.chain.len() + c.prologue.len(), c.size), c)
                })
                .collect();
            // Preferred first; among equal keys, the last (most minor)
            // dimension.
            ways.reverse();
            ways.sort_by_key(|way| std::cmp::Reverse(way.0));
            if !ways.is_empty() {
                found.push(ways.into_iter().map(|(_, c)| c).collect());
            }
        }
    }
    found
}

/// The ways to split a collective on its own: one per dimension it does
/// not gather or scatter.
fn alone_candidate(
    comp: &HloComputation,
    computation: usize,
    collective: InstrId,
) -> Option<Vec<Candidate>> {
    let instr = comp.instr(collective);
    let touched = match instr.opcode {
        Opcode::AllReduce => None,
        Opcode::AllGather | Opcode::ReduceScatter => Some(single_dimension(instr)?),
        _ => return None,
    };
    Some(
        (0..instr.shape.rank())
            .filter(|&d| Some(d) != touched)
            .map(|d| Candidate {
                computation,
                kind: PairKind::Alone,
                collective,
                dot: collective,
                side: 0,
                operand_dim: d,
                output_dim: d,
                size: instr.shape.dims()[d],
                chain: Vec::new(),
                prologue: Vec::new(),
            })
            .collect(),
    )
}

/// The ways to split a reduction of a dot's result: one per dimension.
fn reduction_candidate(
    comp: &HloComputation,
    computation: usize,
    collective: InstrId,
    dot_id: InstrId,
) -> Option<Vec<Candidate>> {
    let dot = comp.instr(dot_id);
    let instr = comp.instr(collective);
    let (kind, scattered) = match instr.opcode {
        Opcode::AllReduce => (PairKind::AllReduce, None),
        _ => (PairKind::ReduceScatter, Some(single_dimension(instr)?)),
    };
    Some(
        (0..dot.shape.rank())
            .filter(|&od| Some(od) != scattered)
            .filter_map(move |od| {
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
                    chain: Vec::new(),
                    prologue: Vec::new(),
                })
            })
            .collect(),
    )
}

/// The ways to split a dot of an all-gather: one per dimension.
fn gather_candidate(
    comp: &HloComputation,
    computation: usize,
    all_gather: InstrId,
    dot_id: InstrId,
) -> Option<Vec<Candidate>> {
    let dot = comp.instr(dot_id);
    let ag = comp.instr(all_gather);
    let side = dot.operands.iter().position(|&o| o == all_gather)?;
    if dot.operands.iter().filter(|&&o| o == all_gather).count() != 1 {
        return None;
    }
    let gathered = single_dimension(ag)?;
    let x = comp.instr(ag.operands[0]);
    Some(
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
                    chain: Vec::new(),
                    prologue: Vec::new(),
                })
            })
            .collect(),
    )
}

/// The chain after `head` (chunked along `head_dim`): in program order,
/// every op not in `excluded` with an operand in the chain whose result
/// keeps the chunked dimension (see [`chunked_dim`]) and whose other
/// operands do not depend on `head`. At most `MAX_CHAIN` ops.
fn chain_of(
    comp: &HloComputation,
    uses: &Uses,
    head: InstrId,
    head_dim: usize,
    excluded: &FxHashSet<InstrId>,
) -> Vec<(InstrId, usize)> {
    let n = comp.instructions.len();
    // Chunked dimension of each chain value (head included).
    let mut dim: Vec<Option<usize>> = vec![None; n];
    dim[head.index()] = Some(head_dim);
    // Depends on `head` without being in the chain.
    let mut tainted = vec![false; n];
    let mut chain = Vec::new();
    for index in head.index() + 1..n {
        let instr = &comp.instructions[index];
        let touches = |o: &InstrId| dim[o.index()].is_some() || tainted[o.index()];
        if !instr.operands.iter().any(touches) {
            continue;
        }
        let joins = chain.len() < MAX_CHAIN
            && !uses.control[index]
            && !excluded.contains(&InstrId(index as u32))
            && instr.shape.is_array()
            && instr.operands.iter().all(|o| !tainted[o.index()]);
        let chunked = joins.then(|| chunked_dim(comp, instr, &dim)).flatten();
        match chunked {
            Some(d) => {
                dim[index] = Some(d);
                chain.push((InstrId(index as u32), d));
            }
            None => tainted[index] = true,
        }
    }
    chain
}

/// The dimension of `instr`'s result that its chain operands' chunked
/// dimensions (`dim`) map to, when `instr` can be computed chunk by chunk
/// with its other operands sliced (or whole): elementwise ops (same
/// shapes), broadcasts, transposes, reshapes that keep the dimension
/// whole, reductions over other dimensions, dots taking the chunked
/// dimension as a free one from one side only or as a batch one (from
/// either side or both), and all-reduces (and
/// all-gathers and reduce-scatters along another dimension).
fn chunked_dim(
    comp: &HloComputation,
    instr: &HloInstruction,
    dim: &[Option<usize>],
) -> Option<usize> {
    let in_chain: Vec<(usize, usize)> = instr
        .operands
        .iter()
        .enumerate()
        .filter_map(|(k, o)| dim[o.index()].map(|d| (k, d)))
        .collect();
    let &(first, d) = in_chain.first()?;
    let rank = instr.shape.rank();
    if instr.opcode == Opcode::Dot {
        // A batch dimension (every chain operand's chunked dimension is
        // the same one of the dot's batch dimensions; the other side is
        // sliced alike), or a free dimension of the one chain operand.
        let batch = in_chain
            .iter()
            .map(|&(side, e)| batch_output_dim(instr, side, e))
            .collect::<Option<Vec<usize>>>();
        return match batch {
            Some(at) if at.iter().all(|&b| b == at[0]) => Some(at[0]),
            _ if in_chain.len() == 1 => output_dim_of(comp, instr, first, d),
            _ => None,
        };
    }
    if instr.opcode.is_elementwise() {
        let same_shape = instr.operands.iter().all(|o| {
            let shape = &comp.instr(*o).shape;
            shape.rank() == 0 || shape.dims() == instr.shape.dims()
        });
        return (same_shape && d < rank && in_chain.iter().all(|&(_, e)| e == d)).then_some(d);
    }
    if in_chain.len() != 1 {
        return None;
    }
    match instr.opcode {
        Opcode::Broadcast => {
            let mapped = *instr.ints_attr(AttrKey::Dimensions)?.get(d)?;
            usize::try_from(mapped).ok().filter(|&m| m < rank)
        }
        Opcode::Transpose => {
            let perm = instr.ints_attr(AttrKey::Dimensions)?;
            perm.iter().position(|&p| p == d as i64)
        }
        Opcode::Reshape => {
            // A reshape that keeps the dimension whole, with as many
            // elements before it: each chunk reshapes on its own.
            let from = comp.instr(instr.operands[0]).shape.dims();
            let to = instr.shape.dims();
            let size = *from.get(d)?;
            let before: i64 = from[..d].iter().product();
            (0..to.len()).find(|&e| to[e] == size && to[..e].iter().product::<i64>() == before)
        }
        Opcode::Reduce => {
            // One input and its scalar init.
            if instr.operands.len() != 2 || first != 0 {
                return None;
            }
            let reduced = instr.ints_attr(AttrKey::Dimensions)?;
            if reduced.contains(&(d as i64)) {
                return None;
            }
            Some(d - reduced.iter().filter(|&&r| r < d as i64).count())
        }
        // A collective reduces or moves each element on its own along
        // every dimension it does not gather or scatter, so its chunks are
        // the same collective on smaller arrays.
        Opcode::AllReduce if instr.operands.len() == 1 => Some(d),
        Opcode::AllGather | Opcode::ReduceScatter if instr.operands.len() == 1 => {
            (single_dimension(instr)? != d).then_some(d)
        }
        _ => None,
    }
}

/// The prologue of a pair: walking back from its split value (chunked
/// along the candidate's operand dimension), every op not in `excluded`
/// all of whose users are the pair's consumer or already in the prologue,
/// each taking its chunks at one dimension, whose chunks can be computed
/// from chunks of its operands (see [`operand_dims`]). In program order; at
/// most `MAX_CHAIN` ops. Empty when the split value has another user.
fn prologue_of(
    comp: &HloComputation,
    uses: &Uses,
    candidate: &Candidate,
    excluded: &FxHashSet<InstrId>,
) -> Vec<PrologueOp> {
    let start = candidate.split_value(comp);
    let consumer = match candidate.kind {
        PairKind::AllReduce | PairKind::ReduceScatter => candidate.dot,
        PairKind::AllGather | PairKind::Alone => candidate.collective,
    };
    if uses.only_user(comp, start) != Some(consumer) {
        return Vec::new();
    }
    let n = comp.instructions.len();
    // The dimension prologue users want each value chunked along: `None`
    // while unasked, `Some(None)` when they disagree or one needs it whole.
    let mut wanted: Vec<Option<Option<usize>>> = vec![None; n];
    // How many uses of each value are by the consumer or prologue ops.
    let mut member_uses = vec![0usize; n];
    wanted[start.index()] = Some(Some(candidate.operand_dim));
    member_uses[start.index()] = 1;
    let mut prologue = Vec::new();
    for index in (0..=start.index()).rev() {
        let id = InstrId(index as u32);
        let Some(Some(dim)) = wanted[index] else {
            continue;
        };
        let instr = comp.instr(id);
        if prologue.len() >= MAX_CHAIN
            || member_uses[index] != uses.users[index].len()
            || id == comp.root
            || uses.control[index]
            || excluded.contains(&id)
            || !instr.shape.is_array()
        {
            continue;
        }
        let Some(operand_dims) = operand_dims(comp, instr, dim) else {
            continue;
        };
        for (operand, operand_dim) in instr.operands.iter().zip(&operand_dims) {
            member_uses[operand.index()] += 1;
            let slot = &mut wanted[operand.index()];
            *slot = match (*slot, *operand_dim) {
                (None, Some(d)) => Some(Some(d)),
                (Some(Some(d)), Some(e)) if d == e => Some(Some(d)),
                _ => Some(None),
            };
        }
        prologue.push(PrologueOp {
            op: id,
            dim,
            operand_dims,
        });
    }
    prologue.reverse();
    prologue
}

/// The dot output dimension of operand `side`'s batch dimension `dim`
/// (batch dimensions come first in a dot's result, in order).
fn batch_output_dim(dot: &HloInstruction, side: usize, dim: usize) -> Option<usize> {
    let key = [AttrKey::LhsBatchDims, AttrKey::RhsBatchDims].get(side)?;
    dot.ints_attr(*key)?.iter().position(|&b| b == dim as i64)
}

/// The lhs and rhs batch dimensions that dot output dimension `dim` is,
/// when it is a batch one.
fn batch_operand_dims(dot: &HloInstruction, dim: usize) -> Option<(usize, usize)> {
    let at = |key| {
        let d = *dot.ints_attr(key)?.get(dim)?;
        usize::try_from(d).ok()
    };
    Some((at(AttrKey::LhsBatchDims)?, at(AttrKey::RhsBatchDims)?))
}

/// For `instr` computed in chunks along dimension `dim` of its result, the
/// dimension of each operand its chunks take (`None`: the whole operand):
/// elementwise ops (operands of the result's shape, or scalars),
/// broadcasts, transposes, reshapes that keep the dimension whole,
/// reductions (of one input), dots where `dim` is a free dimension of
/// one side (the other whole) or a batch one (both sides chunked), and
/// collectives that do not gather or scatter along it.
/// `None` for anything else (iotas, parameters and constants are sliced).
fn operand_dims(
    comp: &HloComputation,
    instr: &HloInstruction,
    dim: usize,
) -> Option<Vec<Option<usize>>> {
    let operand_dims = |i: usize| comp.instr(instr.operands[i]).shape.dims();
    if instr.opcode.is_elementwise() {
        return instr
            .operands
            .iter()
            .map(|o| {
                let shape = &comp.instr(*o).shape;
                if shape.rank() == 0 {
                    Some(None)
                } else {
                    (shape.dims() == instr.shape.dims()).then_some(Some(dim))
                }
            })
            .collect();
    }
    match instr.opcode {
        Opcode::Broadcast if instr.operands.len() == 1 => {
            // The operand's dimension that `dim` comes from, or the whole
            // operand when `dim` is a new one.
            let mapping = instr.ints_attr(AttrKey::Dimensions)?;
            Some(vec![mapping.iter().position(|&m| m == dim as i64)])
        }
        Opcode::Transpose => {
            let perm = instr.ints_attr(AttrKey::Dimensions)?;
            Some(vec![Some(usize::try_from(*perm.get(dim)?).ok()?)])
        }
        Opcode::Reshape => {
            let from = operand_dims(0);
            let to = instr.shape.dims();
            let size = *to.get(dim)?;
            let before: i64 = to[..dim].iter().product();
            let e = (0..from.len())
                .find(|&e| from[e] == size && from[..e].iter().product::<i64>() == before)?;
            Some(vec![Some(e)])
        }
        Opcode::Reduce if instr.operands.len() == 2 => {
            let reduced = instr.ints_attr(AttrKey::Dimensions)?;
            let kept: Vec<usize> = (0..operand_dims(0).len())
                .filter(|d| !reduced.contains(&(*d as i64)))
                .collect();
            Some(vec![Some(*kept.get(dim)?), None])
        }
        Opcode::Dot if instr.operands.len() == 2 => {
            if let Some(both) = batch_operand_dims(instr, dim) {
                return Some(vec![Some(both.0), Some(both.1)]);
            }
            let (side, operand_dim) = operand_dim_of(comp, instr, dim)?;
            let mut dims = vec![None, None];
            dims[side] = Some(operand_dim);
            Some(dims)
        }
        Opcode::AllReduce if instr.operands.len() == 1 => Some(vec![Some(dim)]),
        Opcode::AllGather | Opcode::ReduceScatter if instr.operands.len() == 1 => {
            (single_dimension(instr)? != dim).then_some(vec![Some(dim)])
        }
        _ => None,
    }
}

/// Splits each planned pair into its `k` chunks (`k >= 2` dividing the
/// candidate's size; other entries are skipped); returns how many pairs
/// were split. An instruction belongs to the first planned pair that
/// touches it: a later pair whose dot or collective is taken is skipped,
/// and one whose chain or prologue meets taken instructions has them
/// recomputed without those (a pair planned without a prologue keeps
/// none).
pub fn decompose(module: &mut HloModule, plan: &[(Candidate, i64)]) -> usize {
    let num_partitions = module.num_partitions().max(1);
    let mut ctx = ModuleContext::new(module, num_partitions);
    let mut split = 0;
    for computation in 0..module.computations.len() {
        let comp = &module.computations[computation];
        let uses = Uses::of(comp);
        let mut taken: FxHashSet<InstrId> = FxHashSet::default();
        let mut pairs: Vec<(Candidate, i64)> = Vec::new();
        for (candidate, k) in plan {
            if candidate.computation != computation
                || *k < 2
                || candidate.size % k != 0
                || taken.contains(&candidate.dot)
                || taken.contains(&candidate.collective)
            {
                continue;
            }
            let mut candidate = candidate.clone();
            if candidate.members().any(|m| taken.contains(&m)) {
                candidate.chain =
                    chain_of(comp, &uses, candidate.head(), candidate.output_dim, &taken);
                if !candidate.prologue.is_empty() {
                    candidate.prologue = prologue_of(comp, &uses, &candidate, &taken);
                }
            }
            taken.extend(candidate.members());
            pairs.push((candidate, *k));
        }
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
        PairKind::Alone => (c.collective, NO_WHOLE),
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
    pairs: &[(Candidate, i64)],
) -> HloComputation {
    let mut b = Builder::new(ctx, &old.name, old.instructions.len() + 16 * pairs.len());
    b.comp.execution_thread = old.execution_thread.clone();
    let uses = Uses::of(&old);
    // Split value (a pair's head or chain op) -> (its pair's index, chunk
    // count, chunked dimension of its result).
    let mut split: FxHashMap<InstrId, (usize, i64, usize)> = FxHashMap::default();
    for (p, (c, k)) in pairs.iter().enumerate() {
        split.insert(c.head(), (p, *k, c.output_dim));
        split.extend(c.chain.iter().map(|&(op, d)| (op, (p, *k, d))));
    }
    // Prologue op -> its pair's chunk count and how it is chunked.
    let mut prologue: FxHashMap<InstrId, (i64, &PrologueOp)> = FxHashMap::default();
    for (c, k) in pairs {
        prologue.extend(c.prologue.iter().map(|op| (op.op, (*k, op))));
    }
    // Whether op `user` takes split value `value` piece by piece: a split
    // op of its own pair, an elementwise split op of another pair chunked
    // alike, or a prologue op chunking it alike at every use.
    let takes_pieces = |user: InstrId, value: InstrId| {
        let Some(&(value_pair, value_k, value_dim)) = split.get(&value) else {
            return false;
        };
        if let Some(&(k, op)) = prologue.get(&user) {
            return k == value_k
                && old
                    .instr(user)
                    .operands
                    .iter()
                    .zip(&op.operand_dims)
                    .filter(|(o, _)| **o == value)
                    .all(|(_, d)| *d == Some(value_dim));
        }
        match split.get(&user) {
            Some(&(user_pair, k, dim)) => {
                user_pair == value_pair
                    || (old.instr(user).opcode.is_elementwise() && (k, dim) == (value_k, value_dim))
            }
            None => false,
        }
    };
    // Values split into pieces (new ids, one per chunk); a value is also
    // needed whole when the root or an op that does not take its pieces
    // uses it.
    let mut pieces: FxHashMap<InstrId, Vec<InstrId>> = FxHashMap::default();
    let escapes = |id: InstrId| {
        id == old.root || uses.users[id.index()].iter().any(|&u| !takes_pieces(u, id))
    };
    // Slices of whole operands, per (operand, dimension, chunk count).
    let mut slices: FxHashMap<(InstrId, usize, i64), Vec<InstrId>> = FxHashMap::default();
    let mut map: Vec<InstrId> = Vec::with_capacity(old.instructions.len());
    for (index, mut instr) in old.instructions.clone().into_iter().enumerate() {
        let id = InstrId(index as u32);
        if pairs.iter().any(|(c, _)| replaced_and_dropped(c).1 == id) {
            map.push(NO_WHOLE);
            continue;
        }
        if let Some(&(k, op)) = prologue.get(&id) {
            // All its users take its pieces: it is never needed whole.
            let chunk = instr.shape.dims()[op.dim] / k;
            let mut parts = Vec::with_capacity(k as usize);
            for i in 0..k as usize {
                let mut operands = Vec::with_capacity(instr.operands.len());
                for (o, operand_dim) in instr.operands.iter().zip(&op.operand_dims) {
                    let from_pieces = prologue.contains_key(o) || takes_pieces(id, *o);
                    operands.push(match (operand_dim, pieces.get(o)) {
                        (None, _) => map[o.index()],
                        (Some(_), Some(parts)) if from_pieces => parts[i],
                        (Some(d), _) => {
                            let chunks = chunks_of(&mut b, &old, &map, &mut slices, *o, *d, k);
                            chunks[i]
                        }
                    });
                }
                let shape = with_dim(&instr.shape, op.dim, chunk);
                parts.push(chunk_of(&mut b, &instr, operands, shape));
            }
            pieces.insert(id, parts);
            map.push(NO_WHOLE);
            continue;
        }
        let (parts, output_dim) =
            if let Some((candidate, k)) = pairs.iter().find(|(c, _)| c.head() == id) {
                let from = pieces
                    .get(&candidate.split_value(&old))
                    .filter(|_| prologue.contains_key(&candidate.split_value(&old)));
                (
                    pair_pieces(&mut b, &old, &map, candidate, *k, from.map(Vec::as_slice)),
                    candidate.output_dim,
                )
            } else if let Some(&(_, k, dim)) = split.get(&id) {
                let chunk = instr.shape.dims()[dim] / k;
                // Where operands that are not taken piece by piece are sliced
                // (an elementwise op's other operands, a batch dot's other
                // side); the others are taken whole.
                let sliced = operand_dims(&old, &instr, dim).unwrap_or_default();
                let mut parts = Vec::with_capacity(k as usize);
                for i in 0..k as usize {
                    let mut operands = Vec::with_capacity(instr.operands.len());
                    for (j, o) in instr.operands.iter().enumerate() {
                        operands.push(match (pieces.get(o), sliced.get(j).copied().flatten()) {
                            (Some(parts), _) if takes_pieces(id, *o) => parts[i],
                            (_, Some(d)) if old.instr(*o).shape.rank() > 0 => {
                                chunks_of(&mut b, &old, &map, &mut slices, *o, d, k)[i]
                            }
                            _ => map[o.index()],
                        });
                    }
                    let shape = with_dim(&instr.shape, dim, chunk);
                    parts.push(chunk_of(&mut b, &instr, operands, shape));
                }
                (parts, dim)
            } else {
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
        if escapes(id) {
            let whole = b.concatenate(parts.clone(), output_dim);
            b.comp.instr_mut(whole).sharding = instr.sharding.take();
            map.push(whole);
        } else {
            map.push(NO_WHOLE);
        }
        pieces.insert(id, parts);
    }
    b.comp.root = map[old.root.index()];
    let mut chunk_of_piece: FxHashMap<InstrId, u32> = FxHashMap::default();
    for parts in pieces.values() {
        for (i, part) in parts.iter().enumerate() {
            chunk_of_piece.insert(*part, i as u32);
        }
    }
    let new = std::mem::replace(&mut b.comp, HloComputation::new(""));
    chunk_major(new, &chunk_of_piece)
}

/// `comp` in an order that runs each chunk's work as far as it goes
/// before the next chunk's (the order a list scheduler starts from): a
/// topological order taking, among the ready instructions, the lowest
/// chunk first, then the earliest. A piece has its chunk; any other
/// instruction the lowest chunk among its users (0 without users), so
/// the slices and dots feeding chunk `i` move with it.
fn chunk_major(comp: HloComputation, chunk_of_piece: &FxHashMap<InstrId, u32>) -> HloComputation {
    let n = comp.instructions.len();
    let mut users: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut waiting = vec![0usize; n];
    for (index, instr) in comp.instructions.iter().enumerate() {
        for operand in instr.operands.iter().chain(&instr.control_predecessors) {
            users[operand.index()].push(index as u32);
            waiting[index] += 1;
        }
    }
    let mut chunk = vec![0u32; n];
    for index in (0..n).rev() {
        chunk[index] = match chunk_of_piece.get(&InstrId(index as u32)) {
            Some(&c) => c,
            None => users[index]
                .iter()
                .map(|&u| chunk[u as usize])
                .min()
                .unwrap_or(0),
        };
    }
    let mut ready: std::collections::BinaryHeap<std::cmp::Reverse<(u32, u32)>> = (0..n)
        .filter(|&i| waiting[i] == 0)
        .map(|i| std::cmp::Reverse((chunk[i], i as u32)))
        .collect();
    let mut order = Vec::with_capacity(n);
    while let Some(std::cmp::Reverse((_, index))) = ready.pop() {
        order.push(index);
        for &user in &users[index as usize] {
            waiting[user as usize] -= 1;
            if waiting[user as usize] == 0 {
                ready.push(std::cmp::Reverse((chunk[user as usize], user)));
            }
        }
    }
    let mut new_index = vec![0u32; n];
    for (position, &index) in order.iter().enumerate() {
        new_index[index as usize] = position as u32;
    }
    let remap = |id: InstrId| InstrId(new_index[id.index()]);
    let mut slots: Vec<Option<HloInstruction>> = comp.instructions.into_iter().map(Some).collect();
    let mut instructions = Vec::with_capacity(n);
    for &index in &order {
        let mut instr = slots[index as usize].take().expect("each instruction once");
        for operand in instr
            .operands
            .iter_mut()
            .chain(instr.control_predecessors.iter_mut())
        {
            *operand = remap(*operand);
        }
        instructions.push(instr);
    }
    HloComputation {
        instructions,
        root: remap(comp.root),
        parameters: comp.parameters.iter().map(|&p| remap(p)).collect(),
        ..comp
    }
}

/// The `k` chunks along `dim` of whole value `operand` (an old id), made
/// once per (operand, dimension, chunk count) and kept in `slices`.
fn chunks_of<'a>(
    b: &mut Builder<'_>,
    old: &HloComputation,
    map: &[InstrId],
    slices: &'a mut FxHashMap<(InstrId, usize, i64), Vec<InstrId>>,
    operand: InstrId,
    dim: usize,
    k: i64,
) -> &'a [InstrId] {
    let chunk = old.instr(operand).shape.dims()[dim] / k;
    slices.entry((operand, dim, k)).or_insert_with(|| {
        (0..k)
            .map(|j| operand_chunk(b, old, map, operand, dim, j * chunk, chunk))
            .collect()
    })
}

/// The `k` pieces of a pair: each chunk's dot and collective, taking the
/// split value's chunks `from` its prologue when it has one.
fn pair_pieces(
    b: &mut Builder<'_>,
    old: &HloComputation,
    map: &[InstrId],
    candidate: &Candidate,
    k: i64,
    from: Option<&[InstrId]>,
) -> Vec<InstrId> {
    let dot = old.instr(candidate.dot);
    let collective = old.instr(candidate.collective);
    let chunk = candidate.size / k;
    let mut pieces = Vec::with_capacity(k as usize);
    for i in 0..k {
        let piece = match candidate.kind {
            PairKind::Alone => {
                let part = match from {
                    Some(parts) => parts[i as usize],
                    None => operand_chunk(
                        b,
                        old,
                        map,
                        collective.operands[0],
                        candidate.operand_dim,
                        i * chunk,
                        chunk,
                    ),
                };
                let shape = with_dim(&collective.shape, candidate.output_dim, chunk);
                chunk_of(b, collective, vec![part], shape)
            }
            PairKind::AllReduce | PairKind::ReduceScatter => {
                let other = map[dot.operands[1 - candidate.side].index()];
                let part = match from {
                    Some(parts) => parts[i as usize],
                    None => {
                        let sliced = map[dot.operands[candidate.side].index()];
                        slice_along(b, sliced, candidate.operand_dim, i * chunk, chunk)
                    }
                };
                let operands = if candidate.side == 0 {
                    vec![part, other]
                } else {
                    vec![other, part]
                };
                let dot_shape = with_dim(&dot.shape, candidate.output_dim, chunk);
                let product = chunk_of(b, dot, operands, dot_shape);
                let shape = with_dim(&collective.shape, candidate.output_dim, chunk);
                chunk_of(b, collective, vec![product], shape)
            }
            PairKind::AllGather => {
                let other = map[dot.operands[1 - candidate.side].index()];
                let part = match from {
                    Some(parts) => parts[i as usize],
                    None => {
                        let x = map[collective.operands[0].index()];
                        slice_along(b, x, candidate.operand_dim, i * chunk, chunk)
                    }
                };
                let gathered_shape = with_dim(&collective.shape, candidate.operand_dim, chunk);
                let gathered = chunk_of(b, collective, vec![part], gathered_shape);
                let operands = if candidate.side == 0 {
                    vec![gathered, other]
                } else {
                    vec![other, gathered]
                };
                let shape = with_dim(&dot.shape, candidate.output_dim, chunk);
                chunk_of(b, dot, operands, shape)
            }
        };
        pieces.push(piece);
    }
    pieces
}

/// Elements `[start, start + size)` along `dim` of `operand` (an old id)
/// for a chain op: a broadcast of a value that exists whole is broadcast
/// again at the chunk's shape (from a slice of its operand when the
/// dimension comes from it), so the whole broadcast need not exist;
/// anything else (a broadcast of a value that exists only in pieces is
/// itself split, and concatenated for this use) is sliced.
fn operand_chunk(
    b: &mut Builder<'_>,
    old: &HloComputation,
    map: &[InstrId],
    operand: InstrId,
    dim: usize,
    start: i64,
    size: i64,
) -> InstrId {
    let instr = old.instr(operand);
    let whole = |id: InstrId| map[id.index()] != NO_WHOLE;
    if instr.opcode == Opcode::Broadcast && instr.operands.len() == 1 && whole(instr.operands[0]) {
        if let Some(mapping) = instr.ints_attr(AttrKey::Dimensions) {
            let source = map[instr.operands[0].index()];
            let source = match mapping.iter().position(|&m| m == dim as i64) {
                Some(source_dim) => slice_along(b, source, source_dim, start, size),
                None => source,
            };
            let shape = with_dim(&instr.shape, dim, size);
            return b.add(
                &instr.name,
                Opcode::Broadcast,
                shape,
                vec![source],
                vec![(AttrKey::Dimensions, AttrValue::Ints(mapping.to_vec()))],
            );
        }
    }
    slice_along(b, map[operand.index()], dim, start, size)
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
