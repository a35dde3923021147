//! Linear algebra: `dot`, `convolution`, `fft`, `cholesky`,
//! `triangular-solve` and the batch-norm ops.
//!
//! Invariant: dimension numbers are range- and uniqueness-checked before they
//! index an operand; `dot` and `convolution` give XLA's result element type
//! (`HigherPrecisionElementType`, then `MaybeUpcast` to the preferred type).

use super::window::window_output_size;
use super::{array_like_dynamic, array_shape, check_unique, complex_component, dim_index, Cx, R};
use crate::attrs::{AttrKey, Window};
use crate::opcode::Opcode;
use crate::primitive_type::PrimitiveType;
use crate::shape::{ArrayShape, Shape};

/// XLA's `HigherPrecisionElementType`.
fn higher_precision(a: PrimitiveType, b: PrimitiveType) -> PrimitiveType {
    if a == b {
        return a;
    }
    let fa = a.is_float() || a.is_complex();
    let fb = b.is_float() || b.is_complex();
    if fa != fb {
        return if fa { a } else { b };
    }
    if b.bit_width() > a.bit_width() {
        b
    } else {
        a
    }
}

/// XLA's `MaybeUpcast`: the result type of a dot/convolution.
fn maybe_upcast(from: PrimitiveType, preferred: Option<PrimitiveType>) -> R<PrimitiveType> {
    match preferred {
        None => Ok(from),
        Some(p) if p == from => Ok(from),
        Some(p) => {
            if !(from.is_float() || from.is_complex())
                && p.is_integer()
                && p.bit_width() < from.bit_width()
            {
                invalid!("preferred element type {p} is narrower than the operand type {from}");
            }
            if !p.is_array_type() {
                invalid!("preferred element type {p} is not a data type");
            }
            Ok(p)
        }
    }
}

pub(super) fn infer_dot(cx: &Cx) -> R<Shape> {
    if cx.ops.len() < 2 {
        invalid!("dot needs two operands");
    }
    let l = cx.array(0)?;
    let r = cx.array(1)?;
    let dn = cx.instr.dot_dimension_numbers();
    if dn.lhs_batch.len() != dn.rhs_batch.len() {
        invalid!("dot has a different number of lhs and rhs batch dimensions");
    }
    if dn.lhs_contracting.len() != dn.rhs_contracting.len() {
        invalid!("dot has a different number of lhs and rhs contracting dimensions");
    }
    let mut lhs_used: Vec<i64> = dn.lhs_batch.clone();
    lhs_used.extend(&dn.lhs_contracting);
    let mut rhs_used: Vec<i64> = dn.rhs_batch.clone();
    rhs_used.extend(&dn.rhs_contracting);
    check_unique(&lhs_used, "dot lhs batch and contracting dimensions")?;
    check_unique(&rhs_used, "dot rhs batch and contracting dimensions")?;
    for &d in &lhs_used {
        dim_index(d, l.rank(), "dot lhs dimension")?;
    }
    for &d in &rhs_used {
        dim_index(d, r.rank(), "dot rhs dimension")?;
    }
    for (&a, &b) in dn.lhs_batch.iter().zip(&dn.rhs_batch) {
        if l.dims[a as usize] != r.dims[b as usize] {
            invalid!(
                "dot batch dimension sizes differ: lhs dimension {a} is {} but rhs dimension {b} is {}",
                l.dims[a as usize],
                r.dims[b as usize]
            );
        }
    }
    for (&a, &b) in dn.lhs_contracting.iter().zip(&dn.rhs_contracting) {
        if l.dims[a as usize] != r.dims[b as usize] {
            invalid!(
                "dot contracting dimension sizes differ: lhs dimension {a} is {} but rhs dimension {b} is {}",
                l.dims[a as usize],
                r.dims[b as usize]
            );
        }
    }
    let mut dims = Vec::new();
    let mut dynamic = Vec::new();
    for &a in &dn.lhs_batch {
        dims.push(l.dims[a as usize]);
        dynamic.push(l.is_dynamic_dim(a as usize));
    }
    for d in 0..l.rank() {
        if !lhs_used.contains(&(d as i64)) {
            dims.push(l.dims[d]);
            dynamic.push(l.is_dynamic_dim(d));
        }
    }
    for d in 0..r.rank() {
        if !rhs_used.contains(&(d as i64)) {
            dims.push(r.dims[d]);
            dynamic.push(r.is_dynamic_dim(d));
        }
    }
    let ty = maybe_upcast(
        higher_precision(l.element_type, r.element_type),
        cx.preferred,
    )?;
    Ok(array_like_dynamic(ty, dims, dynamic))
}

pub(super) fn infer_convolution(cx: &Cx) -> R<Shape> {
    if cx.ops.len() < 2 {
        invalid!("convolution needs two operands");
    }
    let l = cx.array(0)?;
    let r = cx.array(1)?;
    let Some(dn) = cx.instr.conv_dimension_numbers() else {
        invalid!("convolution needs dim_labels=");
    };
    let spatial = dn.input_spatial.len();
    if dn.kernel_spatial.len() != spatial || dn.output_spatial.len() != spatial {
        invalid!("dim_labels have different numbers of spatial dimensions");
    }
    let rank = spatial + 2;
    if l.rank() != rank || r.rank() != rank {
        invalid!(
            "convolution operands must have rank {rank} (dim_labels), got {} and {}",
            l.rank(),
            r.rank()
        );
    }
    let mut lhs_dims = vec![dn.input_batch, dn.input_feature];
    lhs_dims.extend(&dn.input_spatial);
    let mut rhs_dims = vec![dn.kernel_input_feature, dn.kernel_output_feature];
    rhs_dims.extend(&dn.kernel_spatial);
    let mut out_dims_idx = vec![dn.output_batch, dn.output_feature];
    out_dims_idx.extend(&dn.output_spatial);
    for (list, what) in [
        (&lhs_dims, "input"),
        (&rhs_dims, "kernel"),
        (&out_dims_idx, "output"),
    ] {
        for &d in list.iter() {
            dim_index(d, rank, &format!("convolution {what} dimension"))?;
        }
        check_unique(list, &format!("convolution {what} dimension labels"))?;
    }
    let fgc = cx.instr.int_attr(AttrKey::FeatureGroupCount).unwrap_or(1);
    let bgc = cx.instr.int_attr(AttrKey::BatchGroupCount).unwrap_or(1);
    if fgc <= 0 || bgc <= 0 {
        invalid!("feature_group_count and batch_group_count must be positive");
    }
    if fgc > 1 && bgc > 1 {
        invalid!("feature_group_count and batch_group_count cannot both exceed 1");
    }
    let input_batch = l.dims[dn.input_batch as usize];
    let input_features = l.dims[dn.input_feature as usize];
    let kernel_in = r.dims[dn.kernel_input_feature as usize];
    let kernel_out = r.dims[dn.kernel_output_feature as usize];
    if input_features % fgc != 0 || input_features / fgc != kernel_in {
        invalid!(
            "input feature size {input_features} / feature_group_count {fgc} does not equal the kernel input feature size {kernel_in}"
        );
    }
    if kernel_out % fgc != 0 {
        invalid!(
            "kernel output feature size {kernel_out} is not divisible by feature_group_count {fgc}"
        );
    }
    if input_batch % bgc != 0 {
        invalid!("input batch size {input_batch} is not divisible by batch_group_count {bgc}");
    }
    if kernel_out % bgc != 0 {
        invalid!(
            "kernel output feature size {kernel_out} is not divisible by batch_group_count {bgc}"
        );
    }
    let default = Window::default();
    let window = cx.instr.window().unwrap_or(&default);
    if window.dims.len() != spatial {
        invalid!(
            "window has {} dimensions but the convolution has {spatial} spatial dimensions",
            window.dims.len()
        );
    }
    let mut out = vec![0i64; rank];
    out[dn.output_batch as usize] = input_batch / bgc;
    out[dn.output_feature as usize] = kernel_out;
    for i in 0..spatial {
        let w = &window.dims[i];
        let k = r.dims[dn.kernel_spatial[i] as usize];
        if w.size != k {
            invalid!(
                "window dimension {i} has size {} but the kernel spatial dimension has size {k}",
                w.size
            );
        }
        let base = l.dims[dn.input_spatial[i] as usize];
        match window_output_size(base, w) {
            Ok(s) => out[dn.output_spatial[i] as usize] = s,
            Err(e) => invalid!("window dimension {i}: {e}"),
        }
    }
    let ty = maybe_upcast(
        higher_precision(l.element_type, r.element_type),
        cx.preferred,
    )?;
    Ok(array_shape(ty, out))
}

pub(super) fn infer_fft(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    let len = cx.ints(AttrKey::FftLength);
    let Some(kind) = cx.instr.ident_attr(AttrKey::FftType) else {
        invalid!("fft needs fft_type=");
    };
    if len.is_empty() || len.len() > 3 || len.len() > a.rank() {
        invalid!("fft_length must have 1 to 3 entries, at most the operand rank");
    }
    let r = a.rank();
    let tail = &a.dims[r - len.len()..];
    let mut dims = a.dims.clone();
    let ty = a.element_type;
    match kind {
        "FFT" | "IFFT" => {
            if !ty.is_complex() {
                invalid!("{kind} expects a complex operand, got {ty}");
            }
            Ok(array_shape(ty, dims))
        }
        "RFFT" => {
            let out_ty = match ty {
                PrimitiveType::F32 => PrimitiveType::C64,
                PrimitiveType::F64 => PrimitiveType::C128,
                _ => invalid!("RFFT expects an f32 or f64 operand, got {ty}"),
            };
            if tail != len {
                invalid!("RFFT fft_length {len:?} does not match the operand's minor dimensions {tail:?}");
            }
            if let (Some(l), Some(&n)) = (dims.last_mut(), len.last()) {
                if n != 0 {
                    *l = n / 2 + 1;
                }
            }
            Ok(array_shape(out_ty, dims))
        }
        "IRFFT" => {
            let Some(out_ty) = complex_component(ty) else {
                invalid!("IRFFT expects a complex operand, got {ty}");
            };
            let k = len.len();
            if tail[..k - 1] != len[..k - 1] {
                invalid!("IRFFT fft_length {len:?} does not match the operand's minor dimensions {tail:?}");
            }
            if let (Some(l), Some(&n)) = (dims.last_mut(), len.last()) {
                *l = n;
            }
            Ok(array_shape(out_ty, dims))
        }
        other => invalid!("unknown fft_type {other}"),
    }
}

fn square_minor(a: &ArrayShape, what: &str) -> R<()> {
    let r = a.rank();
    if r < 2 || a.dims[r - 1] != a.dims[r - 2] {
        invalid!("{what} must have square minor dimensions, got {a}");
    }
    Ok(())
}

pub(super) fn infer_cholesky(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    square_minor(a, "cholesky operand")?;
    Ok(Shape::Array(a.clone()))
}

pub(super) fn infer_triangular_solve(cx: &Cx) -> R<Shape> {
    cx.exact_operands(2)?;
    let a = cx.array(0)?;
    let b = cx.array(1)?;
    square_minor(a, "triangular-solve a")?;
    if a.rank() != b.rank() || a.element_type != b.element_type {
        invalid!("triangular-solve operands must have the same rank and element type");
    }
    Ok(Shape::Array(b.clone()))
}

/// `batch-norm-training`, `batch-norm-grad` and `batch-norm-inference`.
pub(super) fn infer_batch_norm(opcode: Opcode, cx: &Cx) -> R<Shape> {
    let a = cx.array(0)?;
    let Some(fi) = cx.instr.int_attr(AttrKey::FeatureIndex) else {
        invalid!("{opcode} needs feature_index=");
    };
    let f = dim_index(fi, a.rank(), "feature_index")?;
    let feature = array_shape(a.element_type, vec![a.dims[f]]);
    if opcode == Opcode::BatchNormInference {
        Ok(Shape::Array(a.clone()))
    } else {
        Ok(Shape::Tuple(vec![
            Shape::Array(a.clone()),
            feature.clone(),
            feature,
        ]))
    }
}
