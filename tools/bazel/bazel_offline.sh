#!/usr/bin/env bash
# Runs a real Bazel command on this repository offline, in the Debian sid
# chroot (Bazel 7.7.1, rules_rust 0.54.1, Debian's rustc), with the
# third-party crates vendored from Cargo.lock.
#
#   tools/bazel/bazel_offline.sh                 # = test //... --config=ci
#   tools/bazel/bazel_offline.sh build //tools/hlo_opt:hlo-opt
#   tools/bazel/bazel_offline.sh shell           # a shell in the same setup
#
# Steps:
#   1. tools/bazel/setup_chroot.sh: create or reuse the chroot (outside the repo).
#   2. tools/bazel/vendor_crates.py (on the host, whose cargo reaches the crates
#      registry): `cargo vendor` into .vendor/crates, checked against the
#      Cargo.lock checksums, plus generated BUILD files and the @crates hub.
#   3. .vendor/bazel/: stub modules that are only needed to resolve
#      rules_rust's module graph, rules_rust's tinyjson (from Debian's copy),
#      and a rust_toolchains repository that registers Debian's rustc.
#   4. In private mount and network namespaces (no network: only loopback, for
#      the Bazel client/server), bind-mounts the repository into the chroot at
#      the same path and runs `bazel <command> --config=debian_offline` there.
#      The debian_offline block of .bazelrc points rules_rust and the other
#      modules at the chroot's copies and the repositories at step 2/3's folders.
#
# Environment: XLA_RS_CHROOT (default /opt/xla-rs-sid), BAZEL_OFFLINE_TIMEOUT
# (seconds for the Bazel command, default 2700), BAZEL_JOBS (default 2),
# BAZEL_OUTPUT_USER_ROOT (inside the chroot, default /var/cache/xla-rs-bazel),
# BAZEL_DISK_CACHE (inside the chroot, default $BAZEL_OUTPUT_USER_ROOT/disk;
# empty: none).
# Exit status: Bazel's, 124 on timeout, or setup_chroot.sh's (2, 3).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
cd "$ROOT"

TIMEOUT=${BAZEL_OFFLINE_TIMEOUT:-2700}
JOBS=${BAZEL_JOBS:-2}
OUTPUT_USER_ROOT=${BAZEL_OUTPUT_USER_ROOT:-/var/cache/xla-rs-bazel}
VENDOR=$ROOT/.vendor
# Bazel's disk cache inside the chroot, shared by every checkout (action keys
# do not depend on the checkout's path), garbage-collected to DISK_CACHE_MAX.
DISK_CACHE=${BAZEL_DISK_CACHE-$OUTPUT_USER_ROOT/disk}
DISK_CACHE_MAX=${BAZEL_DISK_CACHE_MAX:-6G}

if [[ $# == 0 ]]; then
  set -- test //... --config=ci
fi

log() { echo "bazel_offline: $*" >&2; }

t0=$SECONDS
CHROOT=$(tools/bazel/setup_chroot.sh)
log "chroot ready in $((SECONDS - t0)) s"

t1=$SECONDS
python3 tools/bazel/vendor_crates.py --out "$VENDOR"
log "crates vendored in $((SECONDS - t1)) s"

# --- step 3: the repositories that replace downloads ---------------------------
B=$VENDOR/bazel
rm -rf "$B"
mkdir -p "$B"
# Modules in rules_rust 0.54.1's graph that Debian does not package and that
# nothing here uses: empty modules, so the graph resolves.
for m in protobuf:21.7 apple_support:1.13.0 aspect_rules_js:1.39.0 zlib:1.3.1 buildozer:7.1.2; do
  name=${m%%:*}
  mkdir -p "$B/stubs/$name"
  printf 'module(name = "%s", version = "%s")\n' "$name" "${m#*:}" >"$B/stubs/$name/MODULE.bazel"
  : >"$B/stubs/$name/BUILD.bazel"
done
# rules_rust: Debian's 0.54.1, with crate_universe/extensions.bzl (the file
# MODULE.bazel loads; 0.54.1 only has extension.bzl) replaced by an extension
# that serves the crates vendored in step 2.
cp -r "$CHROOT/usr/share/bazel/rules/rust" "$B/rules_rust"
cp tools/bazel/debian_offline/crate_universe_extensions.bzl "$B/rules_rust/crate_universe/extensions.bzl"
# rules_rust's process wrapper needs tinyjson 2.5.1; Debian ships its sources.
cp -r "$CHROOT/usr/share/cargo/registry/tinyjson-2.5.1" "$B/tinyjson"
cp "$CHROOT/usr/share/bazel/rules/rust/util/process_wrapper/BUILD.tinyjson.bazel" "$B/tinyjson/BUILD.bazel"
: >"$B/tinyjson/REPO.bazel"
# The Rust toolchain: Debian's rustc in the chroot, in place of rules_rust's
# downloaded one (the hub repository @rust_toolchains that MODULE.bazel registers).
mkdir -p "$B/rust_toolchains"
ln -s /usr "$B/rust_toolchains/usr"
cp toolchain/BUILD.debian_rust.bazel "$B/rust_toolchains/BUILD.bazel"
: >"$B/rust_toolchains/REPO.bazel"

# --- step 4: Bazel in the chroot, without network ---------------------------------
# Output bases are per checkout (Bazel names them by the md5 of its path), and
# CI clones into new folders: drop those unused for 3 days (the disk cache keeps
# their actions), after marking this checkout's as used.
obase=$CHROOT$OUTPUT_USER_ROOT/$(printf %s "$ROOT" | md5sum | cut -c1-32)
if [[ -d $obase ]]; then touch "$obase"; fi
find "$CHROOT$OUTPUT_USER_ROOT" -mindepth 1 -maxdepth 1 -type d -regextype egrep \
  -regex '.*/[0-9a-f]{32}' -mtime +3 -exec rm -rf --one-file-system {} + 2>/dev/null || true

# Bazel 7 garbage-collects the disk cache only while its server sits idle, and
# this server ends with the command, so the cache is trimmed here instead: the
# least recently used files (Bazel refreshes a file's mtime on every hit) go
# until the rest fits in DISK_CACHE_MAX.
if [[ -n $DISK_CACHE && -d $CHROOT$DISK_CACHE ]]; then
  max_bytes=$(numfmt --from=iec "$DISK_CACHE_MAX")
  find "$CHROOT$DISK_CACHE" -type f -printf '%T@ %s %p\n' | sort -rn \
    | awk -v max="$max_bytes" '{ total += $2; if (total > max) { sub(/^[^ ]+ [^ ]+ /, ""); print } }' \
    | xargs -r -d '\n' rm -f --
  log "disk cache trimmed to $(du -sh "$CHROOT$DISK_CACHE" | cut -f1) (limit $DISK_CACHE_MAX)"
fi

log "bazel $* --config=debian_offline (in $CHROOT, no network, timeout ${TIMEOUT}s)"
# The command, then the disk cache (before the user's flags, so that
# `--disk_cache=` turns it off), the user's arguments, the offline config.
inner=$(printf '%q ' "$1")
case $1 in
  build | test | run | coverage)
    if [[ -n $DISK_CACHE ]]; then
      inner="$inner --disk_cache=$DISK_CACHE --experimental_disk_cache_gc_max_size=$DISK_CACHE_MAX"
    fi
    ;;
esac
shift
if [[ $# -gt 0 ]]; then
  inner="$inner $(printf '%q ' "$@")"
fi
inner="$inner --config=debian_offline"
case $inner in
  build\ * | test\ * | run\ * | coverage\ * | cquery\ * | aquery\ *) inner="$inner --jobs=$JOBS" ;;
esac
set +e
timeout --kill-after=60 "$TIMEOUT" unshare --mount --net --fork bash -ec '
  chroot_dir=$1 root=$2 out_root=$3 jobs=$4 cmd=$5
  ip link set lo up 2>/dev/null || true
  mount --make-rprivate /
  mount -t proc proc "$chroot_dir/proc"
  mount --rbind /dev "$chroot_dir/dev"
  mount -t sysfs sys "$chroot_dir/sys"
  mount -t tmpfs tmpfs "$chroot_dir/tmp"
  mkdir -p "$chroot_dir$root" "$chroot_dir$out_root"
  mount --bind "$root" "$chroot_dir$root"
  exec chroot "$chroot_dir" /usr/bin/env -i HOME=/root USER=root LANG=C.UTF-8 \
    PATH=/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb CI="${CI:-}" \
    bash -c "cd \"$root\" && case \"$cmd\" in shell\ *) exec bash -i ;; esac
      bazel --output_user_root=$out_root --max_idle_secs=120 $cmd
      rc=\$?
      bazel --output_user_root=$out_root shutdown >/dev/null 2>&1
      exit \$rc"
' _ "$CHROOT" "$ROOT" "$OUTPUT_USER_ROOT" "$JOBS" "$inner"
rc=$?
set -e
if [[ $rc == 124 || $rc == 137 ]]; then
  log "ERROR: bazel did not finish within ${TIMEOUT}s"
fi
log "bazel exited with $rc after $((SECONDS - t0)) s in all"
exit $rc
