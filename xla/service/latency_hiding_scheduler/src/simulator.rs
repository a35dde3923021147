//! Discrete-event simulation of a schedule under a cost model.
//!
//! Execution model: one in-order compute stream runs the instructions in
//! schedule order; an async start issues its operation on one of its
//! resource's lanes (as many lanes as the overlap limit), where it begins
//! when both issued and a lane is free, and runs for its transfer time; a
//! done blocks the stream until its operation has finished (that wait is
//! exposed communication). A synchronous collective takes a lane and
//! blocks the stream for its whole duration. A while loop, call or
//! conditional occupies the stream for its callees' simulated time (a
//! while: `trip × (body + condition) + condition`).
//!
//! Lower bounds: the critical path (nested lower bounds as weights,
//! transfers on start→done edges), the compute stream's total busy time,
//! and each resource's total transfer time divided by its lanes; the
//! bound is their maximum, raised for small computations (at most
//! `exact::MAX_DECISIONS` nodes that cost time or move data) to the
//! optimum of a relaxed problem found by branch and bound. The
//! sequential reference runs the same
//! instructions in order with every transfer exposed.
//!
//! Invariants: `makespan >= lower_bound` for every order the simulator
//! accepts (each bound is a property of every valid execution); times are
//! finite; the simulation of a computation depends only on its graph and
//! order, so callee summaries can be computed once, callees first.

use crate::calls::{callee_first_order, computation_uses, CompUse};
use crate::cost::CostModel;
use crate::error::SchedulerError;
use crate::graph::{CompSummary, Graph, NodeKind};
use crate::kinds::{ResourceKind, NUM_RESOURCES};
use crate::memory::{live_profile, peak_of_order};
use xla_hlo_ir::{CompId, HloModule};

/// One slice of time on one track of the timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceEvent {
    pub name: String,
    pub category: &'static str,
    /// Track: 0 = compute stream; `lane_tid(resource, lane)` otherwise.
    pub tid: u32,
    pub ts_us: f64,
    pub dur_us: f64,
    pub args: Vec<(&'static str, serde_json::Value)>,
}

/// The simulated timeline of one computation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub computation: String,
    pub events: Vec<TraceEvent>,
    /// (time, live bytes) samples.
    pub memory: Vec<(f64, u64)>,
    pub lanes: Vec<(u32, String)>,
}

/// Search budget (expansions) of the exact bound for small computations.
pub const EXACT_BUDGET: usize = 20_000;

/// Track id of a resource lane.
pub fn lane_tid(r: ResourceKind, lane: usize) -> u32 {
    1 + (r.index() as u32) * 64 + lane as u32
}

/// The per-instruction exposed time of each node's callees (while loops,
/// calls, conditionals), indexed by node.
fn nested_exposed_of(g: &Graph) -> Vec<f64> {
    let mut nested = vec![0.0f64; g.n];
    for &(k, v) in &g.nested_exposed {
        if let Some(x) = nested.get_mut(k as usize) {
            *x += v;
        }
    }
    nested
}

/// The simulation's state between two positions of an order (with the
/// communication end times, kept apart as `comm_end`).
#[derive(Clone, Debug)]
struct PlayState {
    t: f64,
    end_all: f64,
    exposed: f64,
    lane_free: Vec<Vec<f64>>,
}

/// The lanes worth simulating per resource: its overlap limit (at least
/// one), but no more than the graph's ops on that resource, since a lane
/// beyond those is never taken (each op finds an unused one), so the
/// timeline is the same and a huge limit costs nothing.
fn lanes_in_use(g: &Graph, limits: &[usize; NUM_RESOURCES]) -> [usize; NUM_RESOURCES] {
    let mut ops = [0usize; NUM_RESOURCES];
    for r in g.resource.iter().flatten() {
        ops[r.index()] += 1;
    }
    std::array::from_fn(|r| limits[r].max(1).min(ops[r].max(1)))
}

impl PlayState {
    fn start(lanes_n: &[usize; NUM_RESOURCES]) -> PlayState {
        PlayState {
            t: 0.0,
            end_all: 0.0,
            exposed: 0.0,
            lane_free: lanes_n.iter().map(|&k| vec![0.0; k]).collect(),
        }
    }
}

/// `PlayState`s, one per position of an order, in two flat arrays.
#[derive(Debug, Default)]
struct Checkpoints {
    /// `(t, end_all, exposed)` per position.
    scalars: Vec<(f64, f64, f64)>,
    /// Every resource's lanes, resource by resource, per position.
    lanes: Vec<f64>,
    /// Lanes per resource (the same at every position).
    lanes_per_resource: Vec<usize>,
}

impl Checkpoints {
    fn push(&mut self, t: f64, end_all: f64, exposed: f64, lane_free: &[Vec<f64>]) {
        if self.scalars.is_empty() {
            self.lanes_per_resource = lane_free.iter().map(Vec::len).collect();
        }
        self.scalars.push((t, end_all, exposed));
        for lanes in lane_free {
            self.lanes.extend_from_slice(lanes);
        }
    }

    fn state(&self, position: usize) -> PlayState {
        let (t, end_all, exposed) = self.scalars[position];
        let stride: usize = self.lanes_per_resource.iter().sum();
        let mut at = position * stride;
        let lane_free = self
            .lanes_per_resource
            .iter()
            .map(|&k| {
                let lanes = self.lanes[at..at + k].to_vec();
                at += k;
                lanes
            })
            .collect();
        PlayState {
            t,
            end_all,
            exposed,
            lane_free,
        }
    }
}

/// Makespans of orders that share a prefix with one recorded order, each
/// played from the state the recorded order reached at the end of that
/// prefix (a prefix's simulation depends on the prefix alone), for
/// comparing many candidate orders of one graph.
///
/// Invariant: a candidate replaced the suffix from position `p` on, with
/// the same instructions, and `p` never exceeds the previous candidate's
/// (positions are visited from the end backwards): then the communication
/// end times of the prefix's starts, recorded once, are still those of the
/// candidate, and those of the suffix are written before they are read.
pub struct PrefixReplay<'g> {
    g: &'g Graph,
    nested: Vec<f64>,
    /// The recorded order's state before each position.
    before: Checkpoints,
    comm_end: Vec<f64>,
    last_position: usize,
}

impl<'g> PrefixReplay<'g> {
    /// Records `order`, returning the replay and the order's makespan.
    pub fn record(
        g: &'g Graph,
        order: &[u32],
        lanes: &[usize; NUM_RESOURCES],
    ) -> (PrefixReplay<'g>, f64) {
        let lanes_n = lanes_in_use(g, lanes);
        let nested = nested_exposed_of(g);
        let mut state = PlayState::start(&lanes_n);
        let mut comm_end = vec![0.0f64; g.n];
        let mut before = Checkpoints::default();
        let played = play(
            g,
            order,
            None,
            &mut state,
            &mut comm_end,
            &nested,
            Some(&mut before),
        );
        let replay = PrefixReplay {
            g,
            nested,
            before,
            comm_end,
            last_position: order.len(),
        };
        (replay, played.makespan)
    }

    /// The makespan of the recorded order's first `position` instructions
    /// followed by `suffix`.
    pub fn makespan_with_suffix(&mut self, position: usize, suffix: &[u32]) -> f64 {
        assert!(
            position <= self.last_position && position < self.before.scalars.len(),
            "PrefixReplay positions must not increase"
        );
        self.last_position = position;
        let mut state = self.before.state(position);
        play(
            self.g,
            suffix,
            None,
            &mut state,
            &mut self.comm_end,
            &self.nested,
            None,
        )
        .makespan
    }
}

/// The peak live bytes of `order`, parameters included (`simulate_graph`'s
/// `peak_total`).
pub fn peak_total_of(g: &Graph, order: &[u32]) -> u64 {
    peak_of_order(&g.buffers, order, &g.transient).0
}

/// What playing an order gives.
struct Played {
    makespan: f64,
    /// Time the compute stream reaches the end of the order.
    stream_end: f64,
    exposed: f64,
    /// The stream's time at each position of the order (with a timeline).
    begin_times: Vec<f64>,
}

/// Plays `order` on the execution model from `state` (left as the order
/// ends it), writing each start's communication end time into
/// `comm_end`; with `trace`, records the events into its timeline
/// (instruction names from its computation); with `checkpoints`, pushes
/// the state before each position.
#[allow(clippy::too_many_arguments)]
fn play(
    g: &Graph,
    order: &[u32],
    trace: Option<(&mut Timeline, Option<&xla_hlo_ir::HloComputation>)>,
    state: &mut PlayState,
    comm_end: &mut [f64],
    nested: &[f64],
    mut checkpoints: Option<&mut Checkpoints>,
) -> Played {
    let n = g.n;
    let (mut timeline, comp) = match trace {
        Some((tl, comp)) => (Some(tl), comp),
        None => (None, None),
    };
    let mut lane_free = std::mem::take(&mut state.lane_free);
    let (mut t, mut end_all, mut exposed) = (state.t, state.end_all, state.exposed);
    let mut begin_times: Vec<f64> = Vec::with_capacity(if timeline.is_some() { n } else { 0 });
    let name_of = |i: usize| -> String {
        comp.and_then(|c| c.instructions.get(i))
            .map(|x| x.name.clone())
            .unwrap_or_else(|| format!("#{i}"))
    };
    let nested_exposed = |i: usize| -> f64 { nested[i] };
    let take_lane = |lane_free: &mut Vec<Vec<f64>>, r: usize| -> usize {
        let mut best = 0;
        for (k, &f) in lane_free[r].iter().enumerate() {
            if f < lane_free[r][best] {
                best = k;
            }
        }
        best
    };
    for &i in order {
        if let Some(c) = checkpoints.as_mut() {
            c.push(t, end_all, exposed, &lane_free);
        }
        let i = i as usize;
        if i >= n {
            continue;
        }
        if timeline.is_some() {
            begin_times.push(t);
        }
        match g.kind[i] {
            NodeKind::Nop | NodeKind::Update => {}
            NodeKind::Compute => {
                let mask = g.nested_resources[i];
                if mask != 0 {
                    // Its transfers need a lane of each kind it uses.
                    let mut free = t;
                    for (r, lanes) in lane_free.iter().enumerate() {
                        if mask & (1 << r) != 0 {
                            free = free.max(lanes.iter().copied().fold(f64::INFINITY, f64::min));
                        }
                    }
                    exposed += free - t;
                    t = free;
                }
                let b = t;
                t += g.cost[i];
                exposed += nested_exposed(i);
                if mask != 0 {
                    for (r, lanes) in lane_free.iter_mut().enumerate() {
                        if mask & (1 << r) != 0 {
                            if let Some(l) = lanes.iter_mut().min_by(|a, b| a.total_cmp(b)) {
                                *l = t;
                            }
                        }
                    }
                }
                if let Some(tl) = timeline.as_mut() {
                    if g.cost[i] > 0.0 {
                        tl.events.push(TraceEvent {
                            name: name_of(i),
                            category: "compute",
                            tid: 0,
                            ts_us: b,
                            dur_us: g.cost[i],
                            args: Vec::new(),
                        });
                    }
                }
            }
            NodeKind::Start => {
                let issue = t;
                t += g.cost[i];
                let r = g.resource[i].map_or(0, |r| r.index());
                let lane = take_lane(&mut lane_free, r);
                let begin = t.max(lane_free[r][lane]);
                let end = begin + g.latency[i];
                lane_free[r][lane] = end;
                comm_end[i] = end;
                end_all = end_all.max(end);
                if let Some(tl) = timeline.as_mut() {
                    let rk = ResourceKind::ALL[r];
                    tl.events.push(TraceEvent {
                        name: name_of(i),
                        category: rk.name(),
                        tid: lane_tid(rk, lane),
                        ts_us: begin,
                        dur_us: g.latency[i],
                        args: vec![("issued_us", serde_json::json!(issue))],
                    });
                }
            }
            NodeKind::Done => {
                let s = g.pair[i] as usize;
                let ready = comm_end.get(s).copied().unwrap_or(0.0);
                let wait = (ready - t).max(0.0);
                if wait > 0.0 {
                    if let Some(tl) = timeline.as_mut() {
                        tl.events.push(TraceEvent {
                            name: format!("wait {}", name_of(i)),
                            category: "exposed",
                            tid: 0,
                            ts_us: t,
                            dur_us: wait,
                            args: Vec::new(),
                        });
                    }
                }
                exposed += wait;
                t = t.max(ready) + g.cost[i];
            }
            NodeKind::SyncCollective => {
                let r = g.resource[i].map_or(0, |r| r.index());
                let lane = take_lane(&mut lane_free, r);
                let begin = t.max(lane_free[r][lane]);
                let end = begin + g.latency[i];
                lane_free[r][lane] = end;
                exposed += end - t;
                if let Some(tl) = timeline.as_mut() {
                    let rk = ResourceKind::ALL[r];
                    tl.events.push(TraceEvent {
                        name: name_of(i),
                        category: rk.name(),
                        tid: lane_tid(rk, lane),
                        ts_us: begin,
                        dur_us: g.latency[i],
                        args: vec![("synchronous", serde_json::json!(true))],
                    });
                    tl.events.push(TraceEvent {
                        name: format!("sync {}", name_of(i)),
                        category: "exposed",
                        tid: 0,
                        ts_us: t,
                        dur_us: end - t,
                        args: Vec::new(),
                    });
                }
                t = end;
            }
        }
    }
    *state = PlayState {
        t,
        end_all,
        exposed,
        lane_free,
    };
    Played {
        makespan: t.max(end_all),
        stream_end: t,
        exposed,
        begin_times,
    }
}

/// Simulates `order` (node indices of `g`) with `lanes[r]` lanes per
/// resource. With `names`, also records the timeline; with
/// `detailed_bounds`, the lower bound uses serialized ancestor work
/// (`Graph::lower_bounds`).
pub fn simulate_graph(
    g: &Graph,
    order: &[u32],
    lanes: &[usize; NUM_RESOURCES],
    names: Option<(&HloModule, CompId)>,
    detailed_bounds: bool,
) -> (CompSummary, Option<Timeline>) {
    let n = g.n;
    let limits: [usize; NUM_RESOURCES] = lanes.map(|l| l.max(1));
    let lanes_n = lanes_in_use(g, lanes);
    let comp = names.and_then(|(m, c)| m.computations.get(c.index()));
    let mut timeline = comp.map(|c| Timeline {
        computation: c.name.clone(),
        ..Timeline::default()
    });
    let mut state = PlayState::start(&lanes_n);
    let mut comm_end = vec![0.0f64; n];
    let played = play(
        g,
        order,
        timeline.as_mut().map(|tl| (tl, comp)),
        &mut state,
        &mut comm_end,
        &nested_exposed_of(g),
        None,
    );
    let (t, exposed, begin_times) = (played.stream_end, played.exposed, played.begin_times);
    let makespan = played.makespan;
    let bounds = g.lower_bounds(&lanes_n, detailed_bounds);
    let (cp, mut lower_bound) = (bounds.critical_path, bounds.value());
    if detailed_bounds && lower_bound < makespan * (1.0 - 1e-9) {
        let mut rank = vec![usize::MAX; n];
        for (p, &i) in order.iter().enumerate() {
            if let Some(r) = rank.get_mut(i as usize) {
                *r = p;
            }
        }
        if let Some(exact) = crate::exact::exact_bound(g, &lanes_n, makespan, &rank, EXACT_BUDGET) {
            lower_bound = lower_bound.max(exact);
        }
    }
    let sequential: f64 = g.seq_cost.iter().sum::<f64>()
        + (0..n)
            .filter(|&i| g.kind[i] == NodeKind::Start)
            .map(|i| g.latency[i])
            .sum::<f64>();
    let mut comm_busy = [0.0; NUM_RESOURCES];
    for i in 0..n {
        if let Some(r) = g.resource[i] {
            if matches!(g.kind[i], NodeKind::Start | NodeKind::SyncCollective) {
                comm_busy[r.index()] += g.latency[i];
            }
        }
    }
    for (_, c) in &g.nested_comm {
        for (k, v) in c.iter().enumerate() {
            if v.is_finite() {
                comm_busy[k] += v;
            }
        }
    }
    let total_comm: f64 = (0..n)
        .filter(|&i| {
            g.resource[i].is_some()
                && matches!(g.kind[i], NodeKind::Start | NodeKind::SyncCollective)
        })
        .map(|i| g.latency[i])
        .chain(
            g.nested_total
                .iter()
                .map(|&(_, v)| v)
                .filter(|v| v.is_finite()),
        )
        // fold from +0.0: an empty f64 `sum` is -0.0, which the report
        // would print as "-0.0".
        .fold(0.0, |a, x| a + x);
    let compute_busy: f64 = (0..n)
        .filter(|&i| g.kind[i] != NodeKind::SyncCollective)
        .map(|i| g.lb_cost[i])
        .sum();
    let (peak_total, peak_temp) = peak_of_order(&g.buffers, order, &g.transient);
    if let Some(tl) = timeline.as_mut() {
        let prof = live_profile(&g.buffers, order, &g.transient);
        let mut last = u64::MAX;
        for (k, &bytes) in prof.iter().enumerate() {
            if bytes != last {
                tl.memory
                    .push((begin_times.get(k).copied().unwrap_or(t), bytes));
                last = bytes;
            }
        }
        for r in ResourceKind::ALL {
            for lane in 0..lanes_n[r.index()] {
                let tid = lane_tid(r, lane);
                if tl.events.iter().any(|e| e.tid == tid) {
                    let label = if limits[r.index()] > 1 {
                        format!("{} #{lane}", r.name())
                    } else {
                        r.name().to_string()
                    };
                    tl.lanes.push((tid, label));
                }
            }
        }
    }
    let summary = CompSummary {
        makespan,
        lower_bound,
        sequential,
        critical_path: cp,
        compute_busy,
        comm_busy,
        exposed_comm: exposed,
        total_comm,
        peak_temp,
        peak_total,
    };
    (summary, timeline)
}

/// The simulation of a whole module in its current (arena) order.
#[derive(Clone, Debug, Default)]
pub struct ModuleSimulation {
    /// Summary per computation (`None` for fused / embedded ones).
    pub summaries: Vec<Option<CompSummary>>,
    /// The entry computation's summary.
    pub entry: CompSummary,
    /// Timelines, when requested: the entry's first, then one execution
    /// of each other sequential computation that moves data (loop bodies,
    /// branches, callees).
    pub timelines: Vec<Timeline>,
}

/// Simulates every sequential computation of `module` in arena order,
/// callees first.
pub fn simulate_module(
    module: &HloModule,
    model: &dyn CostModel,
    lanes: &[usize; NUM_RESOURCES],
    want_timeline: bool,
) -> Result<ModuleSimulation, SchedulerError> {
    let uses = computation_uses(module);
    let mut summaries: Vec<Option<CompSummary>> = vec![None; module.computations.len()];
    let mut timelines = Vec::new();
    for c in callee_first_order(module) {
        if uses.get(c.index()) != Some(&CompUse::Sequential) {
            continue;
        }
        let g = Graph::build(module, c, model, &summaries)?;
        let order: Vec<u32> = (0..g.n as u32).collect();
        let moves_data = g
            .kind
            .iter()
            .any(|k| matches!(k, NodeKind::Start | NodeKind::SyncCollective));
        let trace = want_timeline && (c == module.entry || moves_data);
        let (s, tl) = simulate_graph(&g, &order, lanes, trace.then_some((module, c)), true);
        if let Some(mut tl) = tl {
            if c == module.entry {
                timelines.insert(0, tl);
            } else {
                tl.computation.push_str(" (one execution)");
                timelines.push(tl);
            }
        }
        summaries[c.index()] = Some(s);
    }
    let entry = summaries
        .get(module.entry.index())
        .cloned()
        .flatten()
        .unwrap_or_default();
    Ok(ModuleSimulation {
        summaries,
        entry,
        timelines,
    })
}
