//! `Grid`: the partitioner's working form of an array sharding. A grid is a
//! device array over `[tiles of dim 0, ..., tiles of dim r-1, replication]`;
//! the device at tile coordinates `c` holds the padded tile
//! `[c_a * ceil(X_a / t_a), (c_a + 1) * ceil(X_a / t_a))` of every dim `a`
//! (XLA's uneven-sharding convention: every tile has the ceiling size, the
//! valid part comes first, trailing tiles may be padding only).
//!
//! Grids whose device array is a transposed iota (XLA's
//! `IotaTileAssignment`; every sharding the partitioner derives from iota
//! shardings) are kept in digit form (`DigitForm`): device ids as mixed-radix
//! numbers, each grid dim reading some digits. Derived grids (gathers,
//! all-to-alls, remaps, merges, reshapes), device groups (emitted as iota
//! replica groups) and slice checks then cost O(rank), not O(devices); the
//! device list is built only when something needs it (collective-permute
//! pairs, per-partition offset tables, execution). Other grids keep an
//! explicit device list and the device-list algorithms.
//!
//! Invariants: a grid covers every device `0..n` exactly once (a sharding
//! that leaves devices out is rejected); devices inside one replication
//! group are sorted; the digit form is canonical and used whenever one
//! exists, so `==` is semantic equality; `pos[d]` is device `d`'s flat
//! index. Nothing panics on malformed input; constructors return
//! `None`/errors.

mod cache;
mod derive;
mod digits;
mod groups;
mod pairs;
#[cfg(test)]
mod tests;

pub use cache::GridCache;
pub use groups::{DevGroups, Groups};

use crate::error::SpmdError;
use digits::DigitForm;
use rustc_hash::FxHasher;
use std::cell::OnceCell;
use std::hash::{Hash, Hasher};
use std::rc::Rc;
use xla_hlo_ir::sharding::SubgroupType;
use xla_hlo_utils::{Sharding, TileArray};

#[derive(Debug)]
struct GridData {
    /// Tile counts of the data dims, then the replication count (last).
    dims: Vec<i64>,
    /// Row-major strides of `dims`.
    strides: Vec<i64>,
    /// Number of devices.
    n: i64,
    /// The digit form, when the device array has one (then every grid
    /// operation is O(rank) and no device list is built unless asked for).
    digits: Option<DigitForm>,
    /// Devices, row-major over `dims` (built on demand for digit forms).
    devs: OnceCell<Vec<i64>>,
    /// Device -> flat index into `devs` (explicit grids only).
    pos: OnceCell<Vec<u32>>,
    /// Every device's coordinates, device-major (`dims.len()` per device;
    /// built on demand, for planners that visit every device).
    coord_table: OnceCell<Vec<u32>>,
    /// The canonical sharding (built on demand).
    sharding: OnceCell<Sharding>,
    /// Hash of `dims` and the digit form or `devs` (cheap inequality).
    hash: u64,
}

/// A normalized tiled sharding over all devices. Cloning is cheap (shared).
/// `==` and `Hash` are semantic (equal device arrays over equal dims); a
/// [`GridCache`] memoizes derived grids by value and interns them, so equal
/// grids it hands out share storage and compare by pointer first.
#[derive(Clone, Debug)]
pub struct Grid(Rc<GridData>);

impl PartialEq for Grid {
    #[inline]
    fn eq(&self, other: &Grid) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
            // Hashes agree between grids of one form (digits or devices).
            || ((self.0.hash == other.0.hash
                || self.0.digits.is_some() != other.0.digits.is_some())
                && digits::same_short(&self.0.dims, &other.0.dims)
                && same_devices(&self.0, &other.0))
    }
}
impl Eq for Grid {}
impl Hash for Grid {
    #[inline]
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.0.hash);
    }
}

/// Equal device arrays (same dims assumed).
fn same_devices(a: &GridData, b: &GridData) -> bool {
    match (&a.digits, &b.digits) {
        (Some(x), Some(y)) => a.hash == b.hash && x == y,
        (None, None) => a.hash == b.hash && a.devs.get() == b.devs.get(),
        (Some(x), None) | (None, Some(x)) => {
            let e = if a.digits.is_none() { a } else { b };
            e.devs.get().map(|d| &x.devices() == d).unwrap_or(false)
        }
    }
}

fn strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1];
    }
    s
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
        if let Some(s) = DigitForm::detect(&dims, &devs) {
            let g = Grid::from_digits(s);
            let _ = g.0.devs.set(devs);
            let _ = g.0.pos.set(pos);
            return Some(g);
        }
        let mut h = FxHasher::default();
        dims.hash(&mut h);
        devs.hash(&mut h);
        let hash = h.finish();
        Some(Grid(Rc::new(GridData {
            strides: strides(&dims),
            n,
            dims,
            digits: None,
            devs: OnceCell::from(devs),
            pos: OnceCell::from(pos),
            coord_table: OnceCell::new(),
            sharding: OnceCell::new(),
            hash,
        })))
    }

    /// An explicit (device-list) grid, never in digit form
    /// (tests compare the digit-form operations against it).
    #[cfg(test)]
    fn new_explicit(dims: Vec<i64>, devs: Vec<i64>) -> Grid {
        let g = Grid::new(dims, devs).expect("grid");
        let mut h = FxHasher::default();
        g.dims().hash(&mut h);
        g.devs().hash(&mut h);
        Grid(Rc::new(GridData {
            strides: strides(g.dims()),
            n: g.num_devices(),
            dims: g.dims().to_vec(),
            digits: None,
            devs: OnceCell::from(g.devs().to_vec()),
            pos: OnceCell::new(),
            coord_table: OnceCell::new(),
            sharding: OnceCell::new(),
            hash: h.finish(),
        }))
    }

    /// The grid of an iota tile assignment `iota(reshape_dims).transpose(perm)`
    /// laid out over `dims` (data dims then replication), without building
    /// the device list; `None` when the dims do not line up.
    pub fn from_iota(dims: &[i64], reshape_dims: &[i64], perm: &[i64]) -> Option<Grid> {
        Some(Grid::from_digits(DigitForm::from_iota(
            dims,
            reshape_dims,
            perm,
        )?))
    }

    /// The grid of a digit form.
    fn from_digits(s: DigitForm) -> Grid {
        let dims = s.dims();
        let mut h = FxHasher::default();
        dims.hash(&mut h);
        s.hash(&mut h);
        let hash = h.finish();
        Grid(Rc::new(GridData {
            strides: strides(&dims),
            n: dims.iter().product(),
            dims,
            digits: Some(s),
            devs: OnceCell::new(),
            pos: OnceCell::new(),
            coord_table: OnceCell::new(),
            sharding: OnceCell::new(),
            hash,
        }))
    }

    /// Everything on every device.
    pub fn replicated(rank: usize, n: i64) -> Grid {
        Grid::from_digits(DigitForm::replicated(rank, n.max(1)))
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
                        // A manual subgroup (a partially manual shard_map)
                        // folds into replication: each manual group is
                        // partitioned on its own over the other devices, and
                        // the partitioner moves nothing between groups
                        // (see `Part::in_partial_manual`).
                        // An unreduced subgroup is laid out as replication;
                        // whether a value holds partial sums is the
                        // partitioner's state (`Part::partial`).
                        SubgroupType::Replicated
                        | SubgroupType::Manual
                        | SubgroupType::Unreduced => repl *= size,
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

    /// The canonical sharding of this grid (built once per grid).
    pub fn to_sharding(&self) -> Sharding {
        self.0
            .sharding
            .get_or_init(
                || match TileArray::new(self.0.dims.clone(), self.devs().to_vec()) {
                    Ok(t) => Sharding::partial_tile(t),
                    Err(_) => Sharding::Replicated,
                },
            )
            .clone()
    }

    #[inline]
    pub fn rank(&self) -> usize {
        self.0.dims.len() - 1
    }
    #[inline]
    pub fn dims(&self) -> &[i64] {
        &self.0.dims
    }
    /// The devices, row-major over the grid dims (O(devices) the first time
    /// for a grid in digit form).
    pub fn devs(&self) -> &[i64] {
        self.0.devs.get_or_init(|| match &self.0.digits {
            Some(s) => s.devices(),
            None => Vec::new(),
        })
    }
    fn pos(&self) -> &[u32] {
        self.0.pos.get_or_init(|| {
            let devs = self.devs();
            let mut pos = vec![0u32; devs.len()];
            for (i, &d) in devs.iter().enumerate() {
                if let Some(p) = pos.get_mut(d as usize) {
                    *p = i as u32;
                }
            }
            pos
        })
    }
    /// Tile count of data dim `a`.
    #[inline]
    pub fn tiles(&self, a: usize) -> i64 {
        self.0.dims[a]
    }
    #[inline]
    pub fn repl(&self) -> i64 {
        *self.0.dims.last().unwrap_or(&1)
    }
    #[inline]
    pub fn num_devices(&self) -> i64 {
        self.0.n
    }
    #[inline]
    pub fn num_tiles(&self) -> i64 {
        self.0.dims[..self.rank()].iter().product()
    }
    #[inline]
    pub fn is_replicated(&self) -> bool {
        self.num_tiles() == 1
    }
    /// Data dims with more than one tile.
    pub fn tiled_dims(&self) -> Vec<usize> {
        (0..self.rank()).filter(|&a| self.0.dims[a] > 1).collect()
    }

    /// The coordinates (data dims then replica index) of device `d`.
    pub fn coords(&self, d: i64) -> Vec<i64> {
        (0..self.0.dims.len()).map(|a| self.coord(d, a)).collect()
    }
    /// Every device's coordinates (data dims then replica index),
    /// device-major: device `d`'s are `[d * (rank + 1)..][..rank + 1]`.
    /// O(devices) once per grid, then a lookup per coordinate.
    pub fn coord_table(&self) -> &[u32] {
        self.0.coord_table.get_or_init(|| {
            let dims = &self.0.dims;
            let width = dims.len();
            let mut table = vec![0u32; self.0.n as usize * width];
            let mut coords = vec![0u32; width];
            for &d in self.devs() {
                table[d as usize * width..][..width].copy_from_slice(&coords);
                for b in (0..width).rev() {
                    coords[b] += 1;
                    if (coords[b] as i64) < dims[b] {
                        break;
                    }
                    coords[b] = 0;
                }
            }
            table
        })
    }
    /// The coordinate of device `d` along data dim `a`.
    pub fn coord(&self, d: i64, a: usize) -> i64 {
        if let Some(s) = &self.0.digits {
            return s.coord(d, a);
        }
        let p = self.pos()[d as usize] as i64;
        (p / self.0.strides[a]) % self.0.dims[a]
    }
    /// The device at coordinates (data dims then replica index).
    pub fn device_at(&self, coords: &[i64]) -> i64 {
        if let Some(s) = &self.0.digits {
            return s.device(coords);
        }
        let flat: i64 = coords.iter().zip(&self.0.strides).map(|(c, s)| c * s).sum();
        self.devs()[flat as usize]
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
}

/// Padded tile size of a dim of size `x` split into `t` tiles.
#[inline]
pub fn tile_size(x: i64, t: i64) -> i64 {
    if t <= 1 {
        x
    } else {
        (x + t - 1) / t
    }
}

/// Local (padded) dims of an array of `dims` under `g`.
#[inline]
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
