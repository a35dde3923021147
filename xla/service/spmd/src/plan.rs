//! Planning the reshard of an array between any two grids: the cheapest
//! collective sequence found among a few plan families, each costed in
//! bytes per device (the size of every collective's result):
//!
//! - nothing (equal grids), or a local `dynamic-slice` when every device's
//!   target tile lies inside its source tile (replicated -> tiled, adding
//!   tiling on replicated devices);
//! - all-to-all moves of a minor tile factor from one dim to another (row to
//!   column sharding, 8-way -> 4x2), then the rest; or one dim gathered
//!   whole first, then such moves (its tiles sat on the wrong devices); or
//!   one all-to-all straight to the target when tiled dims move to other
//!   dims with every device keeping its coordinates;
//! - one all-gather of the minor factors the target does not want (the whole
//!   dim when the partial gather would not line up with the target's padded
//!   tiles), then a collective-permute when the devices sit at other tiles,
//!   then a local slice;
//! - a dim that is mostly padding (at most half of its padded tiles is
//!   data) made whole by a sum of the placed rows (XLA's all-reduce of a
//!   masked slice), then the rest;
//! - dims retiled where the grids agree elsewhere: one dim by its boundary
//!   rows (`Retile`), several at once by pieces sent straight from their
//!   holders (`Redistribute`, small meshes only);
//! - as a last resort, replicate (all-gather everything) and slice.
//!
//! Invariant: after every step the local buffer is exactly the padded tile
//! of the step's grid (`ceil(X/t)` per dim, valid data first); a plan is only
//! formed from steps whose preconditions hold (even dims for all-to-all,
//! aligned tiles for partial gathers, containment for slices), so emitting
//! it cannot produce wrong data.

use crate::grid::{gcd, local_dims, tile_size, Grid, GridCache};
use crate::memo::{hash_of, MemoTable};
use crate::redistribute::{redistribute_cost, redistribute_within};
use std::sync::Arc;

/// One step of a resharding plan; `to` is the grid after the step.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// All-gather the minor factor `f` of each `(dim, f)` in one collective.
    Gather {
        factors: Vec<(usize, i64)>,
        to: Grid,
    },
    /// All-to-all moving the minor factor `f` of `src` to dim `tgt`.
    AllToAll {
        src: usize,
        tgt: usize,
        f: i64,
        to: Grid,
    },
    /// One all-to-all making several moves at once (each `(src, tgt, f)`
    /// as in `AllToAll`, on pairwise distinct dims, every dim even): the
    /// group spans the moved factors, the first one major.
    AllToAllMulti {
        moves: Vec<(usize, usize, i64)>,
        to: Grid,
    },
    /// Collective-permute to the same tiling on other devices.
    Permute { to: Grid },
    /// Each device slices, out of its tile, the part of the tile it sends
    /// that the receiver keeps (the receiver's `to` tile inside its `via`
    /// tile), then a collective-permute to the `via` placement: the same
    /// result as `Permute { via }` then `Slice { to }` with less data moved.
    SlicePermute { via: Grid, to: Grid },
    /// Local (dynamic-)slice: every target tile lies in the source tile.
    Slice { to: Grid },
    /// Makes `dims` whole by one all-reduce (sum, or `or` for pred) of
    /// each device's rows placed at their global positions, zeros
    /// elsewhere: for dims mostly padding (an edge row or two over many
    /// tiles), where it moves less than gathering the padded tiles.
    SumGather { dims: Vec<usize>, to: Grid },
    /// Retiles dim `dim` (the grids agree on every other dim, device by
    /// device): each device receives the rows of its `to` tile from the
    /// devices holding them, one collective-permute per position of the
    /// source tile in the window (see [`retile`]).
    Retile { dim: usize, to: Grid },
    /// Moves several dims at once, each device receiving its target
    /// tile's pieces from their holders (see [`crate::redistribute`]).
    Redistribute { dims: Vec<usize>, to: Grid },
}

/// One collective-permute of a [`Retile`]: rows `[lo, hi)` of the source
/// tile, sent along `pairs` (remote sources only); `own[d]` marks devices
/// whose piece is in their own tile (taken locally).
#[derive(Clone, Debug, PartialEq)]
pub struct RetileGroup {
    pub lo: i64,
    pub hi: i64,
    pub pairs: Vec<(i64, i64)>,
    pub own: Vec<i64>,
}

/// A retile of one dim: the groups, concatenated in order along the dim,
/// hold every device's window from `offsets[d]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Retile {
    pub groups: Vec<RetileGroup>,
    pub offsets: Vec<i64>,
}

/// Most devices a retile is planned for (it visits every device).
const MAX_RETILE_DEVICES: i64 = 4096;

/// Plans moving dim `a` (of `x` elements) from `cur`'s tiling to `to`'s
/// when the two agree on every other data dim device by device: group `k`
/// carries the `k`-th source tile of every device's window (from the
/// device itself when it holds it, else from a holder with its other
/// coordinates not yet sending in that group). `None` when the grids
/// differ elsewhere or no holder is free.
pub fn retile(cur: &Grid, to: &Grid, a: usize, x: i64) -> Option<Retile> {
    let n = cur.num_devices();
    let rank = cur.rank();
    if to.num_devices() != n || to.rank() != rank || n > MAX_RETILE_DEVICES || a >= rank {
        return None;
    }
    if (0..rank).any(|b| b != a && cur.tiles(b) != to.tiles(b)) {
        return None;
    }
    let (s1, s2) = (tile_size(x, cur.tiles(a)), tile_size(x, to.tiles(a)));
    if s1 <= 0 || s2 <= 0 {
        return None;
    }
    // The `to.repl()` devices of one target tile want the same source
    // tile in each group; at most `cur.repl()` of them hold it, and its
    // `cur.repl()` holders send it once each.
    if to.repl() > 2 * cur.repl() {
        return None;
    }
    // A device's tile key: its `cur` coordinates on the data dims in mixed
    // radix, so the tile `i` along `a` of the same row is
    // `key + (i - coord) * strides[a]`.
    let mut strides = vec![0i64; rank];
    let mut num_keys = 1i64;
    for b in (0..rank).rev() {
        strides[b] = num_keys;
        num_keys *= cur.tiles(b);
    }
    let nu = n as usize;
    let (cur_coords, to_coords) = (cur.coord_table(), to.coord_table());
    let width = rank + 1;
    let mut key = vec![0i64; nu];
    let mut coord_a = vec![0i64; nu];
    let mut to_a = vec![0i64; nu];
    for d in 0..nu {
        let (c, t) = (
            &cur_coords[d * width..][..rank],
            &to_coords[d * width..][..rank],
        );
        let mut k = 0;
        for b in 0..rank {
            if b != a && t[b] != c[b] {
                return None;
            }
            k += c[b] as i64 * strides[b];
        }
        key[d] = k;
        coord_a[d] = c[a] as i64;
        to_a[d] = t[a] as i64;
    }
    // Holders of each key in device order (a counting sort): key `k`'s
    // holders are `holders[start[k]..start[k + 1]]`.
    let mut start = vec![0usize; num_keys as usize + 1];
    for &k in &key {
        start[k as usize + 1] += 1;
    }
    for k in 0..num_keys as usize {
        start[k + 1] += start[k];
    }
    let mut holders = vec![0i64; nu];
    let mut fill = start.clone();
    for (d, &k) in key.iter().enumerate() {
        holders[fill[k as usize]] = d as i64;
        fill[k as usize] += 1;
    }
    // Every device's window along `a` and the first source tile in it.
    let windows: Vec<Option<(i64, i64)>> = to_a
        .iter()
        .map(|&t| {
            let lo = t * s2;
            let hi = (lo + s2).min(x);
            (lo < hi).then_some((lo, hi))
        })
        .collect();
    let num_groups = windows
        .iter()
        .flatten()
        .map(|&(lo, hi)| (hi - 1) / s1 - lo / s1 + 1)
        .max()
        .unwrap_or(0);
    // Group by group, so a group with too few holders stops the plan
    // early; within a group each holder sends once, the receivers asking
    // the same key taking its holders in device order.
    let mut groups: Vec<RetileGroup> = Vec::with_capacity(num_groups as usize);
    let mut taken = vec![0usize; num_keys as usize];
    let mut touched: Vec<usize> = Vec::new();
    let mut first_row = vec![None; nu];
    for k in 0..num_groups {
        let mut grp = RetileGroup {
            lo: i64::MAX,
            hi: i64::MIN,
            pairs: Vec::new(),
            own: vec![0; nu],
        };
        for d in 0..nu {
            let Some((lo, hi)) = windows[d] else {
                continue;
            };
            let i = lo / s1 + k;
            if i > (hi - 1) / s1 {
                continue;
            }
            let (r0, r1) = (lo.max(i * s1) - i * s1, hi.min(i * s1 + s1) - i * s1);
            if k == 0 {
                first_row[d] = Some(r0);
            }
            grp.lo = grp.lo.min(r0);
            grp.hi = grp.hi.max(r1);
            if coord_a[d] == i {
                grp.own[d] = 1;
                continue;
            }
            let source_key = (key[d] + (i - coord_a[d]) * strides[a]) as usize;
            let slot = start[source_key] + taken[source_key];
            if slot >= start[source_key + 1] {
                return None;
            }
            if taken[source_key] == 0 {
                touched.push(source_key);
            }
            taken[source_key] += 1;
            grp.pairs.push((holders[slot], d as i64));
        }
        for t in touched.drain(..) {
            taken[t] = 0;
        }
        groups.push(grp);
    }
    let lo0 = groups.first().map_or(0, |g| g.lo);
    let offsets = first_row.iter().map(|r| r.map_or(0, |r| r - lo0)).collect();
    Some(Retile { groups, offsets })
}

/// Bytes per device a [`retile`] moves (groups with a remote source).
fn retile_cost(rt: &Retile, cur: &Grid, a: usize, dims: &[i64], bytes: u64) -> u64 {
    let local = local_dims(dims, cur);
    let other: u64 = local
        .iter()
        .enumerate()
        .filter(|&(b, _)| b != a)
        .map(|(_, &d)| d.max(0) as u64)
        .product();
    rt.groups
        .iter()
        .filter(|g| !g.pairs.is_empty())
        .map(|g| (g.hi - g.lo).max(0) as u64 * other * bytes)
        .sum()
}

/// A resharding plan and its communication cost (bytes per device).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
    pub cost: u64,
}

impl Plan {
    /// Continues this plan with `rest`.
    fn append(&mut self, rest: Plan) {
        self.cost += rest.cost;
        self.steps.extend(rest.steps);
    }
}

/// The rest of a plan that has reached `cur`: nothing, a local slice, or
/// the gather-permute-slice family.
fn finish(grids: &GridCache, cur: &Grid, tgt: &Grid, dims: &[i64], bytes: u64) -> Plan {
    if cur == tgt {
        Plan::default()
    } else if slice_ok(cur, tgt, dims) {
        Plan {
            steps: vec![Step::Slice { to: tgt.clone() }],
            cost: 0,
        }
    } else {
        plan_gather_fix(grids, cur, tgt, dims, bytes)
    }
}

fn elems(dims: &[i64]) -> u64 {
    dims.iter().map(|&d| d.max(0) as u64).product()
}

/// True when every device's valid target tile lies inside its valid source tile.
pub fn slice_ok(src: &Grid, tgt: &Grid, dims: &[i64]) -> bool {
    for (a, &x) in dims.iter().enumerate() {
        let (ts, tt) = (src.tiles(a), tgt.tiles(a));
        if ts == 1 {
            continue;
        }
        let (ss, st) = (tile_size(x, ts), tile_size(x, tt));
        let ok = src.all_pairs(tgt, a, |cs, ct| {
            let ot = ct * st;
            let vt = (x - ot).clamp(0, st);
            if vt == 0 {
                return true;
            }
            let os = cs * ss;
            let vs = (x - os).clamp(0, ss);
            !(ot < os || ot + vt > os + vs)
        });
        if !ok {
            return false;
        }
    }
    true
}

/// Validity of gathering minor factor `f` of dim `a` (size `x`, `t` tiles):
/// the merged tiles must be exactly the padded tiles of the result.
fn gather_aligned(x: i64, t: i64, f: i64) -> bool {
    let nt = t / f;
    nt == 1 || tile_size(x, nt) == f * tile_size(x, t)
}

fn gather_cost(src: &Grid, factors: &[(usize, i64)], dims: &[i64], bytes: u64) -> u64 {
    let mut l = local_dims(dims, src);
    for &(a, f) in factors {
        l[a] *= f;
    }
    elems(&l) * bytes
}

/// Gather (the minor factors the target does not want), permute, slice.
fn plan_gather_fix(grids: &GridCache, src: &Grid, tgt: &Grid, dims: &[i64], bytes: u64) -> Plan {
    let mut plan = Plan::default();
    let mut factors = Vec::new();
    for (a, &x) in dims.iter().enumerate() {
        let (s, t) = (src.tiles(a), tgt.tiles(a));
        let mut g = s / gcd(s, t);
        if g > 1 && !gather_aligned(x, s, g) {
            g = s;
        }
        if g > 1 {
            factors.push((a, g));
        }
    }
    let mut cur = src.clone();
    if !factors.is_empty() {
        let Some(to) = grids.gathered(src, &factors) else {
            return replicate_plan(grids, src, tgt, dims, bytes);
        };
        plan.cost += gather_cost(src, &factors, dims, bytes);
        plan.steps.push(Step::Gather {
            factors,
            to: to.clone(),
        });
        cur = to;
    }
    if &cur == tgt {
        return plan;
    }
    if slice_ok(&cur, tgt, dims) {
        plan.steps.push(Step::Slice { to: tgt.clone() });
        return plan;
    }
    let cdims: Vec<i64> = (0..cur.rank()).map(|a| cur.tiles(a)).collect();
    let Some(coarse) = grids.coarsened(tgt, &cdims) else {
        return replicate_plan(grids, src, tgt, dims, bytes);
    };
    if coarse != cur && coarse.dims() != cur.dims() {
        return replicate_plan(grids, src, tgt, dims, bytes);
    }
    if &coarse != tgt && !slice_ok(&coarse, tgt, dims) {
        return replicate_plan(grids, src, tgt, dims, bytes);
    }
    match (coarse != cur, &coarse != tgt) {
        (true, true) => {
            plan.cost += elems(&local_dims(dims, tgt)) * bytes;
            plan.steps.push(Step::SlicePermute {
                via: coarse,
                to: tgt.clone(),
            });
        }
        (true, false) => {
            plan.cost += elems(&local_dims(dims, &cur)) * bytes;
            plan.steps.push(Step::Permute { to: coarse });
        }
        (false, true) => plan.steps.push(Step::Slice { to: tgt.clone() }),
        (false, false) => {}
    }
    plan
}

/// All-gather everything, then slice.
fn replicate_plan(grids: &GridCache, src: &Grid, tgt: &Grid, dims: &[i64], bytes: u64) -> Plan {
    let mut plan = Plan::default();
    let factors: Vec<(usize, i64)> = src
        .tiled_dims()
        .iter()
        .map(|&a| (a, src.tiles(a)))
        .collect();
    let repl = grids.replicated(src.rank(), src.num_devices());
    if !factors.is_empty() {
        plan.cost += gather_cost(src, &factors, dims, bytes);
        plan.steps.push(Step::Gather {
            factors,
            to: repl.clone(),
        });
    }
    if &repl != tgt {
        plan.steps.push(Step::Slice { to: tgt.clone() });
    }
    plan
}

/// An all-to-all moving the minor factor `f` of dim `a` (`xa` elements in
/// `sa` tiles) to dim `b` (`xb` in `sb` tiles) keeps every buffer an exact
/// padded tile: the merged tiles of `a` line up with the result's tiles (or
/// `a` becomes whole), and the chunks of `b` line up with its new tiles.
fn all_to_all_ok(xa: i64, sa: i64, xb: i64, sb: i64, f: i64) -> bool {
    gather_aligned(xa, sa, f) && (sb == 1 || tile_size(xb, sb) == f * tile_size(xb, sb * f))
}

/// Bytes of the all-to-all result (the target dim padded to `f` chunks).
fn all_to_all_cost(cur: &Grid, dims: &[i64], b: usize, f: i64, bytes: u64) -> u64 {
    let mut l = local_dims(dims, cur);
    l[b] = f * tile_size(dims[b], cur.tiles(b) * f);
    elems(&l) * bytes
}

/// Finds one useful all-to-all move from `cur` towards `tgt`.
fn next_all_to_all(cur: &Grid, tgt: &Grid, dims: &[i64]) -> Option<(usize, usize, i64)> {
    for (a, &xa) in dims.iter().enumerate() {
        let (sa, ta) = (cur.tiles(a), tgt.tiles(a));
        let excess = sa / gcd(sa, ta);
        if excess <= 1 {
            continue;
        }
        for (b, &xb) in dims.iter().enumerate() {
            if b == a {
                continue;
            }
            let (sb, tb) = (cur.tiles(b), tgt.tiles(b));
            if tb % sb != 0 {
                continue;
            }
            let f = gcd(excess, tb / sb);
            if f > 1 && all_to_all_ok(xa, sa, xb, sb, f) {
                return Some((a, b, f));
            }
        }
    }
    None
}

/// Memo tables of the planner, keyed by value: plans, and the slice
/// offsets of local slices between two grids. One cache lives as long as
/// the partitioning of one module.
#[derive(Default)]
pub struct PlanCache {
    plans: MemoTable<(Grid, Grid, Vec<i64>, u64), Plan>,
    slice_summaries: MemoTable<(Grid, Grid, usize, i64), (Option<i64>, i64)>,
    slice_tables: MemoTable<(Grid, Grid, usize, i64), Arc<[i64]>>,
    retiles: MemoTable<(Grid, Grid, usize, i64), Option<std::rc::Rc<Retile>>>,
}

impl PlanCache {
    /// The cheapest plan found from `src` to `tgt` for an array of `dims`
    /// with `bytes` bytes per element (memoized).
    pub fn plan(
        &self,
        grids: &GridCache,
        src: &Grid,
        tgt: &Grid,
        dims: &[i64],
        bytes: u64,
    ) -> Plan {
        if src == tgt {
            return Plan::default();
        }
        self.plans.get_or_insert_with(
            hash_of((src, tgt, dims, bytes)),
            |k| k.0 == *src && k.1 == *tgt && k.2 == dims && k.3 == bytes,
            || (src.clone(), tgt.clone(), dims.to_vec(), bytes),
            || plan_uncached(self, grids, src, tgt, dims, bytes),
        )
    }

    /// [`retile`], memoized (the planner costs it, the emitter emits it).
    pub fn retile(&self, cur: &Grid, to: &Grid, a: usize, x: i64) -> Option<std::rc::Rc<Retile>> {
        self.retiles.get_or_insert_with(
            hash_of((cur, to, a, x)),
            |k| k.0 == *cur && k.1 == *to && (k.2, k.3) == (a, x),
            || (cur.clone(), to.clone(), a, x),
            || retile(cur, to, a, x).map(std::rc::Rc::new),
        )
    }

    /// [`slice_summary`], memoized.
    pub fn slice_summary(&self, cur: &Grid, to: &Grid, a: usize, xa: i64) -> (Option<i64>, i64) {
        self.slice_summaries.get_or_insert_with(
            hash_of((cur, to, a, xa)),
            |k| k.0 == *cur && k.1 == *to && (k.2, k.3) == (a, xa),
            || (cur.clone(), to.clone(), a, xa),
            || slice_summary(cur, to, a, xa),
        )
    }

    /// [`slice_table`], memoized: equal requests get the same table (one
    /// `Arc`), which the builder emits once per computation.
    pub fn slice_table(&self, cur: &Grid, to: &Grid, a: usize, xa: i64) -> Arc<[i64]> {
        self.slice_tables.get_or_insert_with(
            hash_of((cur, to, a, xa)),
            |k| k.0 == *cur && k.1 == *to && (k.2, k.3) == (a, xa),
            || (cur.clone(), to.clone(), a, xa),
            || slice_table(cur, to, a, xa),
        )
    }
}

/// Where a slice from `cur`'s tile to `to`'s along dim `a` (of size `xa`)
/// starts, for a device at coordinate `cs` (under `cur`) and `ct` (under
/// `to`): `None` for devices whose target tile is padding only.
fn slice_offset(cur: &Grid, to: &Grid, a: usize, xa: i64, cs: i64, ct: i64) -> Option<i64> {
    let (ss, st) = (tile_size(xa, cur.tiles(a)), tile_size(xa, to.tiles(a)));
    let ot = ct * st;
    let vt = (xa - ot).clamp(0, st);
    (vt != 0).then(|| ot - cs * ss)
}

/// The slice offsets from `cur`'s tile to `to`'s along dim `a` of size
/// `xa`: the offset when every partition has the same one (0 for devices
/// whose target tile is padding), and the buffer length the slices need
/// (O(coordinate pairs), not O(devices)).
pub fn slice_summary(cur: &Grid, to: &Grid, a: usize, xa: i64) -> (Option<i64>, i64) {
    let st = tile_size(xa, to.tiles(a));
    let mut need = st;
    let mut first: Option<i64> = None;
    let mut constant = true;
    cur.all_pairs(to, a, |cs, ct| {
        let v = slice_offset(cur, to, a, xa, cs, ct);
        if let Some(off) = v {
            need = need.max(off + st);
        }
        let v = v.unwrap_or(0);
        match first {
            None => first = Some(v),
            Some(f) if f != v => constant = false,
            _ => {}
        }
        true
    });
    (
        if constant {
            Some(first.unwrap_or(0))
        } else {
            None
        },
        need,
    )
}

/// The per-partition offsets of a local slice from `cur`'s tile to `to`'s
/// along dim `a` of size `xa` (0 for devices whose target tile is padding).
pub fn slice_table(cur: &Grid, to: &Grid, a: usize, xa: i64) -> Arc<[i64]> {
    cur.pair_table(to, a, |cs, ct| {
        slice_offset(cur, to, a, xa, cs, ct).unwrap_or(0)
    })
    .into()
}

fn plan_uncached(
    cache: &PlanCache,
    grids: &GridCache,
    src: &Grid,
    tgt: &Grid,
    dims: &[i64],
    bytes: u64,
) -> Plan {
    if slice_ok(src, tgt, dims) {
        return Plan {
            steps: vec![Step::Slice { to: tgt.clone() }],
            cost: 0,
        };
    }
    let mut best = plan_gather_fix(grids, src, tgt, dims, bytes);
    // All-to-all moves first, then the rest.
    let (mut a2a, cur) = all_to_alls(grids, src, tgt, dims, bytes);
    if best.cost > 0 {
        if let Some(pg) = permute_then_gather(grids, src, tgt, dims, bytes, best.cost) {
            if pg.cost < best.cost {
                best = pg;
            }
        }
    }
    if best.cost > 0 {
        if let Some(sa) = slice_then_all_to_all(grids, src, tgt, dims, bytes, best.cost) {
            if sa.cost < best.cost {
                best = sa;
            }
        }
    }
    if !a2a.steps.is_empty() {
        a2a.append(finish(grids, &cur, tgt, dims, bytes));
        if a2a.cost < best.cost {
            best = a2a;
        }
    }
    if best.cost > 0 {
        if let Some(direct) = direct_all_to_all_multi(grids, src, tgt, dims, bytes) {
            if direct.cost < best.cost {
                best = direct;
            }
        }
    }
    // Dims retiled by a window exchange (the grids agree elsewhere): one
    // dim by a retile, several by a redistribution.
    if best.cost > 0 {
        let differing: Vec<usize> = (0..dims.len())
            .filter(|&a| {
                src.tiles(a) != tgt.tiles(a) || src.coord_pairs(tgt, a).iter().any(|p| p.0 != p.1)
            })
            .collect();
        if differing.len() >= 2 {
            if let Some(rd) =
                redistribute_within(src, tgt, &differing, dims, Some((bytes, best.cost)))
            {
                let cost = redistribute_cost(&rd, src, dims, bytes);
                if cost < best.cost {
                    best = Plan {
                        steps: vec![Step::Redistribute {
                            dims: differing.clone(),
                            to: tgt.clone(),
                        }],
                        cost,
                    };
                }
            }
        }
        if let [a] = differing[..] {
            if let Some(rt) = cache.retile(src, tgt, a, dims[a]) {
                let cost = retile_cost(&rt, src, a, dims, bytes);
                if cost < best.cost {
                    best = Plan {
                        steps: vec![Step::Retile {
                            dim: a,
                            to: tgt.clone(),
                        }],
                        cost,
                    };
                }
            }
        }
    }
    // Dims that are mostly padding summed whole first (each alone, and all
    // of them in one all-reduce), then the rest.
    if best.cost > 0 {
        let padding_dims: Vec<usize> = src
            .tiled_dims()
            .into_iter()
            .filter(|&a| {
                let t = src.tiles(a);
                tgt.tiles(a) == 1 && 2 * dims[a] <= t * tile_size(dims[a], t)
            })
            .collect();
        let mut sets: Vec<Vec<usize>> = padding_dims.iter().map(|&a| vec![a]).collect();
        if padding_dims.len() > 1 {
            sets.push(padding_dims.clone());
        }
        for set in sets {
            let factors: Vec<(usize, i64)> = set.iter().map(|&a| (a, src.tiles(a))).collect();
            let Some(to) = grids.gathered(src, &factors) else {
                continue;
            };
            let mut sg = Plan {
                steps: vec![Step::SumGather {
                    dims: set.clone(),
                    to: to.clone(),
                }],
                cost: elems(&local_dims(dims, &to)) * bytes,
            };
            if sg.cost >= best.cost {
                continue;
            }
            sg.append(cache.plan(grids, &to, tgt, dims, bytes));
            if sg.cost < best.cost {
                best = sg;
            }
            // The other dims the target keeps whole gathered first, so the
            // sum moves the padded dims' rows once, not per other tile.
            let others: Vec<(usize, i64)> = src
                .tiled_dims()
                .into_iter()
                .filter(|a| !set.contains(a) && tgt.tiles(*a) == 1)
                .map(|a| (a, src.tiles(a)))
                .collect();
            if others.is_empty() {
                continue;
            }
            let Some(mid) = grids.gathered(src, &others) else {
                continue;
            };
            let Some(to) = grids.gathered(&mid, &factors) else {
                continue;
            };
            let mut gs = Plan {
                steps: vec![
                    Step::Gather {
                        factors: others.clone(),
                        to: mid.clone(),
                    },
                    Step::SumGather {
                        dims: set.clone(),
                        to: to.clone(),
                    },
                ],
                cost: gather_cost(src, &others, dims, bytes)
                    + elems(&local_dims(dims, &to)) * bytes,
            };
            if gs.cost >= best.cost {
                continue;
            }
            gs.append(cache.plan(grids, &to, tgt, dims, bytes));
            if gs.cost < best.cost {
                best = gs;
            }
        }
    }
    // One tiled dim gathered whole first (its tiles sit on the wrong
    // devices for the target), then all-to-alls, then the rest.
    if best.cost > 0 {
        for a in src.tiled_dims() {
            let factors = [(a, src.tiles(a))];
            let Some(g) = grids.gathered(src, &factors) else {
                continue;
            };
            let mut ga = Plan {
                steps: vec![Step::Gather {
                    factors: factors.to_vec(),
                    to: g.clone(),
                }],
                cost: gather_cost(src, &factors, dims, bytes),
            };
            if ga.cost >= best.cost {
                continue;
            }
            let (moves, cur) = all_to_alls(grids, &g, tgt, dims, bytes);
            if moves.steps.is_empty() {
                continue;
            }
            ga.append(moves);
            ga.append(finish(grids, &cur, tgt, dims, bytes));
            if ga.cost < best.cost {
                best = ga;
            }
        }
    }
    best
}

/// The all-to-all moves `next_all_to_all` finds from `src` towards `tgt`,
/// in order, and the grid they reach.
fn all_to_alls(
    grids: &GridCache,
    src: &Grid,
    tgt: &Grid,
    dims: &[i64],
    bytes: u64,
) -> (Plan, Grid) {
    let mut cur = src.clone();
    let mut a2a = Plan::default();
    for _ in 0..2 * dims.len() + 2 {
        let Some((a, b, f)) = next_all_to_all(&cur, tgt, dims) else {
            break;
        };
        let Some(to) = grids.all_to_all(&cur, a, b, f) else {
            break;
        };
        a2a.cost += all_to_all_cost(&cur, dims, b, f, bytes);
        a2a.steps.push(Step::AllToAll {
            src: a,
            tgt: b,
            f,
            to: to.clone(),
        });
        cur = to;
    }
    (merge_all_to_alls(grids, src, a2a, dims, bytes), cur)
}

/// Merges runs of consecutive all-to-all steps on pairwise distinct dims
/// into one all-to-all over the product of their groups: one local tile
/// moves instead of one per step.
fn merge_all_to_alls(grids: &GridCache, src: &Grid, plan: Plan, dims: &[i64], bytes: u64) -> Plan {
    if plan.steps.len() < 2 {
        return plan;
    }
    let mut out = Plan::default();
    let mut cur = src.clone();
    let mut i = 0;
    let steps = &plan.steps;
    while i < steps.len() {
        let mut best: Option<(usize, Step)> = None;
        let mut moves: Vec<(usize, usize, i64)> = Vec::new();
        for (j, step) in steps.iter().enumerate().skip(i) {
            let Step::AllToAll {
                src: a,
                tgt: b,
                f,
                to,
            } = step
            else {
                break;
            };
            if moves
                .iter()
                .any(|m| [m.0, m.1].contains(a) || [m.0, m.1].contains(b))
            {
                break;
            }
            moves.push((*a, *b, *f));
            if moves.len() >= 2 && multi_all_to_all_ok(grids, &cur, to, &moves, dims) {
                best = Some((
                    j,
                    Step::AllToAllMulti {
                        moves: moves.clone(),
                        to: to.clone(),
                    },
                ));
            }
        }
        match best {
            Some((j, step)) => {
                out.cost += elems(&local_dims(dims, &cur)) * bytes;
                if let Step::AllToAllMulti { to, .. } = &step {
                    cur = to.clone();
                }
                out.steps.push(step);
                i = j + 1;
            }
            None => {
                let step = steps[i].clone();
                if let Step::AllToAll { tgt, f, to, .. } = &step {
                    out.cost += all_to_all_cost(&cur, dims, *tgt, *f, bytes);
                    cur = to.clone();
                }
                out.steps.push(step);
                i += 1;
            }
        }
    }
    out
}

/// Most dims one direct all-to-all pairs (bijections and move orders are
/// enumerated).
const MAX_DIRECT_MOVES: usize = 4;

/// One all-to-all straight to `tgt` when the two grids differ only in
/// dims tiled by one of them alone, paired source-to-target by equal tile
/// counts with every device keeping its coordinate (XLA's all-to-all with
/// several source and target dims): one local tile moves, where the
/// greedy minor-factor moves may take several steps and a permute.
fn direct_all_to_all_multi(
    grids: &GridCache,
    src: &Grid,
    tgt: &Grid,
    dims: &[i64],
    bytes: u64,
) -> Option<Plan> {
    if src.rank() != tgt.rank() || src.num_devices() != tgt.num_devices() {
        return None;
    }
    let (mut from, mut onto) = (Vec::new(), Vec::new());
    for a in 0..dims.len() {
        match (src.tiles(a), tgt.tiles(a)) {
            (s, t) if s == t => {}
            (s, 1) if s > 1 => from.push(a),
            (1, t) if t > 1 => onto.push(a),
            _ => return None,
        }
    }
    if from.len() < 2 || from.len() != onto.len() || from.len() > MAX_DIRECT_MOVES {
        return None;
    }
    for pairing in permutations(onto.len()) {
        let moves: Vec<(usize, usize, i64)> = from
            .iter()
            .zip(&pairing)
            .map(|(&a, &k)| (a, onto[k], src.tiles(a)))
            .collect();
        if moves.iter().any(|m| tgt.tiles(m.1) != m.2) {
            continue;
        }
        for order in permutations(moves.len()) {
            let ordered: Vec<(usize, usize, i64)> = order.iter().map(|&k| moves[k]).collect();
            let mut cur = src.clone();
            for &(a, b, f) in &ordered {
                match grids.all_to_all(&cur, a, b, f) {
                    Some(next) => cur = next,
                    None => break,
                }
            }
            if &cur != tgt || !multi_all_to_all_ok(grids, src, &cur, &ordered, dims) {
                continue;
            }
            return Some(Plan {
                steps: vec![Step::AllToAllMulti {
                    moves: ordered,
                    to: tgt.clone(),
                }],
                cost: elems(&local_dims(dims, src)) * bytes,
            });
        }
    }
    None
}

/// Every ordering of `0..n` (n small).
fn permutations(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for rest in permutations(n - 1) {
        for at in 0..=rest.len() {
            let mut p = rest.clone();
            p.insert(at, n - 1);
            out.push(p);
        }
    }
    out
}

/// Whether one all-to-all over the moved factors' groups takes `cur` to
/// `to`: every moved dim even (no padding), the group members ordered by
/// the moved factors' minor coordinates (first move major), and every
/// device's new minor coordinate on each target dim its old one on the
/// source dim.
pub fn multi_all_to_all_ok(
    grids: &GridCache,
    cur: &Grid,
    to: &Grid,
    moves: &[(usize, usize, i64)],
    dims: &[i64],
) -> bool {
    for &(a, b, f) in moves {
        if f <= 1 || dims[a] % cur.tiles(a) != 0 || dims[b] % (cur.tiles(b) * f) != 0 {
            return false;
        }
        if cur.tiles(a) % f != 0 {
            return false;
        }
    }
    let factors: Vec<(usize, i64)> = moves.iter().map(|m| (m.0, m.2)).collect();
    let groups = grids.factor_groups(cur, &factors);
    let Some(first) = groups.lists().into_iter().next() else {
        return false;
    };
    let minor = |d: i64, k: usize| cur.coord(d, moves[k].0) % moves[k].2;
    for (m, &d) in first.iter().enumerate() {
        let mut pos = 0;
        for k in 0..moves.len() {
            pos = pos * moves[k].2 + minor(d, k);
        }
        if pos != m as i64 {
            return false;
        }
    }
    (0..cur.num_devices()).all(|d| {
        moves
            .iter()
            .enumerate()
            .all(|(k, m)| to.coord(d, m.1) % m.2 == minor(d, k))
    })
}

/// A local slice that adds tiling the source holds by replication,
/// followed by one all-to-all into the target (then whatever remains):
/// the all-to-all moves the sliced buffer instead of the whole tile.
fn slice_then_all_to_all(
    grids: &GridCache,
    src: &Grid,
    tgt: &Grid,
    dims: &[i64],
    bytes: u64,
    to_beat: u64,
) -> Option<Plan> {
    for (a, &xa) in dims.iter().enumerate() {
        let (sa, ta) = (src.tiles(a), tgt.tiles(a));
        if sa <= ta || sa % ta != 0 {
            continue;
        }
        for (b, &xb) in dims.iter().enumerate() {
            let (sb, tb) = (src.tiles(b), tgt.tiles(b));
            if b == a || tb <= sb || tb % sb != 0 {
                continue;
            }
            let f = gcd(sa / ta, tb / sb);
            if f <= 1 {
                continue;
            }
            // The all-to-all alone moves the sliced tile: skip building
            // grids (O(devices)) when that cannot beat the best plan.
            let mut mid_local = local_dims(dims, src);
            mid_local[b] = f * tile_size(xb, tb);
            if elems(&mid_local) * bytes >= to_beat {
                continue;
            }
            // The grid one all-to-all before the target, or else the
            // source with its replicas spread over dim `b` (a permute
            // then fixes the device order).
            let mid = match grids.all_to_all(tgt, b, a, f) {
                Some(m) if slice_ok(src, &m, dims) => m,
                _ => match spread_replicas(src, b, tb / f) {
                    Some(m) => m,
                    None => continue,
                },
            };
            if mid.tiles(a) != sa
                || !slice_ok(src, &mid, dims)
                || !all_to_all_ok(xa, mid.tiles(a), xb, mid.tiles(b), f)
            {
                continue;
            }
            let Some(after) = grids.all_to_all(&mid, a, b, f) else {
                continue;
            };
            let mut plan = Plan::default();
            if &mid != src {
                plan.steps.push(Step::Slice { to: mid.clone() });
            }
            plan.cost += all_to_all_cost(&mid, dims, b, f, bytes);
            plan.steps.push(Step::AllToAll {
                src: a,
                tgt: b,
                f,
                to: after.clone(),
            });
            plan.append(finish(grids, &after, tgt, dims, bytes));
            return Some(plan);
        }
    }
    None
}

/// A collective-permute of the (small) source tiles to the devices that,
/// after gathering the factors the target does not want, hold exactly the
/// target: cheaper than gathering first and permuting the gathered tiles.
fn permute_then_gather(
    grids: &GridCache,
    src: &Grid,
    tgt: &Grid,
    dims: &[i64],
    bytes: u64,
    to_beat: u64,
) -> Option<Plan> {
    let mut factors = Vec::new();
    for (a, &x) in dims.iter().enumerate() {
        let (s, t) = (src.tiles(a), tgt.tiles(a));
        if s == t {
            continue;
        }
        if s < t || s % t != 0 || !gather_aligned(x, s, s / t) {
            return None;
        }
        factors.push((a, s / t));
    }
    // The cost depends on tile counts only: decide before building grids.
    let cost = elems(&local_dims(dims, src)) * bytes + gather_cost(src, &factors, dims, bytes);
    if factors.is_empty() || cost >= to_beat {
        return None;
    }
    let mut pre = tgt.clone();
    for &(a, _) in &factors {
        pre = spread_replicas(&pre, a, src.tiles(a))?;
    }
    if pre.dims() != src.dims() || &pre == src {
        return None;
    }
    let gathered = grids.gathered(&pre, &factors)?;
    if &gathered != tgt {
        return None;
    }
    Some(Plan {
        cost,
        steps: vec![
            Step::Permute { to: pre.clone() },
            Step::Gather {
                factors,
                to: gathered,
            },
        ],
    })
}

/// `src` with dim `b` tiled `tiles` ways, the new tiling taken from its
/// replicas (each device keeps its data dims' coordinates, so a local slice
/// gets there).
fn spread_replicas(src: &Grid, b: usize, tiles: i64) -> Option<Grid> {
    let sb = src.tiles(b);
    let r = src.repl();
    if tiles <= sb || tiles % sb != 0 || r % (tiles / sb) != 0 {
        return None;
    }
    let k = tiles / sb;
    let n = src.num_devices();
    let mut replica = vec![0i64; n as usize];
    for (pos, &d) in src.devs().iter().enumerate() {
        if let Some(x) = usize::try_from(d).ok().and_then(|d| replica.get_mut(d)) {
            *x = pos as i64 % r;
        }
    }
    let mut dims: Vec<i64> = (0..src.rank()).map(|a| src.tiles(a)).collect();
    dims[b] = tiles;
    Grid::from_coords(&dims, n, |d, c| {
        for (a, x) in c.iter_mut().enumerate() {
            *x = src.coord(d, a);
        }
        c[b] = c[b] * k + replica[d as usize] % k;
    })
}
