//! Called-computation signatures: each called computation must take and
//! return what its caller passes and expects.
//!
//! - Reducers (`reduce`, `reduce-window`, `scatter`, `all-reduce`,
//!   `reduce-scatter`): 2N scalar parameters; the root is a scalar (N = 1) or a
//!   tuple of N scalars; accumulator parameter i and root element i share an
//!   element type; init value i and parameter N+i have it up to
//!   floating-point precision (XLA's `VerifyReducerShape`).
//!   Collectives' reducers are checked for arity and scalar-ness only.
//! - `select-and-scatter`: `select` takes two scalars and returns `pred[]`,
//!   `scatter` takes two scalars and returns a scalar.
//! - `sort` comparators take two scalars per operand (of the operand's type,
//!   up to floating-point precision) and return `pred[]`; `map` functions take one scalar per operand and
//!   return a scalar.
//! - `while`: condition and body take one parameter of the loop's shape; the
//!   condition returns `pred[]`, the body the loop's shape.
//! - `conditional`: the index is `pred[]` (two branches) or `s32[]`; branch b
//!   takes one parameter compatible with operand b+1 and returns the
//!   conditional's shape.
//! - `call`, `fusion` and `async-start` (with `calls=`): parameters match the
//!   operands; the root matches the result (for async starts, element 1 of the
//!   `((operands), result, context...)` tuple).
//!
//! Invariant: runs only on instructions whose operands and callees passed the
//! structural checks; returns false when a callee is unusable (its own
//! errors are already reported), so shape checks skip the instruction.

use crate::structure::Status;
use crate::{compatible, is_scalar, param_shapes, root_shape, show, At, Report};
use xla_hlo_ir::{AttrKey, AttrValue, CompId, HloComputation, Opcode, PrimitiveType, Shape};

pub(crate) fn check(at: &At, status: &Status, r: &mut Report) -> bool {
    let instr = at.instr();
    if instr
        .called_computations()
        .iter()
        .any(|&c| !status.callee_ok(c))
    {
        return false;
    }
    let ops = at.operand_shapes();
    let n = ops.len();
    let sem = match (instr.opcode, instr.async_wrapped) {
        (Opcode::AsyncStart, Some(w)) => w,
        (Opcode::AsyncUpdate | Opcode::AsyncDone, Some(_)) => return true,
        (op, _) => op,
    };
    // The wrapped op's result: a sugared start (`call-start`) holds it as
    // element 1 of its `((operands), result, context...)` shape, whose form
    // the shape checks verify.
    let result = match (instr.opcode, &instr.shape) {
        (Opcode::AsyncStart, Shape::Tuple(elements)) if instr.async_wrapped.is_some() => {
            match elements.get(1) {
                Some(result) => result,
                None => return true,
            }
        }
        (Opcode::AsyncStart, _) if instr.async_wrapped.is_some() => return true,
        (_, shape) => shape,
    };
    let elem = |s: &Shape| s.element_type();
    match sem {
        Opcode::Reduce | Opcode::ReduceWindow => {
            let k = n / 2;
            let inits: Vec<Option<PrimitiveType>> = ops[k..].iter().map(|s| elem(s)).collect();
            let inputs: Vec<Option<PrimitiveType>> = ops[..k].iter().map(|s| elem(s)).collect();
            if let Some(c) = callee(at, AttrKey::ToApply) {
                reducer(at, r, "to_apply", c, k, Some(&inits), Some(&inputs));
            }
        }
        Opcode::Scatter => {
            let k = n.saturating_sub(1) / 2;
            let operands: Vec<Option<PrimitiveType>> = ops[..k].iter().map(|s| elem(s)).collect();
            let updates: Vec<Option<PrimitiveType>> = ops
                .get(k + 1..)
                .unwrap_or(&[])
                .iter()
                .map(|s| elem(s))
                .collect();
            if let Some(c) = callee(at, AttrKey::ToApply) {
                reducer(at, r, "to_apply", c, k, Some(&operands), Some(&updates));
            }
        }
        Opcode::AllReduce | Opcode::AllReduceStart | Opcode::ReduceScatter => {
            if let Some(c) = callee(at, AttrKey::ToApply) {
                reducer(at, r, "to_apply", c, 1, None, None);
            }
        }
        Opcode::SelectAndScatter => {
            if let Some(c) = callee(at, AttrKey::SelectComputation) {
                if scalar_params(at, r, "select", c, 2) {
                    expect_root(at, r, "select", c, &Shape::scalar(PrimitiveType::Pred));
                }
            }
            if let Some(c) = callee(at, AttrKey::ScatterComputation) {
                if scalar_params(at, r, "scatter", c, 2) {
                    root_scalar(at, r, "scatter", c);
                }
            }
        }
        Opcode::Sort => {
            if let Some(c) = callee(at, AttrKey::ToApply) {
                if scalar_params(at, r, "to_apply", c, 2 * n) {
                    if let Some(params) = param_shapes(c) {
                        for (i, p) in params.iter().enumerate() {
                            let want = ops.get(i / 2).and_then(|s| elem(s));
                            let got = elem(p);
                            let ok = match (want, got) {
                                (Some(w), Some(g)) => same_up_to_fp(w, g),
                                _ => true,
                            };
                            if !ok {
                                at.err(
                                    r,
                                    format!(
                                        "comparator %{} parameter {i} is {} but operand {} has element type {}",
                                        c.name,
                                        show(p),
                                        i / 2,
                                        want.map(|t| t.to_string()).unwrap_or_default()
                                    ),
                                );
                            }
                        }
                    }
                    expect_root(at, r, "to_apply", c, &Shape::scalar(PrimitiveType::Pred));
                }
            }
        }
        Opcode::Map => {
            if let Some(c) = callee(at, AttrKey::ToApply) {
                if scalar_params(at, r, "to_apply", c, n) {
                    if let Some(params) = param_shapes(c) {
                        for (i, (p, o)) in params.iter().zip(&ops).enumerate() {
                            if elem(p) != elem(o) {
                                at.err(
                                    r,
                                    format!(
                                        "map function %{} parameter {i} is {} but operand {i} is {}",
                                        c.name,
                                        show(p),
                                        show(o)
                                    ),
                                );
                            }
                        }
                    }
                    root_scalar(at, r, "to_apply", c);
                }
            }
        }
        Opcode::While => {
            let shape = &instr.shape;
            if let Some(c) = callee(at, AttrKey::Condition) {
                if params_match(at, r, "condition", c, &[shape]) {
                    expect_root(at, r, "condition", c, &Shape::scalar(PrimitiveType::Pred));
                }
            }
            if let Some(c) = callee(at, AttrKey::Body) {
                if params_match(at, r, "body", c, &[shape]) {
                    expect_root(at, r, "body", c, shape);
                }
            }
        }
        Opcode::Conditional => conditional(at, r, &ops),
        Opcode::Call => {
            if let Some(c) = callee(at, AttrKey::ToApply) {
                if params_match(at, r, "to_apply", c, &ops) {
                    expect_root(at, r, "to_apply", c, result);
                }
            }
        }
        Opcode::Fusion => {
            if let Some(c) = callee(at, AttrKey::Calls) {
                if params_match(at, r, "calls", c, &ops) {
                    expect_root(at, r, "calls", c, result);
                }
            }
        }
        Opcode::AsyncStart => {
            if let Some(c) = callee(at, AttrKey::Calls) {
                if params_match(at, r, "calls", c, &ops) {
                    match &instr.shape {
                        Shape::Tuple(e) if e.len() >= 2 => {
                            let operands = Shape::Tuple(ops.iter().map(|s| (*s).clone()).collect());
                            if !compatible(&e[0], &operands) {
                                at.err(
                                    r,
                                    format!(
                                        "async-start shape element 0 is {} but the operands are {}",
                                        show(&e[0]),
                                        show(&operands)
                                    ),
                                );
                            }
                            if let Some(root) = root_shape(c) {
                                if !compatible(&e[1], root) {
                                    at.err(
                                        r,
                                        format!(
                                            "async-start shape element 1 is {} but %{} returns {}",
                                            show(&e[1]),
                                            c.name,
                                            show(root)
                                        ),
                                    );
                                }
                            }
                        }
                        other => at.err(
                            r,
                            format!(
                                "async-start shape must be ((operands), result, context...), got {}",
                                show(other)
                            ),
                        ),
                    }
                }
            }
        }
        // No signature rule: the op calls no computation, or one whose
        // signature is not checked (scan's `to_apply`, custom-call's
        // `called_computations`, ...).
        Opcode::Abs
        | Opcode::Acos
        | Opcode::Acosh
        | Opcode::Add
        | Opcode::AddDependency
        | Opcode::AfterAll
        | Opcode::AllGather
        | Opcode::AllGatherDone
        | Opcode::AllGatherStart
        | Opcode::AllReduceDone
        | Opcode::AllToAll
        | Opcode::And
        | Opcode::Asin
        | Opcode::Asinh
        | Opcode::AsyncDone
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
        | Opcode::ReducePrecision
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
        | Opcode::Select
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
        | Opcode::Sqrt
        | Opcode::StochasticConvert
        | Opcode::Subtract
        | Opcode::Tan
        | Opcode::Tanh
        | Opcode::TopK
        | Opcode::Transpose
        | Opcode::TriangularSolve
        | Opcode::Tuple
        | Opcode::Xor => {}
    }
    true
}

fn callee<'a>(at: &At<'a>, key: AttrKey) -> Option<&'a HloComputation> {
    let id = at.instr().computation_attr(key)?;
    at.module.computations.get(id.index())
}

/// Checks the callee takes `n` scalar parameters.
fn scalar_params(at: &At, r: &mut Report, role: &str, c: &HloComputation, n: usize) -> bool {
    let Some(params) = param_shapes(c) else {
        return false;
    };
    if params.len() != n {
        at.err(
            r,
            format!(
                "{role} computation %{} takes {} parameter(s), expected {n}",
                c.name,
                params.len()
            ),
        );
        return false;
    }
    let mut ok = true;
    for (i, p) in params.iter().enumerate() {
        if !is_scalar(p) {
            at.err(
                r,
                format!(
                    "{role} computation %{} parameter {i} must be a scalar, got {}",
                    c.name,
                    show(p)
                ),
            );
            ok = false;
        }
    }
    ok
}

fn root_scalar(at: &At, r: &mut Report, role: &str, c: &HloComputation) {
    if let Some(root) = root_shape(c) {
        if !is_scalar(root) {
            at.err(
                r,
                format!(
                    "{role} computation %{} must return a scalar, got {}",
                    c.name,
                    show(root)
                ),
            );
        }
    }
}

fn expect_root(at: &At, r: &mut Report, role: &str, c: &HloComputation, want: &Shape) {
    if let Some(root) = root_shape(c) {
        if !compatible(root, want) {
            at.err(
                r,
                format!(
                    "{role} computation %{} returns {} but {} is expected",
                    c.name,
                    show(root),
                    show(want)
                ),
            );
        }
    }
}

/// Checks the callee's parameters are compatible with `args`, one to one.
fn params_match(at: &At, r: &mut Report, role: &str, c: &HloComputation, args: &[&Shape]) -> bool {
    let Some(params) = param_shapes(c) else {
        return false;
    };
    if params.len() != args.len() {
        at.err(
            r,
            format!(
                "{role} computation %{} takes {} parameter(s) but is given {}",
                c.name,
                params.len(),
                args.len()
            ),
        );
        return false;
    }
    let mut ok = true;
    for (i, (p, a)) in params.iter().zip(args).enumerate() {
        if !compatible(p, a) {
            at.err(
                r,
                format!(
                    "{role} computation %{} parameter {i} is {} but is given {}",
                    c.name,
                    show(p),
                    show(a)
                ),
            );
            ok = false;
        }
    }
    ok
}

fn same_up_to_fp(a: PrimitiveType, b: PrimitiveType) -> bool {
    a == b || (a.is_float() && b.is_float())
}

/// XLA's `VerifyReducerShape`. `accumulators`/`inputs`, when given, are the
/// element types of the init values (or scatter operands) and of the inputs.
fn reducer(
    at: &At,
    r: &mut Report,
    role: &str,
    c: &HloComputation,
    n: usize,
    accumulators: Option<&[Option<PrimitiveType>]>,
    inputs: Option<&[Option<PrimitiveType>]>,
) {
    if !scalar_params(at, r, role, c, 2 * n) {
        return;
    }
    let (Some(params), Some(root)) = (param_shapes(c), root_shape(c)) else {
        return;
    };
    let results: Vec<&Shape> = match root {
        Shape::Tuple(e) => e.iter().collect(),
        s => vec![s],
    };
    if results.len() != n || !results.iter().all(|s| is_scalar(s)) {
        let want = if n == 1 {
            "a scalar".to_string()
        } else {
            format!("a tuple of {n} scalars")
        };
        at.err(
            r,
            format!(
                "{role} computation %{} must return {want}, got {}",
                c.name,
                show(root)
            ),
        );
        return;
    }
    for i in 0..n {
        let acc = results[i].element_type();
        if params[i].element_type() != acc {
            at.err(
                r,
                format!(
                    "{role} computation %{} accumulator parameter {i} is {} but it returns {} there",
                    c.name,
                    show(params[i]),
                    show(results[i])
                ),
            );
        }
        if let Some(Some(want)) = accumulators.and_then(|a| a.get(i)) {
            if !acc.is_some_and(|acc| same_up_to_fp(acc, *want)) {
                at.err(
                    r,
                    format!(
                        "{role} computation %{} accumulates {} but init value {i} has element type {want}",
                        c.name,
                        show(results[i])
                    ),
                );
            }
        }
        if let (Some(Some(want)), Some(got)) = (
            inputs.and_then(|a| a.get(i)),
            params.get(n + i).and_then(|p| p.element_type()),
        ) {
            if !same_up_to_fp(*want, got) {
                at.err(
                    r,
                    format!(
                        "{role} computation %{} parameter {} is {} but input {i} has element type {want}",
                        c.name,
                        n + i,
                        show(params[n + i])
                    ),
                );
            }
        }
    }
}

fn conditional(at: &At, r: &mut Report, ops: &[&Shape]) {
    let instr = at.instr();
    let (branches, indexed): (Vec<CompId>, bool) = match instr.attr(AttrKey::BranchComputations) {
        Some(AttrValue::Computations(cs)) => (cs.clone(), true),
        _ => {
            let t = instr.computation_attr(AttrKey::TrueComputation);
            let f = instr.computation_attr(AttrKey::FalseComputation);
            match (t, f) {
                (Some(t), Some(f)) => (vec![t, f], false),
                _ => return,
            }
        }
    };
    if branches.is_empty() {
        at.err(r, "conditional has no branch computations");
        return;
    }
    if ops.len() != branches.len() + 1 {
        at.err(
            r,
            format!(
                "conditional has {} branch(es) so takes {} operands, but has {}",
                branches.len(),
                branches.len() + 1,
                ops.len()
            ),
        );
        return;
    }
    let index = ops[0];
    let pred = Shape::scalar(PrimitiveType::Pred);
    let s32 = Shape::scalar(PrimitiveType::S32);
    let index_ok = if indexed {
        compatible(index, &s32) || (compatible(index, &pred) && branches.len() == 2)
    } else {
        compatible(index, &pred)
    };
    if !index_ok {
        let want = if indexed { "s32[]" } else { "pred[]" };
        at.err(
            r,
            format!(
                "conditional branch index must be {want}, got {}",
                show(index)
            ),
        );
    }
    for (b, id) in branches.iter().enumerate() {
        let Some(c) = at.module.computations.get(id.index()) else {
            continue;
        };
        let role = format!("branch {b}");
        if params_match(at, r, &role, c, &ops[b + 1..b + 2]) {
            expect_root(at, r, &role, c, &instr.shape);
        }
    }
}
