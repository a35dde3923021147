//! Comparing and combining shardings: "more specific" ordering, sub-tiling,
//! merging two partially replicated shardings into one that refines both,
//! and the improvement rule sharding propagation applies.
//!
//! Semantics follow XLA's `IsShardingMoreSpecific`, `MergeSharding`,
//! `MergeShardingIfCompatible`, `IsSubTilingOrEqualSharding`,
//! `FindCommonSharding` and `ReturnImprovedShardingImpl`.
//! Invariant: a successful merge yields a sharding whose tiles refine both
//! inputs' tiles (each merged tile lies inside one tile of each input).

use crate::sharding::{InstrSharding, Sharding};
use crate::tile::{for_each_index, TileArray};
use std::collections::BTreeSet;
use xla_hlo_ir::sharding::SubgroupType;

/// `a` is more specific than `b` (leaf rule).
pub fn is_leaf_more_specific(a: &Sharding, b: &Sharding) -> bool {
    if a.is_manual() && b.is_tile_maximal() {
        return true;
    }
    if a.is_manual() || b.is_manual() {
        return false;
    }
    if !b.is_tile_maximal() {
        return a.num_tiles() > b.num_tiles();
    }
    if b.is_replicated() {
        !a.is_replicated()
    } else {
        !a.is_tile_maximal()
    }
}

/// `a` is more specific than `b` (tuples: no leaf worse, one better).
pub fn is_more_specific(a: &InstrSharding, b: &InstrSharding) -> bool {
    match (a, b) {
        (InstrSharding::Tuple(x), InstrSharding::Tuple(y)) => {
            if x.len() != y.len() {
                return false;
            }
            let mut better = false;
            for (l, r) in x.iter().zip(y.iter()) {
                if is_leaf_more_specific(r, l) {
                    return false;
                }
                better |= is_leaf_more_specific(l, r);
            }
            better
        }
        (InstrSharding::Single(x), InstrSharding::Single(y)) => is_leaf_more_specific(x, y),
        _ => false,
    }
}

/// Manual is strictly better than a tile-maximal (non-manual) sharding.
fn leaf_strictly_better(a: &Sharding, b: &Sharding) -> bool {
    a.is_manual() && b.is_tile_maximal()
}

/// `a` is strictly better than `b` (`IsShardingStrictlyBetter`).
pub fn is_strictly_better(a: &InstrSharding, b: &InstrSharding) -> bool {
    match (a, b) {
        (InstrSharding::Tuple(x), InstrSharding::Tuple(y)) => {
            if x.len() != y.len() {
                return false;
            }
            let mut mask = 0;
            for (l, r) in x.iter().zip(y.iter()) {
                if leaf_strictly_better(l, r) {
                    mask |= 1;
                }
                if leaf_strictly_better(r, l) {
                    mask |= 2;
                }
            }
            mask == 1
        }
        (InstrSharding::Single(x), InstrSharding::Single(y)) => leaf_strictly_better(x, y),
        _ => false,
    }
}

/// Merges `to_merge` into `dst` when both are partially replicated and have
/// compatible tiles, with at least `min_tiles` tiles in the result
/// (`MergeShardingIfCompatible`). Returns whether `dst` was replaced.
pub fn merge_sharding_if_compatible(
    to_merge: &Sharding,
    min_tiles: i64,
    dst: &mut Sharding,
) -> bool {
    if !to_merge.is_tiled() || dst.is_manual() || dst.is_unknown() {
        return false;
    }
    if dst.is_tile_maximal() {
        *dst = to_merge.clone();
        return true;
    }
    if !dst.has_partial_replication() {
        return false;
    }
    let (Sharding::Tiled(tm), Sharding::Tiled(td)) = (to_merge, &*dst) else {
        return false;
    };
    let r = tm.data_rank();
    if r != td.data_rank() {
        return false;
    }
    let man_m = to_merge.manual_dim();
    let man_d = dst.manual_dim();
    if man_m.is_some() != man_d.is_some() {
        return false;
    }
    let dst_nd = td.tiles().num_dims();
    let mut perm_merge: Vec<i64> = vec![-1; dst_nd];
    let mut perm_dst: Vec<i64> = vec![-1; dst_nd];
    let (mut cm, mut cd) = (0i64, 0i64);
    let (mut merge_old, mut dst_old) = (Vec::new(), Vec::new());
    let (mut merge_new, mut dst_new) = (Vec::new(), Vec::new());
    let (mut merge_new_idx, mut dst_new_idx) = (Vec::new(), Vec::new());
    let mut merged = Vec::new();
    let (mut n_merge_groups, mut n_dst_groups) = (1i64, 1i64);
    for i in 0..r {
        let m = tm.tiles().dim(i);
        let d = td.tiles().dim(i);
        n_merge_groups *= m;
        n_dst_groups *= d;
        if m == d {
            merge_old.push(m);
            perm_merge[i] = cm;
            cm += 1;
            dst_old.push(d);
            perm_dst[i] = cd;
            cd += 1;
            merged.push(d);
        } else if d == 1 {
            merge_old.push(m);
            perm_merge[i] = cm;
            cm += 1;
            dst_new.push(m);
            dst_new_idx.push(i);
            merged.push(m);
        } else if m == 1 {
            merge_new.push(d);
            merge_new_idx.push(i);
            dst_old.push(d);
            perm_dst[i] = cd;
            cd += 1;
            merged.push(d);
        } else {
            return false;
        }
    }
    let num_devices = tm.tiles().num_elements();
    if num_devices != td.tiles().num_elements() {
        return false;
    }
    let new_num_tiles: i64 = merged.iter().product();
    if new_num_tiles == 0 || num_devices % new_num_tiles != 0 || new_num_tiles < min_tiles {
        return false;
    }
    let replication;
    if let (Some(mm), Some(md)) = (man_m, man_d) {
        let g = tm.tiles().dim(mm);
        if g != td.tiles().dim(md) {
            return false;
        }
        merge_old.push(g);
        dst_old.push(g);
        if r < dst_nd {
            perm_merge[r] = cm;
            cm += 1;
            perm_dst[r] = cd;
            cd += 1;
        }
        merged.push(g);
        n_merge_groups *= g;
        n_dst_groups *= g;
        if num_devices % (new_num_tiles * g) != 0 {
            return false;
        }
        replication = num_devices / (new_num_tiles * g);
    } else {
        replication = num_devices / new_num_tiles;
    }
    if replication > 1 {
        merged.push(replication);
    }

    // Method 1: reshape + transpose both into the merged layout.
    let compatible_list = |s: &Sharding,
                           old: &[i64],
                           new_dims: &[i64],
                           new_idx: &[usize],
                           perm: &[i64],
                           counter: i64|
     -> Vec<TileArray> {
        let tiles = s.tiles().expect("tiled");
        let rd = s.replication_dim();
        if !s.has_partial_replication() || rd.map(|d| tiles.dim(d)) == Some(replication) {
            return vec![tiles.clone()];
        }
        let mut perm = perm.to_vec();
        let mut new_dims = new_dims.to_vec();
        let mut new_idx = new_idx.to_vec();
        if replication == 1 {
            perm.pop();
        } else {
            new_dims.push(replication);
            new_idx.push(dst_nd - 1);
        }
        let mut out = Vec::new();
        let mut order: Vec<usize> = (0..new_dims.len()).collect();
        loop {
            let mut local = perm.clone();
            let mut reshape: Vec<i64> = old.to_vec();
            for (c, &i) in (counter..).zip(order.iter()) {
                reshape.push(new_dims[i]);
                if let Some(slot) = local.get_mut(new_idx[i]) {
                    *slot = c;
                }
            }
            if reshape.iter().product::<i64>() == tiles.num_elements()
                && local
                    .iter()
                    .all(|&p| p >= 0 && (p as usize) < reshape.len())
                && local.len() == reshape.len()
            {
                let lp: Vec<usize> = local.iter().map(|&p| p as usize).collect();
                out.push(tiles.reshape(reshape).transpose(&lp));
            }
            if !next_permutation(&mut order) {
                break;
            }
        }
        out
    };
    let merge_list = compatible_list(
        to_merge,
        &merge_old,
        &merge_new,
        &merge_new_idx,
        &perm_merge,
        cm,
    );
    let dst_list = compatible_list(dst, &dst_old, &dst_new, &dst_new_idx, &perm_dst, cd);
    let mut found: Option<TileArray> = None;
    for a in &dst_list {
        for b in &merge_list {
            if a == b {
                found = Some(a.clone());
            }
        }
    }

    // Method 2: intersect replication groups device by device.
    if found.is_none() {
        let merge_group_size = (num_devices / n_merge_groups.max(1)) as usize;
        let dst_group_size = (num_devices / n_dst_groups.max(1)) as usize;
        let mut merge_groups: Vec<BTreeSet<i64>> = tm
            .tiles()
            .devices()
            .chunks(merge_group_size.max(1))
            .map(|c| c.iter().copied().collect())
            .collect();
        let mut dst_groups: Vec<BTreeSet<i64>> = td
            .tiles()
            .devices()
            .chunks(dst_group_size.max(1))
            .map(|c| c.iter().copied().collect())
            .collect();
        let group_index = |idx: &[i64], dims: &[i64], manual: Option<usize>| -> usize {
            let mut g = 0i64;
            for i in 0..r {
                g = g * dims[i] + idx[i];
            }
            if let Some(m) = manual {
                g = g * dims[m] + idx[m];
            }
            g as usize
        };
        let mut devices = vec![0i64; merged.iter().product::<i64>() as usize];
        let mut ok = true;
        let mdims = tm.tiles().dims().to_vec();
        let ddims = td.tiles().dims().to_vec();
        for_each_index(&merged, |flat, idx| {
            if !ok {
                return;
            }
            let mut mi = vec![0i64; mdims.len()];
            let mut di = vec![0i64; ddims.len()];
            for i in 0..r {
                mi[i] = if mdims[i] == 1 { 0 } else { idx[i] };
                di[i] = if ddims[i] == 1 { 0 } else { idx[i] };
            }
            if let (Some(mm), Some(md)) = (man_m, man_d) {
                mi[mm] = idx[r];
                di[md] = idx[r];
            }
            let gm = group_index(&mi, &mdims, man_m);
            let gd = group_index(&di, &ddims, man_d);
            let (Some(s1), Some(s2)) = (merge_groups.get(gm), dst_groups.get(gd)) else {
                ok = false;
                return;
            };
            match s1.intersection(s2).next().copied() {
                Some(dev) => {
                    devices[flat] = dev;
                    merge_groups[gm].remove(&dev);
                    dst_groups[gd].remove(&dev);
                }
                None => ok = false,
            }
        });
        if !ok {
            return false;
        }
        found = TileArray::new(merged.clone(), devices).ok();
    }
    let Some(tiles) = found else {
        return false;
    };
    let mut types = Vec::new();
    if man_m.is_some() {
        types.push(SubgroupType::Manual);
    }
    if replication > 1 {
        types.push(SubgroupType::Replicated);
    }
    if tiles.num_dims() != r + types.len() {
        return false;
    }
    *dst = Sharding::subgroup(tiles, &types);
    true
}

fn next_permutation(v: &mut [usize]) -> bool {
    if v.len() < 2 {
        return false;
    }
    let mut i = v.len() - 1;
    while i > 0 && v[i - 1] >= v[i] {
        i -= 1;
    }
    if i == 0 {
        return false;
    }
    let mut j = v.len() - 1;
    while v[j] <= v[i - 1] {
        j -= 1;
    }
    v.swap(i - 1, j);
    v[i..].reverse();
    true
}

/// Merges leaf `to_merge` into `dst` (combining partial shardings when
/// allowed); returns whether `dst` is now at least as good and refined
/// (`MergeSharding`).
pub fn merge_sharding_leaf(to_merge: &Sharding, dst: &mut Sharding, may_combine: bool) -> bool {
    if may_combine
        && to_merge.has_partial_replication()
        && dst.has_partial_replication()
        && to_merge.total_num_tiles() == dst.total_num_tiles()
    {
        let min = to_merge.num_tiles().max(dst.num_tiles()) + 1;
        if merge_sharding_if_compatible(to_merge, min, dst) {
            return true;
        }
    }
    is_leaf_more_specific(dst, to_merge)
}

/// `MergeSharding` over instruction shardings (tuples leaf by leaf).
pub fn merge_sharding(
    to_merge: &InstrSharding,
    dst: &mut InstrSharding,
    may_combine: bool,
) -> bool {
    match (to_merge, dst) {
        (InstrSharding::Tuple(a), InstrSharding::Tuple(b)) => {
            let mut changed = false;
            let mut leaves = b.to_vec();
            for (x, y) in a.iter().zip(leaves.iter_mut()) {
                changed |= merge_sharding_leaf(x, y, may_combine);
            }
            *b = leaves.into();
            changed
        }
        (InstrSharding::Single(a), InstrSharding::Single(b)) => {
            merge_sharding_leaf(a, b, may_combine)
        }
        _ => false,
    }
}

fn ceil_div(a: i64, b: i64) -> i64 {
    if b <= 0 {
        a
    } else {
        (a + b - 1) / b
    }
}

/// Every tile of `sub` (on `shape`) lies inside the tile of the same device
/// under `s` (`IsSubTilingOrEqualSharding`).
pub fn is_subtiling_or_equal(shape: &[i64], sub: &Sharding, s: &Sharding) -> bool {
    if sub.is_manual() || s.is_manual() {
        return false;
    }
    if s.is_tile_maximal() {
        return true;
    }
    if sub.is_tile_maximal() {
        return false;
    }
    let (Sharding::Tiled(pt), Sharding::Tiled(st)) = (sub, s) else {
        return false;
    };
    let r = pt.data_rank();
    if r != st.data_rank() || r != shape.len() {
        return false;
    }
    let mut pbase = vec![0i64; r];
    let mut base = vec![0i64; r];
    let mut shortcut = true;
    let mut diff = 0usize;
    let mut reshape_dims: Vec<i64> = pt.tiles().dims().to_vec();
    for i in 0..r {
        let n = shape[i];
        let p = pt.tiles().dim(i);
        let q = st.tiles().dim(i);
        if p < q {
            return false;
        }
        pbase[i] = ceil_div(n, p);
        base[i] = ceil_div(n, q);
        if q != 1
            && (p % q != 0
                || base[i] % pbase[i].max(1) != 0
                || n <= (p - 1) * pbase[i]
                || n <= (q - 1) * base[i])
        {
            shortcut = false;
        }
        if shortcut && p != q {
            reshape_dims[i + diff] = q;
            reshape_dims.insert(i + diff + 1, p / q);
            diff += 1;
        }
    }
    if shortcut {
        if !s.has_partial_replication() {
            return sub == s;
        }
        let mut perm: Vec<usize> = (0..reshape_dims.len()).collect();
        for i in 0..r {
            if pt.tiles().dim(i) != st.tiles().dim(i) {
                let e = perm.remove(i + 1);
                perm.push(e);
            }
        }
        if reshape_dims.iter().product::<i64>() != pt.tiles().num_elements()
            || st.tiles().num_elements() != pt.tiles().num_elements()
        {
            return false;
        }
        let t = pt
            .tiles()
            .reshape(reshape_dims)
            .transpose(&perm)
            .reshape(st.tiles().dims().to_vec());
        return Sharding::partial_tile(t).tiles() == Some(st.tiles());
    }
    // General case: compare tile offsets device by device.
    let mut offsets: rustc_hash::FxHashMap<i64, Vec<i64>> = rustc_hash::FxHashMap::default();
    for_each_index(st.tiles().dims(), |flat, idx| {
        let dev = st.tiles().devices()[flat];
        offsets
            .entry(dev)
            .or_insert_with(|| (0..r).map(|i| base[i] * idx[i]).collect());
    });
    let mut ok = true;
    for_each_index(pt.tiles().dims(), |flat, idx| {
        if !ok {
            return;
        }
        let dev = pt.tiles().devices()[flat];
        let Some(so) = offsets.get(&dev) else {
            ok = false;
            return;
        };
        for j in 0..r {
            let sub_off = pbase[j] * idx[j];
            if sub_off < so[j] {
                ok = false;
                return;
            }
            if sub_off + pbase[j] <= shape[j] && sub_off + pbase[j] > so[j] + base[j] {
                ok = false;
                return;
            }
        }
    });
    ok
}

/// The sharding `from` improves `current` to, if any
/// (`ReturnImprovedShardingImpl`); `shape` is the instruction's array shape
/// (`None` for tuples).
pub fn return_improved(
    from: &InstrSharding,
    current: Option<&InstrSharding>,
    shape: Option<&[i64]>,
    may_combine: bool,
    allow_aggressive_resharding: bool,
) -> Option<InstrSharding> {
    if let Some(cur) = current {
        if is_strictly_better(from, cur) {
            return Some(from.clone());
        }
    }
    if !from.is_spatially_partitioned() {
        return None;
    }
    let Some(cur) = current else {
        return Some(from.clone());
    };
    if from.is_manual() {
        return None;
    }
    let tiles_before = match from {
        InstrSharding::Single(s) => s.num_tiles(),
        InstrSharding::Tuple(_) => 0,
    };
    let mut merged = from.clone();
    if merge_sharding(cur, &mut merged, may_combine) {
        if let (false, Some(shape), InstrSharding::Single(c), InstrSharding::Single(m)) =
            (allow_aggressive_resharding, shape, cur, &merged)
        {
            if !c.is_tile_maximal()
                && m.num_tiles() == tiles_before
                && !is_subtiling_or_equal(shape, m, c)
            {
                return None;
            }
        }
        return Some(merged);
    }
    None
}

/// A sharding compatible with all of `shardings`, else `default` (or the
/// first) (`FindCommonSharding`).
pub fn find_common_sharding(
    shardings: &[Sharding],
    default: Option<&Sharding>,
) -> Option<Sharding> {
    let first = shardings.first()?;
    let mut common = first.clone();
    for s in &shardings[1..] {
        if &common != s {
            let min = common.num_tiles();
            if !merge_sharding_if_compatible(s, min, &mut common) {
                return Some(default.cloned().unwrap_or_else(|| first.clone()));
            }
        }
    }
    Some(common)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::partially_replicate_on_dims;

    fn tiled(dims: &[i64]) -> Sharding {
        Sharding::tile(TileArray::iota(dims.to_vec()))
    }

    #[test]
    fn merge_partials() {
        // [2,1,4] (dim 0 on 2) and [1,4,2] (dim 1 on 4) merge into [2,4].
        let a = partially_replicate_on_dims(&tiled(&[2, 4]), &[1]);
        let b = partially_replicate_on_dims(&tiled(&[2, 4]), &[0]);
        let mut dst = a.clone();
        assert!(merge_sharding_if_compatible(&b, 3, &mut dst));
        assert_eq!(dst, tiled(&[2, 4]));
    }

    #[test]
    fn subtiling() {
        let fine = tiled(&[2, 4]);
        let coarse = partially_replicate_on_dims(&fine, &[1]);
        assert!(is_subtiling_or_equal(&[16, 64], &fine, &coarse));
        assert!(!is_subtiling_or_equal(&[16, 64], &coarse, &fine));
        assert!(is_subtiling_or_equal(
            &[16, 64],
            &fine,
            &Sharding::Replicated
        ));
    }

    #[test]
    fn more_specific() {
        assert!(is_leaf_more_specific(&tiled(&[8]), &Sharding::Replicated));
        assert!(!is_leaf_more_specific(&Sharding::Replicated, &tiled(&[8])));
        assert!(is_leaf_more_specific(
            &Sharding::Manual,
            &Sharding::Replicated
        ));
    }
}
