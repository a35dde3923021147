//! HLO opcodes as kernel operations (`un_op`, `bin_op`), which opcodes a
//! kernel expression can evaluate in place (`is_fusable`), and scalar
//! constants as expressions.
//!
//! Invariant: every opcode `is_fusable` accepts has a case in
//! `Planner::node`.

use super::types::{BinOp, Expr, UnOp};
use xla_hlo_evaluator::Value;
use xla_hlo_ir::{HloComputation, InstrId, Opcode};

pub(super) fn un_op(op: Opcode) -> Option<UnOp> {
    Some(match op {
        Opcode::Negate => UnOp::Neg,
        Opcode::Exp => UnOp::Exp,
        Opcode::Log => UnOp::Log,
        Opcode::Tanh => UnOp::Tanh,
        Opcode::Sqrt => UnOp::Sqrt,
        Opcode::Rsqrt => UnOp::Rsqrt,
        Opcode::Cbrt => UnOp::Cbrt,
        Opcode::Abs => UnOp::Abs,
        Opcode::Sin => UnOp::Sin,
        Opcode::Cos => UnOp::Cos,
        Opcode::Tan => UnOp::Tan,
        Opcode::Floor => UnOp::Floor,
        Opcode::Ceil => UnOp::Ceil,
        Opcode::Sign => UnOp::Sign,
        Opcode::Log1p => UnOp::Log1p,
        Opcode::Expm1 => UnOp::Expm1,
        Opcode::Erf => UnOp::Erf,
        Opcode::Logistic => UnOp::Logistic,
        Opcode::RoundNearestAfz => UnOp::RoundAfz,
        Opcode::RoundNearestEven => UnOp::RoundEven,
        Opcode::Not => UnOp::Not,
        Opcode::IsFinite => UnOp::IsFinite,
        Opcode::PopulationCount => UnOp::Popcnt,
        Opcode::Clz => UnOp::Clz,
        Opcode::Real => UnOp::Real,
        Opcode::Imag => UnOp::Imag,
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
        Opcode::Atan2 => BinOp::Atan2,
        Opcode::And => BinOp::And,
        Opcode::Or => BinOp::Or,
        Opcode::Xor => BinOp::Xor,
        Opcode::ShiftLeft => BinOp::ShiftLeft,
        Opcode::ShiftRightLogical => BinOp::ShiftRightLogical,
        Opcode::ShiftRightArithmetic => BinOp::ShiftRightArithmetic,
        Opcode::Complex => BinOp::Complex,
        _ => return None,
    })
}

/// Opcodes a kernel evaluates per output element, inside its users' kernels
/// where the planner inlines them.
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
                | Opcode::BitcastConvert
                | Opcode::ReducePrecision
                | Opcode::Copy
                | Opcode::Bitcast
                | Opcode::Broadcast
                | Opcode::Reshape
                | Opcode::Transpose
                | Opcode::Slice
                | Opcode::Iota
                | Opcode::Reduce
                | Opcode::ReduceWindow
                | Opcode::Gather
                | Opcode::Convolution
                | Opcode::Fft
        )
}

/// A scalar constant as an expression (`Int` for integers and pred).
pub(super) fn scalar_constant(comp: &HloComputation, id: InstrId) -> Option<Expr> {
    let ins = comp.instr(id);
    if ins.opcode != Opcode::Constant || !ins.shape.dims().is_empty() || !ins.shape.is_array() {
        return None;
    }
    let v = Value::from_literal(ins.literal.as_deref()?).ok()?;
    let a = v.as_array()?;
    if a.ty.is_complex() {
        // Materialized: a kernel scalar holds one real number.
        return None;
    }
    if a.ty.is_float() {
        Some(Expr::Scalar(a.get_f64(0)))
    } else if a.ty == xla_hlo_ir::PrimitiveType::U64 {
        Some(Expr::Int(a.get_i64(0) as u64 as i128))
    } else {
        Some(Expr::Int(a.get_i64(0) as i128))
    }
}
