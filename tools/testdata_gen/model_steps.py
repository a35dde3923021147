#!/usr/bin/env python3
"""Two more model train steps, written in plain JAX the way real frameworks
write them, checked end to end against XLA: a Mixtral-style MoE decoder with
expert parallelism and a DeepSeek-style MLA (multi-head latent attention)
decoder.  Small widths and two layers, so that each compiles in seconds on
the CPU.

Models (all: token embedding, decoder layers of RMSNorm -> attention ->
residual, RMSNorm -> MLP -> residual, final RMSNorm, untied LM head, softmax
cross-entropy, jax.value_and_grad and an optimizer update; outputs the loss
and the new parameters / optimizer state with the shardings they came in):

  moe           Mixtral-style: causal multi-head attention with rotary
                embeddings; MoE MLP with 8 SwiGLU experts, top-2 softmax router
                (Mixtral renormalizes the two gates), GShard/MaxText dense
                dispatch: token positions inside each expert by a cumsum over
                the (k-major) routing mask, capacity factor 1.5, dispatch and
                combine tensors [G, S, E, C], `einsum("gsec,gsd->egcd")` with a
                sharding constraint that moves the expert dim onto the
                "expert" axis (XLA makes the all-to-all), expert SwiGLU, and
                the combine einsum back to [G, S, D]; a Switch-style load
                balancing loss.  SGD with momentum.  Mesh 2x4 ("data",
                "expert"): the batch (groups) on both axes outside the MoE
                block, non-expert weights FSDP over both axes, expert weights
                P("expert", "data", ...) (expert-parallel, FSDP on "data").
  moe_shardmap  The same model, but the MoE block is a jax.shard_map over
                both axes (MaxText's/Megablocks-style manual path): expert
                weights all-gathered over "data" inside (FSDP), local routing,
                jax.lax.all_to_all over "expert" to send tokens to their
                experts and back, pmean of the auxiliary loss.
  mla           DeepSeek-V2/V3-style MLA: q low-rank (wq_a -> RMSNorm ->
                wq_b), joint KV compression (wkv_a -> [latent c_kv | k_pe]),
                RMSNorm of the latent, up-projection wkv_b to per-head
                [k_nope | v], decoupled rotary part (rope on q_pe and on the
                single shared k_pe, broadcast over heads), causal softmax
                attention with scale 1/sqrt(nope + rope); SwiGLU MLP.  Adam.
                Mesh 2x4 ("fsdp", "tp"), MaxText-like FSDP x TP: batch on
                fsdp, weights' embed dim on fsdp, heads / MLP hidden / vocab
                on tp.

Driver, per model and per lowering (shardy = JAX's default; gspmd =
jax_use_shardy_partitioner=False), in OUT/<model>_<lowering>/:
  1. a child python compiles and runs the jitted step with
        XLA_FLAGS=--xla_force_host_platform_device_count=8 --xla_dump_to=DUMP
                  --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=.*
                  --xla_dump_large_constants   (the rope tables and causal masks
                                                are constants; elided, they cannot run)
     on small deterministic random inputs (args/arg<i>.npy, entry parameter
     order) and saves XLA's outputs (expected/out<i>.npy); from the dump:
        input.hlo            before_optimizations
        xla_propagated.hlo   after shardy-xla (shardy) / after sharding-propagation
                             (gspmd), i.e. the module spmd-partitioning receives
        xla_partitioned.hlo  after spmd-partitioning
  2. hlo-opt input.hlo --passes=sharding-propagation,spmd-partitioning --stats
     vs hlo-opt xla_partitioned.hlo --stats (collective_bytes, collectives);
  3. run_hlo_module input.hlo --partition --args args --expected expected
     (our propagation + partitioning, run on 8 loopback devices, compared
     with XLA's outputs);
  4. hlo-opt input.hlo --passes=sharding-propagation --compare-shardings
     xla_propagated.hlo (matched/total).
Prints a table and, per failure, the command that reproduces it.  The two
binaries are copied to OUT/bin first (a rebuild during the run does not
change what runs); the repro commands name target/release/.

Usage:
    python3 tools/testdata_gen/model_steps.py                    # all models, both lowerings
    python3 tools/testdata_gen/model_steps.py --models mla --lowerings shardy
    python3 tools/testdata_gen/model_steps.py --out DIR --rtol 1e-4 --atol 1e-5 --keep-dumps
Output: OUT (default /tmp/model_steps)/<model>_<lowering>/..., OUT/results.json.
Needs jax/jaxlib/numpy only.
"""

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from shardy_speed import pick_dump  # noqa: E402

HLO_OPT = os.path.join(REPO_ROOT, "target", "release", "hlo-opt")
RUN_HLO = os.path.join(REPO_ROOT, "target", "release", "run_hlo_module")
MODELS = ("moe", "moe_shardmap", "mla")
LOWERINGS = ("shardy", "gspmd")
NUM_DEVICES = 8


# ---------------------------------------------------------------------------
# Models (imported only in the child, after XLA_FLAGS is set).
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class MoEConfig:
    layers: int = 2
    vocab: int = 256
    hidden: int = 64
    heads: int = 4
    head_dim: int = 16
    experts: int = 8
    top_k: int = 2
    mlp: int = 128            # per-expert hidden
    capacity_factor: float = 1.5
    batch: int = 8            # = groups; one per device outside the MoE block
    seq: int = 32
    lr: float = 1e-2
    momentum: float = 0.9
    aux_weight: float = 0.01


@dataclasses.dataclass
class MLAConfig:
    layers: int = 2
    vocab: int = 256
    hidden: int = 64
    heads: int = 8
    q_lora_rank: int = 32
    kv_lora_rank: int = 32
    qk_nope_dim: int = 16
    qk_rope_dim: int = 8
    v_dim: int = 16
    mlp: int = 128
    batch: int = 8
    seq: int = 32
    lr: float = 1e-3


def _common():
    import numpy as np
    import jax
    import jax.numpy as jnp
    from jax import lax
    return np, jax, jnp, lax


def rms_norm(x, scale):
    _, _, jnp, lax = _common()
    x32 = x.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
    return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rope_tables(seq, dim):
    import numpy as np
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    ang = np.arange(seq, dtype=np.float32)[:, None] * inv_freq[None, :]     # [S, dim/2]
    return np.cos(ang), np.sin(ang)


def rope(x, cos_np, sin_np):
    """x: [B, S, N, dim]; rotate-half form (Llama / DeepSeek HF reference)."""
    _, _, jnp, _ = _common()
    cos = jnp.asarray(cos_np, x.dtype)[None, :, None, :]
    sin = jnp.asarray(sin_np, x.dtype)[None, :, None, :]
    x1, x2 = jnp.split(x, 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def cross_entropy(logits, targets):
    _, jax, jnp, _ = _common()
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return jnp.mean(nll)


def build_moe(mesh, shard_map_variant=False, cfg=None):
    np, jax, jnp, lax = _common()
    from jax.sharding import NamedSharding, PartitionSpec as P
    cfg = cfg or MoEConfig()
    B, S, D, H, Dh = cfg.batch, cfg.seq, cfg.hidden, cfg.heads, cfg.head_dim
    E, K, F, V = cfg.experts, cfg.top_k, cfg.mlp, cfg.vocab
    C = int(np.ceil(K * S / E * cfg.capacity_factor))
    DE = ("data", "expert")
    n_exp_shards = mesh.shape["expert"]
    assert E % n_exp_shards == 0

    layer_specs = [
        ("attn_norm", (D,), P(None), "norm"),
        ("wq", (D, H, Dh), P(DE, None, None), D),
        ("wk", (D, H, Dh), P(DE, None, None), D),
        ("wv", (D, H, Dh), P(DE, None, None), D),
        ("wo", (H, Dh, D), P(None, None, DE), H * Dh),
        ("mlp_norm", (D,), P(None), "norm"),
        ("router", (D, E), P(None, None), D),
        ("w_gate", (E, D, F), P("expert", "data", None), D),
        ("w_up", (E, D, F), P("expert", "data", None), D),
        ("w_down", (E, F, D), P("expert", None, "data"), F),
    ]
    specs = [("embedding", (V, D), P(None, DE), 1.0)]
    for i in range(cfg.layers):
        specs += [("layer%d/%s" % (i, n), s, sp, init) for n, s, sp, init in layer_specs]
    specs += [("final_norm", (D,), P(None), "norm"), ("lm_head", (D, V), P(DE, None), D)]
    names = [n for n, _, _, _ in layer_specs]
    nl = len(layer_specs)

    def wsc(x, spec):
        return lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    cos_np, sin_np = rope_tables(S, Dh)
    causal = np.tril(np.ones((S, S), dtype=bool))

    def attention(x, p):
        q = wsc(jnp.einsum("bsd,dhk->bshk", x, p["wq"]), P(DE, None, None, None))
        k = wsc(jnp.einsum("bsd,dhk->bshk", x, p["wk"]), P(DE, None, None, None))
        v = wsc(jnp.einsum("bsd,dhk->bshk", x, p["wv"]), P(DE, None, None, None))
        q, k = rope(q, cos_np, sin_np), rope(k, cos_np, sin_np)
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) * np.float32(Dh ** -0.5)
        s = jnp.where(causal, s, np.float32(-1e9))
        w = jax.nn.softmax(s, axis=-1)
        o = wsc(jnp.einsum("bhqs,bshk->bqhk", w, v), P(DE, None, None, None))
        return jnp.einsum("bshk,hkd->bsd", o, p["wo"])

    def route(x, router):
        """x [G, S, D] -> dispatch, combine [G, S, E, C] (f32), aux loss."""
        logits = jnp.einsum("gsd,de->gse", x, router).astype(jnp.float32)
        probs = jax.nn.softmax(logits, axis=-1)
        top_w, top_i = lax.top_k(probs, K)                          # [G, S, K]
        top_w = top_w / jnp.sum(top_w, axis=-1, keepdims=True)       # Mixtral renormalization
        mask = jax.nn.one_hot(top_i, E, dtype=jnp.int32)            # [G, S, K, E]
        g = x.shape[0]
        # GShard priority: all first choices before any second choice.
        mk = jnp.transpose(mask, (0, 2, 1, 3)).reshape(g, K * S, E)
        pos = jnp.cumsum(mk, axis=1) * mk - 1                        # slot in expert, -1 if not routed
        pos = jnp.transpose(pos.reshape(g, K, S, E), (0, 2, 1, 3))    # [G, S, K, E]
        slot = jax.nn.one_hot(pos, C, dtype=jnp.float32)             # -1 and >= C (dropped) -> 0
        dispatch = jnp.sum(slot, axis=2)                             # [G, S, E, C]
        combine = jnp.sum(top_w[..., None, None] * slot, axis=2)     # [G, S, E, C]
        frac = jnp.mean(mask.sum(axis=2).astype(jnp.float32), axis=(0, 1)) / K   # [E]
        aux = E * jnp.sum(frac * jnp.mean(probs, axis=(0, 1)))
        return dispatch, combine, aux

    def experts(xe, wg, wu, wd):
        gate = jnp.einsum("egcd,edf->egcf", xe, wg)
        up = jnp.einsum("egcd,edf->egcf", xe, wu)
        return jnp.einsum("egcf,efd->egcd", jax.nn.silu(gate) * up, wd)

    def moe_dense(x, p):
        dispatch, combine, aux = route(x, p["router"])
        dispatch = wsc(dispatch, P(DE, None, None, None))
        combine = wsc(combine, P(DE, None, None, None))
        xe = jnp.einsum("gsec,gsd->egcd", dispatch, x)
        xe = wsc(xe, P("expert", "data", None, None))                # -> all-to-all
        ye = experts(xe, p["w_gate"], p["w_up"], p["w_down"])
        ye = wsc(ye, P("expert", "data", None, None))
        y = jnp.einsum("egcd,gsec->gsd", ye, combine)
        return wsc(y, P(DE, None, None)), aux

    def moe_local(x, router, wg, wu, wd):
        # Per device: x [G/8, S, D]; router whole; w* [E/4, D/2, F] / [E/4, F, D/2].
        wg = lax.all_gather(wg, "data", axis=1, tiled=True)
        wu = lax.all_gather(wu, "data", axis=1, tiled=True)
        wd = lax.all_gather(wd, "data", axis=2, tiled=True)
        dispatch, combine, aux = route(x, router)
        xe = jnp.einsum("gsec,gsd->egcd", dispatch, x)               # [E, G_l, C, D]
        xe = lax.all_to_all(xe, "expert", 0, 1, tiled=True)          # [E/4, 4 G_l, C, D]
        ye = experts(xe, wg, wu, wd)
        ye = lax.all_to_all(ye, "expert", 1, 0, tiled=True)          # [E, G_l, C, D]
        y = jnp.einsum("egcd,gsec->gsd", ye, combine)
        return y, lax.pmean(aux, DE)

    if shard_map_variant:
        moe_sm = jax.shard_map(
            moe_local, mesh=mesh,
            in_specs=(P(DE, None, None), P(None, None), P("expert", "data", None),
                      P("expert", "data", None), P("expert", None, "data")),
            out_specs=(P(DE, None, None), P()))

        def moe(x, p):
            return moe_sm(x, p["router"], p["w_gate"], p["w_up"], p["w_down"])
    else:
        moe = moe_dense

    def decoder_layer(x, p):
        x = wsc(x + attention(rms_norm(x, p["attn_norm"]), p), P(DE, None, None))
        y, aux = moe(rms_norm(x, p["mlp_norm"]), p)
        return wsc(x + y, P(DE, None, None)), aux

    def forward_loss(params, tokens, targets):
        x = wsc(jnp.take(params[0], tokens, axis=0), P(DE, None, None))
        aux_total = 0.0
        for i in range(cfg.layers):
            x, aux = decoder_layer(x, dict(zip(names, params[1 + i * nl:1 + (i + 1) * nl])))
            aux_total = aux_total + aux
        x = rms_norm(x, params[-2])
        logits = wsc(x @ params[-1], P(DE, None, None))
        return cross_entropy(logits, targets) + cfg.aux_weight * aux_total

    def train_step(tokens, targets, params, momenta):
        loss, grads = jax.value_and_grad(forward_loss)(params, tokens, targets)
        new_m = tuple(cfg.momentum * m + g for m, g in zip(momenta, grads))
        new_p = tuple(p_ - cfg.lr * m for p_, m in zip(params, new_m))
        return loss, new_p, new_m

    ns = lambda spec: NamedSharding(mesh, spec)  # noqa: E731
    p_sh = tuple(ns(sp) for _, _, sp, _ in specs)
    data_sh = ns(P(DE, None))
    in_sh = (data_sh, data_sh, p_sh, p_sh)
    out_sh = (ns(P()), p_sh, p_sh)
    # Argument generators, in the structure of train_step's arguments.
    gens = (("tokens", (B, S), V), ("targets", (B, S), V),
            tuple(("param", s, init) for _, s, _, init in specs),
            tuple(("momentum", s, None) for _, s, _, _ in specs))
    train_step.__name__ = train_step.__qualname__ = (
        "moe_shardmap_train_step" if shard_map_variant else "moe_train_step")
    return train_step, in_sh, out_sh, gens


def build_mla(mesh, cfg=None):
    np, jax, jnp, lax = _common()
    from jax.sharding import NamedSharding, PartitionSpec as P
    cfg = cfg or MLAConfig()
    B, S, D, H, V, F = cfg.batch, cfg.seq, cfg.hidden, cfg.heads, cfg.vocab, cfg.mlp
    QR, KR = cfg.q_lora_rank, cfg.kv_lora_rank
    NOPE, ROPE, DV = cfg.qk_nope_dim, cfg.qk_rope_dim, cfg.v_dim

    layer_specs = [
        ("attn_norm", (D,), P(None), "norm"),
        ("wq_a", (D, QR), P("fsdp", None), D),
        ("q_norm", (QR,), P(None), "norm"),
        ("wq_b", (QR, H, NOPE + ROPE), P("fsdp", "tp", None), QR),
        ("wkv_a", (D, KR + ROPE), P("fsdp", None), D),
        ("kv_norm", (KR,), P(None), "norm"),
        ("wkv_b", (KR, H, NOPE + DV), P("fsdp", "tp", None), KR),
        ("wo", (H, DV, D), P("tp", None, "fsdp"), H * DV),
        ("mlp_norm", (D,), P(None), "norm"),
        ("w_gate", (D, F), P("fsdp", "tp"), D),
        ("w_up", (D, F), P("fsdp", "tp"), D),
        ("w_down", (F, D), P("tp", "fsdp"), F),
    ]
    specs = [("embedding", (V, D), P("tp", "fsdp"), 1.0)]
    for i in range(cfg.layers):
        specs += [("layer%d/%s" % (i, n), s, sp, init) for n, s, sp, init in layer_specs]
    specs += [("final_norm", (D,), P(None), "norm"), ("lm_head", (D, V), P("fsdp", "tp"), D)]
    names = [n for n, _, _, _ in layer_specs]
    nl = len(layer_specs)

    def wsc(x, spec):
        return lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    cos_np, sin_np = rope_tables(S, ROPE)
    causal = np.tril(np.ones((S, S), dtype=bool))
    scale = np.float32((NOPE + ROPE) ** -0.5)
    heads = P("fsdp", None, "tp", None)

    def mla(x, p):
        cq = rms_norm(jnp.einsum("bsd,dr->bsr", x, p["wq_a"]), p["q_norm"])
        q = wsc(jnp.einsum("bsr,rhk->bshk", cq, p["wq_b"]), heads)
        q_nope, q_pe = q[..., :NOPE], q[..., NOPE:]
        q_pe = rope(q_pe, cos_np, sin_np)
        kv_a = wsc(jnp.einsum("bsd,dr->bsr", x, p["wkv_a"]), P("fsdp", None, None))
        c_kv, k_pe = kv_a[..., :KR], kv_a[..., KR:]
        c_kv = rms_norm(c_kv, p["kv_norm"])                            # the cached latent
        k_pe = rope(k_pe[:, :, None, :], cos_np, sin_np)               # [B, S, 1, ROPE], shared
        kv = wsc(jnp.einsum("bsr,rhk->bshk", c_kv, p["wkv_b"]), heads)
        k_nope, v = kv[..., :NOPE], kv[..., NOPE:]
        q = jnp.concatenate([q_nope, q_pe], axis=-1)
        k = jnp.concatenate([k_nope, jnp.broadcast_to(k_pe, (B, S, H, ROPE))], axis=-1)
        k = wsc(k, heads)
        s = jnp.einsum("bqhk,bshk->bhqs", q, k).astype(jnp.float32) * scale
        s = jnp.where(causal, s, np.float32(-1e9))
        w = jax.nn.softmax(s, axis=-1).astype(x.dtype)
        o = wsc(jnp.einsum("bhqs,bshk->bqhk", w, v), heads)
        return jnp.einsum("bshk,hkd->bsd", o, p["wo"])

    def mlp(x, p):
        gate = wsc(x @ p["w_gate"], P("fsdp", None, "tp"))
        up = wsc(x @ p["w_up"], P("fsdp", None, "tp"))
        return (jax.nn.silu(gate) * up) @ p["w_down"]

    def decoder_layer(x, p):
        x = wsc(x + mla(rms_norm(x, p["attn_norm"]), p), P("fsdp", None, None))
        return wsc(x + mlp(rms_norm(x, p["mlp_norm"]), p), P("fsdp", None, None))

    def forward_loss(params, tokens, targets):
        x = wsc(jnp.take(params[0], tokens, axis=0), P("fsdp", None, None))
        for i in range(cfg.layers):
            x = decoder_layer(x, dict(zip(names, params[1 + i * nl:1 + (i + 1) * nl])))
        x = rms_norm(x, params[-2])
        logits = wsc(x @ params[-1], P("fsdp", None, "tp"))
        return cross_entropy(logits, targets)

    b1, b2, eps = 0.9, 0.95, 1e-8

    def train_step(step, tokens, targets, params, mu, nu):
        loss, grads = jax.value_and_grad(forward_loss)(params, tokens, targets)
        t = (step + 1).astype(jnp.float32)
        c1, c2 = 1.0 - b1 ** t, 1.0 - b2 ** t
        new_p, new_m, new_v = [], [], []
        for p_, g, m, v in zip(params, grads, mu, nu):
            m = b1 * m + (1.0 - b1) * g
            v = b2 * v + (1.0 - b2) * g * g
            new_p.append(p_ - cfg.lr * (m / c1) / (jnp.sqrt(v / c2) + eps))
            new_m.append(m)
            new_v.append(v)
        return loss, step + 1, tuple(new_p), tuple(new_m), tuple(new_v)

    ns = lambda spec: NamedSharding(mesh, spec)  # noqa: E731
    p_sh = tuple(ns(sp) for _, _, sp, _ in specs)
    data_sh = ns(P("fsdp", None))
    in_sh = (ns(P()), data_sh, data_sh, p_sh, p_sh, p_sh)
    out_sh = (ns(P()), ns(P()), p_sh, p_sh, p_sh)
    gens = (("step", (), 10), ("tokens", (B, S), V), ("targets", (B, S), V),
            tuple(("param", s, init) for _, s, _, init in specs),
            tuple(("mu", s, None) for _, s, _, _ in specs),
            tuple(("nu", s, None) for _, s, _, _ in specs))
    train_step.__name__ = train_step.__qualname__ = "mla_train_step"
    return train_step, in_sh, out_sh, gens


def make_values(gens, seed):
    """Deterministic host arrays in the structure of `gens`."""
    import numpy as np
    rng = np.random.default_rng(seed)

    def one(g):
        kind, shape, x = g
        if kind == "step":
            return np.array(x, np.int32)
        if kind in ("tokens", "targets"):
            return rng.integers(0, x, size=shape, dtype=np.int32)
        if kind == "param":
            if x == "norm":
                return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
            return (rng.standard_normal(shape) / np.sqrt(x)).astype(np.float32)
        if kind in ("momentum", "mu"):
            return (1e-3 * rng.standard_normal(shape)).astype(np.float32)
        if kind == "nu":     # a mid-training second moment: keeps Adam's update well-conditioned
            return rng.uniform(1e-5, 1e-4, size=shape).astype(np.float32)
        raise ValueError(kind)

    def walk(g):
        if isinstance(g, tuple) and g and isinstance(g[0], str):
            return one(g)
        return tuple(walk(x) for x in g)
    return walk(gens)


# ---------------------------------------------------------------------------
# Child: compile, run, save (env set by the parent).
# ---------------------------------------------------------------------------

def child_main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, choices=MODELS)
    ap.add_argument("--lowering", required=True, choices=LOWERINGS)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args(argv)
    import numpy as np
    import jax
    from jax.sharding import Mesh
    if a.lowering == "gspmd":
        jax.config.update("jax_use_shardy_partitioner", False)
    elif not jax.config.jax_use_shardy_partitioner:
        raise SystemExit("JAX's default is not Shardy here")
    devs = jax.devices()
    if len(devs) < NUM_DEVICES:
        raise SystemExit("need %d devices, got %d" % (NUM_DEVICES, len(devs)))
    if a.model == "mla":
        mesh = Mesh(np.array(devs[:8]).reshape(2, 4), ("fsdp", "tp"))
        fn, in_sh, out_sh, gens = build_mla(mesh)
    else:
        mesh = Mesh(np.array(devs[:8]).reshape(2, 4), ("data", "expert"))
        fn, in_sh, out_sh, gens = build_moe(mesh, shard_map_variant=(a.model == "moe_shardmap"))
    vals = make_values(gens, zlib.crc32(("model_steps/" + a.model).encode()))
    jitted = jax.jit(fn, in_shardings=in_sh, out_shardings=out_sh, keep_unused=True)
    dev_vals = jax.device_put(vals, in_sh)
    t0 = time.time()
    compiled = jitted.lower(*dev_vals).compile()
    t1 = time.time()
    outs = compiled(*dev_vals)
    outs = jax.tree_util.tree_leaves(outs)
    t2 = time.time()
    leaves = jax.tree_util.tree_leaves(vals)
    os.makedirs(os.path.join(a.dir, "args"), exist_ok=True)
    os.makedirs(os.path.join(a.dir, "expected"), exist_ok=True)
    for i, x in enumerate(leaves):
        np.save(os.path.join(a.dir, "args", "arg%d.npy" % i), np.array(x, order="C", copy=True),
                allow_pickle=False)
    out_shapes = []
    for i, o in enumerate(outs):
        o = np.array(np.asarray(o), order="C", copy=True)   # (ascontiguousarray makes 0-d 1-d)
        np.save(os.path.join(a.dir, "expected", "out%d.npy" % i), o, allow_pickle=False)
        out_shapes.append([o.dtype.name, list(o.shape)])
    with open(os.path.join(a.dir, "child.json"), "w") as f:
        json.dump({"module": "jit_" + fn.__name__, "num_args": len(leaves),
                   "num_outputs": len(outs), "outputs": out_shapes,
                   "loss": float(np.asarray(outs[0])), "compile_s": t1 - t0, "run_s": t2 - t1,
                   "jax": jax.__version__,
                   "shardy": bool(jax.config.jax_use_shardy_partitioner)}, f, indent=1)
    return 0


# ---------------------------------------------------------------------------
# Parent.
# ---------------------------------------------------------------------------

class Runner:
    def __init__(self, bins, shown):
        self.bins = bins          # name -> path that runs
        self.shown = shown        # name -> path printed in repro commands

    def run(self, tool, args, timeout=3600):
        cmd = [self.bins[tool]] + args
        shown = " ".join(shlex.quote(x) for x in [self.shown[tool]] + args)
        t0 = time.time()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, out, err = "timeout", e.stdout or "", (e.stderr or "") + "\n(timed out)"
            out = out if isinstance(out, str) else out.decode(errors="replace")
            err = err if isinstance(err, str) else err.decode(errors="replace")
        return {"cmd": shown, "rc": rc, "stdout": out, "stderr": err, "s": time.time() - t0}


def _json_last(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def _tail(s, n=1500):
    s = (s or "").strip()
    return s if len(s) <= n else "..." + s[-n:]


def one_case(model, lowering, args, runner):
    label = "%s_%s" % (model, lowering)
    d = os.path.join(args.out, label)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    dump = os.path.join(d, "xla_dump")
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS=(
        "--xla_force_host_platform_device_count=%d --xla_dump_to=%s --xla_dump_hlo_as_text "
        "--xla_dump_hlo_pass_re=.* --xla_dump_large_constants" % (NUM_DEVICES, dump)))
    row = {"model": model, "lowering": lowering, "dir": d, "failures": []}
    print("[%s] XLA compile + run ..." % label, file=sys.stderr, flush=True)
    t0 = time.time()
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--_child", "--model", model,
                        "--lowering", lowering, "--dir", d], env=env, capture_output=True,
                       text=True)
    with open(os.path.join(d, "child.log"), "w") as f:
        f.write(p.stdout + p.stderr)
    if p.returncode != 0:
        row["failures"].append({"what": "XLA child (JAX compile/run)", "cmd": "see %s/child.log" % d,
                                "detail": _tail(p.stderr, 3000)})
        return row
    with open(os.path.join(d, "child.json")) as f:
        row["child"] = json.load(f)
    row["child"]["wall_s"] = time.time() - t0
    mod = row["child"]["module"]
    prop_needle = ("after_shardy-xla.before_spmd-partitioning" if lowering == "shardy"
                   else "after_sharding-propagation.before_spmd-partitioning")
    files = {"input.hlo": "before_optimizations", "xla_propagated.hlo": prop_needle,
             "xla_partitioned.hlo": "after_spmd-partitioning"}
    for dst, needle in files.items():
        shutil.copyfile(pick_dump(dump, mod, needle), os.path.join(d, dst))
    if not args.keep_dumps:
        shutil.rmtree(dump, ignore_errors=True)
    inp, xprop, xpart = (os.path.join(d, n) for n in files)

    # a. collective bytes, ours vs XLA's.
    print("[%s] hlo-opt stats ..." % label, file=sys.stderr, flush=True)
    r = runner.run("hlo-opt", [inp, "--passes=sharding-propagation,spmd-partitioning", "--stats"])
    if r["rc"] == 0:
        row["ours_stats"] = json.loads(r["stdout"])
    else:
        row["failures"].append({"what": "ours propagation+partitioning", "cmd": r["cmd"],
                                "detail": _tail(r["stderr"])})
    runner.run("hlo-opt", [inp, "--passes=sharding-propagation,spmd-partitioning", "-o",
                           os.path.join(d, "ours_partitioned.hlo")])
    runner.run("hlo-opt", [inp, "--passes=sharding-propagation", "-o",
                           os.path.join(d, "ours_propagated.hlo")])
    r = runner.run("hlo-opt", [xpart, "--stats"])
    if r["rc"] != 0:
        err = r["stderr"]
        r = runner.run("hlo-opt", [xpart, "--stats", "--no-verify"])
        row["xla_stats_needed_no_verify"] = True
        row["failures"].append({"what": "hlo-opt refuses XLA's partitioned module (verify)",
                                "cmd": r["cmd"].replace(" --no-verify", ""), "detail": _tail(err)})
    if r["rc"] == 0:
        row["xla_stats"] = json.loads(r["stdout"])
    else:
        row["failures"].append({"what": "hlo-opt --stats on XLA's partitioned module",
                                "cmd": r["cmd"], "detail": _tail(r["stderr"])})
    o, x = row.get("ours_stats"), row.get("xla_stats")
    if o and x:
        row["ours_bytes"], row["xla_bytes"] = o["collective_bytes"], x["collective_bytes"]
        row["ratio"] = (o["collective_bytes"] / x["collective_bytes"]) if x["collective_bytes"] else None
        if o["collective_bytes"] > x["collective_bytes"]:
            row["failures"].append({
                "what": "collective bytes: ours %d > XLA %d" % (o["collective_bytes"],
                                                                  x["collective_bytes"]),
                "cmd": "%s %s --passes=sharding-propagation,spmd-partitioning --stats  vs  %s %s --stats"
                       % (runner.shown["hlo-opt"], inp, runner.shown["hlo-opt"], xpart),
                "detail": collective_diff(o, x)})

    # b. our partitioned program vs XLA's outputs.
    print("[%s] run_hlo_module --partition ..." % label, file=sys.stderr, flush=True)
    r = runner.run("run_hlo_module", [inp, "--partition", "--args", os.path.join(d, "args"),
                                      "--expected", os.path.join(d, "expected"),
                                      "--rtol", str(args.rtol), "--atol", str(args.atol)],
                   timeout=args.run_timeout)
    with open(os.path.join(d, "run_hlo_module.log"), "w") as f:
        f.write(r["stdout"] + "\n--- stderr\n" + r["stderr"])
    j = _json_last(r["stdout"])
    row["run"] = j
    if j is not None and "all_matched" in j:
        row["outputs_match"] = bool(j["all_matched"])
        bad = [o_ for o_ in j.get("outputs", []) if not o_.get("matched")]
        row["worst_abs_err"] = max((o_.get("max_abs_err") or 0.0) for o_ in j.get("outputs", [])) \
            if j.get("outputs") else None
        if not j["all_matched"] or r["rc"] != 0:
            row["failures"].append({
                "what": "outputs differ from XLA's (%d of %d outputs)" % (len(bad), len(j.get("outputs", []))),
                "cmd": r["cmd"],
                "detail": "; ".join("out%d %s: %d mismatches, max_abs_err %.3g, max_rel_err %.3g"
                                    % (b["index"], b.get("shape"), b.get("mismatches", -1),
                                       b.get("max_abs_err") or 0, b.get("max_rel_err") or 0)
                                    for b in bad[:12]) + ("" if r["rc"] == 0 else
                                                         " | rc %s: %s" % (r["rc"], _tail(r["stderr"], 800)))})
        fb = (j.get("partition") or {}).get("fallbacks")
        if fb:
            row["fallbacks"] = fb
    else:
        row["outputs_match"] = None
        row["failures"].append({"what": "run_hlo_module --partition failed (rc %s)" % r["rc"],
                                "cmd": r["cmd"], "detail": _tail(r["stderr"] or r["stdout"])})

    # c. propagation agreement.
    print("[%s] compare-shardings ..." % label, file=sys.stderr, flush=True)
    r = runner.run("hlo-opt", [inp, "--passes=sharding-propagation", "--compare-shardings", xprop])
    if r["rc"] == 0:
        c = json.loads(r["stdout"])
        with open(os.path.join(d, "compare.json"), "w") as f:
            json.dump(c, f, indent=1)
        row["compare"] = {k: v for k, v in c.items() if k != "mismatches"}
        row["compare"]["first_mismatches"] = c.get("mismatches", [])[:10]
    else:
        row["failures"].append({"what": "compare-shardings failed", "cmd": r["cmd"],
                                "detail": _tail(r["stderr"])})
    return row


def collective_diff(o, x):
    parts = []
    ops = sorted(set(o.get("collectives", {})) | set(x.get("collectives", {}))
                 | set(o.get("collective_bytes_by_op", {})) | set(x.get("collective_bytes_by_op", {})))
    for op in ops:
        oc, xc = o.get("collectives", {}).get(op, 0), x.get("collectives", {}).get(op, 0)
        ob = o.get("collective_bytes_by_op", {}).get(op, 0)
        xb = x.get("collective_bytes_by_op", {}).get(op, 0)
        mark = "  <--" if ob > xb else ""
        parts.append("%s: ours x%d %dB, XLA x%d %dB%s" % (op, oc, ob, xc, xb, mark))
    return "; ".join(parts)


def print_table(rows):
    hdr = "%-13s %-7s %10s %10s %7s %9s %14s" % ("model", "lowering", "our bytes", "XLA bytes",
                                                  "ratio", "outputs", "propagation")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        c = r.get("compare")
        prop = "%d/%d" % (c["matched"], c["total"]) if c else "error"
        om = r.get("outputs_match")
        print("%-13s %-7s %10s %10s %7s %9s %14s" % (
            r["model"], r["lowering"], r.get("ours_bytes", "-"), r.get("xla_bytes", "-"),
            "%.3f" % r["ratio"] if r.get("ratio") is not None else "-",
            "yes" if om else ("no" if om is False else "error"), prop))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--_child":
        return child_main(argv[1:])
    ap = argparse.ArgumentParser(description="MoE / MLA train steps: ours vs XLA.")
    ap.add_argument("--out", default="/tmp/model_steps")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--lowerings", default=",".join(LOWERINGS))
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--atol", type=float, default=1e-5)
    ap.add_argument("--run-timeout", type=int, default=3600, help="seconds for run_hlo_module")
    ap.add_argument("--keep-dumps", action="store_true", help="keep XLA's dump folders")
    ap.add_argument("--no-snapshot", action="store_true", help="run target/release in place")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    lowerings = [x for x in args.lowerings.split(",") if x]
    for m in models:
        if m not in MODELS:
            ap.error("unknown model %s (known: %s)" % (m, ", ".join(MODELS)))
    for x in lowerings:
        if x not in LOWERINGS:
            ap.error("unknown lowering %s" % x)
    if os.path.abspath(args.out).startswith(REPO_ROOT + os.sep):
        ap.error("--out must be outside the repository")
    shown = {"hlo-opt": os.path.relpath(HLO_OPT, os.getcwd()) if os.getcwd() == REPO_ROOT else HLO_OPT,
             "run_hlo_module": os.path.relpath(RUN_HLO, os.getcwd()) if os.getcwd() == REPO_ROOT else RUN_HLO}
    bins = {"hlo-opt": HLO_OPT, "run_hlo_module": RUN_HLO}
    for b in bins.values():
        if not os.path.exists(b):
            print("missing %s (cargo build --release -p hlo-opt -p run-hlo-module)" % b, file=sys.stderr)
            return 2
    os.makedirs(args.out, exist_ok=True)
    if not args.no_snapshot:
        bd = os.path.join(args.out, "bin")
        os.makedirs(bd, exist_ok=True)
        for k in bins:
            dst = os.path.join(bd, os.path.basename(bins[k]))
            shutil.copy2(bins[k], dst)
            bins[k] = dst
    runner = Runner(bins, shown)
    t0 = time.time()
    rows = []
    for m in models:
        for lw in lowerings:
            try:
                rows.append(one_case(m, lw, args, runner))
            except Exception as e:   # keep going
                rows.append({"model": m, "lowering": lw, "failures": [
                    {"what": "driver", "cmd": "", "detail": "%s: %s" % (type(e).__name__, e)}]})
    print()
    print_table(rows)
    print()
    for r in rows:
        ch = r.get("child", {})
        o, x = r.get("ours_stats"), r.get("xla_stats")
        print("== %s / %s  (XLA compile %.1f s; %s args, %s outputs; loss %s)" % (
            r["model"], r["lowering"], ch.get("compile_s", 0), ch.get("num_args"),
            ch.get("num_outputs"), ch.get("loss")))
        if o and x:
            print("   collectives: " + collective_diff(o, x))
        if r.get("worst_abs_err") is not None:
            print("   run: worst max_abs_err %.3g" % r["worst_abs_err"])
        if r.get("fallbacks"):
            print("   partitioner fallbacks: %s" % json.dumps(r["fallbacks"])[:600])
        c = r.get("compare")
        if c:
            print("   compare: matched %d/%d, paired_by_structure %s, unpaired ours %s / XLA %s" % (
                c["matched"], c["total"], c.get("paired_by_structure"), c.get("unpaired_ours"),
                c.get("unpaired_other")))
            for mm in c.get("first_mismatches", [])[:5]:
                print("     %s" % json.dumps(mm)[:300])
        for f in r["failures"]:
            print("   FAIL %s\n     cmd: %s\n     %s" % (f["what"], f["cmd"], f["detail"]))
    print("\ntotal %.1f s; details in %s/results.json" % (time.time() - t0, args.out))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)
    return 1 if any(r["failures"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
