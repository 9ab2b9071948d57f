#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine (as root): installs the packages, builds
# with -Werror, runs every unit and integration test (real nats-server and PostgreSQL), runs
# them again under AddressSanitizer + UndefinedBehaviorSanitizer (daemons included), and checks
# formatting and clang-tidy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh

echo "== build (-Werror) and test"
SPACE_BUILD_DIR=build scripts/build.sh -DCMAKE_BUILD_TYPE=RelWithDebInfo
ctest --test-dir build --output-on-failure

echo "== build with ASan+UBSan and test (the daemons the fixtures start are sanitized too)"
asan_logs=$(mktemp -d /tmp/space-asan.XXXXXX)
SPACE_BUILD_DIR=build-asan scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DSPACE_ASAN=ON
ASAN_OPTIONS="detect_leaks=1:log_path=$asan_logs/asan" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$asan_logs/ubsan" \
  ctest --test-dir build-asan --output-on-failure
if [ -n "$(ls -A "$asan_logs")" ]; then
  echo "sanitizer reports (from a test or a daemon):"
  cat "$asan_logs"/*
  exit 1
fi
rm -rf "$asan_logs"

echo "== lint"
scripts/lint.sh
echo "all checks passed"
