//! Bootstrap through a key-value store: how ranks that know only the
//! store's address, the world size and (optionally) their rank agree on a
//! communicator's unique id. This is NCCL's `ncclGetUniqueId` /
//! `ncclCommInitRank` contract, done the way XLA and PyTorch do it: rank 0
//! creates the id and sets it under a key, the other ranks wait for the key.
//! The loopback backend joins its worlds through the same code.
//!
//! Keys live under a caller-chosen prefix (a job or clique name), so one
//! store can serve several communicators:
//! * `<prefix>/unique_id`: the 128-byte id;
//! * `<prefix>/next_rank`: counter for [`assign_rank`];
//! * `<prefix>/barrier/<name>/<rank>`: arrival marks for [`barrier`].
//!
//! Invariants: every wait is bounded by the caller's timeout, and a timeout
//! names what was missing (the key, or the ranks that did not arrive).

use crate::error::{CallSite, CollectiveError, CollectiveKind, Result, StoreError};
use crate::store::{hex_encode, KeyValueStore};
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Size of an NCCL unique id (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// A communicator's unique id: NCCL's `ncclUniqueId`, or a random id naming
/// a loopback world.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId(pub [u8; UNIQUE_ID_BYTES]);

impl UniqueId {
    /// A random id (OS-seeded hashing of time, process id and a counter).
    pub fn random() -> UniqueId {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let state = RandomState::new();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let count = COUNTER.fetch_add(1, Ordering::Relaxed);
        let mut out = [0u8; UNIQUE_ID_BYTES];
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            let mut h = state.build_hasher();
            h.write_u128(now);
            h.write_u32(std::process::id());
            h.write_u64(count);
            h.write_usize(i);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
        UniqueId(out)
    }

    /// An id from exactly [`UNIQUE_ID_BYTES`] bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let arr: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            CollectiveError::Bootstrap(format!(
                "a unique id has {UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        Ok(UniqueId(arr))
    }

    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }

    /// Full hex spelling.
    pub fn to_hex(&self) -> String {
        hex_encode(&self.0)
    }

    /// First 8 bytes in hex, for messages.
    pub fn short(&self) -> String {
        hex_encode(&self.0[..8])
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UniqueId({}..)", self.short())
    }
}

/// Rank 0 calls `make` and publishes the id under `<prefix>/unique_id`; the
/// other ranks wait up to `timeout` for it. Every rank returns the same id.
pub fn exchange_unique_id(
    store: &dyn KeyValueStore,
    prefix: &str,
    rank: usize,
    timeout: Duration,
    make: impl FnOnce() -> Result<UniqueId>,
) -> Result<UniqueId> {
    let key = format!("{prefix}/unique_id");
    if rank == 0 {
        let id = make()?;
        store.set(&key, id.as_bytes())?;
        Ok(id)
    } else {
        let bytes = store.get(&key, timeout).map_err(|e| match e {
            StoreError::Timeout { key, waited } => CollectiveError::Bootstrap(format!(
                "rank {rank} waited {waited:?} for rank 0 to publish the unique id under {key:?}"
            )),
            e => e.into(),
        })?;
        UniqueId::from_bytes(&bytes)
    }
}

/// Hands out ranks `0, 1, ...` in arrival order (for launchers that do not
/// assign them); errors once more than `world_size` processes asked.
pub fn assign_rank(store: &dyn KeyValueStore, prefix: &str, world_size: usize) -> Result<usize> {
    let v = store.add(&format!("{prefix}/next_rank"), 1)?;
    let rank = usize::try_from(v - 1)
        .map_err(|_| CollectiveError::Bootstrap(format!("rank counter went negative ({v})")))?;
    if rank >= world_size {
        return Err(CollectiveError::Bootstrap(format!(
            "{} processes joined a world of size {world_size}",
            rank + 1
        )));
    }
    Ok(rank)
}

/// Returns once all `world_size` ranks called it with the same `name`, or
/// errors after `timeout` naming the ranks that did not arrive.
pub fn barrier(
    store: &dyn KeyValueStore,
    prefix: &str,
    name: &str,
    rank: usize,
    world_size: usize,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let key = |r: usize| format!("{prefix}/barrier/{name}/{r}");
    store.set(&key(rank), b"1")?;
    for r in 0..world_size {
        let left = deadline.saturating_duration_since(Instant::now());
        match store.get(&key(r), left) {
            Ok(_) => {}
            Err(StoreError::Timeout { .. }) => {
                let mut missing = Vec::new();
                for m in r..world_size {
                    if store.try_get(&key(m))?.is_none() {
                        missing.push(m);
                    }
                }
                return Err(CollectiveError::Timeout {
                    call: CallSite {
                        kind: CollectiveKind::Barrier,
                        group: (0..world_size).collect(),
                        sequence: 0,
                    },
                    missing_ranks: missing.clone(),
                    missing,
                    stage: "arrive",
                    waited: timeout,
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// What a process knows after bootstrap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootstrapInfo {
    pub rank: usize,
    pub world_size: usize,
    pub unique_id: UniqueId,
}

/// The whole bootstrap: take `rank` (or get one from [`assign_rank`]), agree
/// on the unique id (rank 0 makes it with `make`), and wait until every rank
/// has it.
pub fn rendezvous(
    store: &dyn KeyValueStore,
    prefix: &str,
    rank: Option<usize>,
    world_size: usize,
    timeout: Duration,
    make: impl FnOnce() -> Result<UniqueId>,
) -> Result<BootstrapInfo> {
    if world_size == 0 {
        return Err(CollectiveError::InvalidArgument("world size 0".into()));
    }
    let rank = match rank {
        Some(r) if r < world_size => r,
        Some(r) => {
            return Err(CollectiveError::InvalidArgument(format!(
                "rank {r} out of range for world size {world_size}"
            )))
        }
        None => assign_rank(store, prefix, world_size)?,
    };
    let start = Instant::now();
    let unique_id = exchange_unique_id(store, prefix, rank, timeout, make)?;
    let left = timeout.saturating_sub(start.elapsed());
    barrier(store, prefix, "unique_id", rank, world_size, left)?;
    Ok(BootstrapInfo {
        rank,
        world_size,
        unique_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InMemoryStore;

    #[test]
    fn ids_are_random_and_round_trip() {
        let a = UniqueId::random();
        let b = UniqueId::random();
        assert_ne!(a, b);
        assert_eq!(UniqueId::from_bytes(a.as_bytes()).unwrap(), a);
        assert!(UniqueId::from_bytes(&[0; 3]).is_err());
    }

    #[test]
    fn threads_rendezvous() {
        let store = InMemoryStore::new();
        let n = 6;
        let infos: Vec<BootstrapInfo> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|_| {
                    let store = store.clone();
                    s.spawn(move || {
                        rendezvous(&store, "job", None, n, Duration::from_secs(10), || {
                            Ok(UniqueId::random())
                        })
                        .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut ranks: Vec<usize> = infos.iter().map(|i| i.rank).collect();
        ranks.sort();
        assert_eq!(ranks, (0..n).collect::<Vec<_>>());
        assert!(infos.iter().all(|i| i.unique_id == infos[0].unique_id));
        // A seventh process is refused.
        assert!(assign_rank(&store, "job", n).is_err());
    }

    #[test]
    fn barrier_names_missing_ranks() {
        let store = InMemoryStore::new();
        let err = barrier(&store, "p", "b", 1, 3, Duration::from_millis(50)).unwrap_err();
        match err {
            CollectiveError::Timeout { missing, .. } => assert_eq!(missing, vec![0, 2]),
            e => panic!("{e}"),
        }
        let err = exchange_unique_id(&store, "p", 2, Duration::from_millis(20), || unreachable!())
            .unwrap_err();
        assert!(err.to_string().contains("unique id"), "{err}");
    }
}
