//! reduce: over any set of dimensions, of one or several inputs with a
//! (possibly multi-output) computation.
//!
//! Invariants: the fast path (one input, a binary-op computation, the init
//! of the input's type) lays the reduced dims out contiguously and folds
//! rows in 8 lanes, in parallel for large inputs; the generic path calls
//! the computation in row-major order over the kept, then the reduced dims.
//! In consistent mode (`EvalContext::consistent`) both paths combine the
//! reduced elements (row-major over the reduced dims in ascending order) by
//! the pairwise tree of `xla_hlo_utils::reduction_order`, then combine the
//! init with the tree's result (init first), whatever the array's size or
//! the number of threads.

use super::combiner::{
    binary_reducer, dispatch_binop, float_binop, int_binop, pred_binop, scalar_at, scalar_like,
    scalars_to_array, split_result,
};
use crate::elementwise::{fmax32, fmax64, fmin32, fmin64, narrow_f32, widen_f32};
use crate::error::{bad, EvalError};
use crate::interp::Evaluator;
use crate::value::{Array, Data, Value};
use half::{bf16, f16};
use rayon::prelude::*;
use xla_hlo_ir::{CompId, Opcode, PrimitiveType};
use xla_hlo_utils::reduction_order::{fold_rows_in_place, fold_values};

/// Moves `dims` of `a` to the end (keeping the other dims' order) and
/// returns (outer count, reduced count) with the data laid out as
/// [outer, reduced] rows; or, when the reduced dims are already one
/// contiguous block, a [outer, len, inner] view without copying.
fn reduce_layout(a: &Array, dims: &[usize]) -> (Array, usize, usize, usize) {
    let rank = a.rank();
    let mut sorted = dims.to_vec();
    sorted.sort_unstable();
    let contiguous = sorted.windows(2).all(|w| w[1] == w[0] + 1);
    let prod =
        |r: std::ops::Range<usize>| -> usize { a.dims[r].iter().map(|&x| x as usize).product() };
    if sorted.is_empty() {
        return (a.clone(), a.len(), 1, 1);
    }
    if contiguous {
        let lo = sorted[0];
        let hi = *sorted.last().expect("nonempty") + 1;
        return (a.clone(), prod(0..lo), prod(lo..hi), prod(hi..rank));
    }
    let mut perm: Vec<i64> = (0..rank)
        .filter(|d| !dims.contains(d))
        .map(|d| d as i64)
        .collect();
    perm.extend(sorted.iter().map(|&d| d as i64));
    let t = crate::data::transpose(a, &perm).expect("valid permutation");
    let len: usize = sorted.iter().map(|&d| a.dims[d] as usize).product();
    let outer = a.len() / len.max(1);
    (t, outer, len, 1)
}

/// Reduces a [outer, len, inner] array with an associative op.
fn reduce_kernel<T: Copy + Send + Sync>(
    v: &[T],
    outer: usize,
    len: usize,
    inner: usize,
    init: T,
    f: impl Fn(T, T) -> T + Sync + Send,
) -> Vec<T> {
    let fold_row = |row: &[T]| -> T {
        // 8 independent lanes let the compiler vectorise; combine then add init.
        const L: usize = 8;
        if row.len() < 2 * L {
            return row.iter().fold(init, |a, &x| f(a, x));
        }
        let mut lanes = [row[0]; L];
        lanes.copy_from_slice(&row[..L]);
        let chunks = row[L..].chunks_exact(L);
        let rem = chunks.remainder();
        for c in chunks {
            for j in 0..L {
                lanes[j] = f(lanes[j], c[j]);
            }
        }
        let mut acc = lanes[0];
        for &l in &lanes[1..] {
            acc = f(acc, l);
        }
        for &x in rem {
            acc = f(acc, x);
        }
        f(init, acc)
    };
    if inner == 1 {
        if outer == 1 && len >= (1 << 16) {
            let parts: Vec<T> = v[..len]
                .par_chunks(1 << 14)
                .map(|c| {
                    let mut acc = c[0];
                    for &x in &c[1..] {
                        acc = f(acc, x);
                    }
                    acc
                })
                .collect();
            return vec![parts.iter().fold(init, |a, &x| f(a, x))];
        }
        if outer * len >= (1 << 15) {
            return (0..outer)
                .into_par_iter()
                .with_min_len((1 << 13) / len.max(1) + 1)
                .map(|o| fold_row(&v[o * len..(o + 1) * len]))
                .collect();
        }
        return (0..outer)
            .map(|o| fold_row(&v[o * len..(o + 1) * len]))
            .collect();
    }
    let block = |o: usize| -> Vec<T> {
        let base = o * len * inner;
        let mut acc = vec![init; inner];
        for r in 0..len {
            let row = &v[base + r * inner..base + (r + 1) * inner];
            for (a, &x) in acc.iter_mut().zip(row) {
                *a = f(*a, x);
            }
        }
        acc
    };
    if outer > 1 && outer * len * inner >= (1 << 15) {
        let parts: Vec<Vec<T>> = (0..outer).into_par_iter().map(block).collect();
        parts.concat()
    } else {
        (0..outer).flat_map(block).collect()
    }
}

/// The fast path's kernel: [`tree_kernel`] in consistent mode, else
/// [`reduce_kernel`].
fn fold_kernel<T: Copy + Send + Sync>(
    consistent: bool,
    v: &[T],
    (outer, len, inner): (usize, usize, usize),
    init: T,
    f: impl Fn(T, T) -> T + Sync + Send,
) -> Vec<T> {
    if consistent {
        tree_kernel(v, outer, len, inner, init, f)
    } else {
        reduce_kernel(v, outer, len, inner, init, f)
    }
}

fn check_dims(dims: &[i64], rank: usize) -> Result<Vec<usize>, EvalError> {
    let mut seen = vec![false; rank];
    dims.iter()
        .map(|&d| {
            let d = usize::try_from(d)
                .ok()
                .filter(|&d| d < rank && !seen[d])
                .ok_or_else(|| EvalError::invalid(format!("invalid dimension {d}")))?;
            seen[d] = true;
            Ok(d)
        })
        .collect()
}

/// reduce over `dims` of each input, with a (possibly multi-output) computation.
pub fn reduce(
    ev: &Evaluator,
    comp: CompId,
    inputs: &[&Array],
    inits: &[&Array],
    dims: &[i64],
) -> Result<Vec<Array>, EvalError> {
    let Some(first) = inputs.first() else {
        return bad("reduce without inputs");
    };
    if inits.len() != inputs.len() {
        return bad("reduce: input and init counts differ");
    }
    for x in inputs {
        if x.dims != first.dims {
            return bad("reduce: inputs have different shapes");
        }
    }
    let rd = check_dims(dims, first.rank())?;
    let out_dims: Vec<i64> = (0..first.rank())
        .filter(|d| !rd.contains(d))
        .map(|d| first.dims[d])
        .collect();
    if inputs.len() == 1 {
        if let Some(op) = binary_reducer(ev, comp) {
            let a = inputs[0];
            let init = inits[0];
            if init.ty == a.ty {
                let (t, outer, len, inner) = reduce_layout(a, &rd);
                let fast = dispatch_binop!(op, &t, v, f => {
                    let i0 = scalar_like(v, init)?;
                    fold_kernel(ev.ctx.consistent, v, (outer, len, inner), i0, f)
                });
                if let Some(d) = fast {
                    return Ok(vec![Array::from_parts(a.ty, out_dims, d)]);
                }
                if let (Some(w), Some(iw)) = (widen_f32(&t), widen_f32(init)) {
                    let ty = a.ty;
                    let r = |x: f32| -> f32 {
                        match ty {
                            PrimitiveType::Bf16 => bf16::from_f32(x).to_f32(),
                            PrimitiveType::F16 => f16::from_f32(x).to_f32(),
                            _ => xla_hlo_ir::literal::float_from_bits(
                                ty,
                                xla_hlo_ir::literal::float_to_bits(ty, x as f64).unwrap_or(0),
                            )
                            .unwrap_or(f64::NAN) as f32,
                        }
                    };
                    let shape = (outer, len, inner);
                    let tree = ev.ctx.consistent;
                    let res = match op {
                        Opcode::Add => Some(fold_kernel(tree, &w, shape, iw[0], |x, y| r(x + y))),
                        Opcode::Multiply => {
                            Some(fold_kernel(tree, &w, shape, iw[0], |x, y| r(x * y)))
                        }
                        Opcode::Maximum => Some(fold_kernel(tree, &w, shape, iw[0], fmax32)),
                        Opcode::Minimum => Some(fold_kernel(tree, &w, shape, iw[0], fmin32)),
                        _ => None,
                    };
                    if let Some(res) = res {
                        return Ok(vec![Array::from_parts(
                            a.ty,
                            out_dims,
                            narrow_f32(a.ty, &res)?,
                        )]);
                    }
                }
            }
        }
    }
    // Generic path: row-major over kept dims; the reduced elements in
    // row-major order (sequentially, or by the tree in consistent mode).
    let n = inputs.len();
    let laid: Vec<(Array, usize, usize, usize)> =
        inputs.iter().map(|a| reduce_layout(a, &rd)).collect();
    let (_, outer, len, inner) = laid[0];
    let nout = outer * inner;
    let mut results: Vec<Vec<Array>> = vec![Vec::with_capacity(nout); n];
    let mut call = |left: Vec<Value>, right: Vec<Value>| -> Result<Vec<Value>, EvalError> {
        let mut args = left;
        args.extend(right);
        Ok(split_result(ev.call(comp, &args)?, n)?
            .into_iter()
            .map(Value::Array)
            .collect())
    };
    for o in 0..outer {
        for j in 0..inner {
            let init: Vec<Value> = inits.iter().map(|&i| Value::Array(i.clone())).collect();
            let element = |r: usize| -> Vec<Value> {
                let idx = (o * len + r) * inner + j;
                laid.iter().map(|(t, ..)| scalar_at(t, idx)).collect()
            };
            let acc = if ev.ctx.consistent {
                match fold_values((0..len).map(element).collect(), &mut call)? {
                    Some(tree) => call(init, tree)?,
                    None => init,
                }
            } else {
                let mut acc = init;
                for r in 0..len {
                    acc = call(acc, element(r))?;
                }
                acc
            };
            for (k, v) in acc.into_iter().enumerate() {
                results[k].push(
                    v.into_array()
                        .ok_or_else(|| EvalError::invalid("reduce result"))?,
                );
            }
        }
    }
    results
        .into_iter()
        .zip(inits)
        .map(|(items, init)| scalars_to_array(init.ty, out_dims.clone(), &items))
        .collect()
}

/// Reduces a [outer, len, inner] array by the pairwise tree over `len`,
/// then combines `init` with each result (init first).
fn tree_kernel<T: Copy + Send + Sync>(
    v: &[T],
    outer: usize,
    len: usize,
    inner: usize,
    init: T,
    f: impl Fn(T, T) -> T + Sync + Send,
) -> Vec<T> {
    let block = |o: usize| -> Vec<T> {
        if len == 0 {
            return vec![init; inner];
        }
        let mut rows = v[o * len * inner..(o + 1) * len * inner].to_vec();
        fold_rows_in_place(&mut rows, inner, &f);
        rows[..inner].iter().map(|&x| f(init, x)).collect()
    };
    if outer > 1 && outer * len * inner >= (1 << 15) {
        let parts: Vec<Vec<T>> = (0..outer).into_par_iter().map(block).collect();
        parts.concat()
    } else {
        (0..outer).flat_map(block).collect()
    }
}
