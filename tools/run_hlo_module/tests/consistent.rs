//! Consistent mode end to end: `run_hlo_module --partition --consistent
//! --compare-single-device` gives outputs bitwise equal to the unpartitioned
//! module's single-device run in consistent mode, the same bits run after
//! run, with a report of what consistency cost; the default mode, whose
//! split reductions combine in another order, is told apart (exit 1).
//!
//! `RUN_HLO_MODULE_SWEEP=all` runs every testdata case (and the shared
//! corpus when it is beside the checkout) instead of the sample; Shardy
//! shard_map programs, written in per-device shapes, have no single-device
//! run and are counted apart.

use std::path::{Path, PathBuf};
use std::process::Command;

fn tool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_run_hlo_module"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("run_hlo_module-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `case` partitioned and compared with its single-device run; returns
/// the exit status, the JSON line and the output files' bytes.
fn run(case: &Path, out: &Path, consistent: bool) -> (bool, serde_json::Value, Vec<Vec<u8>>) {
    let mut cmd = tool();
    cmd.arg("--case")
        .arg(case)
        .args(["--partition", "--compare-single-device", "--output"])
        .arg(out);
    if consistent {
        cmd.arg("--consistent");
    }
    let o = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let line = stdout.lines().last().unwrap_or("{}");
    let json = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let mut files = Vec::new();
    for i in 0.. {
        match std::fs::read(out.join(format!("out{i}.npy"))) {
            Ok(b) => files.push(b),
            Err(_) => break,
        }
    }
    (o.status.success(), json, files)
}

#[test]
fn consistent_runs_are_bitwise_single_device_and_repeat() {
    let sweep_all = std::env::var("RUN_HLO_MODULE_SWEEP").as_deref() == Ok("all");
    let cases: Vec<PathBuf> = if sweep_all {
        let mut all = xla_test_paths::case_dirs(&xla_test_paths::testdata_cases());
        all.extend(xla_test_paths::case_dirs(
            &xla_test_paths::testdata_cases().with_file_name("shardy_cases"),
        ));
        if let Some(corpus) = xla_test_paths::shared_corpus_cases() {
            all.extend(xla_test_paths::case_dirs(&corpus));
        }
        all
    } else {
        [
            "megatron_mlp_bf16_mesh3d",
            "dot_reduce_scatter_2x4",
            "clip_global_norm_2x4",
            "conv_kernel_grad_batch_spatial_2x4",
            "batchnorm_train_grad_input_4x2",
            "moe_top2_capacity_grad_2x4",
            "embedding_grad_scatter_vocab_sharded",
            "var_mean_multi_axes_mesh3d",
        ]
        .iter()
        .map(|c| xla_test_paths::testdata_case(c))
        .collect()
    };
    let dir = scratch("consistent");
    let (mut failures, mut no_global_run, mut extra) = (Vec::new(), 0, 0i64);
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        let (ok, json, first) = run(case, &dir.join(format!("{name}-1")), true);
        if json["error"]
            .as_str()
            .is_some_and(|e| e.contains("no single-device run"))
        {
            no_global_run += 1;
            continue;
        }
        if !ok || json["single_device"]["identical"] != true {
            failures.push(format!("{name}: {json}"));
            continue;
        }
        let cost = &json["partition"]["consistency"];
        let (bytes, default) = (
            cost["collective_bytes"].as_i64().unwrap(),
            cost["default_collective_bytes"].as_i64().unwrap(),
        );
        assert_eq!(
            cost["extra_bytes"].as_i64(),
            Some(bytes - default),
            "{name}"
        );
        extra += bytes - default;
        // The cost report, one line per case.
        eprintln!(
            "{name}: {bytes} bytes vs {default} ({:+}), simulated {:.2} vs {:.2} us, relaid out: {}",
            bytes - default,
            cost["simulated_us"].as_f64().unwrap_or(0.0),
            cost["default_simulated_us"].as_f64().unwrap_or(0.0),
            cost["relayouts"]
        );
        let (_, _, second) = run(case, &dir.join(format!("{name}-2")), true);
        if first != second || first.is_empty() {
            failures.push(format!("{name}: a second run gave other bits"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "{} cases, {} failures, {no_global_run} without a single-device run, {extra} extra bytes in all",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_default_mode_is_told_apart() {
    // Its tensor-parallel f32 dot combines partial sums in another order
    // than the single-device GEMM, so the bits differ and the run fails.
    // (A bf16 one no longer tells them apart: its partial products are
    // summed in f32 and rounded once, as XLA's CPU compiler does.)
    let case = xla_test_paths::testdata_case("tp_mlp_erf_gelu");
    let dir = scratch("consistent-default");
    let (ok, json, _) = run(&case, &dir, false);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok, "{json}");
    assert_eq!(json["single_device"]["identical"], false, "{json}");
}
