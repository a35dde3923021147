//! The CUDA backend's plans run on the host (backend `cuda-host`): the
//! generated CUDA C is built by the host C++ compiler under
//! `codegen::HOST_SHIM` into a shared library (one "thread" runs each
//! grid-stride loop), loaded with `libloading`, and driven by the same
//! executor as the GPU (`exec.rs`); dots are a row-by-row loop with f32
//! accumulation (f64 for f64), as cuBLAS computes them.
//!
//! This is how the ordinary test suite checks every generated kernel, the
//! plan's control flow and its collectives (through the launcher's
//! loopback devices) against XLA's outputs without a GPU. It needs a `c++`
//! on the PATH (`XLA_RS_CXX` names another compiler).

use super::exec::{execute_plan, refuse_consistent, Machine};
use super::plan::{DotStep, Kernel, Plan};
use crate::backend::{Backend, DeviceContext, Executable};
use crate::error::RuntimeError;
use crate::literal::Literal;
use std::collections::HashMap;
use std::ffi::c_void;
use xla_hlo_ir::literal::{float_from_bits, float_to_bits};
use xla_hlo_ir::{HloModule, PrimitiveType};

type HostKernel = unsafe extern "C" fn(*mut *mut c_void, i64);

fn compile_err(m: impl Into<String>) -> RuntimeError {
    RuntimeError::Compile {
        backend: "cuda-host",
        message: m.into(),
    }
}

fn exec_err(m: impl Into<String>) -> RuntimeError {
    RuntimeError::Device {
        backend: "cuda-host",
        message: m.into(),
    }
}

/// The generated kernels of one plan, built for and loaded on the host.
pub struct HostKernels {
    // Kept alive while the function pointers are used.
    _library: libloading::Library,
    functions: HashMap<String, HostKernel>,
}

impl HostKernels {
    /// Builds the plan's kernels with the host C++ compiler and loads them.
    pub fn build(plan: &Plan) -> Result<HostKernels, RuntimeError> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static SERIAL: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "xla_rs_cuda_host_{}_{}",
            std::process::id(),
            SERIAL.fetch_add(1, Ordering::SeqCst)
        ));
        let io = |e: std::io::Error| compile_err(format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(&dir).map_err(io)?;
        let source = dir.join("kernels.cc");
        let library = dir.join("kernels.so");
        std::fs::write(&source, super::codegen::host_library_source(plan)).map_err(io)?;
        let out = host_compiler()?
            .args(["-std=c++17", "-O1", "-w", "-fPIC", "-shared", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .map_err(|e| compile_err(format!("running the host C++ compiler: {e}")))?;
        if !out.status.success() {
            return Err(compile_err(format!(
                "the generated kernels do not compile (source kept in {}):\n{}",
                source.display(),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        // SAFETY: a library we just built from generated C++ with no
        // initialisers beyond constant data.
        let lib = unsafe { libloading::Library::new(&library) }
            .map_err(|e| compile_err(format!("loading {}: {e}", library.display())))?;
        let mut functions = HashMap::new();
        for k in plan.kernels() {
            let sym = format!("{}_host", k.name);
            // SAFETY: every `NAME_host` has the signature `void(void**, long long)`.
            let f: libloading::Symbol<HostKernel> = unsafe { lib.get(sym.as_bytes()) }
                .map_err(|e| compile_err(format!("kernel {}: {e}", k.name)))?;
            functions.insert(k.name.clone(), *f);
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(HostKernels {
            _library: lib,
            functions,
        })
    }
}

/// The host C++ compiler: `$XLA_RS_CXX`, else the first of `c++`, `g++`,
/// `clang++` that runs.
fn host_compiler() -> Result<std::process::Command, RuntimeError> {
    let candidates: Vec<String> = match std::env::var("XLA_RS_CXX") {
        Ok(c) => vec![c],
        Err(_) => ["c++", "g++", "clang++"]
            .iter()
            .map(|s| s.to_string())
            .collect(),
    };
    for c in &candidates {
        let found = std::process::Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if found {
            return Ok(std::process::Command::new(c));
        }
    }
    Err(compile_err(format!(
        "no host C++ compiler found (tried {}; set XLA_RS_CXX)",
        candidates.join(", ")
    )))
}

/// Host memory and host-built kernels.
pub struct HostMachine<'k> {
    pub kernels: &'k HostKernels,
}

fn decode(ty: PrimitiveType, b: &[u8], i: usize) -> f64 {
    match ty {
        PrimitiveType::F32 => f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap()) as f64,
        PrimitiveType::F64 => f64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap()),
        _ => float_from_bits(ty, u16::from_le_bytes([b[2 * i], b[2 * i + 1]]) as u128)
            .unwrap_or(f64::NAN),
    }
}

fn encode(ty: PrimitiveType, out: &mut [u8], i: usize, v: f64) {
    match ty {
        PrimitiveType::F32 => out[4 * i..4 * i + 4].copy_from_slice(&(v as f32).to_le_bytes()),
        PrimitiveType::F64 => out[8 * i..8 * i + 8].copy_from_slice(&v.to_le_bytes()),
        _ => {
            let bits = float_to_bits(ty, v as f32 as f64).unwrap_or(0) as u16;
            out[2 * i..2 * i + 2].copy_from_slice(&bits.to_le_bytes());
        }
    }
}

impl Machine for HostMachine<'_> {
    type Buf = Vec<u8>;

    fn upload(&self, bytes: &[u8]) -> Result<Vec<u8>, RuntimeError> {
        let mut v = bytes.to_vec();
        if v.is_empty() {
            v.push(0);
        }
        Ok(v)
    }

    fn download(&self, buf: &Vec<u8>, len: usize) -> Result<Vec<u8>, RuntimeError> {
        buf.get(..len).map(|b| b.to_vec()).ok_or_else(|| {
            exec_err(format!(
                "reading {len} bytes of a {}-byte buffer",
                buf.len()
            ))
        })
    }

    fn alloc(&self, bytes: usize) -> Result<Vec<u8>, RuntimeError> {
        Ok(vec![0; bytes.max(1)])
    }

    fn copy(&self, buf: &Vec<u8>, bytes: usize) -> Result<Vec<u8>, RuntimeError> {
        let mut v = self.download(buf, bytes)?;
        if v.is_empty() {
            v.push(0);
        }
        Ok(v)
    }

    fn launch(
        &self,
        kernel: &Kernel,
        outs: &mut [Vec<u8>],
        inputs: &[&Vec<u8>],
    ) -> Result<(), RuntimeError> {
        let f = self
            .kernels
            .functions
            .get(&kernel.name)
            .ok_or_else(|| exec_err(format!("kernel {} not built", kernel.name)))?;
        let mut ptrs: Vec<*mut c_void> = outs
            .iter_mut()
            .map(|o| o.as_mut_ptr() as *mut c_void)
            .collect();
        ptrs.extend(inputs.iter().map(|i| i.as_ptr() as *mut c_void));
        // SAFETY: the kernel reads and writes within the plan's buffer sizes
        // (codegen.rs); outputs are distinct buffers owned here, inputs are
        // only read.
        unsafe { f(ptrs.as_mut_ptr(), kernel.launch_size) };
        Ok(())
    }

    fn gemm(
        &self,
        d: &DotStep,
        lt: PrimitiveType,
        ot: PrimitiveType,
        lhs: &Vec<u8>,
        rhs: &Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<(), RuntimeError> {
        // f64 accumulates in f64, everything else in f32, as cuBLAS does.
        if lt == PrimitiveType::F64 {
            host_gemm(
                d,
                |i| decode(lt, lhs, i),
                |i| decode(lt, rhs, i),
                |i, v| encode(ot, out, i, v),
            );
        } else {
            host_gemm(
                d,
                |i| decode(lt, lhs, i) as f32,
                |i| decode(lt, rhs, i) as f32,
                |i, v: f32| encode(ot, out, i, v as f64),
            );
        }
        Ok(())
    }
}

/// `out = lhs * rhs` for a dot step in the accumulation type `T`: the
/// operands decoded once, each result row accumulated over k in order
/// (loops i, l, j), so every sum adds its terms in increasing l.
fn host_gemm<T>(
    d: &DotStep,
    lhs: impl Fn(usize) -> T,
    rhs: impl Fn(usize) -> T,
    mut out: impl FnMut(usize, T),
) where
    T: Copy + Default + std::ops::AddAssign + std::ops::Mul<Output = T>,
{
    let (m, n, k, batch) = (d.m as usize, d.n as usize, d.k as usize, d.batch as usize);
    let a: Vec<T> = (0..batch * m * k).map(lhs).collect();
    let b: Vec<T> = (0..batch * k * n).map(rhs).collect();
    let mut row = vec![T::default(); n];
    for bi in 0..batch {
        for i in 0..m {
            row.iter_mut().for_each(|x| *x = T::default());
            for l in 0..k {
                let av = a[(bi * m + i) * k + l];
                let brow = &b[(bi * k + l) * n..(bi * k + l + 1) * n];
                row.iter_mut().zip(brow).for_each(|(x, bv)| *x += av * *bv);
            }
            for (j, v) in row.iter().enumerate() {
                out((bi * m + i) * n + j, *v);
            }
        }
    }
}

/// The CUDA backend's plans on the host: backend name `cuda-host`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CudaHostBackend;

/// A module planned for the CUDA backend with its kernels built for the host.
pub struct CudaHostExecutable {
    module: HloModule,
    plan: Plan,
    kernels: HostKernels,
}

impl CudaHostExecutable {
    /// Plans `module` and builds its kernels with the host C++ compiler.
    pub fn build(module: &HloModule) -> Result<CudaHostExecutable, RuntimeError> {
        let (plan, _source) = super::prepare(module)?;
        let kernels = HostKernels::build(&plan)?;
        Ok(CudaHostExecutable {
            module: module.clone(),
            plan,
            kernels,
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }
}

impl Backend for CudaHostBackend {
    fn name(&self) -> &'static str {
        "cuda-host"
    }

    fn compile(&self, module: &HloModule) -> Result<Box<dyn Executable>, RuntimeError> {
        Ok(Box::new(CudaHostExecutable::build(module)?))
    }
}

impl Executable for CudaHostExecutable {
    fn module(&self) -> &HloModule {
        &self.module
    }

    fn execute(
        &self,
        device: &DeviceContext<'_>,
        args: &[Literal],
    ) -> Result<Vec<Literal>, RuntimeError> {
        refuse_consistent(device, "cuda-host")?;
        let machine = HostMachine {
            kernels: &self.kernels,
        };
        execute_plan(&machine, &self.plan, &self.module, device, args)
    }
}
