//! The partitioning driver: walks each computation in definition order,
//! maps every original instruction to a `PValue` (its local instruction in
//! the new computation, its global shape and its sharding), dispatches to
//! the per-opcode handlers, and reshards values on demand (with a cache, so
//! one value is gathered at most once per target sharding).
//!
//! Called computations (while body/condition, conditional branches, `call`
//! targets) are partitioned with the shardings of their call site; a
//! computation needed with two different signatures is cloned. Computations
//! applied elementwise (reducers, comparators) are kept as they are.
//!
//! Invariants: every handler returns a value whose local instruction has
//! exactly the local shape of its sharding; the generic fallback (operands
//! replicated, op run on the global shape, result sliced) is correct for
//! every opcode without side effects, so handlers may decline by falling back.

mod control_flow;
mod dispatch;

use crate::builder::Builder;
use crate::context::ModuleContext;
use crate::error::SpmdError;
use crate::part::Part;
use crate::value::{local_shape, target_like_manual, PValue, ValueSharding};
use std::rc::Rc;
use xla_hlo_ir::{
    AttrKey, AttrValue, Category, CompId, HloComputation, HloInstruction, HloModule, InstrId,
    Opcode,
};

/// Partitions computation `cid` of `orig` with parameter shardings
/// `params`; the root is resharded to `root` when given. Returns the new
/// computation and its root sharding.
pub fn partition_computation(
    orig: &HloModule,
    ctx: &mut ModuleContext,
    cid: CompId,
    params: &[ValueSharding],
    root: Option<&ValueSharding>,
    name: &str,
) -> Result<(HloComputation, ValueSharding), SpmdError> {
    let orig_comp = orig.comp(cid);
    let b = Builder::new(ctx, name, orig_comp.instructions.len() * 2 + 16);
    let mut p = Part::new(orig, orig_comp, b);
    p.constant_derived = constant_derived(orig_comp);
    p.broadcast_dims = broadcast_dims(orig_comp);
    for id in orig_comp.ids() {
        let instr = orig_comp.instr(id);
        let v = if instr.opcode == Opcode::Parameter {
            let k = instr.parameter_number.unwrap_or(0) as usize;
            let vs = params
                .get(k)
                .cloned()
                .ok_or_else(|| SpmdError::Invalid(format!("no sharding for parameter {k}")))?;
            p.parameter(instr, vs)?
        } else {
            p.handle(id).map_err(|e| annotate(e, instr))?
        };
        p.vals[id.index()] = Some(v);
    }
    let rv = p.reduced(orig_comp.root)?;
    let rv = match root {
        Some(t) => p.reshard(&rv, t)?,
        None => rv,
    };
    p.b.comp.root = rv.id;
    let mut comp = std::mem::replace(&mut p.b.comp, HloComputation::new(""));
    comp.execution_thread = orig_comp.execution_thread.clone();
    let removed = dce(&mut comp);
    p.b.ctx.changes += removed;
    Ok((comp, rv.vs))
}

/// The most elements a constant-derived array may have (see
/// `Part::constant_derived`).
const MAX_CONSTANT_DERIVED_ELEMENTS: i64 = 1 << 16;

/// Which instructions of `comp` are small arrays computed from constants
/// (and iotas) only, by ops without side effects or calls other than a
/// reducer: XLA folds them to constants after partitioning.
fn constant_derived(comp: &HloComputation) -> Vec<bool> {
    let mut derived = vec![false; comp.instructions.len()];
    for id in comp.ids() {
        let instr = comp.instr(id);
        let small = instr.shape.is_array()
            && instr
                .shape
                .dims()
                .iter()
                .map(|&d| d.max(0))
                .product::<i64>()
                <= MAX_CONSTANT_DERIVED_ELEMENTS;
        let pure = match instr.opcode {
            Opcode::Constant | Opcode::Iota => true,
            Opcode::Reduce | Opcode::Map | Opcode::ReduceWindow => true,
            Opcode::Bitcast
            | Opcode::Domain
            | Opcode::DynamicReshape
            | Opcode::GetDimensionSize
            | Opcode::SetDimensionSize
            | Opcode::Shuffle => false,
            op => {
                instr.called_computation_ids().next().is_none()
                    && (op.is_elementwise() || op.category() == Category::DataMovement)
            }
        };
        derived[id.index()] = small
            && pure
            && instr
                .operands
                .iter()
                .all(|o| derived.get(o.index()).copied().unwrap_or(false));
    }
    derived
}

/// Per instruction of `comp`, the dims along which its array is constant:
/// a broadcast's added dims (and its operand's, mapped), kept by
/// transposes and by elementwise ops where all their array operands have
/// them.
fn broadcast_dims(comp: &HloComputation) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = vec![Vec::new(); comp.instructions.len()];
    for id in comp.ids() {
        let instr = comp.instr(id);
        if !instr.shape.is_array() {
            continue;
        }
        let of = |k: usize| -> &[usize] {
            instr
                .operands
                .get(k)
                .and_then(|o| out.get(o.index()))
                .map_or(&[], |v| v.as_slice())
        };
        let dims: Vec<usize> = match instr.opcode {
            Opcode::Broadcast => {
                let kept = instr.dimensions();
                (0..instr.shape.rank())
                    .filter(|&d| match kept.iter().position(|&k| k == d as i64) {
                        None => true,
                        Some(k) => of(0).contains(&k),
                    })
                    .collect()
            }
            Opcode::Reshape => {
                let input = comp.instr(instr.operands[0]).shape.dims().to_vec();
                reshape_constant_dims(&input, of(0), instr.shape.dims())
            }
            Opcode::Transpose => {
                let perm = instr.dimensions();
                let operand = of(0);
                (0..perm.len())
                    .filter(|&i| operand.contains(&(perm[i] as usize)))
                    .collect()
            }
            op if op.is_elementwise() && !instr.operands.is_empty() => {
                let rank = instr.shape.rank();
                let arrays: Vec<usize> = (0..instr.operands.len())
                    .filter(|&k| comp.instr(instr.operands[k]).shape.rank() == rank)
                    .collect();
                if arrays.is_empty() {
                    Vec::new()
                } else {
                    (0..rank)
                        .filter(|d| arrays.iter().all(|&k| of(k).contains(d)))
                        .collect()
                }
            }
            _ => Vec::new(),
        };
        out[id.index()] = dims;
    }
    out
}

/// The dims of a reshape's result (`output` dims) along which it is
/// constant, given the input's constant dims: output dim `o` (row-major
/// stride `S`, size `n`) leaves the digit of every other input dim `k`
/// (stride `T`, size `m`) unchanged when it lies wholly below it (`T` a
/// multiple of `S n`) or wholly above it (`S` a multiple of `T m`).
fn reshape_constant_dims(input: &[i64], constant: &[usize], output: &[i64]) -> Vec<usize> {
    let strides = |dims: &[i64]| {
        let mut s = vec![1i64; dims.len()];
        for d in (0..dims.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * dims[d + 1].max(1);
        }
        s
    };
    if constant.is_empty() {
        return Vec::new();
    }
    let (in_strides, out_strides) = (strides(input), strides(output));
    (0..output.len())
        .filter(|&o| {
            let (so, no) = (out_strides[o], output[o].max(1));
            (0..input.len())
                .filter(|k| !constant.contains(k) && input[*k] > 1)
                .all(|k| {
                    let (tk, mk) = (in_strides[k], input[k]);
                    tk % (so * no) == 0 || so % (tk * mk) == 0
                })
        })
        .collect()
}

fn annotate(e: SpmdError, instr: &HloInstruction) -> SpmdError {
    match e {
        SpmdError::Sharding {
            instruction,
            message,
        } if instruction.is_empty() => SpmdError::Sharding {
            instruction: instr.name.clone(),
            message,
        },
        SpmdError::Unsupported(m) => SpmdError::Unsupported(format!("%{}: {m}", instr.name)),
        SpmdError::Invalid(m) => SpmdError::Invalid(format!("%{}: {m}", instr.name)),
        other => other,
    }
}

/// Instructions the dead-code removal keeps even when nothing uses them.
fn has_side_effect(i: &HloInstruction) -> bool {
    match i.opcode {
        Opcode::CustomCall => i.bool_attr(AttrKey::CustomCallHasSideEffect) == Some(true),
        // Control flow (its bodies may have side effects), communication
        // with the host or other programs, tokens, the RNG state.
        Opcode::While
        | Opcode::Conditional
        | Opcode::Call
        | Opcode::Send
        | Opcode::SendDone
        | Opcode::Recv
        | Opcode::RecvDone
        | Opcode::Outfeed
        | Opcode::Infeed
        | Opcode::AfterAll
        | Opcode::AddDependency
        | Opcode::RngGetAndUpdateState => true,
        Opcode::Abs
        | Opcode::Acos
        | Opcode::Acosh
        | Opcode::Add
        | Opcode::AllGather
        | Opcode::AllGatherDone
        | Opcode::AllGatherStart
        | Opcode::AllReduce
        | Opcode::AllReduceDone
        | Opcode::AllReduceStart
        | Opcode::AllToAll
        | Opcode::And
        | Opcode::Asin
        | Opcode::Asinh
        | Opcode::AsyncDone
        | Opcode::AsyncStart
        | Opcode::AsyncUpdate
        | Opcode::Atan
        | Opcode::Atan2
        | Opcode::Atanh
        | Opcode::BatchNormGrad
        | Opcode::BatchNormInference
        | Opcode::BatchNormTraining
        | Opcode::Bitcast
        | Opcode::BitcastConvert
        | Opcode::Broadcast
        | Opcode::Cbrt
        | Opcode::Ceil
        | Opcode::Cholesky
        | Opcode::Clamp
        | Opcode::CollectiveBroadcast
        | Opcode::CollectivePermute
        | Opcode::CollectivePermuteDone
        | Opcode::CollectivePermuteStart
        | Opcode::CollectiveReduce
        | Opcode::Compare
        | Opcode::Complex
        | Opcode::Concatenate
        | Opcode::Constant
        | Opcode::Convert
        | Opcode::Convolution
        | Opcode::Copy
        | Opcode::CopyDone
        | Opcode::CopyStart
        | Opcode::Cos
        | Opcode::Cosh
        | Opcode::Clz
        | Opcode::Divide
        | Opcode::Domain
        | Opcode::Dot
        | Opcode::DynamicReshape
        | Opcode::DynamicSlice
        | Opcode::DynamicUpdateSlice
        | Opcode::Erf
        | Opcode::Exp
        | Opcode::Expm1
        | Opcode::Fft
        | Opcode::Floor
        | Opcode::Fusion
        | Opcode::Gather
        | Opcode::GetDimensionSize
        | Opcode::GetTupleElement
        | Opcode::Imag
        | Opcode::Iota
        | Opcode::IsFinite
        | Opcode::Log
        | Opcode::Log1p
        | Opcode::Logistic
        | Opcode::Map
        | Opcode::Maximum
        | Opcode::Minimum
        | Opcode::Mulhi
        | Opcode::Multiply
        | Opcode::Negate
        | Opcode::Not
        | Opcode::OptimizationBarrier
        | Opcode::Or
        | Opcode::Pad
        | Opcode::Parameter
        | Opcode::PartitionId
        | Opcode::PopulationCount
        | Opcode::Power
        | Opcode::RaggedAllToAll
        | Opcode::RaggedDot
        | Opcode::Real
        | Opcode::Reduce
        | Opcode::ReducePrecision
        | Opcode::ReduceScatter
        | Opcode::ReduceWindow
        | Opcode::Remainder
        | Opcode::ReplicaId
        | Opcode::Reshape
        | Opcode::Reverse
        | Opcode::Rng
        | Opcode::RngBitGenerator
        | Opcode::RoundNearestAfz
        | Opcode::RoundNearestEven
        | Opcode::Rsqrt
        | Opcode::Scan
        | Opcode::ScaledDot
        | Opcode::Scatter
        | Opcode::Select
        | Opcode::SelectAndScatter
        | Opcode::SetDimensionSize
        | Opcode::ShiftLeft
        | Opcode::ShiftRightArithmetic
        | Opcode::ShiftRightLogical
        | Opcode::Shuffle
        | Opcode::Sign
        | Opcode::Sin
        | Opcode::Sinh
        | Opcode::Slice
        | Opcode::Sort
        | Opcode::Sqrt
        | Opcode::StochasticConvert
        | Opcode::Subtract
        | Opcode::Tan
        | Opcode::Tanh
        | Opcode::TopK
        | Opcode::Transpose
        | Opcode::TriangularSolve
        | Opcode::Tuple
        | Opcode::Xor => false,
    }
}

/// Removes instructions nothing live uses (parameters and side effects
/// stay); returns how many were removed.
pub fn dce(comp: &mut HloComputation) -> usize {
    let n = comp.instructions.len();
    let mut live = vec![false; n];
    let mut stack: Vec<usize> = vec![comp.root.index()];
    for (i, instr) in comp.instructions.iter().enumerate() {
        if instr.opcode == Opcode::Parameter || has_side_effect(instr) {
            stack.push(i);
        }
    }
    while let Some(i) = stack.pop() {
        if i >= n || live[i] {
            continue;
        }
        live[i] = true;
        let instr = &comp.instructions[i];
        stack.extend(instr.operands.iter().map(|o| o.index()));
        stack.extend(instr.control_predecessors.iter().map(|o| o.index()));
    }
    comp.retain_instructions(&live)
}

impl<'a, 'c> Part<'a, 'c> {
    fn parameter(
        &mut self,
        instr: &HloInstruction,
        vs: ValueSharding,
    ) -> Result<PValue, SpmdError> {
        let mut c = instr.clone();
        c.name = self.b.ctx.orig_name(&instr.name);
        c.shape = local_shape(&instr.shape, &vs);
        c.sharding = None;
        let id = self.b.push(c);
        Ok(PValue {
            id,
            shape: Rc::new(instr.shape.clone()),
            vs,
        })
    }

    /// Dispatches one instruction.
    fn handle(&mut self, id: InstrId) -> Result<PValue, SpmdError> {
        let orig_comp = self.orig_comp;
        let instr = orig_comp.instr(id);
        let target = self.target(instr)?;
        self.in_partial_manual = crate::handlers::in_partial_manual_region(instr);
        let stays_partial = self.settle_partial_operands(instr)?;
        // Manual regions: the op already works on local data (an outfeed
        // of a manual value too: its result is a token). A
        // get-tuple-element takes its element's layout whatever it is.
        let manual_outfeed = instr.opcode == Opcode::Outfeed
            && self.operand(instr, 0).is_ok_and(|v| v.vs.is_manual());
        if (target.is_manual() || manual_outfeed)
            && !is_spmd_boundary(instr)
            && instr.opcode != Opcode::GetTupleElement
        {
            self.note(instr, "manual");
            return self.manual(instr, target);
        }
        // A constant-derived array is computed replicated, then sliced.
        let computed_in = match &target {
            ValueSharding::Grid(g) if self.constant_derived.get(id.index()) == Some(&true) => {
                ValueSharding::Grid(self.grids().replicate_dims(g, &g.tiled_dims()))
            }
            _ => target.clone(),
        };
        let v = dispatch::dispatch(self, instr, &computed_in)?;
        if let Some(dims) = self.broadcast_dims.get(id.index()).cloned() {
            self.set_broadcast_dims(v.id, &dims);
        }
        // Every handler's result ends in the instruction's own sharding.
        let v = self.reshard_result(&v, &target)?;
        if let Some(groups) = stays_partial {
            self.partial.insert(v.id, groups);
        }
        Ok(v)
    }

    fn manual(
        &mut self,
        instr: &HloInstruction,
        target: ValueSharding,
    ) -> Result<PValue, SpmdError> {
        let mut ops = Vec::new();
        for k in 0..instr.operands.len() {
            let v = self.operand(instr, k)?;
            let t = match &v.vs {
                ValueSharding::Grid(g) if g.is_replicated() => v.vs.clone(),
                ValueSharding::Tuple(_) => target_like_manual(&v.vs),
                _ => ValueSharding::Manual,
            };
            let v = self.reshard(&v, &t)?;
            ops.push(v.id);
        }
        let called = self.partition_calls_manual(instr)?;
        let mut c = instr.clone();
        c.name = self.b.ctx.orig_name(&instr.name);
        c.operands = ops;
        c.sharding = None;
        c.control_predecessors.clear();
        for (key, cid) in called {
            c.set_attr(key, AttrValue::Computation(cid));
        }
        let id = self.b.push(c);
        Ok(PValue {
            id,
            shape: Rc::new(instr.shape.clone()),
            vs: target,
        })
    }

    /// Control flow inside manual regions: bodies are manual too.
    fn partition_calls_manual(
        &mut self,
        instr: &HloInstruction,
    ) -> Result<Vec<(AttrKey, CompId)>, SpmdError> {
        let keys: &[AttrKey] = match instr.opcode {
            Opcode::While => &[AttrKey::Body, AttrKey::Condition],
            Opcode::Call => &[AttrKey::ToApply],
            Opcode::Conditional => &[AttrKey::TrueComputation, AttrKey::FalseComputation],
            // Every other op calls no computation, or one applied to
            // elements (reducers, comparators, combiners, map and fusion
            // bodies), which stays as it is.
            Opcode::Abs
            | Opcode::Acos
            | Opcode::Acosh
            | Opcode::Add
            | Opcode::AddDependency
            | Opcode::AfterAll
            | Opcode::AllGather
            | Opcode::AllGatherDone
            | Opcode::AllGatherStart
            | Opcode::AllReduce
            | Opcode::AllReduceDone
            | Opcode::AllReduceStart
            | Opcode::AllToAll
            | Opcode::And
            | Opcode::Asin
            | Opcode::Asinh
            | Opcode::AsyncDone
            | Opcode::AsyncStart
            | Opcode::AsyncUpdate
            | Opcode::Atan
            | Opcode::Atan2
            | Opcode::Atanh
            | Opcode::BatchNormGrad
            | Opcode::BatchNormInference
            | Opcode::BatchNormTraining
            | Opcode::Bitcast
            | Opcode::BitcastConvert
            | Opcode::Broadcast
            | Opcode::Cbrt
            | Opcode::Ceil
            | Opcode::Cholesky
            | Opcode::Clamp
            | Opcode::CollectiveBroadcast
            | Opcode::CollectivePermute
            | Opcode::CollectivePermuteDone
            | Opcode::CollectivePermuteStart
            | Opcode::CollectiveReduce
            | Opcode::Compare
            | Opcode::Complex
            | Opcode::Concatenate
            | Opcode::Constant
            | Opcode::Convert
            | Opcode::Convolution
            | Opcode::Copy
            | Opcode::CopyDone
            | Opcode::CopyStart
            | Opcode::Cos
            | Opcode::Cosh
            | Opcode::Clz
            | Opcode::CustomCall
            | Opcode::Divide
            | Opcode::Domain
            | Opcode::Dot
            | Opcode::DynamicReshape
            | Opcode::DynamicSlice
            | Opcode::DynamicUpdateSlice
            | Opcode::Erf
            | Opcode::Exp
            | Opcode::Expm1
            | Opcode::Fft
            | Opcode::Floor
            | Opcode::Fusion
            | Opcode::Gather
            | Opcode::GetDimensionSize
            | Opcode::GetTupleElement
            | Opcode::Imag
            | Opcode::Infeed
            | Opcode::Iota
            | Opcode::IsFinite
            | Opcode::Log
            | Opcode::Log1p
            | Opcode::Logistic
            | Opcode::Map
            | Opcode::Maximum
            | Opcode::Minimum
            | Opcode::Mulhi
            | Opcode::Multiply
            | Opcode::Negate
            | Opcode::Not
            | Opcode::OptimizationBarrier
            | Opcode::Or
            | Opcode::Outfeed
            | Opcode::Pad
            | Opcode::Parameter
            | Opcode::PartitionId
            | Opcode::PopulationCount
            | Opcode::Power
            | Opcode::RaggedAllToAll
            | Opcode::RaggedDot
            | Opcode::Real
            | Opcode::Recv
            | Opcode::RecvDone
            | Opcode::Reduce
            | Opcode::ReducePrecision
            | Opcode::ReduceScatter
            | Opcode::ReduceWindow
            | Opcode::Remainder
            | Opcode::ReplicaId
            | Opcode::Reshape
            | Opcode::Reverse
            | Opcode::Rng
            | Opcode::RngBitGenerator
            | Opcode::RngGetAndUpdateState
            | Opcode::RoundNearestAfz
            | Opcode::RoundNearestEven
            | Opcode::Rsqrt
            | Opcode::Scan
            | Opcode::ScaledDot
            | Opcode::Scatter
            | Opcode::Select
            | Opcode::SelectAndScatter
            | Opcode::Send
            | Opcode::SendDone
            | Opcode::SetDimensionSize
            | Opcode::ShiftLeft
            | Opcode::ShiftRightArithmetic
            | Opcode::ShiftRightLogical
            | Opcode::Shuffle
            | Opcode::Sign
            | Opcode::Sin
            | Opcode::Sinh
            | Opcode::Slice
            | Opcode::Sort
            | Opcode::Sqrt
            | Opcode::StochasticConvert
            | Opcode::Subtract
            | Opcode::Tan
            | Opcode::Tanh
            | Opcode::TopK
            | Opcode::Transpose
            | Opcode::TriangularSolve
            | Opcode::Tuple
            | Opcode::Xor => &[],
        };
        let mut out = Vec::new();
        for &k in keys {
            if let Some(cid) = instr.computation_attr(k) {
                let c = self.orig.comp(cid);
                let params: Vec<ValueSharding> = c
                    .parameters
                    .iter()
                    .map(|&p| {
                        target_like_manual(&ValueSharding::replicated_in(
                            &c.instr(p).shape,
                            self.n(),
                            self.grids(),
                        ))
                    })
                    .collect();
                let (nc, _) = self.partition_sub(cid, &params, None)?;
                out.push((k, nc));
            }
        }
        Ok(out)
    }

    /// Partitions a called computation with these parameter shardings
    /// (root resharded to `root` when given); returns the id to call.
    pub fn partition_sub(
        &mut self,
        cid: CompId,
        params: &[ValueSharding],
        root: Option<&ValueSharding>,
    ) -> Result<(CompId, ValueSharding), SpmdError> {
        let name = self.orig.comp(cid).name.clone();
        let key = (cid, params.to_vec(), root.cloned());
        if let Some(hit) = self.b.ctx.partitioned.get(&key) {
            return Ok(hit.clone());
        }
        let first = !self.b.ctx.replaced.contains_key(&cid);
        let new_name = if first {
            name.clone()
        } else {
            self.b.ctx.fresh(&format!("{name}.spmd"))
        };
        let (comp, rvs) =
            partition_computation(self.orig, &mut *self.b.ctx, cid, params, root, &new_name)?;
        let id = if first {
            self.b.ctx.replaced.insert(cid, comp);
            cid
        } else {
            let id = CompId((self.b.ctx.first_new_comp + self.b.ctx.new_comps.len()) as u32);
            self.b.ctx.new_comps.push(comp);
            id
        };
        self.b.ctx.partitioned.insert(key, (id, rvs.clone()));
        Ok((id, rvs))
    }
}

fn is_spmd_boundary(instr: &HloInstruction) -> bool {
    instr.opcode == Opcode::CustomCall
        && matches!(
            instr.ident_attr(AttrKey::CustomCallTarget),
            Some("SPMDFullToShardShape") | Some("SPMDShardToFullShape")
        )
}
