//! Runs the C++ tests of the C++ API (tests/hlo_api_test.cc) from cargo: the
//! build script compiles that file into `libxla_cc_api_cctest.a` beside the
//! cxx bridge; Bazel builds the same file into a cc_test and into this test.

// Links the library (the bridge's Rust side and its C++ objects).
extern crate xla_cc_api;

// Under cargo the C++ tests are build.rs's archive; under Bazel (which passes
// `--cfg bazel`) they are a cc_library in this test's deps.
#[cfg_attr(not(bazel), link(name = "xla_cc_api_cctest", kind = "static"))]
extern "C" {
    fn xla_cc_api_run_tests() -> i32;
}

#[test]
fn cc_api_tests_pass() {
    let failed = unsafe { xla_cc_api_run_tests() };
    assert_eq!(failed, 0, "C++ API tests failed (see the output above)");
}
