//! Dynamic slices and updates: computed where the dims they cut are whole
//! (in the output's layout or the operand's, whichever costs least to
//! reach), except a one-row update into dims that stay tiled (a KV cache
//! written at a runtime position), which each device applies to its own
//! tile.
//!
//! Invariant: start indices are replicated; a device whose tile does not
//! hold the updated row keeps its tile unchanged.

use crate::grid::{tile_size, Grid};
use crate::helpers::{cheapest, HandlerResult};
use crate::part::Part;
use crate::value::{local_shape, PValue, ValueSharding};
use std::rc::Rc;
use xla_hlo_ir::{AttrKey, AttrValue, HloInstruction, InstrId, Opcode};

/// Dims a dynamic slice/update actually cuts (size below the dim).
fn cut_dims(full: &[i64], sizes: &[i64]) -> Vec<usize> {
    (0..full.len()).filter(|&a| sizes[a] < full[a]).collect()
}

pub fn dynamic_slice(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    let v = p.operand(instr, 0)?;
    let Some(vg) = v.vs.grid().cloned() else {
        return Ok(None);
    };
    let dims = v.shape.dims().to_vec();
    let sizes = instr.shape.dims().to_vec();
    if sizes.len() != dims.len() || out.rank() != dims.len() || vg.rank() != dims.len() {
        return Ok(None);
    }
    let cut = cut_dims(&dims, &sizes);
    let cands = [
        p.grids().replicate_dims(&out, &cut),
        p.grids().replicate_dims(&vg, &cut),
    ];
    let costed: Vec<(Grid, u64)> = cands
        .iter()
        .map(|c| (c.clone(), p.cost(&v, c) + p.cost_of(&instr.shape, c, &out)))
        .collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let x = p.reshard_to_grid(&v, &c)?;
    let mut ops = vec![x];
    for a in 0..dims.len() {
        let iv = p.operand(instr, 1 + a)?;
        let iv = p.replicate(&iv)?.id;
        if cut.contains(&a) {
            ops.push(iv);
        } else {
            let ty = p.b.ty(iv)?;
            ops.push(p.b.scalar(ty, 0));
        }
    }
    let vs = ValueSharding::Grid(c);
    let want = local_shape(&instr.shape, &vs);
    let id = p.clone_instr(instr, ops, want.clone());
    p.b.comp.instr_mut(id).set_attr(
        AttrKey::DynamicSliceSizes,
        AttrValue::Ints(want.dims().to_vec()),
    );
    p.note(instr, "dynamic-slice");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs,
    }))
}

pub fn dynamic_update_slice(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    let v = p.operand(instr, 0)?;
    let u = p.operand(instr, 1)?;
    let Some(vg) = v.vs.grid().cloned() else {
        return Ok(None);
    };
    let dims = v.shape.dims().to_vec();
    let usz = u.shape.dims().to_vec();
    if usz.len() != dims.len() || out.rank() != dims.len() || vg.rank() != dims.len() {
        return Ok(None);
    }
    let cut = cut_dims(&dims, &usz);
    let cands = [
        p.grids().replicate_dims(&out, &cut),
        p.grids().replicate_dims(&vg, &cut),
    ];
    let costed: Vec<(Grid, u64)> = cands
        .iter()
        .map(|c| {
            (
                c.clone(),
                p.cost(&v, c) + p.cost(&u, c) + p.cost_of(&instr.shape, c, &out),
            )
        })
        .collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let best = costed.iter().map(|c| c.1).min().unwrap_or(u64::MAX);
    if let Some(r) = dynamic_update_row(p, instr, &out, &v, &u, &cut, best)? {
        return Ok(Some(r));
    }
    if let Some(r) = dynamic_update_window(p, instr, &out, &v, &u, &cut, best)? {
        return Ok(Some(r));
    }
    let x = p.reshard_to_grid(&v, &c)?;
    let y = p.reshard_to_grid(&u, &c)?;
    let mut ops = vec![x, y];
    for a in 0..dims.len() {
        let iv = p.operand(instr, 2 + a)?;
        let iv = p.replicate(&iv)?.id;
        if cut.contains(&a) {
            ops.push(iv);
        } else {
            let ty = p.b.ty(iv)?;
            ops.push(p.b.scalar(ty, 0));
        }
    }
    p.note(instr, "dynamic-update-slice");
    Ok(Some(p.emit_local(instr, ops, &ValueSharding::Grid(c))?))
}

/// A dynamic-update-slice writing one row (update size 1) into dims that
/// stay tiled (a KV cache with its time dim sharded, written at a runtime
/// position): each device updates its own tile at the position less its
/// tile's offset, and keeps the result only when the row falls in its
/// tile (as XLA does); no data moves. Other cut dims are whole. Used when
/// cheaper than `best`.
fn dynamic_update_row(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    out: &Grid,
    v: &PValue,
    u: &PValue,
    cut: &[usize],
    best: u64,
) -> HandlerResult {
    let dims = v.shape.dims().to_vec();
    let usz = u.shape.dims().to_vec();
    let rows: Vec<usize> = cut
        .iter()
        .copied()
        .filter(|&a| usz[a] == 1 && out.tiles(a) > 1)
        .collect();
    if rows.is_empty() {
        return Ok(None);
    }
    let whole: Vec<usize> = cut.iter().copied().filter(|a| !rows.contains(a)).collect();
    let c = p.grids().replicate_dims(out, &whole);
    let cu = p.grids().replicate_dims(&c, &rows);
    let cost = p.cost(v, &c) + p.cost(u, &cu) + p.cost_of(&instr.shape, &c, out);
    if cost >= best {
        return Ok(None);
    }
    let x = p.reshard_to_grid(v, &c)?;
    let y = p.reshard_to_grid(u, &cu)?;
    let mut ops = vec![x, y];
    let mut inside: Option<InstrId> = None;
    for a in 0..dims.len() {
        let iv = p.operand(instr, 2 + a)?;
        let iv = p.replicate(&iv)?.id;
        let ty = p.b.ty(iv)?;
        if rows.contains(&a) {
            let ts = tile_size(dims[a], c.tiles(a));
            let local = tile_start(p, iv, (dims[a], 1), &c, a)?;
            let zero = p.b.scalar(ty, 0);
            let size = p.b.scalar(ty, ts);
            let ge = p.b.compare(local, zero, "GE");
            let lt = p.b.compare(local, size, "LT");
            let here = p.b.binary(Opcode::And, ge, lt);
            inside = Some(match inside {
                Some(prev) => p.b.binary(Opcode::And, prev, here),
                None => here,
            });
            ops.push(local);
        } else if cut.contains(&a) {
            ops.push(iv);
        } else {
            ops.push(p.b.scalar(ty, 0));
        }
    }
    let r = p.emit_local(instr, ops, &ValueSharding::Grid(c))?;
    let Some(inside) = inside else {
        return Ok(None);
    };
    let ld = p.b.dims(r.id);
    let mask = p.b.splat(inside, &ld);
    let id = p.b.select(mask, r.id, x);
    p.note(instr, "dynamic-update-slice:row");
    Ok(Some(PValue { id, ..r }))
}

/// A dynamic-update-slice of a window of several rows into dims that stay
/// tiled: the update is gathered along those dims (it is small next to
/// the operand), and each device places it at the clamped start less its
/// tile's offset (the update padded by a tile on both sides, the tile's
/// window sliced out), writes the placed block over its tile where the
/// window covers it, and keeps its own rows elsewhere; cut dims that are
/// not tiled take the update as a plain dynamic-update-slice. Used when
/// cheaper than `best`.
fn dynamic_update_window(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    out: &Grid,
    v: &PValue,
    u: &PValue,
    cut: &[usize],
    best: u64,
) -> HandlerResult {
    let dims = v.shape.dims().to_vec();
    let usz = u.shape.dims().to_vec();
    let tiled: Vec<usize> = cut.iter().copied().filter(|&a| out.tiles(a) > 1).collect();
    if tiled.is_empty() || tiled.iter().all(|&a| usz[a] == 1) {
        return Ok(None);
    }
    let whole: Vec<usize> = cut.iter().copied().filter(|a| !tiled.contains(a)).collect();
    let c = p.grids().replicate_dims(out, &whole);
    let cu = p.grids().replicate_dims(&c, &tiled);
    let cost = p.cost(v, &c) + p.cost(u, &cu) + p.cost_of(&instr.shape, &c, out);
    if cost >= best {
        return Ok(None);
    }
    let x = p.reshard_to_grid(v, &c)?;
    let mut y = p.reshard_to_grid(u, &cu)?;
    let ld = p.b.dims(x);
    let mut ops = Vec::new();
    let mut mask: Option<InstrId> = None;
    for a in 0..dims.len() {
        let iv = p.operand(instr, 2 + a)?;
        let iv = p.replicate(&iv)?.id;
        let ty = p.b.ty(iv)?;
        if !tiled.contains(&a) {
            ops.push(if cut.contains(&a) {
                iv
            } else {
                p.b.scalar(ty, 0)
            });
            continue;
        }
        let ts = tile_size(dims[a], c.tiles(a));
        let local = tile_start(p, iv, (dims[a], usz[a]), &c, a)?;
        let local = if ty == xla_hlo_ir::PrimitiveType::S32 {
            local
        } else {
            p.b.add(
                "convert",
                Opcode::Convert,
                xla_hlo_ir::Shape::scalar(xla_hlo_ir::PrimitiveType::S32),
                vec![local],
                vec![],
            )
        };
        // Placed: the update padded by a tile on both sides, the window at
        // `ts - local` (in range wherever the window meets the tile).
        let mut lo_hi = vec![(0, 0); dims.len()];
        lo_hi[a] = (ts, ts);
        let padded = p.b.pad_zero(y, &lo_hi)?;
        let tsc = p.b.scalar(xla_hlo_ir::PrimitiveType::S32, ts);
        let at = p.b.binary(Opcode::Subtract, tsc, local);
        let zero = p.b.scalar(xla_hlo_ir::PrimitiveType::S32, 0);
        let starts: Vec<InstrId> = (0..dims.len())
            .map(|d| if d == a { at } else { zero })
            .collect();
        let mut sizes = p.b.dims(padded);
        sizes[a] = ts;
        y = p.b.dynamic_slice(padded, starts, &sizes);
        // Positions q of the tile with local <= q < local + size.
        let neg_local = p.b.binary(Opcode::Subtract, zero, local);
        let m = p.b.range_mask(&ld, a, neg_local, Some(0), Some(usz[a]));
        mask = Some(match mask {
            Some(prev) => p.b.binary(Opcode::And, prev, m),
            None => m,
        });
        ops.push(p.b.scalar(ty, 0));
    }
    let Some(mask) = mask else {
        return Ok(None);
    };
    let mut operands = vec![x, y];
    operands.extend(ops);
    let r = p.emit_local(instr, operands, &ValueSharding::Grid(c))?;
    let id = p.b.select(mask, r.id, x);
    p.note(instr, "dynamic-update-slice:window");
    Ok(Some(PValue { id, ..r }))
}

/// The start index `iv` of a dynamic-update-slice along dim `a` (of `x`
/// elements, an update of `size`) clamped as XLA clamps it, less the
/// device's tile offset under `c`: in the index's own type.
fn tile_start(
    p: &mut Part<'_, '_>,
    iv: InstrId,
    (x, size): (i64, i64),
    c: &Grid,
    a: usize,
) -> Result<InstrId, crate::error::SpmdError> {
    let ty = p.b.ty(iv)?;
    let lo = p.b.scalar(ty, 0);
    let hi = p.b.scalar(ty, x - size);
    let start = p.b.binary(Opcode::Maximum, iv, lo);
    let start = p.b.binary(Opcode::Minimum, start, hi);
    let ts = tile_size(x, c.tiles(a));
    let off = crate::helpers::to_ty(p, &p.grids().offsets(c, a, ts), ty)?;
    Ok(p.b.binary(Opcode::Subtract, start, off))
}
