//! Transformations of shardings used by propagation and partitioning:
//! transpose, reshape (split/merge of sharded dims), reverse, partial
//! replication of chosen dims, removal of dims (reduce), insertion of dims
//! (broadcast), and moving tiling along a dim mapping (gather/scatter, dot).
//!
//! Each function follows the semantics of the XLA `hlo_sharding_util`
//! function named in its doc; they are total: tile-maximal and manual
//! inputs come back unchanged, and an impossible request returns `None`.
//! Invariant: outputs are canonical `Sharding`s (built through
//! `Sharding::subgroup` / `partial_tile`).

use crate::merge::merge_sharding_if_compatible;
use crate::sharding::Sharding;
use crate::tile::{for_each_index, TileArray};
use xla_hlo_ir::sharding::SubgroupType;

fn product(v: &[i64]) -> i64 {
    v.iter().product()
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a.abs()
    } else {
        gcd(b, a % b)
    }
}

/// `p` lists each of `0..n` exactly once.
fn is_permutation(p: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    p.len() == n
        && p.iter()
            .all(|&d| d < n && !std::mem::replace(&mut seen[d], true))
}

/// Rebuilds a sharding of the same kind over new tiles (XLA's
/// `ReplicateOnLastTileDim() ? PartialTile : Subgroup(types)` idiom).
fn rebuild_like(like: &Sharding, tiles: TileArray) -> Sharding {
    if like.replicate_on_last_tile_dim() {
        Sharding::partial_tile(tiles)
    } else {
        Sharding::subgroup(tiles, like.xla_subgroup_types())
    }
}

/// Permutes data dims: result dim `i` takes source dim `perm[i]`; `perm`
/// lists the data dims (subgroup dims follow) or every tile dim
/// (`TransposeSharding`).
pub fn transpose_sharding(s: &Sharding, perm: &[usize]) -> Sharding {
    let Sharding::Tiled(t) = s else {
        return s.clone();
    };
    let nd = t.tiles().num_dims();
    let mut p: Vec<usize> = perm.to_vec();
    if p.len() == t.data_rank() {
        p.extend(t.data_rank()..nd);
    }
    if !is_permutation(&p, nd) {
        return s.clone();
    }
    let tiles = t.tiles().transpose(&p);
    if s.replicate_on_last_tile_dim() {
        Sharding::partial_tile(tiles)
    } else {
        let r = t.data_rank();
        let types: Vec<SubgroupType> = p[r..].iter().map(|&d| s.subgroups()[d - r]).collect();
        Sharding::subgroup(tiles, &types)
    }
}

/// Replicates the data dims `dims` (`PartiallyReplicateTiledShardingOnDims`).
pub fn partially_replicate_on_dims(s: &Sharding, dims: &[usize]) -> Sharding {
    let Sharding::Tiled(t) = s else {
        return s.clone();
    };
    let r = t.data_rank();
    let valid: Vec<usize> = dims.iter().copied().filter(|&d| d < r).collect();
    let group: i64 = valid.iter().map(|&d| t.tiles().dim(d)).product();
    if group == 1 {
        return s.clone();
    }
    if group == s.num_tiles() && s.xla_subgroup_types().is_empty() {
        return Sharding::Replicated;
    }
    // Stable order: kept dims first, then the replicated ones.
    let mut perm: Vec<usize> = (0..r).filter(|d| !valid.contains(d)).collect();
    perm.extend((0..r).filter(|d| valid.contains(d)));
    let moved = transpose_sharding(s, &perm);
    let Some(new_tiles) = moved.tiles().cloned() else {
        return s.clone();
    };
    let mut shape: Vec<i64> = t.tiles().dims().to_vec();
    for &d in &valid {
        shape[d] = 1;
    }
    if s.replicate_on_last_tile_dim() {
        if let Some(last) = shape.last_mut() {
            *last *= group;
        }
        Sharding::partial_tile(new_tiles.reshape(shape))
    } else {
        shape.insert(r, group);
        let mut types = vec![SubgroupType::Replicated];
        types.extend_from_slice(s.xla_subgroup_types());
        Sharding::subgroup(new_tiles.reshape(shape), &types)
    }
}

/// Replicates every data dim except `keep`
/// (`PartiallyReplicateTiledShardingOnAllDimsExcept`).
pub fn partially_replicate_all_except(s: &Sharding, keep: &[usize]) -> Sharding {
    let r = s.tiled_data_rank();
    let dims: Vec<usize> = (0..r).filter(|d| !keep.contains(d)).collect();
    partially_replicate_on_dims(s, &dims)
}

/// Replicates every data dim, keeping manual subgroups; with `data_rank`, the
/// result is laid out for that rank (`ReplicateAllDataDims`).
pub fn replicate_all_data_dims(s: &Sharding, data_rank: Option<usize>) -> Sharding {
    if s.is_manual() {
        return s.clone();
    }
    if s.xla_subgroup_types().is_empty() {
        return Sharding::Replicated;
    }
    let result = partially_replicate_all_except(s, &[]);
    if let (Some(rank), Sharding::Tiled(t)) = (data_rank, &result) {
        if rank != t.data_rank() {
            let mut shape = vec![1i64; rank];
            shape.extend_from_slice(&t.tiles().dims()[t.data_rank()..]);
            let types = result.xla_subgroup_types().to_vec();
            return Sharding::subgroup(t.tiles().reshape(shape), &types);
        }
    }
    result
}

/// Drops data dims (which must be untiled) (`RemoveShapeDimensions`).
pub fn remove_shape_dims(s: &Sharding, dims: &[usize]) -> Sharding {
    let Sharding::Tiled(t) = s else {
        return s.clone();
    };
    if dims.is_empty() {
        return s.clone();
    }
    let shape: Vec<i64> = t
        .tiles()
        .dims()
        .iter()
        .enumerate()
        .filter(|(i, &d)| !(dims.contains(i) && d == 1))
        .map(|(_, &d)| d)
        .collect();
    let removed = t.tiles().num_dims() - shape.len();
    if removed != dims.iter().filter(|&&d| d < t.tiles().num_dims()).count() {
        // A removed dim was tiled: not representable.
        return partially_replicate_on_dims(s, dims);
    }
    rebuild_like(s, t.tiles().reshape(shape))
}

/// Moves tiling along a dim mapping where dims may appear or vanish
/// (`TransposeShardingWithCollapsedDims`). `src_to_tgt[i]` is the target dim
/// of source data dim `i` (-1: collapsed, must be untiled); `tgt_to_src[j]`
/// the source dim of target dim `j` (-1: new, untiled).
pub fn transpose_with_collapsed_dims(
    s: &Sharding,
    src_to_tgt: &[i64],
    tgt_to_src: &[i64],
) -> Option<Sharding> {
    let Sharding::Tiled(t) = s else {
        return Some(s.clone());
    };
    let r = t.data_rank();
    if src_to_tgt.len() < r {
        return None;
    }
    let nd = t.tiles().num_dims();
    // Mapped source dims ordered by target position, collapsed ones after.
    let mut mapped: Vec<(i64, usize)> = Vec::new();
    let mut collapsed = Vec::new();
    for (i, &tgt) in src_to_tgt.iter().enumerate().take(r) {
        if tgt < 0 {
            if t.tiles().dim(i) > 1 {
                return None;
            }
            collapsed.push(i);
        } else {
            mapped.push((tgt, i));
        }
    }
    mapped.sort_unstable();
    let mut perm: Vec<usize> = mapped.iter().map(|m| m.1).collect();
    perm.extend(collapsed);
    perm.extend(r..nd);
    let moved = t.tiles().transpose(&perm);
    let mut shape: Vec<i64> = tgt_to_src
        .iter()
        .map(|&src| {
            if src >= 0 && (src as usize) < r {
                t.tiles().dim(src as usize)
            } else {
                1
            }
        })
        .collect();
    shape.extend_from_slice(&t.tiles().dims()[r..]);
    if product(&shape) != moved.num_elements() {
        return None;
    }
    Some(rebuild_like(s, moved.reshape(shape)))
}

/// Flips the tile order along `dims` (`ReverseSharding`).
pub fn reverse_sharding(s: &Sharding, dims: &[usize]) -> Sharding {
    let Sharding::Tiled(t) = s else {
        return s.clone();
    };
    if dims.is_empty()
        || dims
            .iter()
            .all(|&d| d >= t.data_rank() || t.tiles().dim(d) == 1)
    {
        return s.clone();
    }
    let tdims = t.tiles().dims().to_vec();
    let mut out = Vec::with_capacity(t.tiles().num_elements() as usize);
    let mut src = vec![0i64; tdims.len()];
    for_each_index(&tdims, |_, idx| {
        src.copy_from_slice(idx);
        for &d in dims {
            if d < src.len() {
                src[d] = tdims[d] - 1 - idx[d];
            }
        }
        out.push(t.tiles().get(&src));
    });
    rebuild_like(s, TileArray::from_parts(tdims, out.into()))
}

/// Keeps the tiling of `source_dims` (moved to `target_dims` of a rank
/// `target_rank` array) and replicates the rest
/// (`PropagateShardingAlongDimsAndReplicateOthers`).
pub fn propagate_along_dims(
    s: &Sharding,
    source_dims: &[usize],
    target_dims: &[usize],
    target_rank: usize,
) -> Sharding {
    if s.is_tile_maximal() || source_dims.len() != target_dims.len() {
        return s.clone();
    }
    let rep = partially_replicate_all_except(s, source_dims);
    let Sharding::Tiled(rt) = &rep else {
        return rep;
    };
    let argsort = |v: &[usize]| {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by_key(|&i| v[i]);
        idx
    };
    let as_src = argsort(source_dims);
    let as_tgt = argsort(target_dims);
    if source_dims.iter().any(|&d| d >= rt.data_rank()) {
        return Sharding::Replicated;
    }
    {
        let mut sorted = source_dims.to_vec();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0] == w[1]) {
            return Sharding::Replicated;
        }
    }
    let moved = if as_src != as_tgt {
        let mut perm: Vec<usize> = as_tgt.iter().map(|&i| source_dims[i]).collect();
        let mut next = 0usize;
        for _ in source_dims.len()..rt.tiles().num_dims() {
            while source_dims.contains(&next) {
                next += 1;
            }
            perm.push(next);
            next += 1;
        }
        transpose_sharding(&rep, &perm)
    } else {
        rep.clone()
    };
    let Sharding::Tiled(mt) = &moved else {
        return moved;
    };
    let mut shape = vec![1i64; target_rank];
    for (i, &sd) in source_dims.iter().enumerate() {
        if target_dims[i] < target_rank {
            shape[target_dims[i]] = s.tile_dim(sd);
        }
    }
    shape.extend_from_slice(&mt.tiles().dims()[mt.data_rank()..]);
    if product(&shape) != mt.tiles().num_elements() {
        return Sharding::Replicated;
    }
    rebuild_like(&moved, mt.tiles().reshape(shape))
}

/// Forward broadcast: operand dim `i` becomes output dim `dims[i]`; new dims
/// are untiled (the broadcast case of `InferShardingFromOperands`).
pub fn broadcast_sharding(s: &Sharding, dims: &[usize], out_rank: usize) -> Sharding {
    let Sharding::Tiled(t) = s else {
        return s.clone();
    };
    let mut shape = Vec::with_capacity(out_rank + t.subgroups().len());
    for i in 0..out_rank {
        shape.push(match dims.iter().position(|&d| d == i) {
            Some(src) if src < t.data_rank() => t.tiles().dim(src),
            _ => 1,
        });
    }
    shape.extend_from_slice(&t.tiles().dims()[t.data_rank()..]);
    if product(&shape) != t.tiles().num_elements() {
        return Sharding::Replicated;
    }
    rebuild_like(s, t.tiles().reshape(shape))
}

/// Operand sharding seen from a broadcast's output: the broadcast dims are
/// replicated and removed (`InferBroadcastOperandSharding`, SPMD).
pub fn broadcast_operand_sharding(s: &Sharding, dims: &[usize], out_rank: usize) -> Sharding {
    if s.is_replicated() || s.is_manual() || s.is_tile_maximal() {
        return s.clone();
    }
    let new_dims: Vec<usize> = (0..out_rank).filter(|d| !dims.contains(d)).collect();
    remove_shape_dims(&partially_replicate_on_dims(s, &new_dims), &new_dims)
}

/// Reduce: the reduced dims are replicated then removed.
pub fn reduce_sharding(s: &Sharding, reduced_dims: &[usize]) -> Sharding {
    if s.is_tile_maximal() {
        return s.clone();
    }
    let rep = partially_replicate_on_dims(s, reduced_dims);
    if rep.is_replicated() {
        return rep;
    }
    remove_shape_dims(&rep, reduced_dims)
}

/// Reshape of a sharding where every dim can follow
/// (`ReshapeSharding`): `None` when the reshape moves tiling in ways a
/// sharding cannot express.
pub fn reshape_sharding(source: &[i64], target: &[i64], s: &Sharding) -> Option<Sharding> {
    let Sharding::Tiled(t) = s else {
        return Some(s.clone());
    };
    if t.data_rank() != source.len() {
        return None;
    }
    let mut target_tiles: Vec<i64> = Vec::new();
    let mut src_stack: Vec<i64> = source.iter().rev().copied().collect();
    let mut tgt_stack: Vec<i64> = target.iter().rev().copied().collect();
    let mut tile_stack: Vec<i64> = t.tiles().dims()[..source.len()]
        .iter()
        .rev()
        .copied()
        .collect();
    let mut src_index: i64 = -1;
    let mut to_replicate: Vec<usize> = Vec::new();
    let mut inplace = false;
    macro_rules! push_src {
        ($size:expr, $parts:expr) => {{
            src_stack.push($size);
            tile_stack.push($parts);
            src_index -= 1;
        }};
    }
    macro_rules! pop_src {
        () => {{
            src_stack.pop();
            tile_stack.pop();
            src_index += 1;
        }};
    }
    let append = |target_tiles: &mut Vec<i64>, inplace: &mut bool, size: i64| {
        if *inplace {
            if let Some(l) = target_tiles.last_mut() {
                *l *= size;
            }
        } else {
            target_tiles.push(size);
        }
        *inplace = false;
    };
    while !src_stack.is_empty() && !tgt_stack.is_empty() && product(&tile_stack) != 1 {
        let mut src_product = 1i64;
        while tile_stack.last() == Some(&1) {
            src_product *= *src_stack.last()?;
            pop_src!();
        }
        while let Some(&tl) = tgt_stack.last() {
            if tl > 1 && src_product % tl == 0 {
                src_product /= tl;
                tgt_stack.pop();
                append(&mut target_tiles, &mut inplace, 1);
            } else {
                break;
            }
        }
        if src_product != 1 {
            push_src!(src_product, 1);
        }
        if src_stack.is_empty() || tgt_stack.is_empty() {
            break;
        }
        let s_size = *src_stack.last()?;
        let s_parts = *tile_stack.last()?;
        pop_src!();
        let t_size = tgt_stack.pop()?;
        if s_size == t_size {
            append(&mut target_tiles, &mut inplace, s_parts);
        } else if t_size == 1 {
            append(&mut target_tiles, &mut inplace, 1);
            push_src!(s_size, s_parts);
        } else if s_size == 1 {
            tgt_stack.push(t_size);
            if s_parts > 1 && src_index >= 0 {
                to_replicate.push(src_index as usize);
            }
        } else if s_parts == 1 {
            if !src_stack.is_empty() && tile_stack.last() == Some(&1) {
                if let Some(l) = src_stack.last_mut() {
                    *l *= s_size;
                }
            } else {
                break;
            }
        } else if s_size % s_parts != 0 {
            return None;
        } else {
            let g = gcd(s_parts, t_size);
            if g == 1 {
                break;
            }
            push_src!(s_size / g, s_parts / g);
            tgt_stack.push(t_size / g);
            append(&mut target_tiles, &mut inplace, g);
            inplace = true;
        }
    }
    if product(&target_tiles) == 1 {
        return None;
    }
    while target_tiles.len() < target.len() {
        target_tiles.push(1);
    }
    if target_tiles.len() > target.len() {
        return None;
    }
    let sharding = if to_replicate.is_empty() {
        s.clone()
    } else {
        partially_replicate_on_dims(s, &to_replicate)
    };
    let Sharding::Tiled(st) = &sharding else {
        return None;
    };
    let repl_dim = sharding.replication_dim();
    for i in st.data_rank()..st.tiles().num_dims() {
        target_tiles.push(if Some(i) == repl_dim {
            1
        } else {
            st.tiles().dim(i)
        });
    }
    let mut types = sharding.xla_subgroup_types().to_vec();
    let total = st.tiles().num_elements();
    let p = product(&target_tiles);
    if p == 0 || total % p != 0 {
        return None;
    }
    let quot = total / p;
    if quot > 1 {
        if sharding.replicate_on_last_tile_dim() {
            if let Some(l) = target_tiles.last_mut() {
                *l = quot;
            }
            types.push(SubgroupType::Replicated);
        } else if let Some(rd) = repl_dim {
            target_tiles[rd - st.data_rank() + target.len()] = quot;
        } else {
            target_tiles.push(quot);
            types.push(SubgroupType::Replicated);
        }
    }
    if product(&target_tiles) != total {
        return None;
    }
    Some(Sharding::subgroup(st.tiles().reshape(target_tiles), &types))
}

/// Applies `f` to the sharding with its manual subgroup factored out: `f`
/// sees local device indices; the manual dim is put back after
/// (XLA's `GroupShardingOnDims` / `UngroupSharding` for the manual dim).
fn with_manual_grouped(
    s: &Sharding,
    out_rank: usize,
    f: impl Fn(&Sharding) -> Sharding,
) -> Sharding {
    let (Some(m), Sharding::Tiled(t)) = (s.manual_dim(), s) else {
        return f(s);
    };
    let dims = t.tiles().dims();
    let groups = dims[m] as usize;
    // Devices of each manual group, in row-major order of the other dims.
    let mut perm: Vec<usize> = vec![m];
    perm.extend((0..dims.len()).filter(|&d| d != m));
    let moved = t.tiles().transpose(&perm);
    let group_size = moved.num_elements() as usize / groups;
    let group_devices: Vec<&[i64]> = moved.devices().chunks(group_size).collect();
    let inner_dims: Vec<i64> = perm[1..].iter().map(|&d| dims[d]).collect();
    let inner_types: Vec<SubgroupType> = t
        .subgroups()
        .iter()
        .copied()
        .filter(|&ty| ty != SubgroupType::Manual)
        .collect();
    let inner = Sharding::subgroup(TileArray::iota(inner_dims), &inner_types);
    let out = f(&inner);
    let (out_tiles, out_types, out_rank) = match &out {
        Sharding::Tiled(ot) => (ot.tiles().clone(), ot.subgroups().to_vec(), ot.data_rank()),
        Sharding::Replicated => {
            // Replicated within each group: one tile per data dim of the
            // result, then the group's devices as replication.
            let mut dims = vec![1i64; out_rank];
            dims.push(group_size as i64);
            (
                TileArray::iota(dims),
                vec![SubgroupType::Replicated],
                out_rank,
            )
        }
        _ => return s.clone(),
    };
    let out_rank_dims = out_rank;
    // Result tiles: [data..., manual, rest subgroups...].
    let mut rdims: Vec<i64> = out_tiles.dims()[..out_rank_dims].to_vec();
    rdims.push(groups as i64);
    rdims.extend_from_slice(&out_tiles.dims()[out_rank_dims..]);
    let inner_n = out_tiles.num_elements() as usize;
    if inner_n != group_size {
        return s.clone();
    }
    let mut devices = vec![0i64; inner_n * groups];
    let rstr = crate::tile::strides(&rdims);
    for_each_index(out_tiles.dims(), |flat, idx| {
        let local = out_tiles.devices()[flat] as usize;
        for (g, grp) in group_devices.iter().enumerate() {
            let mut pos = 0i64;
            for (k, &i) in idx.iter().enumerate() {
                let d = if k < out_rank_dims { k } else { k + 1 };
                pos += i * rstr[d];
            }
            pos += g as i64 * rstr[out_rank_dims];
            devices[pos as usize] = grp.get(local).copied().unwrap_or(0);
        }
    });
    let mut types = vec![SubgroupType::Manual];
    types.extend(
        out_types
            .iter()
            .copied()
            .filter(|&ty| ty != SubgroupType::Manual),
    );
    Sharding::subgroup(TileArray::from_parts(rdims, devices.into()), &types)
}

/// Sharding of a reshape's output given its operand's
/// (`PropagateShardingThroughReshape`): the longest runs of dims that
/// `reshape_sharding` can move are kept, the rest replicated.
pub fn propagate_through_reshape(source: &[i64], target: &[i64], s: &Sharding) -> Sharding {
    if s.is_tile_maximal() {
        return s.clone();
    }
    if s.is_manual_subgroup() {
        return with_manual_grouped(s, target.len(), |inner| {
            propagate_through_reshape(source, target, inner)
        });
    }
    let Sharding::Tiled(t) = s else {
        return s.clone();
    };
    if t.data_rank() != source.len() {
        return Sharding::Replicated;
    }
    let mut result = Sharding::Replicated;
    let mut start = 0usize;
    let nd = t.tiles().num_dims();
    while start < source.len() {
        let mut found = false;
        for end in (start + 1..=source.len()).rev() {
            let mut grouped = vec![1i64; source.len()];
            grouped[start..end].copy_from_slice(&t.tiles().dims()[start..end]);
            let Some(reshaped) =
                reshape_sharding(source, target, &Sharding::tile(TileArray::iota(grouped)))
            else {
                continue;
            };
            let mut perm: Vec<usize> = (start..end).collect();
            perm.extend(0..start);
            perm.extend(end..nd);
            let mut rdims: Vec<i64> = reshaped.tile_dims().to_vec();
            if rdims.is_empty() {
                continue;
            }
            let p = product(&rdims);
            if t.tiles().num_elements() % p != 0 {
                continue;
            }
            let reps = t.tiles().num_elements() / p;
            let diff = rdims.len() as i64 - target.len() as i64;
            if diff == 0 {
                rdims.push(reps);
            } else if diff == 1 {
                if let Some(l) = rdims.last_mut() {
                    *l *= reps;
                }
            } else {
                continue;
            }
            let ungrouped = Sharding::partial_tile(t.tiles().transpose(&perm).reshape(rdims));
            let min_tiles = result.num_tiles() + 1;
            if merge_sharding_if_compatible(&ungrouped, min_tiles, &mut result) {
                start = end;
                found = true;
                break;
            }
        }
        if !found {
            start += 1;
        }
    }
    result
}

/// Splits tile dim `dim` into `[new_size, dim / new_size]`
/// (`SplitShardingDimension`).
pub fn split_dim(s: &Sharding, dim: usize, new_size: i64) -> Option<Sharding> {
    let t = s.as_tiled()?;
    if dim >= t.data_rank() || new_size < 1 || t.tiles().dim(dim) % new_size != 0 {
        return None;
    }
    let mut dims = t.tiles().dims().to_vec();
    let cur = dims[dim];
    dims[dim] = new_size;
    dims.insert(dim + 1, cur / new_size);
    Some(rebuild_like(s, t.tiles().reshape(dims)))
}

/// Merges tile dims `dim` and `dim + 1` (`MergeShardingDimension`).
pub fn merge_dims(s: &Sharding, dim: usize) -> Option<Sharding> {
    let t = s.as_tiled()?;
    if dim + 1 >= t.data_rank() {
        return None;
    }
    let mut dims = t.tiles().dims().to_vec();
    dims[dim] *= dims[dim + 1];
    dims.remove(dim + 1);
    Some(rebuild_like(s, t.tiles().reshape(dims)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiled(dims: &[i64]) -> Sharding {
        Sharding::tile(TileArray::iota(dims.to_vec()))
    }

    #[test]
    fn replicate_dims() {
        let s = tiled(&[2, 4]);
        let r = partially_replicate_on_dims(&s, &[1]);
        assert_eq!(r.tile_dims(), &[2, 1, 4]);
        assert!(r.replicate_on_last_tile_dim());
        assert_eq!(
            partially_replicate_on_dims(&s, &[0, 1]),
            Sharding::Replicated
        );
        let r0 = partially_replicate_on_dims(&s, &[0]);
        assert_eq!(r0.tile_dims(), &[1, 4, 2]);
        assert_eq!(r0.tiles().unwrap().devices(), &[0, 4, 1, 5, 2, 6, 3, 7]);
    }

    #[test]
    fn reshape_split_and_merge() {
        // [64,8] sharded 8 on dim 0 -> [8,8,8]: dim 0 gets 8.
        let s = tiled(&[8, 1]);
        let r = reshape_sharding(&[64, 8], &[8, 8, 8], &s).unwrap();
        assert_eq!(r.tile_dims(), &[8, 1, 1]);
        // [8,4,16] major sharded -> [32,16].
        let s = tiled(&[8, 1, 1]);
        let r = reshape_sharding(&[8, 4, 16], &[32, 16], &s).unwrap();
        assert_eq!(r.tile_dims(), &[8, 1]);
        // [4,8,16] minor merged dim sharded: not expressible as is.
        let s = tiled(&[1, 8, 1]);
        let r = propagate_through_reshape(&[4, 8, 16], &[32, 16], &s);
        assert!(r.is_replicated(), "{r:?}");
        // [6,4] -> [4,6] with [6,1]: gcd gives [2,1,3] partial.
        let s = tiled(&[6, 1]);
        let r = reshape_sharding(&[6, 4], &[4, 6], &s).unwrap();
        assert_eq!(r.tile_dims(), &[2, 1, 3]);
    }

    #[test]
    fn transpose_collapse() {
        let s = tiled(&[2, 1, 4]);
        // drop dim 1, swap 0 and 2
        let r = transpose_with_collapsed_dims(&s, &[1, -1, 0], &[2, 0]).unwrap();
        assert_eq!(r.tile_dims(), &[4, 2]);
        assert_eq!(r, transpose_sharding(&tiled(&[2, 4]), &[1, 0]));
        assert!(transpose_with_collapsed_dims(&tiled(&[2, 4]), &[0, -1], &[0]).is_none());
    }

    #[test]
    fn reverse() {
        let s = tiled(&[4]);
        assert_eq!(
            reverse_sharding(&s, &[0]).tiles().unwrap().devices(),
            &[3, 2, 1, 0]
        );
    }

    #[test]
    fn manual_subgroup_reshape() {
        // [4,2 manual] on f32[8,6] -> f32[2,4,6]
        let s = Sharding::subgroup(TileArray::iota(vec![4, 1, 2]), &[SubgroupType::Manual]);
        let r = propagate_through_reshape(&[8, 6], &[2, 4, 6], &s);
        assert_eq!(r.tile_dims(), &[2, 2, 1, 2]);
        assert!(r.is_manual_subgroup());
    }
}
