//! Index arithmetic shared by the data-movement ops: row-major strides,
//! multi-index iteration and one general strided gather that implements
//! broadcast, transpose, slice and reverse as a single copy loop.
//!
//! Invariants: all functions take sizes already validated by their caller
//! (offsets and strides keep every touched source index in bounds); the
//! strided gather runs on rayon's pool for large outputs and produces the
//! same result as the sequential loop.

use rayon::prelude::*;

/// Elements above which a copy loop is split across threads.
pub const PAR_THRESHOLD: usize = 1 << 16;

/// Row-major strides of `dims`.
pub fn strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1].max(0);
    }
    s
}

/// Decomposes a flat row-major index into a multi-index.
pub fn unflatten(mut flat: usize, dims: &[usize], out: &mut [usize]) {
    for d in (0..dims.len()).rev() {
        let n = dims[d].max(1);
        out[d] = flat % n;
        flat /= n;
    }
}

/// Advances a row-major multi-index; returns false after the last index.
#[inline]
pub fn next_index(idx: &mut [usize], dims: &[usize]) -> bool {
    for d in (0..dims.len()).rev() {
        idx[d] += 1;
        if idx[d] < dims[d] {
            return true;
        }
        idx[d] = 0;
    }
    false
}

/// Simplifies a (dims, strides) description: drops size-1 dims and merges
/// adjacent dims that are contiguous with each other.
fn simplify(dims: &[usize], strides: &[isize]) -> (Vec<usize>, Vec<isize>) {
    let mut od: Vec<usize> = Vec::new();
    let mut os: Vec<isize> = Vec::new();
    for (&d, &s) in dims.iter().zip(strides) {
        if d == 1 {
            continue;
        }
        if let (Some(&pd), Some(&ps)) = (od.last(), os.last()) {
            if ps == s * d as isize {
                *od.last_mut().expect("nonempty") = pd * d;
                *os.last_mut().expect("nonempty") = s;
                continue;
            }
        }
        od.push(d);
        os.push(s);
    }
    (od, os)
}

/// out[i] = src[offset + sum_d idx_d * strides[d]] over the row-major
/// multi-indices `idx` of `out_dims`.
pub fn strided_gather<T: Copy + Send + Sync>(
    src: &[T],
    offset: isize,
    out_dims: &[usize],
    src_strides: &[isize],
) -> Vec<T> {
    let total: usize = out_dims.iter().product();
    if total == 0 {
        return Vec::new();
    }
    let (dims, strides) = simplify(out_dims, src_strides);
    if dims.is_empty() {
        return vec![src[offset as usize]];
    }
    let rank = dims.len();
    let inner = dims[rank - 1];
    let inner_stride = strides[rank - 1];
    let outer_dims = &dims[..rank - 1];
    let outer_strides = &strides[..rank - 1];
    let rows = total / inner;
    let mut out = vec![src[offset as usize]; total];
    let fill_rows = |row0: usize, chunk: &mut [T]| {
        let mut idx = vec![0usize; outer_dims.len()];
        unflatten(row0, outer_dims, &mut idx);
        for row in chunk.chunks_mut(inner) {
            let base: isize = offset
                + idx
                    .iter()
                    .zip(outer_strides)
                    .map(|(&i, &s)| i as isize * s)
                    .sum::<isize>();
            if inner_stride == 1 {
                let b = base as usize;
                row.copy_from_slice(&src[b..b + inner]);
            } else if inner_stride == 0 {
                row.fill(src[base as usize]);
            } else {
                let mut p = base;
                for o in row.iter_mut() {
                    *o = src[p as usize];
                    p += inner_stride;
                }
            }
            next_index(&mut idx, outer_dims);
        }
    };
    if total >= PAR_THRESHOLD && rows > 1 {
        let rows_per_chunk = (PAR_THRESHOLD / inner).max(1);
        out.par_chunks_mut(rows_per_chunk * inner)
            .enumerate()
            .for_each(|(c, chunk)| fill_rows(c * rows_per_chunk, chunk));
    } else {
        fill_rows(0, &mut out);
    }
    out
}

/// Writes `src` (dense, row-major over `dims`) into `dst` at
/// `offset + sum idx_d * dst_strides[d]`.
pub fn strided_scatter<T: Copy>(
    dst: &mut [T],
    offset: isize,
    dims: &[usize],
    dst_strides: &[isize],
    src: &[T],
) {
    let total: usize = dims.iter().product();
    if total == 0 {
        return;
    }
    let (dims, strides) = simplify(dims, dst_strides);
    if dims.is_empty() {
        dst[offset as usize] = src[0];
        return;
    }
    let rank = dims.len();
    let inner = dims[rank - 1];
    let inner_stride = strides[rank - 1];
    let outer_dims = &dims[..rank - 1];
    let outer_strides = &strides[..rank - 1];
    let mut idx = vec![0usize; outer_dims.len()];
    for row in src.chunks(inner) {
        let base: isize = offset
            + idx
                .iter()
                .zip(outer_strides)
                .map(|(&i, &s)| i as isize * s)
                .sum::<isize>();
        if inner_stride == 1 {
            let b = base as usize;
            dst[b..b + inner].copy_from_slice(row);
        } else {
            let mut p = base;
            for &v in row {
                dst[p as usize] = v;
                p += inner_stride;
            }
        }
        next_index(&mut idx, outer_dims);
    }
}

/// Converts i64 dims to usize (negative as 0).
pub fn udims(dims: &[i64]) -> Vec<usize> {
    dims.iter().map(|&d| d.max(0) as usize).collect()
}
