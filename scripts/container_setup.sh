#!/usr/bin/env bash
# What the container tools and tests need on the host, installed only when missing (root):
#   podman runc netavark aardvark-dns iptables   the engine when no Docker daemon answers
#                                                (netavark needs iptables for its networks)
#   debootstrap                                  the local Debian base image
#   docker-registry                              a real registry on loopback for the push test
# podman-compose and hadolint come from the project venv (requirements.txt). Not root: prints
# the apt-get line and fails. Podman's settings are the project's scripts/containers.conf.
set -euo pipefail

PACKAGES=(podman runc netavark aardvark-dns iptables debootstrap docker-registry)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "container-setup: missing Debian packages: ${missing[*]}" >&2
  echo "container-setup: install them with: sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi
echo "container-setup: installing Debian packages: ${missing[*]}"
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
# Debian's docker-registry package starts a registry on :5000 where an init system runs; the
# tests start their own on a free loopback port, so a package-started one is not needed.
