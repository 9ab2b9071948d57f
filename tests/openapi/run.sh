#!/usr/bin/env bash
# The OpenAPI document of the /v1 API (api/openapi.json) against the gateway. Two CTest entries:
#   run.sh document <space-gateway>   "openapi.document": valid OpenAPI 3.1, and exactly the
#                                     routes of `space-gateway --list-routes` (document.mjs)
#   run.sh stack                      "integration.openapi", against the stack the CTest fixture
#                                     started in $SPACE_HOME: the served /v1/openapi.json is the
#                                     repo's, every documented route answers as documented
#                                     (probe.mjs), and a client generated from the served
#                                     document by @hey-api/openapi-ts creates a sandbox, runs
#                                     `echo hi` and deletes it (client.ts)
# Installs the pinned packages (package-lock.json, npm ci) into tests/openapi/node_modules when
# they are missing. Needs node >= 20.9 (the generator's engines): without it, exit 77 (skipped).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
doc="$here/../../api/openapi.json"

if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "openapi: SKIP: node and npm are not installed"
  exit 77
fi
if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number);
  process.exit(a>20||(a===20&&b>=9)?0:1)'; then
  echo "openapi: SKIP: node $(node --version) is older than 20.9"
  exit 77
fi
cd "$here"
if ! npm ls --depth=0 >/dev/null 2>&1; then
  npm ci --no-audit --no-fund --loglevel=error
fi

case "${1:-}" in
document)
  exec node document.mjs "$doc" "$2"
  ;;
stack)
  : "${SPACE_HOME:?SPACE_HOME must name the stack (the CTest fixture sets it)}"
  set -a
  . "$SPACE_HOME/space.env"
  set +a
  node probe.mjs "$doc"

  work=$(mktemp -d "${TMPDIR:-/tmp}/space-openapi.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  curl -sf -o "$work/openapi.json" "$SPACE_API_URL/v1/openapi.json"
  "$here/node_modules/.bin/openapi-ts" -i "$work/openapi.json" -o "$work/gen" \
    -c @hey-api/client-fetch >/dev/null
  cp client.ts "$work/"
  "$here/node_modules/.bin/tsc" --outDir "$work/js" --module commonjs --moduleResolution node10 \
    --target es2022 --lib es2022,dom,dom.iterable --strict --skipLibCheck "$work/client.ts"
  echo '{"type": "commonjs"}' >"$work/js/package.json"

  # `space up` (the fixture) returned once the worker had its templates built.
  node "$work/js/client.js"
  ;;
*)
  echo "usage: run.sh document <space-gateway> | run.sh stack" >&2
  exit 2
  ;;
esac
