//! The GPU half of the CUDA backend (feature `cuda`): cudarc with dynamic
//! loading. Libraries are probed with `is_culib_present()` before any call
//! (cudarc panics at first use of a missing library), and the first driver
//! calls run under `catch_unwind`, so a machine without CUDA gets a typed
//! `RuntimeError::Devices`, never a panic.
//!
//! NOT YET RUN ON A GPU (written on machines without one; the same plans,
//! kernels and executor run on the host in the ordinary test suite through
//! the `cuda-host` backend). `tools/gpu_check.sh` is the first GPU run.
//!
//! One backend drives every visible GPU of the process: launcher device `d`
//! runs on GPU `d % count` (one process driving N GPUs, a thread each), or
//! on the GPU chosen by `CudaBackend::new(ordinal)` (one process per GPU).
//! Per GPU: a compute stream for kernels and cuBLAS, and a dedicated
//! communication stream for NCCL. The kernels are compiled once by NVRTC
//! and loaded into every GPU's context.
//!
//! Collectives: when every device of the launch is a GPU of this process,
//! the executable creates one NCCL communicator per device
//! (`ncclCommInitAll`) on first use, and a collective whose group is all
//! devices in order (all-reduce, all-gather and reduce-scatter along a
//! dimension whose major dims are 1, collective-permute) runs on the
//! communication stream after an event from the compute stream; its done
//! (or, for synchronous forms, the next step) makes the compute stream wait
//! on an event from the communication stream, so an async start/done pair
//! of the scheduled program overlaps with the kernels between them. Every
//! other collective (subgroups, tuples, other dimensions) and every
//! multi-process run goes through the device's communicator on the host
//! (the launcher's loopback or TCP/NCCL transport).
//!
//! Dots go to `cublasGemmStridedBatchedEx` with f32 compute (f64 for f64)
//! using the row-major trick: row-major `C = A B` is column-major
//! `C^T = B^T A^T`, so cuBLAS gets (B, A) with m = n, n = m.

use super::exec::{execute_plan, refuse_consistent, Machine};
use super::plan::{BufferInfo, DotStep, Kernel, Plan};
use crate::backend::{Backend, DeviceContext, Executable};
use crate::error::RuntimeError;
use crate::literal::Literal;
use collectives::groups::{ParticipantGroups, Topology};
use cudarc::cublas::{result as blas_result, sys as blas_sys, CudaBlas};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut,
    LaunchConfig, PushKernelArg,
};
use cudarc::nccl::{result as nccl, sys as nccl_sys};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};
use xla_hlo_ir::literal::storage_bytes;
use xla_hlo_ir::{AttrKey, HloInstruction, HloModule, Opcode, PrimitiveType};

fn dev_err(m: impl Into<String>) -> RuntimeError {
    RuntimeError::Devices(m.into())
}

fn exec_err(m: impl Into<String>) -> RuntimeError {
    RuntimeError::Device {
        backend: "cuda",
        message: m.into(),
    }
}

/// Checks that libcuda, libnvrtc and libcublas can be loaded and that there
/// is at least one device; returns the device count.
pub fn probe() -> Result<usize, RuntimeError> {
    // SAFETY: these only try dlopen on the candidate names.
    let (cuda, nvrtc, cublas) = unsafe {
        (
            cudarc::driver::sys::is_culib_present(),
            cudarc::nvrtc::sys::is_culib_present(),
            cudarc::cublas::sys::is_culib_present(),
        )
    };
    let missing: Vec<&str> = [
        ("libcuda", cuda),
        ("libnvrtc", nvrtc),
        ("libcublas", cublas),
    ]
    .iter()
    .filter(|(_, ok)| !ok)
    .map(|(n, _)| *n)
    .collect();
    if !missing.is_empty() {
        return Err(dev_err(format!(
            "CUDA libraries not found: {} (put their directory on LD_LIBRARY_PATH)",
            missing.join(", ")
        )));
    }
    let n = catch_unwind(CudaContext::device_count)
        .map_err(|_| dev_err("the CUDA driver panicked while counting devices"))?
        .map_err(|e| dev_err(format!("cuDeviceGetCount: {e:?}")))?;
    if n <= 0 {
        return Err(dev_err("no CUDA device"));
    }
    Ok(n as usize)
}

/// One GPU: its context, compute and communication streams, cuBLAS handle.
#[derive(Clone)]
struct Gpu {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    comm: Arc<CudaStream>,
    blas: Arc<CudaBlas>,
}

impl Gpu {
    /// The same GPU with new compute and communication streams and a
    /// cuBLAS handle on the new compute stream.
    fn with_own_streams(&self) -> Result<Gpu, RuntimeError> {
        let compute = self
            .ctx
            .new_stream()
            .map_err(|e| dev_err(format!("stream: {e:?}")))?;
        let comm = self
            .ctx
            .new_stream()
            .map_err(|e| dev_err(format!("stream: {e:?}")))?;
        let blas = CudaBlas::new(compute.clone()).map_err(|e| dev_err(format!("cuBLAS: {e:?}")))?;
        Ok(Gpu {
            ordinal: self.ordinal,
            ctx: self.ctx.clone(),
            compute,
            comm,
            blas: Arc::new(blas),
        })
    }

    fn open(ordinal: usize) -> Result<Gpu, RuntimeError> {
        let r = catch_unwind(|| -> Result<Gpu, RuntimeError> {
            let ctx = CudaContext::new(ordinal).map_err(|e| dev_err(format!("cuCtx: {e:?}")))?;
            let compute = ctx
                .new_stream()
                .map_err(|e| dev_err(format!("stream: {e:?}")))?;
            let comm = ctx
                .new_stream()
                .map_err(|e| dev_err(format!("stream: {e:?}")))?;
            let blas =
                CudaBlas::new(compute.clone()).map_err(|e| dev_err(format!("cuBLAS: {e:?}")))?;
            Ok(Gpu {
                ordinal,
                ctx,
                compute,
                comm,
                blas: Arc::new(blas),
            })
        });
        r.map_err(|_| dev_err("cudarc panicked while opening the device"))?
    }
}

/// The CUDA GPUs of this process as a backend.
pub struct CudaBackend {
    gpus: Vec<Gpu>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ords: Vec<usize> = self.gpus.iter().map(|g| g.ordinal).collect();
        write!(f, "CudaBackend(GPUs {ords:?})")
    }
}

impl CudaBackend {
    /// GPU `ordinal` alone (one process per GPU).
    pub fn new(ordinal: usize) -> Result<CudaBackend, RuntimeError> {
        let n = probe()?;
        if ordinal >= n {
            return Err(dev_err(format!("device {ordinal} requested, {n} present")));
        }
        Ok(CudaBackend {
            gpus: vec![Gpu::open(ordinal)?],
        })
    }

    /// Every visible GPU (one process driving all of them).
    pub fn all() -> Result<CudaBackend, RuntimeError> {
        let n = probe()?;
        Ok(CudaBackend {
            gpus: (0..n).map(Gpu::open).collect::<Result<_, _>>()?,
        })
    }

    pub fn gpu_count(&self) -> usize {
        self.gpus.len()
    }

    /// `sm_XY` of the first GPU, for NVRTC.
    pub fn compute_capability(&self) -> Result<(i32, i32), RuntimeError> {
        self.gpus[0]
            .ctx
            .compute_capability()
            .map_err(|e| dev_err(format!("compute capability: {e:?}")))
    }

    /// Throughput of the dot path alone (device-resident operands, no
    /// transfers): `iters` bf16 GEMMs `m x k` by `k x n` with `out_ty`
    /// (bf16 or f32) results; returns TFLOP/s.
    pub fn bf16_gemm_tflops(
        &self,
        m: i64,
        n: i64,
        k: i64,
        out_ty: PrimitiveType,
        iters: usize,
    ) -> Result<f64, RuntimeError> {
        self.gemm_tflops(PrimitiveType::Bf16, out_ty, m, n, k, iters)
    }

    /// The same for f32 operands and results (f32 compute).
    pub fn f32_gemm_tflops(
        &self,
        m: i64,
        n: i64,
        k: i64,
        iters: usize,
    ) -> Result<f64, RuntimeError> {
        self.gemm_tflops(PrimitiveType::F32, PrimitiveType::F32, m, n, k, iters)
    }

    fn gemm_tflops(
        &self,
        in_ty: PrimitiveType,
        out_ty: PrimitiveType,
        m: i64,
        n: i64,
        k: i64,
        iters: usize,
    ) -> Result<f64, RuntimeError> {
        let gpu = &self.gpus[0];
        let alloc = |elems: i64, w: usize| {
            gpu.compute
                .alloc_zeros::<u8>((elems as usize * w).max(1))
                .map_err(|e| exec_err(format!("device allocation: {e:?}")))
        };
        let a = alloc(m * k, storage_bytes(in_ty))?;
        let b = alloc(k * n, storage_bytes(in_ty))?;
        let mut c = alloc(m * n, storage_bytes(out_ty))?;
        let d = DotStep {
            out: 0,
            lhs: 0,
            rhs: 0,
            batch: 1,
            m,
            n,
            k,
        };
        let sync = || {
            gpu.compute
                .synchronize()
                .map_err(|e| exec_err(format!("synchronize: {e:?}")))
        };
        let mut gemm = || gemm_row_major(gpu, &d, in_ty, out_ty, &a, &b, &mut c);
        gemm()?;
        sync()?;
        let t = std::time::Instant::now();
        for _ in 0..iters {
            gemm()?;
        }
        sync()?;
        let s = t.elapsed().as_secs_f64();
        Ok(2.0 * (m * n * k) as f64 * iters as f64 / s / 1e12)
    }

    /// Host-to-device copy bandwidth in GB/s for `bytes` (pageable memory,
    /// as the executor uploads arguments).
    pub fn htod_gbps(&self, bytes: usize, iters: usize) -> Result<f64, RuntimeError> {
        let gpu = &self.gpus[0];
        let host = vec![0u8; bytes.max(1)];
        let t = std::time::Instant::now();
        for _ in 0..iters {
            let _slice = gpu
                .compute
                .clone_htod(&host)
                .map_err(|e| exec_err(format!("copy: {e:?}")))?;
        }
        gpu.compute
            .synchronize()
            .map_err(|e| exec_err(format!("synchronize: {e:?}")))?;
        Ok(bytes as f64 * iters as f64 / t.elapsed().as_secs_f64() / 1e9)
    }

    /// Device-to-device copy bandwidth in GB/s (read + write bytes), for
    /// rooflines.
    pub fn copy_gbps(&self, bytes: usize, iters: usize) -> Result<f64, RuntimeError> {
        let gpu = &self.gpus[0];
        let src = gpu
            .compute
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| exec_err(format!("device allocation: {e:?}")))?;
        let mut dst = gpu
            .compute
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| exec_err(format!("device allocation: {e:?}")))?;
        let t = std::time::Instant::now();
        for _ in 0..iters {
            gpu.compute
                .memcpy_dtod(&src, &mut dst)
                .map_err(|e| exec_err(format!("copy: {e:?}")))?;
        }
        gpu.compute
            .synchronize()
            .map_err(|e| exec_err(format!("synchronize: {e:?}")))?;
        Ok(2.0 * bytes as f64 * iters as f64 / t.elapsed().as_secs_f64() / 1e9)
    }
}

/// `out[b] = lhs[b] (m x k) * rhs[b] (k x n)`, row-major, through
/// `cublasGemmStridedBatchedEx` on the GPU's compute stream.
fn gemm_row_major(
    gpu: &Gpu,
    d: &DotStep,
    lt: PrimitiveType,
    ot: PrimitiveType,
    lhs: &CudaSlice<u8>,
    rhs: &CudaSlice<u8>,
    out: &mut CudaSlice<u8>,
) -> Result<(), RuntimeError> {
    use blas_sys::cudaDataType as D;
    let dt = |t: PrimitiveType| match t {
        PrimitiveType::Bf16 => D::CUDA_R_16BF,
        PrimitiveType::F16 => D::CUDA_R_16F,
        PrimitiveType::F64 => D::CUDA_R_64F,
        _ => D::CUDA_R_32F,
    };
    let wide = lt == PrimitiveType::F64;
    let (alpha32, beta32) = (1.0f32, 0.0f32);
    let (alpha64, beta64) = (1.0f64, 0.0f64);
    let (alpha, beta): (*const std::ffi::c_void, *const std::ffi::c_void) = if wide {
        (&alpha64 as *const f64 as _, &beta64 as *const f64 as _)
    } else {
        (&alpha32 as *const f32 as _, &beta32 as *const f32 as _)
    };
    let compute = if wide {
        blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_64F
    } else {
        blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
    };
    let stream = &gpu.compute;
    let (a_ptr, _ga) = lhs.device_ptr(stream);
    let (b_ptr, _gb) = rhs.device_ptr(stream);
    let (c_ptr, _gc) = out.device_ptr_mut(stream);
    // SAFETY: pointers to buffers of batch*m*k, batch*k*n and batch*m*n
    // elements of the given types (the plan's buffer sizes).
    unsafe {
        blas_result::gemm_strided_batched_ex(
            *gpu.blas.handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            d.n as i32,
            d.m as i32,
            d.k as i32,
            alpha,
            b_ptr as *const _,
            dt(lt),
            d.n as i32,
            d.k * d.n,
            a_ptr as *const _,
            dt(lt),
            d.k as i32,
            d.m * d.k,
            beta,
            c_ptr as *mut _,
            dt(ot),
            d.n as i32,
            d.m * d.n,
            d.batch as i32,
            compute,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| exec_err(format!("cuBLAS gemm: {e:?}")))
}

/// An owned NCCL communicator of one device of an in-process world.
struct RawComm(nccl_sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread, one call at a
// time; each is used only by its device's executor thread.
unsafe impl Send for RawComm {}
unsafe impl Sync for RawComm {}

impl Drop for RawComm {
    fn drop(&mut self) {
        // SAFETY: created by ncclCommInitAll, destroyed once.
        unsafe {
            let _ = nccl::comm_destroy(self.0);
        }
    }
}

struct CudaExecutable {
    module: HloModule,
    plan: Plan,
    gpus: Vec<Gpu>,
    /// Per GPU: the kernels by name.
    functions: Vec<HashMap<String, CudaFunction>>,
    /// Per launcher device: its GPU with streams and cuBLAS handle of its
    /// own (several devices may share a GPU), made on first use.
    device_gpus: Mutex<HashMap<usize, Gpu>>,
    /// The in-process NCCL world of the launch's devices, created on first
    /// use (an error message where NCCL is unavailable).
    world: OnceLock<Result<Vec<RawComm>, String>>,
    /// The generated source (kept for error messages and debugging).
    #[allow(dead_code)]
    source: String,
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn compile(&self, module: &HloModule) -> Result<Box<dyn Executable>, RuntimeError> {
        let (plan, source) = super::prepare(module)?;
        let cerr = |m: String| RuntimeError::Compile {
            backend: "cuda",
            message: m,
        };
        let mut functions = vec![HashMap::new(); self.gpus.len()];
        if plan.kernels().next().is_some() {
            let (maj, min) = self.compute_capability()?;
            let arch = format!("--gpu-architecture=compute_{maj}{min}");
            let opts = cudarc::nvrtc::CompileOptions {
                options: vec![arch, "--std=c++14".into()],
                ..Default::default()
            };
            let ptx = catch_unwind(AssertUnwindSafe(|| {
                cudarc::nvrtc::compile_ptx_with_opts(&source, opts)
            }))
            .map_err(|_| cerr("NVRTC panicked (library missing?)".into()))?
            .map_err(|e| cerr(format!("NVRTC: {e:?}\n--- source ---\n{source}")))?;
            for (g, gpu) in self.gpus.iter().enumerate() {
                let m = gpu
                    .ctx
                    .load_module(ptx.clone())
                    .map_err(|e| cerr(format!("cuModuleLoad: {e:?}")))?;
                for k in plan.kernels() {
                    let f = m
                        .load_function(&k.name)
                        .map_err(|e| cerr(format!("kernel {}: {e:?}", k.name)))?;
                    functions[g].insert(k.name.clone(), f);
                }
            }
        }
        Ok(Box::new(CudaExecutable {
            module: module.clone(),
            plan,
            gpus: self.gpus.clone(),
            functions,
            device_gpus: Mutex::new(HashMap::new()),
            world: OnceLock::new(),
            source,
        }))
    }
}

/// One GPU running one device's program.
struct CudaMachine<'e> {
    gpu: &'e Gpu,
    functions: &'e HashMap<String, CudaFunction>,
    exe: &'e CudaExecutable,
    /// This device's id and the launch's device count.
    device_id: usize,
    devices: usize,
    /// Communication in flight: the result buffer's address and the event
    /// that marks its end on the communication stream.
    pending: Mutex<Vec<(u64, CudaEvent)>>,
}

fn nccl_type(ty: PrimitiveType) -> Option<nccl_sys::ncclDataType_t> {
    use nccl_sys::ncclDataType_t as N;
    Some(match ty {
        PrimitiveType::F32 => N::ncclFloat32,
        PrimitiveType::F64 => N::ncclFloat64,
        PrimitiveType::F16 => N::ncclFloat16,
        PrimitiveType::Bf16 => N::ncclBfloat16,
        PrimitiveType::S8 => N::ncclInt8,
        PrimitiveType::U8 => N::ncclUint8,
        PrimitiveType::S32 => N::ncclInt32,
        PrimitiveType::U32 => N::ncclUint32,
        PrimitiveType::S64 => N::ncclInt64,
        PrimitiveType::U64 => N::ncclUint64,
        _ => return None,
    })
}

/// NCCL's reduction for a collective's `to_apply` root, when it is one.
fn nccl_op(module_root: Option<Opcode>) -> Option<nccl_sys::ncclRedOp_t> {
    use nccl_sys::ncclRedOp_t as R;
    Some(match module_root? {
        Opcode::Add => R::ncclSum,
        Opcode::Multiply => R::ncclProd,
        Opcode::Maximum => R::ncclMax,
        Opcode::Minimum => R::ncclMin,
        _ => return None,
    })
}

impl CudaMachine<'_> {
    fn event(&self, stream: &Arc<CudaStream>) -> Result<CudaEvent, RuntimeError> {
        stream
            .record_event(None)
            .map_err(|e| exec_err(format!("event: {e:?}")))
    }
}

impl Machine for CudaMachine<'_> {
    type Buf = CudaSlice<u8>;

    fn upload(&self, bytes: &[u8]) -> Result<CudaSlice<u8>, RuntimeError> {
        let one = [0u8];
        let bytes = if bytes.is_empty() { &one[..] } else { bytes };
        self.gpu
            .compute
            .clone_htod(bytes)
            .map_err(|e| exec_err(format!("host-to-device copy: {e:?}")))
    }

    fn download(&self, buf: &CudaSlice<u8>, len: usize) -> Result<Vec<u8>, RuntimeError> {
        let mut host: Vec<u8> = self
            .gpu
            .compute
            .clone_dtoh(buf)
            .map_err(|e| exec_err(format!("device-to-host copy: {e:?}")))?;
        host.truncate(len);
        Ok(host)
    }

    fn alloc(&self, bytes: usize) -> Result<CudaSlice<u8>, RuntimeError> {
        self.gpu
            .compute
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| exec_err(format!("device allocation of {bytes} bytes: {e:?}")))
    }

    fn copy(&self, buf: &CudaSlice<u8>, _bytes: usize) -> Result<CudaSlice<u8>, RuntimeError> {
        self.gpu
            .compute
            .clone_dtod(buf)
            .map_err(|e| exec_err(format!("device copy: {e:?}")))
    }

    fn launch(
        &self,
        kernel: &Kernel,
        outs: &mut [CudaSlice<u8>],
        inputs: &[&CudaSlice<u8>],
    ) -> Result<(), RuntimeError> {
        let f = self
            .functions
            .get(&kernel.name)
            .ok_or_else(|| exec_err(format!("kernel {} not loaded", kernel.name)))?;
        let n = kernel.launch_size;
        let block = 256u32;
        let blocks = (n as u64).div_ceil(block as u64).clamp(1, 1 << 20) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.gpu.compute.launch_builder(f);
        for o in outs.iter_mut() {
            b.arg(o);
        }
        for i in inputs {
            b.arg(*i);
        }
        b.arg(&n);
        // SAFETY: the kernel's parameters are (outs..., inputs..., n) with
        // buffers of the planned sizes (codegen.rs).
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| exec_err(format!("launch {}: {e:?}", kernel.name)))
    }

    fn gemm(
        &self,
        d: &DotStep,
        lt: PrimitiveType,
        ot: PrimitiveType,
        lhs: &CudaSlice<u8>,
        rhs: &CudaSlice<u8>,
        out: &mut CudaSlice<u8>,
    ) -> Result<(), RuntimeError> {
        gemm_row_major(self.gpu, d, lt, ot, lhs, rhs, out)
    }

    fn collective(
        &self,
        instr: &HloInstruction,
        operand: (&CudaSlice<u8>, &BufferInfo),
        result: &BufferInfo,
        reducer: Option<Opcode>,
        device: &DeviceContext<'_>,
    ) -> Option<Result<CudaSlice<u8>, RuntimeError>> {
        let comm = self
            .exe
            .world(self.devices)
            .and_then(|w| w.get(self.device_id))?;
        let (input, info) = operand;
        let dtype = nccl_type(info.ty)?;
        let nr = device.num_replicas.max(1) as usize;
        let np = device.num_partitions.max(1) as usize;
        let world = nr * np;
        let me = (device.replica_id as usize) * np + device.partition_id as usize;
        let op = instr.effective_opcode();
        // A permute's pairs are device ids only when one of the two counts
        // is 1; otherwise they may be replica or partition ids.
        if op == Opcode::CollectivePermute && nr > 1 && np > 1 {
            return None;
        }
        // Only groups of every device in order use the device path.
        if op != Opcode::CollectivePermute {
            let topo = Topology::new(nr, np).ok()?;
            let list = instr
                .replica_groups()
                .cloned()
                .unwrap_or(xla_hlo_ir::CollectiveDeviceList::Explicit(Vec::new()));
            let takes_global = matches!(
                op,
                Opcode::AllReduce | Opcode::AllGather | Opcode::ReduceScatter
            );
            let global = if takes_global {
                instr.bool_attr(AttrKey::UseGlobalDeviceIds)
            } else {
                None
            };
            let groups =
                ParticipantGroups::from_hlo(&list, instr.channel_id(), global, topo).ok()?;
            let everyone: Vec<usize> = (0..world).collect();
            if groups.groups() != [everyone] {
                return None;
            }
        }
        // A gather/scatter dimension whose major dims are all 1 concatenates
        // in memory order.
        let major_ones = |dims: &[i64]| -> bool {
            let d = instr.dimensions().first().copied().unwrap_or(0) as usize;
            dims.iter().take(d).all(|x| *x == 1)
        };
        let count = info.dims.iter().product::<i64>().max(0) as usize;
        let root_op = reducer;
        let result_bytes =
            result.dims.iter().product::<i64>().max(0) as usize * storage_bytes(result.ty);
        let run = || -> Result<CudaSlice<u8>, RuntimeError> {
            self.gpu
                .ctx
                .bind_to_thread()
                .map_err(|e| exec_err(format!("bind context: {e:?}")))?;
            let mut out = self.alloc(result_bytes)?;
            let ready = self.event(&self.gpu.compute)?;
            self.gpu
                .comm
                .wait(&ready)
                .map_err(|e| exec_err(format!("stream wait: {e:?}")))?;
            let stream = self.gpu.comm.cu_stream() as nccl_sys::cudaStream_t;
            let (src, _gs) = input.device_ptr(&self.gpu.comm);
            let (dst, _gd) = out.device_ptr_mut(&self.gpu.comm);
            let (src, dst) = (src as *const std::ffi::c_void, dst as *mut std::ffi::c_void);
            let nerr = |e: nccl::NcclError| exec_err(format!("{}: NCCL {:?}", instr.name, e.0));
            // SAFETY: src/dst are device buffers of the operand's and the
            // result's sizes on this GPU; the communicator is this device's.
            unsafe {
                match op {
                    Opcode::AllReduce => {
                        let red =
                            nccl_op(root_op).ok_or_else(|| exec_err("unsupported reduction"))?;
                        nccl::all_reduce(src, dst, count, dtype, red, comm.0, stream)
                            .map_err(nerr)?;
                    }
                    Opcode::AllGather => {
                        nccl::all_gather(src, dst, count, dtype, comm.0, stream).map_err(nerr)?;
                    }
                    Opcode::ReduceScatter => {
                        let red =
                            nccl_op(root_op).ok_or_else(|| exec_err("unsupported reduction"))?;
                        nccl::reduce_scatter(
                            src,
                            dst,
                            count / world.max(1),
                            dtype,
                            red,
                            comm.0,
                            stream,
                        )
                        .map_err(nerr)?;
                    }
                    Opcode::CollectivePermute => {
                        let pairs = permute_pairs(instr);
                        nccl::group_start().map_err(nerr)?;
                        for (s, t) in &pairs {
                            if *s as usize == me {
                                nccl::send(src, count, dtype, *t as i32, comm.0, stream)
                                    .map_err(nerr)?;
                            }
                            if *t as usize == me {
                                nccl::recv(dst, count, dtype, *s as i32, comm.0, stream)
                                    .map_err(nerr)?;
                            }
                        }
                        nccl::group_end().map_err(nerr)?;
                    }
                    _ => return Err(exec_err("not a device collective")),
                }
            }
            drop((_gs, _gd));
            let done = self.event(&self.gpu.comm)?;
            // Keyed by the result's address as taken on the communication
            // stream: taking it on the compute stream would make that stream
            // wait for the communication here rather than at the done.
            self.pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((dst as u64, done));
            Ok(out)
        };
        let supported = match op {
            Opcode::AllReduce | Opcode::ReduceScatter => {
                nccl_op(root_op).is_some() && (op == Opcode::AllReduce || major_ones(&info.dims))
            }
            Opcode::AllGather => major_ones(&info.dims),
            Opcode::CollectivePermute => true,
            _ => false,
        };
        if !supported {
            return None;
        }
        Some(run())
    }

    fn wait(&self, buf: &CudaSlice<u8>) -> Result<(), RuntimeError> {
        let (ptr, _g) = buf.device_ptr(&self.gpu.compute);
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = pending.iter().position(|(p, _)| *p == ptr) {
            let (_, ev) = pending.remove(i);
            self.gpu
                .compute
                .wait(&ev)
                .map_err(|e| exec_err(format!("stream wait: {e:?}")))?;
        }
        Ok(())
    }
}

fn permute_pairs(instr: &HloInstruction) -> Vec<(i64, i64)> {
    match instr.attr(AttrKey::SourceTargetPairs) {
        Some(xla_hlo_ir::attrs::AttrValue::IntLists(l)) => l
            .iter()
            .filter(|p| p.len() == 2)
            .map(|p| (p[0], p[1]))
            .collect(),
        _ => Vec::new(),
    }
}

impl CudaExecutable {
    /// The in-process NCCL world for `devices` devices, when they are all
    /// GPUs of this process (one device: a single-rank communicator).
    fn world(&self, devices: usize) -> Option<&[RawComm]> {
        if devices == 0 || devices > self.gpus.len() {
            return None;
        }
        let w = self.world.get_or_init(|| {
            // SAFETY: the probes only try to dlopen the library.
            if !unsafe { nccl_sys::is_culib_present() } {
                return Err("libnccl.so not found".into());
            }
            let mut comms = vec![std::ptr::null_mut(); devices];
            let ordinals: Vec<i32> = self.gpus[..devices]
                .iter()
                .map(|g| g.ordinal as i32)
                .collect();
            // SAFETY: `comms` has room for `devices` communicators.
            unsafe { nccl::comm_init_all(comms.as_mut_ptr(), devices as i32, ordinals.as_ptr()) }
                .map_err(|e| format!("ncclCommInitAll: {:?}", e.0))?;
            Ok(comms.into_iter().map(RawComm).collect())
        });
        match w {
            Ok(v) => Some(v.as_slice()),
            Err(e) => {
                log::warn!("collectives go through the host: {e}");
                None
            }
        }
    }
}

impl Executable for CudaExecutable {
    fn module(&self) -> &HloModule {
        &self.module
    }

    fn execute(
        &self,
        device: &DeviceContext<'_>,
        args: &[Literal],
    ) -> Result<Vec<Literal>, RuntimeError> {
        refuse_consistent(device, "cuda")?;
        let devices = (device.num_partitions * device.num_replicas).max(1) as usize;
        let id = (device.replica_id * device.num_partitions + device.partition_id).max(0) as usize;
        let g = id % self.gpus.len();
        let gpu = {
            let mut map = self.device_gpus.lock().unwrap_or_else(|p| p.into_inner());
            match map.get(&id) {
                Some(gpu) => gpu.clone(),
                None => {
                    let gpu = self.gpus[g].with_own_streams()?;
                    map.insert(id, gpu.clone());
                    gpu
                }
            }
        };
        let machine = CudaMachine {
            gpu: &gpu,
            functions: &self.functions[g],
            exe: self,
            device_id: id,
            devices,
            pending: Mutex::new(Vec::new()),
        };
        let out = catch_unwind(AssertUnwindSafe(|| {
            execute_plan(&machine, &self.plan, &self.module, device, args)
        }))
        .map_err(|_| exec_err("cudarc panicked during execution"))??;
        gpu.compute
            .synchronize()
            .map_err(|e| exec_err(format!("stream synchronize: {e:?}")))?;
        Ok(out)
    }
}
