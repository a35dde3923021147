//! The launcher: split-then-assemble is the identity for every sharding
//! kind and dtype class (property test), multi-device programs compute
//! XLA's collective semantics, and a failing device is reported promptly.

use proptest::prelude::*;
use std::time::{Duration, Instant};
use xla_hlo_evaluator::{Array, Data, Value};
use xla_hlo_ir::sharding::{ShardingKind, SingleSharding, TileAssignment};
use xla_hlo_ir::{HloSharding, PrimitiveType, Shape};
use xla_runtime::cpu::{literal_from_value, value_from_literal};
use xla_runtime::launcher::split_value;
use xla_runtime::{run_spmd, Backend, CpuBackend, LaunchPlan, Literal, RuntimeError};

fn lit(a: &Array) -> Literal {
    literal_from_value(&Value::Array(a.clone())).unwrap()
}

fn array_of(l: &Literal) -> Array {
    value_from_literal(l).unwrap().into_array().unwrap()
}

fn parse(text: &str) -> xla_hlo_ir::HloModule {
    xla_hlo_parser::parse_module(text).unwrap()
}

fn iota_array(ty: PrimitiveType, dims: Vec<i64>) -> Array {
    let n: i64 = dims.iter().product();
    let v: Vec<f64> = (0..n).map(|i| (i % 97) as f64).collect();
    Array::from_f64s(ty, dims, &v).unwrap()
}

/// An identity module on `n` devices whose parameter and root carry `s`,
/// with per-device shape `local`.
fn identity_module(local: &Shape, s: &str, n: usize) -> xla_hlo_ir::HloModule {
    parse(&format!(
        "HloModule m, num_partitions={n}\nENTRY e {{\n  p = {local} parameter(0), sharding={s}\n  ROOT c = {local} copy(p), sharding={s}\n}}"
    ))
}

fn tiled(dims: &[i64], devices: Vec<i64>, replicate_last: bool) -> SingleSharding {
    SingleSharding::new(ShardingKind::Tiled {
        tile_assignment: TileAssignment::Explicit {
            dims: dims.to_vec(),
            devices,
        },
        replicate_on_last_tile_dim: replicate_last,
        last_tile_dims: Vec::new(),
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]
    #[test]
    fn split_then_assemble_is_identity(
        dims in prop::collection::vec(1i64..7, 1..4),
        tiles_seed in prop::collection::vec(1i64..4, 3),
        replicate in 1i64..3,
        ty_pick in 0usize..5,
        perm_seed in any::<u64>(),
    ) {
        let ty = [PrimitiveType::F32, PrimitiveType::Bf16, PrimitiveType::S32,
                  PrimitiveType::U8, PrimitiveType::Pred][ty_pick];
        let rank = dims.len();
        let mut tile_dims: Vec<i64> = tiles_seed[..rank].to_vec();
        let partial = replicate > 1;
        if partial { tile_dims.push(replicate); }
        let n: i64 = tile_dims.iter().product();
        // A random device order.
        let mut devices: Vec<i64> = (0..n).collect();
        let mut x = perm_seed;
        for i in (1..devices.len()).rev() {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            devices.swap(i, (x >> 33) as usize % (i + 1));
        }
        let s = tiled(&tile_dims, devices, partial);
        let full = iota_array(ty, dims.clone());
        let sharding = HloSharding::Single(s.clone());
        // Per-device tiles (uneven dims padded).
        let local: Vec<i64> = dims.iter().zip(&tile_dims).map(|(&d, &t)| (d + t - 1) / t).collect();
        let module = identity_module(&Shape::array(ty, local), &sharding.to_string(), n as usize);
        let exe = CpuBackend.compile(&module).unwrap();
        let plan = LaunchPlan {
            num_partitions: n as usize,
            parameter_shardings: vec![Some(sharding.clone())],
            result_sharding: Some(sharding),
            result_shape: Shape::array(ty, dims),
            timeout: Duration::from_secs(60),
            check_replicas: true,
            consistent: false,
        };
        let out = run_spmd(exe.as_ref(), &[lit(&full)], &plan).unwrap();
        prop_assert_eq!(out.len(), 1);
        prop_assert_eq!(array_of(&out[0]), full);
    }
}

#[test]
fn uneven_tiles_are_zero_padded() {
    let full = Array::from_f32(vec![5], vec![1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
    let s = HloSharding::Single(tiled(&[2], vec![0, 1], false));
    let last = split_value(&lit(&full), Some(&s), 1).unwrap();
    let a = array_of(&last);
    assert_eq!(a.dims, vec![3]);
    assert_eq!(*a.data, Data::F32(vec![4.0, 5.0, 0.0]));
}

#[test]
fn collectives_run_through_the_launcher() {
    // Row-sharded x; an all-reduce of the local sums gives every device the
    // global sum, replicated at the root.
    let m = parse(
        r#"HloModule m, num_partitions=4
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[2,3] parameter(0), sharding={devices=[4,1]<=[4]}
  z = f32[] constant(0)
  r = f32[] reduce(x, z), dimensions={0,1}, to_apply=add
  ROOT ar = f32[] all-reduce(r), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
}"#,
    );
    let exe = CpuBackend.compile(&m).unwrap();
    let plan = LaunchPlan::from_module(exe.as_ref()).unwrap();
    let x = iota_array(PrimitiveType::F32, vec![8, 3]);
    let out = run_spmd(exe.as_ref(), &[lit(&x)], &plan).unwrap();
    let sum: f64 = (0..24).map(|i| i as f64).sum();
    assert_eq!(array_of(&out[0]).get_f64(0), sum);
}

#[test]
fn a_failing_device_fails_every_device_promptly() {
    // Only device 2 fails (a custom call the interpreter lacks, reached
    // through a conditional on partition-id); the others wait for it at the
    // all-reduce and must hear of the failure, not time out.
    let m = parse(
        r#"HloModule m, num_partitions=4
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ok {
  p = f32[] parameter(0)
  ROOT c = f32[] copy(p)
}
broken {
  q = f32[] parameter(0)
  ROOT bad = f32[] custom-call(q), custom_call_target="no_such_target"
}
ENTRY e {
  x = f32[] parameter(0)
  pid = u32[] partition-id()
  two = u32[] constant(2)
  is2 = pred[] compare(pid, two), direction=EQ
  y = f32[] conditional(is2, x, x), true_computation=broken, false_computation=ok
  ROOT ar = f32[] all-reduce(y), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
}"#,
    );
    let exe = CpuBackend.compile(&m).unwrap();
    let mut plan = LaunchPlan::from_module(exe.as_ref()).unwrap();
    plan.timeout = Duration::from_secs(60);
    let t = Instant::now();
    let err = run_spmd(exe.as_ref(), &[lit(&Array::scalar_f32(1.0))], &plan).unwrap_err();
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    let msg = err.to_string();
    assert!(msg.contains("no_such_target"), "{msg}");
    assert!(matches!(
        err,
        RuntimeError::Execute {
            peer_failed: false,
            ..
        }
    ));
}

#[test]
fn compile_rejects_modules_that_do_not_verify() {
    let m =
        parse("HloModule m\nENTRY e {\n  p = f32[2] parameter(0)\n  ROOT a = f32[3] add(p, p)\n}");
    let err = CpuBackend.compile(&m).err().expect("must not compile");
    assert!(err.to_string().contains("does not verify"), "{err}");
}

#[test]
fn manual_shardings_cannot_be_split() {
    let s = HloSharding::Single(SingleSharding::new(ShardingKind::Manual));
    let err = split_value(&lit(&Array::scalar_f32(1.0)), Some(&s), 0).unwrap_err();
    assert!(err.to_string().contains("manual"), "{err}");
}
