//! The GPU half of the CUDA backend (feature `cuda`): cudarc with dynamic
//! loading. Libraries are probed with `is_culib_present()` before any call
//! (cudarc panics at first use of a missing library), and the first driver
//! calls run under `catch_unwind`, so a machine without CUDA gets a typed
//! `RuntimeError::Devices`, never a panic.
//!
//! UNTESTED ON A GPU so far (written on a machine without one): the first GPU
//! session runs tests/cuda.rs and tools/gpu_check.sh.
//!
//! Execution: every plan buffer is a `CudaSlice<u8>` (typed by the plan);
//! parameters and constants are uploaded, fused kernels (one NVRTC module
//! per executable) are launched with a grid-stride loop, dots go to
//! `cublasGemmStridedBatchedEx` with f32 compute (bf16 inputs accumulate in
//! f32) using the row-major trick: row-major `C = A B` is column-major
//! `C^T = B^T A^T`, so cuBLAS gets (B, A) with m = n, n = m.

use super::host::{array_to_bytes, elem_bytes};
use super::plan::{BufId, DotStep, Plan, Step};
use crate::backend::{Backend, DeviceContext, Executable};
use crate::error::RuntimeError;
use crate::literal::Literal;
use collectives::DeviceBuffer;
use cudarc::cublas::{result as blas_result, sys as blas_sys, CudaBlas};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig,
    PushKernelArg,
};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use xla_hlo_evaluator::Array;
use xla_hlo_ir::{HloModule, PrimitiveType};

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

/// One CUDA device as a backend.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: Arc<CudaBlas>,
    ordinal: usize,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaBackend(device {})", self.ordinal)
    }
}

impl CudaBackend {
    /// Opens device `ordinal` (after [`probe`]).
    pub fn new(ordinal: usize) -> Result<CudaBackend, RuntimeError> {
        let n = probe()?;
        if ordinal >= n {
            return Err(dev_err(format!("device {ordinal} requested, {n} present")));
        }
        let r = catch_unwind(|| -> Result<CudaBackend, RuntimeError> {
            let ctx = CudaContext::new(ordinal).map_err(|e| dev_err(format!("cuCtx: {e:?}")))?;
            let stream = ctx.default_stream();
            let blas =
                CudaBlas::new(stream.clone()).map_err(|e| dev_err(format!("cuBLAS: {e:?}")))?;
            Ok(CudaBackend {
                ctx,
                stream,
                blas: Arc::new(blas),
                ordinal,
            })
        });
        r.map_err(|_| dev_err("cudarc panicked while opening the device"))?
    }

    /// `sm_XY` of the device, for NVRTC.
    pub fn compute_capability(&self) -> Result<(i32, i32), RuntimeError> {
        self.ctx
            .compute_capability()
            .map_err(|e| dev_err(format!("compute capability: {e:?}")))
    }
}

/// `out[b] = lhs[b] (m x k) * rhs[b] (k x n)`, row-major, through
/// `cublasGemmStridedBatchedEx` with f32 compute: row-major `C = A B` is
/// column-major `C^T = B^T A^T`, so cuBLAS gets (rhs, lhs) with its m = n and
/// n = m, and every leading dimension is the row length.
#[allow(clippy::too_many_arguments)]
fn gemm_row_major(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    d: &DotStep,
    lt: PrimitiveType,
    ot: PrimitiveType,
    lhs: &CudaSlice<u8>,
    rhs: &CudaSlice<u8>,
    out: &mut CudaSlice<u8>,
) -> Result<(), RuntimeError> {
    let dt = |t: PrimitiveType| match t {
        PrimitiveType::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
        _ => blas_sys::cudaDataType::CUDA_R_32F,
    };
    let (alpha, beta) = (1.0f32, 0.0f32);
    let (a_ptr, _ga) = lhs.device_ptr(stream);
    let (b_ptr, _gb) = rhs.device_ptr(stream);
    let (c_ptr, _gc) = out.device_ptr_mut(stream);
    // SAFETY: pointers to buffers of batch*m*k, batch*k*n and batch*m*n
    // elements of the given types (the plan's buffer sizes).
    unsafe {
        blas_result::gemm_strided_batched_ex(
            *blas.handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            d.n as i32,
            d.m as i32,
            d.k as i32,
            &alpha as *const f32 as *const _,
            b_ptr as *const _,
            dt(lt),
            d.n as i32,
            d.k * d.n,
            a_ptr as *const _,
            dt(lt),
            d.k as i32,
            d.m * d.k,
            &beta as *const f32 as *const _,
            c_ptr as *mut _,
            dt(ot),
            d.n as i32,
            d.m * d.n,
            d.batch as i32,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| exec_err(format!("cuBLAS gemm: {e:?}")))
}

impl CudaBackend {
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
        let alloc = |elems: i64, w: usize| {
            self.stream
                .alloc_zeros::<u8>((elems as usize * w).max(1))
                .map_err(|e| exec_err(format!("device allocation: {e:?}")))
        };
        let a = alloc(m * k, 2)?;
        let b = alloc(k * n, 2)?;
        let mut c = alloc(m * n, elem_bytes(out_ty))?;
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
            self.stream
                .synchronize()
                .map_err(|e| exec_err(format!("synchronize: {e:?}")))
        };
        let mut gemm = || {
            gemm_row_major(
                &self.blas,
                &self.stream,
                &d,
                PrimitiveType::Bf16,
                out_ty,
                &a,
                &b,
                &mut c,
            )
        };
        // One warm-up call, then the timed ones.
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
}

struct CudaExecutable {
    module: HloModule,
    plan: Plan,
    functions: Vec<Option<CudaFunction>>, // per step
    stream: Arc<CudaStream>,
    blas: Arc<CudaBlas>,
    lock: Mutex<()>,
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
        let mut functions = vec![None; plan.steps.len()];
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
            let m = self
                .ctx
                .load_module(ptx)
                .map_err(|e| cerr(format!("cuModuleLoad: {e:?}")))?;
            for (i, s) in plan.steps.iter().enumerate() {
                if let Step::Fused(k) = s {
                    functions[i] = Some(
                        m.load_function(&k.name)
                            .map_err(|e| cerr(format!("kernel {}: {e:?}", k.name)))?,
                    );
                }
            }
        }
        Ok(Box::new(CudaExecutable {
            module: module.clone(),
            plan,
            functions,
            stream: self.stream.clone(),
            blas: self.blas.clone(),
            lock: Mutex::new(()),
            source,
        }))
    }
}

fn leaf_of<'v>(v: &'v Literal, index: &[usize]) -> Option<&'v DeviceBuffer> {
    match (index.split_first(), v) {
        (None, _) => v.as_array(),
        (Some((i, rest)), Literal::Tuple(elements)) => leaf_of(elements.get(*i)?, rest),
        (Some(_), _) => None,
    }
}

impl CudaExecutable {
    fn upload_constant(&self, a: &Array) -> Result<CudaSlice<u8>, RuntimeError> {
        self.upload(array_to_bytes(a)?)
    }

    fn upload(&self, mut bytes: Vec<u8>) -> Result<CudaSlice<u8>, RuntimeError> {
        if bytes.is_empty() {
            bytes.push(0);
        }
        self.stream
            .clone_htod(&bytes)
            .map_err(|e| exec_err(format!("host-to-device copy: {e:?}")))
    }

    fn alloc(&self, b: BufId) -> Result<CudaSlice<u8>, RuntimeError> {
        let info = &self.plan.buffers[b];
        let n: i64 = info.dims.iter().product();
        let bytes = (n as usize * elem_bytes(info.ty)).max(1);
        self.stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| exec_err(format!("device allocation of {bytes} bytes: {e:?}")))
    }

    fn run(&self, args: &[Literal]) -> Result<Vec<Literal>, RuntimeError> {
        let mut bufs: Vec<Option<CudaSlice<u8>>> =
            (0..self.plan.buffers.len()).map(|_| None).collect();
        for (si, step) in self.plan.steps.iter().enumerate() {
            match step {
                Step::Param { out, number, index } => {
                    let a = args
                        .get(*number)
                        .and_then(|v| leaf_of(v, index))
                        .ok_or_else(|| exec_err(format!("missing argument {number} {index:?}")))?;
                    let info = &self.plan.buffers[*out];
                    if a.dims() != info.dims.as_slice() || a.dtype() != info.ty {
                        return Err(exec_err(format!(
                            "argument {number}{index:?}: expected {}{:?}, got {}",
                            info.ty.name(),
                            info.dims,
                            a.shape_string()
                        )));
                    }
                    // The device layout (little-endian, pred as 0/1 bytes)
                    // is the literal's.
                    bufs[*out] = Some(self.upload(a.to_vec())?);
                }
                Step::Constant { out, value } => bufs[*out] = Some(self.upload_constant(value)?),
                Step::Fused(k) => {
                    let f = self.functions[si]
                        .as_ref()
                        .ok_or_else(|| exec_err(format!("kernel {} not loaded", k.name)))?;
                    let mut out = self.alloc(k.out)?;
                    let n: i64 = self.plan.buffers[k.out].dims.iter().product();
                    if n > 0 {
                        let block = 256u32;
                        let blocks = ((n as u64).div_ceil(block as u64)).clamp(1, 1 << 20) as u32;
                        let cfg = LaunchConfig {
                            grid_dim: (blocks, 1, 1),
                            block_dim: (block, 1, 1),
                            shared_mem_bytes: 0,
                        };
                        let mut b = self.stream.launch_builder(f);
                        b.arg(&mut out);
                        for i in &k.inputs {
                            let s = bufs[*i]
                                .as_ref()
                                .ok_or_else(|| exec_err(format!("{}: input not ready", k.name)))?;
                            b.arg(s);
                        }
                        b.arg(&n);
                        // SAFETY: the kernel's parameters are (out, inputs..., n)
                        // with buffers of the planned sizes (codegen.rs).
                        unsafe { b.launch(cfg) }
                            .map_err(|e| exec_err(format!("launch {}: {e:?}", k.name)))?;
                    }
                    bufs[k.out] = Some(out);
                }
                Step::Dot(d) => {
                    let mut out = self.alloc(d.out)?;
                    let (lt, ot) = (self.plan.buffers[d.lhs].ty, self.plan.buffers[d.out].ty);
                    if d.m > 0 && d.n > 0 && d.batch > 0 && d.k > 0 {
                        let lhs = bufs[d.lhs]
                            .as_ref()
                            .ok_or_else(|| exec_err("dot lhs not ready"))?;
                        let rhs = bufs[d.rhs]
                            .as_ref()
                            .ok_or_else(|| exec_err("dot rhs not ready"))?;
                        gemm_row_major(&self.blas, &self.stream, d, lt, ot, lhs, rhs, &mut out)?;
                    }
                    bufs[d.out] = Some(out);
                }
            }
        }
        let fetch = |b: BufId| -> Result<Literal, RuntimeError> {
            let info = &self.plan.buffers[b];
            let s = bufs[b]
                .as_ref()
                .ok_or_else(|| exec_err("result not computed"))?;
            let host: Vec<u8> = self
                .stream
                .clone_dtoh(s)
                .map_err(|e| exec_err(format!("device-to-host copy: {e:?}")))?;
            let used = (info.dims.iter().product::<i64>() as usize) * elem_bytes(info.ty);
            DeviceBuffer::from_bytes(info.ty, info.dims.clone(), &host[..used.min(host.len())])
                .map(Literal::Array)
                .map_err(|e| exec_err(format!("result: {e}")))
        };
        let out = self.plan.result.outputs(&fetch, &Literal::Tuple)?;
        self.stream
            .synchronize()
            .map_err(|e| exec_err(format!("stream synchronize: {e:?}")))?;
        Ok(out)
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
        if device.num_partitions * device.num_replicas > 1 {
            return Err(exec_err(
                "the CUDA backend runs single-device programs only (no NCCL collectives yet)",
            ));
        }
        if device.consistent {
            return Err(exec_err(
                "the CUDA backend has no consistent mode (its kernels do not follow the tree reduction order); run with --backend cpu",
            ));
        }
        let _g = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        catch_unwind(AssertUnwindSafe(|| self.run(args)))
            .map_err(|_| exec_err("cudarc panicked during execution"))?
    }
}
