#!/usr/bin/env python3
"""Tensor-parallel training steps at realistic widths for the overlap passes
(windowed-einsum, decompose-collectives): the Llama-style decoder train
step of llama_shardy.py (2 layers, bf16, hidden 4096, 32 heads of 128, 8
KV heads, SwiGLU 14336, vocabulary 32000, sequence 2048) lowered with JAX's
defaults (Shardy) on 8 or 16 CPU devices:

    llama_tp8_b1            mesh fsdp=1 x tp=8, batch 1 (Megatron TP at small batch)
    llama_fsdp2_tp4_b2      mesh fsdp=2 x tp=4, batch 2
    llama_forward_tp8_b1    the forward pass alone (the loss, as in prefill), tp=8
    llama_forward_tp8_s512  the same with a sequence of 512
    llama_forward_tp16_b1   the forward pass with tp=16 (16 KV heads): two nodes
                            of 8 GPUs in the cost model, so every all-reduce
                            crosses the NICs

and two single MLPs written as HLO (HAND_WRITTEN): mlp_tp8_seqpar and
mlp_tp8_allreduce.

Only XLA's input module is kept (the dump's before_optimizations, the
module our pipeline reads), as testdata/overlap_cases/<name>.hlo; nothing
runs at these sizes (the modules are for the cost model and the scheduler:
tools/testdata_gen/windowed_einsum_effect.py). The compile only serves to
dump the input.

Usage:
    python3 tools/testdata_gen/overlap_cases.py [--out testdata/overlap_cases]
"""

import argparse
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

# name: (mesh fsdp x tp, batch, forward only, sequence)
CASES = {
    "llama_tp8_b1": ((1, 8), 1, False, 2048),
    "llama_fsdp2_tp4_b2": ((2, 4), 2, False, 2048),
    "llama_forward_tp8_b1": ((1, 8), 1, True, 2048),
    "llama_forward_tp8_s512": ((1, 8), 1, True, 512),
    "llama_forward_tp16_b1": ((1, 16), 1, True, 2048),
}


# One tensor-parallel MLP over 8 devices at full width, written as HLO: with
# sequence parallelism (all-gather before the column-parallel matmul,
# reduce-scatter after the row-parallel one), and without (an all-reduce
# after the row-parallel one). Nothing else runs beside them, so their
# collectives are exposed unless a pass creates overlap.
HAND_WRITTEN = {
    "mlp_tp8_seqpar": """HloModule tp, num_partitions=8

ENTRY %e (x: bf16[8192,4096], w: bf16[4096,16384], v: bf16[16384,4096]) -> bf16[8192,4096] {
  %x = bf16[8192,4096] parameter(0), sharding={devices=[8,1]<=[8]}
  %w = bf16[4096,16384] parameter(1), sharding={devices=[1,8]<=[8]}
  %v = bf16[16384,4096] parameter(2), sharding={devices=[8,1]<=[8]}
  %h = bf16[8192,16384] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[1,8]<=[8]}
  %g = bf16[8192,16384] multiply(%h, %h), sharding={devices=[1,8]<=[8]}
  ROOT %y = bf16[8192,4096] dot(%g, %v), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[8,1]<=[8]}
}
""",
    "mlp_tp8_allreduce": """HloModule tp_ar, num_partitions=8

ENTRY %e (x: bf16[8192,4096], w: bf16[4096,16384], v: bf16[16384,4096]) -> bf16[8192,4096] {
  %x = bf16[8192,4096] parameter(0), sharding={replicated}
  %w = bf16[4096,16384] parameter(1), sharding={devices=[1,8]<=[8]}
  %v = bf16[16384,4096] parameter(2), sharding={devices=[8,1]<=[8]}
  %h = bf16[8192,16384] dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={devices=[1,8]<=[8]}
  %g = bf16[8192,16384] multiply(%h, %h), sharding={devices=[1,8]<=[8]}
  %y = bf16[8192,4096] dot(%g, %v), lhs_contracting_dims={1}, rhs_contracting_dims={0}, sharding={replicated}
  ROOT %z = bf16[8192,4096] add(%y, %x), sharding={replicated}
}
""",
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "testdata", "overlap_cases"))
    args = ap.parse_args()
    dump = tempfile.mkdtemp(prefix="overlap_cases_")
    os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=16 --xla_dump_to=%s "
                               "--xla_dump_hlo_as_text --xla_dump_hlo_pass_re=^$" % dump)
    os.environ["JAX_PLATFORMS"] = "cpu"
    sys.path.insert(0, HERE)
    import numpy as np
    import jax
    from jax.sharding import Mesh
    import llama_shardy as L
    assert jax.config.jax_use_shardy_partitioner, "these cases use JAX's default lowering (Shardy)"
    os.makedirs(args.out, exist_ok=True)
    for name, (mesh_shape, batch, forward_only, seq) in CASES.items():
        devices = mesh_shape[0] * mesh_shape[1]
        mesh = Mesh(np.array(jax.devices()[:devices]).reshape(mesh_shape), ("fsdp", "tp"))
        # At tp=16 the KV heads are 16, so that they shard evenly.
        kv_heads = max(8, mesh_shape[1])
        cfg = L.Config(layers=2, vocab=32000, hidden=4096, heads=32, kv_heads=kv_heads, head_dim=128,
                       mlp=14336, batch=batch, seq=seq, dtype="bfloat16",
                       forward_only=forward_only)
        fn, in_sh, out_sh, abstract = L.build(cfg, mesh)
        fn.__name__ = fn.__qualname__ = name
        jax.jit(fn, in_shardings=in_sh, out_shardings=out_sh).lower(*abstract).compile()
        pat = re.compile(r"^module_\d+\.jit_%s\..*before_optimizations\.txt$" % re.escape(name))
        hits = [f for f in os.listdir(dump) if pat.match(f)]
        if len(hits) != 1:
            raise SystemExit("expected one before_optimizations dump of %s, got %r" % (name, hits))
        shutil.copy(os.path.join(dump, hits[0]), os.path.join(args.out, name + ".hlo"))
        print("wrote %s" % os.path.join(args.out, name + ".hlo"))
    shutil.rmtree(dump, ignore_errors=True)
    for name, text in HAND_WRITTEN.items():
        with open(os.path.join(args.out, name + ".hlo"), "w") as f:
            f.write(text)
        print("wrote %s" % os.path.join(args.out, name + ".hlo"))


if __name__ == "__main__":
    main()
