#!/usr/bin/env python3
"""Tests of tools/check_bazel_cargo.py: it passes on the repository and fails
when one side loses a dependency (or gains one the other lacks), also through
the rust_library_crate / rust_binary_crate macros (tools/bazel/rust_crate.bzl).

    python3 tools/bazel/test_check_bazel_cargo.py

Each case copies the manifests, BUILD files and sources into a temporary
folder, edits one file there, and runs the checker on the copy.
"""

import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "tools" / "check_bazel_cargo.py"
SKIP = shutil.ignore_patterns(".git", "target", ".vendor", "testdata", "node_modules", "bazel-*", "__pycache__")


class CheckBazelCargo(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = Path(self.tmp.name) / "repo"
        shutil.copytree(ROOT, self.root, ignore=SKIP, symlinks=True)

    def tearDown(self):
        self.tmp.cleanup()

    def check(self):
        r = subprocess.run([sys.executable, str(CHECK), "--root", str(self.root)], capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr

    def edit(self, rel, pattern, repl):
        p = self.root / rel
        text = p.read_text()
        new, n = re.subn(pattern, repl, text, count=1, flags=re.M)
        self.assertEqual(n, 1, "pattern %r not found in %s" % (pattern, rel))
        p.write_text(new)

    def assert_fails(self, *messages):
        rc, out = self.check()
        self.assertEqual(rc, 1, out)
        for m in messages:
            self.assertIn(m, out)

    def test_repository_is_consistent(self):
        rc, out = self.check()
        self.assertEqual(rc, 0, out)
        self.assertIn("crates OK", out)

    def test_dependency_removed_from_build(self):
        self.edit("xla/hlo/parser/BUILD.bazel", r'^    deps = \["//xla/hlo/ir"\],', "    deps = [],")
        self.assert_fails("rust_library 'parser': deps lack //xla/hlo/ir:ir (a Cargo dependency)")

    def test_dependency_removed_from_cargo(self):
        self.edit("xla/hlo/pass/Cargo.toml", r"^xla-hlo-verifier\.workspace = true\n", "")
        self.assert_fails("rust_library 'pass': deps have //xla/hlo/verifier:verifier, not a dependency in Cargo.toml")

    def test_dev_dependency_removed_from_build(self):
        self.edit("tools/hlo_opt/BUILD.bazel", r'^        "//xla/hlo/parser",\n', "")
        self.assert_fails(
            "rust_test 'passes_test': deps lack //xla/hlo/parser:parser (a Cargo dependency)",
            "rust_test 'cli_test': deps lack //xla/hlo/parser:parser (a Cargo dependency)",
        )

    def test_dev_dependency_removed_from_cargo(self):
        self.edit("tools/hlo_opt/Cargo.toml", r"^xla-hlo-parser\.workspace = true\n", "")
        self.assert_fails("rust_test 'passes_test': deps have //xla/hlo/parser:parser, not a dependency in Cargo.toml")

    def test_third_party_label_not_in_cargo(self):
        self.edit("xla/hlo/ir/BUILD.bazel", r'^    crate_name = "xla_hlo_ir",\n', '    crate_name = "xla_hlo_ir",\n    deps = ["@crates//:log"],\n')
        self.assert_fails("deps have @crates//:log, not a dependency in Cargo.toml")

    def test_third_party_deps_dropped_from_macro(self):
        # The check runs the macro: a rust_library_crate that stops adding the
        # crate's third-party dependencies fails like a hand-written target.
        self.edit(
            "tools/bazel/rust_crate.bzl",
            r"^        deps = deps \+ all_crate_deps\(normal = True\) \+ gpu_deps,\n    \)\n    _unit_test\(name, dev_deps, unit_test_data",
            "        deps = deps,\n    )\n    _unit_test(name, dev_deps, unit_test_data",
        )
        self.assert_fails("rust_library 'pass': deps lack all_crate_deps(normal = True) for third-party log, thiserror")

    def test_third_party_deps_dropped_from_build(self):
        # A hand-written target next to the macro: the cargo harness of the C++ tests.
        self.edit(
            "xla/cc_api/BUILD.bazel",
            r"^    \] \+ _RUST_DEPS \+ all_crate_deps\(\n        normal = True,\n        normal_dev = True,\n    \),",
            "    ] + _RUST_DEPS,",
        )
        self.assert_fails("rust_test 'cc_test': deps lack all_crate_deps(normal = True) for third-party cxx")

    def test_missing_source_and_uncovered_test(self):
        (self.root / "xla/hlo/parser/benches/parse_speed.rs").unlink()
        (self.root / "xla/hlo/parser/tests/extra.rs").write_text("#[test]\nfn t() {}\n")
        self.edit("xla/hlo/parser/BUILD.bazel", r'^    external_tests = \["roundtrip"\],', '    custom_tests = ["extra"],\n    external_tests = ["roundtrip"],')
        self.assert_fails("source benches/parse_speed.rs does not exist", "tests/extra.rs is not covered")

    def test_bench_not_declared(self):
        self.edit("xla/hlo/parser/BUILD.bazel", r'^    benches = \["parse_speed"\],\n', "")
        self.assert_fails("benches/parse_speed.rs is not built by any rust target")

    def test_macro_names_missing_test(self):
        (self.root / "xla/hlo/parser/tests/roundtrip.rs").unlink()
        self.assert_fails("cannot evaluate xla/hlo/parser/BUILD.bazel", "external_tests names 'roundtrip', but there is no tests/roundtrip.rs")

    def test_macro_unknown_attribute(self):
        self.edit("xla/hlo/ir/BUILD.bazel", r'^    crate_name = "xla_hlo_ir",\n', '    crate_name = "xla_hlo_ir",\n    no_such_attribute = [],\n')
        self.assert_fails("cannot evaluate xla/hlo/ir/BUILD.bazel", "rust_library_crate(...) failed: TypeError")

    def test_feature_mismatch(self):
        self.edit("xla/hlo/ir/BUILD.bazel", r'    crate_name = "xla_hlo_ir",', '    crate_features = ["no-such-feature"],\n    crate_name = "xla_hlo_ir",')
        self.assert_fails("crate_features has 'no-such-feature', not a feature in Cargo.toml")

    # The CUDA switch (--config=cuda): each BUILD file is also checked with it on.

    def test_gpu_feature_dropped(self):
        self.edit("collectives/BUILD.bazel", r'^    gpu_crate_features = \["nccl"\],\n', "")
        self.assert_fails(
            "collectives (collectives) with --config=cuda: rust_library 'collectives': crate_features lacks 'nccl' (enabled by Cargo)"
        )

    def test_forwarded_gpu_feature_dropped(self):
        # run-hlo-module's `cuda` only forwards to xla-runtime: still its own feature.
        self.edit("tools/run_hlo_module/BUILD.bazel", r'^        "cuda",\n', "")
        self.assert_fails("with --config=cuda: rust_binary 'run_hlo_module': crate_features lacks 'cuda' (enabled by Cargo)")

    def test_gpu_dep_dropped(self):
        self.edit("runtime/BUILD.bazel", r'^    gpu_deps = \["@crates//:cudarc"\],\n', "")
        self.assert_fails(
            "xla-runtime (runtime) with --config=cuda: rust_library 'runtime': deps lack @crates//:cudarc (an optional dependency"
        )

    def test_optional_dep_without_switch(self):
        # cudarc outside the select: a dependency Cargo does not enable by default.
        self.edit("collectives/BUILD.bazel", r'^    deps = \["//xla/hlo/ir"\],', '    deps = ["//xla/hlo/ir", "@crates//:cudarc"],')
        self.assert_fails("collectives (collectives): rust_library 'collectives': deps have @crates//:cudarc, not a dependency in Cargo.toml")

    def test_gpu_feature_in_default_build(self):
        self.edit("collectives/BUILD.bazel", r'^    crate_name = "collectives",', '    crate_features = ["nccl"],\n    crate_name = "collectives",')
        self.assert_fails("collectives (collectives): rust_library 'collectives': crate_features has 'nccl', which Cargo does not enable")

    def test_gpu_test_untagged(self):
        # A GPU test left in the suite: --config=ci would run it, --config=cuda would not.
        self.edit("collectives/BUILD.bazel", r'^    gpu_tests = \["nccl_gpu"\],\n', "")
        self.assert_fails(
            "rust_test_suite 'integration_tests': tests/nccl_gpu.rs is a GPU test "
            "(#![cfg(feature = 'nccl')]) but is not tagged 'requires-gpu-nvidia'"
        )

    def test_switch_not_set_by_config(self):
        self.edit(".bazelrc", r"^build:cuda --//tools/bazel:cuda=true\n", "")
        self.assert_fails(".bazelrc lacks the line 'build:cuda --//tools/bazel:cuda=true'")

    def test_cudarc_spec_missing_or_different(self):
        self.edit("MODULE.bazel", r'^        "dynamic-loading",\n', "")
        self.assert_fails("crate.spec(package = 'cudarc'): features is")
        self.edit("MODULE.bazel", r"^crate\.spec\(", "crate.not_a_spec(")
        self.assert_fails("no crate.spec(package = 'cudarc')")

    def test_member_missing_from_module(self):
        self.edit("MODULE.bazel", r'^        "//xla/cc_api:Cargo.toml",\n', "")
        self.assert_fails("crate.from_cargo manifests lacks '//xla/cc_api:Cargo.toml'")


if __name__ == "__main__":
    unittest.main(verbosity=2)
