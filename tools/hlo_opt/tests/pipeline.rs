//! `hlo-opt --passes=pipeline`: the stage programs of
//! testdata/pipeline_cases/mlp8_m8 (prologue, 2 x 4 tasks, epilogue) print
//! as modules our parser reads back; `--pipeline-report` gives the
//! per-stage report; a wrong microbatch count or a misplaced pass is an
//! error with exit 1.

use std::process::Command;

fn tool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hlo-opt"))
}

fn input() -> std::path::PathBuf {
    xla_test_paths::workspace_root().join("testdata/pipeline_cases/mlp8_m8/input.hlo")
}

#[test]
fn stage_programs_print_and_parse() {
    let o = tool()
        .arg(input())
        .args([
            "--passes=pipeline",
            "--stages",
            "4",
            "--microbatches",
            "8",
            "--schedule",
            "1f1b",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8(o.stdout).unwrap();
    let modules: Vec<&str> = text.split("\nHloModule ").collect();
    assert_eq!(modules.len(), 10, "prologue, 8 tasks, epilogue");
    for (i, m) in modules.iter().enumerate() {
        let m = if i == 0 {
            m.to_string()
        } else {
            format!("HloModule {m}")
        };
        xla_hlo_parser::parse_module(&m).unwrap_or_else(|e| panic!("module {i}: {e}"));
    }
}

#[test]
fn report_has_every_stage_and_the_bubble() {
    let o = tool()
        .arg(input())
        .args([
            "--passes=pipeline",
            "--stages",
            "4",
            "--schedule",
            "gpipe",
            "--pipeline-report",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(json["per_stage"].as_array().unwrap().len(), 4);
    for stage in json["per_stage"].as_array().unwrap() {
        assert_eq!(
            stage["peak_live_microbatches"], 8,
            "GPipe keeps every microbatch"
        );
    }
    let idle = json["idle_fraction"].as_f64().unwrap();
    assert!(idle > 0.0 && idle < 1.0, "{json}");
}

#[test]
fn wrong_microbatches_and_misplaced_pass_are_errors() {
    let o = tool()
        .arg(input())
        .args(["--passes=pipeline", "--microbatches", "6"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("runs 8 iterations"));
    let o = tool()
        .arg(input())
        .args(["--passes=pipeline,sharding-propagation"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("must be the last pass"));
}
