#!/usr/bin/env python3
"""Fails when the top-level modules of a crate import each other in a loop.

For every crate of the workspace (the `members` of the root Cargo.toml, or
the crate folders given on the command line), this builds the graph of the
crate's top-level modules and reports every cycle in it.

Nodes: a top-level module is a file `src/NAME.rs` or a folder `src/NAME/`
directly under the crate's `src/` that the crate root (`src/lib.rs` or
`src/main.rs`) declares with `mod NAME`. A module's source is its file and,
when it has a folder, every `.rs` file below that folder (its submodules).
The crate root itself is not a node: its `mod` and `pub use` declarations
name every module by construction and are ignored.

Edges: A -> B when A's source (comments and string literals removed) names
B through one of
  - `crate::B` (a path, `use crate::B...`, `crate::B::f(...)`);
  - `use crate::{..., B, B::x, ...}` (the first segment of every path in a
    brace group after `crate::`);
  - `super::B`, `super::super::B`, ... (also in brace groups) when the
    `super`s climb from the file's module (inline `mod x { }` blocks
    included) to the crate root, so the path resolves to the top-level B.
Names that are not top-level modules (items the root re-exports,
`crate::SomeType`) make no edge; `$crate::` in macros makes none.

A cycle is a strongly connected component of two or more modules. The
script prints, for each crate, `ok` or the cycles with one file and line
that makes each edge of a loop, and exits 1 when any crate has one.

usage: check_module_cycles.py [--root DIR] [CRATE_DIR ...]
       check_module_cycles.py --self-test
"""

import argparse
import glob
import os
import re
import sys
import tempfile
import tomllib

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
CHAR_LITERAL = re.compile(r"'(\\(x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]+\}|.)|[^\\'\n])'")


def strip_comments_and_strings(text):
    """`text` with comments, string and char literals blanked out (newlines
    kept, so line numbers stay valid)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        m = re.compile(r'b?r(#*)"').match(text, i) if c in "br" else None
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = '"' + m.group(1)
            j = text.find(end, m.end())
            j = n if j < 0 else j + len(end)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
            continue
        if c == "'":
            # A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            m = CHAR_LITERAL.match(text, i)
            if m:
                out.append("' '")
                i = m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def brace_group_heads(text, start):
    """The first path segment of every path in the brace group that opens at
    `text[start] == '{'`, with the offset each one starts at."""
    heads, depth, i, expect = [], 0, start, True
    while i < len(text):
        c = text[i]
        if c == "{":
            depth += 1
            expect = depth == 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                break
        elif c == "," and depth == 1:
            expect = True
        elif expect and depth == 1:
            m = re.match(IDENT, text[i:])
            if m:
                heads.append((m.group(0), i))
                expect = False
                i += m.end()
                continue
        i += 1
    return heads


def inline_module_at(text):
    """For each offset of `text`, the stack of inline modules (`mod x {`)
    enclosing it, as a function of the offset."""
    spans = []  # (start, end, name)
    for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*\{", text):
        depth, j = 0, m.end() - 1
        while j < len(text):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    break
            j += 1
        spans.append((m.end(), j, m.group(1)))

    def stack(offset):
        return [name for (a, b, name) in spans if a <= offset < b]

    return stack


def references(text, module_path):
    """(top-level name, offset) for every path in `text` (a file whose module
    path is `module_path`, crate root excluded) that names a top-level item
    of the crate."""
    refs = []
    stack = inline_module_at(text)
    pattern = r"(?<![A-Za-z0-9_$])(crate|super)((?:\s*::\s*super)*)\s*::\s*(\{|" + IDENT + ")"
    for m in re.finditer(pattern, text):
        if m.group(1) == "crate":
            to_root = True
        else:
            ups = 1 + m.group(2).count("super")
            path = module_path + stack(m.start())
            to_root = ups == len(path)
        if not to_root:
            continue
        if m.group(3) == "{":
            refs.extend(brace_group_heads(text, m.end() - 1))
        else:
            refs.append((m.group(3), m.start(3)))
    return refs


def crate_modules(crate_dir):
    """Top-level modules of each crate root of `crate_dir`: a list of
    (root file, {module: [(file, module path)]})."""
    src = os.path.join(crate_dir, "src")
    result = []
    for root_name in ("lib.rs", "main.rs"):
        root = os.path.join(src, root_name)
        if not os.path.isfile(root):
            continue
        text = strip_comments_and_strings(open(root, encoding="utf-8").read())
        modules = {}
        for m in re.finditer(r"\bmod\s+(" + IDENT + r")\s*;", text):
            name = m.group(1)
            files = []
            flat = os.path.join(src, name + ".rs")
            folder = os.path.join(src, name)
            if os.path.isfile(flat):
                files.append((flat, [name]))
            if os.path.isdir(folder):
                for f in sorted(glob.glob(os.path.join(folder, "**", "*.rs"), recursive=True)):
                    rel = os.path.relpath(f, folder)[:-3].split(os.sep)
                    if rel[-1] == "mod":
                        rel = rel[:-1]
                    files.append((f, [name] + rel))
            modules[name] = files
        result.append((root, modules))
    return result


def module_graph(modules):
    """Edges {A: {B: (file, line)}} between the given top-level modules."""
    edges = {name: {} for name in modules}
    for name, files in modules.items():
        for path, module_path in files:
            text = strip_comments_and_strings(open(path, encoding="utf-8").read())
            for target, offset in references(text, module_path):
                if target in modules and target != name and target not in edges[name]:
                    line = text.count("\n", 0, offset) + 1
                    edges[name][target] = (path, line)
    return edges


def strongly_connected(edges):
    """The strongly connected components of the graph (Tarjan)."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return comps


def a_cycle(edges, comp):
    """One loop through the first module of a strongly connected component."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v]):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


def check_crate(crate_dir, out):
    """Prints the result for one crate; returns the number of cycles."""
    found = 0
    for root, modules in crate_modules(crate_dir):
        edges = module_graph(modules)
        cycles = [c for c in strongly_connected(edges) if len(c) > 1]
        label = os.path.relpath(root)
        if not cycles:
            out.write(f"ok     {label} ({len(modules)} modules)\n")
            continue
        found += len(cycles)
        for comp in cycles:
            loop = a_cycle(edges, comp)
            out.write(f"CYCLE  {label}: {{{', '.join(comp)}}}, e.g. {' -> '.join(loop)}\n")
            for a, b in zip(loop, loop[1:]):
                path, line = edges[a][b]
                out.write(f"         {a} -> {b}: {os.path.relpath(path)}:{line}\n")
    return found


def workspace_crates(root):
    with open(os.path.join(root, "Cargo.toml"), "rb") as f:
        manifest = tomllib.load(f)
    members = manifest.get("workspace", {}).get("members", [])
    crates = []
    for member in members:
        for d in sorted(glob.glob(os.path.join(root, member))):
            if os.path.isfile(os.path.join(d, "Cargo.toml")) and os.path.isdir(os.path.join(d, "src")):
                crates.append(d)
    return crates


def self_test():
    """Builds a small workspace with known cycles and checks they are found
    (and that comments, strings and submodule `super` paths make no edge)."""
    files = {
        "Cargo.toml": '[workspace]\nmembers = ["looped", "clean"]\n',
        "looped/Cargo.toml": '[package]\nname = "looped"\n',
        "looped/src/lib.rs": "pub mod x;\npub mod y;\nmod v;\nmod w;\npub use x::f;\n",
        # x -> y by a path; y -> x from a submodule, climbing two levels.
        "looped/src/x.rs": "pub fn f() -> i32 { crate::y::g() }\n",
        "looped/src/y/mod.rs": "pub mod inner;\npub fn g() -> i32 { 1 }\n",
        "looped/src/y/inner.rs": "use super::super::x;\npub fn h() -> i32 { x::f() }\n",
        # w -> v by a brace group; v -> w by `super::` from the top level.
        "looped/src/w.rs": "use crate::{v, x::f as g};\npub fn w() { v::v(); g(); }\n",
        "looped/src/v.rs": "pub fn v() { super::w::w() }\n"
                           "#[cfg(test)]\nmod tests {\n    use super::*;\n    fn t() { v() }\n}\n",
        "clean/Cargo.toml": '[package]\nname = "clean"\n',
        "clean/src/lib.rs": "mod p;\nmod q;\n",
        # Only p -> q is real; q's mentions of p are a comment, a string,
        # a nested-comment and an inline module's `super` (q's own item).
        "clean/src/p.rs": "pub fn p() -> u8 { crate::q::q() }\n",
        "clean/src/q.rs": "// use crate::p;\npub fn q() -> u8 { let _ = \"crate::p\"; let _c = '\"'; 0 }\n"
                          "/* outer /* crate::p */ still a comment crate::p */\n"
                          "mod inner { pub fn p() {} fn f() { super::inner::p() } }\n"
                          "pub fn r<'a>(s: &'a str) -> &'a str { let _ = r#\"super::p\"#; s }\n",
    }
    with tempfile.TemporaryDirectory() as root:
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)

        class Capture:
            def __init__(self):
                self.text = ""

            def write(self, s):
                self.text += s

        results = {}
        for crate in workspace_crates(root):
            cap = Capture()
            results[os.path.basename(crate)] = (check_crate(crate, cap), cap.text)
    failures = []
    cycles, text = results.get("looped", (0, ""))
    if cycles != 2 or "{x, y}" not in text or "{v, w}" not in text:
        failures.append("the looped crate should have the cycles {x, y} and {v, w}:\n" + text)
    cycles, text = results.get("clean", (1, ""))
    if cycles != 0:
        failures.append("the clean crate should have no cycle:\n" + text)
    if failures:
        sys.stdout.write("self-test FAILED\n" + "\n".join(failures))
        return 1
    sys.stdout.write("self-test ok\n")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("crates", nargs="*", help="crate folders (default: every workspace member)")
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                        help="workspace root (default: the checkout this script is in)")
    parser.add_argument("--self-test", action="store_true", help="check the checker on a small workspace")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    crates = args.crates or workspace_crates(os.path.abspath(args.root))
    found = sum(check_crate(c, sys.stdout) for c in crates)
    if found:
        sys.stdout.write(f"{found} module cycle(s) found\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
