//! Small hand-written modules whose optimal schedule is known: the
//! scheduler must reach the optimal makespan (equal to the lower bound),
//! keep overlap limits, respect memory limits, schedule loop bodies, and
//! be deterministic.

mod common;

use common::*;
use xla_latency_hiding_scheduler::{ResourceKind, SchedulerConfig, SchedulerError, NUM_RESOURCES};

const ADD: &str = "%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %sum = f32[] add(%a, %b)\n}\n\n";

fn module(body: &str) -> String {
    format!("HloModule t, num_partitions=8\n\n{ADD}{body}")
}

/// One all-reduce independent of a four-op chain: the transfer (30) hides
/// behind the chain (40); optimum 41 = lower bound.
#[test]
fn all_reduce_hides_behind_independent_chain() {
    let m = parse(&module(
        "ENTRY %e (p0: f32[1024], p1: f32[1024]) -> f32[1024] {
  %p0 = f32[1024]{0} parameter(0)
  %p1 = f32[1024]{0} parameter(1)
  %ar = f32[1024]{0} all-reduce(%p0), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %c1 = f32[1024]{0} exponential(%p1)
  %c2 = f32[1024]{0} exponential(%c1)
  %c3 = f32[1024]{0} exponential(%c2)
  %c4 = f32[1024]{0} exponential(%c3)
  ROOT %r = f32[1024]{0} add(%ar, %c4)
}
",
    ));
    let model = fixed(&[
        ("c1", 10.0),
        ("c2", 10.0),
        ("c3", 10.0),
        ("c4", 10.0),
        ("r", 1.0),
        ("ar", 30.0),
    ]);
    let (out, sim) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    let e = &sim.entry;
    assert!(close(e.makespan, 41.0), "makespan {}", e.makespan);
    assert!(close(e.lower_bound, 41.0), "lower bound {}", e.lower_bound);
    assert!(close(e.sequential, 71.0), "sequential {}", e.sequential);
    assert!(close(e.exposed_comm, 0.0));
    assert!(pos(&out, "ar-start") < pos(&out, "c2"));
    assert!(pos(&out, "ar-done") > pos(&out, "c3"));
    assert!(out.config.is_scheduled);
    assert!(out.to_text().starts_with("HloModule t, is_scheduled=true"));
}

/// The all-reduce depends on compute and feeds compute; only the
/// independent chain can hide it: optimum 41 (c1, start, d1..d3, done, r).
#[test]
fn dependent_collective_overlaps_only_independent_work() {
    let m = parse(&module(
        "ENTRY %e (p0: f32[1024], p1: f32[1024]) -> (f32[1024], f32[1024]) {
  %p0 = f32[1024]{0} parameter(0)
  %p1 = f32[1024]{0} parameter(1)
  %d1 = f32[1024]{0} exponential(%p1)
  %d2 = f32[1024]{0} exponential(%d1)
  %d3 = f32[1024]{0} exponential(%d2)
  %c1 = f32[1024]{0} exponential(%p0)
  %ar = f32[1024]{0} all-reduce(%c1), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %r = f32[1024]{0} add(%ar, %c1)
  ROOT %t = (f32[1024]{0}, f32[1024]{0}) tuple(%r, %d3)
}
",
    ));
    let model = fixed(&[
        ("d1", 10.0),
        ("d2", 10.0),
        ("d3", 10.0),
        ("c1", 10.0),
        ("r", 1.0),
        ("ar", 30.0),
    ]);
    let (out, sim) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    assert!(
        close(sim.entry.makespan, 41.0),
        "makespan {}",
        sim.entry.makespan
    );
    assert!(close(sim.entry.lower_bound, 41.0));
    assert!(pos(&out, "c1") < pos(&out, "d1"), "{}", out.to_text());
}

const TWO_GATHERS: &str = "ENTRY %e (p0: f32[128], p1: f32[128], p2: f32[1024]) -> (f32[1024], f32[1024], f32[1024]) {
  %p0 = f32[128]{0} parameter(0)
  %p1 = f32[128]{0} parameter(1)
  %p2 = f32[1024]{0} parameter(2)
  %ag1 = f32[1024]{0} all-gather(%p0), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}
  %ag2 = f32[1024]{0} all-gather(%p1), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}
  %c1 = f32[1024]{0} exponential(%p2)
  %c2 = f32[1024]{0} exponential(%c1)
  %c3 = f32[1024]{0} exponential(%c2)
  %c4 = f32[1024]{0} exponential(%c3)
  %c5 = f32[1024]{0} exponential(%c4)
  ROOT %t = (f32[1024]{0}, f32[1024]{0}, f32[1024]{0}) tuple(%ag1, %ag2, %c5)
}
";

fn two_gathers_model() -> std::sync::Arc<dyn xla_latency_hiding_scheduler::CostModel> {
    fixed(&[
        ("c1", 10.0),
        ("c2", 10.0),
        ("c3", 10.0),
        ("c4", 10.0),
        ("c5", 10.0),
        ("ag1", 100.0),
        ("ag2", 100.0),
    ])
}

/// Communication-bound: two 100 µs all-gathers on one lane and 50 µs of
/// compute. Optimum 200 (back-to-back transfers); with two lanes, 100.
#[test]
fn communication_bound_keeps_the_lane_busy() {
    let m = parse(&module(TWO_GATHERS));
    let model = two_gathers_model();
    let (out, sim) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    assert!(
        close(sim.entry.makespan, 200.0),
        "makespan {}",
        sim.entry.makespan
    );
    assert!(close(sim.entry.lower_bound, 200.0));
    assert!(close(
        sim.entry.comm_busy[ResourceKind::AllGather.index()],
        200.0
    ));
    // With limit 1 the two gathers never overlap.
    let v = xla_latency_hiding_scheduler::validate_schedule(&out, &limits(1), None);
    assert_eq!(v.max_in_flight[ResourceKind::AllGather.index()], 1);

    let two = SchedulerConfig::default().with_limit(ResourceKind::AllGather, 2);
    let (out2, sim2) = schedule(&m, &two, model.as_ref());
    assert!(
        close(sim2.entry.makespan, 100.0),
        "makespan {}",
        sim2.entry.makespan
    );
    assert!(close(sim2.entry.lower_bound, 100.0));
    let v2 = xla_latency_hiding_scheduler::validate_schedule(&out2, &two.overlap_limits, None);
    assert_eq!(v2.max_in_flight[ResourceKind::AllGather.index()], 2);
    // The schedule made for two lanes is invalid under a limit of one.
    let v1 = xla_latency_hiding_scheduler::validate_schedule(&out2, &limits(1), None);
    assert!(!v1.is_valid());
}

/// A limit beyond the number of ops on a resource is the same as that
/// number (only as many lanes are simulated), so a huge one schedules
/// exactly like it, without a lane array of that size per position.
#[test]
fn a_huge_overlap_limit_schedules_like_the_op_count() {
    let m = parse(&module(TWO_GATHERS));
    let model = two_gathers_model();
    let two = SchedulerConfig::default().with_limit(ResourceKind::AllGather, 2);
    let huge = SchedulerConfig::default().with_limit(ResourceKind::AllGather, 50_000_000);
    let (out2, sim2) = schedule(&m, &two, model.as_ref());
    let (out_huge, sim_huge) = schedule(&m, &huge, model.as_ref());
    assert_eq!(out2.to_string(), out_huge.to_string());
    assert!(close(sim_huge.entry.makespan, 100.0));
    assert_eq!(sim2.entry.makespan, sim_huge.entry.makespan);
    assert_eq!(sim2.entry.lower_bound, sim_huge.entry.lower_bound);
}

/// Different collective kinds use different resources and overlap each
/// other: all-gather 100 and all-reduce 100 beside 50 of compute: 100.
#[test]
fn different_kinds_overlap_each_other() {
    let text = TWO_GATHERS.replace(
        "%ag2 = f32[1024]{0} all-gather(%p1), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}",
        "%ag2 = f32[1024]{0} all-reduce(%p2), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add",
    );
    let m = parse(&module(&text));
    let (_, sim) = schedule(
        &m,
        &SchedulerConfig::default(),
        two_gathers_model().as_ref(),
    );
    assert!(
        close(sim.entry.makespan, 100.0),
        "makespan {}",
        sim.entry.makespan
    );
}

/// Nothing to overlap with: the schedule is the sequential one.
#[test]
fn no_overlap_possible_matches_the_bound() {
    let m = parse(&module(
        "ENTRY %e (p0: f32[1024]) -> f32[1024] {
  %p0 = f32[1024]{0} parameter(0)
  %c1 = f32[1024]{0} exponential(%p0)
  %ar = f32[1024]{0} all-reduce(%c1), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  ROOT %r = f32[1024]{0} exponential(%ar)
}
",
    ));
    let model = fixed(&[("c1", 10.0), ("r", 10.0), ("ar", 30.0)]);
    let (_, sim) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    assert!(close(sim.entry.makespan, 50.0));
    assert!(close(sim.entry.lower_bound, 50.0));
    assert!(close(sim.entry.exposed_comm, 30.0));
}

/// A loop whose body holds an all-reduce beside independent compute: the
/// body is scheduled (overlap inside), the trip count (4) is found, and
/// the entry costs four bodies.
#[test]
fn while_bodies_are_scheduled() {
    let text = module(
        "%cond (s: (s32[], f32[1024], f32[1024])) -> pred[] {
  %s = (s32[], f32[1024]{0}, f32[1024]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (s.1: (s32[], f32[1024], f32[1024])) -> (s32[], f32[1024], f32[1024]) {
  %s.1 = (s32[], f32[1024]{0}, f32[1024]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%s.1), index=0
  %x = f32[1024]{0} get-tuple-element(%s.1), index=1
  %y = f32[1024]{0} get-tuple-element(%s.1), index=2
  %one = s32[] constant(1)
  %i.2 = s32[] add(%i.1, %one)
  %ar = f32[1024]{0} all-reduce(%x), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %c1 = f32[1024]{0} exponential(%y)
  %c2 = f32[1024]{0} exponential(%c1)
  %c3 = f32[1024]{0} exponential(%c2)
  ROOT %t = (s32[], f32[1024]{0}, f32[1024]{0}) tuple(%i.2, %ar, %c3)
}

ENTRY %e (p0: f32[1024], p1: f32[1024]) -> (s32[], f32[1024], f32[1024]) {
  %p0 = f32[1024]{0} parameter(0)
  %p1 = f32[1024]{0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[1024]{0}, f32[1024]{0}) tuple(%zero, %p0, %p1)
  ROOT %w = (s32[], f32[1024]{0}, f32[1024]{0}) while(%init), condition=%cond, body=%body
}
",
    );
    let m = parse(&text);
    let model = fixed(&[
        ("c1", 10.0),
        ("c2", 10.0),
        ("c3", 10.0),
        ("ar", 25.0),
        ("lt", 1.0),
    ]);
    let (out, sim) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    let body = out.find_computation("body").unwrap();
    let bs = sim.summaries[body.index()].as_ref().unwrap();
    assert!(close(bs.makespan, 30.0), "body makespan {}", bs.makespan);
    assert!(close(bs.exposed_comm, 0.0));
    // Entry: 4 bodies + 5 condition evaluations.
    assert!(
        close(sim.entry.makespan, 4.0 * 30.0 + 5.0),
        "entry {}",
        sim.entry.makespan
    );
    assert!(
        close(sim.entry.sequential, 4.0 * 55.0 + 5.0),
        "sequential {}",
        sim.entry.sequential
    );
    let bc = out.comp(body);
    let p = |n: &str| bc.find(n).unwrap().index();
    assert!(
        p("ar-start") < p("c1") && p("ar-done") > p("c2"),
        "{}",
        out.to_text()
    );
}

/// A loop whose body all-reduces counts as one more all-reduce while it
/// runs: with one slot, an independent entry all-reduce cannot span it
/// (exposed: 125 + 100); with two slots it hides behind the loop (125).
#[test]
fn loops_hold_the_resources_their_bodies_use() {
    let text = module(
        "%cond (s: (s32[], f32[1024], f32[1024])) -> pred[] {
  %s = (s32[], f32[1024]{0}, f32[1024]{0}) parameter(0)
  %i = s32[] get-tuple-element(%s), index=0
  %n = s32[] constant(4)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (s.1: (s32[], f32[1024], f32[1024])) -> (s32[], f32[1024], f32[1024]) {
  %s.1 = (s32[], f32[1024]{0}, f32[1024]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%s.1), index=0
  %x = f32[1024]{0} get-tuple-element(%s.1), index=1
  %y = f32[1024]{0} get-tuple-element(%s.1), index=2
  %one = s32[] constant(1)
  %i.2 = s32[] add(%i.1, %one)
  %ar = f32[1024]{0} all-reduce(%x), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %c1 = f32[1024]{0} exponential(%y)
  %c2 = f32[1024]{0} exponential(%c1)
  %c3 = f32[1024]{0} exponential(%c2)
  ROOT %t = (s32[], f32[1024]{0}, f32[1024]{0}) tuple(%i.2, %ar, %c3)
}

ENTRY %e (p0: f32[1024], p1: f32[1024], p2: f32[1024]) -> ((s32[], f32[1024], f32[1024]), f32[1024]) {
  %p0 = f32[1024]{0} parameter(0)
  %p1 = f32[1024]{0} parameter(1)
  %p2 = f32[1024]{0} parameter(2)
  %ar0 = f32[1024]{0} all-reduce(%p2), channel_id=2, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %zero = s32[] constant(0)
  %init = (s32[], f32[1024]{0}, f32[1024]{0}) tuple(%zero, %p0, %p1)
  %w = (s32[], f32[1024]{0}, f32[1024]{0}) while(%init), condition=%cond, body=%body
  ROOT %r = ((s32[], f32[1024]{0}, f32[1024]{0}), f32[1024]{0}) tuple(%w, %ar0)
}
",
    );
    let m = parse(&text);
    let model = fixed(&[
        ("c1", 10.0),
        ("c2", 10.0),
        ("c3", 10.0),
        ("ar", 25.0),
        ("lt", 1.0),
        ("ar0", 100.0),
    ]);
    let (out1, one) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    assert!(
        close(one.entry.makespan, 225.0),
        "makespan {}",
        one.entry.makespan
    );
    assert!(
        close(one.entry.lower_bound, 225.0),
        "bound {}",
        one.entry.lower_bound
    );
    let two = SchedulerConfig::default().with_limit(ResourceKind::AllReduce, 2);
    let (out2, sim2) = schedule(&m, &two, model.as_ref());
    assert!(
        close(sim2.entry.makespan, 125.0),
        "makespan {}",
        sim2.entry.makespan
    );
    // The two-slot schedule breaks the one-slot rule; the one-slot one does not.
    let v = xla_latency_hiding_scheduler::validate_schedule(&out2, &limits(1), None);
    assert!(
        v.violations.iter().any(|x| x.instruction == "w"),
        "{:?}",
        v.violations
    );
    assert!(xla_latency_hiding_scheduler::validate_schedule(&out1, &limits(1), None).is_valid());
}

/// A gather whose 4 MiB result, if prefetched to hide its transfer, is
/// live beside two 4 MiB chain temporaries (12 MiB), while the input
/// order never holds more than two (8 MiB). A limit of 8 MiB of
/// temporaries forces the input order (no overlap); a limit below any
/// order's peak is a typed error.
#[test]
fn memory_limit_trades_overlap_for_memory() {
    let m = parse(&module(
        "ENTRY %e (p0: f32[131072], p1: f32[1048576]) -> f32[] {
  %p0 = f32[131072]{0} parameter(0)
  %p1 = f32[1048576]{0} parameter(1)
  %c1 = f32[1048576]{0} exponential(%p1)
  %c2 = f32[1048576]{0} exponential(%c1)
  %c3 = f32[1048576]{0} exponential(%c2)
  %s = f32[1048576]{0} exponential(%c3)
  %ag = f32[1048576]{0} all-gather(%p0), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}
  ROOT %r = f32[] dot(%ag, %s), lhs_contracting_dims={0}, rhs_contracting_dims={0}
}
",
    ));
    let model = fixed(&[
        ("c1", 10.0),
        ("c2", 10.0),
        ("c3", 10.0),
        ("s", 10.0),
        ("ag", 30.0),
        ("r", 1.0),
    ]);
    let mib4 = 4u64 << 20;
    let params = mib4 + mib4 / 8;
    // Unlimited: the transfer hides behind c2, c3, s; 12 MiB live at c2.
    let (_, free) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    assert!(
        close(free.entry.makespan, 41.0),
        "makespan {}",
        free.entry.makespan
    );
    assert_eq!(free.entry.peak_total, params + 3 * mib4);
    // 8 MiB of temporaries: no overlap fits; the transfer is exposed.
    let cfg = SchedulerConfig {
        memory_limit: Some(params + 2 * mib4 + 4),
        ..SchedulerConfig::default()
    };
    let (_, limited) = schedule(&m, &cfg, model.as_ref());
    assert!(
        limited.entry.peak_total <= params + 2 * mib4 + 4,
        "peak {}",
        limited.entry.peak_total
    );
    assert!(
        close(limited.entry.makespan, 71.0),
        "makespan {}",
        limited.entry.makespan
    );
    // Below what any order needs: a typed error naming both figures.
    let tight = SchedulerConfig {
        memory_limit: Some(params + 2 * mib4 - 1),
        ..SchedulerConfig::default()
    };
    let mut out = m.clone();
    match xla_latency_hiding_scheduler::schedule_module(&mut out, &tight, model.as_ref()) {
        Err(SchedulerError::MemoryLimit { limit, peak }) => {
            assert_eq!(limit, params + 2 * mib4 - 1);
            assert!(peak >= params + 2 * mib4);
        }
        other => panic!("expected a memory-limit error, got {other:?}"),
    }
    let _ = NUM_RESOURCES;
}

/// Scheduling is deterministic and idempotent on its own output.
#[test]
fn deterministic_and_stable() {
    let m = parse(&module(TWO_GATHERS));
    let model = two_gathers_model();
    let (a, _) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    let (b, _) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    assert_eq!(a.to_text(), b.to_text());
    // Rescheduling the scheduled module keeps its makespan.
    let (c, sim_c) = schedule(&a, &SchedulerConfig::default(), model.as_ref());
    let (_, sim_a) = schedule(&a, &SchedulerConfig::default(), model.as_ref());
    assert!(close(sim_c.entry.makespan, sim_a.entry.makespan));
    assert!(c.config.is_scheduled);
}

/// A conditional whose one branch all-reduces and whose other branch does
/// not: the lower bound may only count the cheaper branch's transfers, but
/// the reported total counts the costlier one, as exposed communication
/// does, so `exposed_comm <= total_comm` (the report's invariant) holds.
#[test]
fn conditional_total_comm_counts_the_costliest_branch() {
    let m = parse(&module(
        "%tb (x: f32[1024]) -> f32[1024] {
  %x = f32[1024]{0} parameter(0)
  ROOT %ar = f32[1024]{0} all-reduce(%x), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
}

%fb (y: f32[1024]) -> f32[1024] {
  %y = f32[1024]{0} parameter(0)
  ROOT %ex = f32[1024]{0} exponential(%y)
}

ENTRY %e (p: pred[], p0: f32[1024]) -> f32[1024] {
  %p = pred[] parameter(0)
  %p0 = f32[1024]{0} parameter(1)
  ROOT %c = f32[1024]{0} conditional(%p, %p0, %p0), true_computation=%tb, false_computation=%fb
}
",
    ));
    let model = fixed(&[("ar", 30.0), ("ex", 5.0)]);
    let (_, sim) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    let e = &sim.entry;
    assert!(close(e.total_comm(), 30.0), "total {}", e.total_comm());
    assert!(close(e.exposed_comm, 30.0), "exposed {}", e.exposed_comm);
    assert!(e.exposed_comm <= e.total_comm() + 1e-9);
    assert!(e.comm_busy.iter().sum::<f64>() <= e.total_comm() + 1e-9);
}

/// Without collectives the total is +0.0 (an empty f64 sum is -0.0, which
/// the JSON report would print as "-0.0").
#[test]
fn no_communication_totals_positive_zero() {
    let m = parse(&module(
        "ENTRY %e (p0: f32[1024]) -> f32[1024] {
  %p0 = f32[1024]{0} parameter(0)
  ROOT %c1 = f32[1024]{0} exponential(%p0)
}
",
    ));
    let model = fixed(&[("c1", 10.0)]);
    let (_, sim) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    let t = sim.entry.total_comm();
    assert!(t == 0.0 && t.is_sign_positive(), "total {t:?}");
}

/// Attention-shaped (found on an unseen JAX case): a compute chain ends in
/// an all-gather, and an all-gather of a late parameter (input order puts
/// it after the chain) feeds the same final dot. The parameter's gather
/// must start before the chain (one all-gather lane: it finishes before
/// the chain's gather needs the lane): optimum 10+10+10+20+1 = 51 = lower
/// bound; the input order gives 71.
#[test]
fn late_parameter_gather_moves_ahead_of_the_chain() {
    let m = parse(&module(
        "ENTRY %e (p0: f32[128], p1: f32[128]) -> f32[1024] {
  %p0 = f32[128]{0} parameter(0)
  %c1 = f32[128]{0} exponential(%p0)
  %c2 = f32[128]{0} exponential(%c1)
  %c3 = f32[128]{0} exponential(%c2)
  %ag0 = f32[1024]{0} all-gather(%c3), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  %p1 = f32[128]{0} parameter(1)
  %ag1 = f32[1024]{0} all-gather(%p1), channel_id=2, replica_groups=[1,8]<=[8], dimensions={0}, use_global_device_ids=true
  ROOT %r = f32[1024]{0} multiply(%ag0, %ag1)
}
",
    ));
    let model = fixed(&[
        ("c1", 10.0),
        ("c2", 10.0),
        ("c3", 10.0),
        ("r", 1.0),
        ("ag0", 20.0),
        ("ag1", 20.0),
    ]);
    let (out, sim) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    let e = &sim.entry;
    assert!(close(e.lower_bound, 51.0), "lower bound {}", e.lower_bound);
    assert!(close(e.makespan, 51.0), "makespan {}", e.makespan);
    assert!(pos(&out, "ag1-start") < pos(&out, "c2"));
}

/// `PrefixReplay` (how hoisting compares candidate orders) gives the
/// makespan a full simulation gives: for the recorded order's own suffix
/// at every position (visited from the end backwards), and for a suffix
/// that moves the all-reduce's done as late as it can go.
#[test]
fn prefix_replay_matches_full_simulation() {
    use xla_latency_hiding_scheduler::graph::Graph;
    use xla_latency_hiding_scheduler::simulator::{simulate_graph, PrefixReplay};
    let m = parse(&module(
        "ENTRY %e (p0: f32[1024], p1: f32[1024]) -> f32[1024] {
  %p0 = f32[1024]{0} parameter(0)
  %p1 = f32[1024]{0} parameter(1)
  %ar = f32[1024]{0} all-reduce(%p0), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add
  %c1 = f32[1024]{0} exponential(%p1)
  %c2 = f32[1024]{0} exponential(%c1)
  %c3 = f32[1024]{0} exponential(%c2)
  %c4 = f32[1024]{0} exponential(%c3)
  ROOT %r = f32[1024]{0} add(%ar, %c4)
}
",
    ));
    let model = fixed(&[
        ("c1", 10.0),
        ("c2", 10.0),
        ("c3", 10.0),
        ("c4", 10.0),
        ("r", 1.0),
        ("ar", 30.0),
    ]);
    let (out, _) = schedule(&m, &SchedulerConfig::default(), model.as_ref());
    let g = Graph::build(
        &out,
        out.entry,
        model.as_ref(),
        &vec![None; out.computations.len()],
    )
    .unwrap();
    let lanes = [1usize; NUM_RESOURCES];
    let order: Vec<u32> = (0..g.n as u32).collect();
    let full = |o: &[u32]| simulate_graph(&g, o, &lanes, None, false).0.makespan;
    let (mut replay, recorded) = PrefixReplay::record(&g, &order, &lanes);
    assert!(close(recorded, full(&order)));
    let done = pos(&out, "ar-done");
    let root = order.len() - 1;
    for p in (0..order.len()).rev() {
        assert!(close(
            replay.makespan_with_suffix(p, &order[p..]),
            full(&order)
        ));
        if p == done {
            // The done moved to just before the root.
            let mut alt: Vec<u32> = order[..p].to_vec();
            alt.extend(order[p + 1..root].iter().copied());
            alt.push(order[p]);
            alt.push(order[root]);
            let replayed = replay.makespan_with_suffix(p, &alt[p..]);
            assert!(close(replayed, full(&alt)), "{replayed} vs {}", full(&alt));
        }
    }
}
