//! Helpers the handlers share: picking the cheapest candidate layout,
//! reading a target's grid, masking the padding of uneven tiles,
//! per-partition tables as scalars of an element type, and reading a
//! comparator's direction.
//!
//! Invariant: every helper emits into the computation of the `Part` it is
//! given and leaves a value with the local shape of its layout.

use crate::error::SpmdError;
use crate::grid::{tile_size, Grid, GridCache};
use crate::part::Part;
use crate::value::{PValue, ValueSharding};
use xla_hlo_ir::{AttrKey, CompId, InstrId, Opcode, PrimitiveType, Shape};

/// What a handler returns: the value it computed (in the layout it chose),
/// or `None` when it declines and the generic fallback runs instead.
pub type HandlerResult = Result<Option<PValue>, SpmdError>;

/// Picks the candidate with the lowest cost (first wins ties).
pub fn cheapest<T: Clone>(cands: &[(T, u64)]) -> Option<T> {
    let mut best: Option<&(T, u64)> = None;
    for c in cands {
        if best.map(|b| c.1 < b.1).unwrap_or(true) {
            best = Some(c);
        }
    }
    best.map(|b| b.0.clone())
}

/// The direction of computation `cid` of the original module when it is
/// `(p0, p1, ..) -> compare(p0, p1)` (a sort, top-k or select comparator
/// reading only its first pair).
pub fn compare_direction<'a>(p: &Part<'a, '_>, cid: CompId) -> Option<&'a str> {
    let comp = p.orig.computations.get(cid.index())?;
    let root = comp.root_instr();
    let is_param = |id: InstrId, k: i64| {
        comp.instructions
            .get(id.index())
            .is_some_and(|i| i.opcode == Opcode::Parameter && i.parameter_number == Some(k))
    };
    if root.opcode != Opcode::Compare
        || root.operands.len() != 2
        || !is_param(root.operands[0], 0)
        || !is_param(root.operands[1], 1)
    {
        return None;
    }
    root.ident_attr(AttrKey::Direction)
}

/// The grid of an array target, or `None` (the handler then falls back).
pub fn grid_of(target: &ValueSharding) -> Option<Grid> {
    target.grid().cloned()
}

/// Sets the padding of the tiled, uneven `dims` of local `x` (laid out by
/// `g` over global `shape`) to the scalar `value`.
pub fn mask_padding(
    p: &mut Part<'_, '_>,
    x: InstrId,
    g: &Grid,
    shape: &[i64],
    dims: &[usize],
    value: InstrId,
) -> Result<InstrId, SpmdError> {
    let ld = p.b.dims(x);
    let mut mask = None;
    for &a in dims {
        let t = g.tiles(a);
        if t <= 1 || shape[a] % t == 0 {
            continue;
        }
        let ts = tile_size(shape[a], t);
        let table = p.grids().offsets(g, a, ts);
        let off = p.b.table(&table);
        let m = p.b.range_mask(&ld, a, off, None, Some(shape[a]));
        mask = Some(match mask {
            Some(prev) => p.b.binary(Opcode::And, prev, m),
            None => m,
        });
    }
    match mask {
        None => Ok(x),
        Some(m) => {
            let vb = p.b.splat(value, &ld);
            Ok(p.b.select(m, x, vb))
        }
    }
}

/// A per-partition table as a scalar of type `ty`.
pub fn to_ty(
    p: &mut Part<'_, '_>,
    table: &std::sync::Arc<[i64]>,
    ty: PrimitiveType,
) -> Result<InstrId, SpmdError> {
    let s = p.b.table(table);
    if ty == PrimitiveType::S32 {
        return Ok(s);
    }
    Ok(p.b.add(
        "convert",
        Opcode::Convert,
        Shape::scalar(ty),
        vec![s],
        vec![],
    ))
}

/// Grids where dim `a` is whole: `out` with `a` replicated, or with its
/// tiling moved onto another dim `e` (as a new minor factor) when every
/// array of `shapes` divides evenly there.
pub fn unsharded_candidates(
    grids: &GridCache,
    out: &Grid,
    a: usize,
    shapes: &[&[i64]],
) -> Vec<Grid> {
    let mut c = vec![grids.replicate_dims(out, &[a])];
    let t = out.tiles(a);
    if t > 1 {
        for e in 0..out.rank() {
            if e == a {
                continue;
            }
            let te = out.tiles(e) * t;
            if shapes.iter().all(|s| s[e] % te == 0) && shapes.iter().all(|s| s[a] % t == 0) {
                if let Some(g) = grids.all_to_all(out, a, e, t) {
                    c.push(g);
                }
            }
        }
    }
    c
}
