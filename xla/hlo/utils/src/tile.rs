//! Tile arrays: an N-dimensional array of device ids in row-major order, the
//! explicit form of XLA's `TileAssignment`. Reshape, transpose, element
//! access, conversion from and to the IR's iota / explicit tile assignments,
//! and recovery of the shortest iota form (`<=[R]T(P)`) of an explicit array.
//!
//! Invariants: `devices.len() == product(dims)`; every dim is >= 1. The device
//! list is shared (`Arc`) so cloning a tile array never copies it. Nothing
//! here panics on malformed IR input: `from_ir` returns an error instead.

use crate::error::ShardingError;
use std::sync::Arc;
use xla_hlo_ir::mesh::iota_devices;
use xla_hlo_ir::TileAssignment;

/// Devices laid out over tile dimensions, row-major.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TileArray {
    dims: Vec<i64>,
    devices: Arc<[i64]>,
}

/// Row-major strides of `dims`.
pub(crate) fn strides(dims: &[i64]) -> Vec<i64> {
    let mut s = vec![1i64; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * dims[d + 1];
    }
    s
}

/// Calls `f(flat_index, multi_index)` for every index of `dims`, row-major.
pub(crate) fn for_each_index(dims: &[i64], mut f: impl FnMut(usize, &[i64])) {
    let n: i64 = dims.iter().product();
    let mut idx = vec![0i64; dims.len()];
    for flat in 0..n.max(0) as usize {
        f(flat, &idx);
        for d in (0..dims.len()).rev() {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

impl TileArray {
    /// A tile array from dims and a row-major device list.
    pub fn new(dims: Vec<i64>, devices: Vec<i64>) -> Result<TileArray, ShardingError> {
        if dims.iter().any(|&d| d < 1) {
            return Err(ShardingError::Invalid(format!(
                "tile dimensions must be positive: {dims:?}"
            )));
        }
        let n = dims
            .iter()
            .try_fold(1i64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| ShardingError::Invalid("tile count overflows".into()))?;
        if n != devices.len() as i64 {
            return Err(ShardingError::Invalid(format!(
                "{} devices for tile dimensions {dims:?}",
                devices.len()
            )));
        }
        Ok(TileArray {
            dims,
            devices: devices.into(),
        })
    }

    /// `iota(product(dims))` laid out over `dims`.
    pub fn iota(dims: Vec<i64>) -> TileArray {
        let n: i64 = dims.iter().product();
        TileArray {
            dims,
            devices: (0..n).collect::<Vec<_>>().into(),
        }
    }

    /// Internal constructor for arrays known to be consistent.
    pub(crate) fn from_parts(dims: Vec<i64>, devices: Arc<[i64]>) -> TileArray {
        debug_assert_eq!(dims.iter().product::<i64>(), devices.len() as i64);
        TileArray { dims, devices }
    }

    pub fn dims(&self) -> &[i64] {
        &self.dims
    }
    pub fn dim(&self, i: usize) -> i64 {
        self.dims[i]
    }
    pub fn num_dims(&self) -> usize {
        self.dims.len()
    }
    /// Devices in row-major order.
    pub fn devices(&self) -> &[i64] {
        &self.devices
    }
    pub fn num_elements(&self) -> i64 {
        self.devices.len() as i64
    }
    /// The first device (XLA's `first()`).
    pub fn first(&self) -> i64 {
        self.devices.first().copied().unwrap_or(0)
    }

    /// The device at a multi-index.
    pub fn get(&self, index: &[i64]) -> i64 {
        let s = strides(&self.dims);
        let flat: i64 = index.iter().zip(&s).map(|(i, s)| i * s).sum();
        self.devices[flat as usize]
    }

    /// The same devices over new dims (same product).
    pub fn reshape(&self, dims: Vec<i64>) -> TileArray {
        debug_assert_eq!(
            dims.iter().product::<i64>(),
            self.num_elements(),
            "reshape {:?} -> {dims:?}",
            self.dims
        );
        TileArray {
            dims,
            devices: self.devices.clone(),
        }
    }

    /// Transposes: result dim `i` is source dim `perm[i]`. A `perm` that is
    /// not a permutation of the dims leaves the array unchanged.
    pub fn transpose(&self, perm: &[usize]) -> TileArray {
        let mut seen = vec![false; self.dims.len()];
        if perm.len() != self.dims.len()
            || perm
                .iter()
                .any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true))
        {
            return self.clone();
        }
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return self.clone();
        }
        let src_strides = strides(&self.dims);
        let out_dims: Vec<i64> = perm.iter().map(|&p| self.dims[p]).collect();
        // Skip size-1 dims: they do not change the order.
        let moving: Vec<usize> = (0..perm.len()).filter(|&i| out_dims[i] > 1).collect();
        let order: Vec<usize> = moving.iter().map(|&i| perm[i]).collect();
        if order.windows(2).all(|w| w[0] < w[1]) {
            return TileArray {
                dims: out_dims,
                devices: self.devices.clone(),
            };
        }
        let n = self.devices.len();
        let mut out = Vec::with_capacity(n);
        let rank = out_dims.len();
        let mut idx = vec![0i64; rank];
        let mut src = 0i64;
        for _ in 0..n {
            out.push(self.devices[src as usize]);
            for d in (0..rank).rev() {
                idx[d] += 1;
                src += src_strides[perm[d]];
                if idx[d] < out_dims[d] {
                    break;
                }
                src -= src_strides[perm[d]] * out_dims[d];
                idx[d] = 0;
            }
        }
        TileArray {
            dims: out_dims,
            devices: out.into(),
        }
    }

    /// A copy with every group of `group` consecutive devices sorted.
    pub(crate) fn sort_groups(&self, group: usize) -> TileArray {
        if group <= 1
            || self
                .devices
                .chunks(group)
                .all(|c| c.windows(2).all(|w| w[0] <= w[1]))
        {
            return self.clone();
        }
        let mut v = self.devices.to_vec();
        for c in v.chunks_mut(group) {
            c.sort_unstable();
        }
        TileArray {
            dims: self.dims.clone(),
            devices: v.into(),
        }
    }

    /// Reads an IR tile assignment (iota or explicit).
    pub fn from_ir(ta: &TileAssignment) -> Result<TileArray, ShardingError> {
        match ta {
            TileAssignment::Explicit { dims, devices } => {
                TileArray::new(dims.clone(), devices.clone())
            }
            TileAssignment::Iota {
                dims,
                reshape_dims,
                perm,
            } => {
                if reshape_dims.iter().any(|&d| d < 1) {
                    return Err(ShardingError::Invalid(format!(
                        "iota reshape dims must be positive: {reshape_dims:?}"
                    )));
                }
                if !perm.is_empty() {
                    let mut seen = vec![false; reshape_dims.len()];
                    if perm.len() != reshape_dims.len()
                        || perm.iter().any(|&p| {
                            p < 0
                                || p as usize >= seen.len()
                                || std::mem::replace(&mut seen[p as usize], true)
                        })
                    {
                        return Err(ShardingError::Invalid(format!(
                            "iota transpose {perm:?} is not a permutation of {} dims",
                            reshape_dims.len()
                        )));
                    }
                }
                let n = reshape_dims
                    .iter()
                    .try_fold(1i64, |a, &d| a.checked_mul(d))
                    .filter(|&n| n <= 1 << 24)
                    .ok_or_else(|| ShardingError::Invalid("iota device count too large".into()))?;
                let want: i64 = dims.iter().product();
                if n != want {
                    return Err(ShardingError::Invalid(format!(
                        "iota over {reshape_dims:?} has {n} devices, tile dims {dims:?} need {want}"
                    )));
                }
                TileArray::new(dims.clone(), iota_devices(reshape_dims, perm))
            }
        }
    }

    /// The IR form: iota when the devices are a transposed iota, else explicit.
    pub fn to_ir(&self) -> TileAssignment {
        match self.to_iota() {
            Some((reshape_dims, perm)) => TileAssignment::Iota {
                dims: self.dims.clone(),
                reshape_dims,
                perm,
            },
            None => TileAssignment::Explicit {
                dims: self.dims.clone(),
                devices: self.devices.to_vec(),
            },
        }
    }

    /// The shortest `(reshape_dims, perm)` with
    /// `devices == iota(reshape_dims).transpose(perm).flatten()`, if any; an
    /// identity transpose is returned as an empty `perm` over one reshape dim.
    pub fn to_iota(&self) -> Option<(Vec<i64>, Vec<i64>)> {
        let d = &self.devices;
        let n = d.len();
        if n == 0 || d[0] != 0 {
            return None;
        }
        // Decompose the flat position into digits from the minor end: each
        // segment is (stride in device space, size).
        let mut segs: Vec<(i64, i64)> = Vec::new();
        let mut block = 1usize;
        while block < n {
            let s = d[block] - d[0];
            if s <= 0 {
                return None;
            }
            let mut k = 1usize;
            while (k + 1) * block <= n && d[k * block] == d[0] + k as i64 * s {
                k += 1;
            }
            while k > 1 && n % (k * block) != 0 {
                k -= 1;
            }
            if k <= 1 {
                return None;
            }
            segs.push((s, k as i64));
            block *= k;
        }
        // Verify every position.
        let mut sizes_minor_first = Vec::with_capacity(segs.len());
        for &(_, k) in &segs {
            sizes_minor_first.push(k);
        }
        for (pos, &dev) in d.iter().enumerate() {
            let mut rem = pos as i64;
            let mut v = 0i64;
            for &(s, k) in &segs {
                v += (rem % k) * s;
                rem /= k;
            }
            if v != dev {
                return None;
            }
        }
        // The strides must form a contiguous mixed radix.
        let mut by_stride: Vec<(i64, i64, usize)> = segs
            .iter()
            .enumerate()
            .map(|(i, &(s, k))| (s, k, i))
            .collect();
        by_stride.sort_unstable();
        let mut expect = 1i64;
        for &(s, k, _) in &by_stride {
            if s != expect {
                return None;
            }
            expect *= k;
        }
        // Reshape dims: major (largest stride) first.
        let reshape: Vec<(i64, usize)> = by_stride.iter().rev().map(|&(_, k, i)| (k, i)).collect();
        let reshape_dims: Vec<i64> = reshape.iter().map(|r| r.0).collect();
        // Transposed dims: segments major first (segs are minor first).
        let m = segs.len();
        let perm: Vec<i64> = (0..m)
            .map(|t| {
                let seg = m - 1 - t;
                reshape.iter().position(|r| r.1 == seg).unwrap_or(0) as i64
            })
            .collect();
        if perm.iter().enumerate().all(|(i, &p)| i as i64 == p) {
            Some((vec![n as i64], vec![]))
        } else {
            Some((reshape_dims, perm))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transpose_and_iota_round_trip() {
        let t = TileArray::iota(vec![2, 4]).transpose(&[1, 0]);
        assert_eq!(t.devices(), &[0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(t.to_iota(), Some((vec![2, 4], vec![1, 0])));
        assert_eq!(TileArray::iota(vec![8]).to_iota(), Some((vec![8], vec![])));
        let e = TileArray::new(vec![4], vec![0, 2, 1, 3]).unwrap();
        assert_eq!(e.to_iota(), Some((vec![2, 2], vec![1, 0])));
        let bad = TileArray::new(vec![4], vec![0, 3, 1, 2]).unwrap();
        assert_eq!(bad.to_iota(), None);
        let t3 = TileArray::iota(vec![2, 2, 2]).transpose(&[2, 0, 1]);
        let (r, p) = t3.to_iota().unwrap();
        let back = iota_devices(&r, &p);
        assert_eq!(back, t3.devices());
    }

    #[test]
    fn from_ir_rejects_bad_input() {
        let ta = TileAssignment::Iota {
            dims: vec![2, 2],
            reshape_dims: vec![8],
            perm: vec![],
        };
        assert!(TileArray::from_ir(&ta).is_err());
        let ta = TileAssignment::Iota {
            dims: vec![2, 4],
            reshape_dims: vec![2, 4],
            perm: vec![1, 1],
        };
        assert!(TileArray::from_ir(&ta).is_err());
    }
}
