//! NCCL backend checks (cargo feature `nccl`; compiled in CI, run on a GPU
//! machine): `cargo test -p collectives --features nccl --test nccl_gpu`.
//!
//! Without libcuda/libnccl the constructor must return
//! `BackendUnavailable` (never panic). With them, a one-rank world joined
//! through the TCP store runs every collective through NCCL (native
//! all-reduce/all-gather/reduce-scatter in group calls on the dedicated
//! stream, and the host fallbacks) and must match the reference exactly.
//! One GPU allows one rank: NCCL refuses two ranks on one device, so
//! multi-rank semantics are covered by the loopback and staged tests.
#![cfg(feature = "nccl")]

mod common;

use collectives::nccl::{nccl_available, NcclCommunicator, NcclTransport};
use collectives::{
    reference, CollectiveError, Communicator, DeviceBuffer, InMemoryStore, ReductionKind, TcpStore,
    TcpStoreServer,
};
use common::*;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn missing_libraries_are_a_typed_error() {
    if nccl_available().is_ok() {
        return; // a GPU machine: the next test covers it
    }
    let store = InMemoryStore::new();
    let err = NcclCommunicator::from_store(&store, "t", 0, 1, 0, Duration::from_secs(1))
        .err()
        .expect("no NCCL here");
    assert!(
        matches!(err, CollectiveError::BackendUnavailable(_)),
        "{err}"
    );
    assert!(matches!(
        NcclTransport::nccl_version(),
        Err(CollectiveError::BackendUnavailable(_))
    ));
}

#[test]
fn single_gpu_collectives_match_reference() {
    if let Err(e) = nccl_available() {
        eprintln!("skipping the NCCL run: {e}");
        return;
    }
    eprintln!("NCCL version {:?}", NcclTransport::nccl_version());
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let store = TcpStore::connect(server.local_addr(), TIMEOUT).unwrap();
    let mut c = NcclCommunicator::from_store(&store, "gpu-test", 0, 1, 0, TIMEOUT).unwrap();
    assert_eq!(c.backend_name(), "nccl");
    let mut rng = SplitMix(7);
    let world = [0usize];
    for &dtype in DTYPES {
        for kind in ReductionKind::ALL {
            if !kind.supports(dtype) {
                continue;
            }
            // Two operands: one NCCL group call.
            let ops = vec![
                random_buffer(dtype, &[3, 5], &mut rng),
                random_buffer(dtype, &[7], &mut rng),
            ];
            let got = c.all_reduce(&world, kind, &ops).unwrap();
            for (g, o) in got.iter().zip(&ops) {
                let want = reference::all_reduce(kind, std::slice::from_ref(o)).unwrap();
                assert_same(g, &want[0], &format!("all-reduce {kind:?} {dtype}"));
            }
        }
        let x = random_buffer(dtype, &[2, 3, 4], &mut rng);
        for dim in 0..3 {
            let got = c.all_gather(&world, dim, std::slice::from_ref(&x)).unwrap();
            assert_same(&got[0], &x, "all-gather");
            let got = c
                .reduce_scatter(&world, ReductionKind::Sum, dim, std::slice::from_ref(&x))
                .unwrap();
            assert_same(&got[0], &x, "reduce-scatter");
            let got = c
                .all_to_all(&world, dim, (dim + 1) % 3, std::slice::from_ref(&x))
                .unwrap();
            assert_same(&got[0], &x, "all-to-all");
        }
        let got = c
            .collective_broadcast(&world, std::slice::from_ref(&x))
            .unwrap();
        assert_same(&got[0], &x, "broadcast");
        let got = c
            .collective_permute(&world, &[(0, 0)], std::slice::from_ref(&x))
            .unwrap();
        assert_same(&got[0], &x, "permute");
    }
    c.barrier(&world).unwrap();
    // A large all-reduce, timed (one rank: the NCCL and staging path).
    let n = 16 << 20;
    let big = DeviceBuffer::from_slice(vec![n as i64], &vec![1.5f32; n]).unwrap();
    let t = Instant::now();
    let out = c.all_reduce(&world, ReductionKind::Sum, &[big]).unwrap();
    eprintln!(
        "64 MiB f32 all-reduce (1 rank, host-staged): {:?}",
        t.elapsed()
    );
    assert!(out[0].typed::<f32>().unwrap().iter().all(|&v| v == 1.5));
    // Wrong group: an error, not a hang.
    assert!(c.all_reduce(&[0, 1], ReductionKind::Sum, &[]).is_err());
}
