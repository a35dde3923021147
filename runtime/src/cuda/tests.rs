//! CPU tests of the CUDA backend's planner and code generator: the support
//! check names every unsupported instruction; plans fuse what they should;
//! the plan's generated kernels built for the host and run by the
//! executor (`cuda-host`) match the interpreter; the generated CUDA source
//! has the expected structure.

use super::codegen::{kernel_source, module_source};
use super::hostexec::CudaHostBackend;
use super::plan::{check_supported, plan_module, Expr, KernelBody, Plan, Step};
use super::prepare;
use crate::backend::{Backend, DeviceContext};
use crate::cpu::{literals_from_values, values_from_literals};
use crate::error::RuntimeError;
use xla_hlo_evaluator::compare::compare;
use xla_hlo_evaluator::{evaluate, Array, EvalContext, Value};
use xla_hlo_ir::{HloModule, PrimitiveType};

fn parse(text: &str) -> HloModule {
    xla_hlo_parser::parse_module(text).unwrap()
}

/// Deterministic arguments for the entry parameters (values in [-2, 2],
/// positive where `positive`).
pub(crate) fn args_for(m: &HloModule, positive: bool) -> Vec<Value> {
    let c = m.entry_computation();
    c.parameters
        .iter()
        .enumerate()
        .map(|(pi, p)| {
            let s = c.instr(*p).shape.as_array().unwrap();
            let n: i64 = s.dims.iter().product();
            let v: Vec<f64> = (0..n)
                .map(|i| {
                    let x = (((i * 7 + pi as i64 * 13) % 17) as f64 - 8.0) / 4.0;
                    match s.element_type {
                        PrimitiveType::Pred => ((i + pi as i64) % 2) as f64,
                        t if !t.is_float() => ((i * 5 + pi as i64) % 11) as f64 - 5.0,
                        _ if positive => x.abs() + 0.25,
                        _ => x,
                    }
                })
                .collect();
            Value::Array(Array::from_f64s(s.element_type, s.dims.clone(), &v).unwrap())
        })
        .collect()
}

fn interpret(m: &HloModule, args: &[Value]) -> Vec<Value> {
    let ctx = EvalContext {
        num_partitions: Some(1),
        num_replicas: Some(1),
        ..Default::default()
    };
    evaluate(m, args, &ctx).unwrap()
}

fn assert_close(got: &[Value], want: &[Value], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        let (gl, wl) = (g.leaves(), w.leaves());
        assert_eq!(gl.len(), wl.len());
        for (a, b) in gl.iter().zip(wl) {
            assert_eq!(a.ty, b.ty);
            assert_eq!(a.dims, b.dims);
            let c = compare(a, b, tol, tol);
            assert!(
                c.matched(),
                "{c:?}\n got {:?}\nwant {:?}",
                a.to_f64_vec(),
                b.to_f64_vec()
            );
        }
    }
}

/// Runs `m` on the `cuda-host` backend (the generated kernels built for
/// the host, driven by the plan's executor) on one device.
pub(crate) fn run_on_host(m: &HloModule, args: &[Value]) -> Vec<Value> {
    let exe = CudaHostBackend.compile(m).unwrap_or_else(|e| panic!("{e}"));
    let lits = literals_from_values(args).unwrap();
    let out = exe
        .execute(&DeviceContext::single(), &lits)
        .unwrap_or_else(|e| panic!("{e}"));
    values_from_literals(&out).unwrap()
}

/// Plans `text`, runs its kernels on the host and compares with the
/// interpreter (within a few f32 ulps: libm's expf, tanhf... are not the
/// f64 functions rounded once).
fn check(text: &str, positive: bool, tol: f64) -> Plan {
    let m = parse(text);
    let (plan, src) = prepare(&m).unwrap_or_else(|e| panic!("{e}"));
    assert!(src.contains("xla_bf16_to_f32"));
    let args = args_for(&m, positive);
    let got = run_on_host(&m, &args);
    let want = interpret(&m, &args);
    assert_close(&got, &want, tol.max(1e-6));
    plan
}

fn fused_count(p: &Plan) -> usize {
    p.kernels().count()
}

#[test]
fn unsupported_opcodes_are_named_with_their_instructions() {
    let m = parse(
        r#"HloModule m
ENTRY e {
  p = f32[4] parameter(0)
  st = u64[2] parameter(1)
  r1 = (u64[2], u32[4]) rng-bit-generator(st), algorithm=rng_three_fry
  r2 = (u64[2], u32[4]) rng-bit-generator(st), algorithm=rng_three_fry
  q = u4[4] convert(p)
  cc = f32[4] custom-call(p), custom_call_target="my_kernel"
  ROOT r = f32[4] add(cc, p)
}"#,
    );
    let e = check_supported(&m).unwrap_err();
    assert!(e.contains("rng-bit-generator (r1, r2)"), "{e}");
    assert!(e.contains("custom-call \"my_kernel\" (cc)"), "{e}");
    assert!(e.contains("element type u4 (q)"), "{e}");
    match prepare(&m) {
        Err(RuntimeError::Compile { backend, message }) => {
            assert_eq!(backend, "cuda");
            assert!(message.contains("rng-bit-generator (r1, r2)"), "{message}");
        }
        other => panic!("expected a compile error, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn while_loop_is_driven_from_the_host() {
    let plan = check(
        r#"HloModule m
cond {
  p = (s32[], f32[3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  k = s32[] constant(5)
  ROOT lt = pred[] compare(i, k), direction=LT
}
body {
  p = (s32[], f32[3]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[3] get-tuple-element(p), index=1
  one = s32[] constant(1)
  i1 = s32[] add(i, one)
  h = f32[] constant(0.5)
  hb = f32[3] broadcast(h), dimensions={}
  x1 = f32[3] add(x, hb)
  ROOT t = (s32[], f32[3]) tuple(i1, x1)
}
ENTRY e {
  z = s32[] parameter(0)
  x = f32[3] parameter(1)
  t = (s32[], f32[3]) tuple(z, x)
  w = (s32[], f32[3]) while(t), condition=cond, body=body
  ROOT r = f32[3] get-tuple-element(w), index=1
}"#,
        false,
        0.0,
    );
    assert!(plan
        .entry()
        .steps
        .iter()
        .any(|s| matches!(s, Step::While { .. })));
    assert_eq!(plan.comps.len(), 3);
}

#[test]
fn elementwise_chain_with_scalar_broadcast_is_one_kernel() {
    let p = check(
        r#"HloModule m
ENTRY e {
  x = f32[3,5] parameter(0)
  y = f32[3,5] parameter(1)
  two = f32[] constant(2)
  b = f32[3,5] broadcast(two), dimensions={}
  m = f32[3,5] multiply(x, b)
  a = f32[3,5] add(m, y)
  n = f32[3,5] negate(a)
  t = f32[3,5] tanh(n)
  ROOT ex = f32[3,5] exponential(t)
}"#,
        false,
        1e-6,
    );
    assert_eq!(fused_count(&p), 1);
    let k = p.kernels().next().unwrap();
    assert_eq!(k.inputs.len(), 2);
    match &k.body {
        KernelBody::Elementwise(roots) => assert!(roots[0].size() >= 8),
        b => panic!("{b:?}"),
    }
}

#[test]
fn broadcast_of_rows_and_columns_and_transpose() {
    check(
        r#"HloModule m
ENTRY e {
  x = f32[2,3,4] parameter(0)
  r = f32[3] parameter(1)
  c = f32[2] parameter(2)
  br = f32[2,3,4] broadcast(r), dimensions={1}
  bc = f32[2,3,4] broadcast(c), dimensions={0}
  s = f32[2,3,4] subtract(x, br)
  d = f32[2,3,4] divide(s, bc)
  ROOT t = f32[4,2,3] transpose(d), dimensions={2,0,1}
}"#,
        true,
        1e-6,
    );
}

#[test]
fn softmax_reduce_max_and_sum() {
    let p = check(
        r#"HloModule m
max {
  ma = f32[] parameter(0)
  mb = f32[] parameter(1)
  ROOT mm = f32[] maximum(ma, mb)
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT sa = f32[] add(a, b)
}
ENTRY e {
  x = f32[4,6] parameter(0)
  ninf = f32[] constant(-inf)
  mx = f32[4] reduce(x, ninf), dimensions={1}, to_apply=max
  bmx = f32[4,6] broadcast(mx), dimensions={0}
  s = f32[4,6] subtract(x, bmx)
  ex = f32[4,6] exponential(s)
  zero = f32[] constant(0)
  sum = f32[4] reduce(ex, zero), dimensions={1}, to_apply=add
  bs = f32[4,6] broadcast(sum), dimensions={0}
  ROOT r = f32[4,6] divide(ex, bs)
}"#,
        false,
        1e-6,
    );
    // mx, ex (two users), sum, r.
    assert_eq!(fused_count(&p), 4);
    let src = module_source(&p);
    assert!(src.contains("for (long long r"), "{src}");
    assert!(src.contains("-__int_as_float(0x7f800000)"), "{src}");
}

#[test]
fn reduce_over_leading_and_several_dims() {
    check(
        r#"HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[3,4,5] parameter(0)
  zero = f32[] constant(0)
  r0 = f32[4,5] reduce(x, zero), dimensions={0}, to_apply=add
  r02 = f32[4] reduce(x, zero), dimensions={0,2}, to_apply=add
  ROOT t = (f32[4,5], f32[4]) tuple(r0, r02)
}"#,
        false,
        1e-5,
    );
}

#[test]
fn slice_reshape_iota_compare_select_convert() {
    check(
        r#"HloModule m
ENTRY e {
  x = f32[6,8] parameter(0)
  s = f32[3,3] slice(x), slice={[1:6:2], [0:8:3]}
  rs = f32[9] reshape(s)
  io = s32[9] iota(), iota_dimension=0
  four = s32[] constant(4)
  b4 = s32[9] broadcast(four), dimensions={}
  lt = pred[9] compare(io, b4), direction=LT
  fi = f32[9] convert(io)
  sel = f32[9] select(lt, rs, fi)
  ci = s32[9] convert(sel)
  ROOT t = (f32[9], s32[9], pred[9]) tuple(sel, ci, lt)
}"#,
        false,
        0.0,
    );
}

#[test]
fn bf16_ops_round_per_op() {
    check(
        r#"HloModule m
ENTRY e {
  x = bf16[16] parameter(0)
  y = bf16[16] parameter(1)
  m = bf16[16] multiply(x, y)
  a = bf16[16] add(m, x)
  s = bf16[16] sqrt(a)
  c = f32[16] convert(s)
  ROOT t = (bf16[16], f32[16]) tuple(s, c)
}"#,
        true,
        0.0,
    );
}

#[test]
fn dots_with_batch_and_transposed_operands() {
    let p = check(
        r#"HloModule m
ENTRY e {
  a = f32[2,3,4] parameter(0)
  b = f32[2,5,4] parameter(1)
  ROOT d = f32[2,3,5] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={2}
}"#,
        false,
        1e-5,
    );
    // rhs [b,n,k] is transposed to [b,k,n] by one planned kernel.
    assert_eq!(fused_count(&p), 1);
    let dot = p
        .entry()
        .steps
        .iter()
        .find_map(|s| match s {
            Step::Dot(d) => Some(d.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!((dot.batch, dot.m, dot.n, dot.k), (2, 3, 5, 4));

    check(
        r#"HloModule m
ENTRY e {
  x = bf16[2,3,8] parameter(0)
  w = bf16[8,4] parameter(1)
  ROOT d = f32[2,3,4] dot(x, w), lhs_contracting_dims={2}, rhs_contracting_dims={0}
}"#,
        false,
        1e-5,
    );
    check(
        r#"HloModule m
ENTRY e {
  x = f32[8,3] parameter(0)
  w = f32[4,8] parameter(1)
  ROOT d = f32[3,4] dot(x, w), lhs_contracting_dims={0}, rhs_contracting_dims={1}
}"#,
        false,
        1e-5,
    );
}

#[test]
fn integer_dots_are_kernels_not_cublas_calls() {
    let p = check(
        r#"HloModule m
ENTRY e {
  x = s32[2,3] parameter(0)
  w = s32[3,4] parameter(1)
  ROOT d = s32[2,4] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}"#,
        false,
        0.0,
    );
    assert!(!p.entry().steps.iter().any(|s| matches!(s, Step::Dot(_))));
    assert_eq!(fused_count(&p), 1);
    assert!(plan_module(&parse(
        "HloModule m\nENTRY e {\n  ROOT p = s32[2] parameter(0)\n}"
    ))
    .is_ok());
}

#[test]
fn generated_source_structure() {
    let m = parse(
        r#"HloModule m
ENTRY e {
  x = bf16[2,3] parameter(0)
  r = bf16[3] parameter(1)
  br = bf16[2,3] broadcast(r), dimensions={1}
  a = bf16[2,3] add(x, br)
  ROOT mx = bf16[2,3] maximum(a, x)
}"#,
    );
    let (p, src) = prepare(&m).unwrap();
    assert_eq!(fused_count(&p), 1);
    let k = p.kernels().next().unwrap();
    let ks = kernel_source(k, &p);
    assert!(ks.starts_with(&format!(
        "extern \"C\" __global__ void {}(unsigned short* __restrict__ out0, const unsigned short* __restrict__ in0, const unsigned short* __restrict__ in1, long long n)",
        k.name
    )), "{ks}");
    assert!(ks.contains("xla_f32_to_bf16("), "{ks}");
    assert!(ks.contains("xla_round_bf16("), "{ks}");
    assert!(ks.contains("xla_max<float>("), "{ks}");
    // The broadcast's index math: coordinate 1 of the [2,3] output.
    assert!(ks.contains("(i / 1ll) % 3ll"), "{ks}");
    assert!(ks.contains("gridDim.x * blockDim.x"), "{ks}");
    let opens = src.matches('{').count();
    assert_eq!(opens, src.matches('}').count(), "{src}");
    assert_eq!(src.matches("__global__").count(), 1);
    // Input slots follow first use.
    match &k.body {
        KernelBody::Elementwise(roots) => match &roots[0].expr {
            Expr::Binary(_, a, _) => assert!(matches!(a.expr, Expr::Binary(..))),
            e => panic!("{e:?}"),
        },
        b => panic!("{b:?}"),
    }
}

#[test]
fn backend_without_device_is_a_typed_error() {
    // Without the feature this is the stub; with it, a machine without CUDA
    // gets RuntimeError::Devices from the probe (never a panic).
    match super::CudaBackend::new(0) {
        Ok(_) => eprintln!("a CUDA device is present"),
        Err(RuntimeError::Devices(m)) => eprintln!("no CUDA backend here: {m}"),
        Err(e) => panic!("unexpected error kind: {e}"),
    }
}

#[test]
fn more_elementwise_ops_and_sharding_annotations() {
    let p = check(
        r#"HloModule m
ENTRY e {
  x = f32[12] parameter(0)
  y = f32[12] parameter(1)
  k = s32[12] parameter(2)
  lo = f32[] constant(-1)
  hi = f32[] constant(1.5)
  c = f32[12] clamp(lo, x, hi)
  sg = f32[12] sign(x)
  fl = f32[12] floor(y)
  ce = f32[12] ceil(x)
  sn = f32[12] sine(x)
  cs = f32[12] cosine(y)
  l1 = f32[12] log-plus-one(c)
  em = f32[12] exponential-minus-one(x)
  ax = f32[12] abs(x)
  pw = f32[12] power(ax, y)
  rm = f32[12] remainder(x, y)
  fin = pred[12] is-finite(pw)
  three = s32[] constant(3)
  b3 = s32[12] broadcast(three), dimensions={}
  kr = s32[12] remainder(k, b3)
  ka = s32[12] and(k, b3)
  ko = s32[12] or(k, b3)
  kx = s32[12] xor(k, b3)
  kn = s32[12] not(k)
  z = f32[] constant(0)
  bz = f32[12] broadcast(z), dimensions={}
  gt = pred[12] compare(x, bz), direction=GT
  ng = pred[12] not(gt)
  an = pred[12] and(ng, fin)
  sh = f32[12] custom-call(c), custom_call_target="Sharding", sharding={replicated}
  s1 = f32[12] add(sh, sg)
  s2 = f32[12] add(s1, fl)
  s3 = f32[12] add(s2, ce)
  s4 = f32[12] add(s3, sn)
  s5 = f32[12] add(s4, cs)
  s6 = f32[12] add(s5, l1)
  s7 = f32[12] add(s6, em)
  s8 = f32[12] add(s7, rm)
  ROOT t = (f32[12], pred[12], s32[12], s32[12], s32[12], s32[12], s32[12], pred[12]) tuple(s8, an, kr, ka, ko, kx, kn, fin)
}"#,
        false,
        1e-6,
    );
    let src = module_source(&p);
    for f in [
        "xla_sign(",
        "xla_fmod(",
        "xla_irem(",
        "xla_isfinite(",
        "xla_pow(",
        "xla_log1p(",
    ] {
        assert!(src.contains(f), "{f} missing:\n{src}");
    }
}

#[test]
fn concatenate_and_pad_with_negative_and_interior_padding() {
    let p = check(
        r#"HloModule m
ENTRY e {
  x = f32[2,3] parameter(0)
  y = f32[2,1] parameter(1)
  z = f32[2,2] parameter(2)
  c = f32[2,6] concatenate(x, y, z), dimensions={1}
  e = f32[2,6] exponential(c)
  pv = f32[] constant(-7)
  pd = f32[5,12] pad(e, pv), padding=1_2x-1_2_1
  one = f32[4,2] parameter(3)
  c1 = f32[4,2] concatenate(one), dimensions={0}
  r1 = f32[4,2] reverse(c1), dimensions={0,1}
  ROOT t = (f32[5,12], f32[4,2]) tuple(pd, r1)
}"#,
        false,
        1e-6,
    );
    let src = module_source(&p);
    assert!(src.contains("else if ("), "{src}");
    assert!(src.contains("% 2ll == 0"), "{src}");
}

#[test]
fn dynamic_slice_and_update_with_clamped_starts() {
    check(
        r#"HloModule m
ENTRY e {
  x = f32[5,6] parameter(0)
  u = f32[2,3] parameter(1)
  i = s32[] parameter(2)
  j = s32[] parameter(3)
  big = s32[] constant(100)
  neg = s32[] constant(-3)
  ds = f32[2,4] dynamic-slice(x, i, j), dynamic_slice_sizes={2,4}
  dc = f32[2,4] dynamic-slice(x, big, neg), dynamic_slice_sizes={2,4}
  one = s32[] constant(1)
  two = s32[] constant(2)
  d2 = f32[2,4] dynamic-slice(x, one, two), dynamic_slice_sizes={2,4}
  du = f32[5,6] dynamic-update-slice(x, u, j, big)
  du2 = f32[5,6] dynamic-update-slice(x, u, two, one)
  t = f32[5,6] tanh(du)
  ROOT r = (f32[2,4], f32[2,4], f32[5,6], f32[2,4], f32[5,6]) tuple(ds, dc, t, d2, du2)
}"#,
        false,
        1e-6,
    );
}

#[test]
fn integer_edge_cases_shifts_bit_counts_and_division() {
    check(
        r#"HloModule m
ENTRY e {
  a = s32[11] parameter(0)
  b = s32[11] parameter(1)
  z = s32[11] constant({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
  m = s32[] constant(-2147483648)
  mb = s32[11] broadcast(m), dimensions={}
  big = s32[] constant(40)
  bb = s32[11] broadcast(big), dimensions={}
  d0 = s32[11] divide(a, z)
  r0 = s32[11] remainder(a, z)
  ng = s32[] constant(-1)
  ngb = s32[11] broadcast(ng), dimensions={}
  dm = s32[11] divide(mb, ngb)
  rm = s32[11] remainder(mb, ngb)
  shl = s32[11] shift-left(a, bb)
  shr = s32[11] shift-right-arithmetic(a, bb)
  shrl = s32[11] shift-right-logical(mb, b)
  pc = s32[11] popcnt(a)
  cz = s32[11] count-leading-zeros(a)
  u = u8[11] convert(a)
  uc = u8[11] count-leading-zeros(u)
  up = u8[11] popcnt(u)
  pw = s32[11] power(a, b)
  ROOT t = (s32[11], s32[11], s32[11], s32[11], s32[11], s32[11], s32[11], s32[11], s32[11], u8[11], u8[11], s32[11]) tuple(d0, r0, dm, rm, shl, shr, shrl, pc, cz, uc, up, pw)
}"#,
        false,
        0.0,
    );
}

#[test]
fn narrow_floats_bit_casts_and_reduce_precision() {
    check(
        r#"HloModule m
ENTRY e {
  x = f32[17] parameter(0)
  k = f32[] constant(1000.123)
  kb = f32[17] broadcast(k), dimensions={}
  y = f32[17] multiply(x, kb)
  h = f16[17] convert(y)
  h2 = f16[17] multiply(h, h)
  e5 = f8e5m2[17] convert(y)
  e4 = f8e4m3fn[17] convert(x)
  b = bf16[17] convert(y)
  hb = f32[17] convert(h2)
  e5b = f32[17] convert(e5)
  e4b = f32[17] convert(e4)
  bits = s32[17] bitcast-convert(y)
  hbits = s16[17] bitcast-convert(h)
  rp = f32[17] reduce-precision(y), exponent_bits=5, mantissa_bits=10
  i8 = s8[17] convert(y)
  u64 = u64[17] convert(x)
  ROOT t = (f16[17], f32[17], f32[17], f32[17], bf16[17], s32[17], s16[17], f32[17], s8[17], u64[17]) tuple(h2, hb, e5b, e4b, b, bits, hbits, rp, i8, u64)
}"#,
        false,
        0.0,
    );
}

#[test]
fn total_order_compare_sort_and_top_k() {
    check(
        r#"HloModule m
lt {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ia = s32[] parameter(2)
  ib = s32[] parameter(3)
  ROOT l = pred[] compare(a, b), direction=LT, type=TOTALORDER
}
ENTRY e {
  x = f32[3,9] parameter(0)
  i = s32[3,9] iota(), iota_dimension=1
  s = (f32[3,9], s32[3,9]) sort(x, i), dimensions={1}, is_stable=true, to_apply=lt
  tk = (f32[3,4], s32[3,4]) topk(x), k=4, largest=true
  tks = (f32[3,2], s32[3,2]) topk(x), k=2, largest=false
  ROOT t = ((f32[3,9], s32[3,9]), (f32[3,4], s32[3,4]), (f32[3,2], s32[3,2])) tuple(s, tk, tks)
}"#,
        false,
        0.0,
    );
}

#[test]
fn windows_with_padding_dilation_and_select_and_scatter() {
    check(
        r#"HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
mx {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] maximum(a, b)
}
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT c = pred[] compare(a, b), direction=GE
}
ENTRY e {
  x = f32[2,9,7] parameter(0)
  z = f32[] constant(0)
  ninf = f32[] constant(-inf)
  rw = f32[2,5,4] reduce-window(x, z), window={size=1x3x2 stride=1x2x2 pad=0_0x1_1x0_1 rhs_dilate=1x1x1}, to_apply=add
  rd = f32[2,8,13] reduce-window(x, ninf), window={size=1x2x3 stride=1x1x1 pad=0_0x0_0x1_1 lhs_dilate=1x1x2}, to_apply=mx
  src = f32[2,4,3] parameter(1)
  sas = f32[2,9,7] select-and-scatter(x, src, z), window={size=1x3x3 stride=1x2x2 pad=0_0x0_0x0_0}, select=ge, scatter=add
  ROOT t = (f32[2,5,4], f32[2,8,13], f32[2,9,7]) tuple(rw, rd, sas)
}"#,
        false,
        1e-6,
    );
}

#[test]
fn conditional_gather_scatter_and_convolution() {
    check(
        r#"HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
b0 {
  p = f32[4,3] parameter(0)
  ROOT n = f32[4,3] negate(p)
}
b1 {
  p = f32[4,3] parameter(0)
  ROOT e = f32[4,3] exponential(p)
}
ENTRY e {
  x = f32[4,3] parameter(0)
  k = s32[] parameter(1)
  c = f32[4,3] conditional(k, x, x), branch_computations={b0, b1}
  idx = s32[5,1] constant({{3}, {0}, {7}, {1}, {3}})
  g = f32[5,3] gather(c, idx), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,3}
  upd = f32[5,3] multiply(g, g)
  sc = f32[4,3] scatter(c, idx, upd), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
  img = f32[1,4,3,1] reshape(c)
  w = f32[2,2,1,2] parameter(2)
  cv = f32[1,3,2,2] convolution(img, w), window={size=2x2 pad=0_0x0_0}, dim_labels=b01f_01io->b01f
  ROOT t = (f32[4,3], f32[5,3], f32[4,3], f32[1,3,2,2]) tuple(c, g, sc, cv)
}"#,
        false,
        1e-6,
    );
}

#[test]
fn complex_values_and_fft() {
    check(
        r#"HloModule m
ENTRY e {
  x = f32[2,8] parameter(0)
  y = f32[2,8] parameter(1)
  z = c64[2,8] complex(x, y)
  f = c64[2,8] fft(z), fft_type=FFT, fft_length={8}
  g = c64[2,8] multiply(f, z)
  i = c64[2,8] fft(g), fft_type=IFFT, fft_length={8}
  r = c64[2,5] fft(x), fft_type=RFFT, fft_length={8}
  ir = f32[2,8] fft(r), fft_type=IRFFT, fft_length={8}
  a = f32[2,8] abs(i)
  re = f32[2,8] real(i)
  im = f32[2,8] imag(i)
  ROOT t = (f32[2,8], f32[2,8], f32[2,8], f32[2,8]) tuple(a, re, im, ir)
}"#,
        false,
        1e-5,
    );
}

/// Found by held-out JAX programs: arithmetic shifts of unsigned values
/// shift the signed value of the same width.
#[test]
fn arithmetic_shift_of_unsigned_types() {
    check(
        r#"HloModule m
ENTRY e {
  a = s32[11] parameter(0)
  u = u32[11] convert(a)
  u8 = u8[11] convert(a)
  s = u32[11] constant({0, 1, 3, 31, 32, 40, 2, 5, 7, 30, 1})
  s8 = u8[11] convert(s)
  r32 = u32[11] shift-right-arithmetic(u, s)
  r8 = u8[11] shift-right-arithmetic(u8, s8)
  ROOT t = (u32[11], u8[11]) tuple(r32, r8)
}"#,
        false,
        0.0,
    );
}

/// Found by held-out JAX programs: bitcast-convert between widths, both
/// ways, little-endian.
#[test]
fn bitcast_convert_between_widths() {
    check(
        r#"HloModule m
ENTRY e {
  x = f32[3,2] parameter(0)
  b = u8[3,2,4] bitcast-convert(x)
  h = f16[3,2,2] bitcast-convert(x)
  back = f32[3,2] bitcast-convert(b)
  w = u64[3] bitcast-convert(x)
  ROOT t = (u8[3,2,4], f16[3,2,2], f32[3,2], u64[3]) tuple(b, h, back, w)
}"#,
        false,
        0.0,
    );
}

/// Found by held-out JAX programs: a `call` inside a reducer and a
/// comparator is inlined into the kernel.
#[test]
fn calls_inside_reducers_and_comparators() {
    check(
        r#"HloModule m
pick {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  g = pred[] compare(a, b), direction=GT
  ROOT s = f32[] select(g, a, b)
}
comb {
  x = f32[] parameter(0)
  y = f32[] parameter(1)
  c = f32[] call(x, y), to_apply=pick
  one = f32[] constant(1)
  ROOT r = f32[] add(c, one)
}
less {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  na = f32[] negate(a)
  nb = f32[] negate(b)
  c = f32[] call(na, nb), to_apply=pick
  ROOT l = pred[] compare(c, na), direction=EQ
}
ENTRY e {
  x = f32[4,6] parameter(0)
  z = f32[] constant(0)
  r = f32[4] reduce(x, z), dimensions={1}, to_apply=comb
  s = f32[4,6] sort(x), dimensions={1}, to_apply=less
  ROOT t = (f32[4], f32[4,6]) tuple(r, s)
}"#,
        false,
        0.0,
    );
}

/// Found by held-out JAX programs: complex transcendental functions, sign
/// and power.
#[test]
fn complex_functions() {
    check(
        r#"HloModule m
ENTRY e {
  x = f32[7] parameter(0)
  y = f32[7] parameter(1)
  z = c64[7] complex(x, y)
  a = c64[7] tanh(z)
  b = c64[7] sine(z)
  c = c64[7] cosine(z)
  d = c64[7] tan(z)
  f = c64[7] exponential-minus-one(z)
  g = c64[7] log-plus-one(z)
  h = c64[7] rsqrt(z)
  i = c64[7] sign(z)
  p = c64[7] power(z, a)
  ROOT t = (c64[7], c64[7], c64[7], c64[7], c64[7], c64[7], c64[7], c64[7], c64[7]) tuple(a, b, c, d, f, g, h, i, p)
}"#,
        false,
        1e-5,
    );
}
