//! The loopback backend joins its world through the same store-based
//! bootstrap as NCCL (rank 0 publishes the id, the others fetch it), over an
//! in-memory store and over the TCP store; a rank that asks for a world
//! that is not in this process gets a clear error.

use collectives::bootstrap::UniqueId;
use collectives::{
    CollectiveError, Communicator, DeviceBuffer, InMemoryStore, KeyValueStore,
    LoopbackCommunicator, ReductionKind, TcpStore, TcpStoreServer,
};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(30);

fn join_and_reduce(n: usize, store_for: impl Fn() -> Box<dyn KeyValueStore> + Sync) {
    let results: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|rank| {
                let store_for = &store_for;
                s.spawn(move || {
                    let store = store_for();
                    let mut c = LoopbackCommunicator::from_store(
                        store.as_ref(),
                        "job/world0",
                        rank,
                        n,
                        TIMEOUT,
                    )
                    .unwrap();
                    assert_eq!(c.device(), rank);
                    let x = DeviceBuffer::from_slice(vec![1], &[rank as f64]).unwrap();
                    let out = c
                        .all_reduce(&(0..n).collect::<Vec<_>>(), ReductionKind::Sum, &[x])
                        .unwrap();
                    out[0].typed::<f64>().unwrap()[0]
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want = (n * (n - 1) / 2) as f64;
    assert!(results.iter().all(|&r| r == want), "{results:?}");
}

#[test]
fn join_through_in_memory_store() {
    let store = InMemoryStore::new();
    join_and_reduce(5, || Box::new(store.clone()));
}

#[test]
fn join_through_tcp_store() {
    let server = TcpStoreServer::bind("127.0.0.1:0").unwrap();
    let addr = server.local_addr();
    join_and_reduce(4, || Box::new(TcpStore::connect(addr, TIMEOUT).unwrap()));
}

#[test]
fn unknown_world_is_an_error() {
    let store = InMemoryStore::new();
    store
        .set("other/unique_id", UniqueId::random().as_bytes())
        .unwrap();
    let err = LoopbackCommunicator::from_store(&store, "other", 1, 2, TIMEOUT)
        .err()
        .unwrap();
    assert!(matches!(err, CollectiveError::Bootstrap(_)), "{err}");
    // Rank 0 never came: the others time out naming the key.
    let err = LoopbackCommunicator::from_store(&store, "nobody", 1, 2, Duration::from_millis(50))
        .err()
        .unwrap();
    assert!(err.to_string().contains("unique id"), "{err}");
}
