#!/usr/bin/env bash
# Egress bench (run through `bench/run.sh egress`, which starts the stack with the environment
# below and calls this with SPACE_HOME, SPACE_API_URL, SPACE_API_KEY set).
#
# What it measures, in one run, against the same test servers (tests/integration/egress/
# internet.py in a network namespace this script creates; every address it uses is routed into
# that namespace first, nothing leaves the machine):
#   direct    the host's own connection to the server: the path egressd's upstream leg takes,
#             without a sandbox or a proxy (the baseline; a sandbox has no direct path)
#   cidr      sandbox -> a CIDR:port rule: gVisor's netstack, the nftables redirect and
#             egressd splicing bytes without looking at them
#   http      sandbox -> plain HTTP checked per request (Host, attribution)
#   https     sandbox -> TLS terminated by egressd (leaf from the deployment CA), Host == SNI,
#             new verified TLS to the server
# each as: small requests on one kept-alive connection (p50/p90/p99 per request), small requests
# on a new connection each (p50/p90/p99, handshakes included), and one large download (MB/s).
# Then the credential rows (an injected request against a plain one, below: `bench/run.sh cred`
# runs only those), a 20 MB upload through the proxy, and the same download and upload with the
# sandbox's policy limiting it to LIMIT bytes per second each way (the measured rate should be
# the limit).
# The client is egress-probe (static), the same binary on the host and in the sandbox.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${SPACE_BIN_DIR:-$here/build/bin}
net=${EGRESS_NET:-198.19}
ns=egb-inet
veth=egb-h
N=${BENCH_N:-2000}         # requests on one connection
NC=${BENCH_NEWCONN:-300}   # requests with a connection each
BIG=${BENCH_BIG:-268435456} # bytes of the download
LIMIT=${BENCH_LIMIT:-10000000} # bytes per second of the limited rows
ROUNDS=${BENCH_ROUNDS:-2}  # rounds of every row
pki=$SPACE_HOME/bench-pki
stats=$SPACE_HOME/bench-inet.json
api=$SPACE_API_URL
auth="Authorization: Bearer $SPACE_API_KEY"

cleanup() {
  if [ -n "${inet_pid:-}" ]; then kill "$inet_pid" 2>/dev/null || true; fi
  ip route del "$net.1.0/24" via "$net.0.2" dev "$veth" 2>/dev/null || true
  ip route del "$net.53.0/24" via "$net.0.2" dev "$veth" 2>/dev/null || true
  ip link del "$veth" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
}
trap cleanup EXIT

# ---- PKI: the test "public" CA (egressd's upstream bundle) and leaves for the sites ----
mkdir -p "$pki/rogue"
mkleaf() { # dir name ca-dir
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$2" \
    -keyout "$1/$2.key" -out "$1/$2.csr" 2>/dev/null
  openssl x509 -req -in "$1/$2.csr" -CA "$3/ca.crt" -CAkey "$3/ca.key" -CAcreateserial \
    -days 2 -extfile <(printf 'subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth\n' "$2") \
    -out "$1/$2.crt" 2>/dev/null
}
for d in "$pki" "$pki/rogue"; do
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj "/CN=bench CA" -keyout "$d/ca.key" -out "$d/ca.crt" 2>/dev/null
done
for n in allowed.test www.wild.test forbidden.test; do mkleaf "$pki" "$n" "$pki"; done
mkleaf "$pki/rogue" allowed.test "$pki/rogue"
# egressd re-reads its upstream bundle when it changes; this is its first appearance.
cp "$pki/ca.crt" "$SPACE_UPSTREAM_CA_FILE"

# ---- the test internet ----
cleanup
ip netns add "$ns"
ip link add "$veth" type veth peer name eth0 netns "$ns"
ip addr add "$net.0.1/24" dev "$veth"
ip link set "$veth" up
ip -n "$ns" link set lo up
ip -n "$ns" addr add "$net.0.2/24" dev eth0
for a in "$net.1.10" "$net.1.20" "$net.1.30" "$net.53.53" 169.254.169.254; do
  ip -n "$ns" addr add "$a/32" dev eth0
done
ip -n "$ns" link set eth0 up
ip route add "$net.1.0/24" via "$net.0.2" dev "$veth"
ip route add "$net.53.0/24" via "$net.0.2" dev "$veth"
for a in "$net.1.10" "$net.1.30" "$net.53.53"; do
  ip route get "$a" | grep -q "dev $veth" || { echo "bench: $a is not routed into $ns" >&2; exit 1; }
done
rm -f "$stats"
EGRESS_NET=$net ip netns exec "$ns" /usr/bin/python3 "$here/tests/integration/egress/internet.py" \
  "$stats" "$pki" bench 2>"$SPACE_HOME/bench-inet.log" &
inet_pid=$!
for _ in $(seq 100); do [ -f "$stats" ] && break; sleep 0.05; done
[ -f "$stats" ] || { cat "$SPACE_HOME/bench-inet.log" >&2; exit 1; }

# ---- a sandbox with the probe ----
policy="{\"mode\":\"allowlist\",\"allow\":[\"allowed.test\",\"$net.1.30/32:8080\"]}"
id=$(curl -sf -H "$auth" -H 'Content-Type: application/json' \
  -d "{\"template\":\"tiny\",\"network\":$policy}" "$api/v1/sandboxes" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
curl -sf -X PUT -H "$auth" -H 'Content-Type: application/octet-stream' \
  --data-binary @"$bin/egress-probe" "$api/v1/sandboxes/$id/files?path=/root/probe&mode=0755" >/dev/null
run() { # command in the sandbox, as root; prints its output
  python3 - "$api" "$SPACE_API_KEY" "$id" "$1" <<'EOF'
import json, sys, urllib.request
api, key, sid, cmd = sys.argv[1:]
body = json.dumps({"cmd": "(%s) 2>&1" % cmd, "user": "root", "timeout_s": 600}).encode()
req = urllib.request.Request(api + "/v1/sandboxes/%s/commands" % sid, body, method="POST",
                             headers={"Authorization": "Bearer " + key, "Accept": "application/json",
                                      "Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=700))["stdout"], end="")
EOF
}
# The worker wrote the sandbox's gateway into its resolv.conf at create.
run "nslookup allowed.test >/dev/null && echo resolved" | grep -q resolved

# ---- measurements ----
A=$net.1.10
C=$net.1.30
probe_host() { "$bin/egress-probe" --ca "$pki/ca.crt" "$@"; }
# Resolved again before each run: attributions end with the answer's TTL (plus a grace).
probe_sbx() { run "nslookup allowed.test >/dev/null; /root/probe $*"; }
line() { # label, then the probe's bench line
  printf '%-34s %s\n' "$1" "$(echo "$2" | grep '^bench:' | sed 's/^bench: //')"
}
# ---- credentials: an injected request against a plain allowed one ----
# A bearer credential for allowed.test/inj/ (created through the API, the value random per
# run); /plain/ of the same host carries none. Both go through egressd's credential path (a
# cached lookup per sandbox and host, the head rewritten or not), on one kept-alive connection
# per run, the cache warm (the first request of each run warms it; a run is N requests).
# ABBA order per round cancels the drift of a machine that is shared.
cred_rows() {
  local value
  value="bench-$(openssl rand -hex 16)"
  curl -sf -H "$auth" -H 'Content-Type: application/json' \
    -d "{\"name\":\"bench\",\"hosts\":[\"allowed.test/inj/\"],\"inject\":{\"type\":\"bearer\",\"value\":\"$value\"}}" \
    "$api/v1/credentials" >/dev/null
  local -A p50 p90 p99
  local r k kind out s
  for kind in http https; do for s in plain inj; do p50[$kind$s]=; p90[$kind$s]=; p99[$kind$s]=; done; done
  for r in $(seq "$ROUNDS"); do
    for k in 0 1; do
      for kind in http https; do
        if [ $(((r + k) % 2)) = 0 ]; then s=plain; else s=inj; fi
        if [ "$kind" = http ]; then
          out=$(probe_sbx --host allowed.test --path "/$s/x" --bench "$N" "$A" 8080)
        else
          out=$(probe_sbx --sni allowed.test --path "/$s/x" --bench "$N" "$A" 443)
        fi
        line "cred   $kind $(printf %-5s $s) keep-alive" "$out"
        p50[$kind$s]+=" $(echo "$out" | sed -n 's/.*p50_us=\([0-9]*\).*/\1/p')"
        p90[$kind$s]+=" $(echo "$out" | sed -n 's/.*p90_us=\([0-9]*\).*/\1/p')"
        p99[$kind$s]+=" $(echo "$out" | sed -n 's/.*p99_us=\([0-9]*\).*/\1/p')"
      done
    done
  done
  # The injected rows were injected: egressd recorded uses of the credential on /inj/x (an
  # aggregate per second, so at least one event; a refusal would be a CredentialDenied).
  local used
  for _ in $(seq 30); do
    used=$(psql "$SPACE_PG_URL" -Atc "SELECT count(*) FROM events WHERE type = 'CredentialUsed' AND status = 'accepted' AND position('/inj/x'::bytea in payload) > 0" 2>/dev/null || echo 0)
    [ "${used:-0}" -gt 0 ] && break
    sleep 0.2
  done
  [ "${used:-0}" -gt 0 ] || { echo "bench: no CredentialUsed for /inj/x: the injected rows carried nothing" >&2; exit 1; }
  # Per row the median over its runs (one per round), then injected minus plain.
  med() {
    tr ' ' '\n' | grep . | sort -n |
      awk '{a[NR]=$1} END {print NR % 2 ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2)}'
  }
  echo "-- credentials: per row the median of $ROUNDS runs of $N requests (us)"
  printf '%-6s %-9s %8s %8s %8s\n' "" "" p50 p90 p99
  for kind in http https; do
    local a50 a90 a99 b50 b90 b99
    a50=$(echo "${p50[${kind}plain]}" | med); a90=$(echo "${p90[${kind}plain]}" | med); a99=$(echo "${p99[${kind}plain]}" | med)
    b50=$(echo "${p50[${kind}inj]}" | med); b90=$(echo "${p90[${kind}inj]}" | med); b99=$(echo "${p99[${kind}inj]}" | med)
    printf '%-6s %-9s %8s %8s %8s\n' "$kind" plain "$a50" "$a90" "$a99"
    printf '%-6s %-9s %8s %8s %8s\n' "$kind" injected "$b50" "$b90" "$b99"
    printf '%-6s %-9s %+8d %+8d %+8d\n' "$kind" added $((b50 - a50)) $((b90 - a90)) $((b99 - a99))
  done
}

echo "egress bench: N=$N keep-alive, NC=$NC new connections, download $((BIG >> 20)) MiB; load: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${1:-}" = cred ]; then
  cred_rows
  curl -sf -X DELETE -H "$auth" "$api/v1/sandboxes/$id" >/dev/null || true
  exit 0
fi
for round in $(seq "$ROUNDS"); do
  echo "-- round $round"
  line "direct http  keep-alive"  "$(probe_host --host allowed.test --bench "$N" "$A" 8080)"
  line "cidr   http  keep-alive"  "$(probe_sbx --host allowed.test --bench "$N" "$C" 8080)"
  line "proxy  http  keep-alive"  "$(probe_sbx --host allowed.test --bench "$N" "$A" 8080)"
  line "direct https keep-alive"  "$(probe_host --sni allowed.test --bench "$N" "$A" 443)"
  line "proxy  https keep-alive"  "$(probe_sbx --sni allowed.test --bench "$N" "$A" 443)"
  # A client with HTTP_PROXY set: absolute-form to the gateway, egressd resolves the name and
  # rewrites the target to origin-form.
  line "fwdprx http  keep-alive"  "$(probe_sbx --host allowed.test:8080 --path http://allowed.test:8080/ --bench "$N" "\$(ip route | awk '/default/ {print \$3}')" 3128)"
  line "direct http  new conn"    "$(probe_host --host allowed.test --bench "$NC" --new-conn "$A" 8080)"
  line "cidr   http  new conn"    "$(probe_sbx --host allowed.test --bench "$NC" --new-conn "$C" 8080)"
  line "proxy  http  new conn"    "$(probe_sbx --host allowed.test --bench "$NC" --new-conn "$A" 8080)"
  line "direct https new conn"    "$(probe_host --sni allowed.test --bench "$NC" --new-conn "$A" 443)"
  line "proxy  https new conn"    "$(probe_sbx --sni allowed.test --bench "$NC" --new-conn "$A" 443)"
  line "direct http  download"    "$(probe_host --host allowed.test --path "/big?n=$BIG" --bench 1 "$A" 8080)"
  line "cidr   http  download"    "$(probe_sbx --host allowed.test --path "'/big?n=$BIG'" --bench 1 "$C" 8080)"
  line "proxy  http  download"    "$(probe_sbx --host allowed.test --path "'/big?n=$BIG'" --bench 1 "$A" 8080)"
  line "direct https download"    "$(probe_host --sni allowed.test --path "/big?n=$BIG" --bench 1 "$A" 443)"
  line "proxy  https download"    "$(probe_sbx --sni allowed.test --path "'/big?n=$BIG'" --bench 1 "$A" 443)"
done
cred_rows
echo "-- bandwidth limit: $LIMIT bytes/s each way (the sandbox's policy)"
line "proxy  http  upload"        "$(probe_sbx --host allowed.test --post 20000000 --bench 1 "$A" 8080)"
curl -sf -X PUT -H "$auth" -H 'Content-Type: application/json' \
  -d "{\"mode\":\"allowlist\",\"allow\":[\"allowed.test\",\"$net.1.30/32:8080\"],\"up_bytes_per_s\":$LIMIT,\"down_bytes_per_s\":$LIMIT}" \
  "$api/v1/sandboxes/$id/network" >/dev/null
line "proxy  http  download limited" "$(probe_sbx --host allowed.test --path "'/big?n=20000000'" --bench 1 "$A" 8080)"
line "proxy  http  upload   limited" "$(probe_sbx --host allowed.test --post 20000000 --bench 1 "$A" 8080)"
line "proxy  https download limited" "$(probe_sbx --sni allowed.test --path "'/big?n=20000000'" --bench 1 "$A" 443)"
curl -sf -X DELETE -H "$auth" "$api/v1/sandboxes/$id" >/dev/null || true
