//! Sends each instruction to the handler of its opcode; a handler that
//! declines (returns `None`) and every opcode without one fall back to the
//! generic fallback (operands replicated, the op run on the global shape).
//!
//! Invariants: the match lists every opcode (a new opcode does not compile
//! until it is given a handler or a reason to fall back); the value
//! returned is the handler's (in the layout it chose) or the fallback's
//! (replicated); the driver reshards it to the instruction's own sharding.

use super::control_flow;
use crate::error::SpmdError;
use crate::part::Part;
use crate::value::{PValue, ValueSharding};
use crate::{dot, dynamic_slice, gather, handlers, linalg, reorder, reshape, rng, window};
use xla_hlo_ir::{HloInstruction, Opcode};

/// Dispatches `instr` to its handler.
pub fn dispatch(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> Result<PValue, SpmdError> {
    let res = match instr.opcode {
        Opcode::Constant => return handlers::constant(p, instr),
        Opcode::Iota => handlers::iota(p, instr, target),
        Opcode::Tuple => handlers::tuple(p, instr, target),
        Opcode::GetTupleElement => handlers::get_tuple_element(p, instr),
        Opcode::Broadcast => handlers::broadcast(p, instr, target),
        Opcode::Transpose => handlers::transpose(p, instr, target),
        Opcode::Reshape => reshape::reshape(p, instr, target),
        Opcode::Reduce => handlers::reduce(p, instr, target),
        Opcode::Dot => dot::dot(p, instr, target),
        Opcode::Convolution => dot::convolution(p, instr, target),
        Opcode::While => control_flow::while_loop(p, instr, target),
        Opcode::Conditional => control_flow::conditional(p, instr, target),
        Opcode::Call => control_flow::call(p, instr, target),
        Opcode::CustomCall => handlers::custom_call(p, instr, target),
        Opcode::Slice => window::slice(p, instr, target),
        Opcode::Pad => window::pad(p, instr, target),
        Opcode::ReduceWindow => window::reduce_window(p, instr, target),
        Opcode::SelectAndScatter => window::select_and_scatter(p, instr, target),
        Opcode::Concatenate => window::concatenate(p, instr, target),
        Opcode::DynamicSlice => dynamic_slice::dynamic_slice(p, instr, target),
        Opcode::DynamicUpdateSlice => dynamic_slice::dynamic_update_slice(p, instr, target),
        Opcode::Sort => reorder::sort(p, instr, target),
        Opcode::Cholesky => linalg::cholesky(p, instr, target),
        Opcode::Fft => linalg::fft(p, instr, target),
        Opcode::TriangularSolve => linalg::triangular_solve(p, instr, target),
        Opcode::TopK => reorder::topk(p, instr, target),
        Opcode::Reverse => reorder::reverse(p, instr, target),
        Opcode::Gather => gather::gather(p, instr, target),
        Opcode::Scatter => gather::scatter(p, instr, target),
        Opcode::OptimizationBarrier => handlers::pass_through(p, instr),
        Opcode::Copy if instr.shape.is_tuple() => handlers::tuple_copy(p, instr, target),
        Opcode::AllReduce | Opcode::CollectivePermute => {
            handlers::manual_collective(p, instr, target)
        }
        // Elementwise ops, and map (elementwise over its operands).
        Opcode::Abs
        | Opcode::Acos
        | Opcode::Acosh
        | Opcode::Add
        | Opcode::And
        | Opcode::Asin
        | Opcode::Asinh
        | Opcode::Atan
        | Opcode::Atan2
        | Opcode::Atanh
        | Opcode::Cbrt
        | Opcode::Ceil
        | Opcode::Clamp
        | Opcode::Compare
        | Opcode::Complex
        | Opcode::Convert
        | Opcode::Copy
        | Opcode::Cos
        | Opcode::Cosh
        | Opcode::Clz
        | Opcode::Divide
        | Opcode::Erf
        | Opcode::Exp
        | Opcode::Expm1
        | Opcode::Floor
        | Opcode::Imag
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
        | Opcode::Or
        | Opcode::PopulationCount
        | Opcode::Power
        | Opcode::Real
        | Opcode::ReducePrecision
        | Opcode::Remainder
        | Opcode::RoundNearestAfz
        | Opcode::RoundNearestEven
        | Opcode::Rsqrt
        | Opcode::Select
        | Opcode::ShiftLeft
        | Opcode::ShiftRightArithmetic
        | Opcode::ShiftRightLogical
        | Opcode::Sign
        | Opcode::Sin
        | Opcode::Sinh
        | Opcode::Sqrt
        | Opcode::StochasticConvert
        | Opcode::Subtract
        | Opcode::Tan
        | Opcode::Tanh
        | Opcode::Xor
        | Opcode::Map => handlers::elementwise(p, instr, target),
        // A bitcast-convert between element types of different widths
        // adds or drops a minor dim (see the handler).
        Opcode::BitcastConvert => {
            let operand_rank = instr
                .operands
                .first()
                .map(|&o| p.orig_comp.instr(o).shape.rank())
                .unwrap_or(0);
            if instr.shape.rank() != operand_rank {
                handlers::bitcast_convert_resized(p, instr, target)
            } else {
                handlers::elementwise(p, instr, target)
            }
        }
        // Every other opcode falls back (operands replicated, the op run on
        // the global shape).
        //
        // Each device generates its tile of the global bit stream (see
        // `rng`); other random numbers are generated whole, so every device
        // sees the values of the unpartitioned program.
        Opcode::RngBitGenerator => rng::rng_bit_generator(p, instr, target),
        Opcode::Rng | Opcode::RngGetAndUpdateState => Ok(None),
        // Side effects, tokens and host transfers run as in the
        // unpartitioned program, on replicated operands.
        Opcode::AddDependency
        | Opcode::AfterAll
        | Opcode::Infeed
        | Opcode::Outfeed
        | Opcode::Recv
        | Opcode::RecvDone
        | Opcode::Send
        | Opcode::SendDone => Ok(None),
        // Collectives, async wrappers and device ids already in the input
        // act on replicated operands, as in the unpartitioned program.
        Opcode::AllGather
        | Opcode::AllGatherDone
        | Opcode::AllGatherStart
        | Opcode::AllReduceDone
        | Opcode::AllReduceStart
        | Opcode::AllToAll
        | Opcode::CollectiveBroadcast
        | Opcode::CollectivePermuteDone
        | Opcode::CollectivePermuteStart
        | Opcode::CollectiveReduce
        | Opcode::RaggedAllToAll
        | Opcode::ReduceScatter
        | Opcode::AsyncDone
        | Opcode::AsyncStart
        | Opcode::AsyncUpdate
        | Opcode::CopyDone
        | Opcode::CopyStart
        | Opcode::PartitionId
        | Opcode::ReplicaId => Ok(None),
        // Ops without a partitioned form here are computed whole: batch
        // norms, ragged and scaled dots, scans and fusions.
        Opcode::BatchNormGrad
        | Opcode::BatchNormInference
        | Opcode::BatchNormTraining
        | Opcode::RaggedDot
        | Opcode::ScaledDot
        | Opcode::Scan
        | Opcode::Fusion => Ok(None),
        // Bitcasts, domains, shuffles and dynamic shapes: their local form
        // is not the global op applied to a tile.
        Opcode::Bitcast
        | Opcode::Domain
        | Opcode::DynamicReshape
        | Opcode::GetDimensionSize
        | Opcode::SetDimensionSize
        | Opcode::Shuffle => Ok(None),
        // Parameters never reach the dispatch: the driver gives them the
        // sharding of their call site.
        Opcode::Parameter => Ok(None),
    }?;
    match res {
        Some(v) => Ok(v),
        None => {
            p.note(instr, "fallback");
            handlers::fallback(p, instr)
        }
    }
}
