//! Tuples, called computations and tokens: `get-tuple-element`,
//! `conditional` (the result is its first branch's root), `after-all` and
//! `add-dependency`.
//!
//! Invariant: called computations are looked up through [`Cx::comp`], so a
//! dangling computation id is `Invalid`, never a panic.

use super::{root_shape, Cx, R};
use crate::attrs::{AttrKey, AttrValue};
use crate::shape::Shape;

pub(super) fn infer_get_tuple_element(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let t = cx.op(0)?;
    let Shape::Tuple(elements) = t else {
        invalid!("get-tuple-element operand must be a tuple, got {t}");
    };
    let Some(index) = cx.instr.int_attr(AttrKey::Index) else {
        invalid!("get-tuple-element needs index=");
    };
    match usize::try_from(index).ok().and_then(|i| elements.get(i)) {
        Some(s) => Ok(s.clone()),
        None => invalid!(
            "tuple index {index} is out of range for a tuple of {} elements",
            elements.len()
        ),
    }
}

pub(super) fn infer_conditional(cx: &Cx) -> R<Shape> {
    let instr = cx.instr;
    let first = if let Some(AttrValue::Computations(cs)) = instr.attr(AttrKey::BranchComputations) {
        match cs.first() {
            Some(c) => *c,
            None => invalid!("conditional has no branch computations"),
        }
    } else if let Some(c) = instr.computation_attr(AttrKey::TrueComputation) {
        c
    } else {
        invalid!("conditional needs branch_computations= or true_computation=");
    };
    Ok(root_shape(cx.comp(first)?)?.clone())
}

/// A token, whatever the operands (XLA's verifier checks only the result).
pub(super) fn infer_after_all(_cx: &Cx) -> R<Shape> {
    Ok(Shape::token())
}

pub(super) fn infer_add_dependency(cx: &Cx) -> R<Shape> {
    cx.exact_operands(2)?;
    if !cx.op(1)?.is_token() {
        invalid!("add-dependency's second operand must be a token");
    }
    Ok(cx.op(0)?.clone())
}
