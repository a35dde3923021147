//! Branch and bound over every valid order of a computation: an exact
//! lower bound for small computations (a relaxed problem), and exact
//! schedules with a proven gap (`solve`).
//!
//! Relaxation: compute nodes cheaper than 1% of the largest cost or
//! transfer are free (and free nodes are placed as soon as they are
//! ready, which never delays anything), nested computations cost their
//! lower bounds. Everything else follows the simulator exactly: one
//! in-order compute stream, transfers on their resource's lanes, dones
//! waiting, at most `limit` operations of a resource in flight. The
//! minimum makespan of the relaxed problem is at most the makespan of
//! any valid schedule of the real one, so it is a lower bound; when the
//! search finishes within its budget it is also (up to the relaxation)
//! the optimum, so a schedule that reaches it is optimal.
//!
//! [`solve`] runs the same search on the exact problem (no node is made
//! free) from a given order, within a time limit, and returns the best
//! order with a proven lower bound: the optimum (gap 0) when the search
//! finishes, the detailed lower bound of `Graph::lower_bounds` otherwise.
//! [`solve_within_memory`] adds the memory limit: the peak of live bytes
//! (`memory::peak_of_order`'s model, parameters included) of every order
//! it returns as fitting stays within it. Live bytes depend only on which
//! nodes are placed, so the search tracks them per state and prunes a
//! state whose placement overflows; nodes that allocate are decisions
//! then (placing them early is not free). `tests/exact.rs` checks both
//! against brute force over every valid order.
//!
//! Invariants: `exact_bound` returns `None` rather than a value when the
//! search space is too large (more than `MAX_DECISIONS` decision nodes or
//! `budget` expansions); a returned value never exceeds `upper`. `solve`
//! never returns an order slower than the one it was given; with a memory
//! limit, never one that does not fit when the given one does, nor a
//! slower fitting one.

use crate::graph::{Graph, NodeKind};
use crate::kinds::NUM_RESOURCES;
use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

/// Largest number of nodes the search branches on.
pub const MAX_DECISIONS: usize = 64;

#[derive(Clone)]
struct State {
    remaining: Vec<u32>,
    scheduled: Vec<bool>,
    t: f64,
    lane_free: Vec<Vec<f64>>,
    comm_end: Vec<f64>,
    inflight: [usize; NUM_RESOURCES],
    rem_compute: f64,
    done_count: usize,
    /// Memory tracking (empty without a limit): uses still to place per
    /// buffer, and live bytes of temporaries.
    pending_uses: Vec<u32>,
    live: u64,
    /// A placement overflowed the memory limit.
    overflow: bool,
    /// Nodes in the order they were placed.
    order: Vec<u32>,
}

struct Search<'a> {
    g: &'a Graph,
    w: Vec<f64>,
    decision: Vec<bool>,
    tail: Vec<f64>,
    limits: [usize; NUM_RESOURCES],
    rank: Vec<usize>,
    best: f64,
    expansions: usize,
    budget: usize,
    /// Checked every 256 expansions.
    deadline: Option<Instant>,
    exhausted: bool,
    /// The order of the best complete schedule found below `upper`.
    best_order: Option<Vec<u32>>,
    /// Time profiles already explored per set of placed nodes: a state
    /// whose profile is no earlier anywhere than a seen one is dominated.
    seen: FxHashMap<Vec<u64>, Vec<Vec<f64>>>,
    memory: Option<MemoryTrack>,
}

/// What the search needs to follow live bytes under a limit.
struct MemoryTrack {
    /// Bytes of temporaries allowed (the limit less the parameters).
    limit: u64,
    /// Buffers counted as temporaries: defined by a node, not a parameter.
    counted: Vec<bool>,
    /// Buffers the root returns: live to the end.
    held: Vec<bool>,
}

impl MemoryTrack {
    fn new(g: &Graph, limit: u64) -> MemoryTrack {
        let b = &g.buffers;
        let mut counted = vec![false; b.num_buffers()];
        for i in 0..g.n {
            for &d in b.defs.get(i) {
                counted[d as usize] = !b.is_param[d as usize];
            }
        }
        let mut held = vec![false; b.num_buffers()];
        for &r in &b.root_uses {
            if let Some(h) = held.get_mut(r as usize) {
                *h = true;
            }
        }
        MemoryTrack {
            limit: limit.saturating_sub(b.param_bytes),
            counted,
            held,
        }
    }

    /// Number of nodes using each buffer.
    fn use_counts(g: &Graph) -> Vec<u32> {
        let b = &g.buffers;
        let mut count = vec![0u32; b.num_buffers()];
        for i in 0..g.n {
            for &u in b.uses.get(i) {
                count[u as usize] += 1;
            }
        }
        count
    }

    /// Whether node `i` changes live bytes when placed.
    fn allocates(&self, g: &Graph, i: usize) -> bool {
        g.transient.get(i).copied().unwrap_or(0) > 0
            || g.buffers
                .defs
                .get(i)
                .iter()
                .any(|&d| self.counted[d as usize])
    }
}

/// A freed buffer's entry in `State::pending_uses`.
const FREED: u32 = u32::MAX;

/// The relaxed optimum of `g`, given an achievable makespan `upper` (the
/// scheduler's) and the position of each node in that schedule (`rank`,
/// used to try good orders first).
pub fn exact_bound(
    g: &Graph,
    limits: &[usize; NUM_RESOURCES],
    upper: f64,
    rank: &[usize],
    budget: usize,
) -> Option<f64> {
    exact_search(g, limits, upper, rank, budget).and_then(|r| r.bound)
}

/// What the search found: the relaxed optimum when it finished (`bound`),
/// and the order (every node) of the best schedule it met with a relaxed
/// makespan below `upper`, even when it ran out of budget. That order is
/// valid for the real problem; its real makespan can exceed the relaxed
/// one only by the compute nodes the relaxation made free.
pub struct SearchResult {
    pub bound: Option<f64>,
    pub order: Option<Vec<u32>>,
    pub expansions: usize,
}

/// The search behind [`exact_bound`]; `None` when the computation has
/// too many decision nodes to search.
pub fn exact_search(
    g: &Graph,
    limits: &[usize; NUM_RESOURCES],
    upper: f64,
    rank: &[usize],
    budget: usize,
) -> Option<SearchResult> {
    let scale = (0..g.n)
        .map(|i| g.lb_cost[i].max(g.latency[i]))
        .fold(0.0f64, f64::max);
    search(
        g,
        limits,
        upper,
        rank,
        Limit {
            free_below: 0.01 * scale,
            max_decisions: MAX_DECISIONS,
            budget,
            deadline: None,
        },
    )
}

/// How far a search may go.
struct Limit {
    /// Compute nodes cheaper than this are free (the relaxation; 0: none).
    free_below: f64,
    max_decisions: usize,
    /// Expansions.
    budget: usize,
    deadline: Option<Instant>,
}

/// Largest number of decision nodes [`solve`] searches.
pub const MAX_EXACT_DECISIONS: usize = 4096;

/// What [`solve`] proved about one computation.
#[derive(Clone, Debug, PartialEq)]
pub struct ExactSchedule {
    /// The best order found (every node), and its simulated makespan.
    pub order: Vec<u32>,
    pub makespan: f64,
    /// A proven lower bound on every valid order's makespan.
    pub bound: f64,
    /// The search finished: `makespan` is the optimum (`bound` equals it).
    pub optimal: bool,
    /// Search nodes expanded.
    pub expansions: usize,
    /// Peak live bytes of `order` (parameters included), and whether it is
    /// within the memory limit (always, without one).
    pub peak_bytes: u64,
    pub fits_memory: bool,
}

impl ExactSchedule {
    /// `(makespan - bound) / makespan`: 0 when optimal.
    pub fn gap(&self) -> f64 {
        if self.makespan > 0.0 {
            ((self.makespan - self.bound) / self.makespan).max(0.0)
        } else {
            0.0
        }
    }
}

/// The exact problem of `g` (no relaxation: every node that costs time is
/// a decision), solved by branch and bound from `order` (a valid order,
/// e.g. the list scheduler's) within `time_limit`: the best order found
/// and a proven lower bound. The search model is the simulator's (one
/// in-order compute stream, transfers on their resource's lanes, dones
/// waiting, at most `limits[r]` operations of a resource in flight), and
/// every order it returns is re-simulated with `simulate_graph`, so the
/// makespan is the simulator's. When the search does not finish, the
/// bound is `Graph::lower_bounds` (detailed).
pub fn solve(
    g: &Graph,
    limits: &[usize; NUM_RESOURCES],
    order: &[u32],
    time_limit: Duration,
) -> ExactSchedule {
    solve_within_memory(g, limits, order, time_limit, None)
}

/// [`solve`] under a memory limit (bytes, parameters included, as
/// `memory::peak_of_order` counts them): the fastest order found whose
/// peak fits. When the given order does not fit, any fitting order beats
/// it; when the search finds none, the given order comes back with
/// `fits_memory` false. The bound ignores memory, so it stays a lower
/// bound of the constrained problem; `optimal` means the search finished,
/// i.e. no fitting order is faster.
pub fn solve_within_memory(
    g: &Graph,
    limits: &[usize; NUM_RESOURCES],
    order: &[u32],
    time_limit: Duration,
    memory_limit: Option<u64>,
) -> ExactSchedule {
    let lanes = limits.map(|l| l.max(1));
    let simulate = |order: &[u32]| {
        crate::simulator::simulate_graph(g, order, &lanes, None, false)
            .0
            .makespan
    };
    let peak_of = |order: &[u32]| crate::memory::peak_of_order(&g.buffers, order, &g.transient).0;
    let incumbent = simulate(order);
    let peak = peak_of(order);
    let fits = memory_limit.is_none_or(|l| peak <= l);
    let mut best = ExactSchedule {
        order: order.to_vec(),
        makespan: incumbent,
        bound: g.lower_bounds(&lanes, true).value().min(incumbent),
        optimal: false,
        expansions: 0,
        peak_bytes: peak,
        fits_memory: fits,
    };
    let mut rank = vec![usize::MAX; g.n];
    for (position, &node) in order.iter().enumerate() {
        if let Some(r) = rank.get_mut(node as usize) {
            *r = position;
        }
    }
    let limit = Limit {
        free_below: 0.0,
        max_decisions: MAX_EXACT_DECISIONS,
        budget: usize::MAX,
        deadline: Some(Instant::now() + time_limit),
    };
    // The incumbent plus a hair, so the search also proves it optimal when
    // nothing beats it; anything fitting when the incumbent does not.
    let upper = if fits {
        incumbent * (1.0 + 1e-9) + 1e-9
    } else {
        f64::INFINITY
    };
    let memory = memory_limit.map(|l| MemoryTrack::new(g, l));
    let Some(found) = search_with(g, &lanes, upper, &rank, limit, memory) else {
        return best;
    };
    if let Some(order) = found.order.filter(|o| o.len() == g.n) {
        let makespan = simulate(&order);
        let peak = peak_of(&order);
        let order_fits = memory_limit.is_none_or(|l| peak <= l);
        if order_fits && (!best.fits_memory || makespan < best.makespan) {
            best.order = order;
            best.makespan = makespan;
            best.peak_bytes = peak;
            best.fits_memory = true;
        }
    }
    best.expansions = found.expansions;
    if found.bound.is_some() && best.fits_memory {
        best.optimal = true;
        best.bound = best.makespan;
    }
    best.bound = best.bound.min(best.makespan);
    best
}

fn search(
    g: &Graph,
    limits: &[usize; NUM_RESOURCES],
    upper: f64,
    rank: &[usize],
    limit: Limit,
) -> Option<SearchResult> {
    search_with(g, limits, upper, rank, limit, None)
}

fn search_with(
    g: &Graph,
    limits: &[usize; NUM_RESOURCES],
    upper: f64,
    rank: &[usize],
    limit: Limit,
    memory: Option<MemoryTrack>,
) -> Option<SearchResult> {
    let n = g.n;
    let delta = limit.free_below;
    let mut w = vec![0.0; n];
    let mut decision = vec![false; n];
    for i in 0..n {
        match g.kind[i] {
            NodeKind::Nop | NodeKind::Update => {}
            NodeKind::Compute => {
                if g.lb_cost[i] >= delta && g.lb_cost[i] > 0.0 {
                    w[i] = g.lb_cost[i];
                    decision[i] = true;
                }
            }
            NodeKind::Start | NodeKind::Done | NodeKind::SyncCollective => {
                w[i] = g.lb_cost[i];
                decision[i] = true;
            }
        }
        if memory.as_ref().is_some_and(|m| m.allocates(g, i)) {
            decision[i] = true;
        }
    }
    if decision.iter().filter(|&&d| d).count() > limit.max_decisions {
        return None;
    }
    let topo = g.topological();
    let tail = g.bottom_levels(&w, &topo);
    // A limit above the number of a resource's transfers never binds, so
    // the lanes are capped there (a huge `--overlap-limit` costs nothing).
    let mut starts = [0usize; NUM_RESOURCES];
    for i in 0..n {
        if g.kind[i] == NodeKind::Start {
            starts[g.resource[i].map_or(0, |r| r.index())] += 1;
        }
    }
    let limits: [usize; NUM_RESOURCES] = std::array::from_fn(|r| limits[r].min(starts[r]).max(1));
    let lanes: Vec<Vec<f64>> = limits.iter().map(|&k| vec![0.0; k]).collect();
    let state = State {
        remaining: (0..n).map(|i| g.preds.get(i).len() as u32).collect(),
        scheduled: vec![false; n],
        t: 0.0,
        lane_free: lanes,
        comm_end: vec![0.0; n],
        inflight: [0; NUM_RESOURCES],
        rem_compute: w.iter().sum(),
        done_count: 0,
        order: Vec::with_capacity(n),
        pending_uses: if memory.is_some() {
            MemoryTrack::use_counts(g)
        } else {
            Vec::new()
        },
        live: 0,
        overflow: false,
    };
    let mut s = Search {
        g,
        w,
        decision,
        tail,
        limits,
        rank: rank.to_vec(),
        best: upper,
        expansions: 0,
        budget: limit.budget,
        deadline: limit.deadline,
        exhausted: false,
        best_order: None,
        seen: FxHashMap::default(),
        memory,
    };
    let mut st = state;
    s.close(&mut st);
    s.dfs(st);
    Some(SearchResult {
        bound: (!s.exhausted).then_some(s.best),
        order: s.best_order,
        expansions: s.expansions,
    })
}

impl Search<'_> {
    fn place(&self, st: &mut State, i: usize) {
        let g = self.g;
        st.scheduled[i] = true;
        st.order.push(i as u32);
        st.done_count += 1;
        st.rem_compute -= self.w[i];
        match g.kind[i] {
            NodeKind::Start => {
                st.t += self.w[i];
                let r = g.resource[i].map_or(0, |r| r.index());
                let lane = (0..st.lane_free[r].len())
                    .min_by(|&a, &b| st.lane_free[r][a].total_cmp(&st.lane_free[r][b]))
                    .unwrap_or(0);
                let begin = st.t.max(st.lane_free[r][lane]);
                let end = begin + g.latency[i];
                st.lane_free[r][lane] = end;
                st.comm_end[i] = end;
                st.inflight[r] += 1;
            }
            NodeKind::Done => {
                let s = g.pair[i] as usize;
                st.t = st.t.max(st.comm_end.get(s).copied().unwrap_or(0.0)) + self.w[i];
                let r = g.resource[i].map_or(0, |r| r.index());
                st.inflight[r] = st.inflight[r].saturating_sub(1);
            }
            NodeKind::SyncCollective => {
                let r = g.resource[i].map_or(0, |r| r.index());
                let lane = (0..st.lane_free[r].len())
                    .min_by(|&a, &b| st.lane_free[r][a].total_cmp(&st.lane_free[r][b]))
                    .unwrap_or(0);
                let begin = st.t.max(st.lane_free[r][lane]);
                let end = begin + g.latency[i];
                st.lane_free[r][lane] = end;
                st.t = end;
            }
            _ => st.t += self.w[i],
        }
        for &x in g.succs.get(i) {
            st.remaining[x as usize] -= 1;
        }
        if let Some(memory) = &self.memory {
            Self::track_memory(memory, g, st, i);
        }
    }

    /// Live bytes after placing `i`, as `memory::peak_of_order` counts
    /// them: its buffers become live, the step's peak adds its transient,
    /// then every buffer whose last use (or whose definition, when it has
    /// no use) this was dies, except the root's.
    fn track_memory(memory: &MemoryTrack, g: &Graph, st: &mut State, i: usize) {
        let b = &g.buffers;
        for &d in b.defs.get(i) {
            let d = d as usize;
            if memory.counted[d] && st.pending_uses[d] != FREED {
                st.live += b.size[d];
            }
        }
        if st.live + g.transient.get(i).copied().unwrap_or(0) > memory.limit {
            st.overflow = true;
        }
        for &u in b.uses.get(i) {
            let u = u as usize;
            if st.pending_uses[u] != FREED {
                st.pending_uses[u] -= 1;
            }
        }
        for &x in b.uses.get(i).iter().chain(b.defs.get(i)) {
            let x = x as usize;
            if st.pending_uses[x] == 0 && memory.counted[x] && !memory.held[x] {
                st.live = st.live.saturating_sub(b.size[x]);
                st.pending_uses[x] = FREED;
            }
        }
    }

    /// Places every ready free node (they never delay anything).
    fn close(&self, st: &mut State) {
        loop {
            let mut any = false;
            for i in 0..self.g.n {
                if !st.scheduled[i] && st.remaining[i] == 0 && !self.decision[i] {
                    self.place(st, i);
                    any = true;
                }
            }
            if !any {
                break;
            }
        }
    }

    fn bound(&self, st: &State) -> f64 {
        let g = self.g;
        let mut lb = st.t + st.rem_compute;
        for i in 0..g.n {
            if st.scheduled[i] {
                if g.kind[i] == NodeKind::Start {
                    let d = g.pair[i] as usize;
                    if d < g.n && !st.scheduled[d] {
                        lb = lb.max(st.comm_end[i] + self.tail[d]);
                    }
                }
                continue;
            }
            if g.kind[i] == NodeKind::Start || g.kind[i] == NodeKind::SyncCollective {
                let r = g.resource[i].map_or(0, |r| r.index());
                let free = st.lane_free[r]
                    .iter()
                    .copied()
                    .fold(f64::INFINITY, f64::min);
                lb = lb.max(st.t.max(free) + self.tail[i]);
            } else {
                lb = lb.max(st.t + self.tail[i]);
            }
        }
        lb
    }

    /// Records `st`; true when a state with the same placed nodes and a
    /// profile no later anywhere was already explored.
    fn dominated(&mut self, st: &State) -> bool {
        let g = self.g;
        let mut key = vec![0u64; g.n.div_ceil(64)];
        for (i, &s) in st.scheduled.iter().enumerate() {
            if s {
                key[i / 64] |= 1 << (i % 64);
            }
        }
        let mut profile = vec![st.t];
        for lanes in &st.lane_free {
            profile.extend(lanes.iter().copied());
        }
        for i in 0..g.n {
            if st.scheduled[i] && g.kind[i] == NodeKind::Start {
                let d = g.pair[i] as usize;
                if d < g.n && !st.scheduled[d] {
                    profile.push(st.comm_end[i]);
                }
            }
        }
        let list = self.seen.entry(key).or_default();
        if list.iter().any(|p| {
            p.len() == profile.len() && p.iter().zip(&profile).all(|(a, b)| *a <= *b + 1e-9)
        }) {
            return true;
        }
        list.push(profile);
        false
    }

    fn dfs(&mut self, st: State) {
        if self.exhausted {
            return;
        }
        let g = self.g;
        if st.overflow {
            return;
        }
        if st.done_count == g.n {
            let end = st.comm_end.iter().copied().fold(st.t, f64::max);
            if end < self.best {
                self.best = end;
                self.best_order = Some(st.order.clone());
            }
            return;
        }
        if self.bound(&st) >= self.best - 1e-9 || self.dominated(&st) {
            return;
        }
        self.expansions += 1;
        if self.expansions > self.budget
            || (self.expansions % 256 == 0
                && self
                    .deadline
                    .is_some_and(|deadline| Instant::now() >= deadline))
        {
            self.exhausted = true;
            return;
        }
        let mut ready: Vec<usize> = (0..g.n)
            .filter(|&i| !st.scheduled[i] && st.remaining[i] == 0 && self.decision[i])
            .filter(|&i| {
                g.kind[i] != NodeKind::Start || {
                    let r = g.resource[i].map_or(0, |r| r.index());
                    st.inflight[r] < self.limits[r]
                }
            })
            .collect();
        ready.sort_by_key(|&i| self.rank.get(i).copied().unwrap_or(usize::MAX));
        for i in ready {
            let mut next = st.clone();
            self.place(&mut next, i);
            self.close(&mut next);
            self.dfs(next);
            if self.exhausted {
                return;
            }
        }
    }
}
