#!/usr/bin/env python3
"""Check that HLO text files parse with XLA's own HLO parser (from jaxlib).

Usage:
    python3 tools/check_xla_parses.py FILE.hlo [FILE.hlo ...]
    python3 tools/check_xla_parses.py --from-list LIST.txt   # one path per line

Prints one line per file, `OK <path>` or `FAIL <path>: <first line of error>`,
and exits 1 if any file fails.  If jax/jaxlib cannot be imported it prints
`jaxlib not installed: skipping` and exits 0, so callers (CI) can run it
unconditionally.

Parser entry point (jaxlib 0.10.2): `jaxlib._hlo.hlo_module_from_text(str)`,
reachable as `jax._src.lib.xla_client.hlo.hlo_module_from_text`.  It runs
XLA's HloParser (ParseAndReturnUnverifiedModule); it does not run the HLO
verifier.  Older jaxlibs exposed the same function as
`xla_client._xla.hlo_module_from_text`; both are tried.
"""

import argparse
import sys


def find_parser():
    """Return (callable, description) or (None, reason)."""
    try:
        import jax  # noqa: F401  (makes sure the jaxlib matching jax is used)
        from jax._src.lib import xla_client
    except Exception as e:  # ImportError, or a broken install
        return None, "%s: %s" % (type(e).__name__, e)
    candidates = []
    hlo_mod = getattr(xla_client, "hlo", None)
    if hlo_mod is not None:
        candidates.append((hlo_mod, "jax._src.lib.xla_client.hlo.hlo_module_from_text"))
    xla_mod = getattr(xla_client, "_xla", None)
    if xla_mod is not None:
        candidates.append((xla_mod, "jax._src.lib.xla_client._xla.hlo_module_from_text"))
    try:
        from jaxlib import _hlo
        candidates.append((_hlo, "jaxlib._hlo.hlo_module_from_text"))
    except Exception:
        pass
    for mod, desc in candidates:
        fn = getattr(mod, "hlo_module_from_text", None)
        if fn is not None:
            return fn, desc
    return None, "no hlo_module_from_text entry point found in this jaxlib"


def first_line(msg):
    """First line of an error; XLA's parser puts the useful `error:` line
    second ("Syntax error when trying to parse ...:" comes first), so that
    one is appended when present."""
    lines = [l.strip() for l in str(msg).strip().splitlines() if l.strip()]
    if not lines:
        return "(empty error message)"
    out = lines[0]
    for l in lines[1:]:
        if "error:" in l:
            out += " " + l
            break
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="HLO text files")
    ap.add_argument("--from-list", action="append", default=[], metavar="FILE",
                    help="file with one HLO path per line (blank lines and #-comments ignored)")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="print which parser entry point is used")
    args = ap.parse_args(argv)

    paths = list(args.files)
    for lst in args.from_list:
        with open(lst) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    paths.append(line)

    parse, desc = find_parser()
    if parse is None:
        if desc.startswith(("ModuleNotFoundError", "ImportError")):
            print("jaxlib not installed: skipping (%s)" % desc)
            return 0
        print("jaxlib not usable: skipping (%s)" % desc)
        return 0
    if args.verbose:
        print("# parser: %s" % desc)
    if not paths:
        ap.error("no files given")

    failed = 0
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                text = f.read()
        except Exception as e:
            print("FAIL %s: %s" % (p, first_line(e)))
            failed += 1
            continue
        try:
            parse(text)
        except Exception as e:
            print("FAIL %s: %s" % (p, first_line(e)))
            failed += 1
            continue
        print("OK %s" % p)
    if failed:
        print("%d of %d file(s) failed to parse" % (failed, len(paths)), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
