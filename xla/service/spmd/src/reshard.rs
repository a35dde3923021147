//! Emitting a reshard plan (see `plan`): each step becomes its collective
//! (all-gather, all-to-all, collective-permute, all-reduce of placed rows)
//! or local slice, with the reshapes, transposes and pads that keep every
//! intermediate buffer an exact padded tile.
//!
//! Invariant: after every step the local buffer is exactly the padded tile
//! of the step's grid; a buffer that does not line up is an error, never
//! wrong data.

use crate::builder::Builder;
use crate::error::SpmdError;
use crate::grid::{local_dims, tile_size, Grid};
use crate::plan::{Plan, Step};
use xla_hlo_ir::InstrId;

/// Emits `plan` for local value `x` (laid out by `src`) of a global array of
/// `dims`; returns the local value laid out by the plan's last grid.
pub fn emit(
    b: &mut Builder<'_>,
    mut x: InstrId,
    src: &Grid,
    plan: &Plan,
    dims: &[i64],
) -> Result<InstrId, SpmdError> {
    let mut cur = src.clone();
    for step in &plan.steps {
        x = match step {
            Step::Gather { factors, to } => emit_gather(b, x, &cur, factors, to, dims)?,
            Step::AllToAll { src: a, tgt, f, to } => {
                emit_all_to_all(b, x, &cur, *a, *tgt, *f, to, dims)?
            }
            Step::AllToAllMulti { moves, to } => {
                emit_all_to_all_multi(b, x, &cur, moves, to, dims)?
            }
            Step::Permute { to } => emit_permute(b, x, &cur, to),
            Step::SlicePermute { via, to } => emit_slice_permute(b, x, &cur, via, to, dims)?,
            Step::Slice { to } => emit_slice(b, x, &cur, to, dims)?,
            Step::SumGather { dims: sum_dims, .. } => emit_sum_gather(b, x, &cur, sum_dims, dims)?,
            Step::Retile { dim, to } => emit_retile(b, x, &cur, to, *dim, dims)?,
            Step::Redistribute { dims: moved, to } => {
                emit_redistribute(b, x, &cur, to, moved, dims)?
            }
        };
        cur = match step {
            Step::Gather { to, .. }
            | Step::AllToAll { to, .. }
            | Step::AllToAllMulti { to, .. }
            | Step::Permute { to }
            | Step::SlicePermute { to, .. }
            | Step::Slice { to }
            | Step::SumGather { to, .. }
            | Step::Retile { to, .. }
            | Step::Redistribute { to, .. } => to.clone(),
        };
    }
    Ok(x)
}

/// See [`Step::Retile`]: per group, the local rows `[lo, hi)` of the
/// tile, permuted from their holders (taken from the own tile where the
/// device holds its piece); the groups concatenated; each device's window
/// sliced at its offset.
fn emit_retile(
    b: &mut Builder<'_>,
    x: InstrId,
    cur: &Grid,
    to: &Grid,
    a: usize,
    dims: &[i64],
) -> Result<InstrId, SpmdError> {
    let rt = b
        .ctx
        .cache
        .plans
        .retile(cur, to, a, dims[a])
        .ok_or_else(|| SpmdError::Invalid("retile plan no longer holds".into()))?;
    let local = b.dims(x);
    if local.get(a) != Some(&tile_size(dims[a], cur.tiles(a))) {
        return Err(SpmdError::Invalid(
            "retile of a buffer that is not a tile".into(),
        ));
    }
    let mut parts = Vec::with_capacity(rt.groups.len());
    for g in &rt.groups {
        let mut ranges: Vec<(i64, i64, i64)> = local.iter().map(|&d| (0, d, 1)).collect();
        ranges[a] = (g.lo, g.hi, 1);
        let own = b.slice(x, &ranges);
        if g.pairs.is_empty() {
            parts.push(own);
            continue;
        }
        let moved = b.collective_permute(own, &g.pairs);
        if g.own.iter().all(|&o| o == 0) {
            parts.push(moved);
            continue;
        }
        let table: std::sync::Arc<[i64]> = g.own.clone().into();
        let flag = b.table(&table);
        let one = b.scalar(xla_hlo_ir::PrimitiveType::S32, 1);
        let is_own = b.compare(flag, one, "EQ");
        let pd = b.dims(own);
        let mask = b.broadcast(is_own, &pd, &[]);
        parts.push(b.select(mask, own, moved));
    }
    let buf = if parts.len() == 1 {
        parts[0]
    } else {
        b.concatenate(parts, a)
    };
    let len = tile_size(dims[a], to.tiles(a));
    let total = b.dims(buf)[a];
    let short = rt
        .offsets
        .iter()
        .map(|&o| o + len - total)
        .max()
        .unwrap_or(0);
    let buf = if short > 0 {
        let mut lo_hi = vec![(0, 0); local.len()];
        lo_hi[a] = (0, short);
        b.pad_zero(buf, &lo_hi)?
    } else {
        buf
    };
    let table: std::sync::Arc<[i64]> = rt.offsets.clone().into();
    let mut starts = Vec::with_capacity(local.len());
    for d in 0..local.len() {
        starts.push(if d == a {
            b.table(&table)
        } else {
            b.scalar(xla_hlo_ir::PrimitiveType::S32, 0)
        });
    }
    let mut sizes = b.dims(buf);
    sizes[a] = len;
    for (d, size) in sizes.iter_mut().enumerate() {
        if d != a {
            *size = local[d];
        }
    }
    Ok(b.dynamic_slice(buf, starts, &sizes))
}

/// A per-device `table` compared with `value`, broadcast to `dims`: the
/// mask of the devices whose entry is `value`.
fn table_mask(b: &mut Builder<'_>, table: &[i64], value: i64, dims: &[i64]) -> InstrId {
    let table: std::sync::Arc<[i64]> = table.to_vec().into();
    let entry = b.table(&table);
    let v = b.scalar(xla_hlo_ir::PrimitiveType::S32, value);
    let is = b.compare(entry, v, "EQ");
    b.broadcast(is, dims, &[])
}

/// See [`Step::Redistribute`] and [`crate::redistribute`]: the tile padded
/// at the front, each group's piece sliced (at per-device starts) and
/// permuted round by round (or taken from the own tile), the groups
/// concatenated dim by dim, and each device's window sliced out.
fn emit_redistribute(
    b: &mut Builder<'_>,
    x: InstrId,
    cur: &Grid,
    to: &Grid,
    moved: &[usize],
    dims: &[i64],
) -> Result<InstrId, SpmdError> {
    let rd = crate::redistribute::redistribute(cur, to, moved, dims)
        .ok_or_else(|| SpmdError::Invalid("redistribution plan no longer holds".into()))?;
    let local = b.dims(x);
    if moved
        .iter()
        .any(|&a| local.get(a) != Some(&tile_size(dims[a], cur.tiles(a))))
    {
        return Err(SpmdError::Invalid(
            "redistribution of a buffer that is not a tile".into(),
        ));
    }
    let mut lo_hi = vec![(0, 0); local.len()];
    for (j, &a) in rd.dims.iter().enumerate() {
        lo_hi[a] = (rd.front[j], 0);
    }
    let padded = if rd.front.iter().any(|&f| f > 0) {
        b.pad_zero(x, &lo_hi)?
    } else {
        x
    };
    let mut parts = Vec::with_capacity(rd.groups.len());
    for g in &rd.groups {
        let mut sizes = local.clone();
        for (j, &a) in rd.dims.iter().enumerate() {
            sizes[a] = rd.extents[j][g.k[j]];
        }
        let slice_at = |b: &mut Builder<'_>, starts: &[Vec<i64>]| {
            let idx = table_starts(b, local.len(), &rd.dims, starts);
            b.dynamic_slice(padded, idx, &sizes)
        };
        let mut acc: Option<InstrId> = None;
        for (r, round) in g.rounds.iter().enumerate() {
            let piece = slice_at(b, &round.send_starts);
            let arrived = b.collective_permute(piece, &round.pairs);
            acc = Some(match acc {
                None => arrived,
                Some(prev) => {
                    let mask = table_mask(b, &g.round_of, r as i64, &sizes);
                    b.select(mask, arrived, prev)
                }
            });
        }
        if g.own.contains(&1) || acc.is_none() {
            let own = slice_at(b, &g.own_starts);
            acc = Some(match acc {
                None => own,
                Some(prev) => {
                    let mask = table_mask(b, &g.own, 1, &sizes);
                    b.select(mask, own, prev)
                }
            });
        }
        parts.extend(acc);
    }
    // Groups are in row-major order of their piece indices: concatenate
    // along the last moved dim first.
    for (j, &a) in rd.dims.iter().enumerate().rev() {
        let width = rd.extents[j].len().max(1);
        parts = parts
            .chunks(width)
            .map(|c| {
                if c.len() == 1 {
                    c[0]
                } else {
                    b.concatenate(c.to_vec(), a)
                }
            })
            .collect();
    }
    let [buf] = parts[..] else {
        return Err(SpmdError::Invalid(
            "redistribution assembled no single buffer".into(),
        ));
    };
    let mut end_pad = vec![(0, 0); local.len()];
    let mut window = local.clone();
    for (j, &a) in rd.dims.iter().enumerate() {
        let len = tile_size(dims[a], to.tiles(a));
        window[a] = len;
        let total: i64 = rd.extents[j].iter().sum();
        let short = rd.offsets[j]
            .iter()
            .map(|&o| o + len - total)
            .max()
            .unwrap_or(0);
        end_pad[a] = (0, short.max(0));
    }
    let buf = if end_pad.iter().any(|p| p.1 > 0) {
        b.pad_zero(buf, &end_pad)?
    } else {
        buf
    };
    let starts = table_starts(b, local.len(), &rd.dims, &rd.offsets);
    Ok(b.dynamic_slice(buf, starts, &window))
}

/// Dynamic-slice starts for a rank-`rank` buffer: dim `dims[j]` starts at
/// the device's entry of `tables[j]`, every other dim at 0.
fn table_starts(
    b: &mut Builder<'_>,
    rank: usize,
    dims: &[usize],
    tables: &[Vec<i64>],
) -> Vec<InstrId> {
    (0..rank)
        .map(|a| match dims.iter().position(|&m| m == a) {
            Some(j) => {
                let t: std::sync::Arc<[i64]> = tables[j].clone().into();
                b.table(&t)
            }
            None => b.scalar(xla_hlo_ir::PrimitiveType::S32, 0),
        })
        .collect()
}

/// See [`Step::SumGather`]: the local tile padded by `n` zero rows on
/// both sides of each summed dim (`n` its global size), the window of the
/// `n` global rows taken at each device's offset (tiles wholly in the
/// padding take zeros), then summed over the tiles of the summed dims.
fn emit_sum_gather(
    b: &mut Builder<'_>,
    x: InstrId,
    cur: &Grid,
    sum_dims: &[usize],
    dims: &[i64],
) -> Result<InstrId, SpmdError> {
    let local = b.dims(x);
    let mut lo_hi = vec![(0, 0); local.len()];
    for &a in sum_dims {
        if local.get(a) != Some(&tile_size(dims[a], cur.tiles(a))) {
            return Err(SpmdError::Invalid(
                "sum-gather of a buffer that is not a tile".into(),
            ));
        }
        lo_hi[a] = (dims[a], dims[a]);
    }
    let padded = b.pad_zero(x, &lo_hi)?;
    let mut offsets = Vec::with_capacity(local.len());
    for d in 0..local.len() {
        offsets.push(if sum_dims.contains(&d) {
            let (n, t) = (dims[d], cur.tiles(d));
            let ts = tile_size(n, t);
            let starts: Vec<i64> = (0..t).map(|i| n - i * ts).collect();
            let table = b.ctx.cache.grids.per_coord(cur, d, &starts);
            b.table(&table)
        } else {
            b.scalar(xla_hlo_ir::PrimitiveType::S32, 0)
        });
    }
    let mut sizes = local;
    for &a in sum_dims {
        sizes[a] = dims[a];
    }
    let placed = b.dynamic_slice(padded, offsets, &sizes);
    let factors: Vec<(usize, i64)> = sum_dims.iter().map(|&a| (a, cur.tiles(a))).collect();
    let groups = b.ctx.cache.grids.factor_groups(cur, &factors);
    b.all_reduce(placed, &groups, xla_hlo_ir::Opcode::Add)
}

fn emit_gather(
    b: &mut Builder<'_>,
    x: InstrId,
    cur: &Grid,
    factors: &[(usize, i64)],
    to: &Grid,
    dims: &[i64],
) -> Result<InstrId, SpmdError> {
    let groups = b.ctx.cache.grids.factor_groups(cur, factors);
    let local = b.dims(x);
    let gathered = if factors.len() == 1 {
        b.all_gather(x, factors[0].0, &groups)
    } else {
        let mut with1 = vec![1];
        with1.extend(&local);
        let r = b.reshape(x, &with1);
        let ag = b.all_gather(r, 0, &groups);
        let mut split: Vec<i64> = factors.iter().map(|f| f.1).collect();
        split.extend(&local);
        let k = factors.len();
        let r2 = b.reshape(ag, &split);
        let mut perm = Vec::new();
        for (i, _) in local.iter().enumerate() {
            if let Some(j) = factors.iter().position(|f| f.0 == i) {
                perm.push(j);
            }
            perm.push(k + i);
        }
        let t = b.transpose(r2, &perm);
        let mut merged = local.clone();
        for &(a, f) in factors {
            merged[a] *= f;
        }
        b.reshape(t, &merged)
    };
    let want = local_dims(dims, to);
    if b.dims(gathered) != want {
        let have = b.dims(gathered);
        if have.iter().zip(&want).any(|(h, w)| h < w) {
            return Err(SpmdError::Invalid(
                "gathered buffer smaller than its tile".into(),
            ));
        }
        return Ok(b.slice_to(gathered, &want));
    }
    Ok(gathered)
}

#[allow(clippy::too_many_arguments)]
fn emit_all_to_all(
    b: &mut Builder<'_>,
    x: InstrId,
    cur: &Grid,
    a: usize,
    tgt: usize,
    f: i64,
    to: &Grid,
    dims: &[i64],
) -> Result<InstrId, SpmdError> {
    let groups = b.ctx.cache.grids.factor_groups(cur, &[(a, f)]);
    let chunk = tile_size(dims[tgt], cur.tiles(tgt) * f);
    let mut local = b.dims(x);
    let x = if f * chunk > local[tgt] {
        let mut lh = vec![(0, 0); local.len()];
        lh[tgt] = (0, f * chunk - local[tgt]);
        let y = b.pad_zero(x, &lh)?;
        local[tgt] = f * chunk;
        y
    } else {
        x
    };
    if local[tgt] != f * chunk {
        return Err(SpmdError::Invalid(
            "all-to-all chunks do not line up".into(),
        ));
    }
    // Split `tgt` into (f, rest): the chunk axis sits at index `tgt`.
    let mut split = Vec::new();
    for (i, &d) in local.iter().enumerate() {
        if i == tgt {
            split.push(f);
            split.push(d / f);
        } else {
            split.push(d);
        }
    }
    let r = b.reshape(x, &split);
    let t = b.all_to_all(r, tgt, &groups);
    let axis = |i: usize| if i < tgt { i } else { i + 1 };
    let mut perm = Vec::new();
    for i in 0..local.len() {
        if i == a {
            perm.push(tgt);
            perm.push(axis(a));
        } else if i == tgt {
            perm.push(tgt + 1);
        } else {
            perm.push(axis(i));
        }
    }
    let tr = b.transpose(t, &perm);
    let want = local_dims(dims, to);
    let mut merged = local.clone();
    merged[a] *= f;
    merged[tgt] = chunk;
    let r = b.reshape(tr, &merged);
    if merged != want {
        if merged.iter().zip(&want).any(|(m, w)| m < w) {
            return Err(SpmdError::Invalid(
                "all-to-all result smaller than its tile".into(),
            ));
        }
        return Ok(b.slice_to(r, &want));
    }
    Ok(r)
}

/// See [`Step::AllToAllMulti`]: each target dim split into (its moved
/// factor, the rest), the factors brought to the front and merged into one
/// chunk dim, one all-to-all on it, the received chunk index split back
/// into the source members' factors and each placed in front of its source
/// dim.
fn emit_all_to_all_multi(
    b: &mut Builder<'_>,
    x: InstrId,
    cur: &Grid,
    moves: &[(usize, usize, i64)],
    to: &Grid,
    dims: &[i64],
) -> Result<InstrId, SpmdError> {
    #[derive(Clone, Copy, PartialEq)]
    enum Axis {
        Factor(usize),
        Rest(usize),
        Whole(usize),
    }
    let local = b.dims(x);
    let rank = local.len();
    let target_of = |i: usize| moves.iter().position(|m| m.1 == i);
    let source_of = |i: usize| moves.iter().position(|m| m.0 == i);
    for &(_, t, f) in moves {
        if local[t] % f != 0 {
            return Err(SpmdError::Invalid(
                "all-to-all chunks do not line up".into(),
            ));
        }
    }
    let size = |ax: Axis| match ax {
        Axis::Factor(k) => moves[k].2,
        Axis::Rest(i) => local[i] / moves[target_of(i).unwrap_or(0)].2,
        Axis::Whole(i) => local[i],
    };
    // 1. Split the target dims.
    let mut split: Vec<Axis> = Vec::new();
    for i in 0..rank {
        match target_of(i) {
            Some(k) => {
                split.push(Axis::Factor(k));
                split.push(Axis::Rest(i));
            }
            None => split.push(Axis::Whole(i)),
        }
    }
    let y = b.reshape(x, &split.iter().map(|&a| size(a)).collect::<Vec<_>>());
    // 2. Factors to the front, in move order.
    let mut front: Vec<Axis> = (0..moves.len()).map(Axis::Factor).collect();
    let others: Vec<Axis> = split
        .iter()
        .copied()
        .filter(|a| !matches!(a, Axis::Factor(_)))
        .collect();
    front.extend(others.iter().copied());
    let perm: Vec<usize> = front
        .iter()
        .map(|a| split.iter().position(|s| s == a).unwrap_or(0))
        .collect();
    let y = b.transpose(y, &perm);
    let chunks: i64 = moves.iter().map(|m| m.2).product();
    let mut merged = vec![chunks];
    merged.extend(others.iter().map(|&a| size(a)));
    let y = b.reshape(y, &merged);
    // 3. One all-to-all over the moved factors' groups.
    let factors: Vec<(usize, i64)> = moves.iter().map(|m| (m.0, m.2)).collect();
    let groups = b.ctx.cache.grids.factor_groups(cur, &factors);
    let y = b.all_to_all(y, 0, &groups);
    // 4. The chunk index is now the source member's factors.
    let y = b.reshape(y, &front.iter().map(|&a| size(a)).collect::<Vec<_>>());
    let mut order: Vec<Axis> = Vec::new();
    for i in 0..rank {
        if let Some(k) = source_of(i) {
            order.push(Axis::Factor(k));
        }
        if target_of(i).is_some() {
            order.push(Axis::Rest(i));
        } else {
            order.push(Axis::Whole(i));
        }
    }
    let perm: Vec<usize> = order
        .iter()
        .map(|a| front.iter().position(|s| s == a).unwrap_or(0))
        .collect();
    let y = b.transpose(y, &perm);
    let want = local_dims(dims, to);
    let mut result = Vec::with_capacity(rank);
    for i in 0..rank {
        result.push(match (source_of(i), target_of(i)) {
            (Some(k), _) => local[i] * moves[k].2,
            (_, Some(k)) => local[i] / moves[k].2,
            _ => local[i],
        });
    }
    if result != want {
        return Err(SpmdError::Invalid(
            "multi all-to-all result is not the target tile".into(),
        ));
    }
    Ok(b.reshape(y, &result))
}

fn emit_permute(b: &mut Builder<'_>, x: InstrId, cur: &Grid, to: &Grid) -> InstrId {
    let pairs = permute_pairs(cur, to);
    if pairs.iter().all(|&(s, d)| s == d) {
        return x;
    }
    b.collective_permute(x, &pairs)
}

/// The (source, target) pairs that move every device's `cur` tile to the
/// device holding the same tile in `to`, sorted by target.
fn permute_pairs(cur: &Grid, to: &Grid) -> Vec<(i64, i64)> {
    let r = cur.repl() as usize;
    let mut pairs = Vec::with_capacity(cur.num_devices() as usize);
    let (mut srcs, mut dsts) = (Vec::with_capacity(r), Vec::with_capacity(r));
    // Devices within a replication group are sorted: merge the two groups,
    // keeping devices in both in place and pairing the others in order.
    for (src_group, dst_group) in cur.devs().chunks(r).zip(to.devs().chunks(r)) {
        srcs.clear();
        dsts.clear();
        let (mut i, mut j) = (0, 0);
        while i < src_group.len() || j < dst_group.len() {
            match (src_group.get(i), dst_group.get(j)) {
                (Some(&s), Some(&d)) if s == d => {
                    pairs.push((d, d));
                    i += 1;
                    j += 1;
                }
                (Some(&s), Some(&d)) if s < d => {
                    srcs.push(s);
                    i += 1;
                }
                (Some(_), Some(&d)) | (None, Some(&d)) => {
                    dsts.push(d);
                    j += 1;
                }
                (Some(&s), None) => {
                    srcs.push(s);
                    i += 1;
                }
                (None, None) => break,
            }
        }
        pairs.extend(srcs.iter().copied().zip(dsts.iter().copied()));
    }
    // Sorted by target: every device is the target of exactly one pair.
    let n = cur.num_devices() as usize;
    let mut by_dst = vec![(-1i64, -1i64); n];
    for &(s, d) in &pairs {
        if let Some(slot) = by_dst.get_mut(d as usize) {
            *slot = (s, d);
        }
    }
    if by_dst.iter().all(|p| p.1 >= 0) && pairs.len() == n {
        pairs = by_dst;
    } else {
        pairs.sort_unstable_by_key(|p| p.1);
    }
    pairs
}

fn emit_slice_permute(
    b: &mut Builder<'_>,
    x: InstrId,
    cur: &Grid,
    via: &Grid,
    to: &Grid,
    dims: &[i64],
) -> Result<InstrId, SpmdError> {
    let pairs = permute_pairs(cur, via);
    let n = cur.num_devices() as usize;
    // The device each device sends to (itself when it keeps its tile).
    let mut receiver: Vec<usize> = (0..n).collect();
    for &(s, d) in &pairs {
        if let (Ok(s), Ok(d)) = (usize::try_from(s), usize::try_from(d)) {
            if s < n && d < n {
                receiver[s] = d;
            }
        }
    }
    let buf = b.dims(x);
    let want = local_dims(dims, to);
    let mut pads = vec![(0i64, 0i64); dims.len()];
    let mut starts = Vec::with_capacity(dims.len());
    for (a, &xa) in dims.iter().enumerate() {
        let (c, need) = b.ctx.cache.plans.slice_summary(via, to, a, xa);
        if need > buf[a] {
            pads[a].1 = need - buf[a];
        }
        starts.push(match c {
            Some(c) => Ok(c),
            None => {
                let by_receiver = b.ctx.cache.plans.slice_table(via, to, a, xa);
                let by_sender: std::sync::Arc<[i64]> =
                    receiver.iter().map(|&d| by_receiver[d]).collect();
                Err(by_sender)
            }
        });
    }
    let x = b.pad_zero(x, &pads)?;
    let x = if starts.iter().all(|s| s.is_ok()) {
        let ranges: Vec<(i64, i64, i64)> = starts
            .iter()
            .zip(&want)
            .map(|(s, &w)| {
                let o = *s.as_ref().unwrap_or(&0);
                (o, o + w, 1)
            })
            .collect();
        b.slice(x, &ranges)
    } else {
        let ids = starts
            .iter()
            .map(|s| match s {
                Ok(c) => b.scalar(xla_hlo_ir::PrimitiveType::S32, *c),
                Err(t) => b.table(t),
            })
            .collect();
        b.dynamic_slice(x, ids, &want)
    };
    if pairs.iter().all(|&(s, d)| s == d) {
        return Ok(x);
    }
    Ok(b.collective_permute(x, &pairs))
}

fn emit_slice(
    b: &mut Builder<'_>,
    x: InstrId,
    cur: &Grid,
    to: &Grid,
    dims: &[i64],
) -> Result<InstrId, SpmdError> {
    let buf = b.dims(x);
    let want = local_dims(dims, to);
    let mut consts = Vec::with_capacity(dims.len());
    let mut pads = vec![(0i64, 0i64); dims.len()];
    for (a, &xa) in dims.iter().enumerate() {
        let (c, need) = b.ctx.cache.plans.slice_summary(cur, to, a, xa);
        if need > buf[a] {
            pads[a].1 = need - buf[a];
        }
        consts.push(c);
    }
    let x = b.pad_zero(x, &pads)?;
    let constant: Option<Vec<i64>> = consts.iter().copied().collect();
    if let Some(c) = constant {
        let ranges: Vec<(i64, i64, i64)> =
            c.iter().zip(&want).map(|(&o, &w)| (o, o + w, 1)).collect();
        return Ok(b.slice(x, &ranges));
    }
    let mut starts = Vec::with_capacity(dims.len());
    for (a, &xa) in dims.iter().enumerate() {
        starts.push(match consts[a] {
            Some(c) => b.scalar(xla_hlo_ir::PrimitiveType::S32, c),
            None => {
                let table = b.ctx.cache.plans.slice_table(cur, to, a, xa);
                b.table(&table)
            }
        });
    }
    Ok(b.dynamic_slice(x, starts, &want))
}
