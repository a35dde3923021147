//! Pipeline parallelism end to end: testdata/pipeline_cases/mlp8_m8 (an
//! 8-layer MLP train step written with JAX, gradients accumulated over 8
//! microbatches by a scan, layer k under `named_scope("stage_k")`) is split
//! into stage programs, run on 4 loopback devices by the GPipe, 1F1B and
//! interleaved (v = 2) task tables, and must give JAX's loss and gradients.
//! Counted from what each device executed: every task once, sends and
//! receives, live activations; and the simulated bubble against the
//! closed forms. PP x TP: testdata/pipeline_cases/transformer4_tp2_m8 (a
//! 4-layer transformer, tensor-parallel over 2 devices, JAX's Shardy
//! lowering) as 4 stages x 2-way TP on 8 devices. Stages without scopes:
//! testdata/pipeline_cases/stacked8_m8 (the MLP as a scan over stacked
//! weights) with its layer scans cut into stages.

use std::path::PathBuf;
use std::time::Duration;
use xla_hlo_evaluator::compare::compare;
use xla_hlo_evaluator::npy::{load_argument, read_npy};
use xla_hlo_evaluator::Value;
use xla_mpmd::{
    simulate_uniform, split_pipeline, task_table, PipelineOptions, PipelineProgram, ScheduleKind,
    TaskKey,
};
use xla_runtime::cpu::{literals_from_values, values_from_literals};
use xla_runtime::pipeline::{run_pipeline, PipelineRun};
use xla_runtime::{CpuBackend, Literal};

const MLP: &str = "mlp8_m8";
const TRANSFORMER_TP: &str = "transformer4_tp2_m8";
const STACKED: &str = "stacked8_m8";

fn case_dir(name: &str) -> PathBuf {
    xla_test_paths::workspace_root()
        .join("testdata/pipeline_cases")
        .join(name)
}

fn load_case(name: &str) -> (xla_hlo_ir::HloModule, Vec<Literal>, serde_json::Value) {
    let dir = case_dir(name);
    let text = std::fs::read_to_string(dir.join("input.hlo")).expect("input.hlo");
    let module = xla_hlo_parser::parse_module(&text).expect("parses");
    let case: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("case.json")).unwrap()).unwrap();
    let entry = module.entry_computation();
    let args: Vec<Value> = entry
        .parameters
        .iter()
        .enumerate()
        .map(|(i, &p)| {
            let instr = entry.instr(p);
            Value::Array(
                load_argument(
                    &dir.join(format!("args/arg{i}.npy")),
                    i,
                    &instr.name,
                    &instr.shape,
                )
                .expect("argument"),
            )
        })
        .collect();
    (module, literals_from_values(&args).unwrap(), case)
}

fn run(program: &PipelineProgram, kind: ScheduleKind, args: &[Literal]) -> PipelineRun {
    let table = task_table(
        kind,
        program.num_devices,
        program.virtual_stages,
        program.microbatches(),
    )
    .expect("table");
    run_pipeline(program, &table, &CpuBackend, args, Duration::from_secs(120))
        .expect("pipelined run")
}

fn assert_matches_jax(run: &PipelineRun, case: &serde_json::Value, what: &str) {
    let name = case["name"].as_str().unwrap();
    let rtol = case["rtol"].as_f64().unwrap();
    let atol = case["atol"].as_f64().unwrap();
    let values = values_from_literals(&run.outputs).unwrap();
    let flat: Vec<_> = values.iter().flat_map(|v| v.leaves()).collect();
    assert_eq!(
        flat.len() as u64,
        case["num_outputs"].as_u64().unwrap(),
        "{what}: outputs"
    );
    for (i, out) in flat.iter().enumerate() {
        let expected = read_npy(&case_dir(name).join(format!("expected/out{i}.npy"))).unwrap();
        let c = compare(out, &expected, rtol, atol);
        assert!(c.matched(), "{what}: output {i} differs from JAX's: {c:?}");
    }
}

/// Every (stage, microbatch, direction) ran exactly once, on its device.
fn assert_each_task_once(program: &PipelineProgram, run: &PipelineRun) {
    let s = program.num_stages();
    let m = program.microbatches();
    let mut seen = vec![0usize; 2 * s * m];
    let t = program.tensor_parallel;
    for (device, report) in run.devices.iter().enumerate() {
        for task in &report.executed {
            assert_eq!(program.device_of_stage(task.stage), device / t);
            let order = TaskKey {
                stage: task.stage,
                direction: task.direction,
            }
            .order(s);
            seen[order * m + task.microbatch] += 1;
        }
    }
    assert!(seen.iter().all(|&n| n == t), "task counts {seen:?}");
}

#[test]
fn gpipe_and_1f1b_on_4_devices_match_jax() {
    let (module, args, case) = load_case(MLP);
    let program = split_pipeline(&module, &PipelineOptions::default()).expect("split");
    assert_eq!(program.num_stages(), 4);
    assert_eq!(program.microbatches(), 8);
    let (p, m) = (4usize, 8usize);
    for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
        let run = run(&program, kind, &args);
        assert_matches_jax(&run, &case, kind.name());
        assert_each_task_once(&program, &run);
        // One activation forward and one gradient backward per stage
        // boundary and microbatch: 2 (p - 1) m sends, as many receives.
        let sends: usize = run.devices.iter().map(|d| d.sends).sum();
        let receives: usize = run.devices.iter().map(|d| d.receives).sum();
        assert_eq!(sends, 2 * (p - 1) * m, "{}: sends", kind.name());
        assert_eq!(receives, 2 * (p - 1) * m, "{}: receives", kind.name());
        // Simulated bubble with uniform stages (the closed form's premise).
        let table = task_table(kind, p, 1, m).unwrap();
        let sim = simulate_uniform(&program, &table).unwrap();
        let expected = (p - 1) as f64 / (m + p - 1) as f64;
        assert!(
            (sim.idle_fraction - expected).abs() <= 0.01,
            "{}: idle {} vs {expected}",
            kind.name(),
            sim.idle_fraction
        );
        for stage in 0..p {
            let peak = sim.peak_live_microbatches[stage];
            match kind {
                ScheduleKind::GPipe => assert_eq!(peak, m),
                _ => assert!(peak <= p - stage, "1f1b stage {stage}: {peak} live"),
            }
        }
    }
}

#[test]
fn interleaved_on_4_devices_with_2_virtual_stages_matches_jax() {
    let (module, args, case) = load_case(MLP);
    let options = PipelineOptions {
        virtual_stages: 2,
        ..PipelineOptions::default()
    };
    let program = split_pipeline(&module, &options).expect("split");
    assert_eq!(program.num_stages(), 8);
    let run = run(&program, ScheduleKind::Interleaved, &args);
    assert_matches_jax(&run, &case, "interleaved");
    assert_each_task_once(&program, &run);
    let (p, v, m) = (4usize, 2usize, 8usize);
    let sends: usize = run.devices.iter().map(|d| d.sends).sum();
    assert_eq!(sends, 2 * (p * v - 1) * m, "interleaved: sends");
    let table = task_table(ScheduleKind::Interleaved, p, v, m).unwrap();
    let sim = simulate_uniform(&program, &table).unwrap();
    let expected = (p - 1) as f64 / (v * m + p - 1) as f64;
    assert!(
        (sim.idle_fraction - expected).abs() <= 0.01,
        "interleaved: idle {} vs {expected}",
        sim.idle_fraction
    );
}

#[test]
fn four_stages_by_two_way_tensor_parallel_on_8_devices_match_jax() {
    let (module, args, case) = load_case(TRANSFORMER_TP);
    let options = PipelineOptions {
        tensor_parallel: 2,
        ..PipelineOptions::default()
    };
    let program = split_pipeline(&module, &options).expect("split");
    // Every stage program is partitioned for its 2 devices: Megatron's
    // row-parallel projections end in all-reduces.
    for task in &program.tasks {
        assert_eq!(task.module.num_partitions(), 2);
        let text = task.module.to_text();
        assert!(
            text.contains("all-reduce("),
            "{} has no all-reduce",
            task.module.name
        );
    }
    for kind in [ScheduleKind::GPipe, ScheduleKind::OneFOneB] {
        let run = run(&program, kind, &args);
        assert_eq!(run.devices.len(), 8);
        assert_matches_jax(&run, &case, &format!("{} x tp2", kind.name()));
        assert_each_task_once(&program, &run);
        // Each device sends its tile to the device at its place in the
        // next (or previous) stage's group: 2 (p - 1) m per group position.
        let sends: usize = run.devices.iter().map(|d| d.sends).sum();
        assert_eq!(sends, 2 * 2 * 3 * 8, "{}: sends", kind.name());
    }
}

#[test]
fn stacked_layer_scans_cut_into_stages_match_jax() {
    let (module, args, case) = load_case(STACKED);
    for (kind, v) in [
        (ScheduleKind::GPipe, 1),
        (ScheduleKind::OneFOneB, 1),
        (ScheduleKind::Interleaved, 2),
    ] {
        let options = PipelineOptions {
            virtual_stages: v,
            cut_layer_scans: true,
            ..PipelineOptions::default()
        };
        let program = split_pipeline(&module, &options).expect("split");
        let run = run(&program, kind, &args);
        assert_matches_jax(&run, &case, &format!("cut layer scans, {}", kind.name()));
        assert_each_task_once(&program, &run);
    }
}
