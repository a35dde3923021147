"""crate_universe's `crate` module extension, for the offline build only.

tools/bazel/bazel_offline.sh installs this file as
crate_universe/extensions.bzl in its copy of Debian's rules_rust 0.54.1
(.vendor/bazel/rules_rust, selected by --config=debian_offline). MODULE.bazel's
`crate.from_cargo(name = "crates", ...)` then makes @crates from the folder
that tools/bazel/vendor_crates.py wrote, .vendor/crates: crates vendored by
cargo from Cargo.lock (checksums checked) with generated BUILD files and the
hub files (BUILD.bazel, defs.bzl) crate_universe itself would write. Nothing is
downloaded and cargo-bazel is not needed. Online builds use rules_rust's real
extension (rules_rust 0.73.0 from the Bazel Central Registry).
"""

def _vendored_crates_impl(rctx):
    root = rctx.path(Label("@@//:MODULE.bazel")).dirname
    crates = root.get_child(".vendor").get_child("crates")
    if not crates.get_child("defs.bzl").exists:
        fail("%s has no defs.bzl: run tools/bazel/vendor_crates.py first" % crates)
    for entry in crates.readdir():
        rctx.symlink(entry, entry.basename)

_vendored_crates = repository_rule(
    implementation = _vendored_crates_impl,
    local = True,
    doc = "The crates tools/bazel/vendor_crates.py vendored into .vendor/crates.",
)

def _crate_impl(module_ctx):
    for mod in module_ctx.modules:
        for cfg in mod.tags.from_cargo:
            _vendored_crates(name = cfg.name)

_from_cargo = tag_class(attrs = {
    "cargo_config": attr.label(),
    "cargo_lockfile": attr.label(),
    "generate_binaries": attr.bool(),
    "generate_build_scripts": attr.bool(default = True),
    "isolated": attr.bool(default = True),
    "lockfile": attr.label(),
    "manifests": attr.label_list(),
    "name": attr.string(default = "crates"),
    "supported_platform_triples": attr.string_list(),
})

# crate.spec in MODULE.bazel (cudarc, an optional dependency): accepted and
# not used here, since vendor_crates.py already aliases the optional
# dependencies that the GPU features enable.
_spec = tag_class(attrs = {
    "default_features": attr.bool(default = True),
    "features": attr.string_list(),
    "package": attr.string(mandatory = True),
    "repositories": attr.string_list(),
    "version": attr.string(),
})

crate = module_extension(
    implementation = _crate_impl,
    tag_classes = {
        "from_cargo": _from_cargo,
        "spec": _spec,
    },
)
