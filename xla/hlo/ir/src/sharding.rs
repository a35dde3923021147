//! `HloSharding` in every form XLA prints: replicated, maximal, manual,
//! unknown, unreduced, tiled (explicit or iota tile assignments, partial
//! replication, subgroups), tuple shardings, shard groups, and named (V3)
//! mesh shardings. Only representation lives here; the sharding algebra
//! (tiles, offsets, conversions) is a separate layer.
//!
//! Invariant: printing then parsing a sharding gives an equal value; the
//! representation (iota vs explicit) is kept as written.

use crate::mesh::{iota_devices, write_axis_set, AxisRef, Mesh};
use std::fmt;

/// A tile assignment: the device at each tile position.
// `PartialEq` is written out only to compare short lists inline; it is
// field-wise equality, as the derived `Hash` assumes.
#[allow(clippy::derived_hash_with_manual_eq)]
#[derive(Clone, Debug, Eq, Hash)]
pub enum TileAssignment {
    /// `devices=[2,2]0,2,1,3`
    Explicit { dims: Vec<i64>, devices: Vec<i64> },
    /// `devices=[4,2]<=[2,4]T(1,0)`; an empty `perm` means no transpose.
    Iota {
        dims: Vec<i64>,
        reshape_dims: Vec<i64>,
        perm: Vec<i64>,
    },
}

/// Equal integer lists; short ones (tile dims, iota reshapes) compared
/// inline, where a call to `memcmp` costs more than the comparison.
fn same_ints(a: &[i64], b: &[i64]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a.len() > 16 {
        return a == b;
    }
    a.iter().zip(b).all(|(x, y)| x == y)
}

impl PartialEq for TileAssignment {
    fn eq(&self, other: &TileAssignment) -> bool {
        match (self, other) {
            (
                TileAssignment::Explicit { dims, devices },
                TileAssignment::Explicit {
                    dims: other_dims,
                    devices: other_devices,
                },
            ) => same_ints(dims, other_dims) && same_ints(devices, other_devices),
            (
                TileAssignment::Iota {
                    dims,
                    reshape_dims,
                    perm,
                },
                TileAssignment::Iota {
                    dims: other_dims,
                    reshape_dims: other_reshape_dims,
                    perm: other_perm,
                },
            ) => {
                same_ints(dims, other_dims)
                    && same_ints(reshape_dims, other_reshape_dims)
                    && same_ints(perm, other_perm)
            }
            _ => false,
        }
    }
}

impl TileAssignment {
    pub fn dims(&self) -> &[i64] {
        match self {
            TileAssignment::Explicit { dims, .. } | TileAssignment::Iota { dims, .. } => dims,
        }
    }
    pub fn num_tiles(&self) -> i64 {
        self.dims().iter().product()
    }
    /// Devices in row-major tile order.
    pub fn devices(&self) -> Vec<i64> {
        match self {
            TileAssignment::Explicit { devices, .. } => devices.clone(),
            TileAssignment::Iota {
                reshape_dims, perm, ..
            } => iota_devices(reshape_dims, perm),
        }
    }
}

/// Type of a trailing subgroup tile dimension (`last_tile_dims={manual, replicated}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SubgroupType {
    Manual,
    Replicated,
    Maximal,
    Unreduced,
}

impl SubgroupType {
    pub fn name(self) -> &'static str {
        match self {
            SubgroupType::Manual => "manual",
            SubgroupType::Replicated => "replicated",
            SubgroupType::Maximal => "maximal",
            SubgroupType::Unreduced => "unreduced",
        }
    }
    pub fn from_name(s: &str) -> Option<SubgroupType> {
        Some(match s {
            "manual" => SubgroupType::Manual,
            "replicated" => SubgroupType::Replicated,
            "maximal" => SubgroupType::Maximal,
            "unreduced" => SubgroupType::Unreduced,
            _ => return None,
        })
    }
}

/// `shard_as N` / `shard_like N`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShardGroup {
    As(i64),
    Like(i64),
}

/// One dimension of a named sharding: its axes, and whether it is open (`?`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NamedDim {
    pub axes: Vec<AxisRef>,
    pub open: bool,
}

/// The per-dimension part of a named sharding.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NamedDims {
    /// `[{'a'}, {}]`
    Dims(Vec<NamedDim>),
    /// `replicated`
    Replicated,
    /// `manual`
    Manual,
}

/// A named (V3, Shardy-style) sharding: `{mesh['a'=2,'b'=4], [{'a'}, {'b'}]}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NamedSharding {
    pub mesh: Mesh,
    pub dims: NamedDims,
    pub replicated_axes: Option<Vec<AxisRef>>,
    /// `unreduced[=op]{...}`: the reduction, if written, and the axes.
    pub unreduced: Option<(Option<String>, Vec<AxisRef>)>,
    pub manual_axes: Option<Vec<AxisRef>>,
}

/// The kind of a single (non-tuple) sharding.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ShardingKind {
    Replicated,
    Manual,
    Unknown,
    Unreduced,
    /// `{maximal device=N}`
    Maximal(i64),
    /// `{maximal_mesh[device_id=N]}`
    MaximalMesh(i64),
    Tiled {
        tile_assignment: TileAssignment,
        /// `last_tile_dim_replicate`
        replicate_on_last_tile_dim: bool,
        /// `last_tile_dims={...}`: types of the trailing tile dims.
        last_tile_dims: Vec<SubgroupType>,
    },
    Named(NamedSharding),
}

/// A non-tuple sharding with its shard group and metadata.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SingleSharding {
    pub kind: ShardingKind,
    pub shard_group: Option<ShardGroup>,
    /// Verbatim `metadata=...` value text, when present.
    pub metadata: Option<String>,
}

impl SingleSharding {
    pub fn new(kind: ShardingKind) -> SingleSharding {
        SingleSharding {
            kind,
            shard_group: None,
            metadata: None,
        }
    }
}

/// An instruction's sharding.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
// Single is the common case and is cloned onto many instructions; boxing it
// would add an allocation per sharding to save space only in tuples.
#[allow(clippy::large_enum_variant)]
pub enum HloSharding {
    Single(SingleSharding),
    /// One sharding per leaf of the tuple shape, depth-first.
    Tuple(Vec<SingleSharding>),
}

impl HloSharding {
    pub fn replicated() -> HloSharding {
        HloSharding::Single(SingleSharding::new(ShardingKind::Replicated))
    }
    pub fn manual() -> HloSharding {
        HloSharding::Single(SingleSharding::new(ShardingKind::Manual))
    }
    /// A tiled sharding with an iota tile assignment `devices=[dims]<=[n]`.
    pub fn iota_tiled(dims: Vec<i64>, replicate_on_last_tile_dim: bool) -> HloSharding {
        let n = dims.iter().product();
        HloSharding::Single(SingleSharding::new(ShardingKind::Tiled {
            tile_assignment: TileAssignment::Iota {
                dims,
                reshape_dims: vec![n],
                perm: vec![],
            },
            replicate_on_last_tile_dim,
            last_tile_dims: vec![],
        }))
    }
    /// The leaf shardings (a single sharding is its own only leaf).
    pub fn leaves(&self) -> &[SingleSharding] {
        match self {
            HloSharding::Single(s) => std::slice::from_ref(s),
            HloSharding::Tuple(v) => v,
        }
    }
    pub fn is_tuple(&self) -> bool {
        matches!(self, HloSharding::Tuple(_))
    }
}

impl fmt::Display for TileAssignment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("devices=[")?;
        crate::shape::write_joined(f, self.dims(), ",")?;
        f.write_str("]")?;
        match self {
            TileAssignment::Explicit { devices, .. } => crate::shape::write_joined(f, devices, ","),
            TileAssignment::Iota {
                reshape_dims, perm, ..
            } => {
                f.write_str("<=[")?;
                crate::shape::write_joined(f, reshape_dims, ",")?;
                f.write_str("]")?;
                if !perm.is_empty() {
                    f.write_str("T(")?;
                    crate::shape::write_joined(f, perm, ",")?;
                    f.write_str(")")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for NamedSharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, ", self.mesh)?;
        match &self.dims {
            NamedDims::Replicated => f.write_str("replicated")?,
            NamedDims::Manual => f.write_str("manual")?,
            NamedDims::Dims(dims) => {
                f.write_str("[")?;
                for (i, d) in dims.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write_axis_set(f, &d.axes)?;
                    if d.open {
                        f.write_str("?")?;
                    }
                }
                f.write_str("]")?;
            }
        }
        if let Some(axes) = &self.replicated_axes {
            f.write_str(", replicated=")?;
            write_axis_set(f, axes)?;
        }
        if let Some((op, axes)) = &self.unreduced {
            f.write_str(", unreduced")?;
            if let Some(op) = op {
                write!(f, "={op}")?;
            }
            write_axis_set(f, axes)?;
        }
        if let Some(axes) = &self.manual_axes {
            f.write_str(", manual=")?;
            write_axis_set(f, axes)?;
        }
        Ok(())
    }
}

impl SingleSharding {
    /// Writes the sharding without its enclosing braces.
    fn write_body(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ShardingKind::Replicated => f.write_str("replicated")?,
            ShardingKind::Manual => f.write_str("manual")?,
            ShardingKind::Unknown => f.write_str("unknown")?,
            ShardingKind::Unreduced => f.write_str("unreduced")?,
            ShardingKind::Maximal(d) => write!(f, "maximal device={d}")?,
            ShardingKind::MaximalMesh(d) => write!(f, "maximal_mesh[device_id={d}]")?,
            ShardingKind::Tiled {
                tile_assignment,
                replicate_on_last_tile_dim,
                last_tile_dims,
            } => {
                write!(f, "{tile_assignment}")?;
                if *replicate_on_last_tile_dim {
                    f.write_str(" last_tile_dim_replicate")?;
                }
                if !last_tile_dims.is_empty() {
                    f.write_str(" last_tile_dims={")?;
                    for (i, t) in last_tile_dims.iter().enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        f.write_str(t.name())?;
                    }
                    f.write_str("}")?;
                }
            }
            ShardingKind::Named(n) => write!(f, "{n}")?,
        }
        match self.shard_group {
            Some(ShardGroup::As(id)) => write!(f, " shard_as {id}")?,
            Some(ShardGroup::Like(id)) => write!(f, " shard_like {id}")?,
            None => {}
        }
        if let Some(m) = &self.metadata {
            write!(f, " metadata={m}")?;
        }
        Ok(())
    }
}

impl fmt::Display for SingleSharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        self.write_body(f)?;
        f.write_str("}")
    }
}

impl fmt::Display for HloSharding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HloSharding::Single(s) => write!(f, "{s}"),
            HloSharding::Tuple(elements) => {
                f.write_str("{")?;
                for (i, e) in elements.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                        if i % 5 == 0 {
                            write!(f, "/*index={i}*/")?;
                        }
                    }
                    write!(f, "{e}")?;
                }
                f.write_str("}")
            }
        }
    }
}
