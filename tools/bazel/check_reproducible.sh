#!/usr/bin/env bash
# Reproducibility check: builds the release binaries twice from clean with
# `--config=release` and compares their bytes.
#
#   tools/bazel/check_reproducible.sh [TARGET...]
#
# Runs through tools/bazel/bazel_offline.sh (Bazel 7.7.1 in the Debian chroot,
# no network). Each round starts from `bazel clean --expunge` with the disk
# cache off, so nothing is reused between the rounds; then the sha256 of every
# output file of the targets is recorded. Exit 0 when both rounds give the same
# bytes, 1 otherwise (the differing files are listed). Takes two full optimised
# builds (about 25 minutes each on 2 cores: the optimised evaluator alone takes
# several minutes).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
cd "$ROOT"
CHROOT=${XLA_RS_CHROOT:-/opt/xla-rs-sid}
if [[ $# == 0 ]]; then
  set -- //tools/hlo_opt:hlo-opt //tools/run_hlo_module:run_hlo_module \
    //xla/cc_api:cc_api_static //xla/cc_api:hlo_api_cc_test
fi
OUT=$ROOT/.vendor/reproducible
rm -rf "$OUT"
mkdir -p "$OUT"

for round in 1 2; do
  echo "== round $round: clean, then bazel build --config=release $*"
  tools/bazel/bazel_offline.sh clean --expunge
  start=$SECONDS
  tools/bazel/bazel_offline.sh build --config=release --disk_cache= "$@"
  echo "   built in $((SECONDS - start)) s"
  base=$(tools/bazel/bazel_offline.sh info --config=release output_base 2>/dev/null | tail -n1)
  tools/bazel/bazel_offline.sh cquery --config=release "set($*)" --output=files 2>/dev/null |
    grep '^bazel-out/' >"$OUT/files.$round"
  while read -r f; do
    (cd "$CHROOT$base/execroot/_main" && sha256sum "$f")
  done <"$OUT/files.$round" | sort -k2 >"$OUT/sha256.$round"
  cat "$OUT/sha256.$round"
done

if [[ ! -s $OUT/sha256.1 ]]; then
  echo "check_reproducible: no output files recorded" >&2
  exit 1
fi
if diff "$OUT/sha256.1" "$OUT/sha256.2"; then
  echo "reproducible: $(wc -l <"$OUT/sha256.1") files identical across two clean release builds"
else
  echo "NOT reproducible: the files above differ between the two clean builds" >&2
  exit 1
fi
