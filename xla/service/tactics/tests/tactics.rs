//! Tactics on testdata/tactics_cases/mlp2_train (a 2-layer MLP train step
//! written with JAX, no shardings) over a 2x4 mesh: batch parallelism on
//! x, then Megatron on y, then ZeRO-3 on x. After each tactic the earlier
//! decisions stand, the collectives are the ones derived by hand below,
//! and the partitioned program gives JAX's outputs on 8 loopback devices;
//! a conflicting tactic keeps the earlier decision and is reported. The
//! same schedule on a one-layer transformer train step (Megatron on the
//! attention projections and the MLP) keeps every earlier decision and
//! gives JAX's outputs after each tactic.

use std::path::PathBuf;
use xla_hlo_evaluator::compare::compare;
use xla_hlo_evaluator::npy::{load_argument, read_npy};
use xla_hlo_evaluator::Value;
use xla_hlo_ir::HloModule;
use xla_runtime::cpu::{literals_from_values, values_from_literals};
use xla_runtime::{run_spmd, Backend, CpuBackend, LaunchPlan};
use xla_tactics::{apply_schedule, parse_schedule, TacticReport, TacticsRun};

/// A tactic's step kept every earlier decision and met no conflict.
fn assert_clean(report: &TacticReport) {
    assert!(
        report.conflicts.is_empty(),
        "{}: {:?}",
        report.name,
        report.conflicts
    );
    assert!(
        report.changed_earlier.is_empty(),
        "{}: {:?}",
        report.name,
        report.changed_earlier
    );
}

const MLP: &str = "mlp2_train";
const TRANSFORMER: &str = "transformer_train";

fn case_path(case: &str) -> PathBuf {
    xla_test_paths::workspace_root()
        .join("testdata/tactics_cases")
        .join(case)
}

fn load(case: &str) -> HloModule {
    let text = std::fs::read_to_string(case_path(case).join("input.hlo")).unwrap();
    xla_hlo_parser::parse_module(&text).unwrap()
}

fn module() -> HloModule {
    load(MLP)
}

fn model() -> std::sync::Arc<dyn xla_latency_hiding_scheduler::CostModel> {
    xla_latency_hiding_scheduler::cost_model_from_spec("analytical").unwrap()
}

const SCHEDULE: &str = r#"{
  "mesh": {"x": 2, "y": 4},
  "tactics": [
    {"name": "batch", "recipe": "batch", "axis": "x", "values": ["x", "y"]},
    {"name": "megatron", "recipe": "megatron", "axis": "y", "column": ["w1"], "row": ["w2"]},
    {"name": "zero3", "recipe": "zero3", "axis": "x", "values": ["w*"]}
  ]
}"#;

fn run_on_devices(run: &TacticsRun) -> Result<(), String> {
    run_case_on_devices(MLP, run)
}

fn run_case_on_devices(case: &str, run: &TacticsRun) -> Result<(), String> {
    let case_dir = || case_path(case);
    let global = &run.propagated;
    let local = &run.partitioned;
    let g = global.entry_computation();
    let mut args = Vec::new();
    for (i, &p) in g.parameters.iter().enumerate() {
        let instr = g.instr(p);
        let a = load_argument(
            &case_dir().join(format!("args/arg{i}.npy")),
            i,
            &instr.name,
            &instr.shape,
        )
        .map_err(|e| e.to_string())?;
        args.push(Value::Array(a));
    }
    let plan = LaunchPlan::from_global_module(local, global, 8).map_err(|e| e.to_string())?;
    let exe = CpuBackend.compile(local).map_err(|e| e.to_string())?;
    let outs = run_spmd(exe.as_ref(), &literals_from_values(&args).unwrap(), &plan)
        .and_then(|o| values_from_literals(&o))
        .map_err(|e| e.to_string())?;
    let flat: Vec<_> = outs.iter().flat_map(|v| v.leaves()).collect();
    for (i, out) in flat.iter().enumerate() {
        let expected = read_npy(&case_dir().join(format!("expected/out{i}.npy"))).unwrap();
        let c = compare(out, &expected, 1e-4, 1e-5);
        if !c.matched() {
            return Err(format!("output {i}: {c:?}"));
        }
    }
    Ok(())
}

/// A tactic's name, its collectives by kind and their bytes per device.
type Expected = (&'static str, &'static [(&'static str, usize)], u64);

/// The hand-derived collectives after each tactic (per-device result
/// bytes, f32): x [16,16], y [16,16], w1 [16,32], w2 [32,16] on x=2, y=4.
/// - batch on x: the loss and both gradients contract the batch, so three
///   all-reduces over x: 4 + 16*32*4 + 32*16*4 = 4100 bytes.
/// - then Megatron on y: the row-parallel product is all-reduced over y
///   ([8,16]: 512), the gradient tiles over x ([16,8] and [8,16]: 512 each)
///   and the loss (4): four all-reduces, 1540 bytes.
/// - then ZeRO-3 on x: both weights are all-gathered over x before use ([16,8]
///   and [8,16]: 512 each), the gradients reduce-scattered instead of
///   all-reduced ([8,8]: 256 each), the forward all-reduce over y and the
///   loss stay: 2052 bytes.
const EXPECTED: [Expected; 3] = [
    ("batch", &[("all-reduce", 3)], 4100),
    ("megatron", &[("all-reduce", 4)], 1540),
    (
        "zero3",
        &[("all-gather", 2), ("all-reduce", 2), ("reduce-scatter", 2)],
        2052,
    ),
];

fn prefix(k: usize, text: &str) -> xla_tactics::schedule::Schedule {
    let schedule = parse_schedule(text).unwrap();
    xla_tactics::schedule::Schedule {
        mesh: schedule.mesh.clone(),
        tactics: schedule.tactics[..k].to_vec(),
    }
}

#[test]
fn each_tactic_keeps_earlier_decisions_and_matches_the_hand_derived_collectives() {
    let module = module();
    let full = apply_schedule(
        &module,
        &parse_schedule(SCHEDULE).unwrap(),
        model().as_ref(),
    )
    .unwrap();
    assert_eq!(full.reports.len(), 3);
    for (k, (name, collectives, bytes)) in EXPECTED.iter().enumerate() {
        let report = &full.reports[k];
        assert_eq!(report.name, *name);
        assert_clean(report);
        let got: Vec<(&str, usize)> = report
            .collectives
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(got, collectives.to_vec(), "{name}: collectives");
        assert_eq!(report.collective_bytes, *bytes, "{name}: bytes");
        assert!(report.simulated_step_us > 0.0 && report.peak_memory_bytes > 0);
        // The program as partitioned after this tactic gives JAX's outputs.
        let run = apply_schedule(&module, &prefix(k + 1, SCHEDULE), model().as_ref()).unwrap();
        assert_eq!(run.reports.last().unwrap().collective_bytes, *bytes);
        run_on_devices(&run).unwrap_or_else(|e| panic!("after {name}: {e}"));
    }
    // Sharding the weights cuts their per-device memory at each step.
    assert!(full.reports[1].peak_memory_bytes < full.reports[0].peak_memory_bytes);
    assert!(full.reports[2].peak_memory_bytes < full.reports[1].peak_memory_bytes);
}

#[test]
fn a_conflicting_tactic_keeps_the_earlier_decision_and_is_reported() {
    // Megatron wants w1's last dimension on y; a later tactic asks for it
    // on x: w1 stays [_, y], and the report names both tactics.
    let text = r#"{
      "mesh": {"x": 2, "y": 4},
      "tactics": [
        {"name": "megatron", "recipe": "megatron", "axis": "y", "column": ["w1"], "row": ["w2"]},
        {"name": "late", "axis": "x", "shard": [{"value": "w1", "dim": 1}]}
      ]
    }"#;
    let run = apply_schedule(&module(), &parse_schedule(text).unwrap(), model().as_ref()).unwrap();
    let late = &run.reports[1];
    assert_eq!(late.conflicts.len(), 1, "{:?}", late.conflicts);
    let c = &late.conflicts[0];
    assert_eq!((c.value.as_str(), c.dim), ("w1.1", 1));
    assert_eq!(
        (c.earlier_tactic.as_str(), c.later_tactic.as_str()),
        ("megatron", "late")
    );
    assert_eq!((c.kept.as_str(), c.wanted.as_str()), ("[_,y]", "[_,x]"));
    assert_eq!(c.resharding_bytes, 16 * 32 * 4 / 4);
    assert!(late.sharded.is_empty());
    // The program is the megatron step's.
    assert_eq!(late.collective_bytes, run.reports[0].collective_bytes);
    run_on_devices(&run).unwrap();
}

#[test]
fn bad_schedules_are_refused_naming_the_tactic() {
    let module = module();
    let error = |text: &str| match parse_schedule(text) {
        Err(e) => e,
        Ok(s) => match apply_schedule(&module, &s, model().as_ref()) {
            Err(e) => e,
            Ok(_) => panic!("accepted {text}"),
        },
    };
    let e = error(
        r#"{"mesh": {"x": 2}, "tactics": [{"recipe": "batch", "axis": "z", "values": ["x"]}]}"#,
    );
    assert!(e.contains("axis \"z\" is not in the mesh"), "{e}");
    let e = error(
        r#"{"mesh": {"x": 2}, "tactics": [{"recipe": "batch", "axis": "x", "values": ["nope*"]}]}"#,
    );
    assert!(e.contains("\"nope*\" matches no entry parameter"), "{e}");
    let e = error(r#"{"mesh": {"x": 2}, "tactics": [{"recipe": "pipelined", "axis": "x"}]}"#);
    assert!(e.contains("unknown recipe"), "{e}");
    let e = error("not json");
    assert!(e.contains("not JSON"), "{e}");
}

#[test]
fn transformer_schedule_keeps_earlier_decisions_and_matches_jax_after_each_tactic() {
    let text = r#"{
      "mesh": {"x": 2, "y": 4},
      "tactics": [
        {"name": "batch", "recipe": "batch", "axis": "x", "values": ["x", "y"]},
        {"name": "megatron", "recipe": "megatron", "axis": "y",
         "column": ["wq", "wk", "wv", "w1"], "row": ["wo", "w2"]},
        {"name": "zero3", "recipe": "zero3", "axis": "x", "values": ["w*"]}
      ]
    }"#;
    let module = load(TRANSFORMER);
    for k in 1..=3 {
        let run = apply_schedule(&module, &prefix(k, text), model().as_ref()).unwrap();
        let report = run.reports.last().unwrap();
        assert_clean(report);
        run_case_on_devices(TRANSFORMER, &run)
            .unwrap_or_else(|e| panic!("after {}: {e}", report.name));
    }
}

#[test]
fn intermediates_by_op_name_and_outputs_can_be_sharded() {
    // Batch on x, then the hidden activation (op_name .../jvp()/tanh) split
    // on y: propagation turns it into Megatron's layout (the same 1540
    // bytes as the recipe); then the updated w1 (output 1) split on x.
    let text = r#"{
      "mesh": {"x": 2, "y": 4},
      "tactics": [
        {"name": "batch", "recipe": "batch", "axis": "x", "values": ["x", "y"]},
        {"name": "hidden", "axis": "y", "shard": [{"op_name": "*jvp()/tanh", "dim": 1}]},
        {"name": "w1-out", "axis": "x", "shard": [{"output": 1, "dim": 0}]}
      ]
    }"#;
    let run = apply_schedule(&module(), &parse_schedule(text).unwrap(), model().as_ref()).unwrap();
    let hidden = &run.reports[1];
    assert_eq!(
        hidden.sharded,
        vec![("tanh.1".to_string(), "[x,y]".to_string())]
    );
    assert_eq!(hidden.collective_bytes, 1540);
    let out = &run.reports[2];
    assert_eq!(out.sharded.len(), 1, "{:?}", out);
    assert_eq!(out.sharded[0].1, "[x,y]");
    for report in &run.reports {
        assert_clean(report);
    }
    run_on_devices(&run).unwrap();
    // An op_name that names nothing is refused.
    let bad = text.replace("*jvp()/tanh", "*/softmax");
    let e = apply_schedule(&module(), &parse_schedule(&bad).unwrap(), model().as_ref())
        .err()
        .unwrap();
    assert!(
        e.contains("op_name \"*/softmax\" matches no array instruction"),
        "{e}"
    );
}

#[test]
fn zero3_does_not_resplit_what_propagation_derived_from_megatron() {
    // mlp3_ce's bias b_in follows w_in's Megatron column split onto y;
    // ZeRO-3 on x then finds its only dimension taken: a conflict, and
    // every earlier decision stands.
    let text = r#"{
      "mesh": {"x": 2, "y": 4},
      "tactics": [
        {"name": "batch", "recipe": "batch", "axis": "x", "values": ["x", "y"]},
        {"name": "megatron", "recipe": "megatron", "axis": "y", "column": ["w_in", "w_mid"], "row": ["w_out"]},
        {"name": "zero3", "recipe": "zero3", "axis": "x", "values": ["w_*", "b_in"]}
      ]
    }"#;
    let run = apply_schedule(
        &load("mlp3_ce"),
        &parse_schedule(text).unwrap(),
        model().as_ref(),
    )
    .unwrap();
    for report in &run.reports {
        assert!(
            report.changed_earlier.is_empty(),
            "{}: {:?}",
            report.name,
            report.changed_earlier
        );
    }
    let zero3 = &run.reports[2];
    assert_eq!(zero3.conflicts.len(), 1, "{:?}", zero3.conflicts);
    assert_eq!(zero3.conflicts[0].value, "b_in.1");
    assert_eq!(zero3.conflicts[0].kept, "[y]");
    run_case_on_devices("mlp3_ce", &run).unwrap();
}
