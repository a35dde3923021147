//! Resharding an array between any two grids with the cheapest collective
//! sequence found among a few plan families, each costed in bytes per
//! device (the size of every collective's result):
//!
//! - nothing (equal grids), or a local `dynamic-slice` when every device's
//!   target tile lies inside its source tile (replicated -> tiled, adding
//!   tiling on replicated devices);
//! - all-to-all moves of a minor tile factor from one dim to another (row to
//!   column sharding, 8-way -> 4x2), then the rest; or one dim gathered
//!   whole first, then such moves (its tiles sat on the wrong devices);
//! - one all-gather of the minor factors the target does not want (the whole
//!   dim when the partial gather would not line up with the target's padded
//!   tiles), then a collective-permute when the devices sit at other tiles,
//!   then a local slice;
//! - a dim that is mostly padding (at most half of its padded tiles is
//!   data) made whole by a sum of the placed rows (XLA's all-reduce of a
//!   masked slice), then the rest;
//! - as a last resort, replicate (all-gather everything) and slice.
//!
//! Invariant: after every step the local buffer is exactly the padded tile
//! of the step's grid (`ceil(X/t)` per dim, valid data first); a plan is only
//! formed from steps whose preconditions hold (even dims for all-to-all,
//! aligned tiles for partial gathers, containment for slices), so emitting
//! it cannot produce wrong data.

use crate::builder::Builder;
use crate::error::SpmdError;
use crate::grid::{gcd, local_dims, tile_size, Grid, GridCache};
use crate::memo::{hash_of, MemoTable};
use std::sync::Arc;
use xla_hlo_ir::InstrId;

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
    /// Collective-permute to the same tiling on other devices.
    Permute { to: Grid },
    /// Each device slices, out of its tile, the part of the tile it sends
    /// that the receiver keeps (the receiver's `to` tile inside its `via`
    /// tile), then a collective-permute to the `via` placement: the same
    /// result as `Permute { via }` then `Slice { to }` with less data moved.
    SlicePermute { via: Grid, to: Grid },
    /// Local (dynamic-)slice: every target tile lies in the source tile.
    Slice { to: Grid },
    /// Makes dim `dim` whole by an all-reduce (sum, or `or` for pred) of
    /// each device's rows placed at their global positions, zeros
    /// elsewhere: for dims mostly padding (an edge row or two over many
    /// tiles), where it moves less than gathering the padded tiles.
    SumGather { dim: usize, to: Grid },
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
    // A dim that is mostly padding summed whole first, then the rest.
    if best.cost > 0 {
        for a in src.tiled_dims() {
            let t = src.tiles(a);
            if tgt.tiles(a) != 1 || 2 * dims[a] > t * tile_size(dims[a], t) {
                continue;
            }
            let Some(to) = grids.gathered(src, &[(a, t)]) else {
                continue;
            };
            let mut sg = Plan {
                steps: vec![Step::SumGather {
                    dim: a,
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
    (a2a, cur)
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
            Step::Permute { to } => emit_permute(b, x, &cur, to),
            Step::SlicePermute { via, to } => emit_slice_permute(b, x, &cur, via, to, dims)?,
            Step::Slice { to } => emit_slice(b, x, &cur, to, dims)?,
            Step::SumGather { dim, .. } => emit_sum_gather(b, x, &cur, *dim, dims)?,
        };
        cur = match step {
            Step::Gather { to, .. }
            | Step::AllToAll { to, .. }
            | Step::Permute { to }
            | Step::SlicePermute { to, .. }
            | Step::Slice { to }
            | Step::SumGather { to, .. } => to.clone(),
        };
    }
    Ok(x)
}

/// See [`Step::SumGather`]: the local tile (`ts` rows of dim `a`) padded
/// by `n` zero rows on both sides, the window of the `n` global rows taken
/// at each device's offset (tiles wholly in the padding take zeros), then
/// summed over the tiles of `a`.
fn emit_sum_gather(
    b: &mut Builder<'_>,
    x: InstrId,
    cur: &Grid,
    a: usize,
    dims: &[i64],
) -> Result<InstrId, SpmdError> {
    let t = cur.tiles(a);
    let n = dims[a];
    let ts = tile_size(n, t);
    let local = b.dims(x);
    if local.get(a) != Some(&ts) {
        return Err(SpmdError::Invalid(
            "sum-gather of a buffer that is not a tile".into(),
        ));
    }
    let mut lo_hi = vec![(0, 0); local.len()];
    lo_hi[a] = (n, n);
    let padded = b.pad_zero(x, &lo_hi)?;
    let starts: Vec<i64> = (0..t).map(|i| n - i * ts).collect();
    let table = b.ctx.cache.grids.per_coord(cur, a, &starts);
    let mut offsets = Vec::with_capacity(local.len());
    for d in 0..local.len() {
        offsets.push(if d == a {
            b.table(&table)
        } else {
            b.scalar(xla_hlo_ir::PrimitiveType::S32, 0)
        });
    }
    let mut sizes = local;
    sizes[a] = n;
    let placed = b.dynamic_slice(padded, offsets, &sizes);
    let groups = b.ctx.cache.grids.factor_groups(cur, &[(a, t)]);
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
