#!/usr/bin/env bash
# Runs every test of the project: the cargo test suite (all crates), the
# Cargo/Bazel consistency check, and the XLA cross-checks (XLA's parser on our
# printed HLO). Python packages for the XLA cross-checks (jax/jaxlib, pinned in
# tools/testdata_gen/requirements.txt) are installed when pip can reach the
# registry; without them those checks skip with a message.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c 'import jax' >/dev/null 2>&1; then
  echo "== installing the pinned jax/jaxlib for the XLA cross-checks"
  python3 -m pip install -q -r tools/testdata_gen/requirements.txt \
    || echo "note: could not install jax; XLA cross-checks will skip"
fi

echo "== cargo test (all crates)"
cargo test --workspace --release

echo "== Cargo.toml / BUILD.bazel consistency"
python3 tools/check_bazel_cargo.py

echo "== XLA's parser accepts our printed HLO"
tools/check_printed_hlo_with_xla.sh
