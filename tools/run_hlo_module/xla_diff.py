"""Differential tests of the reference interpreter against XLA (jaxlib CPU).

Small HLO modules per opcode family are compiled and run by XLA, their
outputs stored as expected arrays, and run_hlo_module must reproduce them
(exactly for integers and pred, within a tolerance for floats).

usage: xla_diff.py RUN_HLO_MODULE_BINARY [FILTER]
Exits 0 when every module matches; prints one line per module and a final
'N passed, N failed' line. Exits 0 with a skip message when jax is absent.
"""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import jax  # noqa: F401
except ImportError:  # pragma: no cover
    print("skipping XLA differential tests: jax is not installed")
    sys.exit(0)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from xla_bench import compile_text  # noqa: E402

RNG = np.random.default_rng(1234)


def f32(*shape, lo=-3.0, hi=3.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def i32(*shape, lo=-100, hi=100):
    return RNG.integers(lo, hi, size=shape).astype(np.int32)


UNARY = ["exponential", "log", "tanh", "logistic", "erf", "rsqrt", "sqrt", "cbrt",
         "exponential-minus-one", "log-plus-one", "sine", "cosine", "tan",
         "floor", "ceil", "round-nearest-afz", "round-nearest-even", "sign", "abs",
         "negate"]


def unary_module():
    outs = "\n".join(f"  v{i} = f32[64] {op}(x)" for i, op in enumerate(UNARY))
    tup = ", ".join(f"v{i}" for i in range(len(UNARY)))
    shapes = ", ".join(["f32[64]"] * len(UNARY))
    text = f"""HloModule unary
ENTRY e {{
  x = f32[64] parameter(0)
{outs}
  ROOT t = ({shapes}) tuple({tup})
}}"""
    x = f32(64, lo=0.05, hi=4.0)
    x[:8] = [-0.5, -2.5, 2.5, 0.5, -0.0, 1e-30, 30.0, -30.0]
    x = np.abs(x) if False else x
    return text, [x]


CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def elementwise_unary():
    text, args = unary_module()
    args[0] = np.abs(args[0]) + 0.01  # keep log/sqrt real
    args[0][:4] = [0.5, 2.5, 1.5, 3.5]
    return text, args, 2e-6, 1e-6


@case
def elementwise_binary():
    ops = ["add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "power", "atan2"]
    body = "\n".join(f"  b{i} = f32[48] {op}(x, y)" for i, op in enumerate(ops))
    text = f"""HloModule binary
ENTRY e {{
  x = f32[48] parameter(0)
  y = f32[48] parameter(1)
{body}
  ROOT t = ({", ".join(["f32[48]"] * len(ops))}) tuple({", ".join(f"b{i}" for i in range(len(ops)))})
}}"""
    x = f32(48, lo=0.1, hi=4)
    y = f32(48)
    y[:4] = [0.0, -0.0, np.nan, np.inf]
    return text, [x, y], 2e-6, 1e-6


@case
def integer_ops():
    ops = ["add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum",
           "and", "or", "xor", "shift-left", "shift-right-logical", "shift-right-arithmetic", "power"]
    body = "\n".join(f"  b{i} = s32[40] {op}(x, y)" for i, op in enumerate(ops))
    un = ["popcnt", "count-leading-zeros", "not", "abs", "negate", "sign"]
    body2 = "\n".join(f"  w{i} = s32[40] {op}(x)" for i, op in enumerate(un))
    names = [f"b{i}" for i in range(len(ops))] + [f"w{i}" for i in range(len(un))]
    text = f"""HloModule ints
ENTRY e {{
  x = s32[40] parameter(0)
  y = s32[40] parameter(1)
{body}
{body2}
  ROOT t = ({", ".join(["s32[40]"] * len(names))}) tuple({", ".join(names)})
}}"""
    x = i32(40, lo=-2**31, hi=2**31 - 1)
    y = i32(40, lo=-40, hi=40)
    x[:4] = [-2**31, 7, -7, 0]
    y[:4] = [-1, 0, 0, 3]
    return text, [x, y], 0, 0


@case
def unsigned_ops():
    ops = ["divide", "remainder", "shift-right-logical", "shift-right-arithmetic", "maximum", "multiply"]
    body = "\n".join(f"  b{i} = u8[32] {op}(x, y)" for i, op in enumerate(ops))
    text = f"""HloModule u8ops
ENTRY e {{
  x = u8[32] parameter(0)
  y = u8[32] parameter(1)
{body}
  ROOT t = ({", ".join(["u8[32]"] * len(ops))}) tuple({", ".join(f"b{i}" for i in range(len(ops)))})
}}"""
    x = RNG.integers(0, 256, size=32).astype(np.uint8)
    y = RNG.integers(0, 12, size=32).astype(np.uint8)
    return text, [x, y], 0, 0


@case
def converts():
    text = """HloModule converts
ENTRY e {
  x = f32[64] parameter(0)
  a = bf16[64] convert(x)
  b = f16[64] convert(x)
  c = f8e4m3fn[64] convert(x)
  d = f8e5m2[64] convert(x)
  e = s32[64] convert(x)
  f = u8[64] convert(x)
  g = pred[64] convert(x)
  a2 = f32[64] convert(a)
  b2 = f32[64] convert(b)
  c2 = f32[64] convert(c)
  d2 = f32[64] convert(d)
  h = u32[64] bitcast-convert(x)
  r = f32[64] reduce-precision(x), exponent_bits=5, mantissa_bits=10
  i = s32[64] convert(e)
  j = f32[64] convert(i)
  ROOT t = (f32[64], f32[64], f32[64], f32[64], s32[64], u8[64], pred[64], u32[64], f32[64], f32[64]) tuple(a2, b2, c2, d2, e, f, g, h, r, j)
}"""
    x = f32(64, lo=-600, hi=600)
    x[:10] = [1.00390625, 1.01171875, 3e9, -3e9, np.nan, 0.0, -0.0, 70000.0, 1e-8, 255.5]
    return text, [x], 0, 0


@case
def compare_total_order():
    text = """HloModule cmp
ENTRY e {
  x = f32[8] parameter(0)
  y = f32[8] parameter(1)
  a = pred[8] compare(x, y), direction=LT
  b = pred[8] compare(x, y), direction=LT, type=TOTALORDER
  c = pred[8] compare(x, y), direction=NE
  d = pred[8] compare(x, y), direction=GE, type=TOTALORDER
  s = f32[8] select(a, x, y)
  lo = f32[] constant(-1)
  hi = f32[] constant(1)
  k = f32[8] clamp(lo, x, hi)
  ROOT t = (pred[8], pred[8], pred[8], pred[8], f32[8], f32[8]) tuple(a, b, c, d, s, k)
}"""
    x = np.array([-0.0, np.nan, 1.0, -np.nan, 2.0, -np.inf, 0.0, 5.0], np.float32)
    y = np.array([0.0, 1.0, np.nan, -1.0, 2.0, np.inf, -0.0, -5.0], np.float32)
    return text, [x, y], 0, 0


@case
def data_movement():
    text = """HloModule moves
ENTRY e {
  x = f32[4,6] parameter(0)
  i = s32[] parameter(1)
  z = f32[] constant(-1)
  p = f32[8,12] pad(x, z), padding=2_-1_1x-2_3_1
  s = f32[2,2] slice(x), slice={[1:4:2], [0:6:4]}
  r = f32[4,6] reverse(x), dimensions={0,1}
  c = f32[8,6] concatenate(x, r), dimensions={0}
  t = f32[6,4] transpose(x), dimensions={1,0}
  ds = f32[3,4] dynamic-slice(x, i, i), dynamic_slice_sizes={3,4}
  u = f32[2,2] constant({{7,8},{9,10}})
  dus = f32[4,6] dynamic-update-slice(x, u, i, i)
  b = f32[2,4,6] broadcast(x), dimensions={1,2}
  io = f32[3,5] iota(), iota_dimension=0
  ROOT tt = (f32[8,12], f32[2,2], f32[4,6], f32[8,6], f32[6,4], f32[3,4], f32[4,6], f32[2,4,6], f32[3,5]) tuple(p, s, r, c, t, ds, dus, b, io)
}"""
    return text, [f32(4, 6), np.array(3, np.int32)], 0, 0


@case
def gather_scatter():
    text = """HloModule gs
add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
ENTRY e {
  t = f32[5,4,3] parameter(0)
  ids = s32[6,2] parameter(1)
  g = f32[6,2,3] gather(t, ids), offset_dims={1,2}, collapsed_slice_dims={0}, start_index_map={0,1}, index_vector_dim=1, slice_sizes={1,2,3}
  u = f32[6,2,3] parameter(2)
  s = f32[5,4,3] scatter(t, ids, u), update_window_dims={1,2}, inserted_window_dims={0}, scatter_dims_to_operand_dims={0,1}, index_vector_dim=1, to_apply=add
  ROOT r = (f32[6,2,3], f32[5,4,3]) tuple(g, s)
}"""
    ids = np.array([[0, 0], [4, 2], [2, 3], [-1, 1], [6, 0], [1, 1]], np.int32)
    return text, [f32(5, 4, 3), ids, f32(6, 2, 3)], 1e-6, 1e-6


@case
def sort_variadic():
    text = """HloModule sorts
cmp {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  c = s32[] parameter(2)
  d = s32[] parameter(3)
  ROOT lt = pred[] compare(a, b), direction=LT, type=TOTALORDER
}
cmp2 {
  a = s32[] parameter(0)
  b = s32[] parameter(1)
  ROOT gt = pred[] compare(a, b), direction=GT
}
ENTRY e {
  k = f32[4,33] parameter(0)
  v = s32[4,33] iota(), iota_dimension=1
  s = (f32[4,33], s32[4,33]) sort(k, v), dimensions={1}, is_stable=true, to_apply=cmp
  q = s32[4,33] parameter(1)
  q2 = s32[4,33] sort(q), dimensions={0}, is_stable=true, to_apply=cmp2
  a = f32[4,33] get-tuple-element(s), index=0
  b = s32[4,33] get-tuple-element(s), index=1
  ROOT t = (f32[4,33], s32[4,33], s32[4,33]) tuple(a, b, q2)
}"""
    k = np.round(f32(4, 33), 1)
    k[0, :3] = [np.nan, -0.0, 0.0]
    return text, [k, i32(4, 33, lo=0, hi=5)], 0, 0


@case
def windows():
    text = """HloModule windows
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
  ROOT g = pred[] compare(a, b), direction=GE
}
ENTRY e {
  x = f32[2,9,7] parameter(0)
  z = f32[] constant(0)
  ninf = f32[] constant(-inf)
  a = f32[2,5,7] reduce-window(x, z), window={size=1x3x2 stride=1x2x2 pad=0_0x1_1x1_2 lhs_dilate=1x1x2 rhs_dilate=1x1x2}, to_apply=add
  b = f32[2,4,3] reduce-window(x, ninf), window={size=1x3x3 stride=1x2x2}, to_apply=mx
  src = f32[2,4,3] parameter(1)
  c = f32[2,9,7] select-and-scatter(x, src, z), window={size=1x3x3 stride=1x2x2}, select=ge, scatter=add
  r = f32[2,7] reduce(x, z), dimensions={1}, to_apply=add
  ROOT t = (f32[2,5,7], f32[2,4,3], f32[2,9,7], f32[2,7]) tuple(a, b, c, r)
}"""
    return text, [f32(2, 9, 7), f32(2, 4, 3)], 1e-5, 1e-5


@case
def convolutions():
    text = """HloModule convs
ENTRY e {
  x = f32[2,9,8,4] parameter(0)
  k = f32[3,2,2,6] parameter(1)
  a = f32[2,5,5,6] convolution(x, k), window={size=3x2 stride=2x2 pad=1_1x1_2 rhs_dilate=1x2}, dim_labels=b01f_01io->b01f, feature_group_count=2
  x2 = f32[3,4,10] parameter(2)
  k2 = f32[3,3,8] parameter(3)
  b = f32[4,8,21] convolution(x2, k2), window={size=3 pad=2_2 lhs_dilate=2}, dim_labels=fb0_i0o->bf0
  x3 = f32[4,10,2] parameter(4)
  k3 = f32[3,2,4] parameter(5)
  c = f32[1,8,4] convolution(x3, k3), window={size=3}, dim_labels=b0f_0io->b0f, batch_group_count=4
  x4 = f32[4,10,2] parameter(6)
  k4 = f32[3,2,8] parameter(7)
  d = f32[2,8,8] convolution(x4, k4), window={size=3 rhs_reversal=1}, dim_labels=b0f_0io->b0f, batch_group_count=2
  ROOT t = (f32[2,5,5,6], f32[4,8,21], f32[1,8,4], f32[2,8,8]) tuple(a, b, c, d)
}"""
    return (text, [f32(2, 9, 8, 4), f32(3, 2, 2, 6), f32(3, 4, 10), f32(3, 3, 8),
                   f32(4, 10, 2), f32(3, 2, 4), f32(4, 10, 2), f32(3, 2, 8)], 2e-5, 2e-5)


@case
def dots():
    text = """HloModule dots
ENTRY e {
  a = f32[3,5,4,2] parameter(0)
  b = f32[2,3,6,4] parameter(1)
  d = f32[3,2,5,6] dot(a, b), lhs_batch_dims={0,3}, lhs_contracting_dims={2}, rhs_batch_dims={1,0}, rhs_contracting_dims={3}
  c = bf16[8,16] parameter(2)
  e = bf16[16,4] parameter(3)
  f = f32[8,4] dot(c, e), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  g = bf16[8,4] dot(c, e), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  gi = s32[8,4] parameter(4)
  hi = s32[4,3] parameter(5)
  i = s32[8,3] dot(gi, hi), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT t = (f32[3,2,5,6], f32[8,4], bf16[8,4], s32[8,3]) tuple(d, f, g, i)
}"""
    import ml_dtypes
    c = f32(8, 16).astype(ml_dtypes.bfloat16)
    e = f32(16, 4).astype(ml_dtypes.bfloat16)
    return text, [f32(3, 5, 4, 2), f32(2, 3, 6, 4), c, e, i32(8, 4), i32(4, 3)], 1e-5, 1e-5


@case
def rng_bit_generators():
    text = """HloModule rng
ENTRY e {
  s = u64[2] parameter(0)
  s3 = u64[3] parameter(1)
  a = (u64[2], u32[5,3]) rng-bit-generator(s), algorithm=rng_philox
  b = (u64[2], u32[3,5]) rng-bit-generator(s), algorithm=rng_three_fry
  c = (u64[3], u64[7]) rng-bit-generator(s3), algorithm=rng_philox
  d = (u64[2], u64[3]) rng-bit-generator(s), algorithm=rng_three_fry
  f = (u64[2], u32[7]) rng-bit-generator(s), algorithm=rng_default
  g = (u64[2], u32[]) rng-bit-generator(s), algorithm=rng_three_fry
  h = (u64[2], u16[6]) rng-bit-generator(s), algorithm=rng_philox
  a0 = u64[2] get-tuple-element(a), index=0
  a1 = u32[5,3] get-tuple-element(a), index=1
  b0 = u64[2] get-tuple-element(b), index=0
  b1 = u32[3,5] get-tuple-element(b), index=1
  c0 = u64[3] get-tuple-element(c), index=0
  c1 = u64[7] get-tuple-element(c), index=1
  d1 = u64[3] get-tuple-element(d), index=1
  f1 = u32[7] get-tuple-element(f), index=1
  g1 = u32[] get-tuple-element(g), index=1
  h1 = u16[6] get-tuple-element(h), index=1
  ROOT t = (u64[2], u32[5,3], u64[2], u32[3,5], u64[3], u64[7], u64[3], u32[7], u32[], u16[6]) tuple(a0, a1, b0, b1, c0, c1, d1, f1, g1, h1)
}"""
    s = np.array([0x0123456789ABCDEF, 0xFFFFFFFFFFFFFFFE], np.uint64)
    s3 = np.array([42, 0xFFFFFFFFFFFFFFFF, 7], np.uint64)
    return text, [s, s3], 0, 0


@case
def control_flow():
    text = """HloModule cf
cond {
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(6)
  ROOT lt = pred[] compare(i, n), direction=LT
}
body {
  p = (s32[], f32[4]) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[4] get-tuple-element(p), index=1
  one = s32[] constant(1)
  i2 = s32[] add(i, one)
  x2 = f32[4] sine(x)
  ROOT t = (s32[], f32[4]) tuple(i2, x2)
}
b0 {
  p = f32[4] parameter(0)
  ROOT n = f32[4] negate(p)
}
b1 {
  p = f32[4] parameter(0)
  ROOT n = f32[4] exponential(p)
}
ENTRY e {
  x = f32[4] parameter(0)
  k = s32[] parameter(1)
  z = s32[] constant(0)
  init = (s32[], f32[4]) tuple(z, x)
  w = (s32[], f32[4]) while(init), condition=cond, body=body
  wx = f32[4] get-tuple-element(w), index=1
  c = f32[4] conditional(k, x, x), branch_computations={b0, b1}
  ROOT t = (f32[4], f32[4]) tuple(wx, c)
}"""
    return text, [f32(4), np.array(1, np.int32)], 1e-6, 1e-6


@case
def topk():
    text = """HloModule topk
ENTRY e {
  x = f32[3,40] parameter(0)
  ROOT t = (f32[3,7], s32[3,7]) topk(x), k=7, largest=true
}"""
    x = np.round(f32(3, 40), 1)
    return text, [x], 0, 0


def run_case(binary, name, fn, tmp):
    text, args, rtol, atol = fn()
    d = os.path.join(tmp, name)
    os.makedirs(os.path.join(d, "args"), exist_ok=True)
    os.makedirs(os.path.join(d, "expected"), exist_ok=True)
    hlo = os.path.join(d, "m.hlo")
    open(hlo, "w").write(text)
    import jax
    exe, dev = compile_text(text)
    outs = exe.execute([jax.device_put(np.asarray(a), dev) for a in args])
    outs = [np.asarray(o) for o in outs]
    for i, a in enumerate(args):
        a = np.asarray(a)
        if a.dtype.name == "bfloat16":
            a = a.astype(np.float32)
        np.save(os.path.join(d, "args", f"arg{i}.npy"), a)
    for i, o in enumerate(outs):
        if o.dtype.name in ("bfloat16",) or o.dtype.name.startswith("float8"):
            o = o.astype(np.float32)
        np.save(os.path.join(d, "expected", f"out{i}.npy"), o)
    r = subprocess.run([binary, hlo, "--args", os.path.join(d, "args"), "--expected",
                        os.path.join(d, "expected"), "--rtol", str(rtol), "--atol", str(atol)],
                       capture_output=True, text=True)
    line = (r.stdout.strip().splitlines() or [r.stderr.strip()])[-1]
    return r.returncode == 0, line


def main():
    binary = sys.argv[1]
    flt = sys.argv[2] if len(sys.argv) > 2 else ""
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in CASES.items():
            if flt and flt not in name:
                continue
            try:
                ok, line = run_case(binary, name, fn, tmp)
            except Exception as e:  # XLA rejected the module, or a harness error
                ok, line = False, f"harness error: {e}"
            if ok:
                passed += 1
                print(f"PASS {name}")
            else:
                failed += 1
                try:
                    j = json.loads(line)
                    bad = [o for o in j.get("outputs", []) if not o.get("matched")]
                    line = json.dumps(bad or j)[:1500]
                except Exception:
                    pass
                print(f"FAIL {name}: {line}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
