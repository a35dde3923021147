//! scatter with XLA's dimension numbers (inserted window dims, batching
//! dims, multi-operand).
//!
//! Invariants: update windows that do not fit in the operand are skipped,
//! as XLA does; updates apply in update order (the order of the generic
//! path's calls, and of overlapping writes).

use super::combiner::{binary_reducer, scalar_at, scalars_to_array, split_result};
use crate::elementwise::{fmax32, fmin32};
use crate::error::{bad, EvalError};
use crate::index::{next_index, strides, udims};
use crate::interp::Evaluator;
use crate::value::{Array, Data, Value};
use xla_hlo_ir::attrs::ScatterDimensionNumbers;
use xla_hlo_ir::{CompId, Opcode};

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
