#!/usr/bin/env bash
# Installs every Debian package SPACE-C needs to build, test and run. Idempotent: packages
# already present are left alone, and apt-get runs only when something is missing.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config git ca-certificates
  clang clang-format clang-tidy
  libnats-dev nats-server
  libprotobuf-c-dev protobuf-c-compiler
  libpq-dev postgresql postgresql-contrib
  libuv1-dev libh2o-dev zlib1g-dev
  libnftnl-dev libmnl-dev nftables
  libssl-dev openssl libsodium-dev
  libbtrfsutil-dev btrfs-progs zstd libzstd-dev
  runsc busybox-static debootstrap
  iproute2 procps psmisc curl util-linux python3 chromium
  python3-yaml systemd jq
  libcmocka-dev
  # promtool (check metrics), run by tests/integration/metrics.c on every scrape; the
  # package's server is not used
  prometheus
)
# chromium: the headless browser tests/console drives (through playwright-core from npm).

# Not from Debian: node and npm, which only tests/e2b (the official E2B JS SDK) and
# tests/openapi (the OpenAPI validator and client generator) use. The SDK needs node >= 20.18.1,
# the generator 20.9, and bookworm's nodejs is 18.x; a machine with a newer node (NodeSource, as
# on the project's machines) keeps it, and without one those tests report themselves skipped.

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: must run as root (apt-get)" >&2
  exit 1
fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Debian's postgresql package would start a system cluster; SPACE runs its own private one, so
# keep the package's service from starting during install (policy-rc.d 101 = action forbidden).
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod +x "$policy"
  created_policy=1
fi
trap '[ "$created_policy" = 1 ] && rm -f "$policy"' EXIT
apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
