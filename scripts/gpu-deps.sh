#!/usr/bin/env bash
# Downloads (does not install) the Debian packages that scripts/gpu-check.sh needs on a GPU
# machine that has a compiler, CMake and CUDA but no package access. Run on a Debian machine
# with apt; copy .deps/ along with the source tree.
#
#   ./scripts/gpu-deps.sh            # fills .deps/debs/
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(catch2 libboost1.74-dev libyaml-cpp-dev libyaml-cpp0.7 prometheus-cpp-dev libprometheus-cpp-core1.0 libcivetweb-dev libcivetweb1)
mkdir -p .deps/debs
cd .deps/debs
for p in "${packages[@]}"; do
  if ! ls "${p}"_*.deb >/dev/null 2>&1; then
    apt-get download "$p"
  fi
done
ls -1
