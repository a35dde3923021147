//! Benchmark: sharding propagation on the MaxText training step, the
//! largest corpus cases and the largest module of ../shared/xla-hlo, printed
//! beside XLA's own timings on this machine (11 ms for MaxText; 207 ms for a
//! 13.9k-instruction training step, i.e. 14.9 us per instruction, used as
//! the estimate for modules XLA was not timed on) and as us/instruction to
//! show the growth with module size.
//!
//! Run: `cargo bench -p xla-sharding-propagation --bench propagation`.
//! Files that are absent are skipped with a note.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use xla_hlo_ir::HloModule;
use xla_sharding_propagation::{ShardingPropagation, ShardingPropagationOptions};

const XLA_US_PER_INSTR: f64 = 207_000.0 / 13_900.0;

fn shared() -> PathBuf {
    xla_test_paths::checkout_root().join("../shared")
}

fn load(path: &Path) -> Option<HloModule> {
    let text = std::fs::read_to_string(path).ok()?;
    match xla_hlo_parser::parse_module(&text) {
        Ok(m) => Some(m),
        Err(e) => {
            eprintln!("skip {}: {e}", path.display());
            None
        }
    }
}

/// Fastest and median time of one propagation run (fresh clone each
/// time). The fastest run is reported: it is the one least disturbed by
/// other work on a shared machine.
fn time(module: &HloModule) -> (Duration, Duration, usize) {
    if std::env::var("PROP_STATS").is_ok() {
        let mut m = module.clone();
        let mut pass = ShardingPropagation::new(ShardingPropagationOptions::default());
        let _ = xla_hlo_pass::Pass::run(&mut pass, &mut m);
        eprintln!(
            "{:?} computations={}",
            pass.last_stats,
            module.computations.len()
        );
    }
    let mut samples = Vec::new();
    let budget = Instant::now();
    let fixed: Option<usize> = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok());
    while match fixed {
        Some(k) => samples.len() < k,
        None => {
            samples.len() < 5
                || (budget.elapsed() < Duration::from_millis(1500) && samples.len() < 200)
        }
    } {
        let mut m = module.clone();
        let mut pass = ShardingPropagation::new(ShardingPropagationOptions::default());
        let t = Instant::now();
        let _ = xla_hlo_pass::Pass::run(&mut pass, &mut m);
        samples.push(t.elapsed());
    }
    samples.sort();
    (samples[0], samples[samples.len() / 2], samples.len())
}

fn main() {
    let root = shared();
    let mut files: Vec<(String, PathBuf, Option<f64>)> = vec![(
        "maxtext train_step".into(),
        root.join("xla-hlo/nv_maxtext_1n1g_jit_train_step_before_optimization.hlo"),
        Some(11.0),
    )];
    for case in [
        "perf_transformer_block",
        "transformer_block_tp",
        "deep_mlp_16",
        "elementwise_math",
    ] {
        files.push((
            format!("corpus {case}"),
            root.join(format!("corpus/cases/{case}/input.hlo")),
            None,
        ));
    }
    for f in [
        "hlo_llama31_70b_bf16_16x8.hlo",
        "hlo_llama3_8b_cp_bf16_1x4.hlo",
        "hlo_llama31_8b_bf16_1x8.hlo",
    ] {
        files.push((
            f.trim_end_matches(".hlo").into(),
            root.join(format!("xla-hlo/{f}")),
            None,
        ));
    }
    println!(
        "{:<34} {:>8} {:>10} {:>12} {:>8} {:>10}",
        "module", "instrs", "ours (ms)", "XLA (ms)", "speedup", "us/instr"
    );
    println!(
        "(ours: fastest of the runs, each on a fresh copy; XLA: measured on this machine, or estimated at {XLA_US_PER_INSTR:.1} us/instr)"
    );
    let mut any = false;
    let filter = std::env::var("BENCH_FILTER").unwrap_or_default();
    for (name, path, anchor) in files {
        if !name.contains(&filter) {
            continue;
        }
        let Some(module) = load(&path) else {
            println!("{name:<34} (absent: {})", path.display());
            continue;
        };
        any = true;
        let n = module.instruction_count();
        let (t, median, runs) = time(&module);
        let ms = t.as_secs_f64() * 1e3;
        let (xla, label) = match anchor {
            Some(a) => (a, format!("{a:.1}")),
            None => {
                let e = n as f64 * XLA_US_PER_INSTR / 1e3;
                (e, format!("~{e:.1} est"))
            }
        };
        println!(
            "{name:<34} {n:>8} {ms:>10.3} {label:>12} {:>7.1}x {:>10.3}   (median {:.3} ms of {runs} runs)",
            xla / ms,
            ms * 1e3 / n as f64,
            median.as_secs_f64() * 1e3
        );
    }
    if !any {
        println!("note: ../shared not found; nothing to benchmark");
    }
}
