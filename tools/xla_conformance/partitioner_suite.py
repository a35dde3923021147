#!/usr/bin/env python3
"""XLA's SPMD-partitioner unit tests as a held-out suite, proven by execution:
do our sharding propagation and SPMD partitioner (run_hlo_module --partition)
compute what XLA computes on the modules of XLA's own partitioner tests, fall
back to replication, and move more bytes between devices than XLA does?

The tests come from an XLA source checkout given by path
(xla/service/spmd/spmd_partitioner_test.cc). Nothing of XLA's text is written
into this repository; the extracted modules, arguments, expected outputs and
XLA's partitioned modules go to --out (a temporary directory by default).

For each TEST / TEST_P in that file:
  - the module: the string handed to the fixture's `PartitionComputation(
    hlo_string, num_devices, ...)` (a raw string literal, a variable bound to
    one, or an absl::StrFormat / StrCat / StrReplaceAll of literals), and its
    device count. The helper's parameters and defaults are read from its
    declaration in the file (conv_halo_exchange_always_on_lhs=true,
    choose_faster_windowed_einsum=false, unroll_windowed_einsum=false,
    bidirectional_windowed_einsum=false, threshold_for_windowed_einsum_mib=-1
    i.e. XLA's 256, gather/scatter_method=kExplicitBatch,
    total_bytes_windowed_einsum_threshold=nullopt). Options the test passes
    that differ from the defaults are tags (both sides here run the
    defaults: XLA's CPU pipeline, our hlo-opt / run_hlo_module); a call in a
    loop (over partitioning methods) runs once; a test that expects XLA's
    partitioner to fail is tagged `expects-failure`. What cannot be
    reconstructed is "not extracted", with the reason.
  - correctness by execution: seeded random arguments (floats in [-1, 1],
    integers in [-8, 8) or [0, 16), index operands of gather / scatter /
    dynamic-(update-)slice in [0, operand dim) with few repeats, sorted where
    the op promises indices_are_sorted, preds random; bf16 / f16 / f8
    arguments hold exactly representable values).
    XLA's reference (jaxlib, CPU, a child process per module): the module
    with every `sharding=` removed, compiled for 1 device (a scatter input
    passed twice becomes two parameters fed the same array: XLA's CPU
    scatter miscomputes a shared input). A module with collectives,
    partition-id or manual shardings inside (SPMDFullToShardShape regions)
    has no single-device meaning: its reference is XLA's own partitioned
    program run on N CPU devices (arguments split, results assembled by the
    executable's shardings, uneven tiles zero-padded). A module whose entry
    parameters or root are manual has no global semantics at all: skipped.
    Modules using rng (random values), infeed/outfeed/send/recv, more than
    --max-devices devices or a shape over --max-elements elements are not
    executed (bytes only), nor are those our run gives up on for time or
    memory. An entry parameter of tuple shape is split into array
    parameters (and a tuple of them) for both sides, since run_hlo_module
    takes array arguments.
    Ours: `run_hlo_module FILE --partition --devices N --args --expected
    --rtol R --atol A --time-limit T --memory-limit M`; R by the
    lowest-precision float type in the module (f64 1e-6, f32 1e-4, f16 1e-2,
    bf16 5e-2, f8 0.25), A = R * max(1, largest |expected output|).
    A mismatch is examined before it counts as wrong: our unpartitioned
    interpreter against XLA (agrees: the partitioner is at fault); then, for
    float modules, XLA's own partitioned program on N devices (ours matches
    it: the rounding of partitioned partial results, counted correct); then,
    where our interpreter differs from XLA, the module with its float types
    widened to f64 (ours within tolerance of it: XLA's reference is the
    imprecise one, counted correct). Verdicts: correct / wrong (with the
    fault: partitioner, interpreter, both) / our error, by stage (parse,
    verify, propagation, partition, run) / XLA could not run it / not
    executed. "Fell back to replication": the run's `partition.fallbacks`
    is not empty.
  - communication: ours, `hlo-opt FILE --passes=sharding-propagation,
    spmd-partitioning --num-partitions N --stats` (collective_bytes: bytes
    per device summed over the static collectives); XLA's, the same count
    by our `hlo-opt --stats` (no passes) on the module XLA dumps after its
    `spmd-partitioning` pass (compiled for N partitions, use_spmd_partitioning,
    GSPMD, not Shardy), so both are counted by the same code. Modules where
    ours is more are listed with the ratio, the collective kinds that grow
    and the module's main opcode (the first present of scatter, gather,
    select-and-scatter, convolution, sort, dynamic-update-slice, ...).

Prints one line per failure (not extracted, XLA could not run, our error,
wrong, more bytes), then the totals and the failure classes; `--json FILE`
writes every verdict. Exits 0: this is a measurement, not a test. A full run
takes about 15 minutes on two cores (per module: XLA's compiles in a child
process, our partitioner and interpreter); --only REGEX / --limit N select
tests, --timeout bounds each of our runs and --xla-timeout each XLA child.

Usage:
    python3 tools/xla_conformance/partitioner_suite.py --xla PATH_TO_XLA \
        [--run-hlo-module target/release/run_hlo_module] \
        [--hlo-opt target/release/hlo-opt] [--out DIR] [--json FILE] \
        [--only REGEX] [--limit N] [-v]
PATH_TO_XLA is a directory holding xla/service/spmd/spmd_partitioner_test.cc
(an openxla/xla checkout), or that test file itself. Needs jax/jaxlib 0.10.2
(tools/testdata_gen/requirements.txt) and numpy.
"""

import argparse
import collections
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO_ROOT, "tools"))
from propagation_suite import (  # noqa: E402
    NEW_INSTR, PLACEHOLDER, Module, _attr, _balanced, _split_top, split_tests, tokenize_strings)
from check_xla_parses import first_line  # noqa: E402

TEST_FILE = os.path.join("xla", "service", "spmd", "spmd_partitioner_test.cc")
DEFAULT_RUN_HLO_MODULE = os.path.join(REPO_ROOT, "target", "release", "run_hlo_module")
DEFAULT_HLO_OPT = os.path.join(REPO_ROOT, "target", "release", "hlo-opt")

# PartitionComputation's parameters after the module, with the test file's
# defaults; used when its declaration cannot be read.
FALLBACK_HELPER = [
    ("num_devices", None), ("conv_halo_exchange_always_on_lhs", "true"),
    ("choose_faster_windowed_einsum", "false"), ("unroll_windowed_einsum", "false"),
    ("bidirectional_windowed_einsum", "false"), ("threshold_for_windowed_einsum_mib", "-1"),
    ("gather_method", "PartitioningMethod::kExplicitBatch"),
    ("scatter_method", "PartitioningMethod::kExplicitBatch"),
    ("total_bytes_windowed_einsum_threshold", "std::nullopt")]

# Opcodes naming what a module is about, most specific first.
MAIN_OPCODES = [
    "scatter", "gather", "select-and-scatter", "convolution", "sort", "dynamic-update-slice",
    "dynamic-slice", "pad", "reduce-window", "all-to-all", "collective-permute", "all-reduce",
    "all-gather", "reduce-scatter", "rng", "custom-call", "dot", "concatenate", "reverse",
    "cholesky", "triangular-solve", "fft", "reshape", "transpose", "slice", "reduce", "while",
    "conditional", "call", "iota",
    "broadcast", "copy", "tuple"]
COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter",
               "collective-broadcast", "partition-id", "replica-id", "all-reduce-start",
               "all-gather-start", "collective-permute-start")
HOST_OPS = ("infeed", "outfeed", "send", "recv", "send-done", "recv-done")
PASSTHROUGH = ("convert", "reshape", "bitcast", "copy", "broadcast", "transpose", "slice",
               "concatenate", "bitcast-convert")
TOLERANCE = {"f64": 1e-6, "f32": 1e-4, "f16": 1e-2, "bf16": 5e-2, "c64": 1e-4, "c128": 1e-6}
F8_TOLERANCE = 0.25


def test_file(xla):
    return xla if os.path.isfile(xla) else os.path.join(xla, TEST_FILE)


# ---------------------------------------------------------------------------
# The C++ test file: modules, device counts, options.


def helper_parameters(code):
    """[(name, default text or None)] of PartitionComputation's parameters
    after the module, from its declaration in the fixture."""
    m = re.search(r"PartitionComputation\s*\(\s*absl::string_view\s+\w+\s*,", code)
    if not m:
        return FALLBACK_HELPER
    start = code.rfind("(", 0, m.end())
    end = _balanced(code, start, "(", ")")
    params = []
    for p in _split_top(code[start + 1:end - 1])[1:]:
        p = " ".join(p.split())
        default = None
        if "=" in p:
            p, default = [x.strip() for x in p.split("=", 1)]
        params.append((p.split()[-1], default))
    return params or FALLBACK_HELPER


def _resolve_string(expr, body, strings, depth=0):
    """The text of a C++ string expression: a literal, a variable bound to
    one, absl::StrFormat / StrCat / StrReplaceAll of literals and integer
    constants. None when not understood."""
    expr = expr.strip()
    if depth > 5:
        return None
    p = PLACEHOLDER.fullmatch(expr)
    if p:
        return strings[int(p.group(1))]
    if re.fullmatch(r"-?\d+", expr):
        return expr
    if re.fullmatch(r"\w+", expr):
        d = re.search(r"\b%s\s*=\s*([^;]*);" % re.escape(expr), body) or \
            re.search(r"\b%s\s*\(\s*([^;]*)\)\s*;" % re.escape(expr), body)
        return _resolve_string(d.group(1), body, strings, depth + 1) if d else None
    call = re.fullmatch(r"(?:absl::)?(StrFormat|StrCat|StrReplaceAll)\s*\((.*)\)", expr, re.S)
    if not call:
        return None
    args = [a.strip() for a in _split_top(call.group(2)) if a.strip()]
    if call.group(1) == "StrCat":
        parts = [_resolve_string(a, body, strings, depth + 1) for a in args]
        return None if None in parts else "".join(parts)
    if call.group(1) == "StrReplaceAll":
        text = _resolve_string(args[0], body, strings, depth + 1)
        if text is None:
            return None
        pairs = re.findall(r"\{\s*([^{},]+?)\s*,\s*([^{},]+?)\s*\}", ",".join(args[1:]))
        for a, b in pairs:
            a, b = _resolve_string(a, body, strings, depth + 1), _resolve_string(b, body, strings, depth + 1)
            if a is None or b is None:
                return None
            text = text.replace(a, b)
        return text
    fmt = _resolve_string(args[0], body, strings, depth + 1)
    values = [_resolve_string(a, body, strings, depth + 1) for a in args[1:]]
    if fmt is None or None in values:
        return None
    out, k = [], 0
    for piece in re.split(r"(%%|%\d+\$[sd]|%[sd])", fmt):
        if piece == "%%":
            out.append("%")
        elif re.fullmatch(r"%\d+\$[sd]", piece):
            idx = int(piece[1:piece.index("$")]) - 1
            if idx >= len(values):
                return None
            out.append(values[idx])
        elif piece in ("%s", "%d"):
            if k >= len(values):
                return None
            out.append(values[k])
            k += 1
        else:
            out.append(piece)
    return "".join(out)


def _resolve_int(expr, body):
    expr = expr.strip()
    if re.fullmatch(r"\d+", expr):
        return int(expr)
    if re.fullmatch(r"\w+", expr):
        d = re.search(r"\b(?:const\s+)?(?:int64_t|int|int32_t|auto|constexpr\s+\w+)\s+%s\s*=\s*(\d+)\s*;"
                      % re.escape(expr), body)
        if d:
            return int(d.group(1))
    return None


def extract_test(fixture, name, body, strings, helper):
    """Module text, device count, tags and notes of one test."""
    record = {"test": name, "fixture": fixture, "notes": [], "tags": []}
    calls = list(re.finditer(r"\bPartitionComputation\s*\(", body))
    if not calls:
        record["not_extracted"] = "no PartitionComputation(...) call"
        return record
    if len(calls) > 1:
        record["notes"].append("PartitionComputation called %d times; the first is run" % len(calls))
    call = calls[0]
    close = _balanced(body, call.end() - 1, "(", ")")
    args = [a.strip() for a in _split_top(body[call.end():close - 1]) if a.strip()]
    if len(args) < 2:
        record["not_extracted"] = "PartitionComputation without a device count"
        return record
    text = _resolve_string(args[0], body, strings)
    if text is None:
        record["not_extracted"] = "module string not understood: %s" % " ".join(args[0].split())[:80]
        return record
    if "HloModule" not in text and not re.search(r"^\s*ENTRY\b", text, re.M):
        record["not_extracted"] = "the partitioned string holds no HLO module"
        return record
    n = _resolve_int(args[1], body)
    if n is None:
        record["not_extracted"] = "device count not a constant: %s" % args[1]
        return record
    record["module_text"] = text
    record["num_devices"] = n
    options = {}
    for (pname, default), arg in zip(helper[1:], args[2:]):
        value = " ".join(arg.split())
        options[pname] = value
        if default is None or value.replace(" ", "") != default.replace(" ", ""):
            record["tags"].append("%s=%s" % (pname, value))
    record["options"] = options
    loop = None
    for m in re.finditer(r"\bfor\s*\(", body[:call.start()]):
        head_end = _balanced(body, m.end() - 1, "(", ")")
        j = head_end
        while j < len(body) and body[j].isspace():
            j += 1
        if j < len(body) and body[j] == "{" and _balanced(body, j) > call.start():
            loop = " ".join(body[m.end():head_end - 1].split())
    if loop:
        record["tags"].append("in a loop")
        record["notes"].append("PartitionComputation runs in a loop (for (%s)); run once, with "
                               "the defaults" % loop[:80])
    if re.search(r"EXPECT_FALSE\s*\(\s*\w+\s*(?:\.status\(\))?\s*\.ok\(\)\s*\)", body) or \
            re.search(r"EXPECT_THAT\s*\(\s*\w+\.status\(\)[^;]*(?:StatusIs|HasSubstr)", body):
        record["tags"].append("expects-failure")
        record["notes"].append("XLA's test expects its partitioner to fail on this module")
    return record


# ---------------------------------------------------------------------------
# A light reading of an HLO module: instructions with shape, opcode,
# operands and attributes.


class Hlo(Module):
    """`propagation_suite.Module` with the entry-level views this suite uses."""

    def entry_parameters(self):
        params = [i for i in self.computations.get(self.entry, []) if i["opcode"] == "parameter"]
        return sorted(params, key=lambda i: int(i["operands"][0]) if i["operands"] and
                      i["operands"][0].isdigit() else 0)


    def opcodes(self):
        return collections.Counter(i["opcode"] for i in self.instructions.values())

    def users(self):
        out = collections.defaultdict(list)
        for comp in self.computations.values():
            for instr in comp:
                for k, o in enumerate(instr["operands"]):
                    out[o].append((instr, k))
        return out


def array_dims(shape):
    """[(type, dims)] of the arrays in a shape text."""
    return [(m.group(1), [int(x) for x in m.group(2).split(",") if x.strip()])
            for m in re.finditer(r"\b(pred|s\d+|u\d+|f\d+\w*|bf16|c64|c128|token)\[([\d,\s]*)\]", shape)]


def max_elements(hlo):
    best = 0
    for instr in hlo.instructions.values():
        for _, dims in array_dims(instr["shape"]):
            best = max(best, math.prod(dims))
    return best


def _ints_attr(attrs, key):
    v = _attr(attrs, key)
    if not v:
        return []
    return [int(x) for x in v.strip("{}").split(",") if x.strip().lstrip("-").isdigit()]


def index_limits(hlo):
    """{entry parameter number: {"limit": bound, "sorted": index_vector_dim
    or None}} for integer parameters that reach an index operand of gather /
    scatter / dynamic-(update-)slice through shape-only ops; "sorted" when a
    gather / scatter that reads it directly promises indices_are_sorted."""
    users = hlo.users()
    limits = {}

    def dims_of(name):
        instr = hlo.instructions.get(name)
        arrays = array_dims(instr["shape"]) if instr else []
        return arrays[0][1] if arrays else []

    def bound(user, k):
        op, ops = user["opcode"], user["operands"]
        if op == "gather" and k == 1:
            dims = dims_of(ops[0])
            sel = [dims[d] for d in _ints_attr(user["attrs"], "start_index_map") if d < len(dims)]
            return min(sel or dims or [1])
        if op == "scatter" and k == (len(ops) - 1) // 2:
            dims = dims_of(ops[0])
            sel = [dims[d] for d in _ints_attr(user["attrs"], "scatter_dims_to_operand_dims")
                   if d < len(dims)]
            return min(sel or dims or [1])
        if op == "dynamic-slice" and k >= 1:
            dims, sizes = dims_of(ops[0]), _ints_attr(user["attrs"], "dynamic_slice_sizes")
            d = k - 1
            if d < len(dims):
                return max(1, dims[d] - (sizes[d] if d < len(sizes) else 0) + 1)
        if op == "dynamic-update-slice" and k >= 2:
            dims, upd = dims_of(ops[0]), dims_of(ops[1])
            d = k - 2
            if d < len(dims):
                return max(1, dims[d] - (upd[d] if d < len(upd) else 0) + 1)
        return None

    for p in hlo.entry_parameters():
        arrays = array_dims(p["shape"])
        if len(arrays) != 1 or not re.match(r"[su]\d+", arrays[0][0]):
            continue
        seen, todo, best = set(), [p["name"]], None
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for user, k in users.get(name, []):
                b = bound(user, k)
                if b is not None:
                    best = b if best is None else min(best, b)
                elif user["opcode"] in PASSTHROUGH:
                    todo.append(user["name"])
        if best is not None:
            entry = {"limit": best, "sorted": None}
            for user, k in users.get(p["name"], []):
                if user["opcode"] in ("gather", "scatter") and bound(user, k) is not None and \
                        _attr(user["attrs"], "indices_are_sorted") == "true":
                    v = _attr(user["attrs"], "index_vector_dim")
                    entry["sorted"] = int(v) if v and v.isdigit() else len(arrays[0][1])
            limits[int(p["operands"][0])] = entry
    return limits


def strip_shardings(text):
    """The module without any `sharding={...}` attribute (XLA then compiles
    the global computation on one device)."""
    out, i = [], 0
    pattern = re.compile(r",\s*sharding=\{")
    while True:
        m = pattern.search(text, i)
        if not m:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:m.start()])
        i = _balanced(text, m.end() - 1)


def flatten_tuple_parameters(text, hlo):
    """The module with each entry parameter of (one-level) tuple shape split
    into array parameters and a tuple of them; None when there is none, or
    when a nested tuple makes it harder than that."""
    params = hlo.entry_parameters()
    if not any(p["shape"].startswith("(") for p in params):
        return None
    new_number, replacements = 0, {}
    for p in params:
        number = int(p["operands"][0])
        if not p["shape"].startswith("("):
            replacements[p["name"]] = ("renumber", number, new_number)
            new_number += 1
            continue
        inner = p["shape"][1:-1]
        elements = [e.strip() for e in _split_top(inner)]
        if any(e.startswith("(") for e in elements):
            return None
        shardings = None
        if p["sharding"]:
            s = p["sharding"].strip()[1:-1].strip()
            if s.startswith("{"):
                shardings = []
                j = 0
                while j < len(s):
                    if s[j] == "{":
                        k = _balanced(s, j)
                        shardings.append(s[j:k])
                        j = k
                    else:
                        j += 1
            else:
                shardings = [p["sharding"]] * len(elements)
            if len(shardings) != len(elements):
                return None
        replacements[p["name"]] = ("split", number, new_number, elements, shardings)
        new_number += len(elements)
    entry_start = None
    for m in re.finditer(r"^\s*ENTRY\b.*$", text, re.M):
        entry_start = m.start()
    if entry_start is None:
        return None
    head, entry = text[:entry_start], text[entry_start:]
    for name, rep in replacements.items():
        m = re.search(r"^(\s*)%?" + re.escape(name) + r"\s*=\s*", entry, re.M)
        if not m:
            return None
        # The parameter instruction ends where the next instruction starts.
        nxt = re.compile(NEW_INSTR.pattern + r"|^\s*\}", re.M).search(entry, m.end())
        end = nxt.start() if nxt else len(entry)
        indent = m.group(1).replace("\n", "")
        if rep[0] == "renumber":
            old = entry[m.start():end]
            new = re.sub(r"parameter\(\s*%d\s*\)" % rep[1], "parameter(%d)" % rep[2], old, count=1)
        else:
            _, _, first, elements, shardings = rep
            parts = []
            for k, e in enumerate(elements):
                s = ", sharding=%s" % shardings[k] if shardings else ""
                parts.append("%s%s.flat%d = %s parameter(%d)%s\n" % (indent, name, k, e, first + k, s))
            s = ", sharding=%s" % hlo.instructions[name]["sharding"] if shardings else ""
            parts.append("%s%s = (%s) tuple(%s)%s\n" % (
                indent, name, ", ".join(elements),
                ", ".join("%s.flat%d" % (name, k) for k in range(len(elements))), s))
            lead = "\n" if entry[m.start()] == "\n" else ""
            new = lead + "".join(parts)
        entry = entry[:m.start()] + new + entry[end:]
    # The ENTRY signature (if spelled) no longer holds: drop it.
    entry = re.sub(r"^(\s*ENTRY\s+%?[\w.\-]+)\s*\(.*?\)\s*->\s*[^{]*\{", r"\1 {", entry, count=1,
                   flags=re.M)
    head = re.sub(r",?\s*entry_computation_layout=\{[^\n]*?\}(?=[,\s]*$|,\s*\w+=)", "", head,
                  count=1, flags=re.M)
    return head + entry


def unshare_scatter_operands(text, hlo):
    """The module with each repeated input of a variadic scatter
    (`scatter(%p, %p, ...)`) replaced by a fresh entry parameter fed the
    same argument (or, inside a nested computation, a copy): XLA's CPU
    scatter returns the same (wrong) array for both outputs when an input
    is shared, and its simplifier removes a copy. The meaning is the same.
    Returns (text, [for each appended parameter, the parameter it copies])."""
    extra = []
    params = {i["name"]: int(i["operands"][0]) for i in hlo.entry_parameters()}
    count = len(params)
    for instr in list(hlo.instructions.values()):
        if instr["opcode"] != "scatter":
            continue
        k = (len(instr["operands"]) - 1) // 2
        inputs = instr["operands"][:k]
        if len(set(inputs)) == len(inputs):
            continue
        m = re.search(r"^([ \t]*)(ROOT\s+)?%?" + re.escape(instr["name"]) + r"\s*=", text, re.M)
        if not m:
            continue
        start = text.index("scatter(", m.end())
        end = _balanced(text, start + len("scatter"), "(", ")")
        operands = _split_top(text[start + len("scatter("):end - 1])
        seen, lines = set(), []
        for j in range(k):
            name = operands[j].strip().split()[-1].lstrip("%")
            if name in seen and name in hlo.instructions:
                shape = hlo.instructions[name]["shape"]
                fresh = "%s.unshared%d" % (name, j)
                if name in params and instr["computation"] == hlo.entry:
                    lines.append("%s%s = %s parameter(%d)\n" % (m.group(1), fresh, shape, count))
                    extra.append(params[name])
                    count += 1
                else:
                    lines.append("%s%s = %s copy(%s)\n" % (m.group(1), fresh, shape, name))
                operands[j] = " " + fresh if j else fresh
            seen.add(name)
        if lines:
            text = (text[:m.start()] + "".join(lines) + text[m.start():start] + "scatter(" +
                    ",".join(operands) + ")" + text[end:])
    return text, extra


def main_opcode(hlo):
    ops = hlo.opcodes()
    for op in MAIN_OPCODES:
        if ops.get(op):
            return op
    return "elementwise"


def execution_plan(record, hlo, args):
    """("1dev" | "npart" | None, reason)."""
    ops = hlo.opcodes()
    n = record["num_devices"]
    host = [op for op in HOST_OPS if ops.get(op)]
    if host:
        return None, "xla", "host transfer (%s): not executable here" % ", ".join(host)
    if ops.get("rng") or ops.get("rng-bit-generator"):
        return None, "xla", "random numbers (rng): outputs not comparable"
    if n > args.max_devices:
        return None, "large", "too large to execute: %d devices (over --max-devices %d)" % (
            n, args.max_devices)
    elements = max_elements(hlo)
    if elements > args.max_elements:
        return None, "large", "too large to execute: a shape of %d elements (over --max-elements %d)" % (
            elements, args.max_elements)
    entry = hlo.computations.get(hlo.entry, [])
    boundary = [i for i in entry if i["opcode"] == "parameter" or i["root"]]
    if any(i["sharding"] and "manual" in i["sharding"] for i in boundary):
        return None, "xla", "manual sharding on an entry parameter or the root: no global semantics"
    text = record["module_text"]
    if "manual" in text or "SPMDFullToShardShape" in text or "SPMDShardToFullShape" in text:
        return "npart", None, "manual region inside: XLA's partitioned program is the reference"
    collectives = [op for op in COLLECTIVES if ops.get(op)]
    if collectives:
        return "npart", None, ("%s across partitions: XLA's partitioned program is the reference"
                               % ", ".join(collectives))
    return "1dev", None, None


def output_scale(expected_dir):
    """The largest finite magnitude in the float outputs."""
    import numpy as np
    scale, k = 0.0, 0
    while os.path.exists(os.path.join(expected_dir, "out%d.npy" % k)):
        a = np.load(os.path.join(expected_dir, "out%d.npy" % k))
        if a.dtype.kind in "fc" and a.size:
            finite = np.abs(a[np.isfinite(a)])
            if finite.size:
                scale = max(scale, float(finite.max()))
        k += 1
    return scale


def tolerance(hlo):
    """By the lowest-precision float type anywhere in the module (a bf16
    scatter converted to an f32 result rounds as bf16)."""
    types = {t for i in hlo.instructions.values() for t, _ in array_dims(i["shape"])}
    tol = 0.0
    for t in types:
        if t.startswith("f8"):
            tol = max(tol, F8_TOLERANCE)
        elif t in TOLERANCE:
            tol = max(tol, TOLERANCE[t])
    return tol or 1e-5


# ---------------------------------------------------------------------------
# The XLA child process: arguments, reference outputs, partitioned module.


def _save_npy(np, path, a):
    """bf16 / f8 travel as float32 holding the same values (our npy
    convention)."""
    if a.dtype.name == "bfloat16" or a.dtype.name.startswith("float8") or a.dtype.kind == "V":
        a = a.astype(np.float32)
    np.save(path, a)


def _make_args(np, shapes, seed, limits):
    out = []
    for i, shape in enumerate(shapes):
        if shape.is_tuple():
            raise ValueError("parameter %d has a tuple shape" % i)
        dtype = shape.numpy_dtype()
        dims = tuple(shape.dimensions())
        size = int(np.prod(dims)) if dims else 1
        rng = np.random.default_rng(seed * 1000 + i)
        kind = np.dtype(dtype).kind
        if dtype == np.bool_:
            a = rng.random(dims) < 0.5
        elif kind in "iu":
            if i in limits:
                limit = max(1, int(limits[i]["limit"]))
                reps = -(-size // limit)
                flat = np.concatenate([rng.permutation(limit) for _ in range(reps)])[:size]
                a = flat.reshape(dims).astype(dtype)
                vdim = limits[i]["sorted"]
                if vdim is not None and a.ndim:
                    # indices_are_sorted: index vectors in lexicographic order.
                    if vdim >= a.ndim:
                        a = a[..., None]
                    moved = np.moveaxis(a, vdim, -1)
                    rows = moved.reshape(-1, moved.shape[-1])
                    rows = rows[np.lexsort(rows.T[::-1])]
                    a = np.moveaxis(rows.reshape(moved.shape), -1, vdim).reshape(dims)
            elif kind == "u":
                a = rng.integers(0, 16, size=dims).astype(dtype)
            else:
                a = rng.integers(-8, 8, size=dims).astype(dtype)
        elif kind == "c":
            a = (rng.uniform(-1, 1, dims) + 1j * rng.uniform(-1, 1, dims)).astype(dtype)
        else:
            a = np.asarray(rng.uniform(-1, 1, dims).astype(np.float32)).astype(dtype)
        out.append(np.asarray(a, dtype=dtype).reshape(dims))
    return out


def _leaves(shape):
    if shape.is_tuple():
        return [leaf for s in shape.tuple_shapes() for leaf in _leaves(s)]
    return [shape]


def _tiles(xc, np, op_sharding, dims, n):
    """Per device: the index (tuple of slices) of its tile and the padded
    tile shape; None for a whole-array (replicated / maximal) sharding."""
    h = xc.HloSharding.from_proto(op_sharding)
    if h.is_replicated() or h.is_maximal() or not h.is_tiled():
        return None
    tdims = list(h.tile_assignment_dimensions())
    devices = list(h.tile_assignment_devices())
    rank = len(dims)
    tile = [-(-d // t) for d, t in zip(dims, tdims[:rank])]
    out = [None] * n
    for flat, device in enumerate(devices):
        coord, rest = [], flat
        for t in reversed(tdims):
            coord.append(rest % t)
            rest //= t
        coord.reverse()
        index = tuple(slice(min(c * s, d), min((c + 1) * s, d))
                      for c, s, d in zip(coord[:rank], tile, dims))
        out[device] = index
    return out, tile


def _run_partitioned(jax, xc, np, exe, devices, args, result_shapes, n):
    from jax._src import sharding_impls
    inputs = []
    for a, op in zip(args, exe.get_parameter_shardings()):
        dims = list(a.shape)
        t = _tiles(xc, np, op, dims, n)
        if t is None:
            shards, padded = [a] * n, dims
        else:
            index, tile = t
            shards = []
            for d in range(n):
                piece = a[index[d]] if index[d] is not None else np.zeros(tile, a.dtype)
                pad = [(0, s - p) for s, p in zip(tile, piece.shape)]
                shards.append(np.pad(piece, pad) if any(p[1] for p in pad) else piece)
            padded = [s * k for s, k in zip(tile, xc.HloSharding.from_proto(op)
                                            .tile_assignment_dimensions()[:len(dims)])]
        sharding = sharding_impls.GSPMDSharding(tuple(devices), op)
        bufs = [jax.device_put(np.ascontiguousarray(s), devices[d]) for d, s in enumerate(shards)]
        inputs.append(jax.make_array_from_single_device_arrays(tuple(padded), sharding, bufs))
    results = exe.execute_sharded(inputs)
    per_output = results.disassemble_into_single_device_arrays()
    outs = []
    for k, (shards, op) in enumerate(zip(per_output, exe.get_output_shardings())):
        dims = list(result_shapes[k].dimensions())
        t = _tiles(xc, np, op, dims, n)
        h = xc.HloSharding.from_proto(op)
        if t is None:
            device = h.tile_assignment_devices()[0] if h.is_maximal() and not h.is_replicated() \
                and h.tile_assignment_devices() else 0
            outs.append(np.asarray(shards[device]))
            continue
        index, tile = t
        full = np.zeros(dims, dtype=np.asarray(shards[0]).dtype)
        for d in range(n):
            if index[d] is None:
                continue
            piece = np.asarray(shards[d])
            full[index[d]] = piece[tuple(slice(0, sl.stop - sl.start) for sl in index[d])]
        outs.append(full)
    return outs


def child_main(job_path):
    job = json.load(open(job_path))
    result = {"steps": {}}

    def save():
        with open(job["result"] + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(job["result"] + ".tmp", job["result"])

    import numpy as np
    import jax
    jax.config.update("jax_enable_x64", True)
    from jax._src.lib import xla_client as xc
    n = job["num_devices"]
    text = open(job["module"]).read()
    try:
        module = xc.hlo.hlo_module_from_text(text)
        program = xc.XlaComputation(module.as_serialized_hlo_module_proto()).program_shape()
    except Exception as e:
        result["parse_error"] = first_line(e)
        save()
        return 0
    param_shapes = list(program.parameter_shapes())
    result_leaves = _leaves(program.result_shape())
    try:
        result["output_types"] = [str(s.numpy_dtype()) for s in result_leaves]
    except Exception as e:  # a token result
        result["output_types"] = "unknown: %s" % first_line(e)
    args = None
    if job.get("mode"):
        try:
            limits = {int(k): v for k, v in job["limits"].items()}
            args = _make_args(np, param_shapes, job["seed"], limits)
            os.makedirs(job["args_dir"], exist_ok=True)
            for i, a in enumerate(args):
                _save_npy(np, os.path.join(job["args_dir"], "arg%d.npy" % i), a)
            result["args"] = True
        except Exception as e:
            result["args_error"] = first_line(e)
            args = None
        save()

    def compile_partitioned(dump_dir):
        mlir = xc._xla.mlir.hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
        options = xc.CompileOptions()
        build = options.executable_build_options
        build.num_partitions = n
        build.num_replicas = 1
        build.use_spmd_partitioning = True
        build.use_shardy_partitioner = False
        build.device_assignment = xc.DeviceAssignment.create(np.arange(n).reshape(1, n))
        if dump_dir:
            build.debug_options.xla_dump_to = dump_dir
            build.debug_options.xla_dump_hlo_pass_re = "spmd-partitioning"
        devices = jax.devices()[:n]
        exe = jax.devices()[0].client.compile_and_load(mlir, xc.DeviceList(tuple(devices)), options)
        return exe, devices

    def save_outputs(outs, where=None):
        where = where or job["expected_dir"]
        os.makedirs(where, exist_ok=True)
        for k, o in enumerate(outs):
            _save_npy(np, os.path.join(where, "out%d.npy" % k), np.asarray(o))

    for step in job["steps"]:
        result["steps"][step] = "started"
        save()
        t0 = time.time()
        try:
            if step == "reference":
                if args is None:
                    raise RuntimeError("no arguments")
                stripped = strip_shardings(text)
                stripped, extra = unshare_scatter_operands(stripped, Hlo(stripped))
                if extra:
                    result["reference_note"] = ("a scatter input passed twice is given to XLA as "
                                                "two parameters (XLA's CPU scatter miscomputes a "
                                                "shared input)")
                single = xc.hlo.hlo_module_from_text(stripped)
                mlir = xc._xla.mlir.hlo_to_stablehlo(single.as_serialized_hlo_module_proto())
                dev = jax.devices()[0]
                exe = dev.client.compile_and_load(mlir, xc.DeviceList((dev,)), xc.CompileOptions())
                outs = exe.execute([jax.device_put(a, dev) for a in args + [args[i] for i in extra]])
                save_outputs(outs)
            elif step == "referee":
                # The same computation in f64 (f32 types widened), from the
                # same (f32) arguments: who is closer, XLA's f32 or ours?
                wide_text = re.sub(r"\b(?:f32|bf16|f16)\[", "f64[", strip_shardings(text))
                wide_text, extra = unshare_scatter_operands(wide_text, Hlo(wide_text))
                wide = xc.hlo.hlo_module_from_text(wide_text)
                mlir = xc._xla.mlir.hlo_to_stablehlo(wide.as_serialized_hlo_module_proto())
                dev = jax.devices()[0]
                exe = dev.client.compile_and_load(mlir, xc.DeviceList((dev,)), xc.CompileOptions())
                wide_args = [np.load(os.path.join(job["args_dir"], "arg%d.npy" % i)) for i in
                             range(len(param_shapes))]
                wide_args = [a.astype(np.float64) if a.dtype.kind == "f" else a for a in wide_args]
                outs = exe.execute([jax.device_put(a, dev) for a in
                                    wide_args + [wide_args[i] for i in extra]])
                os.makedirs(job["referee_dir"], exist_ok=True)
                for k, o in enumerate(outs):
                    np.save(os.path.join(job["referee_dir"], "out%d.npy" % k), np.asarray(o))
            elif step == "partitioned":
                dump_dir = job["dump_dir"]
                shutil.rmtree(dump_dir, ignore_errors=True)
                try:
                    exe, devices = compile_partitioned(dump_dir)
                finally:
                    # The partitioner runs before the CPU backend: its dump
                    # is there even when a later stage of the compile fails.
                    found = sorted(glob.glob(os.path.join(dump_dir, "*after_spmd-partitioning*.txt")))
                    if found:
                        shutil.copyfile(found[-1], job["xla_partitioned"])
                        result["xla_partitioned"] = job["xla_partitioned"]
                    else:
                        result["dump_error"] = "no module after spmd-partitioning in the dump"
                    shutil.rmtree(dump_dir, ignore_errors=True)
                if job.get("mode") == "npart" or job.get("partitioned_out"):
                    if args is None:
                        raise RuntimeError("no arguments")
                    outs = _run_partitioned(jax, xc, np, exe, devices, args, result_leaves, n)
                    save_outputs(outs, job.get("partitioned_out"))
            result["steps"][step] = "done"
        except Exception as e:
            result["steps"][step] = "error"
            result[step + "_error"] = first_line(e)[:600]
        result[step + "_s"] = round(time.time() - t0, 3)
        save()
    return 0


def run_xla_child(job, timeout):
    """Runs the child for job["steps"]; a crashed step is recorded and the
    remaining ones rerun. Returns the child's result dict."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=%d" % max(1, job["num_devices"])
    env["JAX_PLATFORMS"] = "cpu"
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    steps = list(job["steps"])
    merged = {"steps": {}}
    while steps:
        job = dict(job, steps=steps)
        with open(job["job"], "w") as f:
            json.dump(job, f)
        if os.path.exists(job["result"]):
            os.remove(job["result"])
        crash = None
        try:
            proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", job["job"]],
                                  env=env, capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0:
                tail = [l for l in proc.stderr.strip().splitlines() if l.strip()]
                crash = "XLA crashed (exit %d): %s" % (proc.returncode, (tail[-1] if tail else "")[:300])
        except subprocess.TimeoutExpired:
            crash = "XLA timed out after %ds" % timeout
        result = {"steps": {}}
        if os.path.exists(job["result"]):
            with open(job["result"]) as f:
                result = json.load(f)
        for k, v in result.items():
            if k == "steps":
                merged["steps"].update(v)
            else:
                merged[k] = v
        if "parse_error" in result:
            return merged
        remaining = [s for s in steps if result["steps"].get(s) not in ("done", "error")]
        if crash:
            if remaining:
                merged["steps"][remaining[0]] = "error"
                merged[remaining[0] + "_error"] = crash
                remaining = remaining[1:]
            elif not result["steps"]:
                merged["crash"] = crash
                return merged
        if not crash and remaining:
            merged["crash"] = "the XLA child stopped before %s" % ", ".join(remaining)
            return merged
        # A rerun makes the same arguments (same seed).
        steps = remaining
    return merged


# ---------------------------------------------------------------------------
# Ours.


def stage_of(message):
    if re.search(r"time limit|timed out", message, re.I):
        return "time limit"
    if re.match(r"\S+:\d+:\d+:", message):
        return "parse"
    m = re.search(r"pass '([\w\-]+)' failed", message)
    if m:
        return {"sharding-propagation": "propagation",
                "spmd-partitioning": "partition"}.get(m.group(1), m.group(1))
    if re.search(r"verif", message, re.I):
        return "verify"
    if re.search(r"missing argument file|argument|parameter \d+ .*shape", message):
        return "arguments"
    return "run"


def run_ours(cmd, timeout):
    """(rc, json line or None, message)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, None, "timed out after %ds (our process killed)" % timeout
    line = None
    for l in reversed(proc.stdout.strip().splitlines()):
        if l.startswith("{"):
            try:
                line = json.loads(l)
                break
            except ValueError:
                pass
    message = ""
    if line and "error" in line:
        message = line["error"]
    elif proc.returncode not in (0, 1) or (proc.returncode != 0 and not line):
        tail = [l for l in proc.stderr.strip().splitlines() if l.strip()]
        message = "exit %d%s: %s" % (proc.returncode, " (crash?)" if proc.returncode not in (0, 1) else "",
                                     " ".join(tail[-3:])[:500])
    return proc.returncode, line, message.split("\n")[0]


def hlo_opt_stats(hlo_opt, path, n, passes, timeout):
    cmd = [hlo_opt, path, "--stats"]
    if passes:
        cmd += ["--passes=" + passes, "--num-partitions", str(n)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timed out after %ds" % timeout
    if proc.returncode != 0:
        lines = [l.strip() for l in proc.stderr.strip().splitlines() if l.strip()]
        first = next((l for l in lines if "error" in l.lower()), lines[0] if lines else "")
        first = re.sub(r"^hlo-opt(?:-\w+)?: ", "", first)
        first = re.sub(r"^error: ", "", first)
        return None, first.replace(os.path.dirname(path) + os.sep, "")
    try:
        return json.loads(proc.stdout.strip().splitlines()[-1]), None
    except (ValueError, IndexError):
        return None, "no JSON from hlo-opt --stats"


def message_class(message):
    """A message with names, numbers and shapes blanked, for grouping."""
    m = re.sub(r"\S+\.hlo:\d+:\d+:", "FILE:", message)
    m = re.sub(r"\b(?:pred|s\d+|u\d+|f\d+\w*|bf16|c64|c128)\[[\d,\s]*\](?:\{[\d,]*\})?", "SHAPE", m)
    m = re.sub(r"%[\w.\-]+", "%X", m)
    m = re.sub(r"\{[^{}]*\}", "{..}", m)
    m = re.sub(r"\d+(\.\d+)?", "N", m)
    return m[:110]


def evaluate(index, record, args, out_dir):
    base = "t%03d_%s" % (index, record["test"])
    n = record["num_devices"]
    text = record["module_text"]
    source = os.path.join(out_dir, base + ".hlo")
    with open(source, "w", encoding="utf-8") as f:
        f.write(text)
    record["file"] = source
    hlo = Hlo(text)
    record["main_opcode"] = main_opcode(hlo)
    mode, skip_kind, reason = execution_plan(record, hlo, args)
    record["exec_mode"] = mode
    if reason and mode:
        record["notes"].append(reason)
    run_file = source
    flat = flatten_tuple_parameters(text, hlo)
    if flat is not None:
        run_file = os.path.join(out_dir, base + ".flat.hlo")
        with open(run_file, "w", encoding="utf-8") as f:
            f.write(flat)
        record["notes"].append("tuple entry parameters split into array parameters for execution")
        hlo_run = Hlo(flat)
    else:
        hlo_run = hlo
    record["run_file"] = run_file
    work = os.path.join(out_dir, base + ".work")
    os.makedirs(work, exist_ok=True)
    job = {"job": os.path.join(work, "job.json"), "result": os.path.join(work, "xla.json"),
           "num_devices": n, "mode": mode, "seed": zlib.crc32(record["test"].encode()) & 0xffff,
           "limits": {str(k): v for k, v in index_limits(hlo_run).items()},
           "args_dir": os.path.join(work, "args"), "expected_dir": os.path.join(work, "expected"),
           "dump_dir": os.path.join(work, "dump"),
           "xla_partitioned": os.path.join(out_dir, base + ".xla_partitioned.hlo")}
    steps = []
    if mode == "1dev":
        steps.append("reference")
    steps.append("partitioned")
    # The reference runs on the execution file, the partitioned compile on
    # XLA's original module (what bytes compare); an npart reference uses
    # the execution file for both.
    t0 = time.time()
    xla = {"steps": {}}
    if mode is None:
        xla = run_xla_child(dict(job, module=source, steps=["partitioned"]), args.xla_timeout)
    elif mode == "npart" or run_file == source:
        xla = run_xla_child(dict(job, module=run_file, steps=steps), args.xla_timeout)
    else:
        ref = run_xla_child(dict(job, module=run_file, steps=["reference"]), args.xla_timeout)
        part = run_xla_child(dict(job, module=source, mode=None, steps=["partitioned"],
                                  result=job["result"] + ".2"), args.xla_timeout)
        xla = ref
        for k, v in part.items():
            if k == "steps":
                xla["steps"].update(v)
            elif k not in ("args", "args_error", "output_types") or k not in xla:
                xla[k] = v
    record["xla_s"] = round(time.time() - t0, 2)
    record["xla"] = {k: v for k, v in xla.items() if k != "steps"}
    record["xla"]["steps"] = xla.get("steps", {})

    # -- execution verdict
    tol = tolerance(hlo_run)
    record["tolerance"] = tol
    verdict, message = None, None
    if mode is None:
        verdict = "skip-large" if skip_kind == "large" else "skip-xla"
        message = reason
    elif "parse_error" in xla:
        verdict, message = "skip-xla", "XLA's parser refuses it: " + xla["parse_error"]
    elif "args_error" in xla:
        verdict, message = "skip-xla", "arguments: " + xla["args_error"]
    else:
        ref_step = "reference" if mode == "1dev" else "partitioned"
        status = xla["steps"].get(ref_step)
        if status != "done":
            verdict = "skip-xla"
            message = "XLA could not run it%s: %s" % (
                " (partitioned for %d)" % n if mode == "npart" else "",
                xla.get(ref_step + "_error") or xla.get("crash") or status or "not run")
    limits = ["--time-limit", str(args.timeout), "--memory-limit", args.memory_limit]
    ours_cmd = [args.run_hlo_module, run_file, "--partition", "--devices", str(n)] + limits
    atol = tol
    if verdict is None:
        # atol relative to the outputs' scale: a sum of many terms rounds
        # at the scale of its terms, not of its (possibly cancelled) value.
        atol = tol * max(1.0, output_scale(job["expected_dir"]))
        record["atol"] = atol
    tolerances = ["--rtol", str(tol), "--atol", "%.6g" % atol]
    if verdict is None:
        cmd = ours_cmd + ["--args", job["args_dir"], "--expected", job["expected_dir"]] + tolerances
        rc, line, msg = run_ours(cmd, args.timeout + 30)
        record["ours_run"] = line
        if line and "partition" in line:
            record["fallbacks"] = line["partition"].get("fallbacks", [])
        if line and line.get("all_matched") is True:
            verdict = "correct"
        elif line and line.get("all_matched") is False:
            verdict = "wrong"
            bad = [o for o in line.get("outputs", []) if not o.get("matched")]
            o = bad[0] if bad else {}
            message = "output %s: %s" % (o.get("index"), o.get("error") or (
                "%s of %s mismatch, max abs err %.3g, first %s" % (
                    o.get("mismatches"), o.get("shape"), o.get("max_abs_err") or 0.0,
                    o.get("first_mismatch"))))
            diagnose_wrong(record, args, run_file, job, limits, tolerances, ours_cmd, work)
            if record.get("verdict_before_referee"):
                verdict, message = "correct", "%s (%s)" % (record["referee"], message)
        elif re.search(r"time limit|timed out|memory limit", msg or ""):
            verdict = "skip-large"
            message = "too large to execute: ours: %s" % msg
        elif rc == -9:
            verdict = "skip-large"
            message = "too large to execute: ours was killed (SIGKILL: out of memory?)"
        else:
            verdict = "error"
            message = msg or "no result (exit %s)" % rc
            record["stage"] = stage_of(message)
    elif verdict == "skip-xla" and args.run_skipped:
        # Still see whether ours partitions and runs it (no reference).
        rc, line, msg = run_ours(ours_cmd, args.timeout + 30)
        if line and "partition" in line:
            record["fallbacks"] = line["partition"].get("fallbacks", [])
        record["ours_unverified"] = "ran" if rc == 0 else (msg or "exit %s" % rc)
    record["verdict"] = verdict
    record["message"] = message

    # -- communication
    ours, err = hlo_opt_stats(args.hlo_opt, source, n, "sharding-propagation,spmd-partitioning",
                              args.timeout)
    record["bytes"] = {}
    if ours is None:
        record["bytes"]["ours_error"] = err
    else:
        record["bytes"]["ours"] = ours["collective_bytes"]
        record["bytes"]["ours_by_op"] = ours.get("collective_bytes_by_op", {})
    xla_file = xla.get("xla_partitioned")
    if xla_file and os.path.exists(xla_file):
        theirs, err = hlo_opt_stats(args.hlo_opt, xla_file, n, None, args.timeout)
        if theirs is None:
            record["bytes"]["xla_error"] = "our hlo-opt on XLA's partitioned module: " + err
        else:
            record["bytes"]["xla"] = theirs["collective_bytes"]
            record["bytes"]["xla_by_op"] = theirs.get("collective_bytes_by_op", {})
    else:
        record["bytes"]["xla_error"] = "XLA did not partition it: %s" % (
            xla.get("partitioned_error") or xla.get("dump_error") or xla.get("parse_error")
            or xla.get("crash") or "no dump")
    b = record["bytes"]
    if "ours" in b and "xla" in b:
        b["compare"] = "less" if b["ours"] < b["xla"] else ("same" if b["ours"] == b["xla"] else "more")
        if b["compare"] == "more":
            grown = {}
            for op in set(b["ours_by_op"]) | set(b["xla_by_op"]):
                d = b["ours_by_op"].get(op, 0) - b["xla_by_op"].get(op, 0)
                if d > 0:
                    grown[op] = d
            b["grown"] = dict(sorted(grown.items(), key=lambda kv: -kv[1]))
    if not args.keep_work:
        for sub in ("dump",):
            shutil.rmtree(os.path.join(work, sub), ignore_errors=True)
    return record


def second_opinion(record, args, run_file, job, tolerances, ours_cmd, work):
    """For a module with floats and a single-device reference: XLA's own
    partitioned program, run on N devices. True (the verdict becomes
    correct) when ours matches it: the difference from the single-device
    result is the rounding of partitioned partial results, which XLA's
    partitioned program shares."""
    if record.get("exec_mode") != "1dev" or not re.search(
            r"\b(?:bf16|f16|f32|f64|f8\w*)\[", open(run_file).read()):
        return False
    out_dir = os.path.join(work, "xla_partitioned_out")
    shutil.rmtree(out_dir, ignore_errors=True)
    result = run_xla_child(dict(job, module=run_file, steps=["partitioned"], mode="1dev",
                                partitioned_out=out_dir, result=job["result"] + ".second",
                                xla_partitioned=os.path.join(work, "second.hlo")),
                           args.xla_timeout)
    if result["steps"].get("partitioned") != "done":
        record["second_opinion"] = "XLA's partitioned program did not run: %s" % (
            result.get("partitioned_error") or result.get("crash"))
        return False
    _, line, _ = run_ours(ours_cmd + ["--args", job["args_dir"], "--expected", out_dir] + tolerances,
                          args.timeout + 30)
    if line and line.get("all_matched"):
        record["second_opinion"] = "ours matches XLA's partitioned program"
        record["verdict_before_referee"] = "wrong"
        record["referee"] = "matches XLA's own partitioned program"
        record["diagnosis"] = ("precision (XLA's partitioned program differs from its single-device "
                               "result as ours does)")
        return True
    record["second_opinion"] = "ours differs from XLA's partitioned program too"
    return False


def referee(record, args, run_file, job, ours_cmd, work):
    """For an all-f32 module where our interpreter differs from XLA: the
    module in f64 (XLA, one device) decides. True (and the verdict becomes
    correct) when our partitioned outputs are within tolerance of the f64
    outputs."""
    text = open(run_file).read()
    if record.get("exec_mode") != "1dev" or re.search(r"\b(?:f8\w*|c64|c128)\[", text) \
            or "bitcast-convert" in text:
        return False
    import numpy as np
    ref_dir, ours_dir = os.path.join(work, "referee"), os.path.join(work, "ours")
    result = run_xla_child(dict(job, module=run_file, steps=["referee"], mode=None,
                                referee_dir=ref_dir, result=job["result"] + ".referee"),
                           args.xla_timeout)
    if result["steps"].get("referee") != "done":
        record["referee"] = "f64 reference failed: %s" % result.get("referee_error")
        return False
    shutil.rmtree(ours_dir, ignore_errors=True)
    run_ours(ours_cmd + ["--args", job["args_dir"], "--output", ours_dir], args.timeout + 30)
    tol = record["tolerance"]
    ours_err = xla_err = 0.0
    ok = True
    k = 0
    while os.path.exists(os.path.join(ref_dir, "out%d.npy" % k)):
        r = np.load(os.path.join(ref_dir, "out%d.npy" % k)).astype(np.float64)
        path = os.path.join(ours_dir, "out%d.npy" % k)
        if not os.path.exists(path):
            return False
        o = np.load(path).astype(np.float64)
        x = np.load(os.path.join(job["expected_dir"], "out%d.npy" % k)).astype(np.float64)
        if o.shape != r.shape:
            return False
        finite = np.isfinite(r)
        if r.size:
            ours_err = max(ours_err, float(np.max(np.abs(o - r), where=finite, initial=0.0)))
            xla_err = max(xla_err, float(np.max(np.abs(x - r), where=finite, initial=0.0)))
        ok &= bool(np.all(np.where(finite, np.abs(o - r) <= record.get("atol", tol) + tol * np.abs(r),
                                   (np.isnan(o) & np.isnan(r)) | (o == r))))
        k += 1
    record["referee"] = "f64: ours off by %.3g, XLA's f32 off by %.3g" % (ours_err, xla_err)
    if ok:
        record["verdict_before_referee"] = "wrong"
        record["diagnosis"] = "XLA's f32 reference is imprecise (ours within tolerance of f64)"
        return True
    return False


def diagnose_wrong(record, args, run_file, job, limits, tolerances, ours_cmd, work):
    """Whose fault is a wrong result? Our unpartitioned interpreter against
    XLA's reference, and our partitioned run against our interpreter."""
    interp_out = os.path.join(work, "interpreter")
    shutil.rmtree(interp_out, ignore_errors=True)
    _, iline, imsg = run_ours(
        [args.run_hlo_module, run_file, "--args", job["args_dir"], "--expected", job["expected_dir"],
         "--output", interp_out] + tolerances + limits, args.timeout + 30)
    if not (iline and "all_matched" in iline):
        record["interpreter_agrees"] = None
        record["interpreter_error"] = imsg or "no result"
        record["diagnosis"] = "unknown (our interpreter fails: %s)" % (imsg or "no result")
        return
    record["interpreter_agrees"] = bool(iline["all_matched"])
    if second_opinion(record, args, run_file, job, tolerances, ours_cmd, work):
        return
    if record["interpreter_agrees"]:
        record["diagnosis"] = "partitioner (our interpreter agrees with XLA)"
        return
    if referee(record, args, run_file, job, ours_cmd, work):
        return
    _, pline, _ = run_ours(ours_cmd + ["--args", job["args_dir"], "--expected", interp_out]
                              + tolerances, args.timeout + 30)
    record["partitioned_matches_interpreter"] = bool(pline and pline.get("all_matched"))
    if record["partitioned_matches_interpreter"]:
        record["diagnosis"] = "interpreter (partitioned = our interpreter != XLA)"
    else:
        record["diagnosis"] = "both (partitioned != our interpreter != XLA)"


def ratio_text(b):
    return "x%.2f" % (b["ours"] / b["xla"]) if b["xla"] else "xla 0"


def report(record, verbose):
    name, v, msg = record["test"], record.get("verdict"), record.get("message")
    tags = " [%s]" % ", ".join(record["tags"]) if record["tags"] else ""
    n = record.get("num_devices")
    if v == "wrong":
        print("wrong       %s (%d dev, %s)%s: %s; fault: %s" % (
            name, n, record["main_opcode"], tags, msg, record.get("diagnosis")))
    elif v == "error":
        print("our-error   %s (%d dev, %s)%s: [%s] %s" % (name, n, record["main_opcode"], tags,
                                                      record.get("stage"), msg))
    elif v == "skip-xla":
        ours = record.get("ours_unverified")
        print("xla-skip    %s (%d dev): %s%s" % (name, n, msg, "; ours: %s" % ours
                                                 if ours not in (None, "ran") else ""))
    elif v == "skip-large" and verbose:
        print("not-run     %s (%d dev): %s" % (name, n, msg))
    elif v == "correct" and verbose:
        print("correct     %s (%d dev)" % (name, n))
    if record.get("fallbacks"):
        print("fallback    %s: %s" % (name, ", ".join(record["fallbacks"])))
    b = record.get("bytes", {})
    if b.get("compare") == "more":
        print("more-bytes  %s (%d dev, %s)%s: ours %d vs XLA %d (%s); grown: %s" % (
            name, n, record["main_opcode"], tags, b["ours"], b["xla"], ratio_text(b),
            ", ".join("%s +%d" % kv for kv in b["grown"].items()) or "-"))
    elif "ours_error" in b and v != "error":
        print("bytes-error %s: ours: %s" % (name, b["ours_error"]))
    elif "xla_error" in b and verbose:
        print("bytes-skip  %s: %s" % (name, b["xla_error"]))
    sys.stdout.flush()


def summarize(records, out, seconds):
    done = [r for r in records if "not_extracted" not in r]
    not_extracted = [r for r in records if "not_extracted" in r]
    by = collections.Counter(r.get("verdict") for r in done)
    runnable = [r for r in done if r.get("verdict") in ("correct", "wrong", "error")]
    fell = [r for r in done if r.get("fallbacks")]
    fell_run = [r for r in runnable if r.get("fallbacks")]
    print()
    print("extracted %d of %d tests (%d not extracted); %.0f s" % (
        len(done), len(records), len(not_extracted), seconds))
    print("correct by execution: %d of %d runnable modules (%d errors, %d wrong), %d fell back to "
          "replication (%d of them runnable)" % (
              by["correct"], len(runnable), by["error"], by["wrong"], len(fell), len(fell_run)))
    refereed = [r for r in runnable if r.get("verdict_before_referee")]
    if refereed:
        print("  %d of the correct differ from XLA's single-device result, decided by a referee "
              "(XLA's own partitioned program, or the module in f64): %s" % (len(refereed), ", ".join(
                  "%s (%s)" % (r["test"], r["referee"]) for r in refereed)))
    wrong = [r for r in done if r.get("verdict") == "wrong"]
    if wrong:
        faults = collections.Counter((r.get("diagnosis") or "?").split(" (")[0] for r in wrong)
        print("  wrong, by fault: %s (partitioner: our interpreter agrees with XLA; interpreter: "
              "our partitioned run agrees with our interpreter, which differs from XLA)" % ", ".join(
                  "%s %d" % kv for kv in faults.most_common()))
    print("  not executed: %d XLA could not run / no reference, %d too large (bytes only)" % (
        by["skip-xla"], by["skip-large"]))
    tagged = [r for r in runnable if r["tags"]]
    if tagged:
        print("  of the runnable, %d tests pass XLA options other than the defaults (both sides "
              "ran the defaults): %d correct" % (len(tagged), sum(r["verdict"] == "correct" for r in tagged)))

    def classes(rs, key):
        groups = collections.OrderedDict()
        for r in rs:
            groups.setdefault(key(r), []).append(r)
        return sorted(groups.items(), key=lambda kv: -len(kv[1]))

    errors = [r for r in done if r.get("verdict") == "error"]
    if errors:
        print("our errors by class:")
        for k, rs in classes(errors, lambda r: "[%s] %s" % (r.get("stage"), message_class(r["message"]))):
            print("  %3d %s: %s" % (len(rs), k, ", ".join(r["test"] for r in rs[:8]) +
                                    (", ..." if len(rs) > 8 else "")))
    if wrong:
        print("wrong by class (main opcode; is our interpreter at fault?):")
        for k, rs in classes(wrong, lambda r: "%s, fault: %s" % (
                r["main_opcode"], (r.get("diagnosis") or "?").split(" (")[0])):
            print("  %3d %s: %s" % (len(rs), k, ", ".join(r["test"] for r in rs)))
    skipped = [r for r in done if r.get("verdict") in ("skip-xla", "skip-large")]
    if skipped:
        print("not executed, by reason:")
        for k, rs in classes(skipped, lambda r: message_class(r["message"])):
            print("  %3d %s: %s" % (len(rs), k, ", ".join(r["test"] for r in rs[:6]) +
                                    (", ..." if len(rs) > 6 else "")))
    if fell:
        print("fell back to replication: %s" % ", ".join(
            "%s (%s)" % (r["test"], ", ".join(r["fallbacks"])) for r in fell))

    compared = [r for r in done if r.get("bytes", {}).get("compare")]
    cmp = collections.Counter(r["bytes"]["compare"] for r in compared)
    print("bytes: ours <= XLA on %d of %d compared (less %d, same %d, more %d)" % (
        cmp["less"] + cmp["same"], len(compared), cmp["less"], cmp["same"], cmp["more"]))
    run_cmp = [r for r in compared if r.get("verdict") in ("correct", "wrong", "error")]
    rc_ = collections.Counter(r["bytes"]["compare"] for r in run_cmp)
    print("  of them runnable modules: ours <= XLA on %d of %d (less %d, same %d, more %d)" % (
        rc_["less"] + rc_["same"], len(run_cmp), rc_["less"], rc_["same"], rc_["more"]))
    tot_ours = sum(r["bytes"]["ours"] for r in compared)
    tot_xla = sum(r["bytes"]["xla"] for r in compared)
    print("  total over compared modules: ours %d, XLA %d bytes per device" % (tot_ours, tot_xla))
    more = [r for r in compared if r["bytes"]["compare"] == "more"]
    if more:
        print("  more bytes, by the module's main opcode:")
        for k, rs in classes(more, lambda r: r["main_opcode"]):
            rs = sorted(rs, key=lambda r: -(r["bytes"]["ours"] / max(r["bytes"]["xla"], 1)))
            print("  %3d %s: %s" % (len(rs), k, ", ".join(
                "%s %s" % (r["test"], ratio_text(r["bytes"])) for r in rs)))
        grown = collections.Counter()
        for r in more:
            for op in r["bytes"]["grown"]:
                grown[op] += 1
        print("  collective kinds that grow: %s" % ", ".join("%s %d" % kv for kv in grown.most_common()))
    no_cmp = [r for r in done if not r.get("bytes", {}).get("compare")]
    if no_cmp:
        print("  not compared: %d (%s)" % (len(no_cmp), "; ".join(
            "%d %s" % (len(rs), k) for k, rs in classes(no_cmp, lambda r: message_class(
                "ours: " + r["bytes"]["ours_error"] if "ours_error" in r.get("bytes", {})
                else r.get("bytes", {}).get("xla_error", "?"))))))
    if not_extracted:
        reasons = collections.Counter(r["not_extracted"] for r in not_extracted)
        print("not extracted: %d tests" % len(not_extracted))
        for reason, k in reasons.most_common():
            print("  %d: %s" % (k, reason))
    print("modules, arguments and XLA's partitioned modules in %s" % out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xla", required=True, help="XLA checkout (or the test file)")
    ap.add_argument("--run-hlo-module", default=DEFAULT_RUN_HLO_MODULE,
                    help="our run_hlo_module (default %s, the release build)"
                    % DEFAULT_RUN_HLO_MODULE)
    ap.add_argument("--hlo-opt", default=DEFAULT_HLO_OPT,
                    help="our hlo-opt (default %s, the release build)" % DEFAULT_HLO_OPT)
    ap.add_argument("--out", help="directory for the extracted modules, arguments and outputs")
    ap.add_argument("--json", help="write every verdict here")
    ap.add_argument("--only", help="run only tests whose name matches this regex")
    ap.add_argument("--limit", type=int, help="run at most this many tests")
    ap.add_argument("--timeout", type=int, default=120,
                    help="seconds each of our runs may take (run_hlo_module --time-limit)")
    ap.add_argument("--xla-timeout", type=int, default=600, help="seconds each XLA child may take")
    ap.add_argument("--memory-limit", default="6GiB",
                    help="run_hlo_module --memory-limit for our runs (default 6GiB)")
    ap.add_argument("--max-elements", type=int, default=1 << 24,
                    help="do not execute modules with a shape over this many elements")
    ap.add_argument("--max-devices", type=int, default=128,
                    help="do not execute modules partitioned for more devices")
    ap.add_argument("--no-run-skipped", dest="run_skipped", action="store_false",
                    help="do not run ours (without a reference) on modules XLA cannot run")
    ap.add_argument("--keep-work", action="store_true", help="keep XLA's dump directories")
    ap.add_argument("-v", "--verbose", action="store_true", help="print correct modules too")
    args = ap.parse_args(argv)

    try:
        import numpy  # noqa: F401
        import jax  # noqa: F401
    except Exception as e:
        print("jax/numpy not usable: skipping (%s)" % first_line(e))
        return 0
    with open(test_file(args.xla), encoding="utf-8") as f:
        code, strings = tokenize_strings(f.read())
    helper = helper_parameters(code)
    out = os.path.abspath(args.out or tempfile.mkdtemp(prefix="xla_partitioner_suite."))
    os.makedirs(out, exist_ok=True)
    start = time.time()
    records = []
    for index, (fixture, name, _, body) in enumerate(split_tests(code)):
        if args.only and not re.search(args.only, name):
            continue
        if args.limit is not None and len(records) >= args.limit:
            break
        try:
            record = extract_test(fixture, name, body, strings, helper)
        except Exception as err:  # an extraction bug must not stop the run
            record = {"test": name, "fixture": fixture, "notes": [], "tags": [],
                      "not_extracted": "extraction failed: %r" % err}
        record["index"] = index
        records.append(record)
        if "not_extracted" in record:
            print("not-extracted %s: %s" % (name, record["not_extracted"]))
            continue
        try:
            evaluate(index, record, args, out)
        except Exception as err:  # a harness bug must not stop the run
            record["verdict"] = "harness-error"
            record["message"] = "%s: %s" % (type(err).__name__, err)
            print("harness-error %s: %s" % (name, record["message"]))
        record.pop("module_text", None)
        report(record, args.verbose)
    summarize(records, out, time.time() - start)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(child_main(sys.argv[2]))
    sys.exit(main())
