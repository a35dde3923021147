//! Consistent mode: a module partitioned with `SpmdOptions::consistent` and
//! run on loopback devices in consistent mode gives the bits of the
//! unpartitioned module run on one device in consistent mode; reductions
//! stay split (partial results and an all-reduce or reduce-scatter) where
//! the split reproduces the order, and are reduced whole, counted as
//! `consistent-relayout`, where it would not.
//!
//! Arguments are floats of very different magnitudes, so that any other
//! summation order shows in the bits.

use xla_hlo_evaluator::{evaluate, Array, EvalContext, Value};
use xla_hlo_ir::{HloModule, Opcode, PrimitiveType};
use xla_runtime::cpu::{literals_from_values, values_from_literals};
use xla_runtime::{Backend, CpuBackend, LaunchPlan};
use xla_spmd_partitioner::{partition_module, PartitionSummary, SpmdOptions};

fn spread(n: usize, seed: u32) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let x = (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(40_503));
            let mantissa = (x % 1000) as f64 / 999.0 - 0.5;
            mantissa * 10f64.powi((x / 1000 % 9) as i32 - 4)
        })
        .collect()
}

fn arguments(m: &HloModule) -> Vec<Value> {
    let e = m.entry_computation();
    e.parameters
        .iter()
        .enumerate()
        .map(|(k, &p)| {
            let shape = &e.instr(p).shape;
            let ty = shape.element_type().unwrap_or(PrimitiveType::F32);
            let n: i64 = shape.dims().iter().product();
            let v = spread(n as usize, k as u32 + 1);
            Value::Array(Array::from_f64s(ty, shape.dims().to_vec(), &v).unwrap())
        })
        .collect()
}

fn bits(values: &[Value]) -> Vec<Vec<u8>> {
    values
        .iter()
        .flat_map(|v| v.leaves().into_iter().cloned())
        .map(|a| {
            xla_hlo_evaluator::collective::to_buffer(&a)
                .unwrap()
                .to_vec()
        })
        .collect()
}

struct Outcome {
    summary: PartitionSummary,
    partitioned: HloModule,
    identical: bool,
}

/// Partitions `text` for `n` devices (consistent or not), runs it and the
/// unpartitioned module in that mode, and compares their bits.
fn run(text: &str, n: i64, consistent: bool) -> Outcome {
    let global = xla_hlo_parser::parse_module(text).unwrap();
    let mut m = global.clone();
    let summary = partition_module(
        &mut m,
        &SpmdOptions {
            num_partitions: Some(n),
            consistent,
        },
    )
    .unwrap();
    xla_hlo_verifier::verify(&m).unwrap();
    let args = arguments(&global);
    let ctx = EvalContext {
        num_partitions: Some(1),
        num_replicas: Some(1),
        consistent,
        ..EvalContext::default()
    };
    let want = evaluate(&global, &args, &ctx).unwrap();
    let exe = CpuBackend.compile(&m).unwrap();
    let out_shape = global.entry_computation().root_instr().shape.clone();
    let mut plan = LaunchPlan::for_partitioned(&m, out_shape);
    plan.num_partitions = n as usize;
    plan.consistent = consistent;
    let got = xla_runtime::run_spmd(exe.as_ref(), &literals_from_values(&args).unwrap(), &plan)
        .and_then(|o| values_from_literals(&o))
        .unwrap();
    Outcome {
        summary,
        identical: bits(&got) == bits(&want),
        partitioned: m,
    }
}

fn count(m: &HloModule, op: Opcode) -> usize {
    m.computations
        .iter()
        .flat_map(|c| &c.instructions)
        .filter(|i| i.opcode == op)
        .count()
}

fn relayouts(s: &PartitionSummary) -> usize {
    s.handlers
        .iter()
        .filter(|(k, _)| k.ends_with(":consistent-relayout"))
        .map(|(_, &v)| v)
        .sum()
}

fn dot(k: i64, ty: &str, n: i64) -> String {
    format!(
        r#"HloModule m, num_partitions={n}
ENTRY e {{
  a = f32[16,{k}] parameter(0), sharding={{devices=[1,{n}]<=[{n}]}}
  b = f32[{k},8] parameter(1), sharding={{devices=[{n},1]<=[{n}]}}
  ca = {ty}[16,{k}] convert(a), sharding={{devices=[1,{n}]<=[{n}]}}
  cb = {ty}[{k},8] convert(b), sharding={{devices=[{n},1]<=[{n}]}}
  d = {ty}[16,8] dot(ca, cb), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}, sharding={{replicated}}
  ROOT r = f32[16,8] convert(d), sharding={{replicated}}
}}"#
    )
}

#[test]
fn a_contraction_split_in_tree_order_stays_split_and_is_bitwise_single_device() {
    for n in [2, 4, 8] {
        let o = run(&dot(64, "f32", n), n, true);
        assert!(o.identical, "{n} devices:\n{}", o.partitioned.to_text());
        assert_eq!(relayouts(&o.summary), 0);
        assert_eq!(count(&o.partitioned, Opcode::AllReduce), 1, "{n} devices");
    }
}

#[test]
fn the_default_mode_does_not_reproduce_the_single_device_bits_here() {
    // The same program without consistent mode: partial sums are combined
    // in another order than the single-device GEMM's, so the bits differ
    // (this is what the consistent mode is for, and shows the comparison
    // can fail).
    let o = run(&dot(64, "f32", 4), 4, false);
    assert!(!o.identical);
}

#[test]
fn splits_that_cannot_reproduce_the_order_reduce_whole() {
    // Three tiles (not a power of two) and uneven tiles: each reduces its
    // contraction whole.
    for (text, n) in [(dot(63, "f32", 3), 3), (dot(62, "f32", 4), 4)] {
        let o = run(&text, n, true);
        assert!(o.identical, "{}", o.partitioned.to_text());
        assert_eq!(relayouts(&o.summary), 1, "{}", o.partitioned.to_text());
        assert_eq!(count(&o.partitioned, Opcode::AllReduce), 0);
    }
}

#[test]
fn a_bf16_dot_keeps_its_split_with_f32_partial_sums() {
    // Rounding partial dots to bf16 would not reproduce the single-device
    // dot (f32 accumulation rounded once): the partial dots stay f32, are
    // all-reduced in f32 and rounded after.
    let o = run(&dot(64, "bf16", 4), 4, true);
    assert!(o.identical, "{}", o.partitioned.to_text());
    let notes = &o.summary.handlers;
    assert_eq!(
        notes.get("dot:consistent-f32-partial-sums"),
        Some(&1),
        "{notes:?}"
    );
    let all_reduce = o
        .partitioned
        .entry_computation()
        .instructions
        .iter()
        .find(|i| i.opcode == Opcode::AllReduce)
        .expect("an all-reduce");
    assert_eq!(all_reduce.shape.element_type(), Some(PrimitiveType::F32));
}

#[test]
fn reduce_splits_only_on_the_major_reduced_dim() {
    let reduce = |dim0_tiles: i64, dim1_tiles: i64| {
        format!(
            r#"HloModule m, num_partitions=4
add {{ x = f32[] parameter(0)  y = f32[] parameter(1)  ROOT s = f32[] add(x, y) }}
ENTRY e {{
  a = f32[8,12,6] parameter(0), sharding={{devices=[{dim0_tiles},{dim1_tiles},1]<=[4]}}
  z = f32[] constant(0)
  ROOT r = f32[6] reduce(a, z), dimensions={{0,1}}, to_apply=add, sharding={{replicated}}
}}"#
        )
    };
    // Dim 0 split: each device's rows are a subtree of the order.
    let o = run(&reduce(4, 1), 4, true);
    assert!(o.identical);
    assert_eq!(relayouts(&o.summary), 0);
    assert_eq!(count(&o.partitioned, Opcode::AllReduce), 1);
    // Dim 1 split: a device's elements are not contiguous in the order; an
    // all-to-all moves the split onto dim 0 (cheaper than gathering).
    let relaid_out = |text: &str, all_to_alls: usize| {
        let o = run(text, 4, true);
        let printed = o.partitioned.to_text();
        assert!(o.identical, "{printed}");
        assert_eq!(relayouts(&o.summary), 1);
        assert_eq!(
            count(&o.partitioned, Opcode::AllToAll),
            all_to_alls,
            "{printed}"
        );
        o
    };
    let o = relaid_out(&reduce(1, 4), 1);
    assert_eq!(count(&o.partitioned, Opcode::AllGather), 0);
    // Both dims split, dim 0 not evenly by all four: gathered instead.
    relaid_out(&reduce(2, 2).replace("f32[8,12,6]", "f32[6,12,6]"), 0);
    // Max is exact in any grouping: it stays split either way.
    let max = reduce(1, 4)
        .replace("add(x, y)", "maximum(x, y)")
        .replace("constant(0)", "constant(-inf)");
    let o = run(&max, 4, true);
    assert!(o.identical);
    assert_eq!(relayouts(&o.summary), 0);
}

#[test]
fn a_convolution_split_on_input_features_stays_split() {
    let text = r#"HloModule m, num_partitions=4
ENTRY e {
  x = f32[2,10,32] parameter(0), sharding={devices=[1,1,4]<=[4]}
  w = f32[3,32,6] parameter(1), sharding={devices=[1,4,1]<=[4]}
  ROOT c = f32[2,10,6] convolution(x, w), window={size=3 pad=1_1}, dim_labels=b0f_0io->b0f, sharding={replicated}
}"#;
    let o = run(text, 4, true);
    assert!(o.identical, "{}", o.partitioned.to_text());
    assert_eq!(relayouts(&o.summary), 0);
    assert_eq!(count(&o.partitioned, Opcode::AllReduce), 1);
}
