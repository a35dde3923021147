//! The verifier never panics: every id and attribute of a valid module
//! corrupted in turn, and reproducible random mutations of a module that
//! exercises many opcodes.

use super::*;
use xla_hlo_ir::{AttrKey, AttrValue, CompId, InstrId, Opcode, PrimitiveType, Shape};

/// Corrupts every id and attribute of a valid module in turn: the verifier
/// must never panic and must flag each dangling id.
#[test]
fn never_panics_on_corruption() {
    let base = parse(&with_add(
        "ENTRY e {
  p = f32[4,8] parameter(0), sharding={devices=[2,2]<=[4]}
  z = f32[] constant(0)
  r = f32[4] reduce(p, z), dimensions={1}, to_apply=add
  ag = f32[4,16] all-gather(p), replica_groups=[2,2]<=[2,2]T(1,0), dimensions={1}
  ids = s32[2,1] parameter(1)
  g = f32[2,8] gather(p, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
  ROOT t = (f32[4], f32[4,16]) tuple(r, ag)
}",
    ));
    let garbage = [
        AttrValue::Int(-5),
        AttrValue::Int(i64::MAX),
        AttrValue::Ints(vec![i64::MIN, 99, -1]),
        AttrValue::Computation(CompId(1000)),
        AttrValue::Computations(vec![CompId(1000), CompId(0)]),
        AttrValue::Ident("x".into()),
    ];
    for ci in 0..base.computations.len() {
        for ii in 0..base.computations[ci].instructions.len() {
            let keys: Vec<AttrKey> = base.computations[ci].instructions[ii]
                .attrs
                .iter()
                .map(|a| a.key)
                .collect();
            for key in keys {
                for g in &garbage {
                    let mut m = base.clone();
                    m.computations[ci].instructions[ii].set_attr(key, g.clone());
                    let _ = verify(&m);
                }
            }
            for bad in [InstrId(ii as u32), InstrId(u32::MAX)] {
                let mut m = base.clone();
                m.computations[ci].instructions[ii].operands.push(bad);
                assert!(verify(&m).is_err());
            }
            for &op in Opcode::ALL {
                let mut m = base.clone();
                m.computations[ci].instructions[ii].opcode = op;
                let _ = verify(&m);
            }
        }
    }
}

/// Random mutations (xorshift-driven, reproducible) of a module exercising
/// many opcodes: ids, opcodes, shapes, attributes and shardings. The
/// verifier must never panic, whatever it is given.
#[test]
fn never_panics_on_random_mutations() {
    use xla_hlo_ir::sharding::{HloSharding, ShardingKind, SingleSharding, TileAssignment};
    let base = parse(&with_add(
        "ENTRY e {
  p = f32[4,8] parameter(0), sharding={devices=[2,2]<=[4]}
  q = s32[2,1] parameter(1)
  z = f32[] constant(0)
  r = f32[4] reduce(p, z), dimensions={1}, to_apply=add
  ag = f32[4,16] all-gather(p), replica_groups=[2,2]<=[2,2]T(1,0), dimensions={1}
  g = f32[2,8] gather(p, q), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
  c = f32[4,4] convolution(p, p), dim_labels=bf_oi->bf
  d = f32[4,4] dot(p, p), lhs_contracting_dims={1}, rhs_contracting_dims={1}
  rw = f32[2,4] reduce-window(p, z), window={size=2x2 stride=2x2}, to_apply=add
  pd = f32[6,8] pad(p, z), padding=1_1x0_0
  ROOT t = (f32[4], f32[4,16], f32[2,8], f32[4,4], f32[4,4], f32[2,4], f32[6,8]) tuple(r, ag, g, c, d, rw, pd)
}",
    ));
    assert!(verify(&base).is_ok(), "{:?}", verify(&base));
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let pool_vals = [
        AttrValue::Int(-1),
        AttrValue::Int(3),
        AttrValue::Int(i64::MAX),
        AttrValue::Ints(vec![]),
        AttrValue::Ints(vec![0, 0]),
        AttrValue::Ints(vec![1, 0, i64::MIN]),
        AttrValue::IntLists(vec![vec![0, 1], vec![1]]),
        AttrValue::Computation(CompId(0)),
        AttrValue::Computation(CompId(77)),
        AttrValue::Computations(vec![]),
    ];
    let keys = [
        AttrKey::Dimensions,
        AttrKey::ToApply,
        AttrKey::Index,
        AttrKey::SliceSizes,
        AttrKey::OffsetDims,
        AttrKey::IndexVectorDim,
        AttrKey::FeatureGroupCount,
        AttrKey::BatchGroupCount,
        AttrKey::LhsContractingDims,
        AttrKey::SourceTargetPairs,
        AttrKey::BranchComputations,
        AttrKey::K,
    ];
    let dims_pool: [&[i64]; 6] = [&[], &[0], &[-3, 2], &[i64::MAX, 2], &[4, 8], &[1, 1, 1, 1]];
    for _ in 0..3000 {
        let mut m = base.clone();
        for _ in 0..(1 + next() % 3) {
            let ci = (next() as usize) % m.computations.len();
            let n = m.computations[ci].instructions.len();
            let ii = (next() as usize) % n;
            let ins = &mut m.computations[ci].instructions[ii];
            match next() % 7 {
                0 => ins.opcode = Opcode::ALL[(next() as usize) % Opcode::ALL.len()],
                1 => {
                    let k = (next() % 4) as usize;
                    ins.operands = (0..k)
                        .map(|_| InstrId((next() % (n as u64 + 2)) as u32))
                        .collect();
                }
                2 => {
                    let d = dims_pool[(next() as usize) % dims_pool.len()];
                    ins.shape = Shape::array(
                        PrimitiveType::ALL[(next() as usize) % PrimitiveType::ALL.len()],
                        d.to_vec(),
                    );
                }
                3 => {
                    let k = keys[(next() as usize) % keys.len()];
                    ins.set_attr(k, pool_vals[(next() as usize) % pool_vals.len()].clone());
                }
                4 => {
                    let d = dims_pool[(next() as usize) % dims_pool.len()].to_vec();
                    let r = dims_pool[(next() as usize) % dims_pool.len()].to_vec();
                    let perm = dims_pool[(next() as usize) % dims_pool.len()].to_vec();
                    ins.sharding = Some(std::sync::Arc::new(HloSharding::Single(
                        SingleSharding::new(ShardingKind::Tiled {
                            tile_assignment: TileAssignment::Iota {
                                dims: d,
                                reshape_dims: r,
                                perm,
                            },
                            replicate_on_last_tile_dim: next() % 2 == 0,
                            last_tile_dims: vec![],
                        }),
                    )));
                }
                5 => ins.shape = Shape::tuple(vec![ins.shape.clone()]),
                _ => ins.parameter_number = Some((next() % 5) as i64 - 1),
            }
        }
        let _ = verify(&m);
    }
}
