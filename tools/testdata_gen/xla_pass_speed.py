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

Ours: RUST_LOG=info hlo-opt FILE --passes=... --repeat K -o /dev/null, which
logs "pass NAME: X ms" for each pass of each of its K runs (the pass alone;
the pipeline's verifier runs outside it).

Each process, ours and XLA's, compiles the module K times (--compiles), and
two tables are printed:
  - "first in process": the first compile of a process (best over the
    processes, --runs for ours, --xla-runs for XLA). Ours is then a
    fresh process that has only parsed the module, so the pass pays for
    every first-touch page fault of its heap (about 1.6-2 us each on this
    VM; 100-250 per pass on MaxText), while XLA's passes run after the
    earlier passes of the same compile have grown its heap.
  - "later in process": compiles 2..K (best over all of them): both sides
    in a process that has compiled the module before.

Usage:
    python3 tools/testdata_gen/xla_pass_speed.py [--runs 5] [--xla-runs 3] [--compiles 3] [--out DIR]
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


def child_main(path, partitions, compiles):
    """Compile PATH with XLA for PARTITIONS partitions COMPILES times (env set
    by the parent)."""
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
    for _ in range(compiles):
        try:
            jax.devices()[0].client.compile_and_load(mlir, xc.DeviceList(tuple(devices)), options)
        except Exception as e:  # expected: the opaque custom call has no CPU implementation
            print("compile stopped: %s" % str(e).splitlines()[0][:200], file=sys.stderr)


def xla_times(path, partitions, compiles, log_path):
    """XLA's pass times, one dict per compile of one process."""
    env = dict(os.environ)
    env.update({
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "TF_CPP_MIN_LOG_LEVEL": "0",
        "TF_CPP_VMODULE": "hlo_pass_pipeline=3",
        "JAX_PLATFORMS": "cpu",
    })
    with open(log_path, "w") as log:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path, str(partitions),
                        str(compiles)],
                       env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    out = [{} for _ in range(compiles)]
    for name in ("call-inliner", "sharding-propagation", "spmd-partitioning"):
        records = parse_pass_log(log_path, name)
        if name == "call-inliner":
            # The run inside the spmd-partitioner pipeline (later pipelines inline again).
            records = [r for r in records if r.get("pipeline") == "spmd-partitioner"] or records
        if len(records) != compiles:
            raise SystemExit("%s: %d records of %s for %d compiles" % (log_path, len(records), name,
                                                                       compiles))
        for compile_times, record in zip(out, records):
            compile_times[name] = record["pass_us"] / 1000.0
    return out


_OURS_RE = re.compile(r"pass ([\w-]+): ([0-9.]+) ms")


def our_times(hlo_opt, path, passes, compiles):
    """Our pass times, one dict per run of one hlo-opt process."""
    env = dict(os.environ, RUST_LOG="info")
    p = subprocess.run([hlo_opt, path, "--passes=" + passes, "--repeat", str(compiles),
                        "-o", os.devnull],
                       env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("hlo-opt failed on %s: %s" % (path, p.stderr[-2000:]))
    runs = []
    pass_count = len(passes.split(","))
    for line in p.stderr.splitlines():
        if "xla_hlo_pass]" in line:
            m = _OURS_RE.search(line)
            if m:
                if not runs or len(runs[-1]) == pass_count:
                    runs.append({})
                runs[-1][m.group(1)] = float(m.group(2))
    if len(runs) != compiles:
        raise SystemExit("hlo-opt logged %d runs of %s, expected %d" % (len(runs), passes, compiles))
    return runs


def best(runs):
    keys = runs[0].keys()
    return {k: min(r[k] for r in runs if r.get(k) is not None) for k in keys}


def first_and_later(processes):
    """Best first compile over the processes, and best later compile."""
    return best([p[0] for p in processes]), best([run for p in processes for run in p[1:]])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hlo-opt", default=os.path.join(REPO_ROOT, "target", "release", "hlo-opt"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--xla-runs", type=int, default=3)
    ap.add_argument("--compiles", type=int, default=3,
                    help="compiles per process (>= 2: the first, and the later ones)")
    ap.add_argument("--out", default="/tmp/xla_pass_speed")
    args = ap.parse_args()
    if args.compiles < 2:
        ap.error("--compiles must be at least 2 (the first compile, and the later ones)")
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
        xla_processes = [xla_times(path, partitions, args.compiles,
                                   os.path.join(args.out, "%s.xla%d.log" % (name, i)))
                         for i in range(args.xla_runs)]
        default_processes = [our_times(args.hlo_opt, path, "sharding-propagation,spmd-partitioning",
                                       args.compiles) for _ in range(args.runs)]
        gspmd_processes = [our_times(args.hlo_opt, path,
                                     "shardy-import,sharding-propagation,spmd-partitioning",
                                     args.compiles) for _ in range(args.runs)]
        results[name] = {}
        for when, pick in (("first in process", 0), ("later in process", 1)):
            xla = first_and_later(xla_processes)[pick]
            default = first_and_later(default_processes)[pick]
            gspmd = first_and_later(gspmd_processes)[pick]
            xla_propagation = (xla["call-inliner"] or 0.0) + xla["sharding-propagation"]
            entries = [
                ("propagation (default)", default["sharding-propagation"], xla_propagation),
                ("propagation (GSPMD path)", gspmd["shardy-import"] + gspmd["sharding-propagation"],
                 xla_propagation),
                ("partitioning", default["spmd-partitioning"], xla["spmd-partitioning"]),
            ]
            results[name][when] = {"xla_ms": xla, "ours_default_ms": default, "ours_gspmd_ms": gspmd}
            for what, ours, theirs in entries:
                rows.append((when, name, what, ours, theirs, theirs / ours))
    for when in ("first in process", "later in process"):
        print("\n%s (best of %d processes of ours, %d of XLA's; %d compiles each)"
              % (when, args.runs, args.xla_runs, args.compiles))
        print("%-14s %-26s %10s %10s %7s" % ("module", "pass", "ours ms", "XLA ms", "ratio"))
        for r in rows:
            if r[0] == when:
                print("%-14s %-26s %10.2f %10.2f %6.1fx" % r[1:])
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
