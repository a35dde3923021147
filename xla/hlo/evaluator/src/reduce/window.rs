//! The windowed ops: reduce-window (base and window dilation, padding,
//! strides) and select-and-scatter, on per-dimension tables from (output
//! index, window index) to input index.
//!
//! Invariants: padding and dilation holes are -1 in the tables and never
//! read; a window must give exactly the result's dimensions; the generic
//! paths visit a window's elements in row-major order.

use super::combiner::{
    binary_reducer, compare_of_params, dispatch_binop, float_binop, int_binop, pred_binop,
    scalar_at, scalar_like, scalars_to_array, split_result,
};
use crate::elementwise::{fmax32, fmax64, fmin32, fmin64};
use crate::error::{bad, EvalError};
use crate::index::{next_index, strides, udims};
use crate::interp::Evaluator;
use crate::value::{element_count, Array, Data, Value};
use rayon::prelude::*;
use xla_hlo_ir::attrs::Window;
use xla_hlo_ir::{CompId, Opcode};

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
