//! The `decompose-collectives` pass (Concerto's decomposition): each
//! collective paired with the dot that produces or consumes it
//! (`xla_spmd_partitioner::decompose`, which also splits the chain of work
//! after it) and left exposed by the current schedule (the compute stream
//! waits for it once the module is scheduled and simulated: Concerto's
//! critical-path collectives) is split into the number of chunks `k` (2, 4
//! or 8, dividing the chunked dimension) that makes the simulated step
//! shortest, or left whole when no split shortens it.
//!
//! The choice is made by the scheduler and simulator themselves: the
//! collectives are tried in order of the time the compute stream waits
//! for them and for the exposed collectives in their chains (a split that
//! hides two goes first), each with `k` = 2, then 4 while that was better, then 8,
//! together with the splits already taken, first with the work producing
//! it (its prologue), then with shorter prologues and without, and with
//! shorter chains (the shortest prefix of the chain, or suffix of the
//! prologue, whose unsplit compute covers the collective's transfer once
//! and twice: `COVER`, see `variants`), then along its other dimensions
//! (`candidate_ways`: splitting a row-parallel projection along its output
//! features reads each weight once, where splitting a small batch of
//! tokens rereads them all); a split is taken when the
//! simulated step of the whole module gets at least `MIN_GAIN` shorter.
//! Collectives tried before a later split was taken are tried again in a
//! further round (up to `MAX_ROUNDS`), on the program as now split.
//! The trials stop after `TRIAL_BUDGET` of scheduling time (the first is
//! always made), so a large module costs a bounded number of schedules.
//! A simple pipeline formula could not make this choice: the chain after a
//! collective may hold the next collective, and splitting adds compute
//! (smaller dots reread their operands; slices, concatenations, kernel
//! overheads) that only the cost model on the split program counts.
//!
//! Invariants: results are bitwise those of the unsplit program (see the
//! partitioner's `decompose`); the simulated step never gets longer.

use crate::windowed::simulate;
use std::sync::Arc;
use std::time::{Duration, Instant};
use xla_hlo_ir::HloModule;
use xla_hlo_pass::{Pass, PassError};
use xla_latency_hiding_scheduler::cost::{CostModel, Op};
use xla_latency_hiding_scheduler::kinds::CollectiveInfo;
use xla_latency_hiding_scheduler::SchedulerConfig;
use xla_spmd_partitioner::decompose::{candidate_ways, decompose, Candidate};

/// Chunk counts tried, in order.
const CHUNKS: [i64; 3] = [2, 4, 8];
/// Least relative gain of the simulated step for a split to be taken.
const MIN_GAIN: f64 = 0.001;
/// Rounds over the exposed collectives (a round that takes no split ends
/// the search).
const MAX_ROUNDS: usize = 3;
/// Scheduling time after which no further trial starts.
const TRIAL_BUDGET: Duration = Duration::from_secs(1);

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
        let all = candidate_ways(module);
        if all.is_empty() {
            return Ok(false);
        }
        let started = Instant::now();
        let model = self.model.as_ref();
        let current = simulate(module, &self.scheduler, model, self.name())?;
        // Exposed collectives, by the wait their split can hide: their own
        // and that of the exposed collectives in their chain.
        let mut exposed: Vec<(&[Candidate], f64)> = all
            .iter()
            .filter_map(|ways| {
                let c = &ways[0];
                let comp = &module.computations[c.computation];
                let wait = |id: xla_hlo_ir::InstrId| {
                    let key = (comp.name.clone(), comp.instr(id).name.clone());
                    current.exposed.get(&key).copied()
                };
                let own = wait(c.collective)?;
                let chained: f64 = c.chain.iter().filter_map(|&(op, _)| wait(op)).sum();
                Some((ways.as_slice(), own + chained))
            })
            .collect();
        exposed.sort_by(|a, b| b.1.total_cmp(&a.1));
        let before = current.step_us;
        let mut best_step = before;
        let mut plan: Vec<(Candidate, i64)> = Vec::new();
        // The module split by `plan` (the best trial so far).
        let mut best_module: Option<HloModule> = None;
        let mut trials = 0;
        // For each candidate, the number of splits taken when it was last
        // tried: a candidate tried before later splits were taken is tried
        // again in the next round, since the split program hides less or
        // more than the one it was tried on.
        let mut tried_with: Vec<Option<usize>> = vec![None; exposed.len()];
        'rounds: for _round in 0..MAX_ROUNDS {
            let taken_before = plan.len();
            'candidates: for (index, (ways, _)) in exposed.iter().enumerate() {
                let candidate = &ways[0];
                if tried_with[index] == Some(plan.len())
                    || plan.iter().any(|(c, _)| {
                        c.computation == candidate.computation
                            && c.collective == candidate.collective
                    })
                {
                    continue;
                }
                tried_with[index] = Some(plan.len());
                // The preferred dimension's variants, then the other
                // dimensions', each once.
                let mut variants: Vec<Candidate> = Vec::new();
                for way in ways.iter() {
                    for variant in self::variants(module, way, model) {
                        if !variants.contains(&variant) {
                            variants.push(variant);
                        }
                    }
                }
                let mut taken: Option<(Candidate, i64, f64, HloModule)> = None;
                for variant in variants {
                    for k in CHUNKS.into_iter().filter(|k| variant.size % k == 0) {
                        if trials > 0 && started.elapsed() > TRIAL_BUDGET {
                            break 'rounds;
                        }
                        trials += 1;
                        let mut trial_plan = plan.clone();
                        trial_plan.push((variant.clone(), k));
                        let mut trial = module.clone();
                        if decompose(&mut trial, &trial_plan) < trial_plan.len() {
                            // Its dot or collective is in a split already taken.
                            continue 'candidates;
                        }
                        let step = simulate(&trial, &self.scheduler, model, self.name())?.step_us;
                        log::debug!(
                            "decompose-collectives: %{} (chain of {} ops, prologue of {}) in {k} chunks: simulated step {step:.1} us",
                            module.computations[variant.computation]
                                .instr(variant.collective)
                                .name,
                            variant.chain.len(),
                            variant.prologue.len()
                        );
                        let reference = taken.as_ref().map_or(best_step, |(_, _, s, _)| *s);
                        if step < reference * (1.0 - MIN_GAIN) {
                            taken = Some((variant.clone(), k, step, trial));
                        } else {
                            break;
                        }
                    }
                }
                if let Some((variant, k, step, split)) = taken {
                    plan.push((variant, k));
                    best_step = step;
                    best_module = Some(split);
                }
            }
            if plan.len() == taken_before {
                break;
            }
        }
        log::info!(
            "decompose-collectives: {} of {} exposed collectives split ({trials} trials, {:.0} ms); simulated step {before:.1} -> {best_step:.1} us",
            plan.len(),
            exposed.len(),
            started.elapsed().as_secs_f64() * 1e3
        );
        let Some(split) = best_module else {
            return Ok(false);
        };
        *module = split;
        Ok(true)
    }
}

/// Shorter chains and prologues tried besides the whole ones: the
/// shortest whose unsplit compute is at least this many times the
/// collective's transfer.
const COVER: [f64; 2] = [1.0, 2.0];

/// The splits of `candidate` tried, in order: with its whole chain and its
/// prologue, its shorter prologues, and none (the prologue's extra kernels
/// may cost more than the overlap they buy); then each shorter chain with
/// the whole prologue and with none.
///
/// A prefix of the chain (in program order) is itself a chain, its values
/// used by later ops concatenated back; a suffix of the prologue is itself
/// a prologue, its first ops' operands sliced from whole values. Chunk
/// `i`'s chain (or chunk `i + 1`'s prologue) only has to outlast chunk
/// `i`'s collective to hide it, and every op split beyond that adds
/// kernels and operand rereads.
fn variants(module: &HloModule, candidate: &Candidate, model: &dyn CostModel) -> Vec<Candidate> {
    let comp = &module.computations[candidate.computation];
    let users = comp.users();
    let cost = |op| model.compute_us(Op::with_users(module, comp, op, &users));
    let transfer = CollectiveInfo::of(module, comp, candidate.collective).map(|info| {
        model.transfer_us(
            Op::with_users(module, comp, candidate.collective, &users),
            &info,
        )
    });
    let (chains, prologues) = match transfer {
        Some(transfer) => (
            covering_lengths(candidate.chain.iter().map(|&(op, _)| cost(op)), transfer),
            covering_lengths(
                candidate.prologue.iter().rev().map(|p| cost(p.op)),
                transfer,
            ),
        ),
        None => (Vec::new(), Vec::new()),
    };
    let with = |chain: usize, prologue: usize| Candidate {
        chain: candidate.chain[..chain].to_vec(),
        prologue: candidate.prologue[candidate.prologue.len() - prologue..].to_vec(),
        ..candidate.clone()
    };
    let (whole_chain, whole_prologue) = (candidate.chain.len(), candidate.prologue.len());
    let mut out = vec![with(whole_chain, whole_prologue)];
    if whole_prologue > 0 {
        out.extend(prologues.iter().map(|&p| with(whole_chain, p)));
        out.push(with(whole_chain, 0));
    }
    for &c in &chains {
        out.push(with(c, whole_prologue));
        if whole_prologue > 0 {
            out.push(with(c, 0));
        }
    }
    out
}

/// For ops costing `costs` (µs, in the order they are taken), the
/// shortest counts whose total reaches each `COVER` multiple of
/// `transfer`, shorter than all of them and without repeats.
fn covering_lengths(costs: impl Iterator<Item = f64>, transfer: f64) -> Vec<usize> {
    let mut totals = Vec::new();
    let mut total = 0.0;
    for c in costs {
        total += c;
        totals.push(total);
    }
    let mut lengths = Vec::new();
    for factor in COVER {
        if let Some(at) = totals.iter().position(|&t| t >= factor * transfer) {
            if at + 1 < totals.len() && !lengths.contains(&(at + 1)) {
                lengths.push(at + 1);
            }
        }
    }
    lengths
}

#[cfg(test)]
mod tests {
    use crate::windowed::steps_around;

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
        steps_around(
            text,
            "sharding-propagation,spmd-partitioning",
            "decompose-collectives",
        )
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

    /// Two such MLP blocks with a residual connection: the first block's
    /// all-reduce feeds the second block, whose dots can hide it only when
    /// they are split with it (the chain).
    fn two_blocks(rows: i64) -> String {
        format!(
            "HloModule tp2, num_partitions=8

ENTRY %e (x: bf16[{rows},4096], w1: bf16[4096,16384], w2: bf16[16384,4096], w3: bf16[4096,16384], w4: bf16[16384,4096]) -> bf16[{rows},4096] {{
  %x = bf16[{rows},4096] parameter(0), sharding={{replicated}}
  %w1 = bf16[4096,16384] parameter(1), sharding={{devices=[1,8]<=[8]}}
  %w2 = bf16[16384,4096] parameter(2), sharding={{devices=[8,1]<=[8]}}
  %w3 = bf16[4096,16384] parameter(3), sharding={{devices=[1,8]<=[8]}}
  %w4 = bf16[16384,4096] parameter(4), sharding={{devices=[8,1]<=[8]}}
  %h1 = bf16[{rows},16384] dot(%x, %w1), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{devices=[1,8]<=[8]}}
  %y1 = bf16[{rows},4096] dot(%h1, %w2), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{replicated}}
  %r1 = bf16[{rows},4096] add(%x, %y1), sharding={{replicated}}
  %h2 = bf16[{rows},16384] dot(%r1, %w3), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{devices=[1,8]<=[8]}}
  %y2 = bf16[{rows},4096] dot(%h2, %w4), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{replicated}}
  ROOT %r2 = bf16[{rows},4096] add(%r1, %y2), sharding={{replicated}}
}}
"
        )
    }

    #[test]
    fn splits_the_next_block_with_an_all_reduce_and_hides_it() {
        let (before, after, all_reduces) = steps(&two_blocks(2048));
        eprintln!("two blocks: {before:.1} -> {after:.1} us, {all_reduces} all-reduces");
        assert!(all_reduces >= 4, "{all_reduces} all-reduces");
        assert!(after < 0.9 * before, "{after:.1} us against {before:.1} us");
    }

    #[test]
    fn leaves_a_small_all_reduce_whole() {
        let (before, after, all_reduces) = steps(&layer(16));
        assert_eq!(all_reduces, 1);
        assert_eq!(after, before);
    }
}
