#!/usr/bin/env python3
"""Side-by-side pass times on XLA's benchmark train steps: our
`sharding-propagation` and `spmd-partitioning` (hlo-opt) against XLA's own
passes (jaxlib's CPU compiler), measured in the same run, printed as a table
with the ratio XLA / ours.

Modules (default): the MaxText DeepSeek step (../shared/xla-hlo-more, 4
partitions) and the MaxText 1n1g step (../shared/xla-hlo, shardings over 8
devices, compiled for 8 partitions).

XLA cannot compile those files unchanged through jaxlib's Python API, so both
sides run the same, slightly edited text (written to OUT/<module>.hlo):
  - `CustomSPMDPartitioning` custom calls (Transformer Engine's
    custom_partitioning; their backend_config is a pointer into the process
    that made the dump) get an opaque target, `OpaqueForTiming`, so XLA
    neither calls back into Python nor aborts;
  - `xla.sdy.FuncResultSharding` custom calls become `copy`: a module
    compiled from HLO text goes down XLA's GSPMD path (sharding-propagation,
    spmd-partitioning), whose partitioner refuses `xla.sdy.*` custom calls.
    The `xla.sdy.sharding` frontend attributes stay, so our
    `sharding-propagation` still runs Shardy's propagation on DeepSeek; the
    GSPMD path (`shardy-import,sharding-propagation`) is timed too.
XLA's compile then stops at the CPU backend (no implementation of the opaque
target), after the passes timed here.

XLA's times come from its pass-pipeline log (TF_CPP_VMODULE=hlo_pass_pipeline=3),
the pass alone: from the "Number of instructions" line logged right before the
pass to the "Pass caused changes" line right after it, so the hlo-verifier run
after a changing pass is excluded (see shardy_speed.parse_pass_log).  XLA's
pipeline inlines calls in a separate `call-inliner` pass before propagation;
our `sharding-propagation` inlines itself (its pre-SPMD step), so the
propagation row compares ours with XLA's call-inliner + sharding-propagation.
XLA's `spmd-partitioning` includes its nested spmd-cleanup pipeline (dce,
tuple-simplifier, cse), as ours includes its own clean-up.

Ours: RUST_LOG=info hlo-opt FILE --passes=... -o /dev/null, which logs
"pass NAME: X ms" for each pass (the pass alone; the pipeline's verifier runs
outside it).  Best of --runs for ours and of --xla-runs for XLA.

Usage:
    python3 tools/testdata_gen/xla_pass_speed.py [--runs 5] [--xla-runs 3] [--out DIR]
Needs jax/jaxlib 0.10.2 (tools/testdata_gen/requirements.txt) and a release
build of hlo-opt (cargo build --release -p hlo-opt).
"""

import argparse
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SHARED = os.path.abspath(os.path.join(REPO_ROOT, "..", "shared"))
sys.path.insert(0, HERE)
from shardy_speed import parse_pass_log  # noqa: E402

MODULES = [
    ("deepseek_1n4g", os.path.join(SHARED, "xla-hlo-more",
                                   "nv_maxtext_deepseek_1n4g_jit_train_step_before_optimization.hlo"), 4),
    ("maxtext_1n1g", os.path.join(SHARED, "xla-hlo",
                                  "nv_maxtext_1n1g_jit_train_step_before_optimization.hlo"), 8),
]

_FUNC_RESULT = re.compile(
    r'custom-call\((%[^,)]+)\), custom_call_target="xla.sdy.FuncResultSharding", '
    r'custom_call_has_side_effect=true,')


def xla_compilable(text):
    text = text.replace('custom_call_target="CustomSPMDPartitioning"',
                        'custom_call_target="OpaqueForTiming"')
    return _FUNC_RESULT.sub(r"copy(\1),", text)


def child_main(path, partitions):
    """Compile PATH with XLA for PARTITIONS partitions (env set by the parent)."""
    import numpy as np
    import jax
    from jax._src.lib import xla_client as xc
    module = xc.hlo.hlo_module_from_text(open(path).read())
    mlir = xc._xla.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    options = xc.CompileOptions()
    build = options.executable_build_options
    build.num_partitions = partitions
    build.num_replicas = 1
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = False
    build.device_assignment = xc.DeviceAssignment.create(np.arange(partitions).reshape(1, partitions))
    devices = jax.devices()[:partitions]
    try:
        jax.devices()[0].client.compile_and_load(mlir, xc.DeviceList(tuple(devices)), options)
    except Exception as e:  # expected: the opaque custom call has no CPU implementation
        print("compile stopped: %s" % str(e).splitlines()[0][:200], file=sys.stderr)


def xla_times(path, partitions, log_path):
    env = dict(os.environ)
    env.update({
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "TF_CPP_VMODULE": "hlo_pass_pipeline=3",
        "JAX_PLATFORMS": "cpu",
    })
    with open(log_path, "w") as log:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path, str(partitions)],
                       env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    out = {}
    for name in ("call-inliner", "sharding-propagation", "spmd-partitioning"):
        records = parse_pass_log(log_path, name)
        if name == "call-inliner":
            # The run inside the spmd-partitioner pipeline (later pipelines inline again).
            records = [r for r in records if r.get("pipeline") == "spmd-partitioner"] or records
        out[name] = records[0]["pass_us"] / 1000.0 if records else None
    return out


_OURS_RE = re.compile(r"pass ([\w-]+): ([0-9.]+) ms")


def our_times(hlo_opt, path, passes):
    env = dict(os.environ, RUST_LOG="info")
    p = subprocess.run([hlo_opt, path, "--passes=" + passes, "-o", os.devnull],
                       env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("hlo-opt failed on %s: %s" % (path, p.stderr[-2000:]))
    times = {}
    for line in p.stderr.splitlines():
        if "xla_hlo_pass]" in line:
            m = _OURS_RE.search(line)
            if m:
                times[m.group(1)] = float(m.group(2))
    return times


def best(runs):
    keys = runs[0].keys()
    return {k: min(r[k] for r in runs if r.get(k) is not None) for k in keys}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hlo-opt", default=os.path.join(REPO_ROOT, "target", "release", "hlo-opt"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--xla-runs", type=int, default=3)
    ap.add_argument("--out", default="/tmp/xla_pass_speed")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {}
    rows = []
    for name, source, partitions in MODULES:
        if not os.path.exists(source):
            print("skipping %s: %s not found" % (name, source))
            continue
        path = os.path.join(args.out, name + ".hlo")
        with open(path, "w") as f:
            f.write(xla_compilable(open(source).read()))
        xla_runs = [xla_times(path, partitions, os.path.join(args.out, "%s.xla%d.log" % (name, i)))
                    for i in range(args.xla_runs)]
        xla = best(xla_runs)
        default = best([our_times(args.hlo_opt, path, "sharding-propagation,spmd-partitioning")
                        for _ in range(args.runs)])
        gspmd = best([our_times(args.hlo_opt, path, "shardy-import,sharding-propagation,spmd-partitioning")
                      for _ in range(args.runs)])
        xla_propagation = (xla["call-inliner"] or 0.0) + xla["sharding-propagation"]
        entries = [
            ("propagation (default)", default["sharding-propagation"], xla_propagation),
            ("propagation (GSPMD path)", gspmd["shardy-import"] + gspmd["sharding-propagation"],
             xla_propagation),
            ("partitioning", default["spmd-partitioning"], xla["spmd-partitioning"]),
        ]
        results[name] = {"xla_ms": xla, "ours_default_ms": default, "ours_gspmd_ms": gspmd}
        for what, ours, theirs in entries:
            rows.append((name, what, ours, theirs, theirs / ours))
    print("%-14s %-26s %10s %10s %7s" % ("module", "pass", "ours ms", "XLA ms", "ratio"))
    for r in rows:
        print("%-14s %-26s %10.1f %10.1f %6.1fx" % r)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child_main(sys.argv[2], int(sys.argv[3]))
    else:
        main()
