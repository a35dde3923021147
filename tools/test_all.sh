#!/usr/bin/env bash
# Runs every test of the project: the cargo test suite (all crates), the
# Cargo/Bazel consistency check, the XLA cross-checks (XLA's parser on our
# printed HLO), buildifier over the Bazel files, and the real Bazel test of
# every target, offline, through the Debian chroot (tools/bazel/bazel_offline.sh;
# needs root and the Debian mirror the first time, see README.md). Set
# XLA_RS_SKIP_BAZEL=1 to skip the Bazel test on a machine that cannot run it. Python packages for the XLA cross-checks (jax/jaxlib, pinned in
# tools/testdata_gen/requirements.txt) are installed when pip can reach the
# registry; without them those checks skip with a message.
set -euo pipefail
cd "$(dirname "$0")/.."

# A /dev/null that became a regular file (something renamed a file over it)
# feeds its contents to every program reading it, rustc's probes included,
# and the build fails far from the cause: repair it as root, else stop here.
if [ ! -c /dev/null ]; then
  echo "warning: /dev/null is not a character device: $(ls -l /dev/null)" >&2
  if [ "$(id -u)" = 0 ]; then
    rm -f /dev/null && mknod -m 666 /dev/null c 1 3 && echo "repaired /dev/null" >&2
  else
    echo "error: /dev/null must be the null device; ask root to run: mknod -m 666 /dev/null c 1 3" >&2
    exit 1
  fi
fi

if ! python3 -c 'import jax' >/dev/null 2>&1; then
  echo "== installing the pinned jax/jaxlib for the XLA cross-checks"
  python3 -m pip install -q -r tools/testdata_gen/requirements.txt \
    || echo "note: could not install jax; XLA cross-checks will skip"
fi

echo "== cargo test (all crates)"
cargo test --workspace --release

echo "== rustfmt and clippy (warnings are errors), default and GPU features"
if cargo fmt --version >/dev/null 2>&1 && cargo clippy --version >/dev/null 2>&1; then
  cargo fmt --all --check
  cargo clippy --release --workspace --all-targets -- -D warnings
  cargo clippy --release -p collectives -p xla-runtime --features collectives/nccl,xla-runtime/cuda --all-targets -- -D warnings
else
  echo "note: rustfmt or clippy is not installed for this toolchain; skipped"
fi

echo "== the NCCL backend compiles (cudarc loads CUDA at run time; no GPU needed to build)"
cargo build --release -p collectives --features nccl
cargo build --release -p xla-runtime --features cuda,nccl --test cuda  # the CUDA backend and its GPU tests compile (cudarc loads CUDA at run time)

echo "== bad input: the CLI fuzzer's regression cases, then a one-minute fuzz run"
cargo build --release -p hlo-opt -p run-hlo-module
python3 tools/fuzz/cli_fuzz.py --bin-dir target/release --replay testdata/fuzz
python3 tools/fuzz/cli_fuzz.py --bin-dir target/release --seconds 60 --seed 1 \
  --out "$(mktemp -d)" --quiet

echo "== no import cycle between a crate's modules (crates with a known cycle are not listed yet)"
python3 tools/check_module_cycles.py --self-test
python3 tools/check_module_cycles.py xla/service/spmd xla/service/sharding_propagation \
  xla/service/pipelines xla/service/mpmd xla/hlo/parser xla/hlo/verifier xla/hlo/pass runtime \
  tools/hlo_opt tools/run_hlo_module

echo "== Cargo.toml / BUILD.bazel consistency"
python3 tools/check_bazel_cargo.py
# ... and the check itself fails when one side loses a dependency.
python3 tools/bazel/test_check_bazel_cargo.py

echo "== XLA's parser accepts our printed HLO"
tools/check_printed_hlo_with_xla.sh

echo "== buildifier 8.2.1 (check + lint) over BUILD/MODULE/WORKSPACE/.bzl files"
tools/bazel/buildifier.sh

if [[ ${XLA_RS_SKIP_BAZEL:-0} == 1 ]]; then
  echo "== Bazel test skipped (XLA_RS_SKIP_BAZEL=1)"
else
  echo "== Bazel: bazel test //... --config=ci, offline in the Debian sid chroot"
  # --nocache_test_results: every test really runs, even when the disk cache
  # of an earlier run has its result.
  tools/bazel/bazel_offline.sh test //... --config=ci --nocache_test_results
fi
