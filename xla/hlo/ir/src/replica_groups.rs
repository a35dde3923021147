//! Collective device lists (`replica_groups=`) in XLA's three spellings:
//! explicit lists, iota lists and mesh-axis lists; all expand to explicit groups.
//!
//! Invariant: `groups()` returns the same groups XLA would build for the
//! representation; an empty explicit list means "all devices in one group",
//! which callers resolve with the participant count they know.

use crate::mesh::{iota_devices, write_axis_set, AxisRef, Mesh};
use std::fmt;

/// A `replica_groups=` value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CollectiveDeviceList {
    /// `{{0,1},{2,3}}`; `{}` is one group of every participant.
    Explicit(Vec<Vec<i64>>),
    /// `[num_groups,group_size]<=[reshape_dims]T(perm)`.
    Iota {
        num_groups: i64,
        group_size: i64,
        reshape_dims: Vec<i64>,
        perm: Vec<i64>,
    },
    /// `mesh['a'=2,'b'=4] {'b'}`: groups vary over the listed axes.
    MeshAxes { mesh: Mesh, axes: Vec<AxisRef> },
}

impl CollectiveDeviceList {
    /// The groups as explicit device-id lists. `None` when a mesh-axis list
    /// names an axis the mesh does not have.
    pub fn groups(&self) -> Option<Vec<Vec<i64>>> {
        match self {
            CollectiveDeviceList::Explicit(groups) => Some(groups.clone()),
            CollectiveDeviceList::Iota {
                num_groups,
                group_size,
                reshape_dims,
                perm,
            } => {
                let devices = iota_devices(reshape_dims, perm);
                if (*num_groups * *group_size) as usize != devices.len() || *group_size <= 0 {
                    return None;
                }
                Some(
                    devices
                        .chunks(*group_size as usize)
                        .map(|c| c.to_vec())
                        .collect(),
                )
            }
            CollectiveDeviceList::MeshAxes { mesh, axes } => mesh_axis_groups(mesh, axes),
        }
    }
}

/// Groups of a mesh-axis list: devices that differ only in the listed axes
/// form a group (ordered by the listed axes, major first); groups are ordered
/// row-major over the remaining axes.
pub fn mesh_axis_groups(mesh: &Mesh, axes: &[AxisRef]) -> Option<Vec<Vec<i64>>> {
    let (sizes, in_group) = mesh.refine(axes)?;
    let devices = mesh.devices();
    let total: i64 = sizes.iter().product();
    if devices.len() as i64 != total {
        return None;
    }
    let rank = sizes.len();
    let mut strides = vec![1i64; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * sizes[d + 1];
    }
    let outer: Vec<usize> = (0..rank).filter(|d| !in_group.contains(d)).collect();
    let enumerate = |dims: &[usize]| -> Vec<i64> {
        // flat offsets of every index over `dims`, row-major
        let mut offsets = vec![0i64];
        for &d in dims {
            let mut next = Vec::with_capacity(offsets.len() * sizes[d] as usize);
            for &o in &offsets {
                for i in 0..sizes[d] {
                    next.push(o + i * strides[d]);
                }
            }
            offsets = next;
        }
        offsets
    };
    let group_offsets = enumerate(&in_group);
    let outer_offsets = enumerate(&outer);
    Some(
        outer_offsets
            .iter()
            .map(|&o| {
                group_offsets
                    .iter()
                    .map(|&g| devices[(o + g) as usize])
                    .collect()
            })
            .collect(),
    )
}

impl fmt::Display for CollectiveDeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CollectiveDeviceList::Explicit(groups) => {
                f.write_str("{")?;
                for (i, g) in groups.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str("{")?;
                    crate::shape::write_joined(f, g, ",")?;
                    f.write_str("}")?;
                }
                f.write_str("}")
            }
            CollectiveDeviceList::Iota {
                num_groups,
                group_size,
                reshape_dims,
                perm,
            } => {
                write!(f, "[{num_groups},{group_size}]<=[")?;
                crate::shape::write_joined(f, reshape_dims, ",")?;
                f.write_str("]")?;
                if !perm.is_empty() {
                    f.write_str("T(")?;
                    crate::shape::write_joined(f, perm, ",")?;
                    f.write_str(")")?;
                }
                Ok(())
            }
            CollectiveDeviceList::MeshAxes { mesh, axes } => {
                write!(f, "{mesh} ")?;
                write_axis_set(f, axes)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::{DeviceIdsPlacement, MeshDeviceIds};

    #[test]
    fn iota_groups() {
        let g = CollectiveDeviceList::Iota {
            num_groups: 2,
            group_size: 4,
            reshape_dims: vec![4, 2],
            perm: vec![1, 0],
        };
        assert_eq!(
            g.groups().unwrap(),
            vec![vec![0, 2, 4, 6], vec![1, 3, 5, 7]]
        );
    }

    #[test]
    fn mesh_groups() {
        let mesh = Mesh::new(vec![("axis_0".into(), 2), ("axis_1".into(), 4)]);
        let g = mesh_axis_groups(&mesh, &[AxisRef::axis("axis_1")]).unwrap();
        assert_eq!(g, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
        let g = mesh_axis_groups(&mesh, &[AxisRef::axis("axis_0")]).unwrap();
        assert_eq!(g, vec![vec![0, 4], vec![1, 5], vec![2, 6], vec![3, 7]]);
        let mesh = Mesh {
            axes: vec![("a".into(), 4), ("b".into(), 2)],
            device_ids: Some(MeshDeviceIds::Iota {
                reshape_dims: vec![2, 4],
                perm: vec![1, 0],
            }),
            device_ids_placement: DeviceIdsPlacement::AfterBrackets,
        };
        // devices in mesh order: 0,4,1,5,2,6,3,7 over [a=4,b=2]
        let g = mesh_axis_groups(&mesh, &[AxisRef::axis("a")]).unwrap();
        assert_eq!(g, vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]);
    }
}
