//! The `windowed-einsum` pass proven by execution: every stored case
//! (testdata/cases and, when present, ../shared/corpus/cases) is
//! propagated and partitioned, then windowed with the threshold at 0
//! (wherever legal); the windowed program must verify, read back with
//! callees printed first, and compute what the unwindowed one computes on the
//! same random arguments: bitwise in consistent mode where only
//! all-gathers were windowed (each output element is the same dot
//! product), within a tolerance where a reduce-scatter's sum is taken in
//! ring order; and again with bidirectional loops. Plus the threshold and
//! trip-count limits, and the communication it keeps (both ways round the
//! ring, for groups of 4 to 9).

mod common;

use common::{compare, random_args, run_partitioned, run_partitioned_in_mode};
use xla_hlo_ir::stats::ModuleStats;
use xla_hlo_ir::{HloModule, Opcode};
use xla_spmd_partitioner::windowed_einsum::{
    windowed_einsum, WindowedEinsumOptions, WindowedEinsumStats,
};
use xla_spmd_partitioner::{partition_module, SpmdOptions};

fn always() -> WindowedEinsumOptions {
    WindowedEinsumOptions {
        threshold_mib: Some(0.0),
        ..Default::default()
    }
}

/// The case's module, propagated and partitioned; `None` when its input
/// is not stored.
fn partitioned(dir: &std::path::Path) -> Option<(HloModule, HloModule)> {
    let text = std::fs::read_to_string(dir.join("input.hlo")).ok()?;
    Some(
        common::propagate_and_partition(&text).unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
    )
}

fn count(module: &HloModule, opcode: Opcode) -> usize {
    module
        .computations
        .iter()
        .flat_map(|c| &c.instructions)
        .filter(|i| i.opcode == opcode)
        .count()
}

#[test]
fn windowed_cases_compute_what_the_unwindowed_ones_compute() {
    let (windowed_cases, total) = window_every_case(&always());
    // testdata alone has 18 such cases with 7 all-gather and 17
    // reduce-scatter loops; the test must not pass by windowing nothing.
    assert!(windowed_cases >= 18, "only {windowed_cases} cases windowed");
    assert!(
        total.all_gather_loops >= 7 && total.reduce_scatter_loops >= 17,
        "{total:?}"
    );
}

#[test]
fn bidirectional_windowed_cases_compute_what_the_unwindowed_ones_compute() {
    let options = WindowedEinsumOptions {
        bidirectional: true,
        ..always()
    };
    let (_, total) = window_every_case(&options);
    let bidirectional = total.loops.iter().filter(|l| l.bidirectional).count();
    // testdata's pairs over groups of 8 give 4 bidirectional loops (the
    // corpus one more); the others have groups of 4 or fewer
    // (unidirectional).
    assert!(
        bidirectional >= 4,
        "only {bidirectional} bidirectional loops"
    );
}

/// Windows every stored case with `options` and checks each windowed
/// module against its unwindowed one (see the file's doc); returns the
/// number of cases windowed and the loops made.
fn window_every_case(options: &WindowedEinsumOptions) -> (usize, WindowedEinsumStats) {
    let mut total = WindowedEinsumStats::default();
    let mut windowed_cases = 0;
    for dir in xla_test_paths::all_case_dirs() {
        let Some((global, plain)) = partitioned(&dir) else {
            continue;
        };
        let mut windowed = plain.clone();
        let stats = windowed_einsum(&mut windowed, options);
        if stats == WindowedEinsumStats::default() {
            assert_eq!(
                windowed,
                plain,
                "{}: unchanged module rewritten",
                dir.display()
            );
            continue;
        }
        windowed_cases += 1;
        total.all_gather_loops += stats.all_gather_loops;
        total.reduce_scatter_loops += stats.reduce_scatter_loops;
        total.loops.extend(stats.loops.iter().cloned());
        let name = dir.display();
        if let Err(e) = xla_hlo_verifier::verify(&windowed) {
            panic!(
                "{name}: the windowed module does not verify:\n{e}\n{}",
                windowed.to_text()
            );
        }
        let text = windowed.to_text();
        let back = xla_hlo_parser::parse_module(&text)
            .unwrap_or_else(|e| panic!("{name}: the printed module does not parse: {e}"));
        let printed_at = |comp: &str| text.find(&format!("%{comp} (")).unwrap_or(0);
        for comp in &back.computations {
            for callee in comp
                .instructions
                .iter()
                .flat_map(|i| i.called_computations())
            {
                let callee = &back.comp(callee).name;
                assert!(
                    printed_at(callee) < printed_at(&comp.name),
                    "{name}: {callee} printed after its caller {}",
                    comp.name
                );
            }
        }
        let loops = stats.all_gather_loops + stats.reduce_scatter_loops;
        assert_eq!(
            count(&windowed, Opcode::While),
            count(&plain, Opcode::While) + loops,
            "{name}"
        );
        assert_eq!(
            count(&windowed, Opcode::AllGather) + stats.all_gather_loops,
            count(&plain, Opcode::AllGather),
            "{name}: each all-gather loop replaces one all-gather"
        );
        assert_eq!(
            count(&windowed, Opcode::ReduceScatter) + stats.reduce_scatter_loops,
            count(&plain, Opcode::ReduceScatter),
            "{name}: each reduce-scatter loop replaces one reduce-scatter"
        );

        let args = random_args(&global, 0x5eed_1234);
        let out_shape = global.entry_computation().root_instr().shape.clone();
        let n = plain.num_partitions();
        // All-gather loops are checked bitwise in consistent mode, where a
        // window's dot sums as the whole dot does whatever its shape.
        let bitwise = stats.reduce_scatter_loops == 0;
        let want = run_partitioned_in_mode(&plain, &args, &out_shape, n, bitwise)
            .unwrap_or_else(|e| panic!("{name}: unwindowed: {e}"));
        let got = run_partitioned_in_mode(&windowed, &args, &out_shape, n, bitwise)
            .unwrap_or_else(|e| panic!("{name}: windowed: {e}\n{text}"));
        let tolerance = if bitwise { 0.0 } else { 1e-5 };
        compare(&got, &want, tolerance, &windowed);
    }
    eprintln!(
        "windowed {windowed_cases} cases: {} all-gather loops, {} reduce-scatter loops, {} bidirectional",
        total.all_gather_loops,
        total.reduce_scatter_loops,
        total.loops.iter().filter(|l| l.bidirectional).count()
    );
    (windowed_cases, total)
}

/// Sequence-parallel input times a column-parallel weight, and a
/// row-parallel matmul whose result is scattered over the rows: the two
/// halves of a Megatron layer with sequence parallelism.
const MEGATRON_SP: &str = r#"HloModule sp, num_partitions=4

ENTRY %e (x: f32[16,8], w: f32[8,12], v: f32[12,4]) -> f32[16,4] {
  %x = f32[16,8] parameter(0), sharding={devices=[4,1]<=[4]}
  %w = f32[8,12] parameter(1), sharding={devices=[1,4]<=[4]}
  %v = f32[12,4] parameter(2), sharding={devices=[4,1]<=[4]}
  %h = f32[16,12] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[1,4]<=[4]}
  ROOT %y = f32[16,4] dot(%h, %v), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[4,1]<=[4]}
}
"#;

fn megatron_partitioned() -> (HloModule, HloModule) {
    megatron_partitioned_over(4)
}

/// `MEGATRON_SP` over `n` devices (4 rows, 3 hidden columns per device).
fn megatron_partitioned_over(n: i64) -> (HloModule, HloModule) {
    let text = MEGATRON_SP
        .replace("num_partitions=4", &format!("num_partitions={n}"))
        .replace("<=[4]", &format!("<=[{n}]"))
        .replace("[4,1]", &format!("[{n},1]"))
        .replace("[1,4]", &format!("[1,{n}]"))
        .replace("[16,12]", &format!("[{},{}]", 4 * n, 3 * n))
        .replace("f32[16,", &format!("f32[{},", 4 * n))
        .replace("[8,12]", &format!("[8,{}]", 3 * n))
        .replace("[12,4]", &format!("[{},4]", 3 * n));
    let mut module = common::parse(&text);
    let global = module.clone();
    partition_module(&mut module, &SpmdOptions::default()).unwrap();
    (global, module)
}

#[test]
fn megatron_layer_with_sequence_parallelism_moves_the_same_bytes_in_loops() {
    let (global, plain) = megatron_partitioned();
    let plain_stats = ModuleStats::of(&plain);
    assert_eq!(plain_stats.collectives.get("all-gather"), Some(&1));
    assert_eq!(plain_stats.collectives.get("reduce-scatter"), Some(&1));
    let mut windowed = plain.clone();
    let stats = windowed_einsum(&mut windowed, &always());
    assert_eq!(stats.all_gather_loops, 1);
    assert_eq!(stats.reduce_scatter_loops, 1);
    xla_hlo_verifier::verify(&windowed).unwrap();
    // Static counts: each loop body permutes one window, n - 1 = 3 times:
    // the all-gather's 3 received windows of f32[4,8] (128 B each), and
    // the reduce-scatter's 3 partial sums of f32[4,4] (64 B each), which
    // is what the all-gather (f32[16,8]) and the reduce-scatter (3 of its
    // 4 blocks of f32[4,4] arrive from other devices) moved.
    let after = ModuleStats::of(&windowed);
    assert_eq!(after.collectives.get("collective-permute"), Some(&2));
    assert_eq!(after.collectives.get("all-gather"), None);
    assert_eq!(after.collectives.get("reduce-scatter"), None);
    assert_eq!(after.collective_bytes, 128 + 64);
    assert_eq!(plain_stats.collective_bytes, 16 * 8 * 4 + 4 * 4 * 4);

    let args = random_args(&global, 7);
    let out_shape = global.entry_computation().root_instr().shape.clone();
    let want = common::run_global(&global, &args);
    let got = run_partitioned(&windowed, &args, &out_shape, 4).unwrap();
    // Multiples of 1/8 summed in any order are exact here.
    compare(&got, &want, 0.0, &windowed);
}

#[test]
fn threshold_and_trip_count_limit_leave_the_module_alone() {
    let (_, plain) = megatron_partitioned();
    for options in [
        WindowedEinsumOptions::default(),
        WindowedEinsumOptions {
            threshold_mib: Some(1.0),
            ..Default::default()
        },
        WindowedEinsumOptions {
            threshold_mib: Some(0.0),
            max_iterations: 3,
            bidirectional: false,
        },
    ] {
        let mut module = plain.clone();
        let stats = windowed_einsum(&mut module, &options);
        assert_eq!(stats, WindowedEinsumStats::default(), "{options:?}");
        assert_eq!(module, plain, "{options:?}");
    }
    // A threshold between the all-gather's result (512 B) and the
    // reduce-scatter's dot result (256 B) windows only the all-gather.
    let mut module = plain.clone();
    let stats = windowed_einsum(
        &mut module,
        &WindowedEinsumOptions {
            threshold_mib: Some(300.0 / (1024.0 * 1024.0)),
            ..Default::default()
        },
    );
    assert_eq!(stats.all_gather_loops, 1);
    assert_eq!(stats.reduce_scatter_loops, 0);
}

/// Bytes the collective-permutes of `module` move when it runs: those of
/// the entry once, those of a windowed loop's body once per iteration.
fn executed_permute_bytes(module: &HloModule, stats: &WindowedEinsumStats) -> u64 {
    let permutes = |comp: &xla_hlo_ir::HloComputation| -> u64 {
        comp.instructions
            .iter()
            .filter(|i| i.opcode == Opcode::CollectivePermute)
            .map(|i| i.shape.byte_size())
            .sum()
    };
    let mut bytes = permutes(module.entry_computation());
    for l in &stats.loops {
        let body = module
            .computations
            .iter()
            .find(|c| c.name == l.body)
            .expect("the loop body");
        bytes += permutes(body) * l.trip_count as u64;
    }
    bytes
}

#[test]
fn bidirectional_loops_move_the_collectives_bytes_and_compute_the_same() {
    let options = WindowedEinsumOptions {
        bidirectional: true,
        ..always()
    };
    for n in 4..=9 {
        let (global, plain) = megatron_partitioned_over(n);
        let mut windowed = plain.clone();
        let stats = windowed_einsum(&mut windowed, &options);
        assert_eq!((stats.all_gather_loops, stats.reduce_scatter_loops), (1, 1));
        xla_hlo_verifier::verify(&windowed).unwrap();
        let others = n - 1;
        for l in &stats.loops {
            // Groups of 5 or more go both ways in about half the steps.
            assert_eq!(l.bidirectional, n >= 5, "n = {n}");
            let trip = if n >= 5 { others / 2 - 1 } else { others };
            assert_eq!(l.trip_count, trip, "n = {n}");
        }
        // n - 1 windows of f32[4,8] and n - 1 sums of f32[4,4], each way
        // round the ring or both.
        assert_eq!(
            executed_permute_bytes(&windowed, &stats),
            others as u64 * (128 + 64),
            "n = {n}"
        );
        let args = random_args(&global, 11 + n as u64);
        let out_shape = global.entry_computation().root_instr().shape.clone();
        let want = common::run_global(&global, &args);
        let got = run_partitioned(&windowed, &args, &out_shape, n).unwrap();
        compare(&got, &want, 0.0, &windowed);
    }
}
