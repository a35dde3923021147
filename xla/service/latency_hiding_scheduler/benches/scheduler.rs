//! Benchmark: `scheduler_ms` of the latency-hiding scheduler (async
//! conversion, scheduling every computation, choosing priorities) on the
//! Llama 3.1 8B training step (40k lines, 1647 collectives) and on prefixes
//! of its entry computation (1/16 to all of it), printed with
//! `ms / (n log2 n)` to show the growth: roughly constant means n log n.
//! Also times every module of ../shared/xla-hlo and ../shared/xla-hlo-more
//! (instructions, async pairs, scheduler_ms, makespan over lower bound).
//!
//! Run: `cargo bench -p xla-latency-hiding-scheduler --bench scheduler`.
//! `BENCH_RUNS=N` sets the runs per size (the fastest is reported: the
//! one least disturbed by other work on a shared machine). Files that are
//! absent are skipped with a note.

use std::path::{Path, PathBuf};
use std::time::Instant;
use xla_hlo_ir::{HloInstruction, HloModule, InstrId, Opcode, Shape};
use xla_latency_hiding_scheduler::{
    schedule_module, AnalyticalCostModel, GpuSpec, ScheduleStats, SchedulerConfig,
};

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

/// The module with its entry cut to the first `k` instructions: parameters
/// renumbered, the values nothing in the prefix uses returned in a tuple.
fn prefix(module: &HloModule, k: usize) -> HloModule {
    let mut m = module.clone();
    m.config.entry_computation_layout = None;
    m.config.input_output_alias = None;
    m.config.buffer_donor = None;
    let entry = m.entry;
    let comp = m.comp_mut(entry);
    comp.instructions.truncate(k);
    let n = comp.instructions.len();
    let mut used = vec![false; n];
    let mut params = Vec::new();
    for (i, instr) in comp.instructions.iter_mut().enumerate() {
        for o in instr.operands.iter().chain(&instr.control_predecessors) {
            if let Some(u) = used.get_mut(o.index()) {
                *u = true;
            }
        }
        if instr.opcode == Opcode::Parameter {
            instr.parameter_number = Some(params.len() as i64);
            params.push(InstrId(i as u32));
        }
    }
    let outs: Vec<InstrId> = (0..n)
        .filter(|&i| !used[i])
        .map(|i| InstrId(i as u32))
        .collect();
    let shape = Shape::Tuple(outs.iter().map(|o| comp.instr(*o).shape.clone()).collect());
    let mut root = HloInstruction::new("bench.root", Opcode::Tuple, shape, outs);
    root.sharding = None;
    comp.root = comp.add(root);
    comp.parameters = params;
    m
}

/// The fastest of `runs` schedules of `module`, with the last run's stats.
fn time_ms(module: &HloModule, runs: usize) -> (f64, Option<ScheduleStats>) {
    let model = AnalyticalCostModel::new(GpuSpec::h100_sxm());
    let config = SchedulerConfig::default();
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..runs {
        let mut m = module.clone();
        let start = Instant::now();
        let r = schedule_module(&mut m, &config, &model);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        match r {
            Ok((_, stats)) => last = Some(stats),
            Err(e) => {
                eprintln!("scheduling failed: {e}");
                return (f64::NAN, None);
            }
        }
        best = best.min(ms);
    }
    (best, last)
}

fn main() {
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let llama = shared().join("xla-hlo/hlo_llama31_8b_bf16_1x8.hlo");
    match load(&llama) {
        None => eprintln!(
            "note: {} not found; skipping the scaling run",
            llama.display()
        ),
        Some(m) => {
            let total = m.entry_computation().instructions.len();
            println!("Llama 3.1 8B entry: {total} instructions; scheduler_ms (fastest of {runs})");
            println!(
                "(n = entry instructions; the module's {} other instructions are small reducers)",
                m.instruction_count() - total
            );
            println!(
                "{:>10} {:>14} {:>12} {:>16}",
                "n", "collectives", "scheduler_ms", "us/(n log2 n)"
            );
            for frac in [16, 8, 4, 2, 1] {
                let k = total / frac;
                let sub = if frac == 1 { m.clone() } else { prefix(&m, k) };
                let n = sub.entry_computation().instructions.len();
                let collectives = sub
                    .entry_computation()
                    .instructions
                    .iter()
                    .filter(|i| {
                        xla_latency_hiding_scheduler::kinds::sync_collective_kind(i).is_some()
                    })
                    .count();
                let (ms, _) = time_ms(&sub, runs);
                let nlogn = n as f64 * (n as f64).log2();
                println!(
                    "{n:>10} {collectives:>14} {ms:>12.2} {:>16.4}",
                    ms * 1e3 / nlogn
                );
            }
        }
    }
    println!();
    println!("every benchmark module (goal: scheduler_ms < 1000, makespan / bound <= 1.10)");
    println!(
        "{:<58} {:>10} {:>12} {:>12} {:>14}",
        "module", "instrs", "async pairs", "scheduler_ms", "makespan/bound"
    );
    let mut paths: Vec<PathBuf> = ["xla-hlo", "xla-hlo-more"]
        .iter()
        .filter_map(|d| std::fs::read_dir(shared().join(d)).ok())
        .flat_map(|rd| rd.flatten().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "hlo"))
        .collect();
    paths.sort();
    for p in paths {
        let Some(m) = load(&p) else { continue };
        let (ms, stats) = time_ms(&m, runs);
        let (pairs, ratio) = stats
            .map(|s| {
                (
                    s.converted,
                    s.entry.makespan / s.entry.lower_bound.max(1e-9),
                )
            })
            .unwrap_or((0, f64::NAN));
        println!(
            "{:<58} {:>10} {:>12} {:>12.2} {:>14.4}",
            p.file_stem().unwrap_or_default().to_string_lossy(),
            m.instruction_count(),
            pairs,
            ms,
            ratio
        );
    }
}
