#!/usr/bin/env python3
"""Vendor the third-party crates and write a Bazel repository `@crates` for them.

Usage:
    python3 tools/bazel/vendor_crates.py [--out .vendor] [--offline]

The offline Bazel build (tools/bazel/bazel_offline.sh, `--config=debian_offline`)
cannot run crate_universe: its generator (cargo-bazel) and the crate archives
would be downloaded by Bazel. This script does the same job with the host's
cargo, which reaches the crates registry:

  1. `cargo vendor --locked --versioned-dirs OUT/crates`: every crate of
     Cargo.lock, each archive checked against its Cargo.lock checksum.
  2. `cargo metadata --locked --offline --filter-platform x86_64-unknown-linux-gnu`
     against the vendored sources: the resolved graph (features, dependencies
     with renames, build scripts, proc macros) of the whole workspace, once
     with default features and once with the GPU features on (GPU_FEATURES:
     `cuda` and `nccl` of every member that has them, what the CUDA switch
     --config=cuda builds).
  3. Writes, next to the sources, a BUILD.bazel per crate (rust_library or
     rust_proc_macro, plus cargo_build_script when the crate has a build.rs)
     and, at the root of OUT/crates, the hub files crate_universe's `@crates`
     repository has: BUILD.bazel with one alias per direct dependency and
     defs.bzl with all_crate_deps(), aliases() and crate_deps(), keyed by the
     Bazel package of each workspace member. The first-party BUILD.bazel files
     therefore load `@crates//:defs.bzl` unchanged in both builds.

Optional dependencies (cudarc) as crate_universe serves them: all_crate_deps()
comes from the default graph, so it leaves them out; the crates, their
features and the hub's aliases come from the graph with GPU_FEATURES on, so
`@crates//:cudarc` exists for the CUDA switch's select() (rust_crate.bzl's
gpu_deps). This matches MODULE.bazel, where a crate.spec adds cudarc to
crate_universe's @crates (features unify the same way: e.g. half gets
cudarc's `rand_distr` in both configurations).

`--config=debian_offline` then points the crate_universe repository at
OUT/crates with --override_repository. Crates' own `[package.metadata.bazel]`
tables (crate_universe annotations, e.g. cxx's `cxx_cc` library) are honoured.
OUT is ignored by git (.gitignore) and by Bazel (.bazelignore); nothing here is
committed. Python 3.11+ stdlib only.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TRIPLE = "x86_64-unknown-linux-gnu"
LIB_KINDS = {"lib", "rlib", "dylib", "cdylib", "staticlib", "proc-macro"}
# The Cargo features of the members that the CUDA switch (--config=cuda,
# tools/bazel/BUILD.bazel) turns on; tools/check_bazel_cargo.py has the same list.
GPU_FEATURES = ("cuda", "nccl")
# Files Bazel must not see as data (labels cannot hold spaces; BUILD files
# would become packages).
DATA_EXCLUDE = [
    "**/* *",
    "**/BUILD",
    "**/BUILD.bazel",
    "**/WORKSPACE",
    "**/WORKSPACE.bazel",
    "**/MODULE.bazel",
    "**/REPO.bazel",
    ".cargo-checksum.json",
]


def run(cmd, cwd, **kw):
    print("vendor_crates: " + " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, cwd=cwd, check=True, **kw)


def starlark(value, indent=4):
    """A Python value as Starlark source (lists one item per line)."""
    pad = " " * indent
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        if not value:
            return "[]"
        inner = "".join("%s    %s,\n" % (pad, starlark(v, indent + 4)) for v in value)
        return "[\n%s%s]" % (inner, pad)
    if isinstance(value, dict):
        if not value:
            return "{}"
        inner = "".join(
            "%s    %s: %s,\n" % (pad, starlark(k), starlark(v, indent + 4)) for k, v in sorted(value.items())
        )
        return "{\n%s%s}" % (inner, pad)
    if isinstance(value, Raw):
        return value.text
    raise TypeError(value)


class Raw:
    def __init__(self, text):
        self.text = text


def rule(kind, attrs):
    lines = ["%s(" % kind]
    for k, v in attrs.items():
        if v is None:
            continue
        lines.append("    %s = %s," % (k, starlark(v)))
    lines.append(")")
    return "\n".join(lines) + "\n"


def glob(include, exclude=None):
    ex = ", exclude = %s" % json.dumps(exclude) if exclude else ""
    return Raw("glob(%s%s, allow_empty = True)" % (json.dumps(include), ex))


class Graph:
    def __init__(self, meta, root):
        self.root = root
        self.pkgs = {p["id"]: p for p in meta["packages"]}
        self.nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
        self.members = set(meta["workspace_members"])

    def is_member(self, pid):
        return pid in self.members

    def lib_target(self, pid):
        for t in self.pkgs[pid]["targets"]:
            if LIB_KINDS & set(t["kind"]):
                return t
        return None

    def build_target(self, pid):
        for t in self.pkgs[pid]["targets"]:
            if "custom-build" in t["kind"]:
                return t
        return None

    def is_proc_macro(self, pid):
        t = self.lib_target(pid)
        return t is not None and "proc-macro" in t["kind"]

    def dir_name(self, pid):
        p = self.pkgs[pid]
        return "%s-%s" % (p["name"], p["version"])

    def label(self, pid):
        return "//%s:%s" % (self.dir_name(pid), self.pkgs[pid]["name"])

    def deps(self, pid):
        """(kind, dep pid, extern name) for each resolved dependency; kind in normal/dev/build."""
        out = []
        for d in self.nodes[pid]["deps"]:
            kinds = {dk["kind"] or "normal" for dk in d["dep_kinds"]} or {"normal"}
            for k in sorted(kinds):
                out.append((k, d["pkg"], d["name"]))
        return out


def crate_name_of(target):
    return target["name"].replace("-", "_")


def rel(path, base):
    return Path(path).resolve().relative_to(Path(base).resolve()).as_posix()


def bazel_meta(pkg):
    md = pkg.get("metadata") or {}
    b = md.get("bazel") if isinstance(md, dict) else None
    return b if isinstance(b, dict) else {}


def crate_build_file(g, pid):
    pkg = g.pkgs[pid]
    cdir = Path(pkg["manifest_path"]).parent
    lib = g.lib_target(pid)
    if lib is None:
        return None
    ann = bazel_meta(pkg)
    features = sorted(g.nodes[pid]["features"])
    normal, procs, build, build_procs, aliases, build_aliases = [], [], [], [], {}, {}
    for kind, dep, name in g.deps(pid):
        if g.is_member(dep) or g.lib_target(dep) is None:
            continue
        label = g.label(dep)
        renamed = crate_name_of(g.lib_target(dep)) != name
        if kind == "normal":
            (procs if g.is_proc_macro(dep) else normal).append(label)
            if renamed:
                aliases[label] = name
        elif kind == "build":
            (build_procs if g.is_proc_macro(dep) else build).append(label)
            if renamed:
                build_aliases[label] = name
    common = {
        "edition": lib["edition"],
        "version": pkg["version"],
        "crate_features": features or None,
        "rustc_flags": ["--cap-lints=allow"] + list(ann.get("rustc_flags", [])),
    }
    out = [
        "# Generated by tools/bazel/vendor_crates.py from cargo metadata; do not edit.\n",
        'load("@rules_rust//cargo:defs.bzl", "cargo_build_script")\n',
        'load("@rules_rust//rust:defs.bzl", "rust_library", "rust_proc_macro")\n\n',
        'package(default_visibility = ["//visibility:public"])\n\n',
    ]
    # crate_universe's annotations: deps, and link_deps (native libraries,
    # e.g. cxx's cxx_cc), both linked into the library.
    deps = sorted(set(normal)) + list(ann.get("deps", [])) + list(ann.get("link_deps", []))
    bs = g.build_target(pid)
    if bs is not None and ann.get("gen_build_script", True):
        out.append(
            rule(
                "cargo_build_script",
                {
                    "name": "_bs",
                    "crate_name": "build_script_build",
                    "crate_root": rel(bs["src_path"], cdir),
                    "srcs": glob(["**/*.rs"]),
                    "compile_data": glob(["**"], DATA_EXCLUDE + ["**/*.rs"]),
                    "data": glob(["**"], DATA_EXCLUDE),
                    "deps": sorted(set(build)) or None,
                    "proc_macro_deps": sorted(set(build_procs)) or None,
                    "aliases": build_aliases or None,
                    "links": pkg.get("links"),
                    "pkg_name": pkg["name"],
                    "build_script_env": ann.get("build_script_env"),
                    "tags": ["manual"],
                    **common,
                },
            )
        )
        out.append("\n")
        deps = [":_bs"] + deps
    out.append(
        rule(
            "rust_proc_macro" if g.is_proc_macro(pid) else "rust_library",
            {
                "name": pkg["name"],
                "crate_name": crate_name_of(lib),
                "crate_root": rel(lib["src_path"], cdir),
                "srcs": glob(["**/*.rs"]),
                "compile_data": glob(["**"], DATA_EXCLUDE + ["**/*.rs"]),
                "deps": deps or None,
                "proc_macro_deps": sorted(set(procs)) + list(ann.get("proc_macro_deps", [])) or None,
                "aliases": aliases or None,
                "rustc_env": ann.get("rustc_env"),
                "tags": ["crate-name=" + pkg["name"], "manual", "noclippy", "norustfmt"],
                **common,
            },
        )
    )
    extra = ann.get("additive_build_file_content")
    if extra:
        out.append("\n" + extra.strip() + "\n")
    return "".join(out)


def hub_files(g, gpu):
    """BUILD.bazel and defs.bzl of the @crates hub, as crate_universe writes them.

    The dependency tables come from `g` (default features); the aliases also
    name the direct dependencies that `gpu` (GPU_FEATURES on) adds.
    """
    kinds = ("normal", "normal_dev", "proc_macro", "proc_macro_dev", "build", "build_proc_macro")
    deps = {}  # package -> kind -> {label: alias-or-None}
    direct = {}
    for pid in sorted(g.members):
        pkg_dir = rel(Path(g.pkgs[pid]["manifest_path"]).parent, g.root)
        pkg_dir = "" if pkg_dir == "." else pkg_dir
        table = {k: {} for k in kinds}
        for kind, dep, name in g.deps(pid):
            if g.is_member(dep) or g.lib_target(dep) is None:
                continue
            pm = g.is_proc_macro(dep)
            key = {"normal": "proc_macro" if pm else "normal",
                   "dev": "proc_macro_dev" if pm else "normal_dev",
                   "build": "build_proc_macro" if pm else "build"}[kind]
            renamed = crate_name_of(g.lib_target(dep)) != name
            table[key][g.label(dep)] = name if renamed else None
            direct[g.pkgs[dep]["name"]] = direct.get(g.pkgs[dep]["name"], set()) | {dep}
        deps[pkg_dir] = table
    # Direct dependencies that only the GPU features enable (cudarc): an alias,
    # not in the tables, as MODULE.bazel's crate.spec gives crate_universe's hub.
    for pid in sorted(gpu.members):
        for kind, dep, name in gpu.deps(pid):
            if not gpu.is_member(dep) and gpu.lib_target(dep) is not None:
                direct[gpu.pkgs[dep]["name"]] = direct.get(gpu.pkgs[dep]["name"], set()) | {dep}

    build = [
        "# Generated by tools/bazel/vendor_crates.py; the hub of the vendored crates.\n",
        'package(default_visibility = ["//visibility:public"])\n\n',
        'exports_files(["defs.bzl"])\n',
    ]
    # Aliases point at the crates as written, from `gpu` (a superset of `g`).
    for name in sorted(direct):
        pids = sorted(direct[name], key=lambda p: gpu.pkgs[p]["version"])
        for pid in pids:
            build.append("\n" + rule("alias", {"name": gpu.dir_name(pid), "actual": gpu.label(pid)}))
        build.append("\n" + rule("alias", {"name": name, "actual": gpu.label(pids[-1])}))
        for extra, target in sorted(bazel_meta(gpu.pkgs[pids[-1]]).get("extra_aliased_targets", {}).items()):
            build.append("\n" + rule("alias", {"name": extra, "actual": "//%s:%s" % (gpu.dir_name(pids[-1]), target)}))

    table_src = json.dumps(
        {p: {k: {l: a for l, a in sorted(v.items())} for k, v in t.items()} for p, t in sorted(deps.items())},
        indent=4,
        sort_keys=True,
    ).replace("null", "None")
    defs = '''"""Generated by tools/bazel/vendor_crates.py: crate_universe's defs.bzl API over the vendored crates."""

_DEPS = %s

_KINDS = ["normal", "normal_dev", "proc_macro", "proc_macro_dev", "build", "build_proc_macro"]

def _table(package_name):
    if package_name == None:
        package_name = native.package_name()
    if package_name not in _DEPS:
        fail("@crates: package %%r is not a member of the Cargo workspace" %% package_name)
    return _DEPS[package_name]

def _wanted(flags):
    if not any(flags.values()):
        return _KINDS
    return [k for k in _KINDS if flags[k]]

def all_crate_deps(normal = False, normal_dev = False, proc_macro = False, proc_macro_dev = False, build = False, build_proc_macro = False, package_name = None):
    """Third-party dependencies of the kinds asked (all kinds when none is)."""
    t = _table(package_name)
    flags = {"normal": normal, "normal_dev": normal_dev, "proc_macro": proc_macro, "proc_macro_dev": proc_macro_dev, "build": build, "build_proc_macro": build_proc_macro}
    out = []
    for k in _wanted(flags):
        for label in t[k]:
            if Label(label) not in out:
                out.append(Label(label))
    return out

def aliases(normal = False, normal_dev = False, proc_macro = False, proc_macro_dev = False, build = False, build_proc_macro = False, package_name = None):
    """{label: name} for renamed dependencies (Cargo's `package = ...`)."""
    t = _table(package_name)
    flags = {"normal": normal, "normal_dev": normal_dev, "proc_macro": proc_macro, "proc_macro_dev": proc_macro_dev, "build": build, "build_proc_macro": build_proc_macro}
    if not any(flags.values()):
        flags["normal"] = True
        flags["proc_macro"] = True
    out = {}
    for k in _KINDS:
        if flags[k]:
            for label, name in t[k].items():
                if name != None:
                    out[Label(label)] = name
    return out

def crate_deps(deps, package_name = None):
    """Labels of the named direct dependencies."""
    t = _table(package_name)
    out = []
    for name in deps:
        found = [l for k in _KINDS for l in t[k] if l.split(":")[-1] == name]
        if not found:
            fail("@crates: %%r is not a dependency of package %%r" %% (name, package_name or native.package_name()))
        out.append(Label(found[0]))
    return out

def crate_edition(package_name = None):
    return "2021"
''' % table_src
    return "".join(build), defs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    ap.add_argument("--out", type=Path, default=None, help="default: ROOT/.vendor")
    ap.add_argument("--offline", action="store_true", help="vendor from cargo's local cache only")
    args = ap.parse_args()
    root = args.root.resolve()
    out = (args.out or root / ".vendor").resolve()
    crates = out / "crates"
    out.mkdir(parents=True, exist_ok=True)

    vendor = ["cargo", "vendor", "--locked", "--versioned-dirs", "--quiet"]
    if args.offline:
        vendor.append("--offline")
    run(vendor + [str(crates)], cwd=root, stdout=subprocess.DEVNULL)
    cfg = [
        "--config", 'source.crates-io.replace-with="xla-rs-vendored"',
        "--config", 'source.xla-rs-vendored.directory="%s"' % crates,
    ]
    metadata = ["cargo", "metadata", "--locked", "--offline", "--format-version", "1", "--filter-platform", TRIPLE] + cfg
    g = Graph(json.loads(run(metadata, cwd=root, stdout=subprocess.PIPE).stdout), root)
    # The same with the GPU features on: `--features member/feature`.
    on = sorted(
        "%s/%s" % (g.pkgs[pid]["name"], f) for pid in g.members for f in GPU_FEATURES if f in g.pkgs[pid]["features"]
    )
    if on:
        metadata += ["--features", ",".join(on)]
    gpu = Graph(json.loads(run(metadata, cwd=root, stdout=subprocess.PIPE).stdout), root)
    n = 0
    for pid, pkg in sorted(gpu.pkgs.items()):
        if gpu.is_member(pid) or pid not in gpu.nodes:
            continue
        cdir = Path(pkg["manifest_path"]).parent
        if cdir.parent != crates:
            sys.exit("vendor_crates: %s is not under %s (git or path dependency?)" % (pkg["name"], crates))
        text = crate_build_file(gpu, pid)
        if text is None:
            continue
        (cdir / "BUILD.bazel").write_text(text)
        n += 1
    build, defs = hub_files(g, gpu)
    (crates / "BUILD.bazel").write_text(build)
    (crates / "defs.bzl").write_text(defs)
    (crates / "REPO.bazel").write_text("")
    (crates / "WORKSPACE.bazel").write_text('workspace(name = "crates")\n')
    print("vendor_crates: %d crates under %s" % (n, crates), file=sys.stderr)


if __name__ == "__main__":
    main()
