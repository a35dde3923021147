//! Bad and unusual input: arenas out of dependency order are put in order;
//! dependency cycles, dangling ids and missing callees give typed errors
//! or valid output, never panics; every testdata module (inputs,
//! propagated and partitioned) schedules to a valid module; loops whose
//! trip count cannot be derived count once.

mod common;

use common::*;
use xla_hlo_ir::{HloModule, InstrId};
use xla_latency_hiding_scheduler::pass::apply_order;
use xla_latency_hiding_scheduler::{
    schedule_module, simulate_module, validate_schedule, AnalyticalCostModel, ApproximateCostModel,
    GpuSpec, SchedulerConfig, SchedulerError,
};

fn testdata_modules() -> Vec<(String, HloModule)> {
    let root = xla_test_paths::testdata_cases();
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(&root) else {
        return out;
    };
    let mut dirs: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    dirs.sort();
    for d in dirs {
        for f in ["input.hlo", "propagated.hlo", "xla_partitioned.hlo"] {
            let p = d.join(f);
            if let Ok(text) = std::fs::read_to_string(&p) {
                if let Ok(m) = xla_hlo_parser::parse_module(&text) {
                    out.push((p.display().to_string(), m));
                }
            }
        }
    }
    out
}

/// A fixed pseudo-random permutation of `0..n`.
fn shuffle(n: usize, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    let mut x = seed | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

#[test]
fn every_testdata_module_schedules_validly_even_shuffled() {
    let model = AnalyticalCostModel::new(GpuSpec::h100_sxm());
    let config = SchedulerConfig::default();
    let modules = testdata_modules();
    assert!(!modules.is_empty(), "no testdata modules");
    for (name, m) in modules {
        for shuffled in [false, true] {
            let mut input = m.clone();
            if shuffled {
                for c in input.computations.iter_mut() {
                    let n = c.instructions.len();
                    apply_order(c, &shuffle(n, n as u64 + 7));
                }
            }
            let mut out = input.clone();
            if let Err(e) = schedule_module(&mut out, &config, &model) {
                panic!("{name} (shuffled={shuffled}): {e}");
            }
            let v = validate_schedule(&out, &config.overlap_limits, None);
            assert!(
                v.is_valid(),
                "{name} (shuffled={shuffled}): {:?}",
                v.violations
            );
            if xla_hlo_verifier::verify(&m).is_ok() {
                xla_hlo_verifier::verify(&out)
                    .unwrap_or_else(|e| panic!("{name} (shuffled={shuffled}): {e}"));
            }
        }
    }
}

#[test]
fn cycles_are_typed_errors() {
    let mut m = parse(
        "HloModule c\n\nENTRY %e (p: f32[4]) -> f32[4] {\n  %p = f32[4]{0} parameter(0)\n  %a = f32[4]{0} negate(%p)\n  ROOT %b = f32[4]{0} negate(%a)\n}\n",
    );
    let e = m.entry;
    let a = m.comp(e).find("a").unwrap();
    let b = m.comp(e).find("b").unwrap();
    m.comp_mut(e).instr_mut(a).control_predecessors.push(b);
    let r = schedule_module(
        &mut m.clone(),
        &SchedulerConfig::default(),
        &ApproximateCostModel,
    );
    assert!(
        matches!(r, Err(SchedulerError::Cycle { .. })),
        "{:?}",
        r.err()
    );
    assert!(simulate_module(&m, &ApproximateCostModel, &limits(1), false).is_err());
    let v = validate_schedule(&m, &limits(1), None);
    assert!(!v.is_valid());
}

#[test]
fn dangling_ids_and_missing_callees_do_not_panic() {
    let text = "HloModule d, num_partitions=8\n\n%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %sum = f32[] add(%a, %b)\n}\n\nENTRY %e (p: f32[64]) -> f32[64] {\n  %p = f32[64]{0} parameter(0)\n  %x = f32[64]{0} negate(%p)\n  %ar = f32[64]{0} all-reduce(%x), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add\n  ROOT %y = f32[64]{0} add(%ar, %x)\n}\n";
    let base = parse(text);
    // An operand id past the end, a root past the end.
    let mut m = base.clone();
    let e = m.entry;
    let x = m.comp(e).find("x").unwrap();
    m.comp_mut(e).instr_mut(x).operands.push(InstrId(999));
    let _ = schedule_module(&mut m, &SchedulerConfig::default(), &ApproximateCostModel);
    let _ = m.to_text();
    let mut m = base.clone();
    m.comp_mut(e).root = InstrId(777);
    let _ = schedule_module(&mut m, &SchedulerConfig::default(), &ApproximateCostModel);
    // A while whose body and condition do not exist.
    let w = "HloModule w\n\n%c (s: s32[]) -> pred[] {\n  %s = s32[] parameter(0)\n  %k = s32[] constant(3)\n  ROOT %lt = pred[] compare(%s, %k), direction=LT\n}\n\n%b (t: s32[]) -> s32[] {\n  %t = s32[] parameter(0)\n  %one = s32[] constant(1)\n  ROOT %n = s32[] add(%t, %one)\n}\n\nENTRY %e (p: s32[]) -> s32[] {\n  %p = s32[] parameter(0)\n  ROOT %w = s32[] while(%p), condition=%c, body=%b\n}\n";
    let mut m = parse(w);
    // Not a counted loop over a tuple: the trip count is unknown (1).
    let sim = simulate_module(&m, &ApproximateCostModel, &limits(1), false).unwrap();
    assert!(sim.entry.makespan > 0.0);
    let e = m.entry;
    let wi = m.comp(e).find("w").unwrap();
    for a in m.comp_mut(e).instr_mut(wi).attrs.iter_mut() {
        if let xla_hlo_ir::AttrValue::Computation(c) = &mut a.value {
            c.0 = 4242;
        }
    }
    let _ = schedule_module(&mut m, &SchedulerConfig::default(), &ApproximateCostModel);
    let _ = simulate_module(&m, &ApproximateCostModel, &limits(1), false);
    let _ = validate_schedule(&m, &limits(1), None);
}
