#!/usr/bin/env bash
# Runs the benchmarks against a fresh local stack in a temporary SPACE_HOME, then removes it.
# Usage: bench/run.sh [space-bench options]   (build first: see README.md)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${SPACE_BIN_DIR:-$here/build/bin}
home=$(mktemp -d /tmp/space-bench.XXXXXX)
chmod 0755 "$home"
trap 'SPACE_HOME=$home "$bin/space" down --purge >/dev/null 2>&1 || rm -rf "$home"' EXIT
export SPACE_HOME=$home SPACE_NATS_PORT=0 SPACE_BIN_DIR=$bin
"$bin/space" up >/dev/null
set -a; . "$home/space.env"; set +a
"$bin/space-bench" "$@" eventlog
