#!/usr/bin/env bash
# Installs every build and test dependency of vlake from Debian's packages, checks for the CUDA
# driver API headers, then configures and builds a CMake preset (default: release).
#
#   ./scripts/setup.sh              # as root on Debian bookworm
#   VLAKE_PRESET=asan ./scripts/setup.sh
#   VLAKE_CUDA_ROOT=/opt/cuda ./scripts/setup.sh
#
# Idempotent: packages already installed are not fetched again and the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

preset="${VLAKE_PRESET:-release}"
cuda_root="${VLAKE_CUDA_ROOT:-/usr/local/cuda}"

packages=(
  g++ cmake ninja-build pkg-config          # toolchain
  libboost-dev libyaml-cpp-dev              # Boost.Interprocess, yaml-cpp
  prometheus-cpp-dev libcivetweb-dev prometheus  # exporter; promtool + a real server in tests
  python3                                   # test scripts (Prometheus queries, GPU checks)
  catch2                                    # test framework
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc  # kubelet API
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup.sh: missing packages: ${missing[*]}" >&2
    echo "setup.sh: run as root (or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup.sh: all ${#packages[@]} Debian packages present"
fi

if [[ ! -f "$cuda_root/include/cuda.h" || ! -f "$cuda_root/include/cudaTypedefs.h" ]]; then
  cat >&2 <<MSG
setup.sh: CUDA driver API headers not found: $cuda_root/include/cuda.h (and cudaTypedefs.h).
  vlake compiles against the CUDA 12.8+ driver API headers (CUDA 13 recommended) but links
  nothing from the toolkit. Install the CUDA toolkit (or just its cuda_cudart / driver headers)
  so that cuda.h is under /usr/local/cuda/include, or point VLAKE_CUDA_ROOT at its root.
MSG
  exit 1
fi

cmake --preset "$preset" -DVLAKE_CUDA_ROOT="$cuda_root"
cmake --build --preset "$preset"
echo "setup.sh: built preset '$preset' in build/$preset"
