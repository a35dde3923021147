//! Ops that reorder elements along dims: sort and top-k (computed where the
//! sorted dim is whole, its tiling dropped or moved to another dim) and
//! reverse (the reversed dims' tiles are mirrored; uneven tiles are
//! shifted back into place by a window exchange).
//!
//! Invariant: values and indices of a multi-operand sort or top-k come out
//! in one layout.

use crate::exchange::{exchange, exchange_cost};
use crate::grid::{tile_size, Grid};
use crate::helpers::{cheapest, unsharded_candidates, HandlerResult};
use crate::part::Part;
use crate::value::{PValue, ValueSharding};
use xla_hlo_ir::{HloInstruction, Shape};

pub fn sort(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &ValueSharding) -> HandlerResult {
    let out = match target {
        ValueSharding::Grid(g) => g.clone(),
        ValueSharding::Tuple(e) => match e.first().and_then(|x| x.grid()) {
            Some(g) => g.clone(),
            None => return Ok(None),
        },
        _ => return Ok(None),
    };
    let a = instr.dimensions().first().copied().unwrap_or(0) as usize;
    let mut vals = Vec::new();
    for k in 0..instr.operands.len() {
        vals.push(p.operand(instr, k)?);
    }
    if vals.is_empty() || a >= out.rank() || vals.iter().any(|v| v.shape.rank() != out.rank()) {
        return Ok(None);
    }
    let leaf_shape = vals[0].shape.clone();
    let mut cands = unsharded_candidates(p.grids(), &out, a, &[leaf_shape.dims()]);
    if let Some(g) = vals[0].vs.grid() {
        cands.push(p.grids().replicate_dims(g, &[a]));
    }
    let k = vals.len() as u64;
    let costed: Vec<(Grid, u64)> = cands
        .into_iter()
        .map(|c| {
            let mut cost = p.cost_of(&leaf_shape, &c, &out) * k;
            for v in &vals {
                cost += p.cost(v, &c);
            }
            (c, cost)
        })
        .collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let mut ops = Vec::new();
    for v in &vals {
        ops.push(p.reshard_to_grid(v, &c)?);
    }
    let vs = if instr.shape.is_tuple() {
        ValueSharding::Tuple(vec![ValueSharding::Grid(c); vals.len()])
    } else {
        ValueSharding::Grid(c)
    };
    p.note(instr, "sort");
    Ok(Some(p.emit_local(instr, ops, &vs)?))
}

/// `topk` (always over the last dim): computed where the last dim is whole
/// on every device, in the cheapest of the output's sharding and the
/// operand's, each with the last dim's sharding dropped or moved to another
/// dim by an all-to-all; values and indices come out in that sharding.
pub fn topk(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &ValueSharding) -> HandlerResult {
    let out = match target {
        ValueSharding::Tuple(e) => match e.first().and_then(|x| x.grid()) {
            Some(g) => g.clone(),
            None => return Ok(None),
        },
        _ => return Ok(None),
    };
    let v = p.operand(instr, 0)?;
    let dims = v.shape.dims().to_vec();
    let rank = dims.len();
    let Shape::Tuple(leaves) = &instr.shape else {
        return Ok(None);
    };
    if rank == 0 || out.rank() != rank || leaves.len() != 2 {
        return Ok(None);
    }
    let a = rank - 1;
    let mut cands = unsharded_candidates(p.grids(), &out, a, &[&dims]);
    if let Some(g) = v.vs.grid() {
        if g.rank() == rank {
            cands.extend(unsharded_candidates(p.grids(), g, a, &[&dims]));
        }
    }
    let costed: Vec<(Grid, u64)> = cands
        .into_iter()
        .map(|c| {
            let mut cost = p.cost(&v, &c);
            for leaf in leaves {
                cost += p.cost_of(leaf, &c, &out);
            }
            (c, cost)
        })
        .collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let x = p.reshard_to_grid(&v, &c)?;
    p.note(instr, "topk");
    let vs = ValueSharding::Tuple(vec![ValueSharding::Grid(c.clone()), ValueSharding::Grid(c)]);
    Ok(Some(p.emit_local(instr, vec![x], &vs)?))
}

pub fn reverse(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    let v = p.operand(instr, 0)?;
    let dims = v.shape.dims().to_vec();
    let rev: Vec<usize> = instr.dimensions().iter().map(|&d| d as usize).collect();
    if rev.iter().any(|&a| a >= dims.len()) {
        return Ok(None);
    }
    // Reversed dims flip their tile order: each device reverses the tile
    // mirrored to it. On an uneven dim (padding `pad` at the end) that
    // leaves every local tile `pad` rows early: a window exchange shifts
    // it back (as XLA does). The alternative gathers the uneven dims.
    let uneven: Vec<usize> = rev
        .iter()
        .copied()
        .filter(|&a| out.tiles(a) > 1 && dims[a] % out.tiles(a) != 0)
        .collect();
    let flip = |g: &Grid| {
        Grid::from_coords(
            &(0..g.rank()).map(|a| g.tiles(a)).collect::<Vec<_>>(),
            g.num_devices(),
            |d, out| {
                for (a, x) in out.iter_mut().enumerate() {
                    let c = g.coord(d, a);
                    *x = if rev.contains(&a) {
                        g.tiles(a) - 1 - c
                    } else {
                        c
                    };
                }
            },
        )
    };
    // Per uneven dim: (dim, starts, tile size) of the shift, and the dims
    // of the shifted (virtual) array the local tiles are even tiles of.
    let mut virt = dims.clone();
    let shifts: Vec<(usize, Vec<i64>, i64)> = uneven
        .iter()
        .map(|&a| {
            let t = out.tiles(a);
            let ts = tile_size(dims[a], t);
            let pad = ts * t - dims[a];
            virt[a] = ts * t;
            (a, (0..t).map(|i| i * ts + pad).collect(), ts)
        })
        .collect();
    let gathered = p.grids().replicate_dims(&out, &uneven);
    let (Some(src), Some(src_gathered)) = (flip(&out), flip(&gathered)) else {
        return Ok(None);
    };
    let mut shifted_cost = p.cost(&v, &src);
    let virt_shape = crate::shapes::with_dims(&instr.shape, &virt);
    for (a, starts, len) in &shifts {
        shifted_cost += exchange_cost(p, &out, &virt_shape, *a, starts, *len);
    }
    let gathered_cost = p.cost(&v, &src_gathered) + p.cost_of(&instr.shape, &gathered, &out);
    p.note(instr, "reverse");
    if shifts.is_empty() || gathered_cost <= shifted_cost {
        let x = p.reshard_to_grid(&v, &src_gathered)?;
        return Ok(Some(p.emit_local(
            instr,
            vec![x],
            &ValueSharding::Grid(gathered),
        )?));
    }
    let x = p.reshard_to_grid(&v, &src)?;
    let r = p.emit_local(instr, vec![x], &ValueSharding::Grid(out.clone()))?;
    let mut y = r.id;
    for (a, starts, len) in &shifts {
        y = exchange(p, y, &out, &virt, *a, starts, *len, None)?;
    }
    Ok(Some(PValue { id: y, ..r }))
}
