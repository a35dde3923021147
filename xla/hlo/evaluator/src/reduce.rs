//! Ops that apply a called computation: reduce (multi-output), reduce-window,
//! select-and-scatter, sort (multi-operand, stable), scatter and map.
//!
//! Invariants: when the called computation is a single binary op of its two
//! parameters (add, multiply, maximum, minimum, and, or, xor) the op runs a
//! typed, vectorisable kernel; otherwise it calls the computation through the
//! interpreter per element, which is exact for any computation. Reductions
//! visit elements in row-major order in the generic path; the fast path may
//! reassociate (XLA's CPU backend does too). Sorting uses an own stable merge
//! sort that tolerates inconsistent comparators without panicking.

use crate::elementwise::{fmax32, fmax64, fmin32, fmin64, narrow_f32, widen_f32, Direction};
use crate::error::{bad, EvalError};
use crate::index::{next_index, strides, udims};
use crate::interp::Evaluator;
use crate::value::{element_count, Array, Data, Value};
use half::{bf16, f16};
use rayon::prelude::*;
use xla_hlo_ir::attrs::{ScatterDimensionNumbers, Window};
use xla_hlo_ir::{AttrKey, CompId, Opcode, PrimitiveType};

/// Native element types that can be read out of `Data`.
pub trait Elem: Copy + Send + Sync + 'static {
    fn slice(d: &Data) -> Option<&[Self]>;
}
macro_rules! elem {
    ($T:ty, $V:ident) => {
        impl Elem for $T {
            fn slice(d: &Data) -> Option<&[Self]> {
                match d {
                    Data::$V(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
elem!(bool, Pred);
elem!(i8, S8);
elem!(i16, S16);
elem!(i32, S32);
elem!(i64, S64);
elem!(u8, U8);
elem!(u16, U16);
elem!(u32, U32);
elem!(u64, U64);
elem!(f16, F16);
elem!(bf16, Bf16);
elem!(f32, F32);
elem!(f64, F64);

/// The first element of `a` typed like `_like`.
fn scalar_like<T: Elem>(_like: &[T], a: &Array) -> Result<T, EvalError> {
    T::slice(&a.data)
        .and_then(|s| s.first().copied())
        .ok_or_else(|| EvalError::invalid("init value type differs from the operand"))
}

macro_rules! float_binop {
    ($op:expr, $T:ty, $max:expr, $min:expr, $f:ident => $body:expr) => {
        match $op {
            Opcode::Add => {
                let $f = |x: $T, y: $T| x + y;
                Some($body)
            }
            Opcode::Multiply => {
                let $f = |x: $T, y: $T| x * y;
                Some($body)
            }
            Opcode::Maximum => {
                let $f = $max;
                Some($body)
            }
            Opcode::Minimum => {
                let $f = $min;
                Some($body)
            }
            _ => None,
        }
    };
}
macro_rules! int_binop {
    ($op:expr, $T:ty, $f:ident => $body:expr) => {
        match $op {
            Opcode::Add => {
                let $f = |x: $T, y: $T| x.wrapping_add(y);
                Some($body)
            }
            Opcode::Multiply => {
                let $f = |x: $T, y: $T| x.wrapping_mul(y);
                Some($body)
            }
            Opcode::Maximum => {
                let $f = |x: $T, y: $T| x.max(y);
                Some($body)
            }
            Opcode::Minimum => {
                let $f = |x: $T, y: $T| x.min(y);
                Some($body)
            }
            Opcode::And => {
                let $f = |x: $T, y: $T| x & y;
                Some($body)
            }
            Opcode::Or => {
                let $f = |x: $T, y: $T| x | y;
                Some($body)
            }
            Opcode::Xor => {
                let $f = |x: $T, y: $T| x ^ y;
                Some($body)
            }
            _ => None,
        }
    };
}
macro_rules! pred_binop {
    ($op:expr, $f:ident => $body:expr) => {
        match $op {
            Opcode::And | Opcode::Minimum | Opcode::Multiply => {
                let $f = |x: bool, y: bool| x & y;
                Some($body)
            }
            Opcode::Or | Opcode::Maximum | Opcode::Add => {
                let $f = |x: bool, y: bool| x | y;
                Some($body)
            }
            Opcode::Xor => {
                let $f = |x: bool, y: bool| x ^ y;
                Some($body)
            }
            _ => None,
        }
    };
}

/// Runs `$body` (producing a Vec of the element type) with `$v` bound to the
/// typed storage of `$data` and `$f` to the binary op; `None` when the
/// (op, type) pair has no fast kernel. Low-precision floats are widened to
/// f32 and every step is rounded back to the storage type.
macro_rules! dispatch_binop {
    ($op:expr, $arr:expr, $v:ident, $f:ident => $body:expr) => {{
        let arr: &Array = $arr;
        match &*arr.data {
            Data::F32($v) => float_binop!($op, f32, fmax32, fmin32, $f => $body).map(Data::F32),
            Data::F64($v) => float_binop!($op, f64, fmax64, fmin64, $f => $body).map(Data::F64),
            Data::S8($v) => int_binop!($op, i8, $f => $body).map(Data::S8),
            Data::S16($v) => int_binop!($op, i16, $f => $body).map(Data::S16),
            Data::S32($v) => int_binop!($op, i32, $f => $body).map(Data::S32),
            Data::S64($v) => int_binop!($op, i64, $f => $body).map(Data::S64),
            Data::U8($v) => int_binop!($op, u8, $f => $body).map(Data::U8),
            Data::U16($v) => int_binop!($op, u16, $f => $body).map(Data::U16),
            Data::U32($v) => int_binop!($op, u32, $f => $body).map(Data::U32),
            Data::U64($v) => int_binop!($op, u64, $f => $body).map(Data::U64),
            Data::Pred($v) => pred_binop!($op, $f => $body).map(Data::Pred),
            _ => None,
        }
    }};
}

/// If `comp` is `op(param0, param1)` for an associative, commutative op,
/// returns that op.
pub fn binary_reducer(ev: &Evaluator, comp: CompId) -> Option<Opcode> {
    let c = ev.module.computations.get(comp.index())?;
    if c.parameters.len() != 2 {
        return None;
    }
    let root = c.instructions.get(c.root.index())?;
    let op = root.opcode;
    if !matches!(
        op,
        Opcode::Add
            | Opcode::Multiply
            | Opcode::Maximum
            | Opcode::Minimum
            | Opcode::And
            | Opcode::Or
            | Opcode::Xor
    ) {
        return None;
    }
    let p: Vec<i64> = root
        .operands
        .iter()
        .filter_map(|&o| {
            let i = c.instructions.get(o.index())?;
            (i.opcode == Opcode::Parameter).then_some(i.parameter_number?)
        })
        .collect();
    (p.len() == 2 && p[0] != p[1]).then_some(op)
}

/// If `comp` is `compare(param_a, param_b, dir)` returns (a, b, dir, total_order).
fn compare_of_params(ev: &Evaluator, comp: CompId) -> Option<(i64, i64, Direction, bool)> {
    let c = ev.module.computations.get(comp.index())?;
    let root = c.instructions.get(c.root.index())?;
    if root.opcode != Opcode::Compare || root.operands.len() != 2 {
        return None;
    }
    let pn = |k: usize| -> Option<i64> {
        let i = c.instructions.get(root.operands[k].index())?;
        (i.opcode == Opcode::Parameter).then_some(i.parameter_number?)
    };
    let dir = Direction::parse(root.ident_attr(AttrKey::Direction)?)?;
    let total = root.ident_attr(AttrKey::CompareType) == Some("TOTALORDER");
    Some((pn(0)?, pn(1)?, dir, total))
}

fn scalar_at(a: &Array, i: usize) -> Value {
    let d = crate::map_data!(&*a.data, v => vec![v[i]]);
    Value::Array(Array::from_parts(a.ty, vec![], d))
}

fn scalars_to_array(
    ty: PrimitiveType,
    dims: Vec<i64>,
    items: &[Array],
) -> Result<Array, EvalError> {
    let n = element_count(&dims);
    if items.len() != n {
        return bad("internal: scalar count");
    }
    let mut d = Data::zeros(ty, n)?;
    for (i, s) in items.iter().enumerate() {
        crate::zip_data!(&mut d, &*s.data, dst, src => dst[i] = src[0],
            else return bad(format!("computation returned {} where {} is expected", s.ty, ty)));
    }
    Ok(Array::from_parts(ty, dims, d))
}

/// Splits a computation result into `n` scalar arrays.
fn split_result(v: Value, n: usize) -> Result<Vec<Array>, EvalError> {
    match v {
        Value::Array(a) if n == 1 => Ok(vec![a]),
        Value::Tuple(e) if e.len() == n => e
            .into_iter()
            .map(|x| {
                x.into_array()
                    .ok_or_else(|| EvalError::invalid("nested tuple result"))
            })
            .collect(),
        v => bad(format!(
            "computation returned {} but {n} values are expected",
            v.shape_string()
        )),
    }
}

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
                    reduce_kernel(v, outer, len, inner, i0, f)
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
                    let res = match op {
                        Opcode::Add => {
                            Some(reduce_kernel(&w, outer, len, inner, iw[0], |x, y| r(x + y)))
                        }
                        Opcode::Multiply => {
                            Some(reduce_kernel(&w, outer, len, inner, iw[0], |x, y| r(x * y)))
                        }
                        Opcode::Maximum => {
                            Some(reduce_kernel(&w, outer, len, inner, iw[0], fmax32))
                        }
                        Opcode::Minimum => {
                            Some(reduce_kernel(&w, outer, len, inner, iw[0], fmin32))
                        }
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
    // Generic path: row-major over kept dims, then over reduced dims.
    let n = inputs.len();
    let laid: Vec<(Array, usize, usize, usize)> =
        inputs.iter().map(|a| reduce_layout(a, &rd)).collect();
    let (_, outer, len, inner) = laid[0];
    let nout = outer * inner;
    let mut results: Vec<Vec<Array>> = vec![Vec::with_capacity(nout); n];
    for o in 0..outer {
        for j in 0..inner {
            let mut acc: Vec<Value> = inits.iter().map(|&i| Value::Array(i.clone())).collect();
            for r in 0..len {
                let idx = (o * len + r) * inner + j;
                let mut args = acc.clone();
                args.extend(laid.iter().map(|(t, ..)| scalar_at(t, idx)));
                let res = split_result(ev.call(comp, &args)?, n)?;
                acc = res.into_iter().map(Value::Array).collect();
            }
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

/// For each dim, a table mapping (output index, window index) to the input
/// index, or -1 for padding and dilation holes.
fn window_tables(
    in_dims: &[i64],
    w: &Window,
    out_dims: &[i64],
) -> Result<Vec<Vec<i64>>, EvalError> {
    if w.dims.len() != in_dims.len() || out_dims.len() != in_dims.len() {
        return bad("window rank differs from the operand rank");
    }
    let mut tables = Vec::new();
    for (d, wd) in w.dims.iter().enumerate() {
        if wd.stride < 1 || wd.lhs_dilation < 1 || wd.rhs_dilation < 1 || wd.size < 0 {
            return bad("invalid window");
        }
        let dilated_in = if in_dims[d] == 0 {
            0
        } else {
            (in_dims[d] - 1) * wd.lhs_dilation + 1
        };
        let padded = dilated_in + wd.padding_low + wd.padding_high;
        let span = if wd.size == 0 {
            0
        } else {
            (wd.size - 1) * wd.rhs_dilation + 1
        };
        let expect = if padded < span {
            0
        } else {
            (padded - span) / wd.stride + 1
        };
        if expect != out_dims[d] {
            return bad(format!(
                "window gives {expect} elements in dimension {d} but the result has {}",
                out_dims[d]
            ));
        }
        let mut t = Vec::with_capacity((out_dims[d] * wd.size) as usize);
        for o in 0..out_dims[d] {
            for k in 0..wd.size {
                let pos = o * wd.stride + k * wd.rhs_dilation - wd.padding_low;
                let v = if pos < 0 || pos % wd.lhs_dilation != 0 {
                    -1
                } else {
                    let i = pos / wd.lhs_dilation;
                    if i < in_dims[d] {
                        i
                    } else {
                        -1
                    }
                };
                t.push(v);
            }
        }
        tables.push(t);
    }
    Ok(tables)
}

/// Input flat indices of the window of output position `oflat` (valid only).
fn window_inputs(
    oflat: usize,
    out_dims: &[usize],
    wsize: &[usize],
    tables: &[Vec<i64>],
    in_strides: &[i64],
    buf: &mut Vec<usize>,
) {
    buf.clear();
    let rank = out_dims.len();
    let mut oidx = vec![0usize; rank];
    crate::index::unflatten(oflat, out_dims, &mut oidx);
    let total: usize = wsize.iter().product();
    if total == 0 {
        return;
    }
    let mut widx = vec![0usize; rank];
    loop {
        let mut flat = 0i64;
        let mut ok = true;
        for d in 0..rank {
            let i = tables[d][oidx[d] * wsize[d] + widx[d]];
            if i < 0 {
                ok = false;
                break;
            }
            flat += i * in_strides[d];
        }
        if ok {
            buf.push(flat as usize);
        }
        if !next_index(&mut widx, wsize) {
            break;
        }
    }
}

/// reduce-window with base and window dilation, padding and strides.
pub fn reduce_window(
    ev: &Evaluator,
    comp: CompId,
    inputs: &[&Array],
    inits: &[&Array],
    w: &Window,
    out_dims: &[i64],
) -> Result<Vec<Array>, EvalError> {
    let Some(first) = inputs.first() else {
        return bad("reduce-window without inputs");
    };
    let tables = window_tables(&first.dims, w, out_dims)?;
    let od = udims(out_dims);
    let wsize: Vec<usize> = w.dims.iter().map(|d| d.size as usize).collect();
    let ist = strides(&first.dims);
    let nout = element_count(out_dims);
    if inputs.len() == 1 && inits.len() == 1 {
        if let Some(op) = binary_reducer(ev, comp) {
            let init = inits[0];
            let a = inputs[0];
            let fast = dispatch_binop!(op, a, v, f => {
                let i0 = scalar_like(v, init)?;
                (0..nout)
                    .into_par_iter()
                    .with_min_len(256)
                    .map_init(Vec::new, |buf, o| {
                        window_inputs(o, &od, &wsize, &tables, &ist, buf);
                        buf.iter().fold(i0, |acc, &i| f(acc, v[i]))
                    })
                    .collect::<Vec<_>>()
            });
            if let Some(d) = fast {
                return Ok(vec![Array::from_parts(a.ty, out_dims.to_vec(), d)]);
            }
        }
    }
    let n = inputs.len();
    let mut results: Vec<Vec<Array>> = vec![Vec::with_capacity(nout); n];
    let mut buf = Vec::new();
    for o in 0..nout {
        window_inputs(o, &od, &wsize, &tables, &ist, &mut buf);
        let mut acc: Vec<Value> = inits.iter().map(|&i| Value::Array(i.clone())).collect();
        for &i in &buf {
            let mut args = acc.clone();
            args.extend(inputs.iter().map(|t| scalar_at(t, i)));
            acc = split_result(ev.call(comp, &args)?, n)?
                .into_iter()
                .map(Value::Array)
                .collect();
        }
        for (k, v) in acc.into_iter().enumerate() {
            results[k].push(
                v.into_array()
                    .ok_or_else(|| EvalError::invalid("reduce-window result"))?,
            );
        }
    }
    results
        .into_iter()
        .zip(inits)
        .map(|(items, init)| scalars_to_array(init.ty, out_dims.to_vec(), &items))
        .collect()
}

/// select-and-scatter: scatters each source element onto the operand element
/// its window selects.
pub fn select_and_scatter(
    ev: &Evaluator,
    select: CompId,
    scatter: CompId,
    operand: &Array,
    source: &Array,
    init: &Array,
    w: &Window,
) -> Result<Array, EvalError> {
    let tables = window_tables(&operand.dims, w, &source.dims)?;
    let od = udims(&source.dims);
    let wsize: Vec<usize> = w.dims.iter().map(|d| d.size as usize).collect();
    let ist = strides(&operand.dims);
    let nsrc = source.len();
    let fast_sel = compare_of_params(ev, select).filter(|&(a, b, _, _)| a == 0 && b == 1);
    let mut buf = Vec::new();
    // Which operand element each source element goes to.
    let mut targets = Vec::with_capacity(nsrc);
    for s in 0..nsrc {
        window_inputs(s, &od, &wsize, &tables, &ist, &mut buf);
        let mut selected: Option<usize> = None;
        for &i in &buf {
            match selected {
                None => selected = Some(i),
                Some(cur) => {
                    let keep = match fast_sel {
                        Some((_, _, dir, _)) => dir.holds(operand.get_f64(cur), operand.get_f64(i)),
                        None => {
                            let r = ev.call_array(
                                select,
                                &[scalar_at(operand, cur), scalar_at(operand, i)],
                            )?;
                            r.get_i64(0) != 0
                        }
                    };
                    if !keep {
                        selected = Some(i);
                    }
                }
            }
        }
        targets.push(selected);
    }
    let mut out = crate::elementwise::splat(init, &operand.dims);
    if let Some(op) = binary_reducer(ev, scatter) {
        let src = source;
        let dst = std::sync::Arc::make_mut(&mut out.data);
        let mut applied = true;
        macro_rules! go {
            ($d:expr, $s:expr, $f:expr) => {{
                let f = $f;
                for (s, t) in targets.iter().enumerate() {
                    if let Some(t) = *t {
                        $d[t] = f($d[t], $s[s]);
                    }
                }
            }};
        }
        match (dst, &*src.data, op) {
            (Data::F32(d), Data::F32(s), Opcode::Add) => go!(d, s, |x: f32, y: f32| x + y),
            (Data::F64(d), Data::F64(s), Opcode::Add) => go!(d, s, |x: f64, y: f64| x + y),
            (Data::S32(d), Data::S32(s), Opcode::Add) => {
                go!(d, s, |x: i32, y: i32| x.wrapping_add(y))
            }
            _ => applied = false,
        }
        if applied {
            return Ok(out);
        }
    }
    let mut items: Vec<Array> = (0..operand.len())
        .map(|i| scalar_at(&out, i).into_array().expect("array"))
        .collect();
    for (s, t) in targets.iter().enumerate() {
        if let Some(t) = *t {
            let r = ev.call_array(
                scatter,
                &[Value::Array(items[t].clone()), scalar_at(source, s)],
            )?;
            items[t] = r;
        }
    }
    scalars_to_array(init.ty, operand.dims.clone(), &items)
}

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

/// scatter with XLA's dimension numbers; update windows that do not fit in
/// the operand are skipped.
pub fn scatter(
    ev: &Evaluator,
    comp: CompId,
    operands: &[&Array],
    indices: &Array,
    updates: &[&Array],
    dn: &ScatterDimensionNumbers,
) -> Result<Vec<Array>, EvalError> {
    let Some(first) = operands.first() else {
        return bad("scatter without operands");
    };
    let upd0 = updates
        .first()
        .ok_or_else(|| EvalError::invalid("scatter without updates"))?;
    let rank = first.rank();
    if updates.len() != operands.len()
        || operands.iter().any(|o| o.dims != first.dims)
        || updates.iter().any(|u| u.dims != upd0.dims)
    {
        return bad("scatter: operands or updates disagree in count or shape");
    }
    let (_, vectors) = crate::data::index_vectors(indices, dn.index_vector_dim)?;
    let ivd = dn.index_vector_dim as usize;
    let idx_dims_wo: Vec<usize> = (0..indices.rank()).filter(|&d| d != ivd).collect();
    let window_operand_dims: Vec<usize> = (0..rank)
        .filter(|d| {
            !dn.inserted_window_dims.contains(&(*d as i64))
                && !dn.input_batching_dims.contains(&(*d as i64))
        })
        .collect();
    if window_operand_dims.len() != dn.update_window_dims.len() {
        return bad("scatter: update_window_dims do not match the operand");
    }
    let urank = upd0.rank();
    let update_scatter_dims: Vec<usize> = (0..urank)
        .filter(|d| !dn.update_window_dims.contains(&(*d as i64)))
        .collect();
    // Window size per operand dim.
    let mut wsize = vec![1i64; rank];
    for (k, &ud) in dn.update_window_dims.iter().enumerate() {
        let ud = usize::try_from(ud)
            .ok()
            .filter(|&u| u < urank)
            .ok_or_else(|| EvalError::invalid("scatter: update window dim out of range"))?;
        wsize[window_operand_dims[k]] = upd0.dims[ud];
    }
    let ost = strides(&first.dims);
    let ud = udims(&upd0.dims);
    let scatter_dims_sizes: Vec<usize> = update_scatter_dims.iter().map(|&d| ud[d]).collect();
    let sst = {
        let mut s = vec![1usize; scatter_dims_sizes.len()];
        for k in (0..s.len().saturating_sub(1)).rev() {
            s[k] = s[k + 1] * scatter_dims_sizes[k + 1];
        }
        s
    };
    // (update flat index, operand flat index) pairs in update order.
    let mut pairs: Vec<(usize, usize)> = Vec::with_capacity(upd0.len());
    let mut uidx = vec![0usize; urank];
    let total = upd0.len();
    // cache per scatter position: start vector validity
    let mut cache: Vec<Option<Option<Vec<i64>>>> = vec![None; vectors.len().max(1)];
    for uflat in 0..total {
        let mut spos = 0usize;
        for (k, &d) in update_scatter_dims.iter().enumerate() {
            spos += uidx[d] * sst[k];
        }
        if spos >= cache.len() {
            return bad("scatter: updates have more scatter positions than the indices");
        }
        if cache[spos].is_none() {
            let v = vectors
                .get(spos)
                .ok_or_else(|| EvalError::invalid("scatter: indices and updates disagree"))?;
            let mut start = vec![0i64; rank];
            for (k, &od) in dn.scatter_dims_to_operand_dims.iter().enumerate() {
                let od = usize::try_from(od)
                    .ok()
                    .filter(|&d| d < rank)
                    .ok_or_else(|| {
                        EvalError::invalid("scatter_dims_to_operand_dims out of range")
                    })?;
                start[od] = *v
                    .get(k)
                    .ok_or_else(|| EvalError::invalid("scatter: index vector too short"))?;
            }
            // batching dims: the scatter position's index along the indices batch dim
            let mut sidx = vec![0usize; scatter_dims_sizes.len()];
            crate::index::unflatten(spos, &scatter_dims_sizes, &mut sidx);
            for (i, &ibd) in dn.input_batching_dims.iter().enumerate() {
                let sbd = *dn
                    .scatter_indices_batching_dims
                    .get(i)
                    .ok_or_else(|| EvalError::invalid("scatter: batching dims mismatch"))?
                    as usize;
                let pos = idx_dims_wo.iter().position(|&d| d == sbd).ok_or_else(|| {
                    EvalError::invalid("scatter: batching dim is the index vector dim")
                })?;
                start[ibd as usize] = sidx[pos] as i64;
            }
            let fits = (0..rank).all(|d| start[d] >= 0 && start[d] + wsize[d] <= first.dims[d]);
            cache[spos] = Some(fits.then_some(start));
        }
        if let Some(Some(start)) = &cache[spos] {
            let mut off = 0i64;
            for d in 0..rank {
                off += start[d] * ost[d];
            }
            for (k, &udim) in dn.update_window_dims.iter().enumerate() {
                off += uidx[udim as usize] as i64 * ost[window_operand_dims[k]];
            }
            pairs.push((uflat, off as usize));
        }
        next_index(&mut uidx, &ud);
    }
    let n = operands.len();
    // Fast path: single operand with a binary combiner, or plain assignment.
    if n == 1 {
        let c = ev
            .module
            .computations
            .get(comp.index())
            .ok_or_else(|| EvalError::invalid("scatter computation missing"))?;
        let root = c.instructions.get(c.root.index());
        let assign =
            root.is_some_and(|r| r.opcode == Opcode::Parameter && r.parameter_number == Some(1));
        let mut out = (*first).clone();
        let upd = updates[0];
        if assign {
            let dst = std::sync::Arc::make_mut(&mut out.data);
            crate::zip_data!(dst, &*upd.data, d, u => {
                for &(ui, oi) in &pairs { d[oi] = u[ui]; }
            }, else return bad("scatter: update type differs"));
            return Ok(vec![out]);
        }
        if let Some(op) = binary_reducer(ev, comp) {
            let applied = {
                let dst = std::sync::Arc::make_mut(&mut out.data);
                macro_rules! go {
                    ($d:expr, $u:expr, $f:expr) => {{
                        let f = $f;
                        for &(ui, oi) in &pairs {
                            $d[oi] = f($d[oi], $u[ui]);
                        }
                        true
                    }};
                }
                match (dst, &*upd.data, op) {
                    (Data::F32(d), Data::F32(u), Opcode::Add) => go!(d, u, |x: f32, y: f32| x + y),
                    (Data::F64(d), Data::F64(u), Opcode::Add) => go!(d, u, |x: f64, y: f64| x + y),
                    (Data::S32(d), Data::S32(u), Opcode::Add) => {
                        go!(d, u, |x: i32, y: i32| x.wrapping_add(y))
                    }
                    (Data::F32(d), Data::F32(u), Opcode::Maximum) => go!(d, u, fmax32),
                    (Data::F32(d), Data::F32(u), Opcode::Minimum) => go!(d, u, fmin32),
                    _ => false,
                }
            };
            if applied {
                return Ok(vec![out]);
            }
        }
    }
    // Generic path.
    let mut cur: Vec<Vec<Value>> = operands
        .iter()
        .map(|a| (0..a.len()).map(|i| scalar_at(a, i)).collect())
        .collect();
    for &(ui, oi) in &pairs {
        let mut args: Vec<Value> = (0..n).map(|k| cur[k][oi].clone()).collect();
        args.extend(updates.iter().map(|u| scalar_at(u, ui)));
        let r = split_result(ev.call(comp, &args)?, n)?;
        for (k, v) in r.into_iter().enumerate() {
            cur[k][oi] = Value::Array(v);
        }
    }
    cur.into_iter()
        .zip(operands)
        .map(|(vals, a)| {
            let items: Vec<Array> = vals.into_iter().filter_map(Value::into_array).collect();
            scalars_to_array(a.ty, a.dims.clone(), &items)
        })
        .collect()
}

/// map: applies a scalar computation elementwise.
pub fn map(
    ev: &Evaluator,
    comp: CompId,
    ops: &[&Array],
    ty: PrimitiveType,
    dims: &[i64],
) -> Result<Array, EvalError> {
    if ops.len() == 2 {
        if let Some(op) = binary_reducer(ev, comp) {
            return crate::elementwise::binary(op, ops[0], ops[1]);
        }
    }
    let n = element_count(dims);
    for o in ops {
        if o.len() != n {
            return bad("map: operand shapes differ from the result");
        }
    }
    let mut items = Vec::with_capacity(n);
    for i in 0..n {
        let args: Vec<Value> = ops.iter().map(|o| scalar_at(o, i)).collect();
        items.push(ev.call_array(comp, &args)?);
    }
    scalars_to_array(ty, dims.to_vec(), &items)
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
