//! Named device meshes as XLA prints them in mesh-axis replica groups and
//! named (V3) shardings: `mesh['x'=2,'y'=4]`, optional device ids, and axis
//! references with Shardy-style sub-axes (`'y':(2)2`).
//!
//! Invariant: a mesh's device order is `device_ids` when given, otherwise
//! `0..product(axis sizes)`; axis sizes are positive.

use std::fmt;

/// How a mesh lists its devices when they are not `0..n`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum MeshDeviceIds {
    /// `([2,4]T(1,0))`: iota over `reshape_dims`, transposed by `perm`, flattened.
    Iota {
        reshape_dims: Vec<i64>,
        perm: Vec<i64>,
    },
    /// `(0,2,1,3)`
    Explicit(Vec<i64>),
}

/// Where the `device_ids` were written (both spellings occur in XLA's text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceIdsPlacement {
    /// `mesh['a'=2, device_ids=(...)]`
    InsideBrackets,
    /// `mesh['a'=2], device_ids=(...)`
    AfterBrackets,
}

/// A named mesh: ordered axes with sizes, and the device order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Mesh {
    pub axes: Vec<(String, i64)>,
    pub device_ids: Option<MeshDeviceIds>,
    pub device_ids_placement: DeviceIdsPlacement,
}

/// A reference to a mesh axis, or to a sub-axis `'name':(pre_size)size`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AxisRef {
    pub name: String,
    pub sub_axis: Option<(i64, i64)>,
}

impl AxisRef {
    pub fn axis(name: impl Into<String>) -> AxisRef {
        AxisRef {
            name: name.into(),
            sub_axis: None,
        }
    }
}

/// Expands an iota device list: `iota(prod(reshape_dims)).reshape(reshape_dims).transpose(perm)`, flattened.
pub fn iota_devices(reshape_dims: &[i64], perm: &[i64]) -> Vec<i64> {
    let n: i64 = reshape_dims.iter().product();
    if perm.is_empty() {
        return (0..n).collect();
    }
    let rank = reshape_dims.len();
    // strides of the untransposed array
    let mut strides = vec![1i64; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * reshape_dims[d + 1];
    }
    let out_dims: Vec<i64> = perm.iter().map(|&p| reshape_dims[p as usize]).collect();
    let mut out = Vec::with_capacity(n.max(0) as usize);
    let mut index = vec![0i64; rank];
    for _ in 0..n {
        let src: i64 = (0..rank)
            .map(|d| index[d] * strides[perm[d] as usize])
            .sum();
        out.push(src);
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < out_dims[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

impl Mesh {
    pub fn new(axes: Vec<(String, i64)>) -> Mesh {
        Mesh {
            axes,
            device_ids: None,
            device_ids_placement: DeviceIdsPlacement::AfterBrackets,
        }
    }
    pub fn num_devices(&self) -> i64 {
        self.axes.iter().map(|a| a.1).product()
    }
    pub fn axis_size(&self, name: &str) -> Option<i64> {
        self.axes.iter().find(|a| a.0 == name).map(|a| a.1)
    }
    /// Device ids in mesh (row-major over the axes) order.
    pub fn devices(&self) -> Vec<i64> {
        match &self.device_ids {
            None => (0..self.num_devices()).collect(),
            Some(MeshDeviceIds::Explicit(ids)) => ids.clone(),
            Some(MeshDeviceIds::Iota { reshape_dims, perm }) => iota_devices(reshape_dims, perm),
        }
    }

    /// The mesh refined so that every sub-axis in `refs` is its own axis:
    /// returns the refined axis sizes (major to minor) and, for each ref, the
    /// index of the refined axis it names. `None` if a ref does not fit the mesh.
    pub fn refine(&self, refs: &[AxisRef]) -> Option<(Vec<i64>, Vec<usize>)> {
        if self.axes.iter().any(|a| a.1 <= 0) {
            return None;
        }
        // For each axis, the sorted split points (as pre-sizes) it must be cut at.
        let mut cuts: Vec<Vec<i64>> = self.axes.iter().map(|a| vec![1, a.1]).collect();
        for r in refs {
            let ai = self.axes.iter().position(|a| a.0 == r.name)?;
            if let Some((pre, size)) = r.sub_axis {
                let total = self.axes[ai].1;
                let end = pre.checked_mul(size).filter(|_| pre > 0 && size > 0)?;
                if total % end != 0 {
                    return None;
                }
                cuts[ai].push(pre);
                cuts[ai].push(end);
            }
        }
        let mut sizes = Vec::new();
        let mut starts: Vec<Vec<(i64, usize)>> = Vec::new();
        for c in cuts.iter_mut() {
            c.sort_unstable();
            c.dedup();
            let mut axis_starts = Vec::new();
            for w in c.windows(2) {
                if w[1] % w[0] != 0 {
                    return None;
                }
                axis_starts.push((w[0], sizes.len()));
                sizes.push(w[1] / w[0]);
            }
            starts.push(axis_starts);
        }
        let mut ids = Vec::new();
        for r in refs {
            let ai = self.axes.iter().position(|a| a.0 == r.name)?;
            match r.sub_axis {
                None => {
                    // a whole axis: only valid when it was not split
                    if starts[ai].len() != 1 {
                        return None;
                    }
                    ids.push(starts[ai][0].1);
                }
                Some((pre, size)) => {
                    let &(_, idx) = starts[ai].iter().find(|s| s.0 == pre)?;
                    if sizes[idx] != size {
                        return None;
                    }
                    ids.push(idx);
                }
            }
        }
        // Pieces ascend by pre-size, and a smaller pre-size is more major, so
        // `sizes` is already in major-to-minor order.
        let refined = sizes;
        let remap = ids;
        Some((refined, remap))
    }
}

impl fmt::Display for MeshDeviceIds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MeshDeviceIds::Iota { reshape_dims, perm } => {
                f.write_str("([")?;
                crate::shape::write_joined(f, reshape_dims, ",")?;
                f.write_str("]")?;
                if !perm.is_empty() {
                    f.write_str("T(")?;
                    crate::shape::write_joined(f, perm, ",")?;
                    f.write_str(")")?;
                }
                f.write_str(")")
            }
            MeshDeviceIds::Explicit(ids) => {
                f.write_str("(")?;
                crate::shape::write_joined(f, ids, ",")?;
                f.write_str(")")
            }
        }
    }
}

impl fmt::Display for Mesh {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mesh[")?;
        for (i, (name, size)) in self.axes.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "'{name}'={size}")?;
        }
        match (&self.device_ids, self.device_ids_placement) {
            (Some(ids), DeviceIdsPlacement::InsideBrackets) => write!(f, ", device_ids={ids}]"),
            (Some(ids), DeviceIdsPlacement::AfterBrackets) => write!(f, "], device_ids={ids}"),
            (None, _) => f.write_str("]"),
        }
    }
}

impl fmt::Display for AxisRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "'{}'", self.name)?;
        if let Some((pre, size)) = self.sub_axis {
            write!(f, ":({pre}){size}")?;
        }
        Ok(())
    }
}

/// Writes `{'a', 'b':(2)2}`.
pub fn write_axis_set(f: &mut fmt::Formatter<'_>, axes: &[AxisRef]) -> fmt::Result {
    f.write_str("{")?;
    crate::shape::write_joined(f, axes, ", ")?;
    f.write_str("}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iota_transpose() {
        assert_eq!(iota_devices(&[2, 4], &[1, 0]), vec![0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(iota_devices(&[8], &[]), (0..8).collect::<Vec<_>>());
    }

    #[test]
    fn refine_sub_axes() {
        let mesh = Mesh::new(vec![("a".into(), 2), ("b".into(), 4)]);
        let (sizes, ids) = mesh
            .refine(&[AxisRef {
                name: "b".into(),
                sub_axis: Some((2, 2)),
            }])
            .unwrap();
        // b splits into (1)2 major and (2)2 minor
        assert_eq!(sizes, vec![2, 2, 2]);
        assert_eq!(ids, vec![2]);
    }

    #[test]
    fn refine_rejects_bad_sizes_without_panicking() {
        let axis = |name: &str, sub_axis| AxisRef {
            name: name.into(),
            sub_axis,
        };
        let zero = Mesh::new(vec![("a".into(), 0), ("b".into(), 4)]);
        assert_eq!(zero.refine(&[axis("b", None)]), None);
        let mesh = Mesh::new(vec![("a".into(), 4)]);
        assert_eq!(mesh.refine(&[axis("a", Some((i64::MAX, 2)))]), None);
        assert_eq!(mesh.refine(&[axis("a", Some((0, 2)))]), None);
    }
}
