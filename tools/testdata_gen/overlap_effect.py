#!/usr/bin/env python3
"""Side-by-side effect of the overlap passes, windowed einsum (collective
matmul) and collective decomposition, under the analytical cost model: for
every module, our pipeline (sharding-propagation, spmd-partitioning,
latency-hiding-scheduler) with and without `windowed-einsum` (and with
--decompose, `decompose-collectives`; with --combine, `combine-collectives`)
before the scheduler, as `hlo-opt
--schedule-report` simulates them: step time (makespan), exposed
communication, and the change.

Modules: testdata/cases/*/input.hlo, testdata/overlap_cases/*.hlo (tensor
parallel Llama steps at realistic widths), ../shared/corpus/cases/*/input.hlo
(when present), any files given with --extra, and XLA's benchmark modules of
../shared (the MaxText and DeepSeek train steps partitioned by us; the
already-partitioned Llama and Mixtral programs as they are, the overlap
passes run on them directly).

Printed: every module whose current schedule leaves >= --exposed-min (10%)
of its step as exposed communication, and every module whose step time
changes; then the counts of modules improved, unchanged and worse.

Usage:
    python3 tools/testdata_gen/overlap_effect.py [--threshold-mib 0] [--by-cost] [--bidirectional] [--decompose] [--combine]
        [--cost-model analytical] [--extra FILE ...]
Needs a release build of hlo-opt (cargo build --release -p hlo-opt).
"""

import argparse
import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SHARED = os.path.abspath(os.path.join(REPO_ROOT, "..", "shared"))
BASE = "sharding-propagation,spmd-partitioning"


def modules(extra):
    """(path, whether it still needs partitioning)."""
    found = sorted(glob.glob(os.path.join(REPO_ROOT, "testdata", "cases", "*", "input.hlo")))
    found += sorted(glob.glob(os.path.join(REPO_ROOT, "testdata", "overlap_cases", "*.hlo")))
    found += sorted(glob.glob(os.path.join(SHARED, "corpus", "cases", "*", "input.hlo")))
    found += list(extra)
    out = [(path, True) for path in found]
    # XLA's benchmark modules: the two train steps as XLA receives them, the
    # others already partitioned per device (the overlap passes run on
    # them directly).
    for path in sorted(glob.glob(os.path.join(SHARED, "xla-hlo", "*.hlo"))
                       + glob.glob(os.path.join(SHARED, "xla-hlo-more", "*.hlo"))):
        out.append((path, "before_optimization" in path))
    return out


def report(hlo_opt, path, passes, threshold, cost_model, by_cost=False, bidirectional=False):
    cmd = [hlo_opt, path, "--passes=" + passes, "--schedule-report", "--cost-model", cost_model]
    if threshold is not None:
        cmd += ["--windowed-einsum-threshold-mib", str(threshold)]
    if by_cost:
        cmd.append("--windowed-einsum-by-cost")
    if bidirectional:
        cmd.append("--windowed-einsum-bidirectional")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"
    return json.loads(p.stdout), None


def name_of(path):
    parent = os.path.basename(os.path.dirname(path))
    return parent if os.path.basename(path) == "input.hlo" else os.path.basename(path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hlo-opt", default=os.path.join(REPO_ROOT, "target", "release", "hlo-opt"))
    ap.add_argument("--threshold-mib", type=float, default=0.0)
    ap.add_argument("--cost-model", default="analytical")
    ap.add_argument("--exposed-min", type=float, default=0.10)
    ap.add_argument("--extra", nargs="*", default=[])
    ap.add_argument("--by-cost", action="store_true",
                    help="window only the pairs the cost model says pay (--windowed-einsum-by-cost)")
    ap.add_argument("--bidirectional", action="store_true",
                    help="bidirectional windowed loops (--windowed-einsum-bidirectional)")
    ap.add_argument("--decompose", action="store_true",
                    help="also run decompose-collectives after windowed-einsum")
    ap.add_argument("--combine", action="store_true",
                    help="also run combine-collectives (XLA's collective combiners, kept where they pay) last")
    ap.add_argument("--json", help="write every row here")
    args = ap.parse_args()
    rows = []
    for path, partition in modules(args.extra):
        base = BASE + "," if partition else ""
        before, err = report(args.hlo_opt, path, base + "latency-hiding-scheduler", None,
                             args.cost_model)
        if before is None:
            print("skip %s: %s" % (name_of(path), err), file=sys.stderr)
            continue
        passes = base + "windowed-einsum" + (",decompose-collectives" if args.decompose else "")
        passes += ",combine-collectives" if args.combine else ""
        after, err = report(args.hlo_opt, path, passes + ",latency-hiding-scheduler",
                            args.threshold_mib, args.cost_model, args.by_cost,
                            args.bidirectional)
        if after is None:
            print("FAILED %s with windowed-einsum: %s" % (name_of(path), err), file=sys.stderr)
            continue
        rows.append({
            "module": name_of(path),
            "makespan_us": [before["makespan_us"], after["makespan_us"]],
            "exposed_comm_us": [before["exposed_comm_us"], after["exposed_comm_us"]],
            "scheduler_ms": [before["scheduler_ms"], after["scheduler_ms"]],
            "compute_busy_us": [before["compute_busy_us"], after["compute_busy_us"]],
        })
    print("%-52s %12s %12s %8s %12s %12s" % ("module", "step us", "windowed", "change",
                                             "exposed us", "windowed"))
    improved = worse = same = 0
    # Modules at or over --exposed-min, and those of them whose exposed
    # communication at least halves and whose step falls by 15% or more.
    exposed_modules = meet_both = 0
    for r in rows:
        (m0, m1), (e0, e1) = r["makespan_us"], r["exposed_comm_us"]
        change = (m1 - m0) / m0 if m0 > 0 else 0.0
        exposed_share = e0 / m0 if m0 > 0 else 0.0
        if abs(change) < 1e-9:
            same += 1
        elif change < 0:
            improved += 1
        else:
            worse += 1
        r["exposed_share"] = exposed_share
        if exposed_share >= args.exposed_min:
            exposed_modules += 1
            meet_both += int(e1 <= 0.5 * e0 and change <= -0.15)
        if exposed_share >= args.exposed_min or abs(change) >= 1e-9:
            print("%-52s %12.1f %12.1f %+7.1f%% %12.1f %12.1f%s"
                  % (r["module"][:52], m0, m1, 100 * change, e0, e1,
                     "  (exposed %.0f%%)" % (100 * exposed_share)
                     if exposed_share >= args.exposed_min else ""))
    print("\n%d modules: %d faster, %d unchanged, %d slower (threshold %g MiB%s%s%s, %s)"
          % (len(rows), improved, same, worse, args.threshold_mib,
             ", by cost" if args.by_cost else "",
             ", decomposition" if args.decompose else "",
             ", combining" if args.combine else "", args.cost_model))
    print("%d modules with >= %.0f%% of the step as exposed communication: %d of them with it"
          " at least halved and the step at least 15%% shorter"
          % (exposed_modules, 100 * args.exposed_min, meet_both))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
