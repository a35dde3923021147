#!/usr/bin/env bash
# buildifier 8.2.1 over every Bazel file of the repository (BUILD, BUILD.bazel,
# BUILD.*.bazel, *.bzl, MODULE.bazel, WORKSPACE), in check and lint mode:
#
#   tools/bazel/buildifier.sh          # check: formatting + lint warnings; exit 1 if any
#   tools/bazel/buildifier.sh --fix    # rewrite the files (format + fixable lint)
#
# The binary comes from the npm package @bazel/buildifier, which ships it
# prebuilt; it is installed once into ${XDG_CACHE_HOME:-~/.cache}/xla-rs.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
VERSION=8.2.1
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/xla-rs/buildifier-$VERSION
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "buildifier.sh: unsupported machine $(uname -m)" >&2; exit 2 ;;
esac
BIN=$CACHE/node_modules/@bazel/buildifier/buildifier-$(uname -s | tr A-Z a-z)_$arch

if [[ ! -x $BIN ]] || [[ "$("$BIN" --version 2>/dev/null)" != *"version: $VERSION"* ]]; then
  command -v npm >/dev/null || { echo "buildifier.sh: npm is needed to install @bazel/buildifier" >&2; exit 2; }
  echo "buildifier.sh: installing @bazel/buildifier@$VERSION into $CACHE" >&2
  rm -rf "$CACHE"
  mkdir -p "$CACHE"
  (cd "$CACHE" && echo '{"private": true}' >package.json &&
    timeout 300 npm install --no-audit --no-fund --silent "@bazel/buildifier@$VERSION" >&2)
fi

# Tracked files and new ones that git does not ignore (so .vendor/ is skipped).
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- \
  'BUILD' '*/BUILD' 'BUILD.bazel' '*/BUILD.bazel' '*/BUILD.*.bazel' '*.bzl' 'MODULE.bazel' 'WORKSPACE' |
  sort -u | while read -r f; do [[ -f $f ]] && echo "$f"; done)

if [[ ${1:-} == --fix ]]; then
  "$BIN" --mode=fix --lint=fix "${files[@]}"
  echo "buildifier $VERSION: fixed ${#files[@]} files"
  exit 0
fi
if "$BIN" --mode=check --lint=warn "${files[@]}"; then
  echo "buildifier $VERSION: ${#files[@]} files, no findings"
else
  echo "buildifier $VERSION: findings above (run tools/bazel/buildifier.sh --fix)" >&2
  exit 1
fi
