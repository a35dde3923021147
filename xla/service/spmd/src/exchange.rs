//! The window exchange: give every device, along one sharded dim, the
//! window of the global array its output tile needs, by halo exchange with
//! its neighbours (collective-permutes of the few rows that cross a tile
//! boundary) when the halos fit in a neighbour's tile, else by the cheapest
//! of gathering the dim, one permute per tile distance, or one permute per
//! row range; then a per-device slice of the window, with out-of-range
//! positions set to a pad value when the op needs one. Used by the windowed
//! ops, convolutions and reshapes that retile.
//!
//! Invariants: the device holding tile `i` of the dim receives window
//! `[starts[i], starts[i] + len)`; windows are uniform in size on every
//! device; `exchange_cost` is the bytes `exchange` moves.

use crate::assemble::tile_pairs;
use crate::error::SpmdError;
use crate::grid::{tile_size, Grid};
use crate::part::Part;
use xla_hlo_ir::{InstrId, Shape};

/// Gives each device, along dim `a` of local `x` (laid out by `g` over
/// global `dims`), the window `[starts[i], starts[i] + len)` of the global
/// array, `i` being the device's tile index on `a`. Positions outside
/// `[0, dims[a])` hold `pad` when given (garbage otherwise).
#[allow(clippy::too_many_arguments)]
pub fn exchange(
    p: &mut Part<'_, '_>,
    x: InstrId,
    g: &Grid,
    dims: &[i64],
    a: usize,
    starts: &[i64],
    len: i64,
    pad: Option<InstrId>,
) -> Result<InstrId, SpmdError> {
    let xa = dims[a];
    let t = g.tiles(a);
    let s = tile_size(xa, t);
    if starts.len() as i64 != t {
        return Err(SpmdError::Invalid(
            "window starts do not match the tiles".into(),
        ));
    }
    let shape = with_dims_of(p, x, dims);
    let plan = plan_exchange(p, g, &shape, a, starts, len);
    let (l, r) = (plan.left, plan.right);
    let (ps, use_pieces, grouped, multi_hop) = match plan.strategy {
        Strategy::Neighbours => (Vec::new(), false, None, false),
        Strategy::Gather => (Vec::new(), false, None, true),
        Strategy::ByDistance => (pieces(starts, len, s, xa), true, None, true),
        Strategy::ByRange => (Vec::new(), false, range_groups(starts, len, s, xa), true),
        Strategy::ByOrder | Strategy::Assemble => (Vec::new(), false, None, true),
    };
    if plan.strategy == Strategy::Assemble {
        let valid = vec![len; t as usize];
        let asm = crate::assemble::plan(starts, &valid, len, xa, false)
            .ok_or_else(|| SpmdError::Invalid("window assembly no longer plans".into()))?;
        let y = asm.emit(p, x, g, a)?;
        return Ok(mask_pad(p, y, g, a, starts, len, xa, pad));
    }
    let ordered = match plan.strategy {
        Strategy::ByOrder => order_groups(starts, len, s, xa),
        _ => None,
    };
    let (buf, base): (InstrId, Vec<i64>) = if let Some(og) = &ordered {
        // Group k carries the k-th source tile of every window; the
        // groups concatenated in order make each window contiguous.
        let ld = p.b.dims(x);
        let mut parts = Vec::new();
        for grp in &og.groups {
            let mut r: Vec<(i64, i64, i64)> = ld.iter().map(|&d| (0, d, 1)).collect();
            r[a] = (grp.lo, grp.hi, 1);
            let sl = p.b.slice(x, &r);
            let all_local = grp
                .source
                .iter()
                .enumerate()
                .all(|(i, src)| src.is_none_or(|j| j == i as i64));
            parts.push(if all_local {
                sl
            } else {
                let pairs = tile_pairs(g, a, &grp.source);
                p.b.collective_permute(sl, &pairs)
            });
        }
        let y = if parts.len() == 1 {
            parts[0]
        } else {
            p.b.concatenate(parts, a)
        };
        let lo0 = og.groups.first().map_or(0, |grp| grp.lo);
        let base: Vec<i64> = (0..t as usize)
            .map(|i| {
                let st = starts[i];
                let lo = st.max(0);
                if lo >= (st + len).min(xa) {
                    return st;
                }
                // Buffer position of the window start: `lo` sits at
                // `lo - j0 * s - lo0`.
                st - ((lo - (lo / s) * s - lo0) - (lo - st))
            })
            .collect();
        (y, base)
    } else if let Some(rg) = &grouped {
        // Every window lies in one source tile: one collective-permute per
        // distinct row range (each source tile sends once per permute),
        // plus a local slice for windows in their own tile.
        let ld = p.b.dims(x);
        let mut parts = Vec::new();
        let mut pos = 0;
        let mut local_at = 0;
        if let Some((h0, h1)) = rg.local {
            let mut r: Vec<(i64, i64, i64)> = ld.iter().map(|&d| (0, d, 1)).collect();
            r[a] = (h0, h1, 1);
            parts.push(p.b.slice(x, &r));
            local_at = pos;
            pos += h1 - h0;
        }
        let mut group_at = Vec::with_capacity(rg.groups.len());
        for grp in &rg.groups {
            let mut r: Vec<(i64, i64, i64)> = ld.iter().map(|&d| (0, d, 1)).collect();
            r[a] = (grp.lo, grp.hi, 1);
            let sl = p.b.slice(x, &r);
            let pairs = tile_pairs(g, a, &grp.source);
            parts.push(p.b.collective_permute(sl, &pairs));
            group_at.push(pos);
            pos += grp.hi - grp.lo;
        }
        let y = p.b.concatenate(parts, a);
        let base: Vec<i64> = (0..t as usize)
            .map(|i| {
                let st = starts[i];
                let lo = st.max(0);
                let at = match rg.tile_group[i] {
                    TileSource::Nothing => return st,
                    TileSource::Local => {
                        local_at + (lo - i as i64 * s - rg.local.map_or(0, |h| h.0))
                    }
                    TileSource::Group(k) => group_at[k],
                };
                // Buffer position of the window start: `lo` sits at `at`.
                st - (at - (lo - st))
            })
            .collect();
        (y, base)
    } else if use_pieces {
        // Halos beyond the neighbours, cheaper than a gather: one
        // collective-permute per tile distance.
        let ld = p.b.dims(x);
        let mut parts = Vec::new();
        let mut at = Vec::new();
        let mut pos = 0;
        for &(k, lo, hi) in &ps {
            let mut rg: Vec<(i64, i64, i64)> = ld.iter().map(|&d| (0, d, 1)).collect();
            rg[a] = (lo, hi, 1);
            let sl = p.b.slice(x, &rg);
            parts.push(if k == 0 {
                sl
            } else {
                let pairs = neighbour_pairs(g, a, -k);
                p.b.collective_permute(sl, &pairs)
            });
            at.push((k, lo, pos));
            pos += hi - lo;
        }
        let y = p.b.concatenate(parts, a);
        // Buffer position of global row g for tile i (where tile i's window
        // needs it); windows start at that position less their
        // out-of-range prefix.
        let base: Vec<i64> = (0..t)
            .map(|i| {
                let st = starts[i as usize];
                let (lo, hi) = (st.max(0), (st + len).min(xa));
                if lo >= hi {
                    return st;
                }
                let k = lo / s - i;
                match at.iter().find(|e| e.0 == k) {
                    Some(&(_, plo, ppos)) => st - (ppos + (lo - (i + k) * s - plo) - (lo - st)),
                    None => st,
                }
            })
            .collect();
        (y, base)
    } else if multi_hop {
        // Halo beyond a neighbour: gather the dim.
        let full = p.grids().replicate_dims(g, &[a]);
        let y = p.reshard_grid(x, g, &full, &with_dims_of(p, x, dims))?;
        (y, vec![0; t as usize])
    } else {
        let mut parts = Vec::new();
        let ld = p.b.dims(x);
        if l > 0 {
            let mut rg: Vec<(i64, i64, i64)> = ld.iter().map(|&d| (0, d, 1)).collect();
            rg[a] = (s - l, s, 1);
            let sl = p.b.slice(x, &rg);
            let pairs = neighbour_pairs(g, a, 1);
            parts.push(p.b.collective_permute(sl, &pairs));
        }
        parts.push(x);
        if r > 0 {
            let mut rg: Vec<(i64, i64, i64)> = ld.iter().map(|&d| (0, d, 1)).collect();
            rg[a] = (0, r, 1);
            let sl = p.b.slice(x, &rg);
            let pairs = neighbour_pairs(g, a, -1);
            parts.push(p.b.collective_permute(sl, &pairs));
        }
        let y = p.b.concatenate(parts, a);
        (y, (0..t).map(|i| i * s - l).collect())
    };
    let blen = p.b.dims(buf)[a];
    // Offsets of the window in the buffer, per tile.
    let mut offs: Vec<i64> = starts.iter().zip(&base).map(|(st, b)| st - b).collect();
    let (mut pl, mut ph) = (0i64, 0i64);
    for (i, &st) in starts.iter().enumerate() {
        if st.max(0) >= (st + len).min(xa) {
            continue;
        }
        pl = pl.max(-offs[i]);
        ph = ph.max(offs[i] + len - blen);
    }
    let mut y = buf;
    if pl > 0 || ph > 0 {
        let mut lh = vec![(0, 0); dims.len()];
        lh[a] = (pl, ph);
        y = p.b.pad_zero(y, &lh)?;
    }
    let total = blen + pl + ph;
    for o in offs.iter_mut() {
        *o = (*o + pl).clamp(0, (total - len).max(0));
    }
    let yd = p.b.dims(y);
    if offs.iter().all(|&o| o == offs[0]) {
        let mut rg: Vec<(i64, i64, i64)> = yd.iter().map(|&d| (0, d, 1)).collect();
        rg[a] = (offs[0], offs[0] + len, 1);
        y = p.b.slice(y, &rg);
    } else {
        let mut tables = Vec::new();
        for d in 0..yd.len() {
            if d == a {
                let tb = p.grids().per_coord(g, a, &offs);
                tables.push(p.b.table(&tb));
            } else {
                tables.push(p.b.scalar(xla_hlo_ir::PrimitiveType::S32, 0));
            }
        }
        let mut sizes = yd.clone();
        sizes[a] = len;
        y = p.b.dynamic_slice(y, tables, &sizes);
    }
    Ok(mask_pad(p, y, g, a, starts, len, xa, pad))
}

/// Sets the window positions outside `[0, xa)` to `pad`, when given and
/// some window reaches outside.
#[allow(clippy::too_many_arguments)]
fn mask_pad(
    p: &mut Part<'_, '_>,
    y: InstrId,
    g: &Grid,
    a: usize,
    starts: &[i64],
    len: i64,
    xa: i64,
    pad: Option<InstrId>,
) -> InstrId {
    let Some(pv) = pad else {
        return y;
    };
    if !starts.iter().any(|&st| st < 0 || st + len > xa) {
        return y;
    }
    let tb = p.grids().per_coord(g, a, starts);
    let off = p.b.table(&tb);
    let yd = p.b.dims(y);
    let m = p.b.range_mask(&yd, a, off, Some(0), Some(xa));
    let pb = p.b.splat(pv, &yd);
    p.b.select(m, y, pb)
}

/// Left and right halo sizes of a window exchange along dim `a` (and the
/// tile size); halos larger than the tile need a gather instead.
fn halos(g: &Grid, dims: &[i64], a: usize, starts: &[i64], len: i64) -> (i64, i64, i64) {
    let xa = dims[a];
    let s = tile_size(xa, g.tiles(a));
    let (mut l, mut r) = (0i64, 0i64);
    for (i, &st) in starts.iter().enumerate() {
        let i = i as i64;
        let (lo, hi) = (st.max(0), (st + len).min(xa));
        if lo >= hi {
            continue;
        }
        l = l.max(i * s - lo);
        r = r.max(hi - (i * s + s));
    }
    (l, r, s)
}

/// Pieces of a multi-hop exchange: for each tile distance `k` (the source
/// tile is `i + k`), the hull `[lo, hi)` of the source tile's rows some
/// window needs, by increasing `k`.
fn pieces(starts: &[i64], len: i64, s: i64, xa: i64) -> Vec<(i64, i64, i64)> {
    let mut map: std::collections::BTreeMap<i64, (i64, i64)> = Default::default();
    for (i, &st) in starts.iter().enumerate() {
        let i = i as i64;
        let (lo, hi) = (st.max(0), (st + len).min(xa));
        if lo >= hi || s <= 0 {
            continue;
        }
        for j in lo / s..=(hi - 1) / s {
            let a = lo.max(j * s) - j * s;
            let b = hi.min(j * s + s) - j * s;
            let e = map.entry(j - i).or_insert((a, b));
            e.0 = e.0.min(a);
            e.1 = e.1.max(b);
        }
    }
    map.into_iter().map(|(k, (a, b))| (k, a, b)).collect()
}

/// Bytes the collective-permutes of `pieces` move (the local piece is free).
fn pieces_cost(ps: &[(i64, i64, i64)], per_row: u64) -> u64 {
    ps.iter()
        .filter(|p| p.0 != 0)
        .map(|p| (p.2 - p.1).max(0) as u64 * per_row)
        .sum()
}

/// Where a tile's window comes from in a range-grouped exchange.
#[derive(Clone, Copy, Debug, PartialEq)]
enum TileSource {
    /// Its window is empty (it needs no data).
    Nothing,
    /// Its window lies in its own tile.
    Local,
    /// From group `k`'s collective-permute.
    Group(usize),
}

/// One collective-permute of a range-grouped exchange: rows `[lo, hi)` of
/// the source tile, sent by tile `source[i]` to tile `i` (each source at
/// most once).
struct RangeGroup {
    lo: i64,
    hi: i64,
    source: Vec<Option<i64>>,
}

/// A range-grouped exchange: possible when every window lies within one
/// source tile.
struct RangeGroups {
    local: Option<(i64, i64)>,
    groups: Vec<RangeGroup>,
    tile_group: Vec<TileSource>,
}

impl RangeGroups {
    fn cost(&self, per_row: u64) -> u64 {
        self.groups
            .iter()
            .map(|g| (g.hi - g.lo).max(0) as u64 * per_row)
            .sum()
    }
}

/// Groups the windows of an exchange by the rows of the source tile they
/// need, when each window lies in a single source tile (`None` otherwise).
fn range_groups(starts: &[i64], len: i64, s: i64, xa: i64) -> Option<RangeGroups> {
    if s <= 0 {
        return None;
    }
    let t = starts.len();
    let mut rg = RangeGroups {
        local: None,
        groups: Vec::new(),
        tile_group: vec![TileSource::Nothing; t],
    };
    for (i, &st) in starts.iter().enumerate() {
        let (lo, hi) = (st.max(0), (st + len).min(xa));
        if lo >= hi {
            continue;
        }
        let j = lo / s;
        if (hi - 1) / s != j {
            return None;
        }
        let (r0, r1) = (lo - j * s, hi - j * s);
        if j == i as i64 {
            rg.local = Some(match rg.local {
                None => (r0, r1),
                Some((a, b)) => (a.min(r0), b.max(r1)),
            });
            rg.tile_group[i] = TileSource::Local;
            continue;
        }
        let k = match rg
            .groups
            .iter()
            .position(|g| g.lo == r0 && g.hi == r1 && !g.source.contains(&Some(j)))
        {
            Some(k) => k,
            None => {
                rg.groups.push(RangeGroup {
                    lo: r0,
                    hi: r1,
                    source: vec![None; t],
                });
                rg.groups.len() - 1
            }
        };
        rg.groups[k].source[i] = Some(j);
        rg.tile_group[i] = TileSource::Group(k);
    }
    Some(rg)
}

/// An exchange by source position: group `k` sends, to every tile whose
/// window covers at least `k + 1` source tiles, rows `[lo, hi)` of its
/// `k`-th source tile (the hull over those windows). The first piece of a
/// window that continues ends at the tile end and every later piece
/// starts at row 0, so each window is contiguous in the concatenation of
/// the groups.
struct OrderGroups {
    groups: Vec<RangeGroup>,
}

impl OrderGroups {
    /// Bytes of the groups with a remote source (a group whose every
    /// window reads its own tile is a local slice).
    fn cost(&self, per_row: u64) -> u64 {
        self.groups
            .iter()
            .filter(|grp| {
                grp.source
                    .iter()
                    .enumerate()
                    .any(|(i, src)| src.is_some_and(|j| j != i as i64))
            })
            .map(|grp| (grp.hi - grp.lo).max(0) as u64 * per_row)
            .sum()
    }
}

/// Groups the windows by the position of each source tile in them;
/// `None` when two windows would read the same source tile in the same
/// group (a collective-permute sends from each device once).
fn order_groups(starts: &[i64], len: i64, s: i64, xa: i64) -> Option<OrderGroups> {
    if s <= 0 {
        return None;
    }
    let t = starts.len();
    let source_tiles = ((xa + s - 1) / s).max(0) as usize;
    let mut groups: Vec<RangeGroup> = Vec::new();
    // used[k][j]: source tile j already sends in group k.
    let mut used: Vec<Vec<bool>> = Vec::new();
    for (i, &st) in starts.iter().enumerate() {
        let (lo, hi) = (st.max(0), (st + len).min(xa));
        if lo >= hi {
            continue;
        }
        for (k, j) in (lo / s..=(hi - 1) / s).enumerate() {
            let (r0, r1) = (lo.max(j * s) - j * s, hi.min(j * s + s) - j * s);
            if groups.len() <= k {
                groups.push(RangeGroup {
                    lo: r0,
                    hi: r1,
                    source: vec![None; t],
                });
                used.push(vec![false; source_tiles]);
            }
            let grp = &mut groups[k];
            if std::mem::replace(&mut used[k][j as usize], true) {
                return None;
            }
            grp.lo = grp.lo.min(r0);
            grp.hi = grp.hi.max(r1);
            grp.source[i] = Some(j);
        }
    }
    (!groups.is_empty()).then_some(OrderGroups { groups })
}

/// Bytes of one row (one index along dim `a`) of the local tile.
pub fn other_bytes(shape: &Shape, g: &Grid, a: usize) -> u64 {
    let bytes = shape
        .element_type()
        .map(|t| t.byte_width().max(1))
        .unwrap_or(4) as u64;
    let ld = crate::grid::local_dims(shape.dims(), g);
    ld.iter()
        .enumerate()
        .filter(|&(k, _)| k != a)
        .map(|(_, &d)| d.max(0) as u64)
        .product::<u64>()
        * bytes
}

/// How an exchange moves its windows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Strategy {
    /// One collective-permute from each neighbour of the halo hull.
    Neighbours,
    /// Gather the dim.
    Gather,
    /// One collective-permute per tile distance (hull of the rows needed).
    ByDistance,
    /// One collective-permute per distinct row range (every window lies
    /// in one source tile).
    ByRange,
    /// One collective-permute per position of the source tile in the
    /// window (its first, second, .. tile), each the hull of those rows.
    ByOrder,
    /// Pieces placed one by one (see [`crate::assemble`]).
    Assemble,
}

/// The cheapest way to exchange the windows, its bytes per device, and
/// the left and right halo sizes.
struct ExchangePlan {
    strategy: Strategy,
    bytes: u64,
    left: i64,
    right: i64,
}

/// Picks the cheapest strategy: neighbour halos only where they fit in a
/// neighbour's tile; the by-distance and by-range permutes send only the
/// rows some window needs, which is less than the neighbour hull when the
/// windows of the tiles that need data are small (a slice to a few rows).
fn plan_exchange(
    p: &Part<'_, '_>,
    g: &Grid,
    shape: &Shape,
    a: usize,
    starts: &[i64],
    len: i64,
) -> ExchangePlan {
    let dims = shape.dims();
    let (l, r, s) = halos(g, dims, a, starts, len);
    let per_row = other_bytes(shape, g, a);
    let gather = p.cost_of(shape, g, &p.grids().replicate_dims(g, &[a]));
    let mut best = if l <= s && r <= s {
        (Strategy::Neighbours, (l + r).max(0) as u64 * per_row)
    } else {
        (Strategy::Gather, gather)
    };
    let mut consider = |st: Strategy, bytes: u64| {
        if bytes < best.1 {
            best = (st, bytes);
        }
    };
    consider(Strategy::Gather, gather);
    // At equal bytes the grouped permutes win: they send only to the
    // tiles that need rows, where a by-distance permute sends to all.
    if let Some(rg) = range_groups(starts, len, s, dims[a]) {
        consider(Strategy::ByRange, rg.cost(per_row));
    }
    if let Some(og) = order_groups(starts, len, s, dims[a]) {
        consider(Strategy::ByOrder, og.cost(per_row));
    }
    consider(
        Strategy::ByDistance,
        pieces_cost(&pieces(starts, len, s, dims[a]), per_row),
    );
    // Last, and only when strictly cheaper: it costs selects per group.
    let valid = vec![len; starts.len()];
    if let Some(asm) = crate::assemble::plan(starts, &valid, len, dims[a], false) {
        consider(Strategy::Assemble, asm.rows_moved().max(0) as u64 * per_row);
    }
    ExchangePlan {
        strategy: best.0,
        bytes: best.1,
        left: l,
        right: r,
    }
}

/// Bytes per device `exchange` moves.
pub fn exchange_cost(
    p: &Part<'_, '_>,
    g: &Grid,
    shape: &Shape,
    a: usize,
    starts: &[i64],
    len: i64,
) -> u64 {
    plan_exchange(p, g, shape, a, starts, len).bytes
}

fn with_dims_of(p: &Part<'_, '_>, x: InstrId, dims: &[i64]) -> Shape {
    crate::shapes::with_dims(p.b.shape(x), dims)
}

/// Pairs sending each tile to the tile `step` further along dim `a`.
fn neighbour_pairs(g: &Grid, a: usize, step: i64) -> Vec<(i64, i64)> {
    let t = g.tiles(a);
    let mut pairs = Vec::new();
    for d in 0..g.num_devices() {
        let mut c = g.coords(d);
        let nc = c[a] + step;
        if nc < 0 || nc >= t {
            continue;
        }
        c[a] = nc;
        pairs.push((d, g.device_at(&c)));
    }
    pairs
}
