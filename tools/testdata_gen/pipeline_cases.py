#!/usr/bin/env python3
"""Pipeline-parallel test programs (issue: MPMD pipelining), written with
JAX at its defaults and dumped before optimization:

  transformer4_tp2_m8: a 4-layer residual transformer train step,
    tensor-parallel over 2 devices (Megatron splits), layer k under
    named_scope("stage_k"), m = 8 microbatches; JAX's default (Shardy)
    lowering for 2 partitions: 4 stages x 2-way TP on 8 devices.
  stacked8_m8: the same MLP as one lax.scan over stacked weights, without
    stage scopes: stages come from cutting the layer scans.
  mlp8_m8: an 8-layer tanh MLP train step, layer k under
    `jax.named_scope("stage_k")`, gradients accumulated over m = 8
    microbatches by a `lax.scan` (the loop that gets pipelined). Cut into
    4 stages (2 layers each) for GPipe and 1F1B, or 8 virtual stages (v = 2
    per device) for interleaved 1F1B.

Each case directory holds input.hlo (XLA's before_optimizations dump),
args/argN.npy (the flattened arguments, in entry-parameter order),
expected/outN.npy (JAX's outputs on the CPU) and case.json.

Usage: python3 tools/testdata_gen/pipeline_cases.py [--out testdata/pipeline_cases]
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
GENERATOR = "tools/testdata_gen/pipeline_cases.py"
sys.path.insert(0, HERE)
from case_files import start_dump, write_case  # noqa: E402


def accumulated_train_step(loss_fn, microbatches):
    """The train step that averages LOSS_FN and its gradients over the
    microbatches of `xs`, `ys` (stacked on axis 0) with a `lax.scan`: the
    loop that gets pipelined (jax must already be imported)."""
    import jax
    import jax.numpy as jnp

    def train_step(params, xs, ys):
        def body(carry, xy):
            loss_acc, grads_acc = carry
            loss, grads = jax.value_and_grad(loss_fn)(params, *xy)
            return (loss_acc + loss, jax.tree.map(jnp.add, grads_acc, grads)), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        (loss, grads), _ = jax.lax.scan(body, (jnp.float32(0), zeros), (xs, ys))
        return loss / microbatches, jax.tree.map(lambda g: g / microbatches, grads)

    return train_step


def mlp_case(out_dir, name, layers, width, microbatch, microbatches, seed):
    dump = start_dump()
    import jax
    import jax.numpy as jnp
    import numpy as np

    def layer(w, b, h):
        return jnp.tanh(h @ w + b)

    def loss_fn(params, x, y):
        h = x
        for k in range(layers):
            with jax.named_scope(f"stage_{k}"):
                h = layer(params[k][0], params[k][1], h)
        return jnp.mean((h - y) ** 2)

    train_step = accumulated_train_step(loss_fn, microbatches)

    rng = np.random.default_rng(seed)
    params = [((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32),
               rng.standard_normal((width,)).astype(np.float32) * 0.1)
              for _ in range(layers)]
    xs = rng.standard_normal((microbatches, microbatch, width)).astype(np.float32)
    ys = rng.standard_normal((microbatches, microbatch, width)).astype(np.float32)
    outputs = jax.jit(train_step)(params, xs, ys)
    flat_args = [a for wb in params for a in wb] + [xs, ys]
    flat_out = jax.tree.leaves(outputs)

    meta = {
        "name": name,
        "description": (f"{layers}-layer tanh MLP train step (width {width}), layer k under "
                        f"named_scope stage_k; gradients accumulated over {microbatches} "
                        f"microbatches of {microbatch} rows by lax.scan"),
        "layers": layers,
        "microbatches": microbatches,
        "stage_scope_prefix": "stage_",
        "num_args": len(flat_args),
        "num_outputs": len(flat_out),
        "outputs": ["loss"] + [f"grad_{'w' if i % 2 == 0 else 'b'}{i // 2}"
                               for i in range(len(flat_out) - 1)],
        "rtol": 1e-4,
        "atol": 1e-5,
    }
    write_case(out_dir, name, dump, meta, GENERATOR, args=flat_args, outputs=flat_out)


def transformer_tp_case(out_dir, name, layers, width, heads, seq, microbatch, microbatches, seed):
    """A residual transformer train step (attention with heads, then an
    MLP, per layer), tensor-parallel over a 2-device `tp` mesh axis
    (Megatron: Q/K/V and the first MLP matrix split by columns, the output
    projections by rows), layer k under named_scope("stage_k"), gradients
    accumulated over a scan of microbatches. Lowered with JAX's defaults
    (Shardy) for 2 partitions."""
    dump = start_dump("--xla_force_host_platform_device_count=8")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("tp",))
    head_dim = width // heads

    def attention(wq, wk, wv, wo, h):
        b, t, _ = h.shape
        q = (h @ wq).reshape(b, t, heads, head_dim)
        k = (h @ wk).reshape(b, t, heads, head_dim)
        v = (h @ wv).reshape(b, t, heads, head_dim)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(head_dim)
        mask = jnp.tril(jnp.ones((t, t), dtype=bool))
        scores = jnp.where(mask, scores, -1e9)
        probs = jax.nn.softmax(scores, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, heads * head_dim)
        return out @ wo

    def block(p, h):
        h = h + attention(p["wq"], p["wk"], p["wv"], p["wo"], h)
        return h + jnp.tanh(h @ p["w1"]) @ p["w2"]

    def loss_fn(params, x, y):
        h = x
        for k in range(layers):
            with jax.named_scope(f"stage_{k}"):
                h = block(params[k], h)
        return jnp.mean((h - y) ** 2)

    train_step = accumulated_train_step(loss_fn, microbatches)

    rng = np.random.default_rng(seed)
    hidden = 2 * width

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)

    params = [{"wq": matrix(width, width), "wk": matrix(width, width), "wv": matrix(width, width),
               "wo": matrix(width, width), "w1": matrix(width, hidden), "w2": matrix(hidden, width)}
              for _ in range(layers)]
    specs = {"wq": P(None, "tp"), "wk": P(None, "tp"), "wv": P(None, "tp"), "wo": P("tp", None),
             "w1": P(None, "tp"), "w2": P("tp", None)}
    param_shardings = [{k: NamedSharding(mesh, v) for k, v in specs.items()} for _ in range(layers)]
    xs = rng.standard_normal((microbatches, microbatch, seq, width)).astype(np.float32)
    ys = rng.standard_normal((microbatches, microbatch, seq, width)).astype(np.float32)
    replicated = NamedSharding(mesh, P())
    step = jax.jit(train_step, in_shardings=(param_shardings, replicated, replicated))
    outputs = step(params, xs, ys)
    flat_args = jax.tree.leaves(params) + [xs, ys]
    flat_out = jax.tree.leaves(outputs)

    meta = {
        "name": name,
        "description": (f"{layers}-layer residual transformer train step (width {width}, {heads} heads, "
                        f"seq {seq}), tensor-parallel over a 2-device tp axis (Megatron splits), layer k "
                        f"under named_scope stage_k; gradients accumulated over {microbatches} "
                        f"microbatches of {microbatch} by lax.scan; JAX defaults (Shardy)"),
        "layers": layers,
        "microbatches": microbatches,
        "tensor_parallel": 2,
        "stage_scope_prefix": "stage_",
        "num_args": len(flat_args),
        "num_outputs": len(flat_out),
        "rtol": 1e-4,
        "atol": 1e-5,
    }
    write_case(out_dir, name, dump, meta, GENERATOR, args=flat_args, outputs=flat_out)


def stacked_case(out_dir, name, layers, width, microbatch, microbatches, seed):
    """An MLP train step whose layers are one `lax.scan` over stacked
    weights [layers, width, width] (no stage scopes): the case for cutting
    layer scans into stages."""
    dump = start_dump()
    import jax
    import jax.numpy as jnp
    import numpy as np

    def loss_fn(ws, x, y):
        def layer(h, w):
            return jnp.tanh(h @ w), None

        h, _ = jax.lax.scan(layer, x, ws)
        return jnp.mean((h - y) ** 2)

    def train_step(ws, xs, ys):
        def body(carry, xy):
            loss, grads = jax.value_and_grad(loss_fn)(ws, *xy)
            return (carry[0] + loss, carry[1] + grads), None

        (loss, grads), _ = jax.lax.scan(body, (jnp.float32(0), jnp.zeros_like(ws)), (xs, ys))
        return loss / microbatches, grads / microbatches

    rng = np.random.default_rng(seed)
    ws = (rng.standard_normal((layers, width, width)) / np.sqrt(width)).astype(np.float32)
    xs = rng.standard_normal((microbatches, microbatch, width)).astype(np.float32)
    ys = rng.standard_normal((microbatches, microbatch, width)).astype(np.float32)
    outputs = jax.jit(train_step)(ws, xs, ys)
    flat_args = [ws, xs, ys]
    flat_out = jax.tree.leaves(outputs)
    meta = {
        "name": name,
        "description": (f"{layers}-layer tanh MLP train step as one lax.scan over stacked weights "
                        f"[{layers},{width},{width}] (no stage scopes), gradients accumulated over "
                        f"{microbatches} microbatches of {microbatch} by an outer lax.scan"),
        "layers": layers,
        "microbatches": microbatches,
        "num_args": len(flat_args),
        "num_outputs": len(flat_out),
        "rtol": 1e-4,
        "atol": 1e-5,
    }
    write_case(out_dir, name, dump, meta, GENERATOR, args=flat_args, outputs=flat_out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "testdata", "pipeline_cases"))
    parser.add_argument("--case", choices=["mlp8_m8", "transformer4_tp2_m8", "stacked8_m8", "all"], default="all")
    args = parser.parse_args()
    # XLA_FLAGS are read when jax first initializes: one case per process.
    if args.case == "all":
        for case in ["mlp8_m8", "transformer4_tp2_m8", "stacked8_m8"]:
            subprocess.run([sys.executable, __file__, "--out", args.out, "--case", case], check=True)
    elif args.case == "mlp8_m8":
        mlp_case(args.out, "mlp8_m8", layers=8, width=16, microbatch=4, microbatches=8, seed=19)
    elif args.case == "stacked8_m8":
        stacked_case(args.out, "stacked8_m8", layers=8, width=16, microbatch=4, microbatches=8, seed=29)
    else:
        transformer_tp_case(args.out, "transformer4_tp2_m8", layers=4, width=8, heads=2, seq=4,
                            microbatch=2, microbatches=8, seed=23)


if __name__ == "__main__":
    sys.exit(main())
