//! Per-instruction form: operand counts and required attributes.
//!
//! Operand counts come from `Opcode::arity()`; variadic opcodes get the
//! rules XLA's `CreateInstruction` and `ShapeInference` apply (`reduce` takes
//! N inputs and N inits, `scatter` N operands, indices and N updates, ...).
//! Required attributes are those XLA's parser marks `required=true`
//! (inventory §1.6). A sugared async start (`reduce-scatter-start`) is held to
//! the wrapped op's rules, since it carries the wrapped op's operands and
//! attributes; sugared updates and dones carry none.
//!
//! Invariant: an instruction that passes here has the operand count and the
//! attributes (of the right value kind) that shape inference reads.

use crate::{is_scalar, At, Report};
use xla_hlo_ir::{Arity, AttrKey, AttrValue, HloInstruction, Opcode, PrimitiveType, ValueKind};

/// The opcode whose operand and attribute rules apply, `None` for sugared
/// async updates and dones (one operand, no attributes of their own).
fn semantic_opcode(instr: &HloInstruction) -> Option<Opcode> {
    match (instr.opcode, instr.async_wrapped) {
        (Opcode::AsyncStart, Some(w)) => Some(w),
        (Opcode::AsyncUpdate | Opcode::AsyncDone, Some(_)) => None,
        (op, _) => Some(op),
    }
}

/// Attribute present with the value kind its key calls for.
fn present(instr: &HloInstruction, key: AttrKey) -> bool {
    let Some(v) = instr.attr(key) else {
        return false;
    };
    match key.kind() {
        ValueKind::Computation => matches!(v, AttrValue::Computation(_)),
        ValueKind::Computations => matches!(v, AttrValue::Computations(_)),
        ValueKind::Int => matches!(v, AttrValue::Int(_)),
        ValueKind::Ints => matches!(v, AttrValue::Ints(_)),
        ValueKind::IntsOrLists => matches!(v, AttrValue::Ints(_) | AttrValue::IntLists(_)),
        ValueKind::IntLists => matches!(v, AttrValue::IntLists(_)),
        ValueKind::Slice => matches!(v, AttrValue::Slice(_)),
        ValueKind::Padding => matches!(v, AttrValue::Padding(_)),
        ValueKind::Window => matches!(v, AttrValue::Window(_)),
        ValueKind::DimLabels => matches!(v, AttrValue::DimLabels(_)),
        ValueKind::ReplicaGroups => matches!(v, AttrValue::ReplicaGroups(_)),
        _ => true,
    }
}

fn required(op: Opcode) -> &'static [AttrKey] {
    use AttrKey as K;
    use Opcode as O;
    match op {
        O::Iota => &[K::IotaDimension],
        O::Compare => &[K::Direction],
        O::Transpose | O::Reverse | O::Concatenate => &[K::Dimensions],
        O::Slice => &[K::Slice],
        O::DynamicSlice => &[K::DynamicSliceSizes],
        O::Pad => &[K::Padding],
        O::Reduce => &[K::Dimensions, K::ToApply],
        O::ReduceWindow => &[K::ToApply],
        O::SelectAndScatter => &[K::SelectComputation, K::ScatterComputation],
        O::Map => &[K::ToApply],
        O::Sort => &[K::Dimensions, K::ToApply],
        O::Scan => &[K::Dimensions, K::NumCarries, K::ToApply],
        O::TopK => &[K::K],
        O::Convolution => &[K::DimLabels],
        O::Gather => &[
            K::OffsetDims,
            K::CollapsedSliceDims,
            K::StartIndexMap,
            K::IndexVectorDim,
            K::SliceSizes,
        ],
        O::Scatter => &[
            K::UpdateWindowDims,
            K::InsertedWindowDims,
            K::ScatterDimsToOperandDims,
            K::IndexVectorDim,
            K::ToApply,
        ],
        O::Fft => &[K::FftType, K::FftLength],
        O::BatchNormGrad | O::BatchNormInference | O::BatchNormTraining => {
            &[K::Epsilon, K::FeatureIndex]
        }
        O::Rng => &[K::Distribution],
        O::RngBitGenerator => &[K::Algorithm],
        O::RngGetAndUpdateState => &[K::Delta],
        O::ReducePrecision => &[K::ExponentBits, K::MantissaBits],
        O::GetTupleElement => &[K::Index],
        O::While => &[K::Condition, K::Body],
        O::Call => &[K::ToApply],
        O::Fusion => &[K::FusionKind, K::Calls],
        O::CustomCall => &[K::CustomCallTarget],
        O::GetDimensionSize | O::SetDimensionSize => &[K::Dimensions],
        O::Domain => &[K::Domain],
        O::AllReduce | O::AllReduceStart => &[K::ToApply],
        O::ReduceScatter => &[K::ToApply, K::Dimensions],
        O::AllGather | O::AllGatherStart => &[K::Dimensions],
        O::CollectivePermute | O::CollectivePermuteStart => &[K::SourceTargetPairs],
        // No attribute required, or checked in `check` (broadcast's
        // `dimensions`, conditional's branches, async-start's `calls`,
        // constant's literal).
        O::Abs
        | O::Acos
        | O::Acosh
        | O::Add
        | O::AddDependency
        | O::AfterAll
        | O::AllGatherDone
        | O::AllReduceDone
        | O::AllToAll
        | O::And
        | O::Asin
        | O::Asinh
        | O::AsyncDone
        | O::AsyncStart
        | O::AsyncUpdate
        | O::Atan
        | O::Atan2
        | O::Atanh
        | O::Bitcast
        | O::BitcastConvert
        | O::Broadcast
        | O::Cbrt
        | O::Ceil
        | O::Cholesky
        | O::Clamp
        | O::CollectiveBroadcast
        | O::CollectivePermuteDone
        | O::CollectiveReduce
        | O::Complex
        | O::Conditional
        | O::Constant
        | O::Convert
        | O::Copy
        | O::CopyDone
        | O::CopyStart
        | O::Cos
        | O::Cosh
        | O::Clz
        | O::Divide
        | O::Dot
        | O::DynamicReshape
        | O::DynamicUpdateSlice
        | O::Erf
        | O::Exp
        | O::Expm1
        | O::Floor
        | O::Imag
        | O::Infeed
        | O::IsFinite
        | O::Log
        | O::Log1p
        | O::Logistic
        | O::Maximum
        | O::Minimum
        | O::Mulhi
        | O::Multiply
        | O::Negate
        | O::Not
        | O::OptimizationBarrier
        | O::Or
        | O::Outfeed
        | O::Parameter
        | O::PartitionId
        | O::PopulationCount
        | O::Power
        | O::RaggedAllToAll
        | O::RaggedDot
        | O::Real
        | O::Recv
        | O::RecvDone
        | O::Remainder
        | O::ReplicaId
        | O::Reshape
        | O::RoundNearestAfz
        | O::RoundNearestEven
        | O::Rsqrt
        | O::ScaledDot
        | O::Select
        | O::Send
        | O::SendDone
        | O::ShiftLeft
        | O::ShiftRightArithmetic
        | O::ShiftRightLogical
        | O::Shuffle
        | O::Sign
        | O::Sin
        | O::Sinh
        | O::Sqrt
        | O::StochasticConvert
        | O::Subtract
        | O::Tan
        | O::Tanh
        | O::TriangularSolve
        | O::Tuple
        | O::Xor => &[],
    }
}

/// Checks operand count and required attributes; true when both are fine.
pub(crate) fn check(at: &At, operands_ok: bool, r: &mut Report) -> bool {
    let instr = at.instr();
    let mut ok = true;
    let n = instr.operands.len();
    let sem = semantic_opcode(instr);

    // Operand count.
    let arity_op = sem.unwrap_or(instr.opcode);
    let count_error = match arity_op.arity() {
        Arity::Fixed(k) if n != k => Some(format!("takes {k} operand(s)")),
        Arity::Fixed(_) => None,
        Arity::Variadic => variadic_rule(arity_op, n),
    };
    if let Some(expect) = count_error {
        let what = if sem != Some(instr.opcode) {
            format!("{} (as {arity_op})", instr.opcode)
        } else {
            instr.opcode.to_string()
        };
        at.err(r, format!("{what} {expect}, but has {n}"));
        ok = false;
    }

    let Some(sem) = sem else {
        return ok;
    };
    let mut missing: Vec<&str> = required(sem)
        .iter()
        .filter(|&&k| !present(instr, k))
        .map(|k| k.name())
        .collect();
    match sem {
        Opcode::Broadcast => {
            // `dimensions` may be left out only when the operand is a scalar.
            let scalar_operand = operands_ok && at.operand_shape(0).is_some_and(is_scalar);
            if !present(instr, AttrKey::Dimensions) && !scalar_operand {
                missing.push("dimensions");
            }
        }
        Opcode::Conditional => {
            let indexed = present(instr, AttrKey::BranchComputations);
            let binary = present(instr, AttrKey::TrueComputation)
                && present(instr, AttrKey::FalseComputation);
            // As XLA's parser: a pred[] index takes true/false computations,
            // any other index the list of branches, and not the other form.
            let index = operands_ok.then(|| at.operand_shape(0)).flatten();
            let pred_index = index
                .and_then(|s| s.as_array())
                .and_then(|a| match a.element_type {
                    PrimitiveType::Pred => Some(true),
                    t if t.is_integer() => Some(false),
                    // Any other index is the signature check's error.
                    _ => None,
                });
            match pred_index {
                Some(true) if instr.has_attr(AttrKey::BranchComputations) => {
                    at.err(r, "a conditional on a pred[] index takes true_computation and false_computation, not branch_computations");
                    ok = false;
                }
                Some(false)
                    if instr.has_attr(AttrKey::TrueComputation)
                        || instr.has_attr(AttrKey::FalseComputation) =>
                {
                    at.err(r, "a conditional on an integer index takes branch_computations, not true_computation and false_computation");
                    ok = false;
                }
                _ => {}
            }
            if !indexed && !binary {
                missing.push("branch_computations (or true_computation and false_computation)");
            }
        }
        Opcode::AsyncStart if !present(instr, AttrKey::Calls) => missing.push("calls"),
        Opcode::Constant if instr.literal.is_none() => {
            at.err(r, "constant has no literal");
            ok = false;
        }
        _ => {}
    }
    if !missing.is_empty() {
        at.err(
            r,
            format!("{} requires attribute(s): {}", sem, missing.join(", ")),
        );
        ok = false;
    }
    ok
}

/// The operand-count rule of a variadic opcode, as an expectation when `n` breaks it.
fn variadic_rule(op: Opcode, n: usize) -> Option<String> {
    use Opcode as O;
    let (good, expect) = match op {
        O::Reduce | O::ReduceWindow => (
            n >= 2 && n & 1 == 0,
            "takes N inputs and N init values (an even number, at least 2)",
        ),
        O::Scatter => (
            n >= 3 && n % 2 == 1,
            "takes N operands, the indices and N updates (an odd number, at least 3)",
        ),
        O::DynamicSlice => (n >= 2, "takes an operand and start indices"),
        O::DynamicUpdateSlice => (n >= 3, "takes an operand, an update and start indices"),
        O::Convolution => (n >= 2, "takes at least 2 operands"),
        O::Sort
        | O::Map
        | O::Concatenate
        | O::Conditional
        | O::AllReduce
        | O::AllReduceStart
        | O::AllGather
        | O::AllGatherStart
        | O::ReduceScatter
        | O::AllToAll
        | O::CollectivePermute
        | O::CollectivePermuteStart
        | O::CollectiveBroadcast
        | O::CollectiveReduce
        | O::DynamicReshape => (n >= 1, "takes at least 1 operand"),
        // Variadic with any operand count.
        O::AfterAll
        | O::AsyncStart
        | O::AsyncUpdate
        | O::Call
        | O::CustomCall
        | O::Fusion
        | O::Rng
        | O::Scan
        | O::Tuple => (true, ""),
        // Fixed arity: checked against `Opcode::arity`, never asked here.
        O::Abs
        | O::Acos
        | O::Acosh
        | O::Add
        | O::AddDependency
        | O::AllGatherDone
        | O::AllReduceDone
        | O::And
        | O::Asin
        | O::Asinh
        | O::AsyncDone
        | O::Atan
        | O::Atan2
        | O::Atanh
        | O::BatchNormGrad
        | O::BatchNormInference
        | O::BatchNormTraining
        | O::Bitcast
        | O::BitcastConvert
        | O::Broadcast
        | O::Cbrt
        | O::Ceil
        | O::Cholesky
        | O::Clamp
        | O::CollectivePermuteDone
        | O::Compare
        | O::Complex
        | O::Constant
        | O::Convert
        | O::Copy
        | O::CopyDone
        | O::CopyStart
        | O::Cos
        | O::Cosh
        | O::Clz
        | O::Divide
        | O::Domain
        | O::Dot
        | O::Erf
        | O::Exp
        | O::Expm1
        | O::Fft
        | O::Floor
        | O::Gather
        | O::GetDimensionSize
        | O::GetTupleElement
        | O::Imag
        | O::Infeed
        | O::Iota
        | O::IsFinite
        | O::Log
        | O::Log1p
        | O::Logistic
        | O::Maximum
        | O::Minimum
        | O::Mulhi
        | O::Multiply
        | O::Negate
        | O::Not
        | O::OptimizationBarrier
        | O::Or
        | O::Outfeed
        | O::Pad
        | O::Parameter
        | O::PartitionId
        | O::PopulationCount
        | O::Power
        | O::RaggedAllToAll
        | O::RaggedDot
        | O::Real
        | O::Recv
        | O::RecvDone
        | O::ReducePrecision
        | O::Remainder
        | O::ReplicaId
        | O::Reshape
        | O::Reverse
        | O::RngBitGenerator
        | O::RngGetAndUpdateState
        | O::RoundNearestAfz
        | O::RoundNearestEven
        | O::Rsqrt
        | O::ScaledDot
        | O::Select
        | O::SelectAndScatter
        | O::Send
        | O::SendDone
        | O::SetDimensionSize
        | O::ShiftLeft
        | O::ShiftRightArithmetic
        | O::ShiftRightLogical
        | O::Shuffle
        | O::Sign
        | O::Sin
        | O::Sinh
        | O::Slice
        | O::Sqrt
        | O::StochasticConvert
        | O::Subtract
        | O::Tan
        | O::Tanh
        | O::TopK
        | O::Transpose
        | O::TriangularSolve
        | O::While
        | O::Xor => (true, ""),
    };
    if good {
        None
    } else {
        Some(expect.to_string())
    }
}
