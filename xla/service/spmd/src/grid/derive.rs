//! Derived grids: the grid after a collective or a change of dims (remap,
//! gather, all-to-all, coarsening, merge, reshape, the layout of a
//! reduce-scatter) and the device groups of a collective. Every operation
//! is a pure function of its inputs: in digit form when the inputs have one
//! (O(rank)), else on device lists. `GridCache` memoizes them.
//!
//! Invariant: the digit-form and device-list paths give equal grids (the
//! tests compare them on random grids).

use super::digits::DigitForm;
use super::groups::DevGroups;
use super::{gcd, transpose_devices, Grid};

impl Grid {
    /// A grid over `map.len()` data dims: new dim `j` takes this grid's dim
    /// `map[j]` (a new untiled dim when `None`); this grid's data dims that
    /// no entry names are merged into replication.
    pub fn remap(&self, map: &[Option<usize>]) -> Grid {
        self.remap_by_digits(map)
            .unwrap_or_else(|| self.remap_by_devices(map))
    }

    pub(super) fn remap_by_digits(&self, map: &[Option<usize>]) -> Option<Grid> {
        let s = self.0.digits.as_ref()?;
        let r = self.rank();
        let mut used = vec![false; r + 1];
        let mut digs: Vec<Vec<usize>> = Vec::with_capacity(map.len() + 1);
        for m in map {
            match m {
                Some(a) if *a < r && !used[*a] => {
                    used[*a] = true;
                    digs.push(s.digs[*a].clone());
                }
                Some(_) => return None,
                None => digs.push(Vec::new()),
            }
        }
        let mut rest = Vec::new();
        for a in 0..=r {
            if !used[a] {
                rest.extend(&s.digs[a]);
            }
        }
        digs.push(rest);
        Some(Grid::from_digits(DigitForm::canon(s.radix.clone(), digs)?))
    }

    pub(super) fn remap_by_devices(&self, map: &[Option<usize>]) -> Grid {
        let r = self.rank();
        let mut perm: Vec<usize> = map.iter().flatten().copied().collect();
        let mut rest: Vec<usize> = (0..r).filter(|d| !perm.contains(d)).collect();
        perm.append(&mut rest);
        perm.push(r);
        let (_, devs) = transpose_devices(&self.0.dims, self.devs(), &perm);
        let mut dims: Vec<i64> = map
            .iter()
            .map(|m| m.map(|d| self.0.dims[d]).unwrap_or(1))
            .collect();
        let mapped: i64 = dims.iter().product();
        dims.push(self.num_devices() / mapped.max(1));
        Grid::new(dims, devs).unwrap_or_else(|| Grid::replicated(map.len(), self.num_devices()))
    }

    /// Device groups that vary over the minor factor `f` of each `(dim, f)`
    /// (row-major over the factors in the order given), all other
    /// coordinates fixed; every device is in exactly one group.
    pub fn factor_groups(&self, factors: &[(usize, i64)]) -> DevGroups {
        self.factor_groups_by_digits(factors)
            .unwrap_or_else(|| DevGroups::from_lists(&self.factor_group_lists(factors)))
    }

    pub(super) fn factor_groups_by_digits(&self, factors: &[(usize, i64)]) -> Option<DevGroups> {
        let mut s = self.0.digits.clone()?;
        let r = self.rank();
        let nd = s.digs.len();
        let mut lists = Vec::new();
        for &(a, f) in factors {
            if a >= r || f <= 1 {
                continue;
            }
            s.digs.push(Vec::new());
            let into = s.digs.len() - 1;
            if !s.take_minor(a, f, into) {
                return None;
            }
            lists.push(into);
        }
        let rest: Vec<usize> = s.digs[..nd].iter().flatten().copied().collect();
        let minor: Vec<usize> = lists.iter().flat_map(|&l| s.digs[l].clone()).collect();
        let list = s.iota_groups(&rest, &minor);
        let size: i64 = minor.iter().map(|&k| s.radix[k]).product();
        Some(DevGroups {
            count: self.num_devices() / size.max(1),
            size,
            list,
        })
    }

    pub(super) fn factor_group_lists(&self, factors: &[(usize, i64)]) -> Vec<Vec<i64>> {
        let r = self.rank();
        // Split each factored dim into (major, minor).
        let mut dims = Vec::new();
        let mut minor_axis = vec![usize::MAX; r];
        let mut order_major = Vec::new();
        for a in 0..=r {
            let f = factors.iter().find(|x| x.0 == a).map(|x| x.1).unwrap_or(1);
            if a < r && f > 1 {
                order_major.push(dims.len());
                dims.push(self.0.dims[a] / f);
                minor_axis[a] = dims.len();
                dims.push(f);
            } else {
                order_major.push(dims.len());
                dims.push(self.0.dims[a]);
            }
        }
        let mut perm = order_major;
        let mut g = 1;
        for &(a, f) in factors {
            if a < r && f > 1 {
                perm.push(minor_axis[a]);
                g *= f;
            }
        }
        let (_, devs) = transpose_devices(&dims, self.devs(), &perm);
        devs.chunks(g.max(1) as usize).map(|c| c.to_vec()).collect()
    }

    /// Moves the minor factor `f` of each `(dim, f)` into replication.
    pub(super) fn gathered_by_digits(&self, factors: &[(usize, i64)]) -> Option<Grid> {
        let mut s = self.0.digits.clone()?;
        let r = self.rank();
        for &(a, f) in factors {
            if a >= r || f < 1 || self.0.dims[a] % f != 0 {
                return None;
            }
            if !s.take_minor(a, f, r) {
                return None;
            }
        }
        Some(Grid::from_digits(DigitForm::canon(s.radix, s.digs)?))
    }

    /// The grid after gathering the minor factor `f` of each `(dim, f)`.
    pub fn gathered(&self, factors: &[(usize, i64)]) -> Option<Grid> {
        self.gathered_by_digits(factors)
            .or_else(|| self.gathered_by_devices(factors))
    }

    pub(super) fn gathered_by_devices(&self, factors: &[(usize, i64)]) -> Option<Grid> {
        let mut dims = self.0.dims[..self.rank()].to_vec();
        for &(a, f) in factors {
            if f < 1 || dims[a] % f != 0 {
                return None;
            }
            dims[a] /= f;
        }
        let fs: Vec<i64> = (0..self.rank())
            .map(|a| factors.iter().find(|x| x.0 == a).map(|x| x.1).unwrap_or(1))
            .collect();
        Grid::from_coords(&dims, self.num_devices(), |d, c| {
            for (a, x) in c.iter_mut().enumerate() {
                *x = self.coord(d, a) / fs[a];
            }
        })
    }

    /// [`Grid::all_to_all`] on the digit form (`None` without one, or when
    /// the factor does not split off the digits).
    pub(super) fn all_to_all_by_digits(&self, a: usize, b: usize, f: i64) -> Option<Grid> {
        let mut s = self.0.digits.clone()?;
        s.digs.push(Vec::new());
        let into = s.digs.len() - 1;
        if !s.take_minor(a, f, into) {
            return None;
        }
        let moved = s.digs.pop()?;
        s.digs[b].extend(moved);
        Some(Grid::from_digits(DigitForm::canon(s.radix, s.digs)?))
    }

    /// The grid after an all-to-all moving the minor factor `f` of dim `a`
    /// to a new minor factor of dim `b`.
    pub fn all_to_all(&self, a: usize, b: usize, f: i64) -> Option<Grid> {
        if a == b || f < 2 || self.0.dims[a] % f != 0 || a >= self.rank() || b >= self.rank() {
            return None;
        }
        if let Some(g) = self.all_to_all_by_digits(a, b, f) {
            return Some(g);
        }
        let mut dims = self.0.dims[..self.rank()].to_vec();
        dims[a] /= f;
        dims[b] *= f;
        Grid::from_coords(&dims, self.num_devices(), |d, c| {
            for (k, x) in c.iter_mut().enumerate() {
                *x = self.coord(d, k);
            }
            let r = c[a] % f;
            c[a] /= f;
            c[b] = c[b] * f + r;
        })
    }

    /// This grid coarsened to `dims` tiles per data dim (each a divisor of
    /// this grid's count): device `d` holds the coarse tile containing its
    /// tile.
    pub fn coarsened(&self, dims: &[i64]) -> Option<Grid> {
        if dims.len() != self.rank() {
            return None;
        }
        let mut ratio = Vec::with_capacity(dims.len());
        for (a, &t) in dims.iter().enumerate() {
            if t < 1 || self.0.dims[a] % t != 0 {
                return None;
            }
            ratio.push(self.0.dims[a] / t);
        }
        let factors: Vec<(usize, i64)> = ratio
            .iter()
            .enumerate()
            .filter(|x| *x.1 > 1)
            .map(|(a, &f)| (a, f))
            .collect();
        if let Some(g) = self.gathered_by_digits(&factors) {
            return Some(g);
        }
        Grid::from_coords(dims, self.num_devices(), |d, c| {
            for (a, x) in c.iter_mut().enumerate() {
                *x = self.coord(d, a) / ratio[a];
            }
        })
    }

    pub(super) fn merge_by_digits(&self, y: &Grid, from_y: &[usize]) -> Option<Grid> {
        let (sx, sy) = (self.0.digits.as_ref()?, y.0.digits.as_ref()?);
        let (sx, sy) = DigitForm::common(sx, sy)?;
        let r = self.rank();
        let mut digs: Vec<Vec<usize>> = (0..r)
            .map(|a| {
                if from_y.contains(&a) {
                    sy.digs[a].clone()
                } else {
                    sx.digs[a].clone()
                }
            })
            .collect();
        let mut used = vec![false; sx.radix.len()];
        for l in &digs {
            for &k in l {
                if used[k] {
                    return None;
                }
                used[k] = true;
            }
        }
        digs.push((0..used.len()).filter(|&k| !used[k]).collect());
        Some(Grid::from_digits(DigitForm::canon(sx.radix, digs)?))
    }

    /// Combines two grids over the same dims: dims in `from_y` take `y`'s
    /// tiling and coordinates, the others `self`'s.
    pub fn merge(&self, y: &Grid, from_y: &[usize]) -> Option<Grid> {
        let r = self.rank();
        if y.rank() != r || y.num_devices() != self.num_devices() {
            None
        } else if let Some(g) = self.merge_by_digits(y, from_y) {
            Some(g)
        } else {
            let dims: Vec<i64> = (0..r)
                .map(|a| {
                    if from_y.contains(&a) {
                        y.tiles(a)
                    } else {
                        self.tiles(a)
                    }
                })
                .collect();
            let ys: Vec<bool> = (0..r).map(|a| from_y.contains(&a)).collect();
            Grid::from_coords(&dims, self.num_devices(), |d, c| {
                for (a, x) in c.iter_mut().enumerate() {
                    *x = if ys[a] {
                        y.coord(d, a)
                    } else {
                        self.coord(d, a)
                    };
                }
            })
        }
    }

    /// XLA's `ReshapeSharding` of this grid from global dims `source` to
    /// `target`, in digit form: `Some(result)` when it was computed here
    /// (`result` as `xla_hlo_utils::ops::reshape_sharding` would give it),
    /// `None` when only the device-list path can tell (it replicates dims).
    pub fn reshaped(&self, source: &[i64], target: &[i64]) -> Option<Option<Grid>> {
        let digits = self.0.digits.as_ref()?;
        if source.len() != self.rank() {
            return Some(None);
        }
        if self.is_replicated() {
            return Some(Some(Grid::replicated(target.len(), self.num_devices())));
        }
        let tiles = &self.0.dims[..self.rank()];
        let mut tt = reshape_tile_counts(source, target, tiles)?;
        let Some(t) = tt.as_mut() else {
            return Some(None);
        };
        let p: i64 = t.iter().product();
        let total = self.num_devices();
        if p == 0 || total % p != 0 {
            return Some(None);
        }
        t.push(total / p);
        // The devices keep their row-major order; only the dims change.
        let seq: Vec<usize> = digits.digs.iter().flatten().copied().collect();
        let mut x = DigitForm::deal(digits.radix.clone(), seq, t)?;
        let tmp = t.len();
        if !x.digs[tmp].is_empty() {
            return None;
        }
        x.digs.pop();
        Some(Some(Grid::from_digits(DigitForm::canon(x.radix, x.digs)?)))
    }

    /// This grid (`io`) with the coordinates of `c`'s data dims `ks` (major
    /// first) appended as a new minor factor of dim `od`: the layout of a
    /// reduce-scatter over `ks`'s device groups onto `od`.
    pub fn with_minor_from(&self, c: &Grid, ks: &[usize], od: usize) -> Option<Grid> {
        let (x, y) = DigitForm::common(self.0.digits.as_ref()?, c.0.digits.as_ref()?)?;
        let r = self.rank();
        if od >= r || ks.iter().any(|&k| k >= c.rank()) {
            return None;
        }
        let mut digs: Vec<Vec<usize>> = x.digs[..r].to_vec();
        for &k in ks {
            digs[od].extend(&y.digs[k]);
        }
        let mut used = vec![false; x.radix.len()];
        for l in &digs {
            for &k in l {
                if used[k] {
                    return None;
                }
                used[k] = true;
            }
        }
        digs.push((0..used.len()).filter(|&k| !used[k]).collect());
        Some(Grid::from_digits(DigitForm::canon(x.radix, digs)?))
    }

    /// The grid of a partial result laid out by this grid (`io`; partial
    /// over the tiled iteration dims `k_tiled` of `c`) after a
    /// reduce-scatter over those dims' device groups onto dim `od`: each
    /// device keeps the chunk at its rank in its group, as a new minor
    /// factor of `od`'s tiling.
    pub fn reduce_scattered(&self, c: &Grid, k_tiled: &[usize], od: usize) -> Option<Grid> {
        let io = self;
        let g: i64 = k_tiled.iter().map(|&k| c.tiles(k)).product();
        let dims: Vec<i64> = (0..io.rank())
            .map(|a| {
                if a == od {
                    io.tiles(a) * g
                } else {
                    io.tiles(a)
                }
            })
            .collect();
        if let Some(g) = io.with_minor_from(c, k_tiled, od) {
            return Some(g);
        }
        Grid::from_coords(&dims, c.num_devices(), |d, out| {
            let mut rank = 0;
            for &k in k_tiled {
                rank = rank * c.tiles(k) + c.coord(d, k);
            }
            for (a, x) in out.iter_mut().enumerate() {
                let ca = io.coord(d, a);
                *x = if a == od { ca * g + rank } else { ca };
            }
        })
    }

    /// Replicates the given data dims (their tiles merge into replication).
    pub fn replicate_dims(&self, dims: &[usize]) -> Grid {
        self.remap(&replicate_dims_map(self.rank(), dims))
    }
}

/// The remap (see [`Grid::remap`]) that replicates `dims` of a grid of `rank`.
pub(super) fn replicate_dims_map(rank: usize, dims: &[usize]) -> Vec<Option<usize>> {
    (0..rank)
        .map(|a| if dims.contains(&a) { None } else { Some(a) })
        .collect()
}

/// The start of each of `tiles` tiles of size `ts`.
pub(super) fn offset_values(tiles: i64, ts: i64) -> Vec<i64> {
    (0..tiles).map(|i| i * ts).collect()
}

/// The data tile counts `xla_hlo_utils::ops::reshape_sharding` gives a
/// reshape from `source` to `target` of a sharding with data tile counts
/// `tiles` (a port of its first phase): `Some(None)` when it gives no
/// sharding, `None` when it would replicate some dims (not handled here).
fn reshape_tile_counts(source: &[i64], target: &[i64], tiles: &[i64]) -> Option<Option<Vec<i64>>> {
    let mut target_tiles: Vec<i64> = Vec::new();
    let mut src_stack: Vec<i64> = source.iter().rev().copied().collect();
    let mut tgt_stack: Vec<i64> = target.iter().rev().copied().collect();
    let mut tile_stack: Vec<i64> = tiles.iter().rev().copied().collect();
    let mut src_index: i64 = -1;
    let mut inplace = false;
    fn append(target_tiles: &mut Vec<i64>, inplace: &mut bool, size: i64) {
        if *inplace {
            if let Some(l) = target_tiles.last_mut() {
                *l *= size;
            }
        } else {
            target_tiles.push(size);
        }
        *inplace = false;
    }
    while !src_stack.is_empty() && !tgt_stack.is_empty() && tile_stack.iter().product::<i64>() != 1
    {
        let mut src_product = 1i64;
        while tile_stack.last() == Some(&1) {
            let Some(&l) = src_stack.last() else {
                return Some(None);
            };
            src_product *= l;
            src_stack.pop();
            tile_stack.pop();
            src_index += 1;
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
            src_stack.push(src_product);
            tile_stack.push(1);
            src_index -= 1;
        }
        if src_stack.is_empty() || tgt_stack.is_empty() {
            break;
        }
        let (Some(&s_size), Some(&s_parts)) = (src_stack.last(), tile_stack.last()) else {
            return Some(None);
        };
        src_stack.pop();
        tile_stack.pop();
        src_index += 1;
        let Some(t_size) = tgt_stack.pop() else {
            return Some(None);
        };
        if s_size == t_size {
            append(&mut target_tiles, &mut inplace, s_parts);
        } else if t_size == 1 {
            append(&mut target_tiles, &mut inplace, 1);
            src_stack.push(s_size);
            tile_stack.push(s_parts);
            src_index -= 1;
        } else if s_size == 1 {
            tgt_stack.push(t_size);
            if s_parts > 1 && src_index >= 0 {
                return None;
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
            return Some(None);
        } else {
            let g = gcd(s_parts, t_size);
            if g == 1 {
                break;
            }
            src_stack.push(s_size / g);
            tile_stack.push(s_parts / g);
            src_index -= 1;
            tgt_stack.push(t_size / g);
            append(&mut target_tiles, &mut inplace, g);
            inplace = true;
        }
    }
    if target_tiles.iter().product::<i64>() == 1 {
        return Some(None);
    }
    while target_tiles.len() < target.len() {
        target_tiles.push(1);
    }
    if target_tiles.len() > target.len() {
        return Some(None);
    }
    Some(Some(target_tiles))
}
