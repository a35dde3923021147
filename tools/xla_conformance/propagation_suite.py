#!/usr/bin/env python3
"""XLA's sharding-propagation unit tests as a held-out suite: how many of the
shardings XLA's tests expect after `ShardingPropagation` does our
`hlo-opt --passes=sharding-propagation` reproduce?

The tests come from an XLA source checkout given by path
(xla/service/sharding_propagation_test.cc). Nothing of XLA's text is written
into this repository; the extracted modules and our outputs go to --out (a
temporary directory by default).

For each TEST / TEST_F / TEST_P in that file:
  - the module: the raw string literal handed to ParseAndReturnVerifiedModule
    (a test that builds or edits its module in C++ -- set_sharding, another
    pass first, a format string we cannot fill -- is "not extracted", with
    the reason);
  - the options of its `ShardingPropagation(...)` call, positionally as the
    constructor declares them (xla/service/sharding_propagation.h):
      is_spmd=false, propagate_metadata=false,
      allow_spmd_sharding_propagation_to_output={false},
      allow_spmd_sharding_propagation_to_parameters={false},
      cse_prevention_only=false.
    is_spmd=false is passed as `--sharding-propagation-is-spmd=false`, the
    execution threads as `--sharding-propagation-execution-threads=...`, and
    every test runs with `--sharding-propagation-inline-calls=false` (XLA's
    pass alone does not inline calls; its pipeline does, before it), when
    the hlo-opt given has those flags. Our pass takes
    the two allow_* permissions from the module header
    (`HloModule m, allow_spmd_sharding_propagation_to_output={true}`), so
    they are written there (--no-header-options: leave the header alone).
    A test whose options differ from ours (is_spmd=false, allow_*,
    cse_prevention_only) is tagged with them; the totals are broken down by
    tag. TEST_P tests run once, with the first parameter of their suite
    (propagate_metadata=false, clear_metadata=false,
    allow_root_sharding_propagation=false); `if (GetParam()...)` branches
    are resolved with those values;
  - the expectations, in order, through variables bound by
    `auto* x = FindInstruction(module.get(), "NAME")`, entry
    root/parameter_instruction(i), ->operand(i) and loops over instruction
    lists: `op::Sharding("...")`, `op::ShardingWithMetadata`, `op::NoSharding()`
    and `EXPECT_FALSE(x->has_sharding())` count as expected shardings;
    `has_sharding()`, `IsReplicated()`/`IsManual()` and
    `EXPECT_EQ/NE(a->sharding(), b->sharding())` are "other checks";
    `EXPECT_TRUE/FALSE(changed)` and status-message expectations are counted
    apart. Metadata expectations are ignored.

Ours: `hlo-opt FILE -o IN.hlo` (our parser and verifier on XLA's module) and
`hlo-opt FILE --passes=sharding-propagation -o OUT.hlo`; each expected
sharding is compared with the printed one modulo representation (iota vs
explicit devices, last_tile_dim_replicate vs last_tile_dims={replicated},
device order within replicated groups, trivial subgroups, metadata). "changed"
is whether any sharding or instruction differs between IN and OUT.

Prints one line per test that is not fully matched (matched/expected, tags)
and one line per failing expectation, then the totals, by tag; `--json FILE`
writes every verdict. Exits 0: this is a measurement, not a test.

Usage:
    python3 tools/xla_conformance/propagation_suite.py --xla PATH_TO_XLA \
        [--hlo-opt target/release/hlo-opt] [--out DIR] [--json FILE] [-v]
    python3 tools/xla_conformance/propagation_suite.py --self-test
PATH_TO_XLA is a directory holding xla/service/sharding_propagation_test.cc
(an openxla/xla checkout), or that test file itself.
"""

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
TEST_FILE = os.path.join("xla", "service", "sharding_propagation_test.cc")
DEFAULT_HLO_OPT = os.path.join(REPO_ROOT, "target", "release", "hlo-opt")

# The first instantiation of each parameterized suite.
PARAMS = {"propagate_metadata": False, "clear_metadata": False,
          "allow_root_sharding_propagation": False}
# ShardingPropagation's constructor, positionally, with XLA's defaults.
OPTION_NAMES = ["is_spmd", "propagate_metadata",
                "allow_spmd_sharding_propagation_to_output",
                "allow_spmd_sharding_propagation_to_parameters",
                "cse_prevention_only", "sharding_helper"]
XLA_DEFAULTS = {"is_spmd": False, "propagate_metadata": False,
                "allow_spmd_sharding_propagation_to_output": [False],
                "allow_spmd_sharding_propagation_to_parameters": [False],
                "cse_prevention_only": False, "sharding_helper": None}
HEADER_OPTIONS = ("allow_spmd_sharding_propagation_to_output",
                  "allow_spmd_sharding_propagation_to_parameters")


def test_file(xla):
    return xla if os.path.isfile(xla) else os.path.join(xla, TEST_FILE)


# ---------------------------------------------------------------------------
# Shardings: parse and normalize.


def _balanced(text, start, open_ch="{", close_ch="}"):
    """Index one past the bracket closing the one at text[start]; quotes
    are skipped."""
    depth = 0
    i = start
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError("unbalanced %r in %r" % (open_ch, text[start:start + 80]))


def _strip_metadata(text):
    out = []
    i = 0
    while True:
        j = text.find("metadata={", i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        i = _balanced(text, j + len("metadata="))


def _ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def _iota(dims, reshape, perm):
    """Devices of `<=[reshape]T(perm)` in row-major order of the transposed
    array."""
    n = 1
    for d in reshape:
        n *= d
    if not perm:
        return list(range(n))
    strides = [1] * len(reshape)
    for k in range(len(reshape) - 2, -1, -1):
        strides[k] = strides[k + 1] * reshape[k + 1]
    tdims = [reshape[p] for p in perm]
    out = []
    for flat in range(n):
        rest, idx = flat, []
        for d in reversed(tdims):
            idx.append(rest % d)
            rest //= d
        idx.reverse()
        out.append(sum(idx[k] * strides[perm[k]] for k in range(len(perm))))
    return out


TILED = re.compile(r"devices=\[([\d,\s]*)\]\s*(?:<=\[([\d,\s]+)\](?:T\(([\d,\s]+)\))?|([\d,\s]+))")


def _single(text):
    """Canonical form of one non-tuple sharding's inside (no braces)."""
    body = _strip_metadata(text)
    body = re.sub(r"\bshard_(?:as|like)\s+\d+", " ", body)
    m = TILED.search(body)
    if m is None:
        words = body.split()
        if words[:1] == ["maximal"]:
            dev = re.search(r"device=(\d+)", body)
            return ("maximal", int(dev.group(1)) if dev else None)
        for w in ("replicated", "manual", "unknown", "unreduced"):
            if w in words:
                return (w,)
        raise ValueError("unknown sharding %r" % text)
    dims = _ints(m.group(1))
    if m.group(2) is not None:
        devices = _iota(dims, _ints(m.group(2)), _ints(m.group(3) or ""))
    else:
        devices = _ints(m.group(4))
    rest = body[m.end():]
    types = []
    if "last_tile_dim_replicate" in rest:
        types = ["replicated"]
    sub = re.search(r"last_tile_dims=\{([^}]*)\}", rest)
    if sub:
        types = [t.strip() for t in sub.group(1).split(",") if t.strip()]
    n = 1
    for d in dims:
        n *= d
    if n != len(devices) or len(types) > len(dims):
        raise ValueError("inconsistent tiled sharding %r" % text)
    nd = len(dims) - len(types)
    data_dims = tuple(dims[:nd])
    manual = [k for k, t in enumerate(types) if t == "manual"]
    manual_size = 1
    for k in manual:
        manual_size *= dims[nd + k]
    replicated_size = n // max(1, manual_size)
    for d in data_dims:
        replicated_size //= d
    if all(d == 1 for d in data_dims):
        if manual_size == 1:
            return ("replicated",)
        if replicated_size == 1:
            return ("manual",)
    groups = collections.defaultdict(list)
    for flat, device in enumerate(devices):
        rest_, coord = flat, []
        for d in reversed(dims):
            coord.append(rest_ % d)
            rest_ //= d
        coord.reverse()
        data = tuple(coord[:nd])
        man = tuple(coord[nd + k] for k in manual)
        groups[(data, man)].append(device)
    canon = tuple(sorted((key, tuple(sorted(v))) for key, v in groups.items()))
    return ("tiled", data_dims, manual_size, canon)


def parse_sharding(text):
    """Canonical form of a sharding as XLA or we print it: a tuple for one
    sharding, a list of them for a tuple sharding."""
    text = text.strip()
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError("not a sharding: %r" % text)
    inner = text[1:-1].strip()
    if not inner.startswith("{") and inner != "":
        return _single(inner)
    elements = []
    i = 0
    while i < len(inner):
        if inner[i] == "{":
            j = _balanced(inner, i)
            element = parse_sharding(inner[i:j])
            elements.extend(element if isinstance(element, list) else [element])
            i = j
        else:
            i += 1
    return elements


def same_sharding(expected, ours):
    """Equal modulo representation; a one-sharding tuple element list equals
    the single sharding that all its elements are."""
    if expected is None or ours is None:
        return expected is ours
    a, b = parse_sharding(expected), parse_sharding(ours)
    if isinstance(a, list) and isinstance(b, list):
        return a == b
    if isinstance(a, list):
        return bool(a) and all(x == b for x in a)
    if isinstance(b, list):
        return bool(b) and all(x == a for x in b)
    return a == b


def leaf_match(expected, ours):
    """(leaves, matched leaves) of an expected sharding: a tuple sharding
    counts once per element, compared element-wise."""
    a = parse_sharding(expected)
    leaves = len(a) if isinstance(a, list) else 1
    if ours is None:
        return leaves, 0
    b = parse_sharding(ours)
    if not isinstance(a, list):
        return 1, int(same_sharding(expected, ours))
    if isinstance(b, list):
        if len(b) != len(a):
            return leaves, 0
        return leaves, sum(x == y for x, y in zip(a, b))
    return leaves, sum(x == b for x in a)


def self_test():
    pairs = [
        ("{devices=[2,2]<=[4]}", "{devices=[2,2]0,1,2,3}", True),
        ("{devices=[2,2]<=[2,2]T(1,0)}", "{devices=[2,2]0,2,1,3}", True),
        ("{devices=[4]<=[2,2]T(1,0)}", "{devices=[4]0,2,1,3}", True),
        ("{devices=[2,2]0,1,2,3}", "{devices=[2,2]0,2,1,3}", False),
        ("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}",
         "{devices=[2,1,2]1,0,3,2 last_tile_dims={replicated}}", True),
        ("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}",
         "{devices=[2,1,2]0,2,1,3 last_tile_dim_replicate}", False),
        ("{devices=[1,2,2]<=[4] last_tile_dim_replicate}",
         "{devices=[1,2,2]<=[2,2]T(1,0) last_tile_dim_replicate}", False),
        ("{devices=[1,1,4]<=[4] last_tile_dim_replicate}", "{replicated}", True),
        ("{devices=[1,2]0,1 last_tile_dims={manual}}", "{manual}", True),
        ("{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}",
         "{devices=[2,2,2]1,0,3,2,5,4,7,6 last_tile_dims={manual, replicated}}", True),
        ("{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}",
         "{devices=[2,2,2]<=[2,2,2]T(0,2,1) last_tile_dims={replicated, manual}}", True),
        ("{devices=[2,2,2]<=[8] last_tile_dims={manual, replicated}}",
         "{devices=[2,2,2]<=[8] last_tile_dims={replicated, manual}}", False),
        ("{devices=[2,1,1,2]<=[4] last_tile_dims={replicated, replicated}}",
         "{devices=[2,1,2]<=[4] last_tile_dim_replicate}", True),
        ("{{replicated}, {maximal device=1 metadata={op_name=\"a\"}}}",
         "{{replicated}, {maximal device=1}}", True),
        ("{{replicated}, {maximal device=1}}", "{{maximal device=1}, {replicated}}", False),
        ("{{replicated}, {replicated}}", "{replicated}", True),
        ("{maximal device=0}", "{maximal device=1}", False),
        ("{replicated}", "{manual}", False),
        ("{devices=[4]0,1,2,3 metadata={op_name=\"x\" source_file=\"a{b}\"}}",
         "{devices=[4]<=[4]}", True),
        ("{devices=[2,2]<=[4] shard_as 1}", "{devices=[2,2]<=[4]}", True),
    ]
    bad = 0
    for a, b, want in pairs:
        got = same_sharding(a, b)
        if got != want:
            bad += 1
            print("self-test FAIL: %s vs %s: got %s" % (a, b, got))
    print("self-test: %d of %d pairs right" % (len(pairs) - bad, len(pairs)))
    return 1 if bad else 0


# ---------------------------------------------------------------------------
# Our printed HLO: computations, instructions, shardings.


INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
# An instruction's first line (`name = TYPE opcode(...`): continuation
# lines such as `sharding={...}` or `to_apply=f,` are not.
NEW_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?:\(|[a-z]\w*\[)")
COMP = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\)\s*->\s*.*)?\{\s*$")


def _skip_type(text, i):
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "(":
        return _balanced(text, i, "(", ")")
    while i < len(text) and text[i] not in " ":
        i += 1
    return i


def _attr(text, key):
    """Value of `key=` at the top level of an instruction's attributes."""
    m = re.search(r"(?:^|[,\s])" + re.escape(key) + r"=", text)
    while m:
        start = m.end()
        # Not inside quotes: count quotes before.
        if text.count('"', 0, m.start()) % 2 == 0:
            if start < len(text) and text[start] == "{":
                return text[start:_balanced(text, start)]
            end = start
            while end < len(text) and text[end] not in ", ":
                end += 1
            return text[start:end]
        m = re.compile(r"[,\s]" + re.escape(key) + r"=").search(text, start)
    return None


class Module:
    def __init__(self, text):
        self.computations = collections.OrderedDict()  # name -> [instr]
        self.instructions = {}  # name -> instr dict
        self.entry = None
        lines = []
        for line in text.splitlines():
            if NEW_INSTR.match(line) or COMP.match(line) or line.strip() in ("}", "") \
                    or line.startswith("HloModule") or not lines:
                lines.append(line)
            else:
                lines[-1] += " " + line.strip()
        current = None
        for line in lines:
            c = COMP.match(line)
            if c and not INSTR.match(line):
                current = c.group(2)
                self.computations[current] = []
                if c.group(1):
                    self.entry = current
                continue
            m = INSTR.match(line)
            if not m or current is None:
                continue
            rest = m.group(3)
            i = _skip_type(rest, 0)
            shape = rest[:i].strip()
            op = re.match(r"\s*([\w\-]+)\(", rest[i:])
            opcode, operands, attrs = "", [], rest
            if op:
                opcode = op.group(1)
                start = i + op.end() - 1
                end = _balanced(rest, start, "(", ")")
                operands = [o.strip().split()[-1].lstrip("%")
                            for o in _split_top(rest[start + 1:end - 1]) if o.strip()]
                attrs = rest[end:]
            instr = {"name": m.group(2), "root": bool(m.group(1)), "opcode": opcode,
                     "shape": shape, "operands": operands, "computation": current,
                     "sharding": _attr(attrs, "sharding"), "attrs": attrs}
            if opcode == "parameter" and operands:
                instr["parameter_number"] = int(operands[0]) if operands[0].isdigit() else None
            self.computations[current].append(instr)
            self.instructions[instr["name"]] = instr
        if self.entry is None and self.computations:
            self.entry = list(self.computations)[-1]

    def root(self, comp):
        instrs = self.computations.get(comp) or []
        for instr in instrs:
            if instr["root"]:
                return instr
        return instrs[-1] if instrs else None

    def parameter(self, comp, k):
        for instr in self.computations.get(comp) or []:
            if instr["opcode"] == "parameter" and instr.get("parameter_number") == k:
                return instr
        return None

    def called(self, instr, key):
        value = _attr(instr["attrs"], key)
        if value is None:
            return None
        return value.strip("{}").split(",")[0].strip().lstrip("%")

    def shardings(self):
        return {name: (parse_sharding(i["sharding"]) if i["sharding"] else None)
                for name, i in self.instructions.items()}


def _split_top(text, sep=","):
    out, depth, cur, quote = [], 0, [], False
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                cur.append(text[i:i + 2])
                i += 2
                continue
            if c == '"':
                quote = False
        elif c == '"':
            quote = True
        elif c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == sep and depth == 0:
            out.append("".join(cur))
            cur = []
            i += 1
            continue
        cur.append(c)
        i += 1
    out.append("".join(cur))
    return out


# ---------------------------------------------------------------------------
# The C++ test file: strings, tests, options, expectations.


def tokenize_strings(source):
    """Replace comments by a space and string literals (raw or not; adjacent
    ones concatenated) by __S<n>__ placeholders. Returns (code, strings)."""
    out, strings = [], []
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if source.startswith("//", i):
            j = source.find("\n", i)
            i = n if j < 0 else j
            out.append(" ")
            continue
        if source.startswith("/*", i):
            j = source.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
            continue
        raw = re.match(r'R"([^(\s]*)\(', source[i:i + 40]) if c == "R" and (
            i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")) else None
        if raw or c == '"':
            if raw:
                end = source.find(")" + raw.group(1) + '"', i + raw.end())
                value = source[i + raw.end():end]
                i = end + len(raw.group(1)) + 2
            else:
                j, buf = i + 1, []
                while source[j] != '"':
                    if source[j] == "\\":
                        esc = source[j + 1]
                        buf.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'"}.get(esc, esc))
                        j += 2
                    else:
                        buf.append(source[j])
                        j += 1
                value = "".join(buf)
                i = j + 1
            k = len(out) - 1
            while k >= 0 and out[k].isspace():
                k -= 1
            if k >= 0 and re.fullmatch(r"__S\d+__", out[k]):
                strings[int(out[k][3:-2])] += value  # C++ concatenation
                del out[k + 1:]
            else:
                out.append("__S%d__" % len(strings))
                strings.append(value)
            continue
        if c == "'":
            j = i + 1
            while source[j] != "'":
                j += 2 if source[j] == "\\" else 1
            out.append("0")
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out), strings


TEST_HEAD = re.compile(r"\bTEST(?:_F|_P)?\s*\(\s*(\w+)\s*,\s*(\w+)\s*\)\s*\{")
PLACEHOLDER = re.compile(r"__S(\d+)__")


def split_tests(code):
    tests = []
    for m in TEST_HEAD.finditer(code):
        start = m.end() - 1
        end = _balanced(code, start)
        tests.append((m.group(1), m.group(2), m.start(), code[start + 1:end - 1]))
    return tests


def eval_cond(cond):
    """Value of a condition over GetParam() fields, or None."""
    expr = cond
    for key, value in PARAMS.items():
        expr = re.sub(r"GetParam\(\)\s*\.\s*" + key + r"\b", str(value), expr)
    if "GetParam" in expr:
        return None
    expr = expr.replace("&&", " and ").replace("||", " or ")
    expr = re.sub(r"!(?!=)", " not ", expr)
    expr = expr.replace("true", "True").replace("false", "False")
    try:
        return bool(eval(expr, {"__builtins__": {}}, {}))
    except Exception:
        return None


def _block(code, i):
    """(text, end) of the statement starting at code[i]: a braced block
    (text without the braces), an `if (...) S [else S]` chain, or a plain
    statement up to its `;`."""
    while code[i].isspace():
        i += 1
    if code[i] == "{":
        end = _balanced(code, i)
        return code[i + 1:end - 1], end
    m = re.match(r"if\s*\(", code[i:])
    if m:
        close = _balanced(code, i + m.end() - 1, "(", ")")
        _, end = _block(code, close)
        e = re.match(r"\s*else\b", code[end:])
        if e:
            _, end = _block(code, end + e.end())
        return code[i:end], end
    depth, j = 0, i
    while True:
        c = code[j]
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == ";" and depth == 0:
            return code[i:j + 1], j + 1
        j += 1


def resolve_params(code):
    """Replace `if (COND over GetParam()) A else B` by the branch taken
    (both dropped when COND is not understood)."""
    while True:
        for m in re.finditer(r"\bif\s*\(", code):
            close = _balanced(code, m.end() - 1, "(", ")")
            cond = code[m.end():close - 1]
            if "GetParam" not in cond:
                continue
            value = eval_cond(cond)
            then, end = _block(code, close)
            other = ""
            e = re.match(r"\s*else\b", code[end:])
            if e:
                other, end = _block(code, end + e.end())
            taken = " " if value is None else (then if value else other)
            code = code[:m.start()] + " { " + taken + " } " + code[end:]
            break
        else:
            return code


def expand_loops(code, notes):
    """Unroll range-for loops over brace lists or named vectors of
    instructions (and over vectors of string pairs); drop other loops."""
    lists = {}
    for m in re.finditer(r"std::vector<[^;]*?>\s+(\w+)\s*(?:=\s*|\(\s*)\{", code):
        start = m.end() - 1
        end = _balanced(code, start)
        lists[m.group(1)] = code[start + 1:end - 1]
    while True:
        m = re.search(r"\bfor\s*\(", code)
        if not m:
            return code
        close = _balanced(code, m.end() - 1, "(", ")")
        head = code[m.end():close - 1]
        body, end = _block(code, close)
        unrolled = []
        rng = re.match(r"\s*(?:const\s+)?[\w:<>\*&\s]*?(?:\[\s*(\w+)\s*,\s*(\w+)\s*\]|(\w+))\s*:\s*(.*)$",
                       head, re.S)
        items = None
        if rng:
            source = rng.group(4).strip()
            if source.startswith("{"):
                items = _split_top(source[1:_balanced(source, 0) - 1])
            elif source in lists:
                items = _split_top(lists[source])
        if rng and items is not None:
            for item in items:
                item = item.strip()
                if not item:
                    continue
                text = body
                if rng.group(3):
                    text = re.sub(r"\b%s\b" % rng.group(3), item, text)
                else:
                    pair = _split_top(item.strip()[1:-1])
                    if len(pair) != 2:
                        continue
                    text = re.sub(r"\b%s\b" % rng.group(1), pair[0].strip(), text)
                    text = re.sub(r"\b%s\b" % rng.group(2), pair[1].strip(), text)
                unrolled.append("{ " + text + " }")
        else:
            if re.search(r"op::Sharding|has_sharding|IsManual|IsReplicated", body):
                notes.append("loop not unrolled: for (%s)" % " ".join(head.split()))
        code = code[:m.start()] + " ".join(unrolled) + code[end:]


def statements(code):
    """Top-level statements (split at ; { } outside parentheses)."""
    out, depth, cur = [], 0, []
    for c in code:
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        if depth == 0 and c in ";{}":
            s = "".join(cur).strip()
            if s:
                out.append(" ".join(s.split()))
            cur = []
            continue
        cur.append(c)
    s = "".join(cur).strip()
    if s:
        out.append(" ".join(s.split()))
    return out


def unquote(text, strings):
    """C++ text with its __S<n>__ placeholders spelled as string literals."""
    return PLACEHOLDER.sub(lambda m: json.dumps(strings[int(m.group(1))])[:60], text)


def parse_value(arg):
    arg = arg.strip()
    m = re.fullmatch(r"GetParam\(\)\s*\.\s*(\w+)", arg)
    if m and m.group(1) in PARAMS:
        return PARAMS[m.group(1)]
    if arg in ("true", "false"):
        return arg == "true"
    if arg.startswith("{") and arg.endswith("}"):
        values = [parse_value(a) for a in _split_top(arg[1:-1]) if a.strip()]
        return values
    return arg  # something else (a helper object)


def parse_options(code, strings):
    """Options of the ShardingPropagation(...) calls in a test body."""
    calls = []
    for m in re.finditer(r"\bShardingPropagation\s*\(", code):
        close = _balanced(code, m.end() - 1, "(", ")")
        args = [a for a in _split_top(code[m.end():close - 1]) if a.strip()]
        options = dict(XLA_DEFAULTS)
        for name, arg in zip(OPTION_NAMES, args):
            options[name] = parse_value(arg)
        run = re.match(r"\s*\.\s*Run\s*\(", code[close:])
        options["execution_threads"] = None
        if run:
            run_close = _balanced(code, close + run.end() - 1, "(", ")")
            run_args = _split_top(code[close + run.end():run_close - 1])
            if len(run_args) > 1:
                options["execution_threads"] = unquote(" ".join(run_args[1].split()), strings)
        options["_at"] = m.start()
        calls.append(options)
    return calls


def option_tags(options, header_options):
    """What differs from what our hlo-opt runs (is_spmd=true, no
    propagation to outputs/parameters unless the header says so)."""
    tags = []
    if options["is_spmd"] is not True:
        tags.append("is_spmd=false")
    for key in HEADER_OPTIONS:
        value = options[key]
        if isinstance(value, list) and any(v is True for v in value):
            tags.append("%s={%s}" % (key, ",".join("true" if v else "false" for v in value)))
    if options["cse_prevention_only"] is True:
        tags.append("cse_prevention_only")
    if options["sharding_helper"] not in (None, "nullptr"):
        tags.append("sharding_helper")
    if options.get("execution_threads") not in (None, "{}"):
        tags.append("execution_threads=" + options["execution_threads"])
    return tags


# Instruction expressions -> locators.
FIND = re.compile(r"FindInstruction\(\s*module(?:\.get\(\))?\s*,\s*(__S\d+__)\s*\)")


def parse_locator(expr, env, strings):
    """A locator for an instruction/computation expression, or None:
    ("name", N) | ("root", comp) | ("param", comp, k) | ("operand", loc, k)
    | ("entry",) | ("called", loc, key)."""
    expr = expr.strip()
    while expr.startswith("(") and expr.endswith(")") and _balanced(expr, 0, "(", ")") == len(expr):
        expr = expr[1:-1].strip()
    m = FIND.match(expr)
    if m:
        loc, rest = ("name", strings[int(m.group(1)[3:-2])]), expr[m.end():]
    else:
        m = re.match(r"module(?:\.get\(\))?\s*->\s*entry_computation\(\)", expr)
        if m:
            loc, rest = ("entry",), expr[m.end():]
        else:
            m = re.match(r"(\w+)", expr)
            if not m or m.group(1) not in env:
                return None
            loc, rest = env[m.group(1)], expr[m.end():]
    while rest.strip():
        m = re.match(r"\s*(?:->|\.)\s*(\w+)\(\s*(\d*)\s*\)(?:\[(\d+)\])?", rest)
        if not m:
            return None
        method, arg, index = m.group(1), m.group(2), m.group(3)
        rest = rest[m.end():]
        if method == "root_instruction":
            loc = ("root", loc)
        elif method == "parameter_instruction":
            loc = ("param", loc, int(arg))
        elif method in ("operand", "mutable_operand"):
            loc = ("operand", loc, int(arg))
        elif method == "while_body":
            loc = ("called", loc, "body")
        elif method == "while_condition":
            loc = ("called", loc, "condition")
        elif method == "to_apply":
            loc = ("called", loc, "to_apply")
        elif method == "branch_computation":
            loc = ("called", loc, "branch%d" % int(arg))
        elif method == "called_computations" and index is not None:
            loc = ("called", loc, "called%d" % int(index))
        elif method == "get":
            pass
        else:
            return None
    return loc


def describe(loc):
    kind = loc[0]
    if kind == "name":
        return loc[1]
    if kind == "entry":
        return "ENTRY"
    if kind == "root":
        return describe(loc[1]) + ".root"
    if kind == "param":
        return "%s.parameter(%d)" % (describe(loc[1]), loc[2])
    if kind == "operand":
        return "%s.operand(%d)" % (describe(loc[1]), loc[2])
    if kind == "called":
        return "%s.%s" % (describe(loc[1]), loc[2])
    return str(loc)


def resolve(loc, module):
    """Instruction dict (or computation name for computation locators) in
    our module; None when absent."""
    kind = loc[0]
    if kind == "name":
        return module.instructions.get(loc[1])
    if kind == "entry":
        return ("comp", module.entry)
    if kind in ("root", "param"):
        comp = resolve(loc[1], module)
        if not (isinstance(comp, tuple) and comp[1]):
            return None
        return module.root(comp[1]) if kind == "root" else module.parameter(comp[1], loc[2])
    if kind == "operand":
        instr = resolve(loc[1], module)
        if not isinstance(instr, dict) or loc[2] >= len(instr["operands"]):
            return None
        return module.instructions.get(instr["operands"][loc[2]])
    if kind == "called":
        instr = resolve(loc[1], module)
        if not isinstance(instr, dict):
            return None
        key = loc[2]
        if key.startswith("branch") or key.startswith("called"):
            k = int(key[6:])
            for attr in ("branch_computations", "calls", "to_apply", "called_computations"):
                value = _attr(instr["attrs"], attr)
                if value:
                    names = [v.strip().lstrip("%") for v in value.strip("{}").split(",")]
                    if k < len(names):
                        return ("comp", names[k])
            if key.startswith("branch"):
                value = _attr(instr["attrs"], "true_computation" if k == 0 else "false_computation")
                return ("comp", value.lstrip("%")) if value else None
            return None
        name = module.called(instr, key)
        return ("comp", name) if name else None
    return None


SHARDING_MATCHER = re.compile(r"op::(?:Sharding|ShardingWithMetadata)\(\s*(__S\d+__)")


def extract_expectations(body, strings, notes):
    """Expectations of a test body in order: dicts with kind, loc and
    expected text where it applies."""
    env = {}
    out = []
    for st in statements(body):
        # Bindings: `auto* x = EXPR`, `x = EXPR`.
        b = re.match(r"(?:(?:const\s+)?(?:auto|HloInstruction|HloComputation)\s*\*?\s*)?(\w+)\s*=\s*(.+)$", st)
        if b and not st.startswith(("EXPECT", "ASSERT")) and "==" not in st:
            loc = parse_locator(b.group(2), env, strings)
            if loc is not None:
                env[b.group(1)] = loc
            elif b.group(1) in env:
                del env[b.group(1)]
            continue
        m = re.match(r"(EXPECT|ASSERT)_(THAT|TRUE|FALSE|EQ|NE)\s*\((.*)\)$", st)
        if not m:
            continue
        what, args = m.group(2), _split_top(m.group(3))
        text = " ".join(st.split())
        if what == "THAT" and len(args) == 2:
            target, matcher = args[0].strip(), args[1].strip()
            if "result" in target and "status()" in target:
                sub = PLACEHOLDER.search(matcher)
                out.append({"kind": "status", "message": strings[int(sub.group(1))] if sub else None})
                continue
            if "ShardingMetadata" in matcher or "->sharding()" in target or \
                    target.startswith(("sharding", "sub_sharding", "shardings", "tuple_element")):
                continue  # metadata checks
            loc = parse_locator(target, env, strings)
            s = SHARDING_MATCHER.search(matcher)
            if s:
                kind, expected = "sharding", strings[int(s.group(1)[3:-2])]
            elif "op::NoSharding()" in matcher:
                kind, expected = "none", None
            elif "op::Sharding(" in matcher:
                notes.append("expected sharding not a literal: " + text)
                continue
            else:
                continue  # op::Shape, op::CustomCall, ...
            if loc is None:
                notes.append("instruction not resolved: " + text)
                continue
            e = {"kind": kind, "loc": loc, "expected": expected}
            if kind == "sharding":
                try:
                    p = parse_sharding(expected)
                except ValueError as err:
                    notes.append("expected sharding not understood: %s (%s)" % (expected, err))
                    continue
                e["leaves"] = len(p) if isinstance(p, list) else 1
            out.append(e)
            continue
        if what in ("TRUE", "FALSE") and len(args) == 1:
            arg = args[0].strip()
            if arg == "changed":
                out.append({"kind": "changed", "expected": what == "TRUE"})
                continue
            if re.fullmatch(r"\w+\.ok\(\)", arg):
                if what == "FALSE":
                    out.append({"kind": "status", "message": None})
                continue
            h = re.fullmatch(r"(.*?)\s*->\s*(has_sharding|sharding\(\)\s*\.\s*IsReplicated|"
                             r"sharding\(\)\s*\.\s*IsManual)\(\)", arg)
            if h:
                loc = parse_locator(h.group(1), env, strings)
                if loc is None:
                    notes.append("instruction not resolved: " + text)
                    continue
                method = h.group(2).split(".")[-1].strip()
                if method == "has_sharding":
                    if what == "FALSE":
                        out.append({"kind": "none", "loc": loc, "expected": None})
                    else:
                        out.append({"kind": "other", "check": "has_sharding", "loc": loc})
                else:
                    out.append({"kind": "other", "check": ("" if what == "TRUE" else "not ") + method,
                                "loc": loc})
            continue
        if what in ("EQ", "NE") and len(args) == 2:
            a, b_ = args[0].strip(), args[1].strip()
            if a == "changed" or b_ == "changed":
                value = eval_cond(b_ if a == "changed" else a)
                if value is not None:
                    out.append({"kind": "changed", "expected": value if what == "EQ" else not value})
                continue
            sa = re.fullmatch(r"(.*?)\s*->\s*sharding\(\)", a)
            sb = re.fullmatch(r"(.*?)\s*->\s*sharding\(\)", b_)
            if sa and sb:
                la, lb = parse_locator(sa.group(1), env, strings), parse_locator(sb.group(1), env, strings)
                if la and lb:
                    out.append({"kind": "other", "check": "equal" if what == "EQ" else "differ",
                                "loc": la, "other": lb})
                else:
                    notes.append("instruction not resolved: " + text)
            elif re.search(r"sharding", a + b_):
                notes.append("not understood: " + text)
    return out


# Reasons a module cannot be run as XLA's test runs it.
MUTATIONS = [
    (r"->set_sharding\(|->clear_sharding\(", "module edited in C++ (set_sharding)"),
    (r"HloConstantSplitter", "another pass runs first (HloConstantSplitter)"),
    (r"\bAddInstruction\(|ReplaceAllUsesWith|->set_", "module edited in C++"),
]


def extract_test(fixture, name, body, strings):
    """Module text, options, expectations and notes of one test."""
    record = {"test": name, "fixture": fixture, "notes": []}
    if fixture in ("ParameterizedMetadataTest", "ParameterizedMetadataTestWithOutput"):
        record["parameterized"] = fixture
    parses = re.findall(r"ParseAndReturn(?:Un)?[Vv]erifiedModule\(\s*([^,)]+)", body)
    if not parses:
        record["not_extracted"] = "no ParseAndReturnVerifiedModule"
        return record
    arg = parses[0].strip()
    text = None
    p = PLACEHOLDER.fullmatch(arg)
    if p:
        text = strings[int(p.group(1))]
    else:
        d = re.search(r"\b%s\s*=\s*([^;]*);" % re.escape(arg), body) or \
            re.search(r"\b%s\s*\(\s*([^;]*)\)\s*;" % re.escape(arg), body)
        if d:
            value = d.group(1).strip()
            p = PLACEHOLDER.fullmatch(value)
            if p:
                text = strings[int(p.group(1))]
            else:
                f = re.fullmatch(r"absl::StrFormat\(\s*(__S\d+__)\s*,(.*)\)", value, re.S)
                r = re.fullmatch(r"absl::StrReplaceAll\(\s*(__S\d+__)\s*,\s*\{(.*)\}\s*\)", value, re.S)
                if f:
                    values = []
                    for a in _split_top(f.group(2)):
                        a = a.strip()
                        q = PLACEHOLDER.fullmatch(a)
                        if q:
                            values.append(strings[int(q.group(1))])
                        elif re.fullmatch(r"-?\d+", a):
                            values.append(int(a))
                        else:
                            values = None
                            break
                    if values is not None:
                        try:
                            text = re.sub(r"%(\d+\$)?([sd])", "%s",
                                          strings[int(f.group(1)[3:-2])].replace("%%", "\0")) % tuple(values)
                            text = text.replace("\0", "%")
                        except TypeError:
                            text = None
                    if text is None:
                        record["not_extracted"] = "absl::StrFormat with non-literal arguments"
                        return record
                elif r:
                    text = strings[int(r.group(1)[3:-2])]
                    for pair in re.findall(r"\{\s*(__S\d+__)\s*,\s*(__S\d+__)\s*\}", r.group(2)):
                        text = text.replace(strings[int(pair[0][3:-2])], strings[int(pair[1][3:-2])])
                else:
                    record["not_extracted"] = "module built in C++: %s" % " ".join(value.split())[:80]
                    return record
        else:
            record["not_extracted"] = "module variable %s not found" % arg
            return record
    if "HloModule" not in text:
        record["not_extracted"] = "the parsed string holds no HloModule"
        return record
    record["module_text"] = text
    if len(parses) > 1:
        record["notes"].append("module parsed %d times; the first is run" % len(parses))
    for pattern, reason in MUTATIONS:
        if re.search(pattern, body):
            record["not_extracted"] = reason
            return record
    code = resolve_params(body)
    code = expand_loops(code, record["notes"])
    calls = parse_options(code, strings)
    if not calls:
        record["not_extracted"] = "no ShardingPropagation(...) call"
        return record
    if len(calls) > 1:
        # Later runs work on a fresh parse with other options: keep what
        # the first run is checked for.
        cut = calls[1]["_at"]
        again = [m.start() for m in re.finditer(r"ParseAndReturn(?:Un)?[Vv]erifiedModule", code)
                 if calls[0]["_at"] < m.start() < cut]
        cut = again[0] if again else cut
        cut = code.rfind(";", 0, cut) + 1
        dropped = extract_expectations(code[cut:], strings, [])
        record["notes"].append("%d ShardingPropagation runs: the first is measured, %d expectations "
                               "of the later ones dropped" % (len(calls), len(dropped)))
        code = code[:cut]
    options = calls[0]
    del options["_at"]
    record["options"] = options
    if re.search(r"HloDCE|RunHloPass", code):
        record["notes"].append("another pass (HloDCE) runs after propagation")
    record["expectations"] = extract_expectations(code, strings, record["notes"])
    record["notes"] = [unquote(n, strings) for n in record["notes"]]
    return record


def with_header_options(text, options):
    """The module text with XLA's allow_* options written into the header
    (our pass reads them there)."""
    lines = text.split("\n")
    for k, line in enumerate(lines):
        if line.strip().startswith("HloModule"):
            header = line
            for key in HEADER_OPTIONS:
                value = options[key]
                if not isinstance(value, list):
                    continue
                spelled = "%s={%s}" % (key, ",".join("true" if v else "false" for v in value))
                if re.search(r"\b%s=\{[^}]*\}" % key, header):
                    header = re.sub(r"\b%s=\{[^}]*\}" % key, spelled, header)
                elif any(v is True for v in value):
                    header = header.rstrip() + ", " + spelled
            lines[k] = header
            return "\n".join(lines)
    return text


# ---------------------------------------------------------------------------
# Running ours.


def run_hlo_opt(hlo_opt, path, out, passes, timeout, extra=()):
    cmd = [hlo_opt, path, "-o", out] + (["--passes=" + passes] if passes else []) + list(extra)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, "timeout after %ds" % timeout
    lines = [l.strip() for l in proc.stderr.strip().splitlines() if l.strip()]
    first = next((k for k, l in enumerate(lines) if "error" in l.lower()), 0)
    message = " ".join(lines[first:first + 2]) if lines and lines[first].endswith(":") \
        else (lines[first] if lines else "exit %d" % proc.returncode)
    message = message.replace(os.path.dirname(path) + os.sep, "")
    if proc.returncode != 0 and proc.returncode != 1:
        message = "exit %d (crash?): %s" % (proc.returncode, message)
    return proc.returncode == 0, message


_HELP = {}


def supports_flag(hlo_opt, flag):
    """Whether this hlo-opt takes `flag` (older builds lack the newer ones)."""
    if hlo_opt not in _HELP:
        proc = subprocess.run([hlo_opt, "--help"], capture_output=True, text=True)
        _HELP[hlo_opt] = proc.stdout
    return flag in _HELP[hlo_opt]


def evaluate(record, hlo_opt, out_dir, index, header_options, timeout):
    base = "t%03d_%s" % (index, record["test"])
    source = os.path.join(out_dir, base + ".hlo")
    printed_in = os.path.join(out_dir, base + ".in.hlo")
    printed_out = os.path.join(out_dir, base + ".out.hlo")
    text = record["module_text"]
    if header_options:
        text = with_header_options(text, record["options"])
    with open(source, "w", encoding="utf-8") as f:
        f.write(text)
    record["file"] = source
    ok_in, msg_in = run_hlo_opt(hlo_opt, source, printed_in, None, timeout)
    extra = []
    if supports_flag(hlo_opt, "--sharding-propagation-inline-calls"):
        # XLA's pass alone does not inline calls (its pipeline does, first).
        extra.append("--sharding-propagation-inline-calls=false")
    if record["options"]["is_spmd"] is not True and supports_flag(hlo_opt, "--sharding-propagation-is-spmd"):
        extra.append("--sharding-propagation-is-spmd=false")
    threads = record["options"].get("execution_threads")
    if threads not in (None, "{}") and supports_flag(hlo_opt, "--sharding-propagation-execution-threads"):
        names = re.findall(r'"([^"]*)"', threads)
        extra.append("--sharding-propagation-execution-threads=" + ",".join(names))
    ok_out, msg_out = run_hlo_opt(hlo_opt, source, printed_out, "sharding-propagation", timeout, extra)
    record["ours_ok"] = ok_out
    if not ok_in:
        record["refused"] = "parse/verify: " + msg_in
    elif not ok_out:
        record["refused"] = "sharding-propagation: " + msg_out
    before = after = None
    if ok_in and ok_out:
        with open(printed_in, encoding="utf-8") as f:
            before = Module(f.read())
        with open(printed_out, encoding="utf-8") as f:
            after = Module(f.read())
    for e in record["expectations"]:
        e["ok"] = False
        if after is None:
            e["ours"] = "(refused)"
            if e["kind"] == "status":
                # XLA's pass fails: so should ours (not our parser/verifier).
                e["ok"] = ok_in and not ok_out
                e["ours"] = msg_out if ok_in else "refused by our parser/verifier: " + msg_in
                record["refusal_expected"] = True
            continue
        kind = e["kind"]
        if kind == "changed":
            try:
                changed = before.shardings() != after.shardings()
            except ValueError as err:
                changed = None
                e["ours"] = "unparsable sharding: %s" % err
            e["ours"] = changed
            e["ok"] = changed == e["expected"]
            continue
        if kind == "status":
            e["ours"] = "the pass succeeded"
            continue
        instr = resolve(e["loc"], after)
        if not isinstance(instr, dict):
            e["ours"] = "(no such instruction)"
            continue
        e["instruction"] = instr["name"]
        ours = instr["sharding"]
        e["ours"] = ours
        try:
            if kind == "sharding":
                e["ok"] = ours is not None and same_sharding(e["expected"], ours)
                e["leaves"], e["matched"] = leaf_match(e["expected"], ours)
            elif kind == "none":
                e["ok"] = ours is None
            elif kind == "other":
                check = e["check"]
                if check == "has_sharding":
                    e["ok"] = ours is not None
                elif check in ("IsReplicated", "IsManual", "not IsManual", "not IsReplicated"):
                    want = ("replicated",) if "Replicated" in check else ("manual",)
                    value = parse_sharding(ours) if ours else None
                    hit = value == want or (isinstance(value, list) and value and all(v == want for v in value))
                    e["ok"] = (not hit) if check.startswith("not") else bool(hit)
                else:
                    other = resolve(e["other"], after)
                    theirs = other["sharding"] if isinstance(other, dict) else None
                    e["other_sharding"] = theirs
                    same = ours is not None and theirs is not None and same_sharding(ours, theirs)
                    e["ok"] = same if check == "equal" else (ours is not None and theirs is not None and not same)
        except ValueError as err:
            e["ours"] = "%s (unparsable: %s)" % (ours, err)
    for e in record["expectations"]:
        if "loc" in e:
            e["where"] = describe(e["loc"])
        if e["kind"] != "sharding":
            e["leaves"] = 1
            e["matched"] = int(e["ok"])
        e.setdefault("matched", 0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xla", help="XLA checkout (or the test file)")
    ap.add_argument("--hlo-opt", default=DEFAULT_HLO_OPT,
                    help="our hlo-opt (default %s, the release build)" % DEFAULT_HLO_OPT)
    ap.add_argument("--out", help="directory for the extracted modules and our outputs")
    ap.add_argument("--json", help="write every verdict here")
    ap.add_argument("--no-header-options", action="store_true",
                    help="do not write XLA's allow_spmd_sharding_propagation_to_* options "
                         "into the module header")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per hlo-opt run")
    ap.add_argument("--self-test", action="store_true", help="check the sharding normalizer and exit")
    ap.add_argument("-v", "--verbose", action="store_true", help="print fully matched tests too")
    args = ap.parse_args(argv)

    if args.self_test:
        return self_test()
    if not args.xla:
        ap.error("--xla is required (or --self-test)")
    with open(test_file(args.xla), encoding="utf-8") as f:
        code, strings = tokenize_strings(f.read())
    out = args.out or tempfile.mkdtemp(prefix="xla_propagation_suite.")
    os.makedirs(out, exist_ok=True)

    records = []
    for index, (fixture, name, _, body) in enumerate(split_tests(code)):
        try:
            record = extract_test(fixture, name, body, strings)
        except Exception as err:  # an extraction bug must not stop the run
            record = {"test": name, "fixture": fixture, "notes": [],
                      "not_extracted": "extraction failed: %r" % err}
        records.append(record)
        if "not_extracted" in record:
            print("not-extracted %s: %s" % (name, record["not_extracted"]))
            continue
        record["tags"] = option_tags(record["options"], not args.no_header_options)
        evaluate(record, args.hlo_opt, out, index, not args.no_header_options, args.timeout)
        del record["module_text"]
        report_test(record, args.verbose)

    summarize(records, out, not args.no_header_options)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1, default=list)
    return 0


# Kinds that count as expected shardings (tuple shardings once per element).
MAIN_KINDS = ("sharding", "none", "other")


def _main(record):
    return [e for e in record["expectations"] if e["kind"] in MAIN_KINDS]


def _fully(record):
    return all(e["ok"] for e in _main(record))


def report_test(record, verbose):
    exps = _main(record)
    leaves = sum(e["leaves"] for e in exps)
    matched = sum(e["matched"] for e in exps)
    failing = [e for e in record["expectations"] if not e["ok"]]
    tags = " [%s]" % ", ".join(record["tags"]) if record["tags"] else ""
    if not failing and not verbose:
        return
    print("%s %s: %d/%d%s" % ("ok  " if not failing else "FAIL", record["test"], matched, leaves, tags))
    if "refused" in record:
        print("    refused: %s" % record["refused"])
        if not record.get("refusal_expected"):
            return
    for e in failing:
        if e["kind"] == "changed":
            print("    changed: XLA %s, ours %s" % (e["expected"], e["ours"]))
        elif e["kind"] == "status":
            print("    status: XLA's pass fails (%s); ours: %s" % (e.get("message"), e["ours"]))
        elif "refused" in record:
            continue
        elif e["kind"] == "other":
            print("    %s: %s%s; ours %s%s" % (
                describe(e["loc"]), e["check"], " " + describe(e["other"]) if "other" in e else "",
                e["ours"] or "no sharding",
                " vs %s" % (e.get("other_sharding") or "no sharding") if "other" in e else ""))
        else:
            print("    %s: expected %s, ours %s" % (
                describe(e["loc"]), e["expected"] or "no sharding", e["ours"] or "no sharding"))


def summarize(records, out, header_options):
    run = [r for r in records if "not_extracted" not in r]
    not_extracted = [r for r in records if "not_extracted" in r]

    def line(label, rs):
        exps = [e for r in rs for e in _main(r)]
        leaves = sum(e["leaves"] for e in exps)
        matched = sum(e["matched"] for e in exps)
        full = sum(1 for r in rs if _fully(r))
        return ("%s: matches %d of %d expected shardings (%.1f%%), %d of %d tests fully "
                "[%d of %d expectations]" % (
                    label, matched, leaves, 100.0 * matched / max(leaves, 1), full, len(rs),
                    sum(e["ok"] for e in exps), len(exps)))

    print()
    print(line("propagation", run))
    by_tag = collections.OrderedDict()
    by_tag["default options"] = [r for r in run if not r["tags"]]
    for tag in sorted({t for r in run for t in r["tags"]}):
        by_tag["needs " + tag] = [r for r in run if tag in r["tags"]]
    for label, rs in by_tag.items():
        print("  " + line(label, rs))
    combos = collections.Counter(tuple(r["tags"]) for r in run if len(r["tags"]) > 1)
    for combo, n in sorted(combos.items()):
        print("    (%d tests tagged %s)" % (n, " + ".join(combo)))
    print("  (a tuple sharding counts once per element; [expectations] counts each "
          "EXPECT once, matched only if whole)")

    exps = [e for r in run if "refused" not in r for e in _main(r)]
    failed = [e for e in exps if not e["ok"]]
    absent = ("(no such instruction)",)
    differ = [e for e in failed if e["kind"] == "sharding" and e.get("ours") is not None
              and e.get("ours") not in absent]
    none_ours = [e for e in failed if e["kind"] == "sharding" and e.get("ours") is None]
    extra = [e for e in failed if e["kind"] == "none" and e.get("ours") not in absent]
    missing = [e for e in failed if e.get("ours") in absent]
    other = [e for e in failed if e["kind"] == "other" and e.get("ours") not in absent]
    refused = [r for r in run if "refused" in r and not r.get("refusal_expected")]
    print("  failed expectations: %d different sharding, %d no sharding where XLA expects one, "
          "%d a sharding where XLA expects none, %d other checks, %d instruction not in our "
          "output, %d in %d modules we refused"
          % (len(differ), len(none_ours), len(extra), len(other), len(missing),
             sum(len(_main(r)) for r in refused), len(refused)))
    allexps = [e for r in run for e in r["expectations"]]
    changed = [e for e in allexps if e["kind"] == "changed"]
    unchanged = [e for e in changed if e["expected"] is False]
    print("  `changed` expectations: %d of %d (EXPECT_FALSE(changed): %d of %d)" % (
        sum(e["ok"] for e in changed), len(changed), sum(e["ok"] for e in unchanged), len(unchanged)))
    status = [e for e in allexps if e["kind"] == "status"]
    print("  pass-error expectations (XLA's pass fails): %d of %d" % (
        sum(e["ok"] for e in status), len(status)))
    print("  our refusals: %d modules" % len(refused))
    for r in refused:
        print("    %s: %s" % (r["test"], r["refused"]))
    reasons = collections.Counter(r["not_extracted"] for r in not_extracted)
    print("  not extracted: %d tests" % len(not_extracted))
    for reason, n in reasons.most_common():
        print("    %d: %s (%s)" % (n, reason, ", ".join(r["test"] for r in not_extracted
                                                      if r["not_extracted"] == reason)))
    no_exp = [r["test"] for r in run if not _main(r)]
    if no_exp:
        print("  run, but no expected sharding extracted: %d tests (%s)" % (len(no_exp), ", ".join(no_exp)))
    noted = [(r["test"], n) for r in run for n in r["notes"]
             if n.startswith(("instruction not resolved", "loop not", "not understood",
                              "expected sharding"))]
    if noted:
        print("  expectations not extracted: %d" % len(noted))
        for test, n in noted:
            print("    %s: %s" % (test, n[:160]))
    print("  %s; %d TEST_P tests run once, with their suite's first parameter "
          "(propagate_metadata=false, clear_metadata=false, allow_root_sharding_propagation=false)" % (
              "allow_* options written into the module header" if header_options
              else "module headers left as XLA wrote them",
              sum(1 for r in run if r.get("parameterized"))))
    print("modules and outputs in %s" % out)


if __name__ == "__main__":
    sys.exit(main())
