#!/usr/bin/env bash
# Configures and builds SPACE-C into build/ (binaries in build/bin/). Extra arguments go to
# cmake's configure step, e.g. scripts/build.sh -DSPACE_ASAN=ON.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${SPACE_BUILD_DIR:-build}
cmake -S . -B "$dir" -DSPACE_WERROR=ON "$@" >/dev/null
cmake --build "$dir" -j"$(nproc)"
