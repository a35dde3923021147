//! Windowed ops: slice, pad, reduce-window, select-and-scatter and
//! concatenate (with rotations, `jnp.roll`), built on the window
//! [`exchange`]: every device gets the input window its output tile needs
//! along each sharded dim, then computes its tile locally.
//!
//! Invariants: the operand is first resharded to the output's tiling, so
//! the device holding output tile `i` holds input tile `i`; windows are
//! uniform in size on every device; padding of uneven tiles never reaches
//! a valid output element (it is either masked or outside every window).

use crate::assemble::tile_pairs;
use crate::error::SpmdError;
use crate::exchange::{exchange, exchange_cost};
use crate::grid::{tile_size, Grid};
use crate::helpers::{cheapest, unsharded_candidates, HandlerResult};
use crate::part::Part;
use crate::value::{local_shape, PValue, ValueSharding};
use std::rc::Rc;
use xla_hlo_ir::attrs::PaddingDim;
use xla_hlo_ir::{AttrKey, AttrValue, HloInstruction, InstrId, Opcode, Shape};

/// The window each output tile of dim `a` reads when the dim has `t` tiles:
/// per-tile starts and the uniform length (`None`: not expressible).
type WindowFn<'f> = dyn Fn(usize, i64) -> Option<(Vec<i64>, i64)> + 'f;

/// Chooses the grid to compute a windowed op in (the output's, or the
/// operand's followed by a reshard of the result), reshards the operand to
/// it and exchanges the windows of its tiled dims. Returns the grid and the
/// local windows (dim `a` of the result has the window length where tiled).
fn windowed(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    out: &Grid,
    v: &PValue,
    window: &WindowFn<'_>,
    pad: Option<InstrId>,
) -> Result<Option<(Grid, InstrId)>, SpmdError> {
    let mut cands = vec![out.clone()];
    if let Some(g) = v.vs.grid() {
        if g != out {
            cands.push(g.clone());
        }
    }
    let mut best: Option<(Grid, u64)> = None;
    for c in cands {
        let mut cost = p.cost(v, &c) + p.cost_of(&instr.shape, &c, out);
        let mut ok = true;
        for a in c.tiled_dims() {
            match window(a, c.tiles(a)) {
                Some((starts, len)) => cost += exchange_cost(p, &c, &v.shape, a, &starts, len),
                None => ok = false,
            }
        }
        if ok && best.as_ref().map(|b| cost < b.1).unwrap_or(true) {
            best = Some((c, cost));
        }
    }
    let Some((c, _)) = best else {
        return Ok(None);
    };
    let dims = v.shape.dims().to_vec();
    let mut x = p.reshard_to_grid(v, &c)?;
    for a in c.tiled_dims() {
        let Some((starts, len)) = window(a, c.tiles(a)) else {
            return Ok(None);
        };
        x = exchange(p, x, &c, &dims, a, &starts, len, pad)?;
    }
    Ok(Some((c, x)))
}

/// `ceil(a / b)` for `b > 0`.
fn ceil_div(a: i64, b: i64) -> i64 {
    -((-a).div_euclid(b))
}

pub fn slice(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    let Some(sd) = instr.slice_dims().map(|s| s.to_vec()) else {
        return Ok(None);
    };
    let v = p.operand(instr, 0)?;
    let od = instr.shape.dims().to_vec();
    if sd.len() != od.len() {
        return Ok(None);
    }
    let xd = v.shape.dims().to_vec();
    let window = |a: usize, t: i64| {
        let d = sd[a];
        let so = tile_size(od[a], t);
        // Tiles wholly past the end of the output (padding) need no rows:
        // their windows start past the operand's end.
        let starts: Vec<i64> = (0..t)
            .map(|i| {
                if i * so >= od[a] {
                    xd[a]
                } else {
                    d.start + i * so * d.stride
                }
            })
            .collect();
        Some((starts, (so - 1) * d.stride + 1))
    };
    let Some((c, x)) = windowed(p, instr, &out, &v, &window, None)? else {
        return Ok(None);
    };
    let ranges: Vec<(i64, i64, i64)> = sd
        .iter()
        .enumerate()
        .map(|(a, d)| match c.tiles(a) {
            1 => (d.start, d.limit, d.stride),
            t => (0, (tile_size(od[a], t) - 1) * d.stride + 1, d.stride),
        })
        .collect();
    let id = p.b.slice(x, &ranges);
    p.note(instr, "slice");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(c),
    }))
}

/// Interior padding on a dim of `t` tiles of `so` outputs: per tile, the
/// first input element of the tile and the tile's phase (position of that
/// element), which must be the same for every tile, and the input count.
fn interior_plan(d: &PaddingDim, so: i64, t: i64) -> Option<(Vec<i64>, i64, i64)> {
    let r = d.interior + 1;
    let j0: Vec<i64> = (0..t).map(|i| ceil_div(i * so - d.low, r)).collect();
    let phase = d.low + j0[0] * r;
    if phase >= so || (0..t).any(|i| d.low + j0[i as usize] * r - i * so != phase) {
        return None;
    }
    Some((j0, phase, (so - phase + r - 1) / r))
}

pub fn pad(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &ValueSharding) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    let Some(pd) = instr.padding().map(|s| s.to_vec()) else {
        return Ok(None);
    };
    let od = instr.shape.dims().to_vec();
    if pd.len() != od.len() {
        return Ok(None);
    }
    let v = p.operand(instr, 0)?;
    let pv = p.operand(instr, 1)?;
    let pv = p.replicate(&pv)?.id;
    // Interior padding whose tiles start at different phases: each tile
    // takes `ceil(so / r)` inputs from its first one, pads them locally
    // with `r - 1` in front, and slices its window at its own offset.
    let phased = |d: &PaddingDim, so: i64, t: i64| {
        let r = d.interior + 1;
        let j0: Vec<i64> = (0..t).map(|i| ceil_div(i * so - d.low, r)).collect();
        let offsets: Vec<i64> = (0..t)
            .map(|i| (r - 1) - (d.low + j0[i as usize] * r - i * so))
            .collect();
        (j0, (so + r - 1) / r, offsets)
    };
    let window = |a: usize, t: i64| {
        let d = pd[a];
        let so = tile_size(od[a], t);
        if d.interior == 0 {
            Some(((0..t).map(|i| i * so - d.low).collect(), so))
        } else {
            interior_plan(&d, so, t)
                .map(|(j0, _, len)| (j0, len))
                .or_else(|| Some(phased(&d, so, t)).map(|(j0, len, _)| (j0, len)))
        }
    };
    let Some((c, x)) = windowed(p, instr, &out, &v, &window, Some(pv))? else {
        return Ok(None);
    };
    let mut rest = pd.clone();
    // Per dim sliced at per-tile offsets: (dim, offsets, tile size).
    let mut sliced: Vec<(usize, Vec<i64>, i64)> = Vec::new();
    for (a, d) in pd.iter().enumerate() {
        let t = c.tiles(a);
        if t <= 1 {
            continue;
        }
        let so = tile_size(od[a], t);
        rest[a] = match interior_plan(d, so, t) {
            _ if d.interior == 0 => PaddingDim::default(),
            Some((_, phase, len)) => PaddingDim {
                low: phase,
                high: so - (phase + (len - 1) * (d.interior + 1) + 1),
                interior: d.interior,
            },
            None => {
                let (_, len, offsets) = phased(d, so, t);
                let r = d.interior + 1;
                let padded = (r - 1) + (len - 1) * r + 1;
                sliced.push((a, offsets, so));
                PaddingDim {
                    low: r - 1,
                    high: ((r - 1) + so - padded).max(0),
                    interior: d.interior,
                }
            }
        };
    }
    let id = if rest
        .iter()
        .any(|d| d.low != 0 || d.high != 0 || d.interior != 0)
    {
        let xd = p.b.dims(x);
        let nd: Vec<i64> = xd
            .iter()
            .zip(&rest)
            .map(|(&x, d)| x + d.low + d.high + (x - 1).max(0) * d.interior)
            .collect();
        let shape = crate::shapes::with_dims(&instr.shape, &nd);
        let id = p.clone_instr(instr, vec![x, pv], shape);
        p.b.comp
            .instr_mut(id)
            .set_attr(AttrKey::Padding, AttrValue::Padding(rest));
        id
    } else {
        x
    };
    let id = if sliced.is_empty() {
        id
    } else {
        let mut sizes = p.b.dims(id);
        let mut tables = Vec::new();
        for a in 0..sizes.len() {
            match sliced.iter().find(|s| s.0 == a) {
                Some((_, offsets, so)) => {
                    let tb = p.grids().per_coord(&c, a, offsets);
                    tables.push(p.b.table(&tb));
                    sizes[a] = *so;
                }
                None => tables.push(p.b.scalar(xla_hlo_ir::PrimitiveType::S32, 0)),
            }
        }
        p.b.dynamic_slice(id, tables, &sizes)
    };
    p.note(instr, "pad");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(c),
    }))
}

pub fn reduce_window(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    if instr.operands.len() != 2 {
        return Ok(None);
    }
    let Some(win) = instr.window().cloned() else {
        return Ok(None);
    };
    let v = p.operand(instr, 0)?;
    let init = p.operand(instr, 1)?;
    let init = p.replicate(&init)?.id;
    let od = instr.shape.dims().to_vec();
    if win.dims.len() != od.len() {
        return Ok(None);
    }
    let window = |a: usize, t: i64| {
        let wd = win.dims[a];
        if wd.reversal {
            return None;
        }
        let so = tile_size(od[a], t);
        if wd.lhs_dilation != 1 {
            return dilated_window(&wd, so, t).map(|d| (d.starts, d.rows));
        }
        let span = (wd.size - 1) * wd.rhs_dilation + 1;
        let starts: Vec<i64> = (0..t)
            .map(|i| i * so * wd.stride - wd.padding_low)
            .collect();
        Some((starts, (so - 1) * wd.stride + span))
    };
    let Some((c, x)) = windowed(p, instr, &out, &v, &window, Some(init))? else {
        return Ok(None);
    };
    let mut w = win.clone();
    let mut x = x;
    for a in c.tiled_dims() {
        let wd = w.dims[a];
        if wd.lhs_dilation != 1 {
            // Dilate the exchanged rows locally, then take each tile's
            // window at its phase.
            let Some(dw) = dilated_window(&wd, tile_size(od[a], c.tiles(a)), c.tiles(a)) else {
                return Ok(None);
            };
            let dl = wd.lhs_dilation;
            let base = (dl - 1) + (dw.rows - 1) * dl + 1;
            let high = dw
                .offsets
                .iter()
                .map(|&o| o + dw.needed - base)
                .max()
                .unwrap_or(0)
                .max(0);
            let xd = p.b.dims(x);
            let mut padding = vec![PaddingDim::default(); xd.len()];
            padding[a] = PaddingDim {
                low: dl - 1,
                high,
                interior: dl - 1,
            };
            let mut pd = xd.clone();
            pd[a] = base + high;
            let shape = crate::shapes::with_dims(p.b.shape(x), &pd);
            let padded = p.b.add(
                "pad",
                Opcode::Pad,
                shape,
                vec![x, init],
                vec![(AttrKey::Padding, AttrValue::Padding(padding))],
            );
            let table = p.grids().per_coord(&c, a, &dw.offsets);
            let zero = p.b.scalar(xla_hlo_ir::PrimitiveType::S32, 0);
            let mut starts = vec![zero; xd.len()];
            starts[a] = p.b.table(&table);
            let mut sizes = pd;
            sizes[a] = dw.needed;
            x = p.b.dynamic_slice(padded, starts, &sizes);
            w.dims[a].lhs_dilation = 1;
        }
        w.dims[a].padding_low = 0;
        w.dims[a].padding_high = 0;
    }
    let want = local_shape(&instr.shape, &ValueSharding::Grid(c.clone()));
    let id = p.clone_instr(instr, vec![x, init], want.clone());
    p.b.comp
        .instr_mut(id)
        .set_attr(AttrKey::Window, AttrValue::Window(Box::new(w)));
    let got = p.infer(p.b.comp.instr(id), &[p.b.shape(x), p.b.shape(init)])?;
    if got.dims() != want.dims() {
        return Err(SpmdError::Invalid(format!(
            "local reduce-window shape {got} differs from {want}"
        )));
    }
    p.note(instr, "reduce-window");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(c),
    }))
}

/// The input rows a tile of a base-dilated window reads: per tile the
/// first input row and the uniform row count, and per tile the offset of
/// its window in those rows dilated locally (`D - 1` init values in front,
/// `D - 1` between rows): output tile `i` (of `so` outputs) reads dilated
/// positions `[lo_i, lo_i + needed)`, `lo_i = i * so * stride - pad_low`,
/// input row `j` sitting at dilated position `j * D`. Tiles may start at
/// different phases of the dilation.
struct DilatedWindow {
    starts: Vec<i64>,
    rows: i64,
    offsets: Vec<i64>,
    needed: i64,
}

fn dilated_window(wd: &xla_hlo_ir::attrs::WindowDim, so: i64, t: i64) -> Option<DilatedWindow> {
    let d = wd.lhs_dilation;
    if d < 1 || so < 1 {
        return None;
    }
    let span = (wd.size - 1) * wd.rhs_dilation + 1;
    let needed = (so - 1) * wd.stride + span;
    let mut starts = Vec::with_capacity(t as usize);
    let mut offsets = Vec::with_capacity(t as usize);
    let mut rows = 1;
    for i in 0..t {
        let lo = i * so * wd.stride - wd.padding_low;
        let first = ceil_div(lo, d);
        let last = (lo + needed - 1).div_euclid(d);
        rows = rows.max(last - first + 1);
        starts.push(first);
        offsets.push(lo - first * d + (d - 1));
    }
    Some(DilatedWindow {
        starts,
        rows,
        offsets,
        needed,
    })
}

/// select-and-scatter (the gradient of max pooling) computed where it is
/// local: every tiled dim either passes through (window 1, stride 1) or
/// has non-overlapping windows (size <= stride, no low padding, no
/// dilation) whose stride blocks line up with the tiles (an operand tile
/// is exactly its source tile's windows), the operand, the source and the
/// result tiled alike. Operand rows past the end (the tile padding the
/// window's high padding reads) are masked with the select's loser, -inf
/// for a `GE` select and +inf for `LE`, so they are never chosen; windows
/// wholly past the end scatter only into padding rows. The grid is the
/// result's, the operand's, or the result's with the dims that fail that
/// replicated, whichever costs least to reach. Overlapping windows across
/// tiles (XLA's halo exchange with scattered contributions sent back) are
/// not handled: those fall back.
pub fn select_and_scatter(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    let Some(win) = instr.window().cloned() else {
        return Ok(None);
    };
    if instr.operands.len() != 3 {
        return Ok(None);
    }
    let x = p.operand(instr, 0)?;
    let src = p.operand(instr, 1)?;
    let init = p.operand(instr, 2)?;
    let (xd, sd) = (x.shape.dims().to_vec(), src.shape.dims().to_vec());
    if win.dims.len() != xd.len() || sd.len() != xd.len() {
        return Ok(None);
    }
    let loser = select_loser(p, instr);
    let local_dim = |a: usize, t: i64| {
        let w = &win.dims[a];
        if t <= 1 {
            return true;
        }
        let plain = w.lhs_dilation == 1 && w.rhs_dilation == 1 && w.padding_low == 0 && !w.reversal;
        let (ts, ss) = (tile_size(xd[a], t), tile_size(sd[a], t));
        let padded_rows = t * ts > xd[a];
        plain
            && w.size <= w.stride
            && ts == ss * w.stride
            && (!padded_rows || loser.is_some() || w.padding_high == 0 && xd[a] % w.stride == 0)
    };
    let aligned = |c: &Grid| (0..xd.len()).all(|a| local_dim(a, c.tiles(a)));
    let bad: Vec<usize> = (0..xd.len())
        .filter(|&a| !local_dim(a, out.tiles(a)))
        .collect();
    let mut cands = vec![out.clone(), p.grids().replicate_dims(&out, &bad)];
    if let Some(g) = x.vs.grid() {
        cands.push(g.clone());
    }
    let mut best: Option<(Grid, u64)> = None;
    for c in cands.into_iter().filter(|c| aligned(c)) {
        let cost = p.cost(&x, &c) + p.cost(&src, &c) + p.cost_of(&instr.shape, &c, &out);
        if best.as_ref().is_none_or(|b| cost < b.1) {
            best = Some((c, cost));
        }
    }
    let Some((c, _)) = best else {
        return Ok(None);
    };
    let mut xl = p.reshard_to_grid(&x, &c)?;
    let sl = p.reshard_to_grid(&src, &c)?;
    let init = p.replicate(&init)?.id;
    let mut w = win.clone();
    for a in c.tiled_dims() {
        let t = c.tiles(a);
        w.dims[a].padding_high = 0;
        if t * tile_size(xd[a], t) > xd[a] {
            if let Some(v) = loser {
                let ty = crate::shapes::elem(&x.shape)?;
                let lv =
                    p.b.constant(crate::shapes::scalar_literal(ty, v), Shape::scalar(ty));
                let ld = p.b.dims(xl);
                let offsets = p.grids().offsets(&c, a, tile_size(xd[a], t));
                let off = p.b.table(&offsets);
                let valid = p.b.range_mask(&ld, a, off, None, Some(xd[a]));
                let fill = p.b.splat(lv, &ld);
                xl = p.b.select(valid, xl, fill);
            }
        }
    }
    let want = local_shape(&instr.shape, &ValueSharding::Grid(c.clone()));
    let id = p.clone_instr(instr, vec![xl, sl, init], want);
    p.b.comp
        .instr_mut(id)
        .set_attr(AttrKey::Window, AttrValue::Window(Box::new(w)));
    p.note(instr, "select-and-scatter");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(c),
    }))
}

/// The value a float select-and-scatter's `select` never prefers over a
/// real one: -inf for `compare(a, b) GE` (max, first wins ties), +inf for
/// `LE`; `None` for other selects or element types.
fn select_loser(p: &Part<'_, '_>, instr: &HloInstruction) -> Option<f64> {
    if !instr.shape.element_type()?.is_float() {
        return None;
    }
    let cid = instr.computation_attr(AttrKey::SelectComputation)?;
    match crate::helpers::compare_direction(p, cid)? {
        "GE" => Some(f64::NEG_INFINITY),
        "LE" => Some(f64::INFINITY),
        _ => None,
    }
}

pub fn concatenate(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    let a = instr.dimensions().first().copied().unwrap_or(0) as usize;
    let mut vals = Vec::new();
    for k in 0..instr.operands.len() {
        vals.push(p.operand(instr, k)?);
    }
    if a >= out.rank() || vals.iter().any(|v| v.shape.rank() != out.rank()) {
        return Ok(None);
    }
    if let Some(r) = rotate(p, instr, a, &out, &vals)? {
        return Ok(Some(r));
    }
    if let Some(r) = pad_with_wrap(p, instr, a, &out, &vals)? {
        return Ok(Some(r));
    }
    let c = if out.tiles(a) == 1 {
        out.clone()
    } else {
        let mut shapes: Vec<&[i64]> = vals.iter().map(|v| v.shape.dims()).collect();
        shapes.push(instr.shape.dims());
        let cands = unsharded_candidates(p.grids(), &out, a, &shapes);
        let costed: Vec<(Grid, u64)> = cands
            .into_iter()
            .map(|c| {
                let mut cost = p.cost_of(&instr.shape, &c, &out);
                for v in &vals {
                    cost += p.cost(v, &c);
                }
                (c, cost)
            })
            .collect();
        match cheapest(&costed) {
            Some(c) => c,
            None => return Ok(None),
        }
    };
    let mut ops = Vec::new();
    for v in &vals {
        ops.push(p.reshard_to_grid(v, &c)?);
    }
    p.note(instr, "concatenate");
    Ok(Some(p.emit_local(instr, ops, &ValueSharding::Grid(c))?))
}

/// A wrapped window along `a`: output row `r` (of `total`) is operand row
/// `(r + shift) mod n`, assembled piece by piece (see
/// [`crate::assemble`]) on the output's tiles; its bytes (the operand
/// resharded to `out`, then the pieces moved) and the plan. `None` when
/// `out` does not tile `a`.
fn wrap_window_plan(
    p: &Part<'_, '_>,
    out: &Grid,
    x: &PValue,
    a: usize,
    shift: i64,
    total: i64,
) -> Option<(u64, crate::assemble::Assembly)> {
    let t = out.tiles(a);
    let n = *x.shape.dims().get(a)?;
    if t <= 1 || n <= 0 {
        return None;
    }
    let so = tile_size(total, t);
    let starts: Vec<i64> = (0..t).map(|i| i * so + shift).collect();
    let valid: Vec<i64> = (0..t).map(|i| (total - i * so).clamp(0, so)).collect();
    let asm = crate::assemble::plan(&starts, &valid, so, n, true)?;
    let per_row = crate::exchange::other_bytes(&x.shape, out, a);
    let cost = p.cost(x, out) + asm.rows_moved().max(0) as u64 * per_row;
    Some((cost, asm))
}

/// Emits a [`wrap_window_plan`]; rows of the window below `lhs.0` take the
/// elementwise ops `lhs.1` and rows from `rhs.0` on take `rhs.1` (the
/// modifiers of a wrap pad's edges).
#[allow(clippy::too_many_arguments)]
fn wrap_window_emit(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    out: &Grid,
    x: &PValue,
    a: usize,
    asm: &crate::assemble::Assembly,
    total: i64,
    lhs: (i64, &[InstrId]),
    rhs: (i64, &[InstrId]),
) -> HandlerResult {
    let xl = p.reshard_to_grid(x, out)?;
    let mut y = asm.emit(p, xl, out, a)?;
    let so = tile_size(total, out.tiles(a));
    for (mods, bound, below) in [(lhs.1, lhs.0, true), (rhs.1, rhs.0, false)] {
        if mods.is_empty() {
            continue;
        }
        let mut m = y;
        for &id in mods {
            let op = p.orig_comp.instr(id);
            let Some(ty) = op.shape.element_type() else {
                return Ok(None);
            };
            let shape = Shape::array(ty, p.b.dims(m));
            m = p.clone_instr(op, vec![m], shape);
        }
        let dims = p.b.dims(y);
        let offsets = p.grids().offsets(out, a, so);
        let off = p.b.table(&offsets);
        let mask = if below {
            p.b.range_mask(&dims, a, off, None, Some(bound))
        } else {
            p.b.range_mask(&dims, a, off, Some(bound), None)
        };
        y = p.b.select(mask, m, y);
    }
    p.note(instr, "concatenate:wrap");
    Ok(Some(PValue {
        id: y,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(out.clone()),
    }))
}

/// A chain of one-operand elementwise ops down from `id` to a slice:
/// `(slice, ops from the slice up)`.
fn through_modifiers(p: &Part<'_, '_>, mut id: InstrId) -> Option<(InstrId, Vec<InstrId>)> {
    let mut mods = Vec::new();
    loop {
        let i = p.orig_comp.instructions.get(id.index())?;
        if i.opcode == Opcode::Slice {
            mods.reverse();
            return Some((id, mods));
        }
        if !i.opcode.is_elementwise() || i.operands.len() != 1 || mods.len() > 8 {
            return None;
        }
        mods.push(id);
        id = i.operands[0];
    }
}

/// `concatenate(f(slice(x)[n-l:n]), x, g(slice(x)[0:r]))` along `a` (a
/// pad with wrap, `f` and `g` chains of elementwise ops): output row `q`
/// is `x[(q - l) mod n]`, the edges modified; assembled as a wrapped
/// window when cheaper than the generic concatenation.
fn pad_with_wrap(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    a: usize,
    out: &Grid,
    vals: &[PValue],
) -> HandlerResult {
    let [left, mid, right] = instr.operands[..] else {
        return Ok(None);
    };
    let (Some((ls, lmods)), Some((rs, rmods))) =
        (through_modifiers(p, left), through_modifiers(p, right))
    else {
        return Ok(None);
    };
    let (ls, rs) = (p.orig_comp.instr(ls), p.orig_comp.instr(rs));
    if ls.operands.first() != Some(&mid) || rs.operands.first() != Some(&mid) {
        return Ok(None);
    }
    let x = p.val(mid)?;
    let xd = x.shape.dims().to_vec();
    let (Some(dl), Some(dr)) = (ls.slice_dims(), rs.slice_dims()) else {
        return Ok(None);
    };
    if a >= xd.len() || dl.len() != xd.len() || dr.len() != xd.len() {
        return Ok(None);
    }
    let whole = |d: &xla_hlo_ir::attrs::SliceDim, b: usize| {
        d.stride == 1 && (b == a || (d.start == 0 && d.limit == xd[b]))
    };
    if !(0..xd.len()).all(|b| whole(&dl[b], b) && whole(&dr[b], b)) {
        return Ok(None);
    }
    let n = xd[a];
    if dl[a].limit != n || dr[a].start != 0 {
        return Ok(None);
    }
    let (l, r) = (n - dl[a].start, dr[a].limit);
    let total = instr.shape.dims()[a];
    if l <= 0 || r <= 0 || l + n + r != total {
        return Ok(None);
    }
    let Some((cost, asm)) = wrap_window_plan(p, out, &x, a, -l, total) else {
        return Ok(None);
    };
    let generic: u64 = vals
        .iter()
        .map(|v| p.cost(v, &p.grids().replicate_dims(out, &[a])))
        .sum();
    if cost >= generic {
        return Ok(None);
    }
    wrap_window_emit(
        p,
        instr,
        out,
        &x,
        a,
        &asm,
        total,
        (l, &lmods),
        (l + n, &rmods),
    )
}

/// `concatenate(slice(x)[k:n], slice(x)[0:k])` along `a` (`jnp.roll`),
/// as `(x, k)`: the result is `x` rotated left by `k` along `a`.
fn rotation(p: &Part<'_, '_>, instr: &HloInstruction, a: usize) -> Option<(InstrId, i64)> {
    let [first, second] = instr.operands[..] else {
        return None;
    };
    let (s0, s1) = (p.orig_comp.instr(first), p.orig_comp.instr(second));
    if s0.opcode != Opcode::Slice || s1.opcode != Opcode::Slice || s0.operands != s1.operands {
        return None;
    }
    let x = p.orig_comp.instr(*s0.operands.first()?);
    let xd = x.shape.dims();
    let (d0, d1) = (s0.slice_dims()?, s1.slice_dims()?);
    if d0.len() != xd.len() || d1.len() != xd.len() || a >= xd.len() {
        return None;
    }
    let whole = |d: &xla_hlo_ir::attrs::SliceDim, b: usize| {
        d.stride == 1 && (b == a || (d.start == 0 && d.limit == xd[b]))
    };
    if !(0..xd.len()).all(|b| whole(&d0[b], b) && whole(&d1[b], b)) {
        return None;
    }
    let k = d0[a].start;
    let rotated = d0[a].limit == xd[a] && d1[a].start == 0 && d1[a].limit == k;
    (rotated && k > 0 && k < xd[a]).then_some((s0.operands[0], k))
}

/// A rotation along `a` (see [`rotation`]) of an operand that can be laid
/// out like the result, evenly tiled along `a`: each tile takes the rest
/// of the tile `k / s` further on and the head of the next one (`s` the
/// tile size): at most two collective-permutes of one tile in all, as XLA
/// does, instead of gathering the pieces. Used when cheaper than the
/// generic concatenation.
fn rotate(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    a: usize,
    out: &Grid,
    vals: &[PValue],
) -> HandlerResult {
    let t = out.tiles(a);
    let Some((xid, k)) = rotation(p, instr, a) else {
        return Ok(None);
    };
    let x = p.val(xid)?;
    let n = x.shape.dims()[a];
    if t <= 1 {
        return Ok(None);
    }
    // The wrapped-window assembly competes with the two-permute rotation
    // (or, uneven, the two exchanges) and the generic concatenation.
    let wrap = wrap_window_plan(p, out, &x, a, k, n);
    let generic: u64 = vals
        .iter()
        .map(|v| p.cost(v, &p.grids().replicate_dims(out, &[a])))
        .sum();
    if n % t != 0 {
        return rotate_uneven(p, instr, a, out, &x, k, (generic, wrap));
    }
    let s = n / t;
    let (q, r) = (k / s, k % s);
    let tile_bytes =
        p.cost_of(&instr.shape, out, &p.grids().replicate_dims(out, &[a])) / (t as u64 - 1);
    let moved = |from: i64, rows: i64| {
        if from % t == 0 {
            0
        } else {
            tile_bytes * rows as u64 / s as u64
        }
    };
    let cost = p.cost(&x, out) + moved(q, s - r) + if r > 0 { moved(q + 1, r) } else { 0 };
    if let Some((wcost, asm)) = &wrap {
        if *wcost < cost.min(generic) {
            return wrap_window_emit(p, instr, out, &x, a, asm, n, (0, &[]), (n, &[]));
        }
    }
    if cost >= generic {
        return Ok(None);
    }
    let xl = p.reshard_to_grid(&x, out)?;
    let ld = p.b.dims(xl);
    let piece = |p: &mut Part<'_, '_>, lo: i64, hi: i64, shift: i64| {
        let mut rg: Vec<(i64, i64, i64)> = ld.iter().map(|&d| (0, d, 1)).collect();
        rg[a] = (lo, hi, 1);
        let sl = p.b.slice(xl, &rg);
        if shift % t == 0 {
            return sl;
        }
        let source: Vec<Option<i64>> = (0..t).map(|i| Some((i + shift) % t)).collect();
        let pairs = tile_pairs(out, a, &source);
        p.b.collective_permute(sl, &pairs)
    };
    let mut parts = vec![piece(p, r, s, q)];
    if r > 0 {
        parts.push(piece(p, 0, r, q + 1));
    }
    let id = if parts.len() == 1 {
        parts[0]
    } else {
        p.b.concatenate(parts, a)
    };
    p.note(instr, "concatenate:rotate");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(out.clone()),
    }))
}

/// A rotation by `k` along an unevenly tiled dim `a` of `n` elements:
/// output tile `i` (tile size `s`) is the window `[i*s + k, ... + s)` of
/// the operand where that stays below `n`, and the window shifted back by
/// `n` beyond: two window exchanges and a select. Used when cheaper than
/// `generic`; the wrapped-window assembly `wrap` is used instead when
/// cheaper still.
fn rotate_uneven(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    a: usize,
    out: &Grid,
    x: &PValue,
    k: i64,
    (generic, wrap): (u64, Option<(u64, crate::assemble::Assembly)>),
) -> HandlerResult {
    let t = out.tiles(a);
    let dims = x.shape.dims().to_vec();
    let n = dims[a];
    let s = tile_size(n, t);
    let head: Vec<i64> = (0..t).map(|i| i * s + k).collect();
    let wrapped: Vec<i64> = (0..t).map(|i| i * s + k - n).collect();
    let cost = p.cost(x, out)
        + exchange_cost(p, out, &x.shape, a, &head, s)
        + exchange_cost(p, out, &x.shape, a, &wrapped, s);
    if let Some((wcost, asm)) = &wrap {
        if *wcost < cost.min(generic) {
            return wrap_window_emit(p, instr, out, x, a, asm, n, (0, &[]), (n, &[]));
        }
    }
    if cost >= generic {
        return Ok(None);
    }
    let xl = p.reshard_to_grid(x, out)?;
    let y1 = exchange(p, xl, out, &dims, a, &head, s, None)?;
    let y2 = exchange(p, xl, out, &dims, a, &wrapped, s, None)?;
    let ld = p.b.dims(y1);
    let offsets = p.grids().offsets(out, a, s);
    let off = p.b.table(&offsets);
    let from_head = p.b.range_mask(&ld, a, off, None, Some(n - k));
    let id = p.b.select(from_head, y1, y2);
    p.note(instr, "concatenate:rotate");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(out.clone()),
    }))
}
