//! Shape and literal helpers shared by the value conversion, the builder
//! and the handlers: array shapes with new dims (layout kept), element
//! types, scalar literals.

use crate::error::SpmdError;
use xla_hlo_ir::literal::ArrayLiteral;
use xla_hlo_ir::{ArrayShape, Literal, PrimitiveType, Shape};

/// Array shape helper (no layout).
#[inline]
pub fn arr(ty: PrimitiveType, dims: Vec<i64>) -> Shape {
    Shape::Array(ArrayShape::new(ty, dims))
}

/// The same shape with new dims, keeping element type and layout.
#[inline]
pub fn with_dims(shape: &Shape, dims: &[i64]) -> Shape {
    match shape {
        Shape::Array(a) if a.dims.len() == dims.len() => Shape::Array(a.with_dims(dims.to_vec())),
        Shape::Array(a) => arr(a.element_type, dims.to_vec()),
        other => other.clone(),
    }
}

/// The element type of an array shape (errors for tuples).
#[inline]
pub fn elem(shape: &Shape) -> Result<PrimitiveType, SpmdError> {
    shape
        .element_type()
        .ok_or_else(|| SpmdError::Invalid(format!("expected an array shape, got {shape}")))
}

/// A scalar literal of `ty` holding `v` (integers and floats; pred: v != 0).
pub fn scalar_literal(ty: PrimitiveType, v: f64) -> Literal {
    let mut lit = ArrayLiteral::zeros(ArrayShape::new(ty, vec![]));
    if ty.is_float() || ty.is_complex() {
        lit.set_f64(0, v);
    } else {
        lit.set_int(0, v as i128);
    }
    Literal::Array(lit)
}
