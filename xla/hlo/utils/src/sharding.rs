//! The algebraic sharding: a canonical, semantic form of the IR's
//! `HloSharding`, used by every transformation in this crate.
//!
//! `Sharding` is one leaf (an array's sharding); `InstrSharding` is what an
//! instruction carries (one leaf, or one leaf per leaf of a tuple shape).
//!
//! Invariants (established by the constructors, relied on by `==`):
//! - a tiled sharding's tile array has `data_rank` data dims followed by one
//!   dim per subgroup; subgroup dims are > 1, each subgroup type occurs once,
//!   in the order maximal, manual, unreduced, replicated;
//! - devices are sorted inside each replication group (their order there
//!   carries no meaning), so structural equality is semantic equality;
//! - a tiled sharding with no data tiling and a single subgroup type is
//!   `Replicated` / `Manual` / `Unreduced` instead.
//!
//! Metadata and shard groups are not part of the algebra (see `from_ir`).

use crate::error::ShardingError;
use crate::tile::TileArray;
use std::sync::Arc;
use xla_hlo_ir::sharding::{ShardingKind, SingleSharding, SubgroupType};
use xla_hlo_ir::{HloSharding, Shape};

/// One array's sharding.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Sharding {
    Replicated,
    Manual,
    Unknown,
    Unreduced,
    /// All data on one device.
    Maximal(i64),
    /// Shared: cloning a tiled sharding never copies it.
    Tiled(Arc<Tiled>),
}

/// A tiled sharding: tile array over data dims then subgroup dims.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tiled {
    tiles: TileArray,
    data_rank: usize,
    subgroups: Vec<SubgroupType>,
}

/// An instruction's sharding: a leaf, or one leaf per leaf of a tuple shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InstrSharding {
    Single(Sharding),
    /// Shared: cloning never copies the leaves.
    Tuple(Arc<[Sharding]>),
}

fn type_rank(t: SubgroupType) -> u8 {
    match t {
        SubgroupType::Maximal => 0,
        SubgroupType::Manual => 1,
        SubgroupType::Unreduced => 2,
        SubgroupType::Replicated => 3,
    }
}

impl Tiled {
    pub fn tiles(&self) -> &TileArray {
        &self.tiles
    }
    pub fn data_rank(&self) -> usize {
        self.data_rank
    }
    /// Subgroup types of the trailing tile dims (canonical order).
    pub fn subgroups(&self) -> &[SubgroupType] {
        &self.subgroups
    }
    /// Tile counts of the data dims.
    pub fn data_dims(&self) -> &[i64] {
        &self.tiles.dims()[..self.data_rank]
    }
}

impl Sharding {
    /// A tiled sharding without subgroups (XLA's `HloSharding::Tile`); a
    /// single tile is replication.
    pub fn tile(tiles: TileArray) -> Sharding {
        if tiles.num_elements() == 1 {
            return Sharding::Replicated;
        }
        let r = tiles.num_dims();
        Sharding::Tiled(Arc::new(Tiled {
            tiles,
            data_rank: r,
            subgroups: Vec::new(),
        }))
    }

    /// A tiled sharding whose last tile dim is replication (`PartialTile`).
    pub fn partial_tile(tiles: TileArray) -> Sharding {
        let n = tiles.num_elements();
        let nd = tiles.num_dims();
        if nd <= 1 || tiles.dim(nd - 1) == n {
            return Sharding::Replicated;
        }
        let last = tiles.dim(nd - 1);
        if last == 1 {
            let dims = tiles.dims()[..nd - 1].to_vec();
            return Sharding::tile(tiles.reshape(dims));
        }
        Sharding::Tiled(Arc::new(Tiled {
            tiles: tiles.sort_groups(last as usize),
            data_rank: nd - 1,
            subgroups: vec![SubgroupType::Replicated],
        }))
    }

    /// A tiled sharding whose trailing `types.len()` tile dims are subgroups
    /// of the given types, normalized (XLA's `HloSharding::Subgroup`).
    pub fn subgroup(tiles: TileArray, types: &[SubgroupType]) -> Sharding {
        if types.is_empty() {
            return Sharding::tile(tiles);
        }
        let nd = tiles.num_dims();
        if types.len() > nd {
            return Sharding::tile(tiles);
        }
        let r = nd - types.len();
        let data_product: i64 = tiles.dims()[..r].iter().product();
        if types.iter().all(|&t| t == types[0]) && data_product == 1 {
            match types[0] {
                SubgroupType::Manual => return Sharding::Manual,
                SubgroupType::Replicated => return Sharding::Replicated,
                SubgroupType::Unreduced => return Sharding::Unreduced,
                SubgroupType::Maximal => {}
            }
        }
        // Drop size-1 subgroup dims, merge equal types, order the types.
        let mut by_type: [Vec<usize>; 4] = Default::default();
        let mut removed = Vec::new();
        let mut needs_merging = false;
        let mut distinct = 0;
        for (i, &t) in types.iter().enumerate() {
            let dim = r + i;
            if tiles.dim(dim) == 1 {
                removed.push(dim);
                needs_merging = true;
                continue;
            }
            let slot = &mut by_type[type_rank(t) as usize];
            if slot.is_empty() {
                distinct += 1;
            } else {
                needs_merging = true;
            }
            slot.push(dim);
        }
        // XLA sorts whenever there are several types.
        needs_merging |= distinct > 1;
        let (tiles, merged_types) = if needs_merging {
            let mut perm: Vec<usize> = (0..r).collect();
            let mut merged_shape: Vec<i64> = tiles.dims()[..r].to_vec();
            let mut merged_types = Vec::new();
            const ORDER: [SubgroupType; 4] = [
                SubgroupType::Maximal,
                SubgroupType::Manual,
                SubgroupType::Unreduced,
                SubgroupType::Replicated,
            ];
            for t in ORDER {
                let dims = &by_type[type_rank(t) as usize];
                if dims.is_empty() {
                    continue;
                }
                let mut size = 1;
                for &d in dims {
                    perm.push(d);
                    size *= tiles.dim(d);
                }
                merged_shape.push(size);
                merged_types.push(t);
            }
            perm.extend(removed.iter().copied());
            (tiles.transpose(&perm).reshape(merged_shape), merged_types)
        } else {
            (tiles, types.to_vec())
        };
        // create_sharding
        if merged_types.is_empty() {
            return Sharding::tile(tiles);
        }
        if merged_types == [SubgroupType::Replicated] {
            return Sharding::partial_tile(tiles);
        }
        let nd = tiles.num_dims();
        if merged_types == [SubgroupType::Manual] && tiles.num_elements() == tiles.dim(nd - 1) {
            return Sharding::Manual;
        }
        let tiles = if merged_types.last() == Some(&SubgroupType::Replicated) {
            let last = tiles.dim(nd - 1) as usize;
            tiles.sort_groups(last)
        } else {
            tiles
        };
        Sharding::Tiled(Arc::new(Tiled {
            data_rank: nd - merged_types.len(),
            tiles,
            subgroups: merged_types,
        }))
    }

    // ----- predicates (XLA's HloSharding leaf predicates) -----

    pub fn as_tiled(&self) -> Option<&Tiled> {
        match self {
            Sharding::Tiled(t) => Some(t),
            _ => None,
        }
    }
    /// Replicated or on a single device (XLA's `IsTileMaximal`: manual and
    /// unknown shardings are not tile-maximal).
    pub fn is_tile_maximal(&self) -> bool {
        matches!(self, Sharding::Replicated | Sharding::Maximal(_))
    }
    pub fn is_tiled(&self) -> bool {
        matches!(self, Sharding::Tiled(_))
    }
    pub fn is_replicated(&self) -> bool {
        matches!(self, Sharding::Replicated)
    }
    pub fn is_manual(&self) -> bool {
        matches!(self, Sharding::Manual)
    }
    pub fn is_unknown(&self) -> bool {
        matches!(self, Sharding::Unknown)
    }
    pub fn is_maximal_device(&self) -> bool {
        matches!(self, Sharding::Maximal(_))
    }
    /// Not on a single device (XLA's `IsSpatiallyPartitioned`: tiled,
    /// replicated, manual or unknown).
    pub fn is_spatially_partitioned(&self) -> bool {
        !matches!(self, Sharding::Maximal(_))
    }
    pub fn is_manual_subgroup(&self) -> bool {
        self.subgroups().contains(&SubgroupType::Manual)
    }
    pub fn subgroups(&self) -> &[SubgroupType] {
        match self {
            Sharding::Tiled(t) => &t.subgroups,
            _ => &[],
        }
    }
    /// XLA's `subgroup_types()`: empty for a plain partial tile.
    pub fn xla_subgroup_types(&self) -> &[SubgroupType] {
        if self.replicate_on_last_tile_dim() {
            &[]
        } else {
            self.subgroups()
        }
    }
    /// The only subgroup is replication (`last_tile_dim_replicate`).
    pub fn replicate_on_last_tile_dim(&self) -> bool {
        self.subgroups() == [SubgroupType::Replicated]
    }
    pub fn has_partial_replication(&self) -> bool {
        self.subgroups().contains(&SubgroupType::Replicated)
    }
    /// Data rank of a tiled sharding (0 for tile-maximal ones).
    pub fn tiled_data_rank(&self) -> usize {
        match self {
            Sharding::Tiled(t) => t.data_rank,
            _ => 0,
        }
    }
    fn subgroup_dim(&self, ty: SubgroupType) -> Option<usize> {
        let t = self.as_tiled()?;
        t.subgroups
            .iter()
            .position(|&s| s == ty)
            .map(|p| t.data_rank + p)
    }
    /// Tile dim index of the replication subgroup.
    pub fn replication_dim(&self) -> Option<usize> {
        self.subgroup_dim(SubgroupType::Replicated)
    }
    /// Tile dim index of the manual subgroup.
    pub fn manual_dim(&self) -> Option<usize> {
        self.subgroup_dim(SubgroupType::Manual)
    }
    /// Number of data tiles (1 for tile-maximal shardings).
    pub fn num_tiles(&self) -> i64 {
        match self {
            Sharding::Tiled(t) => t.data_dims().iter().product(),
            _ => 1,
        }
    }
    /// Number of entries of the tile array (1 for tile-maximal shardings).
    pub fn total_num_tiles(&self) -> i64 {
        match self {
            Sharding::Tiled(t) => t.tiles.num_elements(),
            _ => 1,
        }
    }
    /// Replication factor of a tiled sharding.
    pub fn replication(&self) -> i64 {
        match self.replication_dim() {
            Some(d) => self.tile_dims()[d],
            None => 1,
        }
    }
    /// All tile dims (empty for tile-maximal shardings).
    pub fn tile_dims(&self) -> &[i64] {
        match self {
            Sharding::Tiled(t) => t.tiles.dims(),
            _ => &[],
        }
    }
    /// Tile count of data dim `i` (1 when not tiled or out of range).
    pub fn tile_dim(&self, i: usize) -> i64 {
        match self {
            Sharding::Tiled(t) if i < t.tiles.num_dims() => t.tiles.dim(i),
            _ => 1,
        }
    }
    pub fn tiles(&self) -> Option<&TileArray> {
        self.as_tiled().map(|t| &t.tiles)
    }

    // ----- conversion -----

    /// Reads one IR leaf sharding (named shardings are converted through
    /// their mesh). Metadata and shard groups are dropped.
    pub fn from_ir(s: &SingleSharding) -> Result<Sharding, ShardingError> {
        Ok(match &s.kind {
            ShardingKind::Replicated => Sharding::Replicated,
            ShardingKind::Manual => Sharding::Manual,
            ShardingKind::Unknown => Sharding::Unknown,
            ShardingKind::Unreduced => Sharding::Unreduced,
            ShardingKind::Maximal(d) | ShardingKind::MaximalMesh(d) => Sharding::Maximal(*d),
            ShardingKind::Tiled {
                tile_assignment,
                replicate_on_last_tile_dim,
                last_tile_dims,
            } => {
                let tiles = TileArray::from_ir(tile_assignment)?;
                let mut types = last_tile_dims.clone();
                if *replicate_on_last_tile_dim {
                    types.push(SubgroupType::Replicated);
                }
                if types.len() > tiles.num_dims() {
                    return Err(ShardingError::Invalid(format!(
                        "{} subgroup dims but only {} tile dims",
                        types.len(),
                        tiles.num_dims()
                    )));
                }
                Sharding::subgroup(tiles, &types)
            }
            ShardingKind::Named(n) => crate::named::named_to_sharding(n)?,
        })
    }

    /// The IR form, with an iota tile assignment whenever one exists.
    pub fn to_ir(&self) -> SingleSharding {
        let kind = match self {
            Sharding::Replicated => ShardingKind::Replicated,
            Sharding::Manual => ShardingKind::Manual,
            Sharding::Unknown => ShardingKind::Unknown,
            Sharding::Unreduced => ShardingKind::Unreduced,
            Sharding::Maximal(d) => ShardingKind::Maximal(*d),
            Sharding::Tiled(t) => {
                let rolt = t.subgroups == [SubgroupType::Replicated];
                ShardingKind::Tiled {
                    tile_assignment: t.tiles.to_ir(),
                    replicate_on_last_tile_dim: rolt,
                    last_tile_dims: if rolt { vec![] } else { t.subgroups.clone() },
                }
            }
        };
        SingleSharding::new(kind)
    }
}

impl std::fmt::Display for Sharding {
    /// XLA's text (`{devices=[2,4]<=[8]}`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_ir())
    }
}

impl std::fmt::Display for InstrSharding {
    /// XLA's text, tuples as `{{...}, {...}}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.to_ir())
    }
}

/// Number of leaves XLA requires for a shape's tuple sharding.
pub fn leaf_count(shape: &Shape) -> usize {
    match shape {
        Shape::Tuple(e) => e.iter().map(leaf_count).sum(),
        _ => 1,
    }
}

impl InstrSharding {
    /// `sharding` on every leaf of `shape` (XLA's `HloSharding::Single`).
    pub fn single_for(shape: &Shape, sharding: Sharding) -> InstrSharding {
        match shape {
            Shape::Tuple(_) => {
                InstrSharding::Tuple(vec![sharding; leaf_count(shape).max(1)].into())
            }
            _ => InstrSharding::Single(sharding),
        }
    }
    pub fn leaves(&self) -> &[Sharding] {
        match self {
            InstrSharding::Single(s) => std::slice::from_ref(s),
            InstrSharding::Tuple(v) => v,
        }
    }
    /// A tuple sharding from its leaves.
    pub fn tuple(leaves: Vec<Sharding>) -> InstrSharding {
        InstrSharding::Tuple(leaves.into())
    }
    pub fn as_single(&self) -> Option<&Sharding> {
        match self {
            InstrSharding::Single(s) => Some(s),
            InstrSharding::Tuple(_) => None,
        }
    }
    pub fn is_tuple(&self) -> bool {
        matches!(self, InstrSharding::Tuple(_))
    }
    /// Any leaf is tiled or replicated.
    pub fn is_spatially_partitioned(&self) -> bool {
        self.leaves().iter().any(Sharding::is_spatially_partitioned)
    }
    /// Every leaf is manual.
    pub fn is_manual(&self) -> bool {
        self.leaves().iter().all(Sharding::is_manual)
    }
    /// Every leaf is replicated or on one device.
    pub fn is_tile_maximal(&self) -> bool {
        self.leaves().iter().all(Sharding::is_tile_maximal)
    }
    /// Every leaf is replicated.
    pub fn is_replicated(&self) -> bool {
        self.leaves().iter().all(Sharding::is_replicated)
    }
    pub fn is_unknown(&self) -> bool {
        self.leaves().iter().all(Sharding::is_unknown)
    }
    /// The sharding of tuple element `index` of `shape`.
    pub fn sub_sharding(&self, shape: &Shape, index: usize) -> Option<InstrSharding> {
        match (self, shape) {
            (InstrSharding::Single(s), Shape::Tuple(elems)) => {
                Some(InstrSharding::single_for(elems.get(index)?, s.clone()))
            }
            (InstrSharding::Tuple(leaves), Shape::Tuple(elems)) => {
                let elem = elems.get(index)?;
                let start: usize = elems[..index].iter().map(leaf_count).sum();
                let n = leaf_count(elem);
                let slice = leaves.get(start..start + n)?;
                Some(match elem {
                    Shape::Tuple(_) => InstrSharding::Tuple(slice.into()),
                    _ => InstrSharding::Single(slice[0].clone()),
                })
            }
            _ => None,
        }
    }
    /// Leaf offset of tuple element `index` in the flattened leaves.
    pub fn leaf_offset(shape: &Shape, index: usize) -> usize {
        shape.tuple_elements()[..index.min(shape.tuple_elements().len())]
            .iter()
            .map(leaf_count)
            .sum()
    }

    /// Reads an IR sharding for an instruction of `shape`: a single sharding
    /// on a tuple shape becomes one leaf per tuple leaf.
    pub fn from_ir(s: &HloSharding, shape: &Shape) -> Result<InstrSharding, ShardingError> {
        match s {
            HloSharding::Single(x) => Ok(InstrSharding::single_for(shape, Sharding::from_ir(x)?)),
            HloSharding::Tuple(v) => {
                if !shape.is_tuple() {
                    return Err(ShardingError::ShapeMismatch(
                        "tuple sharding on a non-tuple shape".into(),
                    ));
                }
                let leaves = v
                    .iter()
                    .map(Sharding::from_ir)
                    .collect::<Result<Vec<_>, _>>()?;
                let want = leaf_count(shape);
                if leaves.len() != want && !(want == 0 && leaves.len() <= 1) {
                    return Err(ShardingError::ShapeMismatch(format!(
                        "{} tuple sharding leaves for {want} shape leaves",
                        leaves.len()
                    )));
                }
                Ok(InstrSharding::Tuple(leaves.into()))
            }
        }
    }

    /// The IR form.
    pub fn to_ir(&self) -> HloSharding {
        match self {
            InstrSharding::Single(s) => HloSharding::Single(s.to_ir()),
            InstrSharding::Tuple(v) => HloSharding::Tuple(v.iter().map(Sharding::to_ir).collect()),
        }
    }
}

/// Checks that a leaf sharding fits an array shape of `rank`.
pub fn check_rank(s: &Sharding, rank: usize) -> Result<(), ShardingError> {
    match s {
        Sharding::Tiled(t) if t.data_rank != rank => Err(ShardingError::ShapeMismatch(format!(
            "sharding tiles {} dims, the shape has {rank}",
            t.data_rank
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_xla_text() {
        let s = Sharding::partial_tile(TileArray::iota(vec![2, 1, 4]));
        assert_eq!(
            s.to_string(),
            "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
        );
        let t = TileArray::iota(vec![2, 4]).transpose(&[1, 0]);
        assert_eq!(
            Sharding::tile(t).to_string(),
            "{devices=[4,2]<=[2,4]T(1,0)}"
        );
        let i = InstrSharding::tuple(vec![Sharding::Replicated, Sharding::Manual]);
        assert_eq!(i.to_string(), "{{replicated}, {manual}}");
    }

    #[test]
    fn subgroup_normalization() {
        // [2,1,4] replicate-last over iota: devices sorted per group.
        let s = Sharding::subgroup(TileArray::iota(vec![2, 1, 4]), &[SubgroupType::Replicated]);
        assert!(s.replicate_on_last_tile_dim());
        assert_eq!(s.num_tiles(), 2);
        // A replication dim of 1 disappears.
        let s = Sharding::partial_tile(TileArray::iota(vec![8, 1]));
        assert_eq!(s, Sharding::tile(TileArray::iota(vec![8])));
        // Everything replicated.
        assert_eq!(
            Sharding::partial_tile(TileArray::iota(vec![1, 8])),
            Sharding::Replicated
        );
        // {replicated, manual} is reordered to {manual, replicated}.
        let s = Sharding::subgroup(
            TileArray::iota(vec![2, 2, 2]),
            &[SubgroupType::Replicated, SubgroupType::Manual],
        );
        assert_eq!(
            s.subgroups(),
            &[SubgroupType::Manual, SubgroupType::Replicated]
        );
        assert_eq!(s.tiles().unwrap().devices(), &[0, 2, 1, 3, 4, 6, 5, 7]);
        // Manual only.
        assert_eq!(
            Sharding::subgroup(TileArray::iota(vec![1, 8]), &[SubgroupType::Manual]),
            Sharding::Manual
        );
    }
}
