//! The other halves of asynchronous operations: `-done` ops take their
//! result from the start's `(operands, output, ...)` tuple; `copy-start`
//! gives `(operand, operand, u32[])` and `copy-done` its element 0.
//!
//! Invariant: a done whose start's shape is not such a tuple is
//! `NotInferable` (the start's own shape is the verifier's business).

use super::{not_inferable, Cx, R};
use crate::primitive_type::PrimitiveType;
use crate::shape::Shape;

/// `all-gather-done`, `collective-permute-done` and `async-done`.
pub(super) fn infer_done(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    match cx.op(0)? {
        Shape::Tuple(e) if e.len() >= 2 => Ok(e[1].clone()),
        _ => not_inferable("the start's shape is not a (operands, output, ...) tuple"),
    }
}

pub(super) fn infer_copy_start(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let s = cx.op(0)?.clone();
    Ok(Shape::Tuple(vec![
        s.clone(),
        s,
        Shape::scalar(PrimitiveType::U32),
    ]))
}

pub(super) fn infer_copy_done(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    match cx.op(0)? {
        Shape::Tuple(e) if !e.is_empty() => Ok(e[0].clone()),
        other => invalid!("copy-done operand must be a copy-start tuple, got {other}"),
    }
}
