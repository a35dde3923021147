//! What propagation needs to know per opcode, beside its rules (those are
//! in `infer`): named sets of opcodes, as pattern macros, for the
//! exhaustive `match`es on `Opcode` in this crate, and the per-opcode facts
//! (side effects, the level an op propagates from, the callees partitioned
//! with it). Every opcode the rules treat alike in every such match belongs
//! to one set here; every other opcode is listed by name in each match, so
//! adding an opcode to `xla_hlo_ir::Opcode` fails to compile until each
//! match has decided what propagation does with it.
//!
//! Invariants: `elementwise_opcodes!()` is exactly the opcodes for which
//! `Opcode::is_elementwise` holds (a test checks it); the two sets without
//! rules are disjoint from it and from each other.

use crate::level::{ALL_OPS_LEVEL, BROADCAST_FROM_USERS_LEVEL, PASS_THROUGH_LEVEL};
use xla_hlo_ir::{AttrKey, CompId, HloInstruction, Opcode};

/// The elementwise opcodes (`Opcode::is_elementwise`: unary, binary and
/// ternary categories). `map` and `rng`, which XLA also counts as
/// elementwise, are listed by name where it matters.
macro_rules! elementwise_opcodes {
    () => {
        ::xla_hlo_ir::Opcode::Abs
            | ::xla_hlo_ir::Opcode::Acos
            | ::xla_hlo_ir::Opcode::Acosh
            | ::xla_hlo_ir::Opcode::Add
            | ::xla_hlo_ir::Opcode::And
            | ::xla_hlo_ir::Opcode::Asin
            | ::xla_hlo_ir::Opcode::Asinh
            | ::xla_hlo_ir::Opcode::Atan
            | ::xla_hlo_ir::Opcode::Atan2
            | ::xla_hlo_ir::Opcode::Atanh
            | ::xla_hlo_ir::Opcode::BitcastConvert
            | ::xla_hlo_ir::Opcode::Cbrt
            | ::xla_hlo_ir::Opcode::Ceil
            | ::xla_hlo_ir::Opcode::Clamp
            | ::xla_hlo_ir::Opcode::Clz
            | ::xla_hlo_ir::Opcode::Compare
            | ::xla_hlo_ir::Opcode::Complex
            | ::xla_hlo_ir::Opcode::Convert
            | ::xla_hlo_ir::Opcode::Copy
            | ::xla_hlo_ir::Opcode::Cos
            | ::xla_hlo_ir::Opcode::Cosh
            | ::xla_hlo_ir::Opcode::Divide
            | ::xla_hlo_ir::Opcode::Erf
            | ::xla_hlo_ir::Opcode::Exp
            | ::xla_hlo_ir::Opcode::Expm1
            | ::xla_hlo_ir::Opcode::Floor
            | ::xla_hlo_ir::Opcode::Imag
            | ::xla_hlo_ir::Opcode::IsFinite
            | ::xla_hlo_ir::Opcode::Log
            | ::xla_hlo_ir::Opcode::Log1p
            | ::xla_hlo_ir::Opcode::Logistic
            | ::xla_hlo_ir::Opcode::Maximum
            | ::xla_hlo_ir::Opcode::Minimum
            | ::xla_hlo_ir::Opcode::Mulhi
            | ::xla_hlo_ir::Opcode::Multiply
            | ::xla_hlo_ir::Opcode::Negate
            | ::xla_hlo_ir::Opcode::Not
            | ::xla_hlo_ir::Opcode::Or
            | ::xla_hlo_ir::Opcode::PopulationCount
            | ::xla_hlo_ir::Opcode::Power
            | ::xla_hlo_ir::Opcode::Real
            | ::xla_hlo_ir::Opcode::ReducePrecision
            | ::xla_hlo_ir::Opcode::Remainder
            | ::xla_hlo_ir::Opcode::RoundNearestAfz
            | ::xla_hlo_ir::Opcode::RoundNearestEven
            | ::xla_hlo_ir::Opcode::Rsqrt
            | ::xla_hlo_ir::Opcode::Select
            | ::xla_hlo_ir::Opcode::ShiftLeft
            | ::xla_hlo_ir::Opcode::ShiftRightArithmetic
            | ::xla_hlo_ir::Opcode::ShiftRightLogical
            | ::xla_hlo_ir::Opcode::Sign
            | ::xla_hlo_ir::Opcode::Sin
            | ::xla_hlo_ir::Opcode::Sinh
            | ::xla_hlo_ir::Opcode::Sqrt
            | ::xla_hlo_ir::Opcode::StochasticConvert
            | ::xla_hlo_ir::Opcode::Subtract
            | ::xla_hlo_ir::Opcode::Tan
            | ::xla_hlo_ir::Opcode::Tanh
            | ::xla_hlo_ir::Opcode::Xor
    };
}

/// Side-effect-free opcodes propagation has no rule for: they do not
/// support spatial partitioning, have no representative operand, no
/// forward rule, the default (same-shape) backward rule, propagate from
/// `ALL_OPS_LEVEL`, and call no partitioned computation. (The async and
/// split collective forms appear only after partitioning; the rest XLA's
/// propagation leaves to their users and operands as well.)
macro_rules! effect_free_opcodes_without_rules {
    () => {
        // Async and split collective forms.
        ::xla_hlo_ir::Opcode::AllGatherDone
            | ::xla_hlo_ir::Opcode::AllGatherStart
            | ::xla_hlo_ir::Opcode::AllReduceDone
            | ::xla_hlo_ir::Opcode::AllReduceStart
            | ::xla_hlo_ir::Opcode::AsyncDone
            | ::xla_hlo_ir::Opcode::AsyncStart
            | ::xla_hlo_ir::Opcode::AsyncUpdate
            | ::xla_hlo_ir::Opcode::CollectivePermuteDone
            | ::xla_hlo_ir::Opcode::CollectivePermuteStart
            | ::xla_hlo_ir::Opcode::CopyDone
            | ::xla_hlo_ir::Opcode::CopyStart
            // Linear algebra without a propagation rule.
            | ::xla_hlo_ir::Opcode::BatchNormGrad
            | ::xla_hlo_ir::Opcode::BatchNormInference
            | ::xla_hlo_ir::Opcode::BatchNormTraining
            | ::xla_hlo_ir::Opcode::Cholesky
            | ::xla_hlo_ir::Opcode::Fft
            | ::xla_hlo_ir::Opcode::RaggedDot
            | ::xla_hlo_ir::Opcode::ScaledDot
            | ::xla_hlo_ir::Opcode::TriangularSolve
            // Everything else.
            | ::xla_hlo_ir::Opcode::Bitcast
            | ::xla_hlo_ir::Opcode::CollectiveReduce
            | ::xla_hlo_ir::Opcode::Domain
            | ::xla_hlo_ir::Opcode::DynamicReshape
            | ::xla_hlo_ir::Opcode::Fusion
            | ::xla_hlo_ir::Opcode::GetDimensionSize
            | ::xla_hlo_ir::Opcode::PartitionId
            | ::xla_hlo_ir::Opcode::ReplicaId
            | ::xla_hlo_ir::Opcode::Scan
            | ::xla_hlo_ir::Opcode::SetDimensionSize
            | ::xla_hlo_ir::Opcode::Shuffle
    };
}

/// Side-effecting opcodes propagation has no rule for (otherwise as
/// `effect_free_opcodes_without_rules!()`): tokens, host transfers and the
/// rng state.
macro_rules! effectful_opcodes_without_rules {
    () => {
        ::xla_hlo_ir::Opcode::AddDependency
            | ::xla_hlo_ir::Opcode::AfterAll
            | ::xla_hlo_ir::Opcode::Recv
            | ::xla_hlo_ir::Opcode::RecvDone
            | ::xla_hlo_ir::Opcode::RngGetAndUpdateState
            | ::xla_hlo_ir::Opcode::Send
            | ::xla_hlo_ir::Opcode::SendDone
    };
}

/// Every opcode propagation has no rule for.
macro_rules! opcodes_without_rules {
    () => {
        $crate::opcodes::effect_free_opcodes_without_rules!()
            | $crate::opcodes::effectful_opcodes_without_rules!()
    };
}

pub(crate) use effect_free_opcodes_without_rules;
pub(crate) use effectful_opcodes_without_rules;
pub(crate) use elementwise_opcodes;
pub(crate) use opcodes_without_rules;

/// The lowest aggressiveness level at which sharding passes through an
/// instruction (XLA's `CanPropagateThroughAtAggressiveLevel`).
pub(crate) fn min_propagation_level(opcode: Opcode, is_sharding_custom_call: bool) -> i64 {
    match opcode {
        elementwise_opcodes!()
        | Opcode::Map
        | Opcode::Rng
        | Opcode::Call
        | Opcode::Concatenate
        | Opcode::DynamicSlice
        | Opcode::DynamicUpdateSlice
        | Opcode::GetTupleElement
        | Opcode::OptimizationBarrier
        | Opcode::Reshape
        | Opcode::Transpose
        | Opcode::Tuple
        | Opcode::While => PASS_THROUGH_LEVEL,
        Opcode::CustomCall if is_sharding_custom_call => PASS_THROUGH_LEVEL,
        Opcode::Broadcast => BROADCAST_FROM_USERS_LEVEL,
        Opcode::AllGather
        | Opcode::AllReduce
        | Opcode::AllToAll
        | Opcode::CollectiveBroadcast
        | Opcode::CollectivePermute
        | Opcode::Conditional
        | Opcode::Constant
        | Opcode::Convolution
        | Opcode::CustomCall
        | Opcode::Dot
        | Opcode::Gather
        | Opcode::Infeed
        | Opcode::Iota
        | Opcode::Outfeed
        | Opcode::Pad
        | Opcode::Parameter
        | Opcode::RaggedAllToAll
        | Opcode::Reduce
        | Opcode::ReduceScatter
        | Opcode::ReduceWindow
        | Opcode::Reverse
        | Opcode::RngBitGenerator
        | Opcode::Scatter
        | Opcode::SelectAndScatter
        | Opcode::Slice
        | Opcode::Sort
        | Opcode::TopK => ALL_OPS_LEVEL,
        opcodes_without_rules!() => ALL_OPS_LEVEL,
    }
}

/// XLA's `HasSideEffect` (approximation sufficient for propagation).
pub(crate) fn has_side_effect(instr: &HloInstruction) -> bool {
    match instr.opcode {
        effectful_opcodes_without_rules!() | Opcode::Infeed | Opcode::Outfeed | Opcode::Rng => true,
        Opcode::CustomCall => instr
            .bool_attr(AttrKey::CustomCallHasSideEffect)
            .unwrap_or(false),
        elementwise_opcodes!()
        | effect_free_opcodes_without_rules!()
        | Opcode::AllGather
        | Opcode::AllReduce
        | Opcode::AllToAll
        | Opcode::Broadcast
        | Opcode::Call
        | Opcode::CollectiveBroadcast
        | Opcode::CollectivePermute
        | Opcode::Concatenate
        | Opcode::Conditional
        | Opcode::Constant
        | Opcode::Convolution
        | Opcode::Dot
        | Opcode::DynamicSlice
        | Opcode::DynamicUpdateSlice
        | Opcode::Gather
        | Opcode::GetTupleElement
        | Opcode::Iota
        | Opcode::Map
        | Opcode::OptimizationBarrier
        | Opcode::Pad
        | Opcode::Parameter
        | Opcode::RaggedAllToAll
        | Opcode::Reduce
        | Opcode::ReduceScatter
        | Opcode::ReduceWindow
        | Opcode::Reshape
        | Opcode::Reverse
        | Opcode::RngBitGenerator
        | Opcode::Scatter
        | Opcode::SelectAndScatter
        | Opcode::Slice
        | Opcode::Sort
        | Opcode::TopK
        | Opcode::Transpose
        | Opcode::Tuple
        | Opcode::While => false,
    }
}

/// The computations `instr` calls that the partitioner partitions with
/// it: a while's body and condition, a conditional's branches, a call's
/// callee. Reducers, comparators, fusions and async bodies are not.
pub(crate) fn partitioned_callees(instr: &HloInstruction) -> Vec<CompId> {
    match instr.opcode {
        Opcode::While => [AttrKey::Body, AttrKey::Condition]
            .iter()
            .filter_map(|&key| instr.computation_attr(key))
            .collect(),
        Opcode::Conditional | Opcode::Call => instr.called_computations(),
        elementwise_opcodes!()
        | opcodes_without_rules!()
        | Opcode::AllGather
        | Opcode::AllReduce
        | Opcode::AllToAll
        | Opcode::Broadcast
        | Opcode::CollectiveBroadcast
        | Opcode::CollectivePermute
        | Opcode::Concatenate
        | Opcode::Constant
        | Opcode::Convolution
        | Opcode::CustomCall
        | Opcode::Dot
        | Opcode::DynamicSlice
        | Opcode::DynamicUpdateSlice
        | Opcode::Gather
        | Opcode::GetTupleElement
        | Opcode::Infeed
        | Opcode::Iota
        | Opcode::Map
        | Opcode::OptimizationBarrier
        | Opcode::Outfeed
        | Opcode::Pad
        | Opcode::Parameter
        | Opcode::RaggedAllToAll
        | Opcode::Reduce
        | Opcode::ReduceScatter
        | Opcode::ReduceWindow
        | Opcode::Reshape
        | Opcode::Reverse
        | Opcode::Rng
        | Opcode::RngBitGenerator
        | Opcode::Scatter
        | Opcode::SelectAndScatter
        | Opcode::Slice
        | Opcode::Sort
        | Opcode::TopK
        | Opcode::Transpose
        | Opcode::Tuple => vec![],
    }
}

#[cfg(test)]
mod tests {
    use xla_hlo_ir::Opcode;

    #[test]
    fn elementwise_set_is_the_ir_category() {
        for &opcode in Opcode::ALL {
            assert_eq!(
                matches!(opcode, elementwise_opcodes!()),
                opcode.is_elementwise(),
                "{opcode}"
            );
        }
    }

    #[test]
    fn sets_without_rules_are_disjoint() {
        for &opcode in Opcode::ALL {
            let memberships = [
                matches!(opcode, elementwise_opcodes!()),
                matches!(opcode, effect_free_opcodes_without_rules!()),
                matches!(opcode, effectful_opcodes_without_rules!()),
            ];
            assert!(memberships.iter().filter(|&&m| m).count() <= 1, "{opcode}");
        }
    }
}
