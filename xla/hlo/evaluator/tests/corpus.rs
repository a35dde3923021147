//! Runs every corpus case with stored arrays (../shared/corpus/cases) and
//! every project testdata case (testdata/cases): parse input.hlo, evaluate
//! with global semantics, compare with expected/ at the case's tolerances.
//! (XLA's partitioned programs run on N devices in runtime/tests/corpus.rs.)
//! Skips with a message where a folder is absent.

use std::path::{Path, PathBuf};
use xla_hlo_evaluator::compare::compare;
use xla_hlo_evaluator::npy::{load_argument, read_npy};
use xla_hlo_evaluator::{evaluate, evaluate_spmd, needs_spmd, EvalContext, Value};

/// Runs one case; returns a failure description or None.
fn run_case(dir: &Path) -> Option<String> {
    run_case_global(dir)
}

fn parse(path: &Path) -> Result<xla_hlo_ir::HloModule, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    xla_hlo_parser::parse_module(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn run_case_global(dir: &Path) -> Option<String> {
    let case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).ok()?).ok()?;
    let rtol = case["rtol"].as_f64().unwrap_or(1e-5);
    let atol = case["atol"].as_f64().unwrap_or(1e-5);
    let module = match parse(&dir.join("input.hlo")) {
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
    let outs = if needs_spmd(&module) {
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
        if let Some(f) = run_case(&d) {
            failures.push(format!("{}: {f}", d.display()));
        }
    }
    (ran, failures)
}

#[test]
fn shared_corpus_cases_match_xla() {
    let Some(dir) = xla_test_paths::shared_corpus_cases() else {
        return;
    };
    let (ran, failures) = run_dir(&dir);
    eprintln!("shared corpus: {ran} cases run");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn project_testdata_cases_match_xla() {
    let (ran, failures) = run_dir(&xla_test_paths::testdata_cases());
    eprintln!("testdata: {ran} cases run");
    assert!(ran > 0, "no testdata case ran");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
