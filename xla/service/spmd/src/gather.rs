//! Gather as an iteration space: the output dims, then the operand dims the
//! indices pick single rows from ("sliced" dims, e.g. an embedding table's
//! vocabulary). Operand batching dims and index batch dims follow the
//! output batch dims, operand dims taken whole by the slice follow their
//! output offset dims. A grid over that space gives the operand, indices
//! and output grids; tiling on a sliced dim means each device gathers from
//! its rows only, with shifted indices and a mask, and the partial results
//! are summed over the sliced dims' devices (XLA's "trivially sliced
//! operand" strategy); tiling on batch dims needs no communication (index
//! passthrough / explicit batch). Candidates come from the output, the
//! operand and the indices; the cheapest in bytes wins.
//!
//! Invariant: a masked local gather contributes zero for every index outside
//! the device's rows (after XLA's clamping of start indices), so the sum
//! over the sliced dims' devices is exact.

use crate::error::SpmdError;
use crate::grid::{local_dims, tile_size, Grid, GridCache};
use crate::helpers::{cheapest, to_ty, HandlerResult};
use crate::part::Part;
use crate::value::{local_shape, PValue, ValueSharding};
use std::rc::Rc;
use xla_hlo_ir::{
    AttrKey, AttrValue, HloComputation, HloInstruction, HloModule, InstrId, Opcode, PrimitiveType,
    Shape,
};

fn lift(grids: &GridCache, g: &Grid, map: &[Option<usize>], ni: usize) -> Grid {
    let m: Vec<Option<usize>> = (0..ni)
        .map(|i| map.iter().position(|&d| d == Some(i)))
        .collect();
    grids.remap(g, &m)
}

fn elems(d: &[i64]) -> u64 {
    d.iter().map(|&x| x.max(0) as u64).product()
}

/// How far [`iota_dim`] follows broadcasts, copies and parameters.
const MAX_IOTA_DEPTH: usize = 16;

/// The one instruction of `module` that calls computation `comp`, if it
/// has exactly one caller.
fn only_caller<'m>(
    module: &'m HloModule,
    comp: &HloComputation,
) -> Option<(&'m HloComputation, &'m HloInstruction)> {
    let id = module
        .computations
        .iter()
        .position(|c| std::ptr::eq(c, comp))?;
    let mut callers = module.computations.iter().flat_map(|c| {
        c.instructions
            .iter()
            .filter(move |i| i.called_computation_ids().any(|k| k.index() == id))
            .map(move |i| (c, i))
    });
    let first = callers.next()?;
    callers.next().is_none().then_some(first)
}

/// The value a `while` body's or a branch's parameter element `index`
/// (`None`: the whole parameter) holds on entry, in its caller, when that
/// is the same on every trip: a loop's element is passed through unchanged
/// by the body, a branch's is read once. The argument must be a `tuple`
/// instruction to name an element.
fn parameter_source<'m>(
    module: &'m HloModule,
    comp: &HloComputation,
    use_id: InstrId,
    index: Option<usize>,
) -> Option<(&'m HloComputation, InstrId)> {
    let (caller_comp, caller) = only_caller(module, comp)?;
    let argument = match caller.opcode {
        Opcode::While => {
            if caller.computation_attr(AttrKey::Body).map(|b| b.index())
                != module
                    .computations
                    .iter()
                    .position(|c| std::ptr::eq(c, comp))
            {
                return None;
            }
            let root = comp.instr(comp.root);
            let passed_through = match index {
                Some(k) => root.opcode == Opcode::Tuple && root.operands.get(k) == Some(&use_id),
                None => comp.root == use_id,
            };
            if !passed_through {
                return None;
            }
            *caller.operands.first()?
        }
        Opcode::Conditional => {
            let id = module
                .computations
                .iter()
                .position(|c| std::ptr::eq(c, comp))?;
            let branch = caller
                .called_computation_ids()
                .position(|c| c.index() == id)?;
            *caller.operands.get(branch + 1)?
        }
        _ => return None,
    };
    match index {
        None => Some((caller_comp, argument)),
        Some(k) => {
            let tuple = caller_comp.instructions.get(argument.index())?;
            (tuple.opcode == Opcode::Tuple).then_some(())?;
            Some((caller_comp, *tuple.operands.get(k)?))
        }
    }
}

/// The dim along which `id` of `comp` counts its own index (an `iota`, a
/// broadcast or copy of one, an s32 constant equal to its index along a
/// dim of size > 1, or a loop or branch parameter (element) that holds one
/// from the only caller), as XLA's `GetDimensionForIota`.
fn iota_dim(module: &HloModule, comp: &HloComputation, id: InstrId, depth: usize) -> Option<usize> {
    let instr = comp.instructions.get(id.index())?;
    if depth > MAX_IOTA_DEPTH {
        return None;
    }
    match instr.opcode {
        Opcode::Iota => instr.int_attr(AttrKey::IotaDimension).map(|d| d as usize),
        _ if instr.shape.element_type() != Some(PrimitiveType::S32) => None,
        Opcode::Copy => iota_dim(module, comp, *instr.operands.first()?, depth + 1),
        Opcode::Broadcast => {
            let d = iota_dim(module, comp, *instr.operands.first()?, depth + 1)?;
            instr.dimensions().get(d).map(|&d| d as usize)
        }
        Opcode::Parameter => {
            let (caller_comp, source) = parameter_source(module, comp, id, None)?;
            iota_dim(module, caller_comp, source, depth + 1)
        }
        Opcode::GetTupleElement => {
            let tuple = comp.instructions.get(instr.operands.first()?.index())?;
            if tuple.opcode != Opcode::Parameter {
                return None;
            }
            let index = usize::try_from(instr.int_attr(AttrKey::Index)?).ok()?;
            let (caller_comp, source) = parameter_source(module, comp, id, Some(index))?;
            iota_dim(module, caller_comp, source, depth + 1)
        }
        Opcode::Constant => {
            let xla_hlo_ir::Literal::Array(lit) = instr.literal.as_deref()? else {
                return None;
            };
            if lit.elided {
                return None;
            }
            let dims = instr.shape.dims();
            let mut strides = vec![1i64; dims.len()];
            for d in (0..dims.len().saturating_sub(1)).rev() {
                strides[d] = strides[d + 1] * dims[d + 1];
            }
            (0..dims.len()).find(|&d| {
                dims[d] > 1
                    && (0..lit.len())
                        .all(|e| lit.get_i128(e) == ((e as i64 / strides[d]) % dims[d]) as i128)
            })
        }
        _ => None,
    }
}

/// An index-parallel dim of a gather or scatter: operand dim `operand`
/// is addressed by index component `component`, whose value is its own
/// position along indices dim `indices`, so the two dims can be tiled
/// alike (XLA's `GetGatherScatterBatchParallelDims`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct ParallelDim {
    operand: usize,
    indices: usize,
    component: usize,
}

/// How a gather or scatter addresses its operand through its indices:
/// the slice (or window) size per operand dim, the index vector dim, the
/// operand dim each index component addresses, and the indices' batching
/// dims.
struct IndexAddressing<'a> {
    slice_sizes: &'a [i64],
    index_vector_dim: usize,
    index_map: &'a [usize],
    indices_batching: &'a [usize],
}

/// The index-parallel dims of a gather or scatter whose indices are
/// `indices` (looked through copies to a concatenate along the index
/// vector dim of iotas): components that are an iota along a non-batching
/// indices dim, addressing an operand dim of slice size 1 and of the same
/// size. Empty when an indices dim would pair with two operand dims, or
/// the sizes differ.
fn parallel_dims(
    module: &HloModule,
    comp: &HloComputation,
    operand_dims: &[i64],
    indices: InstrId,
    addressing: &IndexAddressing<'_>,
) -> Vec<ParallelDim> {
    let IndexAddressing {
        slice_sizes,
        index_vector_dim: ivd,
        index_map,
        indices_batching,
    } = *addressing;
    let Some(ix) = comp.instructions.get(indices.index()) else {
        return Vec::new();
    };
    let index_dims = ix.shape.dims().to_vec();
    let mut node = indices;
    while let Some(i) = comp.instructions.get(node.index()) {
        match (i.opcode, i.operands.first()) {
            (Opcode::Copy, Some(&o)) => node = o,
            _ => break,
        }
    }
    let width = |id: InstrId| {
        comp.instructions
            .get(id.index())
            .map(|i| i.shape.dims().get(ivd).copied().unwrap_or(1).max(0) as usize)
            .unwrap_or(0)
    };
    let mut along: Vec<Option<usize>> = vec![None; index_map.len()];
    let cat = comp.instructions.get(node.index());
    if let Some(cat) = cat.filter(|c| {
        c.opcode == Opcode::Concatenate && c.dimensions().first() == Some(&(ivd as i64))
    }) {
        let mut at = 0;
        for &o in &cat.operands {
            let w = width(o);
            if let Some(d) = iota_dim(module, comp, o, 0).filter(|&d| d != ivd) {
                for k in at..(at + w).min(along.len()) {
                    along[k] = Some(d);
                }
            }
            at += w;
        }
    } else if let Some(d) = iota_dim(module, comp, indices, 0).filter(|&d| d != ivd) {
        along.iter_mut().for_each(|a| *a = Some(d));
    }
    let mut out: Vec<ParallelDim> = Vec::new();
    for (k, a) in along.iter().enumerate() {
        let (Some(j), Some(&d)) = (*a, index_map.get(k)) else {
            continue;
        };
        if out.iter().any(|p| p.indices == j) {
            return Vec::new();
        }
        if slice_sizes.get(d) == Some(&1) && !indices_batching.contains(&j) {
            if operand_dims.get(d) != index_dims.get(j) {
                return Vec::new();
            }
            out.push(ParallelDim {
                operand: d,
                indices: j,
                component: k,
            });
        }
    }
    out
}

/// Subtracts from index components the device's tile offset: `shifts`
/// lists (component, operand dim), laid out by `g` over operand dims
/// `od`.
fn shift_components(
    p: &mut Part<'_, '_>,
    y: InstrId,
    ivd: usize,
    g: &Grid,
    od: &[i64],
    shifts: &[(usize, usize)],
) -> Result<InstrId, SpmdError> {
    if shifts.is_empty() {
        return Ok(y);
    }
    let ty = p.b.ty(y)?;
    let yd = p.b.dims(y);
    let implicit = ivd >= yd.len();
    let ncomp = if implicit { 1 } else { yd[ivd] as usize };
    let mut comps = Vec::new();
    for k in 0..ncomp {
        let comp = if implicit {
            y
        } else {
            let mut rg: Vec<(i64, i64, i64)> = yd.iter().map(|&d| (0, d, 1)).collect();
            rg[ivd] = (k as i64, k as i64 + 1, 1);
            p.b.slice(y, &rg)
        };
        match shifts.iter().find(|s| s.0 == k) {
            Some(&(_, d)) => {
                let ts = tile_size(od[d], g.tiles(d));
                let off = to_ty(p, &p.grids().offsets(g, d, ts), ty)?;
                let cd = p.b.dims(comp);
                let ob = p.b.splat(off, &cd);
                comps.push(p.b.binary(Opcode::Subtract, comp, ob));
            }
            None => comps.push(comp),
        }
    }
    Ok(if implicit {
        comps[0]
    } else {
        p.b.concatenate(comps, ivd)
    })
}

pub fn gather(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let Some(out) = target.grid().cloned() else {
        return Ok(None);
    };
    let op = p.operand(instr, 0)?;
    let ix = p.operand(instr, 1)?;
    let (Some(og), Some(ig)) = (op.vs.grid().cloned(), ix.vs.grid().cloned()) else {
        return Ok(None);
    };
    let dn = instr.gather_dimension_numbers();
    let Some(sizes) = instr.ints_attr(AttrKey::SliceSizes).map(|s| s.to_vec()) else {
        return Ok(None);
    };
    let od = op.shape.dims().to_vec();
    let id = ix.shape.dims().to_vec();
    let ro = instr.shape.rank();
    let (rop, ri) = (od.len(), id.len());
    let ivd = dn.index_vector_dim as usize;
    if sizes.len() != rop
        || ivd > ri
        || dn.offset_dims.iter().any(|&d| d < 0 || d as usize >= ro)
        || dn
            .collapsed_slice_dims
            .iter()
            .chain(&dn.operand_batching_dims)
            .chain(&dn.start_index_map)
            .any(|&d| d < 0 || d as usize >= rop)
        || dn
            .start_indices_batching_dims
            .iter()
            .any(|&d| d < 0 || d as usize >= ri)
    {
        return Ok(None);
    }
    let offset: Vec<usize> = dn.offset_dims.iter().map(|&d| d as usize).collect();
    let collapsed: Vec<usize> = dn
        .collapsed_slice_dims
        .iter()
        .map(|&d| d as usize)
        .collect();
    let obatch: Vec<usize> = dn
        .operand_batching_dims
        .iter()
        .map(|&d| d as usize)
        .collect();
    let ibatch: Vec<usize> = dn
        .start_indices_batching_dims
        .iter()
        .map(|&d| d as usize)
        .collect();
    let sim: Vec<usize> = dn.start_index_map.iter().map(|&d| d as usize).collect();
    let out_batch: Vec<usize> = (0..ro).filter(|d| !offset.contains(d)).collect();
    let idx_batch: Vec<usize> = (0..ri).filter(|&d| d != ivd).collect();
    if out_batch.len() != idx_batch.len() {
        return Ok(None);
    }
    // Indices dims -> iteration dims.
    let idx_map: Vec<Option<usize>> = (0..ri)
        .map(|j| idx_batch.iter().position(|&b| b == j).map(|k| out_batch[k]))
        .collect();
    // Operand dims -> iteration dims; sliced dims get ro + k.
    let mut op_map: Vec<Option<usize>> = vec![None; rop];
    let mut sliced: Vec<usize> = Vec::new();
    let offset_operand: Vec<usize> = (0..rop)
        .filter(|d| !collapsed.contains(d) && !obatch.contains(d))
        .collect();
    let parallel = parallel_dims(
        p.orig,
        p.orig_comp,
        &od,
        instr.operands[1],
        &IndexAddressing {
            slice_sizes: &sizes,
            index_vector_dim: ivd,
            index_map: &sim,
            indices_batching: &ibatch,
        },
    );
    for d in 0..rop {
        if let Some(i) = obatch.iter().position(|&b| b == d) {
            op_map[d] = ibatch
                .get(i)
                .and_then(|&j| idx_map.get(j).copied().flatten());
        } else if let Some(pd) = parallel.iter().find(|pd| pd.operand == d) {
            // Index-parallel: tiled like the indices dim, whose index
            // component is shifted to the tile.
            op_map[d] = idx_map.get(pd.indices).copied().flatten();
        } else if sim.contains(&d) && sizes[d] == 1 && od[d] > 1 {
            op_map[d] = Some(ro + sliced.len());
            sliced.push(d);
        } else if let Some(k) = offset_operand.iter().position(|&x| x == d) {
            if sizes[d] == od[d] {
                op_map[d] = offset.get(k).copied();
            }
        }
    }
    let ni = ro + sliced.len();
    let out_map: Vec<Option<usize>> = (0..ro).map(Some).collect();
    let i_o = lift(p.grids(), &out, &out_map, ni);
    let i_op = lift(p.grids(), &og, &op_map, ni);
    let i_ix = lift(p.grids(), &ig, &idx_map, ni);
    let sl_iter: Vec<usize> = (ro..ni).collect();
    let mut cands = vec![i_o.clone(), i_op.clone(), i_ix.clone()];
    cands.extend(p.grids().merge(&i_o, &i_op, &sl_iter));
    cands.extend(p.grids().merge(&i_ix, &i_op, &sl_iter));
    let bytes = instr
        .shape
        .element_type()
        .map(|t| t.byte_width().max(1))
        .unwrap_or(4) as u64;
    let costed: Vec<(Grid, u64)> = cands
        .into_iter()
        .map(|c| {
            let gop = p.grids().remap(&c, &op_map);
            let gix = p.grids().remap(&c, &idx_map);
            let go = p.grids().remap(&c, &out_map);
            let mut cost =
                p.cost(&op, &gop) + p.cost(&ix, &gix) + p.cost_of(&instr.shape, &go, &out);
            if sl_iter.iter().any(|&s| c.tiles(s) > 1) {
                cost += elems(&local_dims(instr.shape.dims(), &go)) * bytes;
            }
            (c, cost)
        })
        .collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let gop = p.grids().remap(&c, &op_map);
    let gix = p.grids().remap(&c, &idx_map);
    let go = p.grids().remap(&c, &out_map);
    let x = p.reshard_to_grid(&op, &gop)?;
    let mut y = p.reshard_to_grid(&ix, &gix)?;
    let parallel_shifts: Vec<(usize, usize)> = parallel
        .iter()
        .filter(|pd| gop.tiles(pd.operand) > 1)
        .map(|pd| (pd.component, pd.operand))
        .collect();
    y = shift_components(p, y, ivd, &gop, &od, &parallel_shifts)?;
    let tiled_sliced: Vec<(usize, usize)> = sliced
        .iter()
        .enumerate()
        .filter(|(k, _)| c.tiles(ro + k) > 1)
        .map(|(k, &d)| (k, d))
        .collect();
    let mut mask: Option<InstrId> = None;
    if !tiled_sliced.is_empty() {
        let (ny, m) = shift_indices(p, y, &gop, &od, &sim, ivd, &tiled_sliced)?;
        y = ny;
        mask = Some(m);
    }
    // Local slice sizes: whole operand dims take their local size.
    let lop = local_dims(&od, &gop);
    let mut lsizes = sizes.clone();
    for d in 0..rop {
        if sizes[d] == od[d] {
            lsizes[d] = lop[d];
        }
    }
    let mut local = instr.clone();
    local.set_attr(AttrKey::SliceSizes, AttrValue::Ints(lsizes));
    let vs = ValueSharding::Grid(go.clone());
    let g = p.emit_local(&local, vec![x, y], &vs)?;
    p.note(
        instr,
        if mask.is_some() {
            "gather-masked"
        } else {
            "gather"
        },
    );
    let Some(m) = mask else {
        return Ok(Some(PValue {
            shape: Rc::new(instr.shape.clone()),
            ..g
        }));
    };
    let lo = p.b.dims(g.id);
    let mb = p.b.broadcast(
        m,
        &lo,
        &out_batch.iter().map(|&d| d as i64).collect::<Vec<_>>(),
    );
    let z = p.b.zero_of(g.id)?;
    let zb = p.b.splat(z, &lo);
    let sel = p.b.select(mb, g.id, zb);
    let factors: Vec<(usize, i64)> = tiled_sliced
        .iter()
        .map(|&(k, _)| (ro + k, c.tiles(ro + k)))
        .collect();
    let groups = p.grids().factor_groups(&c, &factors);
    let ar = p.b.all_reduce(sel, &groups, Opcode::Add)?;
    Ok(Some(PValue {
        id: ar,
        shape: Rc::new(instr.shape.clone()),
        vs,
    }))
}

/// Shifts the index components of the tiled sliced operand dims to the
/// device's rows (after XLA's clamping) and returns the new indices and a
/// pred over the batch dims: true where every shifted index is in range.
#[allow(clippy::too_many_arguments)]
fn shift_indices(
    p: &mut Part<'_, '_>,
    y: InstrId,
    gop: &Grid,
    od: &[i64],
    sim: &[usize],
    ivd: usize,
    tiled: &[(usize, usize)],
) -> Result<(InstrId, InstrId), SpmdError> {
    let ty = p.b.ty(y)?;
    let yd = p.b.dims(y);
    let rank = yd.len();
    let implicit = ivd >= rank;
    let ncomp = if implicit { 1 } else { yd[ivd] };
    let mut comps = Vec::new();
    let mut mask: Option<InstrId> = None;
    // Batch dims shape (index vector dim removed).
    let bdims: Vec<i64> = (0..rank).filter(|&d| d != ivd).map(|d| yd[d]).collect();
    for k in 0..ncomp as usize {
        let comp = if implicit {
            y
        } else {
            let mut rg: Vec<(i64, i64, i64)> = yd.iter().map(|&d| (0, d, 1)).collect();
            rg[ivd] = (k as i64, k as i64 + 1, 1);
            p.b.slice(y, &rg)
        };
        let d = sim.get(k).copied();
        let Some(d) = d.filter(|d| tiled.iter().any(|t| t.1 == *d)) else {
            comps.push(comp);
            continue;
        };
        let cd = p.b.dims(comp);
        let x = od[d];
        let t = gop.tiles(d);
        let ts = tile_size(x, t);
        let lo = p.b.scalar(ty, 0);
        let hi = p.b.scalar(ty, x - 1);
        let lob = p.b.splat(lo, &cd);
        let hib = p.b.splat(hi, &cd);
        let clamped = p.b.add(
            "clamp",
            Opcode::Clamp,
            p.b.shape(comp).clone(),
            vec![lob, comp, hib],
            vec![],
        );
        let offs = p.grids().offsets(gop, d, ts);
        let valid = p.grids().per_coord(
            gop,
            d,
            &(0..t)
                .map(|i| (x - i * ts).clamp(0, ts))
                .collect::<Vec<_>>(),
        );
        let off = to_ty(p, &offs, ty)?;
        let offb = p.b.splat(off, &cd);
        let shifted = p.b.binary(Opcode::Subtract, clamped, offb);
        let vv = to_ty(p, &valid, ty)?;
        let vb = p.b.splat(vv, &cd);
        let z = p.b.scalar(ty, 0);
        let zb = p.b.splat(z, &cd);
        let ge = p.b.compare(shifted, zb, "GE");
        let lt = p.b.compare(shifted, vb, "LT");
        let ok = p.b.binary(Opcode::And, ge, lt);
        let ok = p.b.reshape(ok, &bdims);
        mask = Some(match mask {
            Some(m) => p.b.binary(Opcode::And, m, ok),
            None => ok,
        });
        comps.push(shifted);
    }
    let ny = if implicit {
        comps[0]
    } else {
        p.b.concatenate(comps, ivd)
    };
    let m = match mask {
        Some(m) => m,
        None => {
            let t = p.b.scalar(PrimitiveType::Pred, 1);
            p.b.splat(t, &bdims)
        }
    };
    Ok((ny, m))
}

#[allow(dead_code)]
fn local_out(instr: &HloInstruction, vs: &ValueSharding) -> Shape {
    local_shape(&instr.shape, vs)
}

/// Scatter with the operand sharded on dims the indices address one row of
/// (rows outside a device's tile are skipped by scatter's own bounds rule
/// once the indices are shifted to the tile) and on window dims the updates
/// cover whole: a local scatter, no communication. Indices are replicated,
/// updates follow the operand on their window dims. A variadic scatter (N
/// operands, indices, N updates; every output sharded alike) is laid out by
/// its first operand and update, the others following. Other cases fall
/// back.
pub fn scatter(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    target: &ValueSharding,
) -> HandlerResult {
    let count = instr.operands.len();
    if count < 3 || count % 2 == 0 {
        return Ok(None);
    }
    let n = count / 2;
    let out = match target {
        ValueSharding::Grid(g) if n == 1 => g.clone(),
        ValueSharding::Tuple(leaves) if n > 1 && leaves.len() == n => match leaves[0].grid() {
            Some(g) if leaves.iter().all(|l| l.grid() == Some(g)) => g.clone(),
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    let inputs: Vec<PValue> = (0..n)
        .map(|k| p.operand(instr, k))
        .collect::<Result<_, _>>()?;
    let ix = p.operand(instr, n)?;
    let updates: Vec<PValue> = (n + 1..count)
        .map(|k| p.operand(instr, k))
        .collect::<Result<_, _>>()?;
    let op = inputs[0].clone();
    let up = updates[0].clone();
    let Some(og) = op.vs.grid().cloned() else {
        return Ok(None);
    };
    let dn = instr.scatter_dimension_numbers();
    let od = op.shape.dims().to_vec();
    let ud = up.shape.dims().to_vec();
    let rop = od.len();
    let uwd: Vec<usize> = dn.update_window_dims.iter().map(|&d| d as usize).collect();
    let inserted: Vec<usize> = dn
        .inserted_window_dims
        .iter()
        .map(|&d| d as usize)
        .collect();
    let ibatch: Vec<usize> = dn.input_batching_dims.iter().map(|&d| d as usize).collect();
    let sdod: Vec<usize> = dn
        .scatter_dims_to_operand_dims
        .iter()
        .map(|&d| d as usize)
        .collect();
    if uwd.iter().any(|&d| d >= ud.len())
        || inserted
            .iter()
            .chain(&ibatch)
            .chain(&sdod)
            .any(|&d| d >= rop)
    {
        return Ok(None);
    }
    let window_operand: Vec<usize> = (0..rop)
        .filter(|d| !inserted.contains(d) && !ibatch.contains(d))
        .collect();
    if window_operand.len() != uwd.len() {
        return Ok(None);
    }
    // Window size of each operand dim (inserted dims: 1).
    let mut wsize = vec![1i64; rop];
    let mut upd_of = vec![None; rop];
    for (k, &d) in window_operand.iter().enumerate() {
        wsize[d] = ud[uwd[k]];
        upd_of[d] = Some(uwd[k]);
    }
    // Dims that may stay tiled: single-row dims the indices address, and
    // window dims the updates cover whole.
    let mut allowed = vec![false; rop];
    let mut sliced = vec![false; rop];
    // Operand batching dims may stay tiled when the indices' batching dims
    // and the matching update dims are tiled the same way (each device
    // scatters its own batch rows).
    let sibd: Vec<usize> = dn
        .scatter_indices_batching_dims
        .iter()
        .map(|&d| d as usize)
        .collect();
    let ivd = dn.index_vector_dim as usize;
    let ix_rank = ix.shape.rank();
    let index_batch: Vec<usize> = (0..ix_rank).filter(|&j| j != ivd).collect();
    let update_scatter: Vec<usize> = (0..ud.len()).filter(|j| !uwd.contains(j)).collect();
    // For operand batching dim ibatch[k]: its indices dim and update dim.
    let batch_links: Option<Vec<(usize, usize, usize)>> = (sibd.len() == ibatch.len()
        && index_batch.len() == update_scatter.len())
    .then(|| {
        ibatch
            .iter()
            .zip(&sibd)
            .filter_map(|(&od_k, &ij)| {
                let m = index_batch.iter().position(|&j| j == ij)?;
                Some((od_k, ij, update_scatter[m]))
            })
            .collect::<Vec<_>>()
    })
    .filter(|v| v.len() == ibatch.len() && sibd.iter().all(|&j| j < ix_rank));
    // Index-parallel dims link like batching dims (operand dim, indices
    // dim, update dim); the operand dim is also single-row addressed, so
    // its index component is shifted to the tile.
    let scatter_sizes: Vec<i64> = wsize.clone();
    let parallel = if index_batch.len() == update_scatter.len() {
        parallel_dims(
            p.orig,
            p.orig_comp,
            &od,
            instr.operands[n],
            &IndexAddressing {
                slice_sizes: &scatter_sizes,
                index_vector_dim: ivd,
                index_map: &sdod,
                indices_batching: &sibd,
            },
        )
    } else {
        Vec::new()
    };
    let parallel_links: Vec<(usize, usize, usize)> = parallel
        .iter()
        .filter_map(|pd| {
            let m = index_batch.iter().position(|&j| j == pd.indices)?;
            Some((pd.operand, pd.indices, update_scatter[m]))
        })
        .collect();
    let batch_links = batch_links.map(|mut v| {
        v.extend(parallel_links.iter().copied());
        v
    });
    for d in 0..rop {
        if ibatch.contains(&d) {
            allowed[d] = batch_links.is_some();
            continue;
        }
        if sdod.contains(&d) && wsize[d] == 1 && od[d] > 1 {
            allowed[d] = true;
            sliced[d] = true;
        } else if upd_of[d].is_some() && wsize[d] == od[d] {
            allowed[d] = true;
        }
    }
    // An unevenly tiled index-parallel dim would scatter the updates at
    // the indices' padding positions: kept whole.
    let restrict = |g: &Grid| {
        let bad: Vec<usize> = (0..rop)
            .filter(|&d| {
                g.tiles(d) > 1
                    && (!allowed[d]
                        || (parallel_links.iter().any(|l| l.0 == d) && od[d] % g.tiles(d) != 0))
            })
            .collect();
        p.grids().replicate_dims(g, &bad)
    };
    let links = batch_links.clone().unwrap_or_default();
    let upd_map = |grids: &GridCache, g: &Grid| -> Grid {
        let map: Vec<Option<usize>> = (0..ud.len())
            .map(|j| {
                (0..rop)
                    .find(|&d| upd_of[d] == Some(j) && !sliced[d])
                    .or_else(|| links.iter().find(|l| l.2 == j).map(|l| l.0))
            })
            .collect();
        grids.remap(g, &map)
    };
    let ix_map = |grids: &GridCache, g: &Grid| -> Grid {
        let map: Vec<Option<usize>> = (0..ix_rank)
            .map(|j| links.iter().find(|l| l.1 == j).map(|l| l.0))
            .collect();
        grids.remap(g, &map)
    };
    // The updates' and the indices' layouts carried back to operand dims.
    let from_updates: Vec<Option<usize>> = (0..rop)
        .map(|d| {
            upd_of[d]
                .filter(|_| !sliced[d])
                .or_else(|| links.iter().find(|l| l.0 == d).map(|l| l.2))
        })
        .collect();
    let from_indices: Vec<Option<usize>> = (0..rop)
        .map(|d| links.iter().find(|l| l.0 == d).map(|l| l.1))
        .collect();
    let mut cands = vec![restrict(&out)];
    let mut others = vec![restrict(&og)];
    if let Some(g) = up.vs.grid().filter(|g| g.rank() == ud.len()) {
        others.push(restrict(&p.grids().remap(g, &from_updates)));
    }
    if let Some(g) = ix.vs.grid().filter(|g| g.rank() == ix_rank) {
        others.push(restrict(&p.grids().remap(g, &from_indices)));
    }
    for c in others {
        if !cands.contains(&c) {
            cands.push(c);
        }
    }
    let costed: Vec<(Grid, u64)> = cands
        .into_iter()
        .map(|c| {
            let update_grid = upd_map(p.grids(), &c);
            let cost = inputs.iter().map(|x| p.cost(x, &c)).sum::<u64>()
                + updates.iter().map(|u| p.cost(u, &update_grid)).sum::<u64>()
                + p.cost(&ix, &ix_map(p.grids(), &c))
                + n as u64 * p.cost_of(&op.shape, &c, &out);
            (c, cost)
        })
        .collect();
    let Some(c) = cheapest(&costed) else {
        return Ok(None);
    };
    let best = costed
        .iter()
        .find(|x| x.0 == c)
        .map(|x| x.1)
        .unwrap_or(u64::MAX);
    // Operand batching dims with their update dims.
    let batch: Option<Vec<(usize, usize)>> = if ibatch.is_empty() {
        Some(Vec::new())
    } else {
        batch_links.as_ref().map(|links| {
            links
                .iter()
                .filter(|l| ibatch.contains(&l.0))
                .map(|l| (l.0, l.2))
                .collect()
        })
    };
    if let (Some(batch), 1) = (batch, n) {
        let reduce_args = (sliced.as_slice(), batch.as_slice(), best);
        if let Some(v) = scatter_reduce(p, instr, &out, (&op, &ix, &up), &uwd, reduce_args)? {
            return Ok(Some(v));
        }
    }
    let xs: Vec<InstrId> = inputs
        .iter()
        .map(|x| p.reshard_to_grid(x, &c))
        .collect::<Result<_, _>>()?;
    let update_grid = upd_map(p.grids(), &c);
    let us: Vec<InstrId> = updates
        .iter()
        .map(|u| p.reshard_to_grid(u, &update_grid))
        .collect::<Result<_, _>>()?;
    let mut y = p.reshard_to_grid(&ix, &ix_map(p.grids(), &c))?;
    let shifts: Vec<(usize, usize)> = sdod
        .iter()
        .enumerate()
        .filter(|&(_, &d)| sliced[d] && c.tiles(d) > 1)
        .map(|(k, &d)| (k, d))
        .collect();
    y = shift_components(p, y, ivd, &c, &od, &shifts)?;
    p.note(instr, "scatter");
    let local_operands: Vec<InstrId> = xs.into_iter().chain([y]).chain(us).collect();
    let sharding = if n == 1 {
        ValueSharding::Grid(c)
    } else {
        ValueSharding::Tuple(vec![ValueSharding::Grid(c); n])
    };
    Ok(Some(p.emit_local(instr, local_operands, &sharding)?))
}

/// The combiner op of a scatter whose `to_apply` is `(x, y) -> op(x, y)`
/// for an op with an identity (add, or, and float max/min), with the
/// identity, for element type `ty`.
fn add_like_combiner(
    p: &Part<'_, '_>,
    instr: &HloInstruction,
    ty: PrimitiveType,
) -> Option<(Opcode, f64)> {
    let cid = instr.to_apply()?;
    let comp = p.orig.computations.get(cid.index())?;
    if comp.parameters.len() != 2 {
        return None;
    }
    let root = comp.root_instr();
    let [a, b] = root.operands[..] else {
        return None;
    };
    let is_param = |id: InstrId, k: i64| {
        comp.instructions
            .get(id.index())
            .is_some_and(|i| i.opcode == Opcode::Parameter && i.parameter_number == Some(k))
    };
    if !((is_param(a, 0) && is_param(b, 1)) || (is_param(a, 1) && is_param(b, 0))) {
        return None;
    }
    let float = ty.is_float();
    match root.opcode {
        Opcode::Add if ty != PrimitiveType::Pred && !ty.is_complex() => Some((Opcode::Add, 0.0)),
        Opcode::Or if ty == PrimitiveType::Pred || (!float && !ty.is_complex()) => {
            Some((Opcode::Or, 0.0))
        }
        Opcode::Maximum if float => Some((Opcode::Maximum, f64::NEG_INFINITY)),
        Opcode::Minimum if float => Some((Opcode::Minimum, f64::INFINITY)),
        _ => None,
    }
}

/// The tiled dims of update grid `gu` (with their tile counts) other than
/// the update dims of operand batching dims (`batch`: operand dim, update
/// dim).
fn reduced_factors(gu: &Grid, batch: &[(usize, usize)]) -> Vec<(usize, i64)> {
    gu.tiled_dims()
        .into_iter()
        .filter(|d| !batch.iter().any(|b| b.1 == *d))
        .map(|d| (d, gu.tiles(d)))
        .collect()
}

/// Scatter with an add-like combiner as a local scatter of each device's
/// update shard (tiled on update scatter dims only, evenly) into an
/// identity-filled buffer, an all-reduce over the devices holding different
/// shards, then `op(operand, sum)` laid out by `out`. The buffer is the
/// whole operand, or a tile of it evenly split on dims the indices address
/// one row at a time (`out`'s or the operand's tiling there, XLA's
/// "trivially sliced operand"), when every all-reduce group holds one
/// buffer tile: the index components are shifted to the tile and updates
/// outside it are skipped, as scatter skips out-of-bounds windows. With
/// operand batching dims whose update dims are tiled, the buffer is the
/// operand tiled like them there (each device's batch rows) and only the
/// other update tiles are summed. Taken
/// only when its bytes (resharding updates and indices, the all-reduce,
/// resharding the operand and the sum to `out`) are below `best`.
fn scatter_reduce(
    p: &mut Part<'_, '_>,
    instr: &HloInstruction,
    out: &Grid,
    (op, ix, up): (&PValue, &PValue, &PValue),
    uwd: &[usize],
    (sliced, batch, best): (&[bool], &[(usize, usize)], u64),
) -> HandlerResult {
    let Some(ty) = instr.shape.element_type() else {
        return Ok(None);
    };
    if !instr.shape.is_array() || !up.shape.is_array() || !ix.shape.is_array() {
        return Ok(None);
    }
    let Some((cop, ident)) = add_like_combiner(p, instr, ty) else {
        return Ok(None);
    };
    // Summing scatters across devices reorders an order-sensitive combiner.
    if p.b.ctx.consistent && !crate::consistent::reducer_is_order_free(p.orig, instr.to_apply(), ty)
    {
        p.note(instr, crate::consistent::RELAYOUT_NOTE);
        return Ok(None);
    }
    let dn = instr.scatter_dimension_numbers();
    let ud = up.shape.dims().to_vec();
    let xd = ix.shape.dims().to_vec();
    let od = instr.shape.dims().to_vec();
    let ivd = dn.index_vector_dim as usize;
    let usd: Vec<usize> = (0..ud.len()).filter(|d| !uwd.contains(d)).collect();
    let isd: Vec<usize> = (0..xd.len()).filter(|&d| d != ivd).collect();
    if usd.len() != isd.len() || usd.iter().zip(&isd).any(|(&u, &i)| ud[u] != xd[i]) {
        return Ok(None);
    }
    // Candidate update grids: the updates' own and the indices', keeping
    // only even tilings of the update scatter dims.
    let even = |g: &Grid| -> Grid {
        let drop: Vec<usize> = (0..ud.len())
            .filter(|&d| g.tiles(d) > 1 && (!usd.contains(&d) || ud[d] % g.tiles(d) != 0))
            .collect();
        p.grids().replicate_dims(g, &drop)
    };
    let mut cands: Vec<Grid> = Vec::new();
    if let Some(g) = up.vs.grid() {
        cands.push(even(g));
    }
    if let Some(g) = ix.vs.grid() {
        let map: Vec<Option<usize>> = (0..ud.len())
            .map(|d| usd.iter().position(|&u| u == d).map(|k| isd[k]))
            .collect();
        let c = even(&p.grids().remap(g, &map));
        if !cands.contains(&c) {
            cands.push(c);
        }
    }
    let n = p.n();
    let repl = p.grids().replicated(od.len(), n);
    // Buffer layouts: replicated, and `out`'s and the operand's tiling of
    // the evenly split single-row dims.
    let mut buffers = vec![repl];
    for g in [Some(out), op.vs.grid()].into_iter().flatten() {
        let drop: Vec<usize> = (0..od.len())
            .filter(|&d| g.tiles(d) > 1 && (!sliced[d] || od[d] % g.tiles(d) != 0))
            .collect();
        let b = p.grids().replicate_dims(g, &drop);
        if b.rank() == od.len() && !buffers.contains(&b) {
            buffers.push(b);
        }
    }
    let bytes = ty.byte_width().max(1) as u64;
    let ix_map: Vec<Option<usize>> = (0..xd.len())
        .map(|j| isd.iter().position(|&i| i == j).map(|k| usd[k]))
        .collect();
    let mut chosen: Option<(Grid, Grid, Grid, u64)> = None;
    let batch_map: Vec<Option<usize>> = (0..od.len())
        .map(|d| batch.iter().find(|b| b.0 == d).map(|b| b.1))
        .collect();
    for gu in cands {
        // Update batch dims' tiles stay apart (the buffer is tiled like
        // them); the other update dims' tiles are summed.
        let factors = reduced_factors(&gu, batch);
        if factors.is_empty() {
            continue;
        }
        let groups = p.grids().factor_groups(&gu, &factors);
        let gi = p.grids().remap(&gu, &ix_map);
        let batch_tiled = p.grids().remap(&gu, &batch_map);
        let batch_buffers = [batch_tiled.clone()];
        let candidates: &[Grid] = if batch_tiled.is_replicated() {
            &buffers
        } else {
            &batch_buffers
        };
        for gb in candidates {
            let one_tile_per_group = groups.lists().iter().all(|group| {
                group
                    .windows(2)
                    .all(|w| (0..od.len()).all(|d| gb.coord(w[0], d) == gb.coord(w[1], d)))
            });
            if !one_tile_per_group {
                continue;
            }
            let ar_bytes = elems(&local_dims(&od, gb)) * bytes;
            let cost = p.cost(up, &gu)
                + p.cost(ix, &gi)
                + ar_bytes
                + p.cost(op, out)
                + p.cost_of(&instr.shape, gb, out);
            if cost < best && !matches!(&chosen, Some(c) if c.3 <= cost) {
                chosen = Some((gu.clone(), gi.clone(), gb.clone(), cost));
            }
        }
    }
    let Some((gu, gi, gb, _)) = chosen else {
        return Ok(None);
    };
    let factors = reduced_factors(&gu, batch);
    let groups = p.grids().factor_groups(&gu, &factors);
    let u = p.reshard_to_grid(up, &gu)?;
    let mut y = p.reshard_to_grid(ix, &gi)?;
    let shifts: Vec<(usize, usize)> = dn
        .scatter_dims_to_operand_dims
        .iter()
        .enumerate()
        .filter(|&(_, &d)| gb.tiles(d as usize) > 1)
        .map(|(k, &d)| (k, d as usize))
        .collect();
    y = shift_components(p, y, ivd, &gb, &od, &shifts)?;
    let init =
        p.b.constant(crate::shapes::scalar_literal(ty, ident), Shape::scalar(ty));
    let local_od = local_dims(&od, &gb);
    let buf = p.b.splat(init, &local_od);
    let local_shape = local_shape(&instr.shape, &ValueSharding::Grid(gb.clone()));
    let local = p.clone_instr(instr, vec![buf, y, u], local_shape);
    let sum = p.b.all_reduce(local, &groups, cop)?;
    let summed = PValue {
        id: sum,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(gb),
    };
    let s = p.reshard_to_grid(&summed, out)?;
    let o = p.reshard_to_grid(op, out)?;
    let id = p.b.binary(cop, o, s);
    p.note(instr, "scatter_all_reduce");
    Ok(Some(PValue {
        id,
        shape: Rc::new(instr.shape.clone()),
        vs: ValueSharding::Grid(out.clone()),
    }))
}
