#!/usr/bin/env python3
"""XLA's HLO-parser unit tests as a held-out suite: does our parser (with our
verifier) accept exactly the modules XLA's parser accepts, and does XLA's
parser accept what our printer writes?

The modules come from an XLA source checkout given by path
(xla/hlo/parser/hlo_parser_test.cc): every raw string literal in that file
that holds `HloModule`. Nothing of XLA's text is written into this
repository; the extracted modules go to --out (a temporary directory by
default).

For each module:
  - XLA: `hlo_module_from_text` from jaxlib (XLA's HloParser, unverified);
  - ours: `hlo-opt FILE -o OUT` (parse, verify, print), exit status 0 or 1;
  - printer: where both accept, XLA's parser on our printed module.

Prints one line per disagreement (`xla-accepts` / `xla-refuses` with our
message or XLA's), then the totals; `--json FILE` writes every verdict.
Exits 0: this is a measurement, not a test (the project's own regression
tests pin the fixed classes).

Usage:
    python3 tools/xla_conformance/parser_suite.py --xla PATH_TO_XLA_CHECKOUT \
        [--hlo-opt target/release/hlo-opt] [--out DIR] [--json FILE] [-v]
PATH_TO_XLA_CHECKOUT is a directory holding xla/hlo/parser/hlo_parser_test.cc
(an openxla/xla checkout), or that test file itself.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO_ROOT, "tools"))
from check_xla_parses import find_parser, first_line  # noqa: E402

TEST_FILE = os.path.join("xla", "hlo", "parser", "hlo_parser_test.cc")
RAW_STRING = re.compile(r'R"(\w*)\((.*?)\)\1"', re.S)


def test_file(xla):
    return xla if os.path.isfile(xla) else os.path.join(xla, TEST_FILE)


def extract_modules(source):
    """Distinct raw-string modules of a C++ test file, in file order, each
    with the line it starts on."""
    seen = set()
    out = []
    for m in RAW_STRING.finditer(source):
        body = m.group(2)
        if "HloModule" not in body or body in seen:
            continue
        seen.add(body)
        out.append((source.count("\n", 0, m.start()) + 1, body))
    return out


def ours(hlo_opt, path, printed):
    proc = subprocess.run([hlo_opt, path, "-o", printed], capture_output=True,
                          text=True, timeout=60)
    lines = proc.stderr.strip().splitlines()
    located = [l for l in lines if l.startswith(path + ":")]
    message = (located or lines or [""])[0]
    return proc.returncode == 0, message


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--xla", required=True, help="XLA checkout (or the test file)")
    ap.add_argument("--hlo-opt", default=os.path.join(REPO_ROOT, "target", "release", "hlo-opt"))
    ap.add_argument("--out", help="directory for the extracted and printed modules")
    ap.add_argument("--json", help="write every verdict here")
    ap.add_argument("-v", "--verbose", action="store_true", help="print agreements too")
    args = ap.parse_args(argv)

    parse, desc = find_parser()
    if parse is None:
        print("jaxlib not usable: skipping (%s)" % desc)
        return 0
    path = test_file(args.xla)
    with open(path, encoding="utf-8") as f:
        modules = extract_modules(f.read())
    out = args.out or tempfile.mkdtemp(prefix="xla_parser_suite.")
    os.makedirs(out, exist_ok=True)

    verdicts = []
    agree = printer_ok = printer_total = 0
    for index, (line, text) in enumerate(modules):
        name = "m%03d_line%d" % (index, line)
        source = os.path.join(out, name + ".hlo")
        printed = os.path.join(out, name + ".printed.hlo")
        with open(source, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            parse(text)
            xla_ok, xla_message = True, ""
        except Exception as e:  # XLA's parser raises on every refusal
            xla_ok, xla_message = False, first_line(e)
        our_ok, our_message = ours(args.hlo_opt, source, printed)
        verdict = {"module": name, "line": line, "xla": xla_ok, "ours": our_ok,
                   "xla_message": xla_message, "our_message": our_message}
        if xla_ok == our_ok:
            agree += 1
            if args.verbose:
                print("agree      %s (%s)" % (name, "accepts" if xla_ok else "refuses"))
        elif xla_ok:
            print("xla-accepts %s: ours: %s" % (name, our_message))
        else:
            print("xla-refuses %s: xla: %s" % (name, xla_message))
        if our_ok and xla_ok:
            printer_total += 1
            with open(printed, encoding="utf-8") as f:
                try:
                    parse(f.read())
                    printer_ok += 1
                    verdict["printer"] = True
                except Exception as e:
                    verdict["printer"] = False
                    print("printer    %s: xla: %s" % (name, first_line(e)))
        verdicts.append(verdict)

    total = len(modules)
    xla_accepts = sum(v["xla"] for v in verdicts)
    print("parser: agree with XLA on %d of %d modules (%.1f%%); XLA accepts %d, "
          "we accept %d of those and %d that XLA refuses"
          % (agree, total, 100.0 * agree / max(total, 1), xla_accepts,
             sum(v["xla"] and v["ours"] for v in verdicts),
             sum(v["ours"] and not v["xla"] for v in verdicts)))
    print("printer: XLA parses our output of %d of %d modules" % (printer_ok, printer_total))
    print("modules in %s" % out)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(verdicts, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
