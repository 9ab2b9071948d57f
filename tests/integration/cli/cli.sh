#!/usr/bin/env bash
# The `space` CLI against a real stack (the fixture's `space up`; SPACE_HOME names it): every
# flag of create, ls, exec and cp, stdin forwarded byte for byte (sha256 of a few MB), a tree
# copied both ways and compared file by file, a pty of the local terminal's size and its
# resize (a real terminal from script(1)), each subcommand's --help, and the exit status of bad
# usage (2). Each check prints ok/FAIL; the exit status is the number of failures (capped).
set -u
space=$1
bin=$(dirname "$space")
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok   $1"; }
jqe() { jq -e "$1" >/dev/null; } # the filter holds for the JSON on stdin
bad() {
    echo "FAIL $1"
    fails=$((fails + 1))
}
check() { # check DESCRIPTION COMMAND...: the command's success
    local d=$1
    shift
    if "$@"; then ok "$d"; else bad "$d"; fi
}
status_is() { # status_is DESCRIPTION WANT COMMAND...
    local d=$1 want=$2
    shift 2
    "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
    local rc=$?
    if [ "$rc" -eq "$want" ]; then ok "$d (exit $rc)"; else
        bad "$d: exit $rc, want $want"
        sed 's/^/    /' "$tmp/err" | head -5
    fi
}

# ---- help texts and bad usage ----
for c in create ls rm exec cp events creds keys; do
    out=$("$space" "$c" --help 2>&1)
    rc=$?
    check "space $c --help exits 0" [ "$rc" -eq 0 ]
    check "space $c --help is its own usage" grep -q "^usage: space $c" <<<"$out"
    if grep -q -- '--pg-port\|--nats-server' <<<"$out"; then bad "space $c --help shows the stack's options"; fi
    out=$("$space" help "$c")
    check "space help $c is the same text" grep -q "^usage: space $c" <<<"$out"
done
for c in identity platform; do
    out=$("$space" "$c" --help)
    check "space $c --help is its own usage" grep -q "^usage: space $c" <<<"$out"
done
check "space identity ls --json" jqe '.identities | index("gateway")' <<<"$("$space" identity ls --json)"
check "space platform ls --json" jqe '.platforms | type == "array"' <<<"$("$space" platform ls --json)"
status_is "space identity ls with an unknown option" 2 "$space" identity ls --bogus
status_is "space exec without arguments" 2 "$space" exec
status_is "space exec with an unknown option" 2 "$space" exec sbx_x --bogus -- true
status_is "space exec without a command" 2 "$space" exec sbx_x --
status_is "space exec --timeout abc" 2 "$space" exec sbx_x --timeout abc -- true
status_is "space exec --env NAME not set here" 2 env -u SPACE_CLI_UNSET "$space" exec sbx_x --env SPACE_CLI_UNSET -- true
status_is "space exec --env =V" 2 "$space" exec sbx_x --env =V -- true
status_is "space create --timeout -1" 2 "$space" create --timeout -1
status_is "space create --metadata without =" 2 "$space" create --metadata novalue
status_is "space create with an unknown option" 2 "$space" create --bogus
status_is "space ls with an unknown option" 2 "$space" ls --bogus
status_is "space cp with one argument" 2 "$space" cp onlyone
status_is "space rm without an id" 2 "$space" rm
status_is "space keys nonsense" 2 "$space" keys nonsense
status_is "space unknown command" 2 "$space" frobnicate
status_is "space-bench without arguments" 2 "$bin/space-bench"
status_is "space-bench with an unknown command" 2 "$bin/space-bench" nonsense
out=$("$bin/space-bench" --help)
check "space-bench --help lists its commands" bash -c 'grep -q "eventlog" <<<"$1" && grep -q "lifecycle" <<<"$1" && grep -q "sign" <<<"$1"' _ "$out"
"$bin/space-replay" >/dev/null 2>&1
check "space-replay without arguments fails" [ $? -ne 0 ]
out=$("$bin/space-replay" --help)
check "space-replay --help lists its commands" bash -c 'for c in verify timeline export state rebuild; do grep -q "space-replay \[options\] $c" <<<"$1" || exit 1; done' _ "$out"

# ---- create with every flag ----
run=r$$
id=$("$space" create --template tiny --metadata owner=cli-test --metadata "run=$run" \
    --timeout 900 --env GREETING=hello-from-create --allow api.cli.test --deny bad.cli.test)
check "space create prints the id" grep -qE '^sbx_[0-9a-v]{26}$' <<<"$id"
js=$("$space" ls --json --metadata "run=$run")
check "space ls --json is JSON" jqe . <<<"$js"
check "space ls --metadata finds the one sandbox" [ "$(jq '.sandboxes | length' <<<"$js")" = 1 ]
sb=$(jq -c --arg id "$id" '.sandboxes[] | select(.id == $id)' <<<"$js")
check "--metadata reached the sandbox" [ "$(jq -r '.metadata.owner' <<<"$sb")" = cli-test ]
check "--timeout reached the sandbox" [ "$(jq -r '.timeout_s' <<<"$sb")" = 900 ]
check "--env reached the sandbox (its name)" jqe '.env_names | index("GREETING")' <<<"$sb"
# The sandbox JSON has no policy (network: null): the create's event in the log says it.
"$space" events --json "$id" | grep -i network >"$tmp/net1"
check "--allow is in the policy" grep -q '"api.cli.test"' "$tmp/net1"
check "--deny is in the policy" grep -q '"bad.cli.test"' "$tmp/net1"
check "--allow made an allowlist" grep -qi 'allowlist' "$tmp/net1"
grep -qi allowlist "$tmp/net1" || head -c 2000 "$tmp/net1"
id2=$("$space" create tiny --deny bad.cli.test --metadata "run=$run" --json | jq -r .id)
check "create --json prints the sandbox" grep -qE '^sbx_' <<<"$id2"
"$space" events --json "$id2" | grep -i network >"$tmp/net2"
check "--deny alone is allow_all minus the list" grep -qi 'allow_all' "$tmp/net2"
grep -qi allow_all "$tmp/net2" || head -c 2000 "$tmp/net2"
check "space events --json: JSON lines" jqe . <"$tmp/net2"
check "create --env reaches commands" [ "$("$space" exec "$id" -- sh -c 'echo $GREETING')" = hello-from-create ]

# ---- ls: aligned columns ----
"$space" ls >"$tmp/ls"
check "space ls lists the sandbox" grep -q "^$id " "$tmp/ls"
check "space ls columns are aligned" python3 - "$tmp/ls" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
head = lines[0]
starts = [head.index(h) for h in ("STATE", "TEMPLATE", "WORKER", "CREATED")]
for l in lines[1:]:
    for s in starts:
        if l[s - 2:s] != "  " or l[s] == " ":
            sys.exit("misaligned: %r" % l)
PY
long=a-tenant-name-of-sixty-four-characters-which-is-the-longest-one
"$space" keys create --tenant "$long" --name "cli test" >/dev/null 2>&1
"$space" keys ls >"$tmp/keys"
check "space keys ls lists the long tenant" grep -q "$long" "$tmp/keys"
check "space keys ls columns are aligned (a 64-character tenant)" python3 - "$tmp/keys" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
head = lines[0]
starts = [head.index(h) for h in ("TENANT", "ADMIN", "CREATED", "LAST_USED", "REVOKED", "NAME")]
for l in lines[1:]:
    for s in starts:
        if l[s - 2:s] != "  " or l[s] == " ":
            sys.exit("misaligned: %r" % l)
PY
check "space keys ls --json is JSON with keys" jqe '.keys | length >= 1' <<<"$("$space" keys ls --json)"

# ---- exec ----
check "echo data | space exec ID -- cat prints data" [ "$(echo data | "$space" exec "$id" -- cat)" = data ]
head -c 3000000 /dev/urandom >"$tmp/in"
want=$(sha256sum <"$tmp/in" | cut -d' ' -f1)
got=$("$space" exec "$id" -- sha256sum <"$tmp/in" | cut -d' ' -f1)
check "3 MB of stdin arrive whole (sha256 in the sandbox)" [ "$got" = "$want" ]
"$space" exec "$id" -- cat <"$tmp/in" >"$tmp/back"
check "3 MB round trip through cat (sha256 here)" [ "$(sha256sum <"$tmp/back" | cut -d' ' -f1)" = "$want" ]
check "stdin EOF reaches the command (wc -c)" [ "$(printf 12345 | "$space" exec "$id" -- wc -c | tr -d ' ')" = 5 ]
check "-n: no stdin" [ "$(echo data | "$space" exec "$id" -n -- cat)" = "" ]
status_is "exit status is the command's" 7 "$space" exec "$id" -- sh -c 'exit 7'
status_is "a command killed by a signal: 128 + signal" 137 "$space" exec "$id" -- sh -c 'kill -9 $$'
check "--env K=V (repeatable)" [ "$("$space" exec "$id" --env FOO=bar --env BAZ=qux -- sh -c 'echo $FOO-$BAZ')" = bar-qux ]
check "--env NAME takes the value from here" [ "$(CLI_FROM_HERE=local-value "$space" exec "$id" --env CLI_FROM_HERE -- sh -c 'echo $CLI_FROM_HERE')" = local-value ]
check "--env=K=V" [ "$("$space" exec "$id" --env=FOO=x=y -- sh -c 'echo $FOO')" = x=y ]
check "--cwd" [ "$("$space" exec "$id" --cwd /tmp -- pwd)" = /tmp ]
check "--user user is not root" [ "$("$space" exec "$id" --user user -- id -u)" != 0 ]
check "--user root" [ "$("$space" exec "$id" --user root -- id -u)" = 0 ]
check "--home before the id" [ "$("$space" exec --home "$SPACE_HOME" "$id" -- echo hi)" = hi ]
check "the command's own --home is left alone" [ "$("$space" exec "$id" echo --home x)" = "--home x" ]
check "space ls --home names the stack" grep -q "^$id " <<<"$(env -u SPACE_HOME "$space" ls --home "$SPACE_HOME")"
check "without --: the first non-option is the command" [ "$("$space" exec "$id" echo a --b)" = "a --b" ]
"$space" exec "$id" --timeout 2 -- sleep 60 >"$tmp/out" 2>"$tmp/err"
rc=$?
check "--timeout kills the command (exit $rc)" [ "$rc" -ne 0 ]
check "--timeout says so" grep -q "timed out" "$tmp/err"
"$space" exec "$id" -- sh -c 'trap "echo got-int; exit 3" INT; echo ready; sleep 20 & wait' >"$tmp/int" 2>&1 </dev/null &
p=$!
for _ in $(seq 50); do grep -q ready "$tmp/int" && break; sleep 0.1; done
kill -INT $p
wait $p
rc=$?
check "SIGINT goes on to the command (its trap ran)" grep -q got-int "$tmp/int"
check "... and the exit status is the command's ($rc)" [ "$rc" -eq 3 ]
out=$("$space" exec "$id" -t -- sh -c 'test -t 0 && test -t 1 && echo tty' </dev/null | tr -d '\r')
check "-t runs on a terminal" [ "$out" = tty ]
out=$(script -qec "stty rows 33 cols 101; $space exec $id -t -- stty size" /dev/null | tr -d '\r')
check "-t has the local terminal's size" grep -q "33 101" <<<"$out"
out=$(script -qec "stty rows 33 cols 101; ($space exec $id -t -- sh -c 'sleep 4; stty size' </dev/null & p=\$!; sleep 2; stty rows 44 cols 120; kill -WINCH \$p; wait \$p)" /dev/null | tr -d '\r')
check "-t follows a resize (SIGWINCH)" grep -q "44 120" <<<"$out"
[ -n "$(grep "44 120" <<<"$out")" ] || echo "    got: $out"

# ---- cp ----
mkdir -p "$tmp/tree/a/b/c" "$tmp/tree/empty" "$tmp/tree/with space"
head -c 2500000 /dev/urandom >"$tmp/tree/big.bin"
echo one >"$tmp/tree/a/one.txt"
printf '#!/bin/sh\necho run\n' >"$tmp/tree/a/run.sh"
chmod 0755 "$tmp/tree/a/run.sh"
echo two >"$tmp/tree/a/b/two.txt"
head -c 1000 /dev/urandom >"$tmp/tree/a/b/c/deep.bin"
: >"$tmp/tree/a/empty-file"
echo spaced >"$tmp/tree/with space/file name.txt"
"$space" cp -r "$tmp/tree" "$id:/root/tree" 2>"$tmp/err"
check "cp -r up" [ $? -eq 0 ]
check "cp with stderr piped shows no progress" [ ! -s "$tmp/err" ]
(cd "$tmp/tree" && find . -type f | LC_ALL=C sort | xargs -d '\n' sha256sum) >"$tmp/local.sums"
"$space" exec "$id" --cwd /root/tree -- sh -c "find . -type f | LC_ALL=C sort | while read -r f; do sha256sum \"\$f\"; done" >"$tmp/remote.sums"
check "cp -r up: every file in the sandbox, same bytes" diff "$tmp/local.sums" "$tmp/remote.sums"
check "cp -r up: the empty directory too" "$space" exec "$id" -- test -d /root/tree/empty
"$space" cp -r "$id:/root/tree" "$tmp/down"
check "cp -r down" [ $? -eq 0 ]
check "cp -r down: the same tree, file by file" diff -r "$tmp/tree" "$tmp/down"
check "cp -r up: an executable stays executable" [ "$("$space" exec "$id" -- /root/tree/a/run.sh)" = run ]
check "cp -r down: an executable stays executable" test -x "$tmp/down/a/run.sh"
check "cp down: a 0644 file is not left 0600" [ "$(stat -c %a "$tmp/down/a/one.txt")" = "$(stat -c %a "$tmp/tree/a/one.txt")" ]
status_is "cp of a directory without -r" 2 "$space" cp "$tmp/tree" "$id:/root/x"
out=$(script -qec "$space cp $tmp/tree/big.bin $id:/root/big.bin" /dev/null | tr -d '\r')
check "cp shows a progress bar on a terminal" grep -q "upload .*MB.*%" <<<"$out"
"$space" cp "$id:/root/big.bin" "$tmp/big.back"
check "cp of one file down" cmp -s "$tmp/tree/big.bin" "$tmp/big.back"

# ---- secrets: env values and stdin bytes are in no event ----
echo stdin-marker-$run | "$space" exec "$id" --env SECRET_VALUE=env-marker-$run -- sh -c 'cat >/dev/null; echo "$SECRET_VALUE" | wc -c' >/dev/null
"$space" events --json >"$tmp/events"
check "the event log has events of this run" grep -q "$id" "$tmp/events"
check "no --env value of exec in the event log" bash -c '! grep -q "env-marker-$1" "$2"' _ "$run" "$tmp/events"
check "no --env value of create in the event log" bash -c '! grep -q "hello-from-create" "$1"' _ "$tmp/events"
check "no stdin byte in the event log" bash -c '! grep -q "stdin-marker-$1" "$2"' _ "$run" "$tmp/events"

# ---- bash completion (build/bin/space-completion.bash) ----
complete_words() { # complete_words WORD...: what the completion offers for the last word
    PATH="$bin:$PATH" bash -c '. "$1/space-completion.bash"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _space; printf "%s\n" "${COMPREPLY[@]}"' _ "$bin" "$@"
}
check "completion: commands" grep -qx exec <<<"$(complete_words space ex)"
check "completion: exec's options" bash -c 'grep -qx -- --timeout <<<"$1" && grep -qx -- --tty <<<"$1"' _ "$(complete_words space exec --t)"
check "completion: sandbox ids for rm" grep -qx "$id" <<<"$(complete_words space rm sbx_)"
check "completion: ID: for cp" grep -qx "$id:" <<<"$(complete_words space cp sbx_)"

# ---- rm ----
check "space rm" "$space" rm "$id" "$id2"
check "space ls no longer lists it" bash -c '! "$1" ls | grep -q "^$2 "' _ "$space" "$id"

echo "$fails failure(s)"
[ "$fails" -eq 0 ] || exit $((fails > 100 ? 100 : fails))
