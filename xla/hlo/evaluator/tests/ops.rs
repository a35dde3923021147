//! Unit tests per opcode family, on hand-written HLO text with hand-computed
//! results (XLA's semantics).

use xla_hlo_evaluator::{evaluate, Array, Data, EvalContext, EvalError, Value};
use xla_hlo_ir::PrimitiveType;

fn run(hlo: &str, args: Vec<Array>) -> Result<Vec<Value>, EvalError> {
    let m = xla_hlo_parser::parse_module(hlo).unwrap_or_else(|e| panic!("parse: {e}"));
    let args: Vec<Value> = args.into_iter().map(Value::Array).collect();
    evaluate(&m, &args, &EvalContext::default())
}

fn f32s(a: &Array) -> Vec<f32> {
    match &*a.data {
        Data::F32(v) => v.clone(),
        d => panic!("not f32: {d:?}"),
    }
}
fn i32s(a: &Array) -> Vec<i32> {
    match &*a.data {
        Data::S32(v) => v.clone(),
        d => panic!("not s32: {d:?}"),
    }
}
fn preds(a: &Array) -> Vec<bool> {
    match &*a.data {
        Data::Pred(v) => v.clone(),
        d => panic!("not pred: {d:?}"),
    }
}
fn fa(dims: &[i64], v: &[f32]) -> Array {
    Array::from_f32(dims.to_vec(), v.to_vec()).unwrap()
}
fn ia(dims: &[i64], v: &[i32]) -> Array {
    Array::new(PrimitiveType::S32, dims.to_vec(), Data::S32(v.to_vec())).unwrap()
}

#[test]
fn elementwise_float_math() {
    let hlo = r#"HloModule m
ENTRY e {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  a = f32[4] exponential(x)
  b = f32[4] log-plus-one(x)
  c = f32[4] tanh(x)
  d = f32[4] logistic(x)
  g = f32[4] erf(x)
  h = f32[4] rsqrt(y)
  i = f32[4] cbrt(y)
  j = f32[4] power(y, x)
  k = f32[4] atan2(x, y)
  l = f32[4] remainder(y, x)
  n = f32[4] round-nearest-even(x)
  o = f32[4] round-nearest-afz(x)
  p = f32[4] exponential-minus-one(x)
  ROOT t = (f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4], f32[4]) tuple(a, b, c, d, g, h, i, j, k, l, n, o, p)
}"#;
    let x = [0.5f32, -1.5, 2.5, 0.0];
    let y = [4.0f32, 8.0, 27.0, 1.0];
    let out = run(hlo, vec![fa(&[4], &x), fa(&[4], &y)]).unwrap();
    let get = |k: usize| f32s(out[k].as_array().unwrap());
    let close = |a: &[f32], b: &[f32]| {
        for (p, q) in a.iter().zip(b) {
            let ok = (p.is_nan() && q.is_nan()) || (p - q).abs() <= 1e-6 + 1e-6 * q.abs();
            assert!(ok, "{a:?} vs {b:?}");
        }
    };
    close(&get(0), &x.map(|v| v.exp()));
    close(&get(1), &x.map(|v| v.ln_1p()));
    close(&get(2), &x.map(|v| v.tanh()));
    close(&get(3), &x.map(|v| 1.0 / (1.0 + (-v).exp())));
    close(&get(4), &[0.5204999, -0.9661051, 0.999_593, 0.0]);
    close(&get(5), &[0.5, 0.35355339, 0.19245009, 1.0]);
    close(&get(6), &[1.587401, 2.0, 3.0, 1.0]);
    close(&get(7), &[2.0, 8f32.powf(-1.5), 27f32.powf(2.5), 1.0]);
    close(
        &get(8),
        &[
            0.5f32.atan2(4.0),
            (-1.5f32).atan2(8.0),
            2.5f32.atan2(27.0),
            0.0,
        ],
    );
    close(&get(9)[..3], &[0.0, 0.5, 2.0]);
    assert!(get(9)[3].is_nan());
    assert_eq!(get(10), vec![0.0, -2.0, 2.0, 0.0]);
    assert_eq!(get(11), vec![1.0, -2.0, 3.0, 0.0]);
    close(&get(12), &x.map(|v| v.exp_m1()));
}

#[test]
fn integer_ops_follow_xla() {
    let hlo = r#"HloModule m
ENTRY e {
  x = s32[4] parameter(0)
  y = s32[4] parameter(1)
  d = s32[4] divide(x, y)
  r = s32[4] remainder(x, y)
  sl = s32[4] shift-left(x, y)
  sra = s32[4] shift-right-arithmetic(x, y)
  srl = s32[4] shift-right-logical(x, y)
  p = s32[4] popcnt(x)
  c = s32[4] count-leading-zeros(x)
  pw = s32[4] power(x, y)
  ROOT t = (s32[4], s32[4], s32[4], s32[4], s32[4], s32[4], s32[4], s32[4]) tuple(d, r, sl, sra, srl, p, c, pw)
}"#;
    let x = [7, i32::MIN, -8, 3];
    let y = [0, -1, 33, 2];
    let out = run(hlo, vec![ia(&[4], &x), ia(&[4], &y)]).unwrap();
    let get = |k: usize| i32s(out[k].as_array().unwrap());
    assert_eq!(get(0), vec![-1, i32::MIN, 0, 1]);
    assert_eq!(get(1), vec![7, 0, -8, 1]);
    assert_eq!(get(2), vec![7, 0, 0, 12]);
    assert_eq!(get(3), vec![7, -1, -1, 0]);
    assert_eq!(get(4), vec![7, 0, 0, 0]);
    assert_eq!(get(5), vec![3, 1, 29, 2]);
    assert_eq!(get(6), vec![29, 0, 0, 30]);
    assert_eq!(get(7), vec![1, 0, 0, 9]);
}

#[test]
fn compare_total_order_and_select_clamp() {
    let hlo = r#"HloModule m
ENTRY e {
  x = f32[4] parameter(0)
  y = f32[4] parameter(1)
  lt = pred[4] compare(x, y), direction=LT
  tlt = pred[4] compare(x, y), direction=LT, type=TOTALORDER
  s = f32[4] select(lt, x, y)
  lo = f32[] constant(-1)
  hi = f32[] constant(1)
  c = f32[4] clamp(lo, x, hi)
  ROOT t = (pred[4], pred[4], f32[4], f32[4]) tuple(lt, tlt, s, c)
}"#;
    let x = [-0.0f32, f32::NAN, 1.0, -5.0];
    let y = [0.0f32, 1.0, f32::NAN, 2.0];
    let out = run(hlo, vec![fa(&[4], &x), fa(&[4], &y)]).unwrap();
    assert_eq!(
        preds(out[0].as_array().unwrap()),
        vec![false, false, false, true]
    );
    assert_eq!(
        preds(out[1].as_array().unwrap()),
        vec![true, false, true, true]
    );
    let s = f32s(out[2].as_array().unwrap());
    assert_eq!(s[3], -5.0);
    assert_eq!(f32s(out[3].as_array().unwrap())[2..], [1.0, -1.0]);
}

#[test]
fn convert_rounding_and_bitcast() {
    let hlo = r#"HloModule m
ENTRY e {
  x = f32[5] parameter(0)
  b = bf16[5] convert(x)
  bb = f32[5] convert(b)
  h = f16[5] convert(x)
  hh = f32[5] convert(h)
  e = f8e4m3fn[5] convert(x)
  ee = f32[5] convert(e)
  i = s32[5] convert(x)
  u = u32[5] bitcast-convert(x)
  rp = f32[5] reduce-precision(x), exponent_bits=8, mantissa_bits=7
  ROOT t = (f32[5], f32[5], f32[5], s32[5], u32[5], f32[5]) tuple(bb, hh, ee, i, u, rp)
}"#;
    // 1 + 2^-8 is a tie between bf16 neighbours 1 and 1+2^-7: rounds to even (1).
    let x = [1.0f32 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, 1000.0, -2.7, 3.0e9];
    let out = run(hlo, vec![fa(&[5], &x)]).unwrap();
    let bb = f32s(out[0].as_array().unwrap());
    assert_eq!(bb[0], 1.0);
    assert_eq!(bb[1], 1.0 + 4.0 / 256.0);
    let hh = f32s(out[1].as_array().unwrap());
    assert_eq!(hh[2], 1000.0);
    let ee = f32s(out[2].as_array().unwrap());
    assert!(ee[2].is_nan(), "1000 overflows f8e4m3fn to NaN");
    assert_eq!(ee[3], -2.75);
    assert_eq!(i32s(out[3].as_array().unwrap())[3..], [-2, i32::MAX]);
    match &*out[4].as_array().unwrap().data {
        Data::U32(v) => assert_eq!(v[2], 1000f32.to_bits()),
        _ => panic!(),
    }
    let rp = f32s(out[5].as_array().unwrap());
    assert_eq!(rp[..2], bb[..2]);
}

#[test]
fn data_movement() {
    let hlo = r#"HloModule m
ENTRY e {
  x = f32[2,3] parameter(0)
  t = f32[3,2] transpose(x), dimensions={1,0}
  b = f32[2,2,3] broadcast(x), dimensions={1,2}
  s = f32[2,2] slice(x), slice={[0:2], [0:3:2]}
  r = f32[2,3] reverse(x), dimensions={1}
  z = f32[] constant(0)
  p = f32[3,5] pad(x, z), padding=1_0x-1_1_1
  c = f32[2,6] concatenate(x, x), dimensions={1}
  io = s32[2,3] iota(), iota_dimension=1
  ROOT tt = (f32[3,2], f32[2,2,3], f32[2,2], f32[2,3], f32[3,5], f32[2,6], s32[2,3]) tuple(t, b, s, r, p, c, io)
}"#;
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let out = run(hlo, vec![fa(&[2, 3], &x)]).unwrap();
    let g = |k: usize| f32s(out[k].as_array().unwrap());
    assert_eq!(g(0), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    assert_eq!(g(1), [x, x].concat());
    assert_eq!(g(2), vec![1.0, 3.0, 4.0, 6.0]);
    assert_eq!(g(3), vec![3.0, 2.0, 1.0, 6.0, 5.0, 4.0]);
    // row pad low 1; cols: drop first (low=-1), interior 1, high 1:
    // [1 0 2 0 3] -> drop first -> [0 2 0 3] + high 1 -> [0 2 0 3 0]
    assert_eq!(
        g(4),
        vec![0.0; 5]
            .into_iter()
            .chain([0.0, 2.0, 0.0, 3.0, 0.0])
            .chain([0.0, 5.0, 0.0, 6.0, 0.0])
            .collect::<Vec<_>>()
    );
    assert_eq!(
        g(5),
        vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 4.0, 5.0, 6.0]
    );
    assert_eq!(i32s(out[6].as_array().unwrap()), vec![0, 1, 2, 0, 1, 2]);
}

#[test]
fn dynamic_slices_clamp() {
    let hlo = r#"HloModule m
ENTRY e {
  x = f32[4] parameter(0)
  i = s32[] parameter(1)
  ds = f32[2] dynamic-slice(x, i), dynamic_slice_sizes={2}
  u = f32[2] constant({9, 8})
  dus = f32[4] dynamic-update-slice(x, u, i)
  ROOT t = (f32[2], f32[4]) tuple(ds, dus)
}"#;
    let out = run(hlo, vec![fa(&[4], &[1.0, 2.0, 3.0, 4.0]), ia(&[], &[7])]).unwrap();
    assert_eq!(f32s(out[0].as_array().unwrap()), vec![3.0, 4.0]);
    assert_eq!(f32s(out[1].as_array().unwrap()), vec![1.0, 2.0, 9.0, 8.0]);
}

#[test]
fn gather_and_scatter() {
    let hlo = r#"HloModule m
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  t = f32[3,2] parameter(0)
  ids = s32[4] parameter(1)
  g = f32[4,2] gather(t, ids), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,2}
  u = f32[4,2] parameter(2)
  s = f32[3,2] scatter(t, ids, u), update_window_dims={1}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=add
  ROOT r = (f32[4,2], f32[3,2]) tuple(g, s)
}"#;
    let t = fa(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let ids = ia(&[4], &[2, 0, 5, 2]);
    let u = fa(&[4, 2], &[1.0, 1.0, 10.0, 10.0, 100.0, 100.0, 2.0, 2.0]);
    let out = run(hlo, vec![t, ids, u]).unwrap();
    // gather clamps index 5 to 2
    assert_eq!(
        f32s(out[0].as_array().unwrap()),
        vec![5.0, 6.0, 1.0, 2.0, 5.0, 6.0, 5.0, 6.0]
    );
    // scatter drops the out-of-bounds window, adds the rest
    assert_eq!(
        f32s(out[1].as_array().unwrap()),
        vec![11.0, 12.0, 3.0, 4.0, 8.0, 9.0]
    );
}

#[test]
fn sort_is_stable_and_multi_operand() {
    let hlo = r#"HloModule m
cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  ROOT lt = pred[] compare(a, b), direction=LT
}
cmp2 {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  na = f32[] negate(a)
  nb = f32[] negate(b)
  ROOT gt = pred[] compare(na, nb), direction=GT
}
ENTRY e {
  k = f32[2,4] parameter(0)
  v = s32[2,4] iota(), iota_dimension=1
  s = (f32[2,4], s32[2,4]) sort(k, v), dimensions={1}, is_stable=true, to_apply=cmp
  s2 = (f32[2,4], s32[2,4]) sort(k, v), dimensions={1}, is_stable=true, to_apply=cmp2
  a = s32[2,4] get-tuple-element(s), index=1
  b = s32[2,4] get-tuple-element(s2), index=1
  ROOT t = (s32[2,4], s32[2,4]) tuple(a, b)
}"#;
    let k = fa(&[2, 4], &[3.0, 1.0, 3.0, 0.0, 2.0, 2.0, 2.0, -1.0]);
    let out = run(hlo, vec![k]).unwrap();
    let want = vec![3, 1, 0, 2, 3, 0, 1, 2];
    assert_eq!(i32s(out[0].as_array().unwrap()), want);
    // generic comparator path gives the same stable order
    assert_eq!(i32s(out[1].as_array().unwrap()), want);
}

#[test]
fn reduce_multi_output_and_windows() {
    let hlo = r#"HloModule m
argmax {
  a = f32[] parameter(0)
  i = s32[] parameter(1)
  b = f32[] parameter(2)
  j = s32[] parameter(3)
  gt = pred[] compare(a, b), direction=GE
  v = f32[] select(gt, a, b)
  k = s32[] select(gt, i, j)
  ROOT t = (f32[], s32[]) tuple(v, k)
}
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ge {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT g = pred[] compare(a, b), direction=GE
}
ENTRY e {
  x = f32[2,3] parameter(0)
  io = s32[2,3] iota(), iota_dimension=1
  ninf = f32[] constant(-inf)
  z = s32[] constant(0)
  r = (f32[2], s32[2]) reduce(x, io, ninf, z), dimensions={1}, to_apply=argmax
  zf = f32[] constant(0)
  s = f32[2] reduce(x, zf), dimensions={1}, to_apply=add
  cs = f32[2,3] reduce-window(x, zf), window={size=1x3 pad=0_0x2_0}, to_apply=add
  src = f32[2,2] constant({{1, 2}, {3, 4}})
  sas = f32[2,3] select-and-scatter(x, src, zf), window={size=1x2}, select=ge, scatter=add
  r0 = f32[2] get-tuple-element(r), index=0
  r1 = s32[2] get-tuple-element(r), index=1
  ROOT t = (f32[2], s32[2], f32[2], f32[2,3], f32[2,3]) tuple(r0, r1, s, cs, sas)
}"#;
    let x = fa(&[2, 3], &[1.0, 5.0, 2.0, 7.0, 7.0, 0.0]);
    let out = run(hlo, vec![x]).unwrap();
    assert_eq!(f32s(out[0].as_array().unwrap()), vec![5.0, 7.0]);
    assert_eq!(i32s(out[1].as_array().unwrap()), vec![1, 0]);
    assert_eq!(f32s(out[2].as_array().unwrap()), vec![8.0, 14.0]);
    assert_eq!(
        f32s(out[3].as_array().unwrap()),
        vec![1.0, 6.0, 8.0, 7.0, 14.0, 14.0]
    );
    // windows [1,5] and [5,2] both pick the 5; [7,7] picks the first 7, [7,0] the second
    assert_eq!(
        f32s(out[4].as_array().unwrap()),
        vec![0.0, 3.0, 0.0, 3.0, 4.0, 0.0]
    );
}

#[test]
fn dot_general_and_convolution() {
    let hlo = r#"HloModule m
ENTRY e {
  a = f32[2,2,3] parameter(0)
  b = f32[2,3,1] parameter(1)
  d = f32[2,2,1] dot(a, b), lhs_batch_dims={0}, rhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_contracting_dims={1}
  x = f32[1,4,2] parameter(2)
  k = f32[2,1,2] parameter(3)
  c = f32[1,4,2] convolution(x, k), window={size=2 pad=0_1}, dim_labels=b0f_0io->b0f, feature_group_count=2
  ROOT t = (f32[2,2,1], f32[1,4,2]) tuple(d, c)
}"#;
    let a = fa(
        &[2, 2, 3],
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0],
    );
    let b = fa(&[2, 3, 1], &[1.0, 1.0, 1.0, 2.0, 3.0, 4.0]);
    // depthwise 1-d conv: channel 0 kernel [1,1], channel 1 kernel [1,-1]
    let x = fa(&[1, 4, 2], &[1.0, 1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 8.0]);
    let k = fa(&[2, 1, 2], &[1.0, 1.0, 1.0, -1.0]);
    let out = run(hlo, vec![a, b, x, k]).unwrap();
    assert_eq!(f32s(out[0].as_array().unwrap()), vec![6.0, 15.0, 2.0, 3.0]);
    assert_eq!(
        f32s(out[1].as_array().unwrap()),
        vec![3.0, -1.0, 5.0, -2.0, 7.0, -4.0, 4.0, 8.0]
    );
}

#[test]
fn control_flow() {
    let hlo = r#"HloModule m
cond {
  p = (s32[], f32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(5)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  p = (s32[], f32[]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[] get-tuple-element(p), index=1
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  two = f32[] constant(2)
  x2 = f32[] multiply(x, two)
  ROOT t = (s32[], f32[]) tuple(i2, x2)
}
b0 {
  p = f32[] parameter(0)
  ROOT n = f32[] negate(p)
}
b1 {
  p = f32[] parameter(0)
  ROOT n = f32[] exponential(p)
}
sq {
  p = f32[] parameter(0)
  ROOT m = f32[] multiply(p, p)
}
ENTRY e {
  x = f32[] parameter(0)
  k = s32[] parameter(1)
  z = s32[] constant(0)
  init = (s32[], f32[]) tuple(z, x)
  w = (s32[], f32[]) while(init), condition=cond, body=body
  wx = f32[] get-tuple-element(w), index=1
  c = f32[] conditional(k, x, x), branch_computations={b0, b1}
  cl = f32[] call(x), to_apply=sq
  v = f32[3] broadcast(x), dimensions={}
  mp = f32[3] map(v), dimensions={0}, to_apply=sq
  pid = u32[] partition-id()
  sh = f32[] custom-call(x), custom_call_target="Sharding", sharding={replicated}
  ROOT t = (f32[], f32[], f32[], f32[3], u32[], f32[]) tuple(wx, c, cl, mp, pid, sh)
}"#;
    let out = run(hlo, vec![fa(&[], &[1.5]), ia(&[], &[7])]).unwrap();
    let g = |k: usize| f32s(out[k].as_array().unwrap());
    assert_eq!(g(0), vec![48.0]);
    // out-of-range index selects the last branch
    assert_eq!(g(1), vec![1.5f32.exp()]);
    assert_eq!(g(2), vec![2.25]);
    assert_eq!(g(3), vec![2.25; 3]);
    assert_eq!(g(5), vec![1.5]);
}

#[test]
fn errors_name_the_culprit() {
    let hlo = r#"HloModule m
ENTRY e {
  x = f32[2] parameter(0)
  ROOT f = f32[2] fft(x), fft_type=FFT, fft_length={2}
}"#;
    let e = run(hlo, vec![fa(&[2], &[1.0, 2.0])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("fft") && e.contains("%f"), "{e}");
    let e = run(hlo, vec![fa(&[3], &[1.0, 2.0, 3.0])])
        .unwrap_err()
        .to_string();
    assert!(e.contains("argument 0") && e.contains("%x"), "{e}");
    let e = run(hlo, vec![]).unwrap_err().to_string();
    assert!(e.contains("1 parameters"), "{e}");
}

#[test]
fn collectives_on_one_device_are_identity() {
    let hlo = r#"HloModule m, num_partitions=1
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[2] parameter(0)
  ar = f32[2] all-reduce(x), replica_groups={}, to_apply=add
  ag = f32[2] all-gather(x), dimensions={0}, replica_groups={{0}}
  cp = f32[2] collective-permute(x), channel_id=1, source_target_pairs={{0,0}}
  ROOT t = (f32[2], f32[2], f32[2]) tuple(ar, ag, cp)
}"#;
    let out = run(hlo, vec![fa(&[2], &[1.0, 2.0])]).unwrap();
    for o in &out {
        assert_eq!(f32s(o.as_array().unwrap()), vec![1.0, 2.0]);
    }
}

#[test]
fn collectives_across_loopback_devices() {
    let hlo = r#"HloModule m, num_partitions=4
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  x = f32[2] parameter(0)
  pid = u32[] partition-id()
  pf = f32[] convert(pid)
  pb = f32[2] broadcast(pf), dimensions={}
  y = f32[2] add(x, pb)
  ar = f32[2] all-reduce(y), channel_id=1, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, to_apply=add
  ag = f32[4] all-gather(y), channel_id=2, dimensions={0}, replica_groups={{0,1},{2,3}}, use_global_device_ids=true
  cp = f32[2] collective-permute(y), channel_id=3, source_target_pairs={{0,1},{1,2},{2,3}}
  a2a = f32[2] all-to-all(y), channel_id=4, replica_groups={{0,1},{2,3}}, dimensions={0}
  rs = f32[1] reduce-scatter(y), channel_id=5, replica_groups={{0,1},{2,3}}, use_global_device_ids=true, dimensions={0}, to_apply=add
  ROOT t = (f32[2], f32[4], f32[2], f32[2], f32[1]) tuple(ar, ag, cp, a2a, rs)
}"#;
    let m = xla_hlo_parser::parse_module(hlo).unwrap();
    let outs =
        xla_hlo_evaluator::evaluate_spmd(&m, &[Value::Array(fa(&[2], &[10.0, 20.0]))], 4).unwrap();
    let g = |d: usize, k: usize| f32s(outs[d][k].as_array().unwrap());
    assert_eq!(g(0, 0), vec![21.0, 41.0]);
    assert_eq!(g(3, 0), vec![25.0, 45.0]);
    assert_eq!(g(1, 1), vec![10.0, 20.0, 11.0, 21.0]);
    assert_eq!(g(0, 2), vec![0.0, 0.0]);
    assert_eq!(g(2, 2), vec![11.0, 21.0]);
    // all-to-all: device 1 gets chunk 1 of devices 0 and 1
    assert_eq!(g(1, 3), vec![20.0, 21.0]);
    assert_eq!(g(1, 4), vec![41.0]);
}

#[test]
fn topk_largest_with_ties() {
    let hlo = r#"HloModule m
ENTRY e {
  x = f32[2,5] parameter(0)
  ROOT t = (f32[2,3], s32[2,3]) topk(x), k=3, largest=true
}"#;
    let x = fa(
        &[2, 5],
        &[1.0, 5.0, 3.0, 5.0, 0.0, -1.0, -2.0, f32::NAN, 4.0, 4.0],
    );
    let out = run(hlo, vec![x]).unwrap();
    let v = f32s(out[0].as_array().unwrap());
    assert_eq!(v[..3], [5.0, 5.0, 3.0]);
    assert!(v[3].is_nan());
    assert_eq!(i32s(out[1].as_array().unwrap()), vec![1, 3, 2, 2, 3, 4]);
}

#[test]
fn topk_custom_call_follows_its_comparator() {
    // XLA's `TopK` custom-call: k from the result, largest first for a GT
    // comparator, smallest first for LT.
    let hlo = |direction: &str| {
        format!(
            r#"HloModule m
%cmp (a: f32[], b: f32[], i: s32[], j: s32[]) -> pred[] {{
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %i = s32[] parameter(2)
  %j = s32[] parameter(3)
  ROOT %c = pred[] compare(%a, %b), direction={direction}
}}
ENTRY e {{
  x = f32[2,4] parameter(0)
  ROOT t = (f32[2,2], s32[2,2]) custom-call(x), custom_call_target="TopK", to_apply=%cmp
}}"#
        )
    };
    let x = || fa(&[2, 4], &[3.0, 1.0, 4.0, 1.5, -1.0, 2.0, 0.0, 2.0]);
    let out = run(&hlo("GT"), vec![x()]).unwrap();
    assert_eq!(f32s(out[0].as_array().unwrap()), vec![4.0, 3.0, 2.0, 2.0]);
    assert_eq!(i32s(out[1].as_array().unwrap()), vec![2, 0, 1, 3]);
    let out = run(&hlo("LT"), vec![x()]).unwrap();
    assert_eq!(f32s(out[0].as_array().unwrap()), vec![1.0, 1.5, -1.0, 0.0]);
    assert_eq!(i32s(out[1].as_array().unwrap()), vec![1, 3, 0, 2]);
}

#[test]
fn cholesky_reads_one_triangle_and_fails_per_matrix() {
    // Matrix 0 is [[4,12,-16],[12,37,-43],[-16,-43,98]], whose factor is
    // [[2,0,0],[6,1,0],[-8,5,3]]; the unread triangle holds 999. Matrix 1
    // is not positive definite.
    let lower_input = [
        4.0, 999.0, 999.0, 12.0, 37.0, 999.0, -16.0, -43.0, 98.0, //
        1.0, 999.0, 999.0, 2.0, 1.0, 999.0, 0.0, 0.0, 1.0,
    ];
    let mut upper_input = lower_input;
    for m in 0..2 {
        for r in 0..3 {
            for c in 0..3 {
                upper_input[m * 9 + c * 3 + r] = lower_input[m * 9 + r * 3 + c];
            }
        }
    }
    for (lower, input) in [(true, lower_input), (false, upper_input)] {
        let hlo = format!(
            "HloModule m\nENTRY e {{\n  a = f32[2,3,3] parameter(0)\n  ROOT c = f32[2,3,3] cholesky(a), lower={lower}\n}}"
        );
        let out = run(&hlo, vec![fa(&[2, 3, 3], &input)]).unwrap();
        let v = f32s(out[0].as_array().unwrap());
        let factor = [2.0, 0.0, 0.0, 6.0, 1.0, 0.0, -8.0, 5.0, 3.0];
        for r in 0..3 {
            for c in 0..3 {
                let (fr, fc) = if lower { (r, c) } else { (c, r) };
                assert_eq!(v[r * 3 + c], factor[fr * 3 + fc], "lower={lower} ({r},{c})");
            }
        }
        assert!(
            v[9..].iter().all(|x| x.is_nan()),
            "lower={lower}: {:?}",
            &v[9..]
        );
    }
}

#[test]
fn triangular_solve_every_side_triangle_and_transpose() {
    // a's used triangle is well conditioned; the other holds 999.
    let n = 3;
    let lower_a = [2.0, 999.0, 999.0, 1.0, 3.0, 999.0, -1.0, 0.5, 4.0];
    let b = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0];
    for lower in [true, false] {
        let mut a = lower_a;
        if !lower {
            for r in 0..n {
                for c in 0..n {
                    a[c * n + r] = lower_a[r * n + c];
                }
            }
        }
        for left_side in [true, false] {
            for transpose in ["NO_TRANSPOSE", "TRANSPOSE", "ADJOINT"] {
                for unit_diagonal in [false, true] {
                    let hlo = format!(
                        "HloModule m\nENTRY e {{\n  a = f32[3,3] parameter(0)\n  b = f32[3,3] parameter(1)\n  ROOT x = f32[3,3] triangular-solve(a, b), left_side={left_side}, lower={lower}, unit_diagonal={unit_diagonal}, transpose_a={transpose}\n}}"
                    );
                    let out = run(&hlo, vec![fa(&[3, 3], &a), fa(&[3, 3], &b)]).unwrap();
                    let x = f32s(out[0].as_array().unwrap());
                    // op(a) as a dense matrix with the unread parts dropped.
                    let mut t = [0.0f32; 9];
                    for r in 0..n {
                        for c in 0..n {
                            let in_triangle = if lower { r >= c } else { r <= c };
                            let value = if r == c && unit_diagonal {
                                1.0
                            } else if in_triangle {
                                a[r * n + c]
                            } else {
                                0.0
                            };
                            let (tr, tc) = if transpose == "NO_TRANSPOSE" {
                                (r, c)
                            } else {
                                (c, r)
                            };
                            t[tr * n + tc] = value;
                        }
                    }
                    for r in 0..n {
                        for c in 0..n {
                            let product: f32 = (0..n)
                                .map(|k| {
                                    if left_side {
                                        t[r * n + k] * x[k * n + c]
                                    } else {
                                        x[r * n + k] * t[k * n + c]
                                    }
                                })
                                .sum();
                            assert!(
                                (product - b[r * n + c]).abs() < 1e-4,
                                "left_side={left_side} lower={lower} {transpose} unit={unit_diagonal}: ({r},{c}) {product} vs {}",
                                b[r * n + c]
                            );
                        }
                    }
                }
            }
        }
    }
}

fn run_consistent(hlo: &str, args: Vec<Array>) -> Vec<Value> {
    let m = xla_hlo_parser::parse_module(hlo).unwrap_or_else(|e| panic!("parse: {e}"));
    let args: Vec<Value> = args.into_iter().map(Value::Array).collect();
    let ctx = EvalContext {
        consistent: true,
        ..EvalContext::default()
    };
    evaluate(&m, &args, &ctx).unwrap()
}

/// Floats of very different magnitudes, so that every order of summation
/// shows in the bits.
fn spread(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed);
            let mantissa = (x % 1000) as f32 / 999.0 - 0.5;
            mantissa * 10f32.powi((x / 1000 % 9) as i32 - 4)
        })
        .collect()
}

fn tree_sum(v: Vec<f32>) -> f32 {
    xla_hlo_utils::reduction_order::fold_values::<_, ()>(v, &mut |a, b| Ok(a + b))
        .unwrap()
        .unwrap_or(0.0)
}

#[test]
fn consistent_reduce_follows_the_pairwise_tree() {
    let hlo = r#"HloModule m
add { a = f32[] parameter(0)  b = f32[] parameter(1)  ROOT s = f32[] add(a, b) }
ENTRY e { x = f32[3,7,5] parameter(0)  z = f32[] constant(0)
  ROOT r = f32[7] reduce(x, z), dimensions={0,2}, to_apply=add }"#;
    let x = spread(105, 7);
    let out = run_consistent(hlo, vec![fa(&[3, 7, 5], &x)]);
    let got = f32s(out[0].as_array().unwrap());
    for j in 0..7 {
        // Row-major over the reduced dims (0, then 2), tree-combined, then
        // the init.
        let elems: Vec<f32> = (0..3)
            .flat_map(|i| (0..5).map(move |k| (i, k)))
            .map(|(i, k)| x[(i * 7 + j) * 5 + k])
            .collect();
        assert_eq!(
            got[j].to_bits(),
            (0.0 + tree_sum(elems)).to_bits(),
            "column {j}"
        );
    }
}

#[test]
fn consistent_dot_rows_do_not_depend_on_the_other_dims() {
    let dot = |m: usize| {
        format!(
            r#"HloModule m
ENTRY e {{ a = f32[{m},33] parameter(0)  b = f32[33,5] parameter(1)
  ROOT d = f32[{m},5] dot(a, b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}} }}"#
        )
    };
    let a = spread(8 * 33, 1);
    let b = spread(33 * 5, 2);
    let full = run_consistent(&dot(8), vec![fa(&[8, 33], &a), fa(&[33, 5], &b)]);
    let full = f32s(full[0].as_array().unwrap());
    let rows = run_consistent(
        &dot(2),
        vec![fa(&[2, 33], &a[3 * 33..5 * 33]), fa(&[33, 5], &b)],
    );
    let rows = f32s(rows[0].as_array().unwrap());
    for (k, (g, w)) in rows.iter().zip(&full[15..25]).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "element {k}");
    }
    let products: Vec<f32> = (0..33).map(|k| a[4 * 33 + k] * b[k * 5 + 2]).collect();
    assert_eq!(full[4 * 5 + 2].to_bits(), tree_sum(products).to_bits());
}

#[test]
fn consistent_convolution_sums_features_then_window_positions() {
    let hlo = r#"HloModule m
ENTRY e { x = f32[1,6,4] parameter(0)  w = f32[3,4,2] parameter(1)
  ROOT c = f32[1,6,2] convolution(x, w), window={size=3 pad=1_1}, dim_labels=b0f_0io->b0f }"#;
    let x = spread(24, 3);
    let w = spread(24, 4);
    let out = run_consistent(hlo, vec![fa(&[1, 6, 4], &x), fa(&[3, 4, 2], &w)]);
    let got = f32s(out[0].as_array().unwrap());
    for pos in [0usize, 3, 5] {
        for o in 0..2 {
            let mut products = Vec::new();
            for c in 0..4 {
                for k in 0..3 {
                    let i = pos as i64 + k as i64 - 1;
                    let xv = if (0..6).contains(&i) {
                        x[i as usize * 4 + c]
                    } else {
                        0.0
                    };
                    products.push(xv * w[(k * 4 + c) * 2 + o]);
                }
            }
            assert_eq!(
                got[pos * 2 + o].to_bits(),
                tree_sum(products).to_bits(),
                "{pos} {o}"
            );
        }
    }
}

/// Found by held-out JAX programs: a dot of complex operands (and of a
/// complex and a real one) is (ac - bd) + (ad + bc)i.
#[test]
fn complex_dot() {
    let hlo = r#"HloModule m
ENTRY e {
  x = f32[2,2] parameter(0)
  y = f32[2,2] parameter(1)
  z = c64[2,2] complex(x, y)
  d = c64[2,2] dot(z, z), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  m = c64[2,2] dot(z, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  re = f32[2,2] real(d)
  im = f32[2,2] imag(d)
  mr = f32[2,2] real(m)
  mi = f32[2,2] imag(m)
  ROOT t = (f32[2,2], f32[2,2], f32[2,2], f32[2,2]) tuple(re, im, mr, mi)
}"#;
    // z = [[1+5i, 2+6i], [3+7i, 4+8i]]
    let out = run(
        hlo,
        vec![
            fa(&[2, 2], &[1., 2., 3., 4.]),
            fa(&[2, 2], &[5., 6., 7., 8.]),
        ],
    )
    .unwrap();
    let parts: Vec<Vec<f32>> = out.iter().map(|v| f32s(v.as_array().unwrap())).collect();
    // z*z: row 0 col 0 = (1+5i)(1+5i) + (2+6i)(3+7i) = (-24+10i) + (-36+32i).
    assert_eq!(parts[0][0], -60.0);
    assert_eq!(parts[1][0], 42.0);
    // z*x: row 0 col 0 = (1+5i)*1 + (2+6i)*3 = 7 + 23i.
    assert_eq!(parts[2][0], 7.0);
    assert_eq!(parts[3][0], 23.0);
}

/// Found by held-out JAX programs: converts to f8 encode NaN and overflow
/// as ml_dtypes (and XLA) do: f8e4m3fn keeps the sign on its all-ones NaN
/// (-inf becomes 0xFF), f8e5m2's NaN is the quiet 0x7E.
#[test]
fn f8_nan_and_overflow_encodings() {
    let hlo = r#"HloModule m
ENTRY e {
  x = f32[3] parameter(0)
  a = f8e4m3fn[3] convert(x)
  b = f8e5m2[3] convert(x)
  ab = u8[3] bitcast-convert(a)
  bb = u8[3] bitcast-convert(b)
  ROOT t = (u8[3], u8[3]) tuple(ab, bb)
}"#;
    let out = run(hlo, vec![fa(&[3], &[f32::NEG_INFINITY, f32::NAN, 1e6])]).unwrap();
    let bytes = |v: &Value| match &*v.as_array().unwrap().data {
        Data::U8(b) => b.clone(),
        d => panic!("not u8: {d:?}"),
    };
    assert_eq!(bytes(&out[0]), vec![0xFF, 0x7F, 0x7F]);
    assert_eq!(bytes(&out[1]), vec![0xFC, 0x7E, 0x7C]);
}
