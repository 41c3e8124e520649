#!/usr/bin/env bash
# Installs every host package forkd needs, from Debian (QEMU from bookworm-backports).
# Idempotent: a second run on a ready host does nothing but check.
set -euo pipefail

need_root() { [ "$(id -u)" = 0 ] || { echo "setup-host: run as root (apt-get install)" >&2; exit 1; }; }

# What forkd runs with (the daemon, guest image builds, netns networking), then what only its
# tests use. FORKD_HOST_TEST_PACKAGES=0 leaves the second list out: deploy/Dockerfile does.
PKGS=(debootstrap qemu-utils e2fsprogs cpio zstd kmod busybox-static gcc libc6-dev make python3
      iproute2 util-linux ca-certificates nftables conntrack procps attr etcd-server etcd-client)
TEST_PKGS=(python3-numpy python3-venv openssl python3-prometheus-client docker-registry chromium)
[ "${FORKD_HOST_TEST_PACKAGES:-1}" = 0 ] || PKGS+=("${TEST_PKGS[@]}")
QEMU_PKG=qemu-system-x86

missing=()
for p in "${PKGS[@]}" "$QEMU_PKG"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
qemu_major() { qemu-system-x86_64 --version 2>/dev/null | sed -n 's/.*version \([0-9]*\)\..*/\1/p'; }
if [ ${#missing[@]} -eq 0 ] && [ "$(qemu_major || echo 0)" -ge 8 ] 2>/dev/null; then
  echo "setup-host: all host packages present (QEMU $(qemu_major))"
  exit 0
fi
need_root
export DEBIAN_FRONTEND=noninteractive

# bookworm-backports from the same archive apt already uses for bookworm.
if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
  uri=$(grep -rhs '^URIs:.*debian$\|^URIs:.*debian/$' /etc/apt/sources.list.d/*.sources | head -n1 | awk '{print $2}')
  [ -n "$uri" ] || uri=$(grep -rhs '^deb .*bookworm main' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | head -n1 | awk '{print $2}')
  [ -n "$uri" ] || uri=http://deb.debian.org/debian
  echo "deb $uri bookworm-backports main" > /etc/apt/sources.list.d/forkd-backports.list
  echo "setup-host: added bookworm-backports from $uri"
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${PKGS[@]}" >/dev/null
# docker-registry is for the registry tests and etcd-server for clusters (`forkd cluster up` and
# the tests start their own members): where a package started a system service, stop it.
if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
  systemctl disable --now etcd >/dev/null 2>&1 || true
fi
apt-get install -y -qq --no-install-recommends -t bookworm-backports "$QEMU_PKG" >/dev/null
echo "setup-host: installed; QEMU $(qemu-system-x86_64 --version | head -n1)"
