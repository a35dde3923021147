#!/usr/bin/env python3
"""Tests of tools/check_bazel_cargo.py: it passes on the repository and fails
when one side loses a dependency (or gains one the other lacks).

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
        self.edit("xla/hlo/parser/BUILD.bazel", r'deps = \[\n        "//xla/hlo/ir",\n    \] \+ ', "deps = ")
        self.assert_fails("rust_library 'parser': deps lack //xla/hlo/ir:ir (a Cargo dependency)")

    def test_dependency_removed_from_cargo(self):
        self.edit("xla/hlo/pass/Cargo.toml", r"^xla-hlo-verifier\.workspace = true\n", "")
        self.assert_fails("rust_library 'pass': deps have //xla/hlo/verifier:verifier, not a dependency in Cargo.toml")

    def test_third_party_label_not_in_cargo(self):
        self.edit("xla/hlo/ir/BUILD.bazel", r"    deps = all_crate_deps\(normal = True\),", '    deps = ["@crates//:log"] + all_crate_deps(normal = True),')
        self.assert_fails("deps have @crates//:log, not a dependency in Cargo.toml")

    def test_third_party_deps_dropped_from_build(self):
        self.edit("xla/hlo/pass/BUILD.bazel", r"    \] \+ all_crate_deps\(normal = True\),", "    ],")
        self.assert_fails("deps lack all_crate_deps(normal = True) for third-party log, thiserror")

    def test_missing_source_and_uncovered_test(self):
        (self.root / "xla/hlo/parser/tests/roundtrip.rs").unlink()
        (self.root / "xla/hlo/parser/tests/extra.rs").write_text("#[test]\nfn t() {}\n")
        self.edit("xla/hlo/parser/BUILD.bazel", r'exclude = \["tests/roundtrip.rs"\]', 'exclude = ["tests/roundtrip.rs", "tests/extra.rs"]')
        self.assert_fails("source tests/roundtrip.rs does not exist", "tests/extra.rs is not covered")

    def test_feature_mismatch(self):
        self.edit("xla/hlo/ir/BUILD.bazel", r'    crate_name = "xla_hlo_ir",', '    crate_features = ["no-such-feature"],\n    crate_name = "xla_hlo_ir",')
        self.assert_fails("crate_features has 'no-such-feature', not a feature in Cargo.toml")

    def test_member_missing_from_module(self):
        self.edit("MODULE.bazel", r'^        "//xla/cc_api:Cargo.toml",\n', "")
        self.assert_fails("crate.from_cargo manifests lacks '//xla/cc_api:Cargo.toml'")


if __name__ == "__main__":
    unittest.main(verbosity=2)
