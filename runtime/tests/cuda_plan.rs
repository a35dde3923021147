//! Every corpus case on the CUDA backend without a GPU: the `cuda-host`
//! backend plans each module, builds its generated kernels with the host
//! C++ compiler and runs them with the backend's executor (control flow
//! from the host, collectives through the launcher's loopback devices).
//! For every case with stored arrays (testdata/cases and, when present,
//! ../shared/corpus/cases):
//!
//! * the global `input.hlo` (one device, or its `num_partitions` devices
//!   where the module needs SPMD semantics; a Shardy manual computation has
//!   no global run and is covered by the partitioned one), and
//! * our partitioned per-device program (the standard SPMD pipeline, run
//!   on its devices),
//!
//! must plan and match XLA's expected outputs. Prints a table; fails on any
//! case that does not plan or does not match. No GPU involved.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use xla_hlo_evaluator::compare::compare;
use xla_hlo_evaluator::npy::{load_argument, read_npy};
use xla_hlo_evaluator::{needs_spmd, Value};
use xla_hlo_ir::HloModule;
use xla_runtime::cpu::{literals_from_values, values_from_literals};
use xla_runtime::cuda::hostexec::CudaHostBackend;
use xla_runtime::{run_spmd, Backend, LaunchPlan};

struct Case {
    dir: PathBuf,
    module: HloModule,
    args: Vec<Value>,
    rtol: f64,
    atol: f64,
}

fn load(dir: &Path) -> Result<Case, String> {
    let case: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("case.json")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    // At least 1e-5: the kernels use the host's libm (XLA's f32 sine, for
    // one, is a ulp off at times) and accumulate dots in their own order.
    let rtol = case["rtol"].as_f64().unwrap_or(1e-5).max(1e-5);
    let atol = case["atol"].as_f64().unwrap_or(1e-5).max(1e-5);
    let text = std::fs::read_to_string(dir.join("input.hlo")).map_err(|e| e.to_string())?;
    let module = xla_hlo_parser::parse_module(&text).map_err(|e| e.to_string())?;
    let g = module.entry_computation();
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
    Ok(Case {
        dir: dir.to_path_buf(),
        module,
        args,
        rtol,
        atol,
    })
}

/// Runs `module` on `plan`'s devices with the cuda-host backend and
/// compares with the case's expected outputs; `Err` names what failed.
fn run_and_compare(case: &Case, module: &HloModule, plan: &LaunchPlan) -> Result<usize, String> {
    let exe = CudaHostBackend
        .compile(module)
        .map_err(|e| format!("compile: {e}"))?;
    let kernels = xla_runtime::cuda::prepare(module)
        .map(|(p, _)| p.kernels().count())
        .unwrap_or(0);
    let args = literals_from_values(&case.args).map_err(|e| e.to_string())?;
    let outs = run_spmd(exe.as_ref(), &args, plan)
        .and_then(|o| values_from_literals(&o))
        .map_err(|e| format!("run: {e}"))?;
    let flat: Vec<_> = outs.iter().flat_map(|v| v.leaves()).collect();
    for (i, a) in flat.iter().enumerate() {
        let e = read_npy(&case.dir.join(format!("expected/out{i}.npy")))
            .map_err(|e| format!("expected {i}: {e}"))?;
        let c = compare(a, &e, case.rtol, case.atol);
        if !c.matched() {
            return Err(format!("output {i}: {c:?}"));
        }
    }
    if case
        .dir
        .join(format!("expected/out{}.npy", flat.len()))
        .exists()
    {
        return Err(format!("only {} outputs were produced", flat.len()));
    }
    Ok(kernels)
}

/// The global run: `None` when the module has none (Shardy manual
/// computations are written in per-device shapes).
fn global(case: &Case) -> Option<Result<usize, String>> {
    if xla_pipelines::shardy_import::has_manual_computation(&case.module) {
        return None;
    }
    let n = if needs_spmd(&case.module) {
        case.module.num_partitions().max(1) as usize
    } else {
        1
    };
    Some(run_and_compare(
        case,
        &case.module,
        &LaunchPlan::replicated(&case.module, n),
    ))
}

/// Our partitioned program on the module's devices.
fn partitioned(case: &Case) -> Result<usize, String> {
    let n = case.module.num_partitions().max(1);
    let options = xla_pipelines::PipelineOptions {
        num_partitions: Some(n),
        ..Default::default()
    };
    let mut m = case.module.clone();
    let out_shape = m.entry_computation().root_instr().shape.clone();
    xla_pipelines::spmd_pipeline(&options, false)
        .run(&mut m)
        .map_err(|e| format!("partitioning: {e}"))?;
    let mut plan = LaunchPlan::for_partitioned(&m, out_shape);
    plan.num_partitions = n as usize;
    run_and_compare(case, &m, &plan)
}

/// (cases that matched both ways, cases, failures).
fn run_dir(root: &Path) -> (usize, usize, Vec<String>) {
    let Ok(entries) = std::fs::read_dir(root) else {
        eprintln!("skipping {}: not present", root.display());
        return (0, 0, Vec::new());
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|d| d.join("args").is_dir() && d.join("input.hlo").is_file())
        .collect();
    dirs.sort();
    let queue = Mutex::new(dirs.clone());
    let rows = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(8);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let Some(d) = queue.lock().unwrap().pop() else {
                    break;
                };
                let name = d.file_name().unwrap().to_string_lossy().to_string();
                let row = match load(&d) {
                    Err(e) => (name, Some(Err(e)), Err("not loaded".to_string())),
                    Ok(case) => (name, global(&case), partitioned(&case)),
                };
                rows.lock().unwrap().push(row);
            });
        }
    });
    let mut rows = rows.into_inner().unwrap();
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let mut failures = Vec::new();
    let mut failed_cases = 0;
    let show = |r: &Option<Result<usize, String>>| match r {
        None => "no global run".to_string(),
        Some(Ok(k)) => format!("MATCH ({k} kernels)"),
        Some(Err(e)) => format!("FAILED: {e}"),
    };
    for (name, g, p) in &rows {
        let p = Some(p.clone());
        eprintln!("{name:48} global {:32} partitioned {}", show(g), show(&p));
        let before = failures.len();
        for (what, r) in [("global", g), ("partitioned", &p)] {
            if let Some(Err(e)) = r {
                failures.push(format!("{name} ({what}): {e}"));
            }
        }
        failed_cases += usize::from(failures.len() > before);
    }
    (rows.len() - failed_cases, rows.len(), failures)
}

#[test]
fn testdata_cases_run_on_the_cuda_backend_with_host_built_kernels() {
    let (matched, ran, failures) = run_dir(&xla_test_paths::testdata_cases());
    assert!(ran > 0, "no testdata case ran");
    eprintln!("testdata: {matched} of {ran} cases planned and matched XLA, global and partitioned");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn shared_corpus_cases_run_on_the_cuda_backend_with_host_built_kernels() {
    let Some(dir) = xla_test_paths::shared_corpus_cases() else {
        return;
    };
    let (matched, ran, failures) = run_dir(&dir);
    eprintln!(
        "shared corpus: {matched} of {ran} cases planned and matched XLA, global and partitioned"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
