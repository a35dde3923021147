//! The staged layer (XLA collectives over NCCL-style primitives, used by
//! the NCCL backend) against the reference, on the CPU through
//! `ThreadTransport`: whole-world groups take the native paths, sub-groups
//! and unsupported types the send/recv fallbacks; disagreements between
//! ranks are reported on every rank.

// Index loops here mirror the per-rank, per-operand formulas being checked.
#![allow(clippy::needless_range_loop)]

mod common;

use collectives::{
    reference, CollectiveError, Communicator, DeviceBuffer, DeviceId, ReductionKind,
    StagedCommunicator, TcpTransport, ThreadTransport, Transport,
};
use common::*;
use proptest::prelude::*;
use std::time::Duration;
use xla_hlo_ir::PrimitiveType;

const TIMEOUT: Duration = Duration::from_secs(60);

/// A transport that can make a world of `n` ranks in this process.
trait World: Transport + Sized {
    fn make(n: usize) -> Vec<Self>;
}

impl World for ThreadTransport {
    fn make(n: usize) -> Vec<Self> {
        ThreadTransport::world(n, TIMEOUT)
    }
}

impl World for TcpTransport {
    fn make(n: usize) -> Vec<Self> {
        TcpTransport::local_world(n, TIMEOUT).unwrap()
    }
}

fn run_staged<W: World, T: Send>(
    n: usize,
    f: impl Fn(DeviceId, &mut StagedCommunicator<W>) -> T + Sync,
) -> Vec<T> {
    let comms: Vec<_> = W::make(n)
        .into_iter()
        .map(StagedCommunicator::new)
        .collect();
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(d, mut c)| {
                let f = &f;
                s.spawn(move || f(d, &mut c))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Whole world in order (native paths) or random groups (fallbacks).
fn layout(n: usize, world: bool, equal: bool, rng: &mut SplitMix) -> Vec<Vec<DeviceId>> {
    if world {
        vec![(0..n).collect()]
    } else {
        random_groups(n, equal, rng)
    }
}

fn operands(
    n: usize,
    ops: &[(PrimitiveType, Vec<i64>)],
    rng: &mut SplitMix,
) -> Vec<Vec<DeviceBuffer>> {
    (0..n)
        .map(|_| ops.iter().map(|(t, d)| random_buffer(*t, d, rng)).collect())
        .collect()
}

fn per_group(
    groups: &[Vec<DeviceId>],
    ins: &[Vec<DeviceBuffer>],
    op: impl Fn(&[DeviceBuffer]) -> Vec<DeviceBuffer>,
) -> Vec<Vec<DeviceBuffer>> {
    let mut out: Vec<Vec<DeviceBuffer>> = vec![Vec::new(); ins.len()];
    for g in groups {
        for i in 0..ins[0].len() {
            let gi: Vec<DeviceBuffer> = g.iter().map(|&d| ins[d][i].clone()).collect();
            for (rank, r) in op(&gi).into_iter().enumerate() {
                out[g[rank]].push(r);
            }
        }
    }
    out
}

fn check(got: &[Vec<DeviceBuffer>], want: &[Vec<DeviceBuffer>], what: &str) {
    for (d, (a, e)) in got.iter().zip(want).enumerate() {
        assert_eq!(a.len(), e.len());
        for (x, y) in a.iter().zip(e) {
            assert_same(x, y, &format!("{what}: device {d}"));
        }
    }
}

fn shapes_strategy() -> impl Strategy<Value = Vec<(PrimitiveType, Vec<i64>)>> {
    prop::collection::vec(
        (0..DTYPES.len(), prop::collection::vec(0i64..4, 1..4)),
        1..3,
    )
    .prop_map(|v| v.into_iter().map(|(t, d)| (DTYPES[t], d)).collect())
}

/// The property tests, once per transport: threads of one process, and
/// TCP sockets (the multi-process fallback; fewer cases, each world opens
/// a connection per pair of ranks).
macro_rules! properties {
    ($module:ident, $world:ty, $cases:expr) => {
        mod $module {
            use super::*;

        proptest! {
            #![proptest_config(ProptestConfig { cases: $cases, ..ProptestConfig::default() })]

            #[test]
            fn staged_all_reduce(n in 1usize..=8, world in any::<bool>(), ops in shapes_strategy(), kind_pick in 0usize..6, seed in any::<u64>()) {
                let mut rng = SplitMix(seed);
                let kind = ReductionKind::ALL[kind_pick];
                let kind = if ops.iter().all(|(t, _)| kind.supports(*t)) { kind } else { ReductionKind::Sum };
                let groups = layout(n, world, false, &mut rng);
                let ins = operands(n, &ops, &mut rng);
                let got = run_staged::<$world, _>(n, |d, c| c.all_reduce(group_of(&groups, d), kind, &ins[d]).unwrap());
                check(&got, &per_group(&groups, &ins, |g| reference::all_reduce(kind, g).unwrap()), "all-reduce");
            }

            #[test]
            fn staged_all_gather(n in 1usize..=8, world in any::<bool>(), ops in shapes_strategy(), dim in 0usize..3, seed in any::<u64>()) {
                let mut rng = SplitMix(seed);
                let dim = dim % ops.iter().map(|(_, d)| d.len()).min().unwrap();
                let groups = layout(n, world, false, &mut rng);
                let ins = operands(n, &ops, &mut rng);
                let got = run_staged::<$world, _>(n, |d, c| c.all_gather(group_of(&groups, d), dim, &ins[d]).unwrap());
                check(&got, &per_group(&groups, &ins, |g| reference::all_gather(dim, g).unwrap()), "all-gather");
            }

            #[test]
            fn staged_reduce_scatter(n in 1usize..=8, world in any::<bool>(), ops in shapes_strategy(), dim in 0usize..3, kind_pick in 0usize..6, seed in any::<u64>()) {
                let mut rng = SplitMix(seed);
                let mut ops = ops;
                let groups = layout(n, world, true, &mut rng);
                let k = groups[0].len();
                let dim = dim % ops.iter().map(|(_, d)| d.len()).min().unwrap();
                for (_, d) in ops.iter_mut() { d[dim] = (k * rng.below(3)) as i64; }
                let kind = ReductionKind::ALL[kind_pick];
                let kind = if ops.iter().all(|(t, _)| kind.supports(*t)) { kind } else { ReductionKind::Sum };
                let ins = operands(n, &ops, &mut rng);
                let got = run_staged::<$world, _>(n, |d, c| c.reduce_scatter(group_of(&groups, d), kind, dim, &ins[d]).unwrap());
                check(&got, &per_group(&groups, &ins, |g| reference::reduce_scatter(kind, dim, g).unwrap()), "reduce-scatter");
            }

            #[test]
            fn staged_all_to_all(n in 1usize..=8, world in any::<bool>(), ops in shapes_strategy(), split in 0usize..3, concat in 0usize..3, seed in any::<u64>()) {
                let mut rng = SplitMix(seed);
                let mut ops = ops;
                let groups = layout(n, world, true, &mut rng);
                let k = groups[0].len();
                let r = ops.iter().map(|(_, d)| d.len()).min().unwrap();
                let (split, concat) = (split % r, concat % r);
                for (_, d) in ops.iter_mut() { d[split] = (k * rng.below(3)) as i64; }
                let ins = operands(n, &ops, &mut rng);
                let got = run_staged::<$world, _>(n, |d, c| c.all_to_all(group_of(&groups, d), split, concat, &ins[d]).unwrap());
                check(&got, &per_group(&groups, &ins, |g| reference::all_to_all(split, concat, g).unwrap()), "all-to-all");
            }

            #[test]
            fn staged_broadcast_permute_tuple(n in 1usize..=8, world in any::<bool>(), ops in shapes_strategy(), seed in any::<u64>()) {
                let mut rng = SplitMix(seed);
                let groups = layout(n, world, true, &mut rng);
                let ins = operands(n, &ops, &mut rng);
                let got = run_staged::<$world, _>(n, |d, c| c.collective_broadcast(group_of(&groups, d), &ins[d]).unwrap());
                check(&got, &per_group(&groups, &ins, |g| reference::collective_broadcast(g).unwrap()), "broadcast");

                // permute: a random derangement-ish mapping per group
                let mut pairs_rank: Vec<Vec<(usize, usize)>> = Vec::new();
                for g in &groups {
                    let mut t: Vec<usize> = (0..g.len()).collect();
                    rng.shuffle(&mut t);
                    pairs_rank.push((0..g.len()).filter(|_| rng.below(3) > 0).map(|s| (s, t[s])).collect());
                }
                let global: Vec<Vec<(DeviceId, DeviceId)>> = groups.iter().zip(&pairs_rank).map(|(g, p)| p.iter().map(|&(s, t)| (g[s], g[t])).collect()).collect();
                let got = run_staged::<$world, _>(n, |d, c| {
                    let gi = groups.iter().position(|g| g.contains(&d)).unwrap();
                    c.collective_permute(&groups[gi], &global[gi], &ins[d]).unwrap()
                });
                let mut want: Vec<Vec<DeviceBuffer>> = vec![Vec::new(); n];
                for (g, p) in groups.iter().zip(&pairs_rank) {
                    for i in 0..ops.len() {
                        let gi: Vec<DeviceBuffer> = g.iter().map(|&d| ins[d][i].clone()).collect();
                        for (rank, r) in reference::collective_permute(p, &gi).unwrap().into_iter().enumerate() {
                            want[g[rank]].push(r);
                        }
                    }
                }
                check(&got, &want, "permute");

                // tuple all-to-all: rank r's operand j has dims [r+j mod 3, 2]
                let k = groups[0].len();
                let tin: Vec<Vec<DeviceBuffer>> = (0..n).map(|d| {
                    let r = group_of(&groups, d).iter().position(|&x| x == d).unwrap();
                    (0..k).map(|j| random_buffer(ops[0].0, &[((r + j) % 3) as i64, 2], &mut rng)).collect()
                }).collect();
                let got = run_staged::<$world, _>(n, |d, c| c.all_to_all_tuple(group_of(&groups, d), &tin[d]).unwrap());
                for g in &groups {
                    let gi: Vec<Vec<DeviceBuffer>> = g.iter().map(|&d| tin[d].clone()).collect();
                    let want = reference::all_to_all_tuple(&gi).unwrap();
                    for (rank, &d) in g.iter().enumerate() {
                        for (x, y) in got[d].iter().zip(&want[rank]) {
                            assert_same(x, y, "tuple all-to-all");
                        }
                    }
                }
            }
        }
        }
    };
}

properties!(threads, ThreadTransport, 32);
properties!(tcp, TcpTransport, 6);

#[test]
fn staged_send_recv_pairs() {
    let got = run_staged::<ThreadTransport, _>(4, |d, c| {
        let x = DeviceBuffer::from_slice(vec![2], &[d as i32, 10 * d as i32]).unwrap();
        // even ranks send to the next odd one, odd ones receive
        if d % 2 == 0 {
            c.send(d + 1, 3, &x).unwrap();
            None
        } else {
            Some(c.recv(d - 1, 3, PrimitiveType::S32, &[2]).unwrap())
        }
    });
    assert_eq!(got[1].as_ref().unwrap().typed::<i32>().unwrap(), &[0, 0]);
    assert_eq!(got[3].as_ref().unwrap().typed::<i32>().unwrap(), &[2, 20]);
}

#[test]
fn staged_mismatches_fail_on_every_rank() {
    let got = run_staged::<ThreadTransport, _>(3, |d, c| {
        let x = if d == 2 {
            DeviceBuffer::from_slice(vec![3], &[1.0f32, 2.0, 3.0]).unwrap()
        } else {
            DeviceBuffer::from_slice(vec![2], &[1.0f32, 2.0]).unwrap()
        };
        c.all_reduce(&[0, 1, 2], ReductionKind::Sum, &[x])
    });
    for r in got {
        let err = r.unwrap_err();
        assert!(
            matches!(&err, CollectiveError::Mismatch { detail, .. } if detail.contains("f32[3]") && detail.contains("f32[2]")),
            "{err}"
        );
    }
    // kind mismatch on a sub-group, while the other sub-group succeeds
    let got = run_staged::<ThreadTransport, _>(4, |d, c| {
        let x = DeviceBuffer::from_slice(vec![1], &[d as i64]).unwrap();
        if d < 2 {
            if d == 0 {
                c.all_gather(&[0, 1], 0, &[x])
            } else {
                c.all_reduce(&[0, 1], ReductionKind::Sum, &[x])
            }
        } else {
            c.all_reduce(&[2, 3], ReductionKind::Sum, &[x])
        }
    });
    assert!(matches!(&got[0], Err(CollectiveError::Mismatch { .. })));
    assert!(matches!(&got[1], Err(CollectiveError::Mismatch { .. })));
    assert_eq!(got[2].as_ref().unwrap()[0].typed::<i64>().unwrap(), &[5]);
    // invalid parameters: every rank reaches the same verdict
    let got = run_staged::<ThreadTransport, _>(2, |_, c| {
        let x = DeviceBuffer::from_slice(vec![3], &[1.0f32, 2.0, 3.0]).unwrap();
        c.reduce_scatter(&[0, 1], ReductionKind::Sum, 0, &[x])
    });
    for r in got {
        assert!(r.unwrap_err().to_string().contains("not divisible"));
    }
}
