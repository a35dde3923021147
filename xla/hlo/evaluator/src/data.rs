//! Data-movement ops: broadcast, transpose, slice, reverse, dynamic-slice,
//! dynamic-update-slice, pad, concatenate, iota, gather and the index part of
//! scatter.
//!
//! Invariants: every op validates its attributes against the operand shapes
//! before touching memory and returns an error (never panics) when they
//! disagree; dynamic indices are clamped exactly as XLA clamps them
//! (dynamic-slice, dynamic-update-slice, gather); the result's dims are the
//! ones XLA's shape inference gives.

use crate::error::{bad, EvalError};
use crate::index::{next_index, strided_gather, strided_scatter, strides, udims};
use crate::value::{element_count, storage_of, Array, Data, Storage};
use half::{bf16, f16};
use xla_hlo_ir::attrs::{GatherDimensionNumbers, PaddingDim, SliceDim};
use xla_hlo_ir::PrimitiveType;

fn gather_view(a: &Array, offset: isize, out_dims: &[i64], src_strides: &[isize]) -> Array {
    let od = udims(out_dims);
    let data = crate::map_data!(&*a.data, v => strided_gather(v, offset, &od, src_strides));
    Array::from_parts(a.ty, out_dims.to_vec(), data)
}

/// broadcast: operand dim k becomes result dim `dimensions[k]`.
pub fn broadcast(a: &Array, out_dims: &[i64], dimensions: &[i64]) -> Result<Array, EvalError> {
    if dimensions.len() != a.rank() {
        return bad(format!(
            "broadcast: {} dimensions for an operand of rank {}",
            dimensions.len(),
            a.rank()
        ));
    }
    let st = strides(&a.dims);
    let mut s = vec![0isize; out_dims.len()];
    for (k, &d) in dimensions.iter().enumerate() {
        let d = usize::try_from(d).ok().filter(|&d| d < out_dims.len());
        let Some(d) = d else {
            return bad("broadcast: dimension out of range");
        };
        if out_dims[d] != a.dims[k] {
            return bad(format!(
                "broadcast: operand dim {k} ({}) does not match result dim {d} ({})",
                a.dims[k], out_dims[d]
            ));
        }
        s[d] = st[k] as isize;
    }
    if a.is_empty() {
        return Array::zeros(a.ty, out_dims.to_vec());
    }
    Ok(gather_view(a, 0, out_dims, &s))
}

/// transpose: result dim i is operand dim `perm[i]`.
pub fn transpose(a: &Array, perm: &[i64]) -> Result<Array, EvalError> {
    if perm.len() != a.rank() {
        return bad("transpose: permutation length differs from rank");
    }
    let mut seen = vec![false; a.rank()];
    let st = strides(&a.dims);
    let mut out_dims = Vec::with_capacity(perm.len());
    let mut s = Vec::with_capacity(perm.len());
    for &p in perm {
        let Some(p) = usize::try_from(p)
            .ok()
            .filter(|&p| p < a.rank() && !seen[p])
        else {
            return bad("transpose: invalid permutation");
        };
        seen[p] = true;
        out_dims.push(a.dims[p]);
        s.push(st[p] as isize);
    }
    if perm.iter().enumerate().all(|(i, &p)| i as i64 == p) {
        return Ok(a.clone());
    }
    if a.is_empty() {
        return Array::zeros(a.ty, out_dims);
    }
    Ok(gather_view(a, 0, &out_dims, &s))
}

/// slice with `[start:limit:stride]` per dimension.
pub fn slice(a: &Array, dims: &[SliceDim]) -> Result<Array, EvalError> {
    if dims.len() != a.rank() {
        return bad("slice: attribute rank differs from operand rank");
    }
    let st = strides(&a.dims);
    let mut offset = 0isize;
    let mut out_dims = Vec::new();
    let mut s = Vec::new();
    for (d, sd) in dims.iter().enumerate() {
        if sd.stride <= 0 || sd.start < 0 || sd.limit > a.dims[d] || sd.start > sd.limit {
            return bad(format!(
                "slice: [{}:{}:{}] is out of range for dim {d} of size {}",
                sd.start, sd.limit, sd.stride, a.dims[d]
            ));
        }
        let n = (sd.limit - sd.start + sd.stride - 1) / sd.stride;
        out_dims.push(n);
        offset += (sd.start * st[d]) as isize;
        s.push((sd.stride * st[d]) as isize);
    }
    if element_count(&out_dims) == 0 {
        return Array::zeros(a.ty, out_dims);
    }
    Ok(gather_view(a, offset, &out_dims, &s))
}

/// reverse along `dims`.
pub fn reverse(a: &Array, dims: &[i64]) -> Result<Array, EvalError> {
    let st = strides(&a.dims);
    let mut s: Vec<isize> = st.iter().map(|&x| x as isize).collect();
    let mut offset = 0isize;
    for &d in dims {
        let Some(d) = usize::try_from(d).ok().filter(|&d| d < a.rank()) else {
            return bad("reverse: dimension out of range");
        };
        if a.dims[d] > 0 {
            offset += ((a.dims[d] - 1) * st[d]) as isize;
        }
        s[d] = -s[d];
    }
    if a.is_empty() {
        return Ok(a.clone());
    }
    Ok(gather_view(a, offset, &a.dims, &s))
}

/// Clamped start indices of a dynamic slice of `sizes` from `dims`.
pub fn clamp_starts(starts: &[i64], dims: &[i64], sizes: &[i64]) -> Vec<i64> {
    starts
        .iter()
        .zip(dims.iter().zip(sizes))
        .map(|(&s, (&d, &z))| s.clamp(0, (d - z).max(0)))
        .collect()
}

/// Reads scalar start indices.
pub fn scalar_indices(idx: &[&Array]) -> Result<Vec<i64>, EvalError> {
    idx.iter()
        .map(|a| {
            if a.len() != 1 {
                bad("start index operand is not a scalar")
            } else {
                Ok(a.get_i64(0))
            }
        })
        .collect()
}

/// dynamic-slice with clamped starts.
pub fn dynamic_slice(a: &Array, starts: &[i64], sizes: &[i64]) -> Result<Array, EvalError> {
    if starts.len() != a.rank() || sizes.len() != a.rank() {
        return bad("dynamic-slice: index count differs from rank");
    }
    if sizes.iter().zip(&a.dims).any(|(&z, &d)| z < 0 || z > d) {
        return bad("dynamic-slice: slice sizes exceed the operand");
    }
    let starts = clamp_starts(starts, &a.dims, sizes);
    let sd: Vec<SliceDim> = starts
        .iter()
        .zip(sizes)
        .map(|(&s, &z)| SliceDim {
            start: s,
            limit: s + z,
            stride: 1,
        })
        .collect();
    slice(a, &sd)
}

/// dynamic-update-slice with clamped starts.
pub fn dynamic_update_slice(a: &Array, upd: &Array, starts: &[i64]) -> Result<Array, EvalError> {
    if starts.len() != a.rank() || upd.rank() != a.rank() || upd.ty != a.ty {
        return bad("dynamic-update-slice: operand and update disagree");
    }
    if upd.dims.iter().zip(&a.dims).any(|(&z, &d)| z > d) {
        return bad("dynamic-update-slice: update larger than operand");
    }
    let starts = clamp_starts(starts, &a.dims, &upd.dims);
    let st = strides(&a.dims);
    let offset: isize = starts
        .iter()
        .zip(&st)
        .map(|(&s, &t)| (s * t) as isize)
        .sum();
    let s: Vec<isize> = st.iter().map(|&x| x as isize).collect();
    let mut out = a.clone();
    if upd.is_empty() {
        return Ok(out);
    }
    let ud = udims(&upd.dims);
    let dst = std::sync::Arc::make_mut(&mut out.data);
    crate::zip_data!(dst, &*upd.data, d, u => strided_scatter(d, offset, &ud, &s, u), else return bad("dynamic-update-slice: storage differs"));
    Ok(out)
}

/// pad with low/high (possibly negative) and interior padding.
pub fn pad(a: &Array, value: &Array, padding: &[PaddingDim]) -> Result<Array, EvalError> {
    if padding.len() != a.rank() || value.len() != 1 || value.ty != a.ty {
        return bad("pad: padding config or value does not match the operand");
    }
    let mut out_dims = Vec::new();
    for (d, p) in padding.iter().enumerate() {
        if p.interior < 0 {
            return bad("pad: negative interior padding");
        }
        let n = a.dims[d];
        let size = p.low + p.high + n + (n - 1).max(0) * p.interior;
        if size < 0 {
            return bad("pad: negative result dimension");
        }
        out_dims.push(size);
    }
    let total = element_count(&out_dims);
    let mut data = crate::map_data!(&*value.data, v => vec![v[0]; total]);
    // The block of input elements that land inside the output.
    let ost = strides(&out_dims);
    let ist = strides(&a.dims);
    let mut in_offset = 0isize;
    let mut out_offset = 0isize;
    let mut block = Vec::new();
    let mut in_s = Vec::new();
    let mut out_s = Vec::new();
    for (d, p) in padding.iter().enumerate() {
        let step = p.interior + 1;
        let n = a.dims[d];
        // first i with low + i*step >= 0
        let first = if p.low >= 0 {
            0
        } else {
            (-p.low + step - 1) / step
        };
        // last i with low + i*step < out
        let mut count = 0;
        if first < n {
            let last_pos = out_dims[d] - 1 - p.low;
            if last_pos >= 0 {
                let last = (last_pos / step).min(n - 1);
                count = (last - first + 1).max(0);
            }
        }
        block.push(count);
        in_offset += (first * ist[d]) as isize;
        out_offset += ((p.low + first * step) * ost[d]) as isize;
        in_s.push(ist[d] as isize);
        out_s.push((step * ost[d]) as isize);
    }
    if element_count(&block) > 0 {
        let bd = udims(&block);
        crate::zip_data!(&mut data, &*a.data, o, i => {
            let src = strided_gather(i, in_offset, &bd, &in_s);
            strided_scatter(o, out_offset, &bd, &out_s, &src);
        }, else return bad("pad: storage differs"));
    }
    Ok(Array::from_parts(a.ty, out_dims, data))
}

/// concatenate along `dim`.
pub fn concatenate(parts: &[&Array], dim: i64) -> Result<Array, EvalError> {
    let Some(first) = parts.first() else {
        return bad("concatenate: no operands");
    };
    let Some(d) = usize::try_from(dim).ok().filter(|&d| d < first.rank()) else {
        return bad("concatenate: dimension out of range");
    };
    let mut out_dims = first.dims.clone();
    out_dims[d] = 0;
    for p in parts {
        if p.ty != first.ty
            || p.rank() != first.rank()
            || (0..p.rank()).any(|k| k != d && p.dims[k] != first.dims[k])
        {
            return bad("concatenate: operand shapes disagree");
        }
        out_dims[d] += p.dims[d];
    }
    let outer: usize = first.dims[..d].iter().map(|&x| x as usize).product();
    let inner: usize = first.dims[d + 1..].iter().map(|&x| x as usize).product();
    let data;
    let total = element_count(&out_dims);
    macro_rules! go {
        ($V:ident) => {{
            let mut out = Vec::with_capacity(total);
            let srcs: Vec<&Vec<_>> = parts
                .iter()
                .map(|p| match &*p.data {
                    Data::$V(v) => v,
                    _ => unreachable!("types checked"),
                })
                .collect();
            for o in 0..outer {
                for (p, s) in parts.iter().zip(&srcs) {
                    let chunk = p.dims[d] as usize * inner;
                    out.extend_from_slice(&s[o * chunk..(o + 1) * chunk]);
                }
            }
            data = Data::$V(out);
        }};
    }
    match storage_of(first.ty)? {
        Storage::Pred => go!(Pred),
        Storage::S8 => go!(S8),
        Storage::S16 => go!(S16),
        Storage::S32 => go!(S32),
        Storage::S64 => go!(S64),
        Storage::U8 => go!(U8),
        Storage::U16 => go!(U16),
        Storage::U32 => go!(U32),
        Storage::U64 => go!(U64),
        Storage::F16 => go!(F16),
        Storage::Bf16 => go!(Bf16),
        Storage::F32 => go!(F32),
        Storage::F64 => go!(F64),
        Storage::F8 => go!(F8),
        Storage::C64 => go!(C64),
        Storage::C128 => go!(C128),
    }
    Ok(Array::from_parts(first.ty, out_dims, data))
}

/// iota along `dim`.
pub fn iota(ty: PrimitiveType, dims: &[i64], dim: i64) -> Result<Array, EvalError> {
    let Some(d) = usize::try_from(dim).ok().filter(|&d| d < dims.len()) else {
        return bad("iota: dimension out of range");
    };
    let n = element_count(dims);
    let inner: usize = dims[d + 1..].iter().map(|&x| x as usize).product();
    let len = dims[d].max(1) as usize;
    let idx = |i: usize| (i / inner.max(1)) % len;
    let data = match storage_of(ty)? {
        Storage::Pred => Data::Pred((0..n).map(|i| idx(i) != 0).collect()),
        Storage::S8 => Data::S8((0..n).map(|i| idx(i) as i8).collect()),
        Storage::S16 => Data::S16((0..n).map(|i| idx(i) as i16).collect()),
        Storage::S32 => Data::S32((0..n).map(|i| idx(i) as i32).collect()),
        Storage::S64 => Data::S64((0..n).map(|i| idx(i) as i64).collect()),
        Storage::U8 => Data::U8((0..n).map(|i| idx(i) as u8).collect()),
        Storage::U16 => Data::U16((0..n).map(|i| idx(i) as u16).collect()),
        Storage::U32 => Data::U32((0..n).map(|i| idx(i) as u32).collect()),
        Storage::U64 => Data::U64((0..n).map(|i| idx(i) as u64).collect()),
        Storage::F16 => Data::F16((0..n).map(|i| f16::from_f64(idx(i) as f64)).collect()),
        Storage::Bf16 => Data::Bf16((0..n).map(|i| bf16::from_f64(idx(i) as f64)).collect()),
        Storage::F32 => Data::F32((0..n).map(|i| idx(i) as f32).collect()),
        Storage::F64 => Data::F64((0..n).map(|i| idx(i) as f64).collect()),
        Storage::F8 | Storage::C64 | Storage::C128 => {
            let v: Vec<f64> = (0..n).map(|i| idx(i) as f64).collect();
            return Array::from_f64s(ty, dims.to_vec(), &v);
        }
    };
    Ok(Array::from_parts(ty, dims.to_vec(), data))
}

/// For each batch position of `indices` (all dims but `index_vector_dim`,
/// in order), the index vector it holds.
pub fn index_vectors(
    indices: &Array,
    index_vector_dim: i64,
) -> Result<(Vec<i64>, Vec<Vec<i64>>), EvalError> {
    let rank = indices.rank();
    let ivd = usize::try_from(index_vector_dim)
        .ok()
        .filter(|&d| d <= rank)
        .ok_or_else(|| EvalError::Invalid("index_vector_dim out of range".into()))?;
    let batch_dims: Vec<i64> = (0..rank)
        .filter(|&d| d != ivd)
        .map(|d| indices.dims[d])
        .collect();
    let vlen = if ivd < rank {
        indices.dims[ivd] as usize
    } else {
        1
    };
    let st = strides(&indices.dims);
    let vstride = if ivd < rank { st[ivd] as usize } else { 0 };
    let nb = element_count(&batch_dims);
    let bd = udims(&batch_dims);
    let bstrides: Vec<usize> = (0..rank)
        .filter(|&d| d != ivd)
        .map(|d| st[d] as usize)
        .collect();
    let mut out = Vec::with_capacity(nb);
    let mut idx = vec![0usize; bd.len()];
    for _ in 0..nb {
        let base: usize = idx.iter().zip(&bstrides).map(|(&i, &s)| i * s).sum();
        out.push(
            (0..vlen)
                .map(|k| indices.get_i64(base + k * vstride))
                .collect(),
        );
        next_index(&mut idx, &bd);
    }
    Ok((batch_dims, out))
}

/// gather with XLA's dimension numbers (including batching dims); start
/// indices are clamped so each slice lies inside the operand.
pub fn gather(
    a: &Array,
    indices: &Array,
    dn: &GatherDimensionNumbers,
    slice_sizes: &[i64],
    out_dims: &[i64],
) -> Result<Array, EvalError> {
    let rank = a.rank();
    if slice_sizes.len() != rank {
        return bad("gather: slice_sizes length differs from operand rank");
    }
    if slice_sizes
        .iter()
        .zip(&a.dims)
        .any(|(&z, &d)| z < 0 || z > d)
    {
        return bad("gather: slice_sizes exceed the operand");
    }
    let (batch_dims, vectors) = index_vectors(indices, dn.index_vector_dim)?;
    let ivd = dn.index_vector_dim as usize;
    // Map indices dims (without the index vector dim) to batch positions.
    let idx_dims_wo: Vec<usize> = (0..indices.rank()).filter(|&d| d != ivd).collect();
    // Operand dims that appear in the output as offset dims.
    let offset_operand_dims: Vec<usize> = (0..rank)
        .filter(|d| {
            !dn.collapsed_slice_dims.contains(&(*d as i64))
                && !dn.operand_batching_dims.contains(&(*d as i64))
        })
        .collect();
    if offset_operand_dims.len() != dn.offset_dims.len() {
        return bad("gather: offset_dims do not match the non-collapsed operand dims");
    }
    if out_dims.len() != batch_dims.len() + dn.offset_dims.len() {
        return bad("gather: result rank does not match");
    }
    let ast = strides(&a.dims);
    // Base offset of each batch position.
    let bd = udims(&batch_dims);
    let mut bidx = vec![0usize; bd.len()];
    let mut bases = Vec::with_capacity(vectors.len());
    for v in &vectors {
        let mut start = vec![0i64; rank];
        for (k, &od) in dn.start_index_map.iter().enumerate() {
            let Some(od) = usize::try_from(od).ok().filter(|&d| d < rank) else {
                return bad("gather: start_index_map out of range");
            };
            start[od] = *v
                .get(k)
                .ok_or_else(|| EvalError::Invalid("gather: index vector too short".into()))?;
        }
        for (i, &obd) in dn.operand_batching_dims.iter().enumerate() {
            let sbd = *dn
                .start_indices_batching_dims
                .get(i)
                .ok_or_else(|| EvalError::Invalid("gather: batching dims mismatch".into()))?
                as usize;
            let pos = idx_dims_wo.iter().position(|&d| d == sbd).ok_or_else(|| {
                EvalError::Invalid("gather: batching dim is the index vector dim".into())
            })?;
            start[obd as usize] = bidx[pos] as i64;
        }
        let start = clamp_starts(&start, &a.dims, slice_sizes);
        bases.push(start.iter().zip(&ast).map(|(&s, &t)| s * t).sum::<i64>() as usize);
        next_index(&mut bidx, &bd);
    }
    // Output dims: which are offset dims (and to which operand dim) vs batch dims.
    let od = udims(out_dims);
    let mut role: Vec<Option<usize>> = vec![None; od.len()];
    for (k, &o) in dn.offset_dims.iter().enumerate() {
        let Some(o) = usize::try_from(o).ok().filter(|&o| o < od.len()) else {
            return bad("gather: offset dim out of range");
        };
        role[o] = Some(offset_operand_dims[k]);
        if out_dims[o] != slice_sizes[offset_operand_dims[k]] {
            return bad("gather: result dim does not match slice size");
        }
    }
    let batch_out: Vec<usize> = (0..od.len()).filter(|&d| role[d].is_none()).collect();
    let bstr = strides(&batch_dims);
    let total = element_count(out_dims);
    let mut oidx = vec![0usize; od.len()];
    let mut src_index = Vec::with_capacity(total);
    for _ in 0..total {
        let mut b = 0usize;
        for (k, &d) in batch_out.iter().enumerate() {
            b += oidx[d] * bstr[k] as usize;
        }
        let mut off = bases[b];
        for (d, r) in role.iter().enumerate() {
            if let Some(opd) = r {
                off += oidx[d] * ast[*opd] as usize;
            }
        }
        src_index.push(off);
        next_index(&mut oidx, &od);
    }
    // A collapsed slice dimension of size 0 (which XLA's shape rules allow)
    // selects no operand element for an output that has elements.
    if src_index.iter().any(|&i| i >= a.len()) {
        return bad(
            "gather: the slices read past the operand (a slice size of 0 selects no element)",
        );
    }
    let data = crate::map_data!(&*a.data, v => src_index.iter().map(|&i| v[i]).collect());
    Ok(Array::from_parts(a.ty, out_dims.to_vec(), data))
}
