//! Cargo build of the C++ API: cxx-build generates the bridge of src/lib.rs
//! and compiles it with src/hlo_api.cc into `libxla_cc_api.a`; the C++ tests
//! (tests/hlo_api_test.cc) go into their own archive, which only
//! tests/cc_test.rs links. Headers are included as `xla/cc_api/...`, the
//! workspace-relative paths Bazel uses, so the sources build unchanged under
//! both. (Bazel does not run this file: see BUILD.bazel.)

fn main() {
    cxx_build::CFG.include_prefix = "xla/cc_api";
    cxx_build::bridge("src/lib.rs")
        .file("src/hlo_api.cc")
        .std("c++17")
        .warnings(true)
        .compile("xla_cc_api");

    let out_dir = std::path::PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include(out_dir.join("cxxbridge/include"))
        .include(out_dir.join("cxxbridge/crate"))
        .file("tests/hlo_api_test.cc")
        .cargo_metadata(false)
        .compile("xla_cc_api_cctest");
    println!("cargo:rustc-link-search=native={}", out_dir.display());

    for f in [
        "src/lib.rs",
        "src/hlo_api.cc",
        "include/hlo_api.h",
        "tests/hlo_api_test.cc",
    ] {
        println!("cargo:rerun-if-changed={f}");
    }
}
