//! Automatic sharding: on testdata/tactics_cases/mlp2_train (small enough
//! to enumerate) the coordinate descent finds the exhaustive search's
//! optimum on a 1x4 and a 2x2 mesh, with and without a memory limit; a
//! tight limit shards the weights; a batch-heavy step (mlp2_batch_lowered)
//! gets data parallelism; on transformer_2k_lowered (width 2048,
//! lowered only) the automatic plan's simulated step time is within 5% of
//! the best hand-written schedule (DP, FSDP, TP, FSDP+TP, TP+DP) on a 2x4
//! mesh, found in seconds, and re-running its tactic schedule gives the
//! same figures.

use std::time::Instant;
use xla_hlo_ir::HloModule;
use xla_tactics::auto::descent_only;
use xla_tactics::schedule::{DimChoice, Selector};
use xla_tactics::{apply_schedule, auto_shard, parse_schedule, AutoOptions};

fn load(case: &str) -> HloModule {
    let path = xla_test_paths::workspace_root()
        .join("testdata/tactics_cases")
        .join(case)
        .join("input.hlo");
    xla_hlo_parser::parse_module(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn model() -> std::sync::Arc<dyn xla_latency_hiding_scheduler::CostModel> {
    xla_latency_hiding_scheduler::cost_model_from_spec("analytical").unwrap()
}

fn mesh(axes: &[(&str, i64)]) -> Vec<(String, i64)> {
    axes.iter().map(|(n, s)| (n.to_string(), *s)).collect()
}

#[test]
fn descent_finds_the_exhaustive_optimum_on_the_small_mlp() {
    let module = load("mlp2_train");
    for axes in [&[("x", 1), ("y", 4)][..], &[("x", 2), ("y", 2)][..]] {
        for limit in [None, Some(8000u64), Some(5000)] {
            let options = AutoOptions {
                mesh: mesh(axes),
                memory_limit: limit,
                exhaustive_limit: 1 << 20,
            };
            let exhaustive = auto_shard(&module, &options, model().as_ref());
            let descent = descent_only(&module, &options, model().as_ref());
            match (exhaustive, descent) {
                (Ok(e), Ok(d)) => {
                    assert!(e.exhaustive && !d.exhaustive);
                    assert!(
                        (e.cost.step_us - d.cost.step_us).abs() < 1e-9,
                        "{axes:?} {limit:?}: exhaustive {:?}, descent {:?}",
                        e.cost,
                        d.cost
                    );
                    if let Some(limit) = limit {
                        assert!(d.cost.peak_memory_bytes <= limit);
                    }
                }
                (Err(_), Err(_)) => {}
                (e, d) => panic!(
                    "{axes:?} {limit:?}: exhaustive {:?} vs descent {:?}",
                    e.map(|p| p.cost),
                    d.map(|p| p.cost)
                ),
            }
        }
    }
}

#[test]
fn a_tight_memory_limit_shards_the_weights() {
    let module = load("mlp2_train");
    let plan = |limit| {
        let options = AutoOptions {
            mesh: mesh(&[("y", 4)]),
            memory_limit: limit,
            exhaustive_limit: 1 << 20,
        };
        auto_shard(&module, &options, model().as_ref()).unwrap()
    };
    let loose = plan(None);
    let tight = plan(Some(8000));
    assert!(tight.cost.peak_memory_bytes <= 8000 && loose.cost.peak_memory_bytes > 8000);
    let shards_a_weight = tight
        .schedule
        .tactics
        .iter()
        .flat_map(|t| &t.targets)
        .any(|t| matches!(&t.selector, Selector::Parameter(p) if p.starts_with('w')));
    assert!(shards_a_weight, "{:?}", tight.schedule);
    assert!(tight.cost.step_us >= loose.cost.step_us);
}

#[test]
fn transformer_plan_is_within_5_percent_of_the_best_hand_written_schedule() {
    let module = load("transformer_2k_lowered");
    let hand_written = [
        (
            "dp",
            r#"{"recipe": "batch", "axis": "x", "values": ["x", "y"]}"#,
        ),
        (
            "fsdp",
            r#"{"recipe": "zero3", "axis": "x", "values": ["w*", "x", "y"]}, {"recipe": "zero3", "axis": "y", "values": ["w*", "x", "y"]}"#,
        ),
        (
            "tp",
            r#"{"recipe": "megatron", "axis": "y", "column": ["wq", "wk", "wv", "w1"], "row": ["wo", "w2"]}"#,
        ),
        (
            "tp+dp",
            r#"{"recipe": "megatron", "axis": "y", "column": ["wq", "wk", "wv", "w1"], "row": ["wo", "w2"]}, {"recipe": "batch", "axis": "x", "values": ["x", "y"]}"#,
        ),
        (
            "tp+fsdp",
            r#"{"recipe": "megatron", "axis": "y", "column": ["wq", "wk", "wv", "w1"], "row": ["wo", "w2"]}, {"recipe": "zero3", "axis": "x", "values": ["w*", "x", "y"]}"#,
        ),
    ];
    let mut best = f64::INFINITY;
    for (name, tactics) in hand_written {
        let text = format!(r#"{{"mesh": {{"x": 2, "y": 4}}, "tactics": [{tactics}]}}"#);
        let run =
            apply_schedule(&module, &parse_schedule(&text).unwrap(), model().as_ref()).unwrap();
        let step = run.reports.last().unwrap().simulated_step_us;
        eprintln!("{name}: {step:.0} us");
        best = best.min(step);
    }
    let start = Instant::now();
    let options = AutoOptions {
        mesh: mesh(&[("x", 2), ("y", 4)]),
        memory_limit: None,
        exhaustive_limit: 4096,
    };
    let plan = auto_shard(&module, &options, model().as_ref()).unwrap();
    let seconds = start.elapsed().as_secs_f64();
    eprintln!(
        "auto: {:.0} us ({} plans, {seconds:.2} s, {})",
        plan.cost.step_us, plan.evaluated, plan.criterion
    );
    // The goal is 10 s on a quiet machine for an optimised build (about 3 s
    // measured); CI shares two cores with the other tests of this binary, and
    // Bazel's default fastbuild is unoptimised (about 7x slower: 19 s measured,
    // 36 s seen on CI).
    let limit = if cfg!(debug_assertions) { 90.0 } else { 15.0 };
    assert!(seconds < limit, "{seconds} s (limit {limit} s)");
    assert!(
        plan.cost.step_us <= 1.05 * best,
        "auto {} vs best {best}",
        plan.cost.step_us
    );
    // The returned schedule, re-run as tactics, reports the same plan.
    let rerun = apply_schedule(&module, &plan.schedule, model().as_ref()).unwrap();
    let last = rerun.reports.last().unwrap();
    assert!(last.conflicts.is_empty(), "{:?}", last.conflicts);
    assert!((last.simulated_step_us - plan.cost.step_us).abs() < 1e-6);
    assert_eq!(last.collective_bytes, plan.cost.collective_bytes);
}

#[test]
fn a_batch_heavy_step_gets_data_parallelism() {
    // Batch 65536 of width 1024: all-reducing the 8 MB of weight gradients
    // costs less than moving activations, so the plan splits the batch and
    // keeps the weights whole.
    let module = load("mlp2_batch_lowered");
    let options = AutoOptions {
        mesh: mesh(&[("y", 4)]),
        memory_limit: None,
        exhaustive_limit: 4096,
    };
    let plan = auto_shard(&module, &options, model().as_ref()).unwrap();
    let targets: Vec<_> = plan
        .schedule
        .tactics
        .iter()
        .flat_map(|t| &t.targets)
        .collect();
    let splits_x_batch = targets
        .iter()
        .any(|t| t.selector == Selector::Parameter("x".into()) && t.dim == DimChoice::Dim(0));
    let splits_a_weight = targets
        .iter()
        .any(|t| matches!(&t.selector, Selector::Parameter(p) if p.starts_with('w')));
    assert!(splits_x_batch && !splits_a_weight, "{targets:?}");
}
