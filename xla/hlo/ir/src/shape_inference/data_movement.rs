//! Data movement: `broadcast`, `transpose`, `reverse`, `slice`,
//! `dynamic-slice`, `dynamic-update-slice`, `pad`, `concatenate`, `gather`,
//! `scatter` and the dynamic-dimension ops (`get-dimension-size`,
//! `set-dimension-size`).
//!
//! Invariant: every dimension number and size read from an attribute is
//! range-checked before it indexes a shape; sizes are computed in `i128` and
//! converted back with a check.

use super::{
    array_like_dynamic, array_shape, check_unique, dim_index, is_permutation, to_i64,
    tuple_or_single, Cx, R,
};
use crate::attrs::{AttrKey, AttrValue};
use crate::module::HloInstruction;
use crate::primitive_type::PrimitiveType;
use crate::shape::Shape;

pub(super) fn infer_broadcast(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    let mut dims = cx.ints(AttrKey::Dimensions).to_vec();
    if dims.iter().any(|&d| d < 0) {
        invalid!("broadcast sizes must be non-negative");
    }
    dims.extend_from_slice(&a.dims);
    Ok(array_shape(a.element_type, dims))
}

pub(super) fn infer_transpose(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    let perm = cx.instr.dimensions();
    if !is_permutation(perm, a.rank()) {
        invalid!(
            "transpose dimensions {:?} are not a permutation of the operand's {} dimensions",
            perm,
            a.rank()
        );
    }
    let dims = perm.iter().map(|&p| a.dims[p as usize]).collect();
    let dynamic = perm.iter().map(|&p| a.is_dynamic_dim(p as usize)).collect();
    Ok(array_like_dynamic(a.element_type, dims, dynamic))
}

pub(super) fn infer_reverse(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    for &d in cx.instr.dimensions() {
        dim_index(d, a.rank(), "reverse dimension")?;
    }
    check_unique(cx.instr.dimensions(), "reverse dimensions")?;
    Ok(Shape::Array(a.clone()))
}

pub(super) fn infer_slice(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    let Some(slice) = cx.instr.slice_dims() else {
        invalid!("slice needs slice=");
    };
    if slice.len() != a.rank() {
        invalid!(
            "slice has {} ranges but the operand has rank {}",
            slice.len(),
            a.rank()
        );
    }
    let mut dims = Vec::with_capacity(slice.len());
    for (i, (s, &d)) in slice.iter().zip(&a.dims).enumerate() {
        if s.stride <= 0 {
            invalid!("slice dimension {i}: stride {} must be positive", s.stride);
        }
        if s.start < 0 || s.start > s.limit || s.limit > d {
            invalid!(
                "slice dimension {i}: [{}:{}] is not within [0:{d}]",
                s.start,
                s.limit
            );
        }
        let n = (s.limit as i128 - s.start as i128 + s.stride as i128 - 1) / s.stride as i128;
        dims.push(to_i64(n, "slice size")?);
    }
    Ok(array_shape(a.element_type, dims))
}

/// Checks a dynamic-slice-style list of start indices beginning at operand `first`.
fn check_start_indices(cx: &Cx, first: usize, rank: usize) -> R<()> {
    let n = cx.ops.len().saturating_sub(first);
    let legacy = n == 1 && cx.array(first)?.rank() == 1;
    if legacy {
        // Legacy form: one rank-1 index vector.
        let v = cx.array(first)?;
        if v.dims[0] != rank as i64 || !v.element_type.is_integer() {
            invalid!("start indices vector must be an integer vector of {rank} elements");
        }
        return Ok(());
    }
    if n != rank {
        invalid!("expected {rank} start indices (one per dimension), got {n}");
    }
    let mut ty = None;
    for i in first..cx.ops.len() {
        let s = cx.array(i)?;
        if s.rank() != 0 || !s.element_type.is_integer() {
            invalid!(
                "start index operand {i} must be an integer scalar, got {}",
                Shape::Array(s.without_layout())
            );
        }
        if *ty.get_or_insert(s.element_type) != s.element_type {
            invalid!("start indices must all have the same type");
        }
    }
    Ok(())
}

pub(super) fn infer_dynamic_slice(cx: &Cx) -> R<Shape> {
    let a = cx.array(0)?;
    check_start_indices(cx, 1, a.rank())?;
    let Some(sizes) = cx.instr.ints_attr(AttrKey::DynamicSliceSizes) else {
        invalid!("dynamic-slice needs dynamic_slice_sizes=");
    };
    if sizes.len() != a.rank() {
        invalid!(
            "dynamic_slice_sizes has {} entries but the operand has rank {}",
            sizes.len(),
            a.rank()
        );
    }
    for (i, (&s, &d)) in sizes.iter().zip(&a.dims).enumerate() {
        if s < 0 || s > d {
            invalid!("dynamic slice size {s} of dimension {i} is not within [0, {d}]");
        }
    }
    Ok(array_shape(a.element_type, sizes.to_vec()))
}

pub(super) fn infer_dynamic_update_slice(cx: &Cx) -> R<Shape> {
    let a = cx.array(0)?;
    let u = cx.array(1)?;
    check_start_indices(cx, 2, a.rank())?;
    if u.rank() != a.rank() {
        invalid!(
            "update rank {} does not match the operand rank {}",
            u.rank(),
            a.rank()
        );
    }
    if u.element_type != a.element_type {
        invalid!(
            "update element type {} does not match the operand's {}",
            u.element_type,
            a.element_type
        );
    }
    for (i, (&ud, &d)) in u.dims.iter().zip(&a.dims).enumerate() {
        if ud < 0 || ud > d {
            invalid!("update dimension {i} of size {ud} exceeds the operand's {d}");
        }
    }
    Ok(Shape::Array(a.clone()))
}

pub(super) fn infer_pad(cx: &Cx) -> R<Shape> {
    cx.exact_operands(2)?;
    let a = cx.array(0)?;
    let v = cx.array(1)?;
    if v.rank() != 0 {
        invalid!("pad value must be a scalar");
    }
    if v.element_type != a.element_type {
        invalid!(
            "pad value type {} does not match the operand's {}",
            v.element_type,
            a.element_type
        );
    }
    let Some(padding) = cx.instr.padding() else {
        invalid!("pad needs padding=");
    };
    if padding.len() != a.rank() {
        invalid!(
            "padding has {} dimensions but the operand has rank {}",
            padding.len(),
            a.rank()
        );
    }
    let mut dims = Vec::with_capacity(a.rank());
    for (i, (p, &d)) in padding.iter().zip(&a.dims).enumerate() {
        if p.interior < 0 {
            invalid!(
                "pad dimension {i}: interior padding {} is negative",
                p.interior
            );
        }
        let n = p.low as i128
            + p.high as i128
            + d as i128
            + (d as i128 - 1).max(0) * p.interior as i128;
        if n < 0 {
            invalid!("pad dimension {i} would have negative size {n}");
        }
        dims.push(to_i64(n, "padded size")?);
    }
    Ok(array_shape(a.element_type, dims))
}

pub(super) fn infer_concatenate(cx: &Cx) -> R<Shape> {
    if cx.ops.is_empty() {
        invalid!("concatenate needs at least one operand");
    }
    let dims_attr = cx.instr.dimensions();
    if dims_attr.len() != 1 {
        invalid!("concatenate needs exactly one dimension, got {dims_attr:?}");
    }
    let a0 = cx.array(0)?;
    let d = dim_index(dims_attr[0], a0.rank(), "concatenate dimension")?;
    let mut total: i128 = 0;
    for i in 0..cx.ops.len() {
        let a = cx.array(i)?;
        if a.rank() != a0.rank() || a.element_type != a0.element_type {
            invalid!(
                "concatenate operand {i} {} does not match operand 0 {} in rank or element type",
                Shape::Array(a.without_layout()),
                Shape::Array(a0.without_layout())
            );
        }
        for (k, (&x, &y)) in a.dims.iter().zip(&a0.dims).enumerate() {
            if k != d && x != y {
                invalid!(
                    "concatenate operand {i} differs from operand 0 in dimension {k} ({x} vs {y})"
                );
            }
        }
        total += a.dims[d] as i128;
    }
    let mut dims = a0.dims.clone();
    dims[d] = to_i64(total, "concatenated size")?;
    Ok(array_shape(a0.element_type, dims))
}

fn slice_sizes(instr: &HloInstruction) -> Option<Vec<i64>> {
    match instr.attr(AttrKey::SliceSizes)? {
        AttrValue::Ints(v) => Some(v.clone()),
        AttrValue::IntLists(l) if l.len() == 1 => Some(l[0].clone()),
        _ => None,
    }
}

pub(super) fn infer_gather(cx: &Cx) -> R<Shape> {
    cx.exact_operands(2)?;
    let a = cx.array(0)?;
    let idx = cx.array(1)?;
    if !idx.element_type.is_integer() {
        invalid!("gather indices must be integers, got {}", idx.element_type);
    }
    let dn = cx.instr.gather_dimension_numbers();
    let Some(sizes) = slice_sizes(cx.instr) else {
        invalid!("gather needs slice_sizes=");
    };
    let ivd = dn.index_vector_dim;
    if ivd < 0 || ivd as usize > idx.rank() {
        invalid!(
            "index_vector_dim {ivd} is out of range for indices of rank {}",
            idx.rank()
        );
    }
    let ivd = ivd as usize;
    let index_vector_size = if ivd < idx.rank() { idx.dims[ivd] } else { 1 };
    if index_vector_size != dn.start_index_map.len() as i64 {
        invalid!(
            "gather index vector size {index_vector_size} does not match start_index_map {:?}",
            dn.start_index_map
        );
    }
    if dn.operand_batching_dims.len() != dn.start_indices_batching_dims.len() {
        invalid!("operand_batching_dims and start_indices_batching_dims differ in length");
    }
    if sizes.len() != a.rank() {
        invalid!(
            "slice_sizes has {} entries but the operand has rank {}",
            sizes.len(),
            a.rank()
        );
    }
    for (i, (&s, &d)) in sizes.iter().zip(&a.dims).enumerate() {
        if s < 0 || s > d {
            invalid!("slice size {s} of dimension {i} is not within [0, {d}]");
        }
    }
    for &d in dn.start_index_map.iter() {
        dim_index(d, a.rank(), "start_index_map entry")?;
    }
    check_unique(&dn.start_index_map, "start_index_map")?;
    let mut removed = dn.collapsed_slice_dims.clone();
    removed.extend(&dn.operand_batching_dims);
    check_unique(&removed, "collapsed_slice_dims and operand_batching_dims")?;
    for &d in &removed {
        let u = dim_index(d, a.rank(), "collapsed or batching dimension")?;
        if sizes[u] > 1 {
            invalid!(
                "collapsed or batching dimension {d} has slice size {} > 1",
                sizes[u]
            );
        }
    }
    for &d in &dn.start_indices_batching_dims {
        let u = dim_index(d, idx.rank(), "start_indices_batching_dims entry")?;
        if u == ivd {
            invalid!("start_indices_batching_dims contains index_vector_dim");
        }
    }
    let offset_sizes: Vec<i64> = (0..a.rank())
        .filter(|d| !removed.contains(&(*d as i64)))
        .map(|d| sizes[d])
        .collect();
    if offset_sizes.len() != dn.offset_dims.len() {
        invalid!(
            "gather has {} offset_dims but {} uncollapsed slice dimensions",
            dn.offset_dims.len(),
            offset_sizes.len()
        );
    }
    let batch: Vec<i64> = (0..idx.rank())
        .filter(|&d| d != ivd)
        .map(|d| idx.dims[d])
        .collect();
    let out_rank = offset_sizes.len() + batch.len();
    check_unique(&dn.offset_dims, "offset_dims")?;
    for w in dn.offset_dims.windows(2) {
        if w[0] > w[1] {
            invalid!("offset_dims must be sorted");
        }
    }
    for &d in &dn.offset_dims {
        dim_index(d, out_rank, "offset_dims entry")?;
    }
    let (mut oi, mut bi) = (0usize, 0usize);
    let mut dims = Vec::with_capacity(out_rank);
    for i in 0..out_rank {
        if dn.offset_dims.contains(&(i as i64)) {
            dims.push(offset_sizes[oi]);
            oi += 1;
        } else {
            match batch.get(bi) {
                Some(&b) => dims.push(b),
                None => invalid!("gather output rank does not add up"),
            }
            bi += 1;
        }
    }
    Ok(array_shape(a.element_type, dims))
}

pub(super) fn infer_scatter(cx: &Cx) -> R<Shape> {
    let n = cx.ops.len();
    if n < 3 || n & 1 == 0 {
        invalid!("scatter needs N operands, the indices and N updates, got {n} operands");
    }
    let k = (n - 1) / 2;
    let a0 = cx.array(0)?;
    for i in 1..k {
        if cx.array(i)?.dims != a0.dims {
            invalid!("scatter operands must have the same dimensions");
        }
    }
    let idx = cx.array(k)?;
    if !idx.element_type.is_integer() {
        invalid!("scatter indices must be integers, got {}", idx.element_type);
    }
    let dn = cx.instr.scatter_dimension_numbers();
    let ivd = dn.index_vector_dim;
    if ivd < 0 || ivd as usize > idx.rank() {
        invalid!(
            "index_vector_dim {ivd} is out of range for indices of rank {}",
            idx.rank()
        );
    }
    let ivd = ivd as usize;
    let index_vector_size = if ivd < idx.rank() { idx.dims[ivd] } else { 1 };
    if index_vector_size != dn.scatter_dims_to_operand_dims.len() as i64 {
        invalid!(
            "scatter index vector size {index_vector_size} does not match scatter_dims_to_operand_dims {:?}",
            dn.scatter_dims_to_operand_dims
        );
    }
    for &d in &dn.scatter_dims_to_operand_dims {
        dim_index(d, a0.rank(), "scatter_dims_to_operand_dims entry")?;
    }
    if dn.input_batching_dims.len() != dn.scatter_indices_batching_dims.len() {
        invalid!("input_batching_dims and scatter_indices_batching_dims differ in length");
    }
    let mut removed = dn.inserted_window_dims.clone();
    removed.extend(&dn.input_batching_dims);
    check_unique(&removed, "inserted_window_dims and input_batching_dims")?;
    for &d in &removed {
        dim_index(d, a0.rank(), "inserted window or batching dimension")?;
    }
    check_unique(
        &dn.scatter_indices_batching_dims,
        "scatter_indices_batching_dims",
    )?;
    for &d in &dn.scatter_indices_batching_dims {
        if dim_index(d, idx.rank(), "scatter_indices_batching_dims entry")? == ivd {
            invalid!("scatter_indices_batching_dims contains index_vector_dim");
        }
    }
    let scatter_batch = idx.rank() - usize::from(ivd < idx.rank());
    let u0 = cx.array(k + 1)?;
    for i in k + 1..n {
        let u = cx.array(i)?;
        if u.dims != u0.dims {
            invalid!("scatter updates must have the same dimensions");
        }
        if u.element_type != cx.array(i - k - 1)?.element_type {
            invalid!(
                "scatter update {} has a different element type than its operand",
                i - k - 1
            );
        }
    }
    if u0.rank() != dn.update_window_dims.len() + scatter_batch {
        invalid!(
            "scatter updates have rank {} but update_window_dims ({}) plus scatter dimensions ({scatter_batch}) give {}",
            u0.rank(),
            dn.update_window_dims.len(),
            dn.update_window_dims.len() + scatter_batch
        );
    }
    let window_rank = a0.rank() as i64
        - dn.inserted_window_dims.len() as i64
        - dn.input_batching_dims.len() as i64;
    if dn.update_window_dims.len() as i64 != window_rank {
        invalid!(
            "update_window_dims has {} entries but the operand has {window_rank} window dimensions",
            dn.update_window_dims.len()
        );
    }
    for &d in &dn.update_window_dims {
        dim_index(d, u0.rank(), "update_window_dims entry")?;
    }
    Ok(tuple_or_single(&cx.ops[..k]))
}

pub(super) fn infer_get_dimension_size(cx: &Cx) -> R<Shape> {
    cx.exact_operands(1)?;
    let a = cx.array(0)?;
    let dims = cx.instr.dimensions();
    if dims.len() != 1 {
        invalid!("get-dimension-size needs exactly one dimension");
    }
    dim_index(dims[0], a.rank(), "dimension")?;
    Ok(Shape::scalar(PrimitiveType::S32))
}

pub(super) fn infer_set_dimension_size(cx: &Cx) -> R<Shape> {
    cx.exact_operands(2)?;
    let a = cx.array(0)?;
    let size = cx.array(1)?;
    if size.rank() != 0 || !size.element_type.is_integer() {
        invalid!("set-dimension-size's size operand must be an integer scalar");
    }
    let dims = cx.instr.dimensions();
    if dims.len() != 1 {
        invalid!("set-dimension-size needs exactly one dimension");
    }
    let d = dim_index(dims[0], a.rank(), "dimension")?;
    let mut out = a.clone();
    out.layout = None;
    if out.dynamic.len() != out.rank() {
        out.dynamic = vec![false; out.rank()];
    }
    out.dynamic[d] = true;
    Ok(Shape::Array(out))
}
