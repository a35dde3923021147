//! The exact scheduler (`exact::solve`) against brute force: on random
//! computations of compute ops and async collectives on two resources
//! (up to 14 nodes in release builds, small enough to enumerate every
//! valid order through the simulator), it finishes with gap 0 and its makespan is the minimum over
//! all orders; started from a poor order it finds that minimum too; and
//! with no time it still returns a valid order and a bound below it.

mod common;

use common::{fixed, parse};
use std::time::Duration;
use xla_hlo_ir::HloModule;
use xla_latency_hiding_scheduler::exact::{solve, solve_within_memory};
use xla_latency_hiding_scheduler::graph::{Graph, NodeKind};
use xla_latency_hiding_scheduler::simulator::{peak_total_of, simulate_graph};
use xla_latency_hiding_scheduler::{CostModel, NUM_RESOURCES};

/// A small deterministic generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random entry computation: two parameters, then `ops` instructions,
/// each a compute op on earlier values or an async all-reduce or
/// all-gather pair; costs (µs) per instruction name. Every value is an
/// output.
fn random_module(rng: &mut Rng, ops: usize) -> (String, Vec<(String, f64)>) {
    random_module_with(rng, ops, true)
}

/// `random_module`; with `all_outputs` false only values nothing uses are
/// outputs, so buffers die at their last use and the order sets the peak.
fn random_module_with(
    rng: &mut Rng,
    ops: usize,
    all_outputs: bool,
) -> (String, Vec<(String, f64)>) {
    let mut lines = vec![
        "  %p0 = f32[4] parameter(0)".to_string(),
        "  %p1 = f32[4] parameter(1)".to_string(),
    ];
    let mut values = vec!["p0".to_string(), "p1".to_string()];
    let mut costs = Vec::new();
    let mut made = 0;
    while made < ops {
        let a = values[rng.below(values.len() as u64) as usize].clone();
        let b = values[rng.below(values.len() as u64) as usize].clone();
        let k = values.len();
        match rng.below(4) {
            0 if made + 2 <= ops => {
                let (start, done) = (format!("ars{k}"), format!("ard{k}"));
                lines.push(format!(
                    "  %{start} = f32[4] all-reduce-start(%{a}), replica_groups={{}}, to_apply=%sum"
                ));
                lines.push(format!("  %{done} = f32[4] all-reduce-done(%{start})"));
                costs.push((start, 1.0 + rng.below(40) as f64));
                values.push(done);
                made += 2;
            }
            1 if made + 3 <= ops => {
                let (start, done) = (format!("ags{k}"), format!("agd{k}"));
                lines.push(format!(
                    "  %{start} = (f32[4], f32[8]) all-gather-start(%{a}), replica_groups={{{{0,1}}}}, dimensions={{0}}"
                ));
                lines.push(format!("  %{done} = f32[8] all-gather-done(%{start})"));
                let slice = format!("sl{k}");
                lines.push(format!(
                    "  %{slice} = f32[4] slice(%{done}), slice={{[0:4]}}"
                ));
                costs.push((start, 1.0 + rng.below(40) as f64));
                costs.push((slice.clone(), rng.below(3) as f64));
                values.push(slice);
                made += 3;
            }
            _ => {
                let name = format!("c{k}");
                lines.push(format!("  %{name} = f32[4] add(%{a}, %{b})"));
                costs.push((name.clone(), 1.0 + rng.below(30) as f64));
                values.push(name);
                made += 1;
            }
        }
    }
    let used: std::collections::HashSet<String> = lines
        .iter()
        .flat_map(|line| {
            let operands = line.split_once('(').map_or("", |(_, rest)| rest);
            operands
                .split(|c: char| !c.is_alphanumeric())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    let outputs: Vec<String> = values
        .iter()
        .filter(|v| all_outputs || !used.contains(*v))
        .map(|v| format!("%{v}"))
        .collect();
    let shapes: Vec<&str> = outputs.iter().map(|_| "f32[4]").collect();
    let text = format!(
        "HloModule r, num_partitions=2\n\n%sum (x: f32[], y: f32[]) -> f32[] {{\n  %x = f32[] parameter(0)\n  %y = f32[] parameter(1)\n  ROOT %s = f32[] add(%x, %y)\n}}\n\nENTRY %e (p0: f32[4], p1: f32[4]) -> ({}) {{\n{}\n  ROOT %out = ({}) tuple({})\n}}\n",
        shapes.join(", "),
        lines.join("\n"),
        shapes.join(", "),
        outputs.join(", ")
    );
    (text, costs)
}

fn graph(module: &HloModule, model: &dyn CostModel) -> Graph {
    let summaries = vec![None; module.computations.len()];
    Graph::build(module, module.entry, model, &summaries).unwrap()
}

fn makespan(g: &Graph, order: &[u32], limits: &[usize; NUM_RESOURCES]) -> f64 {
    simulate_graph(g, order, limits, None, false).0.makespan
}

/// The minimum makespan over every valid order of `g`: topological, and
/// never more than `limits[r]` operations of resource `r` in flight (the
/// schedule validator's rule).
fn brute_force(g: &Graph, limits: &[usize; NUM_RESOURCES]) -> (f64, usize) {
    brute_force_within(g, limits, u64::MAX)
}

/// `brute_force` over the orders whose peak of live bytes
/// (`memory::peak_of_order`, parameters included) is at most `memory`:
/// `(minimum makespan, orders counted)`; infinity when none fits.
fn brute_force_within(g: &Graph, limits: &[usize; NUM_RESOURCES], memory: u64) -> (f64, usize) {
    struct Walk<'a> {
        g: &'a Graph,
        limits: &'a [usize; NUM_RESOURCES],
        remaining: Vec<usize>,
        in_flight: [usize; NUM_RESOURCES],
        order: Vec<u32>,
        best: f64,
        count: usize,
        memory: u64,
    }
    impl Walk<'_> {
        fn walk(&mut self) {
            let g = self.g;
            if self.order.len() == g.n {
                self.count += 1;
                if peak_total_of(g, &self.order) <= self.memory {
                    self.best = self.best.min(makespan(g, &self.order, self.limits));
                }
                return;
            }
            for i in 0..g.n {
                if self.remaining[i] != 0 || self.order.contains(&(i as u32)) {
                    continue;
                }
                let resource = g.resource[i].map(|r| r.index());
                let delta: isize = match (g.kind[i], resource) {
                    (NodeKind::Start, Some(r)) => {
                        if self.in_flight[r] >= self.limits[r] {
                            continue;
                        }
                        1
                    }
                    (NodeKind::Done, Some(_)) => -1,
                    _ => 0,
                };
                if let Some(r) = resource {
                    self.in_flight[r] = self.in_flight[r].wrapping_add_signed(delta);
                }
                self.order.push(i as u32);
                for &s in g.succs.get(i) {
                    self.remaining[s as usize] -= 1;
                }
                self.walk();
                for &s in g.succs.get(i) {
                    self.remaining[s as usize] += 1;
                }
                self.order.pop();
                if let Some(r) = resource {
                    self.in_flight[r] = self.in_flight[r].wrapping_add_signed(-delta);
                }
            }
        }
    }
    let mut walk = Walk {
        g,
        limits,
        remaining: (0..g.n).map(|i| g.preds.get(i).len()).collect(),
        in_flight: [0; NUM_RESOURCES],
        order: Vec::new(),
        best: f64::INFINITY,
        count: 0,
        memory,
    };
    walk.walk();
    (walk.best, walk.count)
}

/// A valid but poor order: the topological order that always takes the
/// highest-numbered ready node (with every async pair's done right after
/// its start, so no overlap limit binds).
fn poor_order(g: &Graph) -> Vec<u32> {
    let mut remaining: Vec<usize> = (0..g.n).map(|i| g.preds.get(i).len()).collect();
    let mut placed = vec![false; g.n];
    let mut order = Vec::new();
    while order.len() < g.n {
        let i = (0..g.n)
            .rev()
            .find(|&i| !placed[i] && remaining[i] == 0)
            .expect("a ready node");
        let pair = (g.kind[i] == NodeKind::Start).then_some(g.pair[i] as usize);
        for node in std::iter::once(i).chain(pair) {
            placed[node] = true;
            order.push(node as u32);
            for &s in g.succs.get(node) {
                remaining[s as usize] -= 1;
            }
        }
    }
    order
}

#[test]
fn exact_schedules_are_optimal_against_brute_force() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut checked = 0;
    let mut orders_enumerated = 0;
    let mut largest = 0;
    for case in 0..60 {
        // Debug builds (Bazel's default) enumerate smaller computations.
        let ops = 4 + case % if cfg!(debug_assertions) { 5 } else { 8 };
        let (text, costs) = random_module(&mut rng, ops);
        let module = parse(&text);
        let costs: Vec<(&str, f64)> = costs.iter().map(|(n, c)| (n.as_str(), *c)).collect();
        let model = fixed(&costs);
        let g = graph(&module, model.as_ref());
        largest = largest.max(g.n);
        for lanes in [1, 2] {
            let limits = [lanes; NUM_RESOURCES];
            let (optimum, count) = brute_force(&g, &limits);
            orders_enumerated += count;
            let start = poor_order(&g);
            let exact = solve(&g, &limits, &start, Duration::from_secs(10));
            assert!(exact.optimal, "case {case}: search did not finish\n{text}");
            assert_eq!(exact.gap(), 0.0);
            assert!(
                (exact.makespan - optimum).abs() <= 1e-9 * (1.0 + optimum),
                "case {case}, {lanes} lanes: exact {} but brute force {optimum} over {count} orders\n{text}",
                exact.makespan
            );
            assert!((makespan(&g, &exact.order, &limits) - exact.makespan).abs() < 1e-9);
            assert!(exact.makespan <= makespan(&g, &start, &limits) + 1e-9);
            checked += 1;
        }
    }
    eprintln!(
        "{checked} computations of up to {largest} nodes, {orders_enumerated} orders enumerated"
    );
    assert_eq!(checked, 120);
}

/// Under a memory limit between the least and the greatest peak of any
/// order, the exact search finds the fastest fitting order (brute force
/// over every order), never returns one above the limit, and when the
/// start order does not fit, still returns a fitting one.
#[test]
fn exact_schedules_under_a_memory_limit_are_optimal_against_brute_force() {
    let mut rng = Rng(0x5151_7a7a_0102_0304);
    let mut checked = 0;
    let mut binding = 0;
    for case in 0..40 {
        let ops = 4 + case % if cfg!(debug_assertions) { 5 } else { 8 };
        let (text, costs) = random_module_with(&mut rng, ops, false);
        let module = parse(&text);
        let costs: Vec<(&str, f64)> = costs.iter().map(|(n, c)| (n.as_str(), *c)).collect();
        let model = fixed(&costs);
        let g = graph(&module, model.as_ref());
        let limits = [1; NUM_RESOURCES];
        let (free_optimum, _) = brute_force(&g, &limits);
        // The least peak over all orders, and a limit halfway to the peak
        // of the poor start order.
        let start = poor_order(&g);
        let start_peak = peak_total_of(&g, &start);
        let least = least_peak(&g);
        for memory in [least, (least + start_peak) / 2] {
            let (optimum, count) = brute_force_within(&g, &limits, memory);
            assert!(optimum.is_finite(), "case {case}: no order fits {memory}");
            let exact =
                solve_within_memory(&g, &limits, &start, Duration::from_secs(10), Some(memory));
            assert!(exact.optimal, "case {case}: search did not finish\n{text}");
            assert!(exact.fits_memory, "case {case}: no fitting order found");
            assert!(peak_total_of(&g, &exact.order) <= memory);
            assert_eq!(exact.peak_bytes, peak_total_of(&g, &exact.order));
            assert!(
                (exact.makespan - optimum).abs() <= 1e-9 * (1.0 + optimum),
                "case {case}, limit {memory}: exact {} but brute force {optimum} over {count} orders\n{text}",
                exact.makespan
            );
            if optimum > free_optimum + 1e-9 {
                binding += 1;
            }
            checked += 1;
        }
    }
    eprintln!("{checked} computations under a memory limit, {binding} where it binds");
    assert_eq!(checked, 80);
    assert!(binding >= 5, "the limit bound only {binding} times");
}

/// The least peak of live bytes over every valid order (one lane).
fn least_peak(g: &Graph) -> u64 {
    fn walk(g: &Graph, remaining: &mut Vec<usize>, order: &mut Vec<u32>, best: &mut u64) {
        if order.len() == g.n {
            *best = (*best).min(peak_total_of(g, order));
            return;
        }
        for i in 0..g.n {
            if remaining[i] != 0 || order.contains(&(i as u32)) {
                continue;
            }
            order.push(i as u32);
            for &s in g.succs.get(i) {
                remaining[s as usize] -= 1;
            }
            walk(g, remaining, order, best);
            for &s in g.succs.get(i) {
                remaining[s as usize] += 1;
            }
            order.pop();
        }
    }
    let mut remaining: Vec<usize> = (0..g.n).map(|i| g.preds.get(i).len()).collect();
    let mut best = u64::MAX;
    walk(g, &mut remaining, &mut Vec::new(), &mut best);
    best
}

#[test]
fn without_time_the_start_order_and_a_valid_bound_come_back() {
    let mut rng = Rng(42);
    let (text, costs) = random_module(&mut rng, 9);
    let module = parse(&text);
    let costs: Vec<(&str, f64)> = costs.iter().map(|(n, c)| (n.as_str(), *c)).collect();
    let model = fixed(&costs);
    let g = graph(&module, model.as_ref());
    let limits = [1; NUM_RESOURCES];
    let start = poor_order(&g);
    let exact = solve(&g, &limits, &start, Duration::ZERO);
    let (optimum, _) = brute_force(&g, &limits);
    assert!(exact.bound <= optimum + 1e-9, "bound above the optimum");
    assert!(exact.makespan >= optimum - 1e-9);
    assert!(exact.makespan <= makespan(&g, &start, &limits) + 1e-9);
    if !exact.optimal {
        assert!(exact.gap() >= 0.0);
    }
}

/// With a time limit for the exact search, the scheduler never returns a
/// slower schedule than the list scheduler alone, on XLA's partitioned
/// programs of testdata's cases; held to the list schedule's peak as its
/// memory limit, it still never is, and its peak stays within it.
#[test]
fn the_scheduler_with_exact_search_is_never_slower() {
    use xla_latency_hiding_scheduler::SchedulerConfig;
    let model = xla_latency_hiding_scheduler::cost_model_from_spec("analytical").unwrap();
    let mut compared = 0;
    for dir in xla_test_paths::case_dirs(&xla_test_paths::testdata_cases())
        .into_iter()
        .take(60)
    {
        let Ok(text) = std::fs::read_to_string(dir.join("xla_partitioned.hlo")) else {
            continue;
        };
        let module = parse(&text);
        let list = common::schedule(&module, &SchedulerConfig::default(), model.as_ref()).1;
        let with_exact = SchedulerConfig {
            exact_time_limit: Some(Duration::from_millis(50)),
            ..Default::default()
        };
        let exact = common::schedule(&module, &with_exact, model.as_ref()).1;
        assert!(
            exact.entry.makespan <= list.entry.makespan * (1.0 + 1e-9),
            "{}: {} > {}",
            dir.display(),
            exact.entry.makespan,
            list.entry.makespan
        );
        let held = SchedulerConfig {
            memory_limit: Some(list.entry.peak_total),
            ..with_exact
        };
        let within = common::schedule(&module, &held, model.as_ref()).1;
        assert!(within.entry.peak_total <= list.entry.peak_total);
        assert!(
            within.entry.makespan <= list.entry.makespan * (1.0 + 1e-9),
            "{}: {} > {} under the memory limit",
            dir.display(),
            within.entry.makespan,
            list.entry.makespan
        );
        compared += 1;
    }
    assert!(compared >= 50, "only {compared} modules");
}
