//! The MPMD split of testdata/pipeline_cases/mlp8_m8 (an 8-layer MLP train
//! step written with JAX, layer k under `named_scope("stage_k")`): every
//! stage program verifies and survives printing and parsing; the task
//! tables hold every task once; and malformed stage markers are refused
//! with the instruction named. (Running the programs is in the runtime's
//! tests/pipeline.rs.)

use xla_hlo_ir::HloModule;
use xla_mpmd::{
    split_pipeline, task_table, Direction, MpmdError, PipelineOptions, ScheduleKind, TaskInput,
};

fn case_text() -> String {
    let path = xla_test_paths::workspace_root().join("testdata/pipeline_cases/mlp8_m8/input.hlo");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse(text: &str) -> HloModule {
    xla_hlo_parser::parse_module(text).expect("parses")
}

fn options(num_devices: usize, virtual_stages: usize) -> PipelineOptions {
    PipelineOptions {
        num_devices,
        virtual_stages,
        ..PipelineOptions::default()
    }
}

#[test]
fn stage_programs_verify_and_round_trip() {
    let module = parse(&case_text());
    for (p, v) in [(4, 1), (4, 2), (2, 1), (8, 1)] {
        let program = split_pipeline(&module, &options(p, v)).expect("split");
        assert_eq!(program.tasks.len(), 2 * p * v);
        let mut modules = vec![&program.prologue, &program.epilogue];
        modules.extend(program.tasks.iter().map(|t| &t.module));
        for m in modules {
            let text = m.to_text();
            let reparsed = xla_hlo_parser::parse_module(&text)
                .unwrap_or_else(|e| panic!("{} does not parse back: {e}\n{text}", m.name));
            let report = xla_hlo_verifier::verify_report(&reparsed);
            assert!(report.errors.is_empty(), "{}: {:?}", m.name, report.errors);
            assert_eq!(reparsed.to_text(), text, "{} prints differently", m.name);
        }
        // A forward task reads at most the previous stage's activation; the
        // first reads none.
        let forward_values = |stage: usize| {
            program.tasks[stage]
                .inputs
                .iter()
                .filter(|i| matches!(i, TaskInput::Value(_)))
                .count()
        };
        assert_eq!(forward_values(0), 0);
        for stage in 1..p * v {
            assert_eq!(forward_values(stage), 1, "stage {stage} forward inputs");
        }
    }
}

#[test]
fn task_tables_hold_every_task_once_in_microbatch_order() {
    for (kind, p, v, m) in [
        (ScheduleKind::GPipe, 4, 1, 8),
        (ScheduleKind::OneFOneB, 4, 1, 8),
        (ScheduleKind::OneFOneB, 4, 1, 2),
        (ScheduleKind::Interleaved, 4, 2, 8),
        (ScheduleKind::Interleaved, 2, 3, 4),
    ] {
        let table = task_table(kind, p, v, m).unwrap();
        let s = p * v;
        let mut seen = vec![0; 2 * s * m];
        for (device, tasks) in table.devices.iter().enumerate() {
            let mut last = std::collections::HashMap::new();
            for t in tasks {
                assert_eq!(t.stage % p, device);
                let slot = (t.stage * 2 + (t.direction == Direction::Backward) as usize) * m
                    + t.microbatch;
                seen[slot] += 1;
                let previous = last.insert((t.stage, t.direction), t.microbatch);
                assert!(
                    previous.is_none_or(|x| x < t.microbatch),
                    "{kind:?}: out of order"
                );
            }
        }
        assert!(
            seen.iter().all(|&c| c == 1),
            "{kind:?} p={p} v={v} m={m}: {seen:?}"
        );
    }
    assert!(matches!(
        task_table(ScheduleKind::Interleaved, 4, 2, 6),
        Err(MpmdError::Options(_))
    ));
    assert!(matches!(
        task_table(ScheduleKind::OneFOneB, 4, 2, 8),
        Err(MpmdError::Options(_))
    ));
}

fn split_error(text: &str, p: usize) -> String {
    match split_pipeline(&parse(text), &options(p, 1)) {
        Ok(_) => panic!("split accepted a bad program"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_value_flowing_backwards_is_refused_naming_both_instructions() {
    // Layer 2's tanh marked as layer 7: stage 3's work that stage 1 reads.
    let text = case_text().replace(
        "op_name=\"jvp(stage_2)/tanh\"",
        "op_name=\"jvp(stage_7)/tanh\"",
    );
    let e = split_error(&text, 4);
    assert!(e.contains("value flowing backwards"), "{e}");
    assert!(e.contains("%tanh"), "{e}");
    assert!(
        e.contains("stage 3 forward") && e.contains("stage 1 forward"),
        "{e}"
    );
}

#[test]
fn a_stage_without_work_and_too_many_stages_are_refused() {
    let text = case_text().replace("stage_5)", "stage_9)");
    let e = split_error(&text, 2);
    assert!(e.contains("scope `stage_5` has no instruction"), "{e}");
    let e = split_error(&case_text(), 16);
    assert!(
        e.contains("16 stages asked for") && e.contains("only 8"),
        "{e}"
    );
    let e = split_error(&case_text(), 3);
    assert!(e.contains("cannot be grouped evenly into 3 stages"), "{e}");
    let e = split_error(&case_text().replace("stage_", "layer_"), 4);
    assert!(e.contains("no while loop"), "{e}");
}

#[test]
fn layer_scans_cut_only_into_equal_stages() {
    let path =
        xla_test_paths::workspace_root().join("testdata/pipeline_cases/stacked8_m8/input.hlo");
    let stacked = parse(&std::fs::read_to_string(path).unwrap());
    let cut = |p: usize| {
        let options = PipelineOptions {
            cut_layer_scans: true,
            ..options(p, 1)
        };
        split_pipeline(&stacked, &options)
    };
    let program = cut(4).expect("8 layers cut into 4 stages");
    assert_eq!(program.tasks.len(), 8);
    // Each piece is one while loop running a quarter of the layers.
    for task in &program.tasks {
        let loops = task
            .module
            .entry_computation()
            .instructions
            .iter()
            .filter(|i| i.opcode == xla_hlo_ir::Opcode::While)
            .count();
        assert_eq!(loops, 1, "{}", task.module.name);
    }
    for p in [3, 16] {
        let e = cut(p).expect_err("refused").to_string();
        assert!(e.contains("cannot be cut into"), "{e}");
    }
    // Without the cut, the unscoped program has no stages; the scoped MLP
    // has no layer scan to cut.
    let e = split_pipeline(&stacked, &options(4, 1))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("stage_N"), "{e}");
    let mlp = parse(&case_text());
    let options = PipelineOptions {
        cut_layer_scans: true,
        ..options(4, 1)
    };
    let e = split_pipeline(&mlp, &options)
        .expect_err("refused")
        .to_string();
    assert!(e.contains("scan over layers"), "{e}");
}
