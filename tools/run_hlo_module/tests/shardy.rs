//! The Shardy-era set (`testdata/shardy_cases`, JAX's default lowering):
//! `run_hlo_module --case DIR --partition` on the raw `before_optimizations`
//! dump imports the Shardy annotations, propagates, partitions, runs on 8
//! loopback devices and must reproduce XLA's outputs while moving no more
//! collective bytes than XLA's partitioned program. The cases that do not
//! yet are listed below with the reason; the test fails when a case outside
//! the lists fails, so the lists can only shrink.

use std::collections::BTreeMap;
use std::process::Command;

/// Cases that do not run yet, and why (none today).
const DOES_NOT_RUN: &[(&str, &str)] = &[];

/// Cases that run and match but move more bytes than XLA, and why.
const MORE_BYTES_THAN_XLA: &[(&str, &str)] = &[
    (
        "where_sharded_masks_multi_axis_2x4",
        "same shardings as XLA; inside the select our partitioner computes in the data operands' P((b,a)) layout and permutes the mask and the result, XLA reshards the operands to P((a,b)) and reuses that reshard: 184 vs 168 bytes",
    ),
];

#[test]
fn shardy_cases_partition_run_and_move_no_more_than_xla() {
    let root = xla_test_paths::workspace_root().join("testdata/shardy_cases");
    let cases = xla_test_paths::case_dirs(&root);
    assert!(
        cases.len() >= 40,
        "expected the Shardy set in {}",
        root.display()
    );
    let mut failures: BTreeMap<String, String> = BTreeMap::new();
    let mut summary = Vec::new();
    for dir in &cases {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let out = Command::new(env!("CARGO_BIN_EXE_run_hlo_module"))
            .args(["--case".as_ref(), dir.as_os_str()])
            .arg("--partition")
            .output()
            .unwrap();
        let line = String::from_utf8_lossy(&out.stdout);
        let known = DOES_NOT_RUN.iter().any(|(n, _)| *n == name);
        if !out.status.success() {
            if !known {
                failures.insert(name, String::from_utf8_lossy(&out.stderr).to_string());
            }
            continue;
        }
        if known {
            failures.insert(name.clone(), "runs now: remove it from DOES_NOT_RUN".into());
        }
        let j: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        if j["all_matched"] != true {
            failures.insert(name.clone(), format!("outputs differ: {line}"));
            continue;
        }
        let ours = j["partition"]["collective_bytes"].as_u64().unwrap();
        let case: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
        let xla = case["xla_collective_bytes"].as_u64().unwrap();
        summary.push(format!("{name}: {ours} bytes (XLA {xla})"));
        let listed = MORE_BYTES_THAN_XLA.iter().any(|(n, _)| *n == name);
        if ours > xla && !listed {
            failures.insert(name, format!("{ours} collective bytes > XLA's {xla}"));
        } else if ours <= xla && listed {
            failures.insert(
                name,
                format!("{ours} <= XLA's {xla} bytes now: remove it from MORE_BYTES_THAN_XLA"),
            );
        }
    }
    eprintln!("{}", summary.join("\n"));
    assert!(failures.is_empty(), "{failures:#?}");
}
