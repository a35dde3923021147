//! The CUDA backend on a real GPU (feature `cuda`): small modules and every
//! supported corpus case (testdata/cases and, when present,
//! ../shared/corpus/cases; single device, input.hlo) against the
//! interpreter / XLA's stored outputs. Without a CUDA device or library each
//! test prints why and passes (skips).
//!
//! Written on a machine without a GPU: the first GPU session is the first
//! run of these tests (tools/gpu_check.sh runs them).
#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::time::Instant;
use xla_hlo_evaluator::compare::compare;
use xla_hlo_evaluator::npy::{load_argument, read_npy};
use xla_hlo_evaluator::{evaluate, Array, EvalContext, Value};
use xla_hlo_ir::{HloModule, PrimitiveType};
use xla_runtime::cpu::{literals_from_values, values_from_literals};
use xla_runtime::cuda::CudaBackend;
use xla_runtime::{Backend, DeviceContext, RuntimeError};

/// The backend, or `None` (with the reason printed) where there is no GPU.
fn backend() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) => {
            eprintln!("skipping CUDA test: {e}");
            None
        }
    }
}

fn args_for(m: &HloModule) -> Vec<Value> {
    let c = m.entry_computation();
    c.parameters
        .iter()
        .enumerate()
        .map(|(pi, p)| {
            let s = c.instr(*p).shape.as_array().unwrap();
            let n: i64 = s.dims.iter().product();
            let v: Vec<f64> = (0..n)
                .map(|i| {
                    let x = (((i * 7 + pi as i64 * 13) % 17) as f64 - 8.0) / 4.0;
                    match s.element_type {
                        PrimitiveType::Pred => ((i + pi as i64) % 2) as f64,
                        t if !t.is_float() => ((i * 5 + pi as i64) % 11) as f64 - 5.0,
                        _ => x,
                    }
                })
                .collect();
            Value::Array(Array::from_f64s(s.element_type, s.dims.clone(), &v).unwrap())
        })
        .collect()
}

fn interpret(m: &HloModule, args: &[Value]) -> Vec<Value> {
    let ctx = EvalContext {
        partition_id: 0,
        replica_id: 0,
        num_partitions: Some(1),
        num_replicas: Some(1),
        collectives: None,
        memory_limit: None,
        consistent: false,
    };
    evaluate(m, args, &ctx).unwrap()
}

const SMALL: &[(&str, &str)] = &[
    (
        "chain",
        r#"HloModule m
ENTRY e {
  x = f32[37,5] parameter(0)
  y = f32[37,5] parameter(1)
  two = f32[] constant(2)
  b = f32[37,5] broadcast(two), dimensions={}
  m = f32[37,5] multiply(x, b)
  a = f32[37,5] add(m, y)
  t = f32[37,5] tanh(a)
  ROOT ex = f32[37,5] exponential(t)
}"#,
    ),
    (
        "broadcast_transpose_slice",
        r#"HloModule m
ENTRY e {
  x = f32[2,3,4] parameter(0)
  r = f32[3] parameter(1)
  br = f32[2,3,4] broadcast(r), dimensions={1}
  s = f32[2,3,4] subtract(x, br)
  t = f32[4,2,3] transpose(s), dimensions={2,0,1}
  ROOT sl = f32[2,2,2] slice(t), slice={[0:4:2], [0:2], [1:3]}
}"#,
    ),
    (
        "softmax",
        r#"HloModule m
max {
  ma = f32[] parameter(0)
  mb = f32[] parameter(1)
  ROOT mm = f32[] maximum(ma, mb)
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT sa = f32[] add(a, b)
}
ENTRY e {
  x = f32[8,33] parameter(0)
  ninf = f32[] constant(-inf)
  mx = f32[8] reduce(x, ninf), dimensions={1}, to_apply=max
  bmx = f32[8,33] broadcast(mx), dimensions={0}
  s = f32[8,33] subtract(x, bmx)
  ex = f32[8,33] exponential(s)
  zero = f32[] constant(0)
  sum = f32[8] reduce(ex, zero), dimensions={1}, to_apply=add
  bs = f32[8,33] broadcast(sum), dimensions={0}
  ROOT r = f32[8,33] divide(ex, bs)
}"#,
    ),
    (
        "bf16_and_types",
        r#"HloModule m
ENTRY e {
  x = bf16[16] parameter(0)
  y = bf16[16] parameter(1)
  k = s32[16] parameter(2)
  m = bf16[16] multiply(x, y)
  a = bf16[16] add(m, x)
  c = f32[16] convert(a)
  io = s32[16] iota(), iota_dimension=0
  lt = pred[16] compare(io, k), direction=LT
  sel = f32[16] select(lt, c, c)
  ROOT t = (bf16[16], f32[16], pred[16], s32[16]) tuple(a, sel, lt, io)
}"#,
    ),
    (
        "dot_f32_batched_transposed",
        r#"HloModule m
ENTRY e {
  a = f32[2,3,4] parameter(0)
  b = f32[2,5,4] parameter(1)
  ROOT d = f32[2,3,5] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={2}
}"#,
    ),
    (
        "dot_bf16_f32_accumulation",
        r#"HloModule m
ENTRY e {
  x = bf16[2,3,64] parameter(0)
  w = bf16[64,7] parameter(1)
  ROOT d = f32[2,3,7] dot(x, w), lhs_contracting_dims={2}, rhs_contracting_dims={0}
}"#,
    ),
];

#[test]
fn small_modules_match_the_interpreter() {
    let Some(be) = backend() else { return };
    let mut failures = Vec::new();
    for (name, text) in SMALL {
        let m = xla_hlo_parser::parse_module(text).unwrap();
        let args = args_for(&m);
        let want = interpret(&m, &args);
        let got = match be
            .compile(&m)
            .and_then(|e| e.execute(&DeviceContext::single(), &literals_from_values(&args)?))
            .and_then(|outs| values_from_literals(&outs))
        {
            Ok(g) => g,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let (gl, wl): (Vec<_>, Vec<_>) = (
            got.iter().flat_map(|v| v.leaves()).collect(),
            want.iter().flat_map(|v| v.leaves()).collect(),
        );
        if gl.len() != wl.len() {
            failures.push(format!(
                "{name}: {} outputs, expected {}",
                gl.len(),
                wl.len()
            ));
            continue;
        }
        for (i, (g, w)) in gl.iter().zip(&wl).enumerate() {
            let c = compare(g, w, 1e-5, 1e-5);
            if !c.matched() {
                failures.push(format!("{name} output {i}: {c:?}"));
            }
        }
        eprintln!("{name}: ok");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unsupported_module_is_a_compile_error() {
    let Some(be) = backend() else { return };
    let m = xla_hlo_parser::parse_module(
        "HloModule m\nENTRY e {\n  p = f32[4] parameter(0)\n  ROOT s = f32[4] atan2(p, p)\n}",
    )
    .unwrap();
    match be.compile(&m) {
        Err(RuntimeError::Compile { message, .. }) => {
            assert!(message.contains("atan2 (s)"), "{message}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("atan2 compiled"),
    }
}

fn run_case(be: &CudaBackend, dir: &Path) -> Result<Option<f64>, String> {
    let case: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("case.json")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    // At least 1e-5: the GPU's transcendental functions and cuBLAS'
    // summation order differ from XLA's CPU run by a few ulps.
    let rtol = case["rtol"].as_f64().unwrap_or(1e-5).max(1e-5);
    let atol = case["atol"].as_f64().unwrap_or(1e-5).max(1e-5);
    let text = std::fs::read_to_string(dir.join("input.hlo")).map_err(|e| e.to_string())?;
    let m = xla_hlo_parser::parse_module(&text).map_err(|e| e.to_string())?;
    let exe = match be.compile(&m) {
        Ok(e) => e,
        Err(RuntimeError::Compile { message, .. })
            if message.contains("not supported by the CUDA backend") =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e.to_string()),
    };
    let g = m.entry_computation();
    let mut args = Vec::new();
    for (i, &p) in g.parameters.iter().enumerate() {
        let instr = &g.instructions[p.index()];
        let a = load_argument(
            &dir.join(format!("args/arg{i}.npy")),
            i,
            &instr.name,
            &instr.shape,
        )
        .map_err(|e| format!("argument {i}: {e}"))?;
        args.push(Value::Array(a));
    }
    let args = literals_from_values(&args).map_err(|e| e.to_string())?;
    exe.execute(&DeviceContext::single(), &args)
        .map_err(|e| e.to_string())?; // warm-up
    let t = Instant::now();
    let outs = exe
        .execute(&DeviceContext::single(), &args)
        .map_err(|e| e.to_string())?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let outs = values_from_literals(&outs).map_err(|e| e.to_string())?;
    let flat: Vec<_> = outs.iter().flat_map(|v| v.leaves()).collect();
    for (i, a) in flat.iter().enumerate() {
        let e = read_npy(&dir.join(format!("expected/out{i}.npy")))
            .map_err(|e| format!("expected {i}: {e}"))?;
        let c = compare(a, &e, rtol, atol);
        if !c.matched() {
            return Err(format!("output {i}: {c:?}"));
        }
    }
    Ok(Some(ms))
}

fn run_dir(be: &CudaBackend, root: &Path) -> (usize, usize, Vec<String>) {
    let (mut ran, mut matched, mut failures) = (0, 0, Vec::new());
    let Ok(entries) = std::fs::read_dir(root) else {
        eprintln!("skipping {}: not present", root.display());
        return (0, 0, failures);
    };
    let mut dirs: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    dirs.sort();
    for d in dirs {
        if !d.join("args").is_dir() || !d.join("input.hlo").is_file() {
            continue;
        }
        ran += 1;
        let name = d.file_name().unwrap().to_string_lossy().to_string();
        // One line per case, parsed by tools/gpu_check.sh.
        match run_case(be, &d) {
            Ok(Some(ms)) => {
                matched += 1;
                eprintln!("CUDA-CASE {name} MATCH {ms:.3}ms");
            }
            Ok(None) => eprintln!("CUDA-CASE {name} UNSUPPORTED -"),
            Err(m) => {
                eprintln!("CUDA-CASE {name} FAIL - {m}");
                failures.push(format!("{name}: {m}"));
            }
        }
    }
    (ran, matched, failures)
}

#[test]
fn corpus_cases_on_the_gpu_match_xla() {
    let Some(be) = backend() else { return };
    let mut all = Vec::new();
    let roots = std::iter::once(xla_test_paths::testdata_cases())
        .chain(xla_test_paths::shared_corpus_cases());
    for root in roots {
        let (ran, matched, failures) = run_dir(&be, &root);
        eprintln!(
            "{}: {matched} of {ran} cases matched on the GPU",
            root.display()
        );
        all.extend(failures);
    }
    assert!(all.is_empty(), "{}", all.join("\n"));
}

/// The bf16 GEMM path alone (device-resident, f32 accumulation): prints
/// TFLOP/s for 8192^3 (issue 8's target: at least 80% of the 787 TFLOP/s
/// measured with cuBLAS on the H200). Reports; asserts only that it runs.
#[test]
fn bf16_gemm_throughput() {
    let Some(be) = backend() else { return };
    for out in [PrimitiveType::Bf16, PrimitiveType::F32] {
        let t = be.bf16_gemm_tflops(8192, 8192, 8192, out, 20).unwrap();
        eprintln!(
            "CUDA-GEMM bf16 8192^3 -> {}: {t:.1} TFLOP/s ({:.0}% of 787)",
            out.name(),
            t / 787.0 * 100.0
        );
    }
}
