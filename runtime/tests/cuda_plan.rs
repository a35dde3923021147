//! The CUDA backend's plans, run on the CPU with the generated kernels'
//! semantics (`run_plan_on_cpu`), reproduce XLA's outputs on every corpus
//! case the backend supports (testdata/cases and, when present,
//! ../shared/corpus/cases; single device, input.hlo); every other case is
//! rejected at compile with the unsupported instructions named. Prints a
//! table of both. The generated CUDA C of each plan is also built with the
//! host C++ compiler (when there is one; `XLA_RS_SKIP_HOST_KERNELS=1` skips
//! it) and its results compared too. No GPU involved.

use std::path::{Path, PathBuf};
use xla_hlo_evaluator::compare::compare;
use xla_hlo_evaluator::npy::{load_argument, read_npy};
use xla_hlo_evaluator::Value;
use xla_runtime::cuda::hostcheck::run_generated_on_host;
use xla_runtime::cuda::plan::run_plan_on_cpu;
use xla_runtime::cuda::prepare;
use xla_runtime::RuntimeError;

enum Outcome {
    Matched(usize),
    Unsupported(String),
    Failed(String),
}

fn run_case(dir: &Path) -> Result<Outcome, String> {
    let case: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("case.json")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    // At least 1e-6: the plan computes transcendental functions in f64 and
    // rounds once (XLA's f32 sine, for one, is a ulp off at times).
    let rtol = case["rtol"].as_f64().unwrap_or(1e-5).max(1e-6);
    let atol = case["atol"].as_f64().unwrap_or(1e-5).max(1e-6);
    let text = std::fs::read_to_string(dir.join("input.hlo")).map_err(|e| e.to_string())?;
    let m = xla_hlo_parser::parse_module(&text).map_err(|e| e.to_string())?;
    let (plan, _src) = match prepare(&m) {
        Ok(p) => p,
        Err(RuntimeError::Compile { message, .. }) => return Ok(Outcome::Unsupported(message)),
        Err(e) => return Ok(Outcome::Failed(e.to_string())),
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
    let outs = match run_plan_on_cpu(&plan, &args) {
        Ok(o) => o,
        Err(e) => return Ok(Outcome::Failed(e.to_string())),
    };
    let flat: Vec<_> = outs.iter().flat_map(|v| v.leaves()).collect();
    // The generated kernels built with the host C++ compiler, when there
    // is one (skipped otherwise): within 1e-5 of XLA (host libm).
    let host = if std::env::var_os("XLA_RS_SKIP_HOST_KERNELS").is_some() {
        None
    } else {
        run_generated_on_host(&plan, &args).map_err(|e| format!("host-built kernels: {e}"))?
    };
    for (i, a) in flat.iter().enumerate() {
        let e = read_npy(&dir.join(format!("expected/out{i}.npy")))
            .map_err(|e| format!("expected {i}: {e}"))?;
        let c = compare(a, &e, rtol, atol);
        if !c.matched() {
            return Ok(Outcome::Failed(format!("output {i}: {c:?}")));
        }
        if let Some(h) = &host {
            let c = compare(&h[i], &e, rtol.max(1e-5), atol.max(1e-5));
            if !c.matched() {
                return Ok(Outcome::Failed(format!(
                    "host-built kernels, output {i}: {c:?}"
                )));
            }
        }
    }
    Ok(Outcome::Matched(plan.kernels().count()))
}

fn run_dir(root: &Path) -> (usize, usize, Vec<String>) {
    let (mut ran, mut supported, mut failures) = (0, 0, Vec::new());
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
        match run_case(&d) {
            Ok(Outcome::Matched(k)) => {
                supported += 1;
                eprintln!("{name:48} MATCH ({k} fused kernels)");
            }
            Ok(Outcome::Unsupported(m)) => eprintln!("{name:48} unsupported: {m}"),
            Ok(Outcome::Failed(m)) | Err(m) => {
                eprintln!("{name:48} FAILED: {m}");
                failures.push(format!("{name}: {m}"));
            }
        }
    }
    (ran, supported, failures)
}

#[test]
fn testdata_cases_planned_for_cuda_match_xla_on_the_cpu() {
    let (ran, supported, failures) = run_dir(&xla_test_paths::testdata_cases());
    assert!(ran > 0, "no testdata case ran");
    eprintln!("testdata: {supported} of {ran} cases supported by the CUDA planner and matched");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn shared_corpus_cases_planned_for_cuda_match_xla_on_the_cpu() {
    let Some(dir) = xla_test_paths::shared_corpus_cases() else {
        return;
    };
    let (ran, supported, failures) = run_dir(&dir);
    eprintln!(
        "shared corpus: {supported} of {ran} cases supported by the CUDA planner and matched"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
