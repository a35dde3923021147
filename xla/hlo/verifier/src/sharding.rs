//! Sharding well-formedness (XLA's `HloSharding::Validate`).
//!
//! - A tuple sharding has one leaf sharding per leaf of the tuple shape (an
//!   empty tuple takes zero or one); a single sharding on a tuple shape applies
//!   to every leaf (XLA's parser normalizes it so).
//! - Tiled: tile dimensions positive; the tile assignment holds exactly
//!   product(tile dims) devices (iota: product of the reshape dims, and the
//!   transpose a permutation); its rank is the shape's rank, plus one with
//!   `last_tile_dim_replicate`, plus one per `last_tile_dims` entry; devices
//!   are distinct and non-negative, and below `num_partitions` when the module
//!   has more than one partition.
//! - Maximal: the device is non-negative (and below `num_partitions` when > 1).
//! - Named (mesh) shardings: positive axis sizes with distinct names, device
//!   ids covering the mesh, one entry per dimension, axis references naming
//!   mesh axes (sub-axes dividing their axis), no axis used twice.
//! - No tile assignment or mesh of more than `MAX_DEVICES` devices.
//!
//! Shardings are checked whatever the state of the instruction's operands;
//! token-shaped instructions accept any sharding (as in XLA); device lists
//! are expanded only once their size is known to be within `MAX_DEVICES`.

use crate::header::MAX_DEVICES;
use crate::{show, At, Report};
use std::collections::HashSet;
use xla_hlo_ir::mesh::{iota_devices, AxisRef, Mesh, MeshDeviceIds};
use xla_hlo_ir::shape_inference::{checked_product, is_permutation};
use xla_hlo_ir::sharding::{NamedDims, NamedSharding};
use xla_hlo_ir::{HloSharding, Shape, ShardingKind, SingleSharding, TileAssignment};

pub(crate) fn check(at: &At, r: &mut Report) {
    let instr = at.instr();
    let Some(sharding) = &instr.sharding else {
        return;
    };
    let np = at.module.num_partitions();
    let shape = &instr.shape;
    if shape.is_token() {
        // XLA's `HloSharding::Validate` accepts any sharding on a token
        // (outfeeds carry the tuple sharding of their data and token).
        return;
    }
    match &**sharding {
        HloSharding::Single(s) => {
            if shape.is_tuple() {
                for leaf in shape.leaves() {
                    if let Err(e) = check_single(s, leaf, np) {
                        at.err(r, format!("sharding {sharding}: {e}"));
                        break;
                    }
                }
            } else if let Err(e) = check_single(s, shape, np) {
                at.err(r, format!("sharding {sharding}: {e}"));
            }
        }
        HloSharding::Tuple(elements) => {
            if !shape.is_tuple() {
                at.err(
                    r,
                    format!(
                        "tuple sharding with {} elements on the non-tuple shape {}",
                        elements.len(),
                        show(shape)
                    ),
                );
                return;
            }
            let leaves = shape.leaves();
            let count_ok =
                elements.len() == leaves.len() || (leaves.is_empty() && elements.len() == 1);
            if !count_ok {
                at.err(
                    r,
                    format!(
                        "tuple sharding has {} elements but the shape {} has {} leaves",
                        elements.len(),
                        show(shape),
                        leaves.len()
                    ),
                );
                return;
            }
            for (i, (s, leaf)) in elements.iter().zip(leaves).enumerate() {
                if let Err(e) = check_single(s, leaf, np) {
                    at.err(r, format!("sharding element {i} {s}: {e}"));
                }
            }
        }
    }
}

fn check_device(d: i64, np: i64) -> Result<(), String> {
    if d < 0 {
        return Err(format!("device {d} is negative"));
    }
    if np > 1 && d >= np {
        return Err(format!("device {d} is out of range for {np} partitions"));
    }
    Ok(())
}

fn check_devices(devices: &[i64], np: i64) -> Result<(), String> {
    let mut seen = HashSet::with_capacity(devices.len());
    for &d in devices {
        check_device(d, np)?;
        if !seen.insert(d) {
            return Err(format!("device {d} appears more than once"));
        }
    }
    Ok(())
}

/// Validates an iota device list and returns its device count.
fn iota_count(reshape_dims: &[i64], perm: &[i64]) -> Result<i64, String> {
    let n = checked_product(reshape_dims)
        .ok_or_else(|| format!("iota reshape dimensions {reshape_dims:?} must be positive"))?;
    if !perm.is_empty() && !is_permutation(perm, reshape_dims.len()) {
        return Err(format!(
            "iota transpose {perm:?} is not a permutation of {} dimensions",
            reshape_dims.len()
        ));
    }
    Ok(n)
}

/// The rank a sharding is checked against, `None` for shapes without one (tokens).
fn data_rank(shape: &Shape) -> Option<usize> {
    match shape {
        Shape::Array(a) if a.element_type.is_array_type() => Some(a.rank()),
        Shape::Buffer(b) => data_rank(b),
        _ => None,
    }
}

fn check_single(s: &SingleSharding, shape: &Shape, np: i64) -> Result<(), String> {
    match &s.kind {
        ShardingKind::Replicated
        | ShardingKind::Manual
        | ShardingKind::Unknown
        | ShardingKind::Unreduced => Ok(()),
        ShardingKind::Maximal(d) | ShardingKind::MaximalMesh(d) => check_device(*d, np),
        ShardingKind::Tiled {
            tile_assignment,
            replicate_on_last_tile_dim,
            last_tile_dims,
        } => {
            let dims = tile_assignment.dims();
            let n = checked_product(dims)
                .ok_or_else(|| format!("tile assignment dimensions {dims:?} must be positive"))?;
            let held = match tile_assignment {
                TileAssignment::Explicit { devices, .. } => devices.len() as i64,
                TileAssignment::Iota {
                    reshape_dims, perm, ..
                } => iota_count(reshape_dims, perm)?,
            };
            if held != n {
                return Err(format!(
                    "tile assignment {dims:?} needs {n} devices but lists {held}"
                ));
            }
            if n > MAX_DEVICES {
                return Err(format!(
                    "tile assignment of {n} devices is over the limit of {MAX_DEVICES}"
                ));
            }
            if let Some(rank) = data_rank(shape) {
                let want = rank + usize::from(*replicate_on_last_tile_dim) + last_tile_dims.len();
                if dims.len() != want {
                    return Err(format!(
                        "tile assignment has rank {} but the shape {} needs {want}",
                        dims.len(),
                        show(shape)
                    ));
                }
            }
            check_devices(&tile_assignment.devices(), np)?;
            Ok(())
        }
        ShardingKind::Named(ns) => check_named(ns, shape, np),
    }
}

/// Checks a mesh (of a sharding or a replica-group list); returns its size.
pub(crate) fn check_mesh(mesh: &Mesh, np: i64) -> Result<i64, String> {
    let mut names = HashSet::new();
    for (name, size) in &mesh.axes {
        if *size <= 0 {
            return Err(format!("mesh axis '{name}' has non-positive size {size}"));
        }
        if !names.insert(name.as_str()) {
            return Err(format!("mesh axis '{name}' appears twice"));
        }
    }
    let sizes: Vec<i64> = mesh.axes.iter().map(|a| a.1).collect();
    let n = checked_product(&sizes).ok_or_else(|| "mesh size overflows".to_string())?;
    if n > MAX_DEVICES {
        return Err(format!(
            "mesh of {n} devices is over the limit of {MAX_DEVICES}"
        ));
    }
    match &mesh.device_ids {
        None => {
            if np > 1 && n > np {
                return Err(format!("mesh of {n} devices exceeds {np} partitions"));
            }
        }
        Some(MeshDeviceIds::Explicit(ids)) => {
            if ids.len() as i64 != n {
                return Err(format!(
                    "mesh of {n} devices lists {} device ids",
                    ids.len()
                ));
            }
            check_devices(ids, np)?;
        }
        Some(MeshDeviceIds::Iota { reshape_dims, perm }) => {
            let held = iota_count(reshape_dims, perm)?;
            if held != n {
                return Err(format!("mesh of {n} devices has {held} iota device ids"));
            }
            check_devices(&iota_devices(reshape_dims, perm), np)?;
        }
    }
    Ok(n)
}

/// Checks that `a` names (a sub-axis dividing) an axis of `mesh`, not used before.
pub(crate) fn check_axis_ref(
    mesh: &Mesh,
    a: &AxisRef,
    used: &mut HashSet<AxisRef>,
) -> Result<(), String> {
    let Some(total) = mesh.axis_size(&a.name) else {
        return Err(format!("axis '{}' is not in the mesh", a.name));
    };
    if let Some((pre, size)) = a.sub_axis {
        let ok = pre > 0
            && size > 0
            && (pre as i128 * size as i128) <= total as i128
            && total % (pre * size) == 0;
        if !ok {
            return Err(format!(
                "sub-axis '{}':({pre}){size} does not divide the axis of size {total}",
                a.name
            ));
        }
    }
    if !used.insert(a.clone()) {
        return Err(format!("axis '{}' is used more than once", a.name));
    }
    Ok(())
}

fn check_named(ns: &NamedSharding, shape: &Shape, np: i64) -> Result<(), String> {
    check_mesh(&ns.mesh, np)?;
    let mut used = HashSet::new();
    if let NamedDims::Dims(dims) = &ns.dims {
        if let Some(rank) = data_rank(shape) {
            if dims.len() != rank {
                return Err(format!(
                    "{} dimension shardings for the rank-{rank} shape {}",
                    dims.len(),
                    show(shape)
                ));
            }
        }
        for d in dims {
            for a in &d.axes {
                check_axis_ref(&ns.mesh, a, &mut used)?;
            }
        }
    }
    let extra = ns
        .replicated_axes
        .iter()
        .flatten()
        .chain(ns.unreduced.iter().flat_map(|u| u.1.iter()))
        .chain(ns.manual_axes.iter().flatten());
    for a in extra {
        check_axis_ref(&ns.mesh, a, &mut used)?;
    }
    Ok(())
}
