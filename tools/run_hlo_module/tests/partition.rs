//! `run_hlo_module --partition`: propagation, SPMD partitioning and an
//! 8-device run of testdata cases, compared with their expected outputs;
//! the JSON line reports the partitioned module's collective bytes, which
//! must not exceed XLA's for the case.

use std::path::PathBuf;
use std::process::Command;

fn case(name: &str) -> PathBuf {
    xla_test_paths::testdata_case(name)
}

fn run(name: &str) -> serde_json::Value {
    let c = case(name);
    let out = Command::new(env!("CARGO_BIN_EXE_run_hlo_module"))
        .arg(c.join("input.hlo"))
        .arg("--partition")
        .args(["--devices", "8"])
        .args(["--args".as_ref(), c.join("args").as_os_str()])
        .args(["--expected".as_ref(), c.join("expected").as_os_str()])
        .args(["--rtol", "1e-4", "--atol", "1e-4"])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{line} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(line.trim()).unwrap()
}

fn xla_bytes(name: &str) -> u64 {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(case(name).join("case.json")).unwrap())
            .unwrap();
    j["xla_collective_bytes"].as_u64().unwrap()
}

#[test]
fn partitioned_runs_match_and_communicate_no_more_than_xla() {
    for name in [
        "dp_mlp_3layer",
        "dot_reduce_scatter_2x4",
        "uneven_sharding_slices",
    ] {
        let j = run(name);
        assert_eq!(j["all_matched"], true, "{name}: {j}");
        assert_eq!(j["devices"], 8);
        let ours = j["partition"]["collective_bytes"].as_u64().unwrap();
        assert!(
            ours <= xla_bytes(name),
            "{name}: {ours} > {}",
            xla_bytes(name)
        );
    }
}

/// The README's main command: `--case DIR --partition --schedule` runs the
/// bundled transformer block end to end (propagate, partition, schedule,
/// 8 devices), matches XLA's outputs, and reports bytes beside XLA's and
/// the schedule against its lower bound.
#[test]
fn readme_main_command_runs_end_to_end() {
    let out = Command::new(env!("CARGO_BIN_EXE_run_hlo_module"))
        .args([
            "--case".as_ref(),
            case("transformer_block_2x4_causal").as_os_str(),
        ])
        .args(["--partition", "--schedule"])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{line} {report}");
    let j: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(j["all_matched"], true);
    assert_eq!(j["devices"], 8);
    let p = &j["partition"];
    assert!(p["collective_bytes"].as_u64().unwrap() <= p["xla_collective_bytes"].as_u64().unwrap());
    let s = &p["schedule"];
    assert!(s["makespan_us"].as_f64().unwrap() <= 1.10 * s["lower_bound_us"].as_f64().unwrap());
    assert!(report.contains("outputs match XLA's"), "{report}");
    assert!(report.contains("XLA's partitioner"), "{report}");
}
