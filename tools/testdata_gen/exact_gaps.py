#!/usr/bin/env python3
"""The exact scheduler's verdict on our schedules: every module is
partitioned (when not already) and scheduled by the latency-hiding
scheduler (list scheduling), then `hlo-opt --exact-time-limit` runs the
branch and bound from each computation's schedule and reports the best
order it found and a proven lower bound (the optimum when the search
finished).

Printed per module: computations, how many the search settled (optimal),
whether every computation of at most --small nodes (30) was settled, the
entry's list makespan beside the exact best and the proven bound, and the
largest gap of a schedule to its bound. Then the totals.

Modules: those of overlap_effect.py (testdata/cases, testdata/overlap_cases,
../shared/corpus/cases and XLA's benchmark modules in ../shared/xla-hlo and
../shared/xla-hlo-more: the MaxText and DeepSeek steps partitioned by us, the
others scheduled as the per-device programs they are).

Usage:
    python3 tools/testdata_gen/exact_gaps.py [--time-limit 0.2] [--small 30] [--only SUBSTRING]
Needs a release build of hlo-opt (cargo build --release -p hlo-opt).
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import overlap_effect  # noqa: E402
from overlap_effect import name_of  # noqa: E402
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PARTITION = "sharding-propagation,spmd-partitioning,latency-hiding-scheduler"
SCHEDULE = "latency-hiding-scheduler"


def modules():
    """(path, passes): every module overlap_effect.py measures, partitioned
    and scheduled, or only scheduled where it is already partitioned."""
    return [(path, PARTITION if partition else SCHEDULE)
            for path, partition in overlap_effect.modules([])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hlo-opt", default=os.path.join(REPO_ROOT, "target", "release", "hlo-opt"))
    ap.add_argument("--time-limit", type=float, default=0.2, help="seconds per computation")
    ap.add_argument("--small", type=int, default=30)
    ap.add_argument("--only", default="")
    ap.add_argument("--json", help="write every module's figures here")
    args = ap.parse_args()
    rows = []
    totals = {"computations": 0, "optimal": 0, "small": 0, "small_optimal": 0}
    print("%-44s %6s %7s %6s %11s %11s %11s %7s %8s" % (
        "module", "comps", "optimal", "small", "entry list", "exact best", "bound", "gap",
        "wall s"))
    for path, passes in modules():
        if args.only and args.only not in path:
            continue
        t0 = time.time()
        p = subprocess.run([args.hlo_opt, path, "--passes=" + passes, "--schedule-report",
                            "--exact-time-limit", str(args.time_limit)],
                           capture_output=True, text=True)
        wall = time.time() - t0
        if p.returncode != 0:
            print("skip %s: %s" % (name_of(path), p.stderr.strip().splitlines()[-1:]),
                  file=sys.stderr)
            continue
        exact = json.loads(p.stdout)["exact"]
        comps = exact["by_computation"]
        small = [c for c in comps if c["nodes"] <= args.small]
        small_optimal = sum(1 for c in small if c["optimal"])
        totals["computations"] += len(comps)
        totals["optimal"] += exact["optimal"]
        totals["small"] += len(small)
        totals["small_optimal"] += small_optimal
        entry = exact["entry"] or {}
        rows.append({"module": name_of(path), "exact": exact, "wall_s": wall})
        print("%-44s %6d %7d %6s %11.1f %11.1f %11.1f %6.1f%% %8.1f" % (
            name_of(path)[:44], len(comps), exact["optimal"],
            "%d/%d" % (small_optimal, len(small)),
            entry.get("schedule_us", 0.0), entry.get("best_us", 0.0), entry.get("bound_us", 0.0),
            100 * exact["largest_schedule_gap"], wall))
    print("\n%d computations in %d modules: %d settled optimal; of the %d with at most %d nodes, "
          "%d settled optimal (time limit %g s per computation)"
          % (totals["computations"], len(rows), totals["optimal"], totals["small"], args.small,
             totals["small_optimal"], args.time_limit))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
