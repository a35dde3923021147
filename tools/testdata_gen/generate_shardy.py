#!/usr/bin/env python3
"""Generate the Shardy-era XLA reference cases (testdata/shardy_cases/<name>/...).

Same idea and case.json schema as generate.py (the GSPMD set in
testdata/cases/), but the programs are compiled with JAX's defaults, i.e. with
the Shardy partitioner (jax_use_shardy_partitioner=True), so what XLA receives
is a module with `xla.sdy.*` frontend attributes and custom calls.  Per case:

    input.hlo            the `before_optimizations` dump (module as JAX hands it
                         to XLA: xla.sdy.meshes, xla.sdy.sharding, ShardingGroup,
                         GlobalToLocalShape / LocalToGlobalShape, manual bodies, ...)
    propagated.hlo       `spmd-partitioner.after_shardy-xla.before_spmd-partitioning`:
                         Shardy's propagation result exported to GSPMD shardings
    xla_partitioned.hlo  `after_spmd-partitioning` (per-device program)
    args/arg<i>.npy, expected/out<i>.npy, case.json

plus <out>/index.json.  See testdata/shardy_cases/README.md.  Cases made with
case(..., expected_from_single_device=True) (the rng-bit-generator cases) store
the single-device rerun's outputs in expected/ instead of XLA's sharded ones
(case.json "expected_source": "single_device").

Usage:
    python3 tools/testdata_gen/generate_shardy.py              # -> testdata/shardy_cases/
    python3 tools/testdata_gen/generate_shardy.py --only NAME  # one case (repeatable)
    python3 tools/testdata_gen/generate_shardy.py --out DIR    # DIR/<name>/..., DIR/index.json
    python3 tools/testdata_gen/generate_shardy.py --list
"""

import argparse
import atexit
import contextlib
import itertools
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# generate.py sets XLA_FLAGS / JAX_PLATFORMS and switches Shardy off when it
# is imported.  Neither takes effect before the backend is created (first
# jax.devices()) or the first compile, so we import it for its helpers and then
# put back our own dump flags and JAX's default for the partitioner.
import jax  # noqa: E402

_SHARDY_DEFAULT = jax.config.jax_use_shardy_partitioner  # JAX's default (True in 0.10.2)

import generate as G  # noqa: E402

jax.config.update("jax_use_shardy_partitioner", _SHARDY_DEFAULT)

_DUMP_DIR = tempfile.mkdtemp(prefix="testdata_gen_shardy_dump_")
_KEEP_DUMPS = []
atexit.register(lambda: _KEEP_DUMPS or shutil.rmtree(_DUMP_DIR, ignore_errors=True))
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=8 "
    "--xla_dump_to=%s --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=.*" % _DUMP_DIR
)
os.environ["JAX_PLATFORMS"] = "cpu"

import numpy as np  # noqa: E402
import ml_dtypes  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, AxisType  # noqa: E402
from jax.experimental.shard_alike import shard_alike  # noqa: E402
from jax._src import shard_alike as _shard_alike_mod  # noqa: E402

Case, Ctx, wsc = G.Case, G.Ctx, G.wsc
NUM_DEVICES = G.NUM_DEVICES
REPO_ROOT = G.REPO_ROOT
U = P.UNCONSTRAINED

# A fixed non-iota device order used by the permuted-mesh cases.
PERM = [3, 1, 0, 2, 7, 5, 4, 6]


# ---------------------------------------------------------------------------
# Case registry (own dict: generate.CASES is the GSPMD set).
# ---------------------------------------------------------------------------

CASES = {}


def case(name, description, mesh_shape, axis_names, rtol=1e-5, atol=1e-5, manual=False,
         device_ids=None, explicit=False, logical_device_ids=None,
         expected_from_single_device=False, x64=False):
    """device_ids: the mesh is Mesh(jax.devices()[device_ids]) (non-iota device
    order); explicit: all mesh axes are AxisType.Explicit and the case runs
    under jax.set_mesh; logical_device_ids: the in_shardings are
    NamedSharding(mesh, spec, _logical_device_ids=...) (what jax.device_put
    builds when it moves an array between meshes of different device order).
    A mesh_shape with fewer than 8 devices (and no device_ids) uses jax devices
    0..n-1, and the module has num_partitions=n.
    expected_from_single_device: expected/out*.npy are the outputs of the same
    program jitted on ONE device with every sharding removed (the
    single-device rerun), not of XLA's sharded run; case.json gets
    "expected_source": "single_device" (used for rng-bit-generator, whose
    partitioned values XLA does not promise to keep).  x64: the whole case
    (sharded compile and single-device rerun) runs under
    jax.enable_x64(True); case.json gets "jax_enable_x64": true."""
    def deco(builder):
        assert name not in CASES, name
        CASES[name] = (builder, dict(description=description, mesh_shape=mesh_shape,
                                     axis_names=axis_names, rtol=rtol, atol=atol,
                                     manual=manual),
                       dict(device_ids=device_ids, explicit=explicit,
                            logical_device_ids=logical_device_ids,
                            expected_from_single_device=expected_from_single_device,
                            x64=x64))
        return builder
    return deco


def smap(f, in_specs, out_specs, axis_names=None):
    kw = {} if axis_names is None else {"axis_names": set(axis_names)}
    return jax.shard_map(f, mesh=Ctx.mesh, in_specs=in_specs, out_specs=out_specs, **kw)


def salike(x, y):
    """shard_alike that disappears in the single-device rerun."""
    if Ctx.single:
        return x, y
    return shard_alike(x, y)


# --- MLPs / dots -------------------------------------------------------------

@case("mlp_dp_tp_2x4",
      "2-layer MLP on a 2x4 (a,b) mesh: x batch-sharded on a, w1 column-parallel on b, "
      "w2 row-parallel on b -> one all-reduce over b.",
      (2, 4), ("a", "b"), rtol=1e-4)
def _mlp_dp_tp(c):
    c.arg("x", (8, 16), "f32", P("a", None))
    c.arg("w1", (16, 32), "f32", P(None, "b"), scale=0.25)
    c.arg("b1", (32,), "f32", P("b"), scale=0.1)
    c.arg("w2", (32, 16), "f32", P("b", None), scale=0.18)
    c.out("y", P("a", None))

    def f(x, w1, b1, w2):
        return (jax.nn.gelu(x @ w1 + b1) @ w2,)
    return f


@case("fsdp_mlp_gather_weights_8",
      "FSDP MLP on an 8-way 'x' axis: batch and both weights sharded on x, weights "
      "constrained to replicated right before use (all-gathers).",
      (8,), ("x",), rtol=1e-4)
def _fsdp(c):
    c.arg("x", (16, 24), "f32", P("x", None))
    c.arg("w1", (24, 32), "f32", P(None, "x"), scale=0.2)
    c.arg("w2", (32, 24), "f32", P("x", None), scale=0.17)
    c.out("y", P("x", None))

    def f(x, w1, w2):
        h = jax.nn.silu(x @ wsc(w1, P(None, None)))
        return (h @ wsc(w2, P(None, None)),)
    return f


@case("tp_mlp_gelu_4x2",
      "Megatron MLP on a 4x2 (d,m) mesh with odd-ish dims: x [12,20] on d, w1 [20,24] "
      "columns on m, w2 [24,20] rows on m.",
      (4, 2), ("d", "m"), rtol=1e-4)
def _tp_mlp(c):
    c.arg("x", (12, 20), "f32", P("d", None))
    c.arg("w1", (20, 24), "f32", P(None, "m"), scale=0.22)
    c.arg("w2", (24, 20), "f32", P("m", None), scale=0.2)
    c.out("y", P("d", None))

    def f(x, w1, w2):
        return (x + jax.nn.gelu(x @ w1, approximate=False) @ w2,)
    return f


@case("dot_reduce_scatter_mesh3d",
      "dot with the contracting dim sharded on (b,c) of a 2x2x2 mesh and the result "
      "constrained to rows on a, cols on b.",
      (2, 2, 2), ("a", "b", "c"), rtol=1e-4)
def _dot_rs(c):
    c.arg("x", (8, 16), "f32", P("a", ("b", "c")))
    c.arg("w", (16, 8), "f32", P(("b", "c"), None), scale=0.3)
    c.out("y", P("a", "b"))

    def f(x, w):
        return (wsc(x @ w, P("a", "b")),)
    return f


@case("jit_out_shardings_differ_2x4",
      "inputs sharded P(a,b) and P(b,None); jit out_shardings ask for P(None,(b,a)), "
      "P(b,a) and a replicated scalar: the result shardings come only from out_shardings.",
      (2, 4), ("a", "b"), rtol=1e-4)
def _out_sh(c):
    c.arg("x", (8, 16), "f32", P("a", "b"))
    c.arg("w", (16, 8), "f32", P("b", None), scale=0.3)
    c.out("y", P(None, ("b", "a")))
    c.out("z", P("b", "a"))
    c.out("s", P())

    def f(x, w):
        y = x @ w
        return jnp.tanh(y), x.T @ y.T * 0.1, jnp.sum(y)
    return f


@case("nested_jit_call_2x4",
      "a nested jax.jit (kept as a call in the input) with a sharding constraint inside it, "
      "called twice on differently sharded operands.",
      (2, 4), ("a", "b"), rtol=1e-4)
def _nested_jit(c):
    c.arg("x", (8, 8), "f32", P("a", None))
    c.arg("y", (8, 8), "f32", P(None, "b"))
    c.out("z", P("a", "b"))

    @jax.jit
    def inner(u, v):
        return wsc(jnp.sin(u) @ v, P("a", "b"))

    def f(x, y):
        return (inner(x, y) + inner(y, x),)
    return f


# --- reductions / softmax / attention -----------------------------------------

@case("reductions_mesh3d",
      "sum over a dim sharded on (a,b), max over a dim sharded on c, mean over all, of a "
      "[8,4,6] array on a 2x2x2 mesh.",
      (2, 2, 2), ("a", "b", "c"), rtol=1e-5)
def _red(c):
    c.arg("x", (8, 4, 6), "f32", P(("a", "b"), "c", None))
    c.out("s", P(None, None))
    c.out("m", P(None, None))
    c.out("t", P())

    def f(x):
        return jnp.sum(x, axis=0), jnp.max(x, axis=1), jnp.mean(x)
    return f


@case("softmax_rows_cols_2x4",
      "softmax over the b-sharded last dim of a [8,16] array (rows on a): max and sum "
      "all-reduces over b.",
      (2, 4), ("a", "b"), rtol=1e-5)
def _softmax(c):
    c.arg("x", (8, 16), "f32", P("a", "b"), scale=3.0)
    c.out("y", P("a", "b"))

    def f(x):
        return (jax.nn.softmax(x, axis=-1),)
    return f


@case("attention_heads_batch_2x4",
      "multi-head attention [B=4,S=8,H=4,D=8]: batch on a, heads on b, causal mask, "
      "output projection row-parallel over heads.",
      (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _attn(c):
    c.arg("q", (4, 8, 4, 8), "f32", P("a", None, "b", None))
    c.arg("k", (4, 8, 4, 8), "f32", P("a", None, "b", None))
    c.arg("v", (4, 8, 4, 8), "f32", P("a", None, "b", None))
    c.arg("wo", (4, 8, 16), "f32", P("b", None, None), scale=0.3)
    c.out("y", P("a", None, None))

    def f(q, k, v, wo):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(8.0))
        mask = jnp.tril(jnp.ones((8, 8), bool))
        s = jnp.where(mask, s, -1e9)
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", p, v)
        return (jnp.einsum("bqhd,hde->bqe", o, wo),)
    return f


# --- convolution -----------------------------------------------------------

@case("conv2d_batch_features_2x4",
      "NHWC conv 3x3 SAME: batch on a, output features on b (kernel sharded on its "
      "output-feature dim), relu.",
      (2, 4), ("a", "b"), rtol=1e-4)
def _conv(c):
    c.arg("x", (4, 8, 8, 3), "f32", P("a", None, None, None))
    c.arg("k", (3, 3, 3, 8), "f32", P(None, None, None, "b"), scale=0.4)
    c.out("y", P("a", None, None, "b"))

    def f(x, k):
        y = lax.conv_general_dilated(x, k, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (jax.nn.relu(y),)
    return f


@case("conv1d_seq_sharded_8",
      "1-D conv (width 3, SAME) over a sequence [2,32,4] sharded 8-way: halo exchange.",
      (8,), ("x",), rtol=1e-4)
def _conv1d(c):
    c.arg("x", (2, 32, 4), "f32", P(None, "x", None))
    c.arg("k", (3, 4, 4), "f32", P(), scale=0.4)
    c.out("y", P(None, "x", None))

    def f(x, k):
        return (lax.conv_general_dilated(x, k, (1,), "SAME",
                                         dimension_numbers=("NWC", "WIO", "NWC")),)
    return f


# --- data movement -------------------------------------------------------------

@case("concat_pad_slice_8",
      "concat of two row-sharded arrays [16,4]+[8,4], pad (low 1, high 2, interior 1), "
      "strided slice [3:35:2] -> [16,4]; 8-way.",
      (8,), ("x",), rtol=0, atol=0)
def _concat(c):
    c.arg("x", (16, 4), "f32", P("x", None))
    c.arg("y", (8, 4), "f32", P("x", None))
    c.out("z", P("x", None))

    def f(x, y):
        z = jnp.concatenate([x, y * 2.0], axis=0)
        z = lax.pad(z, np.float32(0), [(1, 2, 1), (0, 0, 0)])
        return (z[3:35:2],)
    return f


@case("gather_embedding_vocab_sharded_2x4",
      "embedding lookup: table [32,16] vocab-sharded on b and feature-sharded on a, ids "
      "[4,6] batch-sharded on a; jnp.take.",
      (2, 4), ("a", "b"), rtol=0, atol=0)
def _gather(c):
    c.arg("table", (32, 16), "f32", P("b", "a"))
    c.arg("ids", (4, 6), "s32", P("a", None), lo=0, hi=32)
    c.out("e", P("a", None, None))

    def f(table, ids):
        return (jnp.take(table, ids, axis=0),)
    return f


@case("scatter_add_rows_8",
      "segment-sum style scatter-add of updates [16,4] (rows sharded 8-way) into a [10,4] "
      "accumulator at integer rows.",
      (8,), ("x",), rtol=1e-5)
def _scatter(c):
    c.arg("acc", (10, 4), "f32", P())
    c.arg("idx", (16,), "s32", P("x"), lo=0, hi=10)
    c.arg("upd", (16, 4), "f32", P("x", None))
    c.out("y", P(None, None))

    def f(acc, idx, upd):
        return (acc.at[idx].add(upd),)
    return f


@case("sort_cumsum_4x2",
      "sort along a b-sharded dim, cumsum along an a-sharded dim, argsort, of a [8,6] array "
      "on a 4x2 mesh.",
      (4, 2), ("a", "b"), rtol=1e-5)
def _sort(c):
    c.arg("x", (8, 6), "f32", P("a", "b"))
    c.out("s", P("a", "b"))
    c.out("cs", P("a", "b"))
    c.out("i", P("a", "b"))

    def f(x):
        return jnp.sort(x, axis=1), jnp.cumsum(x, axis=0), jnp.argsort(x, axis=1).astype(jnp.int32)
    return f


# --- reshapes / sub-axes -----------------------------------------------------

@case("reshape_split_sharded_dim_2x4",
      "reshape [16,8] with rows sharded on (a,b) (8-way) into [4,4,8] and back through a "
      "tanh: splitting the sharded dim needs sub-axes of the (a,b) product in Shardy "
      "(first factor on a and b:(1)2, second on b:(2)2).",
      (2, 4), ("a", "b"), rtol=1e-5)
def _rs_split(c):
    c.arg("x", (16, 8), "f32", P(("a", "b"), None))
    c.out("y", P(None, None, None))
    c.out("z", P(("a", "b"), None))

    def f(x):
        y = jnp.tanh(x.reshape(4, 4, 8))
        return y, (y * 2.0).reshape(16, 8)
    return f


@case("reshape_merge_sharded_dims_4x2",
      "reshape [4,2,6] with dim0 on a and dim1 on b into [8,6] (merge two sharded dims), "
      "then split [8,6] rows into [2,4,6] with the result constrained to P(b,a,None).",
      (4, 2), ("a", "b"), rtol=1e-5)
def _rs_merge(c):
    c.arg("x", (4, 2, 6), "f32", P("a", "b", None))
    c.out("m", P(("a", "b"), None))
    c.out("s", P("b", "a", None))

    def f(x):
        m = jnp.exp(x.reshape(8, 6) * 0.5)
        return m, wsc(m.reshape(2, 4, 6) + 1.0, P("b", "a", None))
    return f


@case("reshape_split_heads_mesh3d",
      "x [4,32] with the feature dim sharded on (y,z) reshaped to heads [4,8,4] "
      "(8 = 2x4: the 4-way (y,z) sharding is split across the head dim), softmax over "
      "the last dim; x's batch on x.",
      (2, 2, 2), ("x", "y", "z"), rtol=1e-5)
def _rs_heads(c):
    c.arg("x", (4, 32), "f32", P("x", ("y", "z")), scale=2.0)
    c.out("p", P("x", None, None))

    def f(x):
        return (jax.nn.softmax(x.reshape(4, 8, 4), axis=-1),)
    return f


@case("reshape_split_8way_dim_to_two_4x2",
      "[24,5] rows sharded 8-way on (a,b) reshaped to [2,12,5] (the 8-way dim does not "
      "divide the leading 2 evenly: a goes to dim0's factor, b and part of a to dim1)",
      (4, 2), ("a", "b"), rtol=1e-5)
def _rs_split2(c):
    c.arg("x", (24, 5), "f32", P(("a", "b"), None))
    c.out("y", P(None, None, None))

    def f(x):
        return (jnp.cos(x).reshape(2, 12, 5),)
    return f


# --- with_sharding_constraint forms ----------------------------------------------

@case("wsc_unconstrained_dims_2x4",
      "with_sharding_constraint with PartitionSpec.UNCONSTRAINED dims: P(a, UNCONSTRAINED) "
      "and P(UNCONSTRAINED, b) around a matmul, open dims left to propagation.",
      (2, 4), ("a", "b"), rtol=1e-4)
def _wsc_u(c):
    c.arg("x", (8, 16), "f32", P(None, "b"))
    c.arg("w", (16, 8), "f32", P("b", None), scale=0.3)
    c.out("y", P("a", None))

    def f(x, w):
        h = wsc(jnp.tanh(x), P("a", U))
        y = wsc(h @ w, P(U, "b"))
        return (jnp.exp(y * 0.1),)
    return f


@case("wsc_unconstrained_multi_axis_mesh3d",
      "constraints P(UNCONSTRAINED, (y,z)) and P(x, UNCONSTRAINED, None) on a 2x2x2 mesh "
      "with a transpose between them.",
      (2, 2, 2), ("x", "y", "z"), rtol=1e-5)
def _wsc_u3(c):
    c.arg("x", (8, 8, 4), "f32", P("x", None, None))
    c.out("y", P("x", None, None))

    def f(x):
        a = wsc(jnp.sin(x), P(U, ("y", "z"), None))
        b = wsc(jnp.transpose(a, (1, 0, 2)) * 2.0, P("x", U, None))
        return (b,)
    return f


@case("wsc_chain_reshard_4x2",
      "a chain of with_sharding_constraints moving one array P(a,b) -> P(b,a) -> "
      "P((a,b),None) -> P(None,None).",
      (4, 2), ("a", "b"), rtol=0, atol=0)
def _wsc_chain(c):
    c.arg("x", (8, 8), "f32", P("a", "b"))
    c.out("y", P(None, None))

    def f(x):
        x = wsc(x + 1.0, P("b", "a"))
        x = wsc(x * 2.0, P(("a", "b"), None))
        return (wsc(x - 3.0, P(None, None)),)
    return f


# --- shard_alike -----------------------------------------------------------------

@case("shard_alike_replicated_partner_2x4",
      "shard_alike(y, z) where y = tanh(x @ w) is sharded P(a,b) by propagation and z is a "
      "replicated parameter: the sharding group forces both to one sharding.",
      (2, 4), ("a", "b"), rtol=1e-4)
def _sa_repl(c):
    c.arg("x", (8, 16), "f32", P("a", None))
    c.arg("w", (16, 8), "f32", P(None, "b"), scale=0.3)
    c.arg("z", (8, 8), "f32", P())
    c.out("y", P("a", None))
    c.out("z", P())

    def f(x, w, z):
        y = jnp.tanh(x @ w)
        y2, z2 = salike(y, z)
        return y2 + z2, z2 * 2.0
    return f


@case("shard_alike_sharded_partner_4x2",
      "shard_alike of an unconstrained intermediate exp(x) with a parameter sharded "
      "P(b,a): the intermediate takes the partner's sharding.",
      (4, 2), ("a", "b"), rtol=1e-5)
def _sa_shard(c):
    c.arg("x", (8, 8), "f32", P())
    c.arg("p", (8, 8), "f32", P("b", "a"))
    c.out("y", P(None, None))

    def f(x, p):
        e, p2 = salike(jnp.exp(x), p)
        return (jnp.sum(e * p2, axis=1, keepdims=True) + e,)
    return f


@case("shard_alike_two_groups_mesh3d",
      "two independent shard_alike groups in one program (ids 0 and 1) plus a "
      "with_sharding_constraint feeding one of them.",
      (2, 2, 2), ("x", "y", "z"), rtol=1e-5)
def _sa_two(c):
    c.arg("a", (8, 4), "f32", P("x", None))
    c.arg("b", (8, 4), "f32", P(None, ("y", "z")))
    c.arg("d", (4, 8), "f32", P())
    c.out("u", P(None, None))
    c.out("v", P(None, None))

    def f(a, b, d):
        a2, b2 = salike(jnp.sin(a), b)
        t = wsc(d * 3.0, P("z", "y"))
        t2, d2 = salike(t, d.T.T + 1.0)
        return a2 * b2, t2 - d2
    return f


# --- shard_map ---------------------------------------------------------------------

@case("shard_map_full_psum_2x4",
      "fully manual shard_map over (a,b): local matmul of a row-sharded x with a "
      "contracting-sharded w, psum over b; out_specs P(a, None).",
      (2, 4), ("a", "b"), rtol=1e-4, manual=True)
def _sm_psum(c):
    c.arg("x", (8, 16), "f32", P("a", "b"))
    c.arg("w", (16, 8), "f32", P("b", None), scale=0.3)
    c.out("y", P("a", None))

    def f(x, w):
        def body(xl, wl):
            return lax.psum(xl @ wl, "b")
        return (smap(body, (P("a", "b"), P("b", None)), P("a", None))(x, w),)
    return f


@case("shard_map_all_to_all_8",
      "fully manual shard_map over 8-way x: all_to_all (split dim 1, concat dim 0) then "
      "axis_index-scaled values.",
      (8,), ("x",), rtol=0, atol=0, manual=True)
def _sm_a2a(c):
    c.arg("x", (16, 8), "f32", P("x", None))
    c.out("y", P(None, "x"))

    def f(x):
        def body(xl):
            y = lax.all_to_all(xl, "x", 1, 0, tiled=True)
            return y * (lax.axis_index("x") + 1).astype(jnp.float32)
        return (smap(body, P("x", None), P(None, "x"))(x),)
    return f


@case("shard_map_ppermute_ring_8",
      "fully manual shard_map over 8-way x: one ring ppermute step plus psum of the local "
      "sums.",
      (8,), ("x",), rtol=1e-5, manual=True)
def _sm_ring(c):
    c.arg("x", (16, 4), "f32", P("x", None))
    c.out("y", P("x", None))
    c.out("s", P())

    def f(x):
        def body(xl):
            nxt = lax.ppermute(xl, "x", [(i, (i + 1) % 8) for i in range(8)])
            return xl + 2.0 * nxt, lax.psum(jnp.sum(xl), "x")
        return smap(body, P("x", None), (P("x", None), P()))(x)
    return f


@case("shard_map_partial_manual_psum_2x4",
      "partially manual shard_map (axis_names={b}, a stays automatic): x [8,16] rows on a "
      "(auto) and cols on b (manual), local reduce + psum over b.",
      (2, 4), ("a", "b"), rtol=1e-5, manual=True)
def _sm_partial_psum(c):
    c.arg("x", (8, 16), "f32", P("a", "b"))
    c.out("y", P("a", None))

    def f(x):
        def body(xl):
            return lax.psum(jnp.sum(jnp.tanh(xl), axis=1, keepdims=True), "b")
        return (smap(body, P(None, "b"), P(None, None), axis_names={"b"})(x),)
    return f


@case("shard_map_partial_manual_ppermute_4x2",
      "partially manual shard_map over a only (b automatic, the operand's dim 1 sharded on "
      "b outside): cyclic ppermute over a and a matmul with a b-sharded weight inside.",
      (4, 2), ("a", "b"), rtol=1e-4, manual=True)
def _sm_partial_pp(c):
    c.arg("x", (8, 6), "f32", P("a", "b"))
    c.arg("w", (6, 4), "f32", P(None, "b"), scale=0.4)
    c.out("y", P("a", None))

    def f(x, w):
        def body(xl, wl):
            r = lax.ppermute(xl, "a", [(i, (i + 1) % 4) for i in range(4)])
            return (xl - r) @ wl
        return (smap(body, (P("a", None), P()), P("a", None), axis_names={"a"})(x, w),)
    return f


@case("shard_map_partial_manual_all_to_all_mesh3d",
      "shard_map manual over (x,y) of a 2x2x2 mesh, z automatic: all_to_all over y (split "
      "dim 0, concat dim 1) plus a psum over x; the auto axis z shards dim 2 outside.",
      (2, 2, 2), ("x", "y", "z"), rtol=1e-5, manual=True)
def _sm_partial_a2a(c):
    c.arg("v", (8, 4, 4), "f32", P("x", "y", "z"))
    c.out("o", P("x", "y", "z"))

    def f(v):
        def body(vl):
            t = lax.all_to_all(vl, "y", 0, 1, tiled=True)
            return t + lax.psum(jnp.sum(vl), "x")
        return (smap(body, P("x", "y"), P("x", "y"), axis_names={"x", "y"})(v),)
    return f


@case("shard_map_in_scan_2x4",
      "lax.scan whose body calls a fully manual shard_map (local matmul + psum over b) on "
      "the carry: manual computation bodies inside a while body.",
      (2, 4), ("a", "b"), rtol=1e-4, manual=True)
def _sm_scan(c):
    c.arg("h", (8, 8), "f32", P("a", None))
    c.arg("ws", (3, 8, 8), "f32", P(None, "b", None), scale=0.3)
    c.out("h", P("a", None))

    def f(h, ws):
        def layer(hh, w):
            def body(hl, wl):
                k = hl.shape[1] // 4
                i = lax.axis_index("b")
                return lax.psum(lax.dynamic_slice_in_dim(hl, i * k, k, 1) @ wl, "b")
            y = smap(body, (P("a", None), P("b", None)), P("a", None))(hh, w)
            return jnp.tanh(y), None
        return (lax.scan(layer, h, ws)[0],)
    return f


# --- control flow ----------------------------------------------------------------

@case("scan_layers_2x4",
      "lax.scan over 4 stacked layers [4,16,16] (stack replicated, the layer's output dim "
      "on b), carry [8,16] batch on a, tanh(x @ w + b).",
      (2, 4), ("a", "b"), rtol=1e-4)
def _scan(c):
    c.arg("x", (8, 16), "f32", P("a", None))
    c.arg("ws", (4, 16, 16), "f32", P(None, None, "b"), scale=0.25)
    c.arg("bs", (4, 16), "f32", P(None, "b"), scale=0.1)
    c.out("y", P("a", None))
    c.out("norms", P(None))

    def f(x, ws, bs):
        def layer(h, wb):
            w, b = wb
            h = jnp.tanh(h @ w + b)
            return h, jnp.sum(h * h)
        return lax.scan(layer, x, (ws, bs))
    return f


@case("fori_loop_while_4x2",
      "fori_loop (a while with a tuple carry) that updates a P(a,b) matrix and a scalar "
      "for 5 iterations with a data-dependent matmul.",
      (4, 2), ("a", "b"), rtol=1e-4)
def _fori(c):
    c.arg("x", (8, 8), "f32", P("a", "b"), scale=0.5)
    c.arg("w", (8, 8), "f32", P("b", None), scale=0.3)
    c.out("x", P("a", "b"))
    c.out("t", P())

    def f(x, w):
        def body(i, st):
            x, t = st
            x = jnp.tanh(x @ w + i.astype(jnp.float32) * 0.1)
            return x, t + jnp.sum(x)
        return lax.fori_loop(0, 5, body, (x, jnp.float32(0)))
    return f


@case("while_data_dependent_2x4",
      "lax.while_loop with a data-dependent trip count (until the sharded vector's norm is "
      "below 1) on a b-sharded vector; a with_sharding_constraint inside the body.",
      (2, 4), ("a", "b"), rtol=1e-5)
def _while(c):
    c.arg("v", (16,), "f32", P("b"), scale=4.0)
    c.out("v", P("b"))
    c.out("n", P())

    def f(v):
        def cond(st):
            return jnp.sum(st[0] * st[0]) > 1.0
        def body(st):
            return wsc(st[0] * 0.5, P("b")), st[1] + 1
        return lax.while_loop(cond, body, (v, jnp.int32(0)))
    return f


@case("cond_sharded_branches_2x4",
      "lax.cond on the sign of a sharded sum; the branches constrain intermediates "
      "differently (P(a,b) vs P(b,None)) and end in an unconstrained op (constraining the "
      "branch roots differently fails XLA's verifier under Shardy, see README).",
      (2, 4), ("a", "b"), rtol=1e-5)
def _cond(c):
    c.arg("x", (8, 8), "f32", P("a", None))
    c.arg("y", (8, 8), "f32", P(None, "b"))
    c.out("z", P("a", None))

    def f(x, y):
        def t(ops):
            a, b = ops
            return wsc(a @ b, P("a", "b")) * 2.0
        def e(ops):
            a, b = ops
            return wsc(a - b, P("b", None)) + 1.0
        return (lax.cond(jnp.sum(x) > 0, t, e, (x, y)),)
    return f


@case("switch_three_branches_mesh3d",
      "lax.switch on an integer argument with three branches over a [8,4] array sharded "
      "P(x,(y,z)).",
      (2, 2, 2), ("x", "y", "z"), rtol=1e-5)
def _switch(c):
    c.arg("i", (), "s32", P(), value=2)
    c.arg("x", (8, 4), "f32", P("x", ("y", "z")))
    c.out("y", P("x", None))

    def f(i, x):
        return (lax.switch(i, [lambda a: a + 1.0, lambda a: jnp.sin(a),
                               lambda a: jnp.cumsum(a, axis=0)], x),)
    return f


# --- device order ----------------------------------------------------------------

@case("permuted_mesh_devices_2x4",
      "Mesh built from a permuted device array (devices [3,1,0,2,7,5,4,6] reshaped 2x4): "
      "the HLO uses iota logical ids (partition i = device_ids[i]); dot + transpose reshard.",
      (2, 4), ("a", "b"), rtol=1e-4, device_ids=PERM)
def _perm_mesh(c):
    c.arg("x", (8, 16), "f32", P("a", "b"))
    c.arg("w", (16, 8), "f32", P("b", None), scale=0.3)
    c.out("y", P("b", "a"))

    def f(x, w):
        return (jnp.transpose(x @ w) + 1.0,)
    return f


@case("logical_device_ids_reshard_2x4",
      "parameters carry NamedSharding(mesh, P(a,b), _logical_device_ids=[3,1,0,2,7,5,4,6]) "
      "(what jax.device_put builds between meshes of different device order): the mesh "
      "attribute carries device_ids=[...] and the parameter sharding is a non-iota "
      "tile assignment; the result is resharded to the iota mesh P(a,b).",
      (2, 4), ("a", "b"), rtol=0, atol=0, logical_device_ids=PERM)
def _ldi(c):
    c.arg("x", (8, 8), "f32", P("a", "b"))
    c.arg("y", (8, 4), "f32", P("a", None))
    c.out("z", P("a", "b"))
    c.out("w", P(None, "b"))

    def f(x, y):
        return x * 2.0, y + 1.0
    return f


# --- explicit axes / unreduced -------------------------------------------------------

@case("explicit_axes_unreduced_dot_2x4",
      "mesh with AxisType.Explicit axes (x,y) under jax.set_mesh: einsum with "
      "out_sharding=P(x, None, unreduced={y}) (an unreduced partial sum), then "
      "jax.sharding.reshard to P(x, None).",
      (2, 4), ("x", "y"), rtol=1e-4, explicit=True)
def _unreduced(c):
    c.arg("a", (8, 16), "f32", P("x", "y"))
    c.arg("b", (16, 8), "f32", P("y", None), scale=0.3)
    c.out("c", P("x", None))

    def f(a, b):
        if Ctx.single:
            return (a @ b,)
        p = jnp.einsum("ij,jk->ik", a, b, out_sharding=P("x", None, unreduced={"y"}))
        return (jax.sharding.reshard(p, P("x", None)),)
    return f


@case("explicit_axes_mlp_2x4",
      "Explicit-axes mesh: x P(x,None) @ w P(None,y) (result sharding from types, "
      "P(x,y)), relu, then jax.sharding.reshard to P(None,y) before the second dot.",
      (2, 4), ("x", "y"), rtol=1e-4, explicit=True)
def _explicit_mlp(c):
    c.arg("x", (8, 16), "f32", P("x", None))
    c.arg("w1", (16, 8), "f32", P(None, "y"), scale=0.3)
    c.arg("w2", (8, 4), "f32", P(), scale=0.3)
    c.out("y", P(None, None))

    def f(x, w1, w2):
        h = jax.nn.relu(x @ w1)
        if not Ctx.single:
            h = jax.sharding.reshard(h, P(None, "y"))
        return (h @ w2,)
    return f


# --- whole programs --------------------------------------------------------------

@case("transformer_train_step_fsdp_tp_2x4",
      "one-layer transformer LM train step on a 2x4 (fsdp,tp) mesh: batch on fsdp, weights "
      "FSDP on fsdp (dim 0) and tensor-parallel on tp (heads / hidden); embedding, "
      "rmsnorm, causal attention, MLP, tied-free LM head, softmax cross-entropy, "
      "jax.grad and an SGD update; outputs loss and the updated weights.",
      (2, 4), ("fsdp", "tp"), rtol=2e-4, atol=2e-5)
def _transformer(c):
    V, D, H, Dh, F, B, S = 16, 16, 4, 4, 32, 4, 8
    c.arg("tokens", (B, S), "s32", P("fsdp", None), lo=0, hi=V)
    c.arg("targets", (B, S), "s32", P("fsdp", None), lo=0, hi=V)
    c.arg("emb", (V, D), "f32", P(None, "fsdp"), scale=0.5)
    c.arg("wqkv", (D, 3, H, Dh), "f32", P("fsdp", None, "tp", None), scale=0.3)
    c.arg("wo", (H, Dh, D), "f32", P("tp", None, "fsdp"), scale=0.3)
    c.arg("w1", (D, F), "f32", P("fsdp", "tp"), scale=0.25)
    c.arg("w2", (F, D), "f32", P("tp", "fsdp"), scale=0.18)
    c.arg("wout", (D, V), "f32", P("fsdp", "tp"), scale=0.3)
    c.out("loss", P())
    for n, s in [("emb", P(None, "fsdp")), ("wqkv", P("fsdp", None, "tp", None)),
                 ("wo", P("tp", None, "fsdp")), ("w1", P("fsdp", "tp")),
                 ("w2", P("tp", "fsdp")), ("wout", P("fsdp", "tp"))]:
        c.out("new_" + n, s)

    def rms(x):
        return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)

    def loss_fn(params, tokens, targets):
        emb, wqkv, wo, w1, w2, wout = params
        x = wsc(jnp.take(emb, tokens, axis=0), P("fsdp", None, None))
        qkv = jnp.einsum("bsd,dthe->tbshe", rms(x), wqkv)
        q, k, v = qkv[0], qkv[1], qkv[2]
        s = jnp.einsum("bqhe,bkhe->bhqk", q, k) * np.float32(0.5)
        s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
        o = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(s, axis=-1), v)
        x = x + jnp.einsum("bqhe,hed->bqd", o, wo)
        x = x + jax.nn.gelu(rms(x) @ w1) @ w2
        logits = rms(x) @ wout
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        return jnp.mean(nll)

    def f(tokens, targets, emb, wqkv, wo, w1, w2, wout):
        params = (emb, wqkv, wo, w1, w2, wout)
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        new = tuple(p - 0.1 * g for p, g in zip(params, grads))
        return (loss,) + new
    return f


@case("mlp_train_step_dp_tp_4x2",
      "2-layer MLP regression train step on a 4x2 (d,m) mesh: batch on d, hidden on m; "
      "MSE loss, jax.grad, SGD; outputs loss and new weights.",
      (4, 2), ("d", "m"), rtol=1e-4, atol=1e-5)
def _mlp_train(c):
    c.arg("x", (8, 12), "f32", P("d", None))
    c.arg("y", (8, 4), "f32", P("d", None))
    c.arg("w1", (12, 16), "f32", P(None, "m"), scale=0.3)
    c.arg("w2", (16, 4), "f32", P("m", None), scale=0.25)
    c.out("loss", P())
    c.out("w1", P(None, "m"))
    c.out("w2", P("m", None))

    def f(x, y, w1, w2):
        def loss_fn(w1, w2):
            return jnp.mean((jnp.tanh(x @ w1) @ w2 - y) ** 2)
        loss, (g1, g2) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w1, w2)
        return loss, w1 - 0.5 * g1, w2 - 0.5 * g2
    return f


# ---------------------------------------------------------------------------
# Running a case.
# ---------------------------------------------------------------------------

_SPMD_DUMP_RE = re.compile(r"spmd|shardy|sharding")


# Held-out programs: written after sdy-propagation was done, against it (not
# developed with it); kept because each found a difference from XLA.


@case("moe_top2_einsum_dispatch_2x4",
       "MoE layer: tokens [16,8] on a, router [8,4], top-2 routing (lax.top_k), dense "
       "one-hot dispatch/combine einsums; expert weights [E=4,8,16]/[4,16,8] on b (expert "
       "axis); dispatched activations constrained P(b,a,None).",
       (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _heldout_moe(c):
    T, D, E, F = 16, 8, 4, 16
    c.arg("x", (T, D), "f32", P("a", None))
    c.arg("wg", (D, E), "f32", P(None, None), scale=0.5)
    c.arg("w1", (E, D, F), "f32", P("b", None, None), scale=0.3)
    c.arg("w2", (E, F, D), "f32", P("b", None, None), scale=0.25)
    c.out("y", P("a", None))

    def f(x, wg, w1, w2):
        gates = jax.nn.softmax(x @ wg, axis=-1)                 # [T,E]
        tv, ti = lax.top_k(gates, 2)                            # [T,2]
        onehot = jax.nn.one_hot(ti, E, dtype=jnp.float32)       # [T,2,E]
        combine = jnp.einsum("tk,tke->te", tv, onehot)          # [T,E]
        dispatch = (combine > 0).astype(jnp.float32)
        xin = wsc(jnp.einsum("te,td->etd", dispatch, x), P("b", "a", None))
        h = jax.nn.relu(jnp.einsum("etd,edf->etf", xin, w1))
        eo = jnp.einsum("etf,efd->etd", h, w2)
        return (jnp.einsum("etd,te->td", eo, combine),)
    return f



@case("cumsum_argmax_topk_sharded_dim_2x4",
       "x [8,16] P(a,b): cumsum, argmax and lax.top_k(k=3) all along the b-sharded dim 1.",
       (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _heldout_scan_ops(c):
    c.arg("x", (8, 16), "f32", P("a", "b"))
    c.out("cs", P("a", "b"))
    c.out("am", P("a"))
    c.out("tv", P("a", None))
    c.out("ti", P("a", None))

    def f(x):
        tv, ti = lax.top_k(x, 3)
        return jnp.cumsum(x, axis=1), jnp.argmax(x, axis=1).astype(jnp.int32), tv, ti
    return f



@case("reshape_merge_transpose_split_2x4",
       "x [4,4,8] P(a,None,b): reshape to [4,32] (merge with the sharded minor dim), tanh, "
       "transpose to [32,4], reshape to [8,4,4]; output P(a,b,None).",
       (2, 4), ("a", "b"), rtol=1e-5, atol=1e-6)
def _heldout_reshape(c):
    c.arg("x", (4, 4, 8), "f32", P("a", None, "b"))
    c.out("y", P("a", "b", None))

    def f(x):
        y = jnp.tanh(x.reshape(4, 32))
        return (y.T.reshape(8, 4, 4) + 1.0,)
    return f



@case("rope_position_ids_2x4",
       "rotary embedding: x [4,16,2,8] batch on a, sequence on b; position ids from iota + "
       "per-batch offset (s32 [4] on a), inv-freq from iota, sin/cos broadcast_in_dim over "
       "heads, rotate-half concat.",
       (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _heldout_rope(c):
    B, S, H, D = 4, 16, 2, 8
    c.arg("x", (B, S, H, D), "f32", P("a", "b", None, None))
    c.arg("off", (B,), "s32", P("a"), lo=0, hi=32)
    c.out("y", P("a", "b", None, None))

    def f(x, off):
        pos = (jnp.arange(S, dtype=jnp.int32)[None, :] + off[:, None]).astype(jnp.float32)
        inv = 1.0 / (10000.0 ** (jnp.arange(D // 2, dtype=jnp.float32) / (D // 2)))
        ang = pos[:, :, None] * inv[None, None, :]                  # [B,S,D/2]
        sin = jnp.broadcast_to(jnp.sin(ang)[:, :, None, :], (B, S, H, D // 2))
        cos = jnp.broadcast_to(jnp.cos(ang)[:, :, None, :], (B, S, H, D // 2))
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return (jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1),)
    return f



@case("where_sharded_masks_multi_axis_2x4",
       "jnp.where with masks sharded differently from the data: x [16,8] P((b,a),None) "
       "(multi-axis dim, b major), m from y [16,8] P((a,b),None) > 0, a row mask [8] on b; "
       "column sums.",
       (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _heldout_where(c):
    c.arg("x", (16, 8), "f32", P(("b", "a"), None))
    c.arg("y", (16, 8), "f32", P(("a", "b"), None))
    c.arg("r", (8,), "f32", P("b"))
    c.out("z", P(("a", "b"), None))
    c.out("s", P(None))

    def f(x, y, r):
        z = jnp.where(y > 0, x, -2.0 * x)
        z = jnp.where((r > 0)[None, :], z, 0.5)
        return z, jnp.sum(jnp.where(z > x, z, 0.0), axis=0)
    return f



@case("cond_reduced_predicate_matmul_4x2",
       "lax.cond on max(x) > 0.5 (x [8,8] P(a,b), a global reduce), true branch x @ w with w "
       "P(b,None), false branch x.T * 3; result P(None,b).",
       (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _heldout_cond(c):
    c.arg("x", (8, 8), "f32", P("a", "b"))
    c.arg("w", (8, 8), "f32", P("b", None), scale=0.3)
    c.out("y", P(None, "b"))

    def f(x, w):
        return (lax.cond(jnp.max(x) > 0.5, lambda a, b: a @ b, lambda a, b: a.T * 3.0, x, w),)
    return f



@case("bf16_mlp_grad_tp8",
      "Gradients of sum((relu(x @ w1) @ w2)^2) for w1 and w2 in bf16 over tp=8 (x [16,32] "
      "P(tp,None), w1 [32,64] P(None,tp), w2 [64,32] P(tp,None)): the row-parallel matmul's "
      "bf16 partial sums are all-reduced. Inputs are eighths (s32 in [-8, 8) over 8), so XLA's "
      "sharded result is the single-device one bit for bit: its CPU compiler sums the partial "
      "products in f32 (all-reduce promotion, and no rounding of the dot to bf16 first).",
      (8,), ("tp",), rtol=0, atol=0)
def _heldout_bf16_grad(c):
    c.arg("x", (16, 32), "s32", P("tp", None), lo=-8, hi=8)
    c.arg("w1", (32, 64), "s32", P(None, "tp"), lo=-8, hi=8)
    c.arg("w2", (64, 32), "s32", P("tp", None), lo=-8, hi=8)
    c.out("dw1", P(None, "tp"))
    c.out("dw2", P("tp", None))

    def f(x, w1, w2):
        eighths = lambda a: a.astype(jnp.bfloat16) / 8
        x, w1, w2 = eighths(x), eighths(w1), eighths(w2)

        def loss(w1, w2):
            return jnp.sum(((jax.nn.relu(x @ w1) @ w2).astype(jnp.float32)) ** 2)
        return jax.grad(loss, argnums=(0, 1))(w1, w2)
    return f


def offload(x, spec):
    """jax.device_put to pinned host memory and back (activation offloading),
    which lowers to annotate_device_placement custom calls; gone in the
    single-device rerun."""
    if Ctx.single:
        return x
    x = jax.device_put(x, NamedSharding(Ctx.mesh, spec, memory_kind="pinned_host"))
    return jax.device_put(x, NamedSharding(Ctx.mesh, spec, memory_kind="device"))


@case("offload_device_put_2x4",
      "tanh(a @ w) with a P(x,None) and w P(None,y), offloaded to pinned host memory and "
      "back with its own sharding P(x,y) (jax.device_put with memory kinds), then "
      "sum(back * h, axis=1): the placement custom calls must pass the sharding through.",
      (2, 4), ("x", "y"), rtol=1e-4)
def _heldout_offload(c):
    c.arg("a", (16, 32), "f32", P("x", None))
    c.arg("w", (32, 64), "f32", P(None, "y"), scale=0.2)
    c.out("o", P("x"))

    def f(a, w):
        h = jnp.tanh(a @ w)
        return (jnp.sum(offload(h, P("x", "y")) * h, axis=1),)
    return f



# --- rng-bit-generator (JAX's rbg / unsafe_rbg PRNGs) --------------------------
#
# jax.random with impl="rbg" / "unsafe_rbg" lowers random bits to the HLO op
# rng-bit-generator (u32[4] key data bitcast to the u64[2] state).  XLA does not
# promise the single-device stream when that op is partitioned, while our
# partitioner computes each device's tile of the global stream, so these cases
# store the single-device outputs as expected (expected_from_single_device) and
# are compared bitwise (rtol = atol = 0).  The key is an input (raw key data,
# u32[4] replicated; any 4 words are a valid rbg key) or, in the last case,
# derived in the program from an s32 seed; the PRNG implementation is named
# per call (wrap_key_data / key(impl=...)), so JAX's default is not touched.

def _key_arg(c):
    c.arg("key", (4,), "u32", P(), lo=0, hi=1 << 32)


def _rbg(kd, impl="rbg"):
    return jax.random.wrap_key_data(kd, impl=impl)


@case("rbg_bits_u32_rows_2",
      "rbg PRNG: random bits u32[16,8] from a replicated u32[4] key (rng-bit-generator), "
      "constrained to rows on a 2-device mesh. Expected = single-device outputs.",
      (2,), ("x",), rtol=0.0, atol=0.0, expected_from_single_device=True)
def _rbg_bits_rows(c):
    _key_arg(c)
    c.out("bits", P("x", None))

    def f(kd):
        return (wsc(jax.random.bits(_rbg(kd), (16, 8), jnp.uint32), P("x", None)),)
    return f


@case("rbg_uniform_f32_cols_4",
      "rbg PRNG: jax.random.uniform f32[8,12] (rng-bit-generator u32 bits -> shift/or/"
      "bitcast - 1) constrained to columns on a 4-device mesh. Expected = single-device "
      "outputs.",
      (4,), ("x",), rtol=0.0, atol=0.0, expected_from_single_device=True)
def _rbg_uniform_cols(c):
    _key_arg(c)
    c.out("u", P(None, "x"))

    def f(kd):
        return (wsc(jax.random.uniform(_rbg(kd), (8, 12), jnp.float32), P(None, "x")),)
    return f


@case("unsafe_rbg_bits_u32_both_dims_2x4",
      "unsafe_rbg PRNG: random bits u32[8,16] constrained to P(a,b) on a 2x4 mesh (both "
      "dims sharded). Expected = single-device outputs.",
      (2, 4), ("a", "b"), rtol=0.0, atol=0.0, expected_from_single_device=True)
def _urbg_bits_2d(c):
    _key_arg(c)
    c.out("bits", P("a", "b"))

    def f(kd):
        return (wsc(jax.random.bits(_rbg(kd, "unsafe_rbg"), (8, 16), jnp.uint32),
                    P("a", "b")),)
    return f


@case("rbg_bits_uneven_rows_4",
      "rbg PRNG: random bits u32[10,6] constrained to rows on a 4-device mesh (uneven: "
      "tiles of 3,3,3,1 rows); outputs the bits replicated and zero-padded to [12,6] with "
      "rows on x (jit outputs must divide evenly; the pad keeps the tile boundaries). "
      "Expected = single-device outputs.",
      (4,), ("x",), rtol=0.0, atol=0.0, expected_from_single_device=True)
def _rbg_uneven_rows(c):
    _key_arg(c)
    c.out("bits", P(None, None))
    c.out("padded", P("x", None))

    def f(kd):
        b = wsc(jax.random.bits(_rbg(kd), (10, 6), jnp.uint32), P("x", None))
        return b, jnp.pad(b, ((0, 2), (0, 0)))
    return f


@case("rbg_bits_uneven_both_dims_2x4",
      "rbg PRNG: random bits u32[7,9] constrained to P(a,b) on a 2x4 mesh (uneven on both "
      "dims: rows 4,3, columns 3,3,3,0); outputs the bits replicated and zero-padded to "
      "[8,12] P(a,b) (same tile boundaries). Expected = single-device outputs.",
      (2, 4), ("a", "b"), rtol=0.0, atol=0.0, expected_from_single_device=True)
def _rbg_uneven_2d(c):
    _key_arg(c)
    c.out("bits", P(None, None))
    c.out("padded", P("a", "b"))

    def f(kd):
        b = wsc(jax.random.bits(_rbg(kd), (7, 9), jnp.uint32), P("a", "b"))
        return b, jnp.pad(b, ((0, 1), (0, 3)))
    return f


@case("rbg_split_fold_in_bits_u8_u16_2x4",
      "rbg PRNG: key split in two (threefry on the key halves), the second folded in with "
      "7; u8[16,8] bits from the first constrained to P(a,None) (replicated over b), "
      "u16[8,12] bits from the folded key constrained to P(None,b) (replicated over a): "
      "two rng-bit-generators with 8- and 16-bit outputs. Expected = single-device outputs.",
      (2, 4), ("a", "b"), rtol=0.0, atol=0.0, expected_from_single_device=True)
def _rbg_split_fold(c):
    _key_arg(c)
    c.out("bits8", P("a", None))
    c.out("bits16", P(None, "b"))

    def f(kd):
        k1, k2 = jax.random.split(_rbg(kd))
        k3 = jax.random.fold_in(k2, 7)
        return (wsc(jax.random.bits(k1, (16, 8), jnp.uint8), P("a", None)),
                wsc(jax.random.bits(k3, (8, 12), jnp.uint16), P(None, "b")))
    return f


@case("rbg_fold_in_bits_u64_x64_2x4",
      "rbg PRNG under jax_enable_x64 (this case only): fold_in(key, 3) then u64[8,6] bits "
      "(a u64 rng-bit-generator) constrained to P(b,a) (b major on rows), and u32[4,8] bits "
      "from the unfolded key constrained to P(a,b). Expected = single-device outputs.",
      (2, 4), ("a", "b"), rtol=0.0, atol=0.0, expected_from_single_device=True, x64=True)
def _rbg_u64(c):
    _key_arg(c)
    c.out("bits64", P("b", "a"))
    c.out("bits32", P("a", "b"))

    def f(kd):
        k = _rbg(kd)
        return (wsc(jax.random.bits(jax.random.fold_in(k, 3), (8, 6), jnp.uint64), P("b", "a")),
                wsc(jax.random.bits(k, (4, 8), jnp.uint32), P("a", "b")))
    return f


@case("rbg_dropout_mask_2x4",
      "dropout-like: x f32[16,16] P(a,b) times (uniform(rbg key, x.shape) > 0.5); the "
      "uniform and mask have no constraint (their sharding comes from x / out_shardings "
      "P(a,b)). Expected = single-device outputs.",
      (2, 4), ("a", "b"), rtol=0.0, atol=0.0, expected_from_single_device=True)
def _rbg_dropout(c):
    c.arg("x", (16, 16), "f32", P("a", "b"))
    _key_arg(c)
    c.out("y", P("a", "b"))

    def f(x, kd):
        return (x * (jax.random.uniform(_rbg(kd), x.shape, jnp.float32) > 0.5),)
    return f


@case("threefry_dropout_uneven_2x4",
      "JAX's default PRNG (threefry2x32, partitionable: elementwise over an iota counter, "
      "no rng-bit-generator): dropout of x f32[12,8] P(a,b) with a bernoulli mask and a "
      "normal-noise term, plus uniform f32[6,10] constrained P(a,b) (uneven columns), "
      "under value_and_grad. Expected = single-device outputs, compared within 1e-5: the "
      "random values are exact, but the loss is a sum over sharded dims (another order) and "
      "XLA's CPU code rounds the gradient's x / 0.75 differently from the interpreter.",
      (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5, expected_from_single_device=True)
def _threefry_dropout(c):
    c.arg("x", (12, 8), "f32", P("a", "b"))
    c.arg("seed", (), "s32", P(), lo=0, hi=1 << 20)
    c.out("loss", P())
    c.out("grad", P("a", "b"))

    def f(x, seed):
        key = jax.random.key(seed, impl="threefry2x32")
        k1, k2 = jax.random.split(key)

        def loss(x):
            keep = jax.random.bernoulli(k1, 0.75, x.shape)
            noise = 0.01 * jax.random.normal(k2, x.shape, jnp.float32)
            y = jnp.where(keep, x / 0.75, 0.0) + noise
            extra = wsc(jax.random.uniform(k2, (6, 10), jnp.float32), P("a", "b"))
            return jnp.sum(y * y) + jnp.sum(extra * extra)
        return jax.value_and_grad(loss)(x)
    return f


@case("unsafe_rbg_seed_split_fold_in_uniform_2x4",
      "unsafe_rbg PRNG with the key made in the program from an s32 seed "
      "(jax.random.key(seed, impl='unsafe_rbg'): threefry seed), split in two (an "
      "rng-bit-generator u32[20,4] + stride-10 slice), the first folded in with 5 (an "
      "rng-bit-generator u32[10,4] from a constant-seeded key, xor); uniform f32[8,8] from "
      "the folded key P(b,a), u32[12,4] bits from the second key P(a,None). Expected = "
      "single-device outputs.",
      (2, 4), ("a", "b"), rtol=0.0, atol=0.0, expected_from_single_device=True)
def _urbg_seed_split_fold(c):
    c.arg("seed", (), "s32", P(), lo=0, hi=1 << 20)
    c.out("u", P("b", "a"))
    c.out("bits", P("a", None))

    def f(seed):
        k = jax.random.key(seed, impl="unsafe_rbg")
        k1, k2 = jax.random.split(k)
        k1 = jax.random.fold_in(k1, 5)
        return (wsc(jax.random.uniform(k1, (8, 8), jnp.float32), P("b", "a")),
                wsc(jax.random.bits(k2, (12, 4), jnp.uint32), P("a", None)))
    return f



def _module_dumps(fn_name):
    pat = re.compile(r"^module_\d+\.jit_%s\.(.*\.txt)$" % re.escape(fn_name))
    found = {}
    for f in sorted(os.listdir(_DUMP_DIR)):
        m = pat.match(f)
        if m:
            found[m.group(1)] = os.path.join(_DUMP_DIR, f)
    return found


def _clear_dumps():
    for f in os.listdir(_DUMP_DIR):
        p = os.path.join(_DUMP_DIR, f)
        if os.path.isdir(p):
            shutil.rmtree(p)
        else:
            os.remove(p)


def _pick(dumps, needle):
    hits = [k for k in sorted(dumps) if needle in k]
    if len(hits) != 1:
        raise RuntimeError("expected one dump containing %r, got %r" % (needle, sorted(dumps)))
    return hits[0]


def _make_mesh(c, extra):
    ids = extra["device_ids"] or list(range(int(np.prod(c.mesh_shape))))
    devices = np.array([jax.devices()[i] for i in ids]).reshape(c.mesh_shape)
    kw = {}
    if extra["explicit"]:
        kw["axis_types"] = (AxisType.Explicit,) * len(c.axis_names)
    return Mesh(devices, tuple(c.axis_names), **kw), ids


def _in_sharding(mesh, spec, extra):
    if extra["logical_device_ids"] is not None:
        return NamedSharding(mesh, spec, _logical_device_ids=tuple(extra["logical_device_ids"]))
    return NamedSharding(mesh, spec)


def _single_device_check(builder, meta, c, host_outs, name, warn=True):
    """Reruns the case on one device without shardings (wsc / shard_alike /
    offload vanish, no in/out shardings) and compares with host_outs.
    Returns (summary for case.json, the single-device outputs as
    [(array, hlo type)])."""
    Ctx.single = True
    try:
        fn1 = builder(Case(name, **meta))
        fn1.__name__ = fn1.__qualname__ = name + "_single_device"
        dev0 = jax.devices()[0]
        args1 = []
        for a in c.args:
            d = a["data"].astype(ml_dtypes.bfloat16) if a["dtype"] == "bf16" else a["data"]
            args1.append(jax.device_put(d, dev0))
        ref = jax.tree_util.tree_leaves(jax.jit(fn1)(*args1))
    finally:
        Ctx.single = False
    diffs, ok, ref_host = [], True, []
    for (o, _), r in zip(host_outs, ref):
        r, r_hlo = G._host(r)
        ref_host.append((r, r_hlo))
        if o.dtype != r.dtype or o.shape != r.shape:
            raise RuntimeError("%s: single-device output %s%s vs sharded %s%s"
                               % (name, r.dtype, r.shape, o.dtype, o.shape))
        d = float(np.max(np.abs(o.astype(np.float64) - r.astype(np.float64)))) if o.size else 0.0
        if o.dtype == np.bool_ or np.issubdtype(o.dtype, np.integer):
            ok = ok and d == 0.0
        else:
            ok = ok and bool(np.allclose(o, r, rtol=c.rtol, atol=c.atol))
        diffs.append(d)
    if not ok and warn:
        print("WARNING: %s: single-device rerun differs: %r" % (name, diffs), file=sys.stderr)
    return {"max_abs_diff": diffs, "within_rtol_atol": bool(ok)}, ref_host


def run_case(name, out_root):
    extra = CASES[name][2]
    ctx = jax.enable_x64(True) if extra["x64"] else contextlib.nullcontext()
    with ctx:
        return _run_case(name, out_root)


def _run_case(name, out_root):
    builder, meta, extra = CASES[name]
    c = Case(name, **meta)
    mesh, device_ids = _make_mesh(c, extra)
    Ctx.mesh, Ctx.single = mesh, False
    fn = builder(c)
    fn.__name__ = fn.__qualname__ = name

    in_sh = tuple(_in_sharding(mesh, a["spec"], extra) for a in c.args)
    out_sh = tuple(NamedSharding(mesh, s) for _, s in c.outs)
    vals = []
    for a, s in zip(c.args, in_sh):
        d = a["data"].astype(ml_dtypes.bfloat16) if a["dtype"] == "bf16" else a["data"]
        vals.append(jax.device_put(d, s))

    # shard_alike numbers its sharding groups from a process-wide counter;
    # restart it so a case's group ids do not depend on the cases run before.
    _shard_alike_mod._next_shard_group_id = itertools.count()
    _clear_dumps()
    if extra["explicit"]:
        with jax.set_mesh(mesh):
            outs = jax.jit(fn, in_shardings=in_sh, out_shardings=out_sh)(*vals)
    else:
        outs = jax.jit(fn, in_shardings=in_sh, out_shardings=out_sh)(*vals)
    outs = jax.tree_util.tree_leaves(outs)
    if len(outs) != len(c.outs):
        raise RuntimeError("%s: %d outputs, %d out specs" % (name, len(outs), len(c.outs)))
    host_outs = [G._host(o) for o in outs]

    dumps = _module_dumps(name)
    files = {
        "input.hlo": _pick(dumps, "before_optimizations"),
        "propagated.hlo": _pick(dumps, "spmd-partitioner.after_shardy-xla.before_spmd-partitioning"),
        "xla_partitioned.hlo": _pick(dumps, "spmd-partitioner.after_spmd-partitioning"),
    }
    texts = {}
    for dst, src in files.items():
        with open(dumps[src], encoding="utf-8") as f:
            texts[dst] = G.clean_hlo(f.read())
    spmd_dumps = sorted(k for k in dumps if _SPMD_DUMP_RE.search(k) or k in files.values())

    if c.manual:
        sdc = {"skipped": "shard_map needs the 8-device mesh"}
    elif extra["expected_from_single_device"]:
        # expected/ holds the single-device outputs; the check records how
        # XLA's sharded outputs (not stored) compare with them.
        sdc, single_outs = _single_device_check(builder, meta, c, host_outs, name, warn=False)
        same = [d == 0.0 for d in sdc["max_abs_diff"]]
        sdc = {"compared": "XLA's sharded outputs (not stored) against expected/ (the "
                           "single-device outputs)",
               "max_abs_diff": sdc["max_abs_diff"],
               "xla_sharded_equals_single_device": same}
        print("  %s: XLA sharded output == single-device output: %s" % (name, same))
        host_outs = single_outs
    else:
        sdc, _ = _single_device_check(builder, meta, c, host_outs, name)
    _clear_dumps()

    # ---- write the case directory -----------------------------------------
    case_dir = os.path.join(out_root, name)
    if os.path.isdir(case_dir):
        shutil.rmtree(case_dir)
    os.makedirs(os.path.join(case_dir, "args"))
    os.makedirs(os.path.join(case_dir, "expected"))
    for dst in files:
        with open(os.path.join(case_dir, dst), "w", encoding="utf-8", newline="\n") as f:
            f.write(texts[dst])
    for i, a in enumerate(c.args):
        np.save(os.path.join(case_dir, "args", "arg%d.npy" % i),
                np.array(a["data"], order="C", copy=True), allow_pickle=False)
    for i, (o, _) in enumerate(host_outs):
        np.save(os.path.join(case_dir, "expected", "out%d.npy" % i), o, allow_pickle=False)

    counts, total_bytes, by_op, hist = G.collective_stats(texts["xla_partitioned.hlo"])
    args_json = []
    for i, a in enumerate(c.args):
        args_json.append({
            "index": i, "name": a["name"], "shape": a["shape"], "dtype": a["dtype"],
            "spec": G.full_spec(a["spec"], len(a["shape"])), "generator": a["generator"],
            "npy_dtype": G.HLO_TYPES[a["dtype"]][0],
        })
    outs_json = []
    for i, ((oname, ospec), (o, hlo)) in enumerate(zip(c.outs, host_outs)):
        outs_json.append({
            "index": i, "name": oname, "shape": list(o.shape), "dtype": hlo,
            "npy_dtype": o.dtype.name, "spec": G.full_spec(ospec, o.ndim),
            "exact": bool(o.dtype == np.bool_ or np.issubdtype(o.dtype, np.integer)),
        })
    if extra["device_ids"]:
        order = ("jax devices %s reshaped row-major to mesh_shape (non-iota); the HLO's "
                 "logical partition i runs on device device_ids[i]" % device_ids)
    else:
        order = ("row-major iota over the mesh: devices 0..%d reshaped to mesh_shape"
                 % (len(device_ids) - 1))
    meta_json = {
        "name": name,
        "description": c.description,
        "mesh_shape": c.mesh_shape,
        "axis_names": c.axis_names,
        "device_order": order,
        "num_partitions": len(device_ids),
        "in_specs": [a["spec"] for a in args_json],
        "out_specs": [o["spec"] for o in outs_json],
        "args": args_json,
        "outputs": outs_json,
        "args_stored": True,
        "expected_stored": True,
        "xla_collectives": counts,
        "xla_collective_bytes": total_bytes,
        "xla_collective_bytes_by_op": by_op,
        "xla_collective_counting": (
            "static count over all computations of xla_partitioned.hlo (instructions inside "
            "while/conditional bodies counted once; async -start forms counted as their "
            "collective); bytes = per-device result-shape bytes, tuple results summed"),
        "xla_partitioned_opcode_histogram": hist,
        "rtol": c.rtol,
        "atol": c.atol,
        "single_device_check": sdc,
        "xla_dump_files": files,
        "xla_spmd_dump_files_all": spmd_dumps,
        "generator_note": (
            "Shardy set (jax_use_shardy_partitioner left at JAX's default, True), made by "
            "tools/testdata_gen/generate_shardy.py. Inputs from hash_u32 / "
            "hash_uniform_float / hash_uniform_int in tools/testdata_gen/generate.py "
            "(see testdata/README.md; seeds use crc32(\"testdata/<case>\")); 'explicit' "
            "args hold the recorded value."),
        "jax_version": jax.__version__,
        # Keys below are additions to the GSPMD schema.
        "partitioner": "shardy",
        "device_ids": device_ids,
        "axis_types": ["explicit" if extra["explicit"] else "auto"] * len(c.axis_names),
        "in_logical_device_ids": extra["logical_device_ids"],
    }
    if extra["expected_from_single_device"]:
        meta_json["expected_source"] = "single_device"
    if extra["x64"]:
        meta_json["jax_enable_x64"] = True
    with open(os.path.join(case_dir, "case.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(G.format_case_json(meta_json))
    return meta_json


def main(argv=None):
    ap = argparse.ArgumentParser(description="Generate the Shardy-era XLA testdata cases.")
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "testdata", "shardy_cases"),
                    help="output folder (cases go to OUT/<name>, index to OUT/index.json)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="generate only this case (repeatable, or comma-separated)")
    ap.add_argument("--list", action="store_true", help="list case names and exit")
    ap.add_argument("--keep-dumps", action="store_true",
                    help="keep XLA's raw dump folder (only the last case's dumps remain)")
    args = ap.parse_args(argv)

    if args.list:
        for n in CASES:
            print(n)
        return 0
    if not jax.config.jax_use_shardy_partitioner:
        print("Shardy is off (JAX default changed?)", file=sys.stderr)
        return 2
    if jax.__version__ != "0.10.2":
        print("WARNING: jax %s (testdata was made with 0.10.2)" % jax.__version__, file=sys.stderr)
    if len(jax.devices()) < NUM_DEVICES:
        print("need %d host devices, got %d" % (NUM_DEVICES, len(jax.devices())), file=sys.stderr)
        return 2

    names = []
    for o in args.only:
        names.extend(x for x in o.split(",") if x)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print("unknown case(s): %s" % ", ".join(unknown), file=sys.stderr)
        return 2
    names = names or list(CASES)

    os.makedirs(args.out, exist_ok=True)
    failed = []
    try:
        for n in names:
            try:
                m = run_case(n, args.out)
            except Exception as e:  # report and keep going
                failed.append(n)
                print("FAILED %s: %s: %s" % (n, type(e).__name__, e), file=sys.stderr)
                continue
            coll = ", ".join("%s:%d" % (k, v) for k, v in m["xla_collectives"].items() if v) or "none"
            print("%-44s %-6s %-56s %7d B" % (n, "x".join(map(str, m["mesh_shape"])), coll,
                                             m["xla_collective_bytes"]))
        index = G.write_index(args.out, cases_dir=args.out,
                              generator="tools/testdata_gen/generate_shardy.py")
        print("%d cases in %s, %.1f KiB" % (index["num_cases"], args.out,
                                             index["total_size_bytes"] / 1024.0))
    finally:
        if args.keep_dumps:
            _KEEP_DUMPS.append(True)
            print("raw dumps kept in %s" % _DUMP_DIR)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
