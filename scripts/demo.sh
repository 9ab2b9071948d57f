#!/usr/bin/env bash
# From a fresh Debian 12 machine (as root): installs the packages, builds, brings the local
# stack up (nats-server + JetStream, a private PostgreSQL, the SPACE daemons) and runs a short
# demo. The stack keeps running; stop it with: build/bin/space down
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
home=${SPACE_HOME:-./var}
# PostgreSQL runs as the postgres user and must reach its data directory: a checkout under a
# private directory (/root is 0700) cannot hold it.
if ! runuser -u postgres -- test -x "$(pwd)"; then
  home=${SPACE_HOME:-/var/tmp/space-c}
  echo "note: the postgres user cannot reach $(pwd); using SPACE_HOME=$home"
fi
export SPACE_HOME=$home
build/bin/space up
build/bin/space demo
