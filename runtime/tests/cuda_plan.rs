//! Every corpus case on the CUDA backend without a GPU: the `cuda-host`
//! backend plans each module, builds its generated kernels with the host
//! C++ compiler and runs them with the backend's executor (control flow
//! from the host, collectives through the launcher's loopback devices).
//! For every case with stored arrays (testdata/cases, testdata/cuda_cases
//! and, when present, ../shared/corpus/cases):
//!
//! * the global `input.hlo` (one device, or its `num_partitions` devices
//!   where the module needs SPMD semantics; a Shardy manual computation has
//!   no global run and is covered by the partitioned one), and
//! * our partitioned per-device program (the standard SPMD pipeline, run
//!   on its devices),
//!
//! must plan and match XLA's expected outputs. Prints a table; fails on any
//! case that does not plan or does not match. No GPU involved.

mod common;

use common::{case_dirs, compare_outputs, global_launch, load_case, partitioned, Case};
use std::path::Path;
use std::sync::Mutex;
use xla_hlo_ir::HloModule;
use xla_runtime::cpu::{literals_from_values, values_from_literals};
use xla_runtime::cuda::hostexec::CudaHostExecutable;
use xla_runtime::{run_spmd, LaunchPlan};

/// Runs `module` on `plan`'s devices with the cuda-host backend and
/// compares with the case's expected outputs; the kernel count, or what
/// failed.
fn run_and_compare(case: &Case, module: &HloModule, plan: &LaunchPlan) -> Result<usize, String> {
    let exe = CudaHostExecutable::build(module).map_err(|e| format!("compile: {e}"))?;
    let kernels = exe.plan().kernels().count();
    let args = literals_from_values(&case.args).map_err(|e| e.to_string())?;
    let outs = run_spmd(&exe, &args, plan)
        .and_then(|o| values_from_literals(&o))
        .map_err(|e| format!("run: {e}"))?;
    compare_outputs(case, &outs)?;
    Ok(kernels)
}

fn global(case: &Case) -> Option<Result<usize, String>> {
    let plan = global_launch(&case.module)?;
    Some(run_and_compare(case, &case.module, &plan))
}

fn partitioned_run(case: &Case) -> Result<usize, String> {
    let (m, plan) = partitioned(&case.module)?;
    run_and_compare(case, &m, &plan)
}

/// (cases that matched both ways, cases, failures).
fn run_dir(root: &Path) -> (usize, usize, Vec<String>) {
    let queue = Mutex::new(case_dirs(root));
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
                let row = match load_case(&d) {
                    Err(e) => (name, Some(Err(e)), Err("not loaded".to_string())),
                    Ok(case) => (name, global(&case), partitioned_run(&case)),
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

/// Held-out JAX programs that found bugs in this backend after it was done
/// (tools/testdata_gen/cuda_heldout_cases.py): unsigned arithmetic shifts,
/// bitcast-convert between widths, calls inside reducers, complex functions.
#[test]
fn heldout_cases_that_found_bugs_run_on_the_cuda_backend() {
    let dir = xla_test_paths::workspace_root().join("testdata/cuda_cases");
    let (matched, ran, failures) = run_dir(&dir);
    assert!(ran > 0, "no case in {}", dir.display());
    eprintln!(
        "cuda_cases: {matched} of {ran} cases planned and matched XLA, global and partitioned"
    );
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
