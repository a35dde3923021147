#!/usr/bin/env python3
"""Probe sharding propagation against XLA on programs outside the corpus.

Compiles a list of small sharded JAX programs (GSPMD, 8 CPU devices), takes
XLA's dumps before and after its sharding propagation, runs
`hlo-opt --passes=sharding-propagation --compare-shardings` on each and
prints the match rate. Needs jax/jaxlib 0.10.2 (tools/testdata_gen/
requirements.txt); nothing here runs in CI.

Usage:
    cargo build --release -p hlo-opt
    python3 xla/service/sharding_propagation/scripts/probe_with_jax.py [--keep DIR]
"""
import os, sys, glob, re, tempfile, shutil, json, subprocess
D = tempfile.mkdtemp(prefix="extra_dump_")
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8 --xla_dump_to=%s --xla_dump_hlo_pass_re=spmd|sharding" % D
os.environ["JAX_PLATFORMS"] = "cpu"
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools/testdata_gen"))
import numpy as np, jax, jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
jax.config.update("jax_use_shardy_partitioner", False)
devs = np.array(jax.devices())
m8 = Mesh(devs, ("x",)); m24 = Mesh(devs.reshape(2,4), ("a","b")); m222 = Mesh(devs.reshape(2,2,2), ("p","q","r"))
def S(m, *spec): return NamedSharding(m, P(*spec))
cases = []
def case(name, fn, args, in_s, out_s=None):
    cases.append((name, fn, args, in_s, out_s))
f32 = lambda *s: jnp.ones(s, jnp.float32)

def attention(x, wq, wk, wv):
    q = x @ wq; k = x @ wk; v = x @ wv
    s = jnp.einsum("bsd,btd->bst", q, k) / 8.0
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bst,btd->bsd", p, v)
case("attn_2x4", attention, [f32(4,16,32), f32(32,32), f32(32,32), f32(32,32)], [S(m24,"a",None,None), S(m24,None,"b"), S(m24,None,"b"), S(m24,None,"b")])

def mlp_grad(w1, w2, x, y):
    def loss(w1, w2):
        h = jax.nn.relu(x @ w1); o = h @ w2
        return jnp.mean((o - y) ** 2)
    return jax.grad(loss, argnums=(0,1))(w1, w2)
case("mlp_grad_fsdp", mlp_grad, [f32(32,64), f32(64,16), f32(16,32), f32(16,16)], [S(m8,"x",None), S(m8,"x",None), S(m8,"x",None), S(m8,"x",None)])

def scatter_add(x, idx, upd):
    return x.at[idx].add(upd)
case("scatter_add", scatter_add, [f32(64,8), jnp.arange(16, dtype=jnp.int32)*3, f32(16,8)], [S(m8,"x",None), S(m8,None), S(m8,None,None)])

def unconstrained(x):
    y = jnp.sin(x)
    y = jax.lax.with_sharding_constraint(y, S(m24, "a", P.UNCONSTRAINED))
    return jnp.cos(y) * 2
case("unconstrained_dim", unconstrained, [f32(16,32)], [S(m24, None, "b")])

def conv_grad(x, w):
    def f(w):
        y = lax.conv_general_dilated(x, w, (1,1), "SAME", dimension_numbers=("NHWC","HWIO","NHWC"))
        return jnp.sum(y*y)
    return jax.grad(f)(w)
case("conv_weight_grad", conv_grad, [f32(8,8,8,4), f32(3,3,4,8)], [S(m8,"x",None,None,None), S(m8,None,None,None,None)])

def argmin_cumsum(x):
    return jnp.argmin(x, axis=1), jnp.cumsum(x, axis=0), jnp.sort(x, axis=0)
case("argmin_cumsum_sort", argmin_cumsum, [f32(32,16)], [S(m24, "a", "b")])

def scan2(h, ws):
    def body(c, w):
        h, acc = c
        h = jnp.tanh(h @ w)
        return (h, acc + h.sum()), h.mean()
    (h, acc), ys = lax.scan(body, (h, jnp.float32(0)), ws)
    return h, acc, ys
case("scan_two_carries", scan2, [f32(16,32), f32(3,32,32)], [S(m24,"a",None), S(m24,None,None,"b")])

def mesh3(x, w):
    return jnp.einsum("bsd,df->bsf", x, w).sum(axis=1)
case("mesh3_einsum_reduce", mesh3, [f32(4,8,16), f32(16,32)], [S(m222,"p","q",None), S(m222,None,"r")])

def partial_manual(x):
    def inner(y):
        return jnp.sin(y) * 2
    f = jax.shard_map(inner, mesh=m24, in_specs=P("a", None), out_specs=P("a", None), axis_names={"a"})
    return f(x)
case("partial_manual_shard_map", partial_manual, [f32(16,32)], [S(m24,"a","b")])

def reshape_transpose(x):
    y = x.reshape(4, 8, 16).transpose(1, 0, 2).reshape(8, 64)
    return jnp.exp(y)
case("reshape_transpose_chain", reshape_transpose, [f32(32,16)], [S(m24,"a","b")])

def dyn_update_loop(x):
    def body(i, c):
        return lax.dynamic_update_slice(c, jnp.full((1,16), i, jnp.float32), (i, 0))
    return lax.fori_loop(0, 4, body, x)
case("fori_dus", dyn_update_loop, [f32(8,16)], [S(m8,None,"x")])


def emb_grad(table, ids):
    def f(t):
        return jnp.sum(jnp.take(t, ids, axis=0) ** 2)
    return jax.grad(f)(table)
case("embedding_grad", emb_grad, [f32(64,16), jnp.arange(8, dtype=jnp.int32)], [S(m8,"x",None), S(m8,None)])

def layernorm(x, g):
    m = x.mean(-1, keepdims=True); v = ((x-m)**2).mean(-1, keepdims=True)
    return (x-m)/jnp.sqrt(v+1e-5)*g
case("layernorm_feature_sharded", layernorm, [f32(16,64), f32(64)], [S(m24,"a","b"), S(m24,"b")])

def conflict_dot(a, b):
    return jnp.einsum("bij,bjk->bik", a, b)
case("conflicting_batch_dot", conflict_dot, [f32(8,16,32), f32(8,32,16)], [S(m24,"a",None,"b"), S(m24,"b",None,None)])

def cond_diff(p, x):
    return lax.cond(p > 0, lambda x: jnp.sin(x), lambda x: jax.lax.with_sharding_constraint(jnp.cos(x), S(m8,None,"x")), x)
case("cond_constraint_branch", cond_diff, [jnp.int32(1), f32(16,16)], [S(m8), S(m8,"x",None)])

def pool(x):
    y = lax.reduce_window(x, -jnp.inf, lax.max, (1,2,2,1), (1,2,2,1), "VALID")
    return jax.grad(lambda x: jnp.sum(lax.reduce_window(x, -jnp.inf, lax.max, (1,2,2,1), (1,2,2,1), "VALID")))(x), y
case("maxpool_and_grad", pool, [f32(8,8,8,4)], [S(m8,"x",None,None,None)])

def pad_rev(x):
    return jnp.flip(lax.pad(x, 0.0, ((1,2,1),(0,0,0))), axis=0)
case("pad_interior_reverse", pad_rev, [f32(16,8)], [S(m8,"x",None)])

def topk(x):
    return lax.top_k(x, 4)
case("top_k_rows", topk, [f32(16,32)], [S(m8,"x",None)])

def while_constraint(x):
    def body(i, c):
        c = jnp.tanh(c)
        return jax.lax.with_sharding_constraint(c, S(m24, None, "b"))
    return lax.fori_loop(0, 3, body, x)
case("loop_constraint_other_axis", while_constraint, [f32(16,32)], [S(m24,"a",None)])

def rng_noise(x):
    k = jax.random.PRNGKey(0)
    return x + jax.random.normal(k, x.shape)
case("rng_noise", rng_noise, [f32(16,32)], [S(m8,"x",None)])

def multi_out(x, w):
    y = x @ w
    return y, jnp.tanh(y).sum(0), jnp.where(y > 0, y, 0.1)
case("multi_out_where", multi_out, [f32(16,32), f32(32,64)], [S(m24,"a",None), S(m24,None,"b")])

def dot_conflict(a, b):
    return a @ b
case("dot_conflict_sizes", dot_conflict, [f32(64,16), f32(16,128)], [S(m8,None,"x"), S(m8,None,"x")])

def vmap_mm(a, b):
    return jax.vmap(lambda x, y: x @ y)(a, b)
case("vmap_matmul", vmap_mm, [f32(8,16,32), f32(8,32,8)], [S(m24,"a","b",None), S(m24,"a",None,None)])

def reduce_multi(x):
    return x.sum(axis=(0,2)), x.max(axis=1)
case("reduce_multi_dims", reduce_multi, [f32(8,16,32)], [S(m222,"p","q","r")])

def depthwise(x, w):
    return lax.conv_general_dilated(x, w, (1,1), "SAME", dimension_numbers=("NHWC","HWIO","NHWC"), feature_group_count=8)
case("depthwise_conv", depthwise, [f32(8,8,8,8), f32(3,3,1,8)], [S(m24,"a",None,None,"b"), S(m24,None,None,None,"b")])

def concat_params(a, b):
    return jnp.concatenate([a.reshape(4, 16), b.reshape(4, 16)], axis=0) * 2
case("concat_reshaped_params", concat_params, [f32(4,4,4), f32(4,4,4)], [S(m24,"a",None,None), S(m24,"a",None,None)])

def loop_allgather(x, w):
    def body(i, c):
        ww = jax.lax.with_sharding_constraint(w, S(m8, None, None))
        return jnp.tanh(c @ ww)
    return lax.fori_loop(0, 2, body, x)
case("loop_allgather_weights", loop_allgather, [f32(16,32), f32(32,32)], [S(m8,"x",None), S(m8,"x",None)])
names = []
for name, fn, args, in_s, out_s in cases:
    fn.__name__ = name
    try:
        jf = jax.jit(fn, in_shardings=in_s)
        jf.lower(*args).compile()
        names.append(name)
    except Exception as e:
        print("FAILED", name, type(e).__name__, str(e)[:200])
from generate import clean_hlo
out = sys.argv[sys.argv.index("--keep") + 1] if "--keep" in sys.argv else tempfile.mkdtemp(prefix="probe_cases_")
shutil.rmtree(out, ignore_errors=True)
for name in names:
    files = sorted(glob.glob(os.path.join(D, "*jit_%s.*" % name)))
    pick = lambda key: [f for f in files if key in f]
    a = pick("before_sharding-propagation"); b = pick("after_sharding-propagation.before_spmd-partitioning")
    if not a or not b:
        print("no dumps for", name, len(files)); continue
    os.makedirs(os.path.join(out, name), exist_ok=True)
    open(os.path.join(out, name, "input.hlo"), "w").write(clean_hlo(open(a[0]).read()))
    open(os.path.join(out, name, "propagated.hlo"), "w").write(clean_hlo(open(b[0]).read()))

hlo_opt = os.path.join(ROOT, "target/release/hlo-opt")
tm = tt = 0
for name in names:
    d = os.path.join(out, name)
    if not os.path.isdir(d):
        continue
    r = subprocess.run([hlo_opt, os.path.join(d, "input.hlo"), "--passes=sharding-propagation",
                        "--compare-shardings", os.path.join(d, "propagated.hlo")], capture_output=True, text=True)
    if r.returncode != 0:
        print("%-32s ERROR %s" % (name, r.stderr.strip()[:200]))
        continue
    c = json.loads(r.stdout)
    tm += c["matched"]; tt += c["total"]
    print("%-32s %4d/%-4d" % (name, c["matched"], c["total"]))
    for m in c["mismatches"]:
        print("    %s (%s): ours %s, XLA %s" % (m["instruction"], m["opcode"], m["ours"], m["other"]))
print("total %d/%d" % (tm, tt))
