//! The `latency-hiding-scheduler` pass: optionally converts collectives
//! to async pairs, schedules every sequential computation (callees first,
//! so a loop's cost is its scheduled body's) and writes each schedule as
//! the computation's arena order with `is_scheduled=true`.
//!
//! Memory: with a limit, the module's peak live bytes are computed after
//! scheduling; when over the limit, every computation is rescheduled with
//! memory pressure (least-memory choices, so less overlap) starting
//! earlier (thresholds 0.9, 0.75, 0.5, 0.25, 0 of the limit), and last in
//! the input order without overlap. If no level fits,
//! the pass fails with `SchedulerError::MemoryLimit` and the module is
//! left as it was (after conversion).
//!
//! Invariants: the module is only reordered when every computation was
//! scheduled (all or nothing); the result passes `validate_schedule` with
//! the same limits; `changed` is reported exactly.

use crate::calls::{callee_first_order, computation_uses, CompUse};
use crate::convert::{convert_collectives, AsyncConversionConfig};
use crate::cost::CostModel;
use crate::error::SchedulerError;
use crate::graph::{topological_order, CompSummary, Graph};
use crate::kinds::{ResourceKind, NUM_RESOURCES};
use crate::scheduler::{schedule_graph, MemoryPolicy, PressureOrder, Priority};
use crate::simulator::{peak_total_of, simulate_graph, PrefixReplay};
use std::sync::Arc;
use std::time::Instant;
use xla_hlo_ir::{HloComputation, HloModule, InstrId};
use xla_hlo_pass::{Pass, PassError};

/// `Priority::Auto` keeps the async-depth schedule when it is shorter and
/// holds no more memory, or when it is this much shorter whatever it holds.
pub const AUTO_GAIN: f64 = 0.02;

/// Scheduler settings (XLA's `SchedulerConfig`, reduced).
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerConfig {
    /// Async operations of one resource allowed in flight at once
    /// (XLA's `*_overlap_limit`, default 1 each).
    pub overlap_limits: [usize; NUM_RESOURCES],
    /// Peak live bytes allowed (parameters included); `None` = unlimited.
    pub memory_limit: Option<u64>,
    /// Pressure thresholds (fractions of the limit) tried in turn when a
    /// schedule exceeds the limit.
    pub memory_thresholds: Vec<f64>,
    /// Convert synchronous collectives first (`None`: leave them).
    pub convert: Option<AsyncConversionConfig>,
    /// How ready compute is ranked.
    pub priority: Priority,
    /// Per computation, time for the exact search
    /// (`exact::solve_within_memory`, held to `memory_limit` in the entry)
    /// to improve the list schedule: it takes the search's order when that
    /// is faster and fits, or fits where the list order does not; `None`:
    /// the list scheduler alone (the fast default).
    pub exact_time_limit: Option<std::time::Duration>,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            overlap_limits: [1; NUM_RESOURCES],
            memory_limit: None,
            memory_thresholds: vec![0.9, 0.75, 0.5, 0.25, 0.0],
            convert: Some(AsyncConversionConfig::default()),
            priority: Priority::default(),
            exact_time_limit: None,
        }
    }
}

impl SchedulerConfig {
    /// Sets the overlap limit of one resource.
    pub fn with_limit(mut self, r: ResourceKind, limit: usize) -> SchedulerConfig {
        self.overlap_limits[r.index()] = limit.max(1);
        self
    }
}

/// What the last run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScheduleStats {
    /// Collectives converted to async pairs.
    pub converted: usize,
    /// Computations scheduled (sequential ones).
    pub computations_scheduled: usize,
    /// Memory levels tried (1 = the first schedule fit).
    pub attempts: usize,
    /// The entry's summary under the scheduler's cost model.
    pub entry: CompSummary,
    /// Wall time of the scheduling itself (conversion included), ms.
    pub scheduler_ms: f64,
    /// Computations the exact search made faster (`exact_time_limit`).
    pub exact_improved: usize,
}

/// The pass.
pub struct LatencyHidingScheduler {
    pub config: SchedulerConfig,
    pub model: Arc<dyn CostModel>,
    pub last_stats: Option<ScheduleStats>,
}

impl LatencyHidingScheduler {
    pub fn new(config: SchedulerConfig, model: Arc<dyn CostModel>) -> LatencyHidingScheduler {
        LatencyHidingScheduler {
            config,
            model,
            last_stats: None,
        }
    }
}

impl Pass for LatencyHidingScheduler {
    fn name(&self) -> &str {
        "latency-hiding-scheduler"
    }
    fn run(&mut self, module: &mut HloModule) -> Result<bool, PassError> {
        let (changed, stats) =
            schedule_module(module, &self.config, self.model.as_ref()).map_err(|e| {
                PassError::Failed {
                    pass: "latency-hiding-scheduler".into(),
                    message: e.to_string(),
                }
            })?;
        self.last_stats = Some(stats);
        Ok(changed)
    }
}

/// Schedules `module` in place; returns whether it changed and statistics.
pub fn schedule_module(
    module: &mut HloModule,
    config: &SchedulerConfig,
    model: &dyn CostModel,
) -> Result<(bool, ScheduleStats), SchedulerError> {
    let start = Instant::now();
    let mut stats = ScheduleStats::default();
    if let Some(cfg) = &config.convert {
        stats.converted = convert_collectives(module, cfg);
        log::debug!(
            "converted {} collectives in {:.1} ms",
            stats.converted,
            start.elapsed().as_secs_f64() * 1e3
        );
    }
    let uses = computation_uses(module);
    let order = callee_first_order(module);
    let mut levels: Vec<Option<MemoryPolicy>> = vec![None];
    if let Some(limit) = config.memory_limit {
        levels.extend(config.memory_thresholds.iter().map(|&threshold| {
            Some(MemoryPolicy {
                limit,
                threshold,
                order: PressureOrder::LeastMemory,
            })
        }));
        levels.push(Some(MemoryPolicy {
            limit,
            threshold: 0.0,
            order: PressureOrder::Original,
        }));
    }
    // (peak, orders, entry summary) of the lowest-memory attempt.
    type Attempt = (u64, Vec<Option<Vec<u32>>>, CompSummary);
    let mut best: Option<Attempt> = None;
    let mut accepted = None;
    // The priority Auto settled on per computation in the first attempt;
    // memory-pressure attempts start from it.
    let mut chosen: Vec<Priority> = vec![config.priority; module.computations.len()];
    for policy in levels {
        stats.attempts += 1;
        let mut summaries: Vec<Option<CompSummary>> = vec![None; module.computations.len()];
        let mut orders: Vec<Option<Vec<u32>>> = vec![None; module.computations.len()];
        for &c in &order {
            let comp = &module.computations[c.index()];
            if uses.get(c.index()) == Some(&CompUse::Sequential) {
                let t0 = Instant::now();
                let g = Graph::build(module, c, model, &summaries)?;
                let t_build = t0.elapsed();
                let base = chosen[c.index()];
                let mut ord = schedule_graph(&g, &config.overlap_limits, policy, base);
                let (mut s, _) = simulate_graph(&g, &ord, &config.overlap_limits, None, false);
                if base == Priority::Auto && policy.is_none() {
                    chosen[c.index()] = Priority::OriginalOrder;
                    for candidate in [Priority::AsyncDepth, Priority::CriticalPath] {
                        if s.exposed_comm <= 0.0 {
                            break;
                        }
                        let alt = schedule_graph(&g, &config.overlap_limits, None, candidate);
                        let (sa, _) = simulate_graph(&g, &alt, &config.overlap_limits, None, false);
                        let pareto = sa.makespan < s.makespan && sa.peak_total <= s.peak_total;
                        if pareto || sa.makespan < s.makespan * (1.0 - AUTO_GAIN) {
                            ord = alt;
                            s = sa;
                            chosen[c.index()] = candidate;
                        }
                    }
                    // A schedule measurably above the detailed lower bound
                    // gets two more tries: the exact search's best order
                    // (small computations), then hoisting work above waits.
                    if s.exposed_comm > 0.0 {
                        let limits = config.overlap_limits.map(|l| l.max(1));
                        let gap = g.lower_bounds(&limits, true).value() * (1.0 + EXACT_GAP);
                        if s.makespan > gap {
                            if let Some(alt) =
                                exact_order(&g, &ord, &config.overlap_limits, s.makespan)
                            {
                                let (sa, _) =
                                    simulate_graph(&g, &alt, &config.overlap_limits, None, false);
                                let pareto =
                                    sa.makespan < s.makespan && sa.peak_total <= s.peak_total;
                                if pareto || sa.makespan < s.makespan * (1.0 - AUTO_GAIN) {
                                    ord = alt;
                                    s = sa;
                                }
                            }
                        }
                        if s.makespan > gap {
                            (ord, s) = hoist_above_waits(&g, ord, s, &config.overlap_limits);
                        }
                    }
                }
                if let Some(time_limit) = config.exact_time_limit {
                    // The memory limit applies to the entry's peak (a
                    // fitting order replaces one that does not fit); under
                    // a limit, a callee's order may not raise its own peak,
                    // which its callers count while it runs.
                    let memory_limit = config.memory_limit.map(|limit| {
                        if c == module.entry {
                            limit
                        } else {
                            s.peak_total
                        }
                    });
                    let solved = crate::exact::solve_within_memory(
                        &g,
                        &config.overlap_limits,
                        &ord,
                        time_limit,
                        memory_limit,
                    );
                    let list_fits = memory_limit.is_none_or(|l| s.peak_total <= l);
                    let better = solved.fits_memory
                        && (solved.makespan < s.makespan || !list_fits)
                        && solved.order != ord;
                    if better {
                        let (sa, _) =
                            simulate_graph(&g, &solved.order, &config.overlap_limits, None, false);
                        log::debug!(
                            "exact schedule of %{}: {:.1} -> {:.1} us, peak {} -> {} bytes ({})",
                            comp.name,
                            s.makespan,
                            sa.makespan,
                            s.peak_total,
                            sa.peak_total,
                            if solved.optimal {
                                "optimal"
                            } else {
                                "time limit"
                            }
                        );
                        ord = solved.order;
                        s = sa;
                        stats.exact_improved += 1;
                    }
                }
                log::debug!(
                    "scheduled %{} ({} instructions; graph {:.1} ms, total {:.1} ms): makespan {:.1} us, lower bound {:.1} us, exposed {:.1} us, peak of temporaries {} bytes",
                    comp.name,
                    g.n,
                    t_build.as_secs_f64() * 1e3,
                    t0.elapsed().as_secs_f64() * 1e3,
                    s.makespan,
                    s.lower_bound,
                    s.exposed_comm,
                    s.peak_temp
                );
                summaries[c.index()] = Some(s);
                orders[c.index()] = Some(ord);
            } else {
                let ord = topological_order(comp).ok_or_else(|| SchedulerError::Cycle {
                    computation: comp.name.clone(),
                    instruction: comp
                        .instructions
                        .first()
                        .map(|i| i.name.clone())
                        .unwrap_or_default(),
                })?;
                orders[c.index()] = Some(ord);
            }
        }
        let entry = summaries
            .get(module.entry.index())
            .cloned()
            .flatten()
            .unwrap_or_default();
        let peak = entry.peak_total;
        let fits = config.memory_limit.filter(|&l| peak > l).is_none();
        if fits {
            accepted = Some((orders, entry));
            break;
        }
        log::info!(
            "latency-hiding-scheduler: peak {peak} bytes over the limit {:?} at {:?}; rescheduling",
            config.memory_limit,
            policy
        );
        if best.as_ref().filter(|b| peak >= b.0).is_none() {
            best = Some((peak, orders, entry));
        }
    }
    let Some((orders, entry)) = accepted else {
        return Err(SchedulerError::MemoryLimit {
            limit: config.memory_limit.unwrap_or(0),
            peak: best.map_or(0, |b| b.0),
        });
    };
    let mut changed = stats.converted > 0 || !module.config.is_scheduled;
    for (ci, ord) in orders.into_iter().enumerate() {
        if let Some(ord) = ord {
            if uses.get(ci) == Some(&CompUse::Sequential) {
                stats.computations_scheduled += 1;
            }
            changed |= apply_order(&mut module.computations[ci], &ord);
        }
    }
    module.config.is_scheduled = true;
    stats.entry = entry;
    stats.scheduler_ms = start.elapsed().as_secs_f64() * 1e3;
    Ok((changed, stats))
}

/// Local search after the list schedule: for each wait (a `done`), the
/// work that follows it within `HOIST_WINDOW` nodes and does not depend on
/// it moves above it, so it runs while the transfer is in flight; a move
/// is kept when the simulated makespan drops without raising the peak of
/// memory. Issues of the wait's own resource kind (and nodes whose callees
/// use it) stay below the wait, with everything that depends on them, so
/// overlap limits hold. At most `HOIST_ROUNDS` passes.
fn hoist_above_waits(
    g: &Graph,
    mut ord: Vec<u32>,
    mut s: CompSummary,
    limits: &[usize; crate::kinds::NUM_RESOURCES],
) -> (Vec<u32>, CompSummary) {
    use crate::graph::NodeKind;
    let mut stays = vec![false; g.n];
    let mut best = (s.makespan, s.peak_total);
    let mut changed = false;
    for _ in 0..HOIST_ROUNDS {
        let mut improved = false;
        // Candidates replace a suffix of `ord`, at positions visited from
        // the end backwards (what `PrefixReplay` needs).
        let (mut replay, _) = PrefixReplay::record(g, &ord, limits);
        let mut suffix: Vec<u32> = Vec::with_capacity(ord.len());
        let mut p = ord.len();
        while p > 0 {
            p -= 1;
            let d = ord[p] as usize;
            if g.kind[d] != NodeKind::Done {
                continue;
            }
            let Some(r) = g.resource[d] else { continue };
            let end = (p + 1 + HOIST_WINDOW).min(ord.len());
            let (mut up, mut down) = (Vec::new(), vec![ord[p]]);
            stays[d] = true;
            // Resources with a done that stays below: no operation of them
            // may start above it (that would put one more in flight).
            let mut waiting: u16 = 1 << r.index();
            for &x in &ord[p + 1..end] {
                let xi = x as usize;
                let takes = |mask: u16| {
                    let own = match (g.kind[xi], g.resource[xi]) {
                        (NodeKind::Start | NodeKind::SyncCollective, Some(rx)) => {
                            mask & (1 << rx.index()) != 0
                        }
                        _ => false,
                    };
                    own || g.nested_resources[xi] & mask != 0
                };
                let blocked = g.preds.get(xi).iter().any(|&q| stays[q as usize]) || takes(waiting);
                if blocked {
                    stays[xi] = true;
                    if let (NodeKind::Done, Some(rx)) = (g.kind[xi], g.resource[xi]) {
                        waiting |= 1 << rx.index();
                    }
                    down.push(x);
                } else {
                    up.push(x);
                }
            }
            for &x in &down {
                stays[x as usize] = false;
            }
            if up.is_empty() {
                continue;
            }
            suffix.clear();
            suffix.extend(&up);
            suffix.extend(&down);
            suffix.extend(&ord[end..]);
            // The peak only for an order that is shorter (most are not).
            let makespan = replay.makespan_with_suffix(p, &suffix);
            if makespan >= best.0 - 1e-9 {
                continue;
            }
            let mut alt = ord[..p].to_vec();
            alt.extend(&suffix);
            let peak_total = peak_total_of(g, &alt);
            if peak_total <= best.1 {
                ord = alt;
                best = (makespan, peak_total);
                improved = true;
                changed = true;
            }
        }
        if !improved {
            break;
        }
    }
    if changed {
        s = simulate_graph(g, &ord, limits, None, false).0;
    }
    (ord, s)
}

/// Passes of `hoist_above_waits`, and how many following nodes it looks at.
const HOIST_ROUNDS: usize = 3;
const HOIST_WINDOW: usize = 96;

/// Relative gap to the lower bound above which Auto tries the exact search.
const EXACT_GAP: f64 = 0.002;
/// Search budget (expansions) for that attempt: it tries the list
/// schedule's order first, so improvements come early when they exist.
const EXACT_ORDER_BUDGET: usize = 4_000;

/// The order of the exact search (see `exact::exact_search`) when it
/// found a schedule shorter than `makespan`, the current order's.
fn exact_order(
    g: &Graph,
    order: &[u32],
    limits: &[usize; crate::kinds::NUM_RESOURCES],
    makespan: f64,
) -> Option<Vec<u32>> {
    let mut rank = vec![usize::MAX; g.n];
    for (p, &i) in order.iter().enumerate() {
        if let Some(r) = rank.get_mut(i as usize) {
            *r = p;
        }
    }
    let lanes = limits.map(|l| l.max(1));
    let found = crate::exact::exact_search(g, &lanes, makespan, &rank, EXACT_ORDER_BUDGET)?;
    found.order.filter(|o| o.len() == g.n)
}

/// Rewrites `comp`'s arena in `order` (old indices); returns whether
/// anything moved. Orders that are not permutations are ignored.
pub fn apply_order(comp: &mut HloComputation, order: &[u32]) -> bool {
    let n = comp.instructions.len();
    if order.len() != n || order.iter().enumerate().all(|(p, &o)| p == o as usize) {
        return false;
    }
    let mut new_index = vec![u32::MAX; n];
    for (p, &o) in order.iter().enumerate() {
        match new_index.get_mut(o as usize) {
            Some(slot) if *slot == u32::MAX => *slot = p as u32,
            _ => return false,
        }
    }
    let remap = |id: InstrId| InstrId(new_index.get(id.index()).copied().unwrap_or(id.0));
    let mut old: Vec<Option<xla_hlo_ir::HloInstruction>> = std::mem::take(&mut comp.instructions)
        .into_iter()
        .map(Some)
        .collect();
    let mut out = Vec::with_capacity(n);
    for &o in order {
        if let Some(mut instr) = old[o as usize].take() {
            for op in instr.operands.iter_mut() {
                *op = remap(*op);
            }
            for c in instr.control_predecessors.iter_mut() {
                *c = remap(*c);
            }
            out.push(instr);
        }
    }
    comp.instructions = out;
    comp.root = remap(comp.root);
    for p in comp.parameters.iter_mut() {
        *p = remap(*p);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::{ApproximateCostModel, CostTable, TableCostModel};
    use crate::validate::validate_schedule;

    /// Hoisting above the all-reduce's wait: the first all-gather's done
    /// stays below it (its start needs the all-reduce), so the second
    /// all-gather may not start above it either (two would be in flight
    /// against a limit of one); the independent exponential still moves up
    /// and hides under the all-reduce.
    #[test]
    fn hoisting_moves_free_work_but_no_start_above_a_pending_done() {
        let text = "HloModule h, num_partitions=8\n\n%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %s = f32[] add(%a, %b)\n}\n\nENTRY %e (p0: f32[1024], p1: f32[1024]) -> (f32[8192], f32[8192], f32[1024]) {\n  %p0 = f32[1024]{0} parameter(0)\n  %p1 = f32[1024]{0} parameter(1)\n  %ar-start = f32[1024]{0} all-reduce-start(%p0), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add\n  %ar-done = f32[1024]{0} all-reduce-done(%ar-start)\n  %x = f32[1024]{0} exponential(%ar-done)\n  %ag1-start = (f32[1024]{0}, f32[8192]{0}) all-gather-start(%x), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}\n  %ag1-done = f32[8192]{0} all-gather-done(%ag1-start)\n  %ag2-start = (f32[1024]{0}, f32[8192]{0}) all-gather-start(%p1), channel_id=3, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}\n  %z = f32[1024]{0} exponential(%p1)\n  %ag2-done = f32[8192]{0} all-gather-done(%ag2-start), control-predecessors={%x}\n  ROOT %t = (f32[8192]{0}, f32[8192]{0}, f32[1024]{0}) tuple(%ag1-done, %ag2-done, %z)\n}\n";
        let module = xla_hlo_parser::parse_module(text).expect("parses");
        let table = CostTable::parse("ar-start 50\nx 1\nag1-start 5\nag2-start 5\nz 10\n").unwrap();
        let model = TableCostModel::new(table, Arc::new(ApproximateCostModel));
        let entry = module.entry;
        let g = Graph::build(&module, entry, &model, &[]).unwrap();
        let limits = [1; NUM_RESOURCES];
        // The module's own order.
        let order: Vec<u32> = (0..g.n as u32).collect();
        let before = simulate_graph(&g, &order, &limits, None, false).0;
        let (hoisted, after) = hoist_above_waits(&g, order, before.clone(), &limits);
        assert!(
            after.makespan < before.makespan,
            "{} -> {}",
            before.makespan,
            after.makespan
        );
        let mut scheduled = module.clone();
        apply_order(&mut scheduled.computations[entry.index()], &hoisted);
        scheduled.config.is_scheduled = true;
        let comp = &scheduled.computations[entry.index()];
        let position = |name: &str| comp.find(name).unwrap().index();
        assert!(position("z") < position("ar-done"));
        assert!(position("ag2-start") > position("ag1-done"));
        let v = validate_schedule(&scheduled, &limits, None);
        assert!(v.is_valid(), "{:?}\n{}", v.violations, scheduled.to_text());
    }
}
