//! `windowed-einsum` with the scheduler's cost model deciding (`by_cost`):
//! of the pairs the partitioner could window (over the threshold), only
//! those whose collective the current schedule leaves exposed (the compute
//! stream waits for it once the module is scheduled and simulated) and
//! whose loop is estimated faster than the dot and the collective are
//! windowed.
//!
//! The estimate, per pair, from the cost model's own figures: before, the
//! dot's compute plus the collective's transfer (the dot is the
//! collective's only user or operand, so neither can hide the other);
//! after, each of the loop's `n - 1` iterations takes the longer of its
//! body's compute and its permute (they are independent in the body, and
//! the latency-hiding scheduler overlaps them), plus the peeled step's
//! compute (as much as one body's). A bidirectional loop's body holds two
//! steps; around it run the own window's dot beside the first two permutes
//! and the peeled steps (up to one and a half bodies of compute). Windows
//! are taken from a trial copy of the module with every eligible pair
//! windowed.
//!
//! The choice is then checked on the whole module: both versions are
//! scheduled by the latency-hiding scheduler and simulated under the same
//! model, and the windowed one is kept only when its step is shorter (a
//! collective the estimate counts as exposed may already hide behind other
//! work).
//!
//! Invariants: with `by_cost` off the pass is exactly the partitioner's
//! `windowed_einsum` (XLA's threshold semantics: 0 windows wherever legal);
//! with it on, the simulated step never gets longer.

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;
use xla_hlo_ir::{HloComputation, HloModule, InstrId};
use xla_hlo_pass::{Pass, PassError};
use xla_latency_hiding_scheduler::cost::{CostModel, Op};
use xla_latency_hiding_scheduler::kinds::CollectiveInfo;
use xla_latency_hiding_scheduler::{schedule_module, simulate_module, SchedulerConfig};
use xla_spmd_partitioner::windowed_einsum::{
    windowed_einsum, windowed_einsum_where, WindowedEinsumOptions, WindowedLoop,
};

/// The registered `windowed-einsum` pass.
pub struct WindowedEinsumPass {
    pub options: WindowedEinsumOptions,
    /// Window only the pairs the cost model says pay.
    pub by_cost: bool,
    pub model: Arc<dyn CostModel>,
    /// The scheduler that checks the choice (`by_cost`).
    pub scheduler: SchedulerConfig,
}

impl Pass for WindowedEinsumPass {
    fn name(&self) -> &str {
        "windowed-einsum"
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        let stats = if self.by_cost {
            let mut trial = module.clone();
            let every = windowed_einsum(&mut trial, &self.options);
            if every.loops.is_empty() {
                return Ok(false);
            }
            let current = simulate(module, &self.scheduler, self.model.as_ref(), self.name())?;
            let paying: FxHashSet<(usize, InstrId)> = every
                .loops
                .iter()
                .filter(|l| {
                    let comp = &module.computations[l.computation];
                    let name = &comp.instr(l.collective).name;
                    current
                        .exposed
                        .contains_key(&(comp.name.clone(), name.clone()))
                })
                .filter(|l| pays(module, &trial, l, self.model.as_ref()))
                .map(|l| (l.computation, l.dot))
                .collect();
            log::info!(
                "windowed-einsum: {} of {} eligible pairs pay under {}",
                paying.len(),
                every.loops.len(),
                self.model.name()
            );
            if paying.is_empty() {
                return Ok(false);
            }
            let mut windowed = module.clone();
            let stats = windowed_einsum_where(&mut windowed, &self.options, |comp, dot| {
                paying.contains(&(comp, dot))
            });
            let before = current.step_us;
            let after =
                simulate(&windowed, &self.scheduler, self.model.as_ref(), self.name())?.step_us;
            if after >= before {
                log::info!(
                    "windowed-einsum: not applied: the simulated step would take {after:.1} us, not {before:.1} us"
                );
                return Ok(false);
            }
            log::info!("windowed-einsum: simulated step {before:.1} -> {after:.1} us");
            *module = windowed;
            stats
        } else {
            windowed_einsum(module, &self.options)
        };
        if !stats.loops.is_empty() {
            log::info!(
                "windowed-einsum: {} all-gather-then-dot and {} dot-then-reduce-scatter pairs became loops",
                stats.all_gather_loops,
                stats.reduce_scatter_loops
            );
        }
        Ok(!stats.loops.is_empty())
    }
}

/// What scheduling and simulating a module shows the overlap passes.
pub(crate) struct Simulated {
    /// The step time (µs).
    pub step_us: f64,
    /// `(computation name, collective name)` of every collective whose
    /// done the compute stream waits for (the async pair the scheduler
    /// makes of collective `X` is `X-start`/`X-done`), with how long it
    /// waits in one execution of the computation (µs).
    pub exposed: FxHashMap<(String, String), f64>,
}

/// For the overlap passes' tests: `text` after the passes `prepare`
/// (comma-separated; none when empty), its simulated step before and after
/// `pass`, and the all-reduces left.
#[cfg(test)]
pub(crate) fn steps_around(text: &str, prepare: &str, pass: &str) -> (f64, f64, usize) {
    let options = crate::PipelineOptions::default();
    let mut module = xla_hlo_parser::parse_module(text).unwrap();
    if !prepare.is_empty() {
        crate::pipeline(&options, "t", prepare)
            .unwrap()
            .run(&mut module)
            .unwrap();
    }
    let step = |m: &HloModule| {
        simulate(m, &options.scheduler, options.cost_model.as_ref(), "t")
            .unwrap()
            .step_us
    };
    let before = step(&module);
    crate::pipeline(&options, "t", pass)
        .unwrap()
        .run(&mut module)
        .unwrap();
    let all_reduces = module
        .computations
        .iter()
        .flat_map(|c| &c.instructions)
        .filter(|i| i.opcode == xla_hlo_ir::Opcode::AllReduce)
        .count();
    (before, step(&module), all_reduces)
}

/// Schedules a copy of `module` with the latency-hiding scheduler and
/// simulates it; errors name `pass`.
pub(crate) fn simulate(
    module: &HloModule,
    scheduler: &SchedulerConfig,
    model: &dyn CostModel,
    pass: &str,
) -> Result<Simulated, PassError> {
    let failed = |e: xla_latency_hiding_scheduler::SchedulerError| PassError::Failed {
        pass: pass.into(),
        message: e.to_string(),
    };
    let mut scheduled = module.clone();
    schedule_module(&mut scheduled, scheduler, model).map_err(failed)?;
    let simulation =
        simulate_module(&scheduled, model, &scheduler.overlap_limits, true).map_err(failed)?;
    let mut exposed = FxHashMap::default();
    for timeline in &simulation.timelines {
        let computation = timeline
            .computation
            .strip_suffix(" (one execution)")
            .unwrap_or(&timeline.computation);
        for event in timeline.events.iter().filter(|e| e.category == "exposed") {
            let done = event.name.strip_prefix("wait ").unwrap_or(&event.name);
            let collective = done.strip_suffix("-done").unwrap_or(done);
            *exposed
                .entry((computation.to_string(), collective.to_string()))
                .or_insert(0.0) += event.dur_us;
        }
    }
    Ok(Simulated {
        step_us: simulation.entry.makespan,
        exposed,
    })
}

/// Compute and transfer time of `id` in `comp` (µs).
fn cost(
    model: &dyn CostModel,
    module: &HloModule,
    comp: &HloComputation,
    id: InstrId,
) -> (f64, f64) {
    let op = Op::new(module, comp, id);
    match CollectiveInfo::of(module, comp, id) {
        Some(info) => (0.0, model.transfer_us(op, &info)),
        None => (model.compute_us(op), 0.0),
    }
}

/// Whether the loop `windowed` (in `trial`) is estimated faster than its
/// dot and collective in `module`.
fn pays(
    module: &HloModule,
    trial: &HloModule,
    windowed: &WindowedLoop,
    model: &dyn CostModel,
) -> bool {
    let Some(comp) = module.computations.get(windowed.computation) else {
        return false;
    };
    let (dot, _) = cost(model, module, comp, windowed.dot);
    let (_, collective) = cost(model, module, comp, windowed.collective);
    let before = dot + collective;
    let Some(body) = trial.computations.iter().find(|c| c.name == windowed.body) else {
        return false;
    };
    let (mut compute, mut transfer) = (0.0, 0.0);
    for index in 0..body.instructions.len() {
        let (c, t) = cost(model, trial, body, InstrId(index as u32));
        compute += c;
        transfer += t;
    }
    let iterations = windowed.trip_count as f64 * f64::max(compute, transfer);
    let after = if windowed.bidirectional {
        f64::max(compute / 2.0, transfer) + iterations + 1.5 * compute
    } else {
        iterations + compute
    };
    after < before
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{pipeline, PipelineOptions};

    /// A Megatron layer with sequence parallelism over 8 devices:
    /// all-gather of the activations before the column-parallel matmul,
    /// reduce-scatter after the row-parallel one, over `sequence` rows.
    fn layer(sequence: i64) -> String {
        format!(
            "HloModule tp, num_partitions=8

ENTRY %e (x: bf16[{sequence},4096], w: bf16[4096,16384], v: bf16[16384,4096]) -> bf16[{sequence},4096] {{
  %x = bf16[{sequence},4096] parameter(0), sharding={{devices=[8,1]<=[8]}}
  %w = bf16[4096,16384] parameter(1), sharding={{devices=[1,8]<=[8]}}
  %v = bf16[16384,4096] parameter(2), sharding={{devices=[8,1]<=[8]}}
  %h = bf16[{sequence},16384] dot(%x, %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{devices=[1,8]<=[8]}}
  ROOT %y = bf16[{sequence},4096] dot(%h, %v), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{devices=[8,1]<=[8]}}
}}
"
        )
    }

    /// The simulated step of `text` partitioned, optionally windowed by
    /// cost, and scheduled; and whether windowing changed the module.
    fn step(text: &str, by_cost: bool) -> (f64, usize) {
        let options = PipelineOptions {
            windowed_einsum: WindowedEinsumOptions {
                threshold_mib: by_cost.then_some(0.0),
                ..Default::default()
            },
            windowed_einsum_by_cost: by_cost,
            ..Default::default()
        };
        let mut module = xla_hlo_parser::parse_module(text).unwrap();
        let passes = if by_cost {
            "sharding-propagation,spmd-partitioning,windowed-einsum"
        } else {
            "sharding-propagation,spmd-partitioning"
        };
        pipeline(&options, "t", passes)
            .unwrap()
            .run(&mut module)
            .unwrap();
        let loops = module
            .computations
            .iter()
            .flat_map(|c| &c.instructions)
            .filter(|i| i.opcode == xla_hlo_ir::Opcode::While)
            .count();
        let step = simulate(
            &module,
            &options.scheduler,
            options.cost_model.as_ref(),
            "t",
        );
        (step.unwrap().step_us, loops)
    }

    #[test]
    fn windows_a_large_tensor_parallel_layer_and_its_step_gets_shorter() {
        let text = layer(8192);
        let (plain, plain_loops) = step(&text, false);
        let (windowed, loops) = step(&text, true);
        assert_eq!(plain_loops, 0);
        assert_eq!(loops, 2, "both the all-gather and the reduce-scatter pay");
        assert!(
            windowed < 0.85 * plain,
            "windowed {windowed:.1} us against {plain:.1} us"
        );
    }

    #[test]
    fn leaves_a_small_layer_whole_where_windows_would_not_pay() {
        // 64 rows: each window's permute pays its latency for a few rows.
        let text = layer(64);
        let (plain, _) = step(&text, false);
        let (after, loops) = step(&text, true);
        assert_eq!(loops, 0);
        assert_eq!(after, plain);
    }
}
