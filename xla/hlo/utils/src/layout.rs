//! `TiledLayout`: a sharding applied to one array shape, normalized for the
//! partitioner: tile counts per data dim, manual subgroup size, replication
//! factor and the device order, with per-device tile shapes and offsets.
//!
//! Uneven dims are padded as XLA pads: every tile has the size
//! `ceil(dim / tiles)`; tile `i` starts at `min(i * size, dim)` and ends at
//! `min((i + 1) * size, dim)`, so trailing tiles may hold padding only.
//!
//! Invariants: the device array always has `rank + 2` dims
//! `[tiles..., manual, replication]` (sizes 1 when absent); every device of
//! the sharding appears exactly once; lookups by device are O(1).

use crate::error::ShardingError;
use crate::sharding::Sharding;
use crate::tile::{for_each_index, strides, TileArray};
use xla_hlo_ir::sharding::SubgroupType;

/// A sharding laid out over an array shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TiledLayout {
    shape: Vec<i64>,
    tile_dims: Vec<i64>,
    manual: i64,
    replication: i64,
    devices: TileArray,
    /// For each device id, its flat position in `devices` (or -1).
    position: Vec<i64>,
}

impl TiledLayout {
    /// Lays `sharding` over `shape` on `num_devices` devices.
    pub fn new(
        sharding: &Sharding,
        shape: &[i64],
        num_devices: i64,
    ) -> Result<TiledLayout, ShardingError> {
        let rank = shape.len();
        let (dims, devices): (Vec<i64>, Vec<i64>) = match sharding {
            Sharding::Replicated => {
                let mut d = vec![1; rank];
                d.extend([1, num_devices]);
                (d, (0..num_devices).collect())
            }
            Sharding::Manual => {
                let mut d = vec![1; rank];
                d.extend([num_devices, 1]);
                (d, (0..num_devices).collect())
            }
            Sharding::Tiled(t) => {
                if t.data_rank() != rank {
                    return Err(ShardingError::ShapeMismatch(format!(
                        "sharding of rank {} on a rank-{rank} shape",
                        t.data_rank()
                    )));
                }
                let mut manual = 1;
                let mut repl = 1;
                for (i, ty) in t.subgroups().iter().enumerate() {
                    let size = t.tiles().dim(rank + i);
                    match ty {
                        SubgroupType::Manual => manual = size,
                        SubgroupType::Replicated => repl = size,
                        other => {
                            return Err(ShardingError::Unsupported(format!(
                                "{} subgroups in a tiled layout",
                                other.name()
                            )))
                        }
                    }
                }
                let mut d = t.data_dims().to_vec();
                d.extend([manual, repl]);
                (d, t.tiles().devices().to_vec())
            }
            other => {
                return Err(ShardingError::Unsupported(format!(
                    "{other:?} has no tiled layout"
                )))
            }
        };
        if shape.iter().any(|&d| d < 0) {
            return Err(ShardingError::ShapeMismatch("negative dimension".into()));
        }
        let max = devices.iter().copied().max().unwrap_or(0);
        if max >= num_devices.max(devices.len() as i64) || devices.iter().any(|&d| d < 0) {
            return Err(ShardingError::Invalid(format!("device {max} out of range")));
        }
        let mut position = vec![-1i64; num_devices.max(max + 1) as usize];
        for (p, &d) in devices.iter().enumerate() {
            if position[d as usize] >= 0 {
                return Err(ShardingError::Invalid(format!("device {d} listed twice")));
            }
            position[d as usize] = p as i64;
        }
        let tiles = TileArray::new(dims.clone(), devices)?;
        Ok(TiledLayout {
            shape: shape.to_vec(),
            tile_dims: dims[..rank].to_vec(),
            manual: dims[rank],
            replication: dims[rank + 1],
            devices: tiles,
            position,
        })
    }

    pub fn shape(&self) -> &[i64] {
        &self.shape
    }
    /// Tiles per data dim.
    pub fn tile_dims(&self) -> &[i64] {
        &self.tile_dims
    }
    pub fn manual(&self) -> i64 {
        self.manual
    }
    pub fn replication(&self) -> i64 {
        self.replication
    }
    /// Devices over `[tiles..., manual, replication]`.
    pub fn devices(&self) -> &TileArray {
        &self.devices
    }
    pub fn num_devices(&self) -> i64 {
        self.devices.num_elements()
    }
    /// Every dim divides evenly.
    pub fn is_even(&self) -> bool {
        self.shape
            .iter()
            .zip(&self.tile_dims)
            .all(|(d, t)| d % t == 0)
    }

    /// The per-device (padded) shape: `ceil(dim / tiles)` per dim.
    pub fn tile_shape(&self) -> Vec<i64> {
        self.shape
            .iter()
            .zip(&self.tile_dims)
            .map(|(&d, &t)| (d + t - 1) / t)
            .collect()
    }

    fn multi_index(&self, device: i64) -> Option<Vec<i64>> {
        let p = *self.position.get(usize::try_from(device).ok()?)?;
        if p < 0 {
            return None;
        }
        let s = strides(self.devices.dims());
        Some(
            s.iter()
                .zip(self.devices.dims())
                .map(|(st, d)| (p / st) % d)
                .collect(),
        )
    }

    /// The data tile a device holds.
    pub fn tile_index(&self, device: i64) -> Option<Vec<i64>> {
        let mut i = self.multi_index(device)?;
        i.truncate(self.shape.len());
        Some(i)
    }
    /// The device's index in its manual subgroup dim.
    pub fn manual_index(&self, device: i64) -> Option<i64> {
        Some(self.multi_index(device)?[self.shape.len()])
    }
    /// The device's index in its replication group.
    pub fn replica_index(&self, device: i64) -> Option<i64> {
        Some(self.multi_index(device)?[self.shape.len() + 1])
    }

    /// Start of the device's tile (clamped to the shape).
    pub fn tile_offset(&self, device: i64) -> Option<Vec<i64>> {
        let idx = self.tile_index(device)?;
        let ts = self.tile_shape();
        Some(
            idx.iter()
                .zip(&ts)
                .zip(&self.shape)
                .map(|((i, t), d)| (i * t).min(*d))
                .collect(),
        )
    }
    /// End (exclusive) of the device's tile (clamped to the shape).
    pub fn tile_limit(&self, device: i64) -> Option<Vec<i64>> {
        let idx = self.tile_index(device)?;
        let ts = self.tile_shape();
        Some(
            idx.iter()
                .zip(&ts)
                .zip(&self.shape)
                .map(|((i, t), d)| ((i + 1) * t).min(*d))
                .collect(),
        )
    }
    /// Valid (unpadded) element counts of the device's tile per dim.
    pub fn valid_extent(&self, device: i64) -> Option<Vec<i64>> {
        let o = self.tile_offset(device)?;
        let l = self.tile_limit(device)?;
        Some(l.iter().zip(&o).map(|(l, o)| l - o).collect())
    }
    /// Padding at the end of the device's tile per dim.
    pub fn padding(&self, device: i64) -> Option<Vec<i64>> {
        let v = self.valid_extent(device)?;
        Some(
            self.tile_shape()
                .iter()
                .zip(&v)
                .map(|(t, v)| t - v)
                .collect(),
        )
    }

    /// The device holding data tile `tile` in manual group `manual` and
    /// replica `replica`.
    pub fn device_for_tile(&self, tile: &[i64], manual: i64, replica: i64) -> Option<i64> {
        if tile.len() != self.shape.len()
            || tile
                .iter()
                .zip(&self.tile_dims)
                .any(|(i, t)| *i < 0 || i >= t)
            || !(0..self.manual).contains(&manual)
            || !(0..self.replication).contains(&replica)
        {
            return None;
        }
        let mut idx = tile.to_vec();
        idx.extend([manual, replica]);
        Some(self.devices.get(&idx))
    }

    /// The devices holding the same data as `device` (its replication group,
    /// itself included), in replica order.
    pub fn devices_in_same_tile(&self, device: i64) -> Option<Vec<i64>> {
        let mut idx = self.multi_index(device)?;
        let r = self.shape.len() + 1;
        Some(
            (0..self.replication)
                .map(|k| {
                    idx[r] = k;
                    self.devices.get(&idx)
                })
                .collect(),
        )
    }

    /// All replication groups (one per data tile and manual index).
    pub fn replica_groups(&self) -> Vec<Vec<i64>> {
        self.devices
            .devices()
            .chunks(self.replication.max(1) as usize)
            .map(|c| c.to_vec())
            .collect()
    }

    /// Device groups that differ only along the given device-array dims
    /// (indices into `[tiles..., manual, replication]`), e.g. the groups of
    /// an all-gather over tiled data dim `d` (`groups_along(&[d])`) or of an
    /// all-reduce over the replication dim. Groups are listed in row-major
    /// order of the other dims; inside a group, row-major over `dims`.
    pub fn groups_along(&self, dims: &[usize]) -> Vec<Vec<i64>> {
        let all = self.devices.dims();
        let nd = all.len();
        let dims: Vec<usize> = dims.iter().copied().filter(|&d| d < nd).collect();
        let mut perm: Vec<usize> = (0..nd).filter(|d| !dims.contains(d)).collect();
        perm.extend(dims.iter().copied());
        let moved = self.devices.transpose(&perm);
        let size: i64 = dims.iter().map(|&d| all[d]).product();
        moved
            .devices()
            .chunks(size.max(1) as usize)
            .map(|c| c.to_vec())
            .collect()
    }

    /// Calls `f(device, offset, limit)` for every device.
    pub fn for_each_tile(&self, mut f: impl FnMut(i64, &[i64], &[i64])) {
        let ts = self.tile_shape();
        let r = self.shape.len();
        for_each_index(self.devices.dims(), |flat, idx| {
            let dev = self.devices.devices()[flat];
            let off: Vec<i64> = (0..r)
                .map(|i| (idx[i] * ts[i]).min(self.shape[i]))
                .collect();
            let lim: Vec<i64> = (0..r)
                .map(|i| ((idx[i] + 1) * ts[i]).min(self.shape[i]))
                .collect();
            f(dev, &off, &lim);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uneven_tiles_pad_last() {
        // 30 rows on 8 devices: tiles of 4, last holds 2 rows.
        let s = Sharding::tile(TileArray::iota(vec![8, 1]));
        let l = TiledLayout::new(&s, &[30, 12], 8).unwrap();
        assert_eq!(l.tile_shape(), vec![4, 12]);
        assert_eq!(l.tile_offset(7).unwrap(), vec![28, 0]);
        assert_eq!(l.valid_extent(7).unwrap(), vec![2, 12]);
        assert_eq!(l.padding(7).unwrap(), vec![2, 0]);
        assert!(!l.is_even());
        assert_eq!(l.device_for_tile(&[3, 0], 0, 0), Some(3));
    }

    #[test]
    fn groups_along_dims() {
        let s = Sharding::tile(TileArray::iota(vec![2, 4]));
        let l = TiledLayout::new(&s, &[16, 64], 8).unwrap();
        // all-gather over dim 1: devices sharing the dim-0 tile
        assert_eq!(
            l.groups_along(&[1]),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]
        );
        assert_eq!(
            l.groups_along(&[0]),
            vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]
        );
        assert_eq!(l.groups_along(&[0, 1]).len(), 1);
    }

    #[test]
    fn partial_replication_groups() {
        let s = Sharding::partial_tile(TileArray::iota(vec![2, 1, 4]));
        let l = TiledLayout::new(&s, &[16, 64], 8).unwrap();
        assert_eq!(l.replication(), 4);
        assert_eq!(l.devices_in_same_tile(5).unwrap(), vec![4, 5, 6, 7]);
        assert_eq!(l.replica_groups().len(), 2);
    }
}
