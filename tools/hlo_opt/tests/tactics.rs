//! `hlo-opt --tactics SCHEDULE.json [--report]` on
//! testdata/tactics_cases/mlp2_train: the per-tactic report (collectives
//! and bytes after each tactic), the partitioned module otherwise, and a
//! bad schedule exits 1 naming the tactic; `--auto-shard` prints a plan
//! whose schedule re-runs to the same figures.

use std::process::Command;

fn tool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hlo-opt"))
}

fn input() -> std::path::PathBuf {
    xla_test_paths::workspace_root().join("testdata/tactics_cases/mlp2_train/input.hlo")
}

fn schedule_file(name: &str, text: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!(
        "hlo-opt-tactics-{}-{name}.json",
        std::process::id()
    ));
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn report_and_partitioned_module() {
    let schedule = schedule_file(
        "ok",
        r#"{"mesh": {"x": 2, "y": 4}, "tactics": [
            {"name": "batch", "recipe": "batch", "axis": "x", "values": ["x", "y"]},
            {"name": "megatron", "recipe": "megatron", "axis": "y", "column": ["w1"], "row": ["w2"]}]}"#,
    );
    let o = tool()
        .arg(input())
        .arg("--tactics")
        .arg(&schedule)
        .arg("--report")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let bytes: Vec<u64> = json["tactics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["collective_bytes"].as_u64().unwrap())
        .collect();
    assert_eq!(bytes, vec![4100, 1540]);
    let o = tool()
        .arg(input())
        .arg("--tactics")
        .arg(&schedule)
        .output()
        .unwrap();
    assert!(o.status.success());
    let text = String::from_utf8(o.stdout).unwrap();
    let partitioned = xla_hlo_parser::parse_module(&text).expect("the partitioned module parses");
    assert_eq!(partitioned.num_partitions(), 8);
}

#[test]
fn bad_schedule_exits_1_naming_the_tactic() {
    let schedule = schedule_file(
        "bad",
        r#"{"mesh": {"x": 2}, "tactics": [{"name": "dp", "recipe": "batch", "axis": "x", "values": ["inputs*"]}]}"#,
    );
    let o = tool()
        .arg(input())
        .arg("--tactics")
        .arg(&schedule)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("tactic 0 (dp)") && stderr.contains("matches no entry parameter"),
        "{stderr}"
    );
}

#[test]
fn auto_shard_prints_a_schedule_that_reruns_to_the_same_plan() {
    let o = tool()
        .arg(input())
        .args(["--auto-shard", "--mesh", "y=4", "--memory-limit", "8000"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(plan["peak_memory_bytes"].as_u64().unwrap() <= 8000);
    assert!(plan["criterion"]
        .as_str()
        .unwrap()
        .starts_with("exhaustive"));
    let schedule = schedule_file("auto", &plan["schedule"].to_string());
    let o = tool()
        .arg(input())
        .arg("--tactics")
        .arg(&schedule)
        .arg("--report")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let last = report["tactics"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["collective_bytes"], plan["collective_bytes"]);
    assert_eq!(last["peak_memory_bytes"], plan["peak_memory_bytes"]);
    // Nothing fits 100 bytes per device: exit 1 with the reason.
    let o = tool()
        .arg(input())
        .args(["--auto-shard", "--mesh", "y=4", "--memory-limit", "100"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("fits 100 bytes"));
}
