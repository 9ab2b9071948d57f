#!/usr/bin/env bash
# Runs one benchmark against a fresh local stack in a temporary SPACE_HOME, then removes it.
# Usage: bench/run.sh eventlog|create|exec|lifecycle|lifecycle-nats|fork|density|signed [space-bench options]
#        (build first: see README.md; lifecycle-nats: snapshots in the NATS object store)
#        bench/run.sh egress   (bench/egress.sh: root, a test internet in a network namespace)
#        bench/run.sh cred     (egress.sh's credential rows only: injected against plain)
#        bench/run.sh eventlog --nats-nodes 1,3 [space-bench options]
#          (the eventlog bench once per NATS cluster size, each on a fresh stack of its own with
#          SPACE_NATS_NODES=n and its streams R(min(3, n)); then throughput and lag side by side
#          with the ratio to the first size; docs/operations.md "Cluster bench")
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${SPACE_BIN_DIR:-$here/build/bin}
what=${1:-eventlog}
shift || true
if [ "$what" = eventlog ] && [ "${1:-}" = --nats-nodes ]; then
  # One stack per size, torn down before the next: each phase's stream stays small (a stream
  # of a million events has made `space up` time out creating a durable consumer).
  sizes=${2:?--nats-nodes needs a list, e.g. 1,3}
  shift 2
  out=$(mktemp "${SPACE_BENCH_TMP:-/tmp/space-bench}-nodes.XXXXXX")
  trap 'rm -f "$out" "$out".*' EXIT
  for n in ${sizes//,/ }; do
    echo "== eventlog on $n NATS node(s)"
    # Into a file first: tee to /dev/stderr would reopen (and truncate) a redirected log.
    SPACE_NATS_NODES=$n "$0" eventlog "$@" >"$out.$n"
    cat "$out.$n"
    sed -n "s/^JSON \({\"bench\":\"eventlog\",.*\)/$n \1/p" "$out.$n" >>"$out"
    rm -f "$out.$n"
  done
  # The durability the streams ran with (docs/operations.md "Durability"): `space up` writes
  # sync_interval "always" only for nats-server 2.10 or later.
  ver=$(nats-server --version 2>/dev/null | sed -n 's/.*v\([0-9][0-9.]*\).*/\1/p')
  case $ver in
    2.[0-9].* | "") sync="sync_interval default, 2 min (nats-server ${ver:-unknown} has no such field)" ;;
    *) sync="sync_interval always (nats-server $ver)" ;;
  esac
  echo
  echo "durability: $sync; streams R(min(3, nodes)); PostgreSQL fsync=on"
  python3 - "$out" <<'PY'
import json, sys
rows = [(int(l.split(" ", 1)[0]), json.loads(l.split(" ", 1)[1])) for l in open(sys.argv[1])]
if not rows:
    sys.exit("no eventlog result")
n0, b = rows[0]
print("\nNATS cluster size (unsigned mode, checkpoints on; lag at %d ev/s)" % b["lag_rate"])
print("  %-6s %12s %9s %9s %9s   %s" % ("nodes", "ev/s p50", "lag p50", "lag p90", "lag p99",
                                         "vs %d node(s): ev/s, lag p50, lag p99" % n0))
for n, r in rows:
    l, l0 = r["lag_ms"]["unsigned"], b["lag_ms"]["unsigned"]
    print("  %-6d %12.0f %7.2fms %7.2fms %7.2fms   x%.2f, x%.2f, x%.2f" % (
        n, r["eventlog_eps_p50"], l[0], l[1], l[2], r["eventlog_eps_p50"] / b["eventlog_eps_p50"],
        l[0] / l0[0], l[2] / l0[2]))
print("JSON " + json.dumps({"bench": "eventlog-nodes", "runs": b["runs"],
      "events_per_run": b["events_per_run"],
      "nodes": {str(n): {"eps_p50": r["eventlog_eps_p50"], "lag_ms": r["lag_ms"]["unsigned"]}
                for n, r in rows}}))
PY
  exit
fi
# Every packet on this host, loopback included, passes every worker's nftables table: tables
# left by stacks that were not purged make the bus, the database and the daemons dearer
# (docs/machine-notes.md, "Leftover nftables tables").
left=$(nft list tables 2>/dev/null | grep -c ' space_' || true)
if [ "${left:-0}" -gt 0 ]; then
  echo "bench: $left nftables table(s) of other stacks on this host (nft list tables); they tax every packet" >&2
fi
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
if [ "${SPACE_PG_STAT_STATEMENTS:-}" = 1 ]; then
  # Measurement only: `space up` loaded pg_stat_statements; count from here on (the bench's
  # own setup, one sandbox create, counts too). Statement by statement afterwards, per
  # command when the bench ran commands (docs/machine-notes.md "exec, fourth pass").
  psql -qAt "$SPACE_PG_URL" -c 'CREATE EXTENSION IF NOT EXISTS pg_stat_statements' \
    -c 'SELECT pg_stat_statements_reset()' -c 'SELECT pg_stat_reset()' >/dev/null
  "$bin/space-bench" --home "$home" "$@" "$what" | tee "$home/bench.out"
  # Every command's intent is one CommandRequested row: the exact count, both builds.
  cmds=$(psql -qAt "$SPACE_PG_URL" -c "SELECT count(*) FROM events WHERE type = 'CommandRequested'")
  echo
  echo "pg_stat_statements over ${cmds:-?} commands (all builds); per command:"
  psql -qAt -F $'\t' "$SPACE_PG_URL" -v n="${cmds:-1}" <<'SQL'
SELECT 'xact_commit/cmd', round(xact_commit::numeric / :n, 2), 'xact_rollback', xact_rollback
  FROM pg_stat_database WHERE datname = current_database();
SELECT round(calls::numeric / :n, 2) AS calls_per_cmd,
       round((total_exec_time / :n)::numeric * 1000, 1) AS exec_us_per_cmd,
       round((total_exec_time / greatest(calls, 1))::numeric * 1000, 1) AS us_per_call,
       round(plans::numeric / :n, 2) AS plans_per_cmd,
       round((total_plan_time / :n)::numeric * 1000, 1) AS plan_us_per_cmd,
       rows, left(regexp_replace(query, '\s+', ' ', 'g'), 150)
  FROM pg_stat_statements ORDER BY total_exec_time + total_plan_time DESC LIMIT 25;
SQL
else
  "$bin/space-bench" --home "$home" "$@" "$what"
fi
