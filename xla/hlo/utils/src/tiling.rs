//! Moving data between a global array and its per-device tiles: which tile
//! a device holds under an IR sharding, and splitting (`shard`) and
//! reassembling (`assemble`) row-major element slices by it. Generic over
//! the element type, so the interpreter calls it on typed vectors and the
//! runtime on raw bytes (elements as `[u8; N]`).
//!
//! This is the one implementation of split/assemble in the project: the
//! runtime's launcher and the interpreter's `SPMDFullToShardShape` /
//! `SPMDShardToFullShape` both use it, and its offsets come from
//! [`TiledLayout`].
//!
//! Invariants: tiles are `ceil(dim / tiles)` elements per dim, padded with
//! `T::default()` past the end of the array (as XLA pads them); a
//! non-tiled or one-tile sharding's tile is the whole array; unreduced
//! subgroups are laid out as replicated ones (the summing is the program's
//! business); `assemble(shard(x, d) for every d) == x` for every sharding;
//! nothing panics on malformed input.

use crate::error::ShardingError;
use crate::layout::TiledLayout;
use crate::sharding::Sharding;
use std::borrow::Cow;
use xla_hlo_ir::sharding::{ShardingKind, SingleSharding, SubgroupType};

/// Where one device's tile lies in the global array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTile {
    /// Start of the tile, clamped to the array.
    pub offsets: Vec<i64>,
    /// The tile's (padded) size per dim.
    pub dims: Vec<i64>,
}

impl DeviceTile {
    fn whole(dims: &[i64]) -> DeviceTile {
        DeviceTile {
            offsets: vec![0; dims.len()],
            dims: dims.to_vec(),
        }
    }

    /// Whether the tile is the whole array of `dims`.
    pub fn is_whole(&self, dims: &[i64]) -> bool {
        self.dims == dims && self.offsets.iter().all(|&o| o == 0)
    }

    /// Elements of the tile that lie inside an array of `dims`, per dim.
    pub fn valid_extent(&self, dims: &[i64]) -> Vec<i64> {
        dims.iter()
            .zip(&self.offsets)
            .zip(&self.dims)
            .map(|((&d, &o), &t)| (d - o).clamp(0, t))
            .collect()
    }
}

/// The tile `device` holds of an array of `dims` under `s`.
pub fn device_tile(
    s: &SingleSharding,
    dims: &[i64],
    device: i64,
) -> Result<DeviceTile, ShardingError> {
    let ShardingKind::Tiled { last_tile_dims, .. } = &s.kind else {
        return Ok(DeviceTile::whole(dims));
    };
    let placed: Cow<'_, SingleSharding> = if last_tile_dims.contains(&SubgroupType::Unreduced) {
        let mut copy = s.clone();
        if let ShardingKind::Tiled { last_tile_dims, .. } = &mut copy.kind {
            for t in last_tile_dims.iter_mut() {
                if *t == SubgroupType::Unreduced {
                    *t = SubgroupType::Replicated;
                }
            }
        }
        Cow::Owned(copy)
    } else {
        Cow::Borrowed(s)
    };
    let sharding = Sharding::from_ir(&placed)?;
    if matches!(sharding, Sharding::Replicated) {
        return Ok(DeviceTile::whole(dims));
    }
    let layout = TiledLayout::new(&sharding, dims, 0)?;
    let offsets = layout.tile_offset(device).ok_or_else(|| {
        ShardingError::Invalid(format!(
            "device {device} is not in the tile assignment of {s}"
        ))
    })?;
    Ok(DeviceTile {
        offsets,
        dims: layout.tile_shape(),
    })
}

/// Device `device`'s part of a global array.
#[derive(Clone, Debug, PartialEq)]
pub enum Shard<T> {
    /// The device holds the whole array.
    Whole,
    /// The device holds this tile (row-major, padded).
    Tile { dims: Vec<i64>, elements: Vec<T> },
}

/// Splits `full` (row-major over `dims`) for `device` under `s`.
pub fn shard<T: Copy + Default>(
    full: &[T],
    dims: &[i64],
    s: &SingleSharding,
    device: i64,
) -> Result<Shard<T>, ShardingError> {
    check_len(full.len(), dims, "the global array")?;
    let tile = device_tile(s, dims, device)?;
    if tile.is_whole(dims) {
        return Ok(Shard::Whole);
    }
    let elements = extract_tile(full, dims, &tile)?;
    Ok(Shard::Tile {
        dims: tile.dims,
        elements,
    })
}

/// The elements of `tile` of `full` (row-major over `dims`), padded with
/// `T::default()` where the tile passes the end of the array.
pub fn extract_tile<T: Copy + Default>(
    full: &[T],
    dims: &[i64],
    tile: &DeviceTile,
) -> Result<Vec<T>, ShardingError> {
    check_len(full.len(), dims, "the global array")?;
    if tile.dims.len() != dims.len()
        || tile.offsets.len() != dims.len()
        || tile.dims.iter().chain(&tile.offsets).any(|&d| d < 0)
    {
        return Err(ShardingError::ShapeMismatch(format!(
            "a tile of {:?} at {:?} in an array of {dims:?}",
            tile.dims, tile.offsets
        )));
    }
    let mut elements = vec![T::default(); element_count(&tile.dims)];
    copy_region(
        full,
        dims,
        &tile.offsets,
        &mut elements,
        &tile.dims,
        &vec![0; dims.len()],
        &tile.valid_extent(dims),
    );
    Ok(elements)
}

/// Reassembles a global array of `global_dims` from every device's shard
/// (`shards[d]` is device d's, each row-major over `shard_dims`) under `s`.
/// A non-tiled sharding's result is device 0's shard. With
/// `check_replicas`, every device holding a tile (or, replicated, the
/// whole array) must hold the same valid elements as the first holder; the
/// first disagreement is the error.
pub fn assemble<T: Copy + Default + PartialEq>(
    shards: &[&[T]],
    shard_dims: &[i64],
    s: &SingleSharding,
    global_dims: &[i64],
    check_replicas: bool,
) -> Result<Vec<T>, ShardingError> {
    let first = shards
        .first()
        .ok_or_else(|| ShardingError::Invalid("no shards to assemble".into()))?;
    for shard in shards {
        check_len(shard.len(), shard_dims, "a shard")?;
    }
    if !matches!(s.kind, ShardingKind::Tiled { .. }) {
        if check_replicas {
            if let Some(d) = shards.iter().position(|x| x != first) {
                return Err(ShardingError::Disagreement(format!(
                    "devices 0 and {d} disagree about a replicated result"
                )));
            }
        }
        return Ok(first.to_vec());
    }
    if shard_dims.len() != global_dims.len() {
        return Err(ShardingError::ShapeMismatch(format!(
            "shards of {shard_dims:?} for a global array of {global_dims:?}"
        )));
    }
    let mut full = vec![T::default(); element_count(global_dims)];
    let mut holder: std::collections::HashMap<Vec<i64>, usize> = std::collections::HashMap::new();
    let origin = vec![0; global_dims.len()];
    for (d, piece) in shards.iter().enumerate() {
        let tile = device_tile(s, global_dims, d as i64)?;
        let valid = DeviceTile {
            offsets: tile.offsets.clone(),
            dims: shard_dims.to_vec(),
        }
        .valid_extent(global_dims);
        match holder.get(&tile.offsets) {
            None => {
                copy_region(
                    piece,
                    shard_dims,
                    &origin,
                    &mut full,
                    global_dims,
                    &tile.offsets,
                    &valid,
                );
                holder.insert(tile.offsets, d);
            }
            Some(&first_holder) if check_replicas => {
                if !region_equal(piece, shard_dims, &full, global_dims, &tile.offsets, &valid) {
                    return Err(ShardingError::Disagreement(format!(
                        "devices {first_holder} and {d} hold the same tile (offset {:?}) with different data",
                        tile.offsets
                    )));
                }
            }
            Some(_) => {}
        }
    }
    Ok(full)
}

fn element_count(dims: &[i64]) -> usize {
    dims.iter().map(|&d| d.max(0) as usize).product()
}

fn check_len(len: usize, dims: &[i64], what: &str) -> Result<(), ShardingError> {
    if dims.iter().any(|&d| d < 0) || len != element_count(dims) {
        return Err(ShardingError::ShapeMismatch(format!(
            "{what} has {len} elements, its shape {dims:?} says {}",
            element_count(dims)
        )));
    }
    Ok(())
}

/// Row-major strides of `dims`.
fn strides(dims: &[i64]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1].max(0) as usize;
    }
    s
}

/// Calls `run(src_start, dst_start, len)` for every contiguous run (along
/// the last dim) of a box of `extent` at `src_at` in an array of `src_dims`
/// and at `dst_at` in one of `dst_dims`. The box must fit both.
fn for_each_run(
    src_dims: &[i64],
    src_at: &[i64],
    dst_dims: &[i64],
    dst_at: &[i64],
    extent: &[i64],
    mut run: impl FnMut(usize, usize, usize) -> bool,
) {
    if extent.iter().any(|&e| e <= 0) {
        return;
    }
    let rank = extent.len();
    let (src_strides, dst_strides) = (strides(src_dims), strides(dst_dims));
    let offset = |at: &[i64], idx: &[i64], st: &[usize]| -> usize {
        (0..rank).map(|i| (at[i] + idx[i]) as usize * st[i]).sum()
    };
    if rank == 0 {
        run(0, 0, 1);
        return;
    }
    let len = extent[rank - 1] as usize;
    let mut idx = vec![0i64; rank];
    loop {
        if !run(
            offset(src_at, &idx, &src_strides),
            offset(dst_at, &idx, &dst_strides),
            len,
        ) {
            return;
        }
        // Advance over every dim but the last (the run).
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < extent[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

fn copy_region<T: Copy>(
    src: &[T],
    src_dims: &[i64],
    src_at: &[i64],
    dst: &mut [T],
    dst_dims: &[i64],
    dst_at: &[i64],
    extent: &[i64],
) {
    for_each_run(src_dims, src_at, dst_dims, dst_at, extent, |s, d, n| {
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
        true
    });
}

/// Whether `tile`'s box of `extent` at its origin equals `full`'s at `at`.
fn region_equal<T: PartialEq>(
    tile: &[T],
    tile_dims: &[i64],
    full: &[T],
    full_dims: &[i64],
    at: &[i64],
    extent: &[i64],
) -> bool {
    let mut equal = true;
    let origin = vec![0; tile_dims.len()];
    for_each_run(tile_dims, &origin, full_dims, at, extent, |s, d, n| {
        equal = tile[s..s + n] == full[d..d + n];
        equal
    });
    equal
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tile::TileArray;

    fn tiled(dims: Vec<i64>) -> SingleSharding {
        Sharding::tile(TileArray::iota(dims)).to_ir()
    }

    #[test]
    fn uneven_tiles_are_padded_and_round_trip() {
        // 5 x 3 over 2 x 2 devices: tiles of 3 x 2, the last row and column padded.
        let s = tiled(vec![2, 2]);
        let full: Vec<i32> = (1..=15).collect();
        let shards: Vec<Vec<i32>> = (0..4)
            .map(|d| match shard(&full, &[5, 3], &s, d).unwrap() {
                Shard::Tile { dims, elements } => {
                    assert_eq!(dims, vec![3, 2]);
                    elements
                }
                Shard::Whole => panic!("device {d} got the whole array"),
            })
            .collect();
        assert_eq!(shards[0], vec![1, 2, 4, 5, 7, 8]);
        assert_eq!(shards[3], vec![12, 0, 15, 0, 0, 0]);
        let refs: Vec<&[i32]> = shards.iter().map(Vec::as_slice).collect();
        assert_eq!(assemble(&refs, &[3, 2], &s, &[5, 3], true).unwrap(), full);
    }

    #[test]
    fn replicas_that_disagree_are_named() {
        // Two tiles, each held by two devices.
        let s = Sharding::partial_tile(TileArray::iota(vec![2, 2])).to_ir();
        let a = [1.0f32, 2.0];
        let b = [1.0f32, 3.0];
        let err = assemble(&[&a[..], &a[..], &a[..], &b[..]], &[2], &s, &[4], true).unwrap_err();
        assert!(err.to_string().contains("devices 2 and 3"), "{err}");
        assert_eq!(
            assemble(&[&a[..], &a[..], &b[..], &b[..]], &[2], &s, &[4], true).unwrap(),
            vec![1.0, 2.0, 1.0, 3.0]
        );
    }

    #[test]
    fn wrong_lengths_are_errors() {
        let s = tiled(vec![2]);
        assert!(shard(&[1u8, 2, 3], &[4], &s, 0).is_err());
        assert!(assemble(&[&[1u8][..], &[2, 3][..]], &[2], &s, &[4], false).is_err());
    }
}
