"""rust_library_crate, rust_binary_crate: a Cargo package's Rust targets from one call.

Every crate of the Cargo workspace has a BUILD.bazel next to its Cargo.toml
(tools/check_bazel_cargo.py keeps the two in step). These macros write the
targets Cargo would build, with crate_universe's all_crate_deps()/aliases()
boilerplate written once here:

rust_library_crate (a package with a [lib]):
  <name>               rust_library of src/**/*.rs (crate root src/lib.rs)
  <name>_test          its unit tests
  <bin>, <bin>_test    per `binaries`: rust_binary of src/bin/<bin>.rs, unit tests
  integration_tests    rust_test_suite, one rust_test per tests/*.rs, except
                       those declared by themselves (`external_tests`,
                       `large_tests`) or by the BUILD file (`custom_tests`);
                       absent when no tests/*.rs is left
  <stem>               rust_test of tests/<stem>.rs, per external/large test
  <bench>, <example>   rust_binary of benches/<bench>.rs ([[bench]] with
                       harness = false) or examples/<example>.rs, tagged
                       "manual" (`bazel run` them; //... does not build them)

rust_binary_crate (a package whose only target is the binary src/main.rs):
  <name>               rust_binary of src/**/*.rs (crate root src/main.rs)
  <name>_test          its unit tests
  <stem>_test          rust_test of each tests/<stem>.rs

Dependencies are Cargo's: `deps` are the first-party [dependencies] (library
labels), `dev_deps` the first-party [dev-dependencies]; third-party crates come
from the package's Cargo.toml through @crates. The library and binaries get
`deps`; unit tests add `dev_deps`; integration tests, benches and examples get
the library and both. Integration tests also get `test_data`, helper modules
under tests/<dir>/ (tests/common/mod.rs) as shared sources, and, as Cargo's
CARGO_BIN_EXE_<bin>, the path of each binary of the package (in their data).

tools/check_bazel_cargo.py runs this file as Python, with stand-ins for the
rules, to see the targets a BUILD file declares: keep to the part of Starlark
that is also Python (no struct, depset, type(), nested functions).
"""

load("@crates//:defs.bzl", "aliases", "all_crate_deps")
load("@rules_rust//rust:defs.bzl", "rust_binary", "rust_library", "rust_test", "rust_test_suite")

# Modules that every tests/*.rs may `mod` (tests/<dir>/**), as Cargo allows.
_TEST_HELPERS = ["tests/*/**/*.rs"]

def _stems(sources, folder):
    """tests/corpus.rs -> corpus, for the sources directly in `folder`."""
    return [s[len(folder) + 1:-len(".rs")] for s in sources]

def _check_stems(macro, attr, stems, known):
    for stem in stems:
        if stem not in known:
            fail("%s: %s names %r, but there is no tests/%s.rs" % (macro, attr, stem, stem))

def _merged(first, second):
    """The labels of both lists, each once, sorted."""
    return sorted({label: None for label in first + second}.keys())

def _unit_test(crate, dev_deps, data, crate_features):
    """<crate>_test: the unit tests (#[cfg(test)]) of the library or binary `crate`."""
    rust_test(
        name = crate + "_test",
        aliases = aliases(
            normal_dev = True,
            proc_macro_dev = True,
        ),
        crate = ":" + crate,
        crate_features = crate_features,
        data = data,
        proc_macro_deps = all_crate_deps(proc_macro_dev = True),
        deps = dev_deps + all_crate_deps(normal_dev = True),
    )

def _with_dev_dependencies(own, deps, dev_deps):
    """Attributes of a target that sees the package as Cargo's tests, benches and examples do."""
    return dict(
        aliases = aliases(
            normal = True,
            normal_dev = True,
            proc_macro = True,
            proc_macro_dev = True,
        ),
        proc_macro_deps = all_crate_deps(
            proc_macro = True,
            proc_macro_dev = True,
        ),
        deps = own + _merged(deps, dev_deps) + all_crate_deps(
            normal = True,
            normal_dev = True,
        ),
    )

def _binary_env(binaries):
    """rustc_env naming each binary as Cargo does for integration tests."""
    return {"CARGO_BIN_EXE_" + b: "$(rootpath :%s)" % b for b in binaries}

def _manual_binaries(folder, names, own, deps, dev_deps, crate_features):
    """rust_binary <name> of <folder>/<name>.rs for each name, tagged "manual"."""
    for name in names:
        src = "%s/%s.rs" % (folder, name)
        rust_binary(
            name = name,
            srcs = [src],
            crate_features = crate_features,
            crate_root = src,
            tags = ["manual"],
            **_with_dev_dependencies(own, deps, dev_deps)
        )

def rust_library_crate(
        name,
        crate_name,
        deps = [],
        dev_deps = [],
        binaries = [],
        crate_features = [],
        unit_test_data = [],
        test_data = [],
        test_tags = [],
        external_tests = [],
        large_tests = [],
        custom_tests = [],
        benches = [],
        examples = []):
    """The targets of a Cargo package with a library (see the file's docstring).

    Args:
      name: the rust_library target (the package folder's name).
      crate_name: the [lib] name in Cargo.toml.
      deps: first-party [dependencies]: labels of their rust_library.
      dev_deps: first-party [dev-dependencies] that are not in `deps`.
      binaries: names of the [[bin]] targets at src/bin/<name>.rs.
      crate_features: Cargo features on in a workspace build.
      unit_test_data: data of the unit tests (<name>_test).
      test_data: data of every integration test (e.g. //testdata:all).
      test_tags: tags of every integration test.
      external_tests: stems of the tests/*.rs that read ../shared, outside the
        workspace: each is the rust_test <stem>, tagged "external" (so never
        cached), instead of a member of integration_tests.
      large_tests: stems of the tests/*.rs that are the rust_test <stem> of
        size "large" (long-running), instead of members of integration_tests.
      custom_tests: stems of the tests/*.rs that the BUILD file declares itself.
      benches: names of the [[bench]] targets (harness = false) at
        benches/<name>.rs.
      examples: names of the examples at examples/<name>.rs.
    """
    macro = "rust_library_crate(%r)" % name
    rust_library(
        name = name,
        srcs = native.glob(["src/**/*.rs"]),
        aliases = aliases(),
        crate_features = crate_features,
        crate_name = crate_name,
        crate_root = "src/lib.rs",
        proc_macro_deps = all_crate_deps(proc_macro = True),
        deps = deps + all_crate_deps(normal = True),
    )
    _unit_test(name, dev_deps, unit_test_data, crate_features)

    for binary in binaries:
        src = "src/bin/%s.rs" % binary
        rust_binary(
            name = binary,
            srcs = [src],
            aliases = aliases(),
            crate_features = crate_features,
            crate_root = src,
            proc_macro_deps = all_crate_deps(proc_macro = True),
            deps = [":" + name] + deps + all_crate_deps(normal = True),
        )
        _unit_test(binary, dev_deps, [], crate_features)

    own = [":" + name]
    tests = _stems(native.glob(["tests/*.rs"], allow_empty = True), "tests")
    _check_stems(macro, "external_tests", external_tests, tests)
    _check_stems(macro, "large_tests", large_tests, tests)
    _check_stems(macro, "custom_tests", custom_tests, tests)
    separate = [t for t in tests if t in external_tests or t in large_tests]
    in_suite = [t for t in tests if t not in separate and t not in custom_tests]
    helpers = native.glob(_TEST_HELPERS, allow_empty = True)
    data = [":" + b for b in binaries] + test_data
    if in_suite:
        rust_test_suite(
            name = "integration_tests",
            srcs = ["tests/%s.rs" % t for t in in_suite],
            crate_features = crate_features,
            data = data,
            rustc_env = _binary_env(binaries),
            shared_srcs = helpers,
            tags = test_tags,
            **_with_dev_dependencies(own, deps, dev_deps)
        )
    for stem in separate:
        src = "tests/%s.rs" % stem
        rust_test(
            name = stem,
            size = "large" if stem in large_tests else None,
            srcs = [src] + helpers,
            crate_features = crate_features,
            crate_root = src,
            data = data,
            rustc_env = _binary_env(binaries),
            tags = test_tags + (["external"] if stem in external_tests else []),
            **_with_dev_dependencies(own, deps, dev_deps)
        )

    _manual_binaries("benches", benches, own, deps, dev_deps, crate_features)
    _manual_binaries("examples", examples, own, deps, dev_deps, crate_features)

def rust_binary_crate(
        name,
        deps = [],
        dev_deps = [],
        compile_data = [],
        crate_features = [],
        test_data = [],
        external_tests = []):
    """The targets of a Cargo package that is one binary (see the file's docstring).

    Args:
      name: the rust_binary target, the [[bin]] name in Cargo.toml.
      deps: first-party [dependencies]: labels of their rust_library.
      dev_deps: first-party [dev-dependencies] that are not in `deps`.
      compile_data: files the sources read at compile time (include_str!).
      crate_features: Cargo features on in a workspace build.
      test_data: data of every integration test (besides the binary).
      external_tests: stems of the tests/*.rs that read ../shared, outside the
        workspace: their rust_test <stem>_test is tagged "external".
    """
    rust_binary(
        name = name,
        srcs = native.glob(["src/**/*.rs"]),
        aliases = aliases(),
        compile_data = compile_data,
        crate_features = crate_features,
        crate_root = "src/main.rs",
        proc_macro_deps = all_crate_deps(proc_macro = True),
        deps = deps + all_crate_deps(normal = True),
    )
    _unit_test(name, dev_deps, [], crate_features)

    tests = _stems(native.glob(["tests/*.rs"], allow_empty = True), "tests")
    _check_stems("rust_binary_crate(%r)" % name, "external_tests", external_tests, tests)
    helpers = native.glob(_TEST_HELPERS, allow_empty = True)
    for stem in tests:
        src = "tests/%s.rs" % stem
        rust_test(
            name = stem + "_test",
            srcs = [src] + helpers,
            crate_features = crate_features,
            crate_root = src,
            data = [":" + name] + test_data,
            rustc_env = _binary_env([name]),
            tags = ["external"] if stem in external_tests else [],
            **_with_dev_dependencies([], deps, dev_deps)
        )
