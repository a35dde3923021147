//! The list scheduler of one computation, bottom-up as XLA's
//! `DefaultSchedulerCore`: nodes are placed from the end of the program to
//! its start, a node becoming ready once all its users are placed, with a
//! clock that runs backwards on the compute stream.
//!
//! Selection, in order (a reduced form of `ReadySetLt`):
//! 1. free bookkeeping nodes (XLA's NOP set);
//! 2. under memory pressure (live bytes above `threshold × limit`): the
//!    ready node that adds the fewest live bytes (or, as a last resort,
//!    the latest in the original order: the input order and no new
//!    overlap), which is what the rerun levels tighten;
//! 3. `kScheduleDone`: an async done whose resource has a free slot
//!    (bottom-up, a done occupies its resource until its start is placed),
//!    best critical-path priority first;
//! 4. `kLessStall`: an async start whose transfer is already covered by
//!    the compute placed since its done (it releases the resource, and a
//!    late start keeps its buffers short-lived);
//! 5. the compute node first in `Priority` (by default the latest in the
//!    original order, XLA's `kOriginalOrder`; optionally async depth or
//!    critical path first), ties to the original order;
//! 6. otherwise the start that stalls least (the clock jumps: exposed
//!    communication).
//!
//! A loop, call or branch whose callees move data of a kind counts as one
//! more operation of that kind while it runs (XLA's while aggregates its
//! body's resources), so no transfer of that kind spans it beyond the
//! limit.
//!
//! Every choice pops a binary heap, so a computation of `n` nodes and `e`
//! edges is scheduled in `O((n + e) log n)`.
//!
//! Invariants: the result is a permutation of the nodes in dependency
//! order; at no point are more async operations of one resource open than
//! its limit allows (except as a logged last resort when a malformed
//! module leaves no other choice); equal inputs give equal outputs.

use crate::graph::{Csr, Graph, NodeKind, NONE};
use crate::kinds::NUM_RESOURCES;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// When memory pressure takes over.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryPolicy {
    /// The limit in bytes (parameters included).
    pub limit: u64,
    /// Pressure mode starts when live bytes exceed `threshold × limit`.
    pub threshold: f64,
    /// Which ready node pressure mode takes.
    pub order: PressureOrder,
}

/// The choice under memory pressure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PressureOrder {
    /// The node whose placement adds the fewest live bytes (bottom-up: the
    /// operands it makes live minus the results it ends), ties to the
    /// original order. A done adds its transfer's buffers, so overlap
    /// only happens where it costs no memory.
    #[default]
    LeastMemory,
    /// The latest node in the original order (the input order, no new
    /// overlap).
    Original,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct PKey {
    /// Negated byte delta (larger is better).
    neg_delta: i128,
    idx: u32,
}

#[derive(Clone, Copy, PartialEq)]
struct Pri {
    p: f64,
    idx: u32,
}
impl Eq for Pri {}
impl PartialOrd for Pri {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Pri {
    fn cmp(&self, o: &Self) -> Ordering {
        self.p.total_cmp(&o.p).then(self.idx.cmp(&o.idx))
    }
}

/// True when every resource in `mask` has a free slot.
fn nested_fits(
    mask: u16,
    inflight: &[usize; NUM_RESOURCES],
    limits: &[usize; NUM_RESOURCES],
) -> bool {
    mask == 0 || (0..NUM_RESOURCES).all(|r| mask & (1 << r) == 0 || inflight[r] < limits[r])
}

/// How ready compute nodes are ranked (rule 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Priority {
    /// Schedule with `OriginalOrder` and, when that leaves communication
    /// exposed, with `AsyncDepth`; keep the async-depth schedule when its
    /// simulated makespan is shorter and its peak memory no higher, or
    /// when it is more than 2% shorter (it tends to hold more memory).
    /// Decided by the pass per computation; `schedule_graph` treats it as
    /// `OriginalOrder`.
    #[default]
    Auto,
    /// The input order (XLA's `kOriginalOrder`): compute stays where it
    /// was unless a transfer needs room, so memory stays near the input's.
    OriginalOrder,
    /// XLA's `kAsyncDepth` (aggressive policies): transfer latency above
    /// the node first, then the input order.
    AsyncDepth,
    /// Longest path from the inputs, compute and transfers included.
    CriticalPath,
}

/// Schedules `g` under per-resource overlap `limits`; returns the forward
/// order (node indices).
pub fn schedule_graph(
    g: &Graph,
    limits: &[usize; NUM_RESOURCES],
    memory: Option<MemoryPolicy>,
    priority: Priority,
) -> Vec<u32> {
    let n = g.n;
    let tl = match priority {
        Priority::OriginalOrder | Priority::Auto => vec![0.0; n],
        Priority::AsyncDepth => g.top_levels(&vec![0.0; n]),
        Priority::CriticalPath => g.top_levels(&g.cost),
    };
    let mut remaining: Vec<u32> = (0..n).map(|i| g.succs.get(i).len() as u32).collect();
    let mut ready_time = vec![0.0f64; n];
    let mut scheduled = vec![false; n];
    let mut inflight = [0usize; NUM_RESOURCES];
    let mut nops: BinaryHeap<u32> = BinaryHeap::new();
    let mut dones: Vec<BinaryHeap<Pri>> = (0..NUM_RESOURCES).map(|_| BinaryHeap::new()).collect();
    let mut starts: BinaryHeap<Reverse<Pri>> = BinaryHeap::new();
    let mut compute: BinaryHeap<Pri> = BinaryHeap::new();
    let mut pressure: BinaryHeap<PKey> = BinaryHeap::new();
    let mut out_rev: Vec<u32> = Vec::with_capacity(n);
    let mut t = 0.0f64;

    // Memory tracking (bottom-up: a buffer becomes live at its last use
    // and dies at its definition).
    let bufs = &g.buffers;
    let mut live = vec![false; bufs.num_buffers()];
    let mut live_bytes: u64 = 0;
    for &b in &bufs.root_uses {
        let b = b as usize;
        if b < live.len() && !bufs.is_param[b] && !live[b] {
            live[b] = true;
            live_bytes += bufs.size[b];
        }
    }
    let limits: [usize; NUM_RESOURCES] = limits.map(|l| l.max(1));
    let least_memory = memory.is_some_and(|m| m.order == PressureOrder::LeastMemory);
    // Users of each buffer (to refresh their deltas when it becomes live).
    let buffer_users: Csr = if least_memory {
        let mut lists: Vec<Vec<u32>> = vec![Vec::new(); bufs.num_buffers()];
        for i in 0..n {
            for &b in bufs.uses.get(i) {
                lists[b as usize].push(i as u32);
            }
        }
        Csr::from_lists(&lists)
    } else {
        Csr::default()
    };
    // Bytes placing `i` now adds (bottom-up).
    let delta = |i: usize, live: &[bool]| -> i128 {
        if !least_memory {
            return 0;
        }
        let mut d: i128 = 0;
        for &b in bufs.uses.get(i) {
            let b = b as usize;
            if !bufs.is_param[b] && !live[b] {
                d += bufs.size[b] as i128;
            }
        }
        for &b in bufs.defs.get(i) {
            if live[b as usize] {
                d -= bufs.size[b as usize] as i128;
            }
        }
        d
    };

    macro_rules! push_ready {
        ($i:expr) => {{
            let i: usize = $i;
            match g.kind[i] {
                NodeKind::Nop | NodeKind::Update => nops.push(i as u32),
                NodeKind::Done => {
                    let r = g.resource[i].map_or(0, |r| r.index());
                    dones[r].push(Pri {
                        p: tl[i],
                        idx: i as u32,
                    });
                    if memory.is_some() {
                        pressure.push(PKey {
                            neg_delta: -delta(i, &live),
                            idx: i as u32,
                        });
                    }
                }
                NodeKind::Start if g.pair[i] != NONE => {
                    starts.push(Reverse(Pri {
                        p: ready_time[i],
                        idx: u32::MAX - i as u32,
                    }));
                    if memory.is_some() {
                        pressure.push(PKey {
                            neg_delta: -delta(i, &live),
                            idx: i as u32,
                        });
                    }
                }
                _ => {
                    compute.push(Pri {
                        p: tl[i],
                        idx: i as u32,
                    });
                    if memory.is_some() {
                        pressure.push(PKey {
                            neg_delta: -delta(i, &live),
                            idx: i as u32,
                        });
                    }
                }
            }
        }};
    }

    for (i, &r) in remaining.clone().iter().enumerate() {
        if r == 0 {
            push_ready!(i);
        }
    }

    while out_rev.len() < n {
        let mut pick: Option<usize> = None;
        if let Some(i) = nops.pop() {
            pick = Some(i as usize);
        }
        if pick.is_none() {
            if let Some(pol) = memory {
                let now = live_bytes.saturating_add(bufs.param_bytes);
                if now as f64 > pol.limit as f64 * pol.threshold {
                    let mut blocked = Vec::new();
                    while let Some(top) = pressure.pop() {
                        let i = top.idx as usize;
                        if scheduled[i] {
                            continue;
                        }
                        let d = -delta(i, &live);
                        if d != top.neg_delta {
                            // Stale: its operands went live since.
                            pressure.push(PKey {
                                neg_delta: d,
                                idx: top.idx,
                            });
                            continue;
                        }
                        let ok = match g.kind[i] {
                            NodeKind::Done => {
                                let r = g.resource[i].map_or(0, |r| r.index());
                                inflight[r] < limits[r]
                            }
                            _ => nested_fits(g.nested_resources[i], &inflight, &limits),
                        };
                        if ok {
                            pick = Some(i);
                            break;
                        }
                        blocked.push(top);
                    }
                    pressure.extend(blocked);
                }
            }
        }
        if pick.is_none() {
            let mut best: Option<Pri> = None;
            for r in 0..NUM_RESOURCES {
                if inflight[r] >= limits[r] {
                    continue;
                }
                while let Some(top) = dones[r].peek() {
                    if scheduled[top.idx as usize] {
                        dones[r].pop();
                    } else {
                        break;
                    }
                }
                if let Some(&top) = dones[r].peek() {
                    let better = match best {
                        None => true,
                        Some(b) => top > b,
                    };
                    if better {
                        best = Some(top);
                    }
                }
            }
            if let Some(b) = best {
                let r = g.resource[b.idx as usize].map_or(0, |r| r.index());
                dones[r].pop();
                pick = Some(b.idx as usize);
            }
        }
        if pick.is_none() {
            while let Some(Reverse(top)) = starts.peek() {
                if scheduled[(u32::MAX - top.idx) as usize] {
                    starts.pop();
                } else {
                    break;
                }
            }
            if let Some(Reverse(top)) = starts.peek() {
                if top.p <= t {
                    let i = (u32::MAX - top.idx) as usize;
                    starts.pop();
                    pick = Some(i);
                }
            }
        }
        if pick.is_none() {
            let mut blocked = Vec::new();
            while let Some(top) = compute.pop() {
                let i = top.idx as usize;
                if scheduled[i] {
                    continue;
                }
                if !nested_fits(g.nested_resources[i], &inflight, &limits) {
                    blocked.push(top);
                    continue;
                }
                pick = Some(i);
                break;
            }
            compute.extend(blocked);
        }
        if pick.is_none() {
            if let Some(Reverse(top)) = starts.pop() {
                pick = Some((u32::MAX - top.idx) as usize);
            }
        }
        if pick.is_none() {
            // Only blocked nodes remain (a malformed pairing): take the best
            // compute node anyway.
            while let Some(top) = compute.pop() {
                if !scheduled[top.idx as usize] {
                    log::warn!("scheduler: a loop overlaps a transfer of a kind it uses");
                    pick = Some(top.idx as usize);
                    break;
                }
            }
        }
        if pick.is_none() {
            // Only dones over their limit remain: a malformed pairing.
            for heap in dones.iter_mut() {
                while let Some(top) = heap.pop() {
                    if !scheduled[top.idx as usize] {
                        log::warn!("scheduler: overlap limit exceeded to make progress");
                        pick = Some(top.idx as usize);
                        break;
                    }
                }
                if pick.is_some() {
                    break;
                }
            }
        }
        let Some(i) = pick else {
            // Nothing ready: cannot happen for an acyclic graph. Append the
            // rest in reverse arena order so the result is a permutation.
            for j in (0..n).rev() {
                if !scheduled[j] {
                    scheduled[j] = true;
                    out_rev.push(j as u32);
                }
            }
            break;
        };
        if scheduled[i] {
            continue;
        }
        // Place i.
        scheduled[i] = true;
        out_rev.push(i as u32);
        let begin = t.max(ready_time[i]);
        t = begin + g.cost[i];
        match g.kind[i] {
            NodeKind::Done => {
                let r = g.resource[i].map_or(0, |r| r.index());
                inflight[r] += 1;
                let s = g.pair[i] as usize;
                if s < n {
                    ready_time[s] = ready_time[s].max(t + g.latency[s]);
                }
            }
            NodeKind::Start => {
                let d = g.pair[i] as usize;
                if d < n && scheduled[d] {
                    let r = g.resource[i].map_or(0, |r| r.index());
                    inflight[r] = inflight[r].saturating_sub(1);
                }
            }
            _ => {}
        }
        for &b in bufs.uses.get(i) {
            let b = b as usize;
            if !bufs.is_param[b] && !live[b] {
                live[b] = true;
                live_bytes += bufs.size[b];
                if least_memory {
                    // Ready users and the definer now add fewer bytes.
                    let def = bufs.def[b];
                    let others = buffer_users
                        .get(b)
                        .iter()
                        .copied()
                        .chain((def != u32::MAX).then_some(def));
                    for u in others {
                        let u = u as usize;
                        if u < n && !scheduled[u] && remaining[u] == 0 && g.kind[u] != NodeKind::Nop
                        {
                            pressure.push(PKey {
                                neg_delta: -delta(u, &live),
                                idx: u as u32,
                            });
                        }
                    }
                }
            }
        }
        for &b in bufs.defs.get(i) {
            let b = b as usize;
            if live[b] {
                live[b] = false;
                live_bytes -= bufs.size[b];
            }
        }
        for &p in g.preds.get(i) {
            let p = p as usize;
            ready_time[p] = ready_time[p].max(t + g.edge_latency(p, i));
            remaining[p] -= 1;
            if remaining[p] == 0 {
                push_ready!(p);
            }
        }
    }
    out_rev.reverse();
    out_rev
}
