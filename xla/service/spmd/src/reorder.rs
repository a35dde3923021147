//! Ops that reorder elements along dims: sort and top-k (computed where the
//! sorted dim is whole, its tiling dropped or moved to another dim; the
//! `TopK` custom-call also as a local top-k per tile of the sorted dim, the
//! candidates gathered and merged by a sort, as XLA does) and
//! reverse (the reversed dims' tiles are mirrored; uneven tiles are
//! shifted back into place by a window exchange).
//!
//! Invariant: values and indices of a multi-operand sort or top-k come out
//! in one layout.

use crate::exchange::{exchange, exchange_cost};
use crate::grid::{tile_size, Grid};
use crate::helpers::{cheapest, unsharded_candidates, HandlerResult};
use crate::part::Part;
use crate::value::{local_shape, PValue, ValueSharding};
use std::rc::Rc;
use xla_hlo_ir::{AttrKey, AttrValue, HloInstruction, Opcode, PrimitiveType, Shape};

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

/// The `TopK` custom-call (`(values, s32 indices)` of the `k` best along
/// the last dim, ordered by its comparator, greater-than without one): the
/// cheapest of computing it where the last dim is whole, as [`topk`], and,
/// where the operand's tiles of the last dim each hold at least `k`
/// elements (evenly), a local top-k per tile with the indices moved to
/// global positions, an all-gather of the `k * t` candidates over the
/// tiles, a stable sort by the comparator and a slice of the first `k`:
/// ties keep the lower global index first, as the global top-k does.
pub fn topk_custom_call(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let ValueSharding::Tuple(targets) = target else {
        return Ok(None);
    };
    let (Some(out_values), Some(out_indices)) = (
        targets.first().and_then(|t| t.grid()).cloned(),
        targets.get(1).and_then(|t| t.grid()).cloned(),
    ) else {
        return Ok(None);
    };
    let [operand] = instr.operands[..] else {
        return Ok(None);
    };
    let Shape::Tuple(leaves) = &instr.shape else {
        return Ok(None);
    };
    let v = p.val(operand)?;
    let dims = v.shape.dims().to_vec();
    let rank = dims.len();
    if rank == 0 || leaves.len() != 2 || leaves.iter().any(|l| l.rank() != rank) {
        return Ok(None);
    }
    let (Some(value_ty), Some(PrimitiveType::S32)) =
        (leaves[0].element_type(), leaves[1].element_type())
    else {
        return Ok(None);
    };
    let a = rank - 1;
    let (n, k) = (dims[a], leaves[0].dims()[a]);
    let leaf_cost = |p: &Part<'_, '_>, c: &Grid| {
        p.cost_of(&leaves[0], c, &out_values) + p.cost_of(&leaves[1], c, &out_indices)
    };
    let mut whole = unsharded_candidates(p.grids(), &out_values, a, &[&dims]);
    if let Some(g) = v.vs.grid() {
        if g.rank() == rank {
            whole.extend(unsharded_candidates(p.grids(), g, a, &[&dims]));
        }
    }
    let costed: Vec<(Grid, u64)> = whole
        .into_iter()
        .map(|c| (c.clone(), p.cost(&v, &c) + leaf_cost(p, &c)))
        .collect();
    let best_whole = cheapest(&costed).map(|c| {
        let cost = costed.iter().find(|x| x.0 == c).map_or(u64::MAX, |x| x.1);
        (c, cost)
    });
    // Only the values are used: the merge sorts the values alone.
    let values_only = values_only_direction(p, instr);
    // Split along the last dim: the operand's tiling or the values'.
    let mut split: Option<(Grid, Grid, u64)> = None;
    for g in v.vs.grid().into_iter().chain([&out_values]) {
        let t = g.tiles(a);
        if g.rank() != rank || t <= 1 || n % t != 0 || k > n / t {
            continue;
        }
        let merged = p.grids().replicate_dims(g, &[a]);
        let mut cand_dims = leaves[0].dims().to_vec();
        cand_dims[a] = k * t;
        let gathered: u64 = leaves
            .iter()
            .take(if values_only.is_some() { 1 } else { 2 })
            .map(|l| {
                let s = crate::shapes::with_dims(l, &cand_dims);
                p.cost_of(&s, g, &merged)
            })
            .sum();
        let cost = p.cost(&v, g) + gathered + leaf_cost(p, &merged);
        if split.as_ref().is_none_or(|s| cost < s.2) {
            split = Some((g.clone(), merged, cost));
        }
    }
    let use_split = match (&split, &best_whole) {
        (Some(s), Some(w)) => s.2 < w.1,
        (Some(_), None) => true,
        _ => false,
    };
    if !use_split {
        let Some((c, _)) = best_whole else {
            return Ok(None);
        };
        let x = p.reshard_to_grid(&v, &c)?;
        p.note(instr, "topk");
        let vs = ValueSharding::Tuple(vec![ValueSharding::Grid(c.clone()), ValueSharding::Grid(c)]);
        return Ok(Some(p.emit_local(instr, vec![x], &vs)?));
    }
    let Some((g, merged, _)) = split else {
        return Ok(None);
    };
    let t = g.tiles(a);
    let x = p.reshard_to_grid(&v, &g)?;
    let mut local_dims = p.b.dims(x);
    local_dims[a] = k;
    let local_leaves: Vec<Shape> = leaves
        .iter()
        .map(|l| crate::shapes::with_dims(l, &local_dims))
        .collect();
    let local = p.clone_instr(instr, vec![x], Shape::Tuple(local_leaves.clone()));
    let values = p.element(local, 0, local_leaves[0].clone());
    let positions = p.element(local, 1, local_leaves[1].clone());
    let offsets = p.grids().offsets(&g, a, n / t);
    let offset = p.b.table(&offsets);
    let offset = p.b.splat(offset, &local_dims);
    let indices = p.b.binary(Opcode::Add, positions, offset);
    let groups = p.grids().factor_groups(&g, &[(a, t)]);
    let values = p.b.all_gather(values, a, &groups);
    if let Some(direction) = values_only {
        // The indices are never read: sort the values alone; the indices
        // leaf holds the local top-k's positions (the right local shape,
        // not the global indices).
        let comparator = p.b.ctx.value_comparator(value_ty, None, direction);
        let vshape = p.b.shape(values).clone();
        let sorted = p.b.add(
            "sort",
            Opcode::Sort,
            vshape.clone(),
            vec![values],
            vec![
                (AttrKey::Dimensions, AttrValue::Ints(vec![a as i64])),
                (AttrKey::IsStable, AttrValue::Bool(true)),
                (AttrKey::ToApply, AttrValue::Computation(comparator)),
            ],
        );
        let mut ranges: Vec<(i64, i64, i64)> = vshape.dims().iter().map(|&d| (0, d, 1)).collect();
        ranges[a] = (0, k, 1);
        let top = p.b.slice(sorted, &ranges);
        let vs = ValueSharding::Tuple(vec![
            ValueSharding::Grid(merged.clone()),
            ValueSharding::Grid(merged.clone()),
        ]);
        let shape = local_shape(&instr.shape, &vs);
        let id =
            p.b.add("tuple", Opcode::Tuple, shape, vec![top, positions], vec![]);
        p.note(instr, "topk-merge");
        return Ok(Some(PValue {
            id,
            shape: Rc::new(instr.shape.clone()),
            vs,
        }));
    }
    let indices = p.b.all_gather(indices, a, &groups);
    let comparator = match instr
        .to_apply()
        .or_else(|| instr.called_computations().first().copied())
    {
        Some(c) => c,
        None => {
            p.b.ctx
                .value_comparator(value_ty, Some(PrimitiveType::S32), "GT")
        }
    };
    let sorted_leaves: Vec<Shape> = vec![p.b.shape(values).clone(), p.b.shape(indices).clone()];
    let sorted = p.b.add(
        "sort",
        Opcode::Sort,
        Shape::Tuple(sorted_leaves.clone()),
        vec![values, indices],
        vec![
            (AttrKey::Dimensions, AttrValue::Ints(vec![a as i64])),
            (AttrKey::IsStable, AttrValue::Bool(true)),
            (AttrKey::ToApply, AttrValue::Computation(comparator)),
        ],
    );
    let mut parts = Vec::new();
    for (j, leaf) in sorted_leaves.iter().enumerate() {
        let e = p.element(sorted, j, leaf.clone());
        let mut ranges: Vec<(i64, i64, i64)> = leaf.dims().iter().map(|&d| (0, d, 1)).collect();
        ranges[a] = (0, k, 1);
        parts.push(p.b.slice(e, &ranges));
    }
    let vs = ValueSharding::Tuple(vec![
        ValueSharding::Grid(merged.clone()),
        ValueSharding::Grid(merged),
    ]);
    let shape = local_shape(&instr.shape, &vs);
    let id = p.b.add("tuple", Opcode::Tuple, shape, parts, vec![]);
    p.note(instr, "topk-merge");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs,
    }))
}

/// The compare direction of a `TopK` custom-call whose indices result is
/// never read (every user a `get-tuple-element` of the values): its
/// comparator's `compare(p0, p1)` direction, GT without a comparator;
/// `None` when the indices are read or the comparator is another function.
fn values_only_direction(p: &Part<'_, '_>, instr: &HloInstruction) -> Option<&'static str> {
    let comp = p.orig_comp;
    let me = comp
        .instructions
        .iter()
        .position(|i| std::ptr::eq(i, instr))?;
    let me = xla_hlo_ir::InstrId(me as u32);
    if comp.root == me {
        return None;
    }
    for user in comp
        .instructions
        .iter()
        .filter(|i| i.operands.contains(&me))
    {
        if user.opcode != Opcode::GetTupleElement || user.int_attr(AttrKey::Index) != Some(0) {
            return None;
        }
    }
    let Some(c) = instr
        .to_apply()
        .or_else(|| instr.called_computations().first().copied())
    else {
        return Some("GT");
    };
    match crate::helpers::compare_direction(p, c)? {
        "GT" => Some("GT"),
        "LT" => Some("LT"),
        _ => None,
    }
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
