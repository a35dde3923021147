//! Shape rules of the dimension-based collectives and the strided block
//! copies that implement them on row-major byte buffers.
//!
//! Invariants: every function here validates its dimensions and returns an
//! error rather than panicking; `copy_block` only touches bytes inside the
//! source and destination hyper-rectangles it is given.

use crate::buffer::{element_count, DeviceBuffer};
use crate::error::{CollectiveError, Result};

fn invalid(msg: String) -> CollectiveError {
    CollectiveError::InvalidArgument(msg)
}

fn check_dim(dims: &[i64], dim: usize, what: &str) -> Result<()> {
    if dim >= dims.len() {
        return Err(invalid(format!(
            "{what} dimension {dim} out of range for rank-{} shape {dims:?}",
            dims.len()
        )));
    }
    Ok(())
}

/// Output dims of an all-gather over `n` ranks along `dim`.
pub fn all_gather_dims(dims: &[i64], dim: usize, n: usize) -> Result<Vec<i64>> {
    check_dim(dims, dim, "all-gather")?;
    let mut out = dims.to_vec();
    out[dim] = dims[dim]
        .checked_mul(n as i64)
        .ok_or_else(|| invalid(format!("all-gather of {dims:?} over {n} ranks overflows")))?;
    element_count(&out)?;
    Ok(out)
}

/// Output dims of a reduce-scatter over `n` ranks along `dim`.
pub fn reduce_scatter_dims(dims: &[i64], dim: usize, n: usize) -> Result<Vec<i64>> {
    check_dim(dims, dim, "reduce-scatter")?;
    if n == 0 || dims[dim] % n as i64 != 0 {
        return Err(invalid(format!(
            "reduce-scatter dimension {dim} of {dims:?} is not divisible by the group size {n}"
        )));
    }
    let mut out = dims.to_vec();
    out[dim] /= n as i64;
    Ok(out)
}

/// Output dims of an all-to-all over `n` ranks (split `split`, concatenate
/// along `concat`).
pub fn all_to_all_dims(dims: &[i64], split: usize, concat: usize, n: usize) -> Result<Vec<i64>> {
    check_dim(dims, split, "all-to-all split")?;
    check_dim(dims, concat, "all-to-all concat")?;
    if n == 0 || dims[split] % n as i64 != 0 {
        return Err(invalid(format!(
            "all-to-all split dimension {split} of {dims:?} is not divisible by the group size {n}"
        )));
    }
    let mut out = dims.to_vec();
    out[split] /= n as i64;
    out[concat] = out[concat]
        .checked_mul(n as i64)
        .ok_or_else(|| invalid(format!("all-to-all of {dims:?} overflows")))?;
    Ok(out)
}

/// `(outer, dim, inner_bytes)` of `dims` around dimension `d`: the array is
/// `outer` rows of `dim` slabs of `inner_bytes` each. A `d` past the last
/// dimension reads as a trailing dimension of size 1.
pub fn split_at(dims: &[i64], d: usize, esize: usize) -> (usize, usize, usize) {
    let d = d.min(dims.len());
    let outer: usize = dims[..d].iter().map(|&x| x.max(0) as usize).product();
    let inner: usize = dims
        .get(d + 1..)
        .unwrap_or(&[])
        .iter()
        .map(|&x| x.max(0) as usize)
        .product();
    let dim = dims.get(d).map_or(1, |&x| x.max(0) as usize);
    (outer, dim, inner * esize)
}

/// Copies the hyper-rectangle of extent `extent` starting at `src_start` in
/// a row-major array `src` of dims `src_dims` to `dst_start` in `dst` of
/// dims `dst_dims` (elements of `esize` bytes).
#[allow(clippy::too_many_arguments)]
pub fn copy_block(
    src: &[u8],
    src_dims: &[i64],
    src_start: &[usize],
    dst: &mut [u8],
    dst_dims: &[i64],
    dst_start: &[usize],
    extent: &[usize],
    esize: usize,
) -> Result<()> {
    let rank = extent.len();
    if src_dims.len() != rank
        || dst_dims.len() != rank
        || src_start.len() != rank
        || dst_start.len() != rank
    {
        return Err(invalid("copy_block: rank mismatch".into()));
    }
    for k in 0..rank {
        if src_start[k] + extent[k] > src_dims[k] as usize
            || dst_start[k] + extent[k] > dst_dims[k] as usize
        {
            return Err(invalid(format!(
                "copy_block: block {extent:?} at {src_start:?}/{dst_start:?} exceeds {src_dims:?}/{dst_dims:?}"
            )));
        }
    }
    if src.len() != element_count(src_dims)? * esize
        || dst.len() != element_count(dst_dims)? * esize
    {
        return Err(invalid("copy_block: buffer sizes do not match dims".into()));
    }
    if extent.contains(&0) {
        return Ok(());
    }
    // Merge trailing dimensions copied whole in both arrays into one run.
    let mut run = esize;
    let mut k = rank;
    while k > 0 {
        let d = k - 1;
        run *= extent[d];
        let whole = extent[d] == src_dims[d] as usize && extent[d] == dst_dims[d] as usize;
        k = d;
        if !whole {
            break;
        }
    }
    // Dims 0..k are iterated; dim k (if any) was partially folded into run.
    let strides = |dims: &[i64]| -> Vec<usize> {
        let mut s = vec![esize; rank];
        for d in (0..rank.saturating_sub(1)).rev() {
            s[d] = s[d + 1] * dims[d + 1] as usize;
        }
        s
    };
    let ss = strides(src_dims);
    let ds = strides(dst_dims);
    let base_src: usize = (0..rank).map(|d| src_start[d] * ss[d]).sum();
    let base_dst: usize = (0..rank).map(|d| dst_start[d] * ds[d]).sum();
    let mut idx = vec![0usize; k];
    loop {
        let so = base_src + (0..k).map(|d| idx[d] * ss[d]).sum::<usize>();
        let doff = base_dst + (0..k).map(|d| idx[d] * ds[d]).sum::<usize>();
        dst[doff..doff + run].copy_from_slice(&src[so..so + run]);
        // advance the odometer over dims 0..k
        let mut d = k;
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < extent[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Checks that every rank's operand list has the same length and that
/// operand `i` has the same type and dims on all ranks; returns a message
/// naming the first disagreement.
pub fn describe_shape_mismatch(
    mine: &[DeviceBuffer],
    my_rank: usize,
    theirs: &[DeviceBuffer],
    their_rank: usize,
) -> Option<String> {
    if mine.len() != theirs.len() {
        return Some(format!(
            "rank {my_rank} passed {} operands, rank {their_rank} passed {}",
            mine.len(),
            theirs.len()
        ));
    }
    for (i, (a, b)) in mine.iter().zip(theirs).enumerate() {
        if !a.same_shape(b) {
            return Some(format!(
                "operand {i} is {} on rank {my_rank} but {} on rank {their_rank}",
                a.shape_string(),
                b.shape_string()
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_rules() {
        assert_eq!(all_gather_dims(&[2, 3], 1, 4).unwrap(), vec![2, 12]);
        assert!(all_gather_dims(&[2, 3], 2, 4).is_err());
        assert_eq!(reduce_scatter_dims(&[8, 3], 0, 4).unwrap(), vec![2, 3]);
        assert!(reduce_scatter_dims(&[6, 3], 0, 4).is_err());
        assert_eq!(all_to_all_dims(&[8, 3], 0, 1, 4).unwrap(), vec![2, 12]);
        assert_eq!(all_to_all_dims(&[8, 3], 0, 0, 4).unwrap(), vec![8, 3]);
    }

    #[test]
    fn block_copy() {
        // src 2x3 bytes, copy column 1..3 of both rows into dst 2x4 at col 0
        let src: Vec<u8> = (0..6).collect();
        let mut dst = vec![0u8; 8];
        copy_block(
            &src,
            &[2, 3],
            &[0, 1],
            &mut dst,
            &[2, 4],
            &[0, 0],
            &[2, 2],
            1,
        )
        .unwrap();
        assert_eq!(dst, vec![1, 2, 0, 0, 4, 5, 0, 0]);
        assert!(copy_block(
            &src,
            &[2, 3],
            &[0, 2],
            &mut dst,
            &[2, 4],
            &[0, 0],
            &[2, 2],
            1
        )
        .is_err());
        // scalar
        let mut d = vec![0u8; 4];
        copy_block(&[1, 2, 3, 4], &[], &[], &mut d, &[], &[], &[], 4).unwrap();
        assert_eq!(d, vec![1, 2, 3, 4]);
    }
}
