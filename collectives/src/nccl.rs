//! NCCL backend (cargo feature `nccl`): a [`Transport`] over one NCCL
//! communicator per device, through cudarc's `nccl::result` layer, so that
//! [`StagedCommunicator`] gives XLA's collectives on GPUs.
//!
//! * Bootstrap: [`NcclCommunicator::from_store`] needs only a key-value
//!   store, the world size and this process's rank: rank 0 calls
//!   `ncclGetUniqueId` and publishes the 128 bytes through
//!   [`crate::bootstrap`], every rank then calls `ncclCommInitRank`.
//! * Every operation runs on a dedicated stream of the device (not the
//!   default stream); all operands of one collective go in one
//!   `ncclGroupStart`/`ncclGroupEnd` group.
//! * Buffers are host [`crate::DeviceBuffer`]s staged through device memory
//!   (the interpreter's values live on the host).
//! * A watchdog waits for the stream with the communicator's timeout; past
//!   it the communicator is aborted (`ncclCommAbort` unblocks the kernels)
//!   and every later call fails at once. NCCL cannot tell which peer is
//!   missing, so the error names the group.
//! * Missing libraries are an error, never a panic: cudarc panics on first
//!   use of an absent library, so [`nccl_available`] probes
//!   `is_culib_present()` first. cudarc looks for `libnccl.so` (not
//!   `libnccl.so.2`): put a `libnccl.so` symlink on `LD_LIBRARY_PATH` where
//!   only the versioned file exists.
//!
//! Native paths: f32/f64/f16/bf16/s8/u8/s32/u32/s64/u64 with sum, product,
//! min, max; pred with and/or/min/max (as u8 min/max). Everything else
//! (and/or of integers, s16/u16, sub-byte, f8, complex) uses the staged
//! send/recv fallback with host reduction. NCCL's reduction order (and its
//! f16/bf16 accumulation) is its own, so float results may differ from the
//! loopback backend in the last bits.
//!
//! Invariant: no `unsafe` NCCL call is made before the libraries were found
//! and the communicator initialized; raw communicators are destroyed (or
//! aborted after a timeout) exactly once.

use crate::bootstrap::{rendezvous, UniqueId, UNIQUE_ID_BYTES};
use crate::buffer::HostBytes;
use crate::error::{CollectiveError, Result};
use crate::reduce::ReductionKind;
use crate::staged::{StagedCommunicator, Transport};
use crate::store::KeyValueStore;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use cudarc::nccl::{result as nccl, sys};
use std::sync::Arc;
use std::time::{Duration, Instant};
use xla_hlo_ir::PrimitiveType;

/// XLA collectives over NCCL.
pub type NcclCommunicator = StagedCommunicator<NcclTransport>;

/// Ok when libcuda and libnccl can be loaded; otherwise the typed error
/// every constructor returns.
pub fn nccl_available() -> Result<()> {
    // SAFETY: the probes only try to dlopen the libraries.
    let cuda = unsafe { cudarc::driver::sys::is_culib_present() };
    let nccl = unsafe { cudarc::nccl::sys::is_culib_present() };
    match (cuda, nccl) {
        (true, true) => Ok(()),
        (false, _) => Err(CollectiveError::BackendUnavailable(
            "the CUDA driver library (libcuda.so) was not found".into(),
        )),
        (true, false) => Err(CollectiveError::BackendUnavailable(
            "libnccl.so was not found (cudarc does not look for libnccl.so.2: add a libnccl.so symlink on LD_LIBRARY_PATH)"
                .into(),
        )),
    }
}

fn nccl_err(what: &str, e: nccl::NcclError) -> CollectiveError {
    CollectiveError::Backend(format!("{what}: {:?}", e.0))
}

fn cuda_err(what: &str, e: cudarc::driver::DriverError) -> CollectiveError {
    CollectiveError::Backend(format!("{what}: {e}"))
}

/// An owned raw NCCL communicator.
struct RawComm(sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread, one at a time;
// `NcclTransport` owns it and uses it through `&mut self`.
unsafe impl Send for RawComm {}

impl Drop for RawComm {
    fn drop(&mut self) {
        // SAFETY: the communicator is valid and dropped once.
        unsafe {
            let _ = nccl::comm_destroy(self.0);
        }
    }
}

/// One rank's NCCL communicator, device context and dedicated stream.
pub struct NcclTransport {
    rank: usize,
    world: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    comm: Option<RawComm>,
    timeout: Duration,
    unique_id: UniqueId,
    broken: Option<String>,
}

impl NcclCommunicator {
    /// Joins the NCCL world through `store`: rank 0 creates the unique id and
    /// publishes it under `prefix`; every rank waits at most `timeout` for
    /// the others. `device_ordinal` is the local GPU this rank drives.
    pub fn from_store(
        store: &dyn KeyValueStore,
        prefix: &str,
        rank: usize,
        world_size: usize,
        device_ordinal: usize,
        timeout: Duration,
    ) -> Result<NcclCommunicator> {
        Ok(StagedCommunicator::new(NcclTransport::from_store(
            store,
            prefix,
            rank,
            world_size,
            device_ordinal,
            timeout,
        )?))
    }
}

impl NcclTransport {
    /// See [`NcclCommunicator::from_store`].
    pub fn from_store(
        store: &dyn KeyValueStore,
        prefix: &str,
        rank: usize,
        world_size: usize,
        device_ordinal: usize,
        timeout: Duration,
    ) -> Result<NcclTransport> {
        nccl_available()?;
        if rank >= world_size {
            return Err(CollectiveError::InvalidArgument(format!(
                "rank {rank} out of range for world size {world_size}"
            )));
        }
        let ctx = CudaContext::new(device_ordinal).map_err(|e| cuda_err("CUDA context", e))?;
        let stream = ctx.new_stream().map_err(|e| cuda_err("CUDA stream", e))?;
        let info = rendezvous(store, prefix, Some(rank), world_size, timeout, || {
            let id = nccl::get_uniqueid().map_err(|e| nccl_err("ncclGetUniqueId", e))?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            UniqueId::from_bytes(&bytes)
        })?;
        let mut internal = [0 as std::ffi::c_char; UNIQUE_ID_BYTES];
        for (d, s) in internal.iter_mut().zip(info.unique_id.as_bytes()) {
            *d = *s as std::ffi::c_char;
        }
        let id = sys::ncclUniqueId { internal };
        ctx.bind_to_thread()
            .map_err(|e| cuda_err("bind context", e))?;
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        let nranks = i32::try_from(world_size)
            .map_err(|_| CollectiveError::InvalidArgument("world size too large".into()))?;
        // SAFETY: `comm` is a valid out-pointer; the id came from rank 0's
        // ncclGetUniqueId; rank < world size.
        unsafe { nccl::comm_init_rank(&mut comm, nranks, id, rank as i32) }
            .map_err(|e| nccl_err("ncclCommInitRank", e))?;
        Ok(NcclTransport {
            rank,
            world: world_size,
            ctx,
            stream,
            comm: Some(RawComm(comm)),
            timeout,
            unique_id: info.unique_id,
            broken: None,
        })
    }

    /// The id all ranks share.
    pub fn unique_id(&self) -> UniqueId {
        self.unique_id
    }

    /// NCCL's version number (e.g. 22809).
    pub fn nccl_version() -> Result<i32> {
        nccl_available()?;
        nccl::get_nccl_version().map_err(|e| nccl_err("ncclGetVersion", e))
    }

    fn comm(&self) -> Result<sys::ncclComm_t> {
        if let Some(b) = &self.broken {
            return Err(CollectiveError::Backend(format!(
                "NCCL communicator of rank {} was aborted: {b}",
                self.rank
            )));
        }
        self.comm
            .as_ref()
            .map(|c| c.0)
            .ok_or_else(|| CollectiveError::Backend("NCCL communicator is gone".into()))
    }

    fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>> {
        if bytes.is_empty() {
            return self.alloc(0);
        }
        self.stream
            .clone_htod(bytes)
            .map_err(|e| cuda_err("host-to-device copy", e))
    }

    fn alloc(&self, len: usize) -> Result<CudaSlice<u8>> {
        self.stream
            .alloc_zeros::<u8>(len.max(1))
            .map_err(|e| cuda_err("device allocation", e))
    }

    fn download(&self, slice: &CudaSlice<u8>, len: usize) -> Result<Vec<u8>> {
        let mut v = self
            .stream
            .clone_dtoh(slice)
            .map_err(|e| cuda_err("device-to-host copy", e))?;
        v.truncate(len);
        Ok(v)
    }

    fn ptr(&self, s: &CudaSlice<u8>) -> u64 {
        let (p, _record) = s.device_ptr(&self.stream);
        p
    }

    fn raw_stream(&self) -> sys::cudaStream_t {
        self.stream.cu_stream() as sys::cudaStream_t
    }

    /// Runs `enqueue` inside one NCCL group, then waits for the stream with
    /// the watchdog.
    fn grouped(
        &mut self,
        what: &str,
        enqueue: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> Result<()>,
    ) -> Result<()> {
        let comm = self.comm()?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err("bind context", e))?;
        nccl::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let enqueued = enqueue(comm, self.raw_stream());
        let ended = nccl::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
        enqueued?;
        ended?;
        self.wait(what)
    }

    /// Polls the stream until done; aborts the communicator on timeout.
    fn wait(&mut self, what: &str) -> Result<()> {
        let event = self
            .stream
            .record_event(None)
            .map_err(|e| cuda_err("record event", e))?;
        let deadline = Instant::now() + self.timeout;
        let mut pause = Duration::from_micros(20);
        loop {
            match event.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(cuda_err(what, e)),
            }
            if Instant::now() >= deadline {
                let reason = format!(
                    "{what} did not complete within {:?} (a peer is missing or failed)",
                    self.timeout
                );
                if let Some(c) = self.comm.take() {
                    // SAFETY: valid communicator; abort unblocks its kernels.
                    unsafe {
                        let _ = nccl::comm_abort(c.0);
                    }
                    std::mem::forget(c); // aborted: must not be destroyed too
                }
                self.broken = Some(reason.clone());
                return Err(CollectiveError::Backend(format!(
                    "rank {}: {reason}",
                    self.rank
                )));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }
}

/// NCCL type and element count for native reductions.
fn native_type(dtype: PrimitiveType) -> Option<sys::ncclDataType_t> {
    use sys::ncclDataType_t as T;
    Some(match dtype {
        PrimitiveType::Pred | PrimitiveType::U8 => T::ncclUint8,
        PrimitiveType::S8 => T::ncclInt8,
        PrimitiveType::S32 => T::ncclInt32,
        PrimitiveType::U32 => T::ncclUint32,
        PrimitiveType::S64 => T::ncclInt64,
        PrimitiveType::U64 => T::ncclUint64,
        PrimitiveType::F16 => T::ncclFloat16,
        PrimitiveType::Bf16 => T::ncclBfloat16,
        PrimitiveType::F32 => T::ncclFloat32,
        PrimitiveType::F64 => T::ncclFloat64,
        _ => return None,
    })
}

fn native_op(dtype: PrimitiveType, kind: ReductionKind) -> Option<sys::ncclRedOp_t> {
    use sys::ncclRedOp_t as O;
    native_type(dtype)?;
    if dtype == PrimitiveType::Pred {
        return Some(match kind {
            ReductionKind::Sum | ReductionKind::Or | ReductionKind::Max => O::ncclMax,
            ReductionKind::Product | ReductionKind::And | ReductionKind::Min => O::ncclMin,
        });
    }
    Some(match kind {
        ReductionKind::Sum => O::ncclSum,
        ReductionKind::Product => O::ncclProd,
        ReductionKind::Min => O::ncclMin,
        ReductionKind::Max => O::ncclMax,
        ReductionKind::And | ReductionKind::Or => return None,
    })
}

fn native(
    dtype: PrimitiveType,
    kind: ReductionKind,
) -> Result<(sys::ncclDataType_t, sys::ncclRedOp_t, usize)> {
    match (native_type(dtype), native_op(dtype, kind)) {
        (Some(t), Some(o)) => Ok((t, o, xla_hlo_ir::literal::storage_bytes(dtype))),
        _ => Err(CollectiveError::Unsupported(format!(
            "NCCL has no native {} on {dtype}",
            kind.opcode()
        ))),
    }
}

impl Transport for NcclTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn supports_native(&self, dtype: PrimitiveType, kind: ReductionKind) -> bool {
        native_op(dtype, kind).is_some()
    }

    fn all_reduce_world(
        &mut self,
        kind: ReductionKind,
        dtypes: &[PrimitiveType],
        bufs: &[&[u8]],
    ) -> Result<Vec<HostBytes>> {
        let plans: Vec<_> = dtypes
            .iter()
            .map(|&t| native(t, kind))
            .collect::<Result<_>>()?;
        let sends: Vec<CudaSlice<u8>> =
            bufs.iter().map(|b| self.upload(b)).collect::<Result<_>>()?;
        let recvs: Vec<CudaSlice<u8>> = bufs
            .iter()
            .map(|b| self.alloc(b.len()))
            .collect::<Result<_>>()?;
        let ptrs: Vec<(u64, u64)> = sends
            .iter()
            .zip(&recvs)
            .map(|(s, r)| (self.ptr(s), self.ptr(r)))
            .collect();
        self.grouped("ncclAllReduce", |comm, stream| {
            for ((&(s, r), &(t, op, es)), b) in ptrs.iter().zip(&plans).zip(bufs) {
                // SAFETY: s and r are device buffers of at least b.len()
                // bytes on this communicator's device.
                unsafe { nccl::all_reduce(s as _, r as _, b.len() / es, t, op, comm, stream) }
                    .map_err(|e| nccl_err("ncclAllReduce", e))?;
            }
            Ok(())
        })?;
        recvs
            .iter()
            .zip(bufs)
            .map(|(r, b)| Ok(HostBytes::from_slice(&self.download(r, b.len())?)))
            .collect()
    }

    fn all_gather_world(&mut self, bufs: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
        let n = self.world;
        let sends: Vec<CudaSlice<u8>> =
            bufs.iter().map(|b| self.upload(b)).collect::<Result<_>>()?;
        let recvs: Vec<CudaSlice<u8>> = bufs
            .iter()
            .map(|b| self.alloc(b.len() * n))
            .collect::<Result<_>>()?;
        let ptrs: Vec<(u64, u64)> = sends
            .iter()
            .zip(&recvs)
            .map(|(s, r)| (self.ptr(s), self.ptr(r)))
            .collect();
        self.grouped("ncclAllGather", |comm, stream| {
            for (&(s, r), b) in ptrs.iter().zip(bufs) {
                // SAFETY: r holds n * b.len() bytes.
                unsafe {
                    nccl::all_gather(
                        s as _,
                        r as _,
                        b.len(),
                        sys::ncclDataType_t::ncclUint8,
                        comm,
                        stream,
                    )
                }
                .map_err(|e| nccl_err("ncclAllGather", e))?;
            }
            Ok(())
        })?;
        recvs
            .iter()
            .zip(bufs)
            .map(|(r, b)| self.download(r, b.len() * n))
            .collect()
    }

    fn reduce_scatter_world(
        &mut self,
        kind: ReductionKind,
        dtypes: &[PrimitiveType],
        bufs: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>> {
        let n = self.world;
        let plans: Vec<_> = dtypes
            .iter()
            .map(|&t| native(t, kind))
            .collect::<Result<_>>()?;
        let sends: Vec<CudaSlice<u8>> =
            bufs.iter().map(|b| self.upload(b)).collect::<Result<_>>()?;
        let recvs: Vec<CudaSlice<u8>> = bufs
            .iter()
            .map(|b| self.alloc(b.len() / n))
            .collect::<Result<_>>()?;
        let ptrs: Vec<(u64, u64)> = sends
            .iter()
            .zip(&recvs)
            .map(|(s, r)| (self.ptr(s), self.ptr(r)))
            .collect();
        self.grouped("ncclReduceScatter", |comm, stream| {
            for ((&(s, r), &(t, op, es)), b) in ptrs.iter().zip(&plans).zip(bufs) {
                // SAFETY: s holds b.len() bytes, r holds b.len() / n.
                unsafe {
                    nccl::reduce_scatter(s as _, r as _, b.len() / n / es, t, op, comm, stream)
                }
                .map_err(|e| nccl_err("ncclReduceScatter", e))?;
            }
            Ok(())
        })?;
        recvs
            .iter()
            .zip(bufs)
            .map(|(r, b)| self.download(r, b.len() / n))
            .collect()
    }

    fn exchange(
        &mut self,
        sends: &[(usize, &[u8])],
        recvs: &[(usize, usize)],
    ) -> Result<Vec<Vec<u8>>> {
        if sends.is_empty() && recvs.is_empty() {
            return Ok(Vec::new());
        }
        let peers = sends
            .iter()
            .map(|&(p, _)| p)
            .chain(recvs.iter().map(|&(p, _)| p));
        for p in peers {
            if p >= self.world || p == self.rank {
                return Err(CollectiveError::InvalidArgument(format!(
                    "NCCL peer {p} is this rank or out of range"
                )));
            }
        }
        let send_bufs: Vec<CudaSlice<u8>> = sends
            .iter()
            .map(|(_, b)| self.upload(b))
            .collect::<Result<_>>()?;
        let recv_bufs: Vec<CudaSlice<u8>> = recvs
            .iter()
            .map(|&(_, l)| self.alloc(l))
            .collect::<Result<_>>()?;
        let sp: Vec<u64> = send_bufs.iter().map(|s| self.ptr(s)).collect();
        let rp: Vec<u64> = recv_bufs.iter().map(|s| self.ptr(s)).collect();
        self.grouped("ncclSend/ncclRecv", |comm, stream| {
            for (&p, &(peer, b)) in sp.iter().zip(sends) {
                // SAFETY: p holds b.len() bytes.
                unsafe {
                    nccl::send(
                        p as _,
                        b.len(),
                        sys::ncclDataType_t::ncclUint8,
                        peer as i32,
                        comm,
                        stream,
                    )
                }
                .map_err(|e| nccl_err("ncclSend", e))?;
            }
            for (&p, &(peer, len)) in rp.iter().zip(recvs) {
                // SAFETY: p holds at least len bytes.
                unsafe {
                    nccl::recv(
                        p as _,
                        len,
                        sys::ncclDataType_t::ncclUint8,
                        peer as i32,
                        comm,
                        stream,
                    )
                }
                .map_err(|e| nccl_err("ncclRecv", e))?;
            }
            Ok(())
        })?;
        recv_bufs
            .iter()
            .zip(recvs)
            .map(|(r, &(_, l))| self.download(r, l))
            .collect()
    }

    fn name(&self) -> &'static str {
        "nccl"
    }
}
