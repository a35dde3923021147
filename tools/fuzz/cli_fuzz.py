#!/usr/bin/env python3
"""Command-line fuzzer for hlo-opt and run_hlo_module (issue 24, item 5).

Takes the bundled cases (testdata/cases/*/): each case's input.hlo, its
propagated.hlo and its per-device program (xla_partitioned.hlo, or any
*partitioned*.hlo in the folder), together with the case's args/arg*.npy.
Each round picks a case and a file, applies one to three mutations chosen by
a seeded RNG, writes the mutant and runs it through one command picked at
random from the list for that kind of file (cheap commands, parse and verify,
are picked more often; a mutant that passes is run through further commands
with probability 1/2 each, up to four). Every run has a wall-clock timeout
(--timeout, default 20 s) and an address-space cap (--mem-limit, default
4 GiB, set with setrlimit(RLIMIT_AS) in the child before exec; core dumps
off), so a huge allocation fails inside the child (Rust aborts with "memory
allocation of N bytes failed") instead of taking the machine.

Mutations (see MUTATIONS below; a mutation that does not apply to the chosen
line is skipped and another drawn):
  int           an integer literal set to an extreme (0, -1, 1, 2, 3, 7,
                65536, 10^6, 2^31-1, 2^31, -2^31, 2^32, 2^32+1, 2^63-1, 2^63,
                2^64, 999999999991) or off by one / doubled / halved: shape
                dims (f32[8,16]), layouts, num_partitions=, replica_groups=
                (explicit, iota [4,2]<=[8], mesh['axis_0'=2,...]), devices=[...]
                tile assignments, index=, dimensions={...}, slice bounds,
                window size/stride/pad/dilation, padding=, *_dims=,
                slice_sizes, source_target_pairs, parameter(N), constants, ...
                (weighted by where the number is, see INT_WEIGHTS)
  int-list      an integer list ({0,1}, [8,16], ...) reversed, emptied, an
                element dropped, duplicated or appended
  rank          a shape's dimension list: one dropped, added, two swapped, []
  dtype         an element type replaced (f32 -> s32, pred, bf16, c64, token...)
  drop/dup/swap a line dropped, duplicated, or swapped with another
                (usually one of the same computation)
  root          ROOT moved to another instruction of the computation
  name-swap     two instruction names of a computation swapped everywhere
  operand       an operand replaced by another instruction's name, or two
                operands of one instruction swapped
  punct         stray punctuation inserted, or a punctuation character removed
  opcode        an opcode replaced by another of the same arity (unary,
                binary, collectives, ...)
  direction     a compare's direction= removed or changed, type= changed
  attr-drop     one ", name=value" attribute removed from an instruction
  attr-copy     an attribute replaced by the same attribute of another line
  sharding      a sharding={...} replaced (or added) by one from SHARDINGS or
                copied from another instruction
  groups        replica_groups= / source_target_pairs= replaced by a bad form
  header        num_partitions= / replica_count= set, added or removed
  flags         (per command, 1 in 8) --devices N / --num-partitions N /
                --memory-limit / --overlap-limit / --cost-model varied

Commands (COMMANDS below): hlo-opt M; --stats; --no-verify; --passes=
sharding-propagation; complete-shardings; sharding-propagation,
spmd-partitioning; ...,latency-hiding-scheduler; --schedule-report (also with
--trace); --passes=async-collective-creator,latency-hiding-scheduler; the full
pipeline with --schedule-report; the overlap passes (windowed-einsum at
threshold 0 and by cost, decompose-collectives, combine-collectives,
--exact-time-limit); run_hlo_module M --args DIR (plain,
--devices 8, --partition, --partition --schedule, --partition with the
overlap passes); for a per-device program P:
the hlo-opt commands that make sense for it and run_hlo_module P --devices 8
--shardings-from CASE/propagated.hlo --args DIR; and the original P run with a
mutated propagated.hlo as --shardings-from.

Classification of one run:
  signal    killed by a signal (negative return code): SIGABRT (e.g. "memory
            allocation of N bytes failed", stack overflow), SIGSEGV, ...
  panic     a Rust panic: exit code 101, or stderr containing "panicked at"
            or "device N panicked" (a panic caught by the loopback runtime
            and reported as an error)
  bad-exit  any other exit code above 2
  stall     still running after --timeout seconds (killed)
  Everything else (exit 0, 1 or 2) is fine; exit 1/2 must come with a message.
  An exit 1/2 whose stderr says "internal error" (and no panic) is counted as
  a note and saved under internal-*/, but does not fail the run.

Findings: each new one goes to OUT/<class>-<hash>/ with input.hlo (the
mutant, with each changed hunk that is not needed to reproduce reverted, and
a varied flag dropped when not needed), command.txt (one shell-quoted line
with placeholders {BIN} {REPO} {M} {TMP}), stderr.txt, mutation.diff
(against the original testdata file), backtrace.txt and info.json (case,
file, mutations, signature, cause, project stack, hits, command kinds seen).
Deduplication is by cause: a panic or an allocation abort is rerun once with
RUST_BACKTRACE=1 (cheap), and its key is (class, signature, first frame in
project code), whatever command reached it; other signals (SIGSEGV, stack
overflow) are rerun under gdb when it is installed (--backtraces, the
default then). Other findings are keyed by (class, signature, command kind),
stalls also by what the mutation changed (a stall is attached with gdb before
it is killed, for the first few, to show where it spins). The signature is
the panic location and first line of its message, the abort message, or the
top line of stderr, with numbers and names replaced by N / %X. The folder
name's hash is a function of the key, so runs with other seeds that write
into the same --out (or pass it as --baseline) recognize known findings.

Replay: --replay DIR reruns every DIR/*/command.txt with its input.hlo and
reports which still crash. With --write-expected it records, for each finding
that no longer crashes, the exit code and first stderr line in expected.txt;
later replays check them (a changed exit code or message is a mismatch). A
replay exits 1 when any finding still crashes or mismatches its expected.txt:
this is how findings become regression cases.

Standard invocations (from the repository root, after a release build):
  short, for CI (about a minute):
    python3 tools/fuzz/cli_fuzz.py --bin-dir target/release --seconds 60 \
        --seed 1 --out target/fuzz-findings
  long (ten minutes; vary --seed, raise --jobs on an idle machine):
    python3 tools/fuzz/cli_fuzz.py --bin-dir target/release --seconds 600 \
        --seed $RANDOM --jobs 4 --out /tmp/fuzz-findings
  regression check of saved findings:
    python3 tools/fuzz/cli_fuzz.py --bin-dir target/release --replay DIR
  Until the known findings are fixed, the CI run can pass --baseline DIR (a
  folder of saved findings): crashes with those keys are reported but do not
  fail the run; a new one does. At 2 cores, --jobs 1 does about 60 runs/s.

The last line printed is always
  fuzz: N inputs, A aborts, P panics, S stalls, B bad exits
(N counts runs, A runs killed by a signal); the exit status is 1 when any
crash or stall was found (not counting ones whose key is in --baseline DIR),
else 0.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

# ---------------------------------------------------------------------------
# Corpus

SCRIPT_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class Case:
    name: str
    rel: str  # case folder relative to the repository
    input: str | None
    propagated: str | None
    partitioned: str | None
    args: str | None  # args folder relative to the repository, if any


def load_corpus(repo: str, only: str | None) -> list[Case]:
    root = os.path.join(repo, "testdata", "cases")
    cases = []
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if not os.path.isfile(os.path.join(d, "input.hlo")):
            continue
        if only and not re.search(only, name):
            continue
        rel = os.path.relpath(d, repo)
        files = sorted(os.listdir(d))
        part = None
        if "xla_partitioned.hlo" in files:
            part = "xla_partitioned.hlo"
        else:
            part = next((f for f in files if "partitioned" in f and f.endswith(".hlo")), None)
        args = os.path.join(rel, "args") if os.path.isdir(os.path.join(d, "args")) else None
        cases.append(
            Case(
                name=name,
                rel=rel,
                input=os.path.join(rel, "input.hlo"),
                propagated=os.path.join(rel, "propagated.hlo") if "propagated.hlo" in files else None,
                partitioned=os.path.join(rel, part) if part else None,
                args=args,
            )
        )
    return cases


_text_cache: dict[str, list[str]] = {}
_text_lock = threading.Lock()


def lines_of(repo: str, rel: str) -> list[str]:
    with _text_lock:
        if rel not in _text_cache:
            with open(os.path.join(repo, rel), encoding="utf-8", errors="replace") as f:
                _text_cache[rel] = f.read().split("\n")
        return _text_cache[rel]


# ---------------------------------------------------------------------------
# Commands. Placeholders: {BIN} tool folder, {REPO} checkout, {M} the mutant,
# {TMP} a scratch folder, {ARGS} the case's args folder, {G} the case's
# propagated.hlo (or input.hlo), {P} the case's per-device program.
# (kind, weight, argv template). Cheap ones weigh more.

HLO_OPT = "{BIN}/hlo-opt"
RUN = "{BIN}/run_hlo_module"

GLOBAL_COMMANDS = [
    ("parse-verify", 10, [HLO_OPT, "{M}"]),
    ("stats", 4, [HLO_OPT, "{M}", "--stats"]),
    ("no-verify", 2, [HLO_OPT, "{M}", "--no-verify"]),
    ("sharding-propagation", 4, [HLO_OPT, "{M}", "--passes=sharding-propagation"]),
    ("complete-shardings", 2, [HLO_OPT, "{M}", "--passes=sharding-propagation,complete-shardings"]),
    ("spmd", 4, [HLO_OPT, "{M}", "--passes=sharding-propagation,spmd-partitioning"]),
    ("spmd-lhs", 3, [HLO_OPT, "{M}", "--passes=sharding-propagation,spmd-partitioning,latency-hiding-scheduler"]),
    ("schedule-report", 4, [HLO_OPT, "{M}", "--schedule-report"]),
    ("async-lhs", 3, [HLO_OPT, "{M}", "--passes=async-collective-creator,latency-hiding-scheduler"]),
    ("pipeline-report", 2, [HLO_OPT, "{M}", "--passes=sharding-propagation,spmd-partitioning,async-collective-creator,latency-hiding-scheduler", "--schedule-report"]),
    ("pipeline-trace", 1, [HLO_OPT, "{M}", "--passes=sharding-propagation,spmd-partitioning", "--schedule-report", "--trace", "{TMP}/trace.json"]),
    ("overlap", 2, [HLO_OPT, "{M}", "--passes=sharding-propagation,spmd-partitioning,windowed-einsum,decompose-collectives,combine-collectives", "--windowed-einsum-threshold-mib", "0"]),
    ("overlap-by-cost", 1, [HLO_OPT, "{M}", "--passes=sharding-propagation,spmd-partitioning,windowed-einsum,decompose-collectives,latency-hiding-scheduler", "--windowed-einsum-by-cost", "--exact-time-limit", "0.05", "--schedule-report"]),
    ("overlap-bidirectional", 1, [HLO_OPT, "{M}", "--passes=sharding-propagation,spmd-partitioning,windowed-einsum,decompose-collectives", "--windowed-einsum-threshold-mib", "0", "--windowed-einsum-bidirectional"]),
    ("exact-within-memory", 1, [HLO_OPT, "{M}", "--passes=sharding-propagation,spmd-partitioning,latency-hiding-scheduler", "--exact-time-limit", "0.05", "--memory-limit", "1000000", "--schedule-report"]),
    ("compare-shardings", 1, [HLO_OPT, "{M}", "--passes=sharding-propagation", "--compare-shardings", "{G}"]),
    ("run", 4, [RUN, "{M}", "--args", "{ARGS}"]),
    ("run-devices8", 3, [RUN, "{M}", "--args", "{ARGS}", "--devices", "8"]),
    ("run-partition", 3, [RUN, "{M}", "--args", "{ARGS}", "--partition"]),
    ("run-partition-schedule", 2, [RUN, "{M}", "--args", "{ARGS}", "--partition", "--schedule"]),
    ("run-partition-overlap", 2, [RUN, "{M}", "--args", "{ARGS}", "--partition", "--windowed-einsum-threshold-mib", "0", "--decompose-collectives", "--combine-collectives"]),
]

DEVICE_COMMANDS = [
    ("parse-verify", 8, [HLO_OPT, "{M}"]),
    ("stats", 3, [HLO_OPT, "{M}", "--stats"]),
    ("schedule-report", 4, [HLO_OPT, "{M}", "--schedule-report"]),
    ("lhs", 2, [HLO_OPT, "{M}", "--passes=latency-hiding-scheduler"]),
    ("async-lhs", 4, [HLO_OPT, "{M}", "--passes=async-collective-creator,latency-hiding-scheduler"]),
    ("async-lhs-report", 2, [HLO_OPT, "{M}", "--passes=async-collective-creator,latency-hiding-scheduler", "--schedule-report", "--trace", "{TMP}/trace.json"]),
    ("overlap", 2, [HLO_OPT, "{M}", "--passes=windowed-einsum,decompose-collectives,combine-collectives", "--windowed-einsum-threshold-mib", "0"]),
    ("exact", 1, [HLO_OPT, "{M}", "--passes=latency-hiding-scheduler", "--exact-time-limit", "0.05", "--schedule-report"]),
    ("run-sharded", 6, [RUN, "{M}", "--devices", "8", "--shardings-from", "{G}", "--args", "{ARGS}"]),
]

# The original per-device program run with a mutated global module.
SHARDINGS_FROM_COMMANDS = [
    ("run-sharded-from-mutant", 1, [RUN, "{P}", "--devices", "8", "--shardings-from", "{M}", "--args", "{ARGS}"]),
]

FLAG_VARIANTS = {
    "--devices": ["1", "2", "3", "4", "5", "7", "16", "0", "64"],
}
EXTRA_FLAGS = {
    HLO_OPT: [
        ["--num-partitions", "1"], ["--num-partitions", "2"], ["--num-partitions", "3"],
        ["--num-partitions", "16"], ["--num-partitions", "0"], ["--num-partitions", "7"],
        ["--memory-limit", "0"], ["--memory-limit", "1"], ["--memory-limit", "1KB"],
        ["--overlap-limit", "all-gather=0"], ["--overlap-limit", "all-reduce=1000000"],
        ["--cost-model", "approximate"], ["--cost-model", "analytical:h200"],
    ],
    RUN: [["--devices", "1"], ["--devices", "3"], ["--devices", "16"], ["--devices", "2"]],
}


def weighted(rng: random.Random, items):
    total = sum(w for _, w, *_ in items)
    x = rng.uniform(0, total)
    for it in items:
        x -= it[1]
        if x <= 0:
            return it
    return items[-1]


def vary_flags(rng: random.Random, argv: list[str]) -> tuple[list[str], str | None]:
    """With probability 1/8 vary a numeric flag or add one; returns the argv
    and a description (None when unchanged)."""
    if rng.random() >= 1 / 8:
        return argv, None
    argv = list(argv)
    if "--devices" in argv and rng.random() < 0.6:
        i = argv.index("--devices")
        argv[i + 1] = rng.choice(FLAG_VARIANTS["--devices"])
        return argv, f"--devices {argv[i + 1]}"
    extra = EXTRA_FLAGS.get(argv[0])
    if not extra:
        return argv, None
    if argv[0] == RUN and "--devices" in argv:
        return argv, None
    if argv[0] == RUN and "--partition" not in argv and "--shardings-from" not in argv:
        extra = [["--devices", "8"], ["--devices", "3"], ["--devices", "16"]]
    flag = rng.choice(extra)
    return argv + flag, " ".join(flag)


# ---------------------------------------------------------------------------
# Mutations. Each takes (rng, lines) and changes lines in place, returning a
# (category, description) pair, or None when it does not apply.

EXTREMES = [0, -1, 1, 2, 3, 7, 65536, 1000000, 2**31 - 1, 2**31, -(2**31), 2**32, 2**32 + 1,
            2**63 - 1, 2**63, 2**64, 999999999991]

DTYPES = ["pred", "s4", "s8", "s16", "s32", "s64", "u4", "u8", "u16", "u32", "u64", "f16", "bf16",
          "f32", "f64", "c64", "c128", "f8e4m3fn", "f8e5m2"]
DTYPE_RE = r"(?:pred|token|bf16|c64|c128|f8e4m3fn|f8e5m2|f8e4m3fnuz|f8e5m2fnuz|f8e4m3b11fnuz|[suf]\d+)"
SHAPE_RE = re.compile(r"\b" + DTYPE_RE + r"\[([^\]]*)\]")
INSTR_RE = re.compile(r"^(\s*)(ROOT\s+)?(%?[\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\((.*)$")
NAME_TOKEN = r"%?{}(?![\w.\-])"

UNARY = ["abs", "negate", "exponential", "exponential-minus-one", "log", "log-plus-one", "tanh",
         "sqrt", "rsqrt", "cbrt", "sign", "floor", "ceil", "cosine", "sine", "tan", "not", "popcnt",
         "is-finite", "copy", "round-nearest-even", "round-nearest-afz", "count-leading-zeros",
         "logistic", "real", "imag", "erf", "bitcast", "reshape", "transpose", "reverse", "broadcast",
         "convert", "opt-barrier", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
         "collective-permute", "copy-start", "copy-done", "all-gather-start", "all-gather-done",
         "all-reduce-start", "all-reduce-done", "collective-permute-start",
         "collective-permute-done", "get-tuple-element", "slice", "sort"]
BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "remainder",
          "and", "or", "xor", "shift-left", "shift-right-logical", "shift-right-arithmetic",
          "atan2", "compare", "complex", "dot", "concatenate", "pad", "dynamic-slice", "reduce",
          "reduce-window", "convolution", "gather", "select-and-scatter"]
TERNARY = ["select", "clamp", "dynamic-update-slice", "scatter", "sort", "tuple", "concatenate"]
COLLECTIVES = ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "all-reduce-start", "all-gather-start",
               "collective-permute-start", "ragged-all-to-all"]
NULLARY = ["parameter", "constant", "iota", "partition-id", "replica-id", "rng-get-and-update-state",
           "after-all"]

SHARDINGS = [
    "{replicated}", "{manual}", "{maximal device=0}", "{maximal device=7}", "{maximal device=8}",
    "{maximal device=2147483648}", "{devices=[8]<=[8]}", "{devices=[2,4]<=[8]}",
    "{devices=[4,2]<=[8]}", "{devices=[8,1]<=[8]}", "{devices=[1,8]<=[8]}", "{devices=[2,2,2]<=[8]}",
    "{devices=[2,1,4]<=[8] last_tile_dim_replicate}", "{devices=[1,1,8]<=[8] last_tile_dim_replicate}",
    "{devices=[3,1]<=[3]}", "{devices=[16,1]<=[16]}", "{devices=[2,4]<=[4,2]T(1,0)}",
    "{devices=[2,4]0,1,2,3,4,5,6,7}", "{devices=[2,4]0,0,1,1,2,2,3,3}", "{devices=[2,4]0,1,2,3,4,5,6,9}",
    "{devices=[2,4]0,1,2}", "{devices=[2,2,2]<=[8] last_tile_dims={manual}}",
    "{devices=[1,2,4]<=[8] last_tile_dims={manual, replicated}}", "{devices=[0,8]<=[8]}",
    "{devices=[2147483648,1]<=[8]}", "{devices=[4294967296,1]<=[4294967296]}",
    "{devices=[65536,65536]<=[4294967296]}", "{devices=[2,4]<=[8] last_tile_dim_replicate}",
    "{{replicated}, {manual}}", "{{devices=[2,4]<=[8]}, {replicated}}", "{}", "{devices=[1]<=[1]}",
    "{devices=[2,4]<=[2,4]T(0,0)}", "{devices=[8,1,1,1,1,1,1,1,1]<=[8]}",
    "{mesh['x'=2,'y'=4], [{'x'}, {'y'}]}", "{mesh['x'=2,'y'=4], [{'y'}, {'y'}]}",
    "{mesh['x'=2,'y'=4], [{'z'}, {}]}", "{mesh['x'=2,'y'=4], [{'x':(1)2}, {'y':(2)2}]}",
    "{mesh['x'=2,'y'=4], [{'x':(3)5}, {}]}", "{mesh['x'=8], replicated}", "{mesh['x'=8], manual}",
    "{mesh['x'=0], [{'x'}]}", "{maximal_mesh[device_id=9]}", "{devices=[2,4]<=[8] shard_as 1}",
    "{devices=[2,4]<=[8] shard_like 2147483648}",
]

REPLICA_GROUPS = [
    "{}", "{{0}}", "{{0,1,2,3,4,5,6,7}}", "{{0,1},{2,3},{4,5},{6,7}}", "{{0,0},{1,1}}",
    "{{0,1},{1,2}}", "{{0,1,2,3,4,5,6,7,8}}", "{{0,1,2}}", "{{-1,0}}", "{{0,2147483648}}", "{{}}",
    "{{0,1,2,3},{4,5,6}}", "[1,8]<=[8]", "[8,1]<=[8]", "[2,4]<=[8]", "[4,2]<=[2,4]T(1,0)",
    "[3,3]<=[9]", "[0,8]<=[0]", "[2,4]<=[4]", "[2147483648,1]<=[2147483648]",
    "[4294967296,1]<=[4294967296]", "[1,4294967296]<=[4294967296]", "[2,4]<=[2,2,2]T(2,0,1)",
    "mesh['axis_0'=2,'axis_1'=4] {'axis_0'}", "mesh['axis_0'=2,'axis_1'=4] {'axis_2'}",
    "mesh['axis_0'=2,'axis_1'=4] {}", "mesh['axis_0'=2,'axis_1'=4] {'axis_0','axis_1'}",
    "mesh['axis_0'=3,'axis_1'=3] {'axis_0'}", "mesh['axis_0'=0] {'axis_0'}",
    "mesh['axis_0'=2147483648,'axis_1'=2] {'axis_0'}", "mesh['axis_0'=8] {'axis_0','axis_0'}",
    "mesh[] {}", "mesh['a'=16] {'a'}", "mesh['a'=2,'b'=4] {'b':(1)2}", "mesh['a'=2,'b'=4] {'b':(4)4}",
    "mesh['a'=8, device_ids=(7,6,5,4,3,2,1,0)] {'a'}", "mesh['a'=8, device_ids=(0,0,0,0,0,0,0,0)] {'a'}",
    "mesh['a'=8, device_ids=([2,4]T(1,0))] {'a'}", "mesh['a'=8, device_ids=(1,2)] {'a'}",
]
SOURCE_TARGET = ["{}", "{{0,0}}", "{{0,9}}", "{{0,1},{0,2}}", "{{0,1},{2,1}}", "{{-1,0}}",
                 "{{0,2147483648}}", "{{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7},{7,0}}", "{{0,1,2}}"]

INT_WEIGHTS = {
    "shape": 6, "layout": 1, "num_partitions": 8, "replica_count": 6, "replica_groups": 6,
    "sharding": 6, "index": 4, "dimensions": 5, "slice": 6, "window": 6, "padding": 5,
    "dynamic_slice_sizes": 4, "slice_sizes": 4, "source_target_pairs": 5, "parameter": 3,
    "constant": 3, "iota_dimension": 4, "channel_id": 2, "metadata": 0.05, "comment": 0.2,
    "index_vector_dim": 4, "k": 4, "feature_group_count": 4, "batch_group_count": 4,
    "mantissa_bits": 3, "exponent_bits": 3, "entry_computation_layout": 2,
    "lhs_contracting_dims": 4, "rhs_contracting_dims": 4, "lhs_batch_dims": 4, "rhs_batch_dims": 4,
    "offset_dims": 4, "collapsed_slice_dims": 4, "start_index_map": 4, "update_window_dims": 4,
    "inserted_window_dims": 4, "scatter_dims_to_operand_dims": 4, "device_ids": 3,
    "split_dimension": 4, "concat_dimension": 4, "split_count": 4, "devices": 6, "device": 3,
    "size": 5, "stride": 5, "pad": 5, "lhs_dilate": 4, "rhs_dilate": 4,
}


def quote_spans(line: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r'"(?:[^"\\]|\\.)*"', line)]


def attr_spans(line: str) -> list[tuple[str, int, int]]:
    """(name, value_start, value_end) for each `name=value` at bracket depth
    <= 1 outside strings; the value ends at a ',' or closing bracket of the
    same depth."""
    out = []
    for m in re.finditer(r"(?<![\w.\-%'])([a-z_][a-z_0-9]*)=", line):
        start = m.end()
        depth = 0
        i = start
        in_str = False
        while i < len(line):
            c = line[i]
            if in_str:
                if c == "\\":
                    i += 1
                elif c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c in "{[(":
                depth += 1
            elif c in "}])":
                if depth == 0:
                    break
                depth -= 1
            elif c == "," and depth == 0:
                break
            i += 1
        out.append((m.group(1), start, i))
    return out


def int_sites(line: str) -> list[tuple[int, int, str]]:
    """(start, end, category) of each integer literal in the line."""
    qs = quote_spans(line)
    shapes = []
    for m in SHAPE_RE.finditer(line):
        shapes.append((m.start(1), m.end(1), "shape"))
        lm = re.match(r"\{[\d,]*\}", line[m.end():])
        if lm:
            shapes.append((m.end(), m.end() + lm.end(), "layout"))
    attrs = attr_spans(line)
    calls = [(m.start(2), m.end(2), m.group(1)) for m in re.finditer(r"\b([a-z][a-z0-9\-]*)\(([^()]*)\)", line)]
    comments = [(m.start(), m.end(), "comment") for m in re.finditer(r"/\*.*?\*/", line)]
    sites = []
    for m in re.finditer(r"\d+", line):
        s, e = m.start(), m.end()
        if any(a <= s < b for a, b in qs):
            continue
        p = line[s - 1] if s > 0 else ""
        pp = line[s - 2] if s > 1 else ""
        n = line[e] if e < len(line) else ""
        nn = line[e + 1] if e + 1 < len(line) else ""
        if p == ".":
            continue
        if p.isalpha() and not (p == "x" and pp.isdigit()):
            continue
        if p == "_" and not pp.isdigit():
            continue
        if n == "." and nn.isdigit():
            continue
        if n in "eE" and (nn.isdigit() or nn in "+-"):
            continue
        if n.isalpha() and n != "x":
            continue
        if n == "_" and not nn.isdigit():
            continue
        cat = "other"
        for spans in (comments, shapes):
            hit = next((c for a, b, c in spans if a <= s < b), None)
            if hit:
                cat = hit
                break
        else:
            inner = [(b - a, name) for name, a, b in attrs if a <= s < b]
            if inner:
                cat = min(inner)[1]
            else:
                hit = next((c for a, b, c in calls if a <= s < b), None)
                if hit:
                    cat = hit
        sites.append((s, e, cat))
    return sites


def pick_line(rng: random.Random, lines: list[str], pred=None) -> int | None:
    idx = [i for i, l in enumerate(lines) if l.strip() and (pred is None or pred(l))]
    return rng.choice(idx) if idx else None


def is_instr(line: str) -> bool:
    return bool(INSTR_RE.match(line)) and not line.startswith("HloModule")


def computation_of(lines: list[str], i: int) -> tuple[int, int]:
    """[start, end) of the instruction lines of the computation around i."""
    s = i
    while s > 0 and is_instr(lines[s - 1]):
        s -= 1
    e = i
    while e < len(lines) and is_instr(lines[e]):
        e += 1
    return s, e


def new_int(rng: random.Random, old: int) -> int:
    if rng.random() < 0.3:
        return rng.choice([old + 1, old - 1, old * 2, old // 2, old * 1000])
    return rng.choice(EXTREMES)


def m_int(rng, lines):
    """Pick a category first (weighted by INT_WEIGHTS over the categories
    present), then a site of it, so that rare attributes (num_partitions=)
    are hit as often as common ones (shape dims)."""
    by_cat: dict[str, list] = {}
    for i, l in enumerate(lines):
        header = l.startswith("HloModule")
        for s, e, cat in int_sites(l):
            if header and cat in ("shape", "layout", "comment"):
                cat = "entry_computation_layout"
            by_cat.setdefault(cat, []).append((i, s, e))
    if not by_cat:
        return None
    cats = sorted(by_cat)
    cat = rng.choices(cats, weights=[INT_WEIGHTS.get(c, 2) for c in cats])[0]
    i, s, e = rng.choice(by_cat[cat])
    old = lines[i][s:e]
    v = new_int(rng, int(old))
    if v == int(old):
        v = int(old) + 1
    lines[i] = lines[i][:s] + str(v) + lines[i][e:]
    return f"int:{cat}", f"line {i + 1}: {cat} {old} -> {v}"


INT_LIST_RE = re.compile(r"(?:\{|\[|\()(-?\d+(?:,\s*-?\d+)*)?(?:\}|\]|\))")


def m_int_list(rng, lines):
    cands = []
    for i, l in enumerate(lines):
        if l.startswith("HloModule") and rng.random() < 0.7:
            continue
        qs = quote_spans(l)
        for m in INT_LIST_RE.finditer(l):
            if any(a <= m.start() < b for a, b in qs):
                continue
            cands.append((i, m.start(), m.end()))
    if not cands:
        return None
    i, s, e = rng.choice(cands)
    text = lines[i][s:e]
    o, body, c = text[0], text[1:-1], text[-1]
    xs = [x.strip() for x in body.split(",")] if body.strip() else []
    op = rng.choice(["reverse", "empty", "drop", "dup", "append", "append"])
    if op == "reverse" and len(xs) > 1:
        xs = xs[::-1]
    elif op == "empty":
        xs = []
    elif op == "drop" and xs:
        xs.pop(rng.randrange(len(xs)))
    elif op == "dup" and xs:
        k = rng.randrange(len(xs))
        xs.insert(k, xs[k])
    else:
        op = "append"
        xs.append(str(rng.choice([0, 1, len(xs), len(xs) + 1, 2**31 - 1, -1])))
    new = o + ",".join(xs) + c
    if new == text:
        return None
    lines[i] = lines[i][:s] + new + lines[i][e:]
    cat = attr_category(lines[i], s)
    return f"int-list:{cat}", f"line {i + 1}: {cat} {text} -> {new} ({op})"


def attr_category(line: str, pos: int) -> str:
    for m in SHAPE_RE.finditer(line):
        if m.start() <= pos <= m.end() + 1:
            return "shape"
    inner = [(b - a, name) for name, a, b in attr_spans(line) if a <= pos < b]
    if inner:
        return min(inner)[1]
    m = None
    for m2 in re.finditer(r"\b([a-z][a-z0-9\-]*)\(", line[: pos + 1]):
        m = m2
    return m.group(1) if m else "other"


def m_rank(rng, lines):
    cands = [(i, m.start(1), m.end(1)) for i, l in enumerate(lines) for m in SHAPE_RE.finditer(l)]
    if not cands:
        return None
    i, s, e = rng.choice(cands)
    body = lines[i][s:e]
    xs = [x for x in body.split(",") if x.strip()]
    op = rng.choice(["drop", "add", "swap", "scalar"])
    if op == "drop" and xs:
        xs.pop(rng.randrange(len(xs)))
    elif op == "swap" and len(xs) > 1:
        a, b = rng.sample(range(len(xs)), 2)
        xs[a], xs[b] = xs[b], xs[a]
    elif op == "scalar":
        xs = []
    else:
        op = "add"
        xs.insert(rng.randrange(len(xs) + 1), str(rng.choice([1, 2, 8, 3])))
    new = ",".join(xs)
    if new == body:
        return None
    lines[i] = lines[i][:s] + new + lines[i][e:]
    return "rank", f"line {i + 1}: shape [{body}] -> [{new}] ({op})"


def m_dtype(rng, lines):
    cands = [(i, m.start(), m.start() + m.group(0).index("["))
             for i, l in enumerate(lines) for m in SHAPE_RE.finditer(l)]
    if not cands:
        return None
    i, s, e = rng.choice(cands)
    old = lines[i][s:e]
    new = rng.choice(DTYPES + ["token"])
    if new == old:
        return None
    lines[i] = lines[i][:s] + new + lines[i][e:]
    return "dtype", f"line {i + 1}: {old} -> {new}"


def m_drop(rng, lines):
    i = pick_line(rng, lines, lambda l: not l.startswith("HloModule") or rng.random() < 0.05)
    if i is None:
        return None
    old = lines.pop(i)
    return "drop", f"line {i + 1} dropped: {old.strip()[:120]}"


def m_dup(rng, lines):
    i = pick_line(rng, lines)
    if i is None:
        return None
    lines.insert(i, lines[i])
    return "dup", f"line {i + 1} duplicated: {lines[i].strip()[:120]}"


def m_swap(rng, lines):
    i = pick_line(rng, lines, is_instr)
    if i is None:
        return None
    if rng.random() < 0.75:
        s, e = computation_of(lines, i)
        if e - s < 2:
            return None
        j = rng.randrange(s, e)
    else:
        j = pick_line(rng, lines)
    if j is None or j == i:
        return None
    lines[i], lines[j] = lines[j], lines[i]
    return "swap", f"lines {i + 1} and {j + 1} swapped"


def m_root(rng, lines):
    roots = [i for i, l in enumerate(lines) if re.match(r"^\s*ROOT\s", l)]
    if not roots:
        return None
    r = rng.choice(roots)
    s, e = computation_of(lines, r)
    j = rng.randrange(s, e)
    if j == r:
        return None
    lines[r] = re.sub(r"^(\s*)ROOT\s+", r"\1", lines[r])
    if rng.random() < 0.8:
        lines[j] = re.sub(r"^(\s*)", r"\1ROOT ", lines[j], count=1)
        return "root", f"ROOT moved from line {r + 1} to line {j + 1}"
    return "root", f"ROOT removed from line {r + 1}"


def instr_name(line: str) -> str | None:
    m = INSTR_RE.match(line)
    return m.group(3).lstrip("%") if m else None


def m_name_swap(rng, lines):
    i = pick_line(rng, lines, is_instr)
    if i is None:
        return None
    s, e = computation_of(lines, i)
    names = [n for n in (instr_name(lines[k]) for k in range(s, e)) if n]
    if len(names) < 2:
        return None
    a, b = rng.sample(names, 2)
    ra = re.compile(r"(?<![\w.\-])%?" + re.escape(a) + r"(?![\w.\-])")
    rb = re.compile(r"(?<![\w.\-])%?" + re.escape(b) + r"(?![\w.\-])")
    tmp = "\x00SWAP\x00"
    for k in range(len(lines)):
        l = ra.sub(lambda m: m.group(0).replace(a, tmp), lines[k])
        l = rb.sub(lambda m: m.group(0).replace(b, a), l)
        lines[k] = l.replace(tmp, b)
    return "name-swap", f"names {a} and {b} swapped"


def operand_spans(line: str) -> list[tuple[int, int]]:
    m = INSTR_RE.match(line)
    if not m:
        return []
    start = m.start(6)
    depth = 1
    i = start
    while i < len(line) and depth:
        if line[i] == "(":
            depth += 1
        elif line[i] == ")":
            depth -= 1
        i += 1
    body_end = i - 1
    return [(start + x.start(), start + x.end())
            for x in re.finditer(r"%[\w.\-]+", line[start:body_end])]


def m_operand(rng, lines):
    i = pick_line(rng, lines, lambda l: is_instr(l) and bool(operand_spans(l)))
    if i is None:
        return None
    ops = operand_spans(lines[i])
    l = lines[i]
    if len(ops) > 1 and rng.random() < 0.4:
        (a, b), (c, d) = rng.sample(ops, 2)
        if a > c:
            (a, b), (c, d) = (c, d), (a, b)
        x, y = l[a:b], l[c:d]
        if x == y:
            return None
        lines[i] = l[:a] + y + l[b:c] + x + l[d:]
        return "operand", f"line {i + 1}: operands {x} and {y} swapped"
    s, e = computation_of(lines, i)
    names = [n for n in (instr_name(lines[k]) for k in range(s, e)) if n]
    a, b = rng.choice(ops)
    new = "%" + rng.choice(names) if names else "%nonexistent"
    if rng.random() < 0.05:
        new = "%nonexistent"
    if new == l[a:b]:
        return None
    lines[i] = l[:a] + new + l[b:]
    return "operand", f"line {i + 1}: operand {l[a:b]} -> {new}"


PUNCT = "{}[](),=%:;*/\"'<>-_."


def m_punct(rng, lines):
    i = pick_line(rng, lines)
    if i is None:
        return None
    l = lines[i]
    if rng.random() < 0.5:
        pos = [k for k, c in enumerate(l) if c in PUNCT]
        if not pos:
            return None
        k = rng.choice(pos)
        lines[i] = l[:k] + l[k + 1:]
        return "punct", f"line {i + 1} col {k + 1}: {l[k]!r} removed"
    k = rng.randrange(len(l) + 1)
    c = rng.choice(PUNCT)
    lines[i] = l[:k] + c + l[k:]
    return "punct", f"line {i + 1} col {k + 1}: {c!r} inserted"


def m_opcode(rng, lines):
    i = pick_line(rng, lines, is_instr)
    if i is None:
        return None
    m = INSTR_RE.match(lines[i])
    op = m.group(5)
    groups = [g for g in (UNARY, BINARY, TERNARY, COLLECTIVES, NULLARY) if op in g]
    pool = groups[0] if groups else UNARY + BINARY
    if rng.random() < 0.1:
        pool = UNARY + BINARY + TERNARY + COLLECTIVES + NULLARY + ["while", "conditional", "call",
                                                                   "custom-call", "fusion", "rng"]
    new = rng.choice(pool)
    if new == op:
        return None
    lines[i] = lines[i][: m.start(5)] + new + lines[i][m.end(5):]
    return f"opcode:{op}", f"line {i + 1}: {op} -> {new}"


def m_direction(rng, lines):
    i = pick_line(rng, lines, lambda l: "direction=" in l or "type=" in l)
    if i is None:
        return None
    l = lines[i]
    r = rng.random()
    if r < 0.4:
        new = re.sub(r",\s*direction=\w+", "", l, count=1)
        what = "direction removed"
    elif r < 0.8:
        d = rng.choice(["EQ", "NE", "LT", "GT", "LE", "GE", "XX", ""])
        new = re.sub(r"direction=\w+", "direction=" + d, l, count=1)
        what = f"direction -> {d!r}"
    else:
        t = rng.choice(["TOTALORDER", "FLOAT", "SIGNED", "UNSIGNED", "PARTIALORDER", "BOGUS"])
        if "type=" in l:
            new = re.sub(r"\btype=\w+", "type=" + t, l, count=1)
        else:
            new = l + ", type=" + t
        what = f"type -> {t}"
    if new == l:
        return None
    lines[i] = new
    return "direction", f"line {i + 1}: {what}"


def m_attr_drop(rng, lines):
    i = pick_line(rng, lines, lambda l: is_instr(l) and bool(attr_spans(l)))
    if i is None:
        return None
    l = lines[i]
    m = INSTR_RE.match(l)
    spans = [(n, a, b) for n, a, b in attr_spans(l) if a > m.start(6)]
    if not spans:
        return None
    n, a, b = rng.choice(spans)
    k = l.rfind(",", 0, a - len(n) - 1)
    if k < 0:
        return None
    lines[i] = l[:k] + l[b:]
    return f"attr-drop:{n}", f"line {i + 1}: {n}= removed"


def m_attr_copy(rng, lines):
    i = pick_line(rng, lines, lambda l: bool(attr_spans(l)))
    if i is None:
        return None
    n, a, b = rng.choice(attr_spans(lines[i]))
    others = []
    for j, l in enumerate(lines):
        if j == i:
            continue
        for n2, a2, b2 in attr_spans(l):
            if n2 == n and l[a2:b2] != lines[i][a:b]:
                others.append(l[a2:b2])
    if not others:
        return None
    new = rng.choice(others)
    old = lines[i][a:b]
    lines[i] = lines[i][:a] + new + lines[i][b:]
    return f"attr-copy:{n}", f"line {i + 1}: {n}={old[:80]} -> {new[:80]}"


def m_sharding(rng, lines):
    i = pick_line(rng, lines, is_instr)
    if i is None:
        return None
    l = lines[i]
    spans = [(a, b) for n, a, b in attr_spans(l) if n == "sharding"]
    if rng.random() < 0.3:
        others = [x[a:b] for x in lines for n, a, b in attr_spans(x) if n == "sharding"]
        new = rng.choice(others) if others else rng.choice(SHARDINGS)
    else:
        new = rng.choice(SHARDINGS)
    if spans:
        a, b = spans[0]
        old = l[a:b]
        if old == new:
            return None
        lines[i] = l[:a] + new + l[b:]
        return "sharding", f"line {i + 1}: sharding={old[:80]} -> {new[:80]}"
    lines[i] = l + ", sharding=" + new
    return "sharding", f"line {i + 1}: sharding={new[:80]} added"


def m_groups(rng, lines):
    i = pick_line(rng, lines, lambda l: "replica_groups=" in l or "source_target_pairs=" in l)
    if i is None:
        return None
    l = lines[i]
    spans = [(n, a, b) for n, a, b in attr_spans(l) if n in ("replica_groups", "source_target_pairs")]
    if not spans:
        return None
    n, a, b = rng.choice(spans)
    new = rng.choice(REPLICA_GROUPS if n == "replica_groups" else SOURCE_TARGET)
    old = l[a:b]
    if old == new:
        return None
    lines[i] = l[:a] + new + l[b:]
    return f"groups:{n}", f"line {i + 1}: {n}={old[:80]} -> {new}"


def m_header(rng, lines):
    i = next((k for k, l in enumerate(lines) if l.startswith("HloModule")), None)
    if i is None:
        return None
    l = lines[i]
    key = rng.choice(["num_partitions", "num_partitions", "replica_count"])
    v = rng.choice([0, 1, 2, 3, 4, 7, 9, 16, 64, 1024, 2**31 - 1, 2**31, 2**32 + 1, 2**63 - 1, -1])
    if rng.random() < 0.15:
        new = re.sub(r",\s*" + key + r"=\d+", "", l)
        what = f"{key} removed"
    elif key + "=" in l:
        new = re.sub(key + r"=-?\d+", f"{key}={v}", l)
        what = f"{key} -> {v}"
    else:
        new = l + f", {key}={v}"
        what = f"{key}={v} added"
    if new == l:
        return None
    lines[i] = new
    return f"header:{key}", f"header: {what}"


MUTATIONS = [
    (m_int, 30), (m_int_list, 8), (m_rank, 5), (m_dtype, 4), (m_drop, 5), (m_dup, 3), (m_swap, 5),
    (m_root, 2), (m_name_swap, 4), (m_operand, 5), (m_punct, 5), (m_opcode, 5), (m_direction, 2),
    (m_attr_drop, 5), (m_attr_copy, 4), (m_sharding, 8), (m_groups, 5), (m_header, 4),
]


def mutate(rng: random.Random, lines: list[str]) -> tuple[list[str], list[tuple[str, str]]]:
    lines = list(lines)
    n = rng.choices([1, 2, 3], weights=[6, 3, 1.5])[0]
    done = []
    tries = 0
    while len(done) < n and tries < 30:
        tries += 1
        fn = rng.choices([f for f, _ in MUTATIONS], weights=[w for _, w in MUTATIONS])[0]
        r = fn(rng, lines)
        if r:
            done.append(r)
    return lines, done


# ---------------------------------------------------------------------------
# Running and classifying


@dataclass
class Result:
    rc: int | None
    stderr: str
    elapsed: float
    timed_out: bool
    backtrace: str = ""


def limits(mem_bytes: int, cpu_s: int):
    def f():
        if mem_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))
    return f


def gdb_path() -> str | None:
    return shutil.which("gdb")


def with_time_limit(argv: list[str], cfg) -> list[str]:
    """run_hlo_module gets --time-limit (3/4 of the per-run timeout): a
    mutant whose loop never ends is a valid program, and the tool's answer
    to it is a clean error, not a hang."""
    if os.path.basename(argv[0]) == "run_hlo_module" and "--time-limit" not in argv:
        return argv + ["--time-limit", f"{cfg.timeout * 0.75:g}"]
    return argv


def run_cmd(argv: list[str], cfg, env_extra=None, attach_gdb=False) -> Result:
    argv = with_time_limit(argv, cfg)
    env = dict(os.environ)
    env["RUST_BACKTRACE"] = "0"
    if env_extra:
        env.update(env_extra)
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, env=env, start_new_session=True,
                         preexec_fn=limits(cfg.mem_limit, int(cfg.timeout * 4) + 5))
    bt = ""
    try:
        _, err = p.communicate(timeout=cfg.timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        if attach_gdb and gdb_path():
            try:
                bt = subprocess.run([gdb_path(), "-p", str(p.pid), "-batch", "-nx",
                                     "-ex", "thread apply all bt 40"],
                                    stdin=subprocess.DEVNULL, capture_output=True,
                                    text=True, errors="replace", timeout=120).stdout
            except subprocess.TimeoutExpired:
                bt = "(gdb timed out)"
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, err = p.communicate()
    elapsed = time.monotonic() - t0
    text = err.decode("utf-8", errors="replace") if err else ""
    return Result(p.returncode, text, elapsed, timed_out, bt)


PANIC_RE = re.compile(r"panicked at ([^\n]*?):(\d+):(\d+):\n([^\n]*)")
PANIC_OLD_RE = re.compile(r"panicked at '([^\n]*)', ([^\n]*?):(\d+):(\d+)")
DEVICE_PANIC_RE = re.compile(r"device \d+ panicked: ?([^\n]*)")


def norm(s: str) -> str:
    s = re.sub(r"\d+", "N", s)
    s = re.sub(r"%[\w.\-]+", "%X", s)
    s = re.sub(r"'[^']*'", "'X'", s)
    return s[:160]


def classify(r: Result) -> tuple[str | None, str]:
    """(class, signature); class None when the run is fine."""
    err = r.stderr
    if r.timed_out:
        return "stall", "stall"
    m = PANIC_RE.search(err)
    if m:
        loc = re.sub(r"^/rustc/[0-9a-f]+/", "rust:", m.group(1))
        return "panic", f"{loc}:{m.group(2)}: {norm(m.group(4))}"
    m = PANIC_OLD_RE.search(err)
    if m:
        return "panic", f"{m.group(2)}:{m.group(3)}: {norm(m.group(1))}"
    m = DEVICE_PANIC_RE.search(err)
    if m:
        return "panic", f"device panicked: {norm(m.group(1))}"
    if r.rc is not None and r.rc < 0:
        try:
            sig = signal.Signals(-r.rc).name
        except ValueError:
            sig = f"signal {-r.rc}"
        # Threads failing together interleave their messages: match loosely.
        m = re.search(r"memory allocation of", err)
        if m:
            return "signal", f"{sig}: memory allocation of N bytes failed"
        m = re.search(r"has overflowed its stack", err)
        if m:
            return "signal", f"{sig}: stack overflow"
        first = next((l for l in err.splitlines() if l.strip()), "(no stderr)")
        return "signal", f"{sig}: {norm(first)}"
    if r.rc == 101:
        first = next((l for l in err.splitlines() if l.strip()), "(no stderr)")
        return "panic", f"exit 101: {norm(first)}"
    if r.rc is not None and r.rc > 2:
        first = next((l for l in err.splitlines() if l.strip()), "(no stderr)")
        return "bad-exit", f"exit {r.rc}: {norm(first)}"
    if "internal error" in err:
        m = re.search(r"internal error[^\n]*", err)
        return "internal", norm(m.group(0))
    return None, ""


CRASH_CLASSES = ("signal", "panic", "bad-exit", "stall")


# ---------------------------------------------------------------------------
# Fuzzing loop


@dataclass
class Config:
    bin_dir: str
    repo: str
    timeout: float
    mem_limit: int
    out: str
    backtraces: bool
    baseline: set = field(default_factory=set)


@dataclass
class Job:
    seed: int
    case: Case
    target: str  # "global" | "device" | "shardings-from"
    src: str  # mutated file, relative to repo
    original: list[str]
    mutant: list[str]
    mutations: list[tuple[str, str]]


def subst(argv: list[str], values: dict[str, str]) -> list[str]:
    return [re.sub(r"\{([A-Z]+)\}", lambda m: values.get(m.group(1), m.group(0)), a) for a in argv]


def make_job(seed: int, cases: list[Case], repo: str) -> Job | None:
    rng = random.Random(seed)
    case = rng.choice(cases)
    r = rng.random()
    if r < 0.62 or not (case.partitioned and case.propagated):
        target, src = "global", case.input
        if case.propagated and rng.random() < 0.25:
            src = case.propagated
    elif r < 0.93:
        target, src = "device", case.partitioned
    else:
        target, src = "shardings-from", case.propagated
    original = lines_of(repo, src)
    mutant, muts = mutate(rng, original)
    if not muts or mutant == original:
        return None
    return Job(seed, case, target, src, original, mutant, muts)


def commands_for(target: str):
    return {"global": GLOBAL_COMMANDS, "device": DEVICE_COMMANDS,
            "shardings-from": SHARDINGS_FROM_COMMANDS}[target]


def values_for(job: Job, cfg: Config, mpath: str, tmp: str) -> dict[str, str]:
    c = job.case
    g = c.propagated or c.input
    return {
        "BIN": cfg.bin_dir, "REPO": cfg.repo, "M": mpath, "TMP": tmp,
        "ARGS": os.path.join("{REPO}", c.args) if c.args else os.path.join(tmp, "noargs"),
        "G": os.path.join("{REPO}", g), "P": os.path.join("{REPO}", c.partitioned or c.input),
    }


def concretize(template: list[str], vals: dict[str, str]) -> list[str]:
    """Template (with {ARGS}, {G}, {P}) -> the stored form of command.txt,
    where only {BIN}, {REPO}, {M} and {TMP} are left (see to_concrete)."""
    return subst(template, {k: v for k, v in vals.items() if k in ("ARGS", "G", "P")})


def to_concrete(stored: list[str], bin_dir: str, repo: str, m: str, tmp: str) -> list[str]:
    return subst(stored, {"BIN": bin_dir, "REPO": repo, "M": m, "TMP": tmp})


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.inputs = 0
        self.counts = {c: 0 for c in CRASH_CLASSES + ("internal",)}
        self.findings: dict[tuple, dict] = {}
        self.failing = 0


def write_text(path: str, text: str):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def hunks_minimize(original: list[str], mutant: list[str], reproduces) -> list[str]:
    """Revert each changed hunk of the mutant in turn (a block of changed
    lines line by line), keeping the revert when the crash still
    reproduces."""
    current = list(mutant)
    for _ in range(2):
        sm = difflib.SequenceMatcher(a=original, b=current, autojunk=False)
        ops = []
        for tag, i1, i2, j1, j2 in sm.get_opcodes():
            if tag == "equal":
                continue
            if tag == "replace" and i2 - i1 == j2 - j1:
                ops.extend((i1 + k, i1 + k + 1, j1 + k, j1 + k + 1) for k in range(i2 - i1))
            else:
                ops.append((i1, i2, j1, j2))
        if not ops:
            return current
        changed = False
        for i1, i2, j1, j2 in reversed(ops):
            trial = current[:j1] + original[i1:i2] + current[j2:]
            if trial != current and reproduces(trial):
                current = trial
                changed = True
        if not changed:
            break
    return current


PROJECT_FN = re.compile(r"^<?(?:xla_|hlo_opt|run_hlo_module|collectives)")
SRC_PATH = re.compile(r"(?:^|/)((?:xla|runtime|collectives|tools)/[^:]*\.rs):(\d+)")


def rust_frames(text: str) -> list[tuple[str, str]]:
    """(function, file:line or '') of each frame of a RUST_BACKTRACE=1 trace."""
    frames = []
    for line in text.splitlines():
        m = re.match(r"^\s*\d+: (.+)$", line)
        if m:
            frames.append([m.group(1).strip(), ""])
            continue
        m = re.match(r"^\s+at (.+)$", line)
        if m and frames and not frames[-1][1]:
            pm = SRC_PATH.search(m.group(1))
            frames[-1][1] = f"{pm.group(1)}:{pm.group(2)}" if pm else ""
    return [(f, loc) for f, loc in frames]


def gdb_frames(text: str) -> list[tuple[str, str]]:
    frames = []
    for line in text.splitlines():
        m = re.match(r"^#\d+\s+(?:0x[0-9a-f]+ in )?(\S+) \(.*?\)(?: at (\S+))?", line)
        if m:
            pm = SRC_PATH.search(m.group(2) or "")
            frames.append((m.group(1), f"{pm.group(1)}:{pm.group(2)}" if pm else ""))
    return frames


def strip_generics(fn: str) -> str:
    """xla::f<f32>::{{closure}} -> xla::f::{{closure}} (one cause, many
    monomorphizations)."""
    prev = None
    while prev != fn:
        prev = fn
        fn = re.sub(r"(?<=[\w}])<[^<>]*>", "", fn)
    return fn


def project_stack(text: str, n: int = 5) -> list[str]:
    frames = rust_frames(text) or gdb_frames(text)
    out = [f"{fn} ({loc})" if loc else fn for fn, loc in frames if PROJECT_FN.match(fn)]
    return out[:n]


def first_project_frame(frames: list[tuple[str, str]]) -> str:
    for i, (fn, loc) in enumerate(frames):
        if PROJECT_FN.match(fn):
            fn = strip_generics(fn)
            if not loc:
                # Inlined frame without a location: name the next located one.
                nxt = next((l for f, l in frames[i + 1:] if l), "")
                return f"{fn} (near {nxt})" if nxt else fn
            return f"{fn} ({loc})"
    return ""


def cause_of(cls: str, sig: str, argv: list[str], res: Result, cfg: Config) -> tuple[str, str]:
    """(cause, backtrace text): the first project frame of the crash."""
    if cls == "panic" or (cls == "signal" and "memory allocation" in sig):
        r = run_cmd(argv, cfg, env_extra={"RUST_BACKTRACE": "1"})
        if classify(r) == (cls, sig):
            cause = first_project_frame(rust_frames(r.stderr))
            if cls == "panic":
                m = PANIC_RE.search(r.stderr)
                if m and SRC_PATH.search(m.group(1)):
                    pm = SRC_PATH.search(m.group(1))
                    cause = f"panic at {pm.group(1)}:{m.group(2)}" + (f" in {cause}" if cause else "")
            if cause:
                return cause, r.stderr
    if cls == "signal" and cfg.backtraces and gdb_path():
        try:
            g = subprocess.run([gdb_path(), "-batch", "-nx", "-ex", "set startup-with-shell off",
                                "-ex", "run", "-ex", "bt 80", "--args"] + argv,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True,
                               errors="replace", timeout=max(cfg.timeout, 120),
                               preexec_fn=limits(cfg.mem_limit, 600))
            bt = g.stdout + g.stderr
            return first_project_frame(gdb_frames(bt)), bt
        except subprocess.TimeoutExpired:
            return "", "(gdb timed out)"
    if cls == "stall" and res.backtrace:
        # The first project frame of each thread; the main thread's first.
        frames = []
        for block in re.split(r"\nThread ", res.backtrace):
            f = first_project_frame(gdb_frames(block))
            if f and f not in frames:
                frames.append(f)
        return "; ".join(frames[:3]), res.backtrace
    return "", ""


def diff_categories(original: list[str], mutant: list[str]) -> list[str]:
    """What the changed hunks touch: the attribute / shape / opcode at the
    first differing character of each changed line, or drop/insert/move."""
    cats = set()
    sm = difflib.SequenceMatcher(a=original, b=mutant, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        if tag == "delete":
            cats.add("line-drop")
        elif tag == "insert":
            cats.add("line-insert")
        elif i2 - i1 != j2 - j1:
            cats.add("lines-changed")
        else:
            for a, b in zip(original[i1:i2], mutant[j1:j2]):
                p = 0
                while p < min(len(a), len(b)) and a[p] == b[p]:
                    p += 1
                cat = attr_category(b, p)
                if b.startswith("HloModule") and cat in ("shape", "other"):
                    cat = "entry_computation_layout"
                cats.add(cat)
    return sorted(cats)


def record(job: Job, kind: str, stored: list[str], flagdesc, res: Result, cls: str, sig: str,
           cfg: Config, stats: Stats, workdir: str, plain: list[str] | None = None):
    mfile = os.path.join(workdir, "min.hlo")
    argv = to_concrete(stored, cfg.bin_dir, cfg.repo, os.path.join(workdir, "input.hlo"), workdir)
    cause, bt = cause_of(cls, sig, argv, res, cfg)
    if cls in ("panic", "signal") and cause:
        # The same cause reached through another command of the same tool is
        # the same finding (the tool stays in the key: hlo-opt and
        # run_hlo_module verify and bound their inputs differently).
        key = (cls, sig, cause, os.path.basename(stored[0]))
    else:
        cats = ",".join(diff_categories(job.original, job.mutant)) if cls == "stall" else ""
        key = (cls, sig, kind, cats + ("+flags" if flagdesc and cls == "stall" else ""))
    h = hashlib.sha1(repr(key).encode()).hexdigest()[:10]
    with stats.lock:
        if cls in CRASH_CLASSES and h not in cfg.baseline:
            stats.failing += 1
        if key in stats.findings:
            f = stats.findings[key]
            f["hits"] += 1
            f["kinds"].add(kind)
            return
        stats.findings[key] = {"hits": 1, "dir": f"{cls}-{h}", "kinds": {kind}, "cause": cause}
    d = os.path.join(cfg.out, f"{cls}-{h}")
    os.makedirs(d, exist_ok=True)

    def reproduces(lines):
        write_text(mfile, "\n".join(lines))
        r = run_cmd(to_concrete(stored, cfg.bin_dir, cfg.repo, mfile, workdir), cfg)
        return classify(r) == (cls, sig)

    minimal = job.mutant
    if cls != "stall":
        if flagdesc and plain:
            # Without the varied flag, does it still crash the same way?
            r = run_cmd(to_concrete(plain, cfg.bin_dir, cfg.repo,
                                    os.path.join(workdir, "input.hlo"), workdir), cfg)
            if classify(r) == (cls, sig):
                stored, flagdesc = plain, None
        minimal = hunks_minimize(job.original, job.mutant, reproduces)
    write_text(os.path.join(d, "input.hlo"), "\n".join(minimal))
    write_text(os.path.join(d, "command.txt"), shlex.join(stored) + "\n")
    write_text(os.path.join(d, "stderr.txt"), res.stderr[-20000:])
    diff = "".join(difflib.unified_diff([l + "\n" for l in job.original], [l + "\n" for l in minimal],
                                        fromfile=job.src, tofile="input.hlo", n=1))
    write_text(os.path.join(d, "mutation.diff"), diff)
    if bt:
        write_text(os.path.join(d, "backtrace.txt"), bt[-40000:])
    info = {
        "class": cls, "signature": sig, "cause": cause, "command_kind": kind, "case": job.case.name,
        "file": job.src, "target": job.target, "seed": job.seed,
        "mutations_before_minimizing": [m for _, m in job.mutations],
        "changed": diff_categories(job.original, minimal),
        "flags": flagdesc, "rc": res.rc, "elapsed_s": round(res.elapsed, 3),
        "stack": project_stack(bt) if cls != "stall" else [],
        "key": list(key), "hash": h,
    }
    write_text(os.path.join(d, "info.json"), json.dumps(info, indent=1) + "\n")


def fuzz_one(seed: int, cases, cfg: Config, stats: Stats, workdir: str, deadline: float):
    job = make_job(seed, cases, cfg.repo)
    if job is None:
        return
    rng = random.Random(seed ^ 0x5EED)
    mpath = os.path.join(workdir, "input.hlo")
    write_text(mpath, "\n".join(job.mutant))
    cmds = commands_for(job.target)
    used = set()
    for step in range(4):
        if time.monotonic() > deadline:
            return
        kind, _, template = weighted(rng, [c for c in cmds if c[0] not in used] or cmds)
        used.add(kind)
        vals = values_for(job, cfg, mpath, workdir)
        plain = concretize(template, vals)
        template, flagdesc = vary_flags(rng, template)
        stored = concretize(template, vals)
        res = run_cmd(to_concrete(stored, cfg.bin_dir, cfg.repo, mpath, workdir), cfg,
                      attach_gdb=cfg.backtraces and stats.counts["stall"] < 8)
        cls, sig = classify(res)
        with stats.lock:
            stats.inputs += 1
            if cls:
                stats.counts[cls] += 1
        if cls:
            if cls == "stall":
                print(f"  stall: {kind} on {job.src} ({', '.join(m for _, m in job.mutations)})",
                      file=sys.stderr, flush=True)
            record(job, kind, stored, flagdesc, res, cls, sig, cfg, stats, workdir, plain)
            write_text(mpath, "\n".join(job.mutant))
            return
        if res.rc != 0 or rng.random() < 0.5:
            return


def load_existing(out: str, stats: Stats):
    """Findings already in --out (from an earlier run) count as known keys."""
    for d in sorted(os.listdir(out)):
        p = os.path.join(out, d, "info.json")
        try:
            with open(p) as fh:
                info = json.load(fh)
        except (OSError, ValueError):
            continue
        key = list(info["key"])
        if info.get("cause") and key[2] == info["cause"]:
            key[2] = info["cause"] = strip_generics(info["cause"])
        stats.findings[tuple(key)] = {
            "hits": info.get("hits", 1), "dir": d, "cause": info.get("cause", ""),
            "kinds": set(info.get("command_kinds_seen", [info.get("command_kind", "")])),
            "old": True,
        }


def fuzz(cfg: Config, cases, seconds: float, seed: int, jobs: int, progress: bool):
    stats = Stats()
    load_existing(cfg.out, stats)
    known_before = len(stats.findings)
    deadline = time.monotonic() + seconds
    base = tempfile.mkdtemp(prefix="cli_fuzz_")
    counter = [0]
    counter_lock = threading.Lock()
    master = random.Random(seed)

    def worker(w: int):
        wd = os.path.join(base, f"w{w}")
        os.makedirs(wd, exist_ok=True)
        while time.monotonic() < deadline:
            with counter_lock:
                counter[0] += 1
                s = master.getrandbits(63)
            fuzz_one(s, cases, cfg, stats, wd, deadline)

    def reporter():
        while time.monotonic() < deadline:
            time.sleep(min(30, max(0.1, deadline - time.monotonic())))
            with stats.lock:
                c = stats.counts
                print(f"  ... {stats.inputs} inputs, {c['signal']} aborts, {c['panic']} panics, "
                      f"{c['stall']} stalls, {c['bad-exit']} bad exits, "
                      f"{len(stats.findings) - known_before} new distinct", file=sys.stderr, flush=True)

    if progress:
        threading.Thread(target=reporter, daemon=True).start()
    try:
        if jobs <= 1:
            worker(0)
        else:
            with ThreadPoolExecutor(jobs) as ex:
                list(ex.map(worker, range(jobs)))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    # Update hit counts.
    for key, f in stats.findings.items():
        p = os.path.join(cfg.out, f["dir"], "info.json")
        try:
            with open(p) as fh:
                info = json.load(fh)
            info["hits"] = f["hits"]
            info["command_kinds_seen"] = sorted(f["kinds"])
            write_text(p, json.dumps(info, indent=1) + "\n")
        except OSError:
            pass
    return stats


# ---------------------------------------------------------------------------
# Replay


def replay(cfg: Config, folder: str, write_expected: bool) -> int:
    dirs = sorted(d for d in os.listdir(folder) if os.path.isfile(os.path.join(folder, d, "command.txt")))
    tmp = tempfile.mkdtemp(prefix="cli_fuzz_replay_")
    still = fixed = mismatched = 0
    counts = {c: 0 for c in CRASH_CLASSES}
    try:
        for d in dirs:
            p = os.path.join(folder, d)
            with open(os.path.join(p, "command.txt")) as f:
                line = next(l for l in f if l.strip() and not l.startswith("#"))
            argv = to_concrete(shlex.split(line), cfg.bin_dir, cfg.repo,
                               os.path.join(p, "input.hlo"), tmp)
            res = run_cmd(argv, cfg)
            cls, sig = classify(res)
            inp = os.path.join(p, "input.hlo")
            top = [l.replace(inp, "{M}").replace(cfg.repo, "{REPO}").replace(tmp, "{TMP}")
                   for l in res.stderr.splitlines() if l.strip()][:2]
            first = top[0] if top else ""
            exp_path = os.path.join(p, "expected.txt")
            if cls in CRASH_CLASSES:
                still += 1
                counts[cls] += 1
                print(f"{d}: still {cls}: {sig}")
                continue
            fixed += 1
            actual = f"exit: {res.rc}\n" + "".join(f"stderr: {l}\n" for l in top)
            if os.path.exists(exp_path):
                with open(exp_path) as f:
                    expected = f.read()
                if expected != actual:
                    mismatched += 1
                    print(f"{d}: MISMATCH: expected {expected.strip()!r}, got {actual.strip()!r}")
                    continue
                print(f"{d}: ok (exit {res.rc}: {first[:120]})")
            else:
                print(f"{d}: fixed (exit {res.rc}: {first[:120]})")
                if write_expected:
                    write_text(exp_path, actual)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"replay: {len(dirs)} findings, {still} still crash, {fixed} no longer crash, "
          f"{mismatched} differ from expected.txt")
    print(f"fuzz: {len(dirs)} inputs, {counts['signal']} aborts, {counts['panic']} panics, "
          f"{counts['stall']} stalls, {counts['bad-exit']} bad exits")
    return 1 if still or mismatched else 0


# ---------------------------------------------------------------------------


def parse_size(s: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]i?B?|)", s.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {s!r}")
    mult = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[m.group(2)[:1].lower()]
    return int(m.group(1)) * mult


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="See the header of this script for details.")
    ap.add_argument("--repo", default=SCRIPT_REPO, help="checkout with testdata/cases (default: this script's)")
    ap.add_argument("--bin-dir", default=None,
                    help="folder with hlo-opt and run_hlo_module (default: REPO/target/release)")
    ap.add_argument("--seconds", type=float, default=60, help="wall-time budget (default 60)")
    ap.add_argument("--seed", type=int, default=None, help="RNG seed (default: time-based, printed)")
    ap.add_argument("--timeout", type=float, default=20, help="per-run timeout in seconds (default 20)")
    ap.add_argument("--mem-limit", type=parse_size, default=4 * 1024**3,
                    help="RLIMIT_AS per run, e.g. 4GiB (default); 0 for none")
    ap.add_argument("--out", default="fuzz-findings", help="findings folder (default ./fuzz-findings)")
    ap.add_argument("--jobs", type=int, default=1, help="parallel runs (default 1)")
    ap.add_argument("--cases", default=None, help="only cases whose name matches this regex")
    ap.add_argument("--baseline", default=None,
                    help="findings folder whose keys are known: they do not make the exit status 1")
    ap.add_argument("--backtraces", dest="backtraces", action="store_true", default=None,
                    help="get backtraces for new findings (gdb for aborts and stalls; default when gdb exists)")
    ap.add_argument("--no-backtraces", dest="backtraces", action="store_false")
    ap.add_argument("--replay", default=None, metavar="DIR", help="rerun saved findings in DIR")
    ap.add_argument("--write-expected", action="store_true",
                    help="with --replay: write expected.txt for findings that no longer crash")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    a = ap.parse_args(argv)

    repo = os.path.abspath(a.repo)
    bin_dir = os.path.abspath(a.bin_dir or os.path.join(repo, "target", "release"))
    for tool in ("hlo-opt", "run_hlo_module"):
        if not os.access(os.path.join(bin_dir, tool), os.X_OK):
            print(f"cli_fuzz: {bin_dir}/{tool} not found or not executable (--bin-dir)", file=sys.stderr)
            return 2
    backtraces = a.backtraces if a.backtraces is not None else bool(gdb_path())
    cfg = Config(bin_dir=bin_dir, repo=repo, timeout=a.timeout, mem_limit=a.mem_limit,
                 out=os.path.abspath(a.out), backtraces=backtraces)
    if a.replay:
        return replay(cfg, a.replay, a.write_expected)

    if a.baseline and os.path.isdir(a.baseline):
        for d in os.listdir(a.baseline):
            m = re.fullmatch(r"[a-z\-]+-([0-9a-f]{10})", d)
            if m:
                cfg.baseline.add(m.group(1))
    cases = load_corpus(repo, a.cases)
    if not cases:
        print(f"cli_fuzz: no cases under {repo}/testdata/cases", file=sys.stderr)
        return 2
    seed = a.seed if a.seed is not None else int(time.time())
    os.makedirs(cfg.out, exist_ok=True)
    if not a.quiet:
        print(f"cli_fuzz: seed {seed}, {len(cases)} cases, {a.seconds:g} s, timeout {a.timeout:g} s, "
              f"jobs {a.jobs}, findings in {cfg.out}", file=sys.stderr, flush=True)
    stats = fuzz(cfg, cases, a.seconds, seed, a.jobs, not a.quiet)
    for key, f in sorted(stats.findings.items(), key=lambda kv: kv[1]["dir"]):
        cls, sig, third, extra = key
        tag = " (baseline)" if f["dir"].rsplit("-", 1)[-1] in cfg.baseline else ""
        tag += " (from an earlier run)" if f.get("old") else ""
        where = f["cause"] or third
        print(f"{f['dir']}: {sig} | {where}{' [' + extra + ']' if extra else ''} | "
              f"{','.join(sorted(f['kinds']))} x{f['hits']}{tag}")
    c = stats.counts
    if c["internal"]:
        print(f"notes: {c['internal']} runs reported an internal error (saved as internal-*)")
    print(f"fuzz: {stats.inputs} inputs, {c['signal']} aborts, {c['panic']} panics, {c['stall']} stalls, "
          f"{c['bad-exit']} bad exits", flush=True)
    return 1 if stats.failing else 0


if __name__ == "__main__":
    sys.exit(main())
