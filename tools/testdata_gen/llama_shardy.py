#!/usr/bin/env python3
"""A Llama-style decoder train step in plain JAX, sharded FSDP x TP the way
MaxText does it, for benchmarking Shardy propagation (see shardy_speed.py).

The model: token embedding, N decoder layers (RMSNorm -> grouped-query
attention with rotary embeddings and a causal mask -> residual, RMSNorm ->
SwiGLU MLP -> residual), final RMSNorm, an untied LM head, softmax
cross-entropy over the vocabulary, jax.value_and_grad and an Adam update.
Outputs: the loss and the new params / Adam moments (same shardings as in).

Sharding, on a 2x4 mesh ("fsdp", "tp"), MaxText-like:
    embedding [V, D]        P("tp", "fsdp")
    wq  [D, H, Dh]          P("fsdp", "tp", None)
    wk/wv [D, KV, Dh]       P("fsdp", "tp", None)
    wo  [H, Dh, D]          P("tp", None, "fsdp")
    w_gate/w_up [D, F]      P("fsdp", "tp")
    w_down [F, D]           P("tp", "fsdp")
    norm scales [D]         P()
    lm_head [D, V]          P("fsdp", "tp")
    tokens/targets [B, S]   P("fsdp", None)
and with_sharding_constraint on the activations (batch on fsdp; heads and the
MLP hidden dim on tp; logits' vocab on tp), as MaxText's logical axis rules
put them.

Layers are unrolled with a Python loop (one set of weights per layer: the
module grows linearly with the layer count), or, with scan=True, stacked
along a leading layer dim (P(None, ...) on it) and run with jax.lax.scan.

Only jax / numpy are needed.  `build(cfg, mesh)` returns
(fn, in_shardings, out_shardings, abstract_args) (with forward_only, fn is
the loss of (params, tokens, targets)); compile with
jax.jit(fn, in_shardings=..., out_shardings=...).lower(*abstract_args).compile().
"""

import dataclasses

import numpy as np
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P


@dataclasses.dataclass
class Config:
    layers: int = 24
    vocab: int = 1024
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 4
    head_dim: int = 32
    mlp: int = 1024
    batch: int = 8
    seq: int = 128
    scan: bool = False
    remat: bool = False
    dtype: str = "float32"      # params and activations
    lr: float = 1e-3
    forward_only: bool = False  # the loss alone (no gradient, no update)

    def name(self):
        return "llama_%s%dL_d%d_h%d_s%d_b%d_v%d%s" % (
            "scan" if self.scan else "unrolled", self.layers, self.hidden, self.heads,
            self.seq, self.batch, self.vocab, "_remat" if self.remat else "")


# Per-layer parameter names, shapes (without the layer dim) and specs.
def _layer_param_specs(cfg):
    D, H, KV, Dh, F = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.mlp
    return [
        ("attn_norm", (D,), P(None)),
        ("wq", (D, H, Dh), P("fsdp", "tp", None)),
        ("wk", (D, KV, Dh), P("fsdp", "tp", None)),
        ("wv", (D, KV, Dh), P("fsdp", "tp", None)),
        ("wo", (H, Dh, D), P("tp", None, "fsdp")),
        ("mlp_norm", (D,), P(None)),
        ("w_gate", (D, F), P("fsdp", "tp")),
        ("w_up", (D, F), P("fsdp", "tp")),
        ("w_down", (F, D), P("tp", "fsdp")),
    ]


def param_specs(cfg):
    """[(name, shape, spec)] of all parameters, flattened, in argument order."""
    out = [("embedding", (cfg.vocab, cfg.hidden), P("tp", "fsdp"))]
    layer = _layer_param_specs(cfg)
    if cfg.scan:
        for n, s, sp in layer:
            out.append(("layers/" + n, (cfg.layers,) + s, P(None, *sp)))
    else:
        for i in range(cfg.layers):
            for n, s, sp in layer:
                out.append(("layer%d/%s" % (i, n), s, sp))
    out.append(("final_norm", (cfg.hidden,), P(None)))
    out.append(("lm_head", (cfg.hidden, cfg.vocab), P("fsdp", "tp")))
    return out


def build(cfg, mesh):
    dt = jnp.dtype(cfg.dtype)
    B, S, D, H, KV, Dh = cfg.batch, cfg.seq, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim
    assert H % KV == 0
    specs = param_specs(cfg)
    nlayer = len(_layer_param_specs(cfg))

    def wsc(x, spec):
        return lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    def rms_norm(x, scale):
        x32 = x.astype(jnp.float32)
        y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + 1e-6)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)

    # Rotary embedding tables for positions 0..S-1 (constants in the module).
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, Dh, 2, dtype=np.float32) / Dh))
    ang = np.arange(S, dtype=np.float32)[:, None] * inv_freq[None, :]      # [S, Dh/2]
    cos_np, sin_np = np.cos(ang), np.sin(ang)

    def rope(x):                                       # x: [B, S, N, Dh]
        cos = jnp.asarray(cos_np, x.dtype)[None, :, None, :]
        sin = jnp.asarray(sin_np, x.dtype)[None, :, None, :]
        x1, x2 = jnp.split(x, 2, axis=-1)
        return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    causal = np.tril(np.ones((S, S), dtype=bool))

    def attention(x, p):
        q = jnp.einsum("bsd,dhk->bshk", x, p["wq"])
        k = jnp.einsum("bsd,dhk->bshk", x, p["wk"])
        v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
        q = wsc(q, P("fsdp", None, "tp", None))
        k = wsc(k, P("fsdp", None, "tp", None))
        v = wsc(v, P("fsdp", None, "tp", None))
        q, k = rope(q), rope(k)
        g = H // KV
        q = q.reshape(B, S, KV, g, Dh)
        s = jnp.einsum("bqngk,bsnk->bngqs", q, k).astype(jnp.float32) * np.float32(Dh ** -0.5)
        s = jnp.where(causal, s, np.float32(-1e9))
        w = jax.nn.softmax(s, axis=-1).astype(x.dtype)
        o = jnp.einsum("bngqs,bsnk->bqngk", w, v).reshape(B, S, H, Dh)
        o = wsc(o, P("fsdp", None, "tp", None))
        return jnp.einsum("bshk,hkd->bsd", o, p["wo"])

    def mlp(x, p):
        gate = wsc(x @ p["w_gate"], P("fsdp", None, "tp"))
        up = wsc(x @ p["w_up"], P("fsdp", None, "tp"))
        return (jax.nn.silu(gate) * up) @ p["w_down"]

    def decoder_layer(x, p):
        x = x + attention(rms_norm(x, p["attn_norm"]), p)
        x = wsc(x, P("fsdp", None, None))
        x = x + mlp(rms_norm(x, p["mlp_norm"]), p)
        return wsc(x, P("fsdp", None, None))

    layer_fn = jax.checkpoint(decoder_layer) if cfg.remat else decoder_layer
    layer_names = [n for n, _, _ in _layer_param_specs(cfg)]

    def forward_loss(params, tokens, targets):
        emb = params[0]
        x = wsc(jnp.take(emb, tokens, axis=0), P("fsdp", None, None))
        body = params[1:1 + nlayer] if cfg.scan else params[1:1 + nlayer * cfg.layers]
        if cfg.scan:
            def step(h, lp):
                return layer_fn(h, dict(zip(layer_names, lp))), None
            x, _ = lax.scan(step, x, tuple(body))
        else:
            for i in range(cfg.layers):
                x = layer_fn(x, dict(zip(layer_names, body[i * nlayer:(i + 1) * nlayer])))
        final_norm, lm_head = params[-2], params[-1]
        x = rms_norm(x, final_norm)
        logits = wsc((x @ lm_head).astype(jnp.float32), P("fsdp", None, "tp"))
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
        return jnp.mean(nll)

    b1, b2, eps = 0.9, 0.95, 1e-8

    def train_step(step, tokens, targets, params, mu, nu):
        loss, grads = jax.value_and_grad(forward_loss)(params, tokens, targets)
        t = (step + 1).astype(jnp.float32)
        c1 = 1.0 - b1 ** t
        c2 = 1.0 - b2 ** t
        new_p, new_m, new_v = [], [], []
        for p_, g, m, v in zip(params, grads, mu, nu):
            g32 = g.astype(jnp.float32)
            m = b1 * m + (1.0 - b1) * g32
            v = b2 * v + (1.0 - b2) * g32 * g32
            upd = (m / c1) / (jnp.sqrt(v / c2) + eps)
            new_p.append((p_.astype(jnp.float32) - cfg.lr * upd).astype(p_.dtype))
            new_m.append(m)
            new_v.append(v)
        return loss, step + 1, tuple(new_p), tuple(new_m), tuple(new_v)

    ns = lambda spec: NamedSharding(mesh, spec)  # noqa: E731
    p_sh = tuple(ns(sp) for _, _, sp in specs)
    data_sh = ns(P("fsdp", None))
    in_sh = (ns(P()), data_sh, data_sh, p_sh, p_sh, p_sh)
    out_sh = (ns(P()), ns(P()), p_sh, p_sh, p_sh)
    sds = jax.ShapeDtypeStruct
    abstract = (
        sds((), jnp.int32),
        sds((B, S), jnp.int32),
        sds((B, S), jnp.int32),
        tuple(sds(s, dt) for _, s, _ in specs),
        tuple(sds(s, jnp.float32) for _, s, _ in specs),
        tuple(sds(s, jnp.float32) for _, s, _ in specs),
    )
    train_step.__name__ = train_step.__qualname__ = "llama_train_step"
    if cfg.forward_only:
        forward_loss.__name__ = forward_loss.__qualname__ = "llama_forward"
        return forward_loss, (p_sh, data_sh, data_sh), ns(P()), (abstract[3], abstract[1],
                                                                  abstract[2])
    return train_step, in_sh, out_sh, abstract
