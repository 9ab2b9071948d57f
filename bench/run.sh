#!/usr/bin/env bash
# Runs one benchmark against a fresh local stack in a temporary SPACE_HOME, then removes it.
# Usage: bench/run.sh eventlog|create|exec|lifecycle|lifecycle-nats|fork|density [space-bench options]
#        (build first: see README.md; lifecycle-nats: snapshots in the NATS object store)
#        bench/run.sh egress   (bench/egress.sh: root, a test internet in a network namespace)
#        bench/run.sh cred     (egress.sh's credential rows only: injected against plain)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${SPACE_BIN_DIR:-$here/build/bin}
what=${1:-eventlog}
shift || true
home=$(mktemp -d "${SPACE_BENCH_TMP:-/tmp/space-bench}.XXXXXX")
chmod 0755 "$home"
trap 'SPACE_HOME=$home "$bin/space" down --purge >/dev/null 2>&1 || rm -rf "$home"' EXIT
export SPACE_HOME=$home SPACE_NATS_PORT=0 SPACE_API_PORT=0 SPACE_BIN_DIR=$bin
if [ "$what" = lifecycle-nats ]; then
  # The bench moves a sandbox between two workers: heartbeats every 500 ms make a stopped
  # worker dead for the scheduler within 1.5 s.
  export SPACE_SNAPSHOT_STORE=nats SPACE_HEARTBEAT_MS=500 SPACE_ID=bench-w1
  what=lifecycle
fi
if [ "$what" = eventlog ]; then
  export SPACE_DAEMONS=space-eventlog # heartbeats would mix into the measured events
fi
if [ "$what" = density ]; then
  # A claimed pool sandbox runs under its pool id's processes; pools off, every sandbox's
  # processes name it (bench/bench_density.c).
  export SPACE_POOL_SIZE=0
fi
if [ "$what" = create ]; then
  # Its cold part runs with warm pools off; space-bench restarts the worker with a pool
  # (--warm-pool, default 2) for the pooled part and the burst (bench/bench_create.c).
  export SPACE_POOL_SIZE=0
fi
if [ "$what" = exec ]; then
  # `runsc exec` beside each command names the sandbox's container, whose id is the sandbox's
  # only when it was created cold: a sandbox claimed from a warm pool runs in the pooled
  # container (pool_...), and runsc answers "file does not exist".
  export SPACE_POOL_SIZE=0
fi
if [ "$what" = cred ]; then
  what=egress
  set -- cred "$@"
fi
if [ "$what" = egress ]; then
  # Ports of its own, the bench internet's resolver (inside the namespace egress.sh makes) and
  # the upstream CA it makes (egressd reads the file once it appears).
  export SPACE_EGRESS_PROXY_PORT=15601 SPACE_EGRESS_DNS_PORT=15653 \
    SPACE_UPSTREAM_DNS=${EGRESS_NET:-198.19}.53.53:53 \
    SPACE_UPSTREAM_CA_FILE=$home/bench-upstream-ca.crt SPACE_ID=bench-egress
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
if [ "$what" = egress ]; then
  SPACE_BIN_DIR=$bin "$here/bench/egress.sh" "$@"
  exit
fi
"$bin/space-bench" --home "$home" "$@" "$what"
