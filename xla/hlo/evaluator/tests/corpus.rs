//! Runs every corpus case with stored arrays (../shared/corpus/cases) and
//! every project testdata case (testdata/cases): parse input.hlo, evaluate
//! with global semantics, compare with expected/ at the case's tolerances.
//! Skips with a message where a folder is absent.

use std::path::{Path, PathBuf};
use xla_hlo_evaluator::compare::compare;
use xla_hlo_evaluator::npy::{load_argument, read_npy};
use xla_hlo_evaluator::{
    evaluate, evaluate_partitioned, evaluate_spmd, needs_spmd, EvalContext, Value,
};

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs one case; returns a failure description or None.
fn run_case(dir: &Path) -> Option<String> {
    run_case_mode(dir, false)
}

/// Runs XLA's partitioned program of a case on loopback devices with the
/// global arguments sharded by its parameter shardings; outputs are
/// reassembled with propagated.hlo's root shardings.
fn run_partitioned_case(dir: &Path) -> Option<String> {
    run_case_mode(dir, true)
}

fn parse(path: &Path) -> Result<xla_hlo_ir::HloModule, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    xla_hlo_parser::parse_module(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn run_case_mode(dir: &Path, partitioned: bool) -> Option<String> {
    let case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).ok()?).ok()?;
    let rtol = case["rtol"].as_f64().unwrap_or(1e-5);
    let atol = case["atol"].as_f64().unwrap_or(1e-5);
    let global = if partitioned {
        "propagated.hlo"
    } else {
        "input.hlo"
    };
    let module = match parse(&dir.join(global)) {
        Ok(m) => m,
        Err(e) => return Some(e),
    };
    let entry = module.entry_computation();
    let mut args = Vec::new();
    for (i, &p) in entry.parameters.iter().enumerate() {
        let instr = &entry.instructions[p.index()];
        match load_argument(
            &dir.join(format!("args/arg{i}.npy")),
            i,
            &instr.name,
            &instr.shape,
        ) {
            Ok(a) => args.push(Value::Array(a)),
            Err(e) => return Some(format!("argument {i}: {e}")),
        }
    }
    let outs = if partitioned {
        let local = match parse(&dir.join("xla_partitioned.hlo")) {
            Ok(m) => m,
            Err(e) => return Some(e),
        };
        let root = entry.root_instr();
        let dims: Vec<Vec<i64>> = root
            .shape
            .leaves()
            .iter()
            .map(|s| s.dims().to_vec())
            .collect();
        let shardings: Vec<_> = match &root.sharding {
            Some(s) if s.leaves().len() == dims.len() => s.leaves().to_vec(),
            Some(s) if s.leaves().len() == 1 => vec![s.leaves()[0].clone(); dims.len()],
            _ => return Some("propagated root has no sharding".into()),
        };
        evaluate_partitioned(&local, &args, &shardings, &dims)
            .map(|v| v.into_iter().map(Value::Array).collect())
    } else if needs_spmd(&module) {
        evaluate_spmd(&module, &args, module.num_partitions()).map(|mut v| v.remove(0))
    } else {
        evaluate(&module, &args, &EvalContext::default())
    };
    let outs = match outs {
        Ok(o) => o,
        Err(e) => return Some(format!("evaluate: {e}")),
    };
    let flat: Vec<_> = outs.iter().flat_map(|v| v.leaves()).collect();
    for (i, a) in flat.iter().enumerate() {
        let e = match read_npy(&dir.join(format!("expected/out{i}.npy"))) {
            Ok(e) => e,
            Err(e) => return Some(format!("expected {i}: {e}")),
        };
        let c = compare(a, &e, rtol, atol);
        if !c.matched() {
            return Some(format!("output {i}: {c:?}"));
        }
    }
    None
}

fn run_dir(root: &Path) -> (usize, Vec<String>) {
    run_dir_with(root, run_case)
}

fn run_dir_with(root: &Path, run: fn(&Path) -> Option<String>) -> (usize, Vec<String>) {
    let mut ran = 0;
    let mut failures = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        eprintln!("skipping {}: not present", root.display());
        return (0, failures);
    };
    let mut dirs: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    dirs.sort();
    for d in dirs {
        if !d.join("args").is_dir() || !d.join("expected").is_dir() {
            continue;
        }
        ran += 1;
        if let Some(f) = run(&d) {
            failures.push(format!("{}: {f}", d.display()));
        }
    }
    (ran, failures)
}

#[test]
fn shared_corpus_cases_match_xla() {
    let (ran, failures) = run_dir(&manifest().join("../../../../shared/corpus/cases"));
    eprintln!("shared corpus: {ran} cases run");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn project_testdata_cases_match_xla() {
    let (ran, failures) = run_dir(&manifest().join("../../../testdata/cases"));
    eprintln!("testdata: {ran} cases run");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn xla_partitioned_programs_on_loopback_devices_match_global_results() {
    for root in [
        manifest().join("../../../../shared/corpus/cases"),
        manifest().join("../../../testdata/cases"),
    ] {
        let (ran, failures) = run_dir_with(&root, run_partitioned_case);
        eprintln!("{}: {ran} partitioned programs run", root.display());
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
