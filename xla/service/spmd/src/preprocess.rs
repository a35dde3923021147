//! Rewrites of the sharded module before partitioning that let one halo
//! exchange do the work of two, as XLA's `SpmdPartitioner::PreprocessHlos`
//! does: a `slice` of a `pad` (through single-use copies), both sharded
//! alike and tiled on a dim they both change, becomes one `pad` with the
//! slice folded into its (possibly negative) edge padding.
//!
//! Invariants: every rewrite computes the same values as the module it
//! replaces; instructions keep definition order (a rewritten instruction
//! reads only values defined before it); instructions the rewrite leaves
//! unused (the old pad and copies) are removed; the root and parameters
//! are never removed.

use xla_hlo_ir::attrs::PaddingDim;
use xla_hlo_ir::sharding::{HloSharding, ShardingKind};
use xla_hlo_ir::{AttrKey, AttrValue, HloComputation, HloModule, InstrId, Opcode};

/// Applies the rewrites to every computation; returns how many were made.
pub fn preprocess(module: &mut HloModule) -> usize {
    let mut count = 0;
    for comp in module.computations.iter_mut() {
        count += merge_pad_slices(comp);
    }
    count
}

/// Tiles per data dim of a tiled (not manual, not maximal) sharding.
fn tiles_per_dim(sharding: &HloSharding, rank: usize) -> Option<Vec<i64>> {
    let HloSharding::Single(single) = sharding else {
        return None;
    };
    match &single.kind {
        ShardingKind::Tiled {
            tile_assignment,
            last_tile_dims,
            ..
        } if !last_tile_dims.iter().any(|t| t.name() == "manual") => {
            let dims = tile_assignment.dims();
            (dims.len() >= rank).then(|| dims[..rank].to_vec())
        }
        _ => None,
    }
}

/// `slice(copy*(pad(x, v)))` -> `pad(x, v)` with merged edge padding.
fn merge_pad_slices(comp: &mut HloComputation) -> usize {
    let users = comp.users();
    let mut merged = 0;
    let mut dead: Vec<InstrId> = Vec::new();
    for id in comp.ids().collect::<Vec<_>>() {
        let slice = comp.instr(id);
        if slice.opcode != Opcode::Slice {
            continue;
        }
        let Some(sharding) = slice.sharding.as_deref() else {
            continue;
        };
        let rank = slice.shape.rank();
        let Some(tiles) = tiles_per_dim(sharding, rank) else {
            continue;
        };
        // Through single-use copies to a single-use pad.
        let mut chain = Vec::new();
        let mut operand = slice.operands[0];
        while comp.instr(operand).opcode == Opcode::Copy
            && users[operand.index()].len() == 1
            && operand != comp.root
        {
            chain.push(operand);
            operand = comp.instr(operand).operands[0];
        }
        let pad = comp.instr(operand);
        if pad.opcode != Opcode::Pad
            || users[operand.index()].len() != 1
            || pad.sharding.as_deref() != Some(sharding)
            || pad.operands.len() != 2
            || operand == comp.root
        {
            continue;
        }
        let (Some(padding), Some(slice_dims)) = (pad.padding(), slice.slice_dims()) else {
            continue;
        };
        let pad_dims = pad.shape.dims();
        if padding.len() != rank || slice_dims.len() != rank || pad_dims.len() != rank {
            continue;
        }
        let mut merged_padding = Vec::with_capacity(rank);
        let mut multi_halo = false;
        let mut ok = true;
        for d in 0..rank {
            let (pd, sd) = (padding[d], slice_dims[d]);
            if pd.interior != 0 || sd.stride != 1 {
                ok = false;
                break;
            }
            if tiles[d] > 1 && (pd.low != 0 || pd.high != 0) && slice.shape.dims()[d] != pad_dims[d]
            {
                multi_halo = true;
            }
            merged_padding.push(PaddingDim {
                low: pd.low - sd.start,
                high: sd.limit - (pad_dims[d] - pd.high),
                interior: 0,
            });
        }
        let removed: Vec<InstrId> = chain.iter().copied().chain([operand]).collect();
        let control = comp
            .instructions
            .iter()
            .any(|i| i.control_predecessors.iter().any(|c| removed.contains(c)))
            || removed
                .iter()
                .any(|&r| !comp.instr(r).control_predecessors.is_empty());
        if !ok || !multi_halo || control {
            continue;
        }
        let operands = pad.operands.clone();
        let new = comp.instr_mut(id);
        new.opcode = Opcode::Pad;
        new.operands = operands;
        new.attrs.retain(|a| a.key != AttrKey::Slice);
        new.set_attr(AttrKey::Padding, AttrValue::Padding(merged_padding));
        dead.extend(removed);
        merged += 1;
    }
    if !dead.is_empty() {
        let mut keep = vec![true; comp.instructions.len()];
        for d in dead {
            keep[d.index()] = false;
        }
        comp.retain_instructions(&keep);
    }
    merged
}
