//! Dot and convolution: both are einsums over an iteration space (batch,
//! lhs-free, rhs-free and contracted dims). A partitioning is a grid over
//! that space; the operand and output grids are its projections. Candidate
//! iteration grids come from the output, from each operand and from
//! combinations of them; each is costed as the bytes to reshard the
//! operands plus the bytes to combine partial sums (all-reduce, or a
//! reduce-scatter onto an output dim when that leaves the result closer to
//! the wanted sharding) plus the bytes to reshard the result. The cheapest
//! wins. This covers XLA's batch-parallel, non-contracting and contracting
//! strategies on 1-D to 3-D meshes.
//!
//! Convolutions use the same machinery for batch and feature dims; sharded
//! spatial dims get their input window through a halo exchange
//! (`exchange::exchange`), the kernel's spatial dims stay whole.
//!
//! Invariant: uneven contracted dims are masked to zero in both operands
//! before the local dot, so padding never reaches a sum.

use crate::consistent;
use crate::error::SpmdError;
use crate::grid::{local_dims, Grid, GridCache};
use crate::helpers::{mask_padding, HandlerResult};
use crate::part::Part;
use crate::value::{PValue, ValueSharding};
use std::rc::Rc;
use xla_hlo_ir::{AttrKey, AttrValue, HloInstruction, Opcode};

/// Emits the local op: `(part, lhs, lhs grid, rhs, rhs grid, result sharding)`.
pub type EmitFn<'f> = dyn FnMut(
        &mut Part<'_, '_>,
        xla_hlo_ir::InstrId,
        &Grid,
        xla_hlo_ir::InstrId,
        &Grid,
        &ValueSharding,
    ) -> Result<PValue, SpmdError>
    + 'f;

/// An einsum's dim mappings into its iteration space.
pub struct Einsum {
    /// Iteration-space rank.
    pub ni: usize,
    /// For each lhs / rhs / output dim, its iteration dim.
    pub lhs: Vec<usize>,
    pub rhs: Vec<usize>,
    pub out: Vec<usize>,
    /// Contracted iteration dims (partial sums when tiled).
    pub contracted: Vec<usize>,
    /// Iteration dims that must stay untiled.
    pub whole: Vec<usize>,
}

enum Post {
    None,
    AllReduce,
    ReduceScatter(usize, Grid),
}

fn elems(d: &[i64]) -> u64 {
    d.iter().map(|&x| x.max(0) as u64).product()
}

fn project(grids: &GridCache, i: &Grid, dims: &[usize]) -> Grid {
    let map: Vec<Option<usize>> = dims.iter().map(|&d| Some(d)).collect();
    grids.remap(i, &map)
}

fn lift(grids: &GridCache, g: &Grid, dims: &[usize], ni: usize) -> Grid {
    let map: Vec<Option<usize>> = (0..ni).map(|i| dims.iter().position(|&d| d == i)).collect();
    grids.remap(g, &map)
}

/// The layout an einsum is computed in (iteration-space grid), what
/// follows the local op, and the bytes per device it all costs.
pub struct Choice {
    i: Grid,
    post: Post,
    pub cost: u64,
    /// Consistent mode ruled out the layout the default mode would take (a
    /// split of the contraction that does not reproduce the order).
    relaid_out: bool,
}

/// Whether consistent mode constrains how `instr`'s contraction is split:
/// the mode is on and its result type sums order-sensitively.
fn consistent_order_matters(p: &Part<'_, '_>, instr: &HloInstruction) -> bool {
    p.b.ctx.consistent
        && instr
            .shape
            .element_type()
            .is_some_and(consistent::order_sensitive)
}

/// The iteration-space size of each contracted dim (in `e.contracted`'s
/// order), read from the operand that has it.
fn contracted_sizes(e: &Einsum, lhs: &[i64], rhs: &[i64]) -> Vec<i64> {
    e.contracted
        .iter()
        .map(|&d| {
            let from =
                |map: &[usize], dims: &[i64]| map.iter().position(|&x| x == d).map(|a| dims[a]);
            from(&e.lhs, lhs).or_else(|| from(&e.rhs, rhs)).unwrap_or(1)
        })
        .collect()
}

/// In consistent mode, layout `c` with its contracted dims replicated when
/// splitting them would not reproduce the single-device order (see
/// `consistent`), and whether that happened.
fn consistent_layout(
    p: &Part<'_, '_>,
    instr: &HloInstruction,
    e: &Einsum,
    sizes: &[i64],
    c: Grid,
) -> (Grid, bool) {
    let Some(ty) = instr
        .shape
        .element_type()
        .filter(|_| consistent_order_matters(p, instr))
    else {
        return (c, false);
    };
    let tiles: Vec<i64> = e.contracted.iter().map(|&d| c.tiles(d)).collect();
    if tiles.iter().all(|&t| t == 1)
        || (consistent::holds_accumulation(ty) && consistent::split_is_exact(sizes, &tiles))
    {
        return (c, false);
    }
    (p.grids().replicate_dims(&c, &e.contracted), true)
}

/// Partitions an einsum-like op: `emit(p, lhs, rhs, out_vs)` emits the
/// local op on local operands for local result sharding `out_vs`.
pub fn einsum(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    e: &Einsum,
    lhs: &PValue,
    rhs: &PValue,
    out: &Grid,
    emit: &mut EmitFn<'_>,
) -> HandlerResult {
    match einsum_plan(p, instr, e, lhs, rhs, out) {
        Some(choice) => einsum_emit(p, instr, e, lhs, rhs, choice, emit),
        None => Ok(None),
    }
}

/// The cheapest layout for an einsum (see [`einsum`]), or `None`.
pub fn einsum_plan(
    p: &Part<'_, '_>,
    instr: &HloInstruction,
    e: &Einsum,
    lhs: &PValue,
    rhs: &PValue,
    out: &Grid,
) -> Option<Choice> {
    let (Some(lg), Some(rg)) = (lhs.vs.grid().cloned(), rhs.vs.grid().cloned()) else {
        return None;
    };
    let ni = e.ni;
    let out_shape = &instr.shape;
    let bytes = out_shape
        .element_type()
        .map(|t| t.byte_width().max(1))
        .unwrap_or(4) as u64;
    let i_o = lift(p.grids(), out, &e.out, ni);
    let i_l = lift(p.grids(), &lg, &e.lhs, ni);
    let i_r = lift(p.grids(), &rg, &e.rhs, ni);
    let l_only: Vec<usize> = (0..ni)
        .filter(|d| e.lhs.contains(d) && !e.rhs.contains(d))
        .collect();
    let r_only: Vec<usize> = (0..ni)
        .filter(|d| e.rhs.contains(d) && !e.lhs.contains(d))
        .collect();
    let mut cands = vec![i_o.clone(), i_l.clone(), i_r.clone()];
    cands.extend(p.grids().merge(&i_l, &i_r, &r_only));
    cands.extend(p.grids().merge(&i_r, &i_l, &l_only));
    cands.extend(p.grids().merge(&i_o, &i_l, &e.contracted));
    cands.extend(p.grids().merge(&i_o, &i_r, &e.contracted));
    if let Some(m) = p.grids().merge(&i_l, &i_r, &r_only) {
        let non_k: Vec<usize> = (0..ni).filter(|d| !e.contracted.contains(d)).collect();
        cands.extend(p.grids().merge(&m, &i_o, &non_k));
    }
    // Each layout with whether the default mode and consistent mode may
    // take it (they differ only in consistent mode, for splits of the
    // contraction that would not reproduce the single-device order).
    let mut layouts: Vec<(Grid, bool, bool)> = Vec::with_capacity(cands.len() + 2);
    let mut add = |g: Grid, in_default: bool, in_consistent: bool| match layouts
        .iter_mut()
        .find(|l| l.0 == g)
    {
        Some(l) => {
            l.1 |= in_default;
            l.2 |= in_consistent;
        }
        None => layouts.push((g, in_default, in_consistent)),
    };
    let sizes = contracted_sizes(e, lhs.shape.dims(), rhs.shape.dims());
    for c in cands {
        let c = if e.whole.iter().any(|&d| c.tiles(d) > 1) {
            p.grids().replicate_dims(&c, &e.whole)
        } else {
            c
        };
        match consistent_layout(p, instr, e, &sizes, c.clone()) {
            (whole, true) => {
                add(c, true, false);
                add(whole, false, true);
            }
            (c, false) => add(c, true, true),
        }
    }
    let mut best: Option<(Choice, i64)> = None;
    let mut best_default: Option<(u64, i64, bool)> = None;
    for (c, in_default, in_consistent) in layouts {
        let il = project(p.grids(), &c, &e.lhs);
        let ir = project(p.grids(), &c, &e.rhs);
        let mut cost = p.cost(lhs, &il) + p.cost(rhs, &ir);
        let io = project(p.grids(), &c, &e.out);
        let k_tiled: Vec<usize> = e
            .contracted
            .iter()
            .copied()
            .filter(|&d| c.tiles(d) > 1)
            .collect();
        let g: i64 = k_tiled.iter().map(|&d| c.tiles(d)).product();
        let post = if g == 1 {
            cost += p.cost_of(out_shape, &io, out);
            Post::None
        } else {
            let lo = elems(&local_dims(out_shape.dims(), &io));
            let mut bp = (lo * bytes + p.cost_of(out_shape, &io, out), Post::AllReduce);
            for (od, &x) in out_shape.dims().iter().enumerate() {
                let t = io.tiles(od);
                if x % (t * g) != 0 {
                    continue;
                }
                let rs = io.reduce_scattered(&c, &k_tiled, od);
                let Some(rs) = rs else { continue };
                let cc = lo / g as u64 * bytes + p.cost_of(out_shape, &rs, out);
                if cc < bp.0 {
                    bp = (cc, Post::ReduceScatter(od, rs));
                }
            }
            cost += bp.0;
            bp.1
        };
        let tiles = c.num_tiles();
        if in_default
            && best_default.is_none_or(|(bc, bt, _)| cost < bc || (cost == bc && tiles > bt))
        {
            best_default = Some((cost, tiles, !in_consistent));
        }
        if !in_consistent {
            continue;
        }
        let better = match &best {
            None => true,
            Some((b, bt)) => cost < b.cost || (cost == b.cost && tiles > *bt),
        };
        if better {
            let choice = Choice {
                i: c,
                post,
                cost,
                relaid_out: false,
            };
            best = Some((choice, tiles));
        }
    }
    if let (Some((choice, _)), Some((_, _, true))) = (best.as_mut(), best_default) {
        choice.relaid_out = true;
    }
    best.map(|b| b.0)
}

/// Emits an einsum in the layout `choice` (from [`einsum_plan`]).
pub fn einsum_emit(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    e: &Einsum,
    lhs: &PValue,
    rhs: &PValue,
    choice: Choice,
    emit: &mut EmitFn<'_>,
) -> HandlerResult {
    let c = choice.i;
    if choice.relaid_out {
        log::info!(
            "consistent mode: {} reduces its contracted dims whole (the default split would not reproduce the single-device order)",
            instr.name
        );
        p.note(instr, consistent::RELAYOUT_NOTE);
    }
    let il = project(p.grids(), &c, &e.lhs);
    let ir = project(p.grids(), &c, &e.rhs);
    let io = project(p.grids(), &c, &e.out);
    let x = p.reshard_to_grid(lhs, &il)?;
    let y = p.reshard_to_grid(rhs, &ir)?;
    // Mask uneven contracted dims.
    let k_lhs: Vec<usize> = (0..e.lhs.len())
        .filter(|&a| e.contracted.contains(&e.lhs[a]))
        .collect();
    let k_rhs: Vec<usize> = (0..e.rhs.len())
        .filter(|&a| e.contracted.contains(&e.rhs[a]))
        .collect();
    let zx = p.b.zero_of(x)?;
    let x = mask_padding(p, x, &il, lhs.shape.dims(), &k_lhs, zx)?;
    let zy = p.b.zero_of(y)?;
    let y = mask_padding(p, y, &ir, rhs.shape.dims(), &k_rhs, zy)?;
    let local = emit(p, x, &il, y, &ir, &ValueSharding::Grid(io.clone()))?;
    let k_tiled: Vec<(usize, i64)> = e
        .contracted
        .iter()
        .copied()
        .filter(|&d| c.tiles(d) > 1)
        .map(|d| (d, c.tiles(d)))
        .collect();
    match choice.post {
        Post::None => Ok(Some(local)),
        Post::AllReduce => {
            let groups = p.grids().factor_groups(&c, &k_tiled);
            let id = p.b.all_reduce(local.id, &groups, Opcode::Add)?;
            Ok(Some(PValue { id, ..local }))
        }
        Post::ReduceScatter(od, rs) => {
            let groups = p.grids().factor_groups(&c, &k_tiled);
            let id = p.b.reduce_scatter(local.id, od, &groups, Opcode::Add)?;
            Ok(Some(PValue {
                id,
                shape: Rc::new(instr.shape.clone()),
                vs: ValueSharding::Grid(rs),
            }))
        }
    }
}

/// `dot`.
pub fn dot(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &ValueSharding) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    let lhs = p.operand(instr, 0)?;
    let rhs = p.operand(instr, 1)?;
    let dn = instr.dot_dimension_numbers();
    let (rl, rr) = (lhs.shape.rank(), rhs.shape.rank());
    let to_us = |v: &[i64]| -> Vec<usize> { v.iter().map(|&d| d as usize).collect() };
    let (lb, rb, lc, rc) = (
        to_us(&dn.lhs_batch),
        to_us(&dn.rhs_batch),
        to_us(&dn.lhs_contracting),
        to_us(&dn.rhs_contracting),
    );
    if lb.len() != rb.len()
        || lc.len() != rc.len()
        || lb.iter().chain(&lc).any(|&d| d >= rl)
        || rb.iter().chain(&rc).any(|&d| d >= rr)
    {
        return Ok(None);
    }
    let lf: Vec<usize> = (0..rl)
        .filter(|d| !lb.contains(d) && !lc.contains(d))
        .collect();
    let rf: Vec<usize> = (0..rr)
        .filter(|d| !rb.contains(d) && !rc.contains(d))
        .collect();
    let (nb, nm, nn, nk) = (lb.len(), lf.len(), rf.len(), lc.len());
    let ni = nb + nm + nn + nk;
    if nb + nm + nn != instr.shape.rank() {
        return Ok(None);
    }
    let mut lmap = vec![0usize; rl];
    let mut rmap = vec![0usize; rr];
    for i in 0..nb {
        lmap[lb[i]] = i;
        rmap[rb[i]] = i;
    }
    for (j, &d) in lf.iter().enumerate() {
        lmap[d] = nb + j;
    }
    for (j, &d) in rf.iter().enumerate() {
        rmap[d] = nb + nm + j;
    }
    for k in 0..nk {
        lmap[lc[k]] = nb + nm + nn + k;
        rmap[rc[k]] = nb + nm + nn + k;
    }
    let e = Einsum {
        ni,
        lhs: lmap,
        rhs: rmap,
        out: (0..nb + nm + nn).collect(),
        contracted: (nb + nm + nn..ni).collect(),
        whole: vec![],
    };
    p.note(instr, "dot");
    let mut emit = |p: &mut Part<'_, '_>, x, _: &Grid, y, _: &Grid, vs: &ValueSharding| {
        p.emit_local(instr, vec![x, y], vs)
    };
    if consistent_order_matters(p, instr) {
        // Unreduced partial sums would be summed later in an order this
        // mode cannot reproduce, so they are not kept.
        let narrow = einsum_plan(p, instr, &e, &lhs, &rhs, &out);
        let narrow_cost = narrow.as_ref().map_or(u64::MAX, |c| c.cost);
        if let Some(v) = dot_accumulating_wide(p, instr, &e, &lhs, &rhs, &out, narrow_cost)? {
            return Ok(Some(v));
        }
        return match narrow {
            Some(choice) => einsum_emit(p, instr, &e, &lhs, &rhs, choice, &mut emit),
            None => Ok(None),
        };
    }
    if let Some(groups) = p.unreduced_target(instr)? {
        if let Some(v) = dot_unreduced(p, instr, &e, &lhs, &rhs, &out, &groups, &mut emit)? {
            return Ok(Some(v));
        }
    }
    einsum(p, instr, &e, &lhs, &rhs, &out, &mut emit)
}

/// Consistent mode, a dot with a bf16/f16 (or narrower float) result: its
/// contraction may stay split when the partial dots keep f32 results, are
/// all-reduced in f32 and rounded once after (the single-device dot rounds
/// its f32 accumulation once too). Taken when that costs less than
/// `narrow_cost`, the narrow dot's layout (whose split contraction must be
/// gathered); `None` otherwise.
fn dot_accumulating_wide(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    e: &Einsum,
    lhs: &PValue,
    rhs: &PValue,
    out: &Grid,
    narrow_cost: u64,
) -> HandlerResult {
    let Some(ty) = instr.shape.element_type() else {
        return Ok(None);
    };
    if !ty.is_float() || consistent::holds_accumulation(ty) {
        return Ok(None);
    }
    let mut wide = instr.clone();
    wide.shape = instr
        .shape
        .with_element_type(xla_hlo_ir::PrimitiveType::F32);
    let Some(wide_choice) = einsum_plan(p, &wide, e, lhs, rhs, out) else {
        return Ok(None);
    };
    let splits_contraction = e.contracted.iter().any(|&d| wide_choice.i.tiles(d) > 1);
    if !splits_contraction || wide_choice.cost >= narrow_cost {
        return Ok(None);
    }
    log::info!(
        "consistent mode: {} keeps f32 partial sums of its split contraction, rounded to {ty} after the all-reduce",
        instr.name
    );
    p.note(instr, consistent::F32_PARTIAL_SUMS_NOTE);
    let mut emit = |p: &mut Part<'_, '_>, x, _: &Grid, y, _: &Grid, vs: &ValueSharding| {
        p.emit_local(&wide, vec![x, y], vs)
    };
    let Some(v) = einsum_emit(p, &wide, e, lhs, rhs, wide_choice, &mut emit)? else {
        return Ok(None);
    };
    let local_wide = p.b.shape(v.id).clone();
    let id = p.b.add(
        "convert",
        Opcode::Convert,
        local_wide.with_element_type(ty),
        vec![v.id],
        vec![],
    );
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: v.vs,
    }))
}

/// A dot whose sharding is unreduced over `groups`: when the cheapest
/// layout splits the contracted dims over exactly those groups and leaves
/// the result in the wanted layout, the all-reduce is left out and the
/// result recorded as partial sums (see `unreduced`); `None` otherwise.
#[allow(clippy::too_many_arguments)]
fn dot_unreduced(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    e: &Einsum,
    lhs: &PValue,
    rhs: &PValue,
    out: &Grid,
    groups: &crate::grid::Groups,
    emit: &mut EmitFn<'_>,
) -> HandlerResult {
    let Some(mut choice) = einsum_plan(p, instr, e, lhs, rhs, out) else {
        return Ok(None);
    };
    if !matches!(choice.post, Post::AllReduce) || &project(p.grids(), &choice.i, &e.out) != out {
        return Ok(None);
    }
    let k_tiled: Vec<(usize, i64)> = e
        .contracted
        .iter()
        .copied()
        .filter(|&d| choice.i.tiles(d) > 1)
        .map(|d| (d, choice.i.tiles(d)))
        .collect();
    let reduced_over = p.grids().factor_groups(&choice.i, &k_tiled);
    if !crate::unreduced::same_groups(&reduced_over, groups) {
        return Ok(None);
    }
    choice.post = Post::None;
    let Some(v) = einsum_emit(p, instr, e, lhs, rhs, choice, emit)? else {
        return Ok(None);
    };
    p.partial.insert(v.id, groups.clone());
    Ok(Some(v))
}

/// `convolution`: batch, output feature and input feature dims as an
/// einsum (grouped convolutions keep their grouped dims whole); sharded
/// spatial dims via halo exchange.
pub fn convolution(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    let fgc = instr.int_attr(AttrKey::FeatureGroupCount).unwrap_or(1);
    let bgc = instr.int_attr(AttrKey::BatchGroupCount).unwrap_or(1);
    // A convolution without spatial dims (a dot written as one) has no
    // window attribute.
    let Some(dn) = instr.conv_dimension_numbers().cloned() else {
        return Ok(None);
    };
    let win = instr.window().cloned().unwrap_or_default();
    let lhs = p.operand(instr, 0)?;
    let rhs = p.operand(instr, 1)?;
    let ns = dn.input_spatial.len();
    if dn.kernel_spatial.len() != ns || dn.output_spatial.len() != ns || win.dims.len() != ns {
        return Ok(None);
    }
    // Iteration dims: 0 batch, 1 out feature, 2 in feature, 3.. out spatial,
    // 3+ns.. kernel spatial.
    let ni = 3 + 2 * ns;
    let (rl, rr, ro) = (lhs.shape.rank(), rhs.shape.rank(), instr.shape.rank());
    let in_range = |d: i64, r: usize| usize::try_from(d).map(|d| d < r).unwrap_or(false);
    if !in_range(dn.input_batch, rl)
        || !in_range(dn.input_feature, rl)
        || !in_range(dn.kernel_input_feature, rr)
        || !in_range(dn.kernel_output_feature, rr)
        || !in_range(dn.output_batch, ro)
        || !in_range(dn.output_feature, ro)
        || dn.input_spatial.iter().any(|&d| !in_range(d, rl))
        || dn.kernel_spatial.iter().any(|&d| !in_range(d, rr))
        || dn.output_spatial.iter().any(|&d| !in_range(d, ro))
    {
        return Ok(None);
    }
    let mut lmap = vec![0usize; rl];
    let mut rmap = vec![0usize; rr];
    let mut omap = vec![0usize; ro];
    let u = |d: i64| d as usize;
    lmap[u(dn.input_batch)] = 0;
    lmap[u(dn.input_feature)] = 2;
    rmap[u(dn.kernel_input_feature)] = 2;
    rmap[u(dn.kernel_output_feature)] = 1;
    omap[u(dn.output_batch)] = 0;
    omap[u(dn.output_feature)] = 1;
    for s in 0..ns {
        lmap[u(dn.input_spatial[s])] = 3 + s;
        rmap[u(dn.kernel_spatial[s])] = 3 + ns + s;
        omap[u(dn.output_spatial[s])] = 3 + s;
    }
    // Spatial dims sharded in the output use a halo exchange when the window
    // allows it; otherwise they must be whole.
    // With base (lhs) dilation every output tile must start at the same
    // phase of the dilated input, for one local convolution to serve all
    // tiles; the tile counts that can occur are the output's and the
    // input's (the einsum's candidate grids take the dim from either).
    let out_dims = instr.shape.dims().to_vec();
    let same_phase = |s: usize, t: i64| {
        let w = &win.dims[s];
        let so = crate::grid::tile_size(out_dims[u(dn.output_spatial[s])], t);
        t <= 1 || (so * w.stride) % w.lhs_dilation == 0
    };
    let mut halo_dims = Vec::new();
    for s in 0..ns {
        let od = u(dn.output_spatial[s]);
        let lhs_tiles = lhs.vs.grid().map_or(1, |g| g.tiles(u(dn.input_spatial[s])));
        // A reversed window reads the same input rows (only the kernel is
        // flipped), so it takes the same halo exchange, when its span fits
        // in an input tile (a wider reversed window is an einsum written as
        // a convolution, whose window dims are better kept whole).
        let w = &win.dims[s];
        let span = (w.size - 1) * w.rhs_dilation + 1;
        let input_tile = crate::grid::tile_size(
            lhs.shape.dims()[u(dn.input_spatial[s])],
            out.tiles(od).max(lhs_tiles),
        );
        if out.tiles(od) > 1
            && (!w.reversal || span <= input_tile)
            && same_phase(s, out.tiles(od))
            && same_phase(s, lhs_tiles)
        {
            halo_dims.push(s);
        }
    }
    let mut whole: Vec<usize> = (0..ns).map(|s| 3 + ns + s).collect();
    // Grouped convolutions keep the grouped dims whole.
    if fgc != 1 {
        whole.extend([1, 2]);
    }
    if bgc != 1 {
        whole.extend([0, 1]);
    }
    whole.extend((0..ns).filter(|s| !halo_dims.contains(s)).map(|s| 3 + s));
    let e = Einsum {
        ni,
        lhs: lmap,
        rhs: rmap,
        out: omap,
        contracted: {
            let mut c = vec![2];
            c.extend((0..ns).map(|s| 3 + ns + s));
            c
        },
        whole,
    };
    // Grouped convolutions split by groups when that costs no more than
    // the general layout (which keeps the grouped dims whole).
    if (fgc > 1) != (bgc > 1) {
        let general = einsum_plan(p, instr, &e, &lhs, &rhs, &out).map_or(u64::MAX, |c| c.cost);
        let (groups, on_batch) = if bgc > 1 { (bgc, true) } else { (fgc, false) };
        let args = (groups, on_batch, general);
        if let Some(v) = grouped_conv(p, instr, &out, &dn, &win, &lhs, &rhs, args)? {
            return Ok(Some(v));
        }
    }
    // A sharded kernel window splits the contraction in an order consistent
    // mode cannot reproduce.
    if fgc == 1 && bgc == 1 && !consistent_order_matters(p, instr) {
        if let Some(v) = kernel_window_sharded(p, instr, &e, &dn, &win, &lhs, &rhs, &out)? {
            return Ok(Some(v));
        }
    }
    p.note(
        instr,
        if halo_dims.is_empty() {
            "convolution"
        } else {
            "convolution-halo"
        },
    );
    let lhs_dims = lhs.shape.dims().to_vec();
    einsum(p, instr, &e, &lhs, &rhs, &out, &mut |p, x, lg, y, _, vs| {
        let ValueSharding::Grid(io) = vs else {
            return Err(SpmdError::Invalid(
                "convolution output is not an array".into(),
            ));
        };
        let (x, w) = conv_halos(p, x, lg, io, (&dn, &win), &lhs_dims, &out_dims, &halo_dims)?;
        local_conv(p, instr, (x, y), w, None, vs)
    })
}

/// The local convolution of `instr` on local operands, with the local
/// `window` (and feature group count), laid out by `vs`; its shape is
/// checked against the layout's local shape.
fn local_conv(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    (x, y): (xla_hlo_ir::InstrId, xla_hlo_ir::InstrId),
    window: xla_hlo_ir::attrs::Window,
    group_count: Option<(AttrKey, i64)>,
    vs: &ValueSharding,
) -> Result<PValue, SpmdError> {
    let want = crate::value::local_shape(&instr.shape, vs);
    let id = p.clone_instr(instr, vec![x, y], want.clone());
    let local = p.b.comp.instr_mut(id);
    if !window.dims.is_empty() {
        local.set_attr(AttrKey::Window, AttrValue::Window(Box::new(window)));
    }
    if let Some((key, g)) = group_count {
        local.set_attr(key, AttrValue::Int(g));
    }
    let got = p.infer(p.b.comp.instr(id), &[p.b.shape(x), p.b.shape(y)])?;
    if got.dims() != want.dims() {
        return Err(SpmdError::Invalid(format!(
            "local convolution shape {got} differs from {want}"
        )));
    }
    Ok(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: vs.clone(),
    })
}

/// A convolution whose kernel spatial (window) dims are tiled, as in the
/// kernel gradient of a convolution (the "kernel" there is the output
/// gradient, its window the whole image): each device convolves its part
/// of the window with the input rows that part reads (a window exchange of
/// the input), giving a partial sum of the whole output, then an
/// all-reduce (or reduce-scatter) over the window's tiles, as XLA does.
/// The input's spatial dims follow the window's tiling; output spatial
/// dims stay whole. Chosen only when its bytes, halos included, are below
/// the plain strategy's (`e`, which keeps window dims whole).
#[allow(clippy::too_many_arguments)]
fn kernel_window_sharded(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    e: &Einsum,
    dn: &xla_hlo_ir::attrs::ConvDimensionNumbers,
    win: &xla_hlo_ir::attrs::Window,
    lhs: &PValue,
    rhs: &PValue,
    out: &Grid,
) -> HandlerResult {
    let u = |d: i64| d as usize;
    let ns = dn.input_spatial.len();
    let kernel_dims = rhs.shape.dims().to_vec();
    let out_dims = instr.shape.dims().to_vec();
    let lhs_dims = lhs.shape.dims().to_vec();
    // Pointwise spatial dims (window 1, stride 1, no padding or dilation)
    // read input position o for output position o: they tile like batch
    // dims; the others take the window's tiling.
    let pointwise: Vec<bool> = (0..ns)
        .map(|s| {
            let w = &win.dims[s];
            w.size == 1
                && w.stride == 1
                && w.padding_low == 0
                && w.padding_high == 0
                && w.rhs_dilation == 1
                && lhs_dims[u(dn.input_spatial[s])] == out_dims[u(dn.output_spatial[s])]
        })
        .collect();
    let mut lmap = e.lhs.clone();
    for s in (0..ns).filter(|&s| !pointwise[s]) {
        lmap[u(dn.input_spatial[s])] = 3 + ns + s;
    }
    let eb = Einsum {
        ni: e.ni,
        lhs: lmap,
        rhs: e.rhs.clone(),
        out: e.out.clone(),
        contracted: e.contracted.clone(),
        whole: (0..ns).filter(|&s| !pointwise[s]).map(|s| 3 + s).collect(),
    };
    // Window tile j of dim s reads input [j*ks*rd - pad_low, ... + len).
    // Reversed, its kernel rows serve window positions K - (j+1)*ks .. K -
    // j*ks (the tile's padding rows the first of them, against zeros).
    let window = |s: usize, t: i64| {
        let w = &win.dims[s];
        let kernel_size = kernel_dims[u(dn.kernel_spatial[s])];
        let ks = crate::grid::tile_size(kernel_size, t);
        let o = out_dims[u(dn.output_spatial[s])];
        let starts: Vec<i64> = (0..t)
            .map(|j| {
                let first = if w.reversal {
                    kernel_size - (j + 1) * ks
                } else {
                    j * ks
                };
                first * w.rhs_dilation - w.padding_low
            })
            .collect();
        (
            ks,
            starts,
            (o - 1) * w.stride + (ks - 1) * w.rhs_dilation + 1,
        )
    };
    let Some(b) = einsum_plan(p, instr, &eb, lhs, rhs, out) else {
        return Ok(None);
    };
    let il = project(p.grids(), &b.i, &eb.lhs);
    let mut halo = 0;
    let mut tiled = false;
    for s in (0..ns).filter(|&s| !pointwise[s]) {
        let ld = u(dn.input_spatial[s]);
        let t = il.tiles(ld);
        if t > 1 {
            // A tiled window must read undilated input.
            if win.dims[s].lhs_dilation != 1 {
                return Ok(None);
            }
            tiled = true;
            let (_, starts, len) = window(s, t);
            halo += crate::exchange::exchange_cost(p, &il, &lhs.shape, ld, &starts, len);
        }
    }
    let plain = einsum_plan(p, instr, e, lhs, rhs, out).map_or(u64::MAX, |a| a.cost);
    if !tiled || b.cost + halo >= plain {
        return Ok(None);
    }
    p.note(instr, "convolution-window-sharded");
    einsum_emit(p, instr, &eb, lhs, rhs, b, &mut |p, x, lg, y, _, vs| {
        let mut x = x;
        let mut w = win.clone();
        for s in 0..ns {
            let ld = u(dn.input_spatial[s]);
            let t = lg.tiles(ld);
            if t <= 1 || pointwise[s] {
                continue;
            }
            let (ks, starts, len) = window(s, t);
            let zero = p.b.zero_of(x)?;
            x = crate::exchange::exchange(p, x, lg, &lhs_dims, ld, &starts, len, Some(zero))?;
            w.dims[s].size = ks;
            w.dims[s].padding_low = 0;
            w.dims[s].padding_high = 0;
        }
        local_conv(p, instr, (x, y), w, None, vs)
    })
}

/// Exchanges the input windows of a convolution's output-tiled spatial
/// dims `halo_dims` (input `x` laid out by `lg`, output by `io`): each
/// output tile gets the input rows its windows read (zeros outside the
/// input), and the returned window has the local padding that makes one
/// local convolution serve every tile. With base dilation, every tile must
/// start at the same phase of the dilated input (checked by the callers'
/// `same_phase`; an error otherwise).
#[allow(clippy::too_many_arguments)]
fn conv_halos(
    p: &mut Part<'_, '_>,
    x: xla_hlo_ir::InstrId,
    lg: &Grid,
    io: &Grid,
    (dn, win): (
        &xla_hlo_ir::attrs::ConvDimensionNumbers,
        &xla_hlo_ir::attrs::Window,
    ),
    lhs_dims: &[i64],
    out_dims: &[i64],
    halo_dims: &[usize],
) -> Result<(xla_hlo_ir::InstrId, xla_hlo_ir::attrs::Window), SpmdError> {
    let u = |d: i64| d as usize;
    let mut x = x;
    let mut w = win.clone();
    for &s in halo_dims {
        let ld = u(dn.input_spatial[s]);
        let od = u(dn.output_spatial[s]);
        let t = io.tiles(od);
        if t <= 1 {
            continue;
        }
        let wd = win.dims[s];
        let so = crate::grid::tile_size(out_dims[od], t);
        let span = (wd.size - 1) * wd.rhs_dilation + 1;
        // Output tile i reads the dilated, padded input at
        // [i*so*stride - pad_low, ... + dilated_len).
        let dilated_len = (so - 1) * wd.stride + span;
        let dilated_start = |i: i64| i * so * wd.stride - wd.padding_low;
        // The input rows whose dilated positions fall in that window: from
        // the first at or after its start; the window then begins
        // `pad_low` positions before that row (the same for every tile)
        // and ends `pad_high` positions after the last.
        let l = wd.lhs_dilation.max(1);
        let first_row = |i: i64| -((-dilated_start(i)).div_euclid(l));
        let pad_low = first_row(0) * l - dilated_start(0);
        if (0..t).any(|i| first_row(i) * l - dilated_start(i) != pad_low) {
            return Err(SpmdError::Invalid(
                "base-dilated convolution tiles start at different phases".into(),
            ));
        }
        let len = (dilated_len - 1 - pad_low) / l + 1;
        let pad_high = dilated_len - pad_low - ((len - 1) * l + 1);
        let starts: Vec<i64> = (0..t).map(first_row).collect();
        let zero = p.b.zero_of(x)?;
        x = crate::exchange::exchange(p, x, lg, lhs_dims, ld, &starts, len, Some(zero))?;
        w.dims[s].padding_low = pad_low;
        w.dims[s].padding_high = pad_high;
    }
    Ok((x, w))
}

/// A grouped convolution (`feature_group_count` or `batch_group_count`
/// G) whose output features are sharded t-way with t dividing G: each
/// device convolves its G/t groups (the grouped input dim, input features
/// or input batch, and the kernel output features sharded like the output
/// features; kernel input features whole), with no communication beyond
/// bringing the operands to that layout; tiled output spatial dims add a
/// halo exchange of the input, as in the general path. The layout is the
/// cheapest of the output's and those the operands' grouped dims give
/// (the operands aligned with the lhs or the rhs, as XLA's
/// `PartitionConvolutionGroupOnFeature`/`OnBatch` do); with batch groups
/// the output batch is kept whole (each of its rows sums every group).
/// `None` when it would cost more than `bound`.
#[allow(clippy::too_many_arguments)]
fn grouped_conv(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    out: &Grid,
    dn: &xla_hlo_ir::attrs::ConvDimensionNumbers,
    win: &xla_hlo_ir::attrs::Window,
    lhs: &PValue,
    rhs: &PValue,
    (groups, on_batch, bound): (i64, bool, u64),
) -> HandlerResult {
    let u = |d: i64| d as usize;
    let of = u(dn.output_feature);
    let ob = u(dn.output_batch);
    let grouped_in = if on_batch {
        u(dn.input_batch)
    } else {
        u(dn.input_feature)
    };
    let c_in = lhs.shape.dims()[grouped_in];
    let c_out = rhs.shape.dims()[u(dn.kernel_output_feature)];
    let ns = dn.input_spatial.len();
    let out_dims = instr.shape.dims().to_vec();
    let ro = out_dims.len();
    // Candidate output layouts: the output's, and the grouped dims' tiles
    // of each operand moved to the output features.
    let mut cands: Vec<Grid> = vec![out.clone()];
    if let Some(lg) = lhs.vs.grid() {
        let mut map = vec![None; ro];
        map[of] = Some(grouped_in);
        if !on_batch {
            map[ob] = Some(u(dn.input_batch));
        }
        cands.push(p.grids().remap(lg, &map));
    }
    if let Some(rg) = rhs.vs.grid() {
        let mut map = vec![None; ro];
        map[of] = Some(u(dn.kernel_output_feature));
        cands.push(p.grids().remap(rg, &map));
    }
    let mut best: Option<(Grid, Grid, Grid, Vec<usize>, u64)> = None;
    for mut c in cands {
        if on_batch && c.tiles(ob) > 1 {
            c = p.grids().replicate_dims(&c, &[ob]);
        }
        let t = c.tiles(of);
        if t <= 1 || groups % t != 0 || c_in % t != 0 || c_out % t != 0 {
            continue;
        }
        // Tiled output spatial dims take a halo exchange, as in the
        // general path (the same conditions).
        let halo_dims: Vec<usize> = (0..ns)
            .filter(|&s| c.tiles(u(dn.output_spatial[s])) > 1)
            .collect();
        let halo_ok = halo_dims.iter().all(|&s| {
            let w = &win.dims[s];
            let t = c.tiles(u(dn.output_spatial[s]));
            let so = crate::grid::tile_size(out_dims[u(dn.output_spatial[s])], t);
            (so * w.stride) % w.lhs_dilation.max(1) == 0
        });
        if !halo_ok {
            continue;
        }
        let mut lmap = vec![None; lhs.shape.rank()];
        lmap[grouped_in] = Some(of);
        if !on_batch {
            lmap[u(dn.input_batch)] = Some(ob);
        }
        for &s in &halo_dims {
            lmap[u(dn.input_spatial[s])] = Some(u(dn.output_spatial[s]));
        }
        let mut rmap = vec![None; rhs.shape.rank()];
        rmap[u(dn.kernel_output_feature)] = Some(of);
        let lg = p.grids().remap(&c, &lmap);
        let rg = p.grids().remap(&c, &rmap);
        let cost = p.cost(lhs, &lg) + p.cost(rhs, &rg) + p.cost_of(&instr.shape, &c, out);
        if best.as_ref().is_none_or(|b| cost < b.4) {
            best = Some((c, lg, rg, halo_dims, cost));
        }
    }
    let Some((c, lg, rg, halo_dims, _)) = best.filter(|b| b.4 <= bound) else {
        return Ok(None);
    };
    let t = c.tiles(of);
    let x = p.reshard_to_grid(lhs, &lg)?;
    let y = p.reshard_to_grid(rhs, &rg)?;
    let (x, w) = conv_halos(
        p,
        x,
        &lg,
        &c,
        (dn, win),
        lhs.shape.dims(),
        instr.shape.dims(),
        &halo_dims,
    )?;
    let vs = ValueSharding::Grid(c);
    if on_batch {
        p.note(instr, "convolution-grouped-batch");
        let key = Some((AttrKey::BatchGroupCount, groups / t));
        return Ok(Some(local_conv(p, instr, (x, y), w, key, &vs)?));
    }
    p.note(instr, "convolution-grouped-features");
    let key = Some((AttrKey::FeatureGroupCount, groups / t));
    Ok(Some(local_conv(p, instr, (x, y), w, key, &vs)?))
}
