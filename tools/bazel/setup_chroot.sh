#!/usr/bin/env bash
# Creates, or reuses, the Debian sid chroot that runs the offline Bazel build.
#
#   tools/bazel/setup_chroot.sh            # prints the chroot's path on stdout
#
# Debian sid packages Bazel 7.7.1 (bazel-bootstrap), rules_rust 0.54.1
# (bazel-rules-rust), the Bazel modules Debian overrides offline (platforms,
# rules_cc, bazel_skylib, ...), rustc and gcc. They need glibc >= 2.38, so they
# run in a sid chroot rather than on the host (see README.md, "Building with
# Bazel", and shared/reference/build-and-gpu.md section 3.3).
#
# The chroot lives outside the repository (XLA_RS_CHROOT, default
# /opt/xla-rs-sid) and is reused while its stamp file matches the recipe below
# and its Bazel runs; otherwise it is rebuilt next to it and swapped in, so an
# interrupted build never leaves a half-made chroot behind. Needs root and the
# Debian mirror (DEBIAN_MIRROR). Every network step is time-bounded.
#
# Exit status: 0 ok, 2 not root / missing host tools, 3 the chroot could not be
# built (the message says which step failed).
set -euo pipefail

CHROOT=${XLA_RS_CHROOT:-/opt/xla-rs-sid}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=${XLA_RS_CHROOT_SUITE:-sid}
# Bump RECIPE when the package list or the setup steps change: old chroots are
# then rebuilt.
RECIPE=1
PACKAGES="bazel-bootstrap bazel-rules-rust rustc cargo gcc g++ libc6-dev ca-certificates"
WANT="recipe=$RECIPE suite=$SUITE packages=$PACKAGES"
STAMP=.xla-rs-chroot

log() { echo "setup_chroot: $*" >&2; }
fail() {
  log "ERROR: $*"
  log "ERROR: could not build the Debian $SUITE chroot with Bazel at $CHROOT."
  log "       The offline Bazel step needs root, debootstrap and the Debian mirror"
  log "       ($MIRROR). Remove $CHROOT.new and retry, or set XLA_RS_CHROOT."
  exit 3
}

# Runs a command in the chroot with /proc mounted (Bazel's client reads
# /proc/self/exe even for --version), in a private mount namespace.
in_chroot() {
  local dir=$1
  shift
  unshare -m bash -ec 'mount -t proc proc "$0/proc"; exec chroot "$0" "$@"' "$dir" "$@"
}

valid() {
  local dir=$1
  [[ -f $dir/$STAMP ]] && [[ "$(head -n1 "$dir/$STAMP")" == "$WANT" ]] &&
    [[ -d $dir/usr/share/bazel/rules/rust ]] && [[ -x $dir/usr/bin/rustc ]] &&
    in_chroot "$dir" /usr/bin/bazel --version >/dev/null 2>&1
}

if [[ $(id -u) != 0 ]]; then
  log "ERROR: needs root (debootstrap, chroot and mount namespaces)."
  exit 2
fi
for tool in unshare chroot flock timeout; do
  command -v "$tool" >/dev/null || { log "ERROR: missing host tool $tool"; exit 2; }
done

mkdir -p "$(dirname "$CHROOT")"
exec 9>"$CHROOT.lock"
flock -w 1800 9 || fail "timed out waiting for another setup to finish ($CHROOT.lock)"

if valid "$CHROOT"; then
  log "reusing $CHROOT ($(in_chroot "$CHROOT" /usr/bin/bazel --version))"
  echo "$CHROOT"
  exit 0
fi

if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  timeout 600 apt-get update -qq >/dev/null || true
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq debootstrap >/dev/null ||
    fail "apt-get install debootstrap failed"
fi

NEW=$CHROOT.new
rm -rf --one-file-system "$NEW"
start=$SECONDS
log "debootstrap $SUITE into $NEW from $MIRROR (a few minutes)"
timeout 1500 debootstrap --variant=minbase "$SUITE" "$NEW" "$MIRROR" >"$NEW.debootstrap.log" 2>&1 ||
  { tail -n 20 "$NEW.debootstrap.log" >&2; fail "debootstrap failed (log: $NEW.debootstrap.log)"; }
log "debootstrap done in $((SECONDS - start)) s"

# The mirror may be a frozen snapshot whose Release file has expired.
cat >"$NEW/etc/apt/apt.conf.d/99xla-rs" <<'APT'
Acquire::Check-Valid-Until "false";
Acquire::Retries "3";
APT::Install-Recommends "false";
Dpkg::Use-Pty "0";
APT
cp -L /etc/resolv.conf "$NEW/etc/resolv.conf" 2>/dev/null || true

log "installing $PACKAGES"
# A private mount namespace: the mounts disappear with the process.
timeout 1500 unshare -m bash -ec '
  mount -t proc proc "$1/proc"
  mount --rbind /dev "$1/dev"
  mount -t sysfs sys "$1/sys"
  chroot "$1" /usr/bin/env DEBIAN_FRONTEND=noninteractive bash -ec "
    apt-get update -q
    apt-get install -y -q $2
    apt-get clean
    rm -rf /var/lib/apt/lists/*"
' _ "$NEW" "$PACKAGES" >"$NEW.apt.log" 2>&1 ||
  { tail -n 30 "$NEW.apt.log" >&2; fail "apt-get install in the chroot failed (log: $NEW.apt.log)"; }

{
  echo "$WANT"
  chroot "$NEW" dpkg-query -W bazel-bootstrap bazel-rules-rust rustc gcc
} >"$NEW/$STAMP"
valid "$NEW" || fail "the new chroot does not run bazel"

if [[ -e $CHROOT ]]; then
  log "replacing the stale chroot at $CHROOT"
  rm -rf --one-file-system "$CHROOT"
fi
mv "$NEW" "$CHROOT"
rm -f "$NEW.debootstrap.log" "$NEW.apt.log"
log "ready in $((SECONDS - start)) s: $(in_chroot "$CHROOT" /usr/bin/bazel --version), $(chroot "$CHROOT" rustc --version)"
echo "$CHROOT"
