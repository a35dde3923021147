//! Sends each instruction to the handler of its opcode; a handler that
//! declines (returns `None`) and every opcode without one fall back to the
//! generic fallback (operands replicated, the op run on the global shape).
//!
//! Invariant: the value returned is the handler's (in the layout it chose)
//! or the fallback's (replicated); the driver reshards it to the
//! instruction's own sharding.

use super::control_flow;
use crate::error::SpmdError;
use crate::part::Part;
use crate::value::{PValue, VS};
use crate::{dot, dynamic_slice, gather, handlers, reorder, reshape, window};
use xla_hlo_ir::{HloInstruction, Opcode};

/// Dispatches `instr` to its handler.
pub fn dispatch(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &VS,
) -> Result<PValue, SpmdError> {
    let op = instr.opcode;
    let res = match op {
        Opcode::Constant => return handlers::constant(p, instr),
        Opcode::Iota => handlers::iota(p, instr, target),
        Opcode::Tuple => handlers::tuple(p, instr, target),
        Opcode::GetTupleElement => handlers::gte(p, instr),
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
        Opcode::TopK => reorder::topk(p, instr, target),
        Opcode::Reverse => reorder::reverse(p, instr, target),
        Opcode::Gather => gather::gather(p, instr, target),
        Opcode::Scatter => gather::scatter(p, instr, target),
        Opcode::OptimizationBarrier => handlers::pass_through(p, instr),
        Opcode::BitcastConvert
            if instr.shape.rank()
                != instr
                    .operands
                    .first()
                    .map(|&o| p.oc.instr(o).shape.rank())
                    .unwrap_or(0) =>
        {
            Ok(None)
        }
        Opcode::Rng | Opcode::RngBitGenerator => Ok(None),
        _ if op.is_elementwise() || op == Opcode::Map => handlers::elementwise(p, instr, target),
        _ => Ok(None),
    }?;
    match res {
        Some(v) => Ok(v),
        None => {
            p.note(instr, "fallback");
            handlers::fallback(p, instr)
        }
    }
}
