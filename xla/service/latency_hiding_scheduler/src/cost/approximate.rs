//! XLA's `ApproximateLatencyEstimator` in its own units ("cycles", one per
//! microsecond: `CyclesPerMicrosecond() == 1`).
//!
//! * Node cost: bookkeeping ops 0 (as `GpuLatencyEstimator`), loop and
//!   input fusions `kMediumCost = 1000`, output fusions and convolutions
//!   `kHighCost = 5000`, everything else `kLowCost = 1`. One deviation, for
//!   the unfused modules this project schedules: a bare `dot` (which XLA
//!   would have put in an output fusion or a cuBLAS call) costs
//!   `kHighCost` too.
//! * Latency of an async pair (any collective, copy or wrapped op):
//!   `kHighLatency = 5000`; a synchronous collective blocks for the same.
//!
//! The constants were "empirically derived to obtain an overlap of one
//! output fusion/convolution with 1 async op or 5 loop fusions with an
//! async op" (latency_hiding_scheduler.h).
//!
//! Invariant: every answer is one of the constants above.

use super::{CostModel, Op};
use crate::kinds::{is_nop, CollectiveInfo};
use xla_hlo_ir::{AttrKey, HloInstruction, Opcode};

pub const LOW_COST: f64 = 1.0;
pub const MEDIUM_COST: f64 = 1000.0;
pub const HIGH_COST: f64 = 5000.0;
pub const HIGH_LATENCY: f64 = 5000.0;

/// The approximate model.
#[derive(Clone, Copy, Debug, Default)]
pub struct ApproximateCostModel;

impl CostModel for ApproximateCostModel {
    fn name(&self) -> String {
        "approximate".into()
    }
    fn compute_us(&self, op: Op<'_>) -> f64 {
        let Some(instr) = op.instr() else {
            return 0.0;
        };
        if is_nop(instr) || crate::kinds::sync_collective_kind(instr).is_some() {
            return 0.0;
        }
        node_cost(instr)
    }
    fn transfer_us(&self, _op: Op<'_>, _info: &CollectiveInfo) -> f64 {
        HIGH_LATENCY
    }
}

/// XLA's node cost of an instruction, by opcode; every opcode is listed, so
/// a new one must be given a cost.
fn node_cost(instr: &HloInstruction) -> f64 {
    use Opcode as O;
    match instr.opcode {
        // Free: reshapes, and control flow (its callees are costed on their own).
        O::Reshape | O::While | O::Call | O::Conditional => 0.0,
        O::Fusion => match instr.ident_attr(AttrKey::FusionKind) {
            Some("kLoop") | Some("kInput") => MEDIUM_COST,
            Some("kOutput") => HIGH_COST,
            _ => LOW_COST,
        },
        O::Convolution | O::Dot => HIGH_COST,
        // Everything else (bookkeeping ops and synchronous collectives are
        // free before this is asked).
        O::Abs
        | O::Acos
        | O::Acosh
        | O::Add
        | O::AddDependency
        | O::AfterAll
        | O::AllGather
        | O::AllGatherDone
        | O::AllGatherStart
        | O::AllReduce
        | O::AllReduceDone
        | O::AllReduceStart
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
        | O::CollectiveBroadcast
        | O::CollectivePermute
        | O::CollectivePermuteDone
        | O::CollectivePermuteStart
        | O::CollectiveReduce
        | O::Compare
        | O::Complex
        | O::Concatenate
        | O::Constant
        | O::Convert
        | O::Copy
        | O::CopyDone
        | O::CopyStart
        | O::Cos
        | O::Cosh
        | O::Clz
        | O::CustomCall
        | O::Divide
        | O::Domain
        | O::DynamicReshape
        | O::DynamicSlice
        | O::DynamicUpdateSlice
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
        | O::Map
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
        | O::Reduce
        | O::ReducePrecision
        | O::ReduceScatter
        | O::ReduceWindow
        | O::Remainder
        | O::ReplicaId
        | O::Reverse
        | O::Rng
        | O::RngBitGenerator
        | O::RngGetAndUpdateState
        | O::RoundNearestAfz
        | O::RoundNearestEven
        | O::Rsqrt
        | O::Scan
        | O::ScaledDot
        | O::Scatter
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
        | O::Sort
        | O::Sqrt
        | O::StochasticConvert
        | O::Subtract
        | O::Tan
        | O::Tanh
        | O::TopK
        | O::Transpose
        | O::TriangularSolve
        | O::Tuple
        | O::Xor => LOW_COST,
    }
}
