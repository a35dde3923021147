//! Named meshes and partition specs, in the style of JAX's
//! `Mesh`/`PartitionSpec` and Shardy's axis-based shardings: named axes,
//! several axes on one dimension (major first), sub-axes `'x':(pre)size`,
//! manual and unreduced axes; conversion to and from `Sharding`, and from
//! the IR's named (V3) shardings.
//!
//! Invariants: a `NamedMesh` has positive axis sizes, distinct names and a
//! device list that is a permutation of `0..n` (mesh order is row-major over
//! the axes). `NamedMesh::sharding` and `NamedMesh::spec_of` are inverse up
//! to the canonical spec: `spec_of` returns sub-axes merged where possible
//! and is only `Some` when converting the spec back gives the same sharding.

use crate::error::ShardingError;
use crate::sharding::Sharding;
use crate::tile::TileArray;
use xla_hlo_ir::mesh::{AxisRef, Mesh, MeshDeviceIds};
use xla_hlo_ir::sharding::{NamedDims, NamedSharding, SubgroupType};

/// A device mesh with named axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedMesh {
    axes: Vec<(String, i64)>,
    devices: Vec<i64>,
}

/// Which mesh axes shard each dimension, plus manual and unreduced axes;
/// axes not mentioned are replicated.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PartitionSpec {
    /// Per dimension, the axes tiling it, major first.
    pub dims: Vec<Vec<AxisRef>>,
    /// Axes over which the value is manually partitioned.
    pub manual: Vec<AxisRef>,
    /// Axes over which the value holds partial sums.
    pub unreduced: Vec<AxisRef>,
}

impl PartitionSpec {
    /// A spec from per-dimension axis names (`[["x"], [], ["y","z"]]`).
    pub fn from_names(dims: &[&[&str]]) -> PartitionSpec {
        PartitionSpec {
            dims: dims
                .iter()
                .map(|d| d.iter().map(|n| AxisRef::axis(*n)).collect())
                .collect(),
            ..PartitionSpec::default()
        }
    }
}

/// One refined piece of a mesh axis: `(axis, pre_size, size)`.
type Piece = (usize, i64, i64);

impl NamedMesh {
    /// A mesh with devices `0..n` in row-major axis order.
    pub fn new(axes: Vec<(String, i64)>) -> Result<NamedMesh, ShardingError> {
        let n = axes.iter().map(|a| a.1).product::<i64>();
        NamedMesh::with_devices(axes, (0..n).collect())
    }

    /// A mesh with an explicit device order.
    pub fn with_devices(
        axes: Vec<(String, i64)>,
        devices: Vec<i64>,
    ) -> Result<NamedMesh, ShardingError> {
        if axes.iter().any(|a| a.1 < 1) {
            return Err(ShardingError::Mesh("axis sizes must be positive".into()));
        }
        for (i, a) in axes.iter().enumerate() {
            if axes[..i].iter().any(|b| b.0 == a.0) {
                return Err(ShardingError::Mesh(format!("axis '{}' named twice", a.0)));
            }
        }
        let n = axes
            .iter()
            .try_fold(1i64, |p, a| p.checked_mul(a.1))
            .ok_or_else(|| ShardingError::Mesh("mesh too large".into()))?;
        if devices.len() as i64 != n {
            return Err(ShardingError::Mesh(format!(
                "{} device ids for a mesh of {n}",
                devices.len()
            )));
        }
        let mut seen = vec![false; devices.len()];
        for &d in &devices {
            if d < 0 || d >= n || std::mem::replace(&mut seen[d as usize], true) {
                return Err(ShardingError::Mesh(format!(
                    "device ids must be a permutation of 0..{n}"
                )));
            }
        }
        Ok(NamedMesh { axes, devices })
    }

    /// Reads an IR mesh (`mesh['x'=2,'y'=4], device_ids=...`).
    pub fn from_ir(mesh: &Mesh) -> Result<NamedMesh, ShardingError> {
        let devices = match &mesh.device_ids {
            None => (0..mesh.num_devices()).collect(),
            Some(MeshDeviceIds::Explicit(v)) => v.clone(),
            Some(MeshDeviceIds::Iota { reshape_dims, perm }) => {
                let n: i64 = reshape_dims.iter().product();
                if n != mesh.num_devices() || (!perm.is_empty() && perm.len() != reshape_dims.len())
                {
                    return Err(ShardingError::Mesh(
                        "mesh device ids do not cover the mesh".into(),
                    ));
                }
                TileArray::from_ir(&xla_hlo_ir::TileAssignment::Iota {
                    dims: vec![n],
                    reshape_dims: reshape_dims.clone(),
                    perm: perm.clone(),
                })?
                .devices()
                .to_vec()
            }
        };
        NamedMesh::with_devices(mesh.axes.clone(), devices)
    }

    /// The IR mesh.
    pub fn to_ir(&self) -> Mesh {
        let mut m = Mesh::new(self.axes.clone());
        if self.devices.iter().enumerate().any(|(i, &d)| i as i64 != d) {
            let t =
                TileArray::from_parts(vec![self.devices.len() as i64], self.devices.clone().into());
            m.device_ids = Some(match t.to_iota() {
                Some((r, p)) if !p.is_empty() => MeshDeviceIds::Iota {
                    reshape_dims: r,
                    perm: p,
                },
                _ => MeshDeviceIds::Explicit(self.devices.clone()),
            });
        }
        m
    }

    pub fn axes(&self) -> &[(String, i64)] {
        &self.axes
    }
    pub fn devices(&self) -> &[i64] {
        &self.devices
    }
    pub fn num_devices(&self) -> i64 {
        self.devices.len() as i64
    }

    fn axis_index(&self, name: &str) -> Result<usize, ShardingError> {
        self.axes
            .iter()
            .position(|a| a.0 == name)
            .ok_or_else(|| ShardingError::Mesh(format!("no mesh axis '{name}'")))
    }

    /// The refined pieces a reference covers, given every axis's cut points.
    fn pieces_of(&self, r: &AxisRef, cuts: &[Vec<i64>]) -> Result<Vec<Piece>, ShardingError> {
        let a = self.axis_index(&r.name)?;
        let size = self.axes[a].1;
        let (lo, hi) = match r.sub_axis {
            None => (1, size),
            Some((pre, k)) => (pre, pre * k),
        };
        let c = &cuts[a];
        let mut out = Vec::new();
        for w in c.windows(2) {
            if w[0] >= lo && w[1] <= hi {
                out.push((a, w[0], w[1] / w[0]));
            }
        }
        Ok(out)
    }

    /// The sharding a partition spec denotes on this mesh.
    pub fn sharding(&self, spec: &PartitionSpec) -> Result<Sharding, ShardingError> {
        // Cut every axis at the sub-axis boundaries used anywhere.
        let mut cuts: Vec<Vec<i64>> = self.axes.iter().map(|a| vec![1, a.1]).collect();
        let all = spec
            .dims
            .iter()
            .flatten()
            .chain(spec.manual.iter())
            .chain(spec.unreduced.iter());
        for r in all.clone() {
            let a = self.axis_index(&r.name)?;
            if let Some((pre, k)) = r.sub_axis {
                if pre < 1 || k < 1 || self.axes[a].1 % (pre * k) != 0 {
                    return Err(ShardingError::Mesh(format!(
                        "sub-axis '{}':({pre}){k} does not divide the axis of size {}",
                        r.name, self.axes[a].1
                    )));
                }
                cuts[a].push(pre);
                cuts[a].push(pre * k);
            }
        }
        for c in cuts.iter_mut() {
            c.sort_unstable();
            c.dedup();
            if c.windows(2).any(|w| w[1] % w[0] != 0) {
                return Err(ShardingError::Mesh("overlapping sub-axes".into()));
            }
        }
        // Refined mesh: pieces in major-to-minor order.
        let mut pieces: Vec<Piece> = Vec::new();
        for (a, c) in cuts.iter().enumerate() {
            // A smaller pre-size is more major.
            for w in c.windows(2) {
                pieces.push((a, w[0], w[1] / w[0]));
            }
        }
        let index_of = |p: &Piece| pieces.iter().position(|q| q == p);
        let mut used = vec![false; pieces.len()];
        let mut take = |refs: &[AxisRef]| -> Result<(Vec<usize>, i64), ShardingError> {
            let mut ids = Vec::new();
            let mut prod = 1;
            for r in refs {
                let ps = self.pieces_of(r, &cuts)?;
                for p in ps {
                    let i =
                        index_of(&p).ok_or_else(|| ShardingError::Mesh("bad sub-axis".into()))?;
                    if std::mem::replace(&mut used[i], true) {
                        return Err(ShardingError::Mesh(format!("axis '{}' used twice", r.name)));
                    }
                    prod *= p.2;
                    ids.push(i);
                }
            }
            Ok((ids, prod))
        };
        let mut perm: Vec<usize> = Vec::new();
        let mut shape: Vec<i64> = Vec::new();
        for d in &spec.dims {
            let (ids, prod) = take(d)?;
            perm.extend(ids);
            shape.push(prod);
        }
        let (mids, mprod) = take(&spec.manual)?;
        let (uids, uprod) = take(&spec.unreduced)?;
        perm.extend(mids);
        perm.extend(uids);
        let rest: Vec<usize> = (0..pieces.len()).filter(|&i| !used[i]).collect();
        let rprod: i64 = rest.iter().map(|&i| pieces[i].2).product();
        perm.extend(rest);
        let mesh_tiles = TileArray::from_parts(
            pieces.iter().map(|p| p.2).collect(),
            self.devices.clone().into(),
        );
        let moved = mesh_tiles.transpose(&perm);
        let mut types = Vec::new();
        for (size, ty) in [
            (mprod, SubgroupType::Manual),
            (uprod, SubgroupType::Unreduced),
            (rprod, SubgroupType::Replicated),
        ] {
            shape.push(size);
            types.push(ty);
        }
        Ok(Sharding::subgroup(moved.reshape(shape), &types))
    }

    /// The canonical partition spec of `s` (on an array of `rank` dims) on
    /// this mesh, when it is expressible with this mesh's axes.
    pub fn spec_of(&self, s: &Sharding, rank: usize) -> Option<PartitionSpec> {
        let all_axes = || -> Vec<AxisRef> {
            self.axes
                .iter()
                .map(|a| AxisRef::axis(a.0.clone()))
                .collect()
        };
        let spec = match s {
            Sharding::Replicated => PartitionSpec {
                dims: vec![vec![]; rank],
                ..Default::default()
            },
            Sharding::Manual => PartitionSpec {
                dims: vec![vec![]; rank],
                manual: all_axes(),
                ..Default::default()
            },
            Sharding::Unreduced => PartitionSpec {
                dims: vec![vec![]; rank],
                unreduced: all_axes(),
                ..Default::default()
            },
            Sharding::Tiled(t) => {
                if t.data_rank() != rank || t.tiles().num_elements() != self.num_devices() {
                    return None;
                }
                self.decompose(t)?
            }
            _ => return None,
        };
        match self.sharding(&spec) {
            Ok(back) if &back == s => Some(spec),
            _ => None,
        }
    }

    fn decompose(&self, t: &crate::sharding::Tiled) -> Option<PartitionSpec> {
        let n = self.devices.len();
        let mut pos_of = vec![0i64; n];
        for (p, &d) in self.devices.iter().enumerate() {
            pos_of[d as usize] = p as i64;
        }
        let mut positions: Vec<i64> = t
            .tiles()
            .devices()
            .iter()
            .map(|&d| pos_of.get(d as usize).copied())
            .collect::<Option<_>>()?;
        if let Some(rd) = t
            .subgroups()
            .iter()
            .position(|&x| x == SubgroupType::Replicated)
        {
            if rd + 1 == t.subgroups().len() {
                let g = t.tiles().dims()[t.data_rank() + rd] as usize;
                for c in positions.chunks_mut(g) {
                    c.sort_unstable();
                }
            }
        }
        let (reshape, perm) = TileArray::new(vec![n as i64], positions).ok()?.to_iota()?;
        // Segments in tile (major-first) order as (stride, size).
        let rstr = crate::tile::strides(&reshape);
        let segs: Vec<(i64, i64)> = if perm.is_empty() {
            vec![(1, n as i64)]
        } else {
            perm.iter()
                .map(|&p| (rstr[p as usize], reshape[p as usize]))
                .collect()
        };
        // Mesh axis strides.
        let sizes: Vec<i64> = self.axes.iter().map(|a| a.1).collect();
        let astr = crate::tile::strides(&sizes);
        // Split segments at axis boundaries: pieces (axis, local_stride, size).
        let mut pieces: Vec<(usize, i64, i64)> = Vec::new();
        for &(s, k) in &segs {
            let (lo, hi) = (s, s * k);
            for a in 0..self.axes.len() {
                let (alo, ahi) = (astr[a], astr[a] * sizes[a]);
                let plo = lo.max(alo);
                let phi = hi.min(ahi);
                if plo < phi {
                    if phi % plo != 0 {
                        return None;
                    }
                    pieces.push((a, plo / alo, phi / plo));
                }
            }
        }
        // Assign pieces to tile dims in order.
        let tdims = t.tiles().dims();
        let mut per_dim: Vec<Vec<(usize, i64, i64)>> = vec![Vec::new(); tdims.len()];
        let mut it = pieces.into_iter();
        let mut pending: Option<(usize, i64, i64)> = None;
        for (d, &want) in tdims.iter().enumerate() {
            let mut need = want;
            while need > 1 {
                let p = pending.take().or_else(|| it.next())?;
                if p.2 <= need {
                    if need % p.2 != 0 {
                        return None;
                    }
                    need /= p.2;
                    per_dim[d].push(p);
                } else {
                    if p.2 % need != 0 {
                        return None;
                    }
                    // Major part (larger stride) goes to this dim.
                    per_dim[d].push((p.0, p.1 * (p.2 / need), need));
                    pending = Some((p.0, p.1, p.2 / need));
                    need = 1;
                }
            }
        }
        let to_ref = |(a, ls, k): (usize, i64, i64)| -> AxisRef {
            let size = sizes[a];
            let pre = size / (ls * k);
            AxisRef {
                name: self.axes[a].0.clone(),
                sub_axis: if pre == 1 && k == size {
                    None
                } else {
                    Some((pre, k))
                },
            }
        };
        let merge = |v: &[(usize, i64, i64)]| -> Vec<AxisRef> {
            let mut out: Vec<(usize, i64, i64)> = Vec::new();
            for &p in v {
                if let Some(last) = out.last_mut() {
                    // Same axis, contiguous: major part's local stride is the
                    // minor part's stride times its size.
                    if last.0 == p.0 && last.1 == p.1 * p.2 {
                        *last = (p.0, p.1, last.2 * p.2);
                        continue;
                    }
                }
                out.push(p);
            }
            out.into_iter().map(to_ref).collect()
        };
        let r = t.data_rank();
        let mut spec = PartitionSpec {
            dims: per_dim[..r].iter().map(|v| merge(v)).collect(),
            ..Default::default()
        };
        for (i, ty) in t.subgroups().iter().enumerate() {
            let refs = merge(&per_dim[r + i]);
            match ty {
                SubgroupType::Manual => spec.manual = refs,
                SubgroupType::Unreduced => spec.unreduced = refs,
                SubgroupType::Replicated => {}
                SubgroupType::Maximal => return None,
            }
        }
        Some(spec)
    }

    /// The IR named (V3) form of `s` on this mesh, when expressible.
    pub fn to_named_ir(&self, s: &Sharding, rank: usize) -> Option<NamedSharding> {
        let spec = self.spec_of(s, rank)?;
        let dims = match s {
            Sharding::Replicated => NamedDims::Replicated,
            Sharding::Manual => NamedDims::Manual,
            _ => NamedDims::Dims(
                spec.dims
                    .into_iter()
                    .map(|axes| xla_hlo_ir::sharding::NamedDim { axes, open: false })
                    .collect(),
            ),
        };
        Some(NamedSharding {
            mesh: self.to_ir(),
            dims,
            replicated_axes: None,
            unreduced: if spec.unreduced.is_empty() {
                None
            } else {
                Some((None, spec.unreduced))
            },
            manual_axes: if spec.manual.is_empty() || matches!(s, Sharding::Manual) {
                None
            } else {
                Some(spec.manual)
            },
        })
    }
}

/// Converts an IR named (V3) sharding to the algebraic form.
pub fn named_to_sharding(ns: &NamedSharding) -> Result<Sharding, ShardingError> {
    let mesh = NamedMesh::from_ir(&ns.mesh)?;
    match &ns.dims {
        NamedDims::Replicated => Ok(Sharding::Replicated),
        NamedDims::Manual => Ok(Sharding::Manual),
        NamedDims::Dims(dims) => {
            let spec = PartitionSpec {
                dims: dims.iter().map(|d| d.axes.clone()).collect(),
                manual: ns.manual_axes.clone().unwrap_or_default(),
                unreduced: ns
                    .unreduced
                    .as_ref()
                    .map(|u| u.1.clone())
                    .unwrap_or_default(),
            };
            mesh.sharding(&spec)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(axes: &[(&str, i64)]) -> NamedMesh {
        NamedMesh::new(axes.iter().map(|(n, s)| (n.to_string(), *s)).collect()).unwrap()
    }

    #[test]
    fn specs_convert() {
        let m = mesh(&[("a", 2), ("b", 4)]);
        // P('a','b') on a 2-d array = devices=[2,4]<=[8]
        let s = m
            .sharding(&PartitionSpec::from_names(&[&["a"], &["b"]]))
            .unwrap();
        assert_eq!(s, Sharding::tile(TileArray::iota(vec![2, 4])));
        // P('b') on a 1-d array: replicated over 'a'.
        let s = m.sharding(&PartitionSpec::from_names(&[&["b"]])).unwrap();
        assert_eq!(s.tile_dims(), &[4, 2]);
        assert_eq!(s.tiles().unwrap().devices(), &[0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(
            m.spec_of(&s, 1).unwrap(),
            PartitionSpec::from_names(&[&["b"]])
        );
        // P(('b','a')) on one dim
        let s = m
            .sharding(&PartitionSpec::from_names(&[&["b", "a"]]))
            .unwrap();
        assert_eq!(
            m.spec_of(&s, 1).unwrap(),
            PartitionSpec::from_names(&[&["b", "a"]])
        );
        // sub-axis 'b':(2)2
        let spec = PartitionSpec {
            dims: vec![vec![AxisRef {
                name: "b".into(),
                sub_axis: Some((2, 2)),
            }]],
            ..Default::default()
        };
        let s = m.sharding(&spec).unwrap();
        assert_eq!(s.tile_dims(), &[2, 4]);
        assert_eq!(m.spec_of(&s, 1).unwrap(), spec);
    }
}
