//! Where tests find their data, the same way under `cargo test` and
//! `bazel test`.
//!
//! - Under Bazel (`TEST_SRCDIR` is set) the workspace root is the runfiles
//!   tree `$TEST_SRCDIR/_main`, which holds `testdata/` when the test lists
//!   `data = ["//testdata:all"]`. The compile-time `CARGO_MANIFEST_DIR` is
//!   never used there: rules_rust bakes in the execroot of whichever checkout
//!   compiled the test, and Bazel's disk cache can hand the binary to another
//!   checkout, where that path does not exist.
//! - Under cargo the root is two folders above this crate's manifest.
//! - Under `bazel run` (a benchmark) the checkout is
//!   `BUILD_WORKSPACE_DIRECTORY`, which Bazel sets.
//! - `XLA_RS_CHECKOUT` overrides all of these (a test binary carried to
//!   another machine, e.g. the GPU check).
//!
//! `../shared` (the corpus and XLA's large modules) sits next to the source
//! checkout; under Bazel the checkout is found by following a runfile's link
//! back to the source tree. `XLA_RS_SHARED` overrides it.
//!
//! Invariants: `testdata/` is part of the repository, so its absence is a
//! failure (`testdata_cases` panics), never a silent skip; `../shared` is
//! optional and its absence is reported with a note and `None`.

use std::path::{Path, PathBuf};

/// The workspace root as this test sees it: runfiles under Bazel, the
/// checkout under cargo.
pub fn workspace_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("XLA_RS_CHECKOUT") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("BUILD_WORKSPACE_DIRECTORY") {
        return PathBuf::from(dir);
    }
    match std::env::var_os("TEST_SRCDIR") {
        Some(dir) => Path::new(&dir).join("_main"),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."),
    }
}

/// The source checkout (not the runfiles tree): for files that are not
/// Bazel data dependencies, such as `../shared` and helper scripts.
pub fn checkout_root() -> PathBuf {
    let root = workspace_root();
    let overridden = std::env::var_os("XLA_RS_CHECKOUT").is_some()
        || std::env::var_os("BUILD_WORKSPACE_DIRECTORY").is_some();
    if std::env::var_os("TEST_SRCDIR").is_some() && !overridden {
        // Runfiles are links into the source tree (testdata/README.md is in
        // every test's data); two levels above its real path is the checkout.
        if let Ok(real) = root.join("testdata/README.md").canonicalize() {
            if let Some(checkout) = real.parent().and_then(Path::parent) {
                return checkout.to_path_buf();
            }
        }
    }
    root
}

/// `testdata/cases`; panics when absent (it is part of the repository, and
/// Bazel tests must list `//testdata:all` in their data).
pub fn testdata_cases() -> PathBuf {
    let dir = workspace_root().join("testdata/cases");
    assert!(
        dir.is_dir(),
        "{} not found: testdata is part of the repository (Bazel tests need data = [\"//testdata:all\"])",
        dir.display()
    );
    dir
}

/// One case folder of `testdata/cases`.
pub fn testdata_case(name: &str) -> PathBuf {
    testdata_cases().join(name)
}

/// The `../shared` folder next to the checkout, or `None` with a note on
/// stderr where it is absent.
pub fn shared() -> Option<PathBuf> {
    let dir = match std::env::var_os("XLA_RS_SHARED") {
        Some(d) => PathBuf::from(d),
        None => checkout_root().join("../shared"),
    };
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "note: {} not found; skipping the checks that need ../shared",
            dir.display()
        );
        None
    }
}

/// `../shared/<rel>` when it exists (a note on stderr otherwise).
pub fn shared_path(rel: &str) -> Option<PathBuf> {
    let path = shared()?.join(rel);
    if path.exists() {
        Some(path)
    } else {
        eprintln!("note: {} not found; skipping it", path.display());
        None
    }
}

/// The corpus case folders, `../shared/corpus/cases` (empty with a note
/// where absent).
pub fn shared_corpus_cases() -> Option<PathBuf> {
    shared_path("corpus/cases")
}

/// Every stored case folder: testdata's, then the shared corpus's where it
/// exists (a note where it does not).
pub fn all_case_dirs() -> Vec<PathBuf> {
    let mut dirs = case_dirs(&testdata_cases());
    if let Some(shared) = shared_corpus_cases() {
        dirs.extend(case_dirs(&shared));
    }
    dirs
}

/// The subfolders of `parent` that hold an `input.hlo`, sorted by name
/// (empty when `parent` does not exist).
pub fn case_dirs(parent: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(parent)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    dirs.retain(|d| d.join("input.hlo").is_file());
    dirs.sort();
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn testdata_is_found_and_has_cases() {
        assert!(!case_dirs(&testdata_cases()).is_empty());
    }

    #[test]
    fn checkout_root_holds_the_workspace_files() {
        assert!(checkout_root().join("testdata/README.md").is_file());
    }
}
