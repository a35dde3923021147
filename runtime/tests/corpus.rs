//! XLA's own partitioned programs run on N loopback devices reproduce XLA's
//! outputs: for every case with stored arrays (../shared/corpus/cases and
//! testdata/cases), xla_partitioned.hlo is compiled for the CPU backend and
//! launched on its num_partitions devices, the global arguments split by
//! propagated.hlo's parameter shardings and the outputs assembled by its
//! root sharding, then compared with expected/ at the case's tolerances.
//! Skips with a message where a folder is absent.

use std::path::{Path, PathBuf};
use xla_hlo_evaluator::compare::compare;
use xla_hlo_evaluator::npy::{load_argument, read_npy};
use xla_hlo_evaluator::Value;
use xla_hlo_ir::HloModule;
use xla_runtime::cpu::{literals_from_values, values_from_literals};
use xla_runtime::{run_spmd, Backend, CpuBackend, LaunchPlan};

fn parse(path: &Path) -> Result<HloModule, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    xla_hlo_parser::parse_module(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn run_case(dir: &Path) -> Result<(), String> {
    let case: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("case.json")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let rtol = case["rtol"].as_f64().unwrap_or(1e-5);
    let atol = case["atol"].as_f64().unwrap_or(1e-5);
    let global = parse(&dir.join("propagated.hlo"))?;
    let local = parse(&dir.join("xla_partitioned.hlo"))?;
    let g = global.entry_computation();
    let mut args = Vec::new();
    for (i, &p) in g.parameters.iter().enumerate() {
        let instr = &g.instructions[p.index()];
        let path = dir.join(format!("args/arg{i}.npy"));
        let a = load_argument(&path, i, &instr.name, &instr.shape)
            .map_err(|e| format!("argument {i}: {e}"))?;
        args.push(Value::Array(a));
    }
    let n = local.num_partitions().max(1) as usize;
    let plan = LaunchPlan::from_global_module(&local, &global, n).map_err(|e| e.to_string())?;
    let exe = CpuBackend.compile(&local).map_err(|e| e.to_string())?;
    let args = literals_from_values(&args).map_err(|e| e.to_string())?;
    let outs = run_spmd(exe.as_ref(), &args, &plan)
        .and_then(|outs| values_from_literals(&outs))
        .map_err(|e| format!("run: {e}"))?;
    let flat: Vec<_> = outs.iter().flat_map(|v| v.leaves()).collect();
    for (i, a) in flat.iter().enumerate() {
        let e = read_npy(&dir.join(format!("expected/out{i}.npy")))
            .map_err(|e| format!("expected {i}: {e}"))?;
        let c = compare(a, &e, rtol, atol);
        if !c.matched() {
            return Err(format!("output {i}: {c:?}"));
        }
    }
    if dir.join(format!("expected/out{}.npy", flat.len())).exists() {
        return Err(format!("only {} outputs were produced", flat.len()));
    }
    Ok(())
}

fn run_dir(root: &Path) -> (usize, Vec<String>) {
    let mut ran = 0;
    let mut failures = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        eprintln!("skipping {}: not present", root.display());
        return (0, failures);
    };
    let mut dirs: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    dirs.sort();
    for d in dirs {
        if !d.join("args").is_dir() || !d.join("xla_partitioned.hlo").is_file() {
            continue;
        }
        ran += 1;
        if let Err(f) = run_case(&d) {
            failures.push(format!("{}: {f}", d.display()));
        }
    }
    (ran, failures)
}

#[test]
fn shared_corpus_partitioned_programs_match_xla_outputs() {
    let Some(dir) = xla_test_paths::shared_corpus_cases() else {
        return;
    };
    let (ran, failures) = run_dir(&dir);
    eprintln!("shared corpus: {ran} partitioned programs run on loopback devices");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn testdata_partitioned_programs_match_xla_outputs() {
    let (ran, failures) = run_dir(&xla_test_paths::testdata_cases());
    eprintln!("testdata: {ran} partitioned programs run on loopback devices");
    assert!(ran > 0, "no testdata case ran");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
