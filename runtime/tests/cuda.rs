//! The CUDA backend on real GPUs (feature `cuda`): small modules against the
//! interpreter; an async all-reduce through a single-rank NCCL communicator
//! on the communication stream; every corpus case (testdata/cases and, when
//! present, ../shared/corpus/cases) against XLA's stored outputs, the global
//! input.hlo and our partitioned program on its devices (NCCL between the
//! GPUs where there are as many GPUs as devices, host collectives between
//! devices sharing a GPU otherwise); bf16 GEMM throughput, device copy
//! bandwidth, and the perf_transformer_block step beside its roofline.
//! Without a CUDA device or library each test prints why and passes (skips).
//!
//! Written on machines without a GPU (the same plans and kernels run on the
//! host in tests/cuda_plan.rs): tools/gpu_check.sh runs these on a GPU.
#![cfg(feature = "cuda")]

mod common;

use common::{case_dirs, compare_outputs, global_launch, load_case, partitioned, Case};
use std::path::PathBuf;
use std::time::Instant;
use xla_hlo_evaluator::compare::compare;
use xla_hlo_evaluator::{evaluate, Array, EvalContext, Value};
use xla_hlo_ir::{HloModule, PrimitiveType};
use xla_runtime::cpu::{literals_from_values, values_from_literals};
use xla_runtime::cuda::CudaBackend;
use xla_runtime::{run_spmd, Backend, DeviceContext, LaunchPlan, RuntimeError};

/// The backend over every GPU, or `None` (with the reason printed) where
/// there is none.
fn backend() -> Option<CudaBackend> {
    match CudaBackend::all() {
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
        num_partitions: Some(1),
        num_replicas: Some(1),
        ..Default::default()
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
        "HloModule m\nENTRY e {\n  p = u64[2] parameter(0)\n  ROOT s = (u64[2], u32[4]) rng-bit-generator(p), algorithm=rng_three_fry\n}",
    )
    .unwrap();
    match be.compile(&m) {
        Err(RuntimeError::Compile { message, .. }) => {
            assert!(message.contains("rng-bit-generator (s)"), "{message}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("rng-bit-generator compiled"),
    }
}

/// An all-reduce-start/done pair with independent work between them: the
/// reduction runs on the communication stream through a single-rank NCCL
/// communicator and the done makes the compute stream wait.
#[test]
fn async_all_reduce_on_the_communication_stream() {
    let Some(be) = backend() else { return };
    let m = xla_hlo_parser::parse_module(
        r#"HloModule m, num_partitions=1
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[1024,256] parameter(0)
  y = f32[256,256] parameter(1)
  ars = f32[1024,256] all-reduce-start(x), replica_groups={{0}}, to_apply=add
  d = f32[1024,256] dot(x, y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ard = f32[1024,256] all-reduce-done(ars)
  ROOT r = f32[1024,256] add(ard, d)
}"#,
    )
    .unwrap();
    let args = args_for(&m);
    let want = interpret(&m, &args);
    let got = be
        .compile(&m)
        .and_then(|e| e.execute(&DeviceContext::single(), &literals_from_values(&args)?))
        .and_then(|o| values_from_literals(&o))
        .unwrap();
    let c = compare(&got[0].leaves()[0].clone(), want[0].leaves()[0], 1e-4, 1e-4);
    assert!(c.matched(), "{c:?}");
}

/// Runs `m` on `plan`'s devices (warm-up, then one timed run) and compares
/// with the case's expected outputs; the time of the run in ms.
fn run_and_compare(
    be: &CudaBackend,
    case: &Case,
    m: &HloModule,
    plan: &LaunchPlan,
) -> Result<f64, String> {
    let exe = be.compile(m).map_err(|e| e.to_string())?;
    let args = literals_from_values(&case.args).map_err(|e| e.to_string())?;
    run_spmd(exe.as_ref(), &args, plan).map_err(|e| e.to_string())?; // warm-up
    let t = Instant::now();
    let outs = run_spmd(exe.as_ref(), &args, plan).map_err(|e| e.to_string())?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let outs = values_from_literals(&outs).map_err(|e| e.to_string())?;
    compare_outputs(case, &outs)?;
    Ok(ms)
}

fn run_global(be: &CudaBackend, case: &Case) -> Option<Result<f64, String>> {
    let plan = global_launch(&case.module)?;
    Some(run_and_compare(be, case, &case.module, &plan))
}

fn run_partitioned(be: &CudaBackend, case: &Case) -> Result<f64, String> {
    let (m, plan) = partitioned(&case.module)?;
    run_and_compare(be, case, &m, &plan)
}

fn roots() -> Vec<PathBuf> {
    std::iter::once(xla_test_paths::testdata_cases())
        .chain(xla_test_paths::shared_corpus_cases())
        .collect()
}

/// One line per case and mode, parsed by tools/gpu_check.sh:
/// `CUDA-CASE <mode> <name> MATCH|FAIL|SKIP <ms> [message]`.
fn report(mode: &str, name: &str, r: Option<Result<f64, String>>, failures: &mut Vec<String>) {
    match r {
        Some(Ok(ms)) => eprintln!("CUDA-CASE {mode} {name} MATCH {ms:.3}"),
        None => eprintln!("CUDA-CASE {mode} {name} SKIP -"),
        Some(Err(m)) => {
            eprintln!("CUDA-CASE {mode} {name} FAIL - {m}");
            failures.push(format!("{name} ({mode}): {m}"));
        }
    }
}

#[test]
fn corpus_cases_on_one_gpu_match_xla() {
    let Some(be) = backend() else { return };
    let mut failures = Vec::new();
    for root in roots() {
        for d in case_dirs(&root) {
            let name = d.file_name().unwrap().to_string_lossy().to_string();
            match load_case(&d) {
                Ok(case) => report("global", &name, run_global(&be, &case), &mut failures),
                Err(e) => report("global", &name, Some(Err(e)), &mut failures),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Our partitioned programs on the GPUs: NCCL between GPUs where the
/// process has as many GPUs as the program has devices, host collectives
/// between devices sharing a GPU otherwise.
#[test]
fn partitioned_corpus_on_the_gpus_matches_xla() {
    let Some(be) = backend() else { return };
    eprintln!("partitioned programs on {} GPU(s)", be.gpu_count());
    let mut failures = Vec::new();
    for root in roots() {
        for d in case_dirs(&root) {
            let name = d.file_name().unwrap().to_string_lossy().to_string();
            let r = load_case(&d).and_then(|case| run_partitioned(&be, &case));
            report("partitioned", &name, Some(r), &mut failures);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The bf16 GEMM path alone (device-resident, f32 accumulation) and the
/// device copy bandwidth: prints TFLOP/s for 8192^3 (the issue's target: at
/// least 80% of the 787 TFLOP/s measured with cuBLAS on the H200) and GB/s.
/// Reports; asserts only that it runs.
#[test]
fn bf16_gemm_throughput_and_copy_bandwidth() {
    let Some(be) = backend() else { return };
    for out in [PrimitiveType::Bf16, PrimitiveType::F32] {
        let t = be.bf16_gemm_tflops(8192, 8192, 8192, out, 20).unwrap();
        eprintln!(
            "CUDA-GEMM bf16 8192^3 -> {}: {t:.1} TFLOP/s ({:.0}% of 787)",
            out.name(),
            t / 787.0 * 100.0
        );
    }
    let gbps = be.copy_gbps(1 << 30, 10).unwrap();
    eprintln!("CUDA-COPY 1 GiB device-to-device: {gbps:.0} GB/s (read + write)");
}

/// perf_transformer_block's global program on one GPU (its inputs are not
/// stored; the step time does not depend on their values, so deterministic
/// ones are used) beside a roofline measured in the same run: its dots at
/// the measured f32 cuBLAS rate plus the bytes its kernels and dots read
/// and write at the measured copy bandwidth. Reports; run_hlo_module --case
/// checks its outputs against the stored summary.
#[test]
fn perf_transformer_block_beside_its_roofline() {
    let Some(be) = backend() else { return };
    let Some(dir) = xla_test_paths::shared_corpus_cases().map(|d| d.join("perf_transformer_block"))
    else {
        return;
    };
    let Ok(text) = std::fs::read_to_string(dir.join("input.hlo")) else {
        eprintln!("skipping: no perf_transformer_block");
        return;
    };
    let m = xla_hlo_parser::parse_module(&text).unwrap();
    let (plan, _) = xla_runtime::cuda::prepare(&m).unwrap();
    let cost = xla_runtime::cuda::exec::plan_cost(&plan);
    let args = literals_from_values(&args_for(&m)).unwrap();
    let exe = be.compile(&m).unwrap();
    exe.execute(&DeviceContext::single(), &args).unwrap();
    let runs = 5;
    let t = Instant::now();
    for _ in 0..runs {
        exe.execute(&DeviceContext::single(), &args).unwrap();
    }
    let step_ms = t.elapsed().as_secs_f64() * 1e3 / runs as f64;
    let tflops = be.f32_gemm_tflops(4096, 4096, 1024, 20).unwrap();
    let gbps = be.copy_gbps(1 << 28, 20).unwrap();
    let input_bytes: usize = args
        .iter()
        .map(|a| a.leaves().iter().map(|b| b.bytes().len()).sum::<usize>())
        .sum();
    let h2d = be.htod_gbps(input_bytes.max(1), 5).unwrap();
    let roofline_ms = cost.dot_flops / (tflops * 1e12) * 1e3
        + cost.bytes / (gbps * 1e9) * 1e3
        + input_bytes as f64 / (h2d * 1e9) * 1e3;
    eprintln!(
        "CUDA-PERF perf_transformer_block step {step_ms:.3} ms, roofline {roofline_ms:.3} ms ({:.2}x): {:.1} GFLOP of dots at {tflops:.1} TFLOP/s, {:.1} MB at {gbps:.0} GB/s, {:.1} MB of inputs at {h2d:.1} GB/s",
        step_ms / roofline_ms,
        cost.dot_flops / 1e9,
        cost.bytes / 1e6,
        input_bytes as f64 / 1e6
    );
}
