#!/usr/bin/env bash
# Makes the local Debian base image that CPU test builds start from, once; later runs reuse it.
#
#   scripts/make_base_image.sh [IMAGE]      (default localhost/sagemaker-byoc-base:bookworm)
#
# These machines cannot pull from any container registry, so the base is built here:
# `debootstrap --variant=minbase bookworm` from the Debian mirror that apt already uses
# (DEBIAN_MIRROR overrides); `tar | ENGINE import` turns the root filesystem into an image.
# Nothing of this machine's trust goes in (no CA certificate, no pip config): images built on
# it are pushed, and trust only what Debian's ca-certificates package trusts. A build that
# downloads through this machine's TLS-inspecting proxy gets its CA bundle as a build secret
# (scripts/build_image.sh). Needs root. FORCE=1 rebuilds it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/engine.sh

IMAGE=${1:-${LOCAL_BASE_IMAGE:-localhost/sagemaker-byoc-base:bookworm}}
SUITE=bookworm

image_exists() {
  "$ENGINE" image inspect "$IMAGE" >/dev/null 2>&1
}

apt_mirror() {
  # The first Debian archive URI apt is configured with (deb822 or one-line format).
  local uri
  uri=$( (grep -hE '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}';
          grep -hE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
            | awk '{print $2}') | grep -E '/debian/?$' | head -n1)
  echo "${uri:-http://deb.debian.org/debian}"
}

# One at a time: `make test` starts the TensorFlow image's build (which makes this image first)
# in set-up and the CPU image's later; a second caller waits here, then finds the image made.
exec 9>"${TMPDIR:-/tmp}/sagemaker-byoc-base-image.lock"
flock 9

if [ "${FORCE:-0}" != 1 ] && image_exists; then
  echo "base image: $IMAGE already present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "make_base_image: debootstrap needs root; run as root (or pass BASE_IMAGE=debian:bookworm-slim where a registry is reachable)" >&2
  exit 1
fi
command -v debootstrap >/dev/null || { echo "make_base_image: debootstrap missing: run make container-setup" >&2; exit 1; }

MIRROR=${DEBIAN_MIRROR:-$(apt_mirror)}
ROOTFS=$(mktemp -d /tmp/base-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT

echo "base image: debootstrap $SUITE from $MIRROR (about a minute)"
debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
  || { tail -n 30 "$ROOTFS.log" >&2; exit 1; }
rm -f "$ROOTFS.log"

# Smaller: no package caches or lists (every build runs apt-get update).
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*

tar --numeric-owner -C "$ROOTFS" -c . \
  | "$ENGINE" import --change 'CMD ["/bin/bash"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      - "$IMAGE" >/dev/null
echo "base image: $IMAGE imported"
