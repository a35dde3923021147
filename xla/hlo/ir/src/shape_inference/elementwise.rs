//! Elementwise ops: unary (with the element types each accepts and the
//! result type it gives), binary, `select` and `clamp`.
//!
//! Invariant: operands must be data arrays of one set of dimensions (a scalar
//! predicate or bound is allowed where XLA allows it); the result keeps the
//! operand's dimensions, and unary results keep its layout.

use super::{array_like_dynamic, complex_component, Cx, R};
use crate::opcode::Opcode;
use crate::primitive_type::PrimitiveType;
use crate::shape::Shape;

/// The element types a unary elementwise op accepts and the type it gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum UnaryTypeRule {
    /// Any data type, kept (`negate`, `sign`).
    Any,
    /// Any data type; a complex operand gives its component type (`abs`).
    ComplexToComponent,
    /// Floating point, kept, or complex, giving its component type (`real`, `imag`).
    RealOrComplexPart,
    /// Floating point, giving `pred` (`is-finite`).
    FloatToPred,
    /// `pred` or integer, kept (`not`).
    PredOrInteger,
    /// Integer, kept (`popcnt`, `count-leading-zeros`).
    Integer,
    /// Floating point, kept (rounding, `reduce-precision`).
    Float,
    /// Floating point or complex, kept (transcendental functions).
    FloatOrComplex,
}

pub(super) fn infer_unary(op: Opcode, rule: UnaryTypeRule, cx: &Cx) -> R<Shape> {
    use UnaryTypeRule as T;
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    let ty = a.element_type;
    let is_fp = ty.is_float() || ty.is_complex();
    let result_ty = match rule {
        T::FloatToPred => {
            if !ty.is_float() {
                invalid!("{op} expects a floating-point operand, got {ty}");
            }
            PrimitiveType::Pred
        }
        T::RealOrComplexPart => {
            if let Some(c) = complex_component(ty) {
                c
            } else if ty.is_float() {
                ty
            } else {
                invalid!("{op} expects a floating-point or complex operand, got {ty}");
            }
        }
        T::ComplexToComponent => complex_component(ty).unwrap_or(ty),
        T::PredOrInteger => {
            if !(ty == PrimitiveType::Pred || ty.is_integer()) {
                invalid!("{op} expects a pred or integer operand, got {ty}");
            }
            ty
        }
        T::Integer => {
            if !ty.is_integer() {
                invalid!("{op} expects an integer operand, got {ty}");
            }
            ty
        }
        T::Float => {
            if !ty.is_float() {
                invalid!("{op} expects a floating-point operand, got {ty}");
            }
            ty
        }
        T::FloatOrComplex => {
            if !is_fp {
                invalid!("{op} expects a floating-point or complex operand, got {ty}");
            }
            ty
        }
        T::Any => ty,
    };
    let mut out = a.clone();
    out.element_type = result_ty;
    Ok(Shape::Array(out))
}

/// The element types a binary elementwise op accepts (both operands have
/// one type) and the type it gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BinaryTypeRule {
    /// Any data type, kept (arithmetic, `maximum`, `minimum`, ...).
    Any,
    /// Any data type, giving `pred` (`compare`).
    AnyToPred,
    /// `f32` or `f64`, giving `c64` or `c128` (`complex`).
    FloatToComplex,
    /// `pred` or integer, kept (`and`, `or`, `xor`).
    PredOrInteger,
    /// Integer, kept (shifts).
    Integer,
}

pub(super) fn infer_binary(op: Opcode, rule: BinaryTypeRule, cx: &Cx) -> R<Shape> {
    use BinaryTypeRule as T;
    cx.exact_operands(2)?;
    let l = cx.array(0)?;
    let r = cx.array(1)?;
    if l.dims != r.dims {
        invalid!(
            "{op} operands must have the same dimensions, got {} and {}",
            Shape::Array(l.without_layout()),
            Shape::Array(r.without_layout())
        );
    }
    if l.element_type != r.element_type {
        invalid!(
            "{op} operands must have the same element type, got {} and {}",
            l.element_type,
            r.element_type
        );
    }
    let ty = l.element_type;
    let result_ty = match rule {
        T::AnyToPred => PrimitiveType::Pred,
        T::FloatToComplex => match ty {
            PrimitiveType::F32 => PrimitiveType::C64,
            PrimitiveType::F64 => PrimitiveType::C128,
            _ => invalid!("{op} expects f32 or f64 operands, got {ty}"),
        },
        T::PredOrInteger => {
            if !(ty == PrimitiveType::Pred || ty.is_integer()) {
                invalid!("{op} expects pred or integer operands, got {ty}");
            }
            ty
        }
        T::Integer => {
            if !ty.is_integer() {
                invalid!("{op} expects integer operands, got {ty}");
            }
            ty
        }
        T::Any => ty,
    };
    let dynamic = (0..l.rank())
        .map(|d| l.is_dynamic_dim(d) || r.is_dynamic_dim(d))
        .collect();
    Ok(array_like_dynamic(result_ty, l.dims.clone(), dynamic))
}

pub(super) fn infer_select(cx: &Cx) -> R<Shape> {
    cx.exact_operands(3)?;
    let p = cx.array(0)?;
    let t = cx.array(1)?;
    let f = cx.array(2)?;
    if p.element_type != PrimitiveType::Pred {
        invalid!("select's predicate must be pred, got {}", p.element_type);
    }
    if t.dims != f.dims || t.element_type != f.element_type {
        invalid!(
            "select's branches must have the same shape, got {} and {}",
            Shape::Array(t.without_layout()),
            Shape::Array(f.without_layout())
        );
    }
    if p.rank() != 0 && p.dims != t.dims {
        invalid!(
            "select's predicate {} must be a scalar or have the branches' dimensions {:?}",
            Shape::Array(p.without_layout()),
            t.dims
        );
    }
    let dynamic = (0..t.rank())
        .map(|d| t.is_dynamic_dim(d) || f.is_dynamic_dim(d))
        .collect();
    Ok(array_like_dynamic(t.element_type, t.dims.clone(), dynamic))
}

pub(super) fn infer_clamp(cx: &Cx) -> R<Shape> {
    cx.exact_operands(3)?;
    let lo = cx.array(0)?;
    let x = cx.array(1)?;
    let hi = cx.array(2)?;
    for (b, what) in [(lo, "min"), (hi, "max")] {
        if b.element_type != x.element_type {
            invalid!(
                "clamp {what} has element type {} but the operand has {}",
                b.element_type,
                x.element_type
            );
        }
        if b.rank() != 0 && b.dims != x.dims {
            invalid!("clamp {what} must be a scalar or have the operand's dimensions");
        }
    }
    Ok(Shape::Array(x.without_layout()))
}
