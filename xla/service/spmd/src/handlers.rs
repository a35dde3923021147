//! Handlers of the shape ops: elementwise ops, constants, iota, tuples,
//! broadcast, transpose, reduce, the sharding custom-calls and the generic
//! fallback. Reshape is in `reshape`, windowed ops in `window`, dynamic
//! slices in `dynamic_slice`, sort/top-k/reverse in `reorder`, dot and
//! convolution in `dot`, gather and scatter in `gather`, control flow with
//! the driver (`partition::control_flow`); `partition::dispatch` sends each
//! opcode to its handler.
//!
//! Each handler chooses the operand shardings to compute in among a few
//! candidates (the output's, the operands' own, combinations) by the bytes
//! the reshards would move, emits the local op and returns the value in the
//! sharding it was computed in; the driver reshards it to the instruction's
//! own sharding.
//!
//! Invariant: the generic fallback (replicate operands, run the op on the
//! global shape) is correct for every side-effect-free op; handlers that
//! cannot prove their preconditions use it.

use crate::consistent;
use crate::error::{unsupported, SpmdError};
use crate::grid::{local_dims, tile_size, Grid};
use crate::helpers::{cheapest, grid_of, mask_padding, HandlerResult};
use crate::part::Part;
use crate::shapes::with_dims;
use crate::value::{local_shape, PValue, ValueSharding};
use std::rc::Rc;
use xla_hlo_ir::sharding::{ShardingKind, SubgroupType};
use xla_hlo_ir::{AttrKey, AttrValue, HloInstruction, Opcode, PrimitiveType, Shape};

/// A constant: kept whole (replicated) on every device.
pub fn constant(p: &mut Part<'_, '_>, instr: &HloInstruction) -> Result<PValue, SpmdError> {
    p.note(instr, "constant");
    let id = p.clone_instr(instr, vec![], instr.shape.clone());
    Ok(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::replicated_in(&instr.shape, p.n(), p.grids()),
    })
}

/// Replicates every operand and runs the op on the global shape.
pub fn fallback(p: &mut Part<'_, '_>, instr: &HloInstruction) -> Result<PValue, SpmdError> {
    let mut ops = Vec::new();
    for k in 0..instr.operands.len() {
        let v = p.operand(instr, k)?;
        ops.push(p.replicate(&v)?.id);
    }
    let id = p.clone_instr(instr, ops, instr.shape.clone());
    Ok(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::replicated_in(&instr.shape, p.n(), p.grids()),
    })
}

/// Whether `instr`'s own sharding has a manual subgroup: it belongs to a
/// partially manual region (the body of a shard_map manual over some axes).
pub fn in_partial_manual_region(instr: &HloInstruction) -> bool {
    instr.sharding.as_deref().is_some_and(|s| {
        s.leaves().iter().any(|leaf| {
            matches!(&leaf.kind, ShardingKind::Tiled { last_tile_dims, .. }
                if last_tile_dims.contains(&SubgroupType::Manual))
        })
    })
}

/// A cross-replica all-reduce, on the local tiles; or a collective the
/// user wrote in a partially manual region (a psum or
/// ppermute over manual axes): operand and result laid out by the target
/// grid, it runs on the local tiles as written when each replica group or
/// source-target pair joins devices holding the same tile (it then combines
/// or moves equal positions of the per-group arrays). Declines otherwise
/// (the generic fallback replicates first).
pub fn manual_collective(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(grid) = grid_of(target) else {
        return Ok(None);
    };
    // A cross-replica all-reduce (no channel: its groups are replicas, and
    // each partition reduces with its own counterparts) runs on the local
    // tiles, whatever their layout.
    if instr.opcode == Opcode::AllReduce
        && instr.channel_id().is_none()
        && instr.operands.len() == 1
        && instr.bool_attr(AttrKey::UseGlobalDeviceIds) != Some(true)
    {
        let v = p.operand(instr, 0)?;
        let v = p.reshard(&v, target)?;
        p.note(instr, "cross-replica all-reduce on local tiles");
        return Ok(Some(p.emit_local(instr, vec![v.id], target)?));
    }
    if !in_partial_manual_region(instr) || instr.operands.len() != 1 {
        return Ok(None);
    }
    let peers: Vec<Vec<i64>> = match instr.opcode {
        Opcode::AllReduce => match instr.replica_groups().and_then(|g| g.groups()) {
            Some(groups) if !groups.is_empty() => groups,
            _ => return Ok(None),
        },
        Opcode::CollectivePermute => match instr.attr(AttrKey::SourceTargetPairs) {
            Some(AttrValue::IntLists(pairs)) => pairs.clone(),
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    let n = grid.num_devices();
    let same_tile = peers.iter().all(|group| {
        group.iter().all(|&d| (0..n).contains(&d))
            && group
                .windows(2)
                .all(|w| (0..grid.rank()).all(|a| grid.coord(w[0], a) == grid.coord(w[1], a)))
    });
    if !same_tile {
        return Ok(None);
    }
    let v = p.operand(instr, 0)?;
    let v = p.reshard(&v, target)?;
    p.note(instr, "manual collective on local tiles");
    Ok(Some(p.emit_local(instr, vec![v.id], target)?))
}

pub fn elementwise(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = grid_of(target) else {
        return Ok(None);
    };
    let rank = instr.shape.rank();
    let mut vals = Vec::new();
    for k in 0..instr.operands.len() {
        vals.push(p.operand(instr, k)?);
    }
    if vals
        .iter()
        .any(|v| v.shape.rank() != rank && v.shape.rank() != 0)
    {
        return Ok(None);
    }
    let mut cands = vec![out.clone()];
    for v in &vals {
        if let ValueSharding::Grid(g) = &v.vs {
            if v.shape.rank() == rank && rank > 0 && !cands.contains(g) {
                cands.push(g.clone());
            }
        } else {
            return Ok(None);
        }
    }
    // One candidate (every operand already laid out as the result) needs
    // no costing.
    let costed: Vec<(Grid, u64)> = if cands.len() == 1 {
        cands.into_iter().map(|c| (c, 0)).collect()
    } else {
        cands
            .into_iter()
            .map(|c| {
                let mut cost = p.cost_of(&instr.shape, &c, &out);
                for v in &vals {
                    if v.shape.rank() == rank && rank > 0 {
                        cost += p.cost(v, &c);
                    }
                }
                (c, cost)
            })
            .collect()
    };
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let mut ops = Vec::new();
    for v in &vals {
        let g = if v.shape.rank() == rank {
            c.clone()
        } else {
            p.grids().replicated(0, p.n())
        };
        ops.push(p.reshard_to_grid(v, &g)?);
    }
    p.note(instr, "elementwise");
    Ok(Some(p.emit_local(instr, ops, &ValueSharding::Grid(c))?))
}

pub fn iota(p: &mut Part<'_, '_>, instr: &HloInstruction, target: &ValueSharding) -> HandlerResult {
    let Some(out) = grid_of(target) else {
        return Ok(None);
    };
    let dim = instr.int_attr(AttrKey::IotaDimension).unwrap_or(0) as usize;
    let dims = instr.shape.dims().to_vec();
    let ld = local_dims(&dims, &out);
    let shape = with_dims(&instr.shape, &ld);
    let mut id = p.clone_instr(instr, vec![], shape);
    if dim < dims.len() && out.tiles(dim) > 1 {
        let ts = tile_size(dims[dim], out.tiles(dim));
        let table = p.grids().offsets(&out, dim, ts);
        let off = p.b.table(&table);
        let ty = crate::shapes::elem(&instr.shape)?;
        let off = if ty == PrimitiveType::S32 {
            off
        } else {
            p.b.add(
                "convert",
                Opcode::Convert,
                Shape::scalar(ty),
                vec![off],
                vec![],
            )
        };
        let ob = p.b.splat(off, &ld);
        id = p.b.binary(Opcode::Add, id, ob);
    }
    p.note(instr, "iota");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(out),
    }))
}

pub fn tuple(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let mut ids = Vec::new();
    let mut vss = Vec::new();
    for k in 0..instr.operands.len() {
        let v = p.operand(instr, k)?;
        // Operands take the tuple's shardings now, so equal reshards of one
        // value elsewhere are shared.
        let v = match target {
            ValueSharding::Tuple(e) if e.len() == instr.operands.len() && !v.vs.has_manual() => {
                p.reshard(&v, &e[k])?
            }
            _ => v,
        };
        ids.push(v.id);
        vss.push(v.vs);
    }
    let vs = ValueSharding::Tuple(vss);
    let shape = local_shape(&instr.shape, &vs);
    let id = p.clone_instr(instr, ids, shape);
    p.note(instr, "tuple");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs,
    }))
}

pub fn get_tuple_element(p: &mut Part<'_, '_>, instr: &HloInstruction) -> HandlerResult {
    let v = p.operand(instr, 0)?;
    let k = instr.int_attr(AttrKey::Index).unwrap_or(0) as usize;
    let ValueSharding::Tuple(e) = &v.vs else {
        return unsupported("get-tuple-element of a non-tuple value");
    };
    let vs = e
        .get(k)
        .cloned()
        .ok_or_else(|| SpmdError::Invalid("tuple index out of range".into()))?;
    let shape = local_shape(&instr.shape, &vs);
    let id = {
        let ti = p.b.comp.instr(v.id);
        if ti.opcode == Opcode::Tuple && k < ti.operands.len() {
            ti.operands[k]
        } else {
            p.clone_instr(instr, vec![v.id], shape)
        }
    };
    p.note(instr, "get-tuple-element");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs,
    }))
}

pub fn pass_through(p: &mut Part<'_, '_>, instr: &HloInstruction) -> HandlerResult {
    let v = p.operand(instr, 0)?;
    let shape = local_shape(&instr.shape, &v.vs);
    let id = p.clone_instr(instr, vec![v.id], shape);
    p.note(instr, "pass-through");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: v.vs,
    }))
}

/// A copy of a tuple (sharding propagation adds one at a root `while`):
/// the operand is resharded leaf by leaf to the target and copied.
pub fn tuple_copy(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let v = p.operand(instr, 0)?;
    let resharded = p.reshard(&v, target)?;
    p.note(instr, "tuple copy");
    Ok(Some(p.emit_local(instr, vec![resharded.id], target)?))
}

pub fn broadcast(
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
    let bdims: Vec<usize> = instr.dimensions().iter().map(|&d| d as usize).collect();
    let out_rank = instr.shape.rank();
    if bdims.len() != v.shape.rank() || bdims.iter().any(|&d| d >= out_rank) {
        return Ok(None);
    }
    let (pg, rg) = if vg.is_replicated() && out.is_replicated() {
        // Both candidates below are these grids then.
        (vg, out)
    } else {
        // Candidate 1: the operand follows the output (result is `out`).
        let op_from_out: Vec<Option<usize>> = bdims.iter().map(|&d| Some(d)).collect();
        let p1 = p.grids().remap(&out, &op_from_out);
        let c1 = p.cost(&v, &p1);
        // Candidate 2: the operand as it is.
        let out_from_op: Vec<Option<usize>> = (0..out_rank)
            .map(|j| bdims.iter().position(|&d| d == j))
            .collect();
        let r2 = p.grids().remap(&vg, &out_from_op);
        let c2 = p.cost_of(&instr.shape, &r2, &out);
        if c2 < c1 {
            (vg, r2)
        } else {
            (p1, out)
        }
    };
    let x = p.reshard_to_grid(&v, &pg)?;
    p.note(instr, "broadcast");
    let vs = ValueSharding::Grid(rg);
    let shape = local_shape(&instr.shape, &vs);
    let id = p.clone_instr(instr, vec![x], shape);
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs,
    }))
}

pub fn transpose(
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
    let perm: Vec<usize> = instr.dimensions().iter().map(|&d| d as usize).collect();
    let r = perm.len();
    if r != v.shape.rank() {
        return Ok(None);
    }
    let mut op_map = vec![None; r];
    for (i, &pi) in perm.iter().enumerate() {
        if pi >= r {
            return Ok(None);
        }
        op_map[pi] = Some(i);
    }
    let p1 = p.grids().remap(&out, &op_map);
    let c1 = p.cost(&v, &p1);
    let out_map: Vec<Option<usize>> = perm.iter().map(|&pi| Some(pi)).collect();
    let r2 = p.grids().remap(&vg, &out_map);
    let c2 = p.cost_of(&instr.shape, &r2, &out);
    let (pg, rg) = if c2 < c1 { (vg, r2) } else { (p1, out) };
    let x = p.reshard_to_grid(&v, &pg)?;
    p.note(instr, "transpose");
    Ok(Some(p.emit_local(
        instr,
        vec![x],
        &ValueSharding::Grid(rg),
    )?))
}

pub fn reduce(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let k = instr.operands.len() / 2;
    if k == 0 {
        return Ok(None);
    }
    let leaf_target = match target {
        ValueSharding::Grid(g) => g.clone(),
        ValueSharding::Tuple(e) => match e.first().and_then(|x| x.grid()) {
            Some(g) => g.clone(),
            None => return Ok(None),
        },
        _ => return Ok(None),
    };
    let mut inputs = Vec::new();
    for i in 0..k {
        inputs.push(p.operand(instr, i)?);
    }
    let in_shape = inputs[0].shape.clone();
    let r = in_shape.rank();
    let red: Vec<usize> = instr.dimensions().iter().map(|&d| d as usize).collect();
    if red.iter().any(|&d| d >= r) || inputs.iter().any(|v| v.shape.rank() != r) {
        return Ok(None);
    }
    let kept: Vec<usize> = (0..r).filter(|a| !red.contains(a)).collect();
    let in_map: Vec<Option<usize>> = (0..r).map(|a| kept.iter().position(|&x| x == a)).collect();
    let out_map: Vec<Option<usize>> = kept.iter().map(|&a| Some(a)).collect();
    let out_leaf_shape = match &instr.shape {
        Shape::Tuple(e) => e.first().cloned().unwrap_or_else(|| instr.shape.clone()),
        s => s.clone(),
    };
    let Some(g0) = inputs[0].vs.grid().cloned() else {
        return Ok(None);
    };
    let from_out = p.grids().remap(&leaf_target, &in_map);
    let mut cands = vec![g0.clone(), from_out.clone()];
    if let Some(m) = p.grids().merge(&from_out, &g0, &red) {
        cands.push(m);
    }
    let bytes_out: u64 = match &instr.shape {
        Shape::Tuple(e) => e
            .iter()
            .map(|s| s.element_type().map(|t| t.byte_width()).unwrap_or(4) as u64)
            .sum(),
        s => s.element_type().map(|t| t.byte_width()).unwrap_or(4) as u64,
    };
    // Consistent mode: a split of an order-sensitive reduction that would
    // not reproduce the single-device order is replaced by the same split
    // moved onto the major reduced dim (an all-to-all of the operand, when
    // that split is exact) and by the reduced dims whole (gathered); the
    // cheaper is taken.
    let mut red_sorted = red.clone();
    red_sorted.sort_unstable();
    let in_ty = in_shape.element_type().unwrap_or(PrimitiveType::F32);
    let order_sensitive = p.b.ctx.consistent
        && (k > 1 || !consistent::reducer_is_order_free(p.orig, instr.to_apply(), in_ty));
    let exact_split = |c: &Grid| {
        let sizes: Vec<i64> = red_sorted.iter().map(|&a| in_shape.dims()[a]).collect();
        let tiles: Vec<i64> = red_sorted.iter().map(|&a| c.tiles(a)).collect();
        !order_sensitive || consistent::split_is_exact(&sizes, &tiles)
    };
    let default_cands = cands.clone();
    let cands: Vec<Grid> = cands
        .into_iter()
        .flat_map(|c| {
            if exact_split(&c) {
                return vec![c];
            }
            let mut exact = vec![p.grids().replicate_dims(&c, &red)];
            exact.extend(
                tiles_on_major_dim(&c, &red_sorted)
                    .map(|g| p.grids().intern(g))
                    .filter(|g| exact_split(g)),
            );
            exact
        })
        .collect();
    let cost_of_layout = |c: Grid| {
        let mut cost = 0;
        for v in &inputs {
            cost += p.cost(v, &c);
        }
        let c_out = p.grids().remap(&c, &out_map);
        let red_tiled: i64 = red.iter().map(|&a| c.tiles(a)).product();
        let mut post = p.cost_of(&out_leaf_shape, &c_out, &leaf_target) * k as u64;
        if red_tiled > 1 {
            let lo: u64 = local_dims(out_leaf_shape.dims(), &c_out)
                .iter()
                .map(|&d| d as u64)
                .product();
            post += if k == 1 {
                lo * bytes_out
            } else {
                lo * bytes_out * red_tiled as u64
            };
            if k == 1 {
                if let Some((_, _, rc)) = reduce_scatter_choice(
                    p,
                    &c,
                    &c_out,
                    &red,
                    &out_leaf_shape,
                    &leaf_target,
                    lo * bytes_out,
                ) {
                    post = post.min(rc);
                }
            }
        }
        cost += post;
        (c, cost)
    };
    let costed: Vec<(Grid, u64)> = cands.into_iter().map(cost_of_layout).collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    // Noted when consistent mode ruled out the layout the default mode takes.
    let ruled_out = order_sensitive && {
        let default_costed: Vec<(Grid, u64)> =
            default_cands.into_iter().map(cost_of_layout).collect();
        cheapest(&default_costed).is_some_and(|d| !exact_split(&d))
    };
    if ruled_out {
        log::info!(
            "consistent mode: {} takes another layout (the default split would not reproduce the single-device order)",
            instr.name
        );
        p.note(instr, consistent::RELAYOUT_NOTE);
    }
    let c_out = p.grids().remap(&c, &out_map);
    // Groups list devices in tile order over the reduced dims; consistent
    // mode combines partial results in that order, so it must be the
    // reduction order's (ascending dims).
    let red_tiled: Vec<usize> = if p.b.ctx.consistent {
        &red_sorted
    } else {
        &red
    }
    .iter()
    .copied()
    .filter(|&a| c.tiles(a) > 1)
    .collect();
    let mut ops = Vec::new();
    let mut inits = Vec::new();
    for i in 0..k {
        let iv = p.operand(instr, k + i)?;
        inits.push(p.replicate(&iv)?.id);
    }
    for (i, v) in inputs.iter().enumerate() {
        let x = p.reshard_to_grid(v, &c)?;
        let x = mask_padding(p, x, &c, in_shape.dims(), &red_tiled, inits[i])?;
        ops.push(x);
    }
    let mut all_ops = ops.clone();
    all_ops.extend(&inits);
    let out_vs = if k == 1 {
        ValueSharding::Grid(c_out.clone())
    } else {
        ValueSharding::Tuple(vec![ValueSharding::Grid(c_out.clone()); k])
    };
    let local = p.emit_local(instr, all_ops, &out_vs)?;
    p.note(instr, "reduce");
    if red_tiled.is_empty() {
        return Ok(Some(local));
    }
    let factors: Vec<(usize, i64)> = red_tiled.iter().map(|&a| (a, c.tiles(a))).collect();
    let groups = p.grids().factor_groups(&c, &factors);
    let lshape = local_shape(&instr.shape, &out_vs);
    if k == 1 {
        let to_apply = instr
            .to_apply()
            .ok_or_else(|| SpmdError::Invalid("reduce without to_apply".into()))?;
        let lo: u64 = local_dims(out_leaf_shape.dims(), &c_out)
            .iter()
            .map(|&d| d as u64)
            .product();
        let ar_cost = lo * bytes_out + p.cost_of(&out_leaf_shape, &c_out, &leaf_target);
        if let Some((od, rs, rc)) = reduce_scatter_choice(
            p,
            &c,
            &c_out,
            &red,
            &out_leaf_shape,
            &leaf_target,
            lo * bytes_out,
        ) {
            if rc < ar_cost {
                let id = p.b.reduce_scatter_with(local.id, od, &groups, to_apply)?;
                return Ok(Some(PValue {
                    id,
                    shape: Rc::new(instr.shape.clone()),
                    vs: ValueSharding::Grid(rs),
                }));
            }
        }
        let id = p.b.all_reduce_with(local.id, &groups, to_apply);
        return Ok(Some(PValue {
            id,
            shape: Rc::new(instr.shape.clone()),
            vs: out_vs,
        }));
    }
    // Variadic: gather the partial results and reduce them again.
    let g = groups.size;
    let leaves = lshape.tuple_elements().to_vec();
    let mut gathered = Vec::new();
    for (j, ls) in leaves.iter().enumerate() {
        let e = p.b.add(
            "get-tuple-element",
            Opcode::GetTupleElement,
            ls.clone(),
            vec![local.id],
            vec![(AttrKey::Index, AttrValue::Int(j as i64))],
        );
        let mut d1 = vec![1];
        d1.extend(ls.dims());
        let r1 = p.b.reshape(e, &d1);
        gathered.push(p.b.all_gather(r1, 0, &groups));
    }
    let _ = g;
    let mut ops2 = gathered;
    ops2.extend(&inits);
    let mut c2 = instr.clone();
    c2.name = p.b.ctx.fresh(&instr.name);
    c2.operands = ops2;
    c2.shape = lshape;
    c2.sharding = None;
    c2.control_predecessors.clear();
    c2.set_attr(AttrKey::Dimensions, AttrValue::Ints(vec![0]));
    let id = p.b.push(c2);
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: out_vs,
    }))
}

/// `c` with every tile of the reduced dims `red_sorted` (ascending) moved
/// onto the first of them, the device array read in the same row-major
/// order; `None` when they are not split or only the first is.
fn tiles_on_major_dim(c: &Grid, red_sorted: &[usize]) -> Option<Grid> {
    let (&major, _) = red_sorted.split_first()?;
    let tiles: i64 = red_sorted.iter().map(|&a| c.tiles(a)).product();
    if tiles <= 1 || c.tiles(major) == tiles {
        return None;
    }
    let mut dims = c.dims().to_vec();
    for &a in red_sorted {
        dims[a] = 1;
    }
    dims[major] = tiles;
    Grid::new(dims, c.devs().to_vec())
}

/// The cheapest reduce-scatter of a partial reduction (partial over the
/// tiled dims of `red` in `c`, laid out by `c_out`) onto an output dim:
/// (dim, resulting grid, bytes of the scatter plus the reshard to `target`).
fn reduce_scatter_choice(
    p: &Part<'_, '_>,
    c: &Grid,
    c_out: &Grid,
    red: &[usize],
    out_shape: &Shape,
    target: &Grid,
    ar_bytes: u64,
) -> Option<(usize, Grid, u64)> {
    let tiled: Vec<usize> = red.iter().copied().filter(|&a| c.tiles(a) > 1).collect();
    let g: i64 = tiled.iter().map(|&a| c.tiles(a)).product();
    let mut best: Option<(usize, Grid, u64)> = None;
    for (od, &x) in out_shape.dims().iter().enumerate() {
        if x % (c_out.tiles(od) * g) != 0 {
            continue;
        }
        let Some(rs) = c_out.reduce_scattered(c, &tiled, od) else {
            continue;
        };
        let cost = ar_bytes / g as u64 + p.cost_of(out_shape, &rs, target);
        if best.as_ref().map(|b| cost < b.2).unwrap_or(true) {
            best = Some((od, rs, cost));
        }
    }
    best
}

/// A bitcast-convert between element types of different widths: the
/// narrower side has one more, minor dim (the ratio of the widths), which
/// stays whole; the other dims are laid out alike on both sides, in the
/// cheapest of the output's layout and the operand's.
pub fn bitcast_convert_resized(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    let v = p.operand(instr, 0)?;
    let Some(vg) = v.vs.grid().cloned() else {
        return Ok(None);
    };
    let (ri, ro) = (v.shape.rank(), instr.shape.rank());
    if ri.abs_diff(ro) != 1 {
        return Ok(None);
    }
    let lead = ri.min(ro);
    let to_out: Vec<Option<usize>> = (0..ro).map(|d| (d < lead).then_some(d)).collect();
    let to_in: Vec<Option<usize>> = (0..ri).map(|d| (d < lead).then_some(d)).collect();
    let cands = [
        p.grids().remap(&out, &to_out),
        p.grids().remap(&vg, &to_out),
    ];
    let costed: Vec<(Grid, u64)> = cands
        .iter()
        .map(|c| {
            let og = p.grids().remap(c, &to_in);
            (
                c.clone(),
                p.cost(&v, &og) + p.cost_of(&instr.shape, c, &out),
            )
        })
        .collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let og = p.grids().remap(&c, &to_in);
    let x = p.reshard_to_grid(&v, &og)?;
    p.note(instr, "bitcast-convert");
    Ok(Some(p.emit_local(
        instr,
        vec![x],
        &ValueSharding::Grid(c),
    )?))
}

pub fn custom_call(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let tgt = instr.ident_attr(AttrKey::CustomCallTarget).unwrap_or("");
    match tgt {
        "Sharding" => {
            let v = p.operand(instr, 0)?;
            p.note(instr, "sharding");
            Ok(Some(p.reshard(&v, target)?))
        }
        "SPMDFullToShardShape" if matches!(target, ValueSharding::Grid(_)) => {
            // Into a partially manual region: the operand's tiles are the
            // manual groups' local tiles already (as in XLA, the export
            // gives the operand the matching sharding).
            let v = p.operand(instr, 0)?;
            let want = local_shape(&instr.shape, target);
            if p.b.dims(v.id) != want.dims() {
                return unsupported(format!(
                    "SPMDFullToShardShape: local shard {:?} is not the local shape {want} of the partially manual result",
                    p.b.dims(v.id)
                ));
            }
            let id = p.b.add("copy", Opcode::Copy, want, vec![v.id], vec![]);
            p.note(instr, "full-to-shard");
            Ok(Some(PValue {
                id,
                shape: Rc::new(instr.shape.clone()),
                vs: target.clone(),
            }))
        }
        "SPMDFullToShardShape" => {
            let v = p.operand(instr, 0)?;
            let got = p.b.dims(v.id);
            if got != instr.shape.dims() {
                return unsupported(format!(
                    "SPMDFullToShardShape: local shard {got:?} differs from {}",
                    instr.shape
                ));
            }
            let id = p.b.add(
                "copy",
                Opcode::Copy,
                instr.shape.clone(),
                vec![v.id],
                vec![],
            );
            p.note(instr, "full-to-shard");
            Ok(Some(PValue {
                id,
                shape: Rc::new(instr.shape.clone()),
                vs: ValueSharding::Manual,
            }))
        }
        "SPMDShardToFullShape" => {
            let v = p.operand(instr, 0)?;
            let want = local_shape(&instr.shape, target);
            if p.b.dims(v.id) != want.dims() {
                return unsupported(format!(
                    "SPMDShardToFullShape: shard {:?} is not the local shape {want}",
                    p.b.dims(v.id)
                ));
            }
            let id = p.b.add("copy", Opcode::Copy, want, vec![v.id], vec![]);
            p.note(instr, "shard-to-full");
            Ok(Some(PValue {
                id,
                shape: Rc::new(instr.shape.clone()),
                vs: target.clone(),
            }))
        }
        "TopK" => crate::reorder::topk_custom_call(p, instr, target),
        "LayoutConstraint" | "MoveToHost" | "MoveToDevice" if instr.operands.len() == 1 => {
            elementwise(p, instr, target)
        }
        _ => Ok(None),
    }
}
