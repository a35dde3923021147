#!/usr/bin/env python3
"""Programs for sharding tactics (issue: PartIR-style tactics), written with
JAX without any sharding annotation and dumped before optimization:

  mlp2_train: a 2-layer MLP train step (loss and gradients of w1 [D, H],
    w2 [H, D] for a batch x [B, D], y [B, D]); the tactics of the tests
    shard it over a 2x4 mesh.
  transformer_train: a one-layer transformer train step (attention with 4
    heads, MLP), the same way.
  mlp3_ce: a 3-layer MLP with a bias and cross-entropy (found that ZeRO-3
    re-split a bias Megatron had split).
  mlp2_batch_lowered: the MLP with a batch of 65536 and width 1024, lowered
    only: data parallelism pays when memory allows.
  transformer_2k_lowered: the same step at width 2048, sequence 512, lowered
    only (no arrays), for automatic sharding.

Each case directory holds input.hlo, args/argN.npy, expected/outN.npy (JAX
on one CPU device) and case.json.

Usage: python3 tools/testdata_gen/tactics_cases.py [--out testdata/tactics_cases]
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
GENERATOR = "tools/testdata_gen/tactics_cases.py"
sys.path.insert(0, HERE)
from case_files import start_dump, write_case  # noqa: E402


def mlp2_step():
    """The 2-layer tanh MLP train step (loss, then SGD-updated w1, w2; jax
    must already be imported)."""
    import jax
    import jax.numpy as jnp

    def loss_fn(w1, w2, x, y):
        h = jnp.tanh(x @ w1)
        return jnp.mean((h @ w2 - y) ** 2)

    def train_step(w1, w2, x, y):
        loss, (g1, g2) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w1, w2, x, y)
        return loss, w1 - 0.1 * g1, w2 - 0.1 * g2

    return train_step


def mlp2_case(out_dir, name, batch, width, hidden, seed):
    dump = start_dump()
    import jax
    import jax.numpy as jnp
    import numpy as np

    train_step = mlp2_step()

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((width, hidden)) / np.sqrt(width)).astype(np.float32)
    w2 = (rng.standard_normal((hidden, width)) / np.sqrt(hidden)).astype(np.float32)
    x = rng.standard_normal((batch, width)).astype(np.float32)
    y = rng.standard_normal((batch, width)).astype(np.float32)
    outputs = jax.jit(train_step)(w1, w2, x, y)
    args = [w1, w2, x, y]
    meta = {
        "name": name,
        "description": (f"2-layer tanh MLP train step (SGD), x [{batch},{width}], "
                        f"w1 [{width},{hidden}], w2 [{hidden},{width}]; no shardings"),
        "num_args": len(args),
        "rtol": 1e-4,
        "atol": 1e-5,
    }
    write_case(out_dir, name, dump, meta, GENERATOR, args=args, outputs=jax.tree.leaves(outputs))


def transformer_step(width, heads):
    """The one-layer residual transformer train step (multi-head attention,
    then a tanh MLP; SGD update) for activations of width WIDTH (jax must
    already be imported: after start_dump)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    head_dim = width // heads

    def loss_fn(wq, wk, wv, wo, w1, w2, x, y):
        b, t, _ = x.shape
        q = (x @ wq).reshape(b, t, heads, head_dim)
        k = (x @ wk).reshape(b, t, heads, head_dim)
        v = (x @ wv).reshape(b, t, heads, head_dim)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(head_dim)
        probs = jax.nn.softmax(scores, axis=-1)
        h = x + jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, width) @ wo
        h = h + jnp.tanh(h @ w1) @ w2
        return jnp.mean((h - y) ** 2)

    def train_step(wq, wk, wv, wo, w1, w2, x, y):
        loss, grads = jax.value_and_grad(loss_fn, argnums=(0, 1, 2, 3, 4, 5))(
            wq, wk, wv, wo, w1, w2, x, y)
        weights = (wq, wk, wv, wo, w1, w2)
        return (loss,) + tuple(w - 0.1 * g for w, g in zip(weights, grads))

    return train_step


def transformer_case(out_dir, name, batch, seq, width, heads, seed):
    """A one-layer residual transformer train step (multi-head attention,
    then a tanh MLP; SGD update), no shardings."""
    dump = start_dump()
    import jax
    import jax.numpy as jnp
    import numpy as np

    train_step = transformer_step(width, heads)

    rng = np.random.default_rng(seed)

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)

    args = [matrix(width, width) for _ in range(4)] + [matrix(width, 2 * width), matrix(2 * width, width)]
    args += [rng.standard_normal((batch, seq, width)).astype(np.float32),
             rng.standard_normal((batch, seq, width)).astype(np.float32)]
    outputs = jax.jit(train_step)(*args)
    meta = {
        "name": name,
        "description": (f"one-layer transformer train step (SGD): x [{batch},{seq},{width}], "
                        f"{heads} heads, MLP hidden {2 * width}; no shardings"),
        "num_args": len(args),
        "rtol": 1e-4,
        "atol": 1e-5,
    }
    write_case(out_dir, name, dump, meta, GENERATOR, args=args, outputs=jax.tree.leaves(outputs))


def transformer_lowered_case(out_dir, name, batch, seq, width, heads):
    """The one-layer transformer train step at a realistic size, lowered
    only (input.hlo, no arrays): for automatic sharding, which judges plans
    by the cost model without running them."""
    dump = start_dump()
    import jax
    import jax.numpy as jnp
    import numpy as np

    train_step = transformer_step(width, heads)

    f32 = jnp.float32
    shapes = [jax.ShapeDtypeStruct((width, width), f32)] * 4 + [
        jax.ShapeDtypeStruct((width, 4 * width), f32), jax.ShapeDtypeStruct((4 * width, width), f32),
        jax.ShapeDtypeStruct((batch, seq, width), f32), jax.ShapeDtypeStruct((batch, seq, width), f32)]
    jax.jit(train_step).lower(*shapes).compile()
    meta = {
        "name": name,
        "description": (f"one-layer transformer train step (SGD): x [{batch},{seq},{width}], "
                        f"{heads} heads, MLP hidden {4 * width}; no shardings; lowered only"),
    }
    write_case(out_dir, name, dump, meta, GENERATOR)


def mlp2_lowered_case(out_dir, name, batch, width, hidden):
    """The 2-layer MLP train step at a batch-heavy size, lowered only (for
    automatic sharding: data parallelism when memory allows)."""
    dump = start_dump()
    import jax
    import jax.numpy as jnp

    train_step = mlp2_step()

    f32 = jnp.float32
    shapes = [jax.ShapeDtypeStruct((width, hidden), f32), jax.ShapeDtypeStruct((hidden, width), f32),
              jax.ShapeDtypeStruct((batch, width), f32), jax.ShapeDtypeStruct((batch, width), f32)]
    jax.jit(train_step).lower(*shapes).compile()
    meta = {
        "name": name,
        "description": (f"2-layer tanh MLP train step (SGD), x [{batch},{width}], "
                        f"w1 [{width},{hidden}], w2 [{hidden},{width}]; lowered only"),
    }
    write_case(out_dir, name, dump, meta, GENERATOR)


def mlp3_ce_case(out_dir, name, seed):
    """A 3-layer MLP with a bias, layernorm and softmax cross-entropy (SGD):
    a bias that follows Megatron's split, which ZeRO-3 must not re-split."""
    dump = start_dump()
    import jax
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)

    def matrix(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(rows)).astype(np.float32)

    def layernorm(h):
        mean = h.mean(-1, keepdims=True)
        return (h - mean) / jnp.sqrt(((h - mean) ** 2).mean(-1, keepdims=True) + 1e-5)

    def loss_fn(w_in, b_in, w_mid, w_out, x, y):
        h = jax.nn.gelu(layernorm(x) @ w_in + b_in)
        h = h + jnp.tanh(h @ w_mid)
        return -jnp.mean(jnp.sum(jax.nn.log_softmax(h @ w_out) * y, -1))

    def train_step(w_in, b_in, w_mid, w_out, x, y):
        loss, grads = jax.value_and_grad(loss_fn, argnums=(0, 1, 2, 3))(
            w_in, b_in, w_mid, w_out, x, y)
        return (loss,) + tuple(p - 0.05 * g for p, g in zip((w_in, b_in, w_mid, w_out), grads))

    args = [matrix(16, 32), np.zeros(32, np.float32), matrix(32, 32), matrix(32, 8),
            rng.standard_normal((32, 16)).astype(np.float32),
            np.eye(8, dtype=np.float32)[rng.integers(0, 8, 32)]]
    outputs = jax.jit(train_step)(*args)
    meta = {
        "name": name,
        "description": "3-layer MLP with bias, layernorm and cross-entropy (SGD); no shardings",
        "num_args": len(args),
        "rtol": 1e-4,
        "atol": 1e-5,
    }
    write_case(out_dir, name, dump, meta, GENERATOR, args=args, outputs=jax.tree.leaves(outputs))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "testdata", "tactics_cases"))
    parser.add_argument("--case", choices=["mlp2_train", "transformer_train", "transformer_2k_lowered", "mlp2_batch_lowered", "mlp3_ce", "all"], default="all")
    args = parser.parse_args()
    # XLA_FLAGS are read when jax first initializes: one case per process.
    if args.case == "all":
        for case in ["mlp2_train", "transformer_train", "transformer_2k_lowered", "mlp2_batch_lowered",
                     "mlp3_ce"]:
            subprocess.run([sys.executable, __file__, "--out", args.out, "--case", case], check=True)
    elif args.case == "mlp2_train":
        mlp2_case(args.out, "mlp2_train", batch=16, width=16, hidden=32, seed=31)
    elif args.case == "mlp3_ce":
        mlp3_ce_case(args.out, "mlp3_ce", seed=3)
    elif args.case == "mlp2_batch_lowered":
        mlp2_lowered_case(args.out, "mlp2_batch_lowered", batch=65536, width=1024, hidden=1024)
    elif args.case == "transformer_2k_lowered":
        transformer_lowered_case(args.out, "transformer_2k_lowered", batch=16, seq=512, width=2048,
                                 heads=16)
    else:
        transformer_case(args.out, "transformer_train", batch=4, seq=8, width=16, heads=4, seed=37)


if __name__ == "__main__":
    sys.exit(main())
