"""Times XLA (jaxlib, CPU) on an HLO module with global, single-device
semantics, for run_hlo_module --bench-xla and the differential tests.

usage: xla_bench.py FILE.hlo ARGS_DIR [REPEAT] [--output DIR]

Shardings are dropped, `Sharding` custom calls become copies and
num_partitions is set to 1, so XLA compiles the global computation. Prints
one JSON line {"xla_s": best seconds per execution, "compile_s": ...}.
"""
import json
import os
import re
import sys
import time


def strip_sharding(text):
    text = re.sub(r", sharding=\{[^{}]*(\{[^{}]*\}[^{}]*)*\}", "", text)
    text = re.sub(r"custom-call\((%[^)]*)\), custom_call_target=\"Sharding\"(, [a-z_]+=[^,\n]*)*",
                  r"copy(\1)", text)
    text = re.sub(r"num_partitions=\d+", "num_partitions=1", text)
    return text


def compile_text(text):
    import jax
    jax.config.update("jax_enable_x64", True)
    from jax._src.lib import xla_client as xc
    mod = xc.hlo.hlo_module_from_text(text)
    mlir = xc._xla.mlir.hlo_to_stablehlo(mod.as_serialized_hlo_module_proto())
    dev = jax.devices("cpu")[0]
    client = dev.client
    opts = xc.CompileOptions()
    devs = xc._xla.DeviceList((dev,))
    exe = client.compile_and_load(mlir, devs, opts)
    return exe, dev


def main():
    argv = sys.argv[1:]
    out_dir = None
    if "--output" in argv:
        k = argv.index("--output")
        out_dir = argv[k + 1]
        del argv[k:k + 2]
    path, args_dir = argv[0], argv[1]
    repeat = int(argv[2]) if len(argv) > 2 else 3
    import numpy as np
    import jax
    text = strip_sharding(open(path).read())
    t0 = time.perf_counter()
    exe, dev = compile_text(text)
    compile_s = time.perf_counter() - t0
    args = []
    i = 0
    while os.path.exists(os.path.join(args_dir, f"arg{i}.npy")):
        args.append(np.load(os.path.join(args_dir, f"arg{i}.npy")))
        i += 1
    bufs = [jax.device_put(a, dev) for a in args]
    best = float("inf")
    outs = None
    for _ in range(max(repeat, 1)):
        t = time.perf_counter()
        outs = exe.execute(bufs)
        for o in outs:
            o.block_until_ready()
        best = min(best, time.perf_counter() - t)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        for k, o in enumerate(outs):
            np.save(os.path.join(out_dir, f"out{k}.npy"), np.asarray(o))
    print(json.dumps({"xla_s": best, "compile_s": compile_s}))


if __name__ == "__main__":
    main()
