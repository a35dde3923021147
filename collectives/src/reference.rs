//! Single-threaded reference semantics of every collective, element by
//! element: given the operand of each rank of one group (in rank order), the
//! result of each rank.
//!
//! This is the executable specification the backends are tested against.
//! It shares no kernel with them: reductions decode each element to a
//! scalar and fold it, data movement maps every output index back to its
//! source index. Speed is not a goal.
//!
//! Invariants: inputs are validated (same shapes where XLA requires them,
//! dimensions in range, divisibility) and errors are returned, never panics.

use crate::buffer::{element_size, DeviceBuffer, HostBytes};
use crate::error::{CollectiveError, Result};
use crate::groups::check_pairs;
use crate::layout;
use crate::reduce::ReductionKind;
use half::{bf16, f16};
use xla_hlo_ir::{PrimitiveType, TypeClass};

fn invalid(msg: String) -> CollectiveError {
    CollectiveError::InvalidArgument(msg)
}

fn same_shapes(inputs: &[DeviceBuffer]) -> Result<&DeviceBuffer> {
    let first = inputs
        .first()
        .ok_or_else(|| invalid("a collective needs at least one rank".into()))?;
    for (r, b) in inputs.iter().enumerate() {
        if !b.same_shape(first) {
            return Err(invalid(format!(
                "rank {r} has {} but rank 0 has {}",
                b.shape_string(),
                first.shape_string()
            )));
        }
    }
    Ok(first)
}

fn unravel(mut i: usize, dims: &[i64]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        let n = dims[d] as usize;
        idx[d] = i % n;
        i /= n;
    }
    idx
}

fn ravel(idx: &[usize], dims: &[i64]) -> usize {
    idx.iter()
        .zip(dims)
        .fold(0, |acc, (&i, &n)| acc * n as usize + i)
}

/// Builds an output of `dims` whose element `i` is copied from
/// `source(index of i)` = (input number, index in that input).
fn gather_elements(
    inputs: &[DeviceBuffer],
    dtype: PrimitiveType,
    dims: Vec<i64>,
    source: impl Fn(&[usize]) -> (usize, Vec<usize>),
) -> Result<DeviceBuffer> {
    let esize = element_size(dtype)?;
    let n = crate::buffer::element_count(&dims)?;
    let mut out = HostBytes::zeroed(n * esize);
    let o = out.as_bytes_mut();
    for i in 0..n {
        let idx = unravel(i, &dims);
        let (from, sidx) = source(&idx);
        let src = &inputs[from];
        let off = ravel(&sidx, src.dims()) * esize;
        o[i * esize..(i + 1) * esize].copy_from_slice(&src.bytes()[off..off + esize]);
    }
    DeviceBuffer::new(dtype, dims, out)
}

/// All-reduce: every rank gets the fold of all operands.
pub fn all_reduce(kind: ReductionKind, inputs: &[DeviceBuffer]) -> Result<Vec<DeviceBuffer>> {
    let first = same_shapes(inputs)?;
    let dtype = first.dtype();
    kind.check(dtype)?;
    let esize = element_size(dtype)?;
    let n = first.element_count();
    let mut out = HostBytes::zeroed(n * esize);
    for i in 0..n {
        let elems: Vec<&[u8]> = inputs
            .iter()
            .map(|b| &b.bytes()[i * esize..(i + 1) * esize])
            .collect();
        let v = fold_element(kind, dtype, &elems)?;
        out.as_bytes_mut()[i * esize..(i + 1) * esize].copy_from_slice(&v);
    }
    let result = DeviceBuffer::new(dtype, first.dims().to_vec(), out)?;
    Ok(vec![result; inputs.len()])
}

/// All-gather along `dim`: every rank gets the concatenation in rank order.
pub fn all_gather(dim: usize, inputs: &[DeviceBuffer]) -> Result<Vec<DeviceBuffer>> {
    let first = same_shapes(inputs)?;
    let dims = layout::all_gather_dims(first.dims(), dim, inputs.len())?;
    let per = first.dims()[dim] as usize;
    let out = gather_elements(inputs, first.dtype(), dims, |idx| {
        let mut s = idx.to_vec();
        s[dim] = idx[dim] % per;
        (idx[dim] / per, s)
    })?;
    Ok(vec![out; inputs.len()])
}

/// Reduce-scatter along `dim`: rank r gets block r of the all-reduce.
pub fn reduce_scatter(
    kind: ReductionKind,
    dim: usize,
    inputs: &[DeviceBuffer],
) -> Result<Vec<DeviceBuffer>> {
    let first = same_shapes(inputs)?;
    let dims = layout::reduce_scatter_dims(first.dims(), dim, inputs.len())?;
    let full = all_reduce(kind, inputs)?.swap_remove(0);
    let chunk = dims[dim] as usize;
    (0..inputs.len())
        .map(|r| {
            gather_elements(
                std::slice::from_ref(&full),
                first.dtype(),
                dims.clone(),
                |idx| {
                    let mut s = idx.to_vec();
                    s[dim] += r * chunk;
                    (0, s)
                },
            )
        })
        .collect()
}

/// All-to-all: rank r gets, concatenated along `concat` in rank order,
/// block r (along `split`) of every rank's operand.
pub fn all_to_all(
    split: usize,
    concat: usize,
    inputs: &[DeviceBuffer],
) -> Result<Vec<DeviceBuffer>> {
    let first = same_shapes(inputs)?;
    let n = inputs.len();
    let dims = layout::all_to_all_dims(first.dims(), split, concat, n)?;
    let piece_split = first.dims()[split] as usize / n;
    let piece_concat = dims[concat] as usize / n;
    (0..n)
        .map(|r| {
            gather_elements(inputs, first.dtype(), dims.clone(), |idx| {
                let from = idx[concat] / piece_concat;
                let mut s = idx.to_vec();
                s[concat] = idx[concat] % piece_concat;
                s[split] += r * piece_split;
                (from, s)
            })
        })
        .collect()
}

/// Tuple all-to-all: `inputs[r][j]` is rank r's operand j (one per rank);
/// rank r gets `[inputs[0][r], inputs[1][r], ...]`.
pub fn all_to_all_tuple(inputs: &[Vec<DeviceBuffer>]) -> Result<Vec<Vec<DeviceBuffer>>> {
    let n = inputs.len();
    for (r, ops) in inputs.iter().enumerate() {
        if ops.len() != n {
            return Err(invalid(format!(
                "rank {r} passed {} operands to a tuple all-to-all over {n} ranks",
                ops.len()
            )));
        }
    }
    Ok((0..n)
        .map(|r| (0..n).map(|j| inputs[j][r].clone()).collect())
        .collect())
}

/// Collective-permute over group ranks: `pairs` are (source rank, target
/// rank); a rank that is no target gets zeros of its own operand's shape.
pub fn collective_permute(
    pairs: &[(usize, usize)],
    inputs: &[DeviceBuffer],
) -> Result<Vec<DeviceBuffer>> {
    let n = inputs.len();
    check_pairs(pairs)?;
    let mut out = Vec::with_capacity(n);
    for (r, mine) in inputs.iter().enumerate() {
        match pairs.iter().find(|&&(_, t)| t == r) {
            Some(&(s, _)) => {
                let src = inputs
                    .get(s)
                    .ok_or_else(|| invalid(format!("source rank {s} out of range")))?;
                if !src.same_shape(mine) {
                    return Err(invalid(format!(
                        "rank {s} sends {} to rank {r}, which expects {}",
                        src.shape_string(),
                        mine.shape_string()
                    )));
                }
                out.push(src.clone());
            }
            None => out.push(DeviceBuffer::zeros(mine.dtype(), mine.dims().to_vec())?),
        }
    }
    if let Some(&(s, t)) = pairs.iter().find(|&&(s, t)| s >= n || t >= n) {
        return Err(invalid(format!(
            "pair ({s}, {t}) out of range for {n} ranks"
        )));
    }
    Ok(out)
}

/// Collective-broadcast: every rank gets rank 0's operand.
pub fn collective_broadcast(inputs: &[DeviceBuffer]) -> Result<Vec<DeviceBuffer>> {
    let first = same_shapes(inputs)?;
    Ok(vec![first.clone(); inputs.len()])
}

// ---------------------------------------------------------------------------
// Scalar reduction: one element at a time.

fn le_u128(b: &[u8]) -> u128 {
    let mut buf = [0u8; 16];
    buf[..b.len()].copy_from_slice(b);
    u128::from_le_bytes(buf)
}

fn sign_extend(v: u128, bits: u32) -> i128 {
    let shift = 128 - bits;
    ((v << shift) as i128) >> shift
}

/// Folds one element of each rank with `kind`, in rank order, with the
/// accumulation rules documented in `reduce`.
pub fn fold_element(kind: ReductionKind, dtype: PrimitiveType, elems: &[&[u8]]) -> Result<Vec<u8>> {
    kind.check(dtype)?;
    let esize = element_size(dtype)?;
    if elems.is_empty() || elems.iter().any(|e| e.len() != esize) {
        return Err(invalid("fold_element: bad element sizes".into()));
    }
    use ReductionKind as K;
    let bits = dtype.bit_width();
    let out: Vec<u8> = match dtype.class() {
        TypeClass::Pred => {
            let v = match kind {
                K::Sum | K::Or | K::Max => elems.iter().any(|e| e[0] != 0),
                K::Product | K::And | K::Min => elems.iter().all(|e| e[0] != 0),
            };
            vec![v as u8]
        }
        TypeClass::Signed => {
            // Storage is the value sign-extended to whole bytes.
            let storage_bits = 8 * esize as u32;
            let wrap = |v: i128| sign_extend(v as u128, bits);
            let mut acc = sign_extend(le_u128(elems[0]), storage_bits);
            for e in &elems[1..] {
                let x = sign_extend(le_u128(e), storage_bits);
                acc = wrap(match kind {
                    K::Sum => acc.wrapping_add(x),
                    K::Product => acc.wrapping_mul(x),
                    K::Min => acc.min(x),
                    K::Max => acc.max(x),
                    K::And => acc & x,
                    K::Or => acc | x,
                });
            }
            (acc as u128).to_le_bytes()[..esize].to_vec()
        }
        TypeClass::Unsigned => {
            let mask = if bits == 128 {
                u128::MAX
            } else {
                (1u128 << bits) - 1
            };
            let mut acc = le_u128(elems[0]);
            for e in &elems[1..] {
                let x = le_u128(e);
                acc = mask
                    & match kind {
                        K::Sum => acc.wrapping_add(x),
                        K::Product => acc.wrapping_mul(x),
                        K::Min => acc.min(x),
                        K::Max => acc.max(x),
                        K::And => acc & x,
                        K::Or => acc | x,
                    };
            }
            acc.to_le_bytes()[..esize].to_vec()
        }
        TypeClass::Float => match dtype {
            PrimitiveType::F32 => {
                let v = fold_f32(kind, elems.iter().map(|e| f32::from_le_bytes(arr(e))));
                v.to_le_bytes().to_vec()
            }
            PrimitiveType::F64 => {
                let v = fold_f64(kind, elems.iter().map(|e| f64::from_le_bytes(arr(e))));
                v.to_le_bytes().to_vec()
            }
            PrimitiveType::F16 => {
                let v = fold_f32(
                    kind,
                    elems.iter().map(|e| f16::from_le_bytes(arr(e)).to_f32()),
                );
                f16::from_f32(v).to_le_bytes().to_vec()
            }
            PrimitiveType::Bf16 => {
                let v = fold_f32(
                    kind,
                    elems.iter().map(|e| bf16::from_le_bytes(arr(e)).to_f32()),
                );
                bf16::from_f32(v).to_le_bytes().to_vec()
            }
            _ => {
                let fmt = dtype
                    .minifloat_format()
                    .ok_or_else(|| CollectiveError::Unsupported(format!("reduction on {dtype}")))?;
                let v = fold_f64(kind, elems.iter().map(|e| fmt.decode(e[0] as u32)));
                vec![fmt.encode(v) as u8]
            }
        },
        TypeClass::Complex => {
            if dtype == PrimitiveType::C64 {
                let parts = |e: &[u8]| {
                    (
                        f32::from_le_bytes(arr(&e[..4])),
                        f32::from_le_bytes(arr(&e[4..])),
                    )
                };
                let (mut re, mut im) = parts(elems[0]);
                for e in &elems[1..] {
                    let (c, d) = parts(e);
                    (re, im) = match kind {
                        K::Product => (re * c - im * d, re * d + im * c),
                        _ => (re + c, im + d),
                    };
                }
                [re.to_le_bytes(), im.to_le_bytes()].concat()
            } else {
                let parts = |e: &[u8]| {
                    (
                        f64::from_le_bytes(arr(&e[..8])),
                        f64::from_le_bytes(arr(&e[8..])),
                    )
                };
                let (mut re, mut im) = parts(elems[0]);
                for e in &elems[1..] {
                    let (c, d) = parts(e);
                    (re, im) = match kind {
                        K::Product => (re * c - im * d, re * d + im * c),
                        _ => (re + c, im + d),
                    };
                }
                [re.to_le_bytes(), im.to_le_bytes()].concat()
            }
        }
        TypeClass::Token | TypeClass::Opaque => {
            return Err(CollectiveError::Unsupported(format!(
                "reduction on {dtype}"
            )))
        }
    };
    Ok(out)
}

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

macro_rules! fold_float {
    ($name:ident, $t:ty) => {
        fn $name(kind: ReductionKind, mut vals: impl Iterator<Item = $t>) -> $t {
            let mut acc = vals.next().unwrap_or(0.0);
            for x in vals {
                acc = match kind {
                    ReductionKind::Product => acc * x,
                    ReductionKind::Min | ReductionKind::Max if acc.is_nan() || x.is_nan() => {
                        <$t>::NAN
                    }
                    ReductionKind::Min => {
                        if x < acc {
                            x
                        } else {
                            acc
                        }
                    }
                    ReductionKind::Max => {
                        if x > acc {
                            x
                        } else {
                            acc
                        }
                    }
                    _ => acc + x,
                };
            }
            acc
        }
    };
}
fold_float!(fold_f32, f32);
fold_float!(fold_f64, f64);

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(dims: Vec<i64>, v: &[i32]) -> DeviceBuffer {
        DeviceBuffer::from_slice(dims, v).unwrap()
    }

    #[test]
    fn gather_and_scatter() {
        let a = buf(vec![2, 1], &[1, 2]);
        let b = buf(vec![2, 1], &[3, 4]);
        let g = all_gather(1, &[a.clone(), b.clone()]).unwrap();
        assert_eq!(g[0].typed::<i32>().unwrap(), &[1, 3, 2, 4]);
        let g = all_gather(0, &[a.clone(), b.clone()]).unwrap();
        assert_eq!(g[1].typed::<i32>().unwrap(), &[1, 2, 3, 4]);
        let s = reduce_scatter(ReductionKind::Sum, 0, &[a.clone(), b.clone()]).unwrap();
        assert_eq!(s[0].typed::<i32>().unwrap(), &[4]);
        assert_eq!(s[1].typed::<i32>().unwrap(), &[6]);
    }

    #[test]
    fn all_to_all_blocks() {
        // rank r holds [r*10 + 0..4] as 4x1; split 0, concat 1 over 2 ranks
        let a = buf(vec![4, 1], &[0, 1, 2, 3]);
        let b = buf(vec![4, 1], &[10, 11, 12, 13]);
        let out = all_to_all(0, 1, &[a.clone(), b.clone()]).unwrap();
        assert_eq!(out[0].dims(), &[2, 2]);
        assert_eq!(out[0].typed::<i32>().unwrap(), &[0, 10, 1, 11]);
        assert_eq!(out[1].typed::<i32>().unwrap(), &[2, 12, 3, 13]);
        let out = all_to_all(0, 0, &[a, b]).unwrap();
        assert_eq!(out[1].typed::<i32>().unwrap(), &[2, 3, 12, 13]);
    }

    #[test]
    fn permute_and_broadcast() {
        let a = buf(vec![1], &[1]);
        let b = buf(vec![1], &[2]);
        let c = buf(vec![1], &[3]);
        let out =
            collective_permute(&[(0, 1), (1, 2)], &[a.clone(), b.clone(), c.clone()]).unwrap();
        assert_eq!(out[0].typed::<i32>().unwrap(), &[0]);
        assert_eq!(out[1].typed::<i32>().unwrap(), &[1]);
        assert_eq!(out[2].typed::<i32>().unwrap(), &[2]);
        let out = collective_broadcast(&[b, a, c]).unwrap();
        assert_eq!(out[2].typed::<i32>().unwrap(), &[2]);
    }

    #[test]
    fn scalar_folds() {
        let e = |v: i8| vec![v as u8];
        let r = fold_element(ReductionKind::Sum, PrimitiveType::S4, &[&e(7), &e(1)]).unwrap();
        assert_eq!(r[0] as i8, -8);
        let r = fold_element(ReductionKind::Max, PrimitiveType::S8, &[&e(-7), &e(3)]).unwrap();
        assert_eq!(r[0] as i8, 3);
        assert!(fold_element(ReductionKind::Or, PrimitiveType::F32, &[&[0; 4]]).is_err());
    }
}
