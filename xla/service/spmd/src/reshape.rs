//! Reshape: computed on local tiles when the local reshape of the
//! operand's tiles is exactly the output's tiling (XLA's
//! `ReshapeSharding`, with uneven dims padded to whole tiles where the
//! padding lands only in the output's padding), else after the cheapest of
//! resharding the operand to what the output needs, a partial gather, or
//! replication; merges whose merged tiles differ from the output's are
//! retiled by a window exchange after the local reshape.
//!
//! Invariant: a local reshape is only emitted when its element counts
//! match the tiles on both sides.

use crate::exchange::{exchange, exchange_cost};
use crate::grid::{local_dims, tile_size, Grid, GridCache};
use crate::helpers::{cheapest, grid_of, HandlerResult};
use crate::part::Part;
use crate::shapes::with_dims;
use crate::value::{local_shape, PValue, ValueSharding};
use crate::SpmdError;
use std::rc::Rc;
use xla_hlo_ir::HloInstruction;

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
///   times `m`;
/// - the major dim of a merge then split, `[s, m...] -> [s * m / k, k...]`,
///   the tile's `ts * m` elements a whole number of output rows.
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
            // A merge then split (`[s, m] -> [s * m / k, k]`): the local
            // rows of `ts * m` elements make `ts * m / k` output rows.
            (_, _) if gin.len() > 1 && (ts * minor_in) % minor_out == 0 => {
                let tile = ts * minor_in / minor_out;
                if tile_size(out_dims[b], t) != tile {
                    retile.as_mut()?.push(b);
                }
                tile
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

pub fn reshape(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = grid_of(target) else {
        return Ok(None);
    };
    let v = p.operand(instr, 0)?;
    let Some(vg) = v.vs.grid().cloned() else {
        return Ok(None);
    };
    if vg.is_replicated() && out.is_replicated() {
        // Every candidate below is the same local reshape then.
        return Ok(Some(local_reshape(p, instr, &v, vg, out.clone())?));
    }
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
    Ok(Some(local_reshape(p, instr, &v, pg, rg)?))
}

/// `v` resharded to `pg`, then reshaped locally to a result on `rg`.
fn local_reshape(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    v: &PValue,
    pg: Grid,
    rg: Grid,
) -> Result<PValue, SpmdError> {
    let x = p.reshard_to_grid(v, &pg)?;
    let shape = local_shape(&instr.shape, &ValueSharding::Grid(rg.clone()));
    let id = p.clone_instr(instr, vec![x], shape);
    p.note(instr, "reshape");
    Ok(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(rg),
    })
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
) -> HandlerResult {
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
        cost += exchange_cost(p, &q, &virt, *b, starts, *len);
    }
    if cost >= best {
        return Ok(None);
    }
    let local = local_shape(&virt, &ValueSharding::Grid(q.clone()));
    let mut x = p.clone_instr(instr, vec![v.id], local);
    let mut dims_now = pout.clone();
    for (b, starts, len) in &windows {
        x = exchange(p, x, &q, &dims_now, *b, starts, *len, None)?;
        dims_now[*b] = len * q.tiles(*b);
    }
    p.note(instr, "reshape-retile");
    Ok(Some(PValue {
        id: x,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(q),
    }))
}
