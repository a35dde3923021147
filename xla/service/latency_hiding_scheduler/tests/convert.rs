//! `async-collective-creator`: every collective kind becomes the start/done
//! pair XLA spells (native all-reduce / all-gather / collective-permute
//! starts, `async-start`/`async-done` with a wrapped computation for the
//! others or for all with `generic`), the result verifies, prints and
//! parses back, and runs on 8 loopback devices with the same outputs as
//! the synchronous module, before and after scheduling.

mod common;

use common::*;
use xla_hlo_evaluator::{evaluate_spmd, Array, Value};
use xla_hlo_ir::{AttrKey, HloModule, Opcode};
use xla_hlo_pass::Pass;
use xla_latency_hiding_scheduler::{
    convert_collectives, AnalyticalCostModel, AsyncCollectiveCreator, AsyncConversionConfig,
    GpuSpec, SchedulerConfig,
};

const ALL_KINDS: &str = "HloModule kinds, num_partitions=8

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

ENTRY %e (p: f32[64]) -> (f32[64], f32[512], f32[8], f32[64], f32[64], f32[64]) {
  %p = f32[64]{0} parameter(0)
  %id = u32[] partition-id()
  %idf = f32[] convert(%id)
  %idb = f32[64]{0} broadcast(%idf), dimensions={}
  %x = f32[64]{0} add(%p, %idb)
  %ar = f32[64]{0} all-reduce(%x), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %ag = f32[512]{0} all-gather(%x), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}
  %rs = f32[8]{0} reduce-scatter(%x), channel_id=3, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=%add
  %a2a = f32[64]{0} all-to-all(%x), channel_id=4, replica_groups=[1,8]<=[8], dimensions={0}
  %cp = f32[64]{0} collective-permute(%x), channel_id=5, source_target_pairs={{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7},{7,0}}
  %y = f32[64]{0} multiply(%x, %x)
  %z = f32[64]{0} exponential(%y)
  ROOT %t = (f32[64]{0}, f32[512]{0}, f32[8]{0}, f32[64]{0}, f32[64]{0}, /*index=5*/f32[64]{0}) tuple(%ar, %ag, %rs, %a2a, %cp, %z)
}
";

fn run(m: &HloModule) -> String {
    let v: Vec<f32> = (0..64).map(|i| (i as f32) * 0.25 - 3.0).collect();
    let arg = Value::Array(Array::from_f32(vec![64], v).unwrap());
    let out = evaluate_spmd(m, &[arg], 8)
        .unwrap_or_else(|e| panic!("evaluation failed: {e}\n{}", m.to_text()));
    format!("{out:?}")
}

#[test]
fn native_and_wrapped_forms() {
    let mut m = parse(ALL_KINDS);
    let n = convert_collectives(&mut m, &AsyncConversionConfig::default());
    assert_eq!(n, 5);
    xla_hlo_verifier::verify(&m).unwrap_or_else(|e| panic!("{e}\n{}", m.to_text()));
    let e = m.entry_computation();
    let op = |name: &str| {
        e.instr(e.find(name).unwrap_or_else(|| panic!("no %{name}")))
            .opcode
    };
    assert_eq!(op("ar-start"), Opcode::AllReduceStart);
    assert_eq!(op("ar-done"), Opcode::AllReduceDone);
    assert_eq!(op("ag-start"), Opcode::AllGatherStart);
    assert_eq!(op("cp-start"), Opcode::CollectivePermuteStart);
    assert_eq!(op("rs-start"), Opcode::AsyncStart);
    assert_eq!(op("a2a-done"), Opcode::AsyncDone);
    let text = m.to_text();
    assert!(
        text.contains("%ag-start = (f32[64]{0}, f32[512]{0}) all-gather-start(%x)"),
        "{text}"
    );
    assert!(
        text.contains(
            "%cp-start = (f32[64]{0}, f32[64]{0}, u32[], u32[]) collective-permute-start(%x)"
        ),
        "{text}"
    );
    assert!(text.contains("%rs-start = ((f32[64]{0}), f32[8]{0}, u32[]) async-start(%x), calls=%async_computation"), "{text}");
    // The wrapped collective keeps its name and attributes.
    let (c, i) = m.find_instruction("rs").unwrap();
    assert_ne!(c, m.entry);
    assert_eq!(m.comp(c).instr(i).opcode, Opcode::ReduceScatter);
    assert!(m.comp(c).instr(i).has_attr(AttrKey::ToApply));
    // Async computations come before their caller (XLA's parser needs it).
    assert!(c.index() < m.entry.index());
    // Every start is right before its done, so the arena stays ordered.
    assert_eq!(
        e.find("ar-start").unwrap().index() + 1,
        e.find("ar-done").unwrap().index()
    );
    // Printed text reads back identically.
    let back = xla_hlo_parser::parse_module(&text).unwrap();
    assert_eq!(back.to_text(), text);
    // Converting again does nothing (the pass reports it).
    let mut pass = AsyncCollectiveCreator::default();
    assert!(!pass.run(&mut m).unwrap());
}

#[test]
fn generic_wraps_everything() {
    let mut m = parse(ALL_KINDS);
    let cfg = AsyncConversionConfig {
        generic: true,
        ..AsyncConversionConfig::default()
    };
    assert_eq!(convert_collectives(&mut m, &cfg), 5);
    xla_hlo_verifier::verify(&m).unwrap();
    let e = m.entry_computation();
    let starts = e
        .instructions
        .iter()
        .filter(|i| i.opcode == Opcode::AsyncStart)
        .count();
    assert_eq!(starts, 5);
    assert_eq!(
        m.computations
            .iter()
            .filter(|c| c.name.starts_with("async_computation"))
            .count(),
        5
    );
}

#[test]
fn kinds_can_be_left_synchronous() {
    let mut m = parse(ALL_KINDS);
    let mut cfg = AsyncConversionConfig::default();
    cfg.kinds[xla_latency_hiding_scheduler::ResourceKind::AllGather.index()] = false;
    cfg.min_bytes = 64; // the 32-byte reduce-scatter result stays synchronous
    assert_eq!(convert_collectives(&mut m, &cfg), 3);
    let e = m.entry_computation();
    assert_eq!(e.instr(e.find("ag").unwrap()).opcode, Opcode::AllGather);
    assert_eq!(e.instr(e.find("rs").unwrap()).opcode, Opcode::ReduceScatter);
}

#[test]
fn execution_is_unchanged_by_conversion_and_scheduling() {
    let m = parse(ALL_KINDS);
    let reference = run(&m);
    for generic in [false, true] {
        let mut c = m.clone();
        convert_collectives(
            &mut c,
            &AsyncConversionConfig {
                generic,
                ..AsyncConversionConfig::default()
            },
        );
        assert_eq!(run(&c), reference, "converted, generic={generic}");
        let mut config = SchedulerConfig::default();
        config.convert.as_mut().unwrap().generic = generic;
        let model = AnalyticalCostModel::new(GpuSpec::h100_sxm());
        let (s, _) = schedule(&m, &config, &model);
        assert_eq!(run(&s), reference, "scheduled, generic={generic}");
    }
}
