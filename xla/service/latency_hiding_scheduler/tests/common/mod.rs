//! Helpers shared by the integration tests: a cost model with exact costs
//! per instruction name, parsing, scheduling and simulating.

#![allow(dead_code)]

use std::sync::Arc;
use xla_hlo_ir::HloModule;
use xla_latency_hiding_scheduler::cost::Op;
use xla_latency_hiding_scheduler::kinds::CollectiveInfo;
use xla_latency_hiding_scheduler::{
    schedule_module, simulate_module, validate_schedule, CostModel, CostTable, ModuleSimulation,
    SchedulerConfig, TableCostModel, NUM_RESOURCES,
};

/// Everything free unless a table says otherwise.
pub struct Zero;

impl CostModel for Zero {
    fn name(&self) -> String {
        "zero".into()
    }
    fn compute_us(&self, _op: Op<'_>) -> f64 {
        0.0
    }
    fn transfer_us(&self, _op: Op<'_>, _info: &CollectiveInfo) -> f64 {
        0.0
    }
}

/// Exact costs: `(name, µs)` pairs (compute for ordinary instructions,
/// transfer for collectives, looked up by the collective's name).
pub fn fixed(costs: &[(&str, f64)]) -> Arc<dyn CostModel> {
    let mut t = CostTable::default();
    for (n, c) in costs {
        t.entries.insert((*n).to_string(), *c);
    }
    Arc::new(TableCostModel::new(t, Arc::new(Zero)))
}

pub fn parse(text: &str) -> HloModule {
    let m = xla_hlo_parser::parse_module(text).unwrap_or_else(|e| panic!("parse: {e}"));
    xla_hlo_verifier::verify(&m).unwrap_or_else(|e| panic!("input does not verify: {e}"));
    m
}

/// Schedules a copy of `m`; checks the verifier and the validator accept
/// the result; returns it with its simulation.
pub fn schedule(
    m: &HloModule,
    config: &SchedulerConfig,
    model: &dyn CostModel,
) -> (HloModule, ModuleSimulation) {
    let mut out = m.clone();
    schedule_module(&mut out, config, model).unwrap_or_else(|e| panic!("schedule: {e}"));
    xla_hlo_verifier::verify(&out)
        .unwrap_or_else(|e| panic!("output does not verify: {e}\n{}", out.to_text()));
    let v = validate_schedule(&out, &config.overlap_limits, config.memory_limit);
    assert!(
        v.is_valid(),
        "invalid schedule: {:?}\n{}",
        v.violations,
        out.to_text()
    );
    // The printed module reads back to the same schedule.
    let back = xla_hlo_parser::parse_module(&out.to_text()).expect("printed module parses");
    assert_eq!(back.to_text(), out.to_text());
    let sim = simulate_module(&out, model, &config.overlap_limits, false).expect("simulate");
    (out, sim)
}

pub fn limits(n: usize) -> [usize; NUM_RESOURCES] {
    [n; NUM_RESOURCES]
}

/// Position of an instruction in the entry's schedule.
pub fn pos(m: &HloModule, name: &str) -> usize {
    m.entry_computation()
        .find(name)
        .unwrap_or_else(|| panic!("no %{name}"))
        .index()
}

pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * (1.0 + a.abs().max(b.abs()))
}
