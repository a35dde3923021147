//! Property tests of the sharding algebra over random meshes (1 to 3 axes,
//! up to 64 devices), random partition specs and random shapes: tiles cover
//! the global shape exactly once per replica, and conversions round-trip
//! (spec <-> sharding, sharding <-> IR iota/explicit, transposes, reshapes).

use proptest::prelude::*;
use xla_hlo_ir::mesh::AxisRef;
use xla_hlo_ir::sharding::{ShardingKind, SingleSharding};
use xla_hlo_ir::TileAssignment;
use xla_hlo_utils::merge::{is_subtiling_or_equal, merge_sharding_if_compatible};
use xla_hlo_utils::ops::{
    partially_replicate_on_dims, propagate_through_reshape, transpose_sharding,
};
use xla_hlo_utils::{NamedMesh, PartitionSpec, Sharding, TiledLayout};

/// A random mesh: 1-3 axes of sizes 1..8 with at most 64 devices, and
/// possibly a shuffled device order.
fn mesh_strategy() -> impl Strategy<Value = NamedMesh> {
    (prop::collection::vec(1i64..=8, 1..=3), any::<u64>())
        .prop_filter("at most 64 devices", |(s, _)| {
            s.iter().product::<i64>() <= 64
        })
        .prop_map(|(sizes, seed)| {
            let axes: Vec<(String, i64)> = sizes
                .iter()
                .enumerate()
                .map(|(i, &s)| (["x", "y", "z"][i].to_string(), s))
                .collect();
            let n: i64 = sizes.iter().product();
            let mut devices: Vec<i64> = (0..n).collect();
            if seed % 3 == 0 {
                // deterministic shuffle
                let mut st = seed;
                for i in (1..devices.len()).rev() {
                    st = st
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    devices.swap(i, (st >> 33) as usize % (i + 1));
                }
            }
            NamedMesh::with_devices(axes, devices).unwrap()
        })
}

/// A random spec on `mesh` for a rank-`rank` array: each axis goes to a
/// dim, to the manual axes, or stays replicated; sometimes split in two
/// sub-axes spread over two dims.
fn spec_for(mesh: &NamedMesh, rank: usize, choices: &[u8]) -> PartitionSpec {
    let mut spec = PartitionSpec {
        dims: vec![vec![]; rank],
        ..Default::default()
    };
    for (i, (name, size)) in mesh.axes().iter().enumerate() {
        let c = choices.get(i).copied().unwrap_or(0) as usize;
        let slots = rank + 2;
        let slot = c % slots;
        let split = c / slots % 2 == 1 && *size % 2 == 0 && *size > 2;
        let refs = if split {
            vec![
                AxisRef {
                    name: name.clone(),
                    sub_axis: Some((1, 2)),
                },
                AxisRef {
                    name: name.clone(),
                    sub_axis: Some((2, size / 2)),
                },
            ]
        } else {
            vec![AxisRef::axis(name.clone())]
        };
        if slot < rank {
            if split && rank > 1 {
                spec.dims[slot].push(refs[0].clone());
                spec.dims[(slot + 1) % rank].push(refs[1].clone());
            } else {
                spec.dims[slot].push(AxisRef::axis(name.clone()));
            }
        } else if slot == rank && *size > 1 && c / 5 * 5 == c {
            spec.manual.push(AxisRef::axis(name.clone()));
        }
    }
    spec
}

fn explicit(s: &Sharding) -> SingleSharding {
    let mut ir = s.to_ir();
    if let ShardingKind::Tiled {
        tile_assignment, ..
    } = &mut ir.kind
    {
        let t = xla_hlo_utils::TileArray::from_ir(tile_assignment).unwrap();
        *tile_assignment = TileAssignment::Explicit {
            dims: t.dims().to_vec(),
            devices: t.devices().to_vec(),
        };
    }
    ir
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn tiles_cover_shape_once_per_replica(
        mesh in mesh_strategy(),
        shape in prop::collection::vec(1i64..=13, 1..=3),
        choices in prop::collection::vec(any::<u8>(), 3),
    ) {
        let spec = spec_for(&mesh, shape.len(), &choices);
        let s = mesh.sharding(&spec).unwrap();
        let layout = TiledLayout::new(&s, &shape, mesh.num_devices()).unwrap();
        // Every device appears once.
        let mut devs: Vec<i64> = layout.devices().devices().to_vec();
        devs.sort_unstable();
        prop_assert_eq!(devs, (0..mesh.num_devices()).collect::<Vec<_>>());
        // Per (manual, replica), the tiles partition the shape: count elements.
        let total: i64 = shape.iter().product();
        let mut counts = vec![0u32; (total * layout.manual() * layout.replication()) as usize];
        layout.for_each_tile(|dev, off, lim| {
            let group = layout.manual_index(dev).unwrap() * layout.replication()
                + layout.replica_index(dev).unwrap();
            let mut idx = off.to_vec();
            if off.iter().zip(lim).any(|(o, l)| o >= l) {
                return;
            }
            loop {
                let mut flat = 0i64;
                for (i, &x) in idx.iter().enumerate() {
                    flat = flat * shape[i] + x;
                }
                counts[(group * total + flat) as usize] += 1;
                let mut d = idx.len();
                loop {
                    if d == 0 { return; }
                    d -= 1;
                    idx[d] += 1;
                    if idx[d] < lim[d] { break; }
                    idx[d] = off[d];
                }
            }
        });
        prop_assert!(counts.iter().all(|&c| c == 1));
        // Tile shapes are ceil(dim / tiles); the padding is what lies past the end.
        for dev in 0..mesh.num_devices() {
            let ext = layout.valid_extent(dev).unwrap();
            let pad = layout.padding(dev).unwrap();
            for i in 0..shape.len() {
                prop_assert_eq!(ext[i] + pad[i], layout.tile_shape()[i]);
            }
            let same = layout.devices_in_same_tile(dev).unwrap();
            prop_assert!(same.contains(&dev));
            for other in same {
                prop_assert_eq!(layout.tile_index(other), layout.tile_index(dev));
            }
            let t = layout.tile_index(dev).unwrap();
            prop_assert_eq!(
                layout.device_for_tile(&t, layout.manual_index(dev).unwrap(), layout.replica_index(dev).unwrap()),
                Some(dev)
            );
        }
    }

    #[test]
    fn conversions_round_trip(
        mesh in mesh_strategy(),
        rank in 1usize..=3,
        choices in prop::collection::vec(any::<u8>(), 3),
    ) {
        let spec = spec_for(&mesh, rank, &choices);
        let s = mesh.sharding(&spec).unwrap();
        // IR (iota when possible) and explicit device lists read back equal.
        prop_assert_eq!(&Sharding::from_ir(&s.to_ir()).unwrap(), &s);
        prop_assert_eq!(&Sharding::from_ir(&explicit(&s)).unwrap(), &s);
        // Named form round-trips through the canonical spec.
        let back = mesh.spec_of(&s, rank);
        prop_assert!(back.is_some(), "no spec for {:?} from {:?}", s, spec);
        let back = back.unwrap();
        prop_assert_eq!(&mesh.sharding(&back).unwrap(), &s);
        // IR named (V3) form converts to the same sharding.
        if let Some(named) = mesh.to_named_ir(&s, rank) {
            let v3 = SingleSharding::new(ShardingKind::Named(named));
            prop_assert_eq!(&Sharding::from_ir(&v3).unwrap(), &s);
        }
        // Transposes invert.
        if let Sharding::Tiled(_) = &s {
            let perm: Vec<usize> = (0..rank).rev().collect();
            let t = transpose_sharding(&s, &perm);
            prop_assert_eq!(&transpose_sharding(&t, &perm), &s);
        }
    }

    #[test]
    fn reshape_split_merge_and_partial_merge(
        mesh in mesh_strategy(),
        choices in prop::collection::vec(any::<u8>(), 3),
        k in 1i64..=4,
    ) {
        let spec = spec_for(&mesh, 2, &choices);
        let s = mesh.sharding(&spec).unwrap();
        if s.manual_dim().is_some() || !s.is_tiled() {
            return Ok(());
        }
        // Split dim 0 (size tiles*k*2) into [tiles*k, 2] and merge back.
        let t0 = s.tile_dim(0);
        let t1 = s.tile_dim(1);
        let shape = [t0 * k * 2, t1 * 3];
        let split = [t0 * k, 2, t1 * 3];
        let a = propagate_through_reshape(&shape, &split, &s);
        prop_assert_eq!(a.tile_dim(0), t0);
        let b = propagate_through_reshape(&split, &shape, &a);
        prop_assert_eq!(&b, &s);
        // Replicating a dim gives a coarser sharding; merging the two halves
        // gives back the original.
        let r0 = partially_replicate_on_dims(&s, &[0]);
        let r1 = partially_replicate_on_dims(&s, &[1]);
        prop_assert!(is_subtiling_or_equal(&shape, &s, &r0));
        prop_assert!(is_subtiling_or_equal(&shape, &s, &r1));
        if r0.is_tiled() && r1.is_tiled() && r0.has_partial_replication() {
            let mut m = r0.clone();
            let min = r0.num_tiles() + 1;
            if merge_sharding_if_compatible(&r1, min, &mut m) {
                prop_assert!(is_subtiling_or_equal(&shape, &m, &r0));
                prop_assert!(is_subtiling_or_equal(&shape, &m, &r1));
            }
        }
    }
}
