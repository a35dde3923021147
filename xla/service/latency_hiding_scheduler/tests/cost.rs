//! Cost models: the analytical model reproduces the documented NVLink
//! figures (1 GiB all-reduce on 8×H200: 3.96 ms with NVLS, 5.1 ms ring),
//! cross-node groups fall back to NIC bandwidth, compute follows the
//! roofline with memory traffic as XLA's fusion leaves it; the approximate model uses XLA's constants; measured tables
//! parse (text and JSON), report bad lines, and override by name
//! (including the collective a start was converted from).

mod common;

use common::*;
use std::sync::Arc;
use xla_hlo_ir::{InstrId, Opcode};
use xla_latency_hiding_scheduler::cost::{AllReduceAlgorithm, Op};
use xla_latency_hiding_scheduler::kinds::CollectiveInfo;
use xla_latency_hiding_scheduler::{
    convert_collectives, cost_model_from_spec, AnalyticalCostModel, ApproximateCostModel,
    AsyncConversionConfig, CostModel, CostTable, GpuSpec, ResourceKind, SchedulerError,
    TableCostModel,
};

const GIB: u64 = 1 << 30;

fn info(kind: ResourceKind, op: Opcode, bytes: u64, group: Vec<i64>) -> CollectiveInfo {
    CollectiveInfo {
        kind,
        opcode: op,
        bytes_in: bytes,
        bytes_out: bytes,
        group_size: group.len() as i64,
        first_group: Some(group),
        num_pairs: 0,
    }
}

fn within(x: f64, want: f64, rel: f64) -> bool {
    (x - want).abs() <= rel * want
}

#[test]
fn analytical_all_reduce_matches_the_nccl_figures() {
    let ar = info(
        ResourceKind::AllReduce,
        Opcode::AllReduce,
        GIB,
        (0..8).collect(),
    );
    let mut spec = GpuSpec::h200_sxm();
    let nvls = AnalyticalCostModel::new(spec.clone()).collective_us(&ar);
    assert!(within(nvls, 3956.0, 0.01), "NVLS {nvls}");
    spec.all_reduce_algorithm = AllReduceAlgorithm::Ring;
    let ring = AnalyticalCostModel::new(spec.clone()).collective_us(&ar);
    assert!(within(ring, 5079.0, 0.01), "ring {ring}");
    // Small messages are latency-bound: ~8 µs (NVLS), ~12 µs (ring).
    let tiny = info(
        ResourceKind::AllReduce,
        Opcode::AllReduce,
        4,
        (0..8).collect(),
    );
    let t_ring = AnalyticalCostModel::new(spec.clone()).collective_us(&tiny);
    assert!(within(t_ring, 12.4, 0.01), "{t_ring}");
    let t_auto = AnalyticalCostModel::new(GpuSpec::h200_sxm()).collective_us(&tiny);
    assert!(within(t_auto, 7.6, 0.01), "{t_auto}");
}

#[test]
fn analytical_gather_scatter_permute_and_cross_node() {
    let m = AnalyticalCostModel::new(GpuSpec::h100_sxm());
    let ag = info(
        ResourceKind::AllGather,
        Opcode::AllGather,
        GIB,
        (0..8).collect(),
    );
    let t = m.collective_us(&ag);
    let want = 4.0 + 7.0 * 0.6 + GIB as f64 * 7.0 / 8.0 / 370e3;
    assert!(within(t, want, 1e-9), "{t} vs {want}");
    // A reduce-scatter moves the same as an all-gather of its input.
    let rs = info(
        ResourceKind::ReduceScatter,
        Opcode::ReduceScatter,
        GIB,
        (0..8).collect(),
    );
    assert!(within(m.collective_us(&rs), want, 1e-9));
    // Permute: one hop.
    let cp = info(
        ResourceKind::CollectivePermute,
        Opcode::CollectivePermute,
        GIB,
        vec![0, 1],
    );
    assert!(within(
        m.collective_us(&cp),
        4.0 + 0.6 + GIB as f64 / 370e3,
        1e-9
    ));
    // 16 GPUs over two nodes: eight NICs of 45 GB/s per node (360 GB/s);
    // of the ring's 15 steps one crosses nodes (NCCL's tuning model).
    let x = info(
        ResourceKind::AllGather,
        Opcode::AllGather,
        GIB,
        (0..16).collect(),
    );
    let want = 4.0 + 14.0 * 0.6 + 8.0 + GIB as f64 * 15.0 / 16.0 / 360e3;
    assert!(within(m.collective_us(&x), want, 1e-9));
    // A small all-reduce over the two nodes: the tree chains each node's
    // eight GPUs over NVLink and joins the nodes in one inter-node step,
    // each way (the ring would cross twice in 30 steps).
    let tiny = info(
        ResourceKind::AllReduce,
        Opcode::AllReduce,
        4,
        (0..16).collect(),
    );
    let tree = 4.0 + 2.0 * (7.0 * 0.6 + 8.0);
    let t = m.collective_us(&tiny);
    assert!(within(t, tree, 1e-6), "{t} vs {tree}");
    let mut ring_spec = GpuSpec::h100_sxm();
    ring_spec.all_reduce_algorithm = AllReduceAlgorithm::Ring;
    let ring = AnalyticalCostModel::new(ring_spec).collective_us(&tiny);
    let want = 4.0 + 28.0 * 0.6 + 2.0 * 8.0;
    assert!(within(ring, want, 1e-6), "{ring} vs {want}");
    // Interleaved groups (one GPU of each node): every step crosses.
    let across = info(
        ResourceKind::AllGather,
        Opcode::AllGather,
        4,
        vec![0, 8, 16, 24],
    );
    let t = m.collective_us(&across);
    assert!(within(t, 4.0 + 3.0 * 8.0, 1e-3), "{t}");
    // One GPU per node (pairs across nodes): a single NIC.
    let pair = info(ResourceKind::AllReduce, Opcode::AllReduce, GIB, vec![0, 64]);
    let t = m.collective_us(&pair);
    assert!(t > GIB as f64 / 45e3, "{t}");
}

#[test]
fn analytical_compute_is_a_roofline() {
    let text = "HloModule r\n\nENTRY %e (a: bf16[8192,8192], b: bf16[8192,8192]) -> bf16[8192,8192] {\n  %a = bf16[8192,8192]{1,0} parameter(0)\n  %b = bf16[8192,8192]{1,0} parameter(1)\n  %d = bf16[8192,8192]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n  ROOT %n = bf16[8192,8192]{1,0} negate(%d)\n}\n";
    let m = parse(text);
    let model = AnalyticalCostModel::new(GpuSpec::h200_sxm());
    let comp = m.entry_computation();
    let dot = model.compute_us(Op::new(&m, comp, comp.find("d").unwrap()));
    let flops = 2.0 * 8192f64.powi(3);
    assert!(within(dot, flops / (989e6 * 0.8) + 2.0, 1e-9), "dot {dot}");
    let neg = model.compute_us(Op::new(&m, comp, comp.find("n").unwrap()));
    let bytes = 2.0 * 8192.0 * 8192.0 * 2.0;
    assert!(within(neg, bytes / (4800e3 * 0.89), 1e-9), "negate {neg}");
    assert_eq!(
        model.compute_us(Op::new(&m, comp, comp.find("a").unwrap())),
        0.0
    );
    // Out-of-range ids cost nothing rather than panicking.
    assert_eq!(model.compute_us(Op::new(&m, comp, InstrId(99))), 0.0);
}

/// Memory traffic as XLA's fusion leaves it: an RMSNorm reads its input
/// twice (the sum of squares, then the scaling) and writes only what the
/// dot reads; values between fused ops stay in registers, a broadcast
/// reads its small source, an operand named twice is read once.
#[test]
fn analytical_traffic_assumes_xla_fusion() {
    let text = "HloModule f\n\n%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %s = f32[] add(%a, %b)\n}\n\nENTRY %e (x: f32[1024,4096], w: f32[4096,4096]) -> bf16[1024,4096] {\n  %x = f32[1024,4096]{1,0} parameter(0)\n  %w = f32[4096,4096]{1,0} parameter(1)\n  %sq = f32[1024,4096]{1,0} multiply(%x, %x)\n  %zero = f32[] constant(0)\n  %ss = f32[1024]{0} reduce(%sq, %zero), dimensions={1}, to_apply=%add\n  %r = f32[1024]{0} rsqrt(%ss)\n  %rb = f32[1024,4096]{1,0} broadcast(%r), dimensions={0}\n  %y = f32[1024,4096]{1,0} multiply(%x, %rb)\n  %c = bf16[1024,4096]{1,0} convert(%y)\n  %wc = bf16[4096,4096]{1,0} convert(%w)\n  %d = bf16[1024,4096]{1,0} dot(%c, %wc), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n  ROOT %n = bf16[1024,4096]{1,0} negate(%d)\n}\n";
    let m = parse(text);
    let model = AnalyticalCostModel::new(GpuSpec::h200_sxm());
    let comp = m.entry_computation();
    let users = comp.users();
    let bytes_per_us = 4800e3 * 0.89;
    let (rows, cols) = (1024.0, 4096.0);
    let at = |n: &str| {
        let id = comp.find(n).unwrap();
        let with = model.compute_us(Op::with_users(&m, comp, id, &users));
        assert_eq!(with, model.compute_us(Op::new(&m, comp, id)), "{n}");
        with
    };
    let expect = |n: &str, bytes: f64| {
        let t = at(n);
        assert!(within(t, bytes / bytes_per_us, 1e-9), "{n}: {t} us");
    };
    // x read once, the squares go to the reduction in registers.
    expect("sq", 4.0 * rows * cols);
    // The reduction writes its row sums; the rsqrt reads them and feeds
    // the broadcast's consumer in registers.
    expect("r", 4.0 * rows);
    // x read again; the broadcast reads the rsqrt's values in registers.
    expect("y", 4.0 * rows * cols);
    // The dot's operands are written (no fusion into the GEMM).
    expect("c", 2.0 * rows * cols);
    expect("wc", (4.0 + 2.0) * cols * cols);
    // The root reads the dot's result and writes its own.
    expect("n", 2.0 * 2.0 * rows * cols);
    // The reduction reads its squares in registers: its 4M additions
    // (one per element of its operands, the init value included, at the
    // FP32 vector rate) outweigh the row sums it writes.
    let reduce = at("ss");
    let expected = ((rows * cols + 1.0) / 67e6).max((4.0 * rows + 4.0) / bytes_per_us) + 2.0;
    assert!(within(reduce, expected, 1e-9), "{reduce}");
    assert_eq!(at("rb"), 0.0);
}

#[test]
fn approximate_uses_xla_constants() {
    let text = "HloModule r, num_partitions=8\n\n%add (x: f32[], y: f32[]) -> f32[] {\n  %x = f32[] parameter(0)\n  %y = f32[] parameter(1)\n  ROOT %z = f32[] add(%x, %y)\n}\n\nENTRY %e (a: f32[64,64]) -> f32[64,64] {\n  %a = f32[64,64]{1,0} parameter(0)\n  %d = f32[64,64]{1,0} dot(%a, %a), lhs_contracting_dims={1}, rhs_contracting_dims={0}\n  %n = f32[64,64]{1,0} negate(%d)\n  ROOT %ar = f32[64,64]{1,0} all-reduce(%n), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, to_apply=%add\n}\n";
    let m = parse(text);
    let comp = m.entry_computation();
    let a = ApproximateCostModel;
    let at = |n: &str| a.compute_us(Op::new(&m, comp, comp.find(n).unwrap()));
    assert_eq!(at("d"), 5000.0);
    assert_eq!(at("n"), 1.0);
    assert_eq!(at("a"), 0.0);
    let ar = comp.find("ar").unwrap();
    let i = CollectiveInfo::of(&m, comp, ar).unwrap();
    assert_eq!(i.group_size, 8);
    assert_eq!(a.transfer_us(Op::new(&m, comp, ar), &i), 5000.0);
}

#[test]
fn tables_parse_and_report_bad_lines() {
    let t =
        CostTable::parse("# measured\nall-reduce.5 120.5\n%dot.3, 40\n\nfusion\t7 # trailing\n")
            .unwrap();
    assert_eq!(t.get("all-reduce.5"), Some(120.5));
    assert_eq!(t.get("dot.3"), Some(40.0));
    assert_eq!(t.get("fusion"), Some(7.0));
    let j = CostTable::parse("{\"a\": 1.5, \"%b\": 2}").unwrap();
    assert_eq!(j.get("a"), Some(1.5));
    assert_eq!(j.get("b"), Some(2.0));
    assert_eq!(CostTable::parse("a 1\nb x\n").unwrap_err().0, 2);
    assert_eq!(CostTable::parse("a 1 2\n").unwrap_err().0, 1);
    assert!(CostTable::parse("a -1\n").is_err());
    assert!(CostTable::parse("{\"a\": \"x\"}").is_err());
    assert!(CostTable::parse("[1]").is_err());
}

#[test]
fn table_overrides_by_name_after_conversion() {
    let text = "HloModule r, num_partitions=8\n\n%add (x: f32[], y: f32[]) -> f32[] {\n  %x = f32[] parameter(0)\n  %y = f32[] parameter(1)\n  ROOT %z = f32[] add(%x, %y)\n}\n\nENTRY %e (a: f32[64]) -> f32[8] {\n  %a = f32[64]{0} parameter(0)\n  %n = f32[64]{0} negate(%a)\n  ROOT %rs = f32[8]{0} reduce-scatter(%n), channel_id=1, replica_groups=[1,8]<=[8], use_global_device_ids=true, dimensions={0}, to_apply=%add\n}\n";
    let mut m = parse(text);
    let base: Arc<dyn CostModel> = Arc::new(ApproximateCostModel);
    let table = CostTable::parse("n 3.5\nrs 77\n").unwrap();
    let model = TableCostModel::new(table, base);
    convert_collectives(&mut m, &AsyncConversionConfig::default());
    let comp = m.entry_computation();
    let start = comp.find("rs-start").unwrap();
    let done = comp.find("rs-done").unwrap();
    assert_eq!(comp.instr(start).opcode, Opcode::AsyncStart);
    let i = CollectiveInfo::of(&m, comp, start).unwrap();
    assert_eq!(i.kind, ResourceKind::ReduceScatter);
    assert_eq!(i.bytes_in, 256);
    assert_eq!(i.bytes_out, 32);
    assert_eq!(model.transfer_us(Op::new(&m, comp, start), &i), 77.0);
    assert_eq!(
        model.compute_us(Op::new(&m, comp, comp.find("n").unwrap())),
        3.5
    );
    // The done's wait is not compute.
    assert_eq!(model.compute_us(Op::new(&m, comp, done)), 1.0);
}

#[test]
fn cost_model_specs() {
    assert!(cost_model_from_spec("approximate")
        .unwrap()
        .name()
        .contains("approximate"));
    assert!(cost_model_from_spec("analytical")
        .unwrap()
        .name()
        .contains("H100"));
    assert!(cost_model_from_spec("analytical:h200")
        .unwrap()
        .name()
        .contains("H200"));
    assert!(matches!(
        cost_model_from_spec("analytical:a100"),
        Err(SchedulerError::BadCostModel(_))
    ));
    assert!(matches!(
        cost_model_from_spec("magic"),
        Err(SchedulerError::BadCostModel(_))
    ));
    let missing = cost_model_from_spec("table:/nonexistent/costs.txt");
    assert!(
        matches!(missing, Err(SchedulerError::CostTable { .. })),
        "{:?}",
        missing.err()
    );
    let dir = std::env::temp_dir().join(format!("lhs_table_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("t.txt");
    std::fs::write(&p, "x 1\ny oops\n").unwrap();
    match cost_model_from_spec(&format!("table:{}", p.display())) {
        Err(SchedulerError::CostTable { line, .. }) => assert_eq!(line, 2),
        other => panic!("{:?}", other.err()),
    }
    std::fs::write(&p, "x 1\n").unwrap();
    let t = cost_model_from_spec(&format!("table:{}@h200", p.display())).unwrap();
    assert!(t.name().contains("H200"), "{}", t.name());
    let _ = std::fs::remove_dir_all(&dir);
    let _ = fixed(&[]);
}
