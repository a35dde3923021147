//! Per-opcode handlers: elementwise ops, broadcast, transpose, reshape,
//! reduce, iota, constants, tuples, control flow (while, conditional,
//! call), the sharding custom-calls and the generic fallback. Windowed and
//! data-movement ops are in `window`, dot and convolution in `dot`, gather in
//! `gather`.
//!
//! Each handler chooses the operand shardings to compute in among a few
//! candidates (the output's, the operands' own, combinations) by the bytes
//! the reshards would move, emits the local op and returns the value in the
//! sharding it was computed in; the driver reshards it to the instruction's
//! own sharding.
//!
//! Invariant: the generic fallback (replicate operands, run the op on the
//! global shape) is correct for every side-effect-free op; handlers that
//! cannot prove their preconditions use it.

use crate::error::{unsupported, SpmdError};
use crate::grid::{local_dims, tile_size, Grid, GridCache};
use crate::helpers::{cheapest, grid_of, mask_padding};
use crate::part::Part;
use crate::shapes::with_dims;
use crate::value::{local_shape, PValue, VS};
use std::rc::Rc;
use xla_hlo_ir::{AttrKey, AttrValue, HloInstruction, Opcode, PrimitiveType, Shape};

/// Dispatches `instr` to its handler.
pub fn dispatch(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &VS,
) -> Result<PValue, SpmdError> {
    let op = instr.opcode;
    let res = match op {
        Opcode::Constant => {
            p.note(instr, "constant");
            let id = p.clone_instr(instr, vec![], instr.shape.clone());
            return Ok(PValue {
                id,
                shape: Rc::new(instr.shape.clone()),
                vs: VS::replicated_in(&instr.shape, p.n(), p.grids()),
            });
        }
        Opcode::Iota => iota(p, instr, target),
        Opcode::Tuple => tuple(p, instr, target),
        Opcode::GetTupleElement => gte(p, instr),
        Opcode::Broadcast => broadcast(p, instr, target),
        Opcode::Transpose => transpose(p, instr, target),
        Opcode::Reshape => reshape(p, instr, target),
        Opcode::Reduce => reduce(p, instr, target),
        Opcode::Dot => crate::dot::dot(p, instr, target),
        Opcode::Convolution => crate::dot::convolution(p, instr, target),
        Opcode::While => while_loop(p, instr, target),
        Opcode::Conditional => conditional(p, instr, target),
        Opcode::Call => call(p, instr, target),
        Opcode::CustomCall => custom_call(p, instr, target),
        Opcode::Slice => crate::window::slice(p, instr, target),
        Opcode::Pad => crate::window::pad(p, instr, target),
        Opcode::ReduceWindow => crate::window::reduce_window(p, instr, target),
        Opcode::SelectAndScatter => crate::window::select_and_scatter(p, instr, target),
        Opcode::Concatenate => crate::window::concatenate(p, instr, target),
        Opcode::DynamicSlice => crate::window::dynamic_slice(p, instr, target),
        Opcode::DynamicUpdateSlice => crate::window::dynamic_update_slice(p, instr, target),
        Opcode::Sort => crate::window::sort(p, instr, target),
        Opcode::TopK => crate::window::topk(p, instr, target),
        Opcode::Reverse => crate::window::reverse(p, instr, target),
        Opcode::Gather => crate::gather::gather(p, instr, target),
        Opcode::Scatter => crate::gather::scatter(p, instr, target),
        Opcode::OptimizationBarrier => pass_through(p, instr),
        Opcode::BitcastConvert
            if instr.shape.rank()
                != instr
                    .operands
                    .first()
                    .map(|&o| p.oc.instr(o).shape.rank())
                    .unwrap_or(0) =>
        {
            Ok(None)
        }
        Opcode::Rng | Opcode::RngBitGenerator => Ok(None),
        _ if op.is_elementwise() || op == Opcode::Map => elementwise(p, instr, target),
        _ => Ok(None),
    }?;
    match res {
        Some(v) => Ok(v),
        None => {
            p.note(instr, "fallback");
            fallback(p, instr)
        }
    }
}

/// Replicates every operand and runs the op on the global shape.
pub fn fallback(p: &mut Part<'_, '_>, instr: &HloInstruction) -> Result<PValue, SpmdError> {
    let mut ops = Vec::new();
    for k in 0..instr.operands.len() {
        let v = p.operand(instr, k)?;
        ops.push(p.replicate(&v)?.id);
    }
    let id = p.clone_instr(instr, ops, instr.shape.clone());
    Ok(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: VS::replicated_in(&instr.shape, p.n(), p.grids()),
    })
}

type Res = Result<Option<PValue>, SpmdError>;

fn elementwise(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &VS) -> Res {
    let Some(out) = grid_of(target) else {
        return Ok(None);
    };
    let rank = instr.shape.rank();
    let mut vals = Vec::new();
    for k in 0..instr.operands.len() {
        vals.push(p.operand(instr, k)?);
    }
    if vals
        .iter()
        .any(|v| v.shape.rank() != rank && v.shape.rank() != 0)
    {
        return Ok(None);
    }
    let mut cands = vec![out.clone()];
    for v in &vals {
        if let VS::Grid(g) = &v.vs {
            if v.shape.rank() == rank && rank > 0 && !cands.contains(g) {
                cands.push(g.clone());
            }
        } else {
            return Ok(None);
        }
    }
    let costed: Vec<(Grid, u64)> = cands
        .into_iter()
        .map(|c| {
            let mut cost = p.cost_of(&instr.shape, &c, &out);
            for v in &vals {
                if v.shape.rank() == rank && rank > 0 {
                    cost += p.cost(v, &c);
                }
            }
            (c, cost)
        })
        .collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let mut ops = Vec::new();
    for v in &vals {
        let g = if v.shape.rank() == rank {
            c.clone()
        } else {
            p.grids().replicated(0, p.n())
        };
        ops.push(p.reshard_to_grid(v, &g)?);
    }
    p.note(instr, "elementwise");
    Ok(Some(p.emit_local(instr, ops, &VS::Grid(c))?))
}

fn iota(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &VS) -> Res {
    let Some(out) = grid_of(target) else {
        return Ok(None);
    };
    let dim = instr.int_attr(AttrKey::IotaDimension).unwrap_or(0) as usize;
    let dims = instr.shape.dims().to_vec();
    let ld = local_dims(&dims, &out);
    let shape = with_dims(&instr.shape, &ld);
    let mut id = p.clone_instr(instr, vec![], shape);
    if dim < dims.len() && out.tiles(dim) > 1 {
        let ts = tile_size(dims[dim], out.tiles(dim));
        let table = p.grids().offsets(&out, dim, ts);
        let off = p.b.table(&table);
        let ty = crate::shapes::elem(&instr.shape)?;
        let off = if ty == PrimitiveType::S32 {
            off
        } else {
            p.b.add(
                "convert",
                Opcode::Convert,
                Shape::scalar(ty),
                vec![off],
                vec![],
            )
        };
        let ob = p.b.splat(off, &ld);
        id = p.b.binary(Opcode::Add, id, ob);
    }
    p.note(instr, "iota");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: VS::Grid(out),
    }))
}

fn tuple(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &VS) -> Res {
    let mut ids = Vec::new();
    let mut vss = Vec::new();
    for k in 0..instr.operands.len() {
        let v = p.operand(instr, k)?;
        // Operands take the tuple's shardings now, so equal reshards of one
        // value elsewhere are shared.
        let v = match target {
            VS::Tuple(e) if e.len() == instr.operands.len() && !v.vs.has_manual() => {
                p.reshard(&v, &e[k])?
            }
            _ => v,
        };
        ids.push(v.id);
        vss.push(v.vs);
    }
    let vs = VS::Tuple(vss);
    let shape = local_shape(&instr.shape, &vs);
    let id = p.clone_instr(instr, ids, shape);
    p.note(instr, "tuple");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs,
    }))
}

fn gte(p: &mut Part<'_, '_>, instr: &HloInstruction) -> Res {
    let v = p.operand(instr, 0)?;
    let k = instr.int_attr(AttrKey::Index).unwrap_or(0) as usize;
    let VS::Tuple(e) = &v.vs else {
        return unsupported("get-tuple-element of a non-tuple value");
    };
    let vs = e
        .get(k)
        .cloned()
        .ok_or_else(|| SpmdError::Invalid("tuple index out of range".into()))?;
    let shape = local_shape(&instr.shape, &vs);
    let id = {
        let ti = p.b.comp.instr(v.id);
        if ti.opcode == Opcode::Tuple && k < ti.operands.len() {
            ti.operands[k]
        } else {
            p.clone_instr(instr, vec![v.id], shape)
        }
    };
    p.note(instr, "get-tuple-element");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs,
    }))
}

fn pass_through(p: &mut Part<'_, '_>, instr: &HloInstruction) -> Res {
    let v = p.operand(instr, 0)?;
    let shape = local_shape(&instr.shape, &v.vs);
    let id = p.clone_instr(instr, vec![v.id], shape);
    p.note(instr, "pass-through");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: v.vs,
    }))
}

fn broadcast(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &VS) -> Res {
    let Some(out) = grid_of(target) else {
        return Ok(None);
    };
    let v = p.operand(instr, 0)?;
    let Some(vg) = v.vs.grid().cloned() else {
        return Ok(None);
    };
    let bdims: Vec<usize> = instr.dimensions().iter().map(|&d| d as usize).collect();
    let out_rank = instr.shape.rank();
    if bdims.len() != v.shape.rank() || bdims.iter().any(|&d| d >= out_rank) {
        return Ok(None);
    }
    // Candidate 1: the operand follows the output (result is `out`).
    let op_from_out: Vec<Option<usize>> = bdims.iter().map(|&d| Some(d)).collect();
    let p1 = p.grids().remap(&out, &op_from_out);
    let c1 = p.cost(&v, &p1);
    // Candidate 2: the operand as it is.
    let out_from_op: Vec<Option<usize>> = (0..out_rank)
        .map(|j| bdims.iter().position(|&d| d == j))
        .collect();
    let r2 = p.grids().remap(&vg, &out_from_op);
    let c2 = p.cost_of(&instr.shape, &r2, &out);
    let (pg, rg) = if c2 < c1 { (vg, r2) } else { (p1, out) };
    let x = p.reshard_to_grid(&v, &pg)?;
    p.note(instr, "broadcast");
    let vs = VS::Grid(rg);
    let shape = local_shape(&instr.shape, &vs);
    let id = p.clone_instr(instr, vec![x], shape);
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs,
    }))
}

fn transpose(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &VS) -> Res {
    let Some(out) = grid_of(target) else {
        return Ok(None);
    };
    let v = p.operand(instr, 0)?;
    let Some(vg) = v.vs.grid().cloned() else {
        return Ok(None);
    };
    let perm: Vec<usize> = instr.dimensions().iter().map(|&d| d as usize).collect();
    let r = perm.len();
    if r != v.shape.rank() {
        return Ok(None);
    }
    let mut op_map = vec![None; r];
    for (i, &pi) in perm.iter().enumerate() {
        if pi >= r {
            return Ok(None);
        }
        op_map[pi] = Some(i);
    }
    let p1 = p.grids().remap(&out, &op_map);
    let c1 = p.cost(&v, &p1);
    let out_map: Vec<Option<usize>> = perm.iter().map(|&pi| Some(pi)).collect();
    let r2 = p.grids().remap(&vg, &out_map);
    let c2 = p.cost_of(&instr.shape, &r2, &out);
    let (pg, rg) = if c2 < c1 { (vg, r2) } else { (p1, out) };
    let x = p.reshard_to_grid(&v, &pg)?;
    p.note(instr, "transpose");
    Ok(Some(p.emit_local(instr, vec![x], &VS::Grid(rg))?))
}

fn even(dims: &[i64], g: &Grid) -> bool {
    dims.iter()
        .enumerate()
        .all(|(a, &x)| g.tiles(a) == 1 || x % g.tiles(a) == 0)
}

/// The output grid a local reshape of input grid `g` produces, if exact.
fn reshape_out(
    grids: &GridCache,
    in_dims: &[i64],
    out_dims: &[i64],
    g: &Grid,
    n: i64,
) -> Option<Grid> {
    grids.reshape_grid(g, true, in_dims, out_dims, || {
        reshape_out_uncached(in_dims, out_dims, g, n)
    })
}

/// The operand grid whose local reshape gives `out`, if any.
fn reshape_in(
    grids: &GridCache,
    in_dims: &[i64],
    out_dims: &[i64],
    out: &Grid,
    n: i64,
) -> Option<Grid> {
    grids.reshape_grid(out, false, out_dims, in_dims, || {
        let pg = match out.reshaped(out_dims, in_dims) {
            Some(g) => g?,
            None => {
                let s =
                    xla_hlo_utils::ops::reshape_sharding(out_dims, in_dims, &out.to_sharding())?;
                Grid::from_sharding(&s, in_dims.len(), n).ok()?
            }
        };
        (reshape_out(grids, in_dims, out_dims, &pg, n).as_ref() == Some(out)).then_some(pg)
    })
}

/// The reshape's factor groups: the shortest runs of non-1 input dims and
/// of non-1 output dims with equal products, in order. `None` for
/// zero-sized dims.
fn reshape_groups(in_dims: &[i64], out_dims: &[i64]) -> Option<Vec<(Vec<usize>, Vec<usize>)>> {
    let ins: Vec<usize> = (0..in_dims.len()).filter(|&a| in_dims[a] != 1).collect();
    let outs: Vec<usize> = (0..out_dims.len()).filter(|&b| out_dims[b] != 1).collect();
    if in_dims.contains(&0) || out_dims.contains(&0) {
        return None;
    }
    let (mut i, mut j) = (0, 0);
    let mut groups = Vec::new();
    while i < ins.len() && j < outs.len() {
        let (gi, gj) = (i, j);
        let (mut pi, mut po) = (in_dims[ins[i]], out_dims[outs[j]]);
        i += 1;
        j += 1;
        while pi != po {
            if pi < po {
                pi *= *in_dims.get(*ins.get(i)?)?;
                i += 1;
            } else {
                po *= *out_dims.get(*outs.get(j)?)?;
                j += 1;
            }
        }
        groups.push((ins[gi..i].to_vec(), outs[gj..j].to_vec()));
    }
    (i == ins.len() && j == outs.len()).then_some(groups)
}

/// For a reshape of unevenly tiled dims, the global dims with those dims
/// (and the output dims they become) padded to whole tiles, when the local
/// reshape of the padded shards is exact and puts padding only where the
/// output's tiles have it. Per factor group, an uneven dim must be:
/// - a dim of its own (the `keepdims` reshapes of softmax and layernorm,
///   size-1 dims inserted or dropped): both sides padded alike;
/// - split, `[s] -> [s / m, m...]`, the minor factor `m` dividing the tile;
/// - the major dim of a merge with untiled minor dims of product `m`,
///   `[s, m...] -> [s * m]`, where the merged dim's tile is the old tile
///   times `m`.
///
/// With `retile`, a merge whose output tile differs is also accepted: its
/// output dim is padded to the merged tile instead (`ts * m` per tile) and
/// listed, for a window exchange to the real tiles after the reshape.
fn padded_reshape_dims(
    in_dims: &[i64],
    out_dims: &[i64],
    g: &Grid,
    retile: Option<&mut Vec<usize>>,
) -> Option<(Vec<i64>, Vec<i64>)> {
    let mut retile = retile;
    let uneven = |a: usize| g.tiles(a) > 1 && in_dims[a] % g.tiles(a) != 0;
    if (0..in_dims.len()).any(|a| in_dims[a] == 1 && g.tiles(a) > 1) {
        return None;
    }
    let (mut pin, mut pout) = (in_dims.to_vec(), out_dims.to_vec());
    for (gin, gout) in reshape_groups(in_dims, out_dims)? {
        if !gin.iter().any(|&a| uneven(a)) {
            continue;
        }
        let (a, b) = (gin[0], gout[0]);
        if gin[1..].iter().any(|&x| g.tiles(x) > 1) {
            return None;
        }
        let t = g.tiles(a);
        let ts = tile_size(in_dims[a], t);
        let minor_in: i64 = gin[1..].iter().map(|&x| in_dims[x]).product();
        let minor_out: i64 = gout[1..].iter().map(|&x| out_dims[x]).product();
        let out_tile = match (gin.len(), gout.len()) {
            (1, 1) => ts,
            (1, _) if ts % minor_out == 0 => ts / minor_out,
            (_, 1) if tile_size(out_dims[b], t) == ts * minor_in => ts * minor_in,
            (_, 1) if retile.is_some() => {
                retile.as_mut()?.push(b);
                ts * minor_in
            }
            _ => return None,
        };
        pin[a] = ts * t;
        pout[b] = out_tile * t;
    }
    Some((pin, pout))
}

fn reshape_out_uncached(in_dims: &[i64], out_dims: &[i64], g: &Grid, n: i64) -> Option<Grid> {
    if !even(in_dims, g) {
        let (pin, pout) = padded_reshape_dims(in_dims, out_dims, g, None)?;
        return if even(&pin, g) {
            reshape_out_uncached(&pin, &pout, g, n)
        } else {
            None
        };
    }
    let q = match g.reshaped(in_dims, out_dims) {
        Some(q) => q?,
        None => {
            let s = xla_hlo_utils::ops::reshape_sharding(in_dims, out_dims, &g.to_sharding())?;
            Grid::from_sharding(&s, out_dims.len(), n).ok()?
        }
    };
    if !even(out_dims, &q) {
        return None;
    }
    // The tile counts must match the element counts of the local reshape.
    let li: i64 = local_dims(in_dims, g).iter().product();
    let lo: i64 = local_dims(out_dims, &q).iter().product();
    (li == lo).then_some(q)
}

fn reshape(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &VS) -> Res {
    let Some(out) = grid_of(target) else {
        return Ok(None);
    };
    let v = p.operand(instr, 0)?;
    let Some(vg) = v.vs.grid().cloned() else {
        return Ok(None);
    };
    let n = p.n();
    let in_dims = v.shape.dims().to_vec();
    let out_dims = instr.shape.dims().to_vec();
    let mut cands: Vec<((Grid, Grid), u64)> = Vec::new();
    // (b) the operand resharded to what the output sharding needs.
    if let Some(pg) = reshape_in(p.grids(), &in_dims, &out_dims, &out, n) {
        let c = p.cost(&v, &pg);
        cands.push(((pg, out.clone()), c));
    }

    // (a) the operand as it is.
    if let Some(q) = reshape_out(p.grids(), &in_dims, &out_dims, &vg, n) {
        let c = p.cost_of(&instr.shape, &q, &out);
        cands.push(((vg.clone(), q), c));
    }
    // (d) a partial gather of one sharded dim (its smallest minor factor
    // that makes the local reshape exact), then the output resharded.
    // Only worth building when no exact candidate is already free.
    let free = cands.iter().any(|c| c.1 == 0);
    for a in vg.tiled_dims().into_iter().filter(|_| !free) {
        let t = vg.tiles(a);
        for f in (2..=t).filter(|f| t % f == 0) {
            let Some(gg) = p.grids().gathered(&vg, &[(a, f)]) else {
                continue;
            };
            if let Some(q) = reshape_out(p.grids(), &in_dims, &out_dims, &gg, n) {
                let c = p.cost(&v, &gg) + p.cost_of(&instr.shape, &q, &out);
                cands.push(((gg, q), c));
                break;
            }
        }
    }
    // (c) replicated.
    let rin = p.grids().replicated(in_dims.len(), n);
    let rout = p.grids().replicated(out_dims.len(), n);
    let c = p.cost(&v, &rin);
    cands.push(((rin, rout), c));
    let best = cands.iter().map(|c| c.1).min().unwrap_or(u64::MAX);
    if best > 0 {
        if let Some(r) = reshape_retiled(p, instr, &v, &vg, &out, best)? {
            return Ok(Some(r));
        }
    }
    let Some((pg, rg)) = cheapest(&cands) else {
        return Ok(None);
    };
    let x = p.reshard_to_grid(&v, &pg)?;
    let shape = local_shape(&instr.shape, &VS::Grid(rg.clone()));
    let id = p.clone_instr(instr, vec![x], shape);
    p.note(instr, "reshape");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: VS::Grid(rg),
    }))
}

/// A reshape merging an unevenly tiled dim with whole minor dims whose
/// merged tiles differ from the output's (`[6, 10]` over 4 -> `[60]`:
/// local rows of 20 elements, output tiles of 15): the local reshape, then
/// a window exchange from the merged tiles to the output's (a
/// collective-permute of the misaligned part, as XLA does). Used when
/// cheaper than `best`, the other candidates' cost.
fn reshape_retiled(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    v: &PValue,
    vg: &Grid,
    out: &Grid,
    best: u64,
) -> Res {
    let in_dims = v.shape.dims().to_vec();
    let out_dims = instr.shape.dims().to_vec();
    let n = p.n();
    let mut retile = Vec::new();
    let Some((pin, pout)) = padded_reshape_dims(&in_dims, &out_dims, vg, Some(&mut retile)) else {
        return Ok(None);
    };
    if retile.is_empty() || !even(&pin, vg) {
        return Ok(None);
    }
    let Some(q) = reshape_out_uncached(&pin, &pout, vg, n) else {
        return Ok(None);
    };
    // The exchange works on the output with the merged (virtual) sizes.
    let windows: Vec<(usize, Vec<i64>, i64)> = retile
        .iter()
        .map(|&b| {
            let t = q.tiles(b);
            let so = tile_size(out_dims[b], t);
            (b, (0..t).map(|i| i * so).collect(), so)
        })
        .collect();
    let virt = with_dims(&instr.shape, &pout);
    let mut cost = p.cost_of(&instr.shape, &q, out);
    for (b, starts, len) in &windows {
        cost += crate::exchange::exchange_cost(p, &q, &virt, *b, starts, *len);
    }
    if cost >= best {
        return Ok(None);
    }
    let local = local_shape(&virt, &VS::Grid(q.clone()));
    let mut x = p.clone_instr(instr, vec![v.id], local);
    let mut dims_now = pout.clone();
    for (b, starts, len) in &windows {
        x = crate::exchange::exchange(p, x, &q, &dims_now, *b, starts, *len, None)?;
        dims_now[*b] = len * q.tiles(*b);
    }
    p.note(instr, "reshape-retile");
    Ok(Some(PValue {
        id: x,
        shape: Rc::new(instr.shape.clone()),
        vs: VS::Grid(q),
    }))
}

fn reduce(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &VS) -> Res {
    let k = instr.operands.len() / 2;
    if k == 0 {
        return Ok(None);
    }
    let leaf_target = match target {
        VS::Grid(g) => g.clone(),
        VS::Tuple(e) => match e.first().and_then(|x| x.grid()) {
            Some(g) => g.clone(),
            None => return Ok(None),
        },
        _ => return Ok(None),
    };
    let mut inputs = Vec::new();
    for i in 0..k {
        inputs.push(p.operand(instr, i)?);
    }
    let in_shape = inputs[0].shape.clone();
    let r = in_shape.rank();
    let red: Vec<usize> = instr.dimensions().iter().map(|&d| d as usize).collect();
    if red.iter().any(|&d| d >= r) || inputs.iter().any(|v| v.shape.rank() != r) {
        return Ok(None);
    }
    let kept: Vec<usize> = (0..r).filter(|a| !red.contains(a)).collect();
    let in_map: Vec<Option<usize>> = (0..r).map(|a| kept.iter().position(|&x| x == a)).collect();
    let out_map: Vec<Option<usize>> = kept.iter().map(|&a| Some(a)).collect();
    let out_leaf_shape = match &instr.shape {
        Shape::Tuple(e) => e.first().cloned().unwrap_or_else(|| instr.shape.clone()),
        s => s.clone(),
    };
    let Some(g0) = inputs[0].vs.grid().cloned() else {
        return Ok(None);
    };
    let from_out = p.grids().remap(&leaf_target, &in_map);
    let mut cands = vec![g0.clone(), from_out.clone()];
    if let Some(m) = p.grids().merge(&from_out, &g0, &red) {
        cands.push(m);
    }
    let bytes_out: u64 = match &instr.shape {
        Shape::Tuple(e) => e
            .iter()
            .map(|s| s.element_type().map(|t| t.byte_width()).unwrap_or(4) as u64)
            .sum(),
        s => s.element_type().map(|t| t.byte_width()).unwrap_or(4) as u64,
    };
    let costed: Vec<(Grid, u64)> = cands
        .into_iter()
        .map(|c| {
            let mut cost = 0;
            for v in &inputs {
                cost += p.cost(v, &c);
            }
            let c_out = p.grids().remap(&c, &out_map);
            let red_tiled: i64 = red.iter().map(|&a| c.tiles(a)).product();
            let mut post = p.cost_of(&out_leaf_shape, &c_out, &leaf_target) * k as u64;
            if red_tiled > 1 {
                let lo: u64 = local_dims(out_leaf_shape.dims(), &c_out)
                    .iter()
                    .map(|&d| d as u64)
                    .product();
                post += if k == 1 {
                    lo * bytes_out
                } else {
                    lo * bytes_out * red_tiled as u64
                };
                if k == 1 {
                    if let Some((_, _, rc)) = reduce_scatter_choice(
                        p,
                        &c,
                        &c_out,
                        &red,
                        &out_leaf_shape,
                        &leaf_target,
                        lo * bytes_out,
                    ) {
                        post = post.min(rc);
                    }
                }
            }
            cost += post;
            (c, cost)
        })
        .collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let c_out = p.grids().remap(&c, &out_map);
    let red_tiled: Vec<usize> = red.iter().copied().filter(|&a| c.tiles(a) > 1).collect();
    let mut ops = Vec::new();
    let mut inits = Vec::new();
    for i in 0..k {
        let iv = p.operand(instr, k + i)?;
        inits.push(p.replicate(&iv)?.id);
    }
    for (i, v) in inputs.iter().enumerate() {
        let x = p.reshard_to_grid(v, &c)?;
        let x = mask_padding(p, x, &c, in_shape.dims(), &red_tiled, inits[i])?;
        ops.push(x);
    }
    let mut all_ops = ops.clone();
    all_ops.extend(&inits);
    let out_vs = if k == 1 {
        VS::Grid(c_out.clone())
    } else {
        VS::Tuple(vec![VS::Grid(c_out.clone()); k])
    };
    let local = p.emit_local(instr, all_ops, &out_vs)?;
    p.note(instr, "reduce");
    if red_tiled.is_empty() {
        return Ok(Some(local));
    }
    let factors: Vec<(usize, i64)> = red_tiled.iter().map(|&a| (a, c.tiles(a))).collect();
    let groups = p.grids().factor_groups(&c, &factors);
    let lshape = local_shape(&instr.shape, &out_vs);
    if k == 1 {
        let to_apply = instr
            .to_apply()
            .ok_or_else(|| SpmdError::Invalid("reduce without to_apply".into()))?;
        let lo: u64 = local_dims(out_leaf_shape.dims(), &c_out)
            .iter()
            .map(|&d| d as u64)
            .product();
        let ar_cost = lo * bytes_out + p.cost_of(&out_leaf_shape, &c_out, &leaf_target);
        if let Some((od, rs, rc)) = reduce_scatter_choice(
            p,
            &c,
            &c_out,
            &red,
            &out_leaf_shape,
            &leaf_target,
            lo * bytes_out,
        ) {
            if rc < ar_cost {
                let id = p.b.reduce_scatter_with(local.id, od, &groups, to_apply)?;
                return Ok(Some(PValue {
                    id,
                    shape: Rc::new(instr.shape.clone()),
                    vs: VS::Grid(rs),
                }));
            }
        }
        let id = p.b.all_reduce_with(local.id, &groups, to_apply);
        return Ok(Some(PValue {
            id,
            shape: Rc::new(instr.shape.clone()),
            vs: out_vs,
        }));
    }
    // Variadic: gather the partial results and reduce them again.
    let g = groups.size;
    let leaves = lshape.tuple_elements().to_vec();
    let mut gathered = Vec::new();
    for (j, ls) in leaves.iter().enumerate() {
        let e = p.b.add(
            "get-tuple-element",
            Opcode::GetTupleElement,
            ls.clone(),
            vec![local.id],
            vec![(AttrKey::Index, AttrValue::Int(j as i64))],
        );
        let mut d1 = vec![1];
        d1.extend(ls.dims());
        let r1 = p.b.reshape(e, &d1);
        gathered.push(p.b.all_gather(r1, 0, &groups));
    }
    let _ = g;
    let mut ops2 = gathered;
    ops2.extend(&inits);
    let mut c2 = instr.clone();
    c2.name = p.b.ctx.fresh(&instr.name);
    c2.operands = ops2;
    c2.shape = lshape;
    c2.sharding = None;
    c2.control_predecessors.clear();
    c2.set_attr(AttrKey::Dimensions, AttrValue::Ints(vec![0]));
    let id = p.b.push(c2);
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: out_vs,
    }))
}

/// The cheapest reduce-scatter of a partial reduction (partial over the
/// tiled dims of `red` in `c`, laid out by `c_out`) onto an output dim:
/// (dim, resulting grid, bytes of the scatter plus the reshard to `target`).
fn reduce_scatter_choice(
    p: &Part<'_, '_>,
    c: &Grid,
    c_out: &Grid,
    red: &[usize],
    out_shape: &Shape,
    target: &Grid,
    ar_bytes: u64,
) -> Option<(usize, Grid, u64)> {
    let tiled: Vec<usize> = red.iter().copied().filter(|&a| c.tiles(a) > 1).collect();
    let g: i64 = tiled.iter().map(|&a| c.tiles(a)).product();
    let mut best: Option<(usize, Grid, u64)> = None;
    for (od, &x) in out_shape.dims().iter().enumerate() {
        if x % (c_out.tiles(od) * g) != 0 {
            continue;
        }
        let Some(rs) = c_out.reduce_scattered(c, &tiled, od) else {
            continue;
        };
        let cost = ar_bytes / g as u64 + p.cost_of(out_shape, &rs, target);
        if best.as_ref().map(|b| cost < b.2).unwrap_or(true) {
            best = Some((od, rs, cost));
        }
    }
    best
}

fn while_loop(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &VS) -> Res {
    let (Some(body), Some(cond)) = (
        instr.computation_attr(AttrKey::Body),
        instr.computation_attr(AttrKey::Condition),
    ) else {
        return Ok(None);
    };
    let init = p.operand(instr, 0)?;
    let init = p.reshard(&init, target)?;
    let (nb, _) = p.partition_sub(body, std::slice::from_ref(target), Some(target))?;
    let (nc, _) = p.partition_sub(cond, std::slice::from_ref(target), None)?;
    let shape = local_shape(&instr.shape, target);
    let id = p.clone_instr(instr, vec![init.id], shape);
    let w = p.b.comp.instr_mut(id);
    w.set_attr(AttrKey::Body, AttrValue::Computation(nb));
    w.set_attr(AttrKey::Condition, AttrValue::Computation(nc));
    p.note(instr, "while");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: target.clone(),
    }))
}

fn conditional(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &VS) -> Res {
    let branches: Vec<(AttrKey, Option<usize>, xla_hlo_ir::CompId)> =
        if let Some(AttrValue::Computations(cs)) = instr.attr(AttrKey::BranchComputations) {
            cs.iter()
                .enumerate()
                .map(|(i, &c)| (AttrKey::BranchComputations, Some(i), c))
                .collect()
        } else {
            match (
                instr.computation_attr(AttrKey::TrueComputation),
                instr.computation_attr(AttrKey::FalseComputation),
            ) {
                (Some(t), Some(f)) => vec![
                    (AttrKey::TrueComputation, None, t),
                    (AttrKey::FalseComputation, None, f),
                ],
                _ => return Ok(None),
            }
        };
    let sel = p.operand(instr, 0)?;
    let sel = p.replicate(&sel)?;
    let mut ops = vec![sel.id];
    let mut new_branches = Vec::new();
    for (i, (_, _, c)) in branches.iter().enumerate() {
        let v = p.operand(instr, i + 1)?;
        ops.push(v.id);
        let (nc, _) = p.partition_sub(*c, std::slice::from_ref(&v.vs), Some(target))?;
        new_branches.push(nc);
    }
    let shape = local_shape(&instr.shape, target);
    let id = p.clone_instr(instr, ops, shape);
    let ci = p.b.comp.instr_mut(id);
    if branches[0].0 == AttrKey::BranchComputations {
        ci.set_attr(
            AttrKey::BranchComputations,
            AttrValue::Computations(new_branches),
        );
    } else {
        ci.set_attr(
            AttrKey::TrueComputation,
            AttrValue::Computation(new_branches[0]),
        );
        ci.set_attr(
            AttrKey::FalseComputation,
            AttrValue::Computation(new_branches[1]),
        );
    }
    p.note(instr, "conditional");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: target.clone(),
    }))
}

fn call(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &VS) -> Res {
    let Some(callee) = instr.to_apply() else {
        return Ok(None);
    };
    let mut ops = Vec::new();
    let mut params = Vec::new();
    for k in 0..instr.operands.len() {
        let v = p.operand(instr, k)?;
        ops.push(v.id);
        params.push(v.vs);
    }
    let (nc, _) = p.partition_sub(callee, &params, Some(target))?;
    let shape = local_shape(&instr.shape, target);
    let id = p.clone_instr(instr, ops, shape);
    p.b.comp
        .instr_mut(id)
        .set_attr(AttrKey::ToApply, AttrValue::Computation(nc));
    p.note(instr, "call");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: target.clone(),
    }))
}

fn custom_call(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &VS) -> Res {
    let tgt = instr.ident_attr(AttrKey::CustomCallTarget).unwrap_or("");
    match tgt {
        "Sharding" => {
            let v = p.operand(instr, 0)?;
            p.note(instr, "sharding");
            Ok(Some(p.reshard(&v, target)?))
        }
        "SPMDFullToShardShape" => {
            let v = p.operand(instr, 0)?;
            let got = p.b.dims(v.id);
            if got != instr.shape.dims() {
                return unsupported(format!(
                    "SPMDFullToShardShape: local shard {got:?} differs from {}",
                    instr.shape
                ));
            }
            let id = p.b.add(
                "copy",
                Opcode::Copy,
                instr.shape.clone(),
                vec![v.id],
                vec![],
            );
            p.note(instr, "full-to-shard");
            Ok(Some(PValue {
                id,
                shape: Rc::new(instr.shape.clone()),
                vs: VS::Manual,
            }))
        }
        "SPMDShardToFullShape" => {
            let v = p.operand(instr, 0)?;
            let want = local_shape(&instr.shape, target);
            if p.b.dims(v.id) != want.dims() {
                return unsupported(format!(
                    "SPMDShardToFullShape: shard {:?} is not the local shape {want}",
                    p.b.dims(v.id)
                ));
            }
            let id = p.b.add("copy", Opcode::Copy, want, vec![v.id], vec![]);
            p.note(instr, "shard-to-full");
            Ok(Some(PValue {
                id,
                shape: Rc::new(instr.shape.clone()),
                vs: target.clone(),
            }))
        }
        "LayoutConstraint" | "MoveToHost" | "MoveToDevice" if instr.operands.len() == 1 => {
            elementwise(p, instr, target)
        }
        _ => Ok(None),
    }
}
