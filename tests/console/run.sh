#!/usr/bin/env bash
# The web console (gateway-api/console/) in a real headless browser, against the stack the
# CTest fixture started in $SPACE_HOME (CTest "integration.console"): Debian's chromium
# (/usr/bin/chromium) driven by playwright-core, pinned in package-lock.json and installed
# with `npm ci` into tests/console/node_modules when missing. console.mjs says what it checks.
# Screenshots (PNG) go to $SPACE_CONSOLE_OUT (the CTest entry: build/tests/console-shots;
# by default $TMPDIR/space-console-shots).
# Without node or chromium: exit 77 (skipped) on a developer's machine, but a failure under
# CI=true, where a missing browser must not pass for a green test.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
chromium=${SPACE_CHROMIUM:-/usr/bin/chromium}

missing() {
  if [ "${CI:-}" = true ]; then
    echo "console: FAIL: $1 (CI=true: a missing browser or node is a failure)" >&2
    exit 1
  fi
  echo "console: SKIP: $1"
  exit 77
}
command -v node >/dev/null && command -v npm >/dev/null || missing "node and npm are not installed"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 20 ? 0 : 1)' ||
  missing "node $(node --version) is older than 20 (playwright-core's engines)"
[ -x "$chromium" ] || missing "$chromium is not installed (apt-get install chromium)"

: "${SPACE_HOME:?SPACE_HOME must name the stack (the CTest fixture sets it)}"
cd "$here"
if ! npm ls --depth=0 >/dev/null 2>&1; then
  npm ci --no-audit --no-fund --loglevel=error
fi
set -a
. "$SPACE_HOME/space.env"
set +a
export SPACE_CHROMIUM="$chromium"
export SPACE_CONSOLE_OUT=${SPACE_CONSOLE_OUT:-${TMPDIR:-/tmp}/space-console-shots}
exec node console.mjs
