//! End-to-end tests of `hlo-opt --passes=latency-hiding-scheduler` and its
//! flags: the scheduled module prints with is_scheduled=true and reads
//! back; `--schedule-report` is one JSON object with the documented keys;
//! `--trace` writes a Chrome trace; `--cost-model` and `--memory-limit`
//! are honoured and bad values are clear errors.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

fn hlo_opt() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hlo-opt"))
}

fn module() -> PathBuf {
    xla_test_paths::testdata_case("train_step_dp_momentum").join("xla_partitioned.hlo")
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("hlo_opt_sched_{tag}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn report(extra: &[&str]) -> Value {
    let out = hlo_opt()
        .arg(module())
        .arg("--passes=latency-hiding-scheduler")
        .arg("--schedule-report")
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn scheduled_module_prints_and_reads_back() {
    let out = hlo_opt()
        .arg(module())
        .arg("--passes=latency-hiding-scheduler")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with("HloModule jit_train_step_dp_momentum, is_scheduled=true"));
    assert!(text.contains("all-reduce-start("));
    assert!(text.contains("all-reduce-done("));
    let m = xla_hlo_parser::parse_module(&text).unwrap();
    xla_hlo_verifier::verify(&m).unwrap();
    assert!(m.config.is_scheduled);
}

#[test]
fn schedule_report_has_the_figures() {
    let v = report(&[]);
    for key in [
        "makespan_us",
        "lower_bound_us",
        "sequential_makespan_us",
        "exposed_comm_us",
        "peak_memory_bytes",
        "scheduler_ms",
    ] {
        assert!(v[key].is_number(), "{key} missing in {v}");
    }
    let f = |k: &str| v[k].as_f64().unwrap();
    assert!(f("makespan_us") >= f("lower_bound_us"));
    assert!(f("makespan_us") < f("sequential_makespan_us"));
    assert!(f("makespan_us") <= 1.10 * f("lower_bound_us"), "{v}");
    assert!(v["cost_model"].as_str().unwrap().starts_with("analytical"));
    // Other models.
    let a = report(&["--cost-model", "approximate"]);
    assert_eq!(a["cost_model"], "approximate");
    let h = report(&["--cost-model=analytical:h200"]);
    assert!(h["cost_model"].as_str().unwrap().contains("H200"));
}

#[test]
fn table_cost_model_overrides() {
    let dir = temp_dir("table");
    let table = dir.join("costs.txt");
    std::fs::write(&table, "# measured\nall-reduce.4 1000\n").unwrap();
    let spec = format!("--cost-model=table:{}", table.display());
    let v = report(&[&spec]);
    assert!(
        v["comm_busy_us"]["all-reduce"].as_f64().unwrap() > 1000.0,
        "{v}"
    );
    std::fs::write(&table, "all-reduce.4 fast\n").unwrap();
    let out = hlo_opt()
        .arg(module())
        .arg("--passes=latency-hiding-scheduler")
        .arg(&spec)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("costs.txt:1") && err.contains("not a number"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn trace_is_chrome_json() {
    let dir = temp_dir("trace");
    let trace = dir.join("t.json");
    let v = report(&["--trace", trace.to_str().unwrap()]);
    assert!(v["makespan_us"].is_number());
    let t: Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    let events = t["traceEvents"].as_array().unwrap();
    assert!(events
        .iter()
        .any(|e| e["ph"] == "X" && e["cat"] == "all-reduce"));
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["args"]["name"] == "compute stream"));
    assert!(events
        .iter()
        .any(|e| e["ph"] == "C" && e["name"] == "live bytes"));
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == 0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn overlap_limits_are_configurable() {
    let v = report(&[
        "--overlap-limit",
        "all-reduce=2",
        "--overlap-limit=all-gather=3",
    ]);
    let one = report(&[]);
    assert!(v["makespan_us"].as_f64().unwrap() <= one["makespan_us"].as_f64().unwrap() + 1e-6);
    for bad in ["all-reduce", "all-reduce=0", "warp-drive=2"] {
        let out = hlo_opt()
            .arg(module())
            .arg(format!("--overlap-limit={bad}"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
    }
}

#[test]
fn memory_limit_is_honoured_or_refused() {
    let free = report(&[]);
    let peak = free["peak_memory_bytes"].as_u64().unwrap();
    let v = report(&["--memory-limit", &peak.to_string()]);
    assert!(v["peak_memory_bytes"].as_u64().unwrap() <= peak);
    assert_eq!(v["memory_limit_bytes"].as_u64(), Some(peak));
    let out = hlo_opt()
        .arg(module())
        .arg("--passes=latency-hiding-scheduler")
        .arg("--memory-limit=1KiB")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("memory limit of 1024 bytes cannot be met")
    );
    let bad = hlo_opt()
        .arg(module())
        .arg("--memory-limit=lots")
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    let model = hlo_opt()
        .arg(module())
        .arg("--passes=latency-hiding-scheduler")
        .arg("--cost-model=quantum")
        .output()
        .unwrap();
    assert_eq!(model.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&model.stderr).contains("unknown cost model 'quantum'"));
}

/// `--exact-time-limit` adds the exact scheduler's verdict: every
/// computation with its schedule, best order and proven bound; a small
/// computation is settled (optimal, best = bound); the scheduler's
/// makespan is never above the list schedule's. A bad value is refused.
#[test]
fn exact_time_limit_reports_gaps() {
    let list = report(&[]);
    let exact = report(&["--exact-time-limit", "0.5"]);
    assert!(list.get("exact").is_none());
    let verdict = &exact["exact"];
    let computations = verdict["by_computation"].as_array().unwrap();
    assert_eq!(
        computations.len() as u64,
        verdict["computations"].as_u64().unwrap()
    );
    assert!(!computations.is_empty());
    for c in computations {
        let (schedule, best, bound) = (
            c["schedule_us"].as_f64().unwrap(),
            c["best_us"].as_f64().unwrap(),
            c["bound_us"].as_f64().unwrap(),
        );
        assert!(bound <= best + 1e-6 && best <= schedule + 1e-6, "{c}");
        if c["optimal"] == true {
            assert!((best - bound).abs() < 1e-6, "{c}");
        }
    }
    assert!(exact["makespan_us"].as_f64().unwrap() <= list["makespan_us"].as_f64().unwrap() + 1e-6);
    let out = hlo_opt()
        .arg(module())
        .arg("--passes=latency-hiding-scheduler")
        .arg("--exact-time-limit=-1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected seconds"));
}
