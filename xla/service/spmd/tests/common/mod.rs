//! Shared test helpers: deterministic random arguments, running a module
//! globally (one device) and partitioned (N loopback devices, inputs split
//! and outputs assembled by the entry shardings, replicas checked equal),
//! and comparing the two exactly or with a tolerance.

#![allow(dead_code)]

use xla_hlo_evaluator::{Array, Value};
use xla_hlo_ir::{HloModule, PrimitiveType, Shape};
use xla_hlo_pass::Pass;
use xla_runtime::cpu::{literals_from_values, values_from_literals};
use xla_runtime::{Backend, CpuBackend, LaunchPlan};
use xla_spmd_partitioner::{partition_module, PartitionSummary, SpmdOptions};

/// A small deterministic generator (xorshift).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Values exactly representable in every float type used (multiples of 1/8).
    pub fn value(&mut self, ty: PrimitiveType) -> f64 {
        let r = self.next();
        match ty {
            PrimitiveType::Pred => (r % 2) as f64,
            t if t.is_unsigned_int() => (r % 200) as f64,
            t if t.is_integer() => (r % 200) as f64 - 100.0,
            _ => ((r % 64) as f64 - 32.0) / 8.0,
        }
    }
}

pub fn random_value(shape: &Shape, rng: &mut Rng) -> Value {
    match shape {
        Shape::Tuple(e) => Value::Tuple(e.iter().map(|s| random_value(s, rng)).collect()),
        s => {
            let ty = s.element_type().unwrap_or(PrimitiveType::F32);
            let n: i64 = s.dims().iter().product();
            let v: Vec<f64> = (0..n).map(|_| rng.value(ty)).collect();
            Value::Array(Array::from_f64s(ty, s.dims().to_vec(), &v).unwrap())
        }
    }
}

/// Random arguments for `module`'s entry parameters (deterministic in
/// `seed`).
pub fn random_args(module: &HloModule, seed: u64) -> Vec<Value> {
    let mut rng = Rng(seed | 1);
    let entry = module.entry_computation();
    entry
        .parameters
        .iter()
        .map(|&p| random_value(&entry.instr(p).shape, &mut rng))
        .collect()
}

pub fn parse(text: &str) -> HloModule {
    let m = xla_hlo_parser::parse_module(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    xla_hlo_verifier::verify(&m).unwrap_or_else(|e| panic!("{e}\n{text}"));
    m
}

/// Propagates shardings (when `propagate`), partitions for `n` devices,
/// verifies, runs both versions on random arguments and compares exactly
/// (or within `tol` for floats). Returns the partition summary.
pub fn check(
    text: &str,
    n: i64,
    propagate: bool,
    tol: f64,
    seed: u64,
) -> (PartitionSummary, HloModule) {
    let mut m = parse(text);
    if propagate {
        xla_sharding_propagation::ShardingPropagation::default()
            .run(&mut m)
            .unwrap();
    }
    let global = m.clone();
    let out_shape = global.entry_computation().root_instr().shape.clone();
    let summary = partition_module(
        &mut m,
        &SpmdOptions {
            num_partitions: Some(n),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("partitioning failed: {e}\n{}", global.to_text()));
    if let Err(e) = xla_hlo_verifier::verify(&m) {
        panic!("partitioned module does not verify:\n{e}\n{}", m.to_text());
    }
    // The printed program reads back (callees are printed before callers).
    let text_out = m.to_text();
    let back = xla_hlo_parser::parse_module(&text_out)
        .unwrap_or_else(|e| panic!("printed module does not parse: {e}\n{text_out}"));
    let pos = |name: &str| text_out.find(&format!("%{name} (")).unwrap_or(0);
    for c in &back.computations {
        for i in &c.instructions {
            for callee in i.called_computations() {
                let callee = &back.comp(callee).name;
                assert!(
                    pos(callee) < pos(&c.name),
                    "{callee} printed after its caller {}",
                    c.name
                );
            }
        }
    }
    let mut rng = Rng(seed | 1);
    let e = global.entry_computation();
    let args: Vec<Value> = e
        .parameters
        .iter()
        .map(|&p| random_value(&e.instr(p).shape, &mut rng))
        .collect();
    let want = run_global(&global, &args);
    let got = run_partitioned(&m, &args, &out_shape, n)
        .unwrap_or_else(|e| panic!("{e}\n{}", m.to_text()));
    compare(&got, &want, tol, &m);
    (summary, m)
}

pub fn compare(got: &Value, want: &Value, tol: f64, m: &HloModule) {
    let (g, w) = (got.leaves(), want.leaves());
    assert_eq!(g.len(), w.len());
    for (k, (a, b)) in g.iter().zip(&w).enumerate() {
        assert_eq!(a.dims, b.dims, "output {k} shape");
        if tol == 0.0 || !(a.ty.is_float() || a.ty.is_complex()) {
            assert!(a == b, "output {k} differs\n{}", m.to_text());
        } else {
            let c = xla_hlo_evaluator::compare::compare(a, b, tol, tol);
            assert!(c.matched(), "output {k}: {c:?}\n{}", m.to_text());
        }
    }
}

/// Runs the global (unpartitioned) module on one device; a tuple root's
/// elements come back as one tuple.
pub fn run_global(module: &HloModule, args: &[Value]) -> Value {
    let ctx = xla_hlo_evaluator::EvalContext {
        num_partitions: Some(1),
        num_replicas: Some(1),
        ..Default::default()
    };
    let outs = xla_hlo_evaluator::evaluate(module, args, &ctx)
        .unwrap_or_else(|e| panic!("the global module fails: {e}\n{}", module.to_text()));
    as_one_value(module, outs)
}

/// Runs partitioned `module` on `n` loopback devices through the runtime's
/// launcher: global `args` split by the parameter shardings, the result
/// (global shape `out_shape`) assembled by the root's sharding, replicas
/// checked to agree.
pub fn run_partitioned(
    module: &HloModule,
    args: &[Value],
    out_shape: &Shape,
    n: i64,
) -> Result<Value, String> {
    run_partitioned_in_mode(module, args, out_shape, n, false)
}

/// [`run_partitioned`], in consistent mode when `consistent` (every
/// floating-point reduction, dots included, in one pairwise-tree order
/// whatever the shapes, so a dot split into pieces gives the same bits).
pub fn run_partitioned_in_mode(
    module: &HloModule,
    args: &[Value],
    out_shape: &Shape,
    n: i64,
    consistent: bool,
) -> Result<Value, String> {
    let exe = CpuBackend.compile(module).map_err(|e| e.to_string())?;
    let mut plan = LaunchPlan::for_partitioned(module, out_shape.clone());
    plan.num_partitions = n as usize;
    plan.consistent = consistent;
    let args = literals_from_values(args).map_err(|e| e.to_string())?;
    let outs = xla_runtime::run_spmd(exe.as_ref(), &args, &plan)
        .and_then(|outs| values_from_literals(&outs))
        .map_err(|e| e.to_string())?;
    Ok(as_one_value(module, outs))
}

fn as_one_value(module: &HloModule, mut outs: Vec<Value>) -> Value {
    if !module.entry_computation().root_instr().shape.is_tuple() && outs.len() == 1 {
        outs.remove(0)
    } else {
        Value::Tuple(outs)
    }
}

/// Every output element has the same bits (NaNs included, which `==`
/// would call different).
pub fn assert_bitwise_equal(got: &Value, want: &Value, name: &str) {
    let (got, want) = (got.leaves(), want.leaves());
    assert_eq!(got.len(), want.len(), "{name}");
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.dims, b.dims, "{name}: output {k}");
        let bits = |x: &xla_hlo_evaluator::Array| -> Vec<u64> {
            x.to_f64_vec().iter().map(|v| v.to_bits()).collect()
        };
        assert!(bits(a) == bits(b), "{name}: output {k} differs");
    }
}

/// `text` after sharding propagation (the global module), and after
/// partitioning as well.
pub fn propagate_and_partition(text: &str) -> Result<(HloModule, HloModule), String> {
    let mut module = xla_hlo_parser::parse_module(text).map_err(|e| e.to_string())?;
    xla_sharding_propagation::ShardingPropagation::default()
        .run(&mut module)
        .map_err(|e| e.to_string())?;
    let global = module.clone();
    partition_module(&mut module, &SpmdOptions::default()).map_err(|e| e.to_string())?;
    Ok((global, module))
}

/// `rewritten` (a rewrite of partitioned `module`, both from `global`)
/// verifies and, run in consistent mode on the module's partition count
/// with the same random arguments (`seed`), computes `module`'s bits.
pub fn assert_rewrite_computes_the_same(
    global: &HloModule,
    module: &HloModule,
    rewritten: &HloModule,
    seed: u64,
    name: &str,
) {
    xla_hlo_verifier::verify(rewritten)
        .unwrap_or_else(|e| panic!("{name}: {e}\n{}", rewritten.to_text()));
    let args = random_args(global, seed);
    let out_shape = global.entry_computation().root_instr().shape.clone();
    let n = module.num_partitions();
    let want = run_partitioned_in_mode(module, &args, &out_shape, n, true)
        .unwrap_or_else(|e| panic!("{name}: before: {e}"));
    let got = run_partitioned_in_mode(rewritten, &args, &out_shape, n, true)
        .unwrap_or_else(|e| panic!("{name}: rewritten: {e}"));
    assert_bitwise_equal(&got, &want, name);
}

/// How many all-reduces, all-gathers and reduce-scatters `m` holds.
pub fn collective_count(m: &HloModule) -> usize {
    m.computations
        .iter()
        .flat_map(|c| &c.instructions)
        .filter(|i| {
            matches!(
                i.opcode,
                xla_hlo_ir::Opcode::AllReduce
                    | xla_hlo_ir::Opcode::AllGather
                    | xla_hlo_ir::Opcode::ReduceScatter
            )
        })
        .count()
}
