#!/usr/bin/env bash
# Runs vlake's whole test suite (ctest) on a built tree and exits non-zero on any failure.
# Tests labelled `gpu` run against the real driver and are reported as skipped without a GPU.
#
#   ./scripts/test.sh                 # the release preset built by setup.sh
#   VLAKE_PRESET=asan ./scripts/test.sh
#   ./scripts/test.sh -L sim          # extra arguments go to ctest
set -euo pipefail
cd "$(dirname "$0")/.."

preset="${VLAKE_PRESET:-release}"
if [[ ! -f "build/$preset/CTestTestfile.cmake" ]]; then
  echo "test.sh: build/$preset is not built; run ./scripts/setup.sh first" >&2
  exit 1
fi
cmake --build --preset "$preset"
ctest --preset "$preset" --output-on-failure -j "$(nproc)" "$@"
