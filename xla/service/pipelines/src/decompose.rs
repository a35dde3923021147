//! The `decompose-collectives` pass (Concerto's decomposition): each
//! collective paired with the dot that produces or consumes it
//! (`xla_spmd_partitioner::decompose`) is split into the number of chunks
//! `k` (2, 4 or 8, dividing the chunked dimension) the cost model says is
//! fastest, or left whole when no split pays.
//!
//! The estimate, per pair, from the cost model's figures: whole, the dot
//! plus the collective (neither can hide the other); in `k` chunks, a
//! pipeline of `k` dots of 1/k the work and `k` collectives of 1/k the
//! bytes (each paying the collective's latency again), `d + (k - 1) *
//! max(d, c) + c`. A split must gain 2% to be taken. The plan is then
//! checked on the whole module: both versions are scheduled and simulated,
//! and the split one is kept only when its step is shorter.
//!
//! Invariants: results are bitwise those of the unsplit program (see the
//! partitioner's `decompose`); the simulated step never gets longer.

use crate::windowed::{cost, simulated_step_us};
use std::sync::Arc;
use xla_hlo_ir::HloModule;
use xla_hlo_pass::{Pass, PassError};
use xla_latency_hiding_scheduler::cost::{CostModel, Op};
use xla_latency_hiding_scheduler::kinds::CollectiveInfo;
use xla_latency_hiding_scheduler::SchedulerConfig;
use xla_spmd_partitioner::decompose::{candidates, decompose, Candidate};

/// Chunk counts tried.
const CHUNKS: [i64; 3] = [2, 4, 8];
/// Least relative gain of the estimate for a split.
const MIN_GAIN: f64 = 0.02;

/// The registered pass.
pub struct DecomposeCollectives {
    pub model: Arc<dyn CostModel>,
    pub scheduler: SchedulerConfig,
}

impl Pass for DecomposeCollectives {
    fn name(&self) -> &str {
        "decompose-collectives"
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        let all = candidates(module);
        let plan: Vec<(Candidate, i64)> = all
            .iter()
            .filter_map(|c| best_chunks(module, c, self.model.as_ref()).map(|k| (c.clone(), k)))
            .collect();
        log::info!(
            "decompose-collectives: {} of {} collective-and-dot pairs pay to split under {}",
            plan.len(),
            all.len(),
            self.model.name()
        );
        if plan.is_empty() {
            return Ok(false);
        }
        let mut split = module.clone();
        let count = decompose(&mut split, &plan);
        let step = |m: &HloModule| {
            simulated_step_us(
                m,
                &self.scheduler,
                self.model.as_ref(),
                "decompose-collectives",
            )
        };
        let (before, after) = (step(module)?, step(&split)?);
        if after >= before {
            log::info!(
                "decompose-collectives: not applied: the simulated step would take {after:.1} us, not {before:.1} us"
            );
            return Ok(false);
        }
        log::info!(
            "decompose-collectives: {count} pairs split; simulated step {before:.1} -> {after:.1} us"
        );
        *module = split;
        Ok(count > 0)
    }
}

/// The chunk count the estimate prefers for `candidate`, if any pays.
fn best_chunks(module: &HloModule, candidate: &Candidate, model: &dyn CostModel) -> Option<i64> {
    let comp = module.computations.get(candidate.computation)?;
    let (dot, _) = cost(model, module, comp, candidate.dot);
    let info = CollectiveInfo::of(module, comp, candidate.collective)?;
    let whole = model.transfer_us(Op::new(module, comp, candidate.collective), &info);
    let before = dot + whole;
    let mut best: Option<(i64, f64)> = None;
    for k in CHUNKS {
        if candidate.size % k != 0 {
            continue;
        }
        let chunk_info = CollectiveInfo {
            bytes_in: info.bytes_in / k as u64,
            bytes_out: info.bytes_out / k as u64,
            ..info.clone()
        };
        let c = model.transfer_us(Op::new(module, comp, candidate.collective), &chunk_info);
        let d = dot / k as f64;
        let after = d + (k - 1) as f64 * d.max(c) + c;
        if after < before * (1.0 - MIN_GAIN) && best.is_none_or(|(_, t)| after < t) {
            best = Some((k, after));
        }
    }
    best.map(|(k, _)| k)
}
