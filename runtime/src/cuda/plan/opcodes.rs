//! HLO opcodes as kernel operations (`un_op`, `bin_op`), which opcodes a
//! fused kernel can evaluate (`is_fusable`), and the two HLO patterns the
//! planner inlines: scalar constants and reducer computations.
//!
//! Invariant: every opcode `is_fusable` accepts has a case in
//! `Planner::node`.

use super::types::{BinOp, UnOp};
use xla_hlo_evaluator::Value;
use xla_hlo_ir::{HloComputation, HloModule, InstrId, Opcode};

pub(super) fn un_op(op: Opcode) -> Option<UnOp> {
    Some(match op {
        Opcode::Negate => UnOp::Neg,
        Opcode::Exp => UnOp::Exp,
        Opcode::Log => UnOp::Log,
        Opcode::Tanh => UnOp::Tanh,
        Opcode::Sqrt => UnOp::Sqrt,
        Opcode::Rsqrt => UnOp::Rsqrt,
        Opcode::Abs => UnOp::Abs,
        Opcode::Sin => UnOp::Sin,
        Opcode::Cos => UnOp::Cos,
        Opcode::Floor => UnOp::Floor,
        Opcode::Ceil => UnOp::Ceil,
        Opcode::Sign => UnOp::Sign,
        Opcode::Log1p => UnOp::Log1p,
        Opcode::Expm1 => UnOp::Expm1,
        Opcode::Not => UnOp::Not,
        Opcode::IsFinite => UnOp::IsFinite,
        _ => return None,
    })
}

pub(super) fn bin_op(op: Opcode) -> Option<BinOp> {
    Some(match op {
        Opcode::Add => BinOp::Add,
        Opcode::Subtract => BinOp::Sub,
        Opcode::Multiply => BinOp::Mul,
        Opcode::Divide => BinOp::Div,
        Opcode::Maximum => BinOp::Max,
        Opcode::Minimum => BinOp::Min,
        Opcode::Power => BinOp::Pow,
        Opcode::Remainder => BinOp::Rem,
        Opcode::And => BinOp::And,
        Opcode::Or => BinOp::Or,
        Opcode::Xor => BinOp::Xor,
        _ => return None,
    })
}

pub(super) fn is_fusable(op: Opcode) -> bool {
    un_op(op).is_some()
        || bin_op(op).is_some()
        || matches!(
            op,
            Opcode::Select
                | Opcode::Clamp
                | Opcode::Concatenate
                | Opcode::Pad
                | Opcode::Reverse
                | Opcode::DynamicSlice
                | Opcode::DynamicUpdateSlice
                | Opcode::CustomCall
                | Opcode::Compare
                | Opcode::Convert
                | Opcode::Copy
                | Opcode::Broadcast
                | Opcode::Reshape
                | Opcode::Transpose
                | Opcode::Slice
                | Opcode::Iota
                | Opcode::Reduce
        )
}

pub(super) fn scalar_constant(comp: &HloComputation, id: InstrId) -> Option<f64> {
    let ins = comp.instr(id);
    if ins.opcode != Opcode::Constant || !ins.shape.dims().is_empty() || !ins.shape.is_array() {
        return None;
    }
    let v = Value::from_literal(ins.literal.as_deref()?).ok()?;
    Some(v.as_array()?.get_f64(0))
}

/// The reducer of a `reduce`: a computation `root = op(p0, p1)`.
pub(super) fn reducer(module: &HloModule, comp_id: xla_hlo_ir::CompId) -> Option<BinOp> {
    let c = module.comp(comp_id);
    let root = c.root_instr();
    if c.parameters.len() != 2 || root.operands.len() != 2 {
        return None;
    }
    let op = bin_op(root.opcode)?;
    let ps: Vec<Option<i64>> = root
        .operands
        .iter()
        .map(|o| c.instr(*o).parameter_number)
        .collect();
    if ps.iter().all(|p| p.is_some()) && ps[0] != ps[1] {
        Some(op)
    } else {
        None
    }
}
