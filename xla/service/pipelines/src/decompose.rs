//! The `decompose-collectives` pass (Concerto's decomposition): each
//! collective paired with the dot that produces or consumes it
//! (`xla_spmd_partitioner::decompose`) and left exposed by the current
//! schedule (the compute stream waits for it once the module is scheduled
//! and simulated: Concerto's critical-path collectives) is split into the
//! number of chunks `k` (2, 4 or 8, dividing the chunked dimension) the
//! cost model says is fastest, or left whole when no split pays.
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

use crate::windowed::{cost, simulate};
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
        if all.is_empty() {
            return Ok(false);
        }
        let current = simulate(module, &self.scheduler, self.model.as_ref(), self.name())?;
        let plan: Vec<(Candidate, i64)> = all
            .iter()
            .filter(|c| {
                let comp = &module.computations[c.computation];
                current
                    .exposed
                    .contains(&(comp.name.clone(), comp.instr(c.collective).name.clone()))
            })
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
        let before = current.step_us;
        let after = simulate(&split, &self.scheduler, self.model.as_ref(), self.name())?.step_us;
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

#[cfg(test)]
mod tests {
    use crate::windowed::simulate;
    use crate::{pipeline, PipelineOptions};

    /// A Megatron MLP over 8 devices without sequence parallelism: the
    /// row-parallel matmul's partial sums are all-reduced.
    fn layer(rows: i64) -> String {
        format!(
            "HloModule tp, num_partitions=8

ENTRY %e (x: bf16[{rows},4096], w: bf16[4096,16384], v: bf16[16384,4096]) -> bf16[{rows},4096] {{
  %x = bf16[{rows},4096] parameter(0), sharding={{replicated}}
  %w = bf16[4096,16384] parameter(1), sharding={{devices=[1,8]<=[8]}}
  %v = bf16[16384,4096] parameter(2), sharding={{devices=[8,1]<=[8]}}
  %h = bf16[{rows},16384] dot(%x, %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{devices=[1,8]<=[8]}}
  ROOT %y = bf16[{rows},4096] dot(%h, %v), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{replicated}}
}}
"
        )
    }

    /// The simulated step without and with `decompose-collectives`, and
    /// the all-reduces after it.
    fn steps(text: &str) -> (f64, f64, usize) {
        let options = PipelineOptions::default();
        let mut module = xla_hlo_parser::parse_module(text).unwrap();
        pipeline(&options, "t", "sharding-propagation,spmd-partitioning")
            .unwrap()
            .run(&mut module)
            .unwrap();
        let step = |m: &xla_hlo_ir::HloModule| {
            simulate(m, &options.scheduler, options.cost_model.as_ref(), "t")
                .unwrap()
                .step_us
        };
        let before = step(&module);
        pipeline(&options, "t", "decompose-collectives")
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

    #[test]
    fn splits_a_large_all_reduce_and_the_step_gets_shorter() {
        let (before, after, all_reduces) = steps(&layer(8192));
        assert!(all_reduces >= 2, "{all_reduces} all-reduces");
        assert!(
            after < 0.95 * before,
            "{after:.1} us against {before:.1} us"
        );
    }

    #[test]
    fn leaves_a_small_all_reduce_whole() {
        let (before, after, all_reduces) = steps(&layer(16));
        assert_eq!(all_reduces, 1);
        assert_eq!(after, before);
    }
}
