//! Match rate against XLA: on every case of ../shared/corpus (skipped with a
//! message when absent) and testdata/cases, propagate `input.hlo` and
//! compare each instruction's sharding with XLA's `propagated.hlo`
//! (`xla_hlo_utils::compare`: by instruction name, modulo representation).
//! Asserts at least 95% matched in total, that the output verifies, that
//! the pass reports `changed` honestly, and that a second run changes
//! nothing.

use std::path::{Path, PathBuf};
use xla_hlo_ir::HloModule;
use xla_hlo_pass::Pipeline;
use xla_hlo_utils::compare::compare_module_shardings;
use xla_sharding_propagation::ShardingPropagation;

fn case_dirs() -> Vec<PathBuf> {
    let mut parents = vec![xla_test_paths::testdata_cases()];
    parents.extend(xla_test_paths::shared_corpus_cases());
    let mut dirs: Vec<PathBuf> = parents
        .iter()
        .filter_map(|p| std::fs::read_dir(p).ok())
        .flat_map(|rd| rd.flatten().map(|e| e.path()))
        .filter(|p| p.join("input.hlo").is_file() && p.join("propagated.hlo").is_file())
        .collect();
    dirs.sort();
    dirs
}

fn load(path: &Path) -> HloModule {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    xla_hlo_parser::parse_module(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn pipeline() -> Pipeline {
    Pipeline::new("test")
        .add(ShardingPropagation::default())
        .with_verifier(true)
        .with_change_check(true)
}

#[test]
fn matches_xla_on_corpus_and_testdata() {
    let dirs = case_dirs();
    assert!(!dirs.is_empty(), "no cases found");
    let (mut matched, mut total) = (0usize, 0usize);
    let mut report = String::new();
    for dir in &dirs {
        let name = format!(
            "{}/{}",
            dir.parent()
                .and_then(|p| p.parent())
                .and_then(|p| p.file_name())
                .unwrap_or_default()
                .to_string_lossy(),
            dir.file_name().unwrap_or_default().to_string_lossy()
        );
        let mut module = load(&dir.join("input.hlo"));
        let reference = load(&dir.join("propagated.hlo"));
        pipeline()
            .run(&mut module)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let comparison = compare_module_shardings(&module, &reference);
        matched += comparison.matched;
        total += comparison.total;
        report.push_str(&format!(
            "{name:<55} {:>4}/{:<4}\n",
            comparison.matched, comparison.total
        ));
        for mismatch in &comparison.mismatches {
            report.push_str(&format!(
                "    {} ({}): ours {:?}, XLA {:?}\n",
                mismatch.instruction, mismatch.opcode, mismatch.ours, mismatch.other
            ));
        }
        // Idempotent: the output is a fixed point.
        let again = pipeline()
            .run(&mut module)
            .unwrap_or_else(|e| panic!("{name} (second run): {e}"));
        assert!(!again.changed(), "{name}: a second run changed the module");
    }
    let rate = matched as f64 / total.max(1) as f64;
    println!("{report}total {matched}/{total} = {:.2}%", rate * 100.0);
    assert!(
        rate >= 0.95,
        "match rate {:.2}% below 95%\n{report}",
        rate * 100.0
    );
}
