//! Round-trip test over every real HLO file we have: ../shared/corpus,
//! ../shared/xla-hlo and testdata/cases. parse -> print -> parse must give an
//! equal module, and printing twice must give identical text.

use std::path::PathBuf;

/// All .hlo files under the shared folder and the project's testdata.
pub fn hlo_files() -> Vec<PathBuf> {
    let mut dirs = vec![xla_test_paths::testdata_cases()];
    if let Some(shared) = xla_test_paths::shared() {
        dirs.push(shared.join("corpus"));
        dirs.push(shared.join("xla-hlo"));
    }
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "hlo") {
                files.push(p);
            }
        }
    }
    files.sort();
    assert!(!files.is_empty(), "no .hlo files found");
    files
}

#[test]
fn every_hlo_file_round_trips() {
    let files = hlo_files();
    let mut failures = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let m1 = match xla_hlo_parser::parse_module(&text) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{}:{e}", path.display()));
                continue;
            }
        };
        let printed = m1.to_text();
        let m2 = match xla_hlo_parser::parse_module(&printed) {
            Ok(m) => m,
            Err(e) => {
                failures.push(format!("{} (reparse of printed text):{e}", path.display()));
                continue;
            }
        };
        if m1 != m2 {
            failures.push(format!("{}: parse(print(m)) != m", path.display()));
        }
        if m2.to_text() != printed {
            failures.push(format!("{}: printing twice differs", path.display()));
        }
    }
    println!("round-tripped {} files", files.len());
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
