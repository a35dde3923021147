//! Checks a scheduled module: every computation lists each instruction
//! after its operands and control predecessors (and side-effecting
//! instructions in their original relative order is the scheduler's
//! business, not checked here); every async done follows its start and
//! every start has exactly one done; no resource ever has more operations
//! in flight than its overlap limit (a loop, call or branch that moves
//! data of a kind counts as one more while it runs); the module's peak
//! live bytes stay within the memory limit when one is given.
//!
//! Invariant: validation never panics; it reports every violation found
//! (capped at 100) rather than stopping at the first.

use crate::calls::{computation_uses, CompUse};
use crate::cost::ApproximateCostModel;
use crate::graph::{Graph, NodeKind};
use crate::kinds::{ResourceKind, NUM_RESOURCES};
use crate::simulator::simulate_module;
use std::fmt;
use xla_hlo_ir::{HloModule, InstrId};

/// One broken rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub computation: String,
    pub instruction: String,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "%{} in %{}: {}",
            self.instruction, self.computation, self.message
        )
    }
}

/// What validation found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Validation {
    pub violations: Vec<Violation>,
    /// Peak live bytes of the module (entry, parameters and callees included).
    pub peak_memory_bytes: u64,
    /// Most operations in flight at once, per resource.
    pub max_in_flight: [usize; NUM_RESOURCES],
}

impl Validation {
    pub fn is_valid(&self) -> bool {
        self.violations.is_empty()
    }
}

const MAX_VIOLATIONS: usize = 100;

/// Validates the arena order of every computation of `module`.
pub fn validate_schedule(
    module: &HloModule,
    limits: &[usize; NUM_RESOURCES],
    memory_limit: Option<u64>,
) -> Validation {
    let mut v = Validation::default();
    let push = |v: &mut Validation, comp: &str, instr: &str, message: String| {
        if v.violations.len() < MAX_VIOLATIONS {
            v.violations.push(Violation {
                computation: comp.to_string(),
                instruction: instr.to_string(),
                message,
            });
        }
    };
    if !module.config.is_scheduled {
        push(
            &mut v,
            "",
            &module.name,
            "the module is not marked is_scheduled=true".into(),
        );
    }
    let uses = computation_uses(module);
    let model = ApproximateCostModel;
    // Callee summaries tell which resources loops and calls use.
    let sim = simulate_module(module, &model, limits, false).ok();
    let summaries: &[Option<crate::graph::CompSummary>] =
        sim.as_ref().map_or(&[], |s| s.summaries.as_slice());
    for (ci, comp) in module.computations.iter().enumerate() {
        let n = comp.instructions.len();
        for (i, instr) in comp.instructions.iter().enumerate() {
            for o in instr.operands.iter().chain(&instr.control_predecessors) {
                if o.index() >= i {
                    let what = comp
                        .instructions
                        .get(o.index())
                        .map_or_else(|| format!("{o}"), |x| x.name.clone());
                    push(
                        &mut v,
                        &comp.name,
                        &instr.name,
                        format!("placed before its dependency %{what}"),
                    );
                }
            }
        }
        if uses.get(ci) != Some(&CompUse::Sequential) {
            continue;
        }
        let Ok(g) = Graph::build(module, xla_hlo_ir::CompId(ci as u32), &model, summaries) else {
            push(
                &mut v,
                &comp.name,
                "",
                "cannot build the dependency graph (cycle)".into(),
            );
            continue;
        };
        // Pairing.
        let mut dones_of_start = vec![0usize; n];
        for i in 0..n {
            if g.kind[i] == NodeKind::Done {
                dones_of_start[g.pair[i] as usize] += 1;
            }
        }
        for (i, &dones) in dones_of_start.iter().enumerate() {
            let role = crate::kinds::async_role(module, comp, InstrId(i as u32));
            match role {
                Some(crate::kinds::AsyncRole::Start(_)) if g.kind[i] != NodeKind::Start => {
                    push(
                        &mut v,
                        &comp.name,
                        &comp.instructions[i].name,
                        "async start without a done".into(),
                    );
                }
                Some(crate::kinds::AsyncRole::Done(_)) if g.kind[i] != NodeKind::Done => {
                    push(
                        &mut v,
                        &comp.name,
                        &comp.instructions[i].name,
                        "async done without its start".into(),
                    );
                }
                _ => {}
            }
            if g.kind[i] == NodeKind::Start && dones != 1 {
                push(
                    &mut v,
                    &comp.name,
                    &comp.instructions[i].name,
                    format!("async start with {dones} dones"),
                );
            }
        }
        // Overlap limits.
        let mut inflight = [0usize; NUM_RESOURCES];
        for i in 0..n {
            let Some(r) = g.resource[i] else { continue };
            let r = r.index();
            match g.kind[i] {
                NodeKind::Start => {
                    inflight[r] += 1;
                    v.max_in_flight[r] = v.max_in_flight[r].max(inflight[r]);
                    if inflight[r] > limits[r].max(1) {
                        push(
                            &mut v,
                            &comp.name,
                            &comp.instructions[i].name,
                            format!(
                                "{} {} operations in flight, over the limit of {}",
                                inflight[r],
                                ResourceKind::ALL[r].name(),
                                limits[r].max(1)
                            ),
                        );
                    }
                }
                NodeKind::Done => inflight[r] = inflight[r].saturating_sub(1),
                _ => {}
            }
        }
        // A loop, call or branch that moves data of a kind is one more
        // operation of that kind while it runs.
        let mut inflight = [0usize; NUM_RESOURCES];
        for i in 0..n {
            match (g.kind[i], g.resource[i]) {
                (NodeKind::Start, Some(r)) => inflight[r.index()] += 1,
                (NodeKind::Done, Some(r)) => {
                    inflight[r.index()] = inflight[r.index()].saturating_sub(1)
                }
                _ => {}
            }
            let mask = g.nested_resources[i];
            for r in 0..NUM_RESOURCES {
                if mask & (1 << r) != 0 && inflight[r] + 1 > limits[r].max(1) {
                    push(
                        &mut v,
                        &comp.name,
                        &comp.instructions[i].name,
                        format!(
                            "runs {} transfers while {} {} operations are in flight, over the limit of {}",
                            ResourceKind::ALL[r].name(),
                            inflight[r],
                            ResourceKind::ALL[r].name(),
                            limits[r].max(1)
                        ),
                    );
                }
            }
        }
    }
    if let Some(sim) = &sim {
        v.peak_memory_bytes = sim.entry.peak_total;
        if let Some(limit) = memory_limit {
            if sim.entry.peak_total > limit {
                push(
                    &mut v,
                    &module.entry_computation().name,
                    "",
                    format!(
                        "peak memory {} bytes exceeds the limit of {limit}",
                        sim.entry.peak_total
                    ),
                );
            }
        }
    }
    v
}
