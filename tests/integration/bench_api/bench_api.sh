#!/usr/bin/env bash
# CTest entry "bench_api": `space-bench api` against the stack the fixture started (a stack it
# did not start; only its URL and key, from space.env), as an operator runs it: a run at
# concurrency 2 and an open-loop rate, whose JSON must hold every operation of every sandbox
# and whose SVG must be well-formed with each operation in it; a run whose commands fail,
# whose errors are counted and whose sandboxes are still deleted; a run stopped by SIGINT,
# which still deletes what it made; bad usage. After each run the API lists none of the
# run's sandboxes. No timing is asserted. Each check prints ok/FAIL; the exit status is the
# number of failures (capped).
set -u
bench=$1
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: "${SPACE_HOME:?SPACE_HOME must name the stack (the CTest fixture sets it)}"

ok() { echo "ok   $1"; }
bad() {
    echo "FAIL $1"
    fails=$((fails + 1))
}
check() { # check DESCRIPTION COMMAND...
    local d=$1
    shift
    if "$@"; then ok "$d"; else bad "$d"; fi
}
api() { curl -sf -H "Authorization: Bearer $SPACE_API_KEY" "$SPACE_API_URL$1"; }
# py FILE EXPR: EXPR (Python, the parsed JSON as j) is true.
py() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' "$1" "$2"; }
# none_left FILE: the API lists no sandbox of the run FILE describes.
none_left() {
    local id
    id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run"]["run_id"])' "$1") || return 1
    [ -n "$id" ] && api "/v1/sandboxes?metadata.space_bench=$id" | jq -e '.sandboxes | length == 0' >/dev/null
}

set -a
. "$SPACE_HOME/space.env"
set +a
# The key from a file, as the help says, never on the command line.
printf '%s\n' "$SPACE_API_KEY" >"$tmp/key"
chmod 600 "$tmp/key"
# The worker announces its templates with its first heartbeat.
for _ in $(seq 100); do
    api /v1/templates | grep -q '"tiny"' && break
    sleep 0.1
done

# ---- a run: 6 sandboxes, 2 workers, 3 starts per second ----
env -u SPACE_API_KEY "$bench" api --api-url "$SPACE_API_URL" --api-key-file "$tmp/key" \
    --count 6 --concurrency 2 --rate 3 --template tiny --out "$tmp/run" >"$tmp/run.out" 2>&1
rc=$?
check "space-bench api exits 0 (exit $rc)" [ "$rc" -eq 0 ]
sed 's/^/    /' "$tmp/run.out"
check "the JSON parses" py "$tmp/run.json" 'True'
for op in create exec pause resume_paused suspend resume_suspended delete; do
    check "$op: 6 samples, 0 errors in the summary" \
        py "$tmp/run.json" "j['summary']['$op']['n'] == 6 and j['summary']['$op']['errors'] == 0"
    check "$op: 6 samples in the list, each with a status and a latency" \
        py "$tmp/run.json" "len([s for s in j['samples'] if s['op'] == '$op' and s['status'] > 0 and s['latency_ms'] > 0 and s['error'] is None]) == 6"
    check "$op: p50 <= p90 <= p99 <= max" \
        py "$tmp/run.json" "(lambda s: s['p50_ms'] <= s['p90_ms'] <= s['p99_ms'] <= s['max_ms'])(j['summary']['$op'])"
done
check "the run says its rate, concurrency and template" \
    py "$tmp/run.json" "j['run']['rate'] == 3 and j['run']['concurrency'] == 2 and j['run']['template'] == 'tiny' and j['run']['iterations'] == 6"
check "creates scheduled 1/3 s apart (open loop: start_ms is the due time)" \
    py "$tmp/run.json" "sorted(round(s['start_ms']) for s in j['samples'] if s['op'] == 'create') == [0, 333, 667, 1000, 1333, 1667]"
check "the JSON carries no key" bash -c "! grep -qF -- \"\$1\" \"\$2\"" _ "$SPACE_API_KEY" "$tmp/run.json"
check "the table names every operation" \
    bash -c 'for op in create exec pause resume_paused suspend resume_suspended delete; do grep -q "^  $op " "$1" || exit 1; done' _ "$tmp/run.out"
check "no sandbox of the run is left" none_left "$tmp/run.json"
check "the SVG is well-formed XML" python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$tmp/run.svg"
for op in create exec pause resume_paused suspend resume_suspended delete; do
    check "the SVG has a panel for $op" grep -q "id=\"op-$op\"" "$tmp/run.svg"
done
check "the SVG draws one point per successful sample" \
    bash -c '[ "$(grep -c "<circle" "$1")" -eq 42 ]' _ "$tmp/run.svg"
check "the SVG has the percentile lines" bash -c 'grep -q ">p50 " "$1" && grep -q ">p99 " "$1"' _ "$tmp/run.svg"

# ---- failing commands: counted, the run goes on, the sandboxes are deleted ----
"$bench" api --count 2 --ops exec --cmd 'exit 3' --out "$tmp/fail" >"$tmp/fail.out" 2>&1
rc=$?
check "a run with failing commands exits 0 (exit $rc)" [ "$rc" -eq 0 ]
check "exec: 2 errors, counted as status 200, reason exit" \
    py "$tmp/fail.json" "j['summary']['exec']['errors'] == 2 and [s['error'] for s in j['samples'] if s['op'] == 'exec'] == ['exit', 'exit'] and j['summary']['exec']['p50_ms'] is None"
check "the sandboxes were deleted all the same" \
    py "$tmp/fail.json" "j['summary']['delete']['n'] == 2 and j['summary']['delete']['errors'] == 0 and 'pause' not in j['summary']"
check "the table lists the errors" grep -q "^  exec  *200 exit  *2" "$tmp/fail.out"
check "no sandbox of the failing run is left" none_left "$tmp/fail.json"
check "its SVG is well-formed XML" python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$tmp/fail.svg"

# ---- SIGINT: the run stops and deletes what it made ----
"$bench" api --count 200 --concurrency 2 --ops exec --out "$tmp/int" >"$tmp/int.out" 2>&1 &
pid=$!
for _ in $(seq 300); do
    n=$(api /v1/sandboxes | jq '[.sandboxes[] | select(.metadata.space_bench != null)] | length')
    [ "${n:-0}" -ge 1 ] && break
    sleep 0.1
done
kill -INT "$pid"
wait "$pid"
rc=$?
check "an interrupted run exits 130 (exit $rc)" [ "$rc" -eq 130 ]
check "its JSON says interrupted, with fewer than 200 creates" \
    py "$tmp/int.json" "j['run']['interrupted'] is True and 1 <= j['summary']['create']['n'] < 200 and j['run']['sandboxes_left'] == 0"
check "no sandbox of the interrupted run is left" none_left "$tmp/int.json"
check "none of any run is left" \
    bash -c '[ "$(curl -sf -H "Authorization: Bearer $SPACE_API_KEY" "$SPACE_API_URL/v1/sandboxes" | jq "[.sandboxes[] | select(.metadata.space_bench != null)] | length")" = 0 ]'

# ---- bad usage ----
env -u SPACE_API_KEY "$bench" api --count 1 >/dev/null 2>&1
check "without a key: exit 2" [ $? -eq 2 ]
"$bench" api --rate 0 >/dev/null 2>&1
check "--rate 0: exit 2" [ $? -eq 2 ]
"$bench" api --ops bogus >/dev/null 2>&1
check "--ops bogus: exit 2" [ $? -eq 2 ]
"$bench" api --count 1 --template no-such-template >"$tmp/nt.out" 2>&1
check "a template no worker offers: exit 1, said so" \
    bash -c '[ "$1" -eq 1 ] && grep -q "no live worker offers template" "$2"' _ $? "$tmp/nt.out"
out=$("$bench" api --help)
check "space-bench api --help explains the open loop" grep -q "Open loop" <<<"$out"

echo "bench_api: $fails failure(s)"
[ "$fails" -lt 100 ] || fails=100
exit "$fails"
