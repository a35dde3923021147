//! The scheduling graph of one computation: a node per instruction with its
//! kind (bookkeeping, compute, async start / update / done, synchronous
//! collective), its resource, its time on the compute stream, the transfer
//! time of async operations, and edges for operands, control predecessors
//! and the original order of side-effecting instructions.
//!
//! Nested computations enter through `CompSummary`s of their callees: a
//! while costs `trip × (body + condition) + condition`, a call its callee,
//! a conditional its slowest branch; their peaks of temporaries become the
//! node's memory transient.
//!
//! Invariants: `preds`/`succs` are duplicate-free and mirror each other;
//! `pair[start] == done` and `pair[done] == start` for every matched async
//! pair (unmatched starts and dones are demoted to compute nodes); every
//! cost is finite and non-negative.

use crate::calls::while_trip_count;
use crate::cost::{CostModel, Op};
use crate::error::SchedulerError;
use crate::kinds::{
    async_role, has_side_effect, is_nop, sync_collective_kind, AsyncRole, CollectiveInfo,
    ResourceKind, NUM_RESOURCES,
};
use crate::memory::Buffers;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use xla_hlo_ir::{AttrKey, CompId, HloComputation, HloModule, InstrId, Opcode};

/// Compressed adjacency lists.
#[derive(Clone, Debug, Default)]
pub struct Csr {
    pub offsets: Vec<u32>,
    pub items: Vec<u32>,
}

impl Csr {
    pub fn from_lists(lists: &[Vec<u32>]) -> Csr {
        let mut offsets = Vec::with_capacity(lists.len() + 1);
        let mut items = Vec::with_capacity(lists.iter().map(Vec::len).sum());
        offsets.push(0);
        for l in lists {
            items.extend_from_slice(l);
            offsets.push(items.len() as u32);
        }
        Csr { offsets, items }
    }
    /// The list of node `i` (empty when out of range).
    pub fn get(&self, i: usize) -> &[u32] {
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.items[a as usize..b as usize],
            _ => &[],
        }
    }
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Summary of a computation under a cost model (used for nested costs and
/// reports). Times in µs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompSummary {
    /// Simulated time of one execution in the current order.
    pub makespan: f64,
    /// Lower bound on the time of any valid order.
    pub lower_bound: f64,
    /// Program order with every async pair synchronous.
    pub sequential: f64,
    /// Longest dependency path (nested lower bounds as node weights).
    pub critical_path: f64,
    /// Time the compute stream is busy (nested lower bounds included).
    pub compute_busy: f64,
    /// Transfer time per resource (nested included).
    pub comm_busy: [f64; NUM_RESOURCES],
    /// Time the compute stream waits for transfers (nested included).
    pub exposed_comm: f64,
    /// Transfer time of one execution, nested included, taking the
    /// costliest branch of each conditional (as `exposed_comm` does, so
    /// `exposed_comm <= total_comm`; `comm_busy` takes the cheapest
    /// branch instead, since it feeds the lower bound).
    pub total_comm: f64,
    /// Peak live bytes of temporaries (parameters excluded).
    pub peak_temp: u64,
    /// Peak live bytes including parameters.
    pub peak_total: u64,
}

impl CompSummary {
    pub fn total_comm(&self) -> f64 {
        self.total_comm
    }
}

/// Kind of a graph node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// Free bookkeeping (parameters, tuples, bitcasts, ...).
    Nop,
    /// Runs on the compute stream.
    Compute,
    /// Starts an async operation on `resource`.
    Start,
    /// An `async-update` between start and done.
    Update,
    /// Waits for the async operation started by `pair`.
    Done,
    /// A synchronous collective: blocks the compute stream for `latency`.
    SyncCollective,
}

/// The scheduling graph of one computation.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub comp: Option<CompId>,
    pub n: usize,
    pub preds: Csr,
    pub succs: Csr,
    pub kind: Vec<NodeKind>,
    pub resource: Vec<Option<ResourceKind>>,
    /// Compute-stream time with nested makespans.
    pub cost: Vec<f64>,
    /// Compute-stream time with nested lower bounds.
    pub lb_cost: Vec<f64>,
    /// Compute-stream time in the sequential reference (nested sequential).
    pub seq_cost: Vec<f64>,
    /// Transfer time of starts and synchronous collectives.
    pub latency: Vec<f64>,
    /// Start <-> done partner (`u32::MAX` when none).
    pub pair: Vec<u32>,
    /// Nested transfer time per resource, times trip counts.
    pub nested_comm: Vec<(u32, [f64; NUM_RESOURCES])>,
    /// Nested exposed communication per node.
    pub nested_exposed: Vec<(u32, f64)>,
    /// Nested transfer time per node (costliest branch, times trip counts).
    pub nested_total: Vec<(u32, f64)>,
    /// Nested compute-busy lower bound per node.
    pub nested_busy: Vec<(u32, f64)>,
    /// Callee peak of temporaries, added while the node runs.
    pub transient: Vec<u64>,
    /// Resources the node's callees use (bit `r` for `ResourceKind` `r`):
    /// a loop, call or branch that moves data of kind `r` needs a free
    /// slot of `r` while it runs, as XLA's while aggregates its body's
    /// resources.
    pub nested_resources: Vec<u16>,
    pub buffers: Buffers,
}

pub const NONE: u32 = u32::MAX;

/// A topological order of `comp` that keeps the arena order wherever the
/// dependencies allow (smallest index first). `None` on a cycle.
pub fn topological_order(comp: &HloComputation) -> Option<Vec<u32>> {
    let n = comp.instructions.len();
    let preds = raw_preds(comp);
    topo_from_preds(n, &preds)
}

fn topo_from_preds(n: usize, preds: &Csr) -> Option<Vec<u32>> {
    let mut indeg = vec![0u32; n];
    let mut succ_lists: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (i, d) in indeg.iter_mut().enumerate() {
        for &p in preds.get(i) {
            *d += 1;
            succ_lists[p as usize].push(i as u32);
        }
    }
    let mut heap: BinaryHeap<Reverse<u32>> = (0..n as u32)
        .filter(|&i| indeg[i as usize] == 0)
        .map(Reverse)
        .collect();
    let mut out = Vec::with_capacity(n);
    while let Some(Reverse(i)) = heap.pop() {
        out.push(i);
        for &s in &succ_lists[i as usize] {
            indeg[s as usize] -= 1;
            if indeg[s as usize] == 0 {
                heap.push(Reverse(s));
            }
        }
    }
    (out.len() == n).then_some(out)
}

/// Operands, control predecessors and the side-effect chain, deduplicated;
/// ids out of range are dropped.
fn raw_preds(comp: &HloComputation) -> Csr {
    let n = comp.instructions.len();
    let mut mark = vec![u32::MAX; n];
    let mut lists: Vec<Vec<u32>> = Vec::with_capacity(n);
    let mut last_side_effect: Option<u32> = None;
    for (i, instr) in comp.instructions.iter().enumerate() {
        let mut l = Vec::with_capacity(instr.operands.len());
        let mut add = |p: InstrId, l: &mut Vec<u32>| {
            let p = p.0;
            if (p as usize) < n && p != i as u32 && mark[p as usize] != i as u32 {
                mark[p as usize] = i as u32;
                l.push(p);
            }
        };
        for &o in &instr.operands {
            add(o, &mut l);
        }
        for &c in &instr.control_predecessors {
            add(c, &mut l);
        }
        if has_side_effect(instr) {
            if let Some(prev) = last_side_effect {
                add(InstrId(prev), &mut l);
            }
            last_side_effect = Some(i as u32);
        }
        lists.push(l);
    }
    Csr::from_lists(&lists)
}

fn summary(summaries: &[Option<CompSummary>], c: Option<CompId>) -> Option<&CompSummary> {
    summaries.get(c?.index())?.as_ref()
}

impl Graph {
    /// Builds the graph of computation `cid`. `summaries[c]` must hold the
    /// summary of every computation `cid` calls sequentially (missing ones
    /// count as free).
    pub fn build(
        module: &HloModule,
        cid: CompId,
        model: &dyn CostModel,
        summaries: &[Option<CompSummary>],
    ) -> Result<Graph, SchedulerError> {
        let comp =
            module
                .computations
                .get(cid.index())
                .ok_or_else(|| SchedulerError::Malformed {
                    computation: format!("{cid}"),
                    message: "no such computation".into(),
                })?;
        let n = comp.instructions.len();
        let preds = raw_preds(comp);
        if topo_from_preds(n, &preds).is_none() {
            let name = comp
                .instructions
                .first()
                .map(|i| i.name.clone())
                .unwrap_or_default();
            return Err(SchedulerError::Cycle {
                computation: comp.name.clone(),
                instruction: name,
            });
        }
        let mut succ_lists: Vec<Vec<u32>> = vec![Vec::new(); n];
        for i in 0..n {
            for &p in preds.get(i) {
                succ_lists[p as usize].push(i as u32);
            }
        }
        let succs = Csr::from_lists(&succ_lists);
        let mut g = Graph {
            comp: Some(cid),
            n,
            preds,
            succs,
            kind: vec![NodeKind::Compute; n],
            resource: vec![None; n],
            cost: vec![0.0; n],
            lb_cost: vec![0.0; n],
            seq_cost: vec![0.0; n],
            latency: vec![0.0; n],
            pair: vec![NONE; n],
            nested_comm: Vec::new(),
            nested_exposed: Vec::new(),
            nested_total: Vec::new(),
            nested_busy: Vec::new(),
            nested_resources: vec![0; n],
            transient: vec![0; n],
            buffers: Buffers::analyse(comp),
        };
        // Async roles and pairs.
        let mut roles: Vec<Option<AsyncRole>> = Vec::with_capacity(n);
        for i in 0..n {
            roles.push(async_role(module, comp, InstrId(i as u32)));
        }
        for i in 0..n {
            if let Some(AsyncRole::Done(r)) = roles[i] {
                if let Some(s) = crate::kinds::pair_start(comp, InstrId(i as u32)) {
                    let s = s.index();
                    if matches!(roles[s], Some(AsyncRole::Start(_))) && g.pair[s] == NONE {
                        g.pair[s] = i as u32;
                        g.pair[i] = s as u32;
                        g.kind[s] = NodeKind::Start;
                        g.kind[i] = NodeKind::Done;
                        g.resource[s] = Some(r);
                        g.resource[i] = Some(r);
                    }
                }
            }
        }
        let users = comp.users();
        for (i, instr) in comp.instructions.iter().enumerate() {
            let op = Op::with_users(module, comp, InstrId(i as u32), &users);
            match g.kind[i] {
                NodeKind::Start => {
                    let c = sane(model.compute_us(op));
                    g.cost[i] = c;
                    g.lb_cost[i] = c;
                    g.seq_cost[i] = c;
                    g.latency[i] = match CollectiveInfo::of(module, comp, InstrId(i as u32)) {
                        Some(info) => sane(model.transfer_us(op, &info)),
                        None => 0.0,
                    };
                    continue;
                }
                NodeKind::Done => {
                    let c = sane(model.compute_us(op));
                    g.cost[i] = c;
                    g.lb_cost[i] = c;
                    g.seq_cost[i] = c;
                    continue;
                }
                _ => {}
            }
            if matches!(roles[i], Some(AsyncRole::Update(_))) {
                g.kind[i] = NodeKind::Update;
                continue;
            }
            if let Some(r) = sync_collective_kind(instr) {
                g.kind[i] = NodeKind::SyncCollective;
                g.resource[i] = Some(r);
                let t = match CollectiveInfo::of(module, comp, InstrId(i as u32)) {
                    Some(info) => sane(model.transfer_us(op, &info)),
                    None => 0.0,
                };
                g.latency[i] = t;
                g.cost[i] = t;
                g.lb_cost[i] = t;
                g.seq_cost[i] = t;
                continue;
            }
            if is_nop(instr) && instr.opcode != Opcode::While {
                g.kind[i] = NodeKind::Nop;
                continue;
            }
            let base = sane(model.compute_us(op));
            let (mut mk, mut lb, mut sq) = (base, base, base);
            match instr.opcode {
                Opcode::While => {
                    let body = summary(summaries, instr.computation_attr(AttrKey::Body));
                    let cond = summary(summaries, instr.computation_attr(AttrKey::Condition));
                    let trip = match while_trip_count(module, comp, instr) {
                        Some(t) => t as f64,
                        None => {
                            log::debug!("while %{}: unknown trip count, assuming 1", instr.name);
                            1.0
                        }
                    };
                    let get =
                        |s: Option<&CompSummary>, f: fn(&CompSummary) -> f64| s.map_or(0.0, f);
                    mk += trip * (get(body, |s| s.makespan) + get(cond, |s| s.makespan))
                        + get(cond, |s| s.makespan);
                    lb += trip * (get(body, |s| s.lower_bound) + get(cond, |s| s.lower_bound))
                        + get(cond, |s| s.lower_bound);
                    sq += trip * (get(body, |s| s.sequential) + get(cond, |s| s.sequential))
                        + get(cond, |s| s.sequential);
                    let mut comm = [0.0; NUM_RESOURCES];
                    for s in [body, cond].into_iter().flatten() {
                        for (k, c) in comm.iter_mut().enumerate() {
                            *c += trip * s.comm_busy[k];
                        }
                    }
                    for s in [body, cond].into_iter().flatten() {
                        g.nested_resources[i] |= resource_mask(s);
                    }
                    g.nested_comm.push((i as u32, comm));
                    let exposed = trip
                        * (get(body, |s| s.exposed_comm) + get(cond, |s| s.exposed_comm))
                        + get(cond, |s| s.exposed_comm);
                    g.nested_exposed.push((i as u32, exposed));
                    let total = trip * (get(body, |s| s.total_comm) + get(cond, |s| s.total_comm))
                        + get(cond, |s| s.total_comm);
                    g.nested_total.push((i as u32, total));
                    let busy = trip
                        * (get(body, |s| s.compute_busy) + get(cond, |s| s.compute_busy))
                        + get(cond, |s| s.compute_busy);
                    g.nested_busy.push((i as u32, busy));
                    g.transient[i] = body
                        .map_or(0, |s| s.peak_temp)
                        .max(cond.map_or(0, |s| s.peak_temp));
                }
                Opcode::Call | Opcode::Conditional => {
                    let callees: Vec<&CompSummary> = if instr.opcode == Opcode::Call {
                        summary(summaries, instr.to_apply()).into_iter().collect()
                    } else {
                        instr
                            .called_computations()
                            .into_iter()
                            .filter_map(|c| summary(summaries, Some(c)))
                            .collect()
                    };
                    if !callees.is_empty() {
                        let max = |f: fn(&CompSummary) -> f64| {
                            callees.iter().map(|s| f(s)).fold(0.0f64, f64::max)
                        };
                        mk += max(|s| s.makespan);
                        lb += max(|s| s.lower_bound);
                        sq += max(|s| s.sequential);
                        let mut comm = [f64::INFINITY; NUM_RESOURCES];
                        for s in &callees {
                            for (k, c) in comm.iter_mut().enumerate() {
                                *c = c.min(s.comm_busy[k]);
                            }
                        }
                        for s in &callees {
                            g.nested_resources[i] |= resource_mask(s);
                        }
                        g.nested_comm.push((i as u32, comm));
                        g.nested_exposed.push((i as u32, max(|s| s.exposed_comm)));
                        g.nested_total.push((i as u32, max(|s| s.total_comm)));
                        let busy = callees
                            .iter()
                            .map(|s| s.compute_busy)
                            .fold(f64::INFINITY, f64::min);
                        g.nested_busy.push((i as u32, busy));
                        g.transient[i] = callees.iter().map(|s| s.peak_temp).max().unwrap_or(0);
                    }
                }
                _ => {}
            }
            g.cost[i] = sane(mk);
            g.lb_cost[i] = sane(lb);
            g.seq_cost[i] = sane(sq);
        }
        Ok(g)
    }

    /// Extra latency on the edge `p -> s` (the transfer, for start -> done).
    #[inline]
    pub fn edge_latency(&self, p: usize, s: usize) -> f64 {
        if self.kind[p] == NodeKind::Start && self.pair[p] == s as u32 {
            self.latency[p]
        } else {
            0.0
        }
    }

    /// A topological order of the graph (smallest index first).
    pub fn topological(&self) -> Vec<u32> {
        topo_from_preds(self.n, &self.preds).unwrap_or_else(|| (0..self.n as u32).collect())
    }

    /// Longest path ending at each node (inclusive), with `weights` as node
    /// costs and transfers on start -> done edges (also when an update sits
    /// between them).
    pub fn top_levels(&self, weights: &[f64]) -> Vec<f64> {
        let mut tl = vec![0.0f64; self.n];
        for &i in &self.topological() {
            let i = i as usize;
            let mut t: f64 = 0.0;
            for &p in self.preds.get(i) {
                let p = p as usize;
                t = t.max(tl[p] + self.edge_latency(p, i));
            }
            if self.kind[i] == NodeKind::Done {
                let s = self.pair[i] as usize;
                if s < self.n {
                    t = t.max(tl[s] + self.latency[s]);
                }
            }
            tl[i] = t + weights[i];
        }
        tl
    }

    /// Longest path starting at each node (inclusive), with `weights` as
    /// node costs and transfers on start -> done edges.
    pub fn bottom_levels(&self, weights: &[f64], topo: &[u32]) -> Vec<f64> {
        let mut bl = vec![0.0f64; self.n];
        for &i in topo.iter().rev() {
            let i = i as usize;
            let mut t: f64 = 0.0;
            for &s in self.succs.get(i) {
                let s = s as usize;
                t = t.max(bl[s] + self.edge_latency(i, s));
            }
            if self.kind[i] == NodeKind::Start {
                let d = self.pair[i] as usize;
                if d < self.n {
                    t = t.max(bl[d] + self.latency[i]);
                }
            }
            bl[i] = t + weights[i];
        }
        bl
    }

    /// Lower bounds on the makespan of any valid order (see `LowerBounds`).
    /// With `detailed`, heads and tails of transfers also count the work
    /// of all their ancestors / descendants (serialized on the one compute
    /// stream), which costs a bitset pass over the graph.
    pub fn lower_bounds(&self, lanes: &[usize; NUM_RESOURCES], detailed: bool) -> LowerBounds {
        let w = &self.lb_cost;
        let topo = self.topological();
        let tl = self.top_levels(w);
        let bl = self.bottom_levels(w, &topo);
        let critical_path = tl.iter().copied().fold(0.0, f64::max);
        let stream_busy: f64 = w.iter().sum();
        let mut resource_busy = [0.0; NUM_RESOURCES];
        // Transfers: (node that issues, node that waits, resource).
        let mut transfers: Vec<(usize, usize, usize)> = Vec::new();
        for i in 0..self.n {
            let Some(r) = self.resource[i] else { continue };
            match self.kind[i] {
                NodeKind::Start => {
                    resource_busy[r.index()] += self.latency[i];
                    let d = self.pair[i] as usize;
                    if d < self.n {
                        transfers.push((i, d, r.index()));
                    }
                }
                NodeKind::SyncCollective => {
                    resource_busy[r.index()] += self.latency[i];
                    transfers.push((i, i, r.index()));
                }
                _ => {}
            }
        }
        for (_, c) in &self.nested_comm {
            for (k, v) in c.iter().enumerate() {
                if v.is_finite() {
                    resource_busy[k] += v;
                }
            }
        }
        for (k, r) in resource_busy.iter_mut().enumerate() {
            *r /= lanes[k].max(1) as f64;
        }
        // Heads (earliest transfer start) and tails (least work after it).
        let m = transfers.len();
        let mut head: Vec<f64> = Vec::with_capacity(m);
        let mut tail: Vec<f64> = Vec::with_capacity(m);
        for &(s, d, _) in &transfers {
            if s == d {
                head.push(tl[s] - w[s]);
                tail.push(bl[s] - w[s]);
            } else {
                head.push(tl[s]);
                tail.push(bl[d]);
            }
        }
        let mut stream_idle = 0.0;
        if detailed && m > 0 {
            if let Some((anc, desc)) = self.serial_sums(&transfers, &topo) {
                let idle = self.idle_chain(&transfers, &topo, &anc, &desc, stream_busy);
                // Before a transfer's issue the stream runs its ancestors
                // and sits idle through the chains that precede it;
                // likewise after its wait.
                for k in 0..m {
                    head[k] = head[k].max(anc[k] + idle.before[k]);
                    tail[k] = tail[k].max(desc[k] + idle.after[k]);
                }
                stream_idle = idle.longest;
            }
        }
        let mut machine = [0.0f64; NUM_RESOURCES];
        for r in 0..NUM_RESOURCES {
            // Transfers of r, and loops / calls whose callees use r (each
            // holds one slot of r while it runs).
            let items: Vec<(f64, f64, f64)> = (0..m)
                .filter(|&k| transfers[k].2 == r)
                .map(|k| (head[k], self.latency[transfers[k].0], tail[k]))
                .chain(
                    (0..self.n)
                        .filter(|&i| self.nested_resources[i] & (1 << r) != 0)
                        .map(|i| (tl[i] - w[i], w[i], bl[i] - w[i])),
                )
                .collect();
            machine[r] = one_machine_bound(&items, lanes[r].max(1) as f64);
        }
        // The compute stream as one machine: nodes that cost time, with
        // their earliest start and least work after them.
        let items: Vec<(f64, f64, f64)> = (0..self.n)
            .filter(|&i| w[i] > 0.0)
            .map(|i| (tl[i] - w[i], w[i], bl[i] - w[i]))
            .collect();
        let stream_machine = one_machine_bound(&items, 1.0);
        LowerBounds {
            critical_path,
            stream_busy,
            stream_idle,
            resource_busy,
            resource_machine: machine,
            stream_machine,
        }
    }

    /// Time the compute stream must sit idle: while transfer `k` is in
    /// flight (from its issue to its wait) only the work concurrent with it
    /// (`free_k`: neither an ancestor of the issue nor a descendant of the
    /// wait) can run, so at least `latency_k - free_k` of that interval is
    /// idle. Transfers where each one's wait precedes the next one's issue
    /// have disjoint intervals, so their idle times add up: the bound is
    /// the heaviest such chain. (`anc`/`desc` from `serial_sums`.)
    ///
    /// Also per transfer the heaviest chain that ends before its issue
    /// (`before`) and that starts after its wait (`after`).
    fn idle_chain(
        &self,
        transfers: &[(usize, usize, usize)],
        topo: &[u32],
        anc: &[f64],
        desc: &[f64],
        stream_busy: f64,
    ) -> IdleChains {
        let m = transfers.len();
        let words = m.div_ceil(64);
        let w = &self.lb_cost;
        let weight: Vec<f64> = transfers
            .iter()
            .enumerate()
            .map(|(k, &(s, d, _))| {
                let own = if s == d { w[s] } else { 0.0 };
                let free = (stream_busy - anc[k] - desc[k] - own).max(0.0);
                (self.latency[s] - free).max(0.0)
            })
            .collect();
        if weight.iter().all(|&x| x <= 0.0) {
            return IdleChains {
                longest: 0.0,
                before: vec![0.0; m],
                after: vec![0.0; m],
            };
        }
        let mut wait_of = vec![u32::MAX; self.n];
        let mut issue_of = vec![u32::MAX; self.n];
        for (k, &(s, d, _)) in transfers.iter().enumerate() {
            wait_of[d] = k as u32;
            issue_of[s] = k as u32;
        }
        // Forward: the heaviest chain ending with each transfer, and the
        // heaviest before its issue; backward, the same after its wait.
        let (chain, before) = chain_pass(
            topo.iter().map(|&i| i as usize),
            &self.preds,
            &issue_of,
            &wait_of,
            &weight,
            words,
        );
        let (_, after) = chain_pass(
            topo.iter().rev().map(|&i| i as usize),
            &self.succs,
            &wait_of,
            &issue_of,
            &weight,
            words,
        );
        IdleChains {
            longest: chain.iter().copied().fold(0.0, f64::max),
            before,
            after,
        }
    }

    /// For each transfer: the total work of its issuing node's ancestors
    /// (issuing node included) and of its waiting node's descendants
    /// (waiting node included). `None` when the bitsets would be too big.
    fn serial_sums(
        &self,
        transfers: &[(usize, usize, usize)],
        topo: &[u32],
    ) -> Option<(Vec<f64>, Vec<f64>)> {
        let m = transfers.len();
        let words = m.div_ceil(64);
        if self.n.checked_mul(words)? > 16_000_000 {
            return None;
        }
        let w = &self.lb_cost;
        let mut issue_of = vec![u32::MAX; self.n];
        let mut wait_of = vec![u32::MAX; self.n];
        for (k, &(s, d, _)) in transfers.iter().enumerate() {
            issue_of[s] = k as u32;
            wait_of[d] = k as u32;
        }
        let mut bits = vec![0u64; self.n * words];
        let mut acc = vec![0.0f64; m];
        // Ancestors: node n is an ancestor-or-self of transfer k's issue.
        for &i in topo.iter().rev() {
            let i = i as usize;
            for &s in self.succs.get(i) {
                let s = s as usize;
                for x in 0..words {
                    bits[i * words + x] |= bits[s * words + x];
                }
            }
            if issue_of[i] != u32::MAX {
                let k = issue_of[i] as usize;
                bits[i * words + k / 64] |= 1 << (k % 64);
            }
        }
        for i in 0..self.n {
            if w[i] > 0.0 {
                for x in 0..words {
                    let mut b = bits[i * words + x];
                    while b != 0 {
                        acc[x * 64 + b.trailing_zeros() as usize] += w[i];
                        b &= b - 1;
                    }
                }
            }
        }
        let anc = acc;
        // For sync collectives the transfer is the node itself: not before it.
        let mut anc = anc;
        for (k, &(s, d, _)) in transfers.iter().enumerate() {
            if s == d {
                anc[k] -= w[s];
            }
        }
        bits.iter_mut().for_each(|b| *b = 0);
        let mut acc = vec![0.0f64; m];
        for &i in topo {
            let i = i as usize;
            for &p in self.preds.get(i) {
                let p = p as usize;
                for x in 0..words {
                    bits[i * words + x] |= bits[p * words + x];
                }
            }
            if wait_of[i] != u32::MAX {
                let k = wait_of[i] as usize;
                bits[i * words + k / 64] |= 1 << (k % 64);
            }
        }
        for i in 0..self.n {
            if w[i] > 0.0 {
                for x in 0..words {
                    let mut b = bits[i * words + x];
                    while b != 0 {
                        acc[x * 64 + b.trailing_zeros() as usize] += w[i];
                        b &= b - 1;
                    }
                }
            }
        }
        for (k, &(s, d, _)) in transfers.iter().enumerate() {
            if s == d {
                acc[k] -= w[d];
            }
        }
        Some((anc, acc))
    }
}

/// One direction of `Graph::idle_chain`: visiting nodes in `order` (each
/// after its `links`), a bitset per node of the transfers marked at or
/// before it (`mark[i]`: the transfer whose bit node `i` sets, after use);
/// at node `i` with `at[i] = k`, the heaviest chain among those gives
/// `prior[k]`, and `chain[k] = prior[k] + weight[k]`. Returns
/// `(chain, prior)`.
fn chain_pass(
    order: impl Iterator<Item = usize>,
    links: &Csr,
    at: &[u32],
    mark: &[u32],
    weight: &[f64],
    words: usize,
) -> (Vec<f64>, Vec<f64>) {
    let m = weight.len();
    let n = at.len();
    let mut seen = vec![0u64; n * words];
    let mut chain = vec![0.0f64; m];
    let mut prior = vec![0.0f64; m];
    for i in order {
        for &l in links.get(i) {
            let l = l as usize;
            for x in 0..words {
                seen[i * words + x] |= seen[l * words + x];
            }
        }
        if at[i] != u32::MAX {
            let k = at[i] as usize;
            let mut v = 0.0f64;
            for (x, &word) in seen[i * words..(i + 1) * words].iter().enumerate() {
                let mut b = word;
                while b != 0 {
                    v = v.max(chain[x * 64 + b.trailing_zeros() as usize]);
                    b &= b - 1;
                }
            }
            prior[k] = v;
            chain[k] = v + weight[k];
        }
        if mark[i] != u32::MAX {
            let k = mark[i] as usize;
            seen[i * words + k / 64] |= 1 << (k % 64);
        }
    }
    (chain, prior)
}

/// Result of `Graph::idle_chain`.
struct IdleChains {
    longest: f64,
    before: Vec<f64>,
    after: Vec<f64>,
}

/// Lower bounds of one computation (µs); `value()` is their maximum.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LowerBounds {
    /// Longest dependency path (nested lower bounds, transfers on edges).
    pub critical_path: f64,
    /// Total time the compute stream must be busy.
    pub stream_busy: f64,
    /// Time the compute stream must be idle (see `Graph::idle_chain`);
    /// `stream_busy + stream_idle` is a bound.
    pub stream_idle: f64,
    /// Each resource's total transfer time over its lanes.
    pub resource_busy: [f64; NUM_RESOURCES],
    /// Each resource as a machine with release times (work that must
    /// precede a transfer) and tails (work that must follow it):
    /// `max over subsets of (earliest head + transfers / lanes + least tail)`.
    pub resource_machine: [f64; NUM_RESOURCES],
    /// The same bound for the compute stream.
    pub stream_machine: f64,
}

impl LowerBounds {
    pub fn value(&self) -> f64 {
        let mut v = self
            .critical_path
            .max(self.stream_busy + self.stream_idle)
            .max(self.stream_machine);
        for k in 0..NUM_RESOURCES {
            v = v.max(self.resource_busy[k]).max(self.resource_machine[k]);
        }
        v
    }
}

/// Lower bound for jobs `(head, length, tail)` on `lanes` parallel
/// machines: for the jobs whose head is at least `h`, nothing starts
/// before `h`, their work takes `sum / lanes`, and the last one still
/// needs its tail; symmetrically for tails. Also each job alone.
pub fn one_machine_bound(items: &[(f64, f64, f64)], lanes: f64) -> f64 {
    if items.is_empty() {
        return 0.0;
    }
    let mut best = items.iter().map(|&(h, p, q)| h + p + q).fold(0.0, f64::max);
    let mut by_head: Vec<&(f64, f64, f64)> = items.iter().collect();
    by_head.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (mut sum, mut min_tail) = (0.0f64, f64::INFINITY);
    for &&(h, p, q) in &by_head {
        sum += p;
        min_tail = min_tail.min(q);
        best = best.max(h + sum / lanes + min_tail);
    }
    let mut by_tail: Vec<&(f64, f64, f64)> = items.iter().collect();
    by_tail.sort_by(|a, b| b.2.total_cmp(&a.2));
    let (mut sum, mut min_head) = (0.0f64, f64::INFINITY);
    for &&(h, p, q) in &by_tail {
        sum += p;
        min_head = min_head.min(h);
        best = best.max(min_head + sum / lanes + q);
    }
    best
}

/// Bit `r` set when the computation moves data of resource `r`.
fn resource_mask(s: &CompSummary) -> u16 {
    let mut m = 0u16;
    for (r, &busy) in s.comm_busy.iter().enumerate() {
        if busy > 0.0 {
            m |= 1 << r;
        }
    }
    m
}

fn sane(x: f64) -> f64 {
    crate::cost::sane(x)
}
