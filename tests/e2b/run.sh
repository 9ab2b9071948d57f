#!/usr/bin/env bash
# CTest entry "e2b": the official E2B JS SDK, two pinned versions side by side (package.json:
# e2b 2.51.0 and e2b-v1 = e2b 2.50.0, the last to create with POST /sandboxes), run with node's
# test runner against the stack the CTest fixture started in $SPACE_HOME. Installs the pinned
# packages from package-lock.json (npm ci) into tests/e2b/node_modules when they are missing.
#
# Needs node >= 20.18.1 (the SDK's engines; Debian 12's nodejs 18 is too old, so
# install-deps.sh does not install it): without it the test is skipped (exit 77) with a reason.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${SPACE_HOME:?SPACE_HOME must name the stack (the CTest fixture sets it)}"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "e2b: SKIP: node and npm are not installed (the E2B SDK needs node >= 20.18.1)"
  exit 77
fi
if ! node -e 'const [a,b,c]=process.versions.node.split(".").map(Number);
  process.exit(a>=22||(a===20&&(b>18||(b===18&&c>=1)))?0:1)'; then
  echo "e2b: SKIP: node $(node --version) is older than the E2B SDK's minimum (20.18.1)"
  exit 77
fi

cd "$here"
if ! npm ls --depth=0 >/dev/null 2>&1; then
  npm ci --no-audit --no-fund --loglevel=error
fi

set -a
. "$SPACE_HOME/space.env"
set +a
export E2B_API_URL=$SPACE_API_URL E2B_SANDBOX_URL=$SPACE_API_URL E2B_API_KEY=$SPACE_API_KEY

# The worker serves once its templates are built: base (Debian, bash, user "user", what the
# SDK's `/bin/bash -l -c` and /home/user need) takes ~45 s the first time.
for _ in $(seq 1 300); do
  if curl -sf -H "Authorization: Bearer $SPACE_API_KEY" "$SPACE_API_URL/v1/templates" |
    grep -q '"base"'; then
    break
  fi
  sleep 1
done

# SPACE_E2B_TESTS: a subset of the files (a developer's shortcut; CTest runs them all).
exec node --test --test-concurrency=1 ${SPACE_E2B_TESTS:-hostile.test.mjs network.test.mjs more.test.mjs \
  parity.test.mjs snapshots.test.mjs signed.test.mjs sdk-2.51.test.mjs sdk-2.50.test.mjs}
