#!/usr/bin/env python3
"""Check that the Bazel build files agree with the Cargo manifests.

Usage:
    python3 tools/check_bazel_cargo.py [--root DIR] [-v]

Cargo is the source of truth; every crate of the Cargo workspace is mirrored by
a BUILD.bazel next to its Cargo.toml (rules_rust + crate_universe).  This
script reads Cargo.toml files with tomllib and BUILD.bazel / MODULE.bazel with
Python's `ast` module (Starlark is Python syntax), evaluating just enough of it
(lists, `+`, glob(), select(), module-level constants and the crate_universe
macros) to compare the two.  Every BUILD file is evaluated twice: in the
default configuration and with the CUDA switch on (--config=cuda, the
config_setting //tools/bazel:cuda_enabled; select() on it takes that branch),
each compared with what Cargo builds by default and with the GPU features
(`cuda`, `nccl` of every member that declares them).  Macros that a BUILD file loads from this
repository's .bzl files (tools/bazel/rust_crate.bzl's rust_library_crate and
rust_binary_crate) are run as Python, with stand-ins that record every rule
they call, so the targets they declare are checked like hand-written ones.
It checks, for every crate:

  * the crate directory has a BUILD.bazel, and every source file its Rust
    targets name (srcs, crate_root) exists;
  * the [lib] has a rust_library whose crate_name is the lib name, and every
    binary ([[bin]], src/main.rs, src/bin/*.rs) a rust_binary of the same name;
    no other rust_library / rust_binary (benches and examples excepted);
  * first-party (path) [dependencies] == first-party labels in the library's and
    binaries' deps (binaries also depend on their own library); third-party
    dependencies come in through all_crate_deps(normal = True) (or explicit
    @crates//:name labels, which must name Cargo dependencies), proc macros
    through all_crate_deps(proc_macro = True); all_crate_deps() itself is
    computed from Cargo.toml, so it cannot disagree with it;
    C/C++ targets of the same package in deps (cc_library, e.g. a cxx bridge)
    are not Cargo dependencies and are not compared;
  * unit tests: a rust_test with crate = the library and each binary (unless
    Cargo says test = false), whose deps add the first-party [dev-dependencies]
    and all_crate_deps(normal_dev = True) when there are third-party dev deps;
  * integration tests: every tests/*.rs, tests/*/main.rs and [[test]] is
    covered by a rust_test or rust_test_suite whose deps are the library, the
    first-party normal and dev dependencies and all_crate_deps(normal,
    normal_dev); a test source that mentions "testdata" must have //testdata in
    its data, one that mentions "../shared" must be tagged "external", one
    that is all `#![cfg(feature = "cuda")]` (or "nccl") must be tagged
    "requires-gpu-nvidia";
  * benches and examples are covered by some rust target;
  * crate_features: the library/binaries carry exactly the features Cargo turns
    on in a workspace build (the `default` closure plus features that other
    members request), and tests carry at least those; every crate_features
    value must be a feature declared in Cargo.toml; with the CUDA switch, the
    same with the GPU features on;
  * optional third-party dependencies (cudarc): all_crate_deps() leaves them
    out, so a target names them (@crates//:cudarc) exactly in the
    configurations where Cargo enables them; MODULE.bazel has a crate.spec
    for each (equal to its [workspace.dependencies] entry), which gives
    crate_universe's @crates the alias;
  * the CUDA switch: tools/bazel/BUILD.bazel has the bool_flag //tools/bazel:cuda
    and the config_setting :cuda_enabled on it, and .bazelrc's --config=cuda
    sets the flag;
  * workspace: root Cargo.toml `members` == the crate directories found on
    disk == the member manifests listed in MODULE.bazel's crate.from_cargo
    (which must also list //:Cargo.toml and use cargo_lockfile //:Cargo.lock).

Crates with their own [workspace] table (e.g. the cargo-fuzz crate) or listed
in workspace.exclude are separate Cargo workspaces and are not checked.

Prints `bazel/cargo consistency: N crates OK` and exits 0, or prints one line
per mismatch (naming the crate) and exits 1.  Python 3.11+ stdlib only.
"""

import argparse
import ast
import builtins
import fnmatch
import os
import re
import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python < 3.11
    sys.exit("check_bazel_cargo: needs Python 3.11+ (tomllib)")

SKIP_DIRS = {".git", "target", "node_modules", "__pycache__", ".vendor"}
BUILD_NAMES = ("BUILD.bazel", "BUILD")
LIB_RULES = ("rust_library", "rust_proc_macro", "rust_shared_library", "rust_static_library")
# Non-Rust targets a Rust target may depend on (C/C++ code linked into it);
# they are not Cargo dependencies, so the comparison skips them.
NATIVE_RULES = ("cc_library", "cc_import", "rust_cxx_bridge")
THIRD_PARTY_REPO = "@crates"
# The CUDA switch (tools/bazel/BUILD.bazel): a bool_flag, the config_setting
# that select() uses, the .bazelrc config that turns it on, and the Cargo
# features it stands for in every member that declares them.
CUDA_FLAG = "//tools/bazel:cuda"
CUDA_SETTING = "//tools/bazel:cuda_enabled"
CUDA_CONFIG = "--config=cuda"
GPU_FEATURES = ("cuda", "nccl")
# A test file that only exists with a GPU feature (#![cfg(feature = "nccl")])
# needs a GPU: its target carries GPU_TAG, which --config=ci filters out.
GPU_TEST = re.compile(r'^#!\[cfg\(feature = "(%s)"\)\]' % "|".join(GPU_FEATURES), re.M)
GPU_TAG = "requires-gpu-nvidia"
# select() keys that are configuration switches the check evaluates; other
# selects (platforms) merge every branch.
SWITCHES = (CUDA_SETTING,)


# --------------------------------------------------------------------------- #
# Starlark evaluation (the small subset BUILD files use)
# --------------------------------------------------------------------------- #


class CrateDeps:
    """The value of an all_crate_deps(...) call: which dependency kinds it covers."""

    KINDS = ("normal", "normal_dev", "proc_macro", "proc_macro_dev", "build", "build_proc_macro")

    def __init__(self, kinds):
        self.kinds = frozenset(kinds) or frozenset({"normal"})  # no flags = normal

    def __repr__(self):
        return "all_crate_deps(%s)" % ", ".join(sorted(self.kinds))


class Unknown:
    def __repr__(self):
        return "<unknown>"


UNKNOWN = Unknown()


def split_path(p):
    return [s for s in p.split("/") if s not in ("", ".")]


def glob_match(pattern, rel):
    """Bazel glob semantics: '**' spans any number of path segments."""

    def rec(ps, ss):
        if not ps:
            return not ss
        if ps[0] == "**":
            return any(rec(ps[1:], ss[i:]) for i in range(len(ss) + 1))
        return bool(ss) and fnmatch.fnmatchcase(ss[0], ps[0]) and rec(ps[1:], ss[1:])

    return rec(split_path(pattern), split_path(rel))


def package_files(pkg_dir):
    """Files of a Bazel package, relative to it (subpackages excluded)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(pkg_dir):
        d = Path(dirpath)
        if d != pkg_dir and any((d / b).is_file() for b in BUILD_NAMES):
            dirnames[:] = []
            continue
        dirnames[:] = [n for n in dirnames if n not in SKIP_DIRS]
        for f in filenames:
            out.append((d / f).relative_to(pkg_dir).as_posix())
    return sorted(out)


class BuildError(Exception):
    """A BUILD file, or a macro it calls, that cannot be evaluated."""


def merge_select(branches):
    """select({...}) as the union of its branches (every platform's deps)."""
    merged = []
    if isinstance(branches, dict):
        for v in branches.values():
            if isinstance(v, list):
                merged += [x for x in v if x not in merged]
    return merged


def select_in(branches, config):
    """select({...}) in a configuration: the set of SWITCHES that are on.

    A select on a switch takes the branch of the switch that is on, else
    //conditions:default; any other select is the union of its branches.
    """
    if not isinstance(branches, dict):
        return UNKNOWN
    keys = {norm_label(k, "") if isinstance(k, str) else k: v for k, v in branches.items()}
    if not any(k in SWITCHES for k in keys):
        return merge_select(branches)
    for k, v in keys.items():
        if k in config:
            return v
    if "//conditions:default" not in keys:
        raise BuildError("select() on %s has no branch for this configuration" % ", ".join(sorted(keys)))
    return keys["//conditions:default"]


class Native:
    """Starlark's `native` module, as a macro sees it: the calling package's glob."""

    def __init__(self, build_file):
        self._build_file = build_file

    def glob(self, include, exclude=(), allow_empty=True):
        return self._build_file.glob(include, list(exclude))

    def package_name(self):
        pkg = self._build_file.pkg_dir.relative_to(self._build_file.root).as_posix()
        return "" if pkg == "." else pkg


# Builtins of Starlark that the first-party .bzl files may use (they are run as
# Python: see BuildFile.load_bzl).
STARLARK_BUILTINS = {
    name: getattr(builtins, name)
    for name in ("all", "any", "bool", "dict", "enumerate", "getattr", "hasattr", "int", "len", "list",
                 "max", "min", "print", "range", "reversed", "sorted", "str", "tuple", "zip")
}


class BuildFile:
    """Module-level rule calls of a BUILD/MODULE file, with evaluated attributes.

    Rules loaded from other repositories (@rules_rust, @rules_cc, ...) are
    recorded as calls of their name. Macros loaded from this repository's .bzl
    files are run, as Python, with every rule they call recorded the same way,
    so a macro's targets are checked like hand-written ones.
    """

    def __init__(self, path, pkg_dir, root=None, config=frozenset()):
        self.path = path
        self.pkg_dir = pkg_dir
        self.root = root or pkg_dir
        self.config = config  # the SWITCHES that are on
        self.env = {}
        self.functions = {}  # name -> Python callable: first-party macros and functions
        self.rules = []  # (kind, {attr: value}) ; method calls are "obj.method"
        self._files = None
        tree = ast.parse(path.read_text(), filename=str(path))
        for stmt in tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                self.env[stmt.targets[0].id] = self.ev(stmt.value)
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                call = stmt.value
                kind = self.callee(call)
                if kind == "load":
                    args = [self.ev(a) for a in call.args]
                    kwargs = {kw.arg: self.ev(kw.value) for kw in call.keywords if kw.arg}
                    self.functions.update(self.load(path, *args, **kwargs))
                elif kind in self.functions:
                    self.ev(call)
                elif kind:
                    attrs = {kw.arg: self.ev(kw.value) for kw in call.keywords if kw.arg}
                    self.rules.append((kind, attrs))

    def record(self, kind):
        """A stand-in for the rule `kind`: records the call."""

        def rule(**attrs):
            self.rules.append((kind, attrs))

        return rule

    def load(self, from_file, label, *names, **renamed):
        """The symbols a load() statement binds, as Python callables.

        Other repositories' symbols are recorders of their (original) name,
        except @crates' all_crate_deps/aliases/crate_deps, whose values stand for
        what the crate's Cargo.toml lists; this repository's .bzl files are run.
        """
        wanted = {n: n for n in names if isinstance(n, str)}
        wanted.update({k: v for k, v in renamed.items() if isinstance(v, str)})
        if not isinstance(label, str):
            raise BuildError("%s: load() of a non-string label" % from_file)
        if label.startswith("@") and not label.startswith("@//") and not label.startswith("@@//"):
            if label.startswith(THIRD_PARTY_REPO + "//"):
                crates = {
                    "all_crate_deps": lambda **kw: [CrateDeps(k for k in CrateDeps.KINDS if kw.get(k) is True)],
                    "aliases": lambda **kw: UNKNOWN,
                    "crate_deps": lambda deps, **kw: ["%s//:%s" % (THIRD_PARTY_REPO, d) for d in deps],
                }
                return {k: crates.get(v, self.record(v)) for k, v in wanted.items()}
            return {k: self.record(v) for k, v in wanted.items()}
        bzl = self.bzl_path(from_file, label)
        module = self.load_bzl(bzl)
        missing = [v for v in wanted.values() if v not in module]
        if missing:
            raise BuildError("%s: %s has no %s" % (from_file, label, ", ".join(missing)))
        return {k: module[v] for k, v in wanted.items()}

    def bzl_path(self, from_file, label):
        for prefix in ("@@//", "@//"):
            if label.startswith(prefix):
                label = label[len(prefix) - 2 :]
        if label.startswith("//"):
            pkg, _, name = label[2:].partition(":")
            path = self.root / pkg / name
        elif label.startswith(":"):
            path = from_file.parent / label[1:]
        else:
            raise BuildError("%s: cannot load %r" % (from_file, label))
        if not path.is_file():
            raise BuildError("%s: load(%r): no such file %s" % (from_file, label, path))
        return path

    def load_bzl(self, bzl):
        """Runs a first-party .bzl file as Python; its global names.

        Starlark is close to a subset of Python: the file gets Starlark's
        builtins (and only those), fail(), select(), Label() and `native` for
        the package being read, and its own load() statements bind rule
        recorders or other first-party files' names.
        """

        def fail(msg, *args, **kwargs):
            raise BuildError("%s: fail(%s)" % (bzl.name, msg))

        def load(label, *names, **renamed):
            module.update(self.load(bzl, label, *names, **renamed))

        module = {
            "__builtins__": dict(STARLARK_BUILTINS),
            "fail": fail,
            "load": load,
            "select": lambda branches, **kw: select_in(branches, self.config),
            "Label": lambda label: label,
            "native": Native(self),
        }
        try:
            exec(compile(bzl.read_text(), str(bzl), "exec"), module)
        except BuildError:
            raise
        except Exception as e:  # noqa: BLE001 - any error in the file is reported as one
            raise BuildError("%s: cannot run as Python: %s: %s" % (bzl, type(e).__name__, e)) from e
        return module

    @staticmethod
    def callee(call):
        f = call.func
        if isinstance(f, ast.Name):
            return f.id
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            return f.value.id + "." + f.attr
        return None

    def files(self):
        if self._files is None:
            self._files = package_files(self.pkg_dir)
        return self._files

    def glob(self, include, exclude=()):
        inc = include if isinstance(include, list) else []
        exc = exclude if isinstance(exclude, list) else []
        return [
            f
            for f in self.files()
            if any(glob_match(p, f) for p in inc) and not any(glob_match(p, f) for p in exc)
        ]

    def ev(self, node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.ev(e) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {self.ev(k): self.ev(v) for k, v in zip(node.keys, node.values) if k is not None}
        if isinstance(node, ast.Name):
            return self.env.get(node.id, UNKNOWN)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            a, b = self.ev(node.left), self.ev(node.right)
            if isinstance(a, list) and isinstance(b, list):
                return a + b
            if isinstance(a, str) and isinstance(b, str):
                return a + b
            return UNKNOWN
        if isinstance(node, ast.Call):
            name = self.callee(node)
            args = [self.ev(a) for a in node.args]
            kwargs = {kw.arg: self.ev(kw.value) for kw in node.keywords if kw.arg}
            if name == "glob":
                include = args[0] if args else kwargs.get("include", [])
                exclude = args[1] if len(args) > 1 else kwargs.get("exclude", [])
                return self.glob(include, exclude)
            if name == "all_crate_deps":
                return [CrateDeps(k for k in CrateDeps.KINDS if kwargs.get(k) is True)]
            if name == "select":
                return select_in(args[0] if args else kwargs.get("x", {}), self.config)
            if name in self.functions:
                try:
                    return self.functions[name](*args, **kwargs)
                except BuildError:
                    raise
                except Exception as e:  # noqa: BLE001 - e.g. an attribute that is not a list
                    raise BuildError("%s: %s(...) failed: %s: %s" % (self.path, name, type(e).__name__, e)) from e
            return UNKNOWN
        return UNKNOWN

    def targets(self, *kinds):
        return [(k, a) for k, a in self.rules if k in kinds]


# --------------------------------------------------------------------------- #
# Labels
# --------------------------------------------------------------------------- #


def norm_label(label, pkg):
    """Canonical '//pkg:name' for a main-repo label; other repos unchanged."""
    if not isinstance(label, str):
        return None
    for prefix in ("@@//", "@//"):
        if label.startswith(prefix):
            label = label[len(prefix) - 2 :]
    if label.startswith("@"):
        return label
    if label.startswith("//"):
        path, _, name = label[2:].partition(":")
        return "//%s:%s" % (path, name or path.rsplit("/", 1)[-1])
    return "//%s:%s" % (pkg, label.lstrip(":"))


def strings(value):
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def crate_deps_kinds(value):
    kinds = set()
    if isinstance(value, list):
        for v in value:
            if isinstance(v, CrateDeps):
                kinds |= v.kinds
    return kinds


# --------------------------------------------------------------------------- #
# Cargo
# --------------------------------------------------------------------------- #


def load_toml(path):
    with open(path, "rb") as f:
        return tomllib.load(f)


class Crate:
    def __init__(self, root, rel_dir, manifest, workspace_deps):
        self.root = root
        self.rel = rel_dir  # "" for the root
        self.dir = root / rel_dir if rel_dir else root
        self.pkg = rel_dir  # Bazel package name
        self.m = manifest
        p = manifest["package"]
        self.name = p["name"]
        self.label = "%s (%s)" % (self.name, rel_dir or ".")
        self.features = manifest.get("features", {})
        self.deps = {"normal": [], "dev": [], "build": []}
        self.ws_deps = workspace_deps
        self._collect_deps(manifest)
        self.optional = {d["key"] for kind in self.deps.values() for d in kind if d["optional"]}

        # Library.
        lib = manifest.get("lib")
        self.lib = None
        if lib is not None or (self.dir / "src/lib.rs").is_file():
            lib = lib or {}
            if manifest.get("package", {}).get("autolib", True) or "lib" in manifest:
                self.lib = {
                    "name": lib.get("name", self.name.replace("-", "_")),
                    "path": lib.get("path", "src/lib.rs"),
                    "test": lib.get("test", True),
                    "proc_macro": lib.get("proc-macro", False),
                }

        # Binaries.
        bins = [
            {"name": b["name"], "path": b.get("path"), "test": b.get("test", True)}
            for b in manifest.get("bin", [])
        ]
        if p.get("autobins", True):
            auto = []
            if (self.dir / "src/main.rs").is_file():
                auto.append((self.name, "src/main.rs"))
            for f in sorted((self.dir / "src/bin").glob("*.rs")):
                auto.append((f.stem, "src/bin/" + f.name))
            for f in sorted((self.dir / "src/bin").glob("*/main.rs")):
                auto.append((f.parent.name, "src/bin/%s/main.rs" % f.parent.name))
            for name, path in auto:
                if not any(b["name"] == name or b["path"] == path for b in bins):
                    bins.append({"name": name, "path": path, "test": True})
        for b in bins:
            if b["path"] is None:
                b["path"] = "src/main.rs" if b["name"] == self.name else "src/bin/%s.rs" % b["name"]
        self.bins = bins

        # Integration tests, benches, examples.
        self.tests = self._auto_targets("test", "tests", p.get("autotests", True))
        self.benches = self._auto_targets("bench", "benches", p.get("autobenches", True))
        self.examples = self._auto_targets("example", "examples", p.get("autoexamples", True))

    def _auto_targets(self, key, folder, auto):
        paths = []
        for t in self.m.get(key, []):
            paths.append(t.get("path", "%s/%s.rs" % (folder, t["name"])))
        if auto:
            d = self.dir / folder
            for f in sorted(d.glob("*.rs")):
                paths.append("%s/%s" % (folder, f.name))
            for f in sorted(d.glob("*/main.rs")):
                paths.append("%s/%s/main.rs" % (folder, f.parent.name))
        return sorted(set(paths))

    def _collect_deps(self, m):
        tables = [m]
        for tgt in m.get("target", {}).values():
            tables.append(tgt)
        for t in tables:
            for kind, key in (("normal", "dependencies"), ("dev", "dev-dependencies"), ("build", "build-dependencies")):
                for dep_key, spec in t.get(key, {}).items():
                    self.deps[kind].append(self._resolve(dep_key, spec))

    def _resolve(self, key, spec):
        if isinstance(spec, str):
            spec = {"version": spec}
        base_dir = self.dir
        merged = dict(spec)
        if spec.get("workspace") is True:
            ws = self.ws_deps.get(key, {})
            if isinstance(ws, str):
                ws = {"version": ws}
            merged = dict(ws)
            merged["features"] = list(ws.get("features", [])) + list(spec.get("features", []))
            merged["optional"] = spec.get("optional", False)
            base_dir = self.root
        path = merged.get("path")
        return {
            "key": key,
            "package": merged.get("package", key),
            "path": (base_dir / path).resolve() if path else None,
            "features": list(merged.get("features", [])),
            "optional": merged.get("optional", False),
        }


def enabled_features(crates, requested=()):
    """Features Cargo turns on for each member in a workspace build (a fixpoint).

    `requested`: features turned on in every member that declares them (as
    `cargo build --features member/feature` for each), e.g. GPU_FEATURES.
    """
    by_dir = {c.dir.resolve(): c for c in crates}
    enabled = {
        c.name: ({"default"} if "default" in c.features else set()) | {f for f in requested if f in c.features}
        for c in crates
    }
    enabled_deps = {c.name: set() for c in crates}
    changed = True
    while changed:
        changed = False

        def add(crate_name, feat):
            nonlocal changed
            if feat not in enabled[crate_name]:
                enabled[crate_name].add(feat)
                changed = True

        for c in crates:
            deps = {d["key"]: d for d in c.deps["normal"]}
            for f in list(enabled[c.name]):
                for entry in c.features.get(f, []):
                    if entry.startswith("dep:"):
                        enabled_deps[c.name].add(entry[4:])
                    elif "/" in entry:
                        dep, _, feat = entry.partition("/")
                        weak = dep.endswith("?")
                        dep = dep.rstrip("?")
                        if not weak:
                            enabled_deps[c.name].add(dep)
                        d = deps.get(dep)
                        if d and d["path"] in by_dir and (not weak or dep in enabled_deps[c.name]):
                            add(by_dir[d["path"]].name, feat)
                    elif entry in c.features or entry in c.optional:
                        add(c.name, entry)
                        if entry in c.optional:
                            enabled_deps[c.name].add(entry)
            for d in c.deps["normal"]:
                t = by_dir.get(d["path"]) if d["path"] else None
                if t is None or (d["optional"] and d["key"] not in enabled_deps[c.name]):
                    continue
                for feat in d["features"]:
                    add(t.name, feat)
    return enabled, enabled_deps


# --------------------------------------------------------------------------- #
# The check
# --------------------------------------------------------------------------- #


class Checker:
    def __init__(self, root, verbose=False):
        self.root = root
        self.verbose = verbose
        self.errors = []

    def err(self, who, msg):
        self.errors.append("%s: %s" % (who, msg))

    def find_crate_dirs(self):
        """Directories holding a Cargo.toml with [package], minus separate workspaces."""
        found, separate = [], []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(n for n in dirnames if n not in SKIP_DIRS and not n.startswith("bazel-"))
            if "Cargo.toml" not in filenames:
                continue
            d = Path(dirpath)
            m = load_toml(d / "Cargo.toml")
            if "package" not in m:
                continue
            rel = d.relative_to(self.root).as_posix()
            rel = "" if rel == "." else rel
            if "workspace" in m and rel:
                separate.append(rel)
            else:
                found.append(rel)
        return found, separate

    def run(self):
        root_manifest = load_toml(self.root / "Cargo.toml")
        ws = root_manifest.get("workspace", {})
        excluded = {e.rstrip("/") for e in ws.get("exclude", [])}
        members = []
        for pat in ws.get("members", []):
            hits = [p for p in sorted(self.root.glob(pat)) if (p / "Cargo.toml").is_file()]
            if not any(c in pat for c in "*?["):
                hits = [self.root / pat]
            for h in hits:
                rel = h.relative_to(self.root).as_posix()
                if rel not in excluded:
                    members.append(rel)
        if "package" in root_manifest:
            members.append("")

        on_disk, separate = self.find_crate_dirs()
        on_disk = [d for d in on_disk if d not in excluded and not any(d.startswith(e + "/") for e in excluded)]
        if self.verbose:
            for s in separate:
                print("skipping %s: it has its own [workspace]" % s)

        ws_who = "workspace (Cargo.toml)"
        for d in sorted(set(members) - set(on_disk)):
            self.err(ws_who, "member %r has no Cargo.toml with a [package]" % d)
        for d in sorted(set(on_disk) - set(members)):
            self.err(ws_who, "crate directory %r is not listed in [workspace] members" % (d or "."))

        self.check_module(sorted(set(members) & set(on_disk)))

        ws_deps = ws.get("dependencies", {})
        crates = []
        for d in sorted(set(members) & set(on_disk)):
            crates.append(Crate(self.root, d, load_toml((self.root / d) / "Cargo.toml"), ws_deps))
        enabled, enabled_deps = enabled_features(crates)
        gpu_enabled, gpu_enabled_deps = enabled_features(crates, GPU_FEATURES)

        self.check_switch()
        self.check_specs(crates, gpu_enabled_deps, ws_deps)

        builds, gpu_builds = {}, {}
        for c in crates:
            bf = next((c.dir / b for b in BUILD_NAMES if (c.dir / b).is_file()), None)
            if bf is None:
                self.err(c.label, "no BUILD.bazel next to Cargo.toml")
                continue
            try:
                builds[c.name] = BuildFile(bf, c.dir, self.root)
                gpu_builds[c.name] = BuildFile(bf, c.dir, self.root, frozenset({CUDA_SETTING}))
            except SyntaxError as e:
                self.err(c.label, "cannot parse %s: %s" % (bf.relative_to(self.root), e))
            except BuildError as e:
                self.err(c.label, "cannot evaluate %s: %s" % (bf.relative_to(self.root), e))

        # Label of each crate's library target (what dependents put in deps).
        lib_labels = {}
        for c in crates:
            b = builds.get(c.name)
            if b is None or c.lib is None:
                continue
            for _, a in b.targets(*LIB_RULES):
                if self.crate_name_of(a) == c.lib["name"]:
                    lib_labels[c.name] = norm_label(":" + a.get("name", ""), c.pkg)
                    break
            else:
                lib_labels[c.name] = norm_label("//" + c.pkg, c.pkg)  # for messages only

        by_dir = {c.dir.resolve(): c for c in crates}
        for c in crates:
            if c.name in builds:
                self.check_crate(c, builds[c.name], by_dir, lib_labels, enabled[c.name], enabled_deps[c.name])
        # With the CUDA switch: only what differs from the default configuration
        # is reported (a missing source would otherwise be reported twice).
        default_errors = set(self.errors)
        tag = " with " + CUDA_CONFIG
        n = len(self.errors)
        for c in crates:
            if c.name in gpu_builds:
                self.check_crate(c, gpu_builds[c.name], by_dir, lib_labels, gpu_enabled[c.name],
                                 gpu_enabled_deps[c.name], tag)
        self.errors[n:] = [e for e in self.errors[n:] if e.replace(tag, "", 1) not in default_errors]
        return len(crates)

    def check_switch(self):
        """The CUDA switch: bool_flag and config_setting in tools/bazel, set by --config=cuda."""
        who = "CUDA switch"
        flag_pkg, _, flag = CUDA_FLAG[2:].partition(":")
        setting_pkg, _, setting = CUDA_SETTING[2:].partition(":")
        path = self.root / flag_pkg / "BUILD.bazel"
        if not path.is_file():
            self.err(who, "%s is missing (it declares %s)" % (path.relative_to(self.root), CUDA_FLAG))
            return
        try:
            b = BuildFile(path, path.parent, self.root)
        except (SyntaxError, BuildError) as e:
            self.err(who, "cannot evaluate %s: %s" % (path.relative_to(self.root), e))
            return
        flags = [a for k, a in b.targets("bool_flag") if a.get("name") == flag]
        if not flags or flags[0].get("build_setting_default") is not False:
            self.err(who, "%s: no bool_flag %r with build_setting_default = False" % (path.relative_to(self.root), flag))
        settings = [a for k, a in b.targets("config_setting") if a.get("name") == setting]
        values = settings[0].get("flag_values") if settings else None
        want = {":" + flag: "true"}
        if setting_pkg != flag_pkg or not isinstance(values, dict) or values != want:
            self.err(who, "%s: no config_setting %r with flag_values = %r" % (path.relative_to(self.root), setting, want))
        rc = self.root / ".bazelrc"
        line = "build:%s --%s=true" % (CUDA_CONFIG.split("=", 1)[1], CUDA_FLAG)
        if not rc.is_file() or line not in [l.strip() for l in rc.read_text().splitlines()]:
            self.err(who, ".bazelrc lacks the line %r (%s must turn the switch on)" % (line, CUDA_CONFIG))

    def check_specs(self, crates, gpu_enabled_deps, ws_deps):
        """A crate.spec in MODULE.bazel, equal to [workspace.dependencies], per optional third-party dependency
        that the GPU features enable (crate_universe's from_cargo makes no alias for it)."""
        who = "MODULE.bazel"
        path = self.root / "MODULE.bazel"
        if not path.is_file():
            return
        specs = {}
        for kind, a in BuildFile(path, self.root, self.root).rules:
            if kind.endswith(".spec") and isinstance(a.get("package"), str):
                specs[a["package"]] = a
        needed = set()
        for c in crates:
            for kind in c.deps.values():
                for d in kind:
                    if d["optional"] and d["path"] is None and d["key"] in gpu_enabled_deps[c.name]:
                        needed.add(d["package"])
        for name in sorted(needed - set(specs)):
            self.err(who, "no crate.spec(package = %r): @crates//:%s (an optional dependency) would not exist" % (name, name))
        for name, a in sorted(specs.items()):
            ws = ws_deps.get(name)
            if isinstance(ws, str):
                ws = {"version": ws}
            if not isinstance(ws, dict):
                self.err(who, "crate.spec(package = %r) is not in [workspace.dependencies] of Cargo.toml" % name)
                continue
            want = {
                "version": ws.get("version"),
                "default_features": ws.get("default-features", True),
                "features": sorted(ws.get("features", [])),
            }
            got = {
                "version": a.get("version"),
                "default_features": a.get("default_features", True),
                "features": sorted(strings(a.get("features"))),
            }
            for k in want:
                if want[k] != got[k]:
                    self.err(who, "crate.spec(package = %r): %s is %r, Cargo.toml's [workspace.dependencies] has %r"
                             % (name, k, got[k], want[k]))

    def check_module(self, members):
        who = "MODULE.bazel"
        path = self.root / "MODULE.bazel"
        if not path.is_file():
            self.err(who, "missing")
            return
        mod = BuildFile(path, self.root, self.root)
        calls = [a for k, a in mod.rules if k.endswith(".from_cargo")]
        if len(calls) != 1:
            self.err(who, "expected exactly one crate.from_cargo(...), found %d" % len(calls))
            return
        a = calls[0]
        if a.get("cargo_lockfile") != "//:Cargo.lock":
            self.err(who, "crate.from_cargo cargo_lockfile should be \"//:Cargo.lock\", is %r" % a.get("cargo_lockfile"))
        listed = set(strings(a.get("manifests")))
        want = {"//:Cargo.toml"} | {"//%s:Cargo.toml" % m for m in members if m}
        for m in sorted(want - listed):
            self.err(who, "crate.from_cargo manifests lacks %r" % m)
        for m in sorted(listed - want):
            self.err(who, "crate.from_cargo manifests lists %r, which is not a workspace member" % m)

    @staticmethod
    def crate_name_of(attrs):
        n = attrs.get("crate_name")
        if isinstance(n, str):
            return n
        return str(attrs.get("name", "")).replace("-", "_").replace("/", "_")

    @staticmethod
    def src_files(attrs):
        files = set(strings(attrs.get("srcs")))
        root = attrs.get("crate_root")
        if isinstance(root, str):
            files.add(root)
        return files

    def check_crate(self, c, b, by_dir, lib_labels, feats, enabled_deps, config=""):
        """Compares one crate's targets with Cargo.toml, in one configuration.

        `config` names it in messages ("" for the default one, " with
        --config=cuda"); `feats`, `enabled_deps` are what Cargo enables there.
        """
        who = c.label + config
        pkg = c.pkg
        declared = set(c.features) | c.optional

        def fp_labels(kind):
            """First-party deps of a kind -> library labels; third-party -> package names."""
            fp, tp = set(), set()
            for d in c.deps[kind]:
                if d["optional"] and d["key"] not in enabled_deps:
                    continue
                t = by_dir.get(d["path"]) if d["path"] else None
                if t is not None:
                    if t is not c and t.name in lib_labels:
                        fp.add(lib_labels[t.name])
                else:
                    tp.add(d["package"])
            return fp, tp

        normal_fp, normal_tp = fp_labels("normal")
        dev_fp, dev_tp = fp_labels("dev")
        # Enabled optional third-party dependencies: all_crate_deps() (crate_universe
        # resolves default features) leaves them out, so targets name them.
        optional_tp = {d["package"] for d in c.deps["normal"]
                       if d["optional"] and d["path"] is None and d["key"] in enabled_deps}
        normal_tp_from_all = normal_tp - optional_tp
        own_lib = lib_labels.get(c.name) if c.lib else None
        all_fp = set(lib_labels.values())

        native = {norm_label(":" + str(a.get("name")), pkg) for _, a in b.targets(*NATIVE_RULES)}

        def got_fp(attrs, attr="deps"):
            labels = {norm_label(s, pkg) for s in strings(attrs.get(attr))}
            return {l for l in labels if l and l.startswith("//") and l not in native}

        def explicit_tp(attrs):
            out = set()
            for s in strings(attrs.get("deps")) + strings(attrs.get("proc_macro_deps")):
                if s.startswith(THIRD_PARTY_REPO + "//:"):
                    out.add(s.split(":", 1)[1])
            return out

        def compare(target, got, want, allowed=frozenset()):
            for l in sorted(want - got):
                self.err(who, "%s: deps lack %s (a Cargo dependency)" % (target, l))
            for l in sorted(got - want - allowed):
                why = "not a dependency in Cargo.toml" if l in all_fp else "not a Cargo crate's library"
                self.err(who, "%s: deps have %s, %s" % (target, l, why))

        def check_explicit_tp(target, attrs, allowed):
            """Explicit @crates//:name labels must be Cargo dependencies too."""
            for name in sorted(explicit_tp(attrs)):
                base = re.sub(r"-\d+\.\d+\.\d+.*$", "", name)
                if name not in allowed and base not in allowed:
                    self.err(who, "%s: deps have @crates//:%s, not a dependency in Cargo.toml" % (target, name))

        def need_optional(target, attrs):
            for name in sorted(optional_tp - explicit_tp(attrs)):
                self.err(who, "%s: deps lack @crates//:%s (an optional dependency Cargo enables here; "
                         "all_crate_deps() leaves it out)" % (target, name))

        def need_crate_deps(target, attrs, third_party, kind, attr="deps"):
            if not third_party:
                return
            if kind in crate_deps_kinds(attrs.get(attr)):
                return
            missing = sorted(third_party - explicit_tp(attrs))
            if missing:
                self.err(
                    who,
                    "%s: %s lack all_crate_deps(%s = True) for third-party %s"
                    % (target, attr, kind, ", ".join(missing)),
                )

        def check_features(target, attrs, exact):
            got = set(strings(attrs.get("crate_features")))
            for f in sorted(got - declared):
                self.err(who, "%s: crate_features has %r, not a feature in Cargo.toml" % (target, f))
            for f in sorted(feats - got):
                self.err(who, "%s: crate_features lacks %r (enabled by Cargo)" % (target, f))
            if exact:
                for f in sorted((got & declared) - feats):
                    self.err(who, "%s: crate_features has %r, which Cargo does not enable" % (target, f))

        # --- sources named in BUILD.bazel exist ------------------------------
        files = set(b.files())
        for kind, a in b.targets(*(LIB_RULES + ("rust_binary", "rust_test", "rust_test_suite"))):
            named = strings(a.get("srcs")) + strings(a.get("shared_srcs"))
            if isinstance(a.get("crate_root"), str):
                named.append(a["crate_root"])
            for f in sorted(set(named)):
                if ":" not in f and not f.startswith("//") and f not in files:
                    self.err(who, "%s %r: source %s does not exist" % (kind, a.get("name"), f))

        libs = b.targets(*LIB_RULES)
        bins = b.targets("rust_binary")
        tests = b.targets("rust_test")
        suites = b.targets("rust_test_suite")

        # --- library ---------------------------------------------------------
        primary = {}  # normalized label -> (description, attrs)
        if c.lib:
            match = [(k, a) for k, a in libs if self.crate_name_of(a) == c.lib["name"]]
            if not match:
                self.err(who, "no rust_library with crate_name = %r ([lib] name)" % c.lib["name"])
            for kind, a in match[:1]:
                t = "%s %r" % (kind, a.get("name"))
                if c.lib["proc_macro"] != (kind == "rust_proc_macro"):
                    self.err(who, "%s: Cargo's proc-macro = %s needs %s" % (
                        t, str(c.lib["proc_macro"]).lower(),
                        "rust_proc_macro" if c.lib["proc_macro"] else "rust_library"))
                if c.lib["path"] not in self.src_files(a):
                    self.err(who, "%s: srcs do not contain %s" % (t, c.lib["path"]))
                compare(t, got_fp(a), normal_fp)
                check_explicit_tp(t, a, normal_tp)
                need_crate_deps(t, a, normal_tp_from_all, "normal")
                need_optional(t, a)
                need_crate_deps(t, a, normal_tp, "proc_macro", "proc_macro_deps")
                check_features(t, a, exact=True)
                primary[own_lib] = (t, a, c.lib["test"])
        for _, a in libs:
            if not c.lib or self.crate_name_of(a) != c.lib["name"]:
                self.err(who, "rust_library %r has no [lib] of that name in Cargo.toml" % a.get("name"))

        # --- binaries --------------------------------------------------------
        extra_ok = set(c.benches) | set(c.examples)
        bin_names = {x["name"]: x for x in c.bins}
        for _, a in bins:
            name = a.get("name")
            if name in bin_names:
                continue
            if self.src_files(a) & extra_ok:
                continue
            self.err(who, "rust_binary %r is not a binary in Cargo.toml" % name)
        for cb in c.bins:
            match = [a for _, a in bins if a.get("name") == cb["name"]]
            if not match:
                self.err(who, "no rust_binary named %r ([[bin]] name)" % cb["name"])
                continue
            a = match[0]
            t = "rust_binary %r" % cb["name"]
            if cb["path"] not in self.src_files(a):
                self.err(who, "%s: srcs do not contain %s" % (t, cb["path"]))
            compare(t, got_fp(a), normal_fp | ({own_lib} if own_lib else set()))
            check_explicit_tp(t, a, normal_tp)
            need_crate_deps(t, a, normal_tp_from_all, "normal")
            need_optional(t, a)
            need_crate_deps(t, a, normal_tp, "proc_macro", "proc_macro_deps")
            check_features(t, a, exact=True)
            primary[norm_label(":" + cb["name"], pkg)] = (t, a, cb["test"])

        # --- unit tests (rust_test with crate = ...) -------------------------
        unit_for = {}
        for _, a in tests:
            crate = a.get("crate")
            if not isinstance(crate, str):
                continue
            target = norm_label(crate, pkg)
            t = "rust_test %r" % a.get("name")
            if target not in primary:
                self.err(who, "%s: crate = %r is not this crate's library or a binary" % (t, crate))
                continue
            unit_for.setdefault(target, []).append(a)
            compare(t, got_fp(a), dev_fp - normal_fp, allowed=normal_fp | dev_fp)
            check_explicit_tp(t, a, normal_tp | dev_tp)
            need_crate_deps(t, a, dev_tp, "normal_dev")
            check_features(t, a, exact=False)
        for target, (desc, _, wants_test) in sorted(primary.items()):
            if wants_test and target not in unit_for:
                self.err(who, "no rust_test with crate = %s (unit tests of %s)" % (target.split(":")[1], desc))

        # --- integration tests -----------------------------------------------
        integ = []  # (description, attrs, set of test sources it builds)
        for _, a in tests:
            if isinstance(a.get("crate"), str):
                continue
            srcs = self.src_files(a)
            root = a.get("crate_root")
            roots = {root} if isinstance(root, str) else (srcs if len(srcs) == 1 else set())
            integ.append(("rust_test %r" % a.get("name"), a, roots))
        for _, a in suites:
            shared = set(strings(a.get("shared_srcs")))
            integ.append(("rust_test_suite %r" % a.get("name"), a, set(strings(a.get("srcs"))) - shared))
        want = normal_fp | dev_fp | ({own_lib} if own_lib else set())
        for desc, a, roots in integ:
            if not roots:
                continue
            compare(desc, got_fp(a), want)
            check_explicit_tp(desc, a, normal_tp | dev_tp)
            need_crate_deps(desc, a, normal_tp_from_all, "normal")
            need_optional(desc, a)
            need_crate_deps(desc, a, dev_tp, "normal_dev")
            check_features(desc, a, exact=False)
        for src in c.tests:
            covering = [(d, a) for d, a, roots in integ if src in roots]
            if not covering:
                self.err(who, "%s is not covered by any rust_test or rust_test_suite" % src)
                continue
            text = (c.dir / src).read_text(errors="replace")
            for d, a in covering:
                data = {norm_label(s, pkg) for s in strings(a.get("data"))}
                if "testdata" in text and not any(l and l.startswith("//testdata:") for l in data):
                    self.err(who, "%s: %s reads testdata but data lacks //testdata:all" % (d, src))
                if "../shared" in text and "external" not in strings(a.get("tags")):
                    self.err(who, "%s: %s reads ../shared (outside the workspace) but is not tagged \"external\"" % (d, src))
                gpu = GPU_TEST.search(text)
                if gpu and GPU_TAG not in strings(a.get("tags")):
                    self.err(who, "%s: %s is a GPU test (#![cfg(feature = %r)]) but is not tagged %r"
                             % (d, src, gpu.group(1), GPU_TAG))

        # --- benches and examples --------------------------------------------
        all_srcs = set()
        for _, a in b.targets("rust_binary", "rust_test", "rust_test_suite"):
            all_srcs |= self.src_files(a)
        for src in c.benches + c.examples:
            if src not in all_srcs:
                self.err(who, "%s is not built by any rust target" % src)
        for _, a in bins:
            if a.get("name") in bin_names or not (self.src_files(a) & extra_ok):
                continue
            t = "rust_binary %r" % a.get("name")
            compare(t, got_fp(a), want)
            need_crate_deps(t, a, normal_tp_from_all, "normal")
            need_optional(t, a)
            need_crate_deps(t, a, dev_tp, "normal_dev")
            check_features(t, a, exact=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    checker = Checker(args.root.resolve(), args.verbose)
    n = checker.run()
    if checker.errors:
        for e in checker.errors:
            print("check_bazel_cargo: " + e, file=sys.stderr)
        print("bazel/cargo consistency: %d mismatch(es) in %d crates" % (len(checker.errors), n), file=sys.stderr)
        return 1
    print("bazel/cargo consistency: %d crates OK" % n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
