//! The `combine-collectives` pass: XLA's collective combiners
//! (`xla_spmd_partitioner::combine`: independent all-reduces, all-gathers
//! or reduce-scatters of one kind become one variadic collective, within
//! XLA's GPU thresholds) with the scheduler's cost model deciding which
//! groups to keep. A combined collective pays one launch and one set of
//! latencies, but starts only when its last operand is ready, so it can
//! delay the collectives that were ready first (a backward pass's early
//! gradients) past the compute they would have hidden behind.
//!
//! Every group combined together is tried first (XLA's behaviour); it is
//! kept when the simulated step of the whole module gets at least
//! `MIN_GAIN` shorter. Otherwise the groups are tried one at a time, those
//! whose members the current schedule leaves exposed longest first (then
//! in program order), each kept with those before it when that shortens
//! the step, until `TRIAL_BUDGET` of scheduling time is spent (the first
//! trial is always made).
//!
//! Invariants: results are bitwise those of the uncombined program; the
//! simulated step never gets longer.

use crate::windowed::simulate;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xla_hlo_ir::HloModule;
use xla_hlo_pass::{Pass, PassError};
use xla_latency_hiding_scheduler::cost::CostModel;
use xla_latency_hiding_scheduler::SchedulerConfig;
use xla_spmd_partitioner::combine::{combinable_groups, combine, CombineOptions, Group};

/// Least relative gain of the simulated step for a combination to be kept.
const MIN_GAIN: f64 = 0.001;
/// Scheduling time after which no further trial starts.
const TRIAL_BUDGET: Duration = Duration::from_secs(1);

/// The registered pass.
pub struct CombineCollectives {
    pub options: CombineOptions,
    pub model: Arc<dyn CostModel>,
    pub scheduler: SchedulerConfig,
}

impl Pass for CombineCollectives {
    fn name(&self) -> &str {
        "combine-collectives"
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        let groups = combinable_groups(module, &self.options);
        if groups.is_empty() {
            return Ok(false);
        }
        let started = Instant::now();
        let model = self.model.as_ref();
        let step = |m: &HloModule| -> Result<f64, PassError> {
            Ok(simulate(m, &self.scheduler, model, self.name())?.step_us)
        };
        let combined = |chosen: &[Group]| {
            let mut trial = module.clone();
            combine(&mut trial, chosen);
            trial
        };
        let current = simulate(module, &self.scheduler, model, self.name())?;
        let before = current.step_us;
        let all = combined(&groups);
        let all_step = step(&all)?;
        let mut trials = 1;
        let (kept, best_step, best) = if all_step < before * (1.0 - MIN_GAIN) {
            (groups.len(), all_step, Some(all))
        } else {
            // The groups whose members the compute stream waits for longest
            // first (they can gain the most), then in program order.
            let waited = |group: &Group| -> f64 {
                let comp = &module.computations[group.computation];
                group
                    .members
                    .iter()
                    .filter_map(|&m| {
                        let key = (comp.name.clone(), comp.instr(m).name.clone());
                        current.exposed.get(&key).copied()
                    })
                    .sum()
            };
            let mut order: Vec<(f64, &Group)> = groups.iter().map(|g| (waited(g), g)).collect();
            order.sort_by(|a, b| b.0.total_cmp(&a.0));
            let mut chosen: Vec<Group> = Vec::new();
            let mut best_step = before;
            let mut best = None;
            for (_, group) in order {
                if started.elapsed() > TRIAL_BUDGET {
                    break;
                }
                chosen.push(group.clone());
                let trial = combined(&chosen);
                let trial_step = step(&trial)?;
                trials += 1;
                if trial_step < best_step * (1.0 - MIN_GAIN) {
                    best_step = trial_step;
                    best = Some(trial);
                } else {
                    chosen.pop();
                }
            }
            (chosen.len(), best_step, best)
        };
        log::info!(
            "combine-collectives: {kept} of {} groups combined ({trials} trials, {:.0} ms); simulated step {before:.1} -> {best_step:.1} us",
            groups.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
        match best {
            Some(split) => {
                *module = split;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::windowed::steps_around;

    /// The simulated step without and with `combine-collectives`, and the
    /// all-reduces after it.
    fn steps(text: &str) -> (f64, f64, usize) {
        steps_around(text, "", "combine-collectives")
    }

    const ADD: &str = "%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
";

    /// Four small gradient all-reduces with nothing to hide behind: one
    /// launch instead of four.
    #[test]
    fn combines_gradient_all_reduces_and_the_step_gets_shorter() {
        let text = format!(
            "HloModule grads, num_partitions=8

{ADD}
ENTRY %e (a: f32[256,256], b: f32[256], c: f32[256,64], d: f32[64]) -> (f32[256,256], f32[256], f32[256,64], f32[64]) {{
  %a = f32[256,256] parameter(0)
  %b = f32[256] parameter(1)
  %c = f32[256,64] parameter(2)
  %d = f32[64] parameter(3)
  %ga = f32[256,256] all-reduce(%a), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %gb = f32[256] all-reduce(%b), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %gc = f32[256,64] all-reduce(%c), channel_id=3, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %gd = f32[64] all-reduce(%d), channel_id=4, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  ROOT %t = (f32[256,256], f32[256], f32[256,64], f32[64]) tuple(%ga, %gb, %gc, %gd)
}}
"
        );
        let (before, after, all_reduces) = steps(&text);
        assert_eq!(all_reduces, 1);
        assert!(after < 0.6 * before, "{after:.1} us against {before:.1} us");
    }

    /// A large all-reduce that hides behind a long matmul and a small one
    /// of the matmul's result: combined, the large one would wait for the
    /// matmul and be exposed, so both stay apart.
    #[test]
    fn leaves_apart_a_collective_that_hides_behind_compute() {
        let text = format!(
            "HloModule hides, num_partitions=8

{ADD}
ENTRY %e (a: f32[2048,2048], x: f32[4096,4096], w: f32[4096,4096]) -> (f32[2048,2048], f32[4096]) {{
  %a = f32[2048,2048] parameter(0)
  %x = f32[4096,4096] parameter(1)
  %w = f32[4096,4096] parameter(2)
  %ga = f32[2048,2048] all-reduce(%a), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %h = f32[4096,4096] dot(%x, %w), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  %zero = f32[] constant(0)
  %row = f32[4096] reduce(%h, %zero), dimensions={{1}}, to_apply=%add
  %gr = f32[4096] all-reduce(%row), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  ROOT %t = (f32[2048,2048], f32[4096]) tuple(%ga, %gr)
}}
"
        );
        let module = xla_hlo_parser::parse_module(&text).unwrap();
        let groups = xla_spmd_partitioner::combine::combinable_groups(
            &module,
            &xla_spmd_partitioner::combine::CombineOptions::default(),
        );
        assert_eq!(groups.len(), 1, "the two all-reduces could be combined");
        let (before, after, all_reduces) = steps(&text);
        assert_eq!(all_reduces, 2);
        assert_eq!(after, before);
    }
}
