#!/usr/bin/env bash
# Runs one benchmark against a fresh local stack in a temporary SPACE_HOME, then removes it.
# Usage: bench/run.sh eventlog|create|exec|lifecycle [space-bench options]   (build first: see README.md)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${SPACE_BIN_DIR:-$here/build/bin}
what=${1:-eventlog}
shift || true
home=$(mktemp -d /tmp/space-bench.XXXXXX)
chmod 0755 "$home"
trap 'SPACE_HOME=$home "$bin/space" down --purge >/dev/null 2>&1 || rm -rf "$home"' EXIT
export SPACE_HOME=$home SPACE_NATS_PORT=0 SPACE_API_PORT=0 SPACE_BIN_DIR=$bin
if [ "$what" = eventlog ]; then
  export SPACE_DAEMONS=space-eventlog # heartbeats would mix into the measured events
fi
"$bin/space" up >/dev/null
set -a; . "$home/space.env"; set +a
if [ "$what" != eventlog ]; then
  # The worker announces its templates with its first heartbeat.
  for _ in $(seq 100); do
    curl -sf -H "Authorization: Bearer $SPACE_API_KEY" "$SPACE_API_URL/v1/templates" | grep -q tiny && break
    sleep 0.1
  done
fi
"$bin/space-bench" --home "$home" "$@" "$what"
