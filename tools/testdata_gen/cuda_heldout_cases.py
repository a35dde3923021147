"""Held-out JAX programs that found bugs in the CUDA backend (run on the host
as `--backend cuda-host`) after it was done: arithmetic shifts of unsigned
types, bitcast-convert between widths, calls inside reducers, and complex
functions and dots. Written in /tmp first, as programs the backend was not
developed against; kept here because they found something.

Writes testdata/cuda_cases/<name>/ (input.hlo, case.json, args/, expected/).
Expected outputs are single-device XLA's: on some of these programs sharded
XLA CPU itself differs (NaN in a cross-shard max, scatter with duplicate
indices), so the reference is the unsharded run. Each case draws its inputs
from a generator seeded by its name, so one case regenerates alone:

    python3 tools/testdata_gen/cuda_heldout_cases.py [NAME ...]
"""
import os, sys, json, glob, shutil, traceback, zlib
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import case_files
dump = case_files.start_dump("--xla_force_host_platform_device_count=8")
os.environ["JAX_PLATFORMS"] = "cpu"
import numpy as np, ml_dtypes
import jax, jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
try:
    from jax import shard_map
except ImportError:
    from jax.experimental.shard_map import shard_map

OUT = os.path.join(HERE, "..", "..", "testdata", "cuda_cases")
devs = np.array(jax.devices())
M24 = Mesh(devs.reshape(2, 4), ("a", "b"))
M8 = Mesh(devs.reshape(8), ("x",))
rng = np.random.default_rng(0)
CASES = {}
def case(name, rtol=1e-5, atol=1e-6, x64=False):
    def deco(f):
        CASES[name] = (f, rtol, atol, x64)
        return f
    return deco

def widen(a):
    a = np.asarray(a)
    if a.dtype in (ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2):
        return a.astype(np.float32)
    return a

def run(name, build, rtol, atol, x64):
    global dump, rng
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    jax.config.update("jax_enable_x64", x64)
    fn, args, mesh, ins, outs = build()
    fn.__name__ = "train_step"
    kw = {}
    if mesh is not None:
        def divides(a, spec):
            for d, ax in zip(np.shape(a), tuple(spec)):
                if ax is None: continue
                axs = ax if isinstance(ax, tuple) else (ax,)
                n = int(np.prod([mesh.shape[q] for q in axs]))
                if d % n: return False
            return True
        ok = [divides(a, s) for a, s in zip(args, ins)]
        inner = fn
        def fn(*xs):
            xs = [x if o else jax.lax.with_sharding_constraint(x, NamedSharding(mesh, s)) for x, o, s in zip(xs, ok, ins)]
            return inner(*xs)
        kw["in_shardings"] = tuple(NamedSharding(mesh, s if o else P()) for s, o in zip(ins, ok))
        if outs is not None:
            kw["out_shardings"] = outs if not isinstance(outs, (list, tuple)) else tuple(NamedSharding(mesh, s) for s in outs)
    fn.__name__ = "train_step"
    for f in glob.glob(os.path.join(dump, "*")):
        os.remove(f) if os.path.isfile(f) else shutil.rmtree(f)
    j = jax.jit(fn, **kw)
    res = j(*args)
    flat = jax.tree_util.tree_leaves(res)
    d2 = dump + "_keep"
    shutil.rmtree(d2, ignore_errors=True); shutil.copytree(dump, d2)
    if mesh is not None:
        try:
            single = jax.tree_util.tree_leaves(jax.jit(inner if mesh is not None else fn)(*[jax.device_put(a, jax.devices()[0]) for a in args]))
        except Exception:
            single = flat
        for k, (a, b) in enumerate(zip(flat, single)):
            a = np.asarray(widen(a)); b = np.asarray(widen(b))
            same = np.array_equal(a, b, equal_nan=True) if a.dtype.kind not in "fc" else np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
            if not same:
                print(f"NOTE {name}: out{k} sharded XLA differs from single-device XLA; using single-device")
        flat = single
    meta = {"name": name, "num_partitions": 8 if mesh is not None else 1, "rtol": rtol, "atol": atol}
    case_files.write_case(OUT, name, d2, meta, "tools/testdata_gen/cuda_heldout_cases.py",
                          args=[widen(a) for a in args], outputs=[widen(o) for o in flat])

def R(*shape, dtype=np.float32, lo=-2, hi=2):
    if np.issubdtype(np.dtype(dtype), np.integer):
        return rng.integers(lo, hi, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)

# ---------------------------------------------------------------- cases
@case("int_bitops_widths_2x4")
def _():
    def f(a8, a16, a32, u32, s):
        out = []
        for a in (a8, a16, a32, u32):
            sh = (s % 40).astype(a.dtype)  # include >= width
            out += [a << sh, lax.shift_right_arithmetic(a, sh), lax.shift_right_logical(a, sh),
                    lax.population_count(a), lax.clz(a), a // (sh + 1).astype(a.dtype), a % (sh - 3).astype(a.dtype),
                    a ^ (~a >> 1), a & sh | (a * a)]
        return out
    s = R(5, 12, dtype=np.int32, lo=0, hi=80)
    return f, [R(5, 12, dtype=np.int8, lo=-128, hi=127), R(5, 12, dtype=np.int16, lo=-32768, hi=32767),
               R(5, 12, dtype=np.int32, lo=-2**31, hi=2**31 - 1), rng.integers(0, 2**32, (5, 12), dtype=np.uint32), s], M24, \
        [P("a", "b"), P(None, "b"), P("a"), P(), P("a", "b")], None

@case("complex_arith_2x4", rtol=1e-4, atol=1e-5)
def _():
    def f(a, b):
        z = lax.complex(a, b)
        w = lax.complex(b, a * 0.5)
        return (z * w, z / w, jnp.abs(z), jnp.exp(z), jnp.log(z), jnp.sqrt(z), jnp.conj(z) + 1, jnp.angle(z),
                jnp.real(z @ w.T), jnp.imag(z @ w.T), jnp.sum(z, axis=0), z ** 2, jnp.tanh(z * 0.1))
    return f, [R(6, 10), R(6, 10)], M24, [P("a", "b"), P(None, "b")], None

@case("reduce_precision_bitcast_8")
def _():
    def f(x, i, h):
        return (lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10), lax.reduce_precision(x, 8, 7), lax.reduce_precision(x, 4, 3),
                lax.reduce_precision(x, 5, 2), lax.bitcast_convert_type(x, jnp.int32), lax.bitcast_convert_type(x, jnp.uint8),
                lax.bitcast_convert_type(i, jnp.float32), lax.bitcast_convert_type(h, jnp.int16), lax.bitcast_convert_type(h.reshape(8, 6, 2), jnp.float32),
                lax.bitcast_convert_type(x, jnp.float16), lax.bitcast_convert_type(lax.bitcast_convert_type(x, jnp.bfloat16), jnp.uint16))
    x = R(8, 6, lo=-1e5, hi=1e5); x[0, :6] = [np.nan, np.inf, 1e-40, 65504, 70000, -1e-8]
    i = R(8, 6, dtype=np.int32, lo=0, hi=2**31 - 1)
    h = R(8, 12, dtype=np.float16)
    return f, [x, i, h], M8, [P("x"), P(None, "x"), P("x")], None

@case("bitcast_width_change_8")
def _():
    def f(x, h):
        return (lax.bitcast_convert_type(x, jnp.uint8), lax.bitcast_convert_type(h.reshape(8, 6, 2), jnp.float32),
                lax.bitcast_convert_type(x, jnp.float16), lax.bitcast_convert_type(x.astype(jnp.float64) if False else x, jnp.int16))
    return f, [R(8, 6), R(8, 12, dtype=np.float16)], M8, [P("x"), P("x")], None

@case("int_small_unsigned_ops_8", x64=True)
def _():
    def f(a8, a16, a64, s):
        out = []
        for a in (a8, a16, a64):
            sh = (s % 70).astype(a.dtype)
            out += [lax.shift_right_arithmetic(a, sh), lax.shift_right_logical(a, sh), a << sh, lax.population_count(a), lax.clz(a),
                    a * a, a // (sh + 1), a % (sh + 1), -a, ~a, jnp.maximum(a, sh), a.astype(jnp.float32), lax.integer_pow(a, 3),
                    jnp.sum(a, axis=1, dtype=a.dtype), jnp.min(a, axis=0)]
        return out
    return f, [R(8, 10, dtype=np.uint8, lo=0, hi=256), R(8, 10, dtype=np.uint16, lo=0, hi=65536),
               rng.integers(0, 2**64 - 1, (8, 10), dtype=np.uint64), R(8, 10, dtype=np.int32, lo=0, hi=100)], M8, [P("x"), P(None, "x"), P("x"), P()], None

@case("variadic_reduce_custom_2x4")
def _():
    def f(x, i):
        def comb(a, b):
            (av, ai, ac), (bv, bi, bc) = a, b
            take = (av > bv) | ((av == bv) & (ai < bi))
            return jnp.where(take, av, bv), jnp.where(take, ai, bi), ac + bc
        v, ix, cnt = lax.reduce((x, i, jnp.ones_like(i, jnp.uint16)), (jnp.float32(-jnp.inf), jnp.int32(2**31 - 1), jnp.uint16(0)), comb, (1,))
        m = lax.reduce(x, jnp.float32(1.0), lambda a, b: a * b, (0,))
        mx = lax.reduce(i, jnp.int32(0), lax.max, (0, 1))
        return v, ix, cnt, m, mx
    x = R(10, 14).round(0)
    return f, [x, R(10, 14, dtype=np.int32, lo=0, hi=1000)], M24, [P("a", "b"), P("a", "b")], None

if __name__ == "__main__":
    only = sys.argv[1:]
    for name, (b, rtol, atol, x64) in CASES.items():
        if only and name not in only:
            continue
        run(name, b, rtol, atol, x64)
