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

/// `device_put` to host memory and back (`annotate_device_placement`, as
/// JAX emits it for activation offloading) keeps the values' sharding:
/// partitioned, the program runs on 4 devices, gives what the global
/// program gives, and moves nothing (an opaque custom call would be
/// replicated and gathered).
#[test]
fn memory_placements_keep_shardings_and_outputs() {
    const MODULE: &str = r#"HloModule offload, num_partitions=4

ENTRY main {
  p = f32[8,4] parameter(0), sharding={devices=[4,1]<=[4]}
  q = f32[8,4] parameter(1), sharding={devices=[4,1]<=[4]}
  m = f32[8,4] multiply(p, q)
  host = f32[8,4] custom-call(m), custom_call_target="annotate_device_placement", custom_call_has_side_effect=true, frontend_attributes={_xla_buffer_placement="pinned_host"}
  back = f32[8,4] custom-call(host), custom_call_target="annotate_device_placement", custom_call_has_side_effect=true, frontend_attributes={_xla_buffer_placement="device"}
  e = f32[8,4] exponential(back)
  ROOT r = f32[8,4] add(e, p), sharding={devices=[4,1]<=[4]}
}
"#;
    let dir = std::env::temp_dir().join(format!("rhm_offload_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let module = dir.join("offload.hlo");
    std::fs::write(&module, MODULE).unwrap();
    let global = dir.join("global");
    let out = Command::new(env!("CARGO_BIN_EXE_run_hlo_module"))
        .arg(&module)
        .arg("--output")
        .arg(&global)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_run_hlo_module"))
        .arg(&module)
        .arg("--partition")
        .arg("--expected")
        .arg(&global)
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{line} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(j["all_matched"], true, "{j}");
    assert_eq!(j["devices"], 4, "{j}");
    assert_eq!(j["partition"]["collective_bytes"], 0, "{j}");
    assert_eq!(j["partition"]["fallbacks"], serde_json::json!([]), "{j}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--windowed-einsum-threshold-mib 0` windows an MLP's collectives
/// wherever legal and the outputs still match; `--windowed-
/// einsum-by-cost` leaves this small case whole (a window's permute would
/// cost more than it hides), and the JSON line says both.
#[test]
fn windowed_einsum_flags() {
    let c = case("mlp_2d_weight_dp_tp_activations_both_2x4");
    let run_with = |flag: &str| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_run_hlo_module"));
        command
            .arg(c.join("input.hlo"))
            .arg("--partition")
            .args(["--args".as_ref(), c.join("args").as_os_str()])
            .args(["--expected".as_ref(), c.join("expected").as_os_str()])
            .args(["--rtol", "1e-4", "--atol", "1e-4"])
            .arg(flag);
        if flag == "--windowed-einsum-threshold-mib" {
            command.arg("0");
        }
        let out = command.output().unwrap();
        let line = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{flag}: {line}");
        let json: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(json["all_matched"], true, "{flag}");
        json["partition"]["windowed_einsum"].clone()
    };
    let always = run_with("--windowed-einsum-threshold-mib");
    assert_eq!(always["loops"], 2, "{always}");
    // Two of the partitioned program's all-gathers and reduce-scatters
    // became one permute each in a loop body (it had two permutes).
    assert_eq!(always["collectives"]["collective-permute"], 4, "{always}");
    let by_cost = run_with("--windowed-einsum-by-cost");
    assert_eq!(by_cost["loops"], 0, "{by_cost}");
}

/// `--windowed-einsum-bidirectional` on a dot whose reduce-scatter spans
/// all 8 devices: one loop whose permutes go both ways round the ring
/// (five static permutes instead of one), and the outputs still match
/// XLA's.
#[test]
fn bidirectional_windowed_einsum_flag() {
    let c = case("dot_output_sharded_like_contracting");
    let out = Command::new(env!("CARGO_BIN_EXE_run_hlo_module"))
        .arg(c.join("input.hlo"))
        .arg("--partition")
        .args(["--args".as_ref(), c.join("args").as_os_str()])
        .args(["--expected".as_ref(), c.join("expected").as_os_str()])
        .args(["--rtol", "1e-4", "--atol", "1e-4"])
        .args(["--windowed-einsum-threshold-mib", "0"])
        .arg("--windowed-einsum-bidirectional")
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{line}");
    let json: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(json["all_matched"], true, "{json}");
    let windowed = &json["partition"]["windowed_einsum"];
    assert_eq!(windowed["loops"], 1, "{windowed}");
    assert_eq!(
        windowed["collectives"]["collective-permute"], 5,
        "{windowed}"
    );
}
