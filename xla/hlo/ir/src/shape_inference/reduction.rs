//! Reductions and ops that apply a called computation: `reduce`,
//! `reduce-window`, `select-and-scatter`, `map`, `sort` and `topk`.
//!
//! Invariant: reduce-style ops take N inputs of one set of dimensions
//! followed by N scalar init values, and give one result per init value
//! (a tuple when N > 1).

use super::window::window_shape;
use super::{
    array_like_dynamic, array_shape, check_unique, dim_index, single_or_tuple, tuple_or_single, Cx,
    R,
};
use crate::attrs::{AttrKey, Window};
use crate::primitive_type::PrimitiveType;
use crate::shape::{ArrayShape, Shape};

/// Splits reduce-style operands into inputs and init values.
fn inputs_and_inits<'a>(cx: &Cx<'a>) -> R<(Vec<&'a ArrayShape>, Vec<&'a ArrayShape>)> {
    let n = cx.ops.len();
    if n < 2 || n % 2 == 1 {
        invalid!(
            "{} needs N inputs followed by N init values, got {n} operands",
            cx.instr.opcode
        );
    }
    let half = n / 2;
    let mut inputs = Vec::with_capacity(half);
    let mut inits = Vec::with_capacity(half);
    for i in 0..half {
        inputs.push(cx.array(i)?);
    }
    for i in half..n {
        let s = cx.array(i)?;
        if s.rank() != 0 {
            invalid!(
                "init value (operand {i}) must be a scalar, got {}",
                Shape::Array(s.without_layout())
            );
        }
        inits.push(s);
    }
    for (i, a) in inputs.iter().enumerate().skip(1) {
        if a.dims != inputs[0].dims {
            invalid!(
                "input {i} has dimensions {:?} but input 0 has {:?}",
                a.dims,
                inputs[0].dims
            );
        }
    }
    Ok((inputs, inits))
}

pub(super) fn infer_reduce(cx: &Cx) -> R<Shape> {
    let (inputs, inits) = inputs_and_inits(cx)?;
    let a0 = inputs[0];
    let dims = cx.instr.dimensions();
    for &d in dims {
        dim_index(d, a0.rank(), "reduce dimension")?;
    }
    check_unique(dims, "reduce dimensions")?;
    let kept: Vec<usize> = (0..a0.rank())
        .filter(|&d| !dims.contains(&(d as i64)))
        .collect();
    let out_dims: Vec<i64> = kept.iter().map(|&d| a0.dims[d]).collect();
    let dynamic: Vec<bool> = kept.iter().map(|&d| a0.is_dynamic_dim(d)).collect();
    let shapes: Vec<Shape> = inits
        .iter()
        .map(|i| array_like_dynamic(i.element_type, out_dims.clone(), dynamic.clone()))
        .collect();
    Ok(single_or_tuple(shapes))
}

pub(super) fn infer_reduce_window(cx: &Cx) -> R<Shape> {
    let (inputs, inits) = inputs_and_inits(cx)?;
    let default = Window::default();
    let window = cx.instr.window().unwrap_or(&default);
    let out_dims = window_shape(&inputs[0].dims, window)?;
    let shapes = inits
        .iter()
        .map(|i| array_shape(i.element_type, out_dims.clone()))
        .collect();
    Ok(single_or_tuple(shapes))
}

pub(super) fn infer_select_and_scatter(cx: &Cx) -> R<Shape> {
    cx.exact_operands(3)?;
    let a = cx.array(0)?;
    let src = cx.array(1)?;
    let init = cx.array(2)?;
    if init.rank() != 0 {
        invalid!("select-and-scatter init value must be a scalar");
    }
    if src.element_type != a.element_type || init.element_type != a.element_type {
        invalid!("select-and-scatter operand, source and init value must share an element type");
    }
    let default = Window::default();
    let window = cx.instr.window().unwrap_or(&default);
    let expected = window_shape(&a.dims, window)?;
    if expected != src.dims {
        invalid!(
            "select-and-scatter source has dimensions {:?} but the window over the operand gives {:?}",
            src.dims,
            expected
        );
    }
    Ok(Shape::Array(a.clone()))
}

pub(super) fn infer_map(cx: &Cx) -> R<Shape> {
    if cx.ops.is_empty() {
        invalid!("map needs at least one operand");
    }
    let a0 = cx.array(0)?;
    for i in 1..cx.ops.len() {
        let a = cx.array(i)?;
        if a.dims != a0.dims {
            invalid!("map operands must have the same dimensions");
        }
    }
    if let Some(dims) = cx.instr.ints_attr(AttrKey::Dimensions) {
        if !dims.iter().copied().eq(0..a0.rank() as i64) {
            invalid!("map requires dimensions 0..{}, got {dims:?}", a0.rank());
        }
    }
    let root = cx.comp_root_shape(AttrKey::ToApply)?;
    let Some(r) = root.as_array().filter(|r| r.rank() == 0) else {
        invalid!("map's computation must return a scalar, got {root}");
    };
    Ok(array_shape(r.element_type, a0.dims.clone()))
}

pub(super) fn infer_sort(cx: &Cx) -> R<Shape> {
    if cx.ops.is_empty() {
        invalid!("sort needs at least one operand");
    }
    let a0 = cx.array(0)?;
    for i in 1..cx.ops.len() {
        if cx.array(i)?.dims != a0.dims {
            invalid!("sort operands must have the same dimensions");
        }
    }
    let dims = cx.instr.dimensions();
    if dims.len() != 1 {
        invalid!("sort needs exactly one dimension, got {dims:?}");
    }
    dim_index(dims[0], a0.rank(), "sort dimension")?;
    Ok(tuple_or_single(cx.ops))
}

pub(super) fn infer_topk(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    let Some(k) = cx.instr.int_attr(AttrKey::K) else {
        invalid!("topk needs k=");
    };
    let Some(last) = a.dims.last() else {
        invalid!("topk operand must have rank >= 1");
    };
    if k < 0 || k > *last {
        invalid!("topk k={k} is out of range for a last dimension of {last}");
    }
    let mut dims = a.dims.clone();
    if let Some(l) = dims.last_mut() {
        *l = k;
    }
    Ok(Shape::Tuple(vec![
        array_shape(a.element_type, dims.clone()),
        array_shape(PrimitiveType::S32, dims),
    ]))
}
