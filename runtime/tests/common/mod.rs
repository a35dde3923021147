//! Helpers shared by the CUDA backend's corpus tests (tests/cuda_plan.rs on
//! the host, tests/cuda.rs on GPUs): a case's module, arguments and
//! tolerances; the launch of its global module; our partitioned program.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use xla_hlo_evaluator::npy::load_argument;
use xla_hlo_evaluator::{needs_spmd, Value};
use xla_hlo_ir::HloModule;
use xla_runtime::LaunchPlan;

pub struct Case {
    pub dir: PathBuf,
    pub module: HloModule,
    pub args: Vec<Value>,
    pub rtol: f64,
    pub atol: f64,
}

/// A case folder's input.hlo, arguments and tolerances (at least 1e-5: the
/// kernels use their own libm and summation order).
pub fn load_case(dir: &Path) -> Result<Case, String> {
    let case: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("case.json")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
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

/// How the global module runs: one device, or its `num_partitions` devices
/// where it needs SPMD semantics; `None` for a Shardy manual computation
/// (written in per-device shapes, it has no global run).
pub fn global_launch(module: &HloModule) -> Option<LaunchPlan> {
    if xla_pipelines::shardy_import::has_manual_computation(module) {
        return None;
    }
    let n = if needs_spmd(module) {
        module.num_partitions().max(1) as usize
    } else {
        1
    };
    Some(LaunchPlan::replicated(module, n))
}

/// Our partitioned program (the standard SPMD pipeline) for the module's
/// devices, and how to launch it on global arguments.
pub fn partitioned(module: &HloModule) -> Result<(HloModule, LaunchPlan), String> {
    let n = module.num_partitions().max(1);
    let options = xla_pipelines::PipelineOptions {
        num_partitions: Some(n),
        ..Default::default()
    };
    let mut m = module.clone();
    let out_shape = m.entry_computation().root_instr().shape.clone();
    xla_pipelines::spmd_pipeline(&options, false)
        .run(&mut m)
        .map_err(|e| format!("partitioning: {e}"))?;
    let mut plan = LaunchPlan::for_partitioned(&m, out_shape);
    plan.num_partitions = n as usize;
    Ok((m, plan))
}

/// Case folders with stored arrays under `root`, sorted (none, with a
/// message, when `root` is absent).
pub fn case_dirs(root: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(root) else {
        eprintln!("skipping {}: not present", root.display());
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|d| d.join("args").is_dir() && d.join("input.hlo").is_file())
        .collect();
    dirs.sort();
    dirs
}

/// Compares a run's outputs with the case's expected/ arrays.
pub fn compare_outputs(case: &Case, outs: &[Value]) -> Result<(), String> {
    let flat: Vec<_> = outs.iter().flat_map(|v| v.leaves()).collect();
    for (i, a) in flat.iter().enumerate() {
        let e = xla_hlo_evaluator::npy::read_npy(&case.dir.join(format!("expected/out{i}.npy")))
            .map_err(|e| format!("expected {i}: {e}"))?;
        let c = xla_hlo_evaluator::compare::compare(a, &e, case.rtol, case.atol);
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
    Ok(())
}
