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
  <stem>               rust_test of tests/<stem>.rs, per external/large/GPU test
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

GPU code (the CUDA switch, tools/bazel/BUILD.bazel, on with --config=cuda):
Cargo features that build it are off by default, as in Cargo. `gpu_crate_features`
are added to every target's crate_features and `gpu_deps` (optional third-party
crates those features enable, e.g. @crates//:cudarc, which all_crate_deps()
leaves out) to every target's deps, both through select() on the switch.
`gpu_tests` are tests/*.rs that need an NVIDIA GPU: each is its own rust_test,
tagged "requires-gpu-nvidia" (--config=ci skips them, --config=cuda runs only
them); without the switch they are empty tests (#![cfg(feature = ...)]).

tools/check_bazel_cargo.py runs this file as Python, with stand-ins for the
rules, to see the targets a BUILD file declares: keep to the part of Starlark
that is also Python (no struct, depset, type(), nested functions).
"""

load("@crates//:defs.bzl", "aliases", "all_crate_deps")
load("@rules_rust//rust:defs.bzl", "rust_binary", "rust_library", "rust_test", "rust_test_suite")

# Modules that every tests/*.rs may `mod` (tests/<dir>/**), as Cargo allows.
_TEST_HELPERS = ["tests/*/**/*.rs"]

# The CUDA switch (tools/bazel/BUILD.bazel): on with --config=cuda.
_CUDA_ENABLED = Label("//tools/bazel:cuda_enabled")

# The tag of tests that need an NVIDIA GPU (.bazelrc's configs ci and cuda filter on it).
_GPU_TAG = "requires-gpu-nvidia"

def _if_cuda(values):
    """`values` when the CUDA switch is on, else nothing: a select(), or [] for no values."""
    if not values:
        return []
    return select({
        _CUDA_ENABLED: values,
        "//conditions:default": [],
    })

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

def _with_dev_dependencies(own, deps, dev_deps, gpu_deps):
    """Attributes of a target that sees the package as Cargo's tests, benches and examples do.

    `gpu_deps` is a select() (or []) of the optional dependencies the CUDA switch adds.
    """
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
        ) + gpu_deps,
    )

def _binary_env(binaries):
    """rustc_env naming each binary as Cargo does for integration tests."""
    return {"CARGO_BIN_EXE_" + b: "$(rootpath :%s)" % b for b in binaries}

def _manual_binaries(folder, names, own, deps, dev_deps, gpu_deps, crate_features):
    """rust_binary <name> of <folder>/<name>.rs for each name, tagged "manual"."""
    for name in names:
        src = "%s/%s.rs" % (folder, name)
        rust_binary(
            name = name,
            srcs = [src],
            crate_features = crate_features,
            crate_root = src,
            tags = ["manual"],
            **_with_dev_dependencies(own, deps, dev_deps, gpu_deps)
        )

def rust_library_crate(
        name,
        crate_name,
        deps = [],
        dev_deps = [],
        binaries = [],
        crate_features = [],
        gpu_crate_features = [],
        gpu_deps = [],
        unit_test_data = [],
        test_data = [],
        test_tags = [],
        external_tests = [],
        large_tests = [],
        gpu_tests = [],
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
      gpu_crate_features: Cargo features that build the GPU code, on only with
        the CUDA switch (--config=cuda), in every target of the package.
      gpu_deps: labels of the optional third-party dependencies that
        `gpu_crate_features` enable (@crates//:cudarc), in the deps of every
        target (but unit tests, which have the library's) with the CUDA switch.
      unit_test_data: data of the unit tests (<name>_test).
      test_data: data of every integration test (e.g. //testdata:all).
      test_tags: tags of every integration test.
      external_tests: stems of the tests/*.rs that read ../shared, outside the
        workspace: each is the rust_test <stem>, tagged "external" (so never
        cached), instead of a member of integration_tests.
      large_tests: stems of the tests/*.rs that are the rust_test <stem> of
        size "large" (long-running), instead of members of integration_tests.
      gpu_tests: stems of the tests/*.rs that need an NVIDIA GPU: each is the
        rust_test <stem>, tagged "requires-gpu-nvidia", instead of a member of
        integration_tests (may also be external or large).
      custom_tests: stems of the tests/*.rs that the BUILD file declares itself.
      benches: names of the [[bench]] targets (harness = false) at
        benches/<name>.rs.
      examples: names of the examples at examples/<name>.rs.
    """
    macro = "rust_library_crate(%r)" % name
    crate_features = crate_features + _if_cuda(gpu_crate_features)
    gpu_deps = _if_cuda(gpu_deps)
    rust_library(
        name = name,
        srcs = native.glob(["src/**/*.rs"]),
        aliases = aliases(),
        crate_features = crate_features,
        crate_name = crate_name,
        crate_root = "src/lib.rs",
        proc_macro_deps = all_crate_deps(proc_macro = True),
        deps = deps + all_crate_deps(normal = True) + gpu_deps,
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
            deps = [":" + name] + deps + all_crate_deps(normal = True) + gpu_deps,
        )
        _unit_test(binary, dev_deps, [], crate_features)

    own = [":" + name]
    tests = _stems(native.glob(["tests/*.rs"], allow_empty = True), "tests")
    _check_stems(macro, "external_tests", external_tests, tests)
    _check_stems(macro, "large_tests", large_tests, tests)
    _check_stems(macro, "gpu_tests", gpu_tests, tests)
    _check_stems(macro, "custom_tests", custom_tests, tests)
    separate = [t for t in tests if t in external_tests or t in large_tests or t in gpu_tests]
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
            **_with_dev_dependencies(own, deps, dev_deps, gpu_deps)
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
            tags = test_tags + (["external"] if stem in external_tests else []) +
                   ([_GPU_TAG] if stem in gpu_tests else []),
            **_with_dev_dependencies(own, deps, dev_deps, gpu_deps)
        )

    _manual_binaries("benches", benches, own, deps, dev_deps, gpu_deps, crate_features)
    _manual_binaries("examples", examples, own, deps, dev_deps, gpu_deps, crate_features)

def rust_binary_crate(
        name,
        deps = [],
        dev_deps = [],
        compile_data = [],
        crate_features = [],
        gpu_crate_features = [],
        gpu_deps = [],
        test_data = [],
        external_tests = []):
    """The targets of a Cargo package that is one binary (see the file's docstring).

    Args:
      name: the rust_binary target, the [[bin]] name in Cargo.toml.
      deps: first-party [dependencies]: labels of their rust_library.
      dev_deps: first-party [dev-dependencies] that are not in `deps`.
      compile_data: files the sources read at compile time (include_str!).
      crate_features: Cargo features on in a workspace build.
      gpu_crate_features: Cargo features that build the GPU code, on only with
        the CUDA switch (--config=cuda), in every target of the package.
      gpu_deps: labels of the optional third-party dependencies that
        `gpu_crate_features` enable, in the deps of the binary and its tests
        with the CUDA switch (none when the features only forward to
        first-party crates, as run-hlo-module's do).
      test_data: data of every integration test (besides the binary).
      external_tests: stems of the tests/*.rs that read ../shared, outside the
        workspace: their rust_test <stem>_test is tagged "external".
    """
    crate_features = crate_features + _if_cuda(gpu_crate_features)
    gpu_deps = _if_cuda(gpu_deps)
    rust_binary(
        name = name,
        srcs = native.glob(["src/**/*.rs"]),
        aliases = aliases(),
        compile_data = compile_data,
        crate_features = crate_features,
        crate_root = "src/main.rs",
        proc_macro_deps = all_crate_deps(proc_macro = True),
        deps = deps + all_crate_deps(normal = True) + gpu_deps,
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
            **_with_dev_dependencies([], deps, dev_deps, gpu_deps)
        )
