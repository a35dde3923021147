//! Worlds and their communicators: creating a world (registered in this
//! process under its unique id), claiming each device's communicator once,
//! joining through a key-value store as NCCL ranks do, aborting, and the
//! faults tests inject.
//!
//! Invariants: each device of a world has at most one communicator; a
//! communicator that aborts or is dropped marks its device failed, so the
//! other members get an error naming it instead of waiting; the registry
//! holds worlds weakly (a world lives while a `LoopbackWorld` or a
//! communicator of it does).

use super::sync::lock;
use super::table::{mark_failed, Shared, State};
use crate::bootstrap::{self, UniqueId};
use crate::buffer::Recycler;
use crate::error::{CollectiveError, Result};
use crate::groups::DeviceId;
use crate::store::KeyValueStore;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

/// Default time a member waits for the others.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Default bound on the memory a world keeps for reuse by large results.
pub const DEFAULT_POOL_BYTES: usize = 1 << 30;

/// A set of loopback devices sharing one rendezvous table.
#[derive(Clone)]
pub struct LoopbackWorld {
    shared: Arc<Shared>,
}

fn registry() -> &'static Mutex<HashMap<UniqueId, Weak<Shared>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<UniqueId, Weak<Shared>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl LoopbackWorld {
    /// A world of `num_devices` devices whose members wait at most `timeout`
    /// for each other.
    pub fn new(num_devices: usize, timeout: Duration) -> Result<LoopbackWorld> {
        if num_devices == 0 {
            return Err(CollectiveError::InvalidArgument(
                "a loopback world needs at least one device".into(),
            ));
        }
        let shared = Arc::new(Shared {
            id: UniqueId::random(),
            num_devices,
            timeout,
            recycler: Recycler::new(DEFAULT_POOL_BYTES),
            state: Mutex::new(State {
                claimed: vec![false; num_devices],
                ..State::default()
            }),
            cv: Condvar::new(),
        });
        let mut reg = lock(registry());
        reg.retain(|_, w| w.strong_count() > 0);
        reg.insert(shared.id, Arc::downgrade(&shared));
        Ok(LoopbackWorld { shared })
    }

    /// The world's id (what bootstrap publishes).
    pub fn unique_id(&self) -> UniqueId {
        self.shared.id
    }

    pub fn num_devices(&self) -> usize {
        self.shared.num_devices
    }

    /// The world registered under `id` in this process.
    pub fn lookup(id: &UniqueId) -> Result<LoopbackWorld> {
        lock(registry())
            .get(id)
            .and_then(Weak::upgrade)
            .map(|shared| LoopbackWorld { shared })
            .ok_or_else(|| {
                CollectiveError::Bootstrap(format!(
                    "no loopback world with id {} in this process (the loopback backend spans one process, and rank 0 must stay alive)",
                    id.short()
                ))
            })
    }

    /// The communicator of `device`; each device can be claimed once.
    pub fn communicator(&self, device: DeviceId) -> Result<LoopbackCommunicator> {
        let mut st = lock(&self.shared.state);
        match st.claimed.get_mut(device) {
            None => Err(CollectiveError::InvalidArgument(format!(
                "device {device} out of range (devices 0..{})",
                self.shared.num_devices
            ))),
            Some(true) => Err(CollectiveError::InvalidArgument(format!(
                "device {device} already has a communicator"
            ))),
            Some(c) => {
                *c = true;
                Ok(LoopbackCommunicator {
                    shared: self.shared.clone(),
                    device,
                    sequences: HashMap::new(),
                    p2p_sequences: HashMap::new(),
                    aborted: false,
                    fault: None,
                })
            }
        }
    }

    /// Communicators of every device, in device order.
    pub fn communicators(&self) -> Result<Vec<LoopbackCommunicator>> {
        (0..self.shared.num_devices)
            .map(|d| self.communicator(d))
            .collect()
    }
}

/// One device of a [`LoopbackWorld`].
pub struct LoopbackCommunicator {
    pub(super) shared: Arc<Shared>,
    pub(super) device: DeviceId,
    pub(super) sequences: HashMap<Vec<DeviceId>, u64>,
    pub(super) p2p_sequences: HashMap<(DeviceId, DeviceId, u64), u64>,
    pub(super) aborted: bool,
    pub(super) fault: Option<InjectedFault>,
}

/// Misbehaviour a test can inject into a communicator's next collective,
/// after it has arrived and before it does its share (fault tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedFault {
    /// The thread panics mid-way through the collective.
    PanicMidway,
    /// The thread stalls this long mid-way through the collective.
    StallMidway(Duration),
}

impl LoopbackCommunicator {
    /// Joins a loopback world through a key-value store, as NCCL ranks do:
    /// rank 0 creates the world and publishes its id under `prefix`, the
    /// others fetch it (waiting up to `timeout`) and attach. All ranks must
    /// live in this process.
    pub fn from_store(
        store: &dyn KeyValueStore,
        prefix: &str,
        rank: usize,
        world_size: usize,
        timeout: Duration,
    ) -> Result<LoopbackCommunicator> {
        if rank >= world_size {
            return Err(CollectiveError::InvalidArgument(format!(
                "rank {rank} out of range for world size {world_size}"
            )));
        }
        let mut mine = None;
        let id = bootstrap::exchange_unique_id(store, prefix, rank, timeout, || {
            let world = LoopbackWorld::new(world_size, timeout)?;
            mine = Some(world.communicator(0)?);
            Ok(world.unique_id())
        })?;
        match mine {
            Some(c) => Ok(c),
            None => LoopbackWorld::lookup(&id)?.communicator(rank),
        }
    }

    /// The world this communicator belongs to.
    pub fn world(&self) -> LoopbackWorld {
        LoopbackWorld {
            shared: self.shared.clone(),
        }
    }

    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Declares this device failed: every pending and future call involving
    /// it fails on the other members with [`CollectiveError::PeerFailed`].
    pub fn abort(&mut self, reason: &str) {
        self.aborted = true;
        mark_failed(&self.shared, self.device, reason);
    }

    /// Makes the next collective misbehave (for fault tests).
    pub fn inject_fault(&mut self, fault: InjectedFault) {
        self.fault = Some(fault);
    }

    pub(super) fn next_sequence(&mut self, group: &[DeviceId]) -> u64 {
        let s = self.sequences.entry(group.to_vec()).or_insert(0);
        let v = *s;
        *s += 1;
        v
    }

    pub(super) fn check_not_aborted(&self) -> Result<()> {
        if self.aborted {
            return Err(CollectiveError::InvalidArgument(format!(
                "device {} has aborted its communicator",
                self.device
            )));
        }
        Ok(())
    }

    pub(super) fn check_peer(&self, peer: DeviceId) -> Result<()> {
        if peer >= self.shared.num_devices {
            return Err(CollectiveError::InvalidArgument(format!(
                "peer {peer} out of range (devices 0..{})",
                self.shared.num_devices
            )));
        }
        Ok(())
    }
}

impl Drop for LoopbackCommunicator {
    fn drop(&mut self) {
        if !self.aborted {
            let reason = if std::thread::panicking() {
                "its thread panicked"
            } else {
                "its communicator was dropped"
            };
            mark_failed(&self.shared, self.device, reason);
        }
    }
}
