//! Loopback backend: N devices as threads of one process, pure Rust.
//!
//! All communicators of a [`LoopbackWorld`] share one rendezvous table
//! (`Mutex` + `Condvar`). A collective call is a *slot* keyed by (group,
//! sequence number of the call on that group): each member deposits its
//! operands (reference-counted, never copied), the last one to arrive builds
//! the work, then every member does its share of it in parallel:
//! * all-reduce: rank r folds the r-th 1/N of every operand into a shared
//!   output (the reduce-scatter half), and all members then hold the same
//!   immutable result (the all-gather half costs nothing);
//! * all-gather: rank r writes its operand into its slots of a shared output;
//! * reduce-scatter, all-to-all: rank r builds its own result, reading the
//!   others' operands in place;
//! * collective-permute, collective-broadcast, tuple all-to-all: results are
//!   the other ranks' operands themselves (zero copies); non-targets of a
//!   permute get zeros.
//!
//! Failure handling (no hang, no panic):
//! * a member missing at arrival or at the finish barrier past the timeout
//!   makes the slot fail with [`CollectiveError::Timeout`] naming the
//!   missing devices; every waiting member returns that error, and a late
//!   member finds it too (failed slots stay as tombstones without data);
//! * members that disagree about kind, parameters or shapes get
//!   [`CollectiveError::Mismatch`];
//! * a member that panics while doing its share, calls
//!   [`LoopbackCommunicator::abort`], or drops its communicator marks every
//!   pending and future call involving it as failed
//!   ([`CollectiveError::PeerFailed`]).
//!
//! Invariants: the table lock is never held while data is reduced or
//! copied; every shared output is written in disjoint ranges by distinct
//! ranks and read only after all of them passed the finish barrier.

use crate::bootstrap::{self, UniqueId};
use crate::buffer::{element_size, DeviceBuffer, HostBytes, Recycler};
use crate::communicator::{rank_in_group, Communicator};
use crate::error::{CallSite, CollectiveError, CollectiveKind, Result};
use crate::groups::DeviceId;
use crate::layout;
use crate::reduce::{reduce_into, ReductionKind};
use crate::store::KeyValueStore;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};
use xla_hlo_ir::PrimitiveType;

/// Default time a member waits for the others.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Default bound on the memory a world keeps for reuse by large results.
pub const DEFAULT_POOL_BYTES: usize = 1 << 30;

/// A set of loopback devices sharing one rendezvous table.
#[derive(Clone)]
pub struct LoopbackWorld {
    shared: Arc<Shared>,
}

struct Shared {
    id: UniqueId,
    num_devices: usize,
    timeout: Duration,
    recycler: Arc<Recycler>,
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
struct State {
    slots: HashMap<(Vec<DeviceId>, u64), Slot>,
    /// Devices that failed or left, with the reason.
    failed: HashMap<DeviceId, String>,
    /// (source, target, tag) -> messages in order.
    mailboxes: HashMap<(DeviceId, DeviceId, u64), VecDeque<DeviceBuffer>>,
    claimed: Vec<bool>,
}

/// What a call asks for; members must agree on it.
#[derive(Clone, Debug, PartialEq)]
enum Op {
    AllReduce(ReductionKind),
    AllGather(usize),
    ReduceScatter(ReductionKind, usize),
    AllToAll(usize, usize),
    AllToAllTuple,
    Permute(Vec<(DeviceId, DeviceId)>),
    Broadcast,
    Barrier,
}

impl Op {
    fn kind(&self) -> CollectiveKind {
        match self {
            Op::AllReduce(_) => CollectiveKind::AllReduce,
            Op::AllGather(_) => CollectiveKind::AllGather,
            Op::ReduceScatter(..) => CollectiveKind::ReduceScatter,
            Op::AllToAll(..) | Op::AllToAllTuple => CollectiveKind::AllToAll,
            Op::Permute(_) => CollectiveKind::CollectivePermute,
            Op::Broadcast => CollectiveKind::CollectiveBroadcast,
            Op::Barrier => CollectiveKind::Barrier,
        }
    }

    /// Ops whose result is one shared output written by all members.
    fn shared_output(&self) -> bool {
        matches!(self, Op::AllReduce(_) | Op::AllGather(_))
    }

    /// Ops whose operands must have the same shapes on every member.
    fn same_shapes(&self) -> bool {
        !matches!(self, Op::AllToAllTuple | Op::Barrier)
    }

    fn describe(&self) -> String {
        match self {
            Op::AllReduce(k) => format!("all-reduce to_apply={}", k.opcode()),
            Op::AllGather(d) => format!("all-gather dimensions={{{d}}}"),
            Op::ReduceScatter(k, d) => {
                format!("reduce-scatter to_apply={} dimensions={{{d}}}", k.opcode())
            }
            Op::AllToAll(s, c) => format!("all-to-all split={s} concat={c}"),
            Op::AllToAllTuple => "tuple all-to-all".into(),
            Op::Permute(p) => format!("collective-permute pairs={p:?}"),
            Op::Broadcast => "collective-broadcast".into(),
            Op::Barrier => "barrier".into(),
        }
    }
}

struct Slot {
    call: CallSite,
    op: Op,
    first_rank: usize,
    inputs: Vec<Option<Vec<DeviceBuffer>>>,
    arrived: usize,
    work: Option<Arc<Work>>,
    finished: Vec<bool>,
    results: Option<Arc<Vec<DeviceBuffer>>>,
    left: usize,
    error: Option<CollectiveError>,
}

impl Slot {
    fn fail(&mut self, err: CollectiveError) {
        if self.error.is_none() {
            self.error = Some(err);
        }
        // A tombstone keeps the error, not the data.
        self.inputs.iter_mut().for_each(|i| *i = None);
        self.work = None;
        self.results = None;
    }
}

/// The data of one call once every member has arrived.
struct Work {
    op: Op,
    n: usize,
    /// `[rank][operand]`.
    inputs: Vec<Vec<DeviceBuffer>>,
    /// One per operand, for shared-output ops.
    outputs: Vec<SharedOutput>,
    /// Output (type, dims) per operand, for shared-output ops.
    output_shapes: Vec<(PrimitiveType, Vec<i64>)>,
    /// Where large result buffers come from.
    recycler: Arc<Recycler>,
}

/// An output buffer that several ranks write in disjoint ranges.
struct SharedOutput {
    ptr: *mut u8,
    len: usize,
    storage: Mutex<Option<HostBytes>>,
}

// SAFETY: the raw pointer targets the heap block owned by `storage`, which
// lives as long as this value; concurrent writers use disjoint ranges
// (`Work::run`), and the storage is taken out only after every writer passed
// the finish barrier (which orders their writes before the read through the
// table mutex).
unsafe impl Send for SharedOutput {}
unsafe impl Sync for SharedOutput {}

impl SharedOutput {
    /// Every byte must be written before [`SharedOutput::take`].
    fn new(len: usize, recycler: &Arc<Recycler>) -> SharedOutput {
        let mut bytes = recycler.take_uninit(len);
        let ptr = bytes.as_mut_ptr();
        SharedOutput {
            ptr,
            len,
            storage: Mutex::new(Some(bytes)),
        }
    }

    /// # Safety
    /// No other thread may access `start..start + len` until the finish
    /// barrier; the range must be in bounds (checked, returns None).
    #[allow(clippy::mut_from_ref)]
    unsafe fn range(&self, start: usize, len: usize) -> Option<&mut [u8]> {
        if start.checked_add(len)? > self.len {
            return None;
        }
        Some(std::slice::from_raw_parts_mut(self.ptr.add(start), len))
    }

    fn take(&self) -> Option<HostBytes> {
        lock(&self.storage).take()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn invalid(call: &CallSite, msg: impl std::fmt::Display) -> CollectiveError {
    CollectiveError::InvalidArgument(format!("{call}: {msg}"))
}

impl Work {
    /// Validates the call as a whole and allocates shared outputs.
    fn build(
        op: Op,
        inputs: Vec<Vec<DeviceBuffer>>,
        group: &[DeviceId],
        call: &CallSite,
        recycler: &Arc<Recycler>,
    ) -> Result<Work> {
        let n = inputs.len();
        let mut outputs = Vec::new();
        let mut output_shapes = Vec::new();
        let first = &inputs[0];
        match &op {
            Op::AllReduce(kind) => {
                for b in first {
                    kind.check(b.dtype())?;
                    output_shapes.push((b.dtype(), b.dims().to_vec()));
                }
            }
            Op::AllGather(d) => {
                for b in first {
                    let dims =
                        layout::all_gather_dims(b.dims(), *d, n).map_err(|e| invalid(call, e))?;
                    output_shapes.push((b.dtype(), dims));
                }
            }
            Op::ReduceScatter(kind, d) => {
                for b in first {
                    kind.check(b.dtype())?;
                    layout::reduce_scatter_dims(b.dims(), *d, n).map_err(|e| invalid(call, e))?;
                }
            }
            Op::AllToAll(s, c) => {
                for b in first {
                    layout::all_to_all_dims(b.dims(), *s, *c, n).map_err(|e| invalid(call, e))?;
                }
            }
            Op::AllToAllTuple => {
                for (r, ops) in inputs.iter().enumerate() {
                    if ops.len() != n {
                        return Err(CollectiveError::Mismatch {
                            call: call.clone(),
                            detail: format!(
                                "rank {r} passed {} operands to a tuple all-to-all over {n} ranks",
                                ops.len()
                            ),
                        });
                    }
                }
                for r in 0..n {
                    for j in 0..n {
                        if !inputs[j][r].same_shape(&inputs[r][j]) {
                            return Err(CollectiveError::Mismatch {
                                call: call.clone(),
                                detail: format!(
                                    "rank {j} sends {} to rank {r}, whose operand {j} is {}",
                                    inputs[j][r].shape_string(),
                                    inputs[r][j].shape_string()
                                ),
                            });
                        }
                    }
                }
            }
            Op::Permute(pairs) => {
                crate::groups::check_pairs(pairs)?;
                for &(s, t) in pairs {
                    if !group.contains(&s) || !group.contains(&t) {
                        return Err(CollectiveError::InvalidGroups(format!(
                            "{call}: pair ({s}, {t}) names a device outside the group"
                        )));
                    }
                }
            }
            Op::Broadcast | Op::Barrier => {}
        }
        if op.shared_output() && n > 1 {
            for (dtype, dims) in &output_shapes {
                let len = crate::buffer::element_count(dims)? * element_size(*dtype)?;
                outputs.push(SharedOutput::new(len, recycler));
            }
        }
        Ok(Work {
            op,
            n,
            inputs,
            outputs,
            output_shapes,
            recycler: recycler.clone(),
        })
    }

    /// Does `rank`'s share. Returns the rank's private result, or `None` for
    /// shared-output ops (whose result exists after the finish barrier).
    fn run(&self, rank: usize, group: &[DeviceId]) -> Result<Option<Vec<DeviceBuffer>>> {
        let n = self.n;
        if !self.shared() && self.op.shared_output() {
            // One member: its operands are the result (all-reduce, all-gather).
            return Ok(Some(self.inputs[0].clone()));
        }
        match &self.op {
            Op::AllReduce(kind) => {
                for (i, out) in self.outputs.iter().enumerate() {
                    let dtype = self.output_shapes[i].0;
                    let esize = element_size(dtype)?;
                    let count = out.len / esize.max(1);
                    let lo = count * rank / n;
                    let hi = count * (rank + 1) / n;
                    let (a, b) = (lo * esize, hi * esize);
                    let srcs: Vec<&[u8]> = self
                        .inputs
                        .iter()
                        .map(|ops| &ops[i].bytes()[a..b])
                        .collect();
                    // SAFETY: rank r alone writes elements [count*r/n, count*(r+1)/n).
                    let dst = unsafe { out.range(a, b - a) }
                        .ok_or_else(|| CollectiveError::InvalidArgument("output range".into()))?;
                    reduce_into(*kind, dtype, &srcs, dst)?;
                }
                Ok(None)
            }
            Op::AllGather(d) => {
                for (i, out) in self.outputs.iter().enumerate() {
                    let mine = &self.inputs[rank][i];
                    let (outer, dim, inner) =
                        layout::split_at(mine.dims(), *d, mine.element_size());
                    let blk = dim * inner;
                    for o in 0..outer {
                        // SAFETY: rank r alone writes block (o, r) of each row.
                        let dst =
                            unsafe { out.range((o * n + rank) * blk, blk) }.ok_or_else(|| {
                                CollectiveError::InvalidArgument("output range".into())
                            })?;
                        dst.copy_from_slice(&mine.bytes()[o * blk..(o + 1) * blk]);
                    }
                }
                Ok(None)
            }
            Op::ReduceScatter(kind, d) => {
                let mut results = Vec::new();
                for i in 0..self.inputs[rank].len() {
                    let mine = &self.inputs[rank][i];
                    let dims = layout::reduce_scatter_dims(mine.dims(), *d, n)?;
                    let (outer, dim, inner) =
                        layout::split_at(mine.dims(), *d, mine.element_size());
                    let seg = dim / n * inner;
                    // Every byte is written below.
                    let mut out = self.recycler.take_uninit(outer * seg);
                    for o in 0..outer {
                        let start = o * dim * inner + rank * seg;
                        let srcs: Vec<&[u8]> = self
                            .inputs
                            .iter()
                            .map(|ops| &ops[i].bytes()[start..start + seg])
                            .collect();
                        reduce_into(
                            *kind,
                            mine.dtype(),
                            &srcs,
                            &mut out.as_bytes_mut()[o * seg..(o + 1) * seg],
                        )?;
                    }
                    results.push(DeviceBuffer::new(mine.dtype(), dims, out)?);
                }
                Ok(Some(results))
            }
            Op::AllToAll(s, c) => {
                let mut results = Vec::new();
                for i in 0..self.inputs[rank].len() {
                    let mine = &self.inputs[rank][i];
                    let dims = layout::all_to_all_dims(mine.dims(), *s, *c, n)?;
                    let esize = mine.element_size();
                    let mut piece: Vec<usize> = mine.dims().iter().map(|&x| x as usize).collect();
                    piece[*s] /= n;
                    // The blocks of all members tile the output.
                    let mut out = self
                        .recycler
                        .take_uninit(crate::buffer::element_count(&dims)? * esize);
                    for (j, ops) in self.inputs.iter().enumerate() {
                        let mut src_start = vec![0; piece.len()];
                        src_start[*s] = rank * piece[*s];
                        let mut dst_start = vec![0; piece.len()];
                        dst_start[*c] = j * piece[*c];
                        layout::copy_block(
                            ops[i].bytes(),
                            ops[i].dims(),
                            &src_start,
                            out.as_bytes_mut(),
                            &dims,
                            &dst_start,
                            &piece,
                            esize,
                        )?;
                    }
                    results.push(DeviceBuffer::new(mine.dtype(), dims, out)?);
                }
                Ok(Some(results))
            }
            Op::AllToAllTuple => Ok(Some((0..n).map(|j| self.inputs[j][rank].clone()).collect())),
            Op::Permute(pairs) => {
                let me = group[rank];
                let mine = &self.inputs[rank];
                match pairs.iter().find(|&&(_, t)| t == me) {
                    Some(&(s, _)) => {
                        let src = group.iter().position(|&d| d == s).unwrap_or(rank);
                        Ok(Some(self.inputs[src].clone()))
                    }
                    None => Ok(Some(
                        mine.iter()
                            .map(|b| {
                                let zeros = self.recycler.take_zeroed(b.bytes().len());
                                DeviceBuffer::new(b.dtype(), b.dims().to_vec(), zeros)
                            })
                            .collect::<Result<_>>()?,
                    )),
                }
            }
            Op::Broadcast => Ok(Some(self.inputs[0].clone())),
            Op::Barrier => Ok(Some(Vec::new())),
        }
    }

    /// Whether the result is a shared output that needs the finish barrier.
    fn shared(&self) -> bool {
        self.op.shared_output() && self.n > 1
    }

    /// The shared results, once every member has run.
    fn finish(&self) -> Result<Vec<DeviceBuffer>> {
        self.outputs
            .iter()
            .zip(&self.output_shapes)
            .map(|(out, (dtype, dims))| {
                let bytes = out
                    .take()
                    .ok_or_else(|| CollectiveError::InvalidArgument("output taken twice".into()))?;
                DeviceBuffer::new(*dtype, dims.clone(), bytes)
            })
            .collect()
    }
}

/// Marks the slot failed if the rank's share did not complete (panic).
struct RunGuard<'a> {
    shared: &'a Shared,
    key: &'a (Vec<DeviceId>, u64),
    device: DeviceId,
    armed: bool,
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut st = lock(&self.shared.state);
        if let Some(slot) = st.slots.get_mut(self.key) {
            let call = slot.call.clone();
            slot.fail(CollectiveError::PeerFailed {
                call,
                device: self.device,
                reason: "panicked while executing its part".into(),
            });
        }
        st.failed
            .insert(self.device, "panicked during a collective".into());
        self.shared.cv.notify_all();
    }
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
    shared: Arc<Shared>,
    device: DeviceId,
    sequences: HashMap<Vec<DeviceId>, u64>,
    p2p_sequences: HashMap<(DeviceId, DeviceId, u64), u64>,
    aborted: bool,
    fault: Option<InjectedFault>,
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

    fn next_sequence(&mut self, group: &[DeviceId]) -> u64 {
        let s = self.sequences.entry(group.to_vec()).or_insert(0);
        let v = *s;
        *s += 1;
        v
    }

    fn check_not_aborted(&self) -> Result<()> {
        if self.aborted {
            return Err(CollectiveError::InvalidArgument(format!(
                "device {} has aborted its communicator",
                self.device
            )));
        }
        Ok(())
    }

    /// Runs one collective call through the rendezvous table.
    fn collective(
        &mut self,
        group: &[DeviceId],
        op: Op,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.check_not_aborted()?;
        let rank = rank_in_group(group, self.device, self.shared.num_devices)?;
        let sequence = self.next_sequence(group);
        let call = CallSite {
            kind: op.kind(),
            group: group.to_vec(),
            sequence,
        };
        let n = group.len();
        let key = (group.to_vec(), sequence);
        let shared = &*self.shared;
        let timeout = shared.timeout;
        let arrived_at = Instant::now();

        // Phase 1: arrive and wait for the work.
        let work = {
            let mut st = lock(&shared.state);
            let failed_member = group
                .iter()
                .find_map(|d| st.failed.get(d).map(|r| (*d, r.clone())));
            let slot = st.slots.entry(key.clone()).or_insert_with(|| Slot {
                call: call.clone(),
                op: op.clone(),
                first_rank: rank,
                inputs: vec![None; n],
                arrived: 0,
                work: None,
                finished: vec![false; n],
                results: None,
                left: 0,
                error: None,
            });
            if let Some(e) = &slot.error {
                return Err(e.clone());
            }
            if let Some((device, reason)) = failed_member {
                let err = CollectiveError::PeerFailed {
                    call: call.clone(),
                    device,
                    reason,
                };
                slot.fail(err.clone());
                shared.cv.notify_all();
                return Err(err);
            }
            if let Some(detail) = mismatch(slot, &op, rank, operands) {
                let err = CollectiveError::Mismatch {
                    call: call.clone(),
                    detail,
                };
                slot.fail(err.clone());
                shared.cv.notify_all();
                return Err(err);
            }
            if slot.inputs[rank].is_some() {
                return Err(CollectiveError::InvalidArgument(format!(
                    "{call}: device {} arrived twice",
                    self.device
                )));
            }
            slot.inputs[rank] = Some(operands.to_vec());
            slot.arrived += 1;
            if slot.arrived == n {
                let inputs: Vec<Vec<DeviceBuffer>> = slot
                    .inputs
                    .iter_mut()
                    .map(|i| i.take().unwrap_or_default())
                    .collect();
                match Work::build(op.clone(), inputs, group, &call, &shared.recycler) {
                    Ok(w) => slot.work = Some(Arc::new(w)),
                    Err(e) => slot.fail(e),
                }
                shared.cv.notify_all();
            }
            let deadline = arrived_at + timeout;
            loop {
                let slot = st.slots.get_mut(&key).ok_or_else(|| {
                    CollectiveError::InvalidArgument(format!("{call}: slot vanished"))
                })?;
                if let Some(e) = &slot.error {
                    return Err(e.clone());
                }
                if let Some(w) = &slot.work {
                    break w.clone();
                }
                let now = Instant::now();
                if now >= deadline {
                    let missing_ranks: Vec<usize> =
                        (0..n).filter(|&r| slot.inputs[r].is_none()).collect();
                    let err = CollectiveError::Timeout {
                        call: call.clone(),
                        missing: missing_ranks.iter().map(|&r| group[r]).collect(),
                        missing_ranks,
                        stage: "arrive",
                        waited: timeout,
                    };
                    slot.fail(err.clone());
                    shared.cv.notify_all();
                    return Err(err);
                }
                st = shared
                    .cv
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        };

        // Phase 2: this rank's share, outside the lock.
        let mut guard = RunGuard {
            shared,
            key: &key,
            device: self.device,
            armed: true,
        };
        match self.fault.take() {
            Some(InjectedFault::PanicMidway) => {
                panic!(
                    "injected fault: device {} panics during {call}",
                    self.device
                )
            }
            Some(InjectedFault::StallMidway(d)) => std::thread::sleep(d),
            None => {}
        }
        let private = work.run(rank, group);
        guard.armed = false;
        drop(guard);
        let private = match private {
            Ok(p) => p,
            Err(e) => {
                let mut st = lock(&shared.state);
                if let Some(slot) = st.slots.get_mut(&key) {
                    slot.fail(CollectiveError::PeerFailed {
                        call: call.clone(),
                        device: self.device,
                        reason: e.to_string(),
                    });
                }
                shared.cv.notify_all();
                return Err(e);
            }
        };
        if !work.shared() {
            // Private results: the work keeps every operand alive for the
            // others, so this rank can leave now.
            let mut st = lock(&shared.state);
            leave(&mut st, &key, n);
            drop(work);
            return Ok(private.unwrap_or_default());
        }

        // Phase 3: finish barrier, then take the shared results.
        let mut st = lock(&shared.state);
        let finished_at = Instant::now();
        let deadline = finished_at + timeout;
        {
            let slot = st.slots.get_mut(&key).ok_or_else(|| {
                CollectiveError::InvalidArgument(format!("{call}: slot vanished"))
            })?;
            if let Some(e) = &slot.error {
                return Err(e.clone());
            }
            slot.finished[rank] = true;
            if slot.finished.iter().all(|&f| f) {
                match work.finish() {
                    Ok(r) => slot.results = Some(Arc::new(r)),
                    Err(e) => slot.fail(e),
                }
                shared.cv.notify_all();
            }
        }
        drop(work);
        loop {
            let slot = st.slots.get_mut(&key).ok_or_else(|| {
                CollectiveError::InvalidArgument(format!("{call}: slot vanished"))
            })?;
            if let Some(e) = &slot.error {
                return Err(e.clone());
            }
            if let Some(r) = &slot.results {
                let out = r.as_ref().clone();
                leave(&mut st, &key, n);
                return Ok(out);
            }
            let now = Instant::now();
            if now >= deadline {
                let missing_ranks: Vec<usize> = (0..n).filter(|&r| !slot.finished[r]).collect();
                let err = CollectiveError::Timeout {
                    call: call.clone(),
                    missing: missing_ranks.iter().map(|&r| group[r]).collect(),
                    missing_ranks,
                    stage: "finish",
                    waited: timeout,
                };
                slot.fail(err.clone());
                shared.cv.notify_all();
                return Err(err);
            }
            st = shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn check_peer(&self, peer: DeviceId) -> Result<()> {
        if peer >= self.shared.num_devices {
            return Err(CollectiveError::InvalidArgument(format!(
                "peer {peer} out of range (devices 0..{})",
                self.shared.num_devices
            )));
        }
        Ok(())
    }
}

/// Records that `rank` took its result; removes the slot when all did.
fn leave(st: &mut State, key: &(Vec<DeviceId>, u64), n: usize) {
    if let Some(slot) = st.slots.get_mut(key) {
        slot.left += 1;
        if slot.left == n && slot.error.is_none() {
            st.slots.remove(key);
        }
    }
}

/// Compares a member's call with the first member's.
fn mismatch(slot: &Slot, op: &Op, rank: usize, operands: &[DeviceBuffer]) -> Option<String> {
    if slot.op != *op {
        return Some(format!(
            "rank {rank} called {} but rank {} called {}",
            op.describe(),
            slot.first_rank,
            slot.op.describe()
        ));
    }
    if !op.same_shapes() {
        return None;
    }
    // Compare against any member that already deposited operands.
    let (other_rank, theirs) = slot
        .inputs
        .iter()
        .enumerate()
        .find_map(|(r, i)| i.as_ref().map(|i| (r, i)))?;
    layout::describe_shape_mismatch(operands, rank, theirs, other_rank)
}

fn mark_failed(shared: &Shared, device: DeviceId, reason: &str) {
    let mut st = lock(&shared.state);
    st.failed
        .entry(device)
        .or_insert_with(|| reason.to_string());
    for slot in st.slots.values_mut() {
        if slot.error.is_some() {
            continue;
        }
        let Some(rank) = slot.call.group.iter().position(|&d| d == device) else {
            continue;
        };
        let pending = if slot.work.is_none() {
            slot.inputs[rank].is_none()
        } else {
            slot.op.shared_output() && !slot.finished[rank]
        };
        if pending {
            let call = slot.call.clone();
            slot.fail(CollectiveError::PeerFailed {
                call,
                device,
                reason: reason.to_string(),
            });
        }
    }
    shared.cv.notify_all();
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

impl Communicator for LoopbackCommunicator {
    fn device(&self) -> DeviceId {
        self.device
    }

    fn num_devices(&self) -> usize {
        self.shared.num_devices
    }

    fn backend_name(&self) -> &'static str {
        "loopback"
    }

    fn abort(&mut self, reason: &str) {
        LoopbackCommunicator::abort(self, reason);
    }

    fn all_reduce(
        &mut self,
        group: &[DeviceId],
        kind: ReductionKind,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::AllReduce(kind), operands)
    }

    fn all_gather(
        &mut self,
        group: &[DeviceId],
        dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::AllGather(dimension), operands)
    }

    fn reduce_scatter(
        &mut self,
        group: &[DeviceId],
        kind: ReductionKind,
        dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::ReduceScatter(kind, dimension), operands)
    }

    fn all_to_all(
        &mut self,
        group: &[DeviceId],
        split_dimension: usize,
        concat_dimension: usize,
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(
            group,
            Op::AllToAll(split_dimension, concat_dimension),
            operands,
        )
    }

    fn all_to_all_tuple(
        &mut self,
        group: &[DeviceId],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::AllToAllTuple, operands)
    }

    fn collective_permute(
        &mut self,
        group: &[DeviceId],
        pairs: &[(DeviceId, DeviceId)],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::Permute(pairs.to_vec()), operands)
    }

    fn collective_broadcast(
        &mut self,
        group: &[DeviceId],
        operands: &[DeviceBuffer],
    ) -> Result<Vec<DeviceBuffer>> {
        self.collective(group, Op::Broadcast, operands)
    }

    fn send(&mut self, peer: DeviceId, tag: u64, buffer: &DeviceBuffer) -> Result<()> {
        self.check_not_aborted()?;
        self.check_peer(peer)?;
        let mut st = lock(&self.shared.state);
        st.mailboxes
            .entry((self.device, peer, tag))
            .or_default()
            .push_back(buffer.clone());
        self.shared.cv.notify_all();
        Ok(())
    }

    fn recv(
        &mut self,
        peer: DeviceId,
        tag: u64,
        dtype: PrimitiveType,
        dims: &[i64],
    ) -> Result<DeviceBuffer> {
        self.check_not_aborted()?;
        self.check_peer(peer)?;
        let seq = {
            let s = self
                .p2p_sequences
                .entry((peer, self.device, tag))
                .or_insert(0);
            *s += 1;
            *s - 1
        };
        let call = CallSite {
            kind: CollectiveKind::Recv,
            group: vec![peer, self.device],
            sequence: seq,
        };
        let shared = &*self.shared;
        let deadline = Instant::now() + shared.timeout;
        let mut st = lock(&shared.state);
        loop {
            let key = (peer, self.device, tag);
            if let Some(b) = st.mailboxes.get_mut(&key).and_then(|q| q.pop_front()) {
                if st.mailboxes.get(&key).is_some_and(|q| q.is_empty()) {
                    st.mailboxes.remove(&key);
                }
                shared.cv.notify_all();
                if b.dtype() != dtype || b.dims() != dims {
                    return Err(CollectiveError::Mismatch {
                        call,
                        detail: format!(
                            "device {peer} sent {} on channel {tag}, device {} expects {}",
                            b.shape_string(),
                            self.device,
                            crate::buffer::shape_string(dtype, dims)
                        ),
                    });
                }
                return Ok(b);
            }
            if let Some(reason) = st.failed.get(&peer) {
                return Err(CollectiveError::PeerFailed {
                    call,
                    device: peer,
                    reason: reason.clone(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CollectiveError::Timeout {
                    call,
                    missing: vec![peer],
                    missing_ranks: vec![0],
                    stage: "send",
                    waited: shared.timeout,
                });
            }
            st = shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn wait_sends(&mut self) -> Result<()> {
        let shared = &*self.shared;
        let deadline = Instant::now() + shared.timeout;
        let mut st = lock(&shared.state);
        loop {
            let mut pending: Vec<(DeviceId, u64)> = st
                .mailboxes
                .iter()
                .filter(|((s, _, _), q)| *s == self.device && !q.is_empty())
                .map(|((_, t, tag), _)| (*t, *tag))
                .collect();
            if pending.is_empty() {
                return Ok(());
            }
            pending.sort_unstable();
            if let Some(&(peer, _)) = pending.iter().find(|(t, _)| st.failed.contains_key(t)) {
                return Err(CollectiveError::PeerFailed {
                    call: CallSite {
                        kind: CollectiveKind::Send,
                        group: vec![self.device, peer],
                        sequence: 0,
                    },
                    device: peer,
                    reason: st.failed[&peer].clone(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                let mut missing: Vec<DeviceId> = pending.iter().map(|(t, _)| *t).collect();
                missing.dedup();
                return Err(CollectiveError::Timeout {
                    call: CallSite {
                        kind: CollectiveKind::Send,
                        group: [vec![self.device], missing.clone()].concat(),
                        sequence: 0,
                    },
                    missing_ranks: (1..=missing.len()).collect(),
                    missing,
                    stage: "receive",
                    waited: shared.timeout,
                });
            }
            st = shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn barrier(&mut self, group: &[DeviceId]) -> Result<()> {
        self.collective(group, Op::Barrier, &[]).map(|_| ())
    }
}

/// What one device of [`run_world`] ended with.
#[derive(Debug)]
pub enum DeviceOutcome<T, E> {
    Done(T),
    Failed(E),
    /// The device's thread panicked or could not start (the message).
    Panicked(String),
}

/// Runs `program` on every device of a new loopback world of `num_devices`
/// devices, one thread each. A device whose program fails or panics aborts
/// its communicator, so the others get an error naming it instead of
/// waiting for `timeout`. Returns each device's outcome, in device order.
pub fn run_world<T, E, F>(
    num_devices: usize,
    timeout: Duration,
    program: F,
) -> Result<Vec<DeviceOutcome<T, E>>>
where
    T: Send,
    E: Send + std::fmt::Display,
    F: Fn(DeviceId, &Mutex<LoopbackCommunicator>) -> std::result::Result<T, E> + Sync,
{
    let world = LoopbackWorld::new(num_devices, timeout)?;
    let cells: Vec<Mutex<LoopbackCommunicator>> =
        world.communicators()?.into_iter().map(Mutex::new).collect();
    let program = &program;
    let run_one = |device: DeviceId, cell: &Mutex<LoopbackCommunicator>| {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| program(device, cell)));
        let outcome = match r {
            Ok(Ok(v)) => return DeviceOutcome::Done(v),
            Ok(Err(e)) => {
                lock(cell).abort(&format!("device {device} failed: {e}"));
                return DeviceOutcome::Failed(e);
            }
            Err(payload) => payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default(),
        };
        lock(cell).abort(&format!("device {device} panicked: {outcome}"));
        DeviceOutcome::Panicked(outcome)
    };
    let run_one = &run_one;
    Ok(std::thread::scope(|s| {
        let handles: Vec<_> = cells
            .iter()
            .enumerate()
            .map(|(device, cell)| {
                std::thread::Builder::new()
                    .name(format!("loopback-device-{device}"))
                    .spawn_scoped(s, move || run_one(device, cell))
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(device, handle)| {
                let why = match handle.map(|h| h.join()) {
                    Ok(Ok(outcome)) => return outcome,
                    Ok(Err(_)) => "its thread died".to_string(),
                    Err(e) => format!("could not start its thread: {e}"),
                };
                lock(&cells[device]).abort(&format!("device {device}: {why}"));
                DeviceOutcome::Panicked(why)
            })
            .collect()
    }))
}
