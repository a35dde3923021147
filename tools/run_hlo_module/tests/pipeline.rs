//! `run_hlo_module --pipeline`: testdata/pipeline_cases/mlp8_m8 run by the
//! GPipe, 1F1B and interleaved task tables on 4 loopback devices, and
//! transformer4_tp2_m8 as 4 stages x 2-way tensor parallelism on 8, match
//! JAX's outputs, with the per-device counts and the simulated report in
//! the JSON line; a bad pipeline request exits 1 with the reason.

use std::process::Command;

fn tool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_run_hlo_module"))
}

fn case(name: &str) -> std::path::PathBuf {
    xla_test_paths::workspace_root()
        .join("testdata/pipeline_cases")
        .join(name)
}

fn run(args: &[&str]) -> (bool, serde_json::Value) {
    run_case("mlp8_m8", args)
}

fn run_case(name: &str, args: &[&str]) -> (bool, serde_json::Value) {
    let o = tool()
        .arg("--case")
        .arg(case(name))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line = stdout.lines().last().unwrap_or("{}");
    (
        o.status.success(),
        serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")),
    )
}

#[test]
fn each_schedule_matches_jax_on_4_devices() {
    for (schedule, v) in [("gpipe", "1"), ("1f1b", "1"), ("interleaved", "2")] {
        let (ok, json) = run(&[
            "--pipeline",
            schedule,
            "--stages",
            "4",
            "--virtual-stages",
            v,
        ]);
        assert!(ok, "{schedule}: {json}");
        assert_eq!(json["all_matched"], true, "{schedule}: {json}");
        let executed = json["pipeline"]["executed"].as_array().unwrap();
        assert_eq!(executed.len(), 4);
        let tasks: u64 = executed.iter().map(|d| d["tasks"].as_u64().unwrap()).sum();
        assert_eq!(tasks, 2 * 4 * v.parse::<u64>().unwrap() * 8, "{schedule}");
        let report = &json["pipeline"]["report"];
        let uniform = report["uniform_stages_idle_fraction"].as_f64().unwrap();
        let closed = report["closed_form_idle_fraction"].as_f64().unwrap();
        assert!(
            (uniform - closed).abs() <= 0.01,
            "{schedule}: {uniform} vs {closed}"
        );
        // What the runtime kept equals what the report predicts per stage
        // (one stage per device).
        if v == "1" {
            for (d, device) in executed.iter().enumerate() {
                assert_eq!(
                    device["peak_live_bytes"], report["per_stage"][d]["peak_live_activation_bytes"],
                    "{schedule} device {d}"
                );
            }
        }
    }
}

#[test]
fn four_stages_by_two_way_tensor_parallel_match_jax_on_8_devices() {
    let (ok, json) = run_case(
        "transformer4_tp2_m8",
        &[
            "--pipeline",
            "1f1b",
            "--stages",
            "4",
            "--tensor-parallel",
            "2",
        ],
    );
    assert!(ok, "{json}");
    assert_eq!(json["all_matched"], true, "{json}");
    assert_eq!(json["devices"], 8);
    assert_eq!(json["pipeline"]["executed"].as_array().unwrap().len(), 8);
}

#[test]
fn bad_pipeline_requests_exit_1_with_the_reason() {
    let (ok, json) = run(&[
        "--pipeline",
        "interleaved",
        "--stages",
        "3",
        "--virtual-stages",
        "2",
    ]);
    assert!(!ok);
    assert!(
        json["error"]
            .as_str()
            .unwrap()
            .contains("cannot be grouped evenly"),
        "{json}"
    );
    let (ok, json) = run(&["--pipeline", "zero-bubble", "--stages", "4"]);
    assert!(!ok);
    assert!(
        json["error"].as_str().unwrap().contains("unknown schedule"),
        "{json}"
    );
    let (ok, json) = run(&["--pipeline", "1f1b", "--stages", "16"]);
    assert!(!ok);
    assert!(json["error"].as_str().unwrap().contains("only 8"), "{json}");
}
