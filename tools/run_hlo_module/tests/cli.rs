//! End-to-end tests of the run_hlo_module binary: a stored corpus case via
//! --args/--expected, error messages, and (release builds only) the large
//! perf_transformer_block case regenerated from its case.json and checked
//! against its expected_summary.

use std::path::PathBuf;
use std::process::Command;

/// ../shared/corpus/cases, or a note and `None` where it is absent.
fn corpus() -> Option<PathBuf> {
    xla_test_paths::shared_corpus_cases()
}

fn tool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_run_hlo_module"))
}

#[test]
fn stored_case_matches_and_prints_json() {
    let Some(corpus) = corpus() else {
        return;
    };
    let c = corpus.join("megatron_mlp");
    let out = tool()
        .arg(c.join("input.hlo"))
        .args(["--args".as_ref(), c.join("args").as_os_str()])
        .args(["--expected".as_ref(), c.join("expected").as_os_str()])
        .args(["--rtol", "1e-4", "--atol", "1e-5"])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{line} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(j["all_matched"], true);
    assert!(j["outputs"][0]["max_abs_err"].as_f64().is_some());
    assert!(j["wall_s"].as_f64().is_some());
}

#[test]
fn mismatch_and_missing_files_fail_clearly() {
    let Some(corpus) = corpus() else {
        return;
    };
    let c = corpus.join("megatron_mlp");
    // Expected outputs of another case: shapes differ -> exit 1.
    let out = tool()
        .arg(c.join("input.hlo"))
        .args(["--args".as_ref(), c.join("args").as_os_str()])
        .args([
            "--expected".as_ref(),
            corpus.join("fsdp_mlp/expected").as_os_str(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let out = tool()
        .arg(c.join("input.hlo"))
        .args(["--args", "/nonexistent"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("arg0.npy") && err.contains("parameter 0"),
        "{err}"
    );
}

#[test]
fn perf_transformer_block_matches_summary() {
    if cfg!(debug_assertions) {
        eprintln!("skipping perf_transformer_block: run `cargo test --release` for it");
        return;
    }
    let Some(corpus) = corpus() else {
        return;
    };
    let c = corpus.join("perf_transformer_block");
    let out = tool()
        .arg(c.join("input.hlo"))
        .args(["--case-json".as_ref(), c.join("case.json").as_os_str()])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{line}");
    let j: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(j["all_matched"], true, "{line}");
}

/// Differential tests against XLA (jaxlib CPU) for each opcode family; skipped
/// with a message when python3 or jax is unavailable.
#[test]
fn differential_against_xla() {
    let have_jax = Command::new("python3")
        .args(["-c", "import jax, numpy, ml_dtypes"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !have_jax {
        eprintln!("skipping XLA differential tests: python3 with jax is not installed");
        return;
    }
    let script = xla_test_paths::checkout_root().join("tools/run_hlo_module/xla_diff.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_run_hlo_module"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// XLA's partitioned program of a testdata case (uneven shards) on 8
/// loopback devices through the runtime's launcher, shardings and global
/// shapes from propagated.hlo, reproduces XLA's outputs; a mismatched
/// global module is a clear error.
#[test]
fn partitioned_program_runs_on_devices_with_shardings_from() {
    let c = xla_test_paths::testdata_case("uneven_sharding_slices");
    let out = tool()
        .arg(c.join("xla_partitioned.hlo"))
        .args(["--devices", "8"])
        .args([
            "--shardings-from".as_ref(),
            c.join("propagated.hlo").as_os_str(),
        ])
        .args(["--args".as_ref(), c.join("args").as_os_str()])
        .args(["--expected".as_ref(), c.join("expected").as_os_str()])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{line} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(j["all_matched"], true);
    assert_eq!(j["devices"], 8);

    let other =
        xla_test_paths::testdata_case("transformer_block_2x4_causal").join("propagated.hlo");
    let out = tool()
        .arg(c.join("xla_partitioned.hlo"))
        .args(["--devices", "8"])
        .args(["--shardings-from".as_ref(), other.as_os_str()])
        .args(["--args".as_ref(), c.join("args").as_os_str()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error:"), "{err}");
}

/// `--backend cuda` in a build without the `cuda` feature (CI's) says what
/// is missing and exits 1; an unknown backend is named.
#[test]
fn backends_that_cannot_run_are_named() {
    let c = xla_test_paths::testdata_case("dp_mlp_3layer");
    for (backend, needle) in [
        (
            "cuda",
            if cfg!(feature = "cuda") {
                "cuda"
            } else {
                "--features cuda"
            },
        ),
        ("tpu", "unknown backend \"tpu\""),
    ] {
        let out = tool()
            .args(["--case".as_ref(), c.as_os_str()])
            .args(["--partition", "--backend", backend])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if backend == "cuda" && out.status.success() {
            continue; // a CUDA build on a GPU machine
        }
        assert_eq!(out.status.code(), Some(1), "{backend}: {err}");
        assert!(err.contains(needle), "{backend}: {err}");
    }
}

/// Scheduled partitioned programs (the latency-hiding scheduler's async
/// start/done pairs) on the CUDA backend's plans with host-built kernels:
/// the starts run as host steps, the dones wait, and the outputs match XLA's.
#[test]
fn scheduled_async_collectives_on_cuda_host_match_xla() {
    for case in [
        "adam_step_mesh3d",
        "dot_reduce_scatter_2x4",
        "fori_loop_accumulating_tp_dot",
    ] {
        let dir = xla_test_paths::testdata_case(case);
        let out = tool()
            .arg("--case")
            .arg(&dir)
            .args(["--partition", "--schedule", "--backend", "cuda-host"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("\"all_matched\":true"),
            "{case}: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
