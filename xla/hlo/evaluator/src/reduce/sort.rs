//! Ordering ops: sort (multi-operand, along one dimension, stable) and
//! topk (along the last dimension).
//!
//! Invariants: a comparator that is `compare(p0, p1)` LT/GT sorts by
//! total-order keys (consistent even with NaNs); any other comparator goes
//! through the own stable merge sort, which tolerates inconsistent
//! comparators without panicking; topk breaks ties in index order.

use super::combiner::{compare_of_params, scalar_at};
use crate::elementwise::{widen_f32, Direction};
use crate::error::{bad, EvalError};
use crate::index::{next_index, strides};
use crate::interp::Evaluator;
use crate::value::{Array, Data};
use rayon::prelude::*;
use xla_hlo_ir::{CompId, PrimitiveType};

/// Stable merge sort of `idx` under a fallible comparator `less`.
fn merge_sort(
    idx: &mut [usize],
    tmp: &mut Vec<usize>,
    less: &mut dyn FnMut(usize, usize) -> Result<bool, EvalError>,
) -> Result<(), EvalError> {
    let n = idx.len();
    if n <= 1 {
        return Ok(());
    }
    if n <= 16 {
        // insertion sort (stable)
        for i in 1..n {
            let mut j = i;
            while j > 0 && less(idx[j], idx[j - 1])? {
                idx.swap(j, j - 1);
                j -= 1;
            }
        }
        return Ok(());
    }
    let mid = n / 2;
    merge_sort(&mut idx[..mid], tmp, less)?;
    merge_sort(&mut idx[mid..], tmp, less)?;
    tmp.clear();
    let (mut i, mut j) = (0, mid);
    while i < mid && j < n {
        // take from the right only when strictly less (stability)
        if less(idx[j], idx[i])? {
            tmp.push(idx[j]);
            j += 1;
        } else {
            tmp.push(idx[i]);
            i += 1;
        }
    }
    tmp.extend_from_slice(&idx[i..mid]);
    tmp.extend_from_slice(&idx[j..n]);
    idx.copy_from_slice(tmp);
    Ok(())
}

/// sort along `dim`; all operands are permuted like the comparator orders them.
pub fn sort(
    ev: &Evaluator,
    comp: CompId,
    ops: &[&Array],
    dim: i64,
) -> Result<Vec<Array>, EvalError> {
    let Some(first) = ops.first() else {
        return bad("sort without operands");
    };
    for o in ops {
        if o.dims != first.dims {
            return bad("sort: operands have different shapes");
        }
    }
    let Some(d) = usize::try_from(dim)
        .ok()
        .filter(|&d| d < first.rank().max(1))
    else {
        return bad("sort: dimension out of range");
    };
    if first.rank() == 0 {
        return Ok(ops.iter().map(|&a| a.clone()).collect());
    }
    let n = first.dims[d] as usize;
    let st = strides(&first.dims);
    let stride = st[d] as usize;
    let outer_dims: Vec<usize> = (0..first.rank())
        .map(|k| if k == d { 1 } else { first.dims[k] as usize })
        .collect();
    let nslices: usize = outer_dims.iter().product();
    let fast = compare_of_params(ev, comp).and_then(|(a, b, dir, total)| {
        (a % 2 == 0 && b == a + 1 && matches!(dir, Direction::Lt | Direction::Gt)).then_some((
            (a / 2) as usize,
            dir,
            total,
        ))
    });
    // Permutation per slice: perm[s*n + i] = source position.
    let mut perm: Vec<usize> = Vec::with_capacity(nslices * n);
    let mut oidx = vec![0usize; first.rank()];
    let mut bases = Vec::with_capacity(nslices);
    for _ in 0..nslices {
        bases.push(
            oidx.iter()
                .zip(&st)
                .map(|(&i, &s)| i * s as usize)
                .sum::<usize>(),
        );
        next_index(&mut oidx, &outer_dims);
    }
    if let Some((k, dir, _total)) = fast.filter(|&(k, ..)| k < ops.len()) {
        let key = ops[k];
        // Total-order keys make the order consistent even with NaNs.
        let keys: Vec<i128> = match &*key.data {
            Data::F32(v) => v
                .iter()
                .map(|&x| crate::elementwise::total_order_key_f32(x) as i128)
                .collect(),
            Data::F64(v) => v
                .iter()
                .map(|&x| crate::elementwise::total_order_key_f64(x) as i128)
                .collect(),
            Data::F16(_) | Data::Bf16(_) | Data::F8(_) => widen_f32(key)
                .unwrap_or_default()
                .iter()
                .map(|&x| crate::elementwise::total_order_key_f32(x) as i128)
                .collect(),
            _ => (0..key.len())
                .map(|i| key.get_i64(i) as i128)
                .collect::<Vec<_>>(),
        };
        let keys: Vec<i128> = if matches!(&*key.data, Data::U64(_)) {
            match &*key.data {
                Data::U64(v) => v.iter().map(|&x| x as i128).collect(),
                _ => keys,
            }
        } else {
            keys
        };
        let slices: Vec<Vec<usize>> = bases
            .par_iter()
            .map(|&b| {
                let mut p: Vec<usize> = (0..n).map(|i| b + i * stride).collect();
                if dir == Direction::Lt {
                    p.sort_by_key(|&i| keys[i]);
                } else {
                    p.sort_by(|&x, &y| keys[y].cmp(&keys[x]));
                }
                p
            })
            .collect();
        for s in slices {
            perm.extend(s);
        }
    } else {
        let mut tmp = Vec::new();
        for &b in &bases {
            let mut p: Vec<usize> = (0..n).map(|i| b + i * stride).collect();
            let mut less = |x: usize, y: usize| -> Result<bool, EvalError> {
                let mut args = Vec::with_capacity(2 * ops.len());
                for o in ops {
                    args.push(scalar_at(o, x));
                    args.push(scalar_at(o, y));
                }
                let r = ev.call_array(comp, &args)?;
                if r.ty != PrimitiveType::Pred || r.len() != 1 {
                    return bad("sort comparator did not return pred[]");
                }
                Ok(r.get_i64(0) != 0)
            };
            merge_sort(&mut p, &mut tmp, &mut less)?;
            perm.extend(p);
        }
    }
    // Scatter back: slice s, position i gets element perm[s*n+i].
    let mut dest = Vec::with_capacity(nslices * n);
    for &b in &bases {
        for i in 0..n {
            dest.push(b + i * stride);
        }
    }
    ops.iter()
        .map(|&a| {
            let data = crate::map_data!(&*a.data, v => {
                let mut out = v.clone();
                for (pos, &src) in dest.iter().zip(&perm) {
                    out[*pos] = v[src];
                }
                out
            });
            Ok(Array::from_parts(a.ty, a.dims.clone(), data))
        })
        .collect()
}

/// topk along the last dimension: (values, s32 indices), largest (or
/// smallest) first, ties in index order; floats ordered by XLA's total order.
pub fn topk(a: &Array, k: i64, largest: bool) -> Result<(Array, Array), EvalError> {
    let Some(&n) = a.dims.last() else {
        return bad("topk of a scalar");
    };
    if k < 0 || k > n {
        return bad(format!("topk: k={k} exceeds the last dimension ({n})"));
    }
    let (n, k) = (n as usize, k as usize);
    let rows = a.len().checked_div(n).unwrap_or(0);
    let keys: Vec<i128> = match &*a.data {
        Data::F32(v) => v
            .iter()
            .map(|&x| crate::elementwise::total_order_key_f32(x) as i128)
            .collect(),
        Data::F64(v) => v
            .iter()
            .map(|&x| crate::elementwise::total_order_key_f64(x) as i128)
            .collect(),
        Data::U64(v) => v.iter().map(|&x| x as i128).collect(),
        Data::F16(_) | Data::Bf16(_) | Data::F8(_) => widen_f32(a)
            .unwrap_or_default()
            .iter()
            .map(|&x| crate::elementwise::total_order_key_f32(x) as i128)
            .collect(),
        _ => (0..a.len()).map(|i| a.get_i64(i) as i128).collect(),
    };
    let mut src = Vec::with_capacity(rows * k);
    let mut idx = Vec::with_capacity(rows * k);
    for r in 0..rows {
        let mut p: Vec<usize> = (0..n).collect();
        let row = &keys[r * n..(r + 1) * n];
        if largest {
            p.sort_by(|&x, &y| row[y].cmp(&row[x]));
        } else {
            p.sort_by_key(|&x| row[x]);
        }
        for &j in &p[..k] {
            src.push(r * n + j);
            idx.push(j as i32);
        }
    }
    let mut dims = a.dims.clone();
    *dims.last_mut().expect("rank > 0") = k as i64;
    let data = crate::map_data!(&*a.data, v => src.iter().map(|&i| v[i]).collect());
    Ok((
        Array::from_parts(a.ty, dims.clone(), data),
        Array::from_parts(PrimitiveType::S32, dims, Data::S32(idx)),
    ))
}
