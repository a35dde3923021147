"""rust_cxx_bridge: the C++ half of a `#[cxx::bridge]` module, for Bazel.

Cargo builds run cxx-build from build.rs; Bazel does not run that build script.
This macro runs //tools/bazel/cxxbridge (cxx-gen, the same generator, pinned to
the release of cxx) on the Rust source and wraps the generated `<src>.h` and
`<src>.cc` in a cc_library. C++ includes the header by its workspace path, e.g.
`xla/cc_api/src/lib.rs.h`, which is also the path build.rs gives it (cxx-build
with `CFG.include_prefix`), so one source builds under both. The runtime header
`rust/cxx.h` comes from `@crates//:cxx_cc`, the cc_library that cxx's own
Cargo.toml declares for crate_universe.
"""

load("@bazel_skylib//rules:run_binary.bzl", "run_binary")
load("@rules_cc//cc:defs.bzl", "cc_library")

def rust_cxx_bridge(name, src, deps = [], **kwargs):
    """Generates and compiles the C++ side of the bridge in `src`.

    Args:
      name: the cc_library to define.
      src: the Rust file holding the `#[cxx::bridge]` module.
      deps: more cc_library dependencies of the generated code.
      **kwargs: passed to cc_library (visibility, tags, ...).
    """
    header = src + ".h"
    source = src + ".cc"
    run_binary(
        name = name + "_generate",
        srcs = [src],
        outs = [
            header,
            source,
        ],
        args = [
            "$(execpath %s)" % src,
            "--header",
            "$(execpath %s)" % header,
            "--cc",
            "$(execpath %s)" % source,
        ],
        tool = Label("//tools/bazel/cxxbridge"),
    )
    cc_library(
        name = name,
        srcs = [source],
        hdrs = [header],
        copts = ["-std=c++17"],
        linkstatic = True,
        # The C++ standard library, after the bridge and cxx's runtime: rustc
        # puts the C++ toolchain's own -lstdc++ before native libraries when it
        # links a rust_test/rust_binary.
        linkopts = select({
            "@platforms//os:macos": ["-lc++"],
            "//conditions:default": ["-lstdc++"],
        }),
        deps = deps + ["@crates//:cxx_cc"],
        **kwargs
    )
