//! Batched linear algebra beyond dot: `cholesky`, `triangular-solve` and
//! `fft`, computed per device on whole matrices (whole transforms for
//! `fft`: its last `fft_length.len()` dims). The batch dims (all but the
//! minor two, or the transform dims) keep their tiling, as XLA keeps them;
//! `triangular-solve`'s
//! right-hand side also keeps the tiling of its free dim (the columns of
//! `b` when `left_side`, its rows otherwise), since each column (row) of
//! the solution depends only on the same column (row) of `b`.
//!
//! Invariant: the matrices each device factors or solves are whole, so the
//! local op is the global op on that device's batch elements; `a` is laid
//! out as `b` with its minor two dims replicated, so every device holds the
//! `a` of the batch elements it solves.

use crate::grid::Grid;
use crate::helpers::{cheapest, HandlerResult};
use crate::part::Part;
use crate::value::ValueSharding;
use xla_hlo_ir::{AttrKey, HloInstruction};

/// The grids among the target's and the operand's where `whole_dims` are
/// replicated.
fn candidates(
    p: &Part<'_, '_>,
    target: &Grid,
    operand: Option<&Grid>,
    whole_dims: &[usize],
) -> Vec<Grid> {
    let mut out = vec![p.grids().replicate_dims(target, whole_dims)];
    if let Some(g) = operand.filter(|g| g.rank() == target.rank()) {
        let c = p.grids().replicate_dims(g, whole_dims);
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// A one-operand op computed per device on its whole minor `count` dims:
/// the operand and the result share the cheapest grid with those dims
/// replicated, the other (batch) dims keeping their tiling.
fn local_on_whole_minor_dims(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
    count: usize,
    note: &'static str,
) -> HandlerResult {
    let Some(out) = target.grid() else {
        return Ok(None);
    };
    let x = p.operand(instr, 0)?;
    let rank = x.shape.rank();
    if count == 0 || count > rank || out.rank() != rank {
        return Ok(None);
    }
    let whole: Vec<usize> = (rank - count..rank).collect();
    let costed: Vec<(Grid, u64)> = candidates(p, out, x.vs.grid(), &whole)
        .into_iter()
        .map(|c| {
            let cost = p.cost(&x, &c) + p.cost_of(&instr.shape, &c, out);
            (c, cost)
        })
        .collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let local_x = p.reshard_to_grid(&x, &c)?;
    p.note(instr, note);
    Ok(Some(p.emit_local(
        instr,
        vec![local_x],
        &ValueSharding::Grid(c),
    )?))
}

/// `cholesky`: each device factors the matrices of its batch tiles.
pub fn cholesky(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    local_on_whole_minor_dims(p, instr, target, 2, "cholesky")
}

/// `fft`: each device transforms the whole transforms of its batch tiles
/// (the operand and the result share one grid: the transform dims, whose
/// sizes differ between them for RFFT and IRFFT, are replicated in it).
pub fn fft(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &ValueSharding) -> HandlerResult {
    let transform = instr.ints_attr(AttrKey::FftLength).map_or(0, |l| l.len());
    local_on_whole_minor_dims(p, instr, target, transform, "fft")
}

/// `triangular-solve(a, b)`: `b` and the result keep their batch and free
/// dims' tiling with the solved dim whole; `a` is replicated over its
/// matrix dims.
pub fn triangular_solve(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = target.grid() else {
        return Ok(None);
    };
    let a = p.operand(instr, 0)?;
    let b = p.operand(instr, 1)?;
    let rank = b.shape.rank();
    if rank < 2 || out.rank() != rank || a.shape.rank() != rank {
        return Ok(None);
    }
    let left_side = instr.bool_attr(AttrKey::LeftSide).unwrap_or(false);
    let solved = if left_side { rank - 2 } else { rank - 1 };
    let costed: Vec<(Grid, u64)> = candidates(p, out, b.vs.grid(), &[solved])
        .into_iter()
        .map(|c| {
            let a_grid = p.grids().replicate_dims(&c, &[rank - 2, rank - 1]);
            let cost = p.cost(&a, &a_grid) + p.cost(&b, &c) + p.cost_of(&instr.shape, &c, out);
            (c, cost)
        })
        .collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let a_grid = p.grids().replicate_dims(&c, &[rank - 2, rank - 1]);
    let local_a = p.reshard_to_grid(&a, &a_grid)?;
    let local_b = p.reshard_to_grid(&b, &c)?;
    p.note(instr, "triangular-solve");
    Ok(Some(p.emit_local(
        instr,
        vec![local_a, local_b],
        &ValueSharding::Grid(c),
    )?))
}
