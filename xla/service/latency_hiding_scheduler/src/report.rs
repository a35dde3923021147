//! The `--schedule-report` JSON: the scheduled module's simulated makespan
//! and its lower bound beside the sequential reference (the input in
//! program order with every collective synchronous), exposed
//! communication, overlap, peak memory and the scheduler's own time.
//!
//! Invariant: every number in the report comes from one simulation of the
//! scheduled module and one of the original under the same cost model and
//! lanes, so `makespan_us >= lower_bound_us` and
//! `exposed_comm_us <= total_comm_us` always hold.

use crate::cost::CostModel;
use crate::error::SchedulerError;
use crate::kinds::{ResourceKind, NUM_RESOURCES};
use crate::simulator::{simulate_module, ModuleSimulation};
use serde_json::{json, Value};
use xla_hlo_ir::HloModule;

/// Figures of one schedule.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScheduleReport {
    pub cost_model: String,
    pub makespan_us: f64,
    pub lower_bound_us: f64,
    pub sequential_makespan_us: f64,
    pub exposed_comm_us: f64,
    pub total_comm_us: f64,
    pub critical_path_us: f64,
    pub compute_busy_us: f64,
    pub comm_busy_us: [f64; NUM_RESOURCES],
    pub peak_memory_bytes: u64,
    pub memory_limit_bytes: Option<u64>,
    pub scheduler_ms: f64,
}

impl ScheduleReport {
    /// Simulates `scheduled` (and `original` for the sequential reference).
    pub fn compute(
        original: &HloModule,
        scheduled: &HloModule,
        model: &dyn CostModel,
        lanes: &[usize; NUM_RESOURCES],
        scheduler_ms: f64,
        memory_limit: Option<u64>,
        want_timeline: bool,
    ) -> Result<(ScheduleReport, ModuleSimulation), SchedulerError> {
        let sim = simulate_module(scheduled, model, lanes, want_timeline)?;
        let seq = simulate_module(original, model, lanes, false)?;
        let e = &sim.entry;
        let r = ScheduleReport {
            cost_model: model.name(),
            makespan_us: e.makespan,
            lower_bound_us: e.lower_bound,
            sequential_makespan_us: seq.entry.sequential,
            exposed_comm_us: e.exposed_comm,
            total_comm_us: e.total_comm(),
            critical_path_us: e.critical_path,
            compute_busy_us: e.compute_busy,
            comm_busy_us: e.comm_busy,
            peak_memory_bytes: e.peak_total,
            memory_limit_bytes: memory_limit,
            scheduler_ms,
        };
        Ok((r, sim))
    }

    /// `makespan / lower bound` (1 when both are 0).
    pub fn ratio(&self) -> f64 {
        if self.lower_bound_us > 0.0 {
            self.makespan_us / self.lower_bound_us
        } else {
            1.0
        }
    }

    /// Fraction of communication time hidden behind compute.
    pub fn overlap_fraction(&self) -> Option<f64> {
        (self.total_comm_us > 0.0)
            .then(|| (1.0 - self.exposed_comm_us / self.total_comm_us).clamp(0.0, 1.0))
    }

    pub fn to_json(&self) -> Value {
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        let mut busy = serde_json::Map::new();
        for r in ResourceKind::ALL {
            let v = self.comm_busy_us[r.index()];
            if v > 0.0 {
                busy.insert(r.name().to_string(), json!(round(v)));
            }
        }
        json!({
            "makespan_us": round(self.makespan_us),
            "lower_bound_us": round(self.lower_bound_us),
            "sequential_makespan_us": round(self.sequential_makespan_us),
            "exposed_comm_us": round(self.exposed_comm_us),
            "peak_memory_bytes": self.peak_memory_bytes,
            "scheduler_ms": round(self.scheduler_ms),
            "ratio_to_lower_bound": (self.ratio() * 10000.0).round() / 10000.0,
            "overlap_fraction": self.overlap_fraction().map(|x| (x * 10000.0).round() / 10000.0),
            "total_comm_us": round(self.total_comm_us),
            "critical_path_us": round(self.critical_path_us),
            "compute_busy_us": round(self.compute_busy_us),
            "comm_busy_us": Value::Object(busy),
            "memory_limit_bytes": self.memory_limit_bytes,
            "cost_model": self.cost_model,
        })
    }
}

/// The exact search's verdict on one computation's schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct ComputationGap {
    pub computation: String,
    /// Graph nodes (instructions).
    pub nodes: usize,
    /// The schedule's simulated makespan (µs).
    pub schedule_us: f64,
    /// The best order the exact search found and its proven lower bound.
    pub best_us: f64,
    pub bound_us: f64,
    /// The search finished: `best_us` is the optimum.
    pub optimal: bool,
}

impl ComputationGap {
    /// How far the schedule is from the proven bound, relative to it.
    pub fn schedule_gap(&self) -> f64 {
        if self.bound_us > 0.0 {
            (self.schedule_us / self.bound_us - 1.0).max(0.0)
        } else {
            0.0
        }
    }
    pub fn to_json(&self) -> Value {
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        json!({
            "computation": self.computation,
            "nodes": self.nodes,
            "schedule_us": round(self.schedule_us),
            "best_us": round(self.best_us),
            "bound_us": round(self.bound_us),
            "optimal": self.optimal,
            "schedule_gap": (self.schedule_gap() * 10000.0).round() / 10000.0,
        })
    }
}

/// Runs the exact search (`exact::solve`, `time_limit` per computation)
/// from the schedule of every sequential computation of `scheduled` (arena
/// order), callees first; nested computations cost what their schedules
/// cost.
pub fn exact_gaps(
    scheduled: &HloModule,
    model: &dyn CostModel,
    lanes: &[usize; NUM_RESOURCES],
    time_limit: std::time::Duration,
) -> Result<Vec<ComputationGap>, SchedulerError> {
    use crate::calls::{callee_first_order, computation_uses, CompUse};
    use crate::graph::Graph;
    use crate::simulator::simulate_graph;
    let uses = computation_uses(scheduled);
    let mut summaries = vec![None; scheduled.computations.len()];
    let mut gaps = Vec::new();
    for c in callee_first_order(scheduled) {
        if uses.get(c.index()) != Some(&CompUse::Sequential) {
            continue;
        }
        let g = Graph::build(scheduled, c, model, &summaries)?;
        let order: Vec<u32> = (0..g.n as u32).collect();
        let (summary, _) = simulate_graph(&g, &order, lanes, None, false);
        let solved = crate::exact::solve(&g, lanes, &order, time_limit);
        gaps.push(ComputationGap {
            computation: scheduled.computations[c.index()].name.clone(),
            nodes: g.n,
            schedule_us: summary.makespan,
            best_us: solved.makespan,
            bound_us: solved.bound,
            optimal: solved.optimal,
        });
        summaries[c.index()] = Some(summary);
    }
    Ok(gaps)
}
