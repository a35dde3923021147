//! Every HLO module file of the shared corpus (`shared/corpus/cases/*/`,
//! `shared/xla-hlo/`) and of the repository's `testdata/cases/*/` must parse
//! and verify with zero errors: they are real XLA modules, so any verifier
//! error is a false positive (or a parser bug). Folders that are absent are
//! skipped with a message. The instructions whose shape could not be checked
//! are counted by opcode and reason and printed (they are not errors).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn hlo_files_in(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.is_file() && p.extension().is_some_and(|e| e == "hlo") {
            out.push(p);
        }
    }
}

/// `.hlo` files directly in `dir` (when `cases` is false) or in its subfolders.
fn collect(dir: &Path, cases: bool) -> Option<Vec<PathBuf>> {
    if !dir.is_dir() {
        println!("skipping {}: not present", dir.display());
        return None;
    }
    let mut out = Vec::new();
    if cases {
        let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        subdirs.sort();
        for d in subdirs {
            hlo_files_in(&d, &mut out);
        }
    } else {
        hlo_files_in(dir, &mut out);
    }
    Some(out)
}

/// Unchecked instructions by (opcode, reason).
type UncheckedCounts = BTreeMap<(String, String), usize>;

fn check_files(files: &[PathBuf], unchecked: &mut UncheckedCounts) -> Vec<String> {
    let mut failures = Vec::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(f) else {
            failures.push(format!("{}: unreadable", f.display()));
            continue;
        };
        match xla_hlo_parser::parse_module(&text) {
            Err(e) => failures.push(format!("{}: parse error: {e}", f.display())),
            Ok(m) => {
                let report = xla_hlo_verifier::verify_report(&m);
                for u in &report.unchecked {
                    *unchecked
                        .entry((u.opcode.to_string(), u.reason.clone()))
                        .or_default() += 1;
                }
                if let Err(errs) = report.into_result() {
                    let shown: Vec<String> =
                        errs.iter().take(20).map(|e| format!("  {e}")).collect();
                    failures.push(format!(
                        "{}: {} verifier error(s):\n{}",
                        f.display(),
                        errs.len(),
                        shown.join("\n")
                    ));
                }
            }
        }
    }
    failures
}

fn run(dir: PathBuf, cases: bool) {
    let files = collect(&dir, cases).unwrap_or_default();
    assert!(!files.is_empty(), "no .hlo files under {}", dir.display());
    println!("{}: {} files", dir.display(), files.len());
    let mut unchecked = UncheckedCounts::new();
    let failures = check_files(&files, &mut unchecked);
    for ((opcode, reason), n) in &unchecked {
        println!("  unchecked: {n} x {opcode}: {reason}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} files failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn shared_corpus_cases_verify() {
    if let Some(dir) = xla_test_paths::shared_corpus_cases() {
        run(dir, true);
    }
}

#[test]
fn shared_xla_hlo_files_verify() {
    if let Some(dir) = xla_test_paths::shared_path("xla-hlo") {
        run(dir, false);
    }
}

#[test]
fn repo_testdata_cases_verify() {
    run(xla_test_paths::testdata_cases(), true);
}
