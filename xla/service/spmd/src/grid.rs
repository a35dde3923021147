//! `Grid`: the partitioner's working form of an array sharding. A grid is a
//! device array over `[tiles of dim 0, ..., tiles of dim r-1, replication]`;
//! the device at tile coordinates `c` holds the padded tile
//! `[c_a * ceil(X_a / t_a), (c_a + 1) * ceil(X_a / t_a))` of every dim `a`
//! (XLA's uneven-sharding convention: every tile has the ceiling size, the
//! valid part comes first, trailing tiles may be padding only).
//!
//! Grids whose device array is a transposed iota (XLA's
//! `IotaTileAssignment`; every sharding the partitioner derives from iota
//! shardings) are kept in digit form (`Sym`): device ids as mixed-radix
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

use crate::error::SpmdError;
use crate::memo::{hash_of, MemoTable};
use rustc_hash::{FxHashSet, FxHasher};
use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};
use xla_hlo_ir::sharding::SubgroupType;
use xla_hlo_ir::CollectiveDeviceList;
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
    sym: Option<Sym>,
    /// Devices, row-major over `dims` (built on demand for digit forms).
    devs: OnceLock<Vec<i64>>,
    /// Device -> flat index into `devs` (explicit grids only).
    pos: OnceLock<Vec<u32>>,
    /// The canonical sharding (built on demand).
    sharding: OnceLock<Sharding>,
    /// Hash of `dims` and the digit form or `devs` (cheap inequality).
    hash: u64,
}

/// The device groups of a collective: every group has `size` devices;
/// `list` is the replica-group attribute (iota form whenever possible).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevGroups {
    pub count: i64,
    pub size: i64,
    pub list: CollectiveDeviceList,
}

impl DevGroups {
    /// Groups from explicit lists (iota form when they are an iota pattern).
    pub fn from_lists(groups: &[Vec<i64>]) -> DevGroups {
        let g = groups.len() as i64;
        let s = groups.first().map(|x| x.len()).unwrap_or(0) as i64;
        if g > 0 && s > 0 && groups.iter().all(|x| x.len() as i64 == s) {
            let flat: Vec<i64> = groups.iter().flatten().copied().collect();
            if let Ok(t) = TileArray::new(vec![g, s], flat) {
                if let Some((reshape_dims, perm)) = t.to_iota() {
                    return DevGroups {
                        count: g,
                        size: s,
                        list: CollectiveDeviceList::Iota {
                            num_groups: g,
                            group_size: s,
                            reshape_dims,
                            perm,
                        },
                    };
                }
            }
        }
        DevGroups {
            count: g,
            size: s.max(1),
            list: CollectiveDeviceList::Explicit(groups.to_vec()),
        }
    }

    /// The groups as explicit device lists.
    pub fn lists(&self) -> Vec<Vec<i64>> {
        match &self.list {
            CollectiveDeviceList::Explicit(v) => v.clone(),
            CollectiveDeviceList::Iota {
                num_groups,
                group_size,
                reshape_dims,
                perm,
            } => {
                let n: i64 = reshape_dims.iter().product();
                let t = TileArray::new(vec![n], (0..n).collect()).expect("iota");
                let t = t.reshape(reshape_dims.clone());
                let t = if perm.is_empty() {
                    t
                } else {
                    let p: Vec<usize> = perm.iter().map(|&x| x as usize).collect();
                    t.transpose(&p)
                };
                let _ = num_groups;
                t.devices()
                    .chunks((*group_size).max(1) as usize)
                    .map(|c| c.to_vec())
                    .collect()
            }
            _ => Vec::new(),
        }
    }
}

/// Device groups of a collective (shared).
pub type Groups = Arc<DevGroups>;

/// A normalized tiled sharding over all devices. Cloning is cheap (shared).
/// `==` and `Hash` are semantic (equal device arrays over equal dims); a
/// [`GridCache`] memoizes derived grids by value and interns them, so equal
/// grids it hands out share storage and compare by pointer first.
#[derive(Clone, Debug)]
pub struct Grid(Arc<GridData>);

impl PartialEq for Grid {
    fn eq(&self, other: &Grid) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
            || (self.0.dims == other.0.dims && same_devices(&self.0, &other.0))
    }
}
impl Eq for Grid {}
impl Hash for Grid {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.0.hash);
    }
}

/// Equal device arrays (same dims assumed).
fn same_devices(a: &GridData, b: &GridData) -> bool {
    match (&a.sym, &b.sym) {
        (Some(x), Some(y)) => a.hash == b.hash && x == y,
        (None, None) => a.hash == b.hash && a.devs.get() == b.devs.get(),
        (Some(x), None) | (None, Some(x)) => {
            let e = if a.sym.is_none() { a } else { b };
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

/// A device array in digit form: a device id is a mixed-radix number whose
/// digit `k` (minor first) has radix `radix[k]` and weight `base[k]`; each
/// grid dim (data dims, then replication) reads some digits, major first,
/// as its coordinate. This is XLA's iota tile assignment
/// (`iota(reshape_dims).transpose(perm)`) with the transposed dims grouped
/// per grid dim. Canonical (so `==` is equality of device arrays): no
/// radix-1 digits, two digits that sit next to each other (major `k+1`
/// right before minor `k`) in one dim are merged, replication digits are
/// sorted major first (devices of a group ascending).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Sym {
    radix: Vec<i64>,
    base: Vec<i64>,
    digs: Vec<Vec<usize>>,
}

impl Sym {
    /// Canonical form of a digit assignment (`None` unless every digit is
    /// read by exactly one list). The last list is the replication dim.
    fn canon(radix: Vec<i64>, digs: Vec<Vec<usize>>) -> Option<Sym> {
        Sym::canon_with(radix, digs, true)
    }

    fn canon_with(mut radix: Vec<i64>, mut digs: Vec<Vec<usize>>, sort_last: bool) -> Option<Sym> {
        let m = radix.len();
        let mut seen = vec![false; m];
        for l in &digs {
            for &k in l {
                if k >= m || seen[k] {
                    return None;
                }
                seen[k] = true;
            }
        }
        if seen.iter().any(|s| !s) || radix.iter().any(|&r| r < 1) || digs.is_empty() {
            return None;
        }
        if sort_last {
            if let Some(l) = digs.last_mut() {
                l.sort_unstable_by(|a, b| b.cmp(a));
            }
        }
        fn drop_digit(radix: &mut Vec<i64>, digs: &mut [Vec<usize>], k: usize) {
            radix.remove(k);
            for l in digs.iter_mut() {
                l.retain(|&x| x != k);
                for x in l.iter_mut() {
                    if *x > k {
                        *x -= 1;
                    }
                }
            }
        }
        loop {
            if let Some(k) = (0..radix.len()).find(|&k| radix[k] == 1) {
                drop_digit(&mut radix, &mut digs, k);
                continue;
            }
            let mut hit = None;
            'outer: for l in digs.iter() {
                for w in l.windows(2) {
                    if w[0] == w[1] + 1 {
                        hit = Some(w[1]);
                        break 'outer;
                    }
                }
            }
            let Some(k) = hit else { break };
            radix[k] *= radix[k + 1];
            radix[k + 1] = 1;
            drop_digit(&mut radix, &mut digs, k + 1);
        }
        Some(Sym::with(radix, digs))
    }

    fn with(radix: Vec<i64>, digs: Vec<Vec<usize>>) -> Sym {
        let mut base = Vec::with_capacity(radix.len());
        let mut b = 1i64;
        for &r in &radix {
            base.push(b);
            b = b.saturating_mul(r);
        }
        Sym { radix, base, digs }
    }

    /// Everything on `n` devices (one replication digit).
    fn replicated(rank: usize, n: i64) -> Sym {
        let mut digs = vec![Vec::new(); rank + 1];
        if n > 1 {
            digs[rank].push(0);
            Sym::with(vec![n], digs)
        } else {
            Sym::with(vec![], digs)
        }
    }

    fn dims(&self) -> Vec<i64> {
        self.digs
            .iter()
            .map(|l| l.iter().map(|&k| self.radix[k]).product())
            .collect()
    }

    /// Splits digit `k` into a minor digit `k` of radix `inner` and a major
    /// digit `k + 1` (it must divide).
    fn split(&mut self, k: usize, inner: i64) -> bool {
        let r = self.radix[k];
        if inner < 1 || r % inner != 0 {
            return false;
        }
        if inner == 1 || inner == r {
            return true;
        }
        for l in self.digs.iter_mut() {
            let mut out = Vec::with_capacity(l.len() + 1);
            for &x in l.iter() {
                if x == k {
                    out.push(k + 1);
                    out.push(k);
                } else if x > k {
                    out.push(x + 1);
                } else {
                    out.push(x);
                }
            }
            *l = out;
        }
        self.radix[k] = inner;
        self.radix.insert(k + 1, r / inner);
        let (radix, digs) = (
            std::mem::take(&mut self.radix),
            std::mem::take(&mut self.digs),
        );
        *self = Sym::with(radix, digs);
        true
    }

    /// Makes `p` a digit boundary (a weight), splitting a digit if needed.
    fn refine(&mut self, p: i64) -> bool {
        for k in 0..self.radix.len() {
            let (b, r) = (self.base[k], self.radix[k]);
            if p == b {
                return true;
            }
            if p > b && p < b * r {
                return p % b == 0 && self.split(k, p / b);
            }
        }
        true
    }

    /// Moves the minor factor `f` of list `a` (splitting a digit if needed)
    /// to the front of list `into`.
    fn take_minor(&mut self, a: usize, f: i64, into: usize) -> bool {
        let mut need = f;
        while need > 1 {
            let Some(&k) = self.digs[a].last() else {
                return false;
            };
            let r = self.radix[k];
            if need % r == 0 {
                self.digs[a].pop();
                self.digs[into].insert(0, k);
                need /= r;
            } else if r % need == 0 {
                if !self.split(k, need) {
                    return false;
                }
                // Now list `a` ends with [k+1, k]; digit k has radix `need`.
                self.digs[a].pop();
                self.digs[into].insert(0, k);
                need = 1;
            } else {
                return false;
            }
        }
        true
    }

    /// The place value of every digit in the coordinate of dim `a` (0 for
    /// digits it does not read).
    fn places(&self, a: usize) -> Vec<i64> {
        let mut pv = vec![0i64; self.radix.len()];
        let mut w = 1i64;
        for &k in self.digs[a].iter().rev() {
            pv[k] = w;
            w *= self.radix[k];
        }
        pv
    }

    fn coord(&self, d: i64, a: usize) -> i64 {
        let mut c = 0;
        for &k in &self.digs[a] {
            c = c * self.radix[k] + (d / self.base[k]) % self.radix[k];
        }
        c
    }

    fn device(&self, coords: &[i64]) -> i64 {
        let mut d = 0;
        for (l, &c) in self.digs.iter().zip(coords) {
            let mut c = c;
            for &k in l.iter().rev() {
                d += (c % self.radix[k]) * self.base[k];
                c /= self.radix[k];
            }
        }
        d
    }

    /// The devices in row-major order over the grid dims.
    fn devices(&self) -> Vec<i64> {
        let m = self.radix.len();
        let order: Vec<usize> = self.digs.iter().flatten().copied().collect();
        let n: i64 = self.radix.iter().product();
        if m == 0 {
            return vec![0];
        }
        let sizes: Vec<i64> = order.iter().map(|&k| self.radix[k]).collect();
        let weights: Vec<i64> = order.iter().map(|&k| self.base[k]).collect();
        let mut out = Vec::with_capacity(n as usize);
        let mut idx = vec![0i64; m];
        let mut v = 0i64;
        for _ in 0..n {
            out.push(v);
            for t in (0..m).rev() {
                idx[t] += 1;
                v += weights[t];
                if idx[t] < sizes[t] {
                    break;
                }
                v -= weights[t] * sizes[t];
                idx[t] = 0;
            }
        }
        out
    }

    /// The digit form of `devs` over `dims`, when it has one.
    fn detect(dims: &[i64], devs: &[i64]) -> Option<Sym> {
        let n = devs.len() as i64;
        if n == 1 {
            return Some(Sym::replicated(dims.len() - 1, 1));
        }
        let t = TileArray::new(vec![n], devs.to_vec()).ok()?;
        let (rd, perm) = t.to_iota()?;
        let s = Sym::from_iota(dims, &rd, &perm)?;
        (s.devices() == devs).then_some(s)
    }

    /// Deals the digits `seq` (major first) out to dims of sizes `dims`, in
    /// order: each dim takes whole digits, or the major part of a digit it
    /// needs only part of (the digit is split). The digits left over form
    /// one more list at the end. `None` when a size does not line up.
    fn deal(radix: Vec<i64>, seq: Vec<usize>, dims: &[i64]) -> Option<Sym> {
        let mut digs = vec![Vec::new(); dims.len()];
        digs.push(seq);
        let mut s = Sym::with(radix, digs);
        let rest = dims.len();
        for (a, &want) in dims.iter().enumerate() {
            let mut need = want;
            while need > 1 {
                let &k = s.digs[rest].first()?;
                let r = s.radix[k];
                if need % r == 0 {
                    s.digs[rest].remove(0);
                    s.digs[a].push(k);
                    need /= r;
                } else if r % need == 0 {
                    // Split: the major part (radix `need`) goes to dim a.
                    if !s.split(k, r / need) {
                        return None;
                    }
                    let major = s.digs[rest].remove(0); // k + 1
                    s.digs[a].push(major);
                    need = 1;
                } else {
                    return None;
                }
            }
        }
        Some(s)
    }

    /// The digit form of `iota(rd).transpose(perm)` laid out over `dims`
    /// (data dims then replication), when its dims line up with `dims`.
    fn from_iota(dims: &[i64], rd: &[i64], perm: &[i64]) -> Option<Sym> {
        let m = rd.len();
        let perm: Vec<usize> = if perm.is_empty() {
            (0..m).collect()
        } else {
            perm.iter().map(|&p| p as usize).collect()
        };
        if perm.len() != m || rd.iter().any(|&r| r < 1) {
            return None;
        }
        let mut seen = vec![false; m];
        for &p in &perm {
            if p >= m || std::mem::replace(&mut seen[p], true) {
                return None;
            }
        }
        if dims.is_empty() || dims.iter().product::<i64>() != rd.iter().product::<i64>() {
            return None;
        }
        // Digits minor first: reshape dim j is digit m-1-j.
        let radix: Vec<i64> = (0..m).map(|k| rd[m - 1 - k]).collect();
        let seq: Vec<usize> = perm.iter().map(|&p| m - 1 - p).collect();
        let mut s = Sym::deal(radix, seq, dims)?;
        let tmp = dims.len();
        while let Some(&k) = s.digs[tmp].first() {
            if s.radix[k] != 1 {
                return None;
            }
            s.digs[tmp].remove(0);
            s.digs[dims.len() - 1].push(k);
        }
        s.digs.pop();
        Sym::canon(s.radix, s.digs)
    }

    /// Both forms over one digit basis (`None` when their weights do not
    /// form one chain).
    fn common(x: &Sym, y: &Sym) -> Option<(Sym, Sym)> {
        let (mut x, mut y) = (x.clone(), y.clone());
        for _ in 0..4 {
            if x.radix == y.radix {
                return Some((x, y));
            }
            for p in y.base.clone() {
                if !x.refine(p) {
                    return None;
                }
            }
            for p in x.base.clone() {
                if !y.refine(p) {
                    return None;
                }
            }
        }
        (x.radix == y.radix).then_some((x, y))
    }

    /// Replica groups over the digits of the other coordinates (major
    /// first) then `minor` (the group members), in XLA's shortest iota form.
    fn iota_groups(&self, rest: &[usize], minor: &[usize]) -> CollectiveDeviceList {
        let m = self.radix.len();
        let g: i64 = minor.iter().map(|&k| self.radix[k]).product();
        let n: i64 = self.radix.iter().product();
        // Merge digits adjacent in the sequence (major k+1 before minor k).
        let seq: Vec<usize> = rest.iter().chain(minor).copied().collect();
        let s = Sym::canon_with(self.radix.clone(), vec![seq], false)
            .unwrap_or_else(|| Sym::replicated(0, n));
        let seq = &s.digs[0];
        let m2 = s.radix.len();
        let _ = m;
        let reshape_dims: Vec<i64> = (0..m2).map(|j| s.radix[m2 - 1 - j]).collect();
        let perm: Vec<i64> = seq.iter().map(|&k| (m2 - 1 - k) as i64).collect();
        let identity = perm.iter().enumerate().all(|(i, &p)| i as i64 == p);
        CollectiveDeviceList::Iota {
            num_groups: n / g.max(1),
            group_size: g,
            reshape_dims: if m2 == 0 { vec![1] } else { reshape_dims },
            perm: if identity { vec![] } else { perm },
        }
    }
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
        if let Some(s) = Sym::detect(&dims, &devs) {
            let g = Grid::from_sym(s);
            let _ = g.0.devs.set(devs);
            let _ = g.0.pos.set(pos);
            return Some(g);
        }
        let mut h = FxHasher::default();
        dims.hash(&mut h);
        devs.hash(&mut h);
        let hash = h.finish();
        Some(Grid(Arc::new(GridData {
            strides: strides(&dims),
            n,
            dims,
            sym: None,
            devs: OnceLock::from(devs),
            pos: OnceLock::from(pos),
            sharding: OnceLock::new(),
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
        Grid(Arc::new(GridData {
            strides: strides(g.dims()),
            n: g.num_devices(),
            dims: g.dims().to_vec(),
            sym: None,
            devs: OnceLock::from(g.devs().to_vec()),
            pos: OnceLock::new(),
            sharding: OnceLock::new(),
            hash: h.finish(),
        }))
    }

    /// The grid of an iota tile assignment `iota(reshape_dims).transpose(perm)`
    /// laid out over `dims` (data dims then replication), without building
    /// the device list; `None` when the dims do not line up.
    pub fn from_iota(dims: &[i64], reshape_dims: &[i64], perm: &[i64]) -> Option<Grid> {
        Some(Grid::from_sym(Sym::from_iota(dims, reshape_dims, perm)?))
    }

    /// The grid of a digit form.
    fn from_sym(s: Sym) -> Grid {
        let dims = s.dims();
        let mut h = FxHasher::default();
        dims.hash(&mut h);
        s.hash(&mut h);
        let hash = h.finish();
        Grid(Arc::new(GridData {
            strides: strides(&dims),
            n: dims.iter().product(),
            dims,
            sym: Some(s),
            devs: OnceLock::new(),
            pos: OnceLock::new(),
            sharding: OnceLock::new(),
            hash,
        }))
    }

    /// Everything on every device.
    pub fn replicated(rank: usize, n: i64) -> Grid {
        Grid::from_sym(Sym::replicated(rank, n.max(1)))
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

    pub fn rank(&self) -> usize {
        self.0.dims.len() - 1
    }
    pub fn dims(&self) -> &[i64] {
        &self.0.dims
    }
    /// The devices, row-major over the grid dims (O(devices) the first time
    /// for a grid in digit form).
    pub fn devs(&self) -> &[i64] {
        self.0.devs.get_or_init(|| match &self.0.sym {
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
    pub fn tiles(&self, a: usize) -> i64 {
        self.0.dims[a]
    }
    pub fn repl(&self) -> i64 {
        *self.0.dims.last().unwrap_or(&1)
    }
    pub fn num_devices(&self) -> i64 {
        self.0.n
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
        (0..self.0.dims.len()).map(|a| self.coord(d, a)).collect()
    }
    /// The coordinate of device `d` along data dim `a`.
    pub fn coord(&self, d: i64, a: usize) -> i64 {
        if let Some(s) = &self.0.sym {
            return s.coord(d, a);
        }
        let p = self.pos()[d as usize] as i64;
        (p / self.0.strides[a]) % self.0.dims[a]
    }
    /// The device at coordinates (data dims then replica index).
    pub fn device_at(&self, coords: &[i64]) -> i64 {
        if let Some(s) = &self.0.sym {
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

    /// A grid over `map.len()` data dims: new dim `j` takes this grid's dim
    /// `map[j]` (a new untiled dim when `None`); this grid's data dims that
    /// no entry names are merged into replication.
    pub fn remap(&self, map: &[Option<usize>]) -> Grid {
        self.remap_sym(map)
            .unwrap_or_else(|| self.remap_by_devices(map))
    }

    fn remap_sym(&self, map: &[Option<usize>]) -> Option<Grid> {
        let s = self.0.sym.as_ref()?;
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
        Some(Grid::from_sym(Sym::canon(s.radix.clone(), digs)?))
    }

    fn remap_by_devices(&self, map: &[Option<usize>]) -> Grid {
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
        self.factor_groups_sym(factors)
            .unwrap_or_else(|| DevGroups::from_lists(&self.factor_group_lists(factors)))
    }

    fn factor_groups_sym(&self, factors: &[(usize, i64)]) -> Option<DevGroups> {
        let mut s = self.0.sym.clone()?;
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

    fn factor_group_lists(&self, factors: &[(usize, i64)]) -> Vec<Vec<i64>> {
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
    fn gathered_sym(&self, factors: &[(usize, i64)]) -> Option<Grid> {
        let mut s = self.0.sym.clone()?;
        let r = self.rank();
        for &(a, f) in factors {
            if a >= r || f < 1 || self.0.dims[a] % f != 0 {
                return None;
            }
            if !s.take_minor(a, f, r) {
                return None;
            }
        }
        Some(Grid::from_sym(Sym::canon(s.radix, s.digs)?))
    }

    /// The grid after gathering the minor factor `f` of each `(dim, f)`.
    pub fn gathered(&self, factors: &[(usize, i64)]) -> Option<Grid> {
        self.gathered_sym(factors)
            .or_else(|| self.gathered_by_devices(factors))
    }

    fn gathered_by_devices(&self, factors: &[(usize, i64)]) -> Option<Grid> {
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
    fn all_to_all_sym(&self, a: usize, b: usize, f: i64) -> Option<Grid> {
        let mut s = self.0.sym.clone()?;
        s.digs.push(Vec::new());
        let into = s.digs.len() - 1;
        if !s.take_minor(a, f, into) {
            return None;
        }
        let moved = s.digs.pop()?;
        s.digs[b].extend(moved);
        Some(Grid::from_sym(Sym::canon(s.radix, s.digs)?))
    }

    /// The grid after an all-to-all moving the minor factor `f` of dim `a`
    /// to a new minor factor of dim `b`.
    pub fn all_to_all(&self, a: usize, b: usize, f: i64) -> Option<Grid> {
        if a == b || f < 2 || self.0.dims[a] % f != 0 || a >= self.rank() || b >= self.rank() {
            return None;
        }
        if let Some(g) = self.all_to_all_sym(a, b, f) {
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
    /// this grid's count): device `d` holds the coarse tile containing its tile.
    /// This grid coarsened to `dims` tiles per data dim (each a divisor of
    /// this grid's count): device `d` holds the coarse tile containing its tile.
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
        if let Some(g) = self.gathered_sym(&factors) {
            return Some(g);
        }
        Grid::from_coords(dims, self.num_devices(), |d, c| {
            for (a, x) in c.iter_mut().enumerate() {
                *x = self.coord(d, a) / ratio[a];
            }
        })
    }

    fn merge_sym(&self, y: &Grid, from_y: &[usize]) -> Option<Grid> {
        let (sx, sy) = (self.0.sym.as_ref()?, y.0.sym.as_ref()?);
        let (sx, sy) = Sym::common(sx, sy)?;
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
        Some(Grid::from_sym(Sym::canon(sx.radix, digs)?))
    }

    /// Combines two grids over the same dims: dims in `from_y` take `y`'s
    /// tiling and coordinates, the others `self`'s.
    pub fn merge(&self, y: &Grid, from_y: &[usize]) -> Option<Grid> {
        let r = self.rank();
        if y.rank() != r || y.num_devices() != self.num_devices() {
            None
        } else if let Some(g) = self.merge_sym(y, from_y) {
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

    /// The table over partitions of `vals[coordinate along dim a]`.
    pub fn per_coord(&self, a: usize, vals: &[i64]) -> Arc<[i64]> {
        self.pair_table(self, a, |c, _| vals.get(c as usize).copied().unwrap_or(0))
            .into()
    }

    /// Offsets of every partition's tile along dim `a` (tile size `ts`).
    pub fn offsets(&self, a: usize, ts: i64) -> Arc<[i64]> {
        self.per_coord(a, &offset_values(self.tiles(a), ts))
    }

    /// XLA's `ReshapeSharding` of this grid from global dims `source` to
    /// `target`, in digit form: `Some(result)` when it was computed here
    /// (`result` as `xla_hlo_utils::ops::reshape_sharding` would give it),
    /// `None` when only the device-list path can tell (it replicates dims).
    pub fn reshaped(&self, source: &[i64], target: &[i64]) -> Option<Option<Grid>> {
        let sym = self.0.sym.as_ref()?;
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
        let seq: Vec<usize> = sym.digs.iter().flatten().copied().collect();
        let mut x = Sym::deal(sym.radix.clone(), seq, t)?;
        let tmp = t.len();
        if !x.digs[tmp].is_empty() {
            return None;
        }
        x.digs.pop();
        Some(Some(Grid::from_sym(Sym::canon(x.radix, x.digs)?)))
    }

    /// The distinct pairs (coordinate along dim `a` under this grid, under
    /// `other`) over all devices, sorted (without visiting every
    /// device when both grids are in digit form).
    pub fn coord_pairs(&self, other: &Grid, a: usize) -> Arc<[(i64, i64)]> {
        self.coord_pairs_sym(other, a)
            .unwrap_or_else(|| {
                let mut v: Vec<(i64, i64)> = (0..self.num_devices())
                    .map(|d| (self.coord(d, a), other.coord(d, a)))
                    .collect();
                v.sort_unstable();
                v.dedup();
                v
            })
            .into()
    }

    /// True when `pred(coordinate under this grid, under other)` holds for
    /// every device along dim `a`; stops at the first pair that fails
    /// (without visiting every device when both are in digit form).
    pub fn all_pairs(
        &self,
        other: &Grid,
        a: usize,
        mut pred: impl FnMut(i64, i64) -> bool,
    ) -> bool {
        if let (Some(x), Some(y)) = (&self.0.sym, &other.0.sym) {
            if let Some((x, y)) = Sym::common(x, y) {
                // Only the digits either coordinate reads, with their place
                // values in each coordinate.
                let (px, py) = (x.places(a), y.places(a));
                let u: Vec<usize> = (0..x.radix.len())
                    .filter(|&k| px[k] != 0 || py[k] != 0)
                    .collect();
                let count: i64 = u.iter().map(|&k| x.radix[k]).product();
                let mut idx = vec![0i64; u.len()];
                let (mut cx, mut cy) = (0i64, 0i64);
                for _ in 0..count {
                    if !pred(cx, cy) {
                        return false;
                    }
                    for (t, &k) in u.iter().enumerate() {
                        idx[t] += 1;
                        cx += px[k];
                        cy += py[k];
                        if idx[t] < x.radix[k] {
                            break;
                        }
                        cx -= px[k] * x.radix[k];
                        cy -= py[k] * x.radix[k];
                        idx[t] = 0;
                    }
                }
                return true;
            }
        }
        (0..self.num_devices()).all(|d| pred(self.coord(d, a), other.coord(d, a)))
    }

    /// The table over devices `d` (in order) of `f(coordinate of d along
    /// dim a under this grid, under other)`: one pass with digit counters
    /// when both are in digit form.
    pub fn pair_table(&self, other: &Grid, a: usize, f: impl Fn(i64, i64) -> i64) -> Vec<i64> {
        let n = self.num_devices();
        if let (Some(x), Some(y)) = (&self.0.sym, &other.0.sym) {
            if let Some((x, y)) = Sym::common(x, y) {
                // Place value of each digit in each coordinate (0 if unused).
                let (px, py) = (x.places(a), y.places(a));
                let m = x.radix.len();
                let mut idx = vec![0i64; m];
                let (mut cx, mut cy) = (0i64, 0i64);
                let mut out = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    out.push(f(cx, cy));
                    for k in 0..m {
                        idx[k] += 1;
                        cx += px[k];
                        cy += py[k];
                        if idx[k] < x.radix[k] {
                            break;
                        }
                        cx -= px[k] * x.radix[k];
                        cy -= py[k] * x.radix[k];
                        idx[k] = 0;
                    }
                }
                return out;
            }
        }
        (0..n)
            .map(|d| f(self.coord(d, a), other.coord(d, a)))
            .collect()
    }

    fn coord_pairs_sym(&self, other: &Grid, a: usize) -> Option<Vec<(i64, i64)>> {
        let (x, y) = Sym::common(self.0.sym.as_ref()?, other.0.sym.as_ref()?)?;
        let mut u: Vec<usize> = x.digs[a].iter().chain(&y.digs[a]).copied().collect();
        u.sort_unstable();
        u.dedup();
        let count: i64 = u.iter().map(|&k| x.radix[k]).product();
        let mut v = Vec::with_capacity(count as usize);
        let mut idx = vec![0i64; u.len()];
        for _ in 0..count {
            let d: i64 = u.iter().zip(&idx).map(|(&k, &i)| i * x.base[k]).sum();
            v.push((x.coord(d, a), y.coord(d, a)));
            for t in 0..u.len() {
                idx[t] += 1;
                if idx[t] < x.radix[u[t]] {
                    break;
                }
                idx[t] = 0;
            }
        }
        v.sort_unstable();
        v.dedup();
        Some(v)
    }

    /// This grid (`io`) with the coordinates of `c`'s data dims `ks` (major
    /// first) appended as a new minor factor of dim `od`: the layout of a
    /// reduce-scatter over `ks`'s device groups onto `od`.
    pub fn with_minor_from(&self, c: &Grid, ks: &[usize], od: usize) -> Option<Grid> {
        let (x, y) = Sym::common(self.0.sym.as_ref()?, c.0.sym.as_ref()?)?;
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
        Some(Grid::from_sym(Sym::canon(x.radix, digs)?))
    }

    /// Replicates the given data dims (their tiles merge into replication).
    pub fn replicate_dims(&self, dims: &[usize]) -> Grid {
        self.remap(&replicate_dims_map(self.rank(), dims))
    }
}

/// The remap (see [`Grid::remap`]) that replicates `dims` of a grid of `rank`.
fn replicate_dims_map(rank: usize, dims: &[usize]) -> Vec<Option<usize>> {
    (0..rank)
        .map(|a| if dims.contains(&a) { None } else { Some(a) })
        .collect()
}

/// The start of each of `tiles` tiles of size `ts`.
fn offset_values(tiles: i64, ts: i64) -> Vec<i64> {
    (0..tiles).map(|i| i * ts).collect()
}

/// Memo tables of the grid operations the partitioner repeats, keyed by
/// value, and the set of grids they handed out (interned: an equal result
/// is returned as the grid already handed out, so equal grids share their
/// lazily built device lists and compare by pointer first). One cache lives
/// as long as the partitioning of one module; every operation is a pure
/// function of its inputs, so the cache changes no result.
#[derive(Default)]
pub struct GridCache {
    interned: RefCell<FxHashSet<Grid>>,
    remap: MemoTable<(Grid, Vec<Option<usize>>), Grid>,
    gathered: MemoTable<(Grid, Vec<(usize, i64)>), Option<Grid>>,
    all_to_all: MemoTable<(Grid, usize, usize, i64), Option<Grid>>,
    coarsened: MemoTable<(Grid, Vec<i64>), Option<Grid>>,
    groups: MemoTable<(Grid, Vec<(usize, i64)>), Groups>,
    replicated: MemoTable<(usize, i64), Grid>,
    merged: MemoTable<(Grid, Grid, Vec<usize>), Option<Grid>>,
    per_coord: MemoTable<(Grid, usize, Vec<i64>), Arc<[i64]>>,
    reshapes: MemoTable<(Grid, bool, Vec<i64>, Vec<i64>), Option<Grid>>,
}

impl GridCache {
    /// The grid equal to `g` this cache handed out first (`g` itself when
    /// none).
    pub fn intern(&self, g: Grid) -> Grid {
        let mut set = self.interned.borrow_mut();
        if let Some(x) = set.get(&g) {
            return x.clone();
        }
        set.insert(g.clone());
        g
    }

    fn intern_opt(&self, g: Option<Grid>) -> Option<Grid> {
        g.map(|g| self.intern(g))
    }

    /// [`Grid::remap`], memoized.
    pub fn remap(&self, g: &Grid, map: &[Option<usize>]) -> Grid {
        self.remap.get_or_insert_with(
            hash_of((g, map)),
            |k| k.0 == *g && k.1 == map,
            || (g.clone(), map.to_vec()),
            || self.intern(g.remap(map)),
        )
    }

    /// [`Grid::replicate_dims`], memoized.
    pub fn replicate_dims(&self, g: &Grid, dims: &[usize]) -> Grid {
        self.remap(g, &replicate_dims_map(g.rank(), dims))
    }

    /// [`Grid::gathered`], memoized.
    pub fn gathered(&self, g: &Grid, factors: &[(usize, i64)]) -> Option<Grid> {
        self.gathered.get_or_insert_with(
            hash_of((g, factors)),
            |k| k.0 == *g && k.1 == factors,
            || (g.clone(), factors.to_vec()),
            || self.intern_opt(g.gathered(factors)),
        )
    }

    /// [`Grid::all_to_all`], memoized.
    pub fn all_to_all(&self, g: &Grid, a: usize, b: usize, f: i64) -> Option<Grid> {
        self.all_to_all.get_or_insert_with(
            hash_of((g, a, b, f)),
            |k| k.0 == *g && (k.1, k.2, k.3) == (a, b, f),
            || (g.clone(), a, b, f),
            || self.intern_opt(g.all_to_all(a, b, f)),
        )
    }

    /// [`Grid::coarsened`], memoized.
    pub fn coarsened(&self, g: &Grid, dims: &[i64]) -> Option<Grid> {
        self.coarsened.get_or_insert_with(
            hash_of((g, dims)),
            |k| k.0 == *g && k.1 == dims,
            || (g.clone(), dims.to_vec()),
            || self.intern_opt(g.coarsened(dims)),
        )
    }

    /// [`Grid::factor_groups`], memoized (shared).
    pub fn factor_groups(&self, g: &Grid, factors: &[(usize, i64)]) -> Groups {
        self.groups.get_or_insert_with(
            hash_of((g, factors)),
            |k| k.0 == *g && k.1 == factors,
            || (g.clone(), factors.to_vec()),
            || Arc::new(g.factor_groups(factors)),
        )
    }

    /// [`Grid::replicated`], memoized.
    pub fn replicated(&self, rank: usize, n: i64) -> Grid {
        self.replicated.get_or_insert_with(
            hash_of((rank, n)),
            |k| *k == (rank, n),
            || (rank, n),
            || self.intern(Grid::replicated(rank, n)),
        )
    }

    /// [`Grid::merge`], memoized.
    pub fn merge(&self, x: &Grid, y: &Grid, from_y: &[usize]) -> Option<Grid> {
        self.merged.get_or_insert_with(
            hash_of((x, y, from_y)),
            |k| k.0 == *x && k.1 == *y && k.2 == from_y,
            || (x.clone(), y.clone(), from_y.to_vec()),
            || self.intern_opt(x.merge(y, from_y)),
        )
    }

    /// [`Grid::per_coord`], memoized: equal requests get the same table
    /// (one `Arc`), which the builder emits once per computation.
    pub fn per_coord(&self, g: &Grid, a: usize, vals: &[i64]) -> Arc<[i64]> {
        self.per_coord.get_or_insert_with(
            hash_of((g, a, vals)),
            |k| k.0 == *g && k.1 == a && k.2 == vals,
            || (g.clone(), a, vals.to_vec()),
            || g.per_coord(a, vals),
        )
    }

    /// [`Grid::offsets`], memoized (through [`GridCache::per_coord`]).
    pub fn offsets(&self, g: &Grid, a: usize, ts: i64) -> Arc<[i64]> {
        self.per_coord(g, a, &offset_values(g.tiles(a), ts))
    }

    /// A grid computed over a reshape from dims `from` to `to`, memoized:
    /// `compute` gives it for `g` (`forward`: the output grid of a local
    /// reshape of `g`; else the operand grid that reshapes to `g`).
    pub fn reshape_grid(
        &self,
        g: &Grid,
        forward: bool,
        from: &[i64],
        to: &[i64],
        compute: impl FnOnce() -> Option<Grid>,
    ) -> Option<Grid> {
        self.reshapes.get_or_insert_with(
            hash_of((g, forward, from, to)),
            |k| k.0 == *g && k.1 == forward && k.2 == from && k.3 == to,
            || (g.clone(), forward, from.to_vec(), to.to_vec()),
            || self.intern_opt(compute()),
        )
    }
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
            groups.lists(),
            vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
        );
        let groups = g.factor_groups(&[(0, 4)]);
        assert_eq!(groups.lists(), vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]);
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

    /// A tiny deterministic generator (xorshift).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self, k: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % k.max(1)
        }
    }

    /// A random factorization of `n` into `k` factors.
    fn factors(rng: &mut Rng, n: i64, k: usize) -> Vec<i64> {
        let mut out = vec![1i64; k];
        let mut rest = n;
        let mut p = 2;
        while rest > 1 {
            while rest % p == 0 {
                rest /= p;
                let i = rng.next(k as u64) as usize;
                out[i] *= p;
            }
            p += 1;
        }
        out
    }

    /// A random transposed-iota device array over `n` devices.
    fn random_devs(rng: &mut Rng, n: i64) -> Vec<i64> {
        let k = 1 + rng.next(4) as usize;
        let rd = factors(rng, n, k);
        let mut perm: Vec<usize> = (0..k).collect();
        for i in (1..k).rev() {
            let j = rng.next(i as u64 + 1) as usize;
            perm.swap(i, j);
        }
        let (_, devs) = transpose_devices(&rd, &(0..n).collect::<Vec<_>>(), &perm);
        if rng.next(8) == 0 {
            // Sometimes not an iota pattern at all.
            let mut d = devs;
            let (i, j) = (rng.next(n as u64) as usize, rng.next(n as u64) as usize);
            d.swap(i, j);
            return d;
        }
        devs
    }

    fn same(a: &Option<Grid>, b: &Option<Grid>) -> bool {
        match (a, b) {
            (Some(x), Some(y)) => x.dims() == y.dims() && x.devs() == y.devs() && x == y,
            (None, None) => true,
            _ => false,
        }
    }

    /// Every operation on grids in digit form agrees with the explicit
    /// device-list computation.
    #[test]
    fn digit_form_matches_explicit() {
        let mut rng = Rng(0x9e3779b97f4a7c15);
        let mut sym_seen = 0;
        let mut merges = 0;
        let mut gathers = 0;
        for _ in 0..3000 {
            let n = [1i64, 2, 4, 6, 8, 12, 16, 24, 32, 36, 64][rng.next(11) as usize];
            let rank = 1 + rng.next(3) as usize;
            let dims = factors(&mut rng, n, rank + 1);
            let devs = random_devs(&mut rng, n);
            let g = Grid::new(dims.clone(), devs.clone()).unwrap();
            let e = Grid::new_explicit(dims.clone(), devs.clone());
            assert_eq!(g.devs(), e.devs());
            assert!(g == e || g.0.sym.is_none());
            if g.0.sym.is_some() {
                sym_seen += 1;
            }
            for d in 0..n {
                assert_eq!(g.coords(d), e.coords(d), "{dims:?} {devs:?}");
                assert_eq!(g.device_at(&g.coords(d)), d);
            }
            // Gathers of minor factors.
            let a = rng.next(rank as u64) as usize;
            let divs: Vec<i64> = (1..=g.tiles(a)).filter(|f| g.tiles(a) % f == 0).collect();
            let f = divs[rng.next(divs.len() as u64) as usize];
            let b = rng.next(rank as u64) as usize;
            assert!(same(
                &g.gathered_sym(&[(a, f)])
                    .or_else(|| g.gathered_by_devices(&[(a, f)])),
                &e.gathered_by_devices(&[(a, f)])
            ));
            assert!(same(&g.all_to_all(a, b, f), &e.all_to_all(a, b, f)) || g.0.sym.is_none());
            let cd: Vec<i64> = (0..rank)
                .map(|x| if x == a { g.tiles(x) / f } else { g.tiles(x) })
                .collect();
            assert!(same(&g.coarsened(&cd), &e.coarsened(&cd)));
            if f > 1 && g.gathered_sym(&[(a, f)]).is_some() {
                gathers += 1;
            }
            // Groups.
            let fg = g.factor_groups(&[(a, f)]);
            assert_eq!(
                fg.lists(),
                e.factor_group_lists(&[(a, f)]),
                "{dims:?} {devs:?} {a} {f}"
            );
            if b != a {
                let f2 = g.tiles(b);
                let fg = g.factor_groups(&[(b, f2), (a, f)]);
                assert_eq!(fg.lists(), e.factor_group_lists(&[(b, f2), (a, f)]));
            }
            // Remaps.
            let mut map: Vec<Option<usize>> = (0..rank).map(Some).collect();
            if rng.next(2) == 0 {
                map.swap(0, rank - 1);
            }
            if rng.next(2) == 0 {
                map[a] = None;
            }
            if rng.next(2) == 0 {
                map.insert(0, None);
            }
            assert!(same(&Some(g.remap(&map)), &Some(e.remap_by_devices(&map))));
            // Merges with another grid of the same rank.
            let dims2 = factors(&mut rng, n, rank + 1);
            let devs2 = random_devs(&mut rng, n);
            let h = Grid::new(dims2.clone(), devs2.clone()).unwrap();
            let he = Grid::new_explicit(dims2, devs2);
            let from_y: Vec<usize> = (0..rank).filter(|_| rng.next(2) == 0).collect();
            let m1 = g.merge_sym(&h, &from_y);
            if m1.is_some() {
                merges += 1;
                let dims_m: Vec<i64> = (0..rank)
                    .map(|x| {
                        if from_y.contains(&x) {
                            h.tiles(x)
                        } else {
                            g.tiles(x)
                        }
                    })
                    .collect();
                let m2 = Grid::from_coords(&dims_m, n, |d, c| {
                    for (x, v) in c.iter_mut().enumerate() {
                        *v = if from_y.contains(&x) {
                            he.coord(d, x)
                        } else {
                            e.coord(d, x)
                        };
                    }
                });
                assert!(same(&m1, &m2), "merge {dims:?} {from_y:?}");
            }
            // Coordinate pairs.
            let mut pe: Vec<(i64, i64)> = (0..n).map(|d| (e.coord(d, a), he.coord(d, a))).collect();
            pe.sort_unstable();
            pe.dedup();
            assert_eq!(&g.coord_pairs(&h, a)[..], &pe[..]);
            let tab: Vec<i64> = (0..n)
                .map(|d| e.coord(d, a) * 1000 + he.coord(d, a))
                .collect();
            assert_eq!(g.pair_table(&h, a, |x, y| x * 1000 + y), tab);
            let mut seen = Vec::new();
            assert!(g.all_pairs(&h, a, |x, y| {
                seen.push((x, y));
                true
            }));
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen, pe);
            let bad = pe[rng.next(pe.len() as u64) as usize];
            assert!(!g.all_pairs(&h, a, |x, y| (x, y) != bad));
            // A reduce-scatter layout: h's dims `ks` appended to g's dim `a`
            // (when g leaves them free).
            let ks: Vec<usize> = (0..rank).filter(|_| rng.next(2) == 0).collect();
            if let Some(w) = g.with_minor_from(&h, &ks, a) {
                let gk: i64 = ks.iter().map(|&k| h.tiles(k)).product();
                let dims_w: Vec<i64> = (0..rank)
                    .map(|x| if x == a { g.tiles(x) * gk } else { g.tiles(x) })
                    .collect();
                let w2 = Grid::from_coords(&dims_w, n, |d, out| {
                    let mut r = 0;
                    for &k in &ks {
                        r = r * he.tiles(k) + he.coord(d, k);
                    }
                    for (x, v) in out.iter_mut().enumerate() {
                        let c = e.coord(d, x);
                        *v = if x == a { c * gk + r } else { c };
                    }
                });
                assert!(same(&Some(w), &w2), "with_minor_from {dims:?} {ks:?}");
            }
        }
        assert!(
            sym_seen > 1000 && merges > 300 && gathers > 300,
            "{sym_seen} {merges} {gathers}"
        );
    }

    /// Grids read from iota tile assignments equal the grids of their
    /// device lists.
    #[test]
    fn from_iota_matches_device_lists() {
        let mut rng = Rng(0x2545f4914f6cdd1d);
        let mut hits = 0;
        for _ in 0..3000 {
            let n = [1i64, 2, 4, 6, 8, 12, 16, 24, 32, 64, 2048][rng.next(11) as usize];
            let k = 1 + rng.next(4) as usize;
            let rd = factors(&mut rng, n, k);
            let mut perm: Vec<usize> = (0..k).collect();
            for i in (1..k).rev() {
                let j = rng.next(i as u64 + 1) as usize;
                perm.swap(i, j);
            }
            let (_, devs) = transpose_devices(&rd, &(0..n).collect::<Vec<_>>(), &perm);
            let rank = 1 + rng.next(3) as usize;
            let dims = factors(&mut rng, n, rank + 1);
            let p: Vec<i64> = perm.iter().map(|&x| x as i64).collect();
            let want = Grid::new(dims.clone(), devs).unwrap();
            if let Some(g) = Grid::from_iota(&dims, &rd, &p) {
                hits += 1;
                assert_eq!(g.devs(), want.devs(), "{dims:?} {rd:?} {perm:?}");
                assert!(g == want);
            }
        }
        assert!(hits > 1500, "{hits}");
    }

    /// Reshaped grids in digit form equal XLA's `ReshapeSharding` through
    /// device lists.
    #[test]
    fn reshaped_matches_reshape_sharding() {
        let mut rng = Rng(0x853c49e6748fea9b);
        let mut hits = 0;
        for _ in 0..4000 {
            let n = [2i64, 4, 8, 16, 32, 64][rng.next(6) as usize];
            let rank = 1 + rng.next(3) as usize;
            let dims = factors(&mut rng, n, rank + 1);
            let devs = random_devs(&mut rng, n);
            let g = Grid::new(dims.clone(), devs).unwrap();
            // A global shape: each dim a multiple (or not) of its tiles.
            let source: Vec<i64> = (0..rank)
                .map(|a| {
                    g.tiles(a) * [1i64, 2, 3, 4][rng.next(4) as usize] + i64::from(rng.next(6) == 0)
                })
                .collect();
            let total: i64 = source.iter().product();
            // A random target shape with the same element count.
            let mut target = Vec::new();
            let mut rest = total;
            let mut p = 2;
            let mut fs = Vec::new();
            while rest > 1 {
                while rest % p == 0 {
                    rest /= p;
                    fs.push(p);
                }
                p += 1;
            }
            let k = 1 + rng.next(4) as usize;
            target.resize(k, 1i64);
            for f in fs {
                let i = rng.next(k as u64) as usize;
                target[i] *= f;
            }
            let want = xla_hlo_utils::ops::reshape_sharding(&source, &target, &g.to_sharding())
                .and_then(|s| Grid::from_sharding(&s, target.len(), n).ok());
            if let Some(got) = g.reshaped(&source, &target) {
                hits += 1;
                assert!(
                    same(&got, &want),
                    "{source:?} -> {target:?} on {:?}",
                    g.dims()
                );
            }
        }
        assert!(hits > 2000, "{hits}");
    }
}
