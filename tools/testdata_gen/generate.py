#!/usr/bin/env python3
"""Generate the project's XLA SPMD test cases (testdata/cases/<name>/...).

For each case this jit-compiles a small sharded JAX program on an 8-device
host-platform CPU mesh with GSPMD (Shardy disabled), grabs XLA's three
spmd-partitioner dumps, strips source metadata from them, runs the program on
inputs from a portable counter-based hash generator, and writes

    input.hlo            before sharding propagation (user shardings only)
    propagated.hlo       after sharding propagation, before SPMD partitioning
    xla_partitioned.hlo  after SPMD partitioning (per-device program)
    args/arg<i>.npy      global inputs, entry-parameter order
    expected/out<i>.npy  global outputs (flattened output order)
    case.json            metadata (meshes, specs, generators, collective stats)

plus <out>/index.json.  See testdata/README.md for the format.

Usage:
    pip install -r tools/testdata_gen/requirements.txt
    python3 tools/testdata_gen/generate.py                 # all cases -> testdata/
    python3 tools/testdata_gen/generate.py --only NAME     # one case (repeatable)
    python3 tools/testdata_gen/generate.py --out DIR       # other output root
    python3 tools/testdata_gen/generate.py --list          # list case names
"""

import argparse
import atexit
import json
import os
import re
import shutil
import sys
import tempfile
import zlib

# XLA reads XLA_FLAGS once, when the CPU backend is created, so the dump
# folder has to be chosen before jax is imported.
_DUMP_DIR = tempfile.mkdtemp(prefix="testdata_gen_dump_")
_KEEP_DUMPS = []
atexit.register(lambda: _KEEP_DUMPS or shutil.rmtree(_DUMP_DIR, ignore_errors=True))
os.environ["XLA_FLAGS"] = (
    "--xla_force_host_platform_device_count=8 "
    "--xla_dump_to=%s --xla_dump_hlo_pass_re=spmd|sharding" % _DUMP_DIR
)
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import ml_dtypes  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

jax.config.update("jax_use_shardy_partitioner", False)

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NUM_DEVICES = 8

COLLECTIVES = ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"]

# HLO element type -> (numpy dtype used in .npy, bits per element)
HLO_TYPES = {
    "pred": ("bool", 8), "s8": ("int8", 8), "u8": ("uint8", 8),
    "s16": ("int16", 16), "u16": ("uint16", 16), "f16": ("float16", 16),
    "bf16": ("float32", 16), "s32": ("int32", 32), "u32": ("uint32", 32),
    "f32": ("float32", 32), "s64": ("int64", 64), "u64": ("uint64", 64),
    "f64": ("float64", 64), "c64": ("complex64", 64), "c128": ("complex128", 128),
    "s4": ("int8", 4), "u4": ("uint8", 4), "s2": ("int8", 2), "u2": ("uint8", 2),
    "s1": ("int8", 1), "u1": ("uint8", 1),
    "f8e4m3fn": (None, 8), "f8e5m2": (None, 8), "f8e4m3": (None, 8),
    "f8e4m3fnuz": (None, 8), "f8e5m2fnuz": (None, 8), "f8e4m3b11fnuz": (None, 8),
    "f8e3m4": (None, 8), "f8e8m0fnu": (None, 8), "f4e2m1fn": (None, 4),
    "token": (None, 0),
}
NP_TO_HLO = {
    "bool": "pred", "int8": "s8", "uint8": "u8", "int16": "s16", "uint16": "u16",
    "float16": "f16", "bfloat16": "bf16", "int32": "s32", "uint32": "u32",
    "float32": "f32", "int64": "s64", "uint64": "u64", "float64": "f64",
    "complex64": "c64", "complex128": "c128",
}


# ---------------------------------------------------------------------------
# Portable input generator (documented in testdata/README.md).
# ---------------------------------------------------------------------------

def hash_u32(n, seed):
    """Counter-based hash: murmur3's 32-bit finaliser applied to
    (i + seed * 0x9E3779B9) mod 2^32 for the row-major flat index i."""
    i = np.arange(n, dtype=np.uint64)
    mixed = (i + np.uint64(seed % (1 << 32)) * np.uint64(0x9E3779B9)) & np.uint64(0xFFFFFFFF)
    x = mixed.astype(np.uint32)
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x85EBCA6B)
    x = x ^ (x >> np.uint32(13))
    x = x * np.uint32(0xC2B2AE35)
    x = x ^ (x >> np.uint32(16))
    return x


def hash_uniform_float(shape, seed, scale, bf16=False):
    n = int(np.prod(shape, dtype=np.int64))
    x = hash_u32(n, seed)
    top24 = (x >> np.uint32(8)).astype(np.int64)
    u = (2 * top24 - (1 << 24)).astype(np.float32) * np.float32(2.0 ** -24)
    v = (u * np.float32(scale)).astype(np.float32)
    if bf16:
        v = v.astype(ml_dtypes.bfloat16).astype(np.float32)
    return v.reshape(shape)


def hash_uniform_int(shape, seed, lo, hi, np_dtype):
    n = int(np.prod(shape, dtype=np.int64))
    x = hash_u32(n, seed).astype(np.int64)
    v = lo + (x % (hi - lo))
    return v.astype(np_dtype).reshape(shape)


def case_seed(case_name, arg_index):
    base = zlib.crc32(("testdata/" + case_name).encode("utf-8"))
    return (base + 104729 * (arg_index + 1)) % (1 << 32)


# ---------------------------------------------------------------------------
# HLO text helpers.
# ---------------------------------------------------------------------------

_HEADER_BLOCKS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def _skip_braced(text, start):
    """text[start] == '{'; return the index just past the matching '}',
    ignoring braces inside double-quoted strings."""
    depth = 0
    i = start
    n = len(text)
    in_str = False
    while i < n:
        ch = text[i]
        if in_str:
            if ch == "\\":
                i += 2
                continue
            if ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced braces in HLO text")


def strip_metadata(text):
    out = []
    pos = 0
    key = ", metadata={"
    while True:
        j = text.find(key, pos)
        if j < 0:
            out.append(text[pos:])
            break
        out.append(text[pos:j])
        pos = _skip_braced(text, j + len(key) - 1)
    return "".join(out)


def strip_header_blocks(text):
    lines = text.split("\n")
    kept = []
    i = 0
    while i < len(lines):
        if lines[i] in _HEADER_BLOCKS:
            i += 1
            while i < len(lines) and lines[i].strip() != "":
                i += 1
            continue
        kept.append(lines[i])
        i += 1
    # Collapse the blank-line runs the removed blocks leave behind.
    out = []
    for line in kept:
        if line.strip() == "" and out and out[-1].strip() == "":
            continue
        out.append(line)
    return "\n".join(out).strip("\n") + "\n"


def clean_hlo(text):
    return strip_header_blocks(strip_metadata(text))


_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?%?([^\s=]+)\s*=\s*")
_ARRAY_RE = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,\s<=]*)\]")


def _parse_shape(s, i):
    """Parse an HLO shape starting at s[i]; return (shape_text, next_index)."""
    if s[i] == "(":
        depth = 0
        j = i
        while j < len(s):
            if s[j] == "(":
                depth += 1
            elif s[j] == ")":
                depth -= 1
                if depth == 0:
                    return s[i:j + 1], j + 1
            j += 1
        raise ValueError("unbalanced tuple shape")
    j = i
    brace = 0
    while j < len(s):
        ch = s[j]
        if ch == "{":
            brace += 1
        elif ch == "}":
            brace -= 1
        elif ch == " " and brace == 0:
            break
        j += 1
    return s[i:j], j


def parse_instructions(text):
    """Yield (name, shape_text, opcode, line) for every instruction line."""
    for line in text.split("\n"):
        m = _INSTR_RE.match(line)
        if not m:
            continue
        rest_start = m.end()
        if rest_start >= len(line):
            continue
        try:
            shape, k = _parse_shape(line, rest_start)
        except ValueError:
            continue
        rest = line[k:].lstrip()
        om = re.match(r"([a-z][a-z0-9\-]*)\(", rest)
        if not om:
            continue
        yield m.group(1), shape, om.group(1), line


def shape_bytes(shape_text):
    total = 0
    for ty, dims in _ARRAY_RE.findall(shape_text):
        if ty not in HLO_TYPES:
            continue
        bits = HLO_TYPES[ty][1]
        n = 1
        for d in dims.split(","):
            d = d.strip().replace("<=", "")
            if d:
                n *= int(d)
        total += (n * bits + 7) // 8
    return total


def collective_stats(text):
    """Static collective counts / bytes and an opcode histogram over all
    computations.  Async `-start` forms count as their collective (bytes from
    the matching `-done` result); `-done` forms are not counted again."""
    instrs = list(parse_instructions(text))
    done_shape = {}
    for name, shape, op, line in instrs:
        if op.endswith("-done"):
            m = re.search(r"-done\(\s*%?([^\s,)]+)", line)
            if m:
                done_shape[m.group(1)] = shape
    counts = {c: 0 for c in COLLECTIVES}
    by_op = {}
    hist = {}
    for name, shape, op, line in instrs:
        hist[op] = hist.get(op, 0) + 1
        base = op[:-len("-start")] if op.endswith("-start") else op
        if base in counts and not op.endswith("-done"):
            counts[base] += 1
            b = shape_bytes(done_shape.get(name, shape) if op.endswith("-start") else shape)
            by_op[base] = by_op.get(base, 0) + b
    by_op = {k: by_op[k] for k in sorted(by_op)}
    hist = {k: hist[k] for k in sorted(hist)}
    return counts, sum(by_op.values()), by_op, hist


# ---------------------------------------------------------------------------
# Case definitions.
# ---------------------------------------------------------------------------

class Ctx:
    """Per-run state used by case functions (mesh, single-device mode)."""
    mesh = None
    single = False


def wsc(x, spec):
    """with_sharding_constraint that disappears in the single-device rerun."""
    if Ctx.single:
        return x
    return lax.with_sharding_constraint(x, NamedSharding(Ctx.mesh, spec))


class Case:
    def __init__(self, name, description, mesh_shape, axis_names, rtol, atol, manual=False):
        self.name = name
        self.description = description
        self.mesh_shape = list(mesh_shape)
        self.axis_names = list(axis_names)
        self.rtol = rtol
        self.atol = atol
        self.manual = manual  # uses shard_map: no single-device rerun
        self.args = []
        self.outs = []
        self.fn = None

    def arg(self, name, shape, dtype, spec, scale=1.0, lo=None, hi=None, value=None):
        idx = len(self.args)
        shape = tuple(shape)
        if value is not None:
            gen = {"kind": "explicit", "value": value}
            np_dtype = HLO_TYPES[dtype][0]
            data = np.full(shape, value, dtype=np_dtype)
        elif dtype in ("f32", "bf16"):
            seed = case_seed(self.name, idx)
            scale32 = float(np.float32(scale))
            gen = {"kind": "hash_uniform_float", "seed": seed, "scale": scale32}
            data = hash_uniform_float(shape, seed, scale32, bf16=(dtype == "bf16"))
        else:
            seed = case_seed(self.name, idx)
            gen = {"kind": "hash_uniform_int", "seed": seed, "lo": int(lo), "hi": int(hi)}
            data = hash_uniform_int(shape, seed, lo, hi, HLO_TYPES[dtype][0])
        self.args.append({"name": name, "shape": list(shape), "dtype": dtype,
                          "spec": spec, "generator": gen, "data": data})

    def out(self, name, spec):
        self.outs.append((name, spec))


CASES = {}


def case(name, description, mesh_shape, axis_names, rtol=1e-5, atol=1e-5, manual=False):
    def deco(builder):
        assert name not in CASES, name
        CASES[name] = (builder, dict(description=description, mesh_shape=mesh_shape,
                                     axis_names=axis_names, rtol=rtol, atol=atol,
                                     manual=manual))
        return builder
    return deco


def smap(f, in_specs, out_specs):
    return jax.shard_map(f, mesh=Ctx.mesh, in_specs=in_specs, out_specs=out_specs)


# --- MLPs ------------------------------------------------------------------

@case("tp_mlp_erf_gelu",
      "Megatron tensor-parallel MLP on an 8-way 'model' axis: w1 [40,160] column-parallel "
      "(sharded on its output dim, bias too), exact erf-gelu, w2 [160,40] row-parallel "
      "(sharded on the contracting dim) -> one all-reduce of the [24,40] partial sums. "
      "x and y replicated.",
      (8,), ("model",), rtol=1e-4, atol=1e-5)
def _tp_mlp(c):
    c.arg("x", (24, 40), "f32", P(None, None))
    c.arg("w1", (40, 160), "f32", P(None, "model"), scale=0.15)
    c.arg("b1", (160,), "f32", P("model"), scale=0.1)
    c.arg("w2", (160, 40), "f32", P("model", None), scale=0.08)
    c.arg("b2", (40,), "f32", P(None), scale=0.1)
    c.out("y", P(None, None))

    def f(x, w1, b1, w2, b2):
        h = jax.nn.gelu(x @ w1 + b1, approximate=False)
        return (h @ w2 + b2,)
    return f


@case("dp_mlp_3layer",
      "Data-parallel 3-layer MLP (relu, tanh, linear): x [32,20] batch-sharded 8-way over "
      "'batch', all weights/biases replicated; output batch-sharded. No communication.",
      (8,), ("batch",))
def _dp_mlp(c):
    c.arg("x", (32, 20), "f32", P("batch", None))
    c.arg("w1", (20, 48), "f32", P(None, None), scale=0.22)
    c.arg("b1", (48,), "f32", P(None), scale=0.1)
    c.arg("w2", (48, 48), "f32", P(None, None), scale=0.14)
    c.arg("b2", (48,), "f32", P(None), scale=0.1)
    c.arg("w3", (48, 10), "f32", P(None, None), scale=0.14)
    c.arg("b3", (10,), "f32", P(None), scale=0.1)
    c.out("y", P("batch", None))

    def f(x, w1, b1, w2, b2, w3, b3):
        h = jax.nn.relu(x @ w1 + b1)
        h = jnp.tanh(h @ w2 + b2)
        return (h @ w3 + b3,)
    return f


@case("fsdp_mlp_zero3",
      "FSDP / ZeRO-3 MLP on an 8-way 'fsdp' axis: batch sharded, w1 [32,64] stored sharded on "
      "its output dim and w2 [64,32] on its input dim, b1 sharded; each is all-gathered by "
      "with_sharding_constraint(replicated) right before use. Output batch-sharded.",
      (8,), ("fsdp",))
def _fsdp(c):
    c.arg("x", (16, 32), "f32", P("fsdp", None))
    c.arg("w1", (32, 64), "f32", P(None, "fsdp"), scale=0.18)
    c.arg("b1", (64,), "f32", P("fsdp"), scale=0.1)
    c.arg("w2", (64, 32), "f32", P("fsdp", None), scale=0.12)
    c.out("y", P("fsdp", None))

    def f(x, w1, b1, w2):
        w1g = wsc(w1, P(None, None))
        b1g = wsc(b1, P(None))
        w2g = wsc(w2, P(None, None))
        h = jax.nn.silu(x @ w1g + b1g)
        return (h @ w2g,)
    return f


@case("deep_mlp_6_alternating",
      "6-layer MLP on a 2x4 (data, model) mesh: batch on 'data', layers alternate "
      "column-parallel [32,64] (out dim on 'model') and row-parallel [64,32] (in dim on "
      "'model'), residual adds -> 3 all-reduces in a dependent chain.",
      (2, 4), ("data", "model"), rtol=1e-4, atol=1e-5)
def _deep_mlp(c):
    c.arg("x", (8, 32), "f32", P("data", None))
    for i in range(3):
        c.arg("wa%d" % i, (32, 64), "f32", P(None, "model"), scale=0.18)
        c.arg("wb%d" % i, (64, 32), "f32", P("model", None), scale=0.12)
    c.out("y", P("data", None))

    def f(x, wa0, wb0, wa1, wb1, wa2, wb2):
        h = x
        for wa, wb in ((wa0, wb0), (wa1, wb1), (wa2, wb2)):
            h = h + jax.nn.relu(h @ wa) @ wb
        return (h,)
    return f


# --- transformer / training ---------------------------------------------------

@case("transformer_block_2x4_causal",
      "Pre-RMSNorm causal transformer block on a 2x4 (data, model) mesh: batch on 'data', "
      "4 attention heads and the MLP hidden dim (swish) on 'model' (Megatron TP). "
      "B=2, S=8, D=32, H=4, K=8, F=128. Two all-reduces expected (attention out, MLP out).",
      (2, 4), ("data", "model"), rtol=1e-4, atol=1e-4)
def _transformer(c):
    B, S, D, H, K, F = 2, 8, 32, 4, 8, 128
    c.arg("x", (B, S, D), "f32", P("data", None, None))
    c.arg("g1", (D,), "f32", P(None), scale=0.5)
    c.arg("wq", (D, H, K), "f32", P(None, "model", None), scale=0.17)
    c.arg("wk", (D, H, K), "f32", P(None, "model", None), scale=0.17)
    c.arg("wv", (D, H, K), "f32", P(None, "model", None), scale=0.17)
    c.arg("wo", (H, K, D), "f32", P("model", None, None), scale=0.17)
    c.arg("g2", (D,), "f32", P(None), scale=0.5)
    c.arg("w1", (D, F), "f32", P(None, "model"), scale=0.17)
    c.arg("w2", (F, D), "f32", P("model", None), scale=0.09)
    c.out("y", P("data", None, None))

    def rmsnorm(x, g):
        return x * lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * (1.0 + g)

    def f(x, g1, wq, wk, wv, wo, g2, w1, w2):
        h = rmsnorm(x, g1)
        q = jnp.einsum("bsd,dhk->bhsk", h, wq)
        k = jnp.einsum("bsd,dhk->bhsk", h, wk)
        v = jnp.einsum("bsd,dhk->bhsk", h, wv)
        s = jnp.einsum("bhqk,bhsk->bhqs", q, k) * (1.0 / np.sqrt(K))
        mask = jnp.tril(jnp.ones((S, S), dtype=bool))
        s = jnp.where(mask, s, -1e9)
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqs,bhsk->bhqk", p, v)
        x = x + jnp.einsum("bhqk,hkd->bqd", o, wo)
        h = rmsnorm(x, g2)
        x = x + jax.nn.silu(h @ w1) @ w2
        return (x,)
    return f


@case("train_step_dp_momentum",
      "One SGD-with-momentum step (lr=0.05, mu=0.9) of a 2-layer tanh MLP with softmax "
      "cross-entropy against hashed integer labels, data-parallel on an 8-way 'data' axis: "
      "batch sharded, params and velocities replicated -> gradient all-reduces. Outputs: "
      "new w1,b1,w2,b2, new velocities, loss.",
      (8,), ("data",), rtol=1e-4, atol=1e-5)
def _train_step(c):
    c.arg("w1", (12, 24), "f32", P(None, None), scale=0.3)
    c.arg("b1", (24,), "f32", P(None), scale=0.1)
    c.arg("w2", (24, 6), "f32", P(None, None), scale=0.2)
    c.arg("b2", (6,), "f32", P(None), scale=0.1)
    c.arg("v_w1", (12, 24), "f32", P(None, None), scale=0.01)
    c.arg("v_b1", (24,), "f32", P(None), scale=0.01)
    c.arg("v_w2", (24, 6), "f32", P(None, None), scale=0.01)
    c.arg("v_b2", (6,), "f32", P(None), scale=0.01)
    c.arg("x", (64, 12), "f32", P("data", None))
    c.arg("labels", (64,), "s32", P("data"), lo=0, hi=6)
    for n in ("w1", "b1", "w2", "b2", "v_w1", "v_b1", "v_w2", "v_b2"):
        c.out("new_" + n, P(*([None] * (2 if n.endswith(("w1", "w2")) else 1))))
    c.out("loss", P())

    def loss_fn(params, x, labels):
        w1, b1, w2, b2 = params
        h = jnp.tanh(x @ w1 + b1)
        logits = h @ w2 + b2
        logp = jax.nn.log_softmax(logits, axis=-1)
        onehot = jax.nn.one_hot(labels, 6, dtype=jnp.float32)
        return -jnp.mean(jnp.sum(onehot * logp, axis=-1))

    def f(w1, b1, w2, b2, vw1, vb1, vw2, vb2, x, labels):
        params = (w1, b1, w2, b2)
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
        vs = tuple(0.9 * v + g for v, g in zip((vw1, vb1, vw2, vb2), grads))
        new = tuple(p - 0.05 * v for p, v in zip(params, vs))
        return new + vs + (loss,)
    return f


# --- embeddings / losses --------------------------------------------------------

@case("embedding_vocab_sharded_2d_ids",
      "Embedding lookup jnp.take(table, ids, axis=0) with table [128,24] sharded on the vocab "
      "dim over an 8-way 'vocab' axis and a replicated [4,8] s32 id matrix; output [4,8,24] "
      "replicated -> masked local gather + all-reduce.",
      (8,), ("vocab",), rtol=0.0, atol=0.0)
def _embedding(c):
    c.arg("table", (128, 24), "f32", P("vocab", None))
    c.arg("ids", (4, 8), "s32", P(None, None), lo=0, hi=128)
    c.out("emb", P(None, None, None))

    def f(table, ids):
        return (jnp.take(table, ids, axis=0),)
    return f


@case("xent_take_along_2x4",
      "Softmax cross-entropy with logits [8,256] sharded (data, model) on a 2x4 mesh (vocab "
      "4-way): log_softmax over the sharded vocab dim, label log-prob via take_along_axis "
      "(gather), per-example loss (data-sharded), mean loss and an s32 count of correct "
      "argmax predictions (replicated).",
      (2, 4), ("data", "model"), rtol=1e-5, atol=1e-5)
def _xent(c):
    c.arg("logits", (8, 256), "f32", P("data", "model"), scale=3.0)
    c.arg("labels", (8,), "s32", P("data"), lo=0, hi=256)
    c.out("per_example", P("data"))
    c.out("mean", P())
    c.out("num_correct", P())

    def f(logits, labels):
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
        loss = -picked
        correct = jnp.sum((jnp.argmax(logits, axis=-1) == labels).astype(jnp.int32))
        return loss, jnp.mean(loss), correct
    return f


# --- resharding ------------------------------------------------------------------

@case("reshard_rows_to_cols",
      "[16,64] row-sharded 8-way -> (x*2) constrained column-sharded -> output column-sharded "
      "(all-to-all).",
      (8,), ("x",), rtol=0.0, atol=0.0)
def _r2c(c):
    c.arg("x", (16, 64), "f32", P("x", None))
    c.out("y", P(None, "x"))

    def f(x):
        return (wsc(x * 2.0, P(None, "x")),)
    return f


@case("reshard_replicated_to_2d",
      "On a 4x2 (a, b) mesh: replicated [16,16] input -> with_sharding_constraint P('a','b') "
      "-> 2-D tiled output (local dynamic-slice by partition-id, no communication).",
      (4, 2), ("a", "b"), rtol=0.0, atol=0.0)
def _repl2d(c):
    c.arg("x", (16, 16), "f32", P(None, None))
    c.out("y", P("a", "b"))

    def f(x):
        return (wsc(x + 1.0, P("a", "b")),)
    return f


@case("reshard_cols_to_replicated",
      "[8,64] column-sharded 8-way -> replicated via with_sharding_constraint and the "
      "replicated out_sharding (all-gather).",
      (8,), ("x",), rtol=0.0, atol=0.0)
def _c2r(c):
    c.arg("x", (8, 64), "f32", P(None, "x"))
    c.out("y", P(None, None))

    def f(x):
        return (wsc(x - 0.5, P(None, None)),)
    return f


@case("reshard_8way_cols_to_2x4",
      "On a 2x4 (a, b) mesh: [16,32] with dim 1 sharded 8-way over ('a','b') -> 2-D tiling "
      "P('a','b') (dim 0 2-way, dim 1 4-way).",
      (2, 4), ("a", "b"), rtol=0.0, atol=0.0)
def _r8to2x4(c):
    c.arg("x", (16, 32), "f32", P(None, ("a", "b")))
    c.out("y", P("a", "b"))

    def f(x):
        return (wsc(x, P("a", "b")),)
    return f


@case("reshard_2x4_swap_axes",
      "On a 2x4 (a, b) mesh: [16,16] tiled P('a','b') -> P('b','a') (both dims change axis).",
      (2, 4), ("a", "b"), rtol=0.0, atol=0.0)
def _swap(c):
    c.arg("x", (16, 16), "f32", P("a", "b"))
    c.out("y", P("b", "a"))

    def f(x):
        return (wsc(x * 3.0, P("b", "a")),)
    return f


# --- shape ops ---------------------------------------------------------------------

@case("reshape_sharded_3d",
      "Reshapes touching an 8-way sharded dim: (a) merge [16,4,8]->[64,8] with the major dim "
      "sharded (local), (b) merge [2,32,4]->[64,4] with the minor merged dim sharded "
      "(resharding), (c) split [32,6]->[8,4,6] of the sharded dim.",
      (8,), ("x",), rtol=0.0, atol=0.0)
def _reshape(c):
    c.arg("a", (16, 4, 8), "f32", P("x", None, None))
    c.arg("b", (2, 32, 4), "f32", P(None, "x", None))
    c.arg("d", (32, 6), "f32", P("x", None))
    c.out("merge_major", P("x", None))
    c.out("merge_minor_sharded", P("x", None))
    c.out("split", P("x", None, None))

    def f(a, b, d):
        return a.reshape(64, 8), b.reshape(64, 4), d.reshape(8, 4, 6)
    return f


@case("transpose_sharded_3d",
      "Transposes of [8,16,4] sharded 8-way on dim 0: (1,0,2) requested sharded on the new "
      "dim 0 (all-to-all) and (2,1,0) requested sharded on the dim the sharding moved to "
      "(local).",
      (8,), ("x",), rtol=0.0, atol=0.0)
def _transpose(c):
    c.arg("x", (8, 16, 4), "f32", P("x", None, None))
    c.out("t102_resharded", P("x", None, None))
    c.out("t210_local", P(None, None, "x"))

    def f(x):
        return jnp.transpose(x, (1, 0, 2)), jnp.transpose(x, (2, 1, 0))
    return f


@case("concat_sharded_2d",
      "On a 4x2 (a, b) mesh with 2-D tiled operands: concatenate [16,8] ++ [8,8] along the "
      "'a'-sharded dim 0 -> [24,8], and [16,8] ++ 2*[16,8] along the 'b'-sharded dim 1 -> "
      "[16,16]; outputs tiled P('a','b').",
      (4, 2), ("a", "b"), rtol=0.0, atol=0.0)
def _concat(c):
    c.arg("p", (16, 8), "f32", P("a", "b"))
    c.arg("q", (8, 8), "f32", P("a", "b"))
    c.out("concat_dim0", P("a", "b"))
    c.out("concat_dim1", P("a", "b"))

    def f(p, q):
        return jnp.concatenate([p, q], axis=0), jnp.concatenate([p, 2.0 * p], axis=1)
    return f


@case("pad_slice_sharded_cols",
      "Along dim 1 of [8,64] sharded 8-way: jnp.pad cols (2,6) -> [8,72]; slice x[:,4:60] -> "
      "[8,56]; strided x[:,::4] -> [8,16]; lax.pad with interior 1 and high 1 -> [8,128]; "
      "all outputs sharded on dim 1.",
      (8,), ("x",), rtol=0.0, atol=0.0)
def _pad_slice(c):
    c.arg("x", (8, 64), "f32", P(None, "x"))
    for n in ("pad", "slice", "strided_slice", "interior_pad"):
        c.out(n, P(None, "x"))

    def f(x):
        return (jnp.pad(x, ((0, 0), (2, 6))), x[:, 4:60], x[:, ::4],
                lax.pad(x, jnp.float32(-1.0), [(0, 0, 0), (0, 1, 1)]))
    return f


@case("dynamic_slice_update_2d",
      "lax.dynamic_slice / dynamic_update_slice on x [32,16] tiled P('a','b') on a 4x2 mesh "
      "with runtime s32 starts i=10 (dim 0), j=6 (dim 1): an [8,4] window (replicated out) "
      "and an update of a replicated [8,4] block (tiled out).",
      (4, 2), ("a", "b"), rtol=0.0, atol=0.0)
def _dus(c):
    c.arg("x", (32, 16), "f32", P("a", "b"))
    c.arg("upd", (8, 4), "f32", P(None, None))
    c.arg("i", (), "s32", P(), value=10)
    c.arg("j", (), "s32", P(), value=6)
    c.out("window", P(None, None))
    c.out("updated", P("a", "b"))

    def f(x, upd, i, j):
        return (lax.dynamic_slice(x, (i, j), (8, 4)),
                lax.dynamic_update_slice(x, upd, (i, j)))
    return f


# --- convolutions / windows ------------------------------------------------------------

@case("conv2d_batch_sharded_stride2",
      "conv2d NHWC/HWIO 3x3, stride 2, SAME padding + bias + relu on x [16,12,12,3] with the "
      "batch dim sharded 8-way; weights replicated; no communication.",
      (8,), ("data",), rtol=1e-5, atol=1e-5)
def _conv_batch(c):
    c.arg("x", (16, 12, 12, 3), "f32", P("data", None, None, None))
    c.arg("w", (3, 3, 3, 8), "f32", P(None, None, None, None), scale=0.2)
    c.arg("b", (8,), "f32", P(None), scale=0.1)
    c.out("y", P("data", None, None, None))

    def f(x, w, b):
        y = lax.conv_general_dilated(x, w, (2, 2), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (jax.nn.relu(y + b),)
    return f


@case("conv2d_width_sharded",
      "Two stacked convs on x [2,8,32,4] (NHWC) sharded 8-way on width (4 cols per shard): "
      "3x3 SAME then 1x5 SAME (halo of 2) -> halo exchange (collective-permute) per conv.",
      (8,), ("w",), rtol=1e-5, atol=1e-5)
def _conv_spatial(c):
    c.arg("x", (2, 8, 32, 4), "f32", P(None, None, "w", None))
    c.arg("k1", (3, 3, 4, 4), "f32", P(None, None, None, None), scale=0.2)
    c.arg("k2", (1, 5, 4, 4), "f32", P(None, None, None, None), scale=0.2)
    c.out("y", P(None, None, "w", None))

    def f(x, k1, k2):
        dn = ("NHWC", "HWIO", "NHWC")
        y = jnp.tanh(lax.conv_general_dilated(x, k1, (1, 1), "SAME", dimension_numbers=dn))
        y = lax.conv_general_dilated(y, k2, (1, 1), "SAME", dimension_numbers=dn)
        return (y,)
    return f


@case("cumsum_window_cols",
      "Along dim 1 of [4,64] sharded 8-way: jnp.cumsum (reduce-window with 63 low padding on "
      "CPU), lax.cummax of 1.5*x, a centred 3-wide running mean via lax.reduce_window (SAME), and a "
      "window-4 stride-4 VALID max (-> [4,16]).",
      (8,), ("x",), rtol=1e-5, atol=1e-5)
def _cumsum(c):
    c.arg("x", (4, 64), "f32", P(None, "x"))
    c.out("cumsum", P(None, "x"))
    c.out("cummax", P(None, "x"))
    c.out("mean3", P(None, "x"))
    c.out("max4_stride4", P(None, "x"))

    def f(x):
        cs = jnp.cumsum(x, axis=1)
        # cummax gets its own operand: with the cumsum on the same operand, XLA's
        # partitioner (jax 0.10.2) reuses the zero-padded all-gathered operand for
        # the max window too and gets x[r,0] < 0 wrong.
        cm = lax.cummax(x * 1.5, axis=1)
        s3 = lax.reduce_window(x, 0.0, lax.add, (1, 3), (1, 1), "SAME") / 3.0
        m4 = lax.reduce_window(x, -jnp.inf, lax.max, (1, 4), (1, 4), "VALID")
        return cs, cm, s3, m4
    return f


# --- FFT / complex --------------------------------------------------------------------

@case("fft2_spectral_filter_batch",
      "Spectral filter: x [8,6,8] f32 batch-sharded 8-way; rfft2 over the last two dims "
      "(c64 [8,6,5]), multiplied by a complex filter built from two replicated f32 [6,5] "
      "weights (complex(a, b)), irfft2 back to f32 [8,6,8]; also |X| summed over the batch "
      "(an all-reduce of f32 magnitudes). Batch-parallel transforms need no communication.",
      (8,), ("batch",), rtol=1e-4, atol=1e-4)
def _fft2_filter(c):
    c.arg("x", (8, 6, 8), "f32", P("batch", None, None))
    c.arg("a", (6, 5), "f32", P(None, None))
    c.arg("b", (6, 5), "f32", P(None, None), scale=0.5)
    c.out("y", P("batch", None, None))
    c.out("mag", P(None, None))

    def f(x, a, b):
        spec = jnp.fft.rfft2(x)
        filt = lax.complex(a, b)
        y = jnp.fft.irfft2(spec * filt, s=(6, 8))
        return y, jnp.sum(jnp.abs(spec), axis=0)
    return f


@case("fft_along_sharded_dim_2x4",
      "x [4,16] f32 on a 2x4 mesh, sharded ('data', 'model'): a complex fft along the "
      "sharded dim 1 (the transform needs the whole row), the c64 spectrum times its "
      "conjugate's imag flipped (x*conj via complex(real, -imag)), an ifft back and the "
      "c64 result kept ('data', 'model'); the real part also returned.",
      (2, 4), ("data", "model"), rtol=1e-4, atol=1e-4)
def _fft_sharded(c):
    c.arg("x", (4, 16), "f32", P("data", "model"))
    c.out("z", P("data", "model"))
    c.out("re", P("data", "model"))

    def f(x):
        spec = jnp.fft.fft(x.astype(jnp.complex64), axis=1)
        power = spec * lax.complex(jnp.real(spec), -jnp.imag(spec))
        z = jnp.fft.ifft(power * 0.125, axis=1)
        return z, jnp.real(z) + jnp.imag(z)
    return f


# --- sort / reductions -----------------------------------------------------------------

@case("sort_argmin_sharded_dim",
      "x [32,16] sharded 8-way on dim 0: jnp.sort along the sharded dim 0, jnp.argsort along "
      "dim 1 (variadic sort with iota), jnp.argmin along the sharded dim 0 (variadic "
      "value/index reduce across shards), jnp.min along dim 1. s32 outputs are exact.",
      (8,), ("x",), rtol=0.0, atol=0.0)
def _sort(c):
    c.arg("x", (32, 16), "f32", P("x", None))
    c.out("sort0", P("x", None))
    c.out("argsort1", P("x", None))
    c.out("argmin0", P(None))
    c.out("min1", P("x"))

    def f(x):
        return (jnp.sort(x, axis=0), jnp.argsort(x, axis=1).astype(jnp.int32),
                jnp.argmin(x, axis=0).astype(jnp.int32), jnp.min(x, axis=1))
    return f


# --- control flow -----------------------------------------------------------------------

@case("scan_layers_while",
      "lax.scan over 3 stacked layers (-> HLO while) on a 2x4 (data, model) mesh: carry h "
      "[8,32] sharded on 'data' (constrained in the body), stacked weights [3,32,32] sharded "
      "on the contracting (input) dim over 'model' -> partial dot + all-reduce in the loop "
      "body; per-layer mean |h| as stacked ys.",
      (2, 4), ("data", "model"), rtol=1e-4, atol=1e-5)
def _scan(c):
    c.arg("h", (8, 32), "f32", P("data", None))
    c.arg("ws", (3, 32, 32), "f32", P(None, "model", None), scale=0.3)
    c.arg("bs", (3, 32), "f32", P(None, None), scale=0.1)
    c.out("h_final", P("data", None))
    c.out("layer_means", P(None))

    def f(h, ws, bs):
        def body(h, wb):
            w, b = wb
            h = wsc(jnp.tanh(h @ w + b) + 0.5 * h, P("data", None))
            return h, jnp.mean(jnp.abs(h))
        h, ys = lax.scan(body, h, (ws, bs))
        return h, ys
    return f


@case("cond_switch_2x4",
      "lax.cond on a runtime s32 predicate (p=0 -> false branch) and lax.switch with 3 "
      "branches (k=1) on x [16,16] tiled P('a','b') over a 2x4 mesh; branches use a dot with "
      "a replicated w, sin/cos and a transpose -> HLO conditionals with sharded branches.",
      (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _cond(c):
    c.arg("x", (16, 16), "f32", P("a", "b"))
    c.arg("w", (16, 16), "f32", P(None, None), scale=0.25)
    c.arg("p", (), "s32", P(), value=0)
    c.arg("k", (), "s32", P(), value=1)
    c.out("cond", P("a", "b"))
    c.out("switch", P("a", "b"))

    def f(x, w, p, k):
        y1 = lax.cond(p > 0, lambda x: x @ w, lambda x: x * 2.0 + 1.0, x)
        y2 = lax.switch(k, [lambda x: jnp.sin(x),
                            lambda x: jnp.cos(x) @ w,
                            lambda x: x.T - x], x)
        return y1, y2
    return f


# --- shard_map (manual collectives) -------------------------------------------------------

@case("shard_map_psum_ppermute",
      "jax.shard_map on an 8-way 'i' axis: a [16,64] column-sharded times b [64,8] "
      "row-sharded locally, lax.psum over 'i' (all-reduce) -> replicated; lax.ppermute of "
      "the a shards by +3 (collective-permute); lax.pmax of per-shard maxima.",
      (8,), ("i",), rtol=1e-5, atol=1e-5, manual=True)
def _sm1(c):
    c.arg("a", (16, 64), "f32", P(None, "i"))
    c.arg("b", (64, 8), "f32", P("i", None), scale=0.25)
    c.out("psum_matmul", P(None, None))
    c.out("shifted", P(None, "i"))
    c.out("global_max", P(None))

    def local(a, b):
        y = lax.psum(a @ b, "i")
        shifted = lax.ppermute(a, "i", [(s, (s + 3) % 8) for s in range(8)])
        m = lax.pmax(jnp.max(a, keepdims=True)[0], "i")
        return y, shifted, m

    def f(a, b):
        return smap(local, (P(None, "i"), P("i", None)),
                    (P(None, None), P(None, "i"), P(None)))(a, b)
    return f


@case("shard_map_allgather_psum_scatter",
      "jax.shard_map on a 2x4 (dp, tp) mesh: x [8,32] tiled P('dp','tp'); tiled all_gather "
      "over 'tp' along dim 1 (to='invarying'), then psum_scatter (reduce-scatter) over 'tp' "
      "along dim 1 of x_full * sum(x_local); also an untiled all_gather over 'dp' (stacks a new dim).",
      (2, 4), ("dp", "tp"), rtol=1e-5, atol=1e-5, manual=True)
def _sm2(c):
    c.arg("x", (8, 32), "f32", P("dp", "tp"))
    c.out("gathered_tp", P("dp", None))
    c.out("scattered", P("dp", "tp"))
    c.out("stacked_dp", P(None, None, "tp"))

    def local(x):
        full = lax.all_gather(x, "tp", axis=1, tiled=True, to="invarying")
        rs = lax.psum_scatter(full * x.sum(), "tp", scatter_dimension=1, tiled=True)
        st = lax.all_gather(x, "dp", axis=0, tiled=False, to="invarying")
        return full, rs, st

    def f(x):
        return smap(local, (P("dp", "tp"),),
                    (P("dp", None), P("dp", "tp"), P(None, None, "tp")))(x)
    return f


@case("shard_map_all_to_all_axis_index",
      "jax.shard_map on a 4x2 (a, b) mesh: x [16,32] tiled P('a','b') (local [4,16]); "
      "lax.all_to_all over 'a' splitting dim 1 and concatenating dim 0 (-> [16,4] local, "
      "out spec P(None, ('b','a'))); lax.axis_index('a') scaling; psum over both axes.",
      (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5, manual=True)
def _sm3(c):
    c.arg("x", (16, 32), "f32", P("a", "b"))
    c.out("all_to_all", P(None, ("b", "a")))
    c.out("scaled", P("a", "b"))
    c.out("total", P(None))

    def local(x):
        t = lax.all_to_all(x, "a", 1, 0, tiled=True)
        idx = lax.axis_index("a").astype(jnp.float32)
        tot = lax.psum(jnp.sum(x, keepdims=True)[0], ("a", "b"))
        return t, x * (idx + 1.0), tot

    def f(x):
        return smap(local, (P("a", "b"),),
                    (P(None, ("b", "a")), P("a", "b"), P(None)))(x)
    return f


# --- uneven / dot patterns ---------------------------------------------------------------

@case("uneven_sharding_slices",
      "Uneven (padded) shardings inside the program on an 8-way mesh: x [24,10] evenly "
      "row-sharded (3 rows/shard); x[2:22]*2 (20 rows) constrained 8-way (shards of 3, last "
      "shard mostly padding) then summed over rows; x[:, :7] constrained column-sharded 8-way "
      "(7 cols over 8 shards) then max-reduced per row. Outputs replicated.",
      (8,), ("x",), rtol=1e-5, atol=1e-5)
def _uneven(c):
    c.arg("x", (24, 10), "f32", P("x", None))
    c.out("sliced_scaled", P(None, None))
    c.out("colsum", P(None))
    c.out("rowmax", P(None))

    def f(x):
        s = wsc(x[2:22] * 2.0, P("x", None))
        e = wsc(jnp.exp(x[:, :7]), P(None, "x"))
        return wsc(s, P(None, None)), jnp.sum(s, axis=0), jnp.max(e, axis=1)
    return f


@case("dot_reduce_scatter_2x4",
      "dot [16,64]x[64,32] on a 2x4 (a, b) mesh with the contracting dim sharded 4-way over "
      "'b' on both operands (replicated over 'a') and the result requested sharded on dim 0 "
      "over 'b' -> partial dot + all-reduce + dynamic-slice(partition-id) (GSPMD does not "
      "form reduce-scatter itself).",
      (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _dot_rs(c):
    c.arg("a", (16, 64), "f32", P(None, "b"))
    c.arg("b", (64, 32), "f32", P("b", None), scale=0.125)
    c.out("c", P("b", None))

    def f(a, b):
        return (a @ b,)
    return f


@case("bf16_matmul_f32_accum",
      "bf16 x bf16 dot on a 2x4 (a, b) mesh: a [16,64] tiled P('a','b'), b [64,32] sharded on "
      "the contracting dim over 'b'; (1) preferred_element_type=f32 (f32 partial sums and "
      "all-reduce), (2) plain bf16 result (bf16 all-reduce), (3) bf16 elementwise a*a+1. bf16 "
      "args/outputs stored in .npy as exactly-widened float32.",
      (2, 4), ("a", "b"), rtol=1e-2, atol=1e-2)
def _bf16(c):
    c.arg("a", (16, 64), "bf16", P("a", "b"))
    c.arg("b", (64, 32), "bf16", P("b", None), scale=0.125)
    c.out("f32_acc", P("a", None))
    c.out("bf16_dot", P("a", None))
    c.out("bf16_elementwise", P("a", "b"))

    def f(a, b):
        return (jnp.dot(a, b, preferred_element_type=jnp.float32), jnp.dot(a, b),
                a * a + jnp.bfloat16(1.0))
    return f


# --- elementwise ------------------------------------------------------------------------

@case("elementwise_math_2x4",
      "Float elementwise coverage on [16,32] tiled P('a','b') over a 2x4 mesh: exp, log1p, "
      "tanh, erf, logistic, pow, atan2, rem, round-half-even, round-away, clamp, expm1, sqrt, "
      "cbrt, sign, floor, ceil, sin, cos, min/max, select, erf_inv, divide, integer_pow, "
      "f32->s32 convert and is_finite(log(a)) (pred). No communication.",
      (2, 4), ("a", "b"), rtol=1e-5, atol=1e-6)
def _elem(c):
    c.arg("a", (16, 32), "f32", P("a", "b"), scale=3.0)
    c.arg("b", (16, 32), "f32", P("a", "b"), scale=3.0)
    ops = [
        ("exp", lambda a, b: jnp.exp(a)),
        ("log1p_abs", lambda a, b: jnp.log1p(jnp.abs(a))),
        ("tanh", lambda a, b: jnp.tanh(a)),
        ("erf", lambda a, b: lax.erf(a)),
        ("logistic", lambda a, b: jax.nn.sigmoid(a)),
        ("pow", lambda a, b: jnp.power(jnp.abs(a) + 0.5, b)),
        ("atan2", lambda a, b: jnp.arctan2(a, b)),
        ("rem", lambda a, b: lax.rem(a, jnp.abs(b) + 0.25)),
        ("round_even", lambda a, b: jnp.round(a * 2.0)),
        ("round_away", lambda a, b: lax.round(a * 2.0, lax.RoundingMethod.AWAY_FROM_ZERO)),
        ("clamp", lambda a, b: jnp.clip(a, -0.5, 0.7)),
        ("expm1", lambda a, b: jnp.expm1(a * 0.5)),
        ("sqrt_abs", lambda a, b: jnp.sqrt(jnp.abs(a))),
        ("cbrt", lambda a, b: jnp.cbrt(a)),
        ("sign", lambda a, b: jnp.sign(a)),
        ("floor", lambda a, b: jnp.floor(a)),
        ("ceil", lambda a, b: jnp.ceil(a)),
        ("sin", lambda a, b: jnp.sin(a)),
        ("cos", lambda a, b: jnp.cos(a)),
        ("maximum", lambda a, b: jnp.maximum(a, b)),
        ("minimum", lambda a, b: jnp.minimum(a, b)),
        ("select_gt", lambda a, b: jnp.where(a > b, a * b, a - b)),
        ("erf_inv", lambda a, b: lax.erf_inv(a / 3.5)),
        ("div", lambda a, b: a / (jnp.abs(b) + 0.5)),
        ("integer_pow3", lambda a, b: a ** 3),
        ("to_s32", lambda a, b: (a * 10.0).astype(jnp.int32)),
        ("is_finite_log", lambda a, b: jnp.isfinite(jnp.log(a))),
    ]
    for n, _ in ops:
        c.out(n, P("a", "b"))

    def f(a, b):
        return tuple(fn(a, b) for _, fn in ops)
    return f


@case("integer_bool_ops_4x2",
      "Integer / bool coverage on [16,16] s32 tiled P('a','b') over a 4x2 mesh: add, mul "
      "(wrapping), floor_divide, trunc div/rem, jnp.mod, shifts, and/or/xor/not, abs, neg, "
      "min/max, popcount, clz, all 6 comparisons (pred outputs), u32 multiply wrap, s32->u8 "
      "convert, plus reductions over the sharded dims: s32 sum over dim 0, any/all (pred "
      "or/and all-reduce) over dim 1, count of i>j. All outputs exact.",
      (4, 2), ("a", "b"), rtol=0.0, atol=0.0)
def _ints(c):
    c.arg("i", (16, 16), "s32", P("a", "b"), lo=-1000, hi=1000)
    c.arg("j", (16, 16), "s32", P("a", "b"), lo=1, hi=50)
    c.arg("u", (16, 16), "u32", P("a", "b"), lo=0, hi=4000000000)
    ops = [
        ("add", lambda i, j, u: i + j),
        ("mul", lambda i, j, u: i * j * 99991),
        ("floor_divide", lambda i, j, u: jnp.floor_divide(i, j)),
        ("trunc_div", lambda i, j, u: lax.div(i, j)),
        ("trunc_rem", lambda i, j, u: lax.rem(i, j)),
        ("mod", lambda i, j, u: jnp.mod(i, j)),
        ("shl", lambda i, j, u: lax.shift_left(i, j % 16)),
        ("shr_arith", lambda i, j, u: lax.shift_right_arithmetic(i, j % 8)),
        ("shr_logical", lambda i, j, u: lax.shift_right_logical(i, j % 8)),
        ("and_or_xor", lambda i, j, u: (i & j) | (i ^ (j << 3))),
        ("not", lambda i, j, u: ~i),
        ("abs_neg", lambda i, j, u: jnp.abs(i) - (-j)),
        ("min_max", lambda i, j, u: jnp.maximum(i, j * 10) - jnp.minimum(i, -j)),
        ("popcount", lambda i, j, u: lax.population_count(i)),
        ("clz", lambda i, j, u: lax.clz(i)),
        ("eq", lambda i, j, u: (i % 7) == (j % 7)),
        ("ne", lambda i, j, u: i != j),
        ("lt", lambda i, j, u: i < j),
        ("le", lambda i, j, u: i <= -j),
        ("gt", lambda i, j, u: i > j * 5),
        ("ge", lambda i, j, u: i >= 0),
        ("u32_mul_wrap", lambda i, j, u: u * jnp.uint32(2654435761) + jnp.uint32(7)),
        ("u32_shr_cmp", lambda i, j, u: (u >> jnp.uint32(20)) < jnp.uint32(2000)),
        ("to_u8", lambda i, j, u: i.astype(jnp.uint8)),
        ("logical_mix", lambda i, j, u: jnp.logical_xor(i > 0, jnp.logical_and(j > 25, i < 500))),
    ]
    for n, _ in ops:
        c.out(n, P("a", "b"))
    c.out("sum_dim0", P("b"))
    c.out("any_dim1", P("a"))
    c.out("all_dim1", P("a"))
    c.out("count_gt", P())

    def f(i, j, u):
        outs = tuple(fn(i, j, u) for _, fn in ops)
        red = (jnp.sum(i, axis=0), jnp.any(i > 900, axis=1), jnp.all(i > -900, axis=1),
               jnp.sum((i > j).astype(jnp.int32)))
        return outs + red
    return f


# --- 3-D mesh ---------------------------------------------------------------------------

@case("mesh3d_matmul_xyz",
      "dot on a 2x2x2 (x, y, z) mesh: a [8,16] P('x','y'), b [16,8] P('y','z') -> c P('x','z'): "
      "contracting dim sharded over 'y' -> all-reduce over 'y'.",
      (2, 2, 2), ("x", "y", "z"), rtol=1e-5, atol=1e-5)
def _m3_matmul(c):
    c.arg("a", (8, 16), "f32", P("x", "y"))
    c.arg("b", (16, 8), "f32", P("y", "z"), scale=0.25)
    c.out("c", P("x", "z"))

    def f(a, b):
        return (a @ b,)
    return f


@case("mesh3d_mlp_dp_fsdp_tp",
      "MLP on a 2x2x2 (dp, fsdp, tp) mesh: batch on 'dp'; w1 [16,32] stored P('fsdp','tp') and "
      "all-gathered over 'fsdp' to P(None,'tp') (column-parallel); w2 [32,16] stored "
      "P('tp','fsdp') and gathered to P('tp',None) (row-parallel) -> all-gathers over 'fsdp' "
      "and an all-reduce over 'tp'.",
      (2, 2, 2), ("dp", "fsdp", "tp"), rtol=1e-4, atol=1e-5)
def _m3_mlp(c):
    c.arg("x", (8, 16), "f32", P("dp", None))
    c.arg("w1", (16, 32), "f32", P("fsdp", "tp"), scale=0.25)
    c.arg("w2", (32, 16), "f32", P("tp", "fsdp"), scale=0.18)
    c.out("y", P("dp", None))

    def f(x, w1, w2):
        h = jax.nn.gelu(x @ wsc(w1, P(None, "tp")), approximate=True)
        return (h @ wsc(w2, P("tp", None)),)
    return f


@case("mesh3d_reshard_rotate_axes",
      "On a 2x2x2 (x, y, z) mesh: [8,8,4] tiled P('x','y','z') -> P('z','x','y') (every dim "
      "changes axis) and -> P(('x','y','z'), None, None) (8-way on dim 0).",
      (2, 2, 2), ("x", "y", "z"), rtol=0.0, atol=0.0)
def _m3_reshard(c):
    c.arg("t", (8, 8, 4), "f32", P("x", "y", "z"))
    c.out("rotated", P("z", "x", "y"))
    c.out("dim0_8way", P(("x", "y", "z"), None, None))

    def f(t):
        return wsc(t + 1.0, P("z", "x", "y")), wsc(t * 0.5, P(("x", "y", "z"), None, None))
    return f



# --- second set: the same kinds with other meshes, shapes, dtypes and ops ---------------
# (written to check the pipeline on cases it was not developed against)

@case("tp_mlp_4x2_gelu_odd_dims", "Megatron MLP (gelu) on a 4x2 (d, m) mesh with odd sizes: x [12,20] batch on d, w1 [20,30] columns on m, w2 [30,20] rows on m", (4, 2), ("d", "m"), rtol=1e-4, atol=1e-5)
def _a(c):
    c.arg("x", (12, 20), "f32", P("d", None))
    c.arg("w1", (20, 30), "f32", P(None, "m"), scale=0.2)
    c.arg("w2", (30, 20), "f32", P("m", None), scale=0.1)
    c.out("y", P("d", None))
    def f(x, w1, w2):
        return (jax.nn.gelu(x @ w1) @ w2,)
    return f


@case("bf16_dot_contracting_sharded_2x4", "bf16 dot contracting-sharded", (2, 4), ("a", "b"), rtol=2e-2, atol=2e-2)
def _c(c):
    c.arg("x", (16, 64), "bf16", P("a", "b"))
    c.arg("w", (64, 24), "bf16", P("b", None), scale=0.2)
    c.out("y", P("a", None))
    def f(x, w):
        return (jnp.dot(x, w, preferred_element_type=jnp.float32),)
    return f


@case("reductions_mesh3d", "reductions over sharded dims", (2, 2, 2), ("a", "b", "c"), rtol=1e-5, atol=1e-5)
def _d(c):
    c.arg("x", (6, 10, 8), "f32", P("a", "b", "c"))
    c.out("s", P(None))
    c.out("m", P("a"))
    c.out("mean", P())
    def f(x):
        return jnp.sum(x, axis=(0, 2)), jnp.max(x, axis=(1, 2)), jnp.mean(x)
    return f


@case("integer_div_rem_any_count", "integer and bool ops", (8,), ("x",), rtol=0, atol=0)
def _e(c):
    c.arg("a", (24, 6), "s32", P("x", None), lo=-50, hi=50)
    c.arg("b", (24, 6), "s32", P(None, None), lo=1, hi=9)
    c.out("q", P("x", None))
    c.out("any", P(None))
    c.out("cnt", P())
    def f(a, b):
        q = (a // b) * (a % b)
        return q, jnp.any(a > 40, axis=0), jnp.sum((a & 3) == 1).astype(jnp.int32)
    return f


@case("transpose_then_reshape_4x2", "transpose + reshape sharded", (4, 2), ("a", "b"), rtol=0, atol=0)
def _f(c):
    c.arg("x", (8, 6, 4), "f32", P("a", None, "b"))
    c.out("y", P(None, "a"))
    def f(x):
        y = jnp.transpose(x, (1, 0, 2)).reshape(6, 32)
        return (wsc(y, P(None, "a")),)
    return f


@case("embedding_take_2x4", "embedding lookup vocab sharded", (2, 4), ("d", "v"), rtol=0, atol=0)
def _h(c):
    c.arg("table", (40, 12), "f32", P("v", None))
    c.arg("ids", (6, 5), "s32", P("d", None), lo=0, hi=40)
    c.out("e", P("d", None, None))
    def f(table, ids):
        return (jnp.take(table, ids, axis=0),)
    return f


@case("scan_rnn_batch_sharded", "scan with sharded carry", (8,), ("b",), rtol=1e-4, atol=1e-5)
def _i(c):
    c.arg("h0", (16, 8), "f32", P("b", None))
    c.arg("xs", (5, 16, 8), "f32", P(None, "b", None))
    c.arg("w", (8, 8), "f32", P(None, None), scale=0.3)
    c.out("h", P("b", None))
    c.out("ys", P(None, "b", None))
    def f(h0, xs, w):
        def step(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h * 2.0
        return lax.scan(step, h0, xs)
    return f


@case("attention_heads_4x2_late_gather", "attention heads sharded on 4x2", (4, 2), ("d", "m"), rtol=1e-4, atol=1e-5)
def _j(c):
    c.arg("q", (4, 2, 6, 8), "f32", P("d", "m", None, None))
    c.arg("k", (4, 2, 6, 8), "f32", P("d", "m", None, None))
    c.arg("v", (4, 2, 6, 8), "f32", P("d", "m", None, None))
    c.out("o", P("d", None, None, None))
    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 3.0
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqk,bhkd->bhqd", p, v)
        return (wsc(o, P("d", None, None, None)),)
    return f


@case("top_k_and_sort_4x2", "top_k on sharded batch, sort along sharded dim", (4, 2), ("a", "b"), rtol=0, atol=0)
def _m(c):
    c.arg("x", (8, 20), "f32", P("a", "b"))
    c.out("vals", P("a", None))
    c.out("idx", P("a", None))
    c.out("srt", P("a", "b"))
    def f(x):
        v, i = lax.top_k(x, 3)
        return v, i.astype(jnp.int32), jnp.sort(x, axis=1)
    return f


@case("concat_pad_strided_slice_uneven", "concat, pad, slice with uneven (via constraints)", (8,), ("x",), rtol=0, atol=0)
def _g(c):
    c.arg("x", (10, 16), "f32", P(None, "x"))
    c.arg("y", (10, 8), "f32", P(None, "x"))
    c.out("z", P(None, None))
    c.out("s", P(None, None))
    def f(x, y):
        z = jnp.concatenate([x[:, :9], y[:, :5]], axis=1)
        z = wsc(z, P(None, "x"))
        z = jnp.pad(z, ((0, 0), (2, 3)))
        z = wsc(z, P(None, "x"))
        return z, wsc(z[:, 3:17:2], P(None, "x"))
    return f


@case("cumsum_rows_uneven", "cumsum along sharded uneven dim", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _l(c):
    c.arg("x", (32, 3), "f32", P("x", None))
    c.out("c", P(None, None))
    def f(x):
        y = wsc(x[:30] * 1.5, P("x", None))
        return (wsc(jnp.cumsum(y, axis=0), P("x", None)),)
    return f


@case("conv2d_height_sharded_uneven", "conv with H sharded 8-way, uneven", (8,), ("h",), rtol=1e-5, atol=1e-5)
def _n(c):
    c.arg("x", (1, 24, 6, 3), "f32", P(None, "h", None, None))
    c.arg("k", (3, 3, 3, 4), "f32", P(None, None, None, None), scale=0.2)
    c.out("y", P(None, None, None, None))
    def f(x, k):
        x = wsc(x[:, :20], P(None, "h", None, None))
        y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return (wsc(y, P(None, "h", None, None)),)
    return f


@case("train_step_fsdp_sgd", "FSDP train step with grads", (8,), ("f",), rtol=1e-4, atol=1e-5)
def _o(c):
    c.arg("x", (16, 16), "f32", P("f", None))
    c.arg("t", (16, 4), "f32", P("f", None))
    c.arg("w", (16, 4), "f32", P("f", None), scale=0.3)
    c.out("w_new", P("f", None))
    c.out("loss", P())
    def f(x, t, w):
        def loss(w):
            return jnp.mean((x @ wsc(w, P(None, None)) - t) ** 2)
        l, gw = jax.value_and_grad(loss)(w)
        return w - 0.1 * wsc(gw, P("f", None)), l
    return f


@case("dynamic_slice_update_uneven_4x2", "dynamic slice/update on uneven 4x2", (4, 2), ("a", "b"), rtol=0, atol=0)
def _p(c):
    c.arg("x", (16, 8), "f32", P("a", "b"))
    c.arg("u", (3, 3), "f32", P(None, None))
    c.arg("i", (), "s32", P(), value=5)
    c.out("w", P(None, None))
    c.out("x2", P(None, None))
    def f(x, u, i):
        x = wsc(x[:14, :7], P("a", "b"))
        return lax.dynamic_slice(x, (i, i - 3), (4, 3)), wsc(lax.dynamic_update_slice(x, u, (i, 2)), P("a", "b"))
    return f


@case("fori_loop_with_cond_2x4", "fori_loop with cond inside, sharded", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q(c):
    c.arg("x", (8, 8), "f32", P("a", "b"))
    c.arg("n", (), "s32", P(), value=3)
    c.out("y", P("a", "b"))
    def f(x, n):
        def body(i, h):
            return lax.cond(i % 2 == 0, lambda h: h * 0.5 + 1.0, lambda h: jnp.sin(h) + h.sum(axis=0, keepdims=True) * 0.01, h)
        return (lax.fori_loop(0, n, body, x),)
    return f


@case("switch_three_branches_2x4", "lax.switch 3 branches on sharded data", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _a(c):
    c.arg("x", (8, 16), "f32", P("a", "b"))
    c.arg("k", (), "s32", P(), value=2)
    c.out("y", P("a", "b"))
    c.out("s", P())
    def f(x, k):
        y = lax.switch(k, [lambda x: x * 2.0, lambda x: jnp.cos(x), lambda x: x - x.mean(axis=1, keepdims=True)], x)
        return y, jnp.sum(y)
    return f


@case("elementwise_zoo_4x2", "many unary/binary ops", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-6)
def _b(c):
    c.arg("x", (8, 6), "f32", P("a", "b"), scale=0.9)
    c.arg("y", (8, 6), "f32", P("a", None), scale=2.0)
    c.out("o1", P("a", "b"))
    c.out("o2", P(None, "b"))
    def f(x, y):
        o1 = lax.erf(x) + jnp.log1p(jnp.abs(x)) + jnp.expm1(x) + jnp.arctan2(x, y + 3.0) + jnp.round(y) + jnp.clip(y, -0.5, 0.5)
        o2 = lax.rsqrt(jnp.abs(y) + 1.0) * x ** 3 + jnp.sign(y) * jnp.floor(x * 4.0) + jnp.maximum(x, y)
        return o1, wsc(o2, P(None, "b"))
    return f


@case("dot_reduce_scatter_mesh3d", "dot with reduce-scatter on 3D mesh", (2, 2, 2), ("a", "b", "c"), rtol=1e-4, atol=1e-5)
def _c(c):
    c.arg("x", (8, 32), "f32", P("a", ("b", "c")))
    c.arg("w", (32, 16), "f32", P(("b", "c"), None), scale=0.2)
    c.out("y", P("a", ("b", "c")))
    def f(x, w):
        return (wsc(x @ w, P("a", ("b", "c"))),)
    return f


@case("xent_bf16_vocab_sharded", "cross entropy bf16 logits vocab-sharded", (8,), ("v",), rtol=2e-2, atol=2e-2)
def _d(c):
    c.arg("logits", (4, 64), "bf16", P(None, "v"), scale=2.0)
    c.arg("labels", (4,), "s32", P(None), lo=0, hi=64)
    c.out("loss", P())
    def f(logits, labels):
        lp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        return (-jnp.mean(jnp.take_along_axis(lp, labels[:, None], axis=1)),)
    return f


@case("argmax_and_descending_sort", "argmax on sharded dim + descending sort", (8,), ("x",), rtol=0, atol=0)
def _e(c):
    c.arg("x", (16, 8), "f32", P("x", None))
    c.out("am", P(None))
    c.out("sd", P("x", None))
    def f(x):
        return jnp.argmax(x, axis=0).astype(jnp.int32), -jnp.sort(-x, axis=0)
    return f


@case("reshape_merge_split_mesh3d", "reshape merge/split on 3D mesh", (2, 2, 2), ("a", "b", "c"), rtol=0, atol=0)
def _f(c):
    c.arg("x", (4, 8, 6), "f32", P("a", "b", None))
    c.out("y", P("a", None))
    c.out("z", P("a", "b", None, None))
    def f(x):
        y = wsc(x.reshape(4, 48), P("a", None))
        z = wsc(x.reshape(4, 2, 4, 6), P("a", "b", None, None))
        return y, z
    return f


@case("reshard_mesh3d_rotate_and_merge", "reshard rotate 3 axes", (2, 2, 2), ("a", "b", "c"), rtol=0, atol=0)
def _g(c):
    c.arg("x", (8, 8, 8), "f32", P("a", "b", "c"))
    c.out("y", P("c", "a", "b"))
    c.out("z", P(("a", "b"), None, "c"))
    def f(x):
        return wsc(x + 1.0, P("c", "a", "b")), wsc(x * 2.0, P(("a", "b"), None, "c"))
    return f


@case("conv2d_batch_and_features_2x4", "conv with output features sharded", (2, 4), ("d", "f"), rtol=1e-5, atol=1e-5)
def _h(c):
    c.arg("x", (4, 6, 6, 3), "f32", P("d", None, None, None))
    c.arg("k", (3, 3, 3, 8), "f32", P(None, None, None, "f"), scale=0.2)
    c.out("y", P("d", None, None, "f"))
    def f(x, k):
        return (lax.conv_general_dilated(x, k, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")),)
    return f


@case("maxpool2d_height_width_sharded", "2D max pool with H sharded", (4, 2), ("h", "w"), rtol=0, atol=0)
def _i(c):
    c.arg("x", (2, 16, 8, 3), "f32", P(None, "h", "w", None))
    c.out("y", P(None, "h", None, None))
    def f(x):
        y = lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
        return (wsc(y, P(None, "h", None, None)),)
    return f


@case("dynamic_slice_clamped_start", "dynamic slice clamped index", (8,), ("x",), rtol=0, atol=0)
def _j(c):
    c.arg("x", (32, 4), "f32", P("x", None))
    c.arg("i", (), "s32", P(), value=29)
    c.out("w", P(None, None))
    c.out("u", P("x", None))
    def f(x, i):
        return lax.dynamic_slice(x, (i, 0), (6, 4)), lax.dynamic_update_slice(x, jnp.ones((5, 4)), (i - 26, 0))
    return f


@case("gather_rows_2d_ids_4x2", "gather rows with ids sharded 2D", (4, 2), ("a", "b"), rtol=0, atol=0)
def _k(c):
    c.arg("t", (24, 10), "f32", P(None, "b"))
    c.arg("ids", (8, 4), "s32", P("a", "b"), lo=0, hi=24)
    c.out("e", P("a", None, "b"))
    def f(t, ids):
        return (t[ids],)
    return f


@case("scatter_add_sharded_updates", "scatter-add into table", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _l(c):
    c.arg("t", (16, 4), "f32", P(None, None))
    c.arg("ids", (32,), "s32", P("x"), lo=0, hi=16)
    c.arg("u", (32, 4), "f32", P("x", None))
    c.out("r", P(None, None))
    def f(t, ids, u):
        return (t.at[ids].add(u),)
    return f


@case("shard_map_ring_permute_psum_scatter", "shard_map ppermute ring + psum_scatter", (8,), ("x",), rtol=1e-5, atol=1e-5, manual=True)
def _m(c):
    c.arg("x", (16, 4), "f32", P("x", None))
    c.out("r", P("x", None))
    c.out("s", P("x", None))
    def body(x):
        r = jax.lax.ppermute(x, "x", [(i, (i + 1) % 8) for i in range(8)])
        s = jax.lax.psum_scatter(jnp.tile(x, (8, 1)), "x", scatter_dimension=0, tiled=True)
        return r, s
    def f(x):
        return smap(body, (P("x", None),), (P("x", None), P("x", None)))(x)
    return f


@case("train_step_momentum_dp_tp_2x4", "train step adam-ish on 2x4", (2, 4), ("d", "m"), rtol=1e-4, atol=1e-5)
def _n(c):
    c.arg("x", (8, 16), "f32", P("d", None))
    c.arg("t", (8, 8), "f32", P("d", None))
    c.arg("w1", (16, 32), "f32", P(None, "m"), scale=0.2)
    c.arg("w2", (32, 8), "f32", P("m", None), scale=0.2)
    c.arg("m1", (16, 32), "f32", P(None, "m"), scale=0.01)
    c.out("w1n", P(None, "m"))
    c.out("w2n", P("m", None))
    c.out("m1n", P(None, "m"))
    c.out("loss", P())
    def f(x, t, w1, w2, m1):
        def loss(w1, w2):
            return jnp.mean((jnp.tanh(x @ w1) @ w2 - t) ** 2)
        l, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2)
        m1n = 0.9 * m1 + 0.1 * g1
        return w1 - 0.01 * m1n / (jnp.sqrt(jnp.abs(m1n)) + 1e-3), w2 - 0.1 * g2, m1n, l
    return f


@case("cumprod_cummin_cols", "cumprod / cummin along sharded cols", (8,), ("x",), rtol=1e-5, atol=1e-6)
def _o(c):
    c.arg("x", (3, 32), "f32", P(None, "x"), scale=0.5)
    c.out("cp", P(None, "x"))
    c.out("cm", P(None, "x"))
    def f(x):
        return jnp.cumprod(1.0 + 0.1 * x, axis=1), lax.cummin(x, axis=1)
    return f



# --- third set: more kinds (grouped convolutions and their gradients, data-dependent loops,
# multi-operand sorts, bit ops, sequence sharding) -------------------------------------

@case("depthwise_conv_channels_sharded", "depthwise conv feature_group_count, channels sharded", (2, 4), ("b", "c"), rtol=1e-5, atol=1e-5)
def _variant_31(c):
    c.arg("x", (4, 8, 8, 8), "f32", P("b", None, None, "c"))
    c.arg("k", (3, 3, 1, 8), "f32", P(None, None, None, "c"), scale=0.3)
    c.out("y", P("b", None, None, "c"))
    def f(x, k):
        return (lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=8),)
    return f

@case("einsum_two_batch_dims_mesh3d", "einsum with two batch dims on 3d mesh", (2, 2, 2), ("a", "b", "c"), rtol=1e-4, atol=1e-5)
def _variant_32(c):
    c.arg("x", (4, 4, 8, 16), "f32", P("a", "b", None, "c"))
    c.arg("y", (4, 4, 16, 6), "f32", P("a", "b", "c", None), scale=0.3)
    c.out("z", P("a", "b", None, None))
    def f(x, y):
        return (jnp.einsum("abik,abkj->abij", x, y),)
    return f

@case("argmin_flattened_max_4x2", "argmin over two sharded dims (flattened)", (4, 2), ("a", "b"), rtol=0, atol=0)
def _variant_33(c):
    c.arg("x", (8, 12, 6), "f32", P(None, "a", "b"))
    c.out("am", P(None))
    c.out("mx", P("a"))
    def f(x):
        return jnp.argmin(x.reshape(8, 72), axis=1).astype(jnp.int32), jnp.max(x, axis=(0, 2))
    return f

@case("while_data_dependent_trip_count", "while loop with data-dependent trip count", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _variant_34(c):
    c.arg("x", (16, 4), "f32", P("x", None), scale=0.5)
    c.out("y", P("x", None))
    c.out("n", P())
    def f(x):
        def cond(s):
            i, h = s
            return jnp.logical_and(jnp.sum(jnp.abs(h)) < 200.0, i < 20)
        def body(s):
            i, h = s
            return i + 1, h * 1.5 + 0.1
        n, y = lax.while_loop(cond, body, (jnp.int32(0), x))
        return y, n
    return f

@case("take_along_axis_3d", "take_along_axis on 3D with sharded batch", (2, 4), ("a", "b"), rtol=0, atol=0)
def _variant_35(c):
    c.arg("x", (4, 8, 10), "f32", P("a", "b", None))
    c.arg("i", (4, 8, 3), "s32", P("a", "b", None), lo=0, hi=10)
    c.out("g", P("a", "b", None))
    def f(x, i):
        return (jnp.take_along_axis(x, i, axis=2),)
    return f

@case("embedding_grad_scatter_vocab_sharded", "scatter-add into vocab-sharded table (embedding grad)", (8,), ("v",), rtol=1e-5, atol=1e-5)
def _variant_36(c):
    c.arg("table", (32, 6), "f32", P("v", None))
    c.arg("ids", (12,), "s32", P(None), lo=0, hi=32)
    c.arg("g", (12, 6), "f32", P(None, None))
    c.out("t2", P("v", None))
    def f(table, ids, g):
        return (table.at[ids].add(g),)
    return f

@case("integer_bits_shifts_popcount", "integer bit ops, shifts, popcount, clamp", (4, 2), ("a", "b"), rtol=0, atol=0)
def _variant_37(c):
    c.arg("x", (8, 6), "s32", P("a", "b"), lo=-1000, hi=1000)
    c.arg("y", (8, 6), "u32", P("a", "b"), lo=0, hi=100000)
    c.out("o1", P("a", "b"))
    c.out("o2", P(None, "b"))
    c.out("o3", P())
    def f(x, y):
        o1 = (x << 2) ^ (x >> 1) | lax.population_count(x)
        o2 = wsc(jnp.clip(x % 7, -3, 3) * jnp.sign(x), P(None, "b"))
        o3 = jnp.sum((y >> 3) & 0xFF).astype(jnp.uint32)
        return o1, o2, o3
    return f

@case("train_step_bf16_compute_dp_tp", "bf16 params, f32 master, dp x tp", (2, 4), ("d", "m"), rtol=3e-2, atol=3e-2)
def _variant_38(c):
    c.arg("x", (8, 16), "bf16", P("d", None))
    c.arg("w", (16, 32), "f32", P(None, "m"), scale=0.2)
    c.arg("v", (32, 4), "f32", P("m", None), scale=0.2)
    c.out("w2", P(None, "m"))
    c.out("v2", P("m", None))
    c.out("l", P())
    def f(x, w, v):
        def loss(w, v):
            h = jax.nn.relu(x @ w.astype(jnp.bfloat16))
            return jnp.mean((h @ v.astype(jnp.bfloat16)).astype(jnp.float32) ** 2)
        l, (gw, gv) = jax.value_and_grad(loss, argnums=(0, 1))(w, v)
        return w - 0.1 * gw, v - 0.1 * gv, l
    return f

@case("avg_pool_stride3_padded", "avg pool stride 3 with padding on sharded dim", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _variant_39(c):
    c.arg("x", (2, 48), "f32", P(None, "x"))
    c.out("y", P(None, None))
    def f(x):
        return (lax.reduce_window(x, 0.0, lax.add, (1, 5), (1, 3), ((0, 0), (2, 2))) / 5.0,)
    return f

@case("cond_on_sharded_sum_2x4", "cond on a value computed from sharded data", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _variant_40(c):
    c.arg("x", (8, 8), "f32", P("a", "b"))
    c.out("y", P("a", "b"))
    def f(x):
        return (lax.cond(jnp.sum(x) > 0.0, lambda x: x @ x, lambda x: x.T * 2.0, x),)
    return f

@case("stable_sort_three_operands", "stable 3-operand sort along sharded dim", (8,), ("x",), rtol=0, atol=0)
def _variant_41(c):
    c.arg("k", (4, 32), "s32", P(None, "x"), lo=0, hi=5)
    c.arg("v", (4, 32), "f32", P(None, "x"))
    c.out("k2", P(None, "x"))
    c.out("v2", P(None, "x"))
    c.out("i2", P(None, "x"))
    def f(k, v):
        i = lax.broadcasted_iota(jnp.int32, k.shape, 1)
        return lax.sort((k, v, i), dimension=1, is_stable=True, num_keys=1)
    return f

@case("layernorm_mlp_sequence_sharded", "layernorm + mlp with sequence sharded (SP)", (2, 4), ("d", "s"), rtol=1e-4, atol=1e-5)
def _variant_42(c):
    c.arg("x", (2, 16, 12), "f32", P("d", "s", None))
    c.arg("w", (12, 24), "f32", P(None, None), scale=0.3)
    c.out("y", P("d", "s", None))
    def f(x, w):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        h = (x - mu) * lax.rsqrt(var + 1e-5)
        return (jax.nn.silu(h @ w) @ w.T,)
    return f

@case("convert_bf16_s32_pred", "f32->bf16->f32, f32->s32, s32->f32, pred", (8,), ("x",), rtol=0, atol=0)
def _variant_43(c):
    c.arg("x", (16, 8), "f32", P("x", None), scale=100.0)
    c.out("a", P("x", None))
    c.out("b", P("x", None))
    c.out("cnt", P())
    def f(x):
        a = x.astype(jnp.bfloat16).astype(jnp.float32)
        b = x.astype(jnp.int32)
        return a, b, jnp.sum(x > 0).astype(jnp.int32)
    return f

@case("reverse_cumsum_4x2", "reverse cumsum on 2D-sharded", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _variant_44(c):
    c.arg("x", (16, 8), "f32", P("a", "b"))
    c.out("y", P("a", "b"))
    def f(x):
        return (jnp.flip(jnp.cumsum(jnp.flip(x, 0), axis=0), 0),)
    return f

@case("depthwise_conv_grads_batch_groups", "depthwise conv forward + grads (batch_group_count), channels sharded", (2, 4), ("b", "c"), rtol=1e-4, atol=1e-4)
def _variant_45(c):
    c.arg("x", (4, 8, 8, 8), "f32", P("b", None, None, "c"))
    c.arg("k", (3, 3, 1, 8), "f32", P(None, None, None, "c"), scale=0.3)
    c.out("gx", P("b", None, None, "c"))
    c.out("gk", P(None, None, None, "c"))
    def f(x, k):
        def loss(x, k):
            y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=8)
            return jnp.sum(jnp.tanh(y))
        return jax.grad(loss, argnums=(0, 1))(x, k)
    return f

@case("shard_map_all_to_all_pmax_axis_index", "shard_map all_to_all + pmax + axis_index", (2, 4), ("a", "b"), rtol=1e-6, atol=1e-6, manual=True)
def _variant_46(c):
    c.arg("x", (8, 8), "f32", P("a", "b"))
    c.out("t", P("a", "b"))
    c.out("m", P("a", "b"))
    def body(x):
        t = jax.lax.all_to_all(x, "a", 0, 0, tiled=True)
        m = jax.lax.pmax(x, "b") + jax.lax.axis_index("a").astype(jnp.float32)
        return t, m
    def f(x):
        return smap(body, (P("a", "b"),), (P("a", "b"), P("a", "b")))(x)
    return f



# --- fourth set: partially replicated reshards, interior/negative padding, masks, random
# numbers, layer-sharded scans, mixed contracting shardings ------------------------------

@case("reshard_partially_replicated_2x4", "reshard partially replicated -> other axis", (2, 4), ("a", "b"), rtol=0, atol=0)
def _variant_47(c):
    c.arg("x", (8, 16), "f32", P("a", None))
    c.out("y", P(None, "b"))
    c.out("z", P("b", "a"))
    def f(x):
        return wsc(x + 1.0, P(None, "b")), wsc(x * 3.0, P("b", "a"))
    return f

@case("pad_interior_and_negative", "pad with interior and negative padding on sharded dim", (8,), ("x",), rtol=0, atol=0)
def _variant_48(c):
    c.arg("x", (4, 16), "f32", P(None, "x"))
    c.out("y", P(None, "x"))
    def f(x):
        y = lax.pad(x, 0.5, ((0, 0, 0), (-2, 3, 1)))
        return (wsc(y, P(None, "x")),)
    return f

@case("causal_mask_softmax_seq_sharded", "causal mask via iota on sharded seq", (2, 4), ("b", "s"), rtol=1e-5, atol=1e-5)
def _variant_49(c):
    c.arg("x", (2, 16, 16), "f32", P("b", "s", None))
    c.out("y", P("b", "s", None))
    def f(x):
        i = lax.broadcasted_iota(jnp.int32, (16, 16), 0)
        j = lax.broadcasted_iota(jnp.int32, (16, 16), 1)
        s = jnp.where(j <= i, x, -1e9)
        return (jax.nn.softmax(s, axis=-1),)
    return f

@case("random_normal_threefry", "jax.random normal with key arg, sharded output", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _variant_50(c):
    c.arg("k", (2,), "u32", P(None), lo=0, hi=1000)
    c.arg("x", (16, 8), "f32", P("x", None))
    c.out("y", P("x", None))
    def f(k, x):
        n = jax.random.normal(jax.random.wrap_key_data(k, impl="threefry2x32"), (16, 8))
        return (wsc(x + n, P("x", None)),)
    return f

@case("scan_layers_sharded_stack", "scan over stacked weights with layer dim sharded", (2, 4), ("l", "m"), rtol=1e-4, atol=1e-5)
def _variant_51(c):
    c.arg("h", (4, 8), "f32", P(None, None))
    c.arg("ws", (4, 8, 8), "f32", P("l", None, "m"), scale=0.3)
    c.out("h2", P(None, None))
    def f(h, ws):
        def step(h, w):
            return jnp.tanh(h @ w), None
        return (lax.scan(step, h, ws)[0],)
    return f

@case("dot_contracting_sharded_on_different_axes", "dot with contracting dim sharded differently on each side", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _variant_52(c):
    c.arg("x", (8, 32), "f32", P(None, "b"))
    c.arg("y", (32, 8), "f32", P("a", None), scale=0.2)
    c.out("z", P(None, None))
    def f(x, y):
        return (x @ y,)
    return f

@case("transpose_4d_two_sharded_dims", "4D transpose with two sharded dims", (2, 4), ("a", "b"), rtol=0, atol=0)
def _variant_53(c):
    c.arg("x", (4, 8, 2, 6), "f32", P("a", "b", None, None))
    c.out("y", P(None, "b", "a", None))
    def f(x):
        return (wsc(jnp.transpose(x, (3, 1, 0, 2)), P(None, "b", "a", None)),)
    return f

@case("bitcast_and_reduce_precision", "bitcast f32<->s32 and reduce_precision", (8,), ("x",), rtol=0, atol=0)
def _variant_54(c):
    c.arg("x", (16, 4), "f32", P("x", None), scale=10.0)
    c.out("b", P("x", None))
    c.out("r", P("x", None))
    def f(x):
        b = lax.bitcast_convert_type(x, jnp.int32) >> 3
        r = lax.reduce_precision(x, exponent_bits=5, mantissa_bits=7)
        return b, r
    return f

@case("select_n_and_clamp_4x2", "jnp.select with 3 choices and clamp with sharded bounds", (4, 2), ("a", "b"), rtol=0, atol=0)
def _variant_55(c):
    c.arg("x", (8, 8), "f32", P("a", "b"))
    c.arg("lo", (8, 8), "f32", P("a", None), scale=0.2)
    c.out("y", P("a", "b"))
    def f(x, lo):
        s = jnp.select([x < -0.3, x > 0.3], [x * 2, x * x], default=-x)
        return (jnp.clip(s, lo - 0.5, lo + 0.5),)
    return f

@case("squeeze_expand_mesh3d", "reshapes adding/removing size-1 dims on sharded arrays", (2, 2, 2), ("a", "b", "c"), rtol=0, atol=0)
def _variant_56(c):
    c.arg("x", (4, 1, 8, 6), "f32", P("a", None, "b", "c"))
    c.out("y", P("a", "b", None, "c"))
    def f(x):
        y = x.reshape(4, 8, 6)[:, :, None, :]
        return (wsc(y * 2.0, P("a", "b", None, "c")),)
    return f

@case("concat_three_uneven_pieces", "concat three differently-sized pieces on sharded dim", (8,), ("x",), rtol=0, atol=0)
def _variant_57(c):
    c.arg("a", (3, 16), "f32", P(None, "x"))
    c.arg("b", (3, 8), "f32", P(None, "x"))
    c.arg("d", (3, 24), "f32", P(None, "x"))
    c.out("y", P(None, "x"))
    def f(a, b, d):
        return (wsc(jnp.concatenate([a[:, :5], b, d[:, :19]], axis=1), P(None, "x")),)
    return f

@case("dynamic_update_slice_sharded_update", "dynamic_update_slice with a sharded update", (8,), ("x",), rtol=0, atol=0)
def _variant_58(c):
    c.arg("x", (32, 8), "f32", P("x", None))
    c.arg("u", (16, 8), "f32", P("x", None))
    c.arg("i", (), "s32", P(), value=7)
    c.out("y", P("x", None))
    def f(x, u, i):
        return (lax.dynamic_update_slice(x, u, (i, 0)),)
    return f

@case("argmax_flattened_mesh3d", "argmax over two dims on 3D mesh", (2, 2, 2), ("a", "b", "c"), rtol=0, atol=0)
def _variant_59(c):
    c.arg("x", (4, 8, 6), "f32", P("a", "b", "c"))
    c.out("am", P("a"))
    def f(x):
        return (jnp.argmax(x.reshape(4, 48), axis=1).astype(jnp.int32),)
    return f



# --- fifth set: loops around TP dots, nested conditionals, partial-replication reductions,
# 2-D sharded tables, two-index gathers, splitting reshapes, mixed-sharding concats -------

@case("fori_loop_accumulating_tp_dot", "while loop accumulating a TP dot", (2, 4), ("d", "m"), rtol=1e-4, atol=1e-5)
def _variant_60(c):
    c.arg("x", (8, 16), "f32", P("d", None))
    c.arg("w", (16, 16), "f32", P(None, "m"), scale=0.2)
    c.out("acc", P("d", None))
    def f(x, w):
        def body(i, acc):
            return acc + jnp.tanh(x @ w) @ w.T * (i + 1).astype(jnp.float32)
        return (lax.fori_loop(0, 3, body, jnp.zeros_like(x)),)
    return f

@case("nested_conditionals_8", "nested conditionals", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _variant_61(c):
    c.arg("x", (16, 4), "f32", P("x", None))
    c.arg("a", (), "s32", P(), value=1)
    c.arg("b", (), "s32", P(), value=0)
    c.out("y", P("x", None))
    def f(x, a, b):
        inner = lambda x: lax.cond(b > 0, lambda x: x + 1.0, lambda x: x.sum(0, keepdims=True) + x, x)
        return (lax.cond(a > 0, inner, lambda x: x * 2.0, x),)
    return f

@case("dot_output_sharded_like_contracting", "dot whose output wants reduce-scatter", (8,), ("x",), rtol=1e-4, atol=1e-5)
def _variant_62(c):
    c.arg("x", (16, 64), "f32", P(None, "x"))
    c.arg("w", (64, 32), "f32", P("x", None), scale=0.2)
    c.out("y", P(None, "x"))
    def f(x, w):
        return (wsc(x @ w, P(None, "x")),)
    return f

@case("reduce_over_partially_replicated", "reduce over dim sharded on a partially replicated tiling", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _variant_63(c):
    c.arg("x", (8, 12), "f32", P("b", None))
    c.out("s", P(None))
    c.out("m", P("b"))
    def f(x):
        return jnp.sum(x, axis=0), jnp.max(x, axis=1)
    return f

@case("broadcast_sharded_vector_mesh3d", "broadcast sharded vector into 3D", (2, 2, 2), ("a", "b", "c"), rtol=0, atol=0)
def _variant_64(c):
    c.arg("v", (8,), "f32", P("a"))
    c.arg("x", (4, 8, 6), "f32", P("b", "a", "c"))
    c.out("y", P("b", "a", "c"))
    def f(v, x):
        return (x * v[None, :, None] + jnp.arange(6, dtype=jnp.float32),)
    return f

@case("embedding_table_vocab_and_hidden_sharded", "embedding with table sharded on vocab and hidden", (2, 4), ("h", "v"), rtol=0, atol=0)
def _variant_65(c):
    c.arg("t", (32, 8), "f32", P("v", "h"))
    c.arg("ids", (4, 3), "s32", P(None, None), lo=0, hi=32)
    c.out("e", P(None, None, "h"))
    def f(t, ids):
        return (wsc(t[ids], P(None, None, "h")),)
    return f

@case("gather_two_index_dims_4x2", "gather with two index dims (x[i, j])", (4, 2), ("a", "b"), rtol=0, atol=0)
def _variant_66(c):
    c.arg("x", (16, 8, 4), "f32", P("a", "b", None))
    c.arg("i", (6,), "s32", P(None), lo=0, hi=16)
    c.arg("j", (6,), "s32", P(None), lo=0, hi=8)
    c.out("g", P(None, None))
    def f(x, i, j):
        return (x[i, j],)
    return f

@case("reshape_split_sharded_dim", "reshape splitting a sharded dim", (8,), ("x",), rtol=0, atol=0)
def _variant_67(c):
    c.arg("x", (48, 4), "f32", P("x", None))
    c.out("y", P("x", None, None))
    c.out("z", P(None, "x", None))
    def f(x):
        y = wsc(x.reshape(8, 6, 4), P("x", None, None))
        z = wsc(x.reshape(6, 8, 4), P(None, "x", None))
        return y, z
    return f

@case("one_hot_iota_compare_2x4", "sharded iota comparisons (one-hot)", (2, 4), ("a", "b"), rtol=0, atol=0)
def _variant_68(c):
    c.arg("labels", (8,), "s32", P("a"), lo=0, hi=32)
    c.out("oh", P("a", "b"))
    def f(labels):
        return (wsc(jax.nn.one_hot(labels, 32, dtype=jnp.float32), P("a", "b")),)
    return f

@case("pad_negative_low_sharded", "pad with negative low padding on sharded dim", (8,), ("x",), rtol=0, atol=0)
def _variant_69(c):
    c.arg("x", (4, 32), "f32", P(None, "x"))
    c.out("y", P(None, "x"))
    def f(x):
        return (wsc(lax.pad(x, 0.0, ((0, 0, 0), (-3, 3, 0))), P(None, "x")),)
    return f

@case("concat_differently_sharded_inputs", "concat along unsharded dim of differently sharded inputs", (2, 4), ("a", "b"), rtol=0, atol=0)
def _variant_70(c):
    c.arg("x", (8, 8), "f32", P("a", "b"))
    c.arg("y", (8, 4), "f32", P("b", None))
    c.out("z", P("a", None))
    def f(x, y):
        return (wsc(jnp.concatenate([x, y], axis=1), P("a", None)),)
    return f

@case("logsumexp_over_two_sharded_dims", "logsumexp over both sharded dims", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _variant_71(c):
    c.arg("x", (16, 8), "f32", P("a", "b"), scale=3.0)
    c.out("l", P())
    c.out("r", P("a"))
    def f(x):
        return jax.nn.logsumexp(x), jax.nn.logsumexp(x, axis=1)
    return f

@case("triangular_matmul_cumsum_2x4", "cumsum 2D via matmul with triangular mask", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-4)
def _variant_72(c):
    c.arg("x", (8, 16), "f32", P("a", "b"))
    c.out("y", P("a", "b"))
    def f(x):
        tri = jnp.tril(jnp.ones((16, 16), jnp.float32)).T
        return (wsc(x @ tri, P("a", "b")),)
    return f



# --- sixth set: model-shaped programs (GQA + rotary attention, top-1 MoE, LM-head train step,
# conv + batchnorm train step, layernorm/TP backward, bf16 block) ------------------------

@case("gqa_attention_rope_2x4", "GQA attention with rotary embeddings, heads on model", (2, 4), ("data", "model"), rtol=1e-4, atol=1e-4)
def _variant_73(c):
    B, S, D, H, KV, K = 2, 8, 32, 8, 4, 4
    c.arg("x", (B, S, D), "f32", P("data", None, None))
    c.arg("wq", (D, H, K), "f32", P(None, "model", None), scale=0.2)
    c.arg("wk", (D, KV, K), "f32", P(None, "model", None), scale=0.2)
    c.arg("wv", (D, KV, K), "f32", P(None, "model", None), scale=0.2)
    c.arg("wo", (H, K, D), "f32", P("model", None, None), scale=0.2)
    c.out("y", P("data", None, None))
    def rope(t):
        pos = jnp.arange(S, dtype=jnp.float32)[:, None]
        freq = jnp.exp(-jnp.arange(K // 2, dtype=jnp.float32))
        ang = pos * freq
        c_, s_ = jnp.cos(ang), jnp.sin(ang)
        a, b = t[..., : K // 2], t[..., K // 2:]
        return jnp.concatenate([a * c_ - b * s_, a * s_ + b * c_], axis=-1)
    def f(x, wq, wk, wv, wo):
        q = rope(jnp.einsum("bsd,dhk->bhsk", x, wq).transpose(0, 1, 2, 3))
        k = rope(jnp.einsum("bsd,dhk->bhsk", x, wk))
        v = jnp.einsum("bsd,dhk->bhsk", x, wv)
        k = jnp.repeat(k, H // KV, axis=1)
        v = jnp.repeat(v, H // KV, axis=1)
        s = jnp.einsum("bhqk,bhsk->bhqs", q, k) / 2.0
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqs,bhsk->bhqk", p, v)
        return (x + jnp.einsum("bhsk,hkd->bsd", o, wo),)
    return f

@case("moe_top1_onehot_experts_sharded", "top-1 MoE with one-hot dispatch, experts sharded", (2, 4), ("data", "expert"), rtol=1e-4, atol=1e-5)
def _variant_74(c):
    T, D, E, F = 16, 8, 4, 16
    c.arg("x", (T, D), "f32", P("data", None))
    c.arg("wg", (D, E), "f32", P(None, None), scale=0.5)
    c.arg("w1", (E, D, F), "f32", P("expert", None, None), scale=0.3)
    c.arg("w2", (E, F, D), "f32", P("expert", None, None), scale=0.3)
    c.out("y", P("data", None))
    def f(x, wg, w1, w2):
        logits = x @ wg
        e = jnp.argmax(logits, axis=-1)
        gate = jax.nn.softmax(logits, axis=-1)
        oh = jax.nn.one_hot(e, E, dtype=jnp.float32)
        xe = jnp.einsum("te,td->etd", oh, x)
        h = jax.nn.relu(jnp.einsum("etd,edf->etf", xe, w1))
        ye = jnp.einsum("etf,efd->etd", h, w2)
        y = jnp.einsum("etd,te->td", ye, oh * gate)
        return (y,)
    return f

@case("lm_head_train_step_vocab_sharded", "LM head train step: vocab-sharded logits, xent grads", (2, 4), ("data", "vocab"), rtol=1e-4, atol=1e-5)
def _variant_75(c):
    c.arg("h", (8, 16), "f32", P("data", None))
    c.arg("w", (16, 64), "f32", P(None, "vocab"), scale=0.3)
    c.arg("labels", (8,), "s32", P("data"), lo=0, hi=64)
    c.out("w2", P(None, "vocab"))
    c.out("loss", P())
    def f(h, w, labels):
        def loss(w):
            lp = jax.nn.log_softmax(h @ w, axis=-1)
            return -jnp.mean(jnp.take_along_axis(lp, labels[:, None], axis=1))
        l, gw = jax.value_and_grad(loss)(w)
        return w - 0.5 * gw, l
    return f

@case("conv_batchnorm_pool_train_step", "conv + batchnorm + avgpool train step, batch sharded", (8,), ("data",), rtol=1e-4, atol=1e-5)
def _variant_76(c):
    c.arg("x", (16, 8, 8, 3), "f32", P("data", None, None, None))
    c.arg("k", (3, 3, 3, 4), "f32", P(None, None, None, None), scale=0.3)
    c.arg("t", (16, 4), "f32", P("data", None))
    c.out("k2", P(None, None, None, None))
    c.out("loss", P())
    def f(x, k, t):
        def loss(k):
            y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
            mu = y.mean(axis=(0, 1, 2))
            var = y.var(axis=(0, 1, 2))
            y = (y - mu) * lax.rsqrt(var + 1e-5)
            p = y.mean(axis=(1, 2))
            return jnp.mean((p - t) ** 2)
        l, gk = jax.value_and_grad(loss)(k)
        return k - 0.1 * gk, l
    return f

@case("layernorm_tp_mlp_backward", "layernorm + TP MLP backward", (2, 4), ("data", "model"), rtol=1e-4, atol=1e-5)
def _variant_77(c):
    c.arg("x", (8, 16), "f32", P("data", None))
    c.arg("g", (16,), "f32", P(None), scale=0.5)
    c.arg("w1", (16, 32), "f32", P(None, "model"), scale=0.2)
    c.arg("w2", (32, 16), "f32", P("model", None), scale=0.2)
    c.out("gx", P("data", None))
    c.out("gg", P(None))
    c.out("gw1", P(None, "model"))
    def f(x, g_, w1, w2):
        def loss(x, g_, w1):
            mu = x.mean(-1, keepdims=True)
            h = (x - mu) * lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * (1 + g_)
            return jnp.sum(jax.nn.gelu(h @ w1) @ w2)
        return jax.grad(loss, argnums=(0, 1, 2))(x, g_, w1)
    return f

@case("dot_two_contracting_dims_mesh3d", "dot_general with two contracting dims sharded", (2, 2, 2), ("a", "b", "c"), rtol=1e-4, atol=1e-5)
def _variant_78(c):
    c.arg("x", (8, 4, 6), "f32", P("a", "b", "c"))
    c.arg("w", (4, 6, 10), "f32", P("b", "c", None), scale=0.2)
    c.out("y", P("a", None))
    def f(x, w):
        return (jnp.einsum("ijk,jkl->il", x, w),)
    return f

@case("scan_running_max_features_sharded", "scan computing running max with sharded features", (8,), ("f",), rtol=0, atol=0)
def _variant_79(c):
    c.arg("xs", (6, 4, 16), "f32", P(None, None, "f"))
    c.out("m", P(None, "f"))
    c.out("ys", P(None, None, "f"))
    def f(xs):
        def step(m, x):
            m = jnp.maximum(m, x)
            return m, m - x
        return lax.scan(step, jnp.full((4, 16), -jnp.inf), xs)
    return f

@case("bf16_rmsnorm_mlp_block_2x4", "bf16 attention-free block with f32 norms, dp x tp", (2, 4), ("d", "m"), rtol=3e-2, atol=3e-2)
def _variant_80(c):
    c.arg("x", (4, 8, 16), "bf16", P("d", None, None))
    c.arg("w1", (16, 64), "bf16", P(None, "m"), scale=0.2)
    c.arg("w2", (64, 16), "bf16", P("m", None), scale=0.1)
    c.out("y", P("d", None, None))
    def f(x, w1, w2):
        xf = x.astype(jnp.float32)
        n = (xf * lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(jnp.bfloat16)
        h = jax.nn.silu(n @ w1)
        return (x + (h @ w2),)
    return f



# --- seventh set: 2-D TP dots on a 3-D mesh, clip/fill takes, data-dependent dynamic slices,
# sorts over two axes, loops that reshard their carry, shard_map all_to_all/psum_scatter ---

@case("dot_mn_and_k_sharded_mesh3d", "dot with M on x, N on y, K on z", (2, 2, 2), ("x", "y", "z"), rtol=1e-4, atol=1e-5)
def _variant_81(c):
    c.arg("a", (8, 16), "f32", P("x", "z"))
    c.arg("b", (16, 12), "f32", P("z", "y"), scale=0.2)
    c.out("o", P("x", "y"))
    def f(a, b):
        return (a @ b,)
    return f

@case("take_clip_and_fill_modes", "jnp.take with clip and fill modes", (8,), ("x",), rtol=0, atol=0)
def _variant_82(c):
    c.arg("t", (32, 4), "f32", P("x", None))
    c.arg("i", (10,), "s32", P(None), lo=-5, hi=40)
    c.out("a", P(None, None))
    c.out("b", P(None, None))
    def f(t, i):
        return jnp.take(t, i, axis=0, mode="clip"), jnp.take(t, i, axis=0, mode="fill", fill_value=-1.0)
    return f

@case("dynamic_index_from_sharded_argmax", "dynamic slice at an index computed from sharded data", (2, 4), ("a", "b"), rtol=0, atol=0)
def _variant_83(c):
    c.arg("x", (16, 8), "f32", P("a", "b"))
    c.out("row", P(None))
    c.out("upd", P("a", "b"))
    def f(x):
        i = jnp.argmax(jnp.sum(x, axis=1)).astype(jnp.int32)
        row = lax.dynamic_slice(x, (i, 0), (1, 8))[0]
        return row, lax.dynamic_update_slice(x, jnp.zeros((2, 8)), (i, 0))
    return f

@case("sort_dim_sharded_on_two_axes", "sort along a dim sharded over two axes", (2, 4), ("a", "b"), rtol=0, atol=0)
def _variant_84(c):
    c.arg("x", (4, 32), "f32", P(None, ("a", "b")))
    c.out("s", P(None, ("a", "b")))
    def f(x):
        return (jnp.sort(x, axis=1),)
    return f

@case("fori_loop_resharding_carry", "while body re-shards its carry", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _variant_85(c):
    c.arg("x", (8, 8), "f32", P("a", "b"))
    c.out("y", P("a", "b"))
    def f(x):
        def body(i, h):
            h = wsc(h * 1.1 + 0.1, P("b", "a"))
            return wsc(jnp.tanh(h), P("a", "b"))
        return (lax.fori_loop(0, 3, body, x),)
    return f

@case("shard_map_all_to_all_split_ne_concat", "shard_map all_to_all with split != concat", (8,), ("x",), rtol=0, atol=0, manual=True)
def _variant_86(c):
    c.arg("x", (16, 8, 4), "f32", P("x", None, None))
    c.out("y", P(None, "x", None))
    def body(x):
        return (jax.lax.all_to_all(x, "x", 1, 0, tiled=True),)
    def f(x):
        return smap(body, (P("x", None, None),), (P(None, "x", None),))(x)
    return f

@case("shard_map_psum_scatter_dim1_swap", "shard_map psum_scatter on dim 1 and a shifted ppermute", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5, manual=True)
def _variant_87(c):
    c.arg("x", (8, 16), "f32", P("a", None))
    c.out("s", P("a", "b"))
    c.out("r", P("a", None))
    def body(x):
        s = jax.lax.psum_scatter(x, "b", scatter_dimension=1, tiled=True)
        r = jax.lax.ppermute(x, "a", [(0, 1), (1, 0)])
        return s, r
    def f(x):
        return smap(body, (P("a", None),), (P("a", "b"), P("a", None)))(x)
    return f

@case("reduce_window_2d_both_dims_sharded", "reduce_window over both dims of a 2D-sharded array", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _variant_88(c):
    c.arg("x", (16, 16), "f32", P("a", "b"))
    c.out("y", P("a", "b"))
    def f(x):
        return (wsc(lax.reduce_window(x, 0.0, lax.add, (3, 3), (1, 1), "SAME"), P("a", "b")),)
    return f

@case("outer_product_and_compare_2x4", "outer product and broadcasting compare", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-6)
def _variant_89(c):
    c.arg("u", (16,), "f32", P("a"))
    c.arg("v", (24,), "f32", P("b"))
    c.out("o", P("a", "b"))
    c.out("m", P("a", "b"))
    def f(u, v):
        o = u[:, None] * v[None, :]
        return o, (u[:, None] > v[None, :]).astype(jnp.float32)
    return f



# --- eighth set: corpus kinds on other meshes (fill-mode embedding, 2-D spatial conv,
# strided windows, both-dims dynamic slices, bf16 Megatron on 3-D, masked xent, 3-D scan) --

@case("embedding_take_fill_2x4", "jnp.take fill mode, table vocab-sharded on 2x4", (2, 4), ("d", "v"), rtol=0, atol=0)
def _variant_90(c):
    c.arg("t", (48, 8), "f32", P("v", None))
    c.arg("ids", (4, 6), "s32", P("d", None), lo=-3, hi=52)
    c.out("e", P("d", None, None))
    def f(t, ids):
        return (jnp.take(t, ids, axis=0, mode="fill", fill_value=0.0),)
    return f

@case("conv2d_height_and_width_sharded", "conv with H and W both sharded", (2, 4), ("h", "w"), rtol=1e-5, atol=1e-5)
def _variant_91(c):
    c.arg("x", (2, 8, 16, 3), "f32", P(None, "h", "w", None))
    c.arg("k", (3, 3, 3, 4), "f32", P(None, None, None, None), scale=0.3)
    c.out("y", P(None, "h", "w", None))
    def f(x, k):
        return (lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),)
    return f

@case("cumsum_and_window_max_stride3", "cumsum + windowed max stride 3 on sharded dim", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _variant_92(c):
    c.arg("x", (3, 96), "f32", P(None, "x"))
    c.out("c", P(None, "x"))
    c.out("w", P(None, None))
    def f(x):
        return jnp.cumsum(x, axis=1), lax.reduce_window(x, -jnp.inf, lax.max, (1, 5), (1, 3), "VALID")
    return f

@case("sort_and_argmax_4x2", "sort along unsharded, argmax along sharded dims, 4x2", (4, 2), ("a", "b"), rtol=0, atol=0)
def _variant_93(c):
    c.arg("x", (16, 24), "f32", P("a", "b"))
    c.out("s", P("a", None))
    c.out("am0", P(None))
    c.out("am1", P("a"))
    def f(x):
        return jnp.sort(x, axis=1), jnp.argmax(x, axis=0).astype(jnp.int32), jnp.argmax(x, axis=1).astype(jnp.int32)
    return f

@case("dynamic_slice_update_both_dims_sharded", "dynamic slice/update with both dims sharded", (2, 4), ("a", "b"), rtol=0, atol=0)
def _variant_94(c):
    c.arg("x", (32, 32), "f32", P("a", "b"))
    c.arg("u", (5, 7), "f32", P(None, None))
    c.arg("i", (), "s32", P(), value=13)
    c.arg("j", (), "s32", P(), value=20)
    c.out("w", P(None, None))
    c.out("y", P("a", "b"))
    def f(x, u, i, j):
        return lax.dynamic_slice(x, (i, j), (5, 7)), lax.dynamic_update_slice(x, u, (i, j))
    return f

@case("megatron_mlp_bf16_mesh3d", "Megatron MLP bf16 on 3D mesh (dp, fsdp, tp)", (2, 2, 2), ("dp", "fsdp", "tp"), rtol=3e-2, atol=3e-2)
def _variant_95(c):
    c.arg("x", (8, 32), "bf16", P(("dp", "fsdp"), None))
    c.arg("w1", (32, 64), "bf16", P("fsdp", "tp"), scale=0.2)
    c.arg("w2", (64, 32), "bf16", P("tp", "fsdp"), scale=0.1)
    c.out("y", P(("dp", "fsdp"), None))
    def f(x, w1, w2):
        h = jax.nn.gelu(x @ wsc(w1, P(None, "tp")))
        return (h @ wsc(w2, P("tp", None)),)
    return f

@case("xent_one_hot_mask_4x2", "xent with one-hot mask on 4x2 (vocab 2-way)", (4, 2), ("data", "model"), rtol=1e-5, atol=1e-5)
def _variant_96(c):
    c.arg("logits", (16, 48), "f32", P("data", "model"), scale=3.0)
    c.arg("labels", (16,), "s32", P("data"), lo=0, hi=48)
    c.out("l", P("data"))
    c.out("m", P())
    def f(logits, labels):
        lse = jax.nn.logsumexp(logits, axis=-1)
        oh = (jnp.arange(48)[None, :] == labels[:, None])
        picked = jnp.sum(jnp.where(oh, logits, 0.0), axis=-1)
        l = lse - picked
        return l, jnp.mean(l)
    return f

@case("scan_layers_mesh3d", "scan over layers with weights sharded on 3D mesh", (2, 2, 2), ("d", "f", "m"), rtol=1e-4, atol=1e-5)
def _variant_97(c):
    c.arg("h", (8, 16), "f32", P("d", None))
    c.arg("ws", (3, 16, 16), "f32", P(None, "f", "m"), scale=0.25)
    c.out("h2", P("d", None))
    c.out("norms", P(None))
    def f(h, ws):
        def step(h, w):
            h = wsc(jnp.tanh(h @ w), P("d", None))
            return h, jnp.mean(jnp.abs(h))
        return lax.scan(step, h, ws)
    return f


# --- ninth set: written against the pipeline after it was done (uneven keepdims reshapes in
# layernorm/softmax/GQA, rolls and flips, reflect/edge pads, transposed convolutions, kernel
# gradients, max-pool gradients (select-and-scatter), uneven merges, and whole train steps);
# they found the shortfalls fixed in the same change ----------------------------------------

@case("mha_fused_qkv_causal_4x2", "MHA with fused QKV weight [D,3*H*K] column-sharded on m, reshape split of sharded dim, causal softmax", (4, 2), ("d", "m"), rtol=1e-4, atol=1e-4)
def _h01(c):
    B, S, D, H, K = 4, 6, 24, 4, 6
    c.arg("x", (B, S, D), "f32", P("d", None, None))
    c.arg("wqkv", (D, 3 * H * K), "f32", P(None, "m"), scale=0.2)
    c.arg("wo", (H * K, D), "f32", P("m", None), scale=0.2)
    c.out("y", P("d", None, None))
    def f(x, wqkv, wo):
        qkv = (x @ wqkv).reshape(B, S, 3, H, K)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(K)
        mask = jnp.tril(jnp.ones((S, S), bool))
        s = jnp.where(mask, s, -jnp.inf)
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqs,bshk->bqhk", p, v).reshape(B, S, H * K)
        return (x + o @ wo,)
    return f


@case("gqa_uneven_heads_2x4", "GQA with 6 query heads / 3 kv heads sharded 4-way on model (uneven), layernorm pre-norm", (2, 4), ("data", "model"), rtol=1e-4, atol=1e-4)
def _h02(c):
    B, S, D, H, KV, K = 2, 5, 16, 6, 3, 4
    c.arg("x", (B, S, D), "f32", P("data", None, None))
    c.arg("wq", (D, H, K), "f32", P(), scale=0.25)
    c.arg("wk", (D, KV, K), "f32", P(), scale=0.25)
    c.arg("wv", (D, KV, K), "f32", P(), scale=0.25)
    c.arg("wo", (H, K, D), "f32", P(), scale=0.25)
    c.out("y", P("data", None, None))
    def f(x, wq, wk, wv, wo):
        wq = wsc(wq, P(None, "model", None)); wk = wsc(wk, P(None, "model", None))
        wv = wsc(wv, P(None, "model", None)); wo = wsc(wo, P("model", None, None))
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        h = (x - mu) * lax.rsqrt(var + 1e-5)
        q = jnp.einsum("bsd,dhk->bshk", h, wq).reshape(B, S, KV, H // KV, K)
        k = jnp.einsum("bsd,dhk->bshk", h, wk)
        v = jnp.einsum("bsd,dhk->bshk", h, wv)
        s = jnp.einsum("bqgrk,bsgk->bgrqs", q, k) * 0.5
        p = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bgrqs,bsgk->bqgrk", p, v).reshape(B, S, H, K)
        return (x + jnp.einsum("bshk,hkd->bsd", o, wo),)
    return f


@case("layernorm_seq_uneven_8", "layernorm + affine over hidden with sequence dim 21 sharded 8-way (uneven)", (8,), ("s",), rtol=1e-5, atol=1e-5)
def _h03(c):
    c.arg("x", (3, 21, 40), "f32", P(), scale=2.0)
    c.arg("g", (40,), "f32", P(None))
    c.arg("b", (40,), "f32", P(None))
    c.out("y", P(None, None, "s"))
    def f(x, g, b):
        x = wsc(x, P(None, "s", None))
        mu = x.mean(-1, keepdims=True)
        var = x.var(-1, keepdims=True)
        return ((x - mu) * lax.rsqrt(var + 1e-5) * g + b,)
    return f


@case("adam_step_mesh3d", "2-layer MLP loss grad + Adam update, params FSDP/TP sharded on 2x2x2 (dp, fsdp, tp)", (2, 2, 2), ("dp", "fsdp", "tp"), rtol=1e-4, atol=1e-5)
def _h04(c):
    c.arg("x", (8, 12), "f32", P(("dp", "fsdp"), None))
    c.arg("y", (8, 6), "f32", P(("dp", "fsdp"), None))
    c.arg("w1", (12, 20), "f32", P("fsdp", "tp"), scale=0.3)
    c.arg("w2", (20, 6), "f32", P("tp", "fsdp"), scale=0.3)
    c.arg("m1", (12, 20), "f32", P("fsdp", "tp"), scale=0.01)
    c.arg("v1", (12, 20), "f32", P("fsdp", "tp"), scale=0.01)
    c.arg("m2", (20, 6), "f32", P("tp", "fsdp"), scale=0.01)
    c.arg("v2", (20, 6), "f32", P("tp", "fsdp"), scale=0.01)
    for n, s in (("w1", P("fsdp", "tp")), ("w2", P("tp", "fsdp")), ("m1", P("fsdp", "tp")), ("v1", P("fsdp", "tp")), ("m2", P("tp", "fsdp")), ("v2", P("tp", "fsdp"))):
        c.out(n + "_new", s)
    c.out("loss", P())
    def f(x, y, w1, w2, m1, v1, m2, v2):
        def loss(p):
            a, b = p
            h = jnp.tanh(x @ a)
            return jnp.mean((h @ b - y) ** 2)
        l, (g1, g2) = jax.value_and_grad(loss)((w1, w2))
        def adam(w, g, m, v):
            m = 0.9 * m + 0.1 * g
            v = 0.999 * jnp.abs(v) + 0.001 * g * g
            return w - 0.01 * m / (jnp.sqrt(v) + 1e-3), m, v
        w1n, m1n, v1n = adam(w1, g1, m1, v1)
        w2n, m2n, v2n = adam(w2, g2, m2, v2)
        return w1n, w2n, m1n, v1n, m2n, v2n, l
    return f


@case("sgd_momentum_uneven_4x2", "linear+softplus regression grad, momentum SGD, w [30,13] sharded (a,b) unevenly", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h05(c):
    c.arg("x", (10, 30), "f32", P())
    c.arg("t", (10, 13), "f32", P())
    c.arg("w", (30, 13), "f32", P(), scale=0.2)
    c.arg("mom", (30, 13), "f32", P(), scale=0.05)
    c.out("w_new", P())
    c.out("mom_new", P())
    def f(x, t, w, mom):
        x = wsc(x, P("a", None)); t = wsc(t, P("a", "b"))
        w = wsc(w, P("a", "b")); mom = wsc(mom, P("a", "b"))
        g = jax.grad(lambda w: jnp.sum(jax.nn.softplus(x @ w) - t * (x @ w)))(w)
        mom = wsc(0.9 * mom + g, P("a", "b"))
        return wsc(w - 0.05 * mom, P("a", "b")), mom
    return f


@case("embedding_onehot_matmul_uneven", "one-hot(ids, 50) @ table[50,24] with vocab sharded 8-way (uneven), ids batch on none", (8,), ("v",), rtol=1e-5, atol=1e-5)
def _h06(c):
    c.arg("ids", (6, 7), "s32", P(None, None), lo=0, hi=50)
    c.arg("table", (50, 24), "f32", P())
    c.out("e", P(None, None, None))
    def f(ids, table):
        table = wsc(table, P("v", None))
        oh = jax.nn.one_hot(ids, 50, dtype=jnp.float32)
        return (oh @ table,)
    return f


@case("scatter_add_feature_sharded_4x2", "x.at[idx].add(upd) with table rows on a and features on b, updates features on b, duplicate indices", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h07(c):
    c.arg("table", (12, 10), "f32", P("a", "b"))
    c.arg("idx", (9,), "s32", P(None), lo=0, hi=12)
    c.arg("upd", (9, 10), "f32", P(None, "b"))
    c.out("y", P("a", "b"))
    def f(table, idx, upd):
        return (table.at[idx].add(upd),)
    return f


@case("xent_label_smoothing_mesh3d", "cross-entropy with label smoothing, logits vocab sharded on (b,c), batch on a, mean loss + per-example", (2, 2, 2), ("a", "b", "c"), rtol=1e-5, atol=1e-5)
def _h08(c):
    c.arg("logits", (6, 36), "f32", P("a", ("b", "c")), scale=4.0)
    c.arg("labels", (6,), "s32", P("a"), lo=0, hi=36)
    c.out("loss", P())
    c.out("per", P("a"))
    def f(logits, labels):
        lp = jax.nn.log_softmax(logits, axis=-1)
        oh = jax.nn.one_hot(labels, 36)
        tgt = 0.9 * oh + 0.1 / 36
        per = -jnp.sum(tgt * lp, axis=-1)
        return jnp.mean(per), per
    return f


@case("conv_nhwc_stride2_same_2x4", "NHWC conv 3x3 stride 2 SAME, batch on a, W on b (13 wide, uneven)", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h09(c):
    c.arg("x", (4, 9, 13, 3), "f32", P("a", None, None, None))
    c.arg("k", (3, 3, 3, 5), "f32", P(None, None, None, None), scale=0.3)
    c.out("y", P("a", None, None, None))
    def f(x, k):
        x = wsc(x, P("a", None, "b", None))
        return (wsc(lax.conv_general_dilated(x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")), P("a", None, "b", None)),)
    return f


@case("conv_rhs_dilated_height_8", "NHWC conv 3x3 rhs_dilation 2, explicit padding ((2,1),(1,1)), H=19 sharded 8-way", (8,), ("h",), rtol=1e-5, atol=1e-5)
def _h10(c):
    c.arg("x", (2, 19, 6, 4), "f32", P())
    c.arg("k", (3, 3, 4, 3), "f32", P(None, None, None, None), scale=0.3)
    c.out("y", P(None, None, None, None))
    def f(x, k):
        x = wsc(x, P(None, "h", None, None))
        return (wsc(lax.conv_general_dilated(x, k, (1, 1), ((2, 1), (1, 1)), rhs_dilation=(2, 2), dimension_numbers=("NHWC", "HWIO", "NHWC")), P(None, "h", None, None)),)
    return f


@case("conv_grouped_features_4x2", "grouped conv (feature_group_count=2) NHWC, batch on a, output features on b", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h11(c):
    c.arg("x", (4, 8, 8, 6), "f32", P("a", None, None, None))
    c.arg("k", (3, 3, 3, 8), "f32", P(None, None, None, "b"), scale=0.3)
    c.out("y", P("a", None, None, "b"))
    def f(x, k):
        return (lax.conv_general_dilated(x, k, (1, 1), "SAME", feature_group_count=2, dimension_numbers=("NHWC", "HWIO", "NHWC")),)
    return f


@case("conv_transpose_width_sharded", "conv_transpose stride 2 (lhs dilation) with W sharded 4-way on 2x4", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h12(c):
    c.arg("x", (2, 5, 8, 3), "f32", P("a", None, "b", None))
    c.arg("k", (3, 3, 3, 4), "f32", P(None, None, None, None), scale=0.3)
    c.out("y", P("a", None, "b", None))
    def f(x, k):
        return (lax.conv_transpose(x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),)
    return f


@case("maxpool_3x3_s2_uneven_8", "max pool 3x3 stride 2 VALID on NHWC with H=23 sharded 8-way", (8,), ("h",), rtol=0, atol=0)
def _h13(c):
    c.arg("x", (2, 23, 10, 3), "f32", P())
    c.out("y", P(None, None, None, None))
    def f(x):
        x = wsc(x, P(None, "h", None, None))
        return (wsc(lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "VALID"), P(None, "h", None, None)),)
    return f


@case("maxpool_grad_select_scatter_4x2", "grad of 2x2/2 max pool (select-and-scatter), batch on a, W on b", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h14(c):
    c.arg("x", (4, 8, 8, 2), "f32", P("a", None, "b", None))
    c.out("g", P("a", None, "b", None))
    def f(x):
        def loss(x):
            y = lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
            return jnp.sum(y * y)
        return (jax.grad(loss)(x),)
    return f


@case("cumsum_two_axis_dim_mesh3d", "cumsum + reverse cumsum of x*x along a dim sharded on two axes (b,c) of 2x2x2", (2, 2, 2), ("a", "b", "c"), rtol=1e-5, atol=1e-5)
def _h15(c):
    c.arg("x", (4, 20), "f32", P("a", ("b", "c")))
    c.out("cs", P("a", ("b", "c")))
    c.out("cl", P("a", ("b", "c")))
    def f(x):
        return jnp.cumsum(x, axis=1), jnp.flip(jnp.cumsum(jnp.flip(x * x, 1), axis=1), 1)
    return f


@case("top_k_vocab_sharded_2x4", "lax.top_k(k=5) along a vocab dim sharded on b, batch on a", (2, 4), ("a", "b"), rtol=0, atol=0)
def _h16(c):
    c.arg("x", (6, 40), "f32", P("a", "b"))
    c.out("v", P("a", None))
    c.out("i", P("a", None))
    def f(x):
        v, i = lax.top_k(x, 5)
        return v, i
    return f


@case("argmax_partial_repl_uneven", "argmax/max along dim 11 sharded on b with a replicated (partial replication)", (2, 4), ("a", "b"), rtol=0, atol=0)
def _h17(c):
    c.arg("x", (5, 11), "f32", P())
    c.out("am", P(None))
    c.out("mx", P(None))
    def f(x):
        x = wsc(x, P(None, "b"))
        return jnp.argmax(x, axis=1), jnp.max(x, axis=1)
    return f


@case("fori_dynamic_slice_rows", "fori_loop reading row i of a row-sharded matrix via dynamic_slice and writing via dynamic_update_slice", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _h18(c):
    c.arg("a", (16, 6), "f32", P("x", None))
    c.out("o", P("x", None))
    def f(a):
        def body(i, acc):
            row = lax.dynamic_slice(a, (i, 0), (1, 6))
            prev = lax.dynamic_slice(acc, (jnp.maximum(i - 1, 0), 0), (1, 6))
            return lax.dynamic_update_slice(acc, row + 0.5 * prev, (i, 0))
        return (lax.fori_loop(0, 16, body, jnp.zeros_like(a)),)
    return f


@case("kv_cache_update_2x4", "KV cache dynamic_update_slice at a runtime position: cache [B,S,H,K] batch on a, heads on b", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h19(c):
    c.arg("cache", (2, 10, 4, 3), "f32", P("a", None, "b", None))
    c.arg("new", (2, 2, 4, 3), "f32", P("a", None, "b", None))
    c.arg("pos", (), "s32", P(), value=7)
    c.arg("q", (2, 4, 3), "f32", P("a", "b", None))
    c.out("cache2", P("a", None, "b", None))
    c.out("attn", P("a", "b", None))
    def f(cache, new, pos, q):
        cache = lax.dynamic_update_slice(cache, new, (0, pos, 0, 0))
        s = jnp.einsum("bhk,bshk->bhs", q, cache)
        valid = jnp.arange(10)[None, None, :] < pos + 2
        p = jax.nn.softmax(jnp.where(valid, s, -1e9), axis=-1)
        return cache, jnp.einsum("bhs,bshk->bhk", p, cache)
    return f


@case("pad_concat_reshape_transpose_chain", "pad sharded dim, concat with shifted copy, reshape merge, transpose, on 8-way", (8,), ("x",), rtol=0, atol=0)
def _h20(c):
    c.arg("x", (12, 6), "f32", P())
    c.out("y", P(None, "x"))
    def f(x):
        x = wsc(x, P("x", None))
        p = jnp.pad(x, ((2, 2), (0, 0)))
        cat = jnp.concatenate([p, p[::-1] * 2.0], axis=1)
        r = cat.reshape(8, 2, 12).reshape(8, 24)
        return (wsc(r.T, P(None, "x")),)
    return f


@case("scan_rnn_hidden_tp_4x2", "scan RNN with hidden dim sharded on m (TP) and batch on d: carry all-gathered every step", (4, 2), ("d", "m"), rtol=1e-4, atol=1e-5)
def _h21(c):
    T, B, D, Hh = 5, 8, 6, 10
    c.arg("xs", (T, B, D), "f32", P(None, "d", None))
    c.arg("wx", (D, Hh), "f32", P(None, "m"), scale=0.4)
    c.arg("wh", (Hh, Hh), "f32", P(None, "m"), scale=0.3)
    c.out("h", P("d", "m"))
    c.out("ys", P(None, "d", "m"))
    def f(xs, wx, wh):
        def step(h, x):
            h = jnp.tanh(x @ wx + h @ wh)
            return h, h
        return lax.scan(step, jnp.zeros((B, Hh)), xs)
    return f


@case("switch_index_arg_mesh3d", "lax.switch on an index argument with 3 branches (reduce, transpose-like reshard, matmul) on 2x2x2", (2, 2, 2), ("a", "b", "c"), rtol=1e-5, atol=1e-5)
def _h22(c):
    c.arg("i", (), "s32", P(), value=1)
    c.arg("x", (8, 8), "f32", P("a", ("b", "c")))
    c.arg("w", (8, 8), "f32", P(("c", "a"), "b"), scale=0.3)
    c.out("y", P("a", ("b", "c")))
    def f(i, x, w):
        b0 = lambda x, w: x - x.sum(axis=0, keepdims=True)
        b1 = lambda x, w: x.T * 2.0
        b2 = lambda x, w: x @ w
        return (lax.switch(i, [b0, b1, b2], x, w),)
    return f


@case("bf16_attention_f32_softmax", "bf16 q/k/v attention with f32 softmax, batch on a, heads on b, mixed precision dots", (2, 4), ("a", "b"), rtol=3e-2, atol=3e-2)
def _h23(c):
    c.arg("q", (2, 4, 6, 8), "bf16", P("a", "b", None, None))
    c.arg("k", (2, 4, 6, 8), "bf16", P("a", "b", None, None))
    c.arg("v", (2, 4, 6, 8), "bf16", P("a", "b", None, None))
    c.out("o", P("a", "b", None, None))
    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * 0.35
        p = jax.nn.softmax(s, axis=-1).astype(jnp.bfloat16)
        return (jnp.einsum("bhqk,bhkd->bhqd", p, v),)
    return f


@case("reshard_axis_order_swap_2x4", "reshard P(('a','b')) -> P(('b','a')) and 2D P('a','b') -> P('b','a') via constraints", (2, 4), ("a", "b"), rtol=0, atol=0)
def _h24(c):
    c.arg("x", (16, 3), "f32", P(("a", "b"), None))
    c.arg("y", (8, 12), "f32", P("a", "b"))
    c.out("x2", P(("b", "a"), None))
    c.out("y2", P("b", "a"))
    def f(x, y):
        return wsc(x + 1.0, P(("b", "a"), None)), wsc(y * 2.0, P("b", "a"))
    return f


@case("reshard_mesh3d_partial_to_full", "reshard 2x2x2: P('a',None) -> P(None,('c','b')) -> P(('b','c','a'),None)", (2, 2, 2), ("a", "b", "c"), rtol=0, atol=0)
def _h25(c):
    c.arg("x", (8, 12), "f32", P("a", None))
    c.out("y", P(None, ("c", "b")))
    c.out("z", P(("b", "c", "a"), None))
    def f(x):
        y = wsc(jnp.sin(x), P(None, ("c", "b")))
        z = wsc(y * 3.0, P(("b", "c", "a"), None))
        return y, z
    return f


@case("take_along_sharded_axis", "take_along_axis with indices along a dim sharded 8-way (gather along sharded dim)", (8,), ("x",), rtol=0, atol=0)
def _h26(c):
    c.arg("x", (4, 24), "f32", P(None, "x"))
    c.arg("idx", (4, 5), "s32", P(None, None), lo=0, hi=24)
    c.out("y", P(None, None))
    def f(x, idx):
        return (jnp.take_along_axis(x, idx, axis=1),)
    return f


@case("flip_roll_sharded", "jnp.flip and jnp.roll along a dim sharded 4-way (uneven 18) on 4x2", (4, 2), ("a", "b"), rtol=0, atol=0)
def _h27(c):
    c.arg("x", (18, 6), "f32", P(None, "b"))
    c.out("fl", P(None, "b"))
    c.out("ro", P(None, "b"))
    def f(x):
        x = wsc(x, P("a", "b"))
        return wsc(jnp.flip(x, axis=0), P("a", "b")), wsc(jnp.roll(x, 5, axis=0), P("a", "b"))
    return f


@case("triu_mask_uneven_2x4", "jnp.triu/tril with offsets on a 2D array of uneven dims sharded (a,b)", (2, 4), ("a", "b"), rtol=0, atol=0)
def _h28(c):
    c.arg("x", (7, 10), "f32", P())
    c.out("u", P())
    c.out("l", P())
    def f(x):
        x = wsc(x, P("a", "b"))
        return wsc(jnp.triu(x, 1), P("a", "b")), wsc(jnp.tril(x, -2), P("b", None))
    return f


@case("shard_map_ring_fori", "shard_map: fori_loop ring of ppermute accumulating partial matmuls (ring all-gather matmul), then psum over nothing", (8,), ("x",), rtol=1e-4, atol=1e-5, manual=True)
def _h29(c):
    c.arg("x", (16, 8), "f32", P("x", None))
    c.arg("w", (8, 24), "f32", P(None, "x"), scale=0.3)
    c.out("y", P(None, "x"))
    def body(x, w):
        n = 8
        perm = [(j, (j + 1) % n) for j in range(n)]
        idx = lax.axis_index("x")
        out = lax.pcast(jnp.zeros((16, 3), jnp.float32), ("x",), to="varying")
        def step(i, carry):
            out, blk = carry
            src = (idx - i) % n
            out = lax.dynamic_update_slice(out, blk @ w, (src * 2, 0))
            return out, lax.ppermute(blk, "x", perm)
        out, _ = lax.fori_loop(0, n, step, (out, x))
        return out
    def f(x, w):
        return (smap(body, (P("x", None), P(None, "x")), P(None, "x"))(x, w),)
    return f


@case("shard_map_2d_allgather_pmean", "shard_map on 2x4: all_gather over b (not tiled), pmean over a, axis_index arithmetic", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5, manual=True)
def _h30(c):
    c.arg("x", (4, 8), "f32", P("a", "b"))
    c.out("g", P("a", None))
    c.out("m", P(None, "b"))
    def body(x):
        g = lax.all_gather(x, "b", axis=1, tiled=True)
        m = lax.pmean(x, "a") + lax.axis_index("b").astype(jnp.float32)
        return g, m
    def f(x):
        return jax.shard_map(body, mesh=Ctx.mesh, in_specs=(P("a", "b"),), out_specs=(P("a", None), P(None, "b")), check_vma=False)(x)
    return f


@case("rmsnorm_mlp_grad_bf16_2x4", "bf16 RMSNorm+SwiGLU MLP loss grad wrt weights (f32 loss), dp x tp", (2, 4), ("d", "m"), rtol=5e-2, atol=5e-2)
def _h31(c):
    c.arg("x", (4, 16), "bf16", P("d", None))
    c.arg("g", (16,), "bf16", P(None), scale=0.5)
    c.arg("wg", (16, 24), "bf16", P(None, "m"), scale=0.3)
    c.arg("wu", (16, 24), "bf16", P(None, "m"), scale=0.3)
    c.arg("wd", (24, 16), "bf16", P("m", None), scale=0.3)
    c.out("dwg", P(None, "m"))
    c.out("dwu", P(None, "m"))
    c.out("dwd", P("m", None))
    def f(x, g, wg, wu, wd):
        def loss(p):
            wg, wu, wd = p
            xf = x.astype(jnp.float32)
            h = (xf * lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(jnp.bfloat16) * (1 + g)
            a = jax.nn.silu(h @ wg) * (h @ wu)
            y = a @ wd
            return jnp.mean(y.astype(jnp.float32) ** 2)
        return jax.grad(loss)((wg, wu, wd))
    return f


@case("var_mean_multi_axes_mesh3d", "jnp.var/mean over axes (0,2) of a 3D array sharded on all three mesh axes (uneven 5)", (2, 2, 2), ("a", "b", "c"), rtol=1e-5, atol=1e-5)
def _h32(c):
    c.arg("x", (4, 6, 5), "f32", P("a", "b"), scale=3.0)
    c.out("v", P("b"))
    c.out("m", P("b"))
    def f(x):
        x = wsc(x, P("a", "b", "c"))
        return jnp.var(x, axis=(0, 2)), jnp.mean(x, axis=(0, 2))
    return f


@case("segment_sum_ids_sharded", "jax.ops.segment_sum with data and segment ids sharded 8-way, 7 segments", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _h33(c):
    c.arg("data", (24, 5), "f32", P("x", None))
    c.arg("seg", (24,), "s32", P("x"), lo=0, hi=7)
    c.out("s", P(None, None))
    def f(data, seg):
        return (jax.ops.segment_sum(data, seg, num_segments=7),)
    return f


@case("batched_matmul_contract_sharded_uneven", "einsum bij,bjk->bik with b on a (uneven 3), j (contracting, 9) on b", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h34(c):
    c.arg("x", (3, 5, 9), "f32", P())
    c.arg("y", (3, 9, 7), "f32", P())
    c.out("z", P())
    def f(x, y):
        x = wsc(x, P("a", None, "b")); y = wsc(y, P("a", "b", None))
        return (wsc(jnp.einsum("bij,bjk->bik", x, y), P("a", None, None)),)
    return f


@case("dot_conflicting_same_axis_8", "x[M,K] sharded on M over x and w[K,N] sharded on K over the same axis x; output sharded on N", (8,), ("x",), rtol=1e-4, atol=1e-5)
def _h35(c):
    c.arg("x", (16, 24), "f32", P("x", None))
    c.arg("w", (24, 16), "f32", P("x", None), scale=0.3)
    c.out("y", P(None, "x"))
    def f(x, w):
        return (x @ w,)
    return f


@case("clip_global_norm_2x4", "gradient clipping by global norm over three differently sharded params, then SGD", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h36(c):
    c.arg("g1", (8, 12), "f32", P("a", "b"))
    c.arg("g2", (12,), "f32", P("b"))
    c.arg("g3", (6, 10), "f32", P(None, "a"))
    c.arg("p1", (8, 12), "f32", P("a", "b"))
    c.arg("p2", (12,), "f32", P("b"))
    c.arg("p3", (6, 10), "f32", P(None, "a"))
    c.out("q1", P("a", "b"))
    c.out("q2", P("b"))
    c.out("q3", P(None, "a"))
    c.out("norm", P())
    def f(g1, g2, g3, p1, p2, p3):
        n = jnp.sqrt(jnp.sum(g1 * g1) + jnp.sum(g2 * g2) + jnp.sum(g3 * g3))
        s = jnp.minimum(1.0, 1.5 / n)
        return p1 - 0.1 * s * g1, p2 - 0.1 * s * g2, p3 - 0.1 * s * g3, n
    return f


@case("while_convergence_rowsharded", "while_loop with data-dependent stop (norm of a row-sharded vector), matvec inside (power iteration)", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h37(c):
    c.arg("m", (12, 12), "f32", P("a", "b"), scale=0.3)
    c.arg("v", (12,), "f32", P("a"))
    c.out("v", P("a"))
    c.out("it", P())
    def f(m, v):
        def cond(s):
            v, it, d = s
            return (it < 20) & (d > 1e-3)
        def body(s):
            v, it, d = s
            w = m @ v + 0.1 * v
            w = w / jnp.linalg.norm(w)
            return w, it + 1, jnp.max(jnp.abs(w - v))
        v, it, _ = lax.while_loop(cond, body, (v, jnp.int32(0), jnp.float32(1.0)))
        return v, it
    return f


@case("sort_multi_operand_rows_2x2x2", "jnp.sort and argsort along dim 1 (sharded on c) with rows on (a,b), 2x2x2", (2, 2, 2), ("a", "b", "c"), rtol=0, atol=0)
def _h38(c):
    c.arg("x", (8, 10), "f32", P(("a", "b"), "c"))
    c.out("s", P(("a", "b"), "c"))
    c.out("i", P(("a", "b"), None))
    def f(x):
        return jnp.sort(x, axis=1), jnp.argsort(x, axis=1)
    return f


@case("slice_strided_concat_uneven_2x4", "strided slices x[1::3], x[::2] of a dim sharded 4-way plus concat and reverse on 2x4", (2, 4), ("a", "b"), rtol=0, atol=0)
def _h39(c):
    c.arg("x", (4, 25), "f32", P("a", None))
    c.out("y", P("a", None))
    def f(x):
        x = wsc(x, P("a", "b"))
        return (wsc(jnp.concatenate([x[:, 1::3], x[:, ::2][:, ::-1]], axis=1), P("a", "b")),)
    return f


@case("conv1d_causal_seq_sharded", "causal 1D conv (NWC, left pad 3, kernel 4) over sequence sharded 8-way, depthwise-then-pointwise", (8,), ("s",), rtol=1e-5, atol=1e-5)
def _h40(c):
    c.arg("x", (2, 32, 6), "f32", P(None, "s", None))
    c.arg("kd", (4, 1, 6), "f32", P(None, None, None), scale=0.5)
    c.arg("kp", (1, 6, 8), "f32", P(None, None, None), scale=0.5)
    c.out("y", P(None, "s", None))
    def f(x, kd, kp):
        h = lax.conv_general_dilated(x, kd, (1,), ((3, 0),), feature_group_count=6, dimension_numbers=("NWC", "WIO", "NWC"))
        return (lax.conv_general_dilated(jax.nn.gelu(h), kp, (1,), ((0, 0),), dimension_numbers=("NWC", "WIO", "NWC")),)
    return f




# (ninth set, continued)

@case("avgpool_grad_batch_8", "grad of 3x3 stride-2 SAME avg pool (pad + base-dilated reduce-window in backward), batch sharded 8-way", (8,), ("b",), rtol=1e-5, atol=1e-5)
def _k01(c):
    c.arg("x", (8, 9, 9, 2), "f32", P("b", None, None, None))
    c.out("g", P("b", None, None, None))
    def f(x):
        def loss(x):
            y = lax.reduce_window(x, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME") / 9.0
            return jnp.sum(jnp.sin(y))
        return (jax.grad(loss)(x),)
    return f


@case("conv_input_grad_height_sharded", "grad wrt input of a 3x3 stride-2 conv (lhs-dilated conv in backward), H sharded 4-way, batch on a", (2, 4), ("a", "h"), rtol=1e-4, atol=1e-5)
def _k02(c):
    c.arg("x", (2, 16, 6, 3), "f32", P("a", "h", None, None))
    c.arg("k", (3, 3, 3, 4), "f32", P(), scale=0.3)
    c.out("gx", P("a", "h", None, None))
    def f(x, k):
        def loss(x):
            y = lax.conv_general_dilated(x, k, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return jnp.sum(y * y)
        return (jax.grad(loss)(x),)
    return f


@case("conv_kernel_grad_batch_spatial_2x4", "grad wrt kernel of 3x3 conv with batch on a and W on b (batch/spatial become contracting dims)", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-4)
def _k03(c):
    c.arg("x", (4, 6, 8, 3), "f32", P("a", None, "b", None))
    c.arg("k", (3, 3, 3, 5), "f32", P(), scale=0.3)
    c.out("gk", P())
    def f(x, k):
        def loss(k):
            y = lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return jnp.sum(jnp.tanh(y))
        return (jax.grad(loss)(k),)
    return f


@case("dus_uneven_runtime_offset_8", "dynamic_update_slice of a [5,6] block at a runtime row offset into [30,6] sharded 8-way (uneven), then dynamic_slice back", (8,), ("x",), rtol=0, atol=0)
def _k04(c):
    c.arg("buf", (30, 6), "f32", P())
    c.arg("blk", (5, 6), "f32", P())
    c.arg("off", (), "s32", P(), value=11)
    c.out("buf2", P())
    c.out("rd", P())
    def f(buf, blk, off):
        buf = wsc(buf, P("x", None))
        b2 = wsc(lax.dynamic_update_slice(buf, blk * 3.0, (off, 0)), P("x", None))
        rd = lax.dynamic_slice(b2, (off + 2, 1), (7, 4))
        return b2, rd
    return f


@case("vmap_dynamic_slice_gather_batch", "vmap of dynamic_slice with per-example start (batched gather), batch on a, features on b", (4, 2), ("a", "b"), rtol=0, atol=0)
def _k05(c):
    c.arg("x", (8, 20, 6), "f32", P("a", None, "b"))
    c.arg("starts", (8,), "s32", P("a"), lo=0, hi=20)
    c.out("y", P("a", None, "b"))
    def f(x, starts):
        return (jax.vmap(lambda r, s: lax.dynamic_slice(r, (s, 0), (4, 6)))(x, starts),)
    return f


@case("scatter_max_sharded_indices", "x.at[idx].max(upd) with indices and updates sharded 8-way along the index dim", (8,), ("x",), rtol=0, atol=0)
def _k06(c):
    c.arg("table", (10, 4), "f32", P(None, None))
    c.arg("idx", (16,), "s32", P("x"), lo=0, hi=10)
    c.arg("upd", (16, 4), "f32", P("x", None), scale=2.0)
    c.out("y", P(None, None))
    def f(table, idx, upd):
        return (table.at[idx].max(upd),)
    return f


@case("cumsum_bf16_uneven_8", "cumsum in bf16 and f32 along a dim of 20 sharded 8-way (uneven via constraint)", (8,), ("x",), rtol=2e-2, atol=5e-2)
def _k07(c):
    c.arg("x", (3, 20), "bf16", P())
    c.out("cb", P())
    c.out("cf", P())
    def f(x):
        x = wsc(x, P(None, "x"))
        return wsc(jnp.cumsum(x, axis=1), P(None, "x")), wsc(jnp.cumsum(x.astype(jnp.float32), axis=1), P(None, "x"))
    return f


@case("scan_stacked_ys_feature_sharded", "scan emitting stacked ys [T,B,F] with F sharded on m and B on d, carry is a running EMA", (2, 4), ("d", "m"), rtol=1e-5, atol=1e-5)
def _k08(c):
    c.arg("xs", (7, 4, 12), "f32", P(None, "d", "m"))
    c.arg("h0", (4, 12), "f32", P("d", "m"))
    c.out("h", P("d", "m"))
    c.out("ys", P(None, "d", "m"))
    def f(xs, h0):
        def step(h, x):
            h = 0.8 * h + 0.2 * jnp.tanh(x)
            return h, h * jnp.sum(h, axis=1, keepdims=True)
        return lax.scan(step, h0, xs)
    return f


@case("reshape_merge_uneven_4x2", "reshape [6,10]->[60] and [60]->[4,15] where dim 0 (6) is sharded 4-way (uneven)", (4, 2), ("a", "b"), rtol=0, atol=0)
def _k09(c):
    c.arg("x", (6, 10), "f32", P())
    c.out("y", P())
    c.out("z", P())
    def f(x):
        x = wsc(x, P("a", None))
        y = wsc(x.reshape(60) + 1.0, P("a"))
        z = wsc(y.reshape(4, 15) * 2.0, P("a", None))
        return y, z
    return f


@case("top_k_uneven_8", "top_k(k=3) along a dim of 30 sharded 8-way (uneven) with rows replicated", (8,), ("x",), rtol=0, atol=0)
def _k10(c):
    c.arg("x", (4, 30), "f32", P())
    c.out("v", P())
    c.out("i", P())
    def f(x):
        x = wsc(x, P(None, "x"))
        v, i = lax.top_k(x, 3)
        return v, i
    return f


@case("cond_branches_differ_shardings_2x4", "lax.cond whose branches constrain intermediates to different shardings (same branch result sharding)", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _k11(c):
    c.arg("p", (), "s32", P(), value=0)
    c.arg("x", (8, 12), "f32", P("a", "b"))
    c.out("y", P("b", None))
    def f(p, x):
        def t(x):
            return wsc(wsc(jnp.exp(x * 0.5), P(None, "a")) * 2.0, P("b", "a"))
        def e(x):
            return wsc(wsc(x * 3.0, P("a", None)) - 1.0, P("b", "a"))
        return (lax.cond(p > 0, t, e, x),)
    return f


@case("context_parallel_attention_mesh3d", "attention with batch on a, heads on b, query sequence on c (k/v sequence replicated over c)", (2, 2, 2), ("a", "b", "c"), rtol=1e-4, atol=1e-5)
def _k12(c):
    B, H, S, K = 2, 4, 8, 6
    c.arg("q", (B, H, S, K), "f32", P("a", "b", "c", None))
    c.arg("k", (B, H, S, K), "f32", P("a", "b", None, None))
    c.arg("v", (B, H, S, K), "f32", P("a", "b", None, None))
    c.out("o", P("a", "b", "c", None))
    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(K)
        qi = lax.broadcasted_iota(jnp.int32, (S, S), 0)
        ki = lax.broadcasted_iota(jnp.int32, (S, S), 1)
        s = jnp.where(qi >= ki, s, -1e30)
        p = jax.nn.softmax(s, axis=-1)
        return (jnp.einsum("bhqk,bhkd->bhqd", p, v),)
    return f


@case("roll_even_8", "jnp.roll by 3 and by -5 along a dim of 16 sharded 8-way (even)", (8,), ("x",), rtol=0, atol=0)
def _k13(c):
    c.arg("x", (16, 4), "f32", P("x", None))
    c.out("a", P("x", None))
    c.out("b", P("x", None))
    def f(x):
        return jnp.roll(x, 3, axis=0), jnp.roll(x, -5, axis=0)
    return f


@case("pad_reflect_edge_sharded_2x4", "jnp.pad modes reflect and edge on a dim sharded 4-way", (2, 4), ("a", "b"), rtol=0, atol=0)
def _k14(c):
    c.arg("x", (4, 16), "f32", P("a", "b"))
    c.out("r", P("a", None))
    c.out("e", P("a", None))
    def f(x):
        return jnp.pad(x, ((0, 0), (3, 2)), mode="reflect"), jnp.pad(x, ((0, 0), (1, 4)), mode="edge")
    return f


@case("embedding_bf16_hidden_sharded_4x2", "bf16 embedding table [37,16] sharded on hidden (b) with ids batch on a, plus position embedding add", (4, 2), ("a", "b"), rtol=0, atol=0)
def _k15(c):
    c.arg("ids", (8, 5), "s32", P("a", None), lo=0, hi=37)
    c.arg("table", (37, 16), "bf16", P(None, "b"))
    c.arg("pos", (5, 16), "bf16", P(None, "b"))
    c.out("e", P("a", None, "b"))
    def f(ids, table, pos):
        return (jnp.take(table, ids, axis=0) + pos[None],)
    return f


@case("heads_merge_uneven_transpose", "[B,H,S,K] with H=6 sharded 4-way (uneven) transposed to [B,S,H,K] and merged to [B,S,H*K] then projected", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _k16(c):
    c.arg("o", (2, 6, 5, 4), "f32", P())
    c.arg("w", (24, 8), "f32", P(), scale=0.3)
    c.out("y", P("a", None, None))
    def f(o, w):
        o = wsc(o, P("a", "b", None, None))
        m = o.transpose(0, 2, 1, 3).reshape(2, 5, 24)
        return (m @ w,)
    return f


@case("window_sum_stride4_uneven_8", "reduce_window sum size 4 stride 4 and size 3 stride 1 on a dim of 36 sharded 8-way (uneven)", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _k17(c):
    c.arg("x", (36, 3), "f32", P())
    c.out("s4", P())
    c.out("s3", P())
    def f(x):
        x = wsc(x, P("x", None))
        s4 = lax.reduce_window(x, 0.0, lax.add, (4, 1), (4, 1), "VALID")
        s3 = lax.reduce_window(x, 0.0, lax.add, (3, 1), (1, 1), "SAME")
        return wsc(s4, P("x", None)), wsc(s3, P("x", None))
    return f


@case("dot_batch_dim_sharded_differently", "einsum bij,bjk->bik with batch sharded on a in lhs and on b in rhs (2x4)", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _k18(c):
    c.arg("x", (8, 6, 5), "f32", P("a", None, None))
    c.arg("y", (8, 5, 7), "f32", P("b", None, None))
    c.out("z", P(("a", "b"), None, None))
    def f(x, y):
        return (jnp.einsum("bij,bjk->bik", x, y),)
    return f


@case("shard_map_scan_psum", "shard_map over 2x4 where a scan body does psum over b and ppermute over a each step", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5, manual=True)
def _k19(c):
    c.arg("x", (4, 8), "f32", P("a", "b"))
    c.out("y", P("a", "b"))
    def body(x):
        def step(h, _):
            s = lax.psum(h, "b")
            h = 0.5 * h + 0.1 * s
            h = lax.ppermute(h, "a", [(0, 1), (1, 0)])
            return h, None
        h, _ = lax.scan(step, x, None, length=3)
        return h
    def f(x):
        return (smap(body, (P("a", "b"),), P("a", "b"))(x),)
    return f


@case("reduce_precision_logsumexp_partial", "logsumexp over a dim sharded on b with rows partially replicated, plus stop_gradient max trick", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _k20(c):
    c.arg("x", (6, 24), "f32", P(None, "b"), scale=5.0)
    c.out("l", P(None))
    c.out("sm", P(None, "b"))
    def f(x):
        m = lax.stop_gradient(jnp.max(x, axis=1, keepdims=True))
        l = jnp.log(jnp.sum(jnp.exp(x - m), axis=1)) + m[:, 0]
        return l, jnp.exp(x - l[:, None])
    return f


# --- tenth set: whole programs (transformer layers forward+backward with Adam under TP,
# FSDP+TP, sequence and data parallelism; top-2 MoE; ResNet-style train steps; KV-cache
# decode; rotary embeddings; gradient accumulation; sort/unique/searchsorted; uneven
# cumulative ops; mixed precision), written after the pipeline was done -------------------

def _named(names, impl):
    src = "def f(%s):\n    return impl(%s)\n" % (", ".join(names), ", ".join(names))
    ns = {"impl": impl}
    exec(src, ns)
    return ns["f"]


def _ln(x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps)


def _adam(w, g, m, v, lr=0.01):
    m = 0.9 * m + 0.1 * g
    v = 0.999 * jnp.abs(v) + 0.001 * g * g
    return w - lr * (m / 0.1) / (jnp.sqrt(v / 0.001) + 1e-6), m, v


def _block(p, x, S, K, causal=True, sp=None):
    wq, wk, wv, wo, w1, w2 = p
    h = _ln(x)
    q = jnp.einsum("bsd,dhk->bshk", h, wq)
    k = jnp.einsum("bsd,dhk->bshk", h, wk)
    v = jnp.einsum("bsd,dhk->bshk", h, wv)
    s = jnp.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(K)
    if causal:
        mask = jnp.tril(jnp.ones((S, S), bool))
        s = jnp.where(mask, s, -1e9)
    a = jax.nn.softmax(s, -1)
    o = jnp.einsum("bhqs,bshk->bqhk", a, v)
    x = x + jnp.einsum("bqhk,hkd->bqd", o, wo)
    if sp is not None:
        x = wsc(x, sp)
    h = _ln(x)
    x = x + jax.nn.gelu(h @ w1) @ w2
    if sp is not None:
        x = wsc(x, sp)
    return x


def _transformer_train(c, B, S, D, H, K, F, xs, wspecs, adam=True):
    c.arg("x", (B, S, D), "f32", xs)
    c.arg("y", (B, S, D), "f32", xs)
    wn = ["wq", "wk", "wv", "wo", "w1", "w2"]
    shapes = [(D, H, K), (D, H, K), (D, H, K), (H, K, D), (D, F), (F, D)]
    for n, s, sp in zip(wn, shapes, wspecs):
        c.arg(n, s, "f32", sp, scale=0.3)
    if adam:
        for n, s, sp in zip(wn, shapes, wspecs):
            c.arg("m_" + n, s, "f32", sp, scale=0.01)
            c.arg("v_" + n, s, "f32", sp, scale=0.01)
    for n, sp in zip(wn, wspecs):
        c.out(n + "_new", sp)
    if adam:
        for n, sp in zip(wn, wspecs):
            c.out("m_" + n + "_new", sp)
            c.out("v_" + n + "_new", sp)
    c.out("loss", P())
    names = ["x", "y"] + wn + ([p + n for n in wn for p in ("m_", "v_")] if adam else [])

    def impl(x, y, *rest):
        p = tuple(rest[:6])
        def loss(p):
            return jnp.mean((_block(p, x, S, K) - y) ** 2)
        l, g = jax.value_and_grad(loss)(p)
        if not adam:
            return tuple(w - 0.1 * gi for w, gi in zip(p, g)) + (l,)
        st = rest[6:]
        ws, ms, vs = [], [], []
        for i in range(6):
            w, m, v = _adam(p[i], g[i], st[2 * i], st[2 * i + 1])
            ws.append(w); ms.append(m); vs.append(v)
        mv = []
        for m, v in zip(ms, vs):
            mv += [m, v]
        return tuple(ws) + tuple(mv) + (l,)
    return _named(names, impl)


@case("transformer_train_adam_2x4", "full pre-LN transformer layer (causal MHA + GELU MLP) fwd+bwd with Adam; batch on data, heads/ffn on model (Megatron TP)", (2, 4), ("data", "model"), rtol=2e-4, atol=2e-5)
def _q01(c):
    M = "model"
    return _transformer_train(c, 4, 8, 16, 4, 4, 32, P("data", None, None),
                              [P(None, M, None), P(None, M, None), P(None, M, None), P(M, None, None), P(None, M), P(M, None)])


@case("transformer_train_fsdp_tp_mesh3d", "transformer layer train step with Adam on 2x2x2 (dp,fsdp,tp): weights FSDP-sharded on fsdp and TP on tp, batch on (dp,fsdp)", (2, 2, 2), ("dp", "fsdp", "tp"), rtol=2e-4, atol=2e-5)
def _q02(c):
    return _transformer_train(c, 4, 6, 8, 2, 4, 12, P(("dp", "fsdp"), None, None),
                              [P("fsdp", "tp", None), P("fsdp", "tp", None), P("fsdp", "tp", None), P("tp", None, "fsdp"), P("fsdp", "tp"), P("tp", "fsdp")])


@case("transformer_train_seqpar_uneven_4x2", "transformer layer SGD step with Megatron sequence parallelism: residual stream constrained to S (9, uneven) on a, heads/ffn on b", (4, 2), ("a", "b"), rtol=2e-4, atol=2e-5)
def _q03(c):
    B, S, D, H, K, F = 2, 9, 8, 2, 4, 16
    c.arg("x", (B, S, D), "f32", P())
    c.arg("y", (B, S, D), "f32", P())
    wn = ["wq", "wk", "wv", "wo", "w1", "w2"]
    shapes = [(D, H, K), (D, H, K), (D, H, K), (H, K, D), (D, F), (F, D)]
    sps = [P(None, "b", None)] * 3 + [P("b", None, None), P(None, "b"), P("b", None)]
    for n, s, sp in zip(wn, shapes, sps):
        c.arg(n, s, "f32", sp, scale=0.3)
    for n, sp in zip(wn, sps):
        c.out(n + "_new", sp)
    c.out("loss", P())
    sp = P(None, "a", None)

    def impl(x, y, *p):
        x = wsc(x, sp)
        def loss(p):
            return jnp.mean((_block(p, x, S, K, sp=sp) - y) ** 2)
        l, g = jax.value_and_grad(loss)(tuple(p))
        return tuple(w - 0.1 * gi for w, gi in zip(p, g)) + (l,)
    return _named(["x", "y"] + wn, impl)


@case("transformer_fwd_dp_only_8", "transformer layer SGD step, pure data parallel (batch 8-way), weights replicated (grad all-reduce)", (8,), ("dp",), rtol=2e-4, atol=2e-5)
def _q04(c):
    return _transformer_train(c, 8, 5, 8, 2, 4, 12, P("dp", None, None), [P()] * 6, adam=False)


def _moe(x, wr, w_in, w_out, E, C=None):
    logits = x @ wr
    probs = jax.nn.softmax(logits, -1)
    vals, idx = lax.top_k(probs, 2)
    gates = vals / jnp.sum(vals, -1, keepdims=True)
    oh = jax.nn.one_hot(idx, E, dtype=x.dtype)  # [T,2,E]
    if C is None:
        combine = jnp.einsum("tk,tke->te", gates, oh)
        mask = jnp.sum(oh, 1)
        xe = jnp.einsum("te,td->etd", mask, x)
        h = jax.nn.gelu(jnp.einsum("etd,edf->etf", xe, w_in))
        oe = jnp.einsum("etf,efd->etd", h, w_out)
        return jnp.einsum("etd,te->td", oe, combine)
    T = x.shape[0]
    flat = oh.reshape(T * 2, E)  # slot-major positions
    pos = jnp.cumsum(flat, axis=0) * flat - flat  # position in expert
    pos = pos.reshape(T, 2, E)
    keep = (pos < C) * oh
    disp = jnp.einsum("tke,tkec->tec", keep, jax.nn.one_hot(jnp.sum(pos * oh, -1).astype(jnp.int32), C, dtype=x.dtype)[:, :, None, :] * jnp.ones((1, 1, E, 1), x.dtype))
    comb = jnp.einsum("tk,tke,tkec->tec", gates, keep, jax.nn.one_hot(jnp.sum(pos * oh, -1).astype(jnp.int32), C, dtype=x.dtype)[:, :, None, :] * jnp.ones((1, 1, E, 1), x.dtype))
    xe = jnp.einsum("tec,td->ecd", disp, x)
    h = jax.nn.gelu(jnp.einsum("ecd,edf->ecf", xe, w_in))
    oe = jnp.einsum("ecf,efd->ecd", h, w_out)
    return jnp.einsum("ecd,tec->td", oe, comb)


@case("moe_top2_dense_expert_sharded_8", "MoE top-2 routing (dense one-hot dispatch), 8 experts sharded 8-way, tokens sharded 8-way on the same axis", (8,), ("e",), rtol=1e-4, atol=1e-5)
def _q05(c):
    T, D, E, F = 24, 8, 8, 12
    c.arg("x", (T, D), "f32", P("e", None))
    c.arg("wr", (D, E), "f32", P())
    c.arg("w_in", (E, D, F), "f32", P("e", None, None), scale=0.4)
    c.arg("w_out", (E, F, D), "f32", P("e", None, None), scale=0.4)
    c.out("y", P("e", None))
    def f(x, wr, w_in, w_out):
        return (x + _moe(x, wr, w_in, w_out, E),)
    return f


@case("moe_top2_capacity_grad_2x4", "Switch-style MoE top-2 with capacity (cumsum positions, dispatch/combine tensors), experts on expert axis, tokens on data; grad wrt router and experts", (2, 4), ("data", "expert"), rtol=2e-4, atol=2e-5)
def _q06(c):
    T, D, E, F, C = 16, 8, 4, 10, 6
    c.arg("x", (T, D), "f32", P("data", None))
    c.arg("wr", (D, E), "f32", P())
    c.arg("w_in", (E, D, F), "f32", P("expert", None, None), scale=0.4)
    c.arg("w_out", (E, F, D), "f32", P("expert", None, None), scale=0.4)
    c.out("loss", P())
    c.out("g_wr", P())
    c.out("g_in", P("expert", None, None))
    c.out("g_out", P("expert", None, None))
    def f(x, wr, w_in, w_out):
        def loss(wr, w_in, w_out):
            y = _moe(x, wr, w_in, w_out, E, C=C)
            return jnp.mean((x + y) ** 2)
        l, g = jax.value_and_grad(loss, argnums=(0, 1, 2))(wr, w_in, w_out)
        return (l,) + g
    return f


@case("moe_top2_uneven_experts_4x2", "MoE top-2, 6 experts on a 4-way axis (uneven via constraint), tokens on b, expert FFN hidden 10", (4, 2), ("e", "t"), rtol=1e-4, atol=1e-5)
def _q07(c):
    T, D, E, F = 10, 6, 6, 10
    c.arg("x", (T, D), "f32", P("t", None))
    c.arg("wr", (D, E), "f32", P())
    c.arg("w_in", (E, D, F), "f32", P(), scale=0.4)
    c.arg("w_out", (E, F, D), "f32", P(), scale=0.4)
    c.out("y", P("t", None))
    def f(x, wr, w_in, w_out):
        w_in = wsc(w_in, P("e", None, None)); w_out = wsc(w_out, P("e", None, None))
        return (_moe(x, wr, w_in, w_out, E),)
    return f


def _bn(x, g, b):
    mu = jnp.mean(x, axis=(0, 1, 2))
    var = jnp.mean((x - mu) ** 2, axis=(0, 1, 2))
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


def _conv(x, k, s=1, pad="SAME"):
    return lax.conv_general_dilated(x, k, (s, s), pad, dimension_numbers=("NHWC", "HWIO", "NHWC"))


def _maxpool(x, pad="SAME"):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), pad)


def _resnet_train(c, N, Hs, Ws, xs, ncls=5, maxpool=True):
    c.arg("x", (N, Hs, Ws, 3), "f32", xs)
    c.arg("labels", (N,), "s32", P(xs[0]), lo=0, hi=ncls)
    c.arg("k1", (3, 3, 3, 8), "f32", P(), scale=0.4)
    c.arg("k2", (3, 3, 8, 8), "f32", P(), scale=0.2)
    c.arg("ks", (1, 1, 8, 8), "f32", P(), scale=0.3)
    c.arg("g1", (8,), "f32", P(), scale=1.0)
    c.arg("b1", (8,), "f32", P(), scale=0.1)
    c.arg("wd", (8, ncls), "f32", P(), scale=0.5)
    for n in ("k1", "k2", "ks", "g1", "b1", "wd"):
        c.out(n + "_new", P())
    c.out("loss", P())
    def f(x, labels, k1, k2, ks, g1, b1, wd):
        def loss(p):
            k1, k2, ks, g1, b1, wd = p
            h = jax.nn.relu(_bn(_conv(x, k1, 2), g1, b1))
            if maxpool:
                h = _maxpool(h)
            r = h
            h = jax.nn.relu(_bn(_conv(h, k2), g1, b1))
            h = jax.nn.relu(h + _conv(r, ks))
            pooled = jnp.mean(h, axis=(1, 2))
            lg = pooled @ wd
            lp = jax.nn.log_softmax(lg)
            return -jnp.mean(jnp.take_along_axis(lp, labels[:, None], 1))
        p = (k1, k2, ks, g1, b1, wd)
        l, g = jax.value_and_grad(loss)(p)
        return tuple(w - 0.1 * gi for w, gi in zip(p, g)) + (l,)
    return f


@case("resnet_block_train_batch_spatial_2x4", "ResNet-style block train step: conv s2, batchnorm, relu, maxpool 3x3/2, conv, 1x1 shortcut, GAP, dense, xent; batch on a, H on b; SGD", (2, 4), ("a", "b"), rtol=3e-4, atol=3e-5)
def _q08(c):
    return _resnet_train(c, 4, 16, 12, P("a", "b", None, None))


@case("resnet_block_train_batch_8", "ResNet-style block train step (conv s2, BN, maxpool 3x3/2, GAP, xent) with batch sharded 8-way", (8,), ("dp",), rtol=3e-4, atol=3e-5)
def _q09(c):
    return _resnet_train(c, 8, 12, 12, P("dp", None, None, None))


@case("resnet_block_train_nopool_mesh3d", "ResNet-style block train step without maxpool, batch on a, H on b, W on c (2x2x2)", (2, 2, 2), ("a", "b", "c"), rtol=3e-4, atol=3e-5)
def _q10(c):
    return _resnet_train(c, 2, 12, 12, P("a", "b", "c", None), maxpool=False)


@case("resnet_fwd_spatial_uneven_8", "ResNet stem forward: conv 3x3 s2, inference BN, relu, maxpool 3x3 s2 VALID, GAP; H=19 sharded 8-way (uneven)", (8,), ("h",), rtol=1e-4, atol=1e-5)
def _q11(c):
    c.arg("x", (2, 19, 17, 4), "f32", P())
    c.arg("k", (3, 3, 4, 6), "f32", P(), scale=0.3)
    c.arg("mean", (6,), "f32", P(), scale=0.1)
    c.arg("var", (6,), "f32", P(), scale=0.5)
    c.out("feat", P())
    c.out("pooled", P())
    def f(x, k, mean, var):
        x = wsc(x, P(None, "h", None, None))
        h = _conv(x, k, 2)
        h = jax.nn.relu((h - mean) * lax.rsqrt(jnp.abs(var) + 0.1))
        h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "VALID")
        h = wsc(h, P(None, "h", None, None))
        return h, jnp.mean(h, axis=(1, 2))
    return f


@case("kv_cache_decode_2x4", "decode step: dynamic_update_slice of new k/v at runtime pos into KV cache [B,T,H,K] (B on data, H on model), masked attention over cache", (2, 4), ("data", "model"), rtol=1e-4, atol=1e-5)
def _q12(c):
    B, T, H, K = 2, 16, 4, 8
    c.arg("ck", (B, T, H, K), "f32", P("data", None, "model", None))
    c.arg("cv", (B, T, H, K), "f32", P("data", None, "model", None))
    c.arg("q", (B, 1, H, K), "f32", P("data", None, "model", None))
    c.arg("k", (B, 1, H, K), "f32", P("data", None, "model", None))
    c.arg("v", (B, 1, H, K), "f32", P("data", None, "model", None))
    c.arg("pos", (), "s32", P(), value=9)
    c.out("ck_new", P("data", None, "model", None))
    c.out("cv_new", P("data", None, "model", None))
    c.out("o", P("data", None, "model", None))
    def f(ck, cv, q, k, v, pos):
        ck = lax.dynamic_update_slice(ck, k, (0, pos, 0, 0))
        cv = lax.dynamic_update_slice(cv, v, (0, pos, 0, 0))
        s = jnp.einsum("bqhk,bthk->bhqt", q, ck) / np.sqrt(K)
        s = jnp.where(jnp.arange(T)[None, None, None, :] <= pos, s, -1e9)
        p = jax.nn.softmax(s, -1)
        return ck, cv, jnp.einsum("bhqt,bthk->bqhk", p, cv)
    return f


@case("kv_cache_seq_sharded_8", "KV cache with the time dim (24) sharded 8-way: dynamic_update_slice at runtime pos, attention softmax over sharded time", (8,), ("t",), rtol=1e-4, atol=1e-5)
def _q13(c):
    B, T, H, K = 2, 24, 2, 4
    c.arg("ck", (B, T, H, K), "f32", P(None, "t", None, None))
    c.arg("cv", (B, T, H, K), "f32", P(None, "t", None, None))
    c.arg("q", (B, 1, H, K), "f32", P())
    c.arg("k", (B, 1, H, K), "f32", P())
    c.arg("v", (B, 1, H, K), "f32", P())
    c.arg("pos", (), "s32", P(), value=10)
    c.out("ck_new", P(None, "t", None, None))
    c.out("cv_new", P(None, "t", None, None))
    c.out("o", P())
    def f(ck, cv, q, k, v, pos):
        ck = lax.dynamic_update_slice(ck, k, (0, pos, 0, 0))
        cv = lax.dynamic_update_slice(cv, v, (0, pos, 0, 0))
        s = jnp.einsum("bqhk,bthk->bhqt", q, ck) / np.sqrt(K)
        s = jnp.where(jnp.arange(T)[None, None, None, :] <= pos, s, -1e9)
        p = jax.nn.softmax(s, -1)
        return ck, cv, jnp.einsum("bhqt,bthk->bqhk", p, cv)
    return f


@case("kv_cache_prefill_chunk_uneven_4x2", "prefill chunk of 5 tokens written at runtime pos 7 into cache T=18 sharded 4-way (uneven), heads on b, chunked causal attention", (4, 2), ("t", "h"), rtol=1e-4, atol=1e-5)
def _q14(c):
    B, T, H, K, L = 2, 18, 2, 4, 5
    c.arg("ck", (B, T, H, K), "f32", P(None, None, "h", None))
    c.arg("cv", (B, T, H, K), "f32", P(None, None, "h", None))
    c.arg("q", (B, L, H, K), "f32", P(None, None, "h", None))
    c.arg("k", (B, L, H, K), "f32", P(None, None, "h", None))
    c.arg("v", (B, L, H, K), "f32", P(None, None, "h", None))
    c.arg("pos", (), "s32", P(), value=7)
    c.out("ck_new", P(None, None, "h", None))
    c.out("o", P(None, None, "h", None))
    def f(ck, cv, q, k, v, pos):
        ck = wsc(ck, P(None, "t", "h", None)); cv = wsc(cv, P(None, "t", "h", None))
        ck = lax.dynamic_update_slice(ck, k, (0, pos, 0, 0))
        cv = lax.dynamic_update_slice(cv, v, (0, pos, 0, 0))
        ck = wsc(ck, P(None, "t", "h", None))
        s = jnp.einsum("bqhk,bthk->bhqt", q, ck) / np.sqrt(K)
        qpos = pos + jnp.arange(L)
        s = jnp.where(jnp.arange(T)[None, :] <= qpos[:, None], s, -1e9)
        p = jax.nn.softmax(s, -1)
        return ck, jnp.einsum("bhqt,bthk->bqhk", p, cv)
    return f


def _rope(x, pos, interleaved=False):
    K = x.shape[-1]
    inv = 1.0 / (10000.0 ** (jnp.arange(0, K, 2, dtype=jnp.float32) / K))
    ang = pos[..., None].astype(jnp.float32) * inv  # [S, K/2]
    cos = jnp.cos(ang)[None, :, None, :]; sin = jnp.sin(ang)[None, :, None, :]
    if interleaved:
        xr = x.reshape(x.shape[:-1] + (K // 2, 2))
        x1, x2 = xr[..., 0], xr[..., 1]
        return jnp.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).reshape(x.shape)
    x1, x2 = x[..., :K // 2], x[..., K // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


@case("rope_attention_seq_heads_2x4", "rotary embeddings (half-split) on q/k [B,S,H,K] with S on a and H on b, then attention scores and softmax over sharded S", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _q15(c):
    B, S, H, K = 2, 12, 4, 8
    c.arg("q", (B, S, H, K), "f32", P(None, "a", "b", None))
    c.arg("k", (B, S, H, K), "f32", P(None, "a", "b", None))
    c.out("qr", P(None, "a", "b", None))
    c.out("p", P(None, "b", "a", None))
    def f(q, k):
        pos = jnp.arange(S)
        qr = _rope(q, pos); kr = _rope(k, pos)
        s = jnp.einsum("bqhk,bshk->bhqs", qr, kr) / np.sqrt(K)
        return qr, jax.nn.softmax(s, -1)
    return f


@case("rope_interleaved_seq_uneven_8", "interleaved rotary embedding (reshape K->[K/2,2], stack) with runtime position ids, S=13 sharded 8-way (uneven)", (8,), ("s",), rtol=1e-4, atol=1e-5)
def _q16(c):
    B, S, H, K = 2, 13, 2, 6
    c.arg("x", (B, S, H, K), "f32", P())
    c.arg("pos", (S,), "s32", P(), lo=0, hi=64)
    c.out("y", P())
    def f(x, pos):
        x = wsc(x, P(None, "s", None, None)); pos = wsc(pos, P("s"))
        return (wsc(_rope(x, pos, interleaved=True), P(None, "s", None, None)),)
    return f


@case("lm_head_label_smoothing_grad_uneven_vocab_4x2", "LM head h@W with vocab 37 sharded 4-way (uneven), label-smoothed xent, grad wrt W and h; batch on b", (4, 2), ("v", "b"), rtol=1e-4, atol=1e-5)
def _q17(c):
    N, D, V = 6, 16, 37
    c.arg("h", (N, D), "f32", P("b", None))
    c.arg("w", (D, V), "f32", P(), scale=0.3)
    c.arg("labels", (N,), "s32", P("b"), lo=0, hi=V)
    c.out("loss", P())
    c.out("gw", P())
    c.out("gh", P("b", None))
    def f(h, w, labels):
        w = wsc(w, P(None, "v"))
        def loss(w, h):
            lg = wsc(h @ w, P("b", "v"))
            lp = jax.nn.log_softmax(lg, -1)
            tgt = 0.9 * jax.nn.one_hot(labels, V) + 0.1 / V
            return -jnp.mean(jnp.sum(tgt * lp, -1))
        l, (gw, gh) = jax.value_and_grad(loss, argnums=(0, 1))(w, h)
        return l, gw, gh
    return f


@case("grad_accum_fori_2x4", "gradient accumulation over 4 microbatches in fori_loop (dynamic_index_in_dim), TP MLP params, batch on data, then SGD", (2, 4), ("data", "model"), rtol=1e-4, atol=1e-5)
def _q18(c):
    c.arg("xs", (4, 8, 12), "f32", P(None, "data", None))
    c.arg("ys", (4, 8, 4), "f32", P(None, "data", None))
    c.arg("w1", (12, 16), "f32", P(None, "model"), scale=0.3)
    c.arg("w2", (16, 4), "f32", P("model", None), scale=0.3)
    c.out("w1_new", P(None, "model"))
    c.out("w2_new", P("model", None))
    c.out("loss", P())
    def f(xs, ys, w1, w2):
        def loss(p, x, y):
            return jnp.mean((jnp.tanh(x @ p[0]) @ p[1] - y) ** 2)
        def body(i, carry):
            g1, g2, lt = carry
            x = lax.dynamic_index_in_dim(xs, i, 0, keepdims=False)
            y = lax.dynamic_index_in_dim(ys, i, 0, keepdims=False)
            l, (a, b) = jax.value_and_grad(loss)((w1, w2), x, y)
            return g1 + a, g2 + b, lt + l
        g1, g2, lt = lax.fori_loop(0, 4, body, (jnp.zeros_like(w1), jnp.zeros_like(w2), 0.0))
        return w1 - 0.05 * g1, w2 - 0.05 * g2, lt / 4
    return f


@case("grad_accum_scan_adam_mesh3d", "gradient accumulation with lax.scan over 3 microbatches (batch on (a,b)), params TP on c, then Adam update", (2, 2, 2), ("a", "b", "c"), rtol=1e-4, atol=1e-5)
def _q19(c):
    c.arg("xs", (3, 8, 10), "f32", P(None, ("a", "b"), None))
    c.arg("ys", (3, 8), "f32", P(None, ("a", "b")))
    c.arg("w1", (10, 6), "f32", P(None, "c"), scale=0.3)
    c.arg("w2", (6,), "f32", P("c"), scale=0.3)
    c.arg("m1", (10, 6), "f32", P(None, "c"), scale=0.01)
    c.arg("v1", (10, 6), "f32", P(None, "c"), scale=0.01)
    c.out("w1_new", P(None, "c"))
    c.out("w2_new", P("c"))
    c.out("m1_new", P(None, "c"))
    c.out("v1_new", P(None, "c"))
    def f(xs, ys, w1, w2, m1, v1):
        def loss(p, x, y):
            return jnp.mean((jax.nn.silu(x @ p[0]) @ p[1] - y) ** 2)
        def step(carry, xy):
            g = jax.grad(loss)((w1, w2), *xy)
            return jax.tree_util.tree_map(jnp.add, carry, g), None
        (g1, g2), _ = lax.scan(step, (jnp.zeros_like(w1), jnp.zeros_like(w2)), (xs, ys))
        w1n, m1n, v1n = _adam(w1, g1 / 3, m1, v1)
        return w1n, w2 - 0.01 * g2, m1n, v1n
    return f


@case("vmap_per_example_grad_clip_8", "DP-SGD: vmap(grad) per-example gradients of a softplus regression, per-example norm clipping, noise-free mean; batch 16 sharded 8-way", (8,), ("dp",), rtol=1e-4, atol=1e-5)
def _q20(c):
    c.arg("x", (16, 10), "f32", P("dp", None))
    c.arg("y", (16, 3), "f32", P("dp", None))
    c.arg("w", (10, 3), "f32", P(), scale=0.4)
    c.out("w_new", P())
    c.out("norms", P("dp"))
    def f(x, y, w):
        def loss(w, xi, yi):
            return jnp.sum((jax.nn.softplus(xi @ w) - yi) ** 2)
        g = jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))(w, x, y)
        n = jnp.sqrt(jnp.sum(g * g, axis=(1, 2)))
        g = g * jnp.minimum(1.0, 1.0 / (n + 1e-6))[:, None, None]
        return w - 0.1 * jnp.mean(g, 0), n
    return f


@case("vmap_convolve_same_4x2", "vmap(jnp.convolve mode=same) of per-example signals [8,20] (batch on a, length on b) with per-example filters [8,5]", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _q21(c):
    c.arg("x", (8, 20), "f32", P("a", "b"))
    c.arg("k", (8, 5), "f32", P("a", None))
    c.out("y", P("a", "b"))
    def f(x, k):
        return (jax.vmap(lambda a, b: jnp.convolve(a, b, mode="same"))(x, k),)
    return f


@case("einsum_three_operands_2x4", "einsum with 3 operands: bi,ij,jk->bk (chain) and bsh,hd,bd->bs, mixed shardings on 2x4", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _q22(c):
    c.arg("x", (6, 12), "f32", P("a", "b"))
    c.arg("w1", (12, 8), "f32", P("b", None), scale=0.3)
    c.arg("w2", (8, 12), "f32", P(None, "b"), scale=0.3)
    c.arg("s", (6, 5, 8), "f32", P("a", None, "b"))
    c.arg("hd", (8, 4), "f32", P())
    c.arg("bd", (6, 4), "f32", P("a", None))
    c.out("y", P("a", "b"))
    c.out("z", P("a", None))
    def f(x, w1, w2, s, hd, bd):
        return jnp.einsum("bi,ij,jk->bk", x, w1, w2), jnp.einsum("bsh,hd,bd->bs", s, hd, bd)
    return f


@case("einsum_four_operands_mesh3d", "einsum with 4 operands ab,bc,cd,de->ae and ijk,jl,kl,i->l on 2x2x2 with each operand sharded differently", (2, 2, 2), ("a", "b", "c"), rtol=1e-4, atol=1e-5)
def _q23(c):
    c.arg("p", (4, 6), "f32", P("a", "b"))
    c.arg("q", (6, 8), "f32", P("b", "c"))
    c.arg("r", (8, 6), "f32", P("c", "a"), scale=0.5)
    c.arg("s", (6, 4), "f32", P(None, "b"), scale=0.5)
    c.arg("t", (4, 6, 8), "f32", P("a", "b", "c"))
    c.arg("u", (6, 2), "f32", P("b", None))
    c.arg("v", (8, 2), "f32", P("c", None))
    c.arg("w", (4,), "f32", P("a"))
    c.out("o1", P("a", None))
    c.out("o2", P())
    def f(p, q, r, s, t, u, v, w):
        return jnp.einsum("ab,bc,cd,de->ae", p, q, r, s), jnp.einsum("ijk,jl,kl,i->l", t, u, v, w)
    return f


@case("argsort_permute_uneven_8", "argsort along a dim of 21 sharded 8-way (uneven) and take_along_axis of a second array by it, plus descending sort", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _q24(c):
    c.arg("keys", (3, 21), "f32", P())
    c.arg("vals", (3, 21), "f32", P())
    c.out("idx", P())
    c.out("sorted_vals", P())
    c.out("desc", P())
    def f(keys, vals):
        keys = wsc(keys, P(None, "x")); vals = wsc(vals, P(None, "x"))
        i = jnp.argsort(keys, axis=1)
        sv = jnp.take_along_axis(vals, i, axis=1)
        return i, wsc(sv, P(None, "x")), -jnp.sort(-keys, axis=1)
    return f


@case("unique_size_counts_2x4", "jnp.unique(size=12, fill_value=-1, return_counts, return_inverse) of ids [6,8] sharded (a,b)", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q25(c):
    c.arg("ids", (6, 8), "s32", P("a", "b"), lo=0, hi=15)
    c.out("u", P())
    c.out("inv", P())
    c.out("cnt", P())
    def f(ids):
        u, inv, cnt = jnp.unique(ids, size=12, fill_value=-1, return_inverse=True, return_counts=True)
        return u, inv.reshape(-1), cnt
    return f


@case("searchsorted_digitize_4x2", "searchsorted of sharded queries [8,6] (a,b) into a sorted table of 33 (sorted in-program), left and right sides, plus digitize", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q26(c):
    c.arg("table", (33,), "f32", P())
    c.arg("q", (8, 6), "f32", P("a", "b"))
    c.out("l", P("a", "b"))
    c.out("r", P("a", "b"))
    c.out("d", P("a", "b"))
    def f(table, q):
        t = jnp.sort(table)
        return (jnp.searchsorted(t, q, side="left").astype(jnp.int32), jnp.searchsorted(t, q, side="right").astype(jnp.int32),
                jnp.digitize(q, t[::4]).astype(jnp.int32))
    return f


@case("cumsum_uneven_both_dims_2x4", "cumsum along dim 0 (5 over 2) and dim 1 (13 over 4), both sharded unevenly, plus reverse cumsum and int cumsum", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q28(c):
    c.arg("x", (5, 13), "f32", P())
    c.arg("n", (5, 13), "s32", P(), lo=-3, hi=4)
    c.out("c0", P())
    c.out("c1", P())
    c.out("rc", P())
    c.out("ci", P())
    def f(x, n):
        x = wsc(x, P("a", "b")); n = wsc(n, P("a", "b"))
        return jnp.cumsum(x, 0), jnp.cumsum(x, 1), lax.cumsum(x, 1, reverse=True), jnp.cumsum(n, 1)
    return f


@case("cummax_cumprod_uneven_8", "lax.cummax and cumprod along a dim of 10 sharded 8-way (uneven)", (8,), ("x",), rtol=1e-5, atol=1e-6)
def _q29(c):
    c.arg("x", (3, 10), "f32", P())
    c.out("mx", P())
    c.out("pr", P())
    def f(x):
        x = wsc(x, P(None, "x"))
        return lax.cummax(x, 1), lax.cumprod(1.0 + 0.5 * x, 1)
    return f


@case("gather_batch_dims_vmap_2x4", "vmap'd row gather x[b, idx[b,j], :] (gather with operand/index batch dims): x batch on a, features on b; idx batch on a", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q30(c):
    c.arg("x", (4, 12, 8), "f32", P("a", None, "b"))
    c.arg("idx", (4, 5), "s32", P("a", None), lo=0, hi=12)
    c.out("y", P("a", None, "b"))
    def f(x, idx):
        return (jax.vmap(lambda xb, ib: xb[ib])(x, idx),)
    return f


@case("gather_batch_dims_idx_sharded_4x2", "vmap'd gather with the index (non-batch) dim sharded on a while operand batch dim is on b", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q31(c):
    c.arg("x", (2, 10, 6), "f32", P("b", None, None))
    c.arg("idx", (2, 8), "s32", P("b", "a"), lo=0, hi=10)
    c.out("y", P("b", "a", None))
    def f(x, idx):
        return (jax.vmap(lambda xb, ib: xb[ib])(x, idx),)
    return f


@case("scatter_add_batch_dims_vmap_4x2", "vmap'd scatter-add table[b].at[idx[b]].add(upd[b]) with batch on a and features on b, duplicate indices", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q32(c):
    c.arg("t", (4, 10, 6), "f32", P("a", None, "b"))
    c.arg("idx", (4, 7), "s32", P("a", None), lo=0, hi=10)
    c.arg("u", (4, 7, 6), "f32", P("a", None, "b"))
    c.out("y", P("a", None, "b"))
    def f(t, idx, u):
        return (jax.vmap(lambda tb, ib, ub: tb.at[ib].add(ub))(t, idx, u),)
    return f


@case("embedding_gather_ids_sharded_mesh3d", "embedding lookup table[ids] with ids [4,6] on (a,b) and table rows (20) on c, then mean over sequence", (2, 2, 2), ("a", "b", "c"), rtol=1e-5, atol=1e-5)
def _q33(c):
    c.arg("table", (20, 8), "f32", P("c", None))
    c.arg("ids", (4, 6), "s32", P("a", "b"), lo=0, hi=20)
    c.out("e", P("a", "b", None))
    c.out("m", P("a", None))
    def f(table, ids):
        e = table[ids]
        return e, jnp.mean(e, 1)
    return f


@case("reduce_precision_bf16_f16_mix_2x4", "lax.reduce_precision (e5m10, e8m7), bf16 and f16 casts, f16 matmul with f32 accumulation, bf16 reduction on sharded dims", (2, 4), ("a", "b"), rtol=2e-3, atol=2e-3)
def _q34(c):
    c.arg("x", (8, 12), "f32", P("a", "b"), scale=4.0)
    c.arg("w", (12, 8), "f32", P("b", None), scale=0.5)
    c.out("rp", P("a", "b"))
    c.out("mm", P("a", None))
    c.out("s", P("a"))
    def f(x, w):
        rp = lax.reduce_precision(x, exponent_bits=5, mantissa_bits=10) - lax.reduce_precision(x, exponent_bits=8, mantissa_bits=7)
        mm = jnp.dot(x.astype(jnp.float16), w.astype(jnp.float16), preferred_element_type=jnp.float32)
        s = jnp.sum(x.astype(jnp.bfloat16), axis=1).astype(jnp.float32)
        return rp, mm, s
    return f


@case("int_overflow_hash_8", "integer hashing with wraparound: s32/u32 multiply by large constants, xor-shift, shift_right_logical, popcount, int sum over sharded dim", (8,), ("x",), rtol=0, atol=0)
def _q35(c):
    c.arg("x", (16, 8), "s32", P("x", None), lo=-1000000, hi=1000000)
    c.out("h", P("x", None))
    c.out("s", P())
    c.out("pc", P("x"))
    def f(x):
        u = x.astype(jnp.uint32)
        u = u * jnp.uint32(2654435761)
        u = u ^ lax.shift_right_logical(u, jnp.uint32(15))
        u = u * jnp.uint32(0x85EBCA6B)
        h = u.astype(jnp.int32) + x * 1000003
        s = jnp.sum(h, axis=0)
        pc = jnp.sum(lax.population_count(u).astype(jnp.int32), axis=1) + jnp.max(h >> 3, axis=1)
        return h, s, pc
    return f


@case("f16_bf16_outputs_mlp_4x2", "MLP in f16 with f32 layernorm, outputs in f16 and bf16 (low-precision output dtypes), batch on a, hidden on b", (4, 2), ("a", "b"), rtol=1e-2, atol=1e-2)
def _q36(c):
    c.arg("x", (8, 16), "f32", P("a", None))
    c.arg("w1", (16, 24), "f32", P(None, "b"), scale=0.3)
    c.arg("w2", (24, 16), "f32", P("b", None), scale=0.3)
    c.out("y16", P("a", None))
    c.out("ybf", P("a", None))
    def f(x, w1, w2):
        h = _ln(x).astype(jnp.float16)
        h = jax.nn.relu(h @ w1.astype(jnp.float16))
        y = (h @ w2.astype(jnp.float16))
        return y, (y.astype(jnp.float32) * 0.5).astype(jnp.bfloat16)
    return f


@case("transpose_bshd_to_bhsd_2x4", "[B,S,H,D]->[B,H,S,D] with S on a and H on b (axes swap positions), then merge heads [B,S,H*D] and an output constrained to S on b", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q37(c):
    c.arg("x", (2, 12, 4, 6), "f32", P(None, "a", "b", None))
    c.out("t", P(None, "b", "a", None))
    c.out("m", P(None, "a", "b"))
    c.out("t2", P(None, None, "b", None))
    def f(x):
        t = jnp.transpose(x, (0, 2, 1, 3))
        m = x.reshape(2, 12, 24)
        t2 = wsc(jnp.transpose(x * 2.0, (0, 2, 1, 3)), P(None, None, "b", None))
        return t, m, t2
    return f


@case("transpose_reshape_uneven_heads_seq_4x2", "[B,S,H,D] with S=10 on a (uneven) and H=3 on b (uneven) transposed to [B,H,S,D] and reshaped to [B*H,S,D]", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q38(c):
    c.arg("x", (2, 10, 3, 4), "f32", P())
    c.out("t", P())
    c.out("r", P())
    def f(x):
        x = wsc(x, P(None, "a", "b", None))
        t = wsc(jnp.transpose(x, (0, 2, 1, 3)), P(None, "b", "a", None))
        r = wsc(t.reshape(6, 10, 4), P(None, "a", None))
        return t, r
    return f


@case("reshape_split_heads_two_axes_mesh3d", "[B,S,H*D] with H*D=24 sharded on (b,c) split to [B,S,H,D] (H=4), transposed to [B,H,S,D] with S on a", (2, 2, 2), ("a", "b", "c"), rtol=1e-5, atol=1e-5)
def _q39(c):
    c.arg("x", (2, 6, 24), "f32", P(None, None, ("b", "c")))
    c.out("y", P(None, ("b", "c"), "a", None))
    c.out("z", P(None, "a", None, None))
    def f(x):
        r = x.reshape(2, 6, 4, 6)
        return jnp.transpose(r, (0, 2, 1, 3)), r * 3.0
    return f


@case("attention_causal_seq_uneven_8", "causal self-attention with q/k/v sequence 13 sharded 8-way (uneven), 2 heads, output re-sharded on sequence", (8,), ("s",), rtol=1e-4, atol=1e-5)
def _q40(c):
    B, S, H, K = 2, 13, 2, 4
    for n in ("q", "k", "v"):
        c.arg(n, (B, S, H, K), "f32", P())
    c.out("o", P())
    def f(q, k, v):
        q, k, v = (wsc(t, P(None, "s", None, None)) for t in (q, k, v))
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) * 0.5
        s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -jnp.inf)
        p = jax.nn.softmax(s, -1)
        return (wsc(jnp.einsum("bhqs,bshk->bqhk", p, v), P(None, "s", None, None)),)
    return f


@case("sliding_window_attention_2x4", "local (sliding window 4) attention with iota-built band mask, S=16 on model, batch on data", (2, 4), ("data", "model"), rtol=1e-4, atol=1e-5)
def _q41(c):
    B, S, H, K = 2, 16, 2, 4
    for n in ("q", "k", "v"):
        c.arg(n, (B, S, H, K), "f32", P("data", "model", None, None))
    c.out("o", P("data", "model", None, None))
    def f(q, k, v):
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) * 0.5
        i = lax.broadcasted_iota(jnp.int32, (S, S), 0); j = lax.broadcasted_iota(jnp.int32, (S, S), 1)
        s = jnp.where((j <= i) & (i - j < 4), s, -1e9)
        p = jax.nn.softmax(s, -1)
        return (jnp.einsum("bhqs,bshk->bqhk", p, v),)
    return f


@case("scan_layers_transformer_grad_2x4", "scan over 3 stacked MLP-residual layers (params [L,...] TP-sharded on model), loss grad wrt stacked params, batch on data", (2, 4), ("data", "model"), rtol=1e-4, atol=1e-5)
def _q42(c):
    L, B, D, F = 3, 4, 8, 16
    c.arg("x", (B, D), "f32", P("data", None))
    c.arg("w1", (L, D, F), "f32", P(None, None, "model"), scale=0.3)
    c.arg("w2", (L, F, D), "f32", P(None, "model", None), scale=0.3)
    c.out("loss", P())
    c.out("g1", P(None, None, "model"))
    c.out("g2", P(None, "model", None))
    def f(x, w1, w2):
        def loss(w1, w2):
            def layer(h, p):
                a, b = p
                return h + jax.nn.gelu(_ln(h) @ a) @ b, None
            h, _ = lax.scan(layer, x, (w1, w2))
            return jnp.mean(h ** 2)
        l, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2)
        return l, g1, g2
    return f


@case("remat_mlp_grad_2x4", "jax.checkpoint (remat) around two TP MLP blocks, loss grad, batch on data", (2, 4), ("data", "model"), rtol=1e-4, atol=1e-5)
def _q43(c):
    c.arg("x", (6, 8), "f32", P("data", None))
    c.arg("w1", (8, 20), "f32", P(None, "model"), scale=0.3)
    c.arg("w2", (20, 8), "f32", P("model", None), scale=0.3)
    c.out("g1", P(None, "model"))
    c.out("g2", P("model", None))
    def f(x, w1, w2):
        @jax.checkpoint
        def blk(h, w1, w2):
            return h + jnp.tanh(h @ w1) @ w2
        def loss(w1, w2):
            return jnp.sum(blk(blk(x, w1, w2), w1, w2) ** 2)
        return jax.grad(loss, argnums=(0, 1))(w1, w2)
    return f


@case("shard_map_moe_all_to_all_8", "shard_map MoE: each device routes its 4 tokens top-1 to 8 experts with capacity 1 via all_to_all, applies its expert, all_to_all back", (8,), ("e",), rtol=1e-4, atol=1e-5, manual=True)
def _q44(c):
    E, T, D = 8, 4, 6
    c.arg("x", (E * T, D), "f32", P("e", None))
    c.arg("wr", (D, E), "f32", P())
    c.arg("we", (E, D, D), "f32", P("e", None, None), scale=0.4)
    c.out("y", P("e", None))
    def body(x, wr, we):
        lg = x @ wr
        ex = jnp.argmax(lg, -1)
        g = jax.nn.softmax(lg, -1)
        gate = jnp.take_along_axis(g, ex[:, None], 1)[:, 0]
        oh = jax.nn.one_hot(ex, E, dtype=x.dtype)  # [T,E]
        first = (jnp.cumsum(oh, 0) == 1) * oh
        disp = jnp.einsum("te,td->etd", first, x).sum(1, keepdims=True)  # [E,1,D]
        recv = lax.all_to_all(disp, "e", 0, 0, tiled=True)  # [E,1,D] from each source
        out = jnp.einsum("scd,df->scf", recv, we[0])
        back = lax.all_to_all(out, "e", 0, 0, tiled=True)
        y = jnp.einsum("te,ecd->td", first, back)
        return x + gate[:, None] * y
    def f(x, wr, we):
        return (smap(body, (P("e", None), P(), P("e", None, None)), P("e", None))(x, wr, we),)
    return f


@case("shard_map_ring_attention_4x2", "shard_map ring attention: sequence on s (4), heads on h (2); k/v blocks rotated with ppermute in fori_loop, online softmax", (4, 2), ("s", "h"), rtol=1e-4, atol=1e-5, manual=True)
def _q45(c):
    B, S, H, K = 2, 16, 2, 4
    for n in ("q", "k", "v"):
        c.arg(n, (B, S, H, K), "f32", P(None, "s", "h", None))
    c.out("o", P(None, "s", "h", None))
    def body(q, k, v):
        perm = [(i, (i + 1) % 4) for i in range(4)]
        def step(i, carry):
            o, m, l, k, v = carry
            s = jnp.einsum("bqhk,bshk->bhqs", q, k) * 0.5
            mn = jnp.maximum(m, s.max(-1))
            p = jnp.exp(s - mn[..., None])
            corr = jnp.exp(m - mn)
            l = l * corr + p.sum(-1)
            o = o * jnp.transpose(corr, (0, 2, 1))[..., None] + jnp.einsum("bhqs,bshk->bqhk", p, v)
            k = lax.ppermute(k, "s", perm); v = lax.ppermute(v, "s", perm)
            return o, mn, l, k, v
        Bq, Sq, Hq, Kq = q.shape
        m0 = jnp.full((Bq, Hq, Sq), -1e30, jnp.float32) + 0.0 * q[..., 0].transpose(0, 2, 1)
        init = (jnp.zeros_like(q), m0, 0.0 * m0, k, v)
        o, m, l, _, _ = lax.fori_loop(0, 4, step, init)
        return o / jnp.transpose(l, (0, 2, 1))[..., None]
    def f(q, k, v):
        sp = P(None, "s", "h", None)
        return (smap(body, (sp, sp, sp), sp)(q, k, v),)
    return f


@case("pad_interior_negative_8", "lax.pad with interior padding 1 and negative low padding (-2, high 3) on a dim of 12 sharded 8-way (uneven), then slice", (8,), ("x",), rtol=1e-5, atol=1e-5)
def _q46(c):
    c.arg("x", (12, 4), "f32", P())
    c.out("p", P())
    c.out("s", P())
    def f(x):
        x = wsc(x, P("x", None))
        p = lax.pad(x, 0.0, [(-2, 3, 1), (1, 0, 0)])
        p = wsc(p, P("x", None))
        return p, wsc(p[3:20:2] * 2.0, P("x", None))
    return f


@case("batchnorm_train_grad_input_4x2", "batchnorm training (stats over N,H,W) with grad wrt input/gamma/beta; N on a, H on b (uneven 7)", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _q47(c):
    c.arg("x", (4, 7, 6, 5), "f32", P())
    c.arg("g", (5,), "f32", P())
    c.arg("b", (5,), "f32", P())
    c.out("gx", P())
    c.out("gg", P())
    c.out("gb", P())
    def f(x, g, b):
        x = wsc(x, P("a", "b", None, None))
        def loss(x, g, b):
            y = _bn(x, g, b)
            return jnp.sum(jax.nn.relu(y) * jnp.arange(5.0))
        gx, gg, gb = jax.grad(loss, argnums=(0, 1, 2))(x, g, b)
        return wsc(gx, P("a", "b", None, None)), gg, gb
    return f


@case("gap_classifier_mesh3d", "global average pool of NHWC features (N on a, H on b, C on c) then dense + softmax + argmax", (2, 2, 2), ("a", "b", "c"), rtol=1e-5, atol=1e-5)
def _q48(c):
    c.arg("x", (4, 6, 6, 8), "f32", P("a", "b", None, "c"))
    c.arg("w", (8, 5), "f32", P("c", None))
    c.out("p", P("a", None))
    c.out("cls", P("a"))
    def f(x, w):
        lg = jnp.mean(x, axis=(1, 2)) @ w
        return jax.nn.softmax(lg, -1), jnp.argmax(lg, -1).astype(jnp.int32)
    return f


@case("ema_clip_weight_decay_mesh3d", "optimizer utilities on 2x2x2: global-norm clip over 3 params, decoupled weight decay masked to 2D params, EMA of params", (2, 2, 2), ("a", "b", "c"), rtol=1e-5, atol=1e-6)
def _q49(c):
    c.arg("w", (8, 12), "f32", P("a", ("b", "c")))
    c.arg("b", (6,), "f32", P("c"))
    c.arg("e", (5, 8), "f32", P(None, "a"))
    c.arg("gw", (8, 12), "f32", P("a", ("b", "c")))
    c.arg("gb", (6,), "f32", P("c"))
    c.arg("ge", (5, 8), "f32", P(None, "a"))
    c.arg("ema_w", (8, 12), "f32", P("a", ("b", "c")))
    for n, s in (("w", P("a", ("b", "c"))), ("b", P("c")), ("e", P(None, "a")), ("ema_w", P("a", ("b", "c")))):
        c.out(n + "_new", s)
    def f(w, b, e, gw, gb, ge, ema_w):
        n = jnp.sqrt(jnp.sum(gw ** 2) + jnp.sum(gb ** 2) + jnp.sum(ge ** 2))
        sc = jnp.minimum(1.0, 0.5 / n)
        w2 = w - 0.1 * (gw * sc + 0.01 * w)
        b2 = b - 0.1 * gb * sc
        e2 = e - 0.1 * (ge * sc + 0.01 * e)
        return w2, b2, e2, 0.99 * ema_w + 0.01 * w2
    return f


@case("topk_gumbel_sampling_uneven_2x4", "sampling: logits [4,50] with vocab 50 on b (uneven), gumbel noise, argmax sample, top_k(5) renormalised probs and log-prob of sample", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q50(c):
    c.arg("logits", (4, 50), "f32", P(), scale=3.0)
    c.arg("u", (4, 50), "f32", P())
    c.out("sample", P())
    c.out("topv", P())
    c.out("topi", P())
    c.out("lp", P())
    def f(logits, u):
        logits = wsc(logits, P("a", "b")); u = wsc(u, P("a", "b"))
        g = -jnp.log(-jnp.log(jnp.clip(jnp.abs(u), 1e-6, 1 - 1e-6)))
        s = jnp.argmax(logits + g, -1).astype(jnp.int32)
        v, i = lax.top_k(logits, 5)
        lp = jax.nn.log_softmax(logits, -1)
        return s, jax.nn.softmax(v, -1), i, jnp.take_along_axis(lp, s[:, None], 1)[:, 0]
    return f


@case("dynamic_slice_2d_runtime_uneven_4x2", "dynamic_slice of a [5,3] window at runtime (i,j)=(11,6) from [18,10] sharded (a,b) unevenly, and dynamic_update_slice of it doubled at (2,1)", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q51(c):
    c.arg("x", (18, 10), "f32", P())
    c.arg("i", (), "s32", P(), value=11)
    c.arg("j", (), "s32", P(), value=6)
    c.out("w", P())
    c.out("y", P())
    def f(x, i, j):
        x = wsc(x, P("a", "b"))
        w = lax.dynamic_slice(x, (i, j), (5, 3))
        y = lax.dynamic_update_slice(x, 2.0 * w, (i - 9, j - 5))
        return w, wsc(y, P("a", "b"))
    return f


@case("maxpool_3x3_s2_grad_batch_only_8", "grad of maxpool 3x3 stride 2 SAME (select-and-scatter with padding) with only the batch dim sharded 8-way", (8,), ("dp",), rtol=1e-5, atol=1e-5)
def _q52(c):
    c.arg("x", (8, 9, 9, 2), "f32", P("dp", None, None, None))
    c.out("g", P("dp", None, None, None))
    def f(x):
        return (jax.grad(lambda x: jnp.sum(_maxpool(x) * jnp.arange(2.0)))(x),)
    return f


@case("conv_s2_bn_relu_grad_kernel_channels_2x4", "conv 3x3 stride 2 with output channels (12) on b and batch on a, BN + relu, grad wrt kernel", (2, 4), ("a", "b"), rtol=2e-4, atol=2e-5)
def _q53(c):
    c.arg("x", (4, 10, 10, 3), "f32", P("a", None, None, None))
    c.arg("k", (3, 3, 3, 12), "f32", P(None, None, None, "b"), scale=0.3)
    c.out("gk", P(None, None, None, "b"))
    def f(x, k):
        def loss(k):
            h = _conv(x, k, 2)
            mu = h.mean((0, 1, 2)); var = h.var((0, 1, 2))
            return jnp.sum(jax.nn.relu((h - mu) * lax.rsqrt(var + 1e-5)) ** 2)
        return (jax.grad(loss)(k),)
    return f


@case("where_nan_safe_softmax_mask_4x2", "masked softmax with fully-masked rows (NaN-safe via where), padding mask from lengths, rows on a, cols (11, uneven) on b", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q54(c):
    c.arg("x", (8, 11), "f32", P())
    c.arg("lens", (8,), "s32", P("a"), lo=0, hi=12)
    c.out("p", P())
    def f(x, lens):
        x = wsc(x, P("a", "b"))
        m = jnp.arange(11)[None, :] < lens[:, None]
        s = jnp.where(m, x, -jnp.inf)
        mx = jnp.max(s, -1, keepdims=True)
        mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
        e = jnp.where(m, jnp.exp(s - mx), 0.0)
        d = jnp.sum(e, -1, keepdims=True)
        return (wsc(jnp.where(d > 0, e / jnp.where(d > 0, d, 1.0), 0.0), P("a", "b")),)
    return f


@case("dropout_threefry_key_arg_2x4", "dropout with jax.random.bernoulli from a key passed as u32[2] key data (threefry counters over a sharded shape), x [8,12] on (a,b), plus random.normal noise", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _q55(c):
    c.arg("x", (8, 12), "f32", P("a", "b"))
    c.arg("key", (2,), "u32", P(), lo=0, hi=100000)
    c.out("y", P("a", "b"))
    c.out("n", P("a", "b"))
    def f(x, key):
        k = jax.random.wrap_key_data(key, impl="threefry2x32")
        k1, k2 = jax.random.split(k)
        keep = jax.random.bernoulli(k1, 0.8, x.shape)
        return jnp.where(keep, x / 0.8, 0.0), x + 0.1 * jax.random.normal(k2, x.shape)
    return f


@case("decode_loop_kv_seq_sharded_8", "fori_loop of 3 greedy decode steps writing k/v at pos+i into a cache with time (16) sharded 8-way, attention over the cache each step", (8,), ("t",), rtol=1e-4, atol=1e-5)
def _q56(c):
    T, D = 16, 4
    c.arg("ck", (T, D), "f32", P("t", None))
    c.arg("x", (D,), "f32", P())
    c.arg("wk", (D, D), "f32", P(), scale=0.5)
    c.arg("pos", (), "s32", P(), value=6)
    c.out("ck_new", P("t", None))
    c.out("x_new", P())
    def f(ck, x, wk, pos):
        def body(i, carry):
            ck, x = carry
            k = jnp.tanh(x @ wk)
            ck = lax.dynamic_update_slice(ck, k[None, :], (pos + i, 0))
            s = ck @ x
            s = jnp.where(jnp.arange(T) <= pos + i, s, -1e9)
            return ck, jax.nn.softmax(s) @ ck
        return lax.fori_loop(0, 3, body, (ck, x))
    return f


@case("depthwise_conv_spatial_channels_2x4", "MobileNet-style depthwise 3x3 conv (feature_group_count=C=8) + pointwise 1x1, H on a, channels on b", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _q57(c):
    c.arg("x", (2, 8, 6, 8), "f32", P(None, "a", None, "b"))
    c.arg("dw", (3, 3, 1, 8), "f32", P(None, None, None, "b"), scale=0.4)
    c.arg("pw", (1, 1, 8, 8), "f32", P(), scale=0.4)
    c.out("y", P(None, "a", None, "b"))
    def f(x, dw, pw):
        h = lax.conv_general_dilated(x, dw, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=8)
        return (_conv(jax.nn.relu(h), pw),)
    return f


# --- eleventh set: the same kinds of programs under other shardings (heads and sequence on
# different axes, 2-D weight sharding, FSDP on dim 1), associative scans, single-row
# concatenations, uneven axis swaps, integer ops, loops that reshard their carry; written
# after the pipeline was done. (Cholesky, triangular solve and FFT cases were left out: the
# interpreter has no LAPACK custom calls and no complex types.) --------------------------


def _h3_ln(x, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps)


@case("attn_heads_a_seq_b_2x4", "MHA with q/k/v [B,S,H,K] heads on a and sequence on b (non-causal); output constrained back to heads on a, seq on b", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_01(c):
    B, S, H, K = 2, 16, 4, 8
    sp = P(None, "b", "a", None)
    for n in "qkv":
        c.arg(n, (B, S, H, K), "f32", sp)
    c.out("o", sp)

    def f(q, k, v):
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(K)
        a = jax.nn.softmax(s, -1)
        return (wsc(jnp.einsum("bhqs,bshk->bqhk", a, v), sp),)
    return f


@case("mlp_2d_weight_dp_tp_activations_both_2x4", "MLP with both weights 2-D sharded P(a,b)/P(b,a) and activations x [B,D] sharded P(a,b); output P(a,b)", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_02(c):
    c.arg("x", (16, 32), "f32", P("a", "b"))
    c.arg("w1", (32, 64), "f32", P("a", "b"), scale=0.2)
    c.arg("w2", (64, 32), "f32", P("b", "a"), scale=0.15)
    c.out("y", P("a", "b"))

    def f(x, w1, w2):
        h = jax.nn.relu(x @ w1)
        h = wsc(h, P("a", "b"))
        return (x + h @ w2,)
    return f


@case("embed_vocab_and_hidden_ids_2d_mesh3d", "embedding table [V=40,H=24] sharded vocab on x and hidden on y, ids [4,6] sharded on z; take + layernorm + tied logits", (2, 2, 2), ("x", "y", "z"), rtol=1e-4, atol=1e-5)
def _h3_03(c):
    c.arg("table", (40, 24), "f32", P("x", "y"))
    c.arg("ids", (4, 6), "s32", P("z", None), lo=0, hi=40)
    c.out("logits", P("z", None, "x"))

    def f(table, ids):
        e = jnp.take(table, ids, axis=0)
        h = _h3_ln(e)
        return (jnp.einsum("bsh,vh->bsv", h, table),)
    return f


@case("fsdp_params_dim1_sgd_4x2", "FSDP-style SGD step where params are sharded on dim 1 (output dim) over (a,b) instead of dim 0; batch on a", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_04(c):
    c.arg("x", (8, 24), "f32", P("a", None))
    c.arg("y", (8, 8), "f32", P("a", None))
    c.arg("w1", (24, 32), "f32", P(None, ("a", "b")), scale=0.2)
    c.arg("w2", (32, 8), "f32", P(None, ("a", "b")), scale=0.2)
    c.out("w1n", P(None, ("a", "b")))
    c.out("w2n", P(None, ("a", "b")))
    c.out("loss", P())

    def f(x, y, w1, w2):
        def loss(p):
            a, b = p
            return jnp.mean((jnp.tanh(x @ a) @ b - y) ** 2)
        l, g = jax.value_and_grad(loss)((w1, w2))
        return w1 - 0.1 * g[0], w2 - 0.1 * g[1], l
    return f


@case("cond_branches_different_out_shardings_4x2", "lax.cond whose true branch constrains the result rows-on-a and false branch cols-on-b, runtime predicate; plus switch with 3 differently-sharded branches", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h3_08(c):
    c.arg("x", (12, 16), "f32", P(None, None))
    c.arg("p", (), "s32", P(), value=1)
    c.arg("k", (), "s32", P(), value=2)
    c.out("y1", P("b", "a"))
    c.out("y2", P(None, None))

    def f(x, p, k):
        y1 = lax.cond(p > 0, lambda x: jnp.tanh(wsc(jnp.sin(x), P("a", None))), lambda x: jnp.tanh(wsc(x * 3.0, P(None, "b"))), x)
        y2 = lax.switch(k, [lambda x: jnp.exp(wsc(x + 1.0, P("a", "b"))),
                            lambda x: jnp.exp(wsc(x * x, P("b", "a"))),
                            lambda x: jnp.exp(wsc(jnp.cumsum(x, 0), P(None, ("a", "b"))))], x)
        return y1, y2
    return f


@case("while_carry_resharded_in_body_2x4", "fori_loop (4 iters) whose carry enters rows-on-a, is resharded to cols-on-b for a dot and back inside the body", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_09(c):
    c.arg("h", (8, 16), "f32", P("a", None))
    c.arg("w", (16, 16), "f32", P(None, "b"), scale=0.25)
    c.out("h", P("a", None))

    def f(h, w):
        def body(i, h):
            t = wsc(h, P(None, "b"))
            t = jnp.tanh(t @ w) + 0.1 * i
            t = wsc(t, P(None, "b"))
            return wsc(t + h, P("a", None))
        return (lax.fori_loop(0, 4, body, h),)
    return f


@case("nested_scan_2x4", "scan over 3 outer steps containing a scan over 4 inner steps; carry [8,12] rows on a, stacked weights [3,12,12] sharded on b", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_10(c):
    c.arg("h", (8, 12), "f32", P("a", None))
    c.arg("ws", (3, 12, 12), "f32", P(None, None, "b"), scale=0.3)
    c.arg("xs", (3, 4, 8, 12), "f32", P(None, None, "a", None), scale=0.1)
    c.out("h", P("a", None))
    c.out("ys", P(None, None))

    def f(h, ws, xs):
        def outer(h, wx):
            w, xi = wx
            def inner(h, x):
                h = jnp.tanh(h @ w + x)
                return h, jnp.sum(h)
            h, ys = lax.scan(inner, h, xi)
            return h, ys
        return lax.scan(outer, h, (ws, xs))
    return f


@case("lax_map_rows_sharded_4x2", "lax.map over the leading dim (7, uneven over a) of x [7,6,10] with a per-item matmul with w [10,10] sharded on b", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_11(c):
    c.arg("x", (7, 6, 10), "f32", P())
    c.arg("w", (10, 10), "f32", P(None, "b"), scale=0.3)
    c.out("y", P())

    def f(x, w):
        x = wsc(x, P("a", None, None))
        return (lax.map(lambda t: jnp.sin(t @ w) * t.sum(), x),)
    return f


@case("associative_scan_sharded_dim_8", "lax.associative_scan (add and max) along the 8-way sharded dim of x [16,5]; also along the unsharded dim", (8,), ("x",), rtol=1e-4, atol=1e-5)
def _h3_12(c):
    c.arg("x", (16, 5), "f32", P("x", None))
    c.out("csum0", P("x", None))
    c.out("cmax0", P("x", None))
    c.out("csum1", P("x", None))

    def f(x):
        return (lax.associative_scan(jnp.add, x, axis=0), lax.associative_scan(jnp.maximum, x, axis=0),
                lax.associative_scan(jnp.add, x, axis=1))
    return f


@case("take_along_axis_indices_sharded_2x4", "jnp.take_along_axis on x [8,12] P(a,None) with indices [8,5] sharded P(None,b) along axis 1 and along axis 0 with idx [3,12]", (2, 4), ("a", "b"), rtol=0, atol=0)
def _h3_13(c):
    c.arg("x", (8, 12), "f32", P("a", None))
    c.arg("i1", (8, 8), "s32", P(None, "b"), lo=0, hi=12)
    c.arg("i0", (3, 12), "s32", P(None, "b"), lo=0, hi=8)
    c.out("t1", P(None, "b"))
    c.out("t0", P(None, "b"))

    def f(x, i1, i0):
        return jnp.take_along_axis(x, i1, axis=1), jnp.take_along_axis(x, i0, axis=0)
    return f


@case("dynamic_slice_runtime_mesh3d", "lax.dynamic_slice with runtime offsets of x [8,12,6] sharded P(x,y,z) on 2x2x2 (slice sizes 3,5,6) and dynamic_update_slice back", (2, 2, 2), ("x", "y", "z"), rtol=0, atol=0)
def _h3_14(c):
    c.arg("x", (8, 12, 6), "f32", P("x", "y", "z"))
    c.arg("i", (), "s32", P(), value=3)
    c.arg("j", (), "s32", P(), value=4)
    c.out("s", P(None, None, "z"))
    c.out("u", P("x", "y", "z"))

    def f(x, i, j):
        s = lax.dynamic_slice(x, (i, j, 0), (3, 5, 6))
        u = lax.dynamic_update_slice(x, s * 2.0, (j, i, 0))
        return s, u
    return f


@case("argsort_along_sharded_dim_2x4", "jnp.argsort and sort along dim 1 which is sharded 4-way on b (rows on a), x [6,20]", (2, 4), ("a", "b"), rtol=0, atol=0)
def _h3_15(c):
    c.arg("x", (6, 20), "f32", P("a", "b"))
    c.out("idx", P("a", "b"))
    c.out("srt", P("a", "b"))

    def f(x):
        return jnp.argsort(x, axis=1).astype(jnp.int32), jnp.sort(-x, axis=1)
    return f


@case("top_k_2d_mesh_4x2", "lax.top_k(k=5) on x [12,40] sharded P(a,b) (top-k dim sharded on b) and on xT sharded P(b,a)", (4, 2), ("a", "b"), rtol=0, atol=0)
def _h3_16(c):
    c.arg("x", (12, 40), "f32", P("a", "b"))
    c.out("v", P("a", None))
    c.out("i", P("a", None))
    c.out("v2", P(None, None))

    def f(x):
        v, i = lax.top_k(x, 5)
        v2, _ = lax.top_k(wsc(x.T, P("b", "a")), 3)
        return v, i.astype(jnp.int32), v2
    return f


@case("clip_where_isnan_mix_4x2", "log/sqrt of signed inputs creating NaN, isnan/isinf masks, where, clip, nan_to_num and nanmax over sharded dims; x [12,10] P(a,b)", (4, 2), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h3_17(c):
    c.arg("x", (12, 10), "f32", P("a", "b"))
    c.out("y", P("a", "b"))
    c.out("nanmax", P("b"))
    c.out("cnt", P())

    def f(x):
        l = jnp.log(x)
        s = jnp.sqrt(x) / (x - x[0:1])
        bad = jnp.isnan(l) | jnp.isinf(s)
        y = jnp.where(bad, jnp.clip(x, -0.3, 0.2), l + jnp.nan_to_num(s, posinf=1.0, neginf=-1.0))
        return y, jnp.nanmax(l, axis=0), jnp.sum(bad).astype(jnp.int32)
    return f


@case("int_div_shift_uneven_8", "integer floor_divide/remainder/lax.div/rem, left/right shifts of s32 [13,7] with dim 0 13 over 8 (uneven); u32 logical shifts", (8,), ("x",), rtol=0, atol=0)
def _h3_18(c):
    c.arg("a", (13, 7), "s32", P(), lo=-1000, hi=1000)
    c.arg("b", (13, 7), "s32", P(), lo=1, hi=9)
    c.arg("u", (13, 7), "u32", P(), lo=0, hi=2 ** 31)
    for n in ("fd", "md", "qd", "sh", "us"):
        c.out(n, P())

    def f(a, b, u):
        a = wsc(a, P("x", None))
        b = wsc(b, P(None, "x"))
        u = wsc(u, P("x", None))
        fd = jnp.floor_divide(a, b)
        md = jnp.remainder(a, b)
        qd = lax.div(a, b) + lax.rem(a, b) * 1000
        sh = (a << (b % 5)) ^ (a >> (b % 3))
        us = lax.shift_right_logical(u, (b % 7).astype(jnp.uint32)) + (u << jnp.uint32(3))
        return fd, md, qd, sh, us
    return f


@case("bool_any_all_sharded_dims_2x4", "jnp.any / jnp.all over sharded dims of a pred [10,12,6] built from compares; P(a,b,None), reduce dims 0, 1 and (0,2)", (2, 4), ("a", "b"), rtol=0, atol=0)
def _h3_19(c):
    c.arg("x", (10, 12, 6), "f32", P("a", "b", None))
    c.out("any0", P("b", None))
    c.out("all1", P("a", None))
    c.out("any02", P("b"))
    c.out("all_all", P())

    def f(x):
        m = x > 0.7
        n = x > -0.95
        return jnp.any(m, 0), jnp.all(n, 1), jnp.any(m & (x < 0.9), (0, 2)), jnp.all(n)
    return f


@case("einsum_batch_sharded_differently_2x4", "einsum bij,bjk->bik with lhs batch on a and rhs batch on b, plus bij,bkj->bki with lhs contracting on b", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_20(c):
    c.arg("x", (8, 6, 12), "f32", P("a", None, None))
    c.arg("y", (8, 12, 12), "f32", P("b", None, None))
    c.arg("z", (8, 5, 12), "f32", P(None, None, "b"))
    c.out("o1", P("a", None, None))
    c.out("o2", P("b", None, None))

    def f(x, y, z):
        return jnp.einsum("bij,bjk->bik", x, y), jnp.einsum("bij,bkj->bki", x, z)
    return f


@case("broadcast_sharded_vectors_4d_mesh3d", "broadcast sharded vectors a[6] on x, b[8] on y, c[10] on z into a 4-D [6,8,10,4] product + bias sum, output P(x,y,z,None)", (2, 2, 2), ("x", "y", "z"), rtol=1e-5, atol=1e-5)
def _h3_21(c):
    c.arg("a", (6,), "f32", P("x"))
    c.arg("b", (8,), "f32", P("y"))
    c.arg("cc", (10,), "f32", P("z"))
    c.arg("d", (4,), "f32", P("x"))
    c.out("o", P("x", "y", "z", None))
    c.out("o2", P(None, None, "y", "x"))

    def f(a, b, cc, d):
        o = a[:, None, None, None] * b[None, :, None, None] + cc[None, None, :, None] * d
        return o, jnp.broadcast_to(d, (6, 8, 10, 4)) - a[:, None, None, None]
    return f


@case("reduce_to_scalar_broadcast_back_4x2", "global mean/max/std to scalars over x [12,14] P(a,b), broadcast back: normalized x, x/max, mean-centered with per-row sums", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_22(c):
    c.arg("x", (12, 16), "f32", P("a", "b"))
    c.out("n", P("a", "b"))
    c.out("r", P("b", "a"))
    c.out("s", P())

    def f(x):
        mu = jnp.mean(x)
        sd = jnp.std(x)
        n = (x - mu) / sd
        r = x / jnp.max(jnp.abs(x)) + jnp.sum(x, 1, keepdims=True) * mu
        return n, r, sd * jnp.min(x)
    return f


@case("reshape_merge_two_sharded_dims_2x4", "reshape [8,12,5] P(a,b,None) -> [96,5] merging two sharded dims, and [8,12,5]->[8,60] merging b-sharded dim with an unsharded one; then split back", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h3_23(c):
    c.arg("x", (8, 12, 5), "f32", P("a", "b", None))
    c.out("m", P(("a", "b"), None))
    c.out("m2", P("a", "b"))
    c.out("back", P("a", "b", None))

    def f(x):
        m = wsc(x.reshape(96, 5) * 2.0, P(("a", "b"), None))
        m2 = wsc(jnp.sin(x).reshape(8, 60), P("a", "b"))
        back = (m.reshape(8, 12, 5) + m2.reshape(8, 12, 5))
        return m, m2, back
    return f


@case("mesh3d_partial_replication_per_operand", "2x2x2 mesh: a [8,12] P(x,None) (replicated on y,z), b [8,12] P(None,z), c [12,6] P(y,None): add, dot, and output P(z,x)", (2, 2, 2), ("x", "y", "z"), rtol=1e-4, atol=1e-5)
def _h3_24(c):
    c.arg("a", (8, 12), "f32", P("x", None))
    c.arg("b", (8, 12), "f32", P(None, "z"))
    c.arg("cc", (12, 6), "f32", P("y", None))
    c.out("s", P("z", "x"))
    c.out("d", P("z", "x"))

    def f(a, b, cc):
        s = a * b + a
        return s, s @ cc
    return f


@case("uneven_primes_elementwise_dot_mesh3d", "prime sizes on 2x2x2: x [7,11] P(x,y), y [11,13] P(y,z), z [13] P(x); dot, bias, exp, and transpose output P(z,x)", (2, 2, 2), ("x", "y", "z"), rtol=1e-4, atol=1e-5)
def _h3_25(c):
    c.arg("x", (7, 11), "f32", P())
    c.arg("y", (11, 13), "f32", P(), scale=0.3)
    c.arg("z", (13,), "f32", P())
    c.out("o", P())
    c.out("t", P())

    def f(x, y, z):
        x = wsc(x, P("x", "y"))
        y = wsc(y, P("y", "z"))
        z = wsc(z, P("x"))
        o = wsc(jnp.exp(x @ y + z), P("x", "z"))
        return o, wsc(o.T * 0.5, P("z", "x"))
    return f


@case("uneven_dot_primes_4x2", "[13,17] P(a,b) @ [17,11] P(b,None) -> output P(None,a) with uneven everything, plus row softmax", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_26(c):
    c.arg("x", (13, 17), "f32", P())
    c.arg("w", (17, 11), "f32", P(), scale=0.3)
    c.out("y", P())
    c.out("sm", P())

    def f(x, w):
        x = wsc(x, P("a", "b"))
        w = wsc(w, P("b", None))
        y = wsc(x @ w, P(None, "a"))
        return y, jax.nn.softmax(y, -1)
    return f


@case("scan_reverse_sharded_carry_4x2", "lax.scan(reverse=True) over xs [6,8,10] with carry [8,10] sharded P(a,b), xs sharded on time? no: P(None,a,b); ys stacked", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_27(c):
    c.arg("h", (8, 10), "f32", P("a", "b"))
    c.arg("xs", (6, 8, 10), "f32", P(None, "a", "b"))
    c.out("h", P("a", "b"))
    c.out("ys", P(None, "a", "b"))

    def f(h, xs):
        def body(h, x):
            h = 0.5 * h + jnp.sin(x)
            return h, h * x
        return lax.scan(body, h, xs, reverse=True)
    return f


@case("switch_four_branches_resharding_mesh3d", "lax.switch with 4 branches (index=3) each constraining its output to a different 2x2x2 sharding, incl. a reduction and transpose", (2, 2, 2), ("x", "y", "z"), rtol=1e-5, atol=1e-5)
def _h3_28(c):
    c.arg("x", (8, 8), "f32", P("x", "y"))
    c.arg("k", (), "s32", P(), value=3)
    c.out("y", P("z", None))

    def f(x, k):
        return (lax.switch(k, [lambda x: jnp.sin(wsc(x * 2.0, P("y", "x"))),
                               lambda x: jnp.sin(wsc(x.T, P("z", None))),
                               lambda x: jnp.sin(wsc(jnp.broadcast_to(jnp.sum(x, 0), (8, 8)), P(None, ("x", "y", "z")))),
                               lambda x: jnp.sin(wsc(jnp.cos(x) @ x, P(("z", "x"), "y")))], x),)
    return f


@case("while_data_dependent_reshard_2x4", "while_loop with a data-dependent trip count (until norm < thr) whose carry is constrained to rows-on-a then cols-on-b alternately inside the body", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_29(c):
    c.arg("x", (8, 12), "f32", P("a", "b"))
    c.out("x", P("a", "b"))
    c.out("n", P())

    def f(x):
        def cond(s):
            x, n = s
            return (jnp.sum(x * x) > 1.0) & (n < 20)
        def body(s):
            x, n = s
            y = wsc(x * 0.7, P("a", None))
            y = wsc(y + 0.01 * jnp.roll(y, 1, axis=1), P(None, "b"))
            return y, n + 1
        return lax.while_loop(cond, body, (x, jnp.int32(0)))
    return f


@case("associative_scan_mesh3d_two_axes", "lax.associative_scan with a custom (a*b, linear recurrence) operator along dim 1 sharded over (y,z) of x [4,12] on 2x2x2", (2, 2, 2), ("x", "y", "z"), rtol=1e-4, atol=1e-5)
def _h3_30(c):
    c.arg("a", (4, 12), "f32", P("x", ("y", "z")), scale=0.9)
    c.arg("b", (4, 12), "f32", P("x", ("y", "z")))
    c.out("h", P("x", ("y", "z")))

    def f(a, b):
        def op(l, r):
            a1, b1 = l
            a2, b2 = r
            return a1 * a2, a2 * b1 + b2
        return (lax.associative_scan(op, (a, b), axis=1)[1],)
    return f


@case("sort_keys_values_2d_mesh_4x2", "lax.sort of (keys, values) along dim 0 with x [12,6] P(a,b), num_keys=1, and jnp.lexsort-like two-key sort along dim 1", (4, 2), ("a", "b"), rtol=0, atol=0)
def _h3_31(c):
    c.arg("k", (12, 6), "s32", P("a", "b"), lo=0, hi=5)
    c.arg("v", (12, 6), "f32", P("a", "b"))
    c.out("ks", P("a", "b"))
    c.out("vs", P("a", "b"))
    c.out("vs2", P("a", "b"))

    def f(k, v):
        ks, vs = lax.sort((k, v), dimension=0, num_keys=1)
        _, _, vs2 = lax.sort((k, v, v * 2.0), dimension=1, num_keys=2)
        return ks, vs, vs2
    return f


@case("gather_idx_sharded_two_axes_2x4", "x[idx] gather of rows from table [20,8] P(b,None) with idx [6,4] P(a,b); and x[:, idx2] column gather with idx2 [5] P(a)", (2, 4), ("a", "b"), rtol=0, atol=0)
def _h3_32(c):
    c.arg("t", (20, 8), "f32", P("b", None))
    c.arg("idx", (6, 4), "s32", P("a", "b"), lo=0, hi=20)
    c.arg("idx2", (5,), "s32", P(), lo=0, hi=8)
    c.out("g", P("a", "b", None))
    c.out("g2", P())

    def f(t, idx, idx2):
        return t[idx], t[:, wsc(idx2, P("a"))]
    return f


@case("scatter_set_uneven_4x2", "x.at[idx].set(upd) with x [13,6] P(a,b) (13 uneven), idx [5] P(a), upd [5,6] P(a,b); plus .at[].min", (4, 2), ("a", "b"), rtol=0, atol=0)
def _h3_33(c):
    c.arg("x", (13, 6), "f32", P())
    c.arg("idx", (5,), "s32", P(), lo=0, hi=13)
    c.arg("upd", (5, 6), "f32", P())
    c.out("s", P())
    c.out("m", P())

    def f(x, idx, upd):
        x = wsc(x, P("a", "b"))
        idx = wsc(idx, P("a"))
        upd = wsc(upd, P("a", "b"))
        uidx = jnp.array([0, 3, 7, 12, 5], jnp.int32)
        return x.at[uidx].set(upd), x.at[idx].min(upd)
    return f


@case("attn_q_seq_a_kv_heads_b_4x2", "attention where q [2,12,4,4] has seq on a and k/v [2,12,4,4] have heads on b (different shardings per operand); out heads on b", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_34(c):
    B, S, H, K = 2, 12, 4, 4
    c.arg("q", (B, S, H, K), "f32", P(None, "a", None, None))
    c.arg("k", (B, S, H, K), "f32", P(None, None, "b", None))
    c.arg("v", (B, S, H, K), "f32", P(None, None, "b", None))
    c.out("o", P(None, None, "b", None))

    def f(q, k, v):
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) / 2.0
        s = jnp.where(jnp.tril(jnp.ones((S, S), bool)), s, -1e9)
        return (jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(s, -1), v),)
    return f


@case("layernorm_hidden_sharded_batch_2x4", "layernorm over the hidden dim sharded on b with batch on a, x [6,10,24] P(a,None,b), gamma/beta P(b); followed by mean-pool over seq", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_35(c):
    c.arg("x", (6, 10, 24), "f32", P("a", None, "b"))
    c.arg("g", (24,), "f32", P("b"))
    c.arg("bb", (24,), "f32", P("b"))
    c.out("y", P("a", None, "b"))
    c.out("pool", P("a", "b"))

    def f(x, g, bb):
        y = _h3_ln(x) * g + bb
        return y, jnp.mean(y, 1)
    return f


@case("int_rem_negative_clamp_2x4", "s32 jnp.remainder / fmod / abs / sign / clamp / min/max of negatives with [11,9] P(a,b) (uneven both dims)", (2, 4), ("a", "b"), rtol=0, atol=0)
def _h3_36(c):
    c.arg("a", (11, 9), "s32", P(), lo=-50, hi=50)
    c.arg("b", (11, 9), "s32", P(), lo=1, hi=7)
    c.out("o1", P())
    c.out("o2", P())
    c.out("o3", P())

    def f(a, b):
        a = wsc(a, P("a", "b"))
        b = wsc(b, P("b", "a"))
        nb = -b
        o1 = jnp.remainder(a, nb) + jnp.fmod(a, b) * 100
        o2 = jnp.clip(a * jnp.sign(a - 3), -20, 30) + jnp.abs(a) // b
        o3 = jnp.max(jnp.minimum(a, b * 3), axis=1) - jnp.min(a, axis=1)
        return o1, o2, o3
    return f


@case("iota_mask_compare_mesh3d", "iota-based masks on 2x2x2: band mask |i-j|<=2 on x [12,12] P(x,y), argmax over masked rows, and a triangular cumulative count", (2, 2, 2), ("x", "y", "z"), rtol=0, atol=0)
def _h3_37(c):
    c.arg("x", (12, 12), "f32", P("x", "y"))
    c.out("m", P("x", "y"))
    c.out("am", P("z"))
    c.out("cnt", P("y"))

    def f(x):
        i = lax.broadcasted_iota(jnp.int32, (12, 12), 0)
        j = lax.broadcasted_iota(jnp.int32, (12, 12), 1)
        band = jnp.abs(i - j) <= 2
        m = jnp.where(band, x, 0.0)
        am = jnp.argmax(jnp.where(band, x, -jnp.inf), axis=1).astype(jnp.int32)
        cnt = jnp.sum((x > 0) & (j >= i), axis=0).astype(jnp.int32)
        return m, am, cnt
    return f


@case("pad_then_reduce_window_2x4", "jnp.pad (edge-free constant) of x [10,14] P(a,b) by (1,2),(3,0) then 3x3 stride-2 max window and avg window, outputs sharded", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h3_38(c):
    c.arg("x", (10, 14), "f32", P())
    c.out("mx", P())
    c.out("av", P())

    def f(x):
        x = wsc(x, P("a", "b"))
        p = jnp.pad(x, ((1, 2), (3, 0)), constant_values=-0.5)
        mx = lax.reduce_window(p, -jnp.inf, lax.max, (3, 3), (2, 2), "VALID")
        av = lax.reduce_window(p, 0.0, lax.add, (2, 3), (1, 2), "VALID") / 6.0
        return wsc(mx, P("a", "b")), wsc(av, P("b", "a"))
    return f


@case("dot_contract_and_batch_same_axis_8", "dot_general with lhs [8,16,6] contracting dim 16 sharded 8-way and rhs [8,16,5] batch dim sharded 8-way (same axis on different dims)", (8,), ("x",), rtol=1e-4, atol=1e-5)
def _h3_39(c):
    c.arg("l", (8, 16, 6), "f32", P(None, "x", None))
    c.arg("r", (8, 16, 5), "f32", P("x", None, None))
    c.out("o", P("x", None, None))

    def f(l, r):
        return (jnp.einsum("bki,bkj->bij", l, r),)
    return f


@case("transpose_merge_reshape_mesh3d", "x [2,4,6,8] P(x,y,z,None): transpose (2,0,3,1) then reshape to [12,32] merging sharded+unsharded dims, then [6,2,32]", (2, 2, 2), ("x", "y", "z"), rtol=1e-5, atol=1e-5)
def _h3_40(c):
    c.arg("x", (2, 4, 6, 8), "f32", P("x", "y", "z", None))
    c.out("t", P(("z", "x"), "y"))
    c.out("r", P("z", None, None))

    def f(x):
        t = jnp.transpose(x, (2, 0, 3, 1)).reshape(12, 32)
        t = wsc(t, P(("z", "x"), "y"))
        return t, (t * 2.0).reshape(6, 2, 32)
    return f


@case("select_n_index_array_4x2", "lax.select_n with an s32 case-index array [12,10] P(b,a) choosing among 3 operands sharded differently (P(a,b), P(None,b), replicated)", (4, 2), ("a", "b"), rtol=0, atol=0)
def _h3_41(c):
    c.arg("w", (12, 8), "s32", P("b", "a"), lo=0, hi=3)
    c.arg("x", (12, 8), "f32", P("a", "b"))
    c.arg("y", (12, 8), "f32", P(None, "b"))
    c.arg("z", (12, 8), "f32", P())
    c.out("o", P("a", "b"))

    def f(w, x, y, z):
        return (lax.select_n(w, x, y, z),)
    return f


@case("fsdp_dim1_adam_mlp_2x2x2", "FSDP on dim 1 with Adam on 2x2x2: weights [16,24],[24,16] sharded P(tp,(dp,fsdp)), batch on (dp,fsdp); grads resharded to dim-1 shards", (2, 2, 2), ("dp", "fsdp", "tp"), rtol=2e-4, atol=2e-5)
def _h3_42(c):
    sp = P("tp", ("dp", "fsdp"))
    c.arg("x", (8, 16), "f32", P(("dp", "fsdp"), None))
    c.arg("y", (8, 16), "f32", P(("dp", "fsdp"), None))
    for n, s in (("w1", (16, 24)), ("w2", (24, 16))):
        c.arg(n, s, "f32", sp, scale=0.3)
    for n, s in (("m1", (16, 24)), ("m2", (24, 16)), ("v1", (16, 24)), ("v2", (24, 16))):
        c.arg(n, s, "f32", sp, scale=0.01)
    for n in ("w1n", "w2n", "m1n", "m2n", "v1n", "v2n"):
        c.out(n, sp)
    c.out("loss", P())

    def f(x, y, w1, w2, m1, m2, v1, v2):
        def loss(p):
            return jnp.mean((jax.nn.gelu(x @ p[0]) @ p[1] - y) ** 2)
        l, g = jax.value_and_grad(loss)((w1, w2))
        outs = []
        ms, vs = [], []
        for w, gi, m, v in zip((w1, w2), g, (m1, m2), (v1, v2)):
            m = 0.9 * m + 0.1 * gi
            v = 0.999 * jnp.abs(v) + 0.001 * gi * gi
            outs.append(w - 0.01 * m / (jnp.sqrt(v) + 1e-3))
            ms.append(m); vs.append(v)
        return outs[0], outs[1], ms[0], ms[1], vs[0], vs[1], l
    return f


@case("cumsum_then_diff_uneven_two_axes_4x2", "cumsum along dim 0 (11, on a) then jnp.diff along dim 1 (13, on b) of x [11,13] P(a,b); and cumsum of the flattened reversed rows", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_43(c):
    c.arg("x", (11, 13), "f32", P())
    c.out("d", P())
    c.out("rc", P())

    def f(x):
        x = wsc(x, P("a", "b"))
        cs = jnp.cumsum(x, 0)
        d = wsc(jnp.diff(cs, axis=1), P("a", "b"))
        rc = wsc(jnp.cumsum(x[::-1].T, axis=1), P("b", None))
        return d, rc
    return f


@case("expand_squeeze_4d_broadcast_reduce_2x4", "x [6,8] P(a,b) expanded to [6,1,8,1], broadcast to [6,5,8,3] with a [5,3] P(None,None)... then reduce over dims 1 and 3; sharded output", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_44(c):
    c.arg("x", (6, 8), "f32", P("a", "b"))
    c.arg("w", (5, 3), "f32", P())
    c.out("r", P("a", "b"))
    c.out("m", P(None, None, None))

    def f(x, w):
        w = wsc(w, P("b", None))
        t = x[:, None, :, None] * w[None, :, None, :]
        return jnp.sum(jnp.tanh(t), (1, 3)), jnp.max(t, 0)
    return f


@case("conv1d_channels_last_seq_and_features_2x4", "1-D conv NWC x [4,20,8] with seq on a and input channels on b, kernel [3,8,6] sharded on in-channels b; SAME padding", (2, 4), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_45(c):
    c.arg("x", (4, 20, 8), "f32", P(None, "a", "b"))
    c.arg("k", (3, 8, 6), "f32", P(None, "b", None), scale=0.3)
    c.out("y", P(None, "a", None))

    def f(x, k):
        return (lax.conv_general_dilated(x, k, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC")),)
    return f


@case("softmax_over_two_sharded_axes_mesh3d", "softmax over the last dim where x [4,6,16] is P(x,None,(y,z)) (last dim sharded on two axes) and logsumexp; output resharded P(None,y,x)", (2, 2, 2), ("x", "y", "z"), rtol=1e-4, atol=1e-5)
def _h3_46(c):
    c.arg("x", (4, 6, 16), "f32", P("x", None, ("y", "z")))
    c.out("sm", P(None, "y", "x"))
    c.out("lse", P("z", None))

    def f(x):
        return jax.nn.softmax(x, -1), jax.nn.logsumexp(x, -1)
    return f


@case("dynamic_slice_in_fori_sharded_stack_mesh3d", "fori_loop reading layer i of a stacked weight [4,8,8] sharded P(x,y,z) with lax.dynamic_index_in_dim (stack dim sharded) and applying it to h [6,8] P(None,z)", (2, 2, 2), ("x", "y", "z"), rtol=1e-4, atol=1e-5)
def _h3_47(c):
    c.arg("ws", (4, 8, 8), "f32", P("x", "y", "z"), scale=0.3)
    c.arg("h", (6, 8), "f32", P(None, "z"))
    c.out("h", P(None, "z"))

    def f(ws, h):
        def body(i, h):
            w = lax.dynamic_index_in_dim(ws, i, 0, keepdims=False)
            return jnp.tanh(h @ w) + h
        return (lax.fori_loop(0, 4, body, h),)
    return f


@case("roll_replicated_input_sharded_out_8", "jnp.roll by 1 and 3 along dim 1 of a replicated x [8,12] whose results are constrained column-sharded 8-way (12 over 8, uneven) and P(None,x) of a 4x2? no: 8-way mesh", (8,), ("x",), rtol=0, atol=0)
def _h3_48(c):
    c.arg("x", (8, 12), "f32", P())
    c.out("r1", P())
    c.out("r3", P())

    def f(x):
        r1 = wsc(jnp.roll(x, 1, axis=1), P(None, "x"))
        r3 = wsc(jnp.roll(x, 3, axis=1), P(None, "x"))
        return r1 * 2.0, r3 + 1.0
    return f


@case("concat_single_rows_sharded_8", "concatenate of four 1-row slices of x [16,6] (rows 8-way) at rows 0,5,9,15 into [4,6] constrained row-sharded 8-way (4 rows over 8 shards)", (8,), ("x",), rtol=0, atol=0)
def _h3_49(c):
    c.arg("x", (16, 6), "f32", P("x", None))
    c.out("y", P())

    def f(x):
        y = jnp.concatenate([x[0:1], x[5:6] * 2.0, x[9:10], x[15:16] - 1.0], 0)
        return (wsc(wsc(y, P("x", None)) + 1.0, P()),)
    return f


@case("reshard_swap_axes_uneven_2x4", "pure reshard of f32 [11,9] from P(b,a) to P(a,b) (uneven on both dims) followed by exp", (2, 4), ("a", "b"), rtol=1e-5, atol=1e-5)
def _h3_50(c):
    c.arg("x", (11, 9), "f32", P())
    c.out("y", P())

    def f(x):
        x = wsc(jnp.sin(x), P("b", "a"))
        return (wsc(jnp.exp(wsc(x, P("a", "b"))), P()),)
    return f


@case("broadcast_constant_used_two_shardings_8", "a broadcast constant / iota [16,8] combined with x sharded on rows and y sharded on cols (8-way): XLA rematerialises the broadcast per use", (8,), ("x",), rtol=0, atol=0)
def _h3_51(c):
    c.arg("x", (16, 8), "f32", P("x", None))
    c.arg("y", (16, 8), "f32", P(None, "x"))
    c.out("a", P("x", None))
    c.out("b", P(None, "x"))

    def f(x, y):
        k = jnp.full((16, 8), 3.0) + lax.broadcasted_iota(jnp.float32, (16, 8), 1)
        return x * k, y - k
    return f


@case("mlp_uneven_2d_weights_4x2", "MLP with uneven 2-D weight shardings: x [6,13] P(a,None), w1 [13,22] constrained P(a,b), w2 [22,13] constrained P(b,a) (13/22 uneven over 4 and 2)", (4, 2), ("a", "b"), rtol=1e-4, atol=1e-5)
def _h3_52(c):
    c.arg("x", (8, 13), "f32", P("a", None))
    c.arg("w1", (13, 22), "f32", P(), scale=0.3)
    c.arg("w2", (22, 13), "f32", P(), scale=0.3)
    c.out("y", P("a", None))

    def f(x, w1, w2):
        w1 = wsc(w1, P("a", "b"))
        w2 = wsc(w2, P("b", "a"))
        return (x + jax.nn.gelu(x @ w1) @ w2,)
    return f


# ---------------------------------------------------------------------------
# Running a case.
# ---------------------------------------------------------------------------

def spec_to_json(spec):
    out = []
    for e in tuple(spec):
        if e is None:
            out.append(None)
        elif isinstance(e, (tuple, list)):
            out.append(list(e) if len(e) != 1 else e[0])
        else:
            out.append(e)
    return out


def full_spec(spec, rank):
    """PartitionSpec padded with None up to `rank` entries (as JSON)."""
    s = spec_to_json(spec)
    return s + [None] * (rank - len(s))


def _device_arrays(c, mesh):
    vals = []
    for a in c.args:
        d = a["data"]
        if a["dtype"] == "bf16":
            d = d.astype(ml_dtypes.bfloat16)
        vals.append(jax.device_put(d, NamedSharding(mesh, a["spec"])))
    return vals


def _host(x):
    x = np.asarray(x)
    hlo = NP_TO_HLO[x.dtype.name]
    if hlo == "bf16":
        x = x.astype(np.float32)
    return np.array(x, order="C", copy=True), hlo


def _module_dumps(fn_name, before):
    pat = re.compile(r"^module_\d+\.jit_%s\.(\d{4}\..*\.txt)$" % re.escape(fn_name))
    found = {}
    for f in sorted(os.listdir(_DUMP_DIR)):
        if f in before:
            continue
        m = pat.match(f)
        if m:
            found[m.group(1)] = os.path.join(_DUMP_DIR, f)
    return found


def _pick(dumps, needle):
    hits = [k for k in sorted(dumps) if needle in k]
    if len(hits) != 1:
        raise RuntimeError("expected one dump containing %r, got %r" % (needle, sorted(dumps)))
    return hits[0]


def run_case(name, out_root):
    builder, meta = CASES[name]
    c = Case(name, **meta)
    devices = np.array(jax.devices()[:NUM_DEVICES]).reshape(c.mesh_shape)
    mesh = Mesh(devices, tuple(c.axis_names))
    Ctx.mesh, Ctx.single = mesh, False
    fn = builder(c)

    # The HLO module is named jit_<fn.__name__>; parameter names come from
    # the function's own argument names, so rename rather than wrap.
    sharded = fn
    sharded.__name__ = sharded.__qualname__ = name

    in_sh = tuple(NamedSharding(mesh, a["spec"]) for a in c.args)
    out_sh = tuple(NamedSharding(mesh, s) for _, s in c.outs)
    jitted = jax.jit(sharded, in_shardings=in_sh, out_shardings=out_sh)

    before = set(os.listdir(_DUMP_DIR))
    outs = jitted(*_device_arrays(c, mesh))
    outs = jax.tree_util.tree_leaves(outs)
    if len(outs) != len(c.outs):
        raise RuntimeError("%s: %d outputs, %d out specs" % (name, len(outs), len(c.outs)))
    host_outs = [_host(o) for o in outs]

    dumps = _module_dumps(name, before)
    files = {
        "input.hlo": _pick(dumps, "before_sharding-propagation"),
        "propagated.hlo": _pick(dumps, "after_sharding-propagation.before_spmd-partitioning"),
        "xla_partitioned.hlo": _pick(dumps, "after_spmd-partitioning"),
    }

    # Single-device rerun (sharding constraints removed) as a sanity check.
    if c.manual:
        sdc = {"skipped": "shard_map needs the 8-device mesh"}
    else:
        Ctx.single = True
        fn1 = builder(Case(name, **meta))

        single = fn1
        single.__name__ = single.__qualname__ = name + "_single_device"
        dev0 = jax.devices()[0]
        args1 = []
        for a in c.args:
            d = a["data"].astype(ml_dtypes.bfloat16) if a["dtype"] == "bf16" else a["data"]
            args1.append(jax.device_put(d, dev0))
        ref = jax.tree_util.tree_leaves(jax.jit(single)(*args1))
        Ctx.single = False
        diffs, ok = [], True
        for (o, hlo), r in zip(host_outs, ref):
            r, _ = _host(r)
            if o.dtype == np.bool_ or np.issubdtype(o.dtype, np.integer):
                d = float(np.max(np.abs(o.astype(np.complex128 if np.iscomplexobj(o) else np.float64) - r.astype(np.complex128 if np.iscomplexobj(r) else np.float64)))) if o.size else 0.0
                ok = ok and d == 0.0
            else:
                d = float(np.max(np.abs(o.astype(np.complex128 if np.iscomplexobj(o) else np.float64) - r.astype(np.complex128 if np.iscomplexobj(r) else np.float64)))) if o.size else 0.0
                ok = ok and bool(np.allclose(o, r, rtol=c.rtol, atol=c.atol))
            diffs.append(d)
        sdc = {"max_abs_diff": diffs, "within_rtol_atol": bool(ok)}
        if not ok:
            print("WARNING: %s: single-device rerun differs: %r" % (name, diffs), file=sys.stderr)

    # ---- write the case directory -----------------------------------------
    case_dir = os.path.join(out_root, "cases", name)
    if os.path.isdir(case_dir):
        shutil.rmtree(case_dir)
    os.makedirs(os.path.join(case_dir, "args"))
    os.makedirs(os.path.join(case_dir, "expected"))
    texts = {}
    for dst, src in files.items():
        with open(dumps[src], encoding="utf-8") as f:
            texts[dst] = clean_hlo(f.read())
        with open(os.path.join(case_dir, dst), "w", encoding="utf-8", newline="\n") as f:
            f.write(texts[dst])
    for i, a in enumerate(c.args):
        np.save(os.path.join(case_dir, "args", "arg%d.npy" % i),
                np.array(a["data"], order="C", copy=True), allow_pickle=False)
    for i, (o, _) in enumerate(host_outs):
        np.save(os.path.join(case_dir, "expected", "out%d.npy" % i), o, allow_pickle=False)

    counts, total_bytes, by_op, hist = collective_stats(texts["xla_partitioned.hlo"])
    args_json = []
    for i, a in enumerate(c.args):
        args_json.append({
            "index": i, "name": a["name"], "shape": a["shape"], "dtype": a["dtype"],
            "spec": full_spec(a["spec"], len(a["shape"])), "generator": a["generator"],
            "npy_dtype": HLO_TYPES[a["dtype"]][0],
        })
    outs_json = []
    for i, ((oname, ospec), (o, hlo)) in enumerate(zip(c.outs, host_outs)):
        outs_json.append({
            "index": i, "name": oname, "shape": list(o.shape), "dtype": hlo,
            "npy_dtype": o.dtype.name, "spec": full_spec(ospec, o.ndim),
            "exact": bool(o.dtype == np.bool_ or np.issubdtype(o.dtype, np.integer)),
        })
    meta_json = {
        "name": name,
        "description": c.description,
        "mesh_shape": c.mesh_shape,
        "axis_names": c.axis_names,
        "device_order": "row-major iota over the mesh: devices 0..7 reshaped to mesh_shape",
        "num_partitions": NUM_DEVICES,
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
        "xla_spmd_dump_files_all": sorted(dumps),
        "generator_note": (
            "Inputs from hash_u32 / hash_uniform_float / hash_uniform_int in "
            "tools/testdata_gen/generate.py (murmur3 fmix32 of the row-major flat index plus "
            "seed*0x9E3779B9, see testdata/README.md); 'explicit' args hold the recorded value; "
            "bf16 tensors are stored in .npy as exactly-widened float32."),
        "jax_version": jax.__version__,
    }
    with open(os.path.join(case_dir, "case.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write(format_case_json(meta_json))
    return meta_json


def _inline(v):
    return json.dumps(v, ensure_ascii=True, allow_nan=False)


def format_case_json(d):
    """Top-level keys one per line; args expanded one key per line; outputs
    one per line; everything else inline.  Key order is fixed by run_case."""
    lines = ["{"]
    items = list(d.items())
    for n, (k, v) in enumerate(items):
        comma = "," if n + 1 < len(items) else ""
        if k == "args":
            lines.append(' "args": [')
            for m, a in enumerate(v):
                lines.append("  {")
                sub = list(a.items())
                for q, (ak, av) in enumerate(sub):
                    lines.append("   %s: %s%s" % (_inline(ak), _inline(av), "," if q + 1 < len(sub) else ""))
                lines.append("  }" + ("," if m + 1 < len(v) else ""))
            lines.append(" ]" + comma)
        elif k == "outputs":
            lines.append(' "outputs": [')
            for m, o in enumerate(v):
                lines.append("  " + _inline(o) + ("," if m + 1 < len(v) else ""))
            lines.append(" ]" + comma)
        else:
            lines.append(" %s: %s%s" % (_inline(k), _inline(v), comma))
    lines.append("}")
    return "\n".join(lines) + "\n"


def dir_size(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def write_index(out_root, cases_dir=None, generator="tools/testdata_gen/generate.py"):
    """Write <out_root>/index.json summarising every <cases_dir>/*/case.json
    (cases_dir defaults to <out_root>/cases; generate_shardy.py passes its own)."""
    if cases_dir is None:
        cases_dir = os.path.join(out_root, "cases")
    entries = []
    for name in sorted(os.listdir(cases_dir)):
        p = os.path.join(cases_dir, name, "case.json")
        if not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8") as f:
            d = json.load(f)
        entries.append({
            "name": d["name"],
            "mesh_shape": d["mesh_shape"],
            "axis_names": d["axis_names"],
            "num_args": len(d["args"]),
            "num_outputs": len(d["outputs"]),
            "xla_collectives": {k: v for k, v in d["xla_collectives"].items() if v},
            "xla_collective_bytes": d["xla_collective_bytes"],
            "manual": "skipped" in d.get("single_device_check", {}),
            "size_bytes": dir_size(os.path.join(cases_dir, name)),
            "description": d["description"],
        })
    index = {
        "generator": generator,
        "jax_version": jax.__version__,
        "num_partitions": NUM_DEVICES,
        "num_cases": len(entries),
        "total_size_bytes": sum(e["size_bytes"] for e in entries),
        "cases": entries,
    }
    lines = ["{"]
    keys = list(index)
    for n, k in enumerate(keys):
        comma = "," if n + 1 < len(keys) else ""
        if k == "cases":
            lines.append(' "cases": [')
            for m, e in enumerate(entries):
                lines.append("  " + _inline(e) + ("," if m + 1 < len(entries) else ""))
            lines.append(" ]" + comma)
        else:
            lines.append(" %s: %s%s" % (_inline(k), _inline(index[k]), comma))
    lines.append("}")
    with open(os.path.join(out_root, "index.json"), "w", encoding="utf-8", newline="\n") as f:
        f.write("\n".join(lines) + "\n")
    return index


def main(argv=None):
    ap = argparse.ArgumentParser(description="Generate XLA SPMD testdata cases.")
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "testdata"),
                    help="output root (cases go to OUT/cases/<name>; default: <repo>/testdata)")
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="generate only this case (repeatable, or comma-separated)")
    ap.add_argument("--list", action="store_true", help="list case names and exit")
    ap.add_argument("--keep-dumps", action="store_true",
                    help="keep XLA's raw dump folder (its path is printed)")
    args = ap.parse_args(argv)

    if args.list:
        for n in CASES:
            print(n)
        return 0
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

    os.makedirs(os.path.join(args.out, "cases"), exist_ok=True)
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
            print("%-36s %-10s %-60s %8d B" % (n, "x".join(map(str, m["mesh_shape"])), coll,
                                              m["xla_collective_bytes"]))
        index = write_index(args.out)
        print("%d cases in %s, %.1f KiB" % (index["num_cases"], args.out,
                                             index["total_size_bytes"] / 1024.0))
    finally:
        if args.keep_dumps:
            _KEEP_DUMPS.append(True)
            print("raw dumps kept in %s" % _DUMP_DIR)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
