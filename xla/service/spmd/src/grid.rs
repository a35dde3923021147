//! `Grid`: the partitioner's working form of an array sharding. A grid is a
//! device array over `[tiles of dim 0, ..., tiles of dim r-1, replication]`;
//! the device at tile coordinates `c` holds the padded tile
//! `[c_a * ceil(X_a / t_a), (c_a + 1) * ceil(X_a / t_a))` of every dim `a`
//! (XLA's uneven-sharding convention: every tile has the ceiling size, the
//! valid part comes first, trailing tiles may be padding only).
//!
//! Invariants: `devs` lists every device `0..n` exactly once (a sharding that
//! leaves devices out is rejected); devices inside one replication group are
//! sorted, so `==` is semantic equality; `pos[d]` is device `d`'s flat index.
//! Nothing panics on malformed input; constructors return `None`/errors.

use crate::error::SpmdError;
use rustc_hash::{FxHashMap, FxHasher};
use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use xla_hlo_ir::sharding::SubgroupType;
use xla_hlo_utils::{Sharding, TileArray};

#[derive(Debug)]
struct GridData {
    /// Tile counts of the data dims, then the replication count (last).
    dims: Vec<i64>,
    /// Row-major strides of `dims`.
    strides: Vec<i64>,
    /// Devices, row-major over `dims`.
    devs: Vec<i64>,
    /// Device -> flat index into `devs`.
    pos: Vec<u32>,
    /// Hash of `dims` and `devs` (cheap inequality).
    hash: u64,
}

/// Device groups of a collective (shared).
pub type Groups = Arc<Vec<Vec<i64>>>;

/// A normalized tiled sharding over all devices. Cloning is cheap (shared);
/// grids are interned per thread, so equal grids built by the partitioner
/// usually share storage and derived grids are memoized by identity.
#[derive(Clone, Debug)]
pub struct Grid(Arc<GridData>);

impl PartialEq for Grid {
    fn eq(&self, other: &Grid) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || (self.0.hash == other.0.hash
                && self.0.dims == other.0.dims
                && self.0.devs == other.0.devs)
    }
}
impl Eq for Grid {}
impl Hash for Grid {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.0.hash);
    }
}

fn strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1];
    }
    s
}

/// Memo tables for grid operations, keyed by grid identity.
#[derive(Default)]
struct Memo {
    interned: FxHashMap<u64, Vec<Grid>>,
    remap: FxHashMap<(usize, Vec<Option<usize>>), Grid>,
    gathered: FxHashMap<(usize, Vec<(usize, i64)>), Option<Grid>>,
    a2a: FxHashMap<(usize, usize, usize, i64), Option<Grid>>,
    coarse: FxHashMap<(usize, Vec<i64>), Option<Grid>>,
    groups: FxHashMap<(usize, Vec<(usize, i64)>), Groups>,
    replicated: FxHashMap<(usize, i64), Grid>,
    merged: FxHashMap<(usize, usize, Vec<usize>), Option<Grid>>,
    plans: FxHashMap<(usize, usize, Vec<i64>, u64), crate::reshard::Plan>,
    per_coord: FxHashMap<(usize, usize, Vec<i64>), Arc<[i64]>>,
    slice_tables: FxHashMap<(usize, usize, usize, i64), (Arc<[i64]>, i64)>,
    reshapes: FxHashMap<(usize, bool, Vec<i64>, Vec<i64>), Option<Grid>>,
    #[allow(clippy::type_complexity)]
    shardings: FxHashMap<u64, Vec<(xla_hlo_ir::HloSharding, Vec<i64>, i64, crate::partition::VS)>>,
}

/// A memoized resharding plan.
pub(crate) fn memo_plan(
    src: &Grid,
    tgt: &Grid,
    dims: &[i64],
    bytes: u64,
    f: impl FnOnce() -> crate::reshard::Plan,
) -> crate::reshard::Plan {
    let k = (key(src), key(tgt), dims.to_vec(), bytes);
    if let Some(p) = MEMO.with(|m| m.borrow().plans.get(&k).cloned()) {
        return p;
    }
    let p = f();
    MEMO.with(|m| m.borrow_mut().plans.insert(k, p.clone()));
    p
}

/// The per-partition offsets of a local slice from `cur`'s tile to `to`'s
/// along dim `a` of size `xa` (0 for devices whose target tile is padding),
/// and the buffer length the slices need (memoized).
pub(crate) fn slice_table(cur: &Grid, to: &Grid, a: usize, xa: i64) -> (Arc<[i64]>, i64) {
    let k = (key(cur), key(to), a, xa);
    if let Some(v) = MEMO.with(|m| m.borrow().slice_tables.get(&k).cloned()) {
        return v;
    }
    let (ss, st) = (tile_size(xa, cur.tiles(a)), tile_size(xa, to.tiles(a)));
    let n = cur.num_devices();
    let mut t = vec![0i64; n as usize];
    let mut need = st;
    for d in 0..n {
        let ot = to.coord(d, a) * st;
        let vt = (xa - ot).clamp(0, st);
        if vt == 0 {
            continue;
        }
        let off = ot - cur.coord(d, a) * ss;
        t[d as usize] = off;
        need = need.max(off + st);
    }
    let v: (Arc<[i64]>, i64) = (t.into(), need);
    MEMO.with(|m| m.borrow_mut().slice_tables.insert(k, v.clone()));
    v
}

/// A memoized grid computation over a reshape (`forward`: the output grid
/// of a local reshape of `g`; else the operand grid `g` needs).
pub(crate) fn memo_reshape(
    g: &Grid,
    forward: bool,
    from: &[i64],
    to: &[i64],
    f: impl FnOnce() -> Option<Grid>,
) -> Option<Grid> {
    let k = (key(g), forward, from.to_vec(), to.to_vec());
    if let Some(v) = MEMO.with(|m| m.borrow().reshapes.get(&k).cloned()) {
        return v;
    }
    let v = f();
    MEMO.with(|m| m.borrow_mut().reshapes.insert(k, v.clone()));
    v
}

/// The structure of a shape that its sharding conversion depends on: leaf
/// ranks (-1 for non-arrays) with tuple sizes encoded as `-(k + 2)`.
fn skeleton(shape: &xla_hlo_ir::Shape, out: &mut Vec<i64>) {
    match shape {
        xla_hlo_ir::Shape::Tuple(e) => {
            out.push(-(e.len() as i64) - 2);
            for x in e {
                skeleton(x, out);
            }
        }
        s if s.is_array() => out.push(s.rank() as i64),
        _ => out.push(-1),
    }
}

/// A memoized conversion of an IR sharding.
pub(crate) fn memo_sharding(
    s: &xla_hlo_ir::HloSharding,
    shape: &xla_hlo_ir::Shape,
    n: i64,
    f: impl FnOnce() -> Result<crate::partition::VS, SpmdError>,
) -> Result<crate::partition::VS, SpmdError> {
    let mut sk = Vec::new();
    skeleton(shape, &mut sk);
    let mut h = FxHasher::default();
    for leaf in s.leaves() {
        leaf.kind.hash(&mut h);
    }
    s.is_tuple().hash(&mut h);
    sk.hash(&mut h);
    n.hash(&mut h);
    let hk = h.finish();
    let same = |a: &xla_hlo_ir::HloSharding| {
        a.is_tuple() == s.is_tuple()
            && a.leaves().len() == s.leaves().len()
            && a.leaves()
                .iter()
                .zip(s.leaves())
                .all(|(x, y)| x.kind == y.kind)
    };
    let hit = MEMO.with(|m| {
        m.borrow().shardings.get(&hk).and_then(|b| {
            b.iter()
                .find(|e| same(&e.0) && e.1 == sk && e.2 == n)
                .map(|e| e.3.clone())
        })
    });
    if let Some(v) = hit {
        return Ok(v);
    }
    let v = f()?;
    MEMO.with(|m| {
        m.borrow_mut()
            .shardings
            .entry(hk)
            .or_default()
            .push((s.clone(), sk, n, v.clone()))
    });
    Ok(v)
}

thread_local! {
    static MEMO: RefCell<Memo> = RefCell::new(Memo::default());
}

/// Drops the memo tables of this thread (grids stay valid).
pub fn clear_memo() {
    MEMO.with(|m| *m.borrow_mut() = Memo::default());
}

fn key(g: &Grid) -> usize {
    Arc::as_ptr(&g.0) as usize
}

/// Transposes a row-major device array: result axis `i` is source axis `perm[i]`.
pub(crate) fn transpose_devices(
    dims: &[i64],
    devs: &[i64],
    perm: &[usize],
) -> (Vec<i64>, Vec<i64>) {
    let s = strides(dims);
    let new_dims: Vec<i64> = perm.iter().map(|&p| dims[p]).collect();
    let new_strides: Vec<i64> = perm.iter().map(|&p| s[p]).collect();
    let n = devs.len();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0i64; new_dims.len()];
    let mut src: i64 = 0;
    for _ in 0..n {
        out.push(devs[src as usize]);
        for d in (0..new_dims.len()).rev() {
            idx[d] += 1;
            src += new_strides[d];
            if idx[d] < new_dims[d] {
                break;
            }
            src -= new_strides[d] * new_dims[d];
            idx[d] = 0;
        }
    }
    (new_dims, out)
}

impl Grid {
    /// A grid from tile counts (data dims then replication) and devices.
    pub fn new(dims: Vec<i64>, mut devs: Vec<i64>) -> Option<Grid> {
        if dims.is_empty() || dims.iter().any(|&d| d < 1) {
            return None;
        }
        let n: i64 = dims.iter().product();
        if n != devs.len() as i64 {
            return None;
        }
        let r = *dims.last().unwrap_or(&1) as usize;
        if r > 1 {
            for chunk in devs.chunks_mut(r) {
                chunk.sort_unstable();
            }
        }
        let mut pos = vec![u32::MAX; devs.len()];
        for (i, &d) in devs.iter().enumerate() {
            let slot = pos.get_mut(usize::try_from(d).ok()?)?;
            if *slot != u32::MAX {
                return None;
            }
            *slot = i as u32;
        }
        let mut h = FxHasher::default();
        dims.hash(&mut h);
        devs.hash(&mut h);
        let hash = h.finish();
        let data = GridData {
            strides: strides(&dims),
            dims,
            devs,
            pos,
            hash,
        };
        Some(Grid::intern(data))
    }

    fn intern(data: GridData) -> Grid {
        MEMO.with(|m| {
            let mut m = m.borrow_mut();
            let bucket = m.interned.entry(data.hash).or_default();
            if let Some(g) = bucket
                .iter()
                .find(|g| g.0.dims == data.dims && g.0.devs == data.devs)
            {
                return g.clone();
            }
            let g = Grid(Arc::new(data));
            bucket.push(g.clone());
            g
        })
    }

    /// Everything on every device.
    pub fn replicated(rank: usize, n: i64) -> Grid {
        if let Some(g) = MEMO.with(|m| m.borrow().replicated.get(&(rank, n)).cloned()) {
            return g;
        }
        let mut dims = vec![1; rank];
        dims.push(n.max(1));
        let g = Grid::new(dims, (0..n.max(1)).collect()).unwrap_or_else(|| {
            Grid(Arc::new(GridData {
                dims: vec![1],
                strides: vec![1],
                devs: vec![0],
                pos: vec![0],
                hash: 0,
            }))
        });
        MEMO.with(|m| m.borrow_mut().replicated.insert((rank, n), g.clone()));
        g
    }

    /// The grid of an array sharding of `rank` dims over `n` devices
    /// (maximal and unknown shardings count as replicated).
    pub fn from_sharding(s: &Sharding, rank: usize, n: i64) -> Result<Grid, SpmdError> {
        let bad = |m: String| SpmdError::Sharding {
            instruction: String::new(),
            message: m,
        };
        match s {
            Sharding::Replicated
            | Sharding::Maximal(_)
            | Sharding::Unknown
            | Sharding::Unreduced => Ok(Grid::replicated(rank, n)),
            Sharding::Manual => Err(SpmdError::Unsupported(
                "a manual sharding has no grid".into(),
            )),
            Sharding::Tiled(t) => {
                if t.data_rank() != rank {
                    return Err(bad(format!(
                        "sharding of rank {} on a rank-{rank} array",
                        t.data_rank()
                    )));
                }
                let mut dims = t.data_dims().to_vec();
                let mut repl = 1;
                for (i, ty) in t.subgroups().iter().enumerate() {
                    let size = t.tiles().dim(rank + i);
                    match ty {
                        SubgroupType::Replicated => repl *= size,
                        other => {
                            return Err(SpmdError::Unsupported(format!(
                                "{} subgroups",
                                other.name()
                            )))
                        }
                    }
                }
                dims.push(repl);
                let devs = t.tiles().devices().to_vec();
                if devs.len() as i64 != n {
                    return Err(bad(format!(
                        "sharding over {} devices in a module of {n} partitions",
                        devs.len()
                    )));
                }
                Grid::new(dims, devs).ok_or_else(|| bad("devices are not 0..n once each".into()))
            }
        }
    }

    /// The canonical sharding of this grid.
    pub fn to_sharding(&self) -> Sharding {
        match TileArray::new(self.0.dims.clone(), self.0.devs.clone()) {
            Ok(t) => Sharding::partial_tile(t),
            Err(_) => Sharding::Replicated,
        }
    }

    pub fn rank(&self) -> usize {
        self.0.dims.len() - 1
    }
    pub fn dims(&self) -> &[i64] {
        &self.0.dims
    }
    pub fn devs(&self) -> &[i64] {
        &self.0.devs
    }
    /// Tile count of data dim `a`.
    pub fn tiles(&self, a: usize) -> i64 {
        self.0.dims[a]
    }
    pub fn repl(&self) -> i64 {
        *self.0.dims.last().unwrap_or(&1)
    }
    pub fn num_devices(&self) -> i64 {
        self.0.devs.len() as i64
    }
    pub fn num_tiles(&self) -> i64 {
        self.0.dims[..self.rank()].iter().product()
    }
    pub fn is_replicated(&self) -> bool {
        self.num_tiles() == 1
    }
    /// Data dims with more than one tile.
    pub fn tiled_dims(&self) -> Vec<usize> {
        (0..self.rank()).filter(|&a| self.0.dims[a] > 1).collect()
    }

    /// The coordinates (data dims then replica index) of device `d`.
    pub fn coords(&self, d: i64) -> Vec<i64> {
        let p = self.0.pos[d as usize] as i64;
        self.0
            .strides
            .iter()
            .zip(&self.0.dims)
            .map(|(st, dim)| (p / st) % dim)
            .collect()
    }
    /// The coordinate of device `d` along data dim `a`.
    pub fn coord(&self, d: i64, a: usize) -> i64 {
        let p = self.0.pos[d as usize] as i64;
        (p / self.0.strides[a]) % self.0.dims[a]
    }
    /// The device at coordinates (data dims then replica index).
    pub fn device_at(&self, coords: &[i64]) -> i64 {
        let flat: i64 = coords.iter().zip(&self.0.strides).map(|(c, s)| c * s).sum();
        self.0.devs[flat as usize]
    }

    /// A grid where device `d` sits at tile coordinates `coord_of(d)` over
    /// data dims `dims`; every tile must get the same number of devices.
    pub fn from_coords(dims: &[i64], n: i64, coord_of: impl Fn(i64, &mut [i64])) -> Option<Grid> {
        let tiles: i64 = dims.iter().product();
        if tiles <= 0 || n % tiles != 0 {
            return None;
        }
        let repl = n / tiles;
        let s = strides(dims);
        let mut fill = vec![0i64; tiles as usize];
        let mut devs = vec![-1i64; n as usize];
        let mut c = vec![0i64; dims.len()];
        for d in 0..n {
            coord_of(d, &mut c);
            if c.iter().zip(dims).any(|(&c, &t)| c < 0 || c >= t) {
                return None;
            }
            let flat: i64 = c.iter().zip(&s).map(|(c, s)| c * s).sum();
            let k = fill[flat as usize];
            if k >= repl {
                return None;
            }
            fill[flat as usize] += 1;
            devs[(flat * repl + k) as usize] = d;
        }
        let mut full = dims.to_vec();
        full.push(repl);
        Grid::new(full, devs)
    }

    /// A grid over `map.len()` data dims: new dim `j` takes this grid's dim
    /// `map[j]` (a new untiled dim when `None`); this grid's data dims that
    /// no entry names are merged into replication.
    pub fn remap(&self, map: &[Option<usize>]) -> Grid {
        let k = (key(self), map.to_vec());
        if let Some(g) = MEMO.with(|m| m.borrow().remap.get(&k).cloned()) {
            return g;
        }
        let g = self.remap_uncached(map);
        MEMO.with(|m| m.borrow_mut().remap.insert(k, g.clone()));
        g
    }

    fn remap_uncached(&self, map: &[Option<usize>]) -> Grid {
        let r = self.rank();
        let mut perm: Vec<usize> = map.iter().flatten().copied().collect();
        let mut rest: Vec<usize> = (0..r).filter(|d| !perm.contains(d)).collect();
        perm.append(&mut rest);
        perm.push(r);
        let (_, devs) = transpose_devices(&self.0.dims, &self.0.devs, &perm);
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
    pub fn factor_groups(&self, factors: &[(usize, i64)]) -> Groups {
        let k = (key(self), factors.to_vec());
        if let Some(g) = MEMO.with(|m| m.borrow().groups.get(&k).cloned()) {
            return g;
        }
        let g = Arc::new(self.factor_groups_uncached(factors));
        MEMO.with(|m| m.borrow_mut().groups.insert(k, g.clone()));
        g
    }

    fn factor_groups_uncached(&self, factors: &[(usize, i64)]) -> Vec<Vec<i64>> {
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
        let (_, devs) = transpose_devices(&dims, &self.0.devs, &perm);
        devs.chunks(g.max(1) as usize).map(|c| c.to_vec()).collect()
    }

    /// The grid after gathering the minor factor `f` of each `(dim, f)`.
    pub fn gathered(&self, factors: &[(usize, i64)]) -> Option<Grid> {
        let k = (key(self), factors.to_vec());
        if let Some(g) = MEMO.with(|m| m.borrow().gathered.get(&k).cloned()) {
            return g;
        }
        let g = self.gathered_uncached(factors);
        MEMO.with(|m| m.borrow_mut().gathered.insert(k, g.clone()));
        g
    }

    fn gathered_uncached(&self, factors: &[(usize, i64)]) -> Option<Grid> {
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

    /// The grid after an all-to-all moving the minor factor `f` of dim `a`
    /// to a new minor factor of dim `b`.
    pub fn all_to_all(&self, a: usize, b: usize, f: i64) -> Option<Grid> {
        let k = (key(self), a, b, f);
        if let Some(g) = MEMO.with(|m| m.borrow().a2a.get(&k).cloned()) {
            return g;
        }
        let g = self.all_to_all_uncached(a, b, f);
        MEMO.with(|m| m.borrow_mut().a2a.insert(k, g.clone()));
        g
    }

    fn all_to_all_uncached(&self, a: usize, b: usize, f: i64) -> Option<Grid> {
        if a == b || f < 2 || self.0.dims[a] % f != 0 {
            return None;
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
    /// this grid's count): device `d` holds the coarse tile containing its tile.
    pub fn coarsened(&self, dims: &[i64]) -> Option<Grid> {
        let k = (key(self), dims.to_vec());
        if let Some(g) = MEMO.with(|m| m.borrow().coarse.get(&k).cloned()) {
            return g;
        }
        let g = self.coarsened_uncached(dims);
        MEMO.with(|m| m.borrow_mut().coarse.insert(k, g.clone()));
        g
    }

    fn coarsened_uncached(&self, dims: &[i64]) -> Option<Grid> {
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
        Grid::from_coords(dims, self.num_devices(), |d, c| {
            for (a, x) in c.iter_mut().enumerate() {
                *x = self.coord(d, a) / ratio[a];
            }
        })
    }

    /// Combines two grids over the same dims: dims in `from_y` take `y`'s
    /// tiling and coordinates, the others `self`'s (memoized).
    pub fn merge(&self, y: &Grid, from_y: &[usize]) -> Option<Grid> {
        let k = (key(self), key(y), from_y.to_vec());
        if let Some(g) = MEMO.with(|m| m.borrow().merged.get(&k).cloned()) {
            return g;
        }
        let r = self.rank();
        let g = if y.rank() != r {
            None
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
        };
        MEMO.with(|m| m.borrow_mut().merged.insert(k, g.clone()));
        g
    }

    /// The table over partitions of `vals[coordinate along dim a]` (memoized).
    pub fn per_coord(&self, a: usize, vals: &[i64]) -> Arc<[i64]> {
        let k = (key(self), a, vals.to_vec());
        if let Some(v) = MEMO.with(|m| m.borrow().per_coord.get(&k).cloned()) {
            return v;
        }
        let t: Arc<[i64]> = (0..self.num_devices())
            .map(|d| vals.get(self.coord(d, a) as usize).copied().unwrap_or(0))
            .collect::<Vec<_>>()
            .into();
        MEMO.with(|m| m.borrow_mut().per_coord.insert(k, t.clone()));
        t
    }

    /// Offsets of every partition's tile along dim `a` (tile size `ts`).
    pub fn offsets(&self, a: usize, ts: i64) -> Arc<[i64]> {
        let vals: Vec<i64> = (0..self.tiles(a)).map(|i| i * ts).collect();
        self.per_coord(a, &vals)
    }

    /// Replicates the given data dims (their tiles merge into replication).
    pub fn replicate_dims(&self, dims: &[usize]) -> Grid {
        let map: Vec<Option<usize>> = (0..self.rank())
            .map(|a| if dims.contains(&a) { None } else { Some(a) })
            .collect();
        self.remap(&map)
    }
}

/// Padded tile size of a dim of size `x` split into `t` tiles.
pub fn tile_size(x: i64, t: i64) -> i64 {
    if t <= 1 {
        x
    } else {
        (x + t - 1) / t
    }
}

/// Local (padded) dims of an array of `dims` under `g`.
pub fn local_dims(dims: &[i64], g: &Grid) -> Vec<i64> {
    dims.iter()
        .enumerate()
        .map(|(a, &x)| tile_size(x, g.tiles(a)))
        .collect()
}

pub fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a.abs()
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remap_and_groups() {
        // [4,2] iota: device = 2*i + j.
        let g = Grid::new(vec![4, 2, 1], (0..8).collect()).unwrap();
        assert_eq!(g.coords(5), vec![2, 1, 0]);
        let groups = g.factor_groups(&[(1, 2)]);
        assert_eq!(
            *groups,
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
        let groups = g.factor_groups(&[(0, 4)]);
        assert_eq!(*groups, vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
        let r = g.replicate_dims(&[1]);
        assert_eq!(r.dims(), &[4, 1, 2]);
        let t = g.remap(&[Some(1), Some(0)]);
        assert_eq!(t.dims(), &[2, 4, 1]);
        assert_eq!(t.device_at(&[1, 2, 0]), 5);
    }

    #[test]
    fn all_to_all_moves_minor_factor() {
        // dim0 8-way -> dim0 4-way, dim1 2-way.
        let g = Grid::new(vec![8, 1, 1], (0..8).collect()).unwrap();
        let t = g.all_to_all(0, 1, 2).unwrap();
        assert_eq!(t.dims(), &[4, 2, 1]);
        assert_eq!(t.devs(), &(0..8).collect::<Vec<_>>()[..]);
        let full = g.gathered(&[(0, 8)]).unwrap();
        assert!(full.is_replicated());
    }
}
