//! Property tests: every collective of the loopback backend against the
//! single-threaded reference (`collectives::reference`), over random device
//! counts (1..=16), group layouts, element types, shapes and operand counts;
//! and the replica-group modes against a brute-force reading of XLA's rules.

// Index loops here mirror the per-rank, per-operand formulas being checked.
#![allow(clippy::needless_range_loop)]

mod common;

use collectives::groups::{permute_plan, GroupMode, ParticipantGroups, Topology};
use collectives::{reference, Communicator, DeviceBuffer, DeviceId, ReductionKind};
use common::*;
use proptest::prelude::*;
use std::time::Duration;
use xla_hlo_ir::{CollectiveDeviceList, PrimitiveType};

const TIMEOUT: Duration = Duration::from_secs(60);

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 40,
        ..ProptestConfig::default()
    }
}

/// A random case: device count, per-operand (dtype, dims), data seed.
#[derive(Clone, Debug)]
struct Case {
    n: usize,
    operands: Vec<(PrimitiveType, Vec<i64>)>,
    seed: u64,
}

fn dims_strategy() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(0i64..4, 0..4)
}

fn case_strategy() -> impl Strategy<Value = Case> {
    (
        1usize..=16,
        prop::collection::vec((0..DTYPES.len(), dims_strategy()), 1..3),
        any::<u64>(),
    )
        .prop_map(|(n, ops, seed)| Case {
            n,
            operands: ops.into_iter().map(|(t, d)| (DTYPES[t], d)).collect(),
            seed,
        })
}

/// Each device's operands (device-specific data, same shapes everywhere).
fn inputs(case: &Case, rng: &mut SplitMix) -> Vec<Vec<DeviceBuffer>> {
    (0..case.n)
        .map(|_| {
            case.operands
                .iter()
                .map(|(t, d)| random_buffer(*t, d, rng))
                .collect()
        })
        .collect()
}

/// Expected results: for each group, the reference applied per operand.
fn expected(
    groups: &[Vec<DeviceId>],
    ins: &[Vec<DeviceBuffer>],
    op: impl Fn(&[DeviceBuffer]) -> Vec<DeviceBuffer>,
) -> Vec<Vec<DeviceBuffer>> {
    let n = ins.len();
    let nops = ins[0].len();
    let mut out: Vec<Vec<DeviceBuffer>> = vec![Vec::new(); n];
    for g in groups {
        for i in 0..nops {
            let group_inputs: Vec<DeviceBuffer> = g.iter().map(|&d| ins[d][i].clone()).collect();
            for (rank, r) in op(&group_inputs).into_iter().enumerate() {
                out[g[rank]].push(r);
            }
        }
    }
    out
}

fn check_all(actual: &[Vec<DeviceBuffer>], expected: &[Vec<DeviceBuffer>], what: &str) {
    for (d, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert_eq!(a.len(), e.len(), "{what}: device {d} operand count");
        for (i, (x, y)) in a.iter().zip(e).enumerate() {
            assert_same(x, y, &format!("{what}: device {d} operand {i}"));
        }
    }
}

/// Gives dimension `dim` of every operand a size that is a multiple of `k`.
fn make_divisible(case: &mut Case, dim_choice: usize, k: usize, rng: &mut SplitMix) -> Vec<usize> {
    case.operands
        .iter_mut()
        .map(|(_, dims)| {
            if dims.is_empty() {
                dims.push(0);
            }
            let d = dim_choice % dims.len();
            dims[d] = (k * rng.below(3)) as i64;
            d
        })
        .collect()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn all_reduce_matches_reference(case in case_strategy(), kind_pick in 0usize..6, equal in any::<bool>()) {
        let mut rng = SplitMix(case.seed);
        // A kind every operand type supports (Sum works for all).
        let kind = ReductionKind::ALL[kind_pick];
        let kind = if case.operands.iter().all(|(t, _)| kind.supports(*t)) { kind } else { ReductionKind::Sum };
        let groups = random_groups(case.n, equal, &mut rng);
        let ins = inputs(&case, &mut rng);
        let got = run_world(case.n, TIMEOUT, |d, c| c.all_reduce(group_of(&groups, d), kind, &ins[d]).unwrap());
        let want = expected(&groups, &ins, |g| reference::all_reduce(kind, g).unwrap());
        check_all(&got, &want, &format!("all-reduce {kind:?}"));
    }

    /// Long arrays: several kernel blocks, more than four inputs per pass,
    /// uneven 1/N chunks.
    #[test]
    fn all_reduce_long_arrays(n in 1usize..=16, len in 0i64..20000, dtype_pick in 0..DTYPES.len(), kind_pick in 0usize..6, seed in any::<u64>()) {
        let mut rng = SplitMix(seed);
        let dtype = DTYPES[dtype_pick];
        let kind = ReductionKind::ALL[kind_pick];
        let kind = if kind.supports(dtype) { kind } else { ReductionKind::Sum };
        let ins: Vec<Vec<DeviceBuffer>> = (0..n).map(|_| vec![random_buffer(dtype, &[len], &mut rng)]).collect();
        let groups = vec![(0..n).collect::<Vec<_>>()];
        let got = run_world(n, TIMEOUT, |d, c| c.all_reduce(&groups[0], kind, &ins[d]).unwrap());
        let want = expected(&groups, &ins, |g| reference::all_reduce(kind, g).unwrap());
        check_all(&got, &want, &format!("long all-reduce {kind:?} {dtype}"));
    }

    #[test]
    fn all_gather_matches_reference(case in case_strategy(), dim_pick in 0usize..4, equal in any::<bool>()) {
        let mut rng = SplitMix(case.seed);
        let mut case = case;
        for (_, dims) in case.operands.iter_mut() {
            if dims.is_empty() { dims.push(2); }
        }
        let dim = dim_pick % case.operands.iter().map(|(_, d)| d.len()).min().unwrap();
        let groups = random_groups(case.n, equal, &mut rng);
        let ins = inputs(&case, &mut rng);
        let got = run_world(case.n, TIMEOUT, |d, c| c.all_gather(group_of(&groups, d), dim, &ins[d]).unwrap());
        let want = expected(&groups, &ins, |g| reference::all_gather(dim, g).unwrap());
        check_all(&got, &want, "all-gather");
    }

    #[test]
    fn reduce_scatter_matches_reference(case in case_strategy(), dim_pick in 0usize..4, kind_pick in 0usize..6) {
        let mut rng = SplitMix(case.seed);
        let mut case = case;
        let groups = random_groups(case.n, true, &mut rng);
        let k = groups[0].len();
        // One dimension for all operands: the smallest rank bounds it.
        for (_, dims) in case.operands.iter_mut() {
            if dims.is_empty() { dims.push(0); }
        }
        let min_rank = case.operands.iter().map(|(_, d)| d.len()).min().unwrap();
        let dim = dim_pick % min_rank;
        make_divisible(&mut case, dim, k, &mut rng);
        let kind = ReductionKind::ALL[kind_pick];
        let kind = if case.operands.iter().all(|(t, _)| kind.supports(*t)) { kind } else { ReductionKind::Sum };
        let ins = inputs(&case, &mut rng);
        let got = run_world(case.n, TIMEOUT, |d, c| c.reduce_scatter(group_of(&groups, d), kind, dim, &ins[d]).unwrap());
        let want = expected(&groups, &ins, |g| reference::reduce_scatter(kind, dim, g).unwrap());
        check_all(&got, &want, &format!("reduce-scatter {kind:?} dim {dim}"));
    }

    #[test]
    fn all_to_all_matches_reference(case in case_strategy(), split_pick in 0usize..4, concat_pick in 0usize..4) {
        let mut rng = SplitMix(case.seed);
        let mut case = case;
        let groups = random_groups(case.n, true, &mut rng);
        let k = groups[0].len();
        for (_, dims) in case.operands.iter_mut() {
            if dims.is_empty() { dims.push(0); }
        }
        let min_rank = case.operands.iter().map(|(_, d)| d.len()).min().unwrap();
        let split = split_pick % min_rank;
        let concat = concat_pick % min_rank;
        make_divisible(&mut case, split, k, &mut rng);
        let ins = inputs(&case, &mut rng);
        let got = run_world(case.n, TIMEOUT, |d, c| c.all_to_all(group_of(&groups, d), split, concat, &ins[d]).unwrap());
        let want = expected(&groups, &ins, |g| reference::all_to_all(split, concat, g).unwrap());
        check_all(&got, &want, &format!("all-to-all split {split} concat {concat}"));
    }

    #[test]
    fn all_to_all_tuple_matches_reference(n in 1usize..=16, seed in any::<u64>(), dtype_pick in 0..DTYPES.len()) {
        let mut rng = SplitMix(seed);
        let groups = random_groups(n, true, &mut rng);
        let k = groups[0].len();
        // Rank r's operand j has dims [r+1, j+1] so that mismatched routing shows.
        let ins: Vec<Vec<DeviceBuffer>> = (0..n).map(|d| {
            let r = group_of(&groups, d).iter().position(|&x| x == d).unwrap();
            (0..k).map(|j| random_buffer(DTYPES[dtype_pick], &[(r + j) as i64 % 3, 2], &mut rng)).collect()
        }).collect();
        let got = run_world(n, TIMEOUT, |d, c| c.all_to_all_tuple(group_of(&groups, d), &ins[d]).unwrap());
        for g in &groups {
            let group_inputs: Vec<Vec<DeviceBuffer>> = g.iter().map(|&d| ins[d].clone()).collect();
            let want = reference::all_to_all_tuple(&group_inputs).unwrap();
            for (rank, &d) in g.iter().enumerate() {
                for (j, (x, y)) in got[d].iter().zip(&want[rank]).enumerate() {
                    assert_same(x, y, &format!("tuple all-to-all device {d} element {j}"));
                    // zero copy: the result is the sender's buffer itself
                    prop_assert!(x.shares_storage_with(y));
                }
            }
        }
    }

    #[test]
    fn collective_permute_matches_reference(case in case_strategy(), density in 0usize..4) {
        let mut rng = SplitMix(case.seed);
        let groups = random_groups(case.n, false, &mut rng);
        // Random partial permutation inside each group.
        let mut rank_pairs: Vec<Vec<(usize, usize)>> = Vec::new();
        for g in &groups {
            let mut targets: Vec<usize> = (0..g.len()).collect();
            rng.shuffle(&mut targets);
            let pairs: Vec<(usize, usize)> = (0..g.len())
                .filter(|_| rng.below(4) <= density)
                .map(|s| (s, targets[s]))
                .collect();
            rank_pairs.push(pairs);
        }
        let global: Vec<Vec<(DeviceId, DeviceId)>> = groups.iter().zip(&rank_pairs)
            .map(|(g, p)| p.iter().map(|&(s, t)| (g[s], g[t])).collect()).collect();
        let ins = inputs(&case, &mut rng);
        let got = run_world(case.n, TIMEOUT, |d, c| {
            let gi = groups.iter().position(|g| g.contains(&d)).unwrap();
            c.collective_permute(&groups[gi], &global[gi], &ins[d]).unwrap()
        });
        let mut want: Vec<Vec<DeviceBuffer>> = vec![Vec::new(); case.n];
        for (g, pairs) in groups.iter().zip(&rank_pairs) {
            for i in 0..case.operands.len() {
                let gi: Vec<DeviceBuffer> = g.iter().map(|&d| ins[d][i].clone()).collect();
                for (rank, r) in reference::collective_permute(pairs, &gi).unwrap().into_iter().enumerate() {
                    want[g[rank]].push(r);
                }
            }
        }
        check_all(&got, &want, "collective-permute");
    }

    #[test]
    fn collective_broadcast_matches_reference(case in case_strategy(), equal in any::<bool>()) {
        let mut rng = SplitMix(case.seed);
        let groups = random_groups(case.n, equal, &mut rng);
        let ins = inputs(&case, &mut rng);
        let got = run_world(case.n, TIMEOUT, |d, c| c.collective_broadcast(group_of(&groups, d), &ins[d]).unwrap());
        let want = expected(&groups, &ins, |g| reference::collective_broadcast(g).unwrap());
        check_all(&got, &want, "collective-broadcast");
        for g in &groups {
            for &d in g {
                for (x, y) in got[d].iter().zip(&ins[g[0]]) {
                    prop_assert!(x.shares_storage_with(y), "broadcast copied");
                }
            }
        }
    }

    #[test]
    fn send_recv_ring(n in 1usize..=16, seed in any::<u64>(), dtype_pick in 0..DTYPES.len(), dims in dims_strategy(), rounds in 1usize..4) {
        let mut rng = SplitMix(seed);
        let ins: Vec<Vec<DeviceBuffer>> = (0..n).map(|_| (0..rounds).map(|_| random_buffer(DTYPES[dtype_pick], &dims, &mut rng)).collect()).collect();
        let got = run_world(n, TIMEOUT, |d, c| {
            let next = (d + 1) % n;
            let prev = (d + n - 1) % n;
            for b in &ins[d] {
                c.send(next, 7, b).unwrap();
            }
            let out: Vec<DeviceBuffer> = (0..rounds).map(|_| c.recv(prev, 7, DTYPES[dtype_pick], &dims).unwrap()).collect();
            c.wait_sends().unwrap();
            // Keep every communicator alive until all have received.
            c.barrier(&(0..n).collect::<Vec<_>>()).unwrap();
            out
        });
        for d in 0..n {
            let prev = (d + n - 1) % n;
            for (x, y) in got[d].iter().zip(&ins[prev]) {
                assert_same(x, y, "send/recv");
            }
        }
    }

    /// XLA's group modes against a brute-force reading of the definition:
    /// device (r, p) and (r', p') share a group iff ...
    #[test]
    fn group_modes_match_definition(nr in 1usize..5, np in 1usize..5, seed in any::<u64>(), mode_pick in 0usize..4, empty in any::<bool>()) {
        let mut rng = SplitMix(seed);
        let topo = Topology::new(nr, np).unwrap();
        let mode = [GroupMode::CrossReplica, GroupMode::CrossPartition, GroupMode::CrossReplicaAndPartition, GroupMode::FlattenedId][mode_pick];
        let id_count = match mode {
            GroupMode::CrossReplica | GroupMode::CrossReplicaAndPartition => nr,
            GroupMode::CrossPartition => np,
            GroupMode::FlattenedId => nr * np,
        };
        let empty = empty && mode != GroupMode::FlattenedId;
        let id_groups: Vec<Vec<usize>> = if empty { vec![(0..id_count).collect()] } else { random_groups(id_count, false, &mut rng) };
        let hlo_groups: Vec<Vec<i64>> = if empty { vec![] } else { id_groups.iter().map(|g| g.iter().map(|&x| x as i64).collect()).collect() };
        let pg = ParticipantGroups::from_replica_groups(&hlo_groups, mode, topo).unwrap();
        prop_assert!(pg.covers(nr * np));
        let pos = |id: usize| -> (usize, usize) {
            let gi = id_groups.iter().position(|g| g.contains(&id)).unwrap();
            (gi, id_groups[gi].iter().position(|&x| x == id).unwrap())
        };
        for a in 0..nr * np {
            let (ra, pa) = topo.logical_id(a);
            for b in 0..nr * np {
                let (rb, pb) = topo.logical_id(b);
                let same = match mode {
                    GroupMode::CrossReplica => pa == pb && pos(ra).0 == pos(rb).0,
                    GroupMode::CrossPartition => ra == rb && pos(pa).0 == pos(pb).0,
                    GroupMode::CrossReplicaAndPartition => pos(ra).0 == pos(rb).0,
                    GroupMode::FlattenedId => pos(a).0 == pos(b).0,
                };
                let actual = pg.group_of(a).unwrap().contains(&b);
                prop_assert_eq!(same, actual, "devices {} and {} in {:?}", a, b, mode);
            }
            // Rank: position of the id in its replica group (replica-major,
            // then partition, for cross-replica-and-partition).
            let rank = pg.rank_of(a).unwrap();
            let want = match mode {
                GroupMode::CrossReplica => pos(ra).1,
                GroupMode::CrossPartition => pos(pa).1,
                GroupMode::CrossReplicaAndPartition => pos(ra).1 * np + pa,
                GroupMode::FlattenedId => pos(a).1,
            };
            prop_assert_eq!(rank, want);
        }
    }

    /// End to end: HLO attributes (iota replica groups, channel_id,
    /// use_global_device_ids) -> groups -> loopback all-reduce, where each
    /// device contributes its id: every device gets the sum of its group.
    #[test]
    fn hlo_attributes_end_to_end(nr in 1usize..4, np in 1usize..5, channel in any::<bool>(), global in prop::option::of(any::<bool>()), transpose in any::<bool>()) {
        let topo = Topology::new(nr, np).unwrap();
        let Ok(mode) = GroupMode::from_attributes(channel, global) else {
            prop_assert!(!channel && global == Some(true));
            return Ok(());
        };
        let id_count = match mode {
            GroupMode::CrossReplica | GroupMode::CrossReplicaAndPartition => nr,
            GroupMode::CrossPartition => np,
            GroupMode::FlattenedId => nr * np,
        };
        // Iota list [2, id_count/2]<=[2, id_count/2]T(1,0) when even, else one group.
        let list = if id_count % 2 == 0 && id_count >= 2 {
            CollectiveDeviceList::Iota {
                num_groups: 2,
                group_size: id_count as i64 / 2,
                reshape_dims: if transpose { vec![id_count as i64 / 2, 2] } else { vec![id_count as i64] },
                perm: if transpose { vec![1, 0] } else { vec![] },
            }
        } else {
            CollectiveDeviceList::Explicit(vec![(0..id_count as i64).collect()])
        };
        let pg = ParticipantGroups::from_hlo(&list, channel.then_some(1), global, topo).unwrap();
        let got = run_world(nr * np, TIMEOUT, |d, c| {
            let x = DeviceBuffer::from_slice(vec![1], &[d as i64]).unwrap();
            c.all_reduce(pg.group_of(d).unwrap(), ReductionKind::Sum, &[x]).unwrap()
        });
        for d in 0..nr * np {
            let want: i64 = pg.group_of(d).unwrap().iter().map(|&x| x as i64).sum();
            prop_assert_eq!(got[d][0].typed::<i64>().unwrap(), &[want]);
        }
    }

    /// collective-permute plans from HLO source_target_pairs.
    #[test]
    fn permute_plans_from_hlo(nr in 1usize..4, np in 1usize..4, channel in any::<bool>(), shift in 1usize..3) {
        let topo = Topology::new(nr, np).unwrap();
        let count = if channel { np } else { nr };
        let pairs: Vec<(i64, i64)> = (0..count).map(|i| (i as i64, ((i + shift) % count) as i64)).collect();
        let got = run_world(nr * np, TIMEOUT, |d, c| {
            let plan = permute_plan(&pairs, channel, topo, d).unwrap();
            let x = DeviceBuffer::from_slice(vec![], &[d as i32]).unwrap();
            c.collective_permute(&plan.group, &plan.pairs, &[x]).unwrap()
        });
        for d in 0..nr * np {
            let (r, p) = topo.logical_id(d);
            let src = if channel {
                topo.device_id(r, (p + count - shift % count) % count)
            } else {
                topo.device_id((r + count - shift % count) % count, p)
            };
            prop_assert_eq!(got[d][0].typed::<i32>().unwrap(), &[src as i32]);
        }
    }
}

#[test]
fn single_device_all_reduce_is_identity_without_copy() {
    let got = run_world(1, TIMEOUT, |_, c| {
        let x = DeviceBuffer::from_slice(vec![3], &[1.5f32, 2.0, -1.0]).unwrap();
        let y = c
            .all_reduce(&[0], ReductionKind::Max, std::slice::from_ref(&x))
            .unwrap();
        (x, y)
    });
    let (x, y) = &got[0];
    assert_same(&y[0], x, "identity");
    assert!(y[0].shares_storage_with(x));
}
