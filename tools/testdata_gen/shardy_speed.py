#!/usr/bin/env python3
"""Side-by-side speed of our Shardy propagation (hlo-opt --passes=sdy-propagation)
and XLA's own `shardy-xla` pass, on a Llama-style train step (llama_shardy.py)
and on the largest case of testdata/shardy_cases.

Per model:
  1. XLA, dump run: a child python compiles the program with JAX's defaults
     (Shardy on) and
        XLA_FLAGS=--xla_force_host_platform_device_count=8 --xla_dump_to=D
                  --xla_dump_hlo_as_text --xla_dump_hlo_pass_re=shardy-xla|spmd-partitioning
        TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=hlo_pass_pipeline=3
     The dumps give before_optimizations (our input), XLA's module after
     shardy-xla (the propagation result, exported to GSPMD shardings) and after
     spmd-partitioning.
  2. XLA, timing runs (--xla-runs, default 2): the same compile without
     --xla_dump_to (with dumping on, shardy-xla also writes its own MLIR
     dumps into D/shardy/, which XLA's timers then include).
     XLA's own time for the pass comes from its pass-pipeline log
     (hlo_pass_pipeline.cc; XLA's --xla_dump_module_metadata writes nothing on
     the PjRt/JAX compile path in jaxlib 0.10.2, so the HloModuleMetadata
     pass timestamps are not available):
       - "HLO pass: shardy-xla time: T (N us)" (XLA_SCOPED_LOGGING_TIMER around
         the pass, which also covers the post-pass dump and the hlo-verifier
         invariant checker run after a changing pass)  -> column "XLA timer"
       - the pass alone: from the VLOG(2) "Number of instructions: N" line
         logged right before the pass runs to the VLOG(3) "Pass caused changes
         shardy-xla" line logged right after it (and after the dump, absent in
         the timing runs)                              -> column "XLA shardy-xla"
     The best of the timing runs is reported.
  3. Ours: RUST_LOG=info hlo-opt BEFORE --passes=sdy-propagation -o /dev/null,
     which logs "pass sdy-propagation: X ms, changed" (the pass alone; the
     pipeline's verifier runs outside it); --repeats times (default 5), best
     taken.  Same for --passes=sharding-propagation (sdy-propagation, then the
     export) and the whole process wall time.
  4. Sanity: hlo-opt BEFORE --passes=sharding-propagation --compare-shardings
     XLA_AFTER_SHARDY (agreement and mismatch kinds), and collective bytes of
     hlo-opt BEFORE --passes=sharding-propagation,spmd-partitioning --stats vs
     hlo-opt XLA_AFTER_SPMD --stats.

Usage:
    python3 tools/testdata_gen/shardy_speed.py                       # 16 unrolled layers + largest case
    python3 tools/testdata_gen/shardy_speed.py --layers 32
    python3 tools/testdata_gen/shardy_speed.py --scan                # lax.scan over stacked layers
    python3 tools/testdata_gen/shardy_speed.py --both                # unrolled and scan
    python3 tools/testdata_gen/shardy_speed.py --out DIR --repeats 5 --xla-runs 2 --no-case
Output (default /tmp/shardy_speed): DIR/<model>/{before_optimizations.txt,
xla_before_shardy.txt, xla_after_shardy.txt, xla_after_spmd.txt, xla_dump_run.log,
ours_*.txt, compare.json, ...} and DIR/results.json; the table goes to stdout.
Needs only jax/jaxlib/numpy (the case uses generate_shardy.py, which needs
ml_dtypes, a jax dependency).
"""

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
DEFAULT_HLO_OPT = os.path.join(REPO_ROOT, "target", "release", "hlo-opt")

DUMP_PASS_RE = "shardy-xla|spmd-partitioning"


# ---------------------------------------------------------------------------
# Child: compile one program with XLA (env set by the parent).
# ---------------------------------------------------------------------------

def child_main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--what", required=True)          # "llama" or "case:NAME"
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--scan", action="store_true")
    ap.add_argument("--remat", action="store_true")
    ap.add_argument("--result", required=True)
    a = ap.parse_args(argv)
    xla_flags = os.environ["XLA_FLAGS"]
    sys.path.insert(0, HERE)
    out = {}
    if a.what == "llama":
        import numpy as np
        import jax
        from jax.sharding import Mesh
        import llama_shardy as L
        assert jax.config.jax_use_shardy_partitioner, "Shardy is off"
        mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))
        cfg = L.Config(layers=a.layers, scan=a.scan, remat=a.remat)
        fn, in_sh, out_sh, abstract = L.build(cfg, mesh)
        jitted = jax.jit(fn, in_shardings=in_sh, out_shardings=out_sh)
        t0 = time.time()
        lowered = jitted.lower(*abstract)
        t1 = time.time()
        lowered.compile()
        t2 = time.time()
        out.update(module="jit_" + fn.__name__, lower_s=t1 - t0, compile_s=t2 - t1,
                   config=cfg.__dict__, model=cfg.name())
    elif a.what.startswith("case:"):
        name = a.what[len("case:"):]
        # generate_shardy sets XLA_FLAGS at import (before any backend exists);
        # put ours back before the first compile.
        import generate_shardy as GS
        os.environ["XLA_FLAGS"] = xla_flags
        import jax
        builder, meta, extra = GS.CASES[name]
        c = GS.Case(name, **meta)
        mesh, _ = GS._make_mesh(c, extra)
        GS.Ctx.mesh, GS.Ctx.single = mesh, False
        fn = builder(c)
        fn.__name__ = fn.__qualname__ = name
        in_sh = tuple(GS._in_sharding(mesh, x["spec"], extra) for x in c.args)
        out_sh = tuple(GS.NamedSharding(mesh, s) for _, s in c.outs)
        vals = []
        for x in c.args:
            d = x["data"].astype(GS.ml_dtypes.bfloat16) if x["dtype"] == "bf16" else x["data"]
            vals.append(d)
        jitted = jax.jit(fn, in_shardings=in_sh, out_shardings=out_sh)
        t0 = time.time()
        if extra["explicit"]:
            with jax.set_mesh(mesh):
                lowered = jitted.lower(*vals)
        else:
            lowered = jitted.lower(*vals)
        t1 = time.time()
        lowered.compile()
        t2 = time.time()
        out.update(module="jit_" + name, lower_s=t1 - t0, compile_s=t2 - t1, model=name)
        m = re.search(r"--xla_dump_to=(\S+)", xla_flags)
        if m:   # is the fresh XLA input the committed input.hlo (after generate's cleaning)?
            fresh = pick_dump(m.group(1), "jit_" + name, "before_optimizations")
            committed = os.path.join(REPO_ROOT, "testdata", "shardy_cases", name, "input.hlo")
            with open(fresh) as f1, open(committed) as f2:
                out["fresh_input_equals_testdata"] = GS.G.clean_hlo(f1.read()) == f2.read()
    else:
        raise SystemExit("unknown --what %r" % a.what)
    with open(a.result, "w") as f:
        json.dump(out, f)
    return 0


# ---------------------------------------------------------------------------
# XLA's pass log.
# ---------------------------------------------------------------------------

_LOG_RE = re.compile(r"^[IWEF]\d{4} (\d\d):(\d\d):(\d\d\.\d+)\s+(\d+) ([\w.]+):\d+\] (.*)$")


def parse_pass_log(path, pass_name="shardy-xla"):
    """Records of `pass_name` runs: module, pipeline, instructions, pass_us
    (Number-of-instructions line -> Pass-caused-changes line), timer_us (the
    XLA_SCOPED_LOGGING_TIMER figure), verifier_us, changed."""
    cur = {}          # thread -> (module, pipeline)
    pending = {}      # thread -> record being filled
    records = []
    with open(path, errors="replace") as f:
        for line in f:
            m = _LOG_RE.match(line.rstrip("\n"))
            if not m:
                continue
            hh, mm, ss, tid, src, msg = m.groups()
            t = int(hh) * 3600 + int(mm) * 60 + float(ss)
            if src != "hlo_pass_pipeline.cc":
                continue
            mp = re.match(r"Running HLO pass pipeline on module (\S+): (.*)$", msg)
            if mp:
                cur[tid] = (mp.group(1), mp.group(2))
                continue
            s = msg.strip()
            r = pending.get(tid)
            if s == "HLO pass " + pass_name:
                mod, pipe = cur.get(tid, (None, None))
                pending[tid] = {"module": mod, "pipeline": pipe, "t_enter": t}
            elif r is None:
                continue
            elif s.startswith("Number of instructions:") and "t_start" not in r:
                r["t_start"] = t
                r["instructions"] = int(s.split(":")[1])
            elif s == "Pass caused changes " + pass_name:
                r["t_changed"] = t
            elif s.startswith("Invariant checker done"):
                if "t_verify" in r:
                    r["verifier_us"] = r.get("verifier_us", 0.0) + (t - r.pop("t_verify")) * 1e6
            elif s.startswith("Invariant checker "):
                r["t_verify"] = t
            elif s.startswith("HLO pass: %s time:" % pass_name):
                mt = re.search(r"\((\d+) us\)", s)
                r["timer_us"] = int(mt.group(1)) if mt else None
                start = r.get("t_start", r["t_enter"])
                r["changed"] = "t_changed" in r
                end = r.get("t_changed")
                if end is None:     # unchanged: no line after the pass; use the timer
                    r["pass_us"] = r["timer_us"]
                else:
                    r["pass_us"] = (end - start) * 1e6
                for k in ("t_enter", "t_start", "t_changed", "t_verify"):
                    r.pop(k, None)
                records.append(r)
                del pending[tid]
    return records


def xla_env(dump_dir):
    flags = ["--xla_force_host_platform_device_count=8"]
    if dump_dir:
        flags += ["--xla_dump_to=%s" % dump_dir, "--xla_dump_hlo_as_text",
                  "--xla_dump_hlo_pass_re=%s" % DUMP_PASS_RE]
    env = dict(os.environ)
    env.update(XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="0",
               TF_CPP_VMODULE="hlo_pass_pipeline=3")
    env.pop("TF_CPP_MAX_VLOG_LEVEL", None)
    return env


def run_xla_child(what, child_args, dump_dir, log_path, result_path):
    cmd = [sys.executable, os.path.abspath(__file__), "--_child", "--what", what,
           "--result", result_path] + child_args
    t0 = time.time()
    with open(log_path, "w") as log:
        p = subprocess.run(cmd, env=xla_env(dump_dir), stdout=log, stderr=subprocess.STDOUT)
    wall = time.time() - t0
    if p.returncode != 0:
        tail = open(log_path, errors="replace").read()[-3000:]
        raise RuntimeError("XLA child %s failed (rc %d); log %s:\n%s"
                           % (what, p.returncode, log_path, tail))
    with open(result_path) as f:
        res = json.load(f)
    res["child_wall_s"] = wall
    recs = [r for r in parse_pass_log(log_path) if r["module"] == res["module"]]
    if not recs:
        raise RuntimeError("no 'HLO pass: shardy-xla' record for %s in %s" % (res["module"], log_path))
    res["shardy_xla"] = max(recs, key=lambda r: r.get("instructions", 0))
    return res


def pick_dump(dump_dir, module, needle):
    pat = re.compile(r"^module_\d+\.%s\.(.*\.txt)$" % re.escape(module))
    hits = sorted(f for f in os.listdir(dump_dir) if pat.match(f) and needle in f)
    if len(hits) != 1:
        raise RuntimeError("expected one dump of %s containing %r, got %r" % (module, needle, hits))
    return os.path.join(dump_dir, hits[0])


# ---------------------------------------------------------------------------
# Ours.
# ---------------------------------------------------------------------------

# hlo-opt's own line (the pass framework logs the same figure as "changed=true").
_PASS_LOG_RE = re.compile(r"hlo_opt\] pass (\S+): ([0-9.]+) ms, (changed|unchanged)\s*$", re.M)
_READ_RE = re.compile(r"read .* \((\d+) instructions\)")


def hlo_opt(hlo_opt_bin, args, log_env=True, check=True):
    env = dict(os.environ)
    if log_env:
        env["RUST_LOG"] = "info"
    t0 = time.time()
    p = subprocess.run([hlo_opt_bin] + args, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if check and p.returncode != 0:
        raise RuntimeError("hlo-opt %s failed (rc %d): %s"
                           % (" ".join(args), p.returncode, p.stderr.strip()[-3000:]))
    return p, wall


def time_ours(hlo_opt_bin, before, passes, repeats):
    best, all_ms, walls = None, [], []
    for _ in range(repeats):
        p, wall = hlo_opt(hlo_opt_bin, [before, "--passes=" + passes, "-o", os.devnull])
        per = collections.OrderedDict()
        for m in _PASS_LOG_RE.finditer(p.stderr):
            per[m.group(1)] = per.get(m.group(1), 0.0) + float(m.group(2))
        if not per:
            raise RuntimeError("no 'pass NAME: X ms' line from hlo-opt --passes=%s; stderr:\n%s"
                               % (passes, p.stderr[-2000:]))
        total = sum(per.values())
        mi = _READ_RE.search(p.stderr)
        ms = re.search(r"Shardy propagation ran[^:]*: (.*)$", p.stderr, re.M)
        run = {"ms": total, "per_pass_ms": dict(per), "wall_s": wall,
               "summary": ms.group(1) if ms else None,
               "instructions": int(mi.group(1)) if mi else None,
               "changed": [m.group(3) for m in _PASS_LOG_RE.finditer(p.stderr)]}
        all_ms.append(round(total, 3))
        walls.append(wall)
        if best is None or run["ms"] < best["ms"]:
            best = run
    best["all_ms"] = all_ms
    best["best_wall_s"] = min(walls)
    return best


def instruction_count(hlo_opt_bin, path):
    p, _ = hlo_opt(hlo_opt_bin, [path, "--no-verify", "-o", os.devnull], check=False)
    m = _READ_RE.search(p.stderr)
    return int(m.group(1)) if m else None


def _short(s, n=90):
    if s is None:
        return "null"
    s = str(s)
    return s if len(s) <= n else s[:n - 3] + "..."


def _kind(m):
    o, x = m.get("ours"), m.get("other")
    if o is None:
        return "ours unsharded"
    if x is None:
        return "XLA unsharded"
    if "replicated" in str(o) and "replicated" not in str(x):
        return "ours replicated, XLA tiled"
    if "replicated" in str(x) and "replicated" not in str(o):
        return "ours tiled, XLA replicated"
    if "manual" in str(o) or "manual" in str(x):
        return "manual differs"
    return "both tiled, differ"


def compare(hlo_opt_bin, before, xla_after, out_dir, fname="compare.json"):
    p, _ = hlo_opt(hlo_opt_bin, [before, "--passes=sharding-propagation",
                                 "--compare-shardings", xla_after], log_env=False, check=False)
    if p.returncode != 0:
        return {"error": p.stderr.strip()[-2000:]}
    c = json.loads(p.stdout)
    with open(os.path.join(out_dir, fname), "w") as f:
        json.dump(c, f, indent=1)
    mism = c.get("mismatches", [])
    kinds = collections.Counter("%s: %s" % (m.get("opcode"), _kind(m)) for m in mism)
    c["kinds"] = kinds.most_common()
    c["first"] = [{"instruction": m.get("instruction"), "opcode": m.get("opcode"),
                   "computation": m.get("computation"), "ours": m.get("ours"),
                   "other": m.get("other")} for m in mism[:15]]
    return c


def collective_bytes(stats):
    """Collective bytes / counts from an hlo-opt --stats JSON (whatever keys it has)."""
    out = {}
    for k, v in stats.items():
        if "collective" in k.lower() or k in ("all-reduce", "all-gather", "reduce-scatter",
                                              "all-to-all", "collective-permute"):
            out[k] = v
    return out


def stats_pair(hlo_opt_bin, before, xla_spmd, out_dir, num_partitions=8):
    res = {}
    p, _ = hlo_opt(hlo_opt_bin, [before, "--passes=sharding-propagation,spmd-partitioning",
                                 "--num-partitions=%d" % num_partitions, "--stats"],
                   log_env=False, check=False)
    if p.returncode == 0:
        res["ours"] = json.loads(p.stdout)
    else:
        res["ours_error"] = p.stderr.strip()[-2000:]
    p, _ = hlo_opt(hlo_opt_bin, [xla_spmd, "--stats"], log_env=False, check=False)
    if p.returncode != 0:
        p, _ = hlo_opt(hlo_opt_bin, [xla_spmd, "--stats", "--no-verify"], log_env=False, check=False)
        res["xla_no_verify"] = True
    if p.returncode == 0:
        res["xla"] = json.loads(p.stdout)
    else:
        res["xla_error"] = p.stderr.strip()[-2000:]
    with open(os.path.join(out_dir, "stats.json"), "w") as f:
        json.dump(res, f, indent=1)
    return res


# ---------------------------------------------------------------------------
# One model end to end.
# ---------------------------------------------------------------------------

def bench(label, what, child_args, args, before_override=None):
    t_model = time.time()
    out_dir = os.path.join(args.out, label)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    dump_dir = os.path.join(out_dir, "xla_dump")
    print("[%s] XLA compile with dumps ..." % label, file=sys.stderr, flush=True)
    res = run_xla_child(what, child_args, dump_dir, os.path.join(out_dir, "xla_dump_run.log"),
                        os.path.join(out_dir, "xla_dump_run.json"))
    mod = res["module"]
    files = {
        "before_optimizations.txt": "before_optimizations",
        "xla_before_shardy.txt": "before_shardy-xla",
        "xla_after_shardy.txt": "after_shardy-xla",
        "xla_after_spmd.txt": "after_spmd-partitioning",
    }
    for dst, needle in files.items():
        shutil.copyfile(pick_dump(dump_dir, mod, needle), os.path.join(out_dir, dst))
    if not args.keep_dumps:
        shutil.rmtree(dump_dir, ignore_errors=True)
    dump_rec = res["shardy_xla"]

    timing = []
    for i in range(args.xla_runs):
        print("[%s] XLA timing compile %d/%d (no dumps) ..." % (label, i + 1, args.xla_runs),
              file=sys.stderr, flush=True)
        r = run_xla_child(what, child_args, None, os.path.join(out_dir, "xla_time_run%d.log" % i),
                          os.path.join(out_dir, "xla_time_run%d.json" % i))
        timing.append(r)
    recs = [r["shardy_xla"] for r in timing] or [dump_rec]
    best_pass = min(recs, key=lambda r: r["pass_us"])
    best_timer = min(recs, key=lambda r: r["timer_us"] or float("inf"))

    before = before_override or os.path.join(out_dir, "before_optimizations.txt")
    print("[%s] ours x%d ..." % (label, args.repeats), file=sys.stderr, flush=True)
    ours_sdy = time_ours(args.hlo_opt, before, "sdy-propagation", args.repeats)
    ours_sp = time_ours(args.hlo_opt, before, "sharding-propagation", args.repeats)
    # Also on the exact module XLA's shardy-xla pass received (after XLA's
    # passes that run before it in the spmd-partitioner pipeline).
    xla_in = os.path.join(out_dir, "xla_before_shardy.txt")
    ours_sdy_x = time_ours(args.hlo_opt, xla_in, "sdy-propagation", args.repeats)
    print("[%s] compare / stats ..." % label, file=sys.stderr, flush=True)
    xla_after = os.path.join(out_dir, "xla_after_shardy.txt")
    cmp_ = compare(args.hlo_opt, before, xla_after, out_dir)
    cmp_x = compare(args.hlo_opt, xla_in, xla_after, out_dir, "compare_on_xla_input.json")
    stats = stats_pair(args.hlo_opt, before, os.path.join(out_dir, "xla_after_spmd.txt"), out_dir)
    # Our result on disk, for inspection.
    hlo_opt(args.hlo_opt, [before, "--passes=sharding-propagation", "-o",
                           os.path.join(out_dir, "ours_after_sharding_propagation.txt")],
            log_env=False, check=False)

    row = {
        "model": label,
        "before": before,
        "instructions": ours_sdy["instructions"],
        "xla_instructions_at_shardy_xla": best_pass.get("instructions"),
        "xla_shardy_xla_ms": best_pass["pass_us"] / 1e3,
        "xla_shardy_xla_timer_ms": (best_timer["timer_us"] or 0) / 1e3,
        "xla_shardy_xla_ms_all_runs": [round(r["pass_us"] / 1e3, 3) for r in recs],
        "xla_dump_run_shardy_xla_ms": dump_rec["pass_us"] / 1e3,
        "xla_dump_run_timer_ms": (dump_rec["timer_us"] or 0) / 1e3,
        "xla_verifier_ms": best_timer.get("verifier_us", 0.0) / 1e3,
        "xla_compile_s": [round(r["compile_s"], 2) for r in [res] + timing],
        "fresh_input_equals_testdata": res.get("fresh_input_equals_testdata"),
        "ours_sdy_propagation_ms": ours_sdy["ms"],
        "ours_sdy_propagation_all_ms": ours_sdy["all_ms"],
        "ours_sdy_propagation_summary": ours_sdy["summary"],
        "ours_sharding_propagation_ms": ours_sp["ms"],
        "ours_sharding_propagation_per_pass_ms": ours_sp["per_pass_ms"],
        "ours_sharding_propagation_all_ms": ours_sp["all_ms"],
        "ours_hlo_opt_wall_s": ours_sdy["best_wall_s"],
        "ours_sdy_propagation_on_xla_input_ms": ours_sdy_x["ms"],
        "ours_sdy_propagation_on_xla_input_all_ms": ours_sdy_x["all_ms"],
        "compare": {k: v for k, v in cmp_.items() if k != "mismatches"},
        "compare_on_xla_input": {k: v for k, v in cmp_x.items() if k != "mismatches"},
        "stats": stats,
        "seconds": time.time() - t_model,
    }
    row["ratio"] = row["xla_shardy_xla_ms"] / row["ours_sdy_propagation_ms"] \
        if row["ours_sdy_propagation_ms"] > 0 else None
    row["ratio_vs_sharding_propagation"] = row["xla_shardy_xla_ms"] / row["ours_sharding_propagation_ms"] \
        if row["ours_sharding_propagation_ms"] > 0 else None
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(row, f, indent=1)
    return row


def largest_case(hlo_opt_bin):
    best = None
    for path in sorted(glob.glob(os.path.join(REPO_ROOT, "testdata", "shardy_cases", "*", "input.hlo"))):
        n = instruction_count(hlo_opt_bin, path)
        if n is not None and (best is None or n > best[1]):
            best = (os.path.basename(os.path.dirname(path)), n, path)
    return best


def _print_compare(what, c):
    if "error" in c:
        print("   compare-shardings (ours on %s) FAILED: %s" % (what, c["error"]))
        return
    tot = c.get("total") or 0
    print("   shardings, ours on %s vs XLA after shardy-xla: %d/%d matched (%.1f%%), "
          "paired_by_structure=%s, unpaired_ours=%s, unpaired_other=%s"
          % (what, c.get("matched", 0), tot, 100.0 * c.get("matched", 0) / tot if tot else 0,
             c.get("paired_by_structure"), c.get("unpaired_ours"), c.get("unpaired_other")))
    if c.get("kinds"):
        print("     mismatch kinds: " + "; ".join("%s x%d" % tuple(kv) for kv in c["kinds"][:15]))
    for m in c.get("first", []):
        print("     %-28s %-14s ours=%s  xla=%s" % (_short(m["instruction"], 28), m["opcode"],
                                               _short(m["ours"], 60), _short(m["other"], 60)))


def print_report(rows):
    print()
    hdr = ("%-40s %7s %9s %10s %9s %9s %10s %8s %8s"
           % ("model", "instrs", "XLA ms", "XLA timer", "ours sdy", "ours s-p", "sdy@xla-in",
              "XLA/sdy", "XLA/s-p"))
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print("%-40s %7s %9.1f %10.1f %9.2f %9.2f %10.2f %7.1fx %7.1fx" % (
            r["model"], r["instructions"], r["xla_shardy_xla_ms"], r["xla_shardy_xla_timer_ms"],
            r["ours_sdy_propagation_ms"], r["ours_sharding_propagation_ms"],
            r["ours_sdy_propagation_on_xla_input_ms"],
            r["ratio"] or 0, r["ratio_vs_sharding_propagation"] or 0))
    print()
    print("XLA ms    = shardy-xla alone (XLA log: 'Number of instructions' -> 'Pass caused changes'),")
    print("            best of the no-dump compiles; XLA timer = XLA's 'HLO pass: shardy-xla time'")
    print("            (adds the hlo-verifier run after the pass). ours sdy = hlo-opt 'pass")
    print("            sdy-propagation' ms, ours s-p = --passes=sharding-propagation (sum of its")
    print("            passes), best of the repeats; all on before_optimizations. sdy@xla-in = ours")
    print("            sdy-propagation on XLA's own shardy-xla input (the before_shardy-xla dump).")
    print("            XLA/sdy, XLA/s-p = XLA ms / ours sdy, XLA ms / ours s-p.")
    for r in rows:
        print()
        c = r["compare"]
        print("== %s" % r["model"])
        print("   input: %s (%s instructions; XLA counts %s at shardy-xla)"
              % (r["before"], r["instructions"], r["xla_instructions_at_shardy_xla"]))
        print("   XLA shardy-xla runs (ms): %s; with dumps on: %.1f (timer %.1f); compile s: %s"
              % (r["xla_shardy_xla_ms_all_runs"], r["xla_dump_run_shardy_xla_ms"],
                 r["xla_dump_run_timer_ms"], r["xla_compile_s"]))
        print("   ours sdy-propagation runs (ms): %s; sharding-propagation runs (ms): %s %s"
              % (r["ours_sdy_propagation_all_ms"], r["ours_sharding_propagation_all_ms"],
                 json.dumps(r["ours_sharding_propagation_per_pass_ms"])))
        if r.get("ours_sdy_propagation_summary"):
            print("   ours: %s" % r["ours_sdy_propagation_summary"])
        print("   ours sdy-propagation on XLA's shardy-xla input (ms): %s"
              % r["ours_sdy_propagation_on_xla_input_all_ms"])
        _print_compare("before_optimizations", c)
        _print_compare("XLA's shardy-xla input", r["compare_on_xla_input"])
        s = r["stats"]
        for who in ("ours", "xla"):
            if who in s:
                print("   %s partitioned: %s" % (who, json.dumps(collective_bytes(s[who]))))
            elif who + "_error" in s:
                print("   %s partitioned stats FAILED: %s" % (who, _short(s[who + "_error"], 400)))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--_child":
        return child_main(argv[1:])
    ap = argparse.ArgumentParser(description="Shardy propagation speed: ours vs XLA's shardy-xla.")
    ap.add_argument("--out", default="/tmp/shardy_speed")
    ap.add_argument("--layers", type=int, default=16, help="decoder layers (default 16)")
    ap.add_argument("--scan", action="store_true", help="lax.scan over stacked layers instead of unrolling")
    ap.add_argument("--both", action="store_true", help="run the unrolled and the scan variant")
    ap.add_argument("--remat", action="store_true", help="jax.checkpoint each layer")
    ap.add_argument("--repeats", type=int, default=5, help="runs of ours per pass list (best taken)")
    ap.add_argument("--xla-runs", type=int, default=2,
                    help="no-dump XLA compiles for timing (best taken; 0: use the dump run)")
    ap.add_argument("--no-case", action="store_true", help="skip the largest testdata/shardy_cases case")
    ap.add_argument("--case", default=None, help="this shardy case instead of the largest")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--hlo-opt", default=DEFAULT_HLO_OPT)
    ap.add_argument("--no-snapshot", action="store_true",
                    help="run --hlo-opt in place instead of a copy made at the start")
    ap.add_argument("--keep-dumps", action="store_true", help="keep XLA's raw dump folders")
    args = ap.parse_args(argv)
    if not os.path.exists(args.hlo_opt):
        print("no hlo-opt at %s (build it: cargo build --release -p hlo-opt)" % args.hlo_opt,
              file=sys.stderr)
        return 2
    t0 = time.time()
    os.makedirs(args.out, exist_ok=True)
    if not args.no_snapshot:
        # The release binary may be rebuilt while we run: use a private copy.
        snap = os.path.join(args.out, "hlo-opt")
        shutil.copy2(args.hlo_opt, snap)
        print("using a copy of %s (%s, built %s)" % (
            args.hlo_opt, snap, time.strftime("%Y-%m-%d %H:%M:%S",
                                              time.localtime(os.path.getmtime(args.hlo_opt)))),
              file=sys.stderr)
        args.hlo_opt = snap
    rows, failures = [], []
    variants = []
    if not args.no_llama:
        if args.both:
            variants = [False, True]
        else:
            variants = [args.scan]
    for scan in variants:
        sys.path.insert(0, HERE)
        import llama_shardy as L
        cfg = L.Config(layers=args.layers, scan=scan, remat=args.remat)
        child_args = ["--layers", str(args.layers)] + (["--scan"] if scan else []) + \
            (["--remat"] if args.remat else [])
        try:
            rows.append(bench(cfg.name(), "llama", child_args, args))
        except Exception as e:
            failures.append((cfg.name(), "%s: %s" % (type(e).__name__, e)))
    if not args.no_case:
        if args.case:
            name = args.case
            path = os.path.join(REPO_ROOT, "testdata", "shardy_cases", name, "input.hlo")
        else:
            name, n, path = largest_case(args.hlo_opt)
            print("largest shardy case: %s (%d instructions)" % (name, n), file=sys.stderr)
        try:
            rows.append(bench("case_" + name, "case:" + name, [], args, before_override=path))
        except Exception as e:
            failures.append(("case_" + name, "%s: %s" % (type(e).__name__, e)))
    print_report(rows)
    for r in rows:
        if r.get("fresh_input_equals_testdata") is not None:
            print("   (%s: fresh before_optimizations == testdata input.hlo modulo metadata: %s)"
                  % (r["model"], r["fresh_input_equals_testdata"]))
    for n, e in failures:
        print("FAILED %s: %s" % (n, e))
    total = time.time() - t0
    print("\ntotal %.1f s; details in %s/results.json" % (total, args.out))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"rows": rows, "failures": failures, "seconds": total}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
